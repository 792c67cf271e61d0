//! `vigil up --repair[=N|dry|any]` (issue #35, docs/repair.md): the I/O around the core's repair planner
//! (`vigil_core::repair`). After an attempt ends in a crash or a stall (or vigil refused its launch), this
//! gathers the facts the planner needs (the verdict, the log's last lines, who holds the port, the GPU's
//! size), asks it, and carries out its answer: stop the run and prove its release (as `vigil down` does),
//! edit the command, launch it again under the same name and watch again, within the attempts allowed and
//! the overall `--timeout`. It decides nothing itself.

use crate::exit::Exit;
use crate::node::{AnyNode, Node};
use crate::sinks::events::WatchEvent;
use crate::sinks::report::Reporter;
use crate::supervise::hosts::{run_name, up_one, HostResult};
use crate::supervise::up::UpArgs;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use vigil_core::repair::{self, Decision, Done, Failure, Holder, HolderOf, Level, RepairAction, Setting};
use vigil_core::{Profiles, Verdict};

/// `--repair[=N|dry|any]`, parsed: how many repairs, how far they may go, and whether to only show them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RepairMode {
    pub max: usize,
    pub level: Level,
    pub dry: bool,
}

impl RepairMode {
    /// `2`, `any`, `dry`, or several with commas (`any,3`). Attempts from 1 to 10.
    pub fn parse(s: &str) -> Result<RepairMode, String> {
        let mut m = RepairMode { max: 2, level: Level::Keep, dry: false };
        for part in s.split(',').map(str::trim) {
            match part {
                "any" => m.level = Level::Any,
                "dry" => m.dry = true,
                n => match n.parse::<usize>() {
                    Ok(n) if (1..=10).contains(&n) => m.max = n,
                    _ => {
                        return Err(format!(
                            "'{part}': say a number of attempts (1-10), any or dry, e.g. --repair=any,3"
                        ))
                    }
                },
            }
        }
        Ok(m)
    }
}

/// The least time another attempt needs to be worth starting.
const MIN_ATTEMPT: Duration = Duration::from_secs(1);

/// `up` on one node with repairs: attempts until one is ready, or no repair applies, or the attempts or the
/// time run out. The last attempt's result is returned (its verdict was shown as it came); the chain ends with
/// a `repairs` event (the JSON's last line) or, for people, the line that says what the repairs did.
pub async fn up(
    node: Arc<AnyNode>,
    label: &str,
    a: Arc<UpArgs>,
    argv: Vec<Vec<u8>>,
    profiles: Arc<Profiles>,
    mode: RepairMode,
) -> HostResult {
    let t0 = Instant::now();
    let mut argv: Vec<String> = argv.iter().map(|x| String::from_utf8_lossy(x).into_owned()).collect();
    let kind = a.server.clone().or_else(|| profiles.detect_cmd(&argv).map(String::from));
    let name = run_name(&a, &kind, &argv.iter().map(|s| s.clone().into_bytes()).collect::<Vec<_>>());
    let mut rep = Reporter::new(a.launch.json, a.quiet);
    let mut done: Vec<Done> = Vec::new();
    let mut words: Vec<String> = Vec::new();
    let mut attempt = 0;
    loop {
        attempt += 1;
        let left = a.timeout.saturating_sub(t0.elapsed());
        let mut this = (*a).clone();
        this.timeout = left.max(MIN_ATTEMPT);
        this.proof.repairs = words.clone();
        this.launch.repairs = words.clone();
        let bytes = argv.iter().map(|s| s.clone().into_bytes()).collect();
        let r = up_one(node.clone(), label, None, 1, false, Arc::new(this), bytes, profiles.clone(), None, None).await;
        let verdict = r.report.as_ref().map(|x| x.verdict);
        let failed = match verdict {
            Some(Verdict::Crashed | Verdict::Stalled | Verdict::Timeout) => true,
            None => r.code == Exit::Refused && !r.interrupted,
            _ => false,
        };
        if !failed || r.interrupted {
            return end(&mut rep, t0, r, attempt, &words, None);
        }
        let lines = match &r.report {
            Some(x) => {
                let tail = node.log_tail(&name, 400).await.map(|t| t.lines).unwrap_or_default();
                x.evidence.iter().cloned().chain(tail).collect()
            }
            None => vec![],
        };
        let holders = match node.host() {
            None => local_holders(&name, &argv, kind.as_deref(), &profiles, verdict.is_none()),
            Some(_) => vec![],
        };
        let facts = gpu_facts(node.host().is_none());
        let rules = profiles.repairs_for(kind.as_deref());
        let f = Failure {
            verdict,
            cause: r
                .report
                .as_ref()
                .and_then(|x| x.cause)
                .or((verdict.is_none() && !holders.is_empty()).then_some(vigil_core::Cause::PortInUse)),
            phase: r.report.as_ref().map(|x| x.phase).unwrap_or(vigil_core::Phase::Launch),
            lines: &lines,
            holders: &holders,
        };
        let s = Setting { level: mode.level, max: mode.max, argv: &argv, rules: &rules, done: &done, facts: &facts };
        let mut decision = repair::plan(&f, &s);
        if matches!(decision, Decision::Repair(_)) && a.timeout.saturating_sub(t0.elapsed()) < MIN_ATTEMPT {
            decision = Decision::NoRepair { why: "the overall --timeout leaves no time for another attempt".into() };
        }
        let p = match decision {
            Decision::NoRepair { why } => return end(&mut rep, t0, r, attempt, &words, Some(why)),
            Decision::Repair(p) => p,
        };
        let edit = p.edit_text();
        let (shown, _, _) = crate::sinks::redact::redact(&p.argv, &[]);
        rep.emit(
            Some(t0.elapsed().as_millis() as u64),
            &WatchEvent::Repair {
                attempt,
                cause: p.cause,
                rule: &p.rule,
                profile: &p.profile,
                edit: &edit,
                action: &p.action,
                why: &p.why,
                level: p.level,
                changes: p.changes.as_deref(),
                argv: &shown,
                source: &p.source,
                dry: mode.dry,
            },
        );
        if mode.dry {
            return end(
                &mut rep,
                t0,
                r,
                attempt,
                &words,
                Some(format!("--repair=dry: '{name}' was not launched again")),
            );
        }
        // The run is stopped before the relaunch, its release proven as `vigil down` proves it (no process of
        // the run left, its GPU memory released); for an earlier attempt that is the very same stop.
        match node.stop(&name, a.launch.grace, &mut rep).await {
            Ok(true) => {}
            Ok(false) => {
                return end(
                    &mut rep,
                    t0,
                    r,
                    attempt,
                    &words,
                    Some(format!("'{name}' could not be stopped, so it is not launched again")),
                )
            }
            Err(e) => {
                return end(
                    &mut rep,
                    t0,
                    r,
                    attempt,
                    &words,
                    Some(format!("stopping '{name}' failed: {}", e.message())),
                )
            }
        }
        if let (RepairAction::StopLeftover { .. }, None) = (&p.action, node.host()) {
            if let Some(port) = port_of(&argv, kind.as_deref(), &profiles) {
                if !port_released(port).await {
                    let why = format!("port {port} is still taken after the earlier attempt was stopped");
                    return end(&mut rep, t0, r, attempt, &words, Some(why));
                }
            }
        }
        done.push(p.done());
        words.push(format!("{edit}, {}", p.why));
        argv = p.argv.clone();
    }
}

/// The end of the chain: the `repairs` event (people see "no repair: why" or "ready after N repairs: …").
fn end(
    rep: &mut Reporter,
    t0: Instant,
    r: HostResult,
    attempts: usize,
    words: &[String],
    no_repair: Option<String>,
) -> HostResult {
    let verdict = r.report.as_ref().map(|x| x.verdict);
    rep.emit(
        Some(t0.elapsed().as_millis() as u64),
        &WatchEvent::Repairs {
            attempts,
            repairs: words,
            verdict,
            exit: r.code.code(),
            no_repair: no_repair.as_deref(),
        },
    );
    r
}

/// The port the server listens on: `--port` on its command line, else its profile's.
fn port_of(argv: &[String], kind: Option<&str>, profiles: &Profiles) -> Option<u16> {
    crate::sources::follow::arg_value(argv, "--port")
        .and_then(|p| p.parse::<u16>().ok())
        .or_else(|| kind.and_then(|k| profiles.get(k)).map(|p| p.port))
}

/// Waits (at most 10 s) for a port to be free to bind.
async fn port_released(port: u16) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if crate::sources::procs::port_free(port) {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Who holds what the next attempt needs, on this machine: the processes an earlier attempt of this run left
/// (its keeper gone, they carry the run's mark), and the port's holder, told apart by its mark
/// (`VIGIL_RUN_DIR`: this run's folder, another run's, or none: a process vigil did not start). After a
/// verdict (`refused` false) the run's own processes are the attempt that just failed: not holders.
fn local_holders(name: &str, argv: &[String], kind: Option<&str>, profiles: &Profiles, refused: bool) -> Vec<Holder> {
    let Ok(dir) = crate::node::run::run_dir(name) else { return vec![] };
    let mut out = Vec::new();
    let now = crate::node::up::find_run(&dir);
    let cmd = |pid: i32| {
        crate::sources::follow::cmdline(pid)
            .map(|c| crate::sinks::redact::redact(&c, &[]).0.join(" "))
            .unwrap_or_else(|| format!("pid {pid}"))
    };
    if refused && now.keeper.is_none() {
        for pid in now.server.into_iter().chain(now.pids.iter().copied()) {
            if !out.iter().any(|h: &Holder| h.pid == pid) {
                out.push(Holder { pid, cmd: cmd(pid), of: HolderOf::ThisRun, holds: format!("the name '{name}'") });
            }
        }
    }
    if let Some(port) = port_of(argv, kind, profiles) {
        if !crate::sources::procs::port_free(port) {
            let holds = format!("port {port}");
            match crate::sources::procs::port_holder(port) {
                Some((pid, _)) => {
                    let mark = crate::sources::procs::env_var(pid, crate::node::up::MARK);
                    let of = match mark {
                        Some(m) if std::path::Path::new(&m) == dir && !refused => return out,
                        Some(m) if std::path::Path::new(&m) == dir && now.keeper.is_none() => HolderOf::ThisRun,
                        Some(m) if std::path::Path::new(&m) == dir => HolderOf::LiveRun,
                        Some(m) => HolderOf::OtherRun(
                            std::path::Path::new(&m).file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or(m),
                        ),
                        None => HolderOf::NotVigils,
                    };
                    out.push(Holder { pid, cmd: cmd(pid), of, holds });
                }
                None => out.push(Holder {
                    pid: 0,
                    cmd: "a process this user cannot see".into(),
                    of: HolderOf::NotVigils,
                    holds,
                }),
            }
        }
    }
    out
}

/// `gpu_total_gib`: the smallest GPU's memory on this machine (NVML or nvidia-smi), when one can be read.
fn gpu_facts(local: bool) -> BTreeMap<String, f64> {
    let mut f = BTreeMap::new();
    if !local || std::env::var_os("VIGIL_NO_GPU").is_some() {
        return f;
    }
    if let Some(min) = crate::sources::gpu::Reader::open()
        .ok()
        .and_then(|r| r.sample().ok())
        .and_then(|s| s.gpus.iter().map(|g| g.total_mib).filter(|t| *t > 0).min())
    {
        f.insert("gpu_total_gib".into(), min as f64 / 1024.0);
    }
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flag_reads_attempts_level_and_dry() {
        let m = |s| RepairMode::parse(s);
        assert_eq!(m("2").unwrap(), RepairMode { max: 2, level: Level::Keep, dry: false });
        assert_eq!(m("any").unwrap(), RepairMode { max: 2, level: Level::Any, dry: false });
        assert_eq!(m("any,3").unwrap(), RepairMode { max: 3, level: Level::Any, dry: false });
        assert_eq!(m("dry").unwrap(), RepairMode { max: 2, level: Level::Keep, dry: true });
        assert!(m("0").is_err());
        assert!(m("11").is_err());
        assert!(m("all").unwrap_err().contains("'all'"));
    }
}
