//! `--listen ADDR` (issue #37): the process that watches answers over HTTP what it knows — `/livez`,
//! `/startupz`, `/readyz`, `/status`, `/events` (Server-Sent Events of the JSON event stream), `/metrics`
//! and the page `/`.
//!
//! The listener is a sink like stdout: one per process. Every reporter of the process (the watch's, the
//! launch's, a multi-node head's) hands each JSON object it renders, after the one redactor, to the hub
//! ([`publish`]), whatever its own output mode; the hub keeps them (bounded) for `/events` and builds the
//! view the probe endpoints answer from (`state.rs`). Nothing here decides a verdict: the core's events
//! are rendered. `http.rs` is the server (hyper) and its bounds against hostile clients.

pub mod http;
pub mod state;

use crate::error::CliError;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};

/// What `--listen` and its companions resolved to, before anything runs: the socket is bound, the token
/// read, the certificate loaded.
pub struct Settings {
    pub addr: SocketAddr,
    pub listener: std::net::TcpListener,
    /// The bearer token every request must carry (never printed).
    pub token: Option<Vec<u8>>,
    pub tls: Option<Arc<rustls::ServerConfig>>,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings").field("addr", &self.addr).field("tls", &self.tls.is_some()).finish()
    }
}

/// The flags as given.
pub struct Flags<'a> {
    pub addr: SocketAddr,
    /// `--listen` or `--metrics` (for messages).
    pub flag: &'a str,
    pub token_file: Option<&'a Path>,
    pub public: bool,
    pub cert: Option<&'a Path>,
    pub key: Option<&'a Path>,
}

/// Checks the flags and binds: a non-loopback address needs a token file or `--listen-public`.
pub fn resolve(f: Flags<'_>) -> Result<Settings, CliError> {
    let flag = f.flag;
    let addr = f.addr;
    if !addr.ip().is_loopback() && f.token_file.is_none() && !f.public {
        return Err(CliError::usage(format!(
            "{flag} {addr} is not a loopback address: give --listen-token-file FILE (a bearer token) or \
             --listen-public to serve it to everyone who can reach it"
        )));
    }
    let token = match f.token_file {
        Some(p) => Some(read_token(p)?),
        None => None,
    };
    let tls = match (f.cert, f.key) {
        (Some(c), Some(k)) => Some(Arc::new(server_tls(c, k)?)),
        (None, None) => None,
        _ => return Err(CliError::usage("--listen-cert and --listen-key go together")),
    };
    let listener = std::net::TcpListener::bind(addr).map_err(|e| CliError::usage(format!("{flag} {addr}: {e}")))?;
    // a deeper accept queue than std's 128 (the kernel caps it at net.core.somaxconn): a burst of connections
    // waits there instead of in SYN retries; Linux takes a second listen() on a listening socket as the new size
    // SAFETY: listen on a descriptor this listener owns.
    unsafe {
        libc::listen(std::os::fd::AsRawFd::as_raw_fd(&listener), 4096);
    }
    Ok(Settings { addr, listener, token, tls })
}

/// The token: the file's first line, trimmed; an empty or unreadable file is refused (its content never shown).
fn read_token(p: &Path) -> Result<Vec<u8>, CliError> {
    let bad = |why: &str| CliError::usage(format!("--listen-token-file {}: {why}", p.display()));
    let meta = std::fs::metadata(p).map_err(|e| bad(&e.to_string()))?;
    if meta.len() > 4096 {
        return Err(bad("larger than 4 KiB: give a file holding only the token"));
    }
    let text = std::fs::read(p).map_err(|e| bad(&e.to_string()))?;
    let line = text.split(|b| *b == b'\n').next().unwrap_or_default();
    let t: Vec<u8> = line.trim_ascii().to_vec();
    if t.is_empty() {
        return Err(bad("empty"));
    }
    if t.iter().any(|b| !b.is_ascii_graphic()) {
        return Err(bad("the token must be printable ASCII without spaces"));
    }
    Ok(t)
}

/// The server's TLS: the certificate chain and key (PEM), rustls with the ring provider.
fn server_tls(cert: &Path, key: &Path) -> Result<rustls::ServerConfig, CliError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| CliError::usage(format!("--listen-cert {}: {e}", cert.display())))?;
    if certs.is_empty() {
        return Err(CliError::usage(format!("--listen-cert {}: no certificate in it", cert.display())));
    }
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| CliError::usage(format!("--listen-key {}: {e}", key.display())))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .and_then(|b| b.with_no_client_auth().with_single_cert(certs, key))
        .map_err(|e| CliError::usage(format!("--listen-cert/--listen-key: {e}")))
}

static HUB: OnceLock<Arc<state::Hub>> = OnceLock::new();
static METRICS: Mutex<Option<crate::sinks::metrics::Metrics>> = Mutex::new(None);

/// Starts serving (once per process; later calls with the same settings do nothing) and returns the URL.
pub fn start(s: &Settings, host: String) -> Result<Option<String>, CliError> {
    if HUB.get().is_some() {
        return Ok(None);
    }
    let hub = Arc::new(state::Hub::new(host));
    if HUB.set(hub.clone()).is_err() {
        return Ok(None);
    }
    http::serve(s, hub).map_err(|e| CliError::usage(format!("--listen {}: {e}", s.addr)))?;
    let scheme = if s.tls.is_some() { "https" } else { "http" };
    let local = s.listener.local_addr().unwrap_or(s.addr);
    Ok(Some(format!("{scheme}://{local}/")))
}

/// Whether a listener serves in this process.
pub fn active() -> bool {
    HUB.get().is_some()
}

/// One rendered event (a JSON object, redacted) into the listener's log and view; nothing without a listener.
pub fn publish(json: &str) {
    if let Some(h) = HUB.get() {
        h.push(json);
    }
}

/// The watch's metrics, served at `/metrics` (the first watch of the process that has them).
pub fn set_metrics(m: &crate::sinks::metrics::Metrics) {
    let mut g = METRICS.lock().unwrap_or_else(|e| e.into_inner());
    if g.is_none() {
        *g = Some(m.clone());
    }
}

fn metrics() -> Option<crate::sinks::metrics::Metrics> {
    METRICS.lock().unwrap_or_else(|e| e.into_inner()).clone()
}
