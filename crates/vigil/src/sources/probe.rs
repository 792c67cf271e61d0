//! A small HTTP/1.1 prober: one GET with a deadline, a bounded read of the status line and headers.
//! No HTTP client crate: what a readiness probe needs is little, and every read here is bounded so
//! a hostile or broken peer (never answering, trickling, garbage) cannot hold or grow vigil.
//! `https://` targets add a TLS handshake (rustls, `tls.rs`) inside the same deadline: a peer that
//! accepts and never finishes the handshake is a probe timeout like one that never answers.

use crate::sources::tls::{self, Tls, TlsOpts};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use vigil_core::ProbeOutcome;

#[derive(Debug, Clone)]
pub struct Target {
    pub host: String,
    pub port: u16,
    pub path: String,
    /// `https://`: how to speak TLS to it.
    pub tls: Option<Tls>,
}

impl Target {
    /// An `http://` URL, or an `https://` one trusting the system's root certificates.
    pub fn parse(url: &str) -> Result<Target, String> {
        Target::parse_with(url, &TlsOpts::default())
    }

    /// A URL whose `https://` trust comes from `--ca-cert`/`--insecure` (`o`).
    pub fn parse_with(url: &str, o: &TlsOpts) -> Result<Target, String> {
        let (rest, https) = match (url.strip_prefix("http://"), url.strip_prefix("https://")) {
            (Some(r), _) => (r, false),
            (_, Some(r)) => (r, true),
            _ => return Err(format!("--url must start with http:// or https:// (got '{url}')")),
        };
        let default_port = if https { "443" } else { "80" };
        let (hostport, path) = match rest.find('/') {
            Some(i) => (&rest[..i], rest[i..].to_string()),
            None => (rest, "/".to_string()),
        };
        let (host, port) = if let Some(h) = hostport.strip_prefix('[') {
            let (h, p) = h.split_once(']').ok_or_else(|| format!("bad IPv6 host in --url '{url}'"))?;
            (h.to_string(), p.strip_prefix(':').unwrap_or(default_port).to_string())
        } else {
            match hostport.rsplit_once(':') {
                Some((h, p)) => (h.to_string(), p.to_string()),
                None => (hostport.to_string(), default_port.to_string()),
            }
        };
        if host.is_empty() {
            return Err(format!("no host in --url '{url}'"));
        }
        let port: u16 = port.parse().map_err(|_| format!("bad port in --url '{url}'"))?;
        if path.contains(['\r', '\n', ' ']) {
            return Err(format!("bad path in --url '{url}'"));
        }
        let tls = if https { Some(tls::client(&host, o)?) } else { None };
        Ok(Target { host, port, path, tls })
    }

    pub fn is_https(&self) -> bool {
        self.tls.is_some()
    }

    pub fn url(&self) -> String {
        let scheme = if self.is_https() { "https" } else { "http" };
        if self.host.contains(':') {
            format!("{scheme}://[{}]:{}{}", self.host, self.port, self.path)
        } else {
            format!("{scheme}://{}:{}{}", self.host, self.port, self.path)
        }
    }
}

#[derive(Debug, Clone)]
pub struct ProbeResult {
    pub outcome: ProbeOutcome,
    pub status: Option<u16>,
    pub latency: Duration,
    pub note: String,
    /// The TLS handshake failed on the server's certificate (not trusted, wrong name, expired).
    pub cert_error: bool,
}

const MAX_HEAD: usize = 16 * 1024;

/// Why an attempt failed.
struct Failure {
    outcome: ProbeOutcome,
    note: String,
    cert_error: bool,
}

fn fail(outcome: ProbeOutcome, note: impl Into<String>) -> Failure {
    Failure { outcome, note: note.into(), cert_error: false }
}

pub async fn probe(t: &Target, timeout: Duration, bearer: Option<&str>) -> ProbeResult {
    let t0 = Instant::now();
    // Set while a TLS handshake is under way, so a timeout can say where it stopped.
    let handshaking = AtomicBool::new(false);
    // Set once the answer has begun: a timeout then is a head that never ended.
    let answering = AtomicBool::new(false);
    let r = tokio::time::timeout(timeout, attempt(t, bearer, &handshaking, &answering)).await;
    let latency = t0.elapsed();
    match r {
        Err(_) => {
            let during = if handshaking.load(Ordering::SeqCst) {
                " (TLS handshake not finished)"
            } else if answering.load(Ordering::SeqCst) {
                " (the answer began, its headers never ended)"
            } else {
                ""
            };
            ProbeResult {
                outcome: ProbeOutcome::Timeout,
                status: None,
                latency,
                note: format!("no answer within {:.1}s{during}", timeout.as_secs_f64()),
                cert_error: false,
            }
        }
        Ok(Err(f)) => ProbeResult { outcome: f.outcome, status: None, latency, note: f.note, cert_error: f.cert_error },
        Ok(Ok(code)) => {
            let outcome = if (200..300).contains(&code) { ProbeOutcome::Ok } else { ProbeOutcome::NotReady };
            ProbeResult { outcome, status: Some(code), latency, note: format!("HTTP {code}"), cert_error: false }
        }
    }
}

async fn attempt(
    t: &Target,
    bearer: Option<&str>,
    handshaking: &AtomicBool,
    answering: &AtomicBool,
) -> Result<u16, Failure> {
    let addrs: Vec<std::net::SocketAddr> = match tokio::net::lookup_host((t.host.as_str(), t.port)).await {
        Ok(a) => a.collect(),
        Err(e) => return Err(fail(ProbeOutcome::Error, format!("resolve {}: {e}", t.host))),
    };
    let s = match connect_any(&addrs).await {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            return Err(fail(ProbeOutcome::Refused, "connection refused"))
        }
        Err(e) => return Err(fail(ProbeOutcome::Error, format!("connect: {e}"))),
    };
    let host = if t.host.contains(':') { format!("[{}]", t.host) } else { t.host.clone() };
    let mut req = format!(
        "GET {} HTTP/1.1\r\nHost: {}:{}\r\nUser-Agent: vigil\r\nAccept: */*\r\nConnection: close\r\n",
        t.path, host, t.port
    );
    if let Some(b) = bearer {
        req.push_str(&format!("Authorization: Bearer {b}\r\n"));
    }
    req.push_str("\r\n");
    match &t.tls {
        None => status_of(s, &req, answering).await,
        Some(tls) => {
            handshaking.store(true, Ordering::SeqCst);
            let s = handshake(tls, s).await.map_err(|e| Failure {
                outcome: ProbeOutcome::Error,
                note: tls::describe(&e),
                cert_error: tls::is_cert_error(&e),
            })?;
            handshaking.store(false, Ordering::SeqCst);
            status_of(s, &req, answering).await
        }
    }
}

async fn handshake(tls: &Tls, s: TcpStream) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    tokio_rustls::TlsConnector::from(tls.config.clone()).connect(tls.name.clone(), s).await
}

/// A TLS peer that closes the connection without its `close_notify` alert gives `UnexpectedEof`
/// (plain TCP never does): after an answer has begun, that is the end of the answer.
fn is_eof(e: &std::io::Error, got: &[u8]) -> bool {
    e.kind() == std::io::ErrorKind::UnexpectedEof && !got.is_empty()
}

/// Where the head of an answer ends (after its blank line: `\r\n\r\n`, or a bare `\n\n` as lenient
/// HTTP/1.1 readers accept), if it has.
fn head_end(head: &[u8]) -> Option<usize> {
    let crlf = head.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4);
    let lf = head.windows(2).position(|w| w == b"\n\n").map(|i| i + 2);
    crlf.into_iter().chain(lf).min()
}

/// Sends the request and reads (bounded) the status line and the headers: a status counts only once the
/// headers have ended (a 200 whose headers never end is no answer; the probe's deadline ends it), and the
/// head may be at most `MAX_HEAD` bytes. The body is never read.
async fn status_of<S: AsyncRead + AsyncWrite + Unpin>(
    mut s: S,
    req: &str,
    answering: &AtomicBool,
) -> Result<u16, Failure> {
    s.write_all(req.as_bytes()).await.map_err(|e| fail(ProbeOutcome::Error, format!("send: {e}")))?;
    s.flush().await.map_err(|e| fail(ProbeOutcome::Error, format!("send: {e}")))?;
    let mut head = Vec::with_capacity(256);
    let mut buf = [0u8; 1024];
    let mut ended = false;
    loop {
        let n = match s.read(&mut buf).await {
            Ok(n) => n,
            Err(e) if is_eof(&e, &head) => 0,
            Err(e) => return Err(fail(ProbeOutcome::Error, format!("read: {e}"))),
        };
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
        answering.store(true, Ordering::SeqCst);
        if let Some(end) = head_end(&head) {
            head.truncate(end);
            ended = true;
            break;
        }
        if head.len() >= MAX_HEAD {
            break;
        }
    }
    let line_end = head.windows(2).position(|w| w == b"\r\n").unwrap_or(head.len());
    let status_line = String::from_utf8_lossy(&head[..line_end]);
    let mut parts = status_line.split_whitespace();
    let code = match (parts.next(), parts.next()) {
        (Some(v), Some(code)) if v.starts_with("HTTP/1.") => code
            .parse::<u16>()
            .ok()
            .filter(|c| (100..600).contains(c))
            .ok_or(fail(ProbeOutcome::Error, "bad status line"))?,
        _ if head.is_empty() => return Err(fail(ProbeOutcome::Error, "connection closed without an answer")),
        _ => return Err(fail(ProbeOutcome::Error, "not an HTTP answer")),
    };
    if !ended {
        let why = if head.len() >= MAX_HEAD {
            format!("HTTP {code} with headers longer than {} KiB: not counted", MAX_HEAD / 1024)
        } else {
            format!("HTTP {code} closed before its headers ended: not counted")
        };
        return Err(fail(ProbeOutcome::Error, why));
    }
    Ok(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_urls() {
        let t = Target::parse("http://127.0.0.1:8080/health").unwrap();
        assert_eq!((t.host.as_str(), t.port, t.path.as_str()), ("127.0.0.1", 8080, "/health"));
        let t = Target::parse("http://[::1]:9/x").unwrap();
        assert_eq!((t.host.as_str(), t.port), ("::1", 9));
        assert_eq!(Target::parse("http://h").unwrap().port, 80);
        assert!(Target::parse("ftp://x").is_err());
        assert!(Target::parse("http://h/").unwrap().tls.is_none());
        let insecure = TlsOpts { ca_cert: None, insecure: true };
        let t = Target::parse_with("https://node7.example/health", &insecure).unwrap();
        assert_eq!((t.port, t.is_https(), t.url().as_str()), (443, true, "https://node7.example:443/health"));
        let t = Target::parse_with("https://[::1]:8443/x", &insecure).unwrap();
        assert_eq!((t.port, t.url().as_str()), (8443, "https://[::1]:8443/x"));
        assert!(Target::parse("http://:80/").is_err());
        assert!(Target::parse("http://h:99999/").is_err());
    }
}

/// Connects to the first address that accepts, in resolver order: `localhost` resolving to `::1`
/// first while the server listens on 127.0.0.1 only still reaches it.
pub async fn connect_any(addrs: &[std::net::SocketAddr]) -> std::io::Result<TcpStream> {
    let mut last = std::io::Error::new(std::io::ErrorKind::NotFound, "no address");
    for a in addrs {
        match TcpStream::connect(a).await {
            Ok(s) => return Ok(s),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// The largest response body vigil reads (a generation answer is small; a hostile one is cut).
pub const MAX_BODY: usize = 1 << 20;

/// One HTTP/1.1 request with a JSON body (or none), a deadline and a bounded read. Returns the
/// status and the body (chunked encoding decoded).
pub async fn request(
    t: &Target,
    method: &str,
    path: &str,
    body: Option<&str>,
    timeout: Duration,
    bearer: Option<&str>,
) -> Result<(u16, Vec<u8>), String> {
    let fut = async {
        let addrs: Vec<std::net::SocketAddr> =
            tokio::net::lookup_host((t.host.as_str(), t.port)).await.map_err(|e| format!("resolve: {e}"))?.collect();
        let s = connect_any(&addrs).await.map_err(|e| format!("connect: {e}"))?;
        let host = if t.host.contains(':') { format!("[{}]", t.host) } else { t.host.clone() };
        let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {host}:{}\r\nUser-Agent: vigil\r\nAccept: application/json\r\nConnection: close\r\n", t.port);
        if let Some(b) = bearer {
            req.push_str(&format!("Authorization: Bearer {b}\r\n"));
        }
        if let Some(b) = body {
            req.push_str(&format!("Content-Type: application/json\r\nContent-Length: {}\r\n", b.len()));
        }
        req.push_str("\r\n");
        if let Some(b) = body {
            req.push_str(b);
        }
        let data = match &t.tls {
            None => exchange(s, &req).await?,
            Some(tls) => exchange(handshake(tls, s).await.map_err(|e| tls::describe(&e))?, &req).await?,
        };
        parse_response(&data)
    };
    tokio::time::timeout(timeout, fut).await.map_err(|_| format!("no answer within {:.1}s", timeout.as_secs_f64()))?
}

/// Sends the request and reads (bounded) the whole answer, until the server closes the connection.
async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(mut s: S, req: &str) -> Result<Vec<u8>, String> {
    s.write_all(req.as_bytes()).await.map_err(|e| format!("send: {e}"))?;
    s.flush().await.map_err(|e| format!("send: {e}"))?;
    let mut data = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        let n = match s.read(&mut buf).await {
            Ok(n) => n,
            Err(e) if is_eof(&e, &data) => 0,
            Err(e) => return Err(format!("read: {e}")),
        };
        if n == 0 {
            break;
        }
        data.extend_from_slice(&buf[..n]);
        if data.len() > MAX_BODY + MAX_HEAD {
            return Err(format!("answer larger than {} bytes", MAX_BODY));
        }
    }
    Ok(data)
}

fn parse_response(data: &[u8]) -> Result<(u16, Vec<u8>), String> {
    let end = data.windows(4).position(|w| w == b"\r\n\r\n").ok_or("no complete HTTP header")?;
    let head = String::from_utf8_lossy(&data[..end]);
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or("");
    let mut parts = status_line.split_whitespace();
    let code = match (parts.next(), parts.next()) {
        (Some(v), Some(c)) if v.starts_with("HTTP/1.") => c.parse::<u16>().map_err(|_| "bad status line")?,
        _ => return Err("not an HTTP answer".into()),
    };
    let chunked = lines.any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    let mut body = data[end + 4..].to_vec();
    if chunked {
        let mut out = Vec::new();
        let mut rest = &body[..];
        while let Some(i) = rest.windows(2).position(|w| w == b"\r\n") {
            let size =
                usize::from_str_radix(String::from_utf8_lossy(&rest[..i]).split(';').next().unwrap_or("").trim(), 16)
                    .map_err(|_| "bad chunk size")?;
            rest = &rest[i + 2..];
            if size == 0 || rest.len() < size {
                out.extend_from_slice(&rest[..size.min(rest.len())]);
                break;
            }
            out.extend_from_slice(&rest[..size]);
            rest = &rest[(size + 2).min(rest.len())..];
        }
        body = out;
    }
    Ok((code, body))
}

#[cfg(test)]
mod http_tests {
    use super::*;

    /// issue #36: a status counts once the headers end; a 200 whose headers never end is no answer (the
    /// probe's deadline ends it), and one that closes first is an error.
    #[test]
    fn a_status_counts_once_the_headers_end() {
        use tokio::io::AsyncWriteExt;
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let answer = |bytes: &'static [u8], close: bool| {
            rt.block_on(async move {
                let (client, mut server) = tokio::io::duplex(1 << 16);
                server.write_all(bytes).await.unwrap();
                if close {
                    // the peer's side ends (its half closed) before the headers do
                    server.shutdown().await.unwrap();
                    let r = status_of(client, "GET / HTTP/1.1\r\n\r\n", &AtomicBool::new(false)).await;
                    drop(server);
                    return r.map_err(|f| f.note);
                }
                let begun = AtomicBool::new(false);
                let r = tokio::time::timeout(
                    Duration::from_millis(200),
                    status_of(client, "GET / HTTP/1.1\r\n\r\n", &begun),
                )
                .await;
                drop(server);
                match r {
                    Ok(r) => r.map_err(|f| f.note),
                    Err(_) => Err(format!("timed out (answer begun: {})", begun.load(Ordering::SeqCst))),
                }
            })
        };
        assert_eq!(answer(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", false), Ok(200));
        assert_eq!(answer(b"HTTP/1.1 503 Loading\n\n", false), Ok(503));
        assert_eq!(answer(b"HTTP/1.1 200 OK\r\nX-Pad: a\r\n", false), Err("timed out (answer begun: true)".into()));
        let e = answer(b"HTTP/1.1 200 OK\r\nX-Pad: a\r\n", true).unwrap_err();
        assert!(e.contains("closed before its headers ended"), "{e}");
    }

    #[test]
    fn ipv6_first_falls_back_to_ipv4() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        // what `localhost` gives where ::1 comes first: the server listens on 127.0.0.1 only
        let addrs: Vec<std::net::SocketAddr> =
            vec![format!("[::1]:{port}").parse().unwrap(), format!("127.0.0.1:{port}").parse().unwrap()];
        let s = rt.block_on(connect_any(&addrs)).expect("fell back to 127.0.0.1");
        assert_eq!(s.peer_addr().unwrap().ip().to_string(), "127.0.0.1");
    }

    #[test]
    fn parses_plain_and_chunked() {
        let (c, b) = parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi").unwrap();
        assert_eq!((c, b.as_slice()), (200, &b"hi"[..]));
        let (c, b) =
            parse_response(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")
                .unwrap();
        assert_eq!((c, b.as_slice()), (200, &b"abcde"[..]));
        assert!(parse_response(b"garbage").is_err());
        assert!(parse_response(b"SSH-2.0-x\r\n\r\n").is_err());
    }
}
