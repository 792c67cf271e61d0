//! What a command reports while it runs, as one typed stream. The judge's own events (`vigil_core::Event`:
//! phase, progress, verdict) and these are everything `up`, `wait`, `diagnose` and the multi-node driver
//! say; the sinks in `report.rs` render them (TTY and plain lines, JSON lines) behind one redactor. This
//! enum is the JSON schema that `docs/events.md` describes: fields carry typed data, never text formatted
//! for one sink. What a run records on disk (`events.jsonl`) is the second enum, [`RunEvent`]. The payloads
//! that no lower layer owns are defined here ([`StopReport`]: `procs::stop_tree` returns it); the
//! generation proof's is `vigil_core::proof::Generation`.

use serde::Serialize;

/// The version of the event schema, carried by every event object as `"v"` (docs/events.md). 2: notes carry
/// `type` and data (`Typed`), `rank_phase`; 1 (no `v`): before issue #37. Fields are only ever added.
pub const SCHEMA: u32 = 2;
use std::collections::BTreeMap;
use vigil_core::proof::Generation;
use vigil_core::{Cause, Phase, ProbeOutcome};

#[derive(Debug, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum WatchEvent<'a> {
    /// A watch begins: what it watches.
    Start {
        #[serde(skip_serializing_if = "Option::is_none")]
        url: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        log: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pid: Option<i32>,
        #[serde(skip_serializing_if = "Option::is_none")]
        server: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        remote_run: Option<&'a str>,
    },
    /// The server kind, recognised from the log (`line`: where, for `diagnose`).
    Detected {
        server: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        line: Option<u64>,
    },
    /// A health probe's outcome changed.
    Probe { outcome: ProbeOutcome, status: Option<u16>, latency_ms: u64, note: &'a str },
    /// GPU memory held by the server's process tree changed.
    Gpu { held_mib: u64, per_gpu_mib: &'a BTreeMap<u32, u64>, host_pids: bool },
    /// A generation request (the proof, or a probe while watching) came back.
    Generation(&'a Generation),
    /// `up` started the server under its keeper (`on`: the host, for `--host`).
    Launched {
        name: &'a str,
        pid: i64,
        keeper_pid: i64,
        #[serde(skip_serializing_if = "Option::is_none")]
        run_dir: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        on: Option<&'a str>,
        /// Shown to people; the JSON has the run directory.
        #[serde(skip)]
        log: Option<String>,
    },
    /// The SSH connection dropped (shown to people only: in JSON, `reconnected` says it all).
    Disconnected,
    /// The SSH connection came back; the log resumes at byte `log_offset`.
    Reconnected { to: &'a str, down_ms: u64, log_offset: u64 },
    /// The server exited after ready, in order (asked for, or status 0): the watch ends.
    Stopped { how: &'a str, exit_code: Option<i32>, signal: Option<i32>, requested: bool },
    /// `down --pid`: what stopping a process tree did.
    #[serde(rename = "stopped")]
    TreeStopped { pid: i32, report: &'a StopReport },
    /// Multi-node, on the head: one rank's phase changed (every rank's, the head's own included).
    RankPhase { of_rank: usize, of_host: &'a str, phase: Phase },
    /// Multi-node: the least advanced rank's phase changed.
    MultiNodePhase { phase: Phase, slowest_rank: usize, slowest_host: &'a str },
    /// `up --repair` (issue #35): the attempt that just failed is repaired: the run is stopped (its release
    /// proven), the command edited and launched again under the same name (`dry`: only shown).
    Repair {
        /// The attempt that failed (1: the first launch).
        attempt: usize,
        cause: Option<Cause>,
        rule: &'a str,
        profile: &'a str,
        /// The edit in words: `-c 100000000 -> 512`.
        edit: &'a str,
        action: &'a vigil_core::repair::RepairAction,
        why: &'a str,
        level: vigil_core::repair::Level,
        /// `--repair=any`: what the user set that it changes.
        #[serde(skip_serializing_if = "Option::is_none")]
        changes: Option<&'a str>,
        /// The command after the repair (secret values redacted).
        argv: &'a [String],
        source: &'a str,
        dry: bool,
    },
    /// `up --repair`: the end of the chain (the last line): how many attempts, the repairs made (`EDIT, WHY`),
    /// the last attempt's verdict and exit code, and why no further repair was made when the last one failed.
    Repairs {
        attempts: usize,
        repairs: &'a [String],
        #[serde(skip_serializing_if = "Option::is_none")]
        verdict: Option<vigil_core::Verdict>,
        exit: i32,
        #[serde(skip_serializing_if = "Option::is_none")]
        no_repair: Option<&'a str>,
    },
    /// `diagnose --explain`: the rule a line matched.
    Match {
        line: u64,
        profile: &'a str,
        rule: &'a str,
        source: Option<&'a str>,
        text: &'a str,
        #[serde(skip)]
        kind: String,
        #[serde(skip)]
        phase: Option<Phase>,
        #[serde(skip)]
        cause: Option<Cause>,
    },
}

/// What a note is about, when it carries data scripts want (issue #37): the JSON `note` event keeps its
/// `message` (what people read) and gains `type` and these fields, so `--json`, `/events` and the page carry
/// them typed. Notes meant for people only (watch set-up, interrupts, fleet talk) stay untyped.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Typed {
    /// The log source changed: `waiting` (for the file to appear), `appeared`, `truncated`, `rotated`
    /// (replaced), `writer_closed` (a FIFO's), `error` (it cannot be read), `ended`.
    LogSource {
        state: &'static str,
        #[serde(skip_serializing_if = "Option::is_none")]
        path: Option<String>,
    },
    /// The generation proof: `proving` (health is good, one completion asked), `retrying` (it failed, asked
    /// again), `watching` (after ready), `probe_failed` (a generation probe while watching failed).
    ProofStage {
        stage: &'static str,
        #[serde(skip_serializing_if = "Option::is_none")]
        why: Option<String>,
    },
    /// The port answers, but its holder is not in the server's process tree: not proof of readiness.
    ProbeRefused { port: u16, holder_pid: i32 },
    /// The health URL's TLS certificate was refused.
    CertError,
    /// A stop sent `signal` to `pids`.
    StopStep { signal: String, pids: Vec<i32> },
    /// A process still alive after a stop.
    StopSurvivor { pid: i32 },
    /// After a stop: the tree's GPU memory released (`true`), still held (`false`), or not checked (null).
    GpuRelease { released: Option<bool> },
    /// Evidence (stacks, process states) could not be taken.
    EvidenceFailed,
}

/// One host's line of a fleet's or multi-node server's end.
#[derive(Debug, Clone, Serialize)]
pub struct HostLine {
    pub host: String,
    pub rank: Option<usize>,
    pub verdict: String,
    pub exit: i32,
    pub phase: Option<Phase>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cause: Option<vigil_core::Cause>,
    pub detail: String,
}

/// How a fleet (`fleet`) or a multi-node server (`multi_node_verdict`) ended: the worst host's exit code,
/// the member that decided it, and (multi-node) the least advanced phase.
#[derive(Debug, Clone)]
pub struct FleetEnd {
    pub multi: bool,
    pub exit: i32,
    pub hosts: Vec<HostLine>,
    pub decider: Option<usize>,
    pub phase: Option<Phase>,
    /// Multi-node: the server's verdict in the shared vocabulary (`stalled`, not a rank's longer text).
    pub verdict: String,
}

#[derive(Serialize)]
struct Decider<'a> {
    host: &'a str,
    rank: Option<usize>,
}

#[derive(Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
enum FleetJson<'a> {
    Fleet {
        exit: i32,
        hosts: &'a [HostLine],
    },
    MultiNodeVerdict {
        exit: i32,
        hosts: &'a [HostLine],
        verdict: &'a str,
        phase: Option<Phase>,
        /// The root-cause rank's cause.
        #[serde(skip_serializing_if = "Option::is_none")]
        cause: Option<vigil_core::Cause>,
        #[serde(skip_serializing_if = "Option::is_none")]
        decided_by: Option<Decider<'a>>,
    },
}

impl FleetEnd {
    pub fn to_json(&self) -> serde_json::Value {
        let d = self.decider.map(|i| &self.hosts[i]);
        let v = if self.multi {
            FleetJson::MultiNodeVerdict {
                exit: self.exit,
                hosts: &self.hosts,
                verdict: &self.verdict,
                phase: self.phase,
                cause: d.and_then(|d| d.cause),
                decided_by: d.map(|d| Decider { host: &d.host, rank: d.rank }),
            }
        } else {
            FleetJson::Fleet { exit: self.exit, hosts: &self.hosts }
        };
        serde_json::to_value(v).unwrap_or_default()
    }
}

/// What happened to one process of a stopped tree (`procs::stop_tree`).
#[derive(Debug, Clone, Serialize)]
pub struct Stopped {
    pub pid: i32,
    pub cmd: String,
    /// SIGTERM, SIGKILL, or "already gone"
    pub how: String,
}

/// What stopping a process tree did (`procs::stop_tree`): the payload of `down --pid`'s event and of a
/// run's recorded stop.
#[derive(Debug, Clone, Serialize)]
pub struct StopReport {
    pub stopped: Vec<Stopped>,
    pub survivors: Vec<Stopped>,
    pub elapsed_ms: u64,
}

/// What a run records in its `events.jsonl` (the keeper and `down`), with wall-clock times.
#[derive(Debug, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum RunEvent<'a> {
    StopRequested { t_unix_ms: u64, grace_ms: u64 },
    Signal { signal: &'a str, pids: &'a [i32], t_unix_ms: u64 },
    Stopped { t_unix_ms: u64, report: &'a StopReport },
}

impl RunEvent<'_> {
    pub fn to_value(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schema_keeps_its_names() {
        let v = |e: &WatchEvent| serde_json::to_value(e).unwrap();
        let e = WatchEvent::Start { url: None, log: Some("/l"), pid: Some(3), server: None, remote_run: None };
        assert_eq!(v(&e), serde_json::json!({"event": "start", "log": "/l", "pid": 3}));
        let per = BTreeMap::from([(0u32, 10u64)]);
        let e = WatchEvent::Gpu { held_mib: 10, per_gpu_mib: &per, host_pids: false };
        assert_eq!(
            v(&e),
            serde_json::json!({"event": "gpu", "held_mib": 10, "per_gpu_mib": {"0": 10}, "host_pids": false})
        );
        let g = Generation {
            ok: true,
            endpoint: "/completion".into(),
            tokens: 2,
            ms: 1,
            note: "n".into(),
            spec: None,
            spec_note: None,
        };
        assert_eq!(v(&WatchEvent::Generation(&g))["event"], "generation");
        assert_eq!(v(&WatchEvent::Generation(&g))["tokens"], 2);
        let e = WatchEvent::MultiNodePhase { phase: Phase::Weights, slowest_rank: 1, slowest_host: "gpu2" };
        assert_eq!(
            v(&e),
            serde_json::json!({"event": "multi_node_phase", "phase": "weights", "slowest_rank": 1, "slowest_host": "gpu2"})
        );
        let r = StopReport { stopped: vec![], survivors: vec![], elapsed_ms: 5 };
        assert_eq!(v(&WatchEvent::TreeStopped { pid: 7, report: &r })["event"], "stopped");
        let action = vigil_core::repair::RepairAction::Set(vigil_core::repair::FlagEdit {
            flag: "-c".into(),
            before: Some("100000000".into()),
            default: None,
            after: Some("512".into()),
        });
        let argv = ["llama-server".to_string(), "-c".into(), "512".into()];
        let e = WatchEvent::Repair {
            attempt: 1,
            cause: Some(Cause::HostOom),
            rule: "context-over-train",
            profile: "llama-cpp",
            edit: "-c 100000000 -> 512",
            action: &action,
            why: "w",
            level: vigil_core::repair::Level::Any,
            changes: Some("the context length"),
            argv: &argv,
            source: "s",
            dry: false,
        };
        assert_eq!(
            v(&e),
            serde_json::json!({"event": "repair", "attempt": 1, "cause": "host_oom", "rule": "context-over-train",
                "profile": "llama-cpp", "edit": "-c 100000000 -> 512",
                "action": {"kind": "set", "flag": "-c", "before": "100000000", "after": "512"}, "why": "w",
                "level": "any", "changes": "the context length", "argv": ["llama-server", "-c", "512"], "source": "s",
                "dry": false})
        );
        let words = ["-c 100000000 -> 512, w".to_string()];
        let e = WatchEvent::Repairs {
            attempts: 2,
            repairs: &words,
            verdict: Some(vigil_core::Verdict::Ready),
            exit: 0,
            no_repair: None,
        };
        assert_eq!(
            v(&e),
            serde_json::json!({"event": "repairs", "attempts": 2, "repairs": ["-c 100000000 -> 512, w"],
                "verdict": "ready", "exit": 0})
        );
        let e = WatchEvent::RankPhase { of_rank: 1, of_host: "gpu2", phase: Phase::Weights };
        assert_eq!(
            v(&e),
            serde_json::json!({"event": "rank_phase", "of_rank": 1, "of_host": "gpu2", "phase": "weights"})
        );
        let t = |x: &Typed| serde_json::to_value(x).unwrap();
        assert_eq!(
            t(&Typed::StopStep { signal: "SIGTERM".into(), pids: vec![4, 5] }),
            serde_json::json!({"type": "stop_step", "signal": "SIGTERM", "pids": [4, 5]})
        );
        assert_eq!(
            t(&Typed::LogSource { state: "rotated", path: Some("/l".into()) }),
            serde_json::json!({"type": "log_source", "state": "rotated", "path": "/l"})
        );
        assert_eq!(
            t(&Typed::GpuRelease { released: None }),
            serde_json::json!({"type": "gpu_release", "released": null})
        );
        assert_eq!(t(&Typed::EvidenceFailed), serde_json::json!({"type": "evidence_failed"}));
        let e = RunEvent::Signal { signal: "SIGTERM", pids: &[1, 2], t_unix_ms: 9 };
        assert_eq!(
            e.to_value(),
            serde_json::json!({"event": "signal", "signal": "SIGTERM", "pids": [1, 2], "t_unix_ms": 9})
        );
    }
}
