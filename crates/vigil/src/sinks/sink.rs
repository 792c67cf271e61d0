//! The `Sink` trait: every call a watch makes on its outputs. The watch's I/O loop (`supervise/wait.rs`)
//! tells each of its sinks, in a fixed order, the same things: the history recorder (`sources::history`:
//! it records the verdict), the metrics (`metrics::Metrics`), the run's verdict file
//! (`node::run::VerdictFile`), systemd (`notify::Notifier`) and last the reporter (`report::Reporter`:
//! TTY, plain or JSON lines). Every method has an empty default, so a sink implements only what it
//! follows, and a new sink is one `impl`, not a new branch in the loop.

use crate::sinks::events::WatchEvent;
use crate::sinks::notify::Notify;
use std::time::Duration;
use vigil_core::{Event, Judge, Report, Verdict};

/// What a watch tells its outputs. Times are the milliseconds since the watch began.
pub trait Sink {
    /// A free-text note (JSON: the `note` event).
    fn note(&mut self, _t_ms: u64, _msg: &str) {}
    /// A note with data (`events::Typed`): by default what [`Sink::note`] does with its message.
    fn typed(&mut self, t_ms: u64, msg: &str, _what: &crate::sinks::events::Typed) {
        self.note(t_ms, msg);
    }
    /// `--echo`: a log line as read.
    fn echo(&mut self, _t_ms: u64, _line: &str) {}
    /// One of vigil's own events (`docs/events.md`).
    fn emit(&mut self, _t_ms: Option<u64>, _ev: &WatchEvent<'_>) {}
    /// One of the judge's events (a verdict comes through [`Sink::verdict`] instead).
    fn event(&mut self, _t_ms: u64, _ev: &Event) {}
    /// The live status from the judge (with the probe's text), after an input.
    fn live(&mut self, _t_ms: u64, _j: &Judge, _server: Option<&str>, _probe: Option<&str>) {}
    /// The judge's state as gauges (phase, time in phase, verdict; the server kind once known).
    fn gauges(&mut self, _j: &Judge, _server: Option<&str>, _v: Verdict) {}
    /// A health probe's latency.
    fn probe_latency(&mut self, _latency: Duration) {}
    /// A message for the service manager (status, watchdog, start deadline).
    fn notify(&mut self, _n: &Notify) {}
    /// A verdict: ready, or one that ends the watch.
    fn verdict(&mut self, _t_ms: u64, _r: &Report) {}
    /// The watch ends in order (a stop was asked for, the server exited with status 0 after ready, or
    /// SIGTERM while watching): `why` says how.
    fn stopping(&mut self, _why: &str) {}
    /// After an orderly stop: the run's last report (its verdict as it was, its detail says how).
    fn stopped(&mut self, _r: &Report) {}
}
