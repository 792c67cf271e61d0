//! Exit codes: one place, documented in the README.

/// The server is ready (diagnose: the log proves it was ready).
pub const READY: i32 = 0;
/// An unexpected internal error in vigil itself.
pub const INTERNAL: i32 = 1;
/// Bad command line or input (unreadable file, bad profile, bad duration).
pub const USAGE: i32 = 2;
/// The server crashed (fatal marker or exit before ready, or an unrequested exit after ready).
pub const CRASHED: i32 = 3;
/// Alive but no progress for the phase's stall limit.
pub const STALLED: i32 = 4;
/// The overall --timeout passed while the server was still progressing.
pub const TIMEOUT: i32 = 5;
/// Ready earlier, then health failing while the process lives.
pub const UNHEALTHY: i32 = 6;
/// diagnose only: the log ends while the server is still starting.
pub const STARTING: i32 = 7;
/// `up` refused to launch (port taken, earlier run alive).
pub const REFUSED: i32 = 8;
/// `down`: some process of the tree would not die (named in the output).
pub const NOT_STOPPED: i32 = 9;
/// `check` (or `up` running it) found errors: nothing was launched.
pub const CHECK_FAILED: i32 = 10;
/// Ready, but degraded (e.g. speculative decoding asked for and off).
pub const DEGRADED: i32 = 11;
/// A remote host could not be reached over SSH (closed port, no SSH, unknown host key, refused
/// key), or the connection was lost and did not come back within the reconnect window.
pub const UNREACHABLE: i32 = 12;
/// vigil was interrupted (SIGINT / SIGTERM) before a verdict.
pub const INTERRUPTED: i32 = 130;

use vigil_core::Verdict;

pub fn for_verdict(v: Verdict) -> i32 {
    match v {
        Verdict::Ready => READY,
        Verdict::Crashed => CRASHED,
        Verdict::Stalled => STALLED,
        Verdict::Timeout => TIMEOUT,
        Verdict::Unhealthy => UNHEALTHY,
        Verdict::Starting => STARTING,
    }
}

/// Severity order for several verdicts (diagnose of several files): the worst wins.
pub fn worst(a: i32, b: i32) -> i32 {
    let rank = |c: i32| match c {
        READY => 0,
        STARTING => 1,
        UNHEALTHY => 2,
        TIMEOUT => 3,
        STALLED => 4,
        CRASHED => 5,
        UNREACHABLE => 6,
        _ => 7,
    };
    if rank(b) > rank(a) {
        b
    } else {
        a
    }
}
