//! `srun vigil up --multi-node -- CMD` inside a Slurm job (issue #27, docs/slurm.md): one vigil per node
//! of the job step, each the keeper and watch of its node's rank; the verdict per node on every node, the
//! combined verdict on the head node (rank 0, the step's first node).
//!
//! How the ranks meet: the job's own environment names the step's nodes (`SLURM_STEP_NODELIST`, expanded
//! by `scontrol show hostnames`) and this node (`SLURMD_NODENAME`): the rank is the node's place in that
//! list, the head is its first node, reached at its Slurm address (`scontrol show node`, `NodeAddr`) on a
//! TCP port derived from the job and step ids (`--rendezvous-port` to choose it). The other ranks connect
//! to the head and send their phases and verdict as JSON lines; the head feeds them to the core's
//! `fleet::MultiNode` (the first failing rank decides; ready needs every rank). No SSH and no shared
//! directory are needed.
//!
//! At a failure the head tells every rank to stop its server (each one's evidence is already saved at its
//! own verdict), waits for them (bounded), and then ends the job step or the job (`--scancel`), so the
//! allocation is released rather than burning to its time limit. Only a failure does that
//! (`fleet::ends_allocation`): never a serving server or an interrupt.

use crate::error::CliError;
use crate::exit::Exit;
use crate::node::{AnyNode, LocalNode, Node};
use crate::sinks::events::WatchEvent;
use crate::sinks::report::Reporter;
use crate::supervise::hosts::{self, HostResult};
use crate::supervise::up::UpArgs;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc::{self, UnboundedReceiver, UnboundedSender};
use vigil_core::fleet::{self, MultiNode, MultiStep};
use vigil_core::{Phase, Profiles};

/// What `--scancel` ends at a failure verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Scancel {
    /// The job step that runs vigil (`scancel JOB.STEP`); the batch script goes on.
    Step,
    /// The whole job (`scancel JOB`).
    Job,
    /// Nothing: the servers are stopped, the allocation is left to the batch script.
    None,
}

/// The Slurm flags of `vigil up`.
#[derive(Clone, Debug)]
pub struct Flags {
    pub scancel: Scancel,
    pub port: Option<u16>,
    /// How long the head waits for every rank to join, and a rank for the head.
    pub join: Duration,
}

/// A longest protocol line (a verdict's one-line note is far shorter).
const MAX_LINE: usize = 64 << 10;
/// Every `scontrol`/`scancel` call ends within this.
const CMD_TIMEOUT: Duration = Duration::from_secs(15);

/// This node's place in the job step, from the job's environment.
#[derive(Clone, Debug)]
pub struct Job {
    pub id: u64,
    pub step: Option<u64>,
    pub rank: usize,
    pub nodes: Vec<String>,
}

impl Job {
    /// The job step around this process: `None` outside Slurm (no `SLURM_JOB_ID`).
    pub async fn from_env() -> Result<Option<Job>, CliError> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        let Some(id) = var("SLURM_JOB_ID") else { return Ok(None) };
        let id: u64 =
            id.trim().parse().map_err(|_| CliError::usage(format!("SLURM_JOB_ID is not a job id: '{id}'")))?;
        // the batch step's id is not a number ("batch", or 4294967294 in some versions): no step to end
        let step = var("SLURM_STEP_ID").and_then(|s| s.trim().parse::<u64>().ok()).filter(|s| *s < 0xFFFF_FFF0);
        if let Some(l) = var("SLURM_LOCALID").and_then(|l| l.trim().parse::<u32>().ok()) {
            if l > 0 {
                return Err(CliError::usage(format!(
                    "vigil up --multi-node runs one task per node in a Slurm job (srun --ntasks-per-node=1): this is \
                     local task {l}"
                )));
            }
        }
        let me = var("SLURMD_NODENAME")
            .ok_or_else(|| CliError::usage("in a Slurm job without SLURMD_NODENAME: run vigil under srun"))?;
        let list = var("SLURM_STEP_NODELIST")
            .or_else(|| var("SLURM_JOB_NODELIST"))
            .ok_or_else(|| CliError::usage("in a Slurm job without SLURM_STEP_NODELIST or SLURM_JOB_NODELIST"))?;
        let out = run_cmd("scontrol", &["show", "hostnames", &list]).await?;
        let nodes: Vec<String> = out.lines().map(|l| l.trim().to_string()).filter(|l| !l.is_empty()).collect();
        let rank = nodes.iter().position(|n| *n == me).ok_or_else(|| {
            CliError::usage(format!("this node {me} is not in the job step's nodes {list} (scontrol show hostnames)"))
        })?;
        Ok(Some(Job { id, step, rank, nodes }))
    }

    fn port(&self, flags: &Flags) -> u16 {
        flags.port.unwrap_or_else(|| derived_port(self.id, self.step))
    }

    /// What `--scancel` names: `JOB.STEP` or `JOB` (a job without a step id ends whole).
    fn target(&self, s: Scancel) -> Option<String> {
        match (s, self.step) {
            (Scancel::None, _) => None,
            (Scancel::Step, Some(st)) => Some(format!("{}.{st}", self.id)),
            _ => Some(self.id.to_string()),
        }
    }
}

/// The head's port when `--rendezvous-port` is not given: 20000–31999, below Linux's ephemeral ports (32768
/// up, where outgoing connections take theirs), from the job and step ids: two steps of one job, or two jobs
/// on one node, meet on different ports unless their ids collide modulo 12000.
pub fn derived_port(job: u64, step: Option<u64>) -> u16 {
    let k = job.wrapping_mul(7).wrapping_add(step.unwrap_or(0).wrapping_mul(3)) % 12_000;
    20_000 + k as u16
}

/// A run name unique on its node and in the history: `BASE.jobID.nRANK` (the history records the job id
/// with it).
pub fn run_name(base: &str, job: u64, rank: usize) -> String {
    let tail = format!(".job{job}.n{rank}");
    let keep = 64usize.saturating_sub(tail.len());
    let base: String = base.chars().take(keep).collect();
    format!("{base}{tail}")
}

/// Runs a Slurm client command with a deadline; its stdout, or a one-line error.
async fn run_cmd(prog: &str, args: &[&str]) -> Result<String, CliError> {
    let mut c = tokio::process::Command::new(prog);
    c.args(args).stdin(std::process::Stdio::null()).kill_on_drop(true);
    let out = match tokio::time::timeout(CMD_TIMEOUT, c.output()).await {
        Err(_) => return Err(CliError::Unreachable(format!("{prog} {}: no answer within 15s", args.join(" ")))),
        Ok(Err(e)) => return Err(CliError::Unreachable(format!("{prog}: {e}"))),
        Ok(Ok(o)) => o,
    };
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let err = err.lines().next().unwrap_or("").trim().to_string();
        return Err(CliError::Unreachable(format!("{prog} {}: {err} ({})", args.join(" "), out.status)));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The address Slurm reaches a node at (`NodeAddr`), else its name.
async fn node_addr(node: &str) -> String {
    match run_cmd("scontrol", &["show", "node", "-o", node]).await {
        Ok(s) => s
            .split_whitespace()
            .find_map(|w| w.strip_prefix("NodeAddr="))
            .filter(|a| !a.is_empty() && *a != "(null)")
            .unwrap_or(node)
            .to_string(),
        Err(_) => node.to_string(),
    }
}

/// One line of the protocol between a rank and the head.
#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(rename_all = "snake_case", tag = "msg")]
enum Msg {
    /// rank → head, first: who this is.
    Hello { rank: usize, node: String, job: u64 },
    /// rank → head: its phase changed.
    Phase { phase: Phase },
    /// rank → head: its watch ended (or its server ended after ready).
    End { code: Exit, verdict: String, note: String },
    /// head → rank: the server is decided bad (or interrupted): stop yours and exit with `code`.
    Stop { code: Exit, why: String },
    /// rank → head: stopped (`ok`: nothing left).
    Stopped { ok: bool },
}

/// What the head hears from its connections.
enum Ev {
    Joined(usize, String, UnboundedSender<Msg>),
    Got(usize, Msg),
    Closed(usize),
}

/// The head's table shows a rank's first line (its verdict line); the rest is in that node's own output.
fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or("").to_string()
}

fn line_of(m: &Msg) -> Vec<u8> {
    let mut v = serde_json::to_vec(m).unwrap_or_default();
    v.push(b'\n');
    v
}

/// Reads protocol lines, each bounded; `None` at the end, a bad line or a too-long line.
async fn next_msg<R: tokio::io::AsyncBufRead + Unpin>(r: &mut R) -> Option<Msg> {
    let mut buf = Vec::new();
    let mut lim = r.take(MAX_LINE as u64);
    let n = lim.read_until(b'\n', &mut buf).await.ok()?;
    if n == 0 || !buf.ends_with(b"\n") {
        return None;
    }
    serde_json::from_slice(&buf).ok()
}

/// `vigil up --multi-node` in a Slurm job step: this node's rank, and on the head the combined verdict.
pub async fn up(
    job: Job,
    flags: Flags,
    mut a: UpArgs,
    argv: Vec<Vec<u8>>,
    profiles: Profiles,
) -> Result<Exit, CliError> {
    if argv.is_empty() {
        return Err(CliError::usage("up: give the server command after --"));
    }
    let n = job.nodes.len();
    let argv_s: Vec<String> = argv.iter().map(|x| String::from_utf8_lossy(x).into_owned()).collect();
    if let Some(nn) = crate::sources::follow::arg_value(&argv_s, "--nnodes").and_then(|v| v.parse::<usize>().ok()) {
        if nn != n {
            return Err(CliError::usage(format!(
                "--nnodes {nn} but the Slurm job step has {n} nodes ({}): run one vigil per node",
                job.nodes.join(",")
            )));
        }
    }
    let argv = hosts::rank_argv(&argv, job.rank, n);
    let kind = a.server.clone().or_else(|| profiles.detect_cmd(&argv_s).map(String::from));
    let base = hosts::run_name(&a, &kind, &argv);
    a.name = Some(run_name(&base, job.id, job.rank));
    let (a, profiles) = (Arc::new(a), Arc::new(profiles));
    let local = tokio::task::LocalSet::new();
    local
        .run_until(async move {
            let rank0 = job.rank == 0;
            let c = Ctx { job, flags, a, argv, profiles };
            if rank0 {
                head(c).await
            } else {
                member(c).await
            }
        })
        .await
}

/// Starts this node's rank: its launch and watch, with its phases on `ptx`.
fn start_local(
    job: &Job,
    a: &Arc<UpArgs>,
    argv: Vec<Vec<u8>>,
    profiles: &Arc<Profiles>,
) -> (Arc<AnyNode>, tokio::task::JoinHandle<HostResult>, UnboundedReceiver<(usize, Phase)>) {
    let node = Arc::new(AnyNode::Local(LocalNode::default()));
    let (ptx, prx) = mpsc::unbounded_channel();
    let (n2, host, rank, n) = (node.clone(), job.nodes[job.rank].clone(), job.rank, job.nodes.len());
    let (a, profiles) = (a.clone(), profiles.clone());
    let h = tokio::task::spawn_local(async move {
        hosts::up_one(n2, &host, Some(rank), n, true, a, argv, profiles, Some(ptx), None).await
    });
    (node, h, prx)
}

/// What every rank's vigil runs with: the job, the flags, `up`'s arguments, this rank's server command.
struct Ctx {
    job: Job,
    flags: Flags,
    a: Arc<UpArgs>,
    argv: Vec<Vec<u8>>,
    profiles: Arc<Profiles>,
}

fn reporter(a: &UpArgs, job: &Job) -> Reporter {
    let mut rep = Reporter::new(a.launch.json, a.quiet);
    rep.tagged(&job.nodes[job.rank], Some(job.rank));
    rep
}

/// The head (rank 0): its own rank, the others' reports, the combined verdict, and at a failure the stop of
/// every rank and the end of the step or job.
async fn head(c: Ctx) -> Result<Exit, CliError> {
    let Ctx { job, flags, a, argv, profiles } = c;
    let n = job.nodes.len();
    let port = job.port(&flags);
    let listener = TcpListener::bind(("0.0.0.0", port)).await.map_err(|e| {
        CliError::usage(format!(
            "the head node {} cannot listen on port {port} for the other ranks: {e} (choose one with --rendezvous-port)",
            job.nodes[0]
        ))
    })?;
    let mut rep = reporter(&a, &job);
    rep.note(
        0,
        &format!(
            "Slurm job {} on {n} nodes ({}): head, waiting for the ranks on port {port}",
            job.id,
            job.nodes.join(",")
        ),
    );
    let name = a.name.clone().unwrap_or_default();
    let (node, mut local, mut prx) = start_local(&job, &a, argv, &profiles);
    let (etx, mut erx) = mpsc::unbounded_channel::<Ev>();
    let mut senders: Vec<Option<UnboundedSender<Msg>>> = vec![None; n];
    let mut results: Vec<Option<HostResult>> = (0..n).map(|_| None).collect();
    let mut joined = vec![false; n];
    joined[0] = true;
    let mut multi = MultiNode::new(n);
    let t0 = Instant::now();
    let join_by = tokio::time::Instant::now() + flags.join;
    let mut interrupted = false;
    let end_of = |i: usize, code: Exit, verdict: String, note: String| -> HostResult {
        HostResult { code, note, shown: Some(verdict), ..HostResult::new(&job.nodes[i], Some(i), &name) }
    };
    // the startup: every rank to its verdict, or the first failure
    loop {
        let all_joined = joined.iter().all(|j| *j);
        let step = tokio::select! {
            acc = listener.accept() => {
                if let Ok((s, _)) = acc {
                    serve_conn(s, n, etx.clone());
                }
                MultiStep::Wait
            }
            Some((_, p)) = prx.recv() => {
                phase(&mut multi, &mut rep, t0, &job, 0, p);
                MultiStep::Wait
            }
            r = &mut local, if results[0].is_none() => {
                let r = r.unwrap_or_else(|e| HostResult { note: format!("watch: {e}"), ..HostResult::new(&job.nodes[0], Some(0), &name) });
                interrupted |= r.interrupted;
                let step = multi.ended(0, r.code);
                results[0] = Some(r);
                step
            }
            Some(ev) = erx.recv() => match ev {
                Ev::Joined(r, node_name, tx) => {
                    if !joined[r] {
                        joined[r] = true;
                        senders[r] = Some(tx);
                        rep.note(t0.elapsed().as_millis() as u64, &format!("rank {r} ({node_name}) reported in"));
                        if node_name != job.nodes[r] {
                            rep.note(t0.elapsed().as_millis() as u64, &format!("rank {r} says it is {node_name}, Slurm says {}", job.nodes[r]));
                        }
                    }
                    MultiStep::Wait
                }
                Ev::Got(r, Msg::Phase { phase: p }) => {
                    phase(&mut multi, &mut rep, t0, &job, r, p);
                    MultiStep::Wait
                }
                Ev::Got(r, Msg::End { code, verdict, note }) if results[r].is_none() => {
                    results[r] = Some(end_of(r, code, verdict, note));
                    multi.ended(r, code)
                }
                Ev::Closed(r) if results[r].is_none() => {
                    senders[r] = None;
                    results[r] = Some(end_of(r, Exit::Unreachable, "unreachable".into(), format!("vigil on {} went away before its verdict", job.nodes[r])));
                    multi.ended(r, Exit::Unreachable)
                }
                _ => MultiStep::Wait,
            },
            _ = tokio::time::sleep_until(join_by), if !all_joined => {
                let mut step = MultiStep::Wait;
                for r in 0..n {
                    if !joined[r] && results[r].is_none() {
                        let why = format!("vigil on {} did not reach the head within {}s (is it running under the same srun?)", job.nodes[r], flags.join.as_secs());
                        results[r] = Some(end_of(r, Exit::Unreachable, "unreachable".into(), why));
                        step = multi.ended(r, Exit::Unreachable);
                    }
                }
                step
            }
            _ = crate::signals::next_interrupt(), if results[0].is_some() => {
                interrupted = true;
                MultiStep::Done
            }
        };
        if step == MultiStep::Done {
            break;
        }
    }
    if results[0].is_none() {
        local.abort();
    }
    let results: Vec<HostResult> = hosts::stopped_unless_done(results, &job.nodes, &name);
    let mut code = hosts::summarize(&results, true, a.launch.json, a.quiet);
    if interrupted {
        code = Exit::Interrupted;
    }
    let mut why = String::new();
    if fleet::serves(code) {
        // serving: until the job ends (SIGTERM), or a rank's server ends
        rep.note(
            t0.elapsed().as_millis() as u64,
            &format!("serving on all {n} nodes of job {}; ends with the job step", job.id),
        );
        loop {
            tokio::select! {
                acc = listener.accept() => { drop(acc); }
                _ = crate::signals::next_interrupt() => { interrupted = true; code = Exit::Ready; why = "interrupted".into(); break; }
                end = node.wait_exit(&name) => {
                    let x = &end.exit;
                    if job_ending().await {
                        why = "interrupted: the job step is ending".into();
                        interrupted = true;
                        code = Exit::Ready;
                    } else if x.orderly_after_ready(end.requested) {
                        why = format!("rank 0's server {} after ready", crate::node::up::stopped_how(x, end.requested, None));
                        code = Exit::Ready;
                    } else {
                        why = format!("rank 0's server {} after ready: crashed", crate::node::up::exit_how(x.code, x.signal));
                        code = Exit::Crashed;
                    }
                    break;
                }
                Some(ev) = erx.recv() => match ev {
                    // the job's end reaches every node: a rank interrupted after ready is an orderly end
                    Ev::Got(r, Msg::End { code: Exit::Interrupted, .. }) => {
                        why = format!("rank {r} ({}) was interrupted: the job step is ending", job.nodes[r]);
                        interrupted = true;
                        code = Exit::Ready;
                        break;
                    }
                    Ev::Got(r, Msg::End { code: c, note, .. }) => { why = format!("rank {r} ({}): {note}", job.nodes[r]); code = c; break; }
                    // the vigil is the node's task: when it is gone, Slurm ends that node's part of the step, its
                    // server included, and the server as a whole cannot serve
                    Ev::Closed(r) => {
                        why = format!("vigil on {} went away: Slurm ends that node's part of the step with its task", job.nodes[r]);
                        code = Exit::Unreachable;
                        senders[r] = None;
                        break;
                    }
                    _ => {}
                },
            }
        }
        rep.note(t0.elapsed().as_millis() as u64, &why);
    }
    // the end: every rank stops its server (a multi-node server cannot run without all of them)
    if why.is_empty() {
        why = format!(
            "the server is {}",
            if interrupted { "interrupted".to_string() } else { format!("decided: exit {}", code.code()) }
        );
    }
    for tx in senders.iter().flatten() {
        let _ = tx.send(Msg::Stop { code, why: why.clone() });
    }
    let mut worst = code;
    let mut all_stopped = true;
    let keep = a.keep && interrupted;
    if !keep && !node.stop(&name, a.launch.grace, &mut rep).await? {
        worst = worst.max(Exit::NotStopped);
        all_stopped = false;
    }
    // each rank answers when its server is stopped (bounded: its grace and a margin); a rank that never
    // joined, went away or does not answer may have left its server running
    let mut waiting: Vec<bool> = senders.iter().map(|s| s.is_some()).collect();
    let mut confirmed = vec![false; n];
    confirmed[0] = true;
    let by = tokio::time::Instant::now() + a.launch.grace + Duration::from_secs(15);
    while waiting.iter().any(|w| *w) {
        tokio::select! {
            Some(ev) = erx.recv() => match ev {
                Ev::Got(r, Msg::Stopped { ok }) => {
                    waiting[r] = false;
                    confirmed[r] = ok;
                    if !ok {
                        worst = worst.max(Exit::NotStopped);
                        rep.note(t0.elapsed().as_millis() as u64, &format!("rank {r} ({}): its server was not stopped", job.nodes[r]));
                    }
                }
                Ev::Closed(r) => waiting[r] = false,
                _ => {}
            },
            _ = tokio::time::sleep_until(by) => {
                let late: Vec<String> = (0..n).filter(|r| waiting[*r]).map(|r| job.nodes[r].clone()).collect();
                rep.note(t0.elapsed().as_millis() as u64, &format!("no stop confirmed by {} in time", late.join(",")));
                break;
            }
        }
    }
    drop(senders);
    all_stopped &= confirmed.iter().all(|c| *c);
    if !interrupted && fleet::ends_allocation(code) {
        end_allocation(&job, flags.scancel, all_stopped, code, &mut rep, t0).await;
    }
    Ok(worst)
}

/// The server ended after ready: is the job step ending? Slurm signals every process of the step at once,
/// the server and this vigil, so vigil's own SIGTERM comes within moments of the server's end (bounded:
/// 1 s); without it, the end is the server's own (a crash, or an orderly stop asked for).
async fn job_ending() -> bool {
    crate::signals::take_interrupt()
        || tokio::time::timeout(Duration::from_secs(1), crate::signals::next_interrupt()).await.is_ok()
}

/// A rank's phase into the combined live phase (the least advanced rank's).
fn phase(multi: &mut MultiNode, rep: &mut Reporter, t0: Instant, job: &Job, r: usize, p: Phase) {
    if let Some((phase, slow)) = multi.phase(r, p) {
        let ev = WatchEvent::MultiNodePhase { phase, slowest_rank: slow, slowest_host: &job.nodes[slow] };
        rep.emit(Some(t0.elapsed().as_millis() as u64), &ev);
    }
}

/// One rank's connection on the head: its lines to `etx`, and a writer for what the head sends it.
fn serve_conn(s: TcpStream, n: usize, etx: UnboundedSender<Ev>) {
    let _ = s.set_nodelay(true);
    let (rd, mut wr) = s.into_split();
    tokio::task::spawn_local(async move {
        let mut rd = BufReader::new(rd);
        let hello = tokio::time::timeout(Duration::from_secs(10), next_msg(&mut rd)).await;
        let Ok(Some(Msg::Hello { rank, node, .. })) = hello else { return };
        if rank == 0 || rank >= n {
            return;
        }
        let (tx, mut rx) = mpsc::unbounded_channel::<Msg>();
        tokio::task::spawn_local(async move {
            while let Some(m) = rx.recv().await {
                if wr.write_all(&line_of(&m)).await.is_err() {
                    break;
                }
            }
            let _ = wr.shutdown().await;
        });
        if etx.send(Ev::Joined(rank, node, tx)).is_err() {
            return;
        }
        while let Some(m) = next_msg(&mut rd).await {
            if etx.send(Ev::Got(rank, m)).is_err() {
                return;
            }
        }
        let _ = etx.send(Ev::Closed(rank));
    });
}

/// Ends the step or the job after a failure verdict, the evidence saved and the servers stopped. The step:
/// when every rank confirmed its stop, every vigil is exiting with the verdict's code and the step ends
/// with them (a `scancel` of its own step would kill this vigil before its exit code is told); otherwise
/// (a rank lost, silent or not stopped) `scancel JOB.STEP`. The job: `scancel JOB`.
async fn end_allocation(job: &Job, s: Scancel, all_stopped: bool, code: Exit, rep: &mut Reporter, t0: Instant) {
    let t = t0.elapsed().as_millis() as u64;
    let Some(target) = job.target(s) else {
        rep.note(t, "--scancel none: the allocation is left to the batch script");
        return;
    };
    let step = target.contains('.');
    if step && all_stopped {
        rep.note(
            t,
            &format!(
                "every rank stopped its server: Slurm step {target} ends as its vigils exit (exit {})",
                code.code()
            ),
        );
        return;
    }
    let what = if step { "step" } else { "job" };
    rep.note(t, &format!("a failure verdict: ending Slurm {what} {target} (scancel) to release the allocation"));
    if let Err(e) = run_cmd("scancel", &[&target]).await {
        rep.note(t0.elapsed().as_millis() as u64, &format!("scancel {target} failed: {}", e.message()));
    }
}

/// Connects to the head, retrying until `by`; sends `Hello` first.
async fn connect(job: &Job, port: u16, by: tokio::time::Instant) -> Result<TcpStream, String> {
    let addr = node_addr(&job.nodes[0]).await;
    let mut wait = Duration::from_millis(100);
    loop {
        let attempt = tokio::time::timeout(Duration::from_secs(5), TcpStream::connect((addr.as_str(), port))).await;
        let err = match attempt {
            Ok(Ok(s)) => return Ok(s),
            Ok(Err(e)) => e.to_string(),
            Err(_) => "no answer within 5s".into(),
        };
        if tokio::time::Instant::now() + wait > by {
            return Err(format!("the head node {} ({addr}:{port}): {err}", job.nodes[0]));
        }
        // the head may not listen yet (it starts at the same moment): retry with backoff, up to 2 s apart
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(Duration::from_secs(2));
    }
}

/// A rank ≥ 1: its own rank, reported to the head; stops at the head's word, at an interrupt, or (the head
/// lost) at its own failure, when it ends the allocation itself.
async fn member(c: Ctx) -> Result<Exit, CliError> {
    let Ctx { job, flags, a, argv, profiles } = c;
    let name = a.name.clone().unwrap_or_default();
    let mut rep = reporter(&a, &job);
    let port = job.port(&flags);
    let (node, mut local, mut prx) = start_local(&job, &a, argv, &profiles);
    // the connection: messages queue until it is up; the head's words come back on `hrx`
    let (otx, mut orx) = mpsc::unbounded_channel::<Msg>();
    let (htx, mut hrx) = mpsc::unbounded_channel::<Result<Msg, String>>();
    let hello = Msg::Hello { rank: job.rank, node: job.nodes[job.rank].clone(), job: job.id };
    let join_by = tokio::time::Instant::now() + flags.join;
    let j2 = job.clone();
    let conn = tokio::task::spawn_local(async move {
        let s = match connect(&j2, port, join_by).await {
            Ok(s) => s,
            Err(e) => {
                let _ = htx.send(Err(e));
                return;
            }
        };
        let _ = s.set_nodelay(true);
        let (rd, mut wr) = s.into_split();
        let h2 = htx.clone();
        tokio::task::spawn_local(async move {
            let mut rd = BufReader::new(rd);
            while let Some(m) = next_msg(&mut rd).await {
                let _ = h2.send(Ok(m));
            }
            let _ = h2.send(Err("the head's vigil closed the connection".into()));
        });
        if wr.write_all(&line_of(&hello)).await.is_err() {
            let _ = htx.send(Err("the head's vigil closed the connection".into()));
            return;
        }
        while let Some(m) = orx.recv().await {
            if wr.write_all(&line_of(&m)).await.is_err() {
                break;
            }
        }
    });
    let t0 = Instant::now();
    let mut own: Option<HostResult> = None;
    let mut failed_at: Option<tokio::time::Instant> = None;
    let mut code_from_head: Option<Exit> = None;
    let mut head_lost: Option<String> = None;
    let mut interrupted = false;
    let answer_in = a.launch.grace + Duration::from_secs(30);
    loop {
        let serving = own.as_ref().is_some_and(|r| fleet::serves(r.code));
        tokio::select! {
            Some((_, p)) = prx.recv() => { let _ = otx.send(Msg::Phase { phase: p }); }
            r = &mut local, if own.is_none() => {
                let r = r.unwrap_or_else(|e| HostResult { note: format!("watch: {e}"), ..HostResult::new(&job.nodes[job.rank], Some(job.rank), &name) });
                let _ = otx.send(Msg::End { code: r.code, verdict: hosts::verdict_text(&r), note: first_line(&r.note) });
                interrupted |= r.interrupted;
                if interrupted {
                    break;
                }
                if !fleet::serves(r.code) {
                    failed_at = Some(tokio::time::Instant::now());
                } else {
                    rep.note(t0.elapsed().as_millis() as u64, "ready; the head node gives the combined verdict");
                }
                own = Some(r);
            }
            end = node.wait_exit(&name), if serving && failed_at.is_none() => {
                if job_ending().await {
                    let _ = otx.send(Msg::End { code: Exit::Interrupted, verdict: "interrupted".into(), note: "interrupted".into() });
                    interrupted = true;
                    break;
                }
                let x = &end.exit;
                let (code, note) = if x.orderly_after_ready(end.requested) {
                    (Exit::Ready, format!("its server {} after ready", crate::node::up::stopped_how(x, end.requested, None)))
                } else {
                    (Exit::Crashed, format!("its server {} after ready: crashed", crate::node::up::exit_how(x.code, x.signal)))
                };
                rep.note(t0.elapsed().as_millis() as u64, &note);
                let _ = otx.send(Msg::End { code, verdict: if code == Exit::Crashed { "crashed".into() } else { "stopped".into() }, note });
                if let Some(r) = own.as_mut() { r.code = code; }
                failed_at = Some(tokio::time::Instant::now());
            }
            m = hrx.recv() => match m {
                Some(Ok(Msg::Stop { code, why })) => {
                    rep.note(t0.elapsed().as_millis() as u64, &format!("the head stops this rank: {why}"));
                    code_from_head = Some(code);
                    break;
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => { head_lost = Some(e); break; }
                None => { head_lost = Some("the head's vigil is gone".into()); break; }
            },
            _ = tokio::time::sleep_until(failed_at.unwrap_or_else(tokio::time::Instant::now) + answer_in), if failed_at.is_some() => {
                head_lost = Some(format!("no word from the head within {}s of this rank's end", answer_in.as_secs()));
                break;
            }
            _ = crate::signals::next_interrupt(), if own.is_some() => {
                // told before this vigil's connection closes: the head must not take it for a lost rank
                let _ = otx.send(Msg::End { code: Exit::Interrupted, verdict: "interrupted".into(), note: "interrupted".into() });
                interrupted = true;
                break;
            }
        }
    }
    if own.is_none() {
        local.abort();
    }
    if let Some(why) = &head_lost {
        rep.note(t0.elapsed().as_millis() as u64, &format!("the head node is lost: {why}"));
    }
    let mut ok = true;
    if !(a.keep && interrupted) {
        ok = node.stop(&name, a.launch.grace, &mut rep).await?;
    }
    let _ = otx.send(Msg::Stopped { ok });
    drop(otx);
    // the connection writes what is queued (bounded), then ends
    let _ = tokio::time::timeout(Duration::from_secs(5), conn).await;
    let own_code = own.as_ref().map(|r| r.code).unwrap_or(Exit::Starting);
    // SIGTERM after ready (the job's end, a person's scancel) is an orderly stop, as `vigil up`'s own
    let serving = fleet::serves(own_code);
    let mut code = match (interrupted, serving) {
        (true, true) => Exit::Ready,
        (true, false) => Exit::Interrupted,
        _ => code_from_head.unwrap_or(own_code),
    };
    // the head cannot end the allocation: this rank does, for its own failure only
    if head_lost.is_some() && !interrupted && fleet::ends_allocation(own_code) {
        end_allocation(&job, flags.scancel, false, own_code, &mut rep, t0).await;
        code = own_code;
    }
    Ok(if ok { code } else { code.max(Exit::NotStopped) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_the_job_and_stay_valid() {
        assert_eq!(run_name("sglang", 42, 1), "sglang.job42.n1");
        let long = "x".repeat(80);
        let n = run_name(&long, 123456, 3);
        assert!(n.len() <= 64 && n.ends_with(".job123456.n3"));
        assert!(crate::node::run::valid_name(&n).is_ok());
    }

    #[test]
    fn ports_are_in_range_and_differ_by_job() {
        for j in [0u64, 1, 19_999, 20_000, u64::MAX] {
            let p = derived_port(j, Some(0));
            assert!((20_000..32_000).contains(&p), "{j}: {p}");
        }
        assert_ne!(derived_port(10, Some(0)), derived_port(11, Some(0)));
        assert_ne!(derived_port(10, Some(0)), derived_port(10, Some(1)));
    }

    #[test]
    fn scancel_targets() {
        let j = Job { id: 7, step: Some(0), rank: 0, nodes: vec!["a".into()] };
        assert_eq!(j.target(Scancel::Step).as_deref(), Some("7.0"));
        assert_eq!(j.target(Scancel::Job).as_deref(), Some("7"));
        assert_eq!(j.target(Scancel::None), None);
        let batch = Job { step: None, ..j };
        assert_eq!(batch.target(Scancel::Step).as_deref(), Some("7"));
    }

    #[tokio::test]
    async fn protocol_lines_round_trip_and_are_bounded() {
        let m = Msg::End { code: Exit::Crashed, verdict: "crashed".into(), note: "x".into() };
        let line = line_of(&m);
        let mut r = BufReader::new(&line[..]);
        assert!(matches!(next_msg(&mut r).await, Some(Msg::End { code: Exit::Crashed, .. })));
        let long = vec![b'a'; MAX_LINE + 10];
        let mut r = BufReader::new(&long[..]);
        assert!(next_msg(&mut r).await.is_none());
        let mut r = BufReader::new(&b"{\"msg\":\"bogus\"}\n"[..]);
        assert!(next_msg(&mut r).await.is_none());
    }
}
