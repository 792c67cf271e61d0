//! Prometheus metrics (`--metrics ADDR`, loopback by default): phase, time in phase, verdict, probe
//! latency, restarts, in the exposition format, served by a small bounded HTTP endpoint.

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use vigil_core::{Phase, Verdict};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabel {
    server: String,
    phase: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VerdictLabel {
    server: String,
    verdict: String,
}

#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Mutex<Registry>>,
    phase: Family<PhaseLabel, Gauge>,
    verdict: Family<VerdictLabel, Gauge>,
    phase_seconds: Gauge<f64, AtomicU64>,
    probe_latency: Gauge<f64, AtomicU64>,
    server: Arc<Mutex<String>>,
}

/// Binds `--metrics ADDR` now: settings are resolved before any side effect, so a taken port is a usage
/// error before a server is launched (issue #14).
pub fn bind(addr: std::net::SocketAddr) -> Result<std::sync::Arc<std::net::TcpListener>, crate::cli::CliError> {
    std::net::TcpListener::bind(addr)
        .map(std::sync::Arc::new)
        .map_err(|e| crate::cli::CliError::usage(format!("--metrics {addr}: {e}")))
}

impl Metrics {
    pub fn new(restart_count: u64) -> Metrics {
        let (phase, verdict) = (Family::default(), Family::default());
        let (phase_seconds, probe_latency) = (Gauge::default(), Gauge::default());
        let restarts: Counter = Counter::default();
        restarts.inc_by(restart_count);
        let mut r = Registry::default();
        r.register("vigil_phase", "1 for the server's current startup phase, 0 for the others", phase.clone());
        r.register(
            "vigil_verdict",
            "1 for the current verdict (starting, ready, crashed, stalled, timeout, unhealthy)",
            verdict.clone(),
        );
        r.register("vigil_phase_seconds", "Seconds in the current phase", phase_seconds.clone());
        r.register("vigil_probe_latency_seconds", "Latency of the last health probe", probe_latency.clone());
        r.register("vigil_restarts", "Restarts of this run (vigil restart)", restarts.clone());
        Metrics {
            registry: Arc::new(Mutex::new(r)),
            phase,
            verdict,
            phase_seconds,
            probe_latency,
            server: Arc::new(Mutex::new("unknown".into())),
        }
    }

    pub fn set_server(&self, s: &str) {
        *self.server.lock().unwrap() = s.to_string();
    }

    pub fn update(&self, phase: Phase, in_phase_s: f64, verdict: Verdict) {
        let server = self.server.lock().unwrap().clone();
        for p in Phase::ALL {
            self.phase
                .get_or_create(&PhaseLabel { server: server.clone(), phase: p.as_str().into() })
                .set(i64::from(p == phase));
        }
        for v in [
            Verdict::Starting,
            Verdict::Ready,
            Verdict::Crashed,
            Verdict::Stalled,
            Verdict::Timeout,
            Verdict::Unhealthy,
        ] {
            self.verdict
                .get_or_create(&VerdictLabel { server: server.clone(), verdict: v.as_str().into() })
                .set(i64::from(v == verdict));
        }
        self.phase_seconds.set(in_phase_s);
    }

    pub fn probe_latency(&self, s: f64) {
        self.probe_latency.set(s);
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = encode(&mut out, &self.registry.lock().unwrap());
        out
    }

    /// Serves GET /metrics on `addr` until the runtime ends.
    /// Serves on a listener bound earlier by [`bind`] (before anything was launched).
    pub fn serve(self, l: &std::net::TcpListener) -> std::io::Result<std::net::SocketAddr> {
        let l = l.try_clone()?;
        l.set_nonblocking(true)?;
        let l = tokio::net::TcpListener::from_std(l)?;
        let local = l.local_addr()?;
        tokio::spawn(async move {
            loop {
                let Ok((mut s, _)) = l.accept().await else { continue };
                let m = self.clone();
                tokio::spawn(async move {
                    let mut buf = [0u8; 2048];
                    let n = match tokio::time::timeout(std::time::Duration::from_secs(5), s.read(&mut buf)).await {
                        Ok(Ok(n)) => n,
                        _ => return,
                    };
                    let ok = buf[..n].starts_with(b"GET /metrics");
                    let (status, body) =
                        if ok { ("200 OK", m.render()) } else { ("404 Not Found", "not found\n".into()) };
                    let resp = format!(
                        "HTTP/1.1 {status}\r\nContent-Type: application/openmetrics-text; version=1.0.0; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = s.write_all(resp.as_bytes()).await;
                });
            }
        });
        Ok(local)
    }
}

/// `--metrics 9464` → 127.0.0.1:9464; `--metrics HOST:PORT` as given.
pub fn parse_addr(s: &str) -> Result<std::net::SocketAddr, String> {
    if let Ok(p) = s.parse::<u16>() {
        return Ok(std::net::SocketAddr::from(([127, 0, 0, 1], p)));
    }
    s.parse().map_err(|_| format!("--metrics: bad address '{s}' (PORT or HOST:PORT)"))
}
