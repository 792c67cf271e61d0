//! Outcomes as types: every exit code of vigil, with an explicit severity order (documented in the README).

/// The server is ready (diagnose: the log proves it was ready).
pub const READY: i32 = 0;
/// An unexpected internal error in vigil itself.
pub const INTERNAL: i32 = 1;
/// Bad command line or input (unreadable file, bad profile, bad duration).
pub const USAGE: i32 = 2;
/// The server crashed (fatal marker or exit before ready, or an exit after ready neither asked for nor status 0).
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
/// The keeper of the run died while its server lives on: the server's output after that is lost (`wait`,
/// `watch` and `up` of a run; `vigil down` still stops the server).
pub const KEEPER_DIED: i32 = 13;
/// vigil was interrupted (SIGINT / SIGTERM) before a verdict.
pub const INTERRUPTED: i32 = 130;

use crate::Verdict;

/// Every exit code as a type, with an explicit severity order for commands that report several
/// outcomes in one code (a fleet, several hosts, several files): the most severe wins.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Exit {
    // Declaration order is the severity order, least severe first.
    Ready,
    /// Ready but degraded: the server serves, so it ranks below every failure.
    Degraded,
    /// `vigil probe` only: not ready (Kubernetes' exec-probe convention, any non-zero fails the probe).
    /// Its code is 1, shared with `Internal`: a code of 1 read back is `Internal`.
    NotReady,
    Starting,
    Timeout,
    Unhealthy,
    Stalled,
    Crashed,
    /// The run's keeper died; the server lives on unwatched.
    KeeperDied,
    /// Nothing was launched (port taken, earlier run alive; check errors).
    Refused,
    CheckFailed,
    NotStopped,
    Unreachable,
    Usage,
    Internal,
    /// The person stopped the whole command: it outranks what any host said.
    Interrupted,
}

impl Exit {
    pub const ALL: [Exit; 16] = [
        Exit::Ready,
        Exit::Degraded,
        Exit::NotReady,
        Exit::Starting,
        Exit::Timeout,
        Exit::Unhealthy,
        Exit::Stalled,
        Exit::Crashed,
        Exit::KeeperDied,
        Exit::Refused,
        Exit::CheckFailed,
        Exit::NotStopped,
        Exit::Unreachable,
        Exit::Usage,
        Exit::Internal,
        Exit::Interrupted,
    ];

    pub fn code(self) -> i32 {
        match self {
            Exit::Ready => READY,
            Exit::Degraded => DEGRADED,
            Exit::NotReady => INTERNAL,
            Exit::Starting => STARTING,
            Exit::Timeout => TIMEOUT,
            Exit::Unhealthy => UNHEALTHY,
            Exit::Stalled => STALLED,
            Exit::Crashed => CRASHED,
            Exit::KeeperDied => KEEPER_DIED,
            Exit::Refused => REFUSED,
            Exit::CheckFailed => CHECK_FAILED,
            Exit::NotStopped => NOT_STOPPED,
            Exit::Unreachable => UNREACHABLE,
            Exit::Usage => USAGE,
            Exit::Internal => INTERNAL,
            Exit::Interrupted => INTERRUPTED,
        }
    }

    /// The outcome a verdict ends a command with.
    pub fn for_verdict(v: Verdict) -> Exit {
        match v {
            Verdict::Ready => Exit::Ready,
            Verdict::Crashed => Exit::Crashed,
            Verdict::Stalled => Exit::Stalled,
            Verdict::Timeout => Exit::Timeout,
            Verdict::Unhealthy => Exit::Unhealthy,
            Verdict::Starting => Exit::Starting,
        }
    }

    /// The outcome's one word, as every sink writes it (a host's row, a rank's line, a summary).
    pub fn word(self) -> &'static str {
        match self {
            Exit::Ready => "ready",
            Exit::Degraded => "degraded",
            Exit::NotReady => "not ready",
            Exit::Starting => "starting",
            Exit::Timeout => "timeout",
            Exit::Unhealthy => "unhealthy",
            Exit::Stalled => "stalled",
            Exit::Crashed => "crashed",
            Exit::KeeperDied => "keeper died",
            Exit::Refused => "refused",
            Exit::CheckFailed => "check failed",
            Exit::NotStopped => "not stopped",
            Exit::Unreachable => "unreachable",
            Exit::Usage => "error",
            Exit::Internal => "internal error",
            Exit::Interrupted => "interrupted",
        }
    }

    /// The code's meaning; an unknown code is an internal error.
    pub fn from_code(c: i32) -> Exit {
        Exit::ALL.into_iter().filter(|e| *e != Exit::NotReady).find(|e| e.code() == c).unwrap_or(Exit::Internal)
    }
}

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.word())
    }
}

/// On a wire (the Slurm ranks' protocol, JSON events) an outcome is its exit code.
impl serde::Serialize for Exit {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_i32(self.code())
    }
}

impl<'de> serde::Deserialize<'de> for Exit {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Exit, D::Error> {
        let c = <i32 as serde::Deserialize>::deserialize(d)?;
        let e = Exit::from_code(c);
        if e.code() != c {
            return Err(serde::de::Error::custom(format!("{c} is not an exit code of vigil")));
        }
        Ok(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_are_distinct() {
        for e in Exit::ALL.into_iter().filter(|e| *e != Exit::NotReady) {
            assert_eq!(Exit::from_code(e.code()), e);
        }
        assert_eq!(Exit::from_code(Exit::NotReady.code()), Exit::Internal);
        let mut codes: Vec<i32> = Exit::ALL.iter().filter(|e| **e != Exit::NotReady).map(|e| e.code()).collect();
        codes.sort();
        codes.dedup();
        assert_eq!(codes.len(), Exit::ALL.len() - 1);
    }

    /// Issue #14: a fleet where one host crashed and another is degraded exits 3, not 11.
    #[test]
    fn crashed_outranks_degraded_and_every_verdict_outranks_ready() {
        assert_eq!(Exit::Degraded.max(Exit::Crashed).code(), CRASHED);
        assert_eq!(Exit::Crashed.max(Exit::Degraded).code(), CRASHED);
        assert_eq!(Exit::Ready.max(Exit::Degraded).code(), DEGRADED);
        assert_eq!(Exit::Stalled.max(Exit::Crashed).code(), CRASHED);
        assert_eq!(Exit::Crashed.max(Exit::Unreachable).code(), UNREACHABLE);
        assert_eq!(Exit::Unreachable.max(Exit::Interrupted).code(), INTERRUPTED);
        for e in Exit::ALL {
            assert_eq!(Exit::Ready.max(e), e);
        }
    }
}
