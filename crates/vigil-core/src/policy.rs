//! What vigil does with a server it leaves stuck (issue #17): `--on-stall keep|stop`.
//!
//! A stalled server left unattended holds its GPUs for hours (the seed's 8-hour zombie); a crashed one
//! whose HTTP process lingers, or one whose engine died while the front end answers, is no better. After
//! the evidence is saved, `stop` stops its tree and proves the port and GPU memory free; `keep` leaves it
//! for a person to look at. Defaults (chosen by the caller): `stop` for a server vigil launched (`up`),
//! `keep` for one it attached to (`wait`): a server vigil did not start is not vigil's to stop.

use crate::judge::Report;
use crate::types::{Cause, Verdict};
use serde::Serialize;

/// Keep is the default: a server vigil only attached to is not vigil's to stop.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OnStall {
    #[default]
    Keep,
    Stop,
}

impl OnStall {
    pub fn parse(s: &str) -> Option<OnStall> {
        match s {
            "keep" => Some(OnStall::Keep),
            "stop" => Some(OnStall::Stop),
            _ => None,
        }
    }
}

/// What of the server the policy acts on, by the verdict it acts on: named in every line it writes, so that
/// a stop after a crash never reads as a stop of a stall. Its verdicts, when processes of the server still
/// live: stalled (the whole stuck server); crashed (its HTTP process or a child lingers); unhealthy because
/// the engine died. Not `timeout` (still progressing: the deadline was the caller's, the server may well
/// finish) and not other `unhealthy` verdicts (failing probes can pass; stopping a server that would recover
/// is the worst mistake).
fn subject(verdict: Verdict, cause: Option<Cause>) -> Option<&'static str> {
    match verdict {
        Verdict::Stalled => Some("the stuck server"),
        Verdict::Crashed => Some("the leftover processes"),
        Verdict::Unhealthy if cause == Some(Cause::EngineDead) => Some("the server whose engine died"),
        _ => None,
    }
}

/// Does the policy apply to this verdict (see [`subject`])?
pub fn applies(r: &Report) -> bool {
    subject(r.verdict, r.cause).is_some()
}

/// What the policy did, told as an event.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct StallAction {
    /// The verdict the policy acted on (and its cause): why it acted.
    pub verdict: Verdict,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cause: Option<Cause>,
    pub action: OnStall,
    /// Processes of the server's tree when the policy applied.
    pub pids: Vec<i32>,
    /// Processes still alive after a stop (empty: none left).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub survivors: Vec<i32>,
    /// The server's port, when known, and whether it was free after the stop.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port_free: Option<bool>,
    /// Whether the GPU memory the tree held was released (absent: no GPU reading, or the tree held none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_released: Option<bool>,
    /// The node the run is on, for a run over SSH (its pids are the node's; a stop is proven there).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// Why the stop could not be done or proven (the node did not answer): nothing is claimed then.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failed: Option<String>,
    /// For people, after the outcome: how to stop what was kept (`` `vigil down NAME` stops it ``), who holds
    /// a port the stop did not free.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl StallAction {
    /// The policy `action` on the verdict `r`, before it is carried out (the caller fills in the rest).
    pub fn new(action: OnStall, r: &Report) -> StallAction {
        StallAction {
            verdict: r.verdict,
            cause: r.cause,
            action,
            pids: Vec::new(),
            survivors: Vec::new(),
            port: None,
            port_free: None,
            gpu_released: None,
            host: None,
            failed: None,
            note: None,
        }
    }

    /// One line for people and the event: the verdict acted on, what was done to what, then the outcome, e.g.
    /// `crashed: stopped the leftover processes: 2 process(es), none left; port 8080 free`. The flag is named
    /// where it is this verdict's (`--on-stall` on a stall); the clean-up after a crash or a dead engine is
    /// the run's, and it is never put in the verdict's detail (the root cause is; issue #33).
    pub fn line(&self) -> String {
        let what = subject(self.verdict, self.cause).unwrap_or("the server");
        let on = self.host.as_deref().map(|h| format!(" on {h}")).unwrap_or_default();
        let (done, flag) = match self.action {
            OnStall::Keep => (format!("kept {what} running{on}"), "keep"),
            OnStall::Stop if self.failed.is_some() || !self.survivors.is_empty() => {
                (format!("could not stop {what}{on}"), "stop")
            }
            OnStall::Stop => (format!("stopped {what}{on}"), "stop"),
        };
        let flag = if self.verdict == Verdict::Stalled { format!(" (--on-stall {flag})") } else { String::new() };
        let n = self.pids.len();
        let outcome = match (self.action, &self.failed) {
            (_, Some(f)) => f.clone(),
            (OnStall::Stop, None) if !self.survivors.is_empty() => format!("pids {:?} still alive", self.survivors),
            // a run on a node: its pids are the node's, the stop is proven there
            (OnStall::Stop, None) if self.host.is_some() => "none left".to_string(),
            (OnStall::Stop, None) => format!("{n} process(es), none left"),
            (OnStall::Keep, None) if self.host.is_some() => "left as it is".to_string(),
            (OnStall::Keep, None) => format!("{n} process(es) left as they are"),
        };
        let port = match (self.port, self.port_free) {
            (Some(p), Some(true)) => format!("; port {p} free"),
            (Some(p), Some(false)) => format!("; port {p} still taken"),
            _ => String::new(),
        };
        let note = self.note.as_deref().map(|c| format!("; {c}")).unwrap_or_default();
        format!("{}: {done}{flag}: {outcome}{port}{note}", self.verdict)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Phase;

    fn report(verdict: Verdict, cause: Option<Cause>) -> Report {
        Report { cause, ..Report::bare(verdict, Phase::Weights) }
    }

    /// Issue #25 step 8: a stop after a crash names the crash, never a stall.
    #[test]
    fn the_line_names_the_verdict_acted_on() {
        let mut a = StallAction::new(OnStall::Stop, &report(Verdict::Crashed, Some(Cause::EngineDead)));
        a.pids = vec![10, 11];
        a.port = Some(8080);
        a.port_free = Some(true);
        assert_eq!(a.line(), "crashed: stopped the leftover processes: 2 process(es), none left; port 8080 free");
        let mut s = StallAction::new(OnStall::Stop, &report(Verdict::Stalled, None));
        s.pids = vec![10];
        s.survivors = vec![10];
        assert_eq!(s.line(), "stalled: could not stop the stuck server (--on-stall stop): pids [10] still alive");
        let mut u = StallAction::new(OnStall::Keep, &report(Verdict::Unhealthy, Some(Cause::EngineDead)));
        u.host = Some("gpu7".into());
        assert_eq!(u.line(), "unhealthy: kept the server whose engine died running on gpu7: left as it is");
        let mut f = StallAction::new(OnStall::Stop, &report(Verdict::Stalled, None));
        f.host = Some("gpu7".into());
        f.failed = Some("the connection to gpu7 was lost".into());
        assert_eq!(
            f.line(),
            "stalled: could not stop the stuck server on gpu7 (--on-stall stop): the connection to gpu7 was lost"
        );
    }

    /// The event carries the verdict (and cause) it acted on.
    #[test]
    fn the_event_names_the_verdict() {
        let a = StallAction::new(OnStall::Stop, &report(Verdict::Crashed, Some(Cause::EngineDead)));
        let v = serde_json::to_value(&a).unwrap();
        assert_eq!(
            (v["verdict"].as_str(), v["cause"].as_str(), v["action"].as_str()),
            (Some("crashed"), Some("engine_dead"), Some("stop"))
        );
        let s = serde_json::to_value(StallAction::new(OnStall::Keep, &report(Verdict::Stalled, None))).unwrap();
        assert_eq!(s["verdict"], "stalled");
        assert!(s.get("cause").is_none(), "{s}");
    }

    #[test]
    fn applies_to_stuck_servers_only() {
        assert!(applies(&report(Verdict::Stalled, None)));
        assert!(applies(&report(Verdict::Crashed, Some(Cause::GpuOom))));
        assert!(applies(&report(Verdict::Unhealthy, Some(Cause::EngineDead))));
        assert!(!applies(&report(Verdict::Unhealthy, None)));
        assert!(!applies(&report(Verdict::Timeout, None)));
        assert!(!applies(&report(Verdict::Ready, None)));
    }
}
