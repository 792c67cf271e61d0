//! systemd integration: when `NOTIFY_SOCKET` is set (vigil as the `Type=notify` main process of a
//! unit), send `STATUS=` on phase changes, `EXTEND_TIMEOUT_USEC=` while startup progresses, `READY=1`
//! only at the ready verdict, and `WATCHDOG=1` while healthy (when `WATCHDOG_USEC` is set).

use std::os::unix::net::UnixDatagram;
use std::time::{Duration, Instant};

pub struct Notifier {
    sock: UnixDatagram,
    path: String,
    pub watchdog: Option<Duration>,
    last_watchdog: Option<Instant>,
    last_extend: Option<Instant>,
}

impl Notifier {
    pub fn from_env() -> Option<Notifier> {
        let path = std::env::var("NOTIFY_SOCKET").ok().filter(|p| !p.is_empty())?;
        let sock = UnixDatagram::unbound().ok()?;
        let watchdog =
            std::env::var("WATCHDOG_USEC").ok().and_then(|u| u.parse::<u64>().ok()).map(Duration::from_micros);
        Some(Notifier { sock, path, watchdog, last_watchdog: None, last_extend: None })
    }

    pub fn send(&self, msg: &str) {
        if let Some(name) = self.path.strip_prefix('@') {
            use std::os::linux::net::SocketAddrExt;
            if let Ok(addr) = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()) {
                let _ = self.sock.send_to_addr(msg.as_bytes(), &addr);
            }
        } else {
            let _ = self.sock.send_to(msg.as_bytes(), &self.path);
        }
    }

    pub fn status(&self, s: &str) {
        self.send(&format!("STATUS={}", s.replace('\n', " ")));
    }

    /// While startup progresses: extend the unit's start timeout by the current stall limit.
    pub fn extend(&mut self, by: Duration) {
        if self.last_extend.is_some_and(|t| t.elapsed() < Duration::from_secs(5)) {
            return;
        }
        self.last_extend = Some(Instant::now());
        self.send(&format!("EXTEND_TIMEOUT_USEC={}", by.as_micros()));
    }

    pub fn ready(&self, status: &str) {
        self.send(&format!("READY=1\nSTATUS={}", status.replace('\n', " ")));
    }

    /// After a healthy probe: feed the watchdog at most twice per interval.
    pub fn healthy(&mut self) {
        let Some(w) = self.watchdog else { return };
        if self.last_watchdog.is_some_and(|t| t.elapsed() < w / 2) {
            return;
        }
        self.last_watchdog = Some(Instant::now());
        self.send("WATCHDOG=1");
    }
}
