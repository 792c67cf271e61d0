//! `--host`, `--hosts`, `--hosts-file`, `--multi-node`: the commands of `up.rs` on remote nodes,
//! over one SSH connection per host (see `remote.rs`).
//!
//! - One host: the same output as a local run.
//! - A fleet (`--hosts`): every host on its own, at most `--parallel` at once; lines carry the host,
//!   a table of per-host verdicts ends the output; the exit code is the worst.
//! - One server across nodes (`--multi-node`, or `--nnodes N` > 1 in the command): rank i runs on
//!   the i-th host; one verdict for all: the first rank that fails decides it, ready needs every
//!   rank ready; the live phase is the least advanced rank's. Only rank 0 is probed (SGLang's
//!   `/health` on `--node-rank` ≥ 1 is a dummy that always answers 200).

use crate::error::CliError;
use crate::exit::Exit;
use crate::node::remote::{self, SshOpts};
use crate::node::{AnyNode, Launch, Node, SshNode};
use crate::sinks::events::WatchEvent;
use crate::sinks::report::Reporter;
use crate::supervise::up::UpArgs;
use crate::supervise::wait;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc;
use vigil_core::fleet::{self, MultiNode, MultiStep};
use vigil_core::{Phase, Profiles, Report};

/// Which hosts, and how to drive them.
#[derive(Clone, Debug)]
pub struct Hosts {
    pub list: Vec<String>,
    pub multi_node: bool,
    pub parallel: usize,
    pub ssh: SshOpts,
}

impl Hosts {
    /// From `--host`, `--hosts a,b`, `--hosts-file F` (one host a line, `#` comments).
    pub fn parse(
        host: Option<String>,
        hosts: Option<String>,
        file: Option<std::path::PathBuf>,
        multi_node: bool,
        parallel: usize,
        ssh: SshOpts,
    ) -> Result<Option<Hosts>, CliError> {
        let mut list: Vec<String> = Vec::new();
        if let Some(h) = host {
            list.push(h);
        }
        if let Some(hs) = hosts {
            list.extend(hs.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()));
        }
        if let Some(f) = file {
            let text = std::fs::read_to_string(&f)
                .map_err(|e| CliError::usage(format!("--hosts-file {}: {e}", f.display())))?;
            for l in text.lines() {
                let l = l.split('#').next().unwrap_or("").trim();
                if !l.is_empty() {
                    list.push(l.to_string());
                }
            }
        }
        if list.is_empty() {
            if multi_node {
                return Err(CliError::usage(
                    "--multi-node needs --hosts (rank i runs on the i-th host), or a Slurm job (srun vigil up --multi-node)",
                ));
            }
            return Ok(None);
        }
        for h in &list {
            remote::valid_dest(h)?;
        }
        if parallel == 0 {
            return Err(CliError::usage("--parallel must be at least 1"));
        }
        Ok(Some(Hosts { list, multi_node, parallel, ssh }))
    }
}

impl HostResult {
    pub(crate) fn new(host: &str, rank: Option<usize>, name: &str) -> HostResult {
        HostResult {
            host: host.to_string(),
            rank,
            code: Exit::Internal,
            report: None,
            note: String::new(),
            node: None,
            name: name.to_string(),
            interrupted: false,
            shown: None,
            consequence: false,
            phase_seen: None,
        }
    }

    /// A watch's end: its exit code and verdict summary, or the error's code and message.
    fn set_outcome(&mut self, r: Result<wait::Outcome, CliError>) {
        match r {
            Ok(o) => {
                self.code = o.code;
                self.interrupted = o.interrupted;
                self.note = o
                    .report
                    .as_ref()
                    .map(|r| crate::sinks::report::summary(r, None, |s, _| s.to_string()))
                    .unwrap_or_default();
                self.report = o.report;
            }
            Err(e) => {
                self.code = e.code();
                self.note = e.message();
            }
        }
    }

    /// A single host's result as vigil's own: a failure without a verdict is the error it was
    /// (its one line printed, its exit code); anything else is the exit code.
    pub fn into_single(self) -> Result<Exit, CliError> {
        if self.report.is_some() || matches!(self.code, Exit::Ready | Exit::Degraded | Exit::Interrupted) {
            return Ok(self.code);
        }
        match self.code {
            Exit::Unreachable => Err(CliError::Unreachable(self.note)),
            Exit::Usage => Err(CliError::usage(self.note)),
            Exit::Internal => Err(CliError::Internal(self.note)),
            c => {
                eprintln!("vigil: error: {}", self.note);
                Ok(c)
            }
        }
    }
}

type Registry = Arc<std::sync::Mutex<Vec<Option<(Arc<AnyNode>, String)>>>>;

/// What one host ended with.
pub struct HostResult {
    pub host: String,
    pub rank: Option<usize>,
    pub code: Exit,
    pub report: Option<Report>,
    /// One line: the verdict's summary or why the host failed.
    pub note: String,
    /// The node, once reached (to stop its run later).
    pub node: Option<Arc<AnyNode>>,
    pub name: String,
    /// The watch ended on SIGINT/SIGTERM.
    pub interrupted: bool,
    /// The verdict as its own node showed it, for a rank watched elsewhere (a Slurm job's other nodes).
    pub shown: Option<String>,
    /// A multi-node rank's failure followed a peer's: its root-cause lines say a peer went away (the
    /// profiles' `[multi_node] peer_gone`); the rank that failed on its own is the root cause.
    pub consequence: bool,
    /// The last phase this rank's watch reported (a multi-node head hears it over TCP): the phase of a rank
    /// stopped before a verdict of its own.
    pub phase_seen: Option<Phase>,
}

fn lossy(a: &[u8]) -> String {
    String::from_utf8_lossy(a).into_owned()
}

/// The command for rank `rank` of `n`: `{node_rank}` and `{nnodes}` are replaced anywhere; with
/// several nodes, the value of `--node-rank` is set to the rank.
pub fn rank_argv(argv: &[Vec<u8>], rank: usize, n: usize) -> Vec<Vec<u8>> {
    let sub = |a: &[u8]| -> Vec<u8> {
        let s = a.to_vec();
        let s = crate::sources::lines::replace_bytes(&s, b"{node_rank}", rank.to_string().as_bytes());
        crate::sources::lines::replace_bytes(&s, b"{nnodes}", n.to_string().as_bytes())
    };
    let mut out: Vec<Vec<u8>> = argv.iter().map(|a| sub(a)).collect();
    for i in 0..out.len() {
        if out[i] == b"--node-rank" && i + 1 < out.len() {
            out[i + 1] = rank.to_string().into_bytes();
        } else if out[i].starts_with(b"--node-rank=") {
            out[i] = format!("--node-rank={rank}").into_bytes();
        }
    }
    out
}

pub(crate) fn run_name(a: &UpArgs, kind: &Option<String>, argv: &[Vec<u8>]) -> String {
    a.name.clone().or_else(|| kind.clone()).unwrap_or_else(|| {
        let p = lossy(&argv[0]);
        std::path::Path::new(&p)
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_else(|| "server".into())
    })
}

/// `vigil up --hosts` (a fleet) or a multi-node server: `commands::up` runs a single node itself.
pub async fn up(hs: Hosts, a: UpArgs, argv: Vec<Vec<u8>>, profiles: Profiles) -> Result<Exit, CliError> {
    if argv.is_empty() {
        return Err(CliError::usage("up: give the server command after --"));
    }
    let argv_s: Vec<String> = argv.iter().map(|a| lossy(a)).collect();
    let nnodes =
        crate::sources::follow::arg_value(&argv_s, "--nnodes").and_then(|v| v.parse::<usize>().ok()).unwrap_or(1);
    let multi = hs.multi_node || (nnodes > 1 && hs.list.len() > 1);
    if multi && nnodes > 1 && nnodes != hs.list.len() {
        return Err(CliError::usage(format!(
            "--nnodes {nnodes} but {} hosts given: rank i runs on the i-th host",
            hs.list.len()
        )));
    }
    let a = Arc::new(a);
    let profiles = Arc::new(profiles);
    let n = hs.list.len();
    // every host's connection and run name, as soon as it exists: a failed rank stops the others,
    // whose watches were cut short
    let conns: Registry = Arc::new(std::sync::Mutex::new(vec![None; n]));
    let (ptx, prx) = mpsc::unbounded_channel::<(usize, Phase)>();
    let jobs: Vec<_> = hs
        .list
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let (hs, h, a, profiles) = (hs.clone(), h.clone(), a.clone(), profiles.clone());
            let argv = if multi { rank_argv(&argv, i, n) } else { argv.clone() };
            let ptx = multi.then(|| ptx.clone());
            let reg = Some((conns.clone(), i));
            move || async move {
                let rank = multi.then_some(i);
                let node = match SshNode::open(&hs.ssh, &h).await {
                    Ok(n) => Arc::new(AnyNode::Ssh(n)),
                    Err(e) => {
                        let mut res = HostResult::new(&h, rank, "");
                        res.set_outcome(Err(e));
                        let mut rep = Reporter::new(a.launch.json, a.quiet);
                        rep.tagged(&h, rank);
                        rep.note(0, &res.note);
                        return res;
                    }
                };
                up_one(node, &h, rank, n, true, a, argv, profiles, ptx, reg).await
            }
        })
        .collect();
    drop(ptx);
    let (results, decided) = if multi {
        let (r, d) = drive_multi(&hs, jobs, prx, a.launch.json, a.quiet).await;
        (r, Some(d))
    } else {
        (drive_fleet(hs.parallel, jobs).await, None)
    };
    let code = summarize(&results, multi, decided, a.launch.json, a.quiet);
    // Foreground: stay until Ctrl-C, then stop every host's run (--detach leaves them running).
    let all_ready = results.iter().all(|r| r.code == Exit::Ready || r.code == Exit::Degraded);
    let failed_multi = multi && !all_ready;
    if code == Exit::Interrupted || failed_multi || (!a.detach && !a.proof.watch && all_ready) {
        let mut rep = Reporter::new(a.launch.json, a.quiet);
        if !failed_multi && code != Exit::Interrupted {
            rep.note(0, "serving on every host; Ctrl-C stops them (--detach to leave them running)");
            crate::signals::next_interrupt().await;
        } else if a.keep && code == Exit::Interrupted {
            return Ok(code);
        } else if failed_multi {
            rep.note(0, "one rank failed: stopping the other ranks (a multi-node server cannot run without them)");
        }
        let mut worst = code;
        let reg = conns.lock().unwrap().clone();
        for (r, c) in results.iter().zip(reg) {
            if let Some((node, name)) = c {
                let mut rep = Reporter::new(a.launch.json, a.quiet);
                rep.tagged(&r.host, r.rank);
                if !node.stop(&name, a.launch.grace, &mut rep).await? {
                    worst = worst.max(Exit::NotStopped);
                }
            }
        }
        return Ok(worst);
    }
    Ok(code)
}

/// Launches on one node and watches until a verdict.
#[allow(clippy::too_many_arguments)]
pub async fn up_one(
    node: Arc<AnyNode>,
    host: &str,
    rank: Option<usize>,
    n: usize,
    tagged: bool,
    a: Arc<UpArgs>,
    argv: Vec<Vec<u8>>,
    profiles: Arc<Profiles>,
    phase_tx: Option<mpsc::UnboundedSender<(usize, Phase)>>,
    registry: Option<(Registry, usize)>,
) -> HostResult {
    let argv_s: Vec<String> = argv.iter().map(|x| lossy(x)).collect();
    let kind = a.server.clone().or_else(|| profiles.detect_cmd(&argv_s).map(String::from));
    let name = run_name(&a, &kind, &argv);
    let mut res = HostResult::new(host, rank, &name);
    if let Err(e) = crate::node::run::valid_name(&name) {
        res.set_outcome(Err(e));
        return res;
    }
    let mut rep = Reporter::new(a.launch.json, a.quiet);
    if tagged {
        rep.tagged(host, rank);
    }
    res.node = Some(node.clone());
    if let Some((reg, i)) = &registry {
        reg.lock().unwrap()[*i] = Some((node.clone(), name.clone()));
    }
    let l = Launch { name: &name, argv: &argv, a: &a.launch, kind: kind.clone(), profiles: &profiles, rank, n };
    match node.launch(&l, &mut rep).await {
        Ok(Ok(h)) => {
            let mut w = crate::supervise::up::watch_args(&a);
            w.take(h);
            if tagged {
                w.tag = Some((host.to_string(), rank));
                // one of several (fleet, multi-node): the driver serves after ready (and its listener with it);
                // only --watch keeps this host's watch going
                w.watch = a.proof.watch;
            }
            w.phase_tx = phase_tx;
            res.set_outcome(wait::run(w, (*profiles).clone()).await);
            if let Some(r) = &res.report {
                res.consequence = !fleet::serves(res.code) && peer_gone(&profiles, kind.as_deref(), r);
                node.record_startup(&name, r);
            } else if !res.note.is_empty() {
                rep.note(0, &res.note);
            }
        }
        Ok(Err((code, why))) => {
            res.code = code;
            res.note = why;
            if tagged || code != Exit::Usage {
                rep.note(0, &res.note);
            }
        }
        Err(e) => res.set_outcome(Err(e)),
    }
    res
}

/// Whether a failed rank's report says a peer went away (its evidence lines and detail): then its failure
/// followed another rank's.
pub(crate) fn peer_gone(profiles: &Profiles, kind: Option<&str>, r: &vigil_core::Report) -> bool {
    let lines = r.evidence.iter().map(String::as_str).chain(r.detail.as_deref());
    profiles.peer_gone(kind, lines)
}

/// Runs host jobs, at most `parallel` at once; results in host order.
pub async fn drive_fleet<T, F, Fut>(parallel: usize, jobs: Vec<F>) -> Vec<T>
where
    T: 'static,
    F: FnOnce() -> Fut + 'static,
    Fut: std::future::Future<Output = T> + 'static,
{
    let local = tokio::task::LocalSet::new();
    local
        .run_until(async move {
            let sem = Arc::new(tokio::sync::Semaphore::new(parallel));
            let mut handles = Vec::new();
            for j in jobs {
                let sem = sem.clone();
                handles.push(tokio::task::spawn_local(async move {
                    let _permit = sem.acquire_owned().await;
                    j().await
                }));
            }
            let mut out = Vec::new();
            for h in handles {
                if let Ok(r) = h.await {
                    out.push(r);
                }
            }
            out
        })
        .await
}

/// Runs every rank at once. The first rank to fail on its own decides the verdict (a failure that followed a
/// peer's waits `fleet::SETTLE_MS` for it) and the others are stopped watching; ready needs all. Reports the
/// least advanced rank's phase as it changes. The results, and the outcome with the rank that decided it.
async fn drive_multi<F, Fut>(
    hs: &Hosts,
    jobs: Vec<F>,
    mut prx: mpsc::UnboundedReceiver<(usize, Phase)>,
    json: bool,
    quiet: bool,
) -> (Vec<HostResult>, (Exit, Option<usize>))
where
    F: FnOnce() -> Fut + 'static,
    Fut: std::future::Future<Output = HostResult> + 'static,
{
    let n = jobs.len();
    let hosts = hs.list.clone();
    let local = tokio::task::LocalSet::new();
    local
        .run_until(async move {
            let (rtx, mut rrx) = mpsc::unbounded_channel::<(usize, HostResult)>();
            let mut handles = Vec::new();
            for (i, j) in jobs.into_iter().enumerate() {
                let rtx = rtx.clone();
                handles.push(tokio::task::spawn_local(async move {
                    let r = j().await;
                    let _ = rtx.send((i, r));
                }));
            }
            drop(rtx);
            let mut rep = Reporter::new(json, quiet);
            let t0 = Instant::now();
            let mut multi = MultiNode::new(n);
            let mut results: Vec<Option<HostResult>> = (0..n).map(|_| None).collect();
            loop {
                tokio::select! {
                    Some((r, p)) = prx.recv() => {
                        if let Some((phase, slow)) = multi.phase(r, p) {
                            let ev = WatchEvent::MultiNodePhase { phase, slowest_rank: slow, slowest_host: &hosts[slow] };
                            rep.emit(Some(t0.elapsed().as_millis() as u64), &ev);
                        }
                    }
                    _ = tokio::time::sleep_until(tokio::time::Instant::from_std(t0) + std::time::Duration::from_millis(multi.settle_until().unwrap_or(0))), if multi.settle_until().is_some() => {
                        if multi.settled(t0.elapsed().as_millis() as u64) == MultiStep::Done {
                            for (k, h) in handles.iter().enumerate() {
                                if results[k].is_none() {
                                    h.abort();
                                }
                            }
                            break;
                        }
                    }
                    x = rrx.recv() => {
                        let Some((i, r)) = x else { break };
                        let step = multi.ended_at(i, r.code, r.consequence, t0.elapsed().as_millis() as u64);
                        results[i] = Some(r);
                        if step == MultiStep::Done {
                            // one failed rank fails the server (or all have ended): stop watching the others
                            for (k, h) in handles.iter().enumerate() {
                                if results[k].is_none() {
                                    h.abort();
                                }
                            }
                            break;
                        }
                    }
                }
            }
            let mut results = stopped_unless_done(results, &hosts, "");
            for (i, r) in results.iter_mut().enumerate() {
                r.phase_seen = multi.phase_of(i);
            }
            (results, multi.outcome())
        })
        .await
}

/// One server across nodes: each rank's result, a rank whose watch was stopped (another rank failed first)
/// given as still starting.
pub(crate) fn stopped_unless_done(results: Vec<Option<HostResult>>, hosts: &[String], name: &str) -> Vec<HostResult> {
    results
        .into_iter()
        .enumerate()
        .map(|(i, r)| {
            r.unwrap_or_else(|| HostResult {
                code: Exit::Starting,
                note: "watch stopped: another rank failed".into(),
                ..HostResult::new(&hosts[i], Some(i), name)
            })
        })
        .collect()
}

/// The per-host table (or JSON), and the exit code: the worst host's (multi-node: `decided`, the root-cause
/// rank's outcome, see `fleet::MultiNode::outcome`).
pub(crate) fn summarize(
    results: &[HostResult],
    multi: bool,
    decided: Option<(Exit, Option<usize>)>,
    json: bool,
    quiet: bool,
) -> Exit {
    let exits: Vec<Exit> = results.iter().map(|r| r.code).collect();
    let (worst, decider) = decided.unwrap_or_else(|| fleet::combine(&exits));
    let hosts: Vec<crate::sinks::events::HostLine> = results
        .iter()
        .map(|r| crate::sinks::events::HostLine {
            host: r.host.clone(),
            rank: r.rank,
            verdict: verdict_text(r),
            exit: r.code.code(),
            phase: if fleet::serves(r.code) {
                Some(Phase::Serving)
            } else {
                r.report.as_ref().map(|x| x.phase).or(r.phase_seen)
            },
            cause: r.report.as_ref().and_then(|x| x.cause),
            detail: r.note.clone(),
        })
        .collect();
    let phase = server_phase(results, worst, decider);
    // the shared vocabulary's word (a degraded server is ready, its degradation said per rank)
    let verdict = match worst {
        Exit::Degraded => Exit::Ready.word().to_string(),
        Exit::Ready
        | Exit::Timeout
        | Exit::Unhealthy
        | Exit::Stalled
        | Exit::Crashed
        | Exit::Interrupted
        | Exit::Unreachable => worst.word().to_string(),
        _ => decider.map_or_else(|| "failed".to_string(), |d| hosts[d].verdict.clone()),
    };
    let end = crate::sinks::events::FleetEnd { multi, exit: worst.code(), hosts, decider, phase, verdict };
    crate::sinks::tables::fleet(&end, json, quiet);
    worst
}

/// A multi-node server's phase, decided in the core (`fleet::server_phase`).
fn server_phase(results: &[HostResult], worst: Exit, decider: Option<usize>) -> Option<Phase> {
    let own: Vec<Option<Phase>> = results.iter().map(|r| r.report.as_ref().map(|x| x.phase)).collect();
    let seen: Vec<Option<Phase>> = results.iter().map(|r| r.phase_seen).collect();
    fleet::server_phase(&own, &seen, worst, decider)
}

/// A host's verdict as the fleet table shows it.
pub(crate) fn verdict_text(r: &HostResult) -> String {
    if let Some(s) = &r.shown {
        return s.clone();
    }
    match r.report.as_ref() {
        Some(rep) if r.code == Exit::Degraded => format!("{} (degraded)", rep.verdict),
        Some(rep) => rep.verdict.to_string(),
        // without a verdict: the outcome's own word; a watch stopped before one, or any other failure
        None => match r.code {
            Exit::Unreachable | Exit::Refused | Exit::Interrupted | Exit::Usage => r.code.to_string(),
            Exit::Starting => "stopped".into(),
            _ => "failed".into(),
        },
    }
}

/// `vigil wait --hosts H1,H2 NAME` (a fleet or a multi-node server): `commands::wait` runs a single node
/// itself.
pub async fn wait(hs: Hosts, name: String, mut w: wait::Args, profiles: Profiles) -> Result<Exit, CliError> {
    crate::node::run::valid_name(&name)?;
    let w0 = w.clone();
    let jobs: Vec<_> = hs
        .list
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let (hs, h, mut w, profiles, name) = (hs.clone(), h.clone(), w0.clone(), profiles.clone(), name.clone());
            let rank = hs.multi_node.then_some(i);
            move || async move {
                let mut res = HostResult::new(&h, rank, &name);
                let node = match SshNode::open(&hs.ssh, &h).await {
                    Ok(n) => Arc::new(AnyNode::Ssh(n)),
                    Err(e) => {
                        res.set_outcome(Err(e));
                        return res;
                    }
                };
                w.tag = Some((h.clone(), rank));
                let probe = rank.unwrap_or(0) == 0 && w.url.is_none();
                match node.attach(&name, w.server.as_deref(), probe, &profiles).await {
                    Ok(h) => {
                        w.take(h);
                        res.set_outcome(wait::run(w, profiles).await)
                    }
                    Err(e) => res.set_outcome(Err(e)),
                }
                res.node = Some(node);
                res
            }
        })
        .collect();
    let (ptx, prx) = mpsc::unbounded_channel();
    w.phase_tx = Some(ptx);
    let (results, decided) = if hs.multi_node {
        let (r, d) = drive_multi(&hs, jobs, prx, w.json, w.quiet).await;
        (r, Some(d))
    } else {
        (drive_fleet(hs.parallel, jobs).await, None)
    };
    Ok(summarize(&results, hs.multi_node, decided, w.json, w.quiet))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_are_substituted() {
        let a: Vec<Vec<u8>> = ["server", "--node-rank", "0", "--port", "3000{node_rank}", "--nnodes", "{nnodes}"]
            .iter()
            .map(|s| s.as_bytes().to_vec())
            .collect();
        let r = rank_argv(&a, 1, 2);
        let s: Vec<String> = r.iter().map(|x| lossy(x)).collect();
        assert_eq!(s, ["server", "--node-rank", "1", "--port", "30001", "--nnodes", "2"]);
        let b = vec![b"x".to_vec(), b"--node-rank=0".to_vec()];
        assert_eq!(rank_argv(&b, 3, 4)[1], b"--node-rank=3".to_vec());
    }

    #[test]
    fn hosts_lists() {
        let d = tempfile_dir();
        let f = d.join("hosts");
        std::fs::write(&f, "# fleet\nn1\n  n2  # second\n\nme@n3\n").unwrap();
        let h = Hosts::parse(None, Some("a,b".into()), Some(f), false, 4, SshOpts::default()).unwrap().unwrap();
        assert_eq!(h.list, ["a", "b", "n1", "n2", "me@n3"]);
        assert!(Hosts::parse(None, None, None, true, 4, SshOpts::default()).is_err());
        assert!(Hosts::parse(Some("-oX".into()), None, None, false, 4, SshOpts::default()).is_err());
        assert!(Hosts::parse(None, None, None, false, 4, SshOpts::default()).unwrap().is_none());
        let _ = std::fs::remove_dir_all(d);
    }

    fn tempfile_dir() -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("vigil-hosts-test-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}
