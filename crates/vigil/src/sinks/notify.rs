//! systemd integration: when `NOTIFY_SOCKET` is set (vigil as the `Type=notify` main process of a
//! unit), send `STATUS=` on phase changes and on every verdict, `EXTEND_TIMEOUT_USEC=` while startup is
//! alive by vigil's own judgement, `READY=1` only at the ready verdict, `WATCHDOG=1` while healthy (when
//! `WATCHDOG_USEC` is set and `WATCHDOG_PID`, if set, is vigil's pid), and `STOPPING=1` when the watch
//! ends in order. The machine's messages are [`Notify`]; the [`Notifier`] follows them as a
//! `sinks::sink::Sink`.
//!
//! These variables are vigil's, not the server's: `up` removes them from the environment it records
//! and passes on ([`NOTIFY_VARS`]).

use std::os::unix::net::UnixDatagram;
use std::time::{Duration, Instant};

/// A message for systemd (when vigil runs under it).
#[derive(Debug, Clone, PartialEq)]
pub enum Notify {
    Status(String),
    /// A healthy probe while watching (the watchdog).
    Healthy,
    /// The watch ends in order.
    Stopping(String),
    /// While starting: how long vigil still gives the startup; `now`: the phase changed.
    Extend {
        left: Duration,
        now: bool,
    },
}

/// The service manager's variables addressed to vigil itself: never passed to the server, never stored
/// in a run record (a `restart` would otherwise replay a dead socket path or another unit's watchdog).
pub const NOTIFY_VARS: [&str; 3] = ["NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"];

/// Beyond the moment vigil itself would decide, the deadline systemd is given: vigil's verdict (and its
/// `STATUS=`) always comes before systemd's kill.
const EXTEND_MARGIN: Duration = Duration::from_secs(5);

pub struct Notifier {
    sock: UnixDatagram,
    path: String,
    pub watchdog: Option<Duration>,
    last_watchdog: Option<Instant>,
    /// When the last extension was sent and the deadline it gave.
    last_extend: Option<(Instant, Duration)>,
}

impl Notifier {
    pub fn from_env() -> Option<Notifier> {
        let path = std::env::var("NOTIFY_SOCKET").ok().filter(|p| !p.is_empty())?;
        let sock = UnixDatagram::unbound().ok()?;
        // sd_watchdog_enabled(): WATCHDOG_PID, when set, names the process that must ping.
        let ours = std::env::var("WATCHDOG_PID")
            .ok()
            .is_none_or(|p| p.trim().parse::<u32>().is_ok_and(|p| p == std::process::id()));
        let watchdog = std::env::var("WATCHDOG_USEC")
            .ok()
            .and_then(|u| u.parse::<u64>().ok())
            .filter(|u| *u > 0 && ours)
            .map(Duration::from_micros);
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

    /// While starting: `left` is how long vigil itself still gives the startup (the stall limit of the
    /// phase minus the time since the last sign of progress, capped by `--timeout`). systemd's start
    /// deadline is moved to `left` + a margin, renewed well before the previous one runs out (at most
    /// every 5 s, at least every third of the window) and at once on a phase change.
    pub fn extend(&mut self, left: Duration, now: bool) {
        let by = left + EXTEND_MARGIN;
        if let Some((at, prev)) = self.last_extend {
            let every = (prev / 3).min(Duration::from_secs(5));
            if !now && at.elapsed() < every {
                return;
            }
        }
        self.last_extend = Some((Instant::now(), by));
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

/// systemd follows the watch: the machine's messages, `READY=1` or the bad verdict's `STATUS=`, and
/// `STOPPING=1` when the watch ends in order.
impl crate::sinks::sink::Sink for Notifier {
    fn notify(&mut self, n: &Notify) {
        match n {
            Notify::Status(s) => self.status(s),
            Notify::Healthy => self.healthy(),
            Notify::Extend { left, now } => self.extend(*left, *now),
            Notify::Stopping(_) => {} // told through `stopping`
        }
    }

    fn verdict(&mut self, _t_ms: u64, r: &vigil_core::Report) {
        if r.verdict == vigil_core::Verdict::Ready {
            self.ready(&format!(
                "ready{}",
                r.degraded.as_ref().map(|d| format!(" (degraded: {d})")).unwrap_or_default()
            ));
        } else {
            let cause = r.cause.map(|c| format!(" ({c})")).unwrap_or_default();
            self.status(&format!("{}{cause} in {}", r.verdict, r.phase));
        }
    }

    fn stopping(&mut self, why: &str) {
        self.send(&format!("STOPPING=1\nSTATUS=stopping: {}", why.replace('\n', " ")));
    }
}
