//! `vigil up --multi-node -- CMD` on every node of a multi-node server, each started by whatever starts the
//! server there (issue #27: Slurm's `srun`; issue #32: any launcher — a Kubernetes LeaderWorkerSet, Ray, a
//! shell loop over `pdsh`, two processes on one machine): one vigil per rank, each the keeper and watch of
//! its rank; the verdict per rank on every rank, the combined verdict on the head (rank 0).
//!
//! How the ranks meet, in the order they are looked for ([`Group::find`]):
//! - `--rank N --ranks M --rendezvous HOST:PORT`: the launcher says it (any launcher);
//! - a LeaderWorkerSet pod's environment: `LWS_WORKER_INDEX` (the rank), `LWS_GROUP_SIZE` (the ranks),
//!   `LWS_LEADER_ADDRESS` (the head), on `--rendezvous-port` or [`DEFAULT_PORT`];
//! - a Slurm job step: `SLURM_STEP_NODELIST` (expanded by `scontrol show hostnames`) and this node
//!   (`SLURMD_NODENAME`): the rank is the node's place in that list, the head is its first node, reached at
//!   its Slurm address (`scontrol show node`, `NodeAddr`) on a TCP port derived from the job and step ids
//!   (`--rendezvous-port` to choose it).
//!
//! The other ranks connect to the head and send their phases and verdict as JSON lines; the head feeds them
//! to the core's `fleet::MultiNode` (a rank that failed on its own decides over one whose failure followed a
//! peer's; ready needs every rank). No SSH and no shared directory are needed.
//!
//! At a failure the head tells every rank to stop its server; a rank that had no verdict of its own saves
//! its evidence first (its stacks, its GPU memory: the ranks that only waited), then stops. In a Slurm job
//! the head then ends the job step or the job (`--scancel`), so the allocation is released rather than
//! burning to its time limit. Only a failure does that (`fleet::ends_allocation`): never a serving server
//! or an interrupt. Under another launcher each vigil exits with the verdict's code and the launcher's own
//! policy (a LeaderWorkerSet's restart of the group) takes it from there.

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

/// The multi-node flags of `vigil up`.
#[derive(Clone, Debug, Default)]
pub struct Flags {
    pub scancel: Option<Scancel>,
    pub port: Option<u16>,
    /// How long the head waits for every rank to join, and a rank for the head.
    pub join: Duration,
    /// `--rank`, `--ranks`, `--rendezvous HOST:PORT`: the launcher names this rank's place.
    pub rank: Option<usize>,
    pub ranks: Option<usize>,
    pub rendezvous: Option<String>,
}

impl Flags {
    /// Whether the command line names a rank's place (then no launcher environment is needed).
    pub fn named(&self) -> bool {
        self.rank.is_some() || self.ranks.is_some() || self.rendezvous.is_some()
    }
}

/// The head's port under a launcher that names none (a LeaderWorkerSet): below Linux's ephemeral ports, away
/// from the servers' own defaults (8000, 30000, 29500 for torch.distributed).
pub const DEFAULT_PORT: u16 = 24_810;
/// A longest protocol line (a verdict's one-line note is far shorter).
const MAX_LINE: usize = 64 << 10;
/// Every `scontrol`/`scancel` call ends within this.
const CMD_TIMEOUT: Duration = Duration::from_secs(15);

/// Who started the ranks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Launcher {
    /// A Slurm job step: its job and step ids.
    Slurm { job: u64, step: Option<u64> },
    /// A Kubernetes LeaderWorkerSet group (its environment).
    Lws,
    /// `--rank/--ranks/--rendezvous` on the command line.
    Flags,
}

/// This rank's place in the multi-node server, and where the head is.
#[derive(Clone, Debug)]
pub struct Group {
    pub launcher: Launcher,
    /// What every rank of one server shares, checked at the head (a vigil of another group on the same
    /// port is turned away): the job id, the leader's address, the rendezvous.
    pub id: String,
    pub rank: usize,
    /// The ranks' names: Slurm's node names; under another launcher this host's own for this rank, the
    /// head's address for rank 0, `rank N` for the others until they report in.
    pub nodes: Vec<String>,
    /// The address the other ranks reach the head at.
    pub head: String,
    pub port: u16,
}

fn env_var(k: &str) -> Option<String> {
    std::env::var(k).ok().map(|v| v.trim().to_string()).filter(|v| !v.is_empty())
}

fn this_host() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into buf.
    let r = unsafe { libc::gethostname(buf.as_mut_ptr() as *mut libc::c_char, buf.len()) };
    if r != 0 {
        return "localhost".into();
    }
    let n = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

/// `HOST:PORT` (a name, an IPv4 address, or `[IPv6]:PORT`).
pub fn parse_rendezvous(s: &str) -> Result<(String, u16), CliError> {
    let bad =
        || CliError::usage(format!("--rendezvous '{s}': give HOST:PORT (the head's address and a free TCP port)"));
    let (h, p) = s.trim().rsplit_once(':').ok_or_else(bad)?;
    let h = h.trim_start_matches('[').trim_end_matches(']');
    let port: u16 = p.parse().ok().filter(|p| *p > 0).ok_or_else(bad)?;
    if h.is_empty() || h.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(bad());
    }
    Ok((h.to_string(), port))
}

fn place(what: &str, rank: usize, ranks: usize) -> Result<(), CliError> {
    if ranks == 0 || rank >= ranks {
        return Err(CliError::usage(format!("{what}: rank {rank} of {ranks} ranks (ranks count from 0)")));
    }
    Ok(())
}

/// The names of a group's ranks under a launcher that does not list them.
fn names(rank: usize, ranks: usize, head: &str) -> Vec<String> {
    (0..ranks)
        .map(|i| match i {
            _ if i == rank => this_host(),
            0 => head.to_string(),
            _ => format!("rank {i}"),
        })
        .collect()
}

impl Group {
    /// This rank's group: from the command line, else a LeaderWorkerSet's environment, else a Slurm job
    /// step's; `None` when none says it.
    pub async fn find(flags: &Flags) -> Result<Option<Group>, CliError> {
        if flags.named() {
            return Group::from_flags(flags).map(Some);
        }
        if let Some(g) = Group::from_lws(flags)? {
            return Ok(Some(g));
        }
        Group::from_slurm(flags).await
    }

    fn from_flags(flags: &Flags) -> Result<Group, CliError> {
        let (Some(rank), Some(ranks), Some(rv)) = (flags.rank, flags.ranks, flags.rendezvous.as_deref()) else {
            return Err(CliError::usage(
                "--multi-node under a launcher needs all three of --rank N --ranks M --rendezvous HOST:PORT",
            ));
        };
        place("--rank/--ranks", rank, ranks)?;
        let (head, port) = parse_rendezvous(rv)?;
        Ok(Group {
            launcher: Launcher::Flags,
            id: format!("{head}:{port}"),
            rank,
            nodes: names(rank, ranks, &head),
            head,
            port,
        })
    }

    /// A LeaderWorkerSet pod (leaderworkerset.x-k8s.io): the controller sets `LWS_LEADER_ADDRESS`,
    /// `LWS_GROUP_SIZE` and `LWS_WORKER_INDEX` in every container of the group (0 is the leader).
    fn from_lws(flags: &Flags) -> Result<Option<Group>, CliError> {
        let (Some(head), Some(size), Some(index)) =
            (env_var("LWS_LEADER_ADDRESS"), env_var("LWS_GROUP_SIZE"), env_var("LWS_WORKER_INDEX"))
        else {
            return Ok(None);
        };
        let num =
            |k: &str, v: &str| v.parse::<usize>().map_err(|_| CliError::usage(format!("{k} is not a number: '{v}'")));
        let (ranks, rank) = (num("LWS_GROUP_SIZE", &size)?, num("LWS_WORKER_INDEX", &index)?);
        place("LWS_WORKER_INDEX/LWS_GROUP_SIZE", rank, ranks)?;
        Ok(Some(Group {
            launcher: Launcher::Lws,
            id: head.clone(),
            rank,
            nodes: names(rank, ranks, &head),
            port: flags.port.unwrap_or(DEFAULT_PORT),
            head,
        }))
    }

    /// The Slurm job step around this process: `None` outside Slurm (no `SLURM_JOB_ID`).
    async fn from_slurm(flags: &Flags) -> Result<Option<Group>, CliError> {
        let var = env_var;
        let Some(id) = var("SLURM_JOB_ID") else { return Ok(None) };
        let id: u64 = id.parse().map_err(|_| CliError::usage(format!("SLURM_JOB_ID is not a job id: '{id}'")))?;
        // the batch step's id is not a number ("batch", or 4294967294 in some versions): no step to end
        let step = var("SLURM_STEP_ID").and_then(|s| s.parse::<u64>().ok()).filter(|s| *s < 0xFFFF_FFF0);
        if let Some(l) = var("SLURM_LOCALID").and_then(|l| l.parse::<u32>().ok()) {
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
        let head = if rank == 0 { nodes[0].clone() } else { node_addr(&nodes[0]).await };
        Ok(Some(Group {
            launcher: Launcher::Slurm { job: id, step },
            id: id.to_string(),
            rank,
            port: flags.port.unwrap_or_else(|| derived_port(id, step)),
            nodes,
            head,
        }))
    }

    /// What `--scancel` names: `JOB.STEP` or `JOB` (a job without a step id ends whole); nothing outside
    /// Slurm.
    fn target(&self, s: Scancel) -> Option<String> {
        let Launcher::Slurm { job, step } = self.launcher else { return None };
        match (s, step) {
            (Scancel::None, _) => None,
            (Scancel::Step, Some(st)) => Some(format!("{job}.{st}")),
            _ => Some(job.to_string()),
        }
    }

    /// The launcher in words, for the head's first line.
    fn describe(&self) -> String {
        let n = self.nodes.len();
        match self.launcher {
            Launcher::Slurm { job, .. } => format!("Slurm job {job} on {n} nodes ({})", self.nodes.join(",")),
            Launcher::Lws => format!("LeaderWorkerSet group of {n} (leader {})", self.head),
            Launcher::Flags => format!("{n} ranks (rendezvous {})", self.id),
        }
    }

    /// This rank's run name: unique on its node and in the history.
    fn run_name(&self, base: &str) -> String {
        match self.launcher {
            Launcher::Slurm { job, .. } => run_name(base, job, self.rank),
            _ => rank_run_name(base, self.rank),
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

/// Under another launcher: `BASE.nRANK` (two ranks on one machine, as on the GPU machine's two nodes on one
/// GPU, need two names).
pub fn rank_run_name(base: &str, rank: usize) -> String {
    let tail = format!(".n{rank}");
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
    /// rank → head, first: who this is, and of which group (the head turns away another group's vigil);
    /// `follower`: it has no readiness of its own (no API port: vLLM's `--headless` workers), it is ready
    /// when the other ranks are.
    Hello {
        rank: usize,
        node: String,
        group: String,
        #[serde(default)]
        follower: bool,
    },
    /// head → a follower rank: every other rank is ready, the server serves; so is this rank.
    Serving,
    /// rank → head: its phase changed.
    Phase { phase: Phase },
    /// rank → head: its watch ended (or its server ended after ready); `consequence`: its failure followed
    /// a peer's (its root-cause lines say a peer went away).
    End {
        code: Exit,
        verdict: String,
        note: String,
        #[serde(default)]
        consequence: bool,
        /// Its verdict's evidence shows a stopped process: that line.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stuck: Option<String>,
        /// Its verdict: what it was, in which phase, of what cause (the head's table and JSON carry them).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        report: Option<RankVerdict>,
    },
    /// head → rank: the server is decided bad (or interrupted): stop yours and exit with `code`; `evidence`:
    /// a failure, so a rank without a verdict of its own saves its evidence first.
    Stop {
        code: Exit,
        why: String,
        #[serde(default)]
        evidence: bool,
    },
    /// rank → head: stopped (`ok`: nothing left); `stuck`: the evidence taken before shows a stopped process.
    Stopped {
        ok: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stuck: Option<String>,
    },
}

/// A rank's verdict as the head's table and JSON carry it.
#[derive(Serialize, Deserialize, Debug, Clone)]
struct RankVerdict {
    verdict: vigil_core::Verdict,
    phase: Phase,
    #[serde(default)]
    cause: Option<vigil_core::Cause>,
}

impl RankVerdict {
    fn report(self) -> vigil_core::Report {
        let mut b = vigil_core::Report::bare(self.verdict, self.phase);
        b.cause = self.cause;
        b
    }
}

/// What the head hears from its connections.
enum Ev {
    Joined(usize, String, bool, UnboundedSender<Msg>),
    /// A vigil of another group (its id) claimed a rank: turned away.
    Foreign(usize, String),
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

/// `vigil up --multi-node` as one rank of a group: this rank's run, and on the head the combined verdict.
pub async fn up(
    job: Group,
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
                "--nnodes {nn} but {} has {n}: run one vigil per node",
                job.describe()
            )));
        }
    }
    let argv = hosts::rank_argv(&argv, job.rank, n);
    let kind = a.server.clone().or_else(|| profiles.detect_cmd(&argv_s).map(String::from));
    let base = hosts::run_name(&a, &kind, &argv);
    a.name = Some(job.run_name(&base));
    if flags.scancel.is_some() && !matches!(job.launcher, Launcher::Slurm { .. }) {
        return Err(CliError::usage("--scancel is for a Slurm job step; this group was started by another launcher"));
    }
    crate::supervise::up::start_listener(&a)?;
    let (a, profiles) = (Arc::new(a), Arc::new(profiles));
    let local = tokio::task::LocalSet::new();
    local
        .run_until(async move {
            let rank0 = job.rank == 0;
            let c = Ctx { job, flags, a, argv, profiles, kind };
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
    job: &Group,
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

/// What every rank's vigil runs with: the group, the flags, `up`'s arguments, this rank's server command.
struct Ctx {
    job: Group,
    flags: Flags,
    a: Arc<UpArgs>,
    argv: Vec<Vec<u8>>,
    profiles: Arc<Profiles>,
    /// The server's kind (`--server`, else detected from the command), read once for every rank.
    kind: Option<String>,
}

fn reporter(a: &UpArgs, job: &Group) -> Reporter {
    let mut rep = Reporter::new(a.launch.json, a.quiet);
    rep.tagged(&job.nodes[job.rank], Some(job.rank));
    rep
}

/// The head (rank 0): its own rank, the others' reports, the combined verdict, and at a failure the stop of
/// every rank and the end of the step or job.
async fn head(c: Ctx) -> Result<Exit, CliError> {
    let Ctx { mut job, flags, a, argv, profiles, kind } = c;
    let n = job.nodes.len();
    let port = job.port;
    // a loopback rendezvous (ranks on one machine) listens there only; any other on every address, since
    // the name the others use for the head may not be one of this machine's own
    let bind: std::net::IpAddr = match job.head.parse::<std::net::IpAddr>() {
        Ok(ip) if ip.is_loopback() => ip,
        _ if job.head == "localhost" => std::net::Ipv4Addr::LOCALHOST.into(),
        _ => std::net::Ipv4Addr::UNSPECIFIED.into(),
    };
    let listener = TcpListener::bind((bind, port)).await.map_err(|e| {
        let how = if matches!(job.launcher, Launcher::Flags) { "--rendezvous HOST:PORT" } else { "--rendezvous-port" };
        CliError::usage(format!(
            "the head ({}) cannot listen on port {port} for the other ranks: {e} (choose another with {how})",
            job.nodes[0]
        ))
    })?;
    let mut rep = reporter(&a, &job);
    rep.note(0, &format!("{}: head, waiting for the ranks on port {port}", job.describe()));
    let name = a.name.clone().unwrap_or_default();
    let (node, mut local, mut prx) = start_local(&job, &a, argv, &profiles);
    let (etx, mut erx) = mpsc::unbounded_channel::<Ev>();
    let mut senders: Vec<Option<UnboundedSender<Msg>>> = vec![None; n];
    let mut results: Vec<Option<HostResult>> = (0..n).map(|_| None).collect();
    let mut joined = vec![false; n];
    joined[0] = true;
    let mut multi = MultiNode::new(n);
    let mut stuck_lines: Vec<Option<String>> = vec![None; n];
    let t0 = Instant::now();
    let join_by = tokio::time::Instant::now() + flags.join;
    let mut interrupted = false;
    let end_of = |nodes: &[String], i: usize, code: Exit, verdict: String, note: String| -> HostResult {
        HostResult { code, note, shown: Some(verdict), ..HostResult::new(&nodes[i], Some(i), &name) }
    };
    // the startup: every rank to its verdict, or the first failure
    loop {
        let all_joined = joined.iter().all(|j| *j);
        let step = tokio::select! {
            acc = listener.accept() => {
                if let Ok((s, _)) = acc {
                    serve_conn(s, n, job.id.clone(), etx.clone());
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
                let step = multi.ended_at(0, r.code, r.consequence, t0.elapsed().as_millis() as u64);
                results[0] = Some(r);
                step
            }
            Some(ev) = erx.recv() => match ev {
                Ev::Foreign(r, group) => {
                    rep.note(t0.elapsed().as_millis() as u64, &format!("turned away a vigil of another group ({group}) claiming rank {r}"));
                    MultiStep::Wait
                }
                Ev::Joined(r, node_name, follower, tx) => {
                    let t = t0.elapsed().as_millis() as u64;
                    if !joined[r] {
                        joined[r] = true;
                        senders[r] = Some(tx);
                        if follower {
                            multi.follows(r);
                        }
                        rep.note(t, &format!("rank {r} ({node_name}) reported in"));
                        if !matches!(job.launcher, Launcher::Slurm { .. }) {
                            job.nodes[r] = node_name;
                        } else if node_name != job.nodes[r] {
                            rep.note(t, &format!("rank {r} says it is {node_name}, Slurm says {}", job.nodes[r]));
                        }
                        let ev = WatchEvent::RankPhase { of_rank: r, of_host: &job.nodes[r], phase: Phase::Launch };
                        rep.emit(Some(t), &ev);
                    }
                    MultiStep::Wait
                }
                Ev::Got(r, Msg::Phase { phase: p }) => {
                    phase(&mut multi, &mut rep, t0, &job, r, p);
                    MultiStep::Wait
                }
                Ev::Got(r, Msg::End { code, verdict, note, consequence, stuck, report }) if results[r].is_none() => {
                    if stuck.is_some() {
                        multi.stuck(r);
                        stuck_lines[r] = stuck;
                    }
                    let mut res = end_of(&job.nodes, r, code, verdict, note);
                    res.consequence = consequence;
                    res.report = report.map(RankVerdict::report);
                    results[r] = Some(res);
                    multi.ended_at(r, code, consequence, t0.elapsed().as_millis() as u64)
                }
                Ev::Closed(r) if results[r].is_none() => {
                    senders[r] = None;
                    results[r] = Some(end_of(&job.nodes, r, Exit::Unreachable, "unreachable".into(), format!("vigil on {} went away before its verdict", job.nodes[r])));
                    multi.ended_at(r, Exit::Unreachable, false, t0.elapsed().as_millis() as u64)
                }
                _ => MultiStep::Wait,
            },
            // a rank failed as a consequence of a peer: the rank that failed on its own has had its time
            _ = tokio::time::sleep_until(settle_at(&multi, t0)), if multi.settle_until().is_some() => {
                multi.settled(t0.elapsed().as_millis() as u64)
            }
            _ = tokio::time::sleep_until(join_by), if !all_joined => {
                let mut step = MultiStep::Wait;
                for r in 0..n {
                    if !joined[r] && results[r].is_none() {
                        let why = format!("vigil on {} did not reach the head within {}s (is it started, with the same rendezvous?)", job.nodes[r], flags.join.as_secs());
                        results[r] = Some(end_of(&job.nodes, r, Exit::Unreachable, "unreachable".into(), why));
                        step = multi.ended_at(r, Exit::Unreachable, false, t0.elapsed().as_millis() as u64);
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
    let (decided, _) = multi.outcome();
    // a failure: the verdict is told once every rank's evidence is in (which rank is stuck, which waited)
    let deferred = !interrupted && fleet::ends_allocation(decided);
    match &results[0] {
        None => {
            local.abort();
            // another rank failed: this rank's stacks and memory say whether it only waited
            if let Some(l) = if deferred { own_evidence(&node, &name, &mut rep, t0).await } else { None } {
                multi.stuck(0);
                stuck_lines[0] = Some(l);
            }
        }
        Some(r) => {
            if r.report.as_ref().and_then(|x| vigil_core::evidence::stopped_line(&x.evidence)).is_some() {
                multi.stuck(0);
            }
        }
    }
    // followers still running when every other rank is ready are ready with them, and told so
    let exits = multi.exits();
    for r in 1..n {
        if results[r].is_none() && multi.is_follower(r) && exits[r] == Exit::Ready {
            let why = "ready: the other ranks are (no readiness of its own: no API port)".to_string();
            results[r] = Some(end_of(&job.nodes, r, Exit::Ready, "ready".into(), why));
            if let Some(tx) = &senders[r] {
                let _ = tx.send(Msg::Serving);
            }
        }
    }
    let mut results: Vec<HostResult> = hosts::stopped_unless_done(results, &job.nodes, &name);
    for (i, r) in results.iter_mut().enumerate() {
        r.phase_seen = multi.phase_of(i);
    }
    let mut code = if deferred {
        decided
    } else {
        hosts::summarize(&results, true, Some(multi.outcome()), a.launch.json, a.quiet)
    };
    if interrupted {
        code = Exit::Interrupted;
    }
    let mut why = String::new();
    // after ready, the rank whose end decides, and its line
    let mut ended_by: Option<(usize, String, Option<RankVerdict>)> = None;
    if fleet::serves(code) {
        // serving: until the job ends (SIGTERM), or a rank's server ends
        rep.note(
            t0.elapsed().as_millis() as u64,
            &format!(
                "serving on all {n} ranks; ends with the {}",
                match job.launcher {
                    Launcher::Slurm { .. } => "job step",
                    _ => "launcher's stop (SIGTERM)",
                }
            ),
        );
        loop {
            tokio::select! {
                acc = listener.accept() => { drop(acc); }
                _ = crate::signals::next_interrupt() => { interrupted = true; code = Exit::Ready; why = "interrupted".into(); break; }
                end = node.wait_exit(&name) => {
                    let x = &end.exit;
                    if job_ending().await {
                        why = "interrupted: the launcher is stopping the ranks".into();
                        interrupted = true;
                        code = Exit::Ready;
                    } else if end.requested {
                        // only a stop that was asked for (vigil down) is an orderly end of one rank: a rank that
                        // ends on its own, even with status 0 (vLLM's --headless node once its worker died), takes
                        // the server down with it
                        why = format!("rank 0: {}", crate::node::up::stopped_how(x, end.requested, None));
                        code = Exit::Ready;
                    } else {
                        let cause = after_ready_cause(&name, kind.as_deref(), &profiles);
                        let how = crate::node::up::exit_how(x.code, x.signal);
                        let said = cause.map(|c| format!(" ({c})")).unwrap_or_default();
                        why = format!("rank 0's server {how} after ready: crashed{said}");
                        code = Exit::Crashed;
                        let v = RankVerdict { verdict: vigil_core::Verdict::Crashed, phase: Phase::Serving, cause };
                        ended_by = Some((0, format!("its server {how} after ready: crashed{said}"), Some(v)));
                    }
                    break;
                }
                Some(ev) = erx.recv() => match ev {
                    // the job's end reaches every node: a rank interrupted after ready is an orderly end
                    Ev::Got(r, Msg::End { code: Exit::Interrupted, .. }) => {
                        why = format!("rank {r} ({}) was interrupted: the launcher is stopping the ranks", job.nodes[r]);
                        interrupted = true;
                        code = Exit::Ready;
                        break;
                    }
                    Ev::Got(r, Msg::End { code: c, note, report, .. }) => {
                        why = format!("rank {r} ({}): {note}", job.nodes[r]);
                        code = c;
                        ended_by = Some((r, note, report));
                        break;
                    }
                    // the vigil is the node's task: when it is gone, Slurm ends that node's part of the step, its
                    // server included, and the server as a whole cannot serve
                    Ev::Closed(r) => {
                        why = format!("vigil on {} went away: its launcher ends that rank's server with it", job.nodes[r]);
                        code = Exit::Unreachable;
                        senders[r] = None;
                        ended_by = Some((r, "its vigil went away after ready".into(), None));
                        break;
                    }
                    _ => {}
                },
            }
        }
        rep.note(t0.elapsed().as_millis() as u64, &why);
        // the server ended after ready: the verdict again, decided by the rank whose end it was
        if let Some((r, note, report)) = ended_by.filter(|_| !interrupted && !fleet::serves(code)) {
            results[r].code = code;
            results[r].note = note;
            results[r].shown = Some(code.to_string());
            results[r].phase_seen = Some(Phase::Serving);
            results[r].report = report.map(RankVerdict::report);
            hosts::summarize(&results, true, Some((code, Some(r))), a.launch.json, a.quiet);
        }
    }
    // the end: every rank stops its server (a multi-node server cannot run without all of them)
    if why.is_empty() {
        why = format!(
            "the server is {}",
            if interrupted { "interrupted".to_string() } else { format!("decided: exit {}", code.code()) }
        );
    }
    let evidence = !interrupted && fleet::ends_allocation(code);
    for tx in senders.iter().flatten() {
        let _ = tx.send(Msg::Stop { code, why: why.clone(), evidence });
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
                Ev::Got(r, Msg::Stopped { ok, stuck }) => {
                    waiting[r] = false;
                    confirmed[r] = ok;
                    if let Some(l) = stuck {
                        multi.stuck(r);
                        rep.note(t0.elapsed().as_millis() as u64, &format!("rank {r} ({}): {l}", job.nodes[r]));
                        stuck_lines[r] = Some(l);
                    }
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
    if deferred {
        let (exit, by) = multi.outcome();
        // a rank decided by its stopped process, with no verdict of its own (it only stopped moving): the
        // server's outcome is its line, with the evidence that says why
        if let Some(b) = by.filter(|b| results[*b].code == Exit::Starting) {
            results[b].code = exit;
            results[b].shown = Some(format!("{exit} (its process is stopped)"));
            if let Some(l) = &stuck_lines[b] {
                results[b].note = l.clone();
            }
        }
        hosts::summarize(&results, true, Some((exit, by)), a.launch.json, a.quiet);
    }
    all_stopped &= confirmed.iter().all(|c| *c);
    if !interrupted && fleet::ends_allocation(code) {
        end_allocation(&job, flags.scancel, all_stopped, code, &mut rep, t0).await;
    }
    Ok(worst)
}

/// When a multi-node decision that waits for a root cause is due (see `fleet::SETTLE_MS`).
fn settle_at(multi: &MultiNode, t0: Instant) -> tokio::time::Instant {
    let at = multi.settle_until().unwrap_or(0);
    tokio::time::Instant::from_std(t0) + Duration::from_millis(at)
}

/// A rank stopped because another failed, without a verdict of its own: its evidence (stacks, process
/// states, GPU memory) is saved before its server is stopped, and told as an event.
/// The evidence line of a stopped process, if any.
async fn own_evidence(node: &AnyNode, name: &str, rep: &mut Reporter, t0: Instant) -> Option<String> {
    let t = t0.elapsed().as_millis() as u64;
    match node.evidence(name).await {
        Ok((ev, _)) => {
            let lines = ev.lines();
            for l in &lines {
                rep.note(t, &format!("evidence: {l}"));
            }
            rep.event(t, &vigil_core::Event::Evidence(Box::new(ev)));
            vigil_core::evidence::stopped_line(&lines).cloned()
        }
        Err(e) => {
            let msg = format!("evidence of this rank: {}", e.message());
            rep.typed(t, &msg, &crate::sinks::events::Typed::EvidenceFailed);
            None
        }
    }
}

/// The server ended after ready: is the job step ending? Slurm signals every process of the step at once,
/// the server and this vigil, so vigil's own SIGTERM comes within moments of the server's end (bounded:
/// 1 s); without it, the end is the server's own (a crash, or an orderly stop asked for).
async fn job_ending() -> bool {
    crate::signals::take_interrupt()
        || tokio::time::timeout(Duration::from_secs(1), crate::signals::next_interrupt()).await.is_ok()
}

/// A rank's phase into the combined live phase (the least advanced rank's).
fn phase(multi: &mut MultiNode, rep: &mut Reporter, t0: Instant, job: &Group, r: usize, p: Phase) {
    // every rank's phase as the head hears it (the listener's `/status` shows each rank)
    rep.emit(
        Some(t0.elapsed().as_millis() as u64),
        &WatchEvent::RankPhase { of_rank: r, of_host: &job.nodes[r], phase: p },
    );
    if let Some((phase, slow)) = multi.phase(r, p) {
        let ev = WatchEvent::MultiNodePhase { phase, slowest_rank: slow, slowest_host: &job.nodes[slow] };
        rep.emit(Some(t0.elapsed().as_millis() as u64), &ev);
    }
}

/// One rank's connection on the head: its lines to `etx`, and a writer for what the head sends it.
fn serve_conn(s: TcpStream, n: usize, group: String, etx: UnboundedSender<Ev>) {
    let _ = s.set_nodelay(true);
    let (rd, mut wr) = s.into_split();
    tokio::task::spawn_local(async move {
        let mut rd = BufReader::new(rd);
        let hello = tokio::time::timeout(Duration::from_secs(10), next_msg(&mut rd)).await;
        let Ok(Some(Msg::Hello { rank, node, group: theirs, follower })) = hello else { return };
        if rank == 0 || rank >= n {
            return;
        }
        if theirs != group {
            let _ = etx.send(Ev::Foreign(rank, theirs));
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
        if etx.send(Ev::Joined(rank, node, follower, tx)).is_err() {
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
async fn end_allocation(
    job: &Group,
    s: Option<Scancel>,
    all_stopped: bool,
    code: Exit,
    rep: &mut Reporter,
    t0: Instant,
) {
    let t = t0.elapsed().as_millis() as u64;
    if !matches!(job.launcher, Launcher::Slurm { .. }) {
        // each vigil exits with the verdict's code; the launcher's own policy takes it from there
        return;
    }
    let Some(target) = job.target(s.unwrap_or(Scancel::Step)) else {
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

/// The cause of a rank's server ending after ready on its own, read as `vigil diagnose` reads a log: the
/// last MiB of the run's log through the offline judge (vLLM's `--headless` node exits 0 once its worker died,
/// saying so in its log: "Worker proc VllmWorker-1 died unexpectedly", seen on the GPU machine, issue #32).
fn after_ready_cause(name: &str, kind: Option<&str>, profiles: &vigil_core::Profiles) -> Option<vigil_core::Cause> {
    let log = crate::node::run::run_dir(name).ok()?.join("server.log");
    let (tail, _) = crate::node::local::read_tail(&log, 1 << 20);
    let r = vigil_core::diagnose_text(profiles, kind, &String::from_utf8_lossy(&tail));
    (r.verdict == vigil_core::Verdict::Crashed).then_some(r.cause).flatten()
}

/// Connects to the head, retrying until `by`; sends `Hello` first.
async fn connect(job: &Group, port: u16, by: tokio::time::Instant) -> Result<TcpStream, String> {
    let addr = job.head.clone();
    let mut wait = Duration::from_millis(100);
    loop {
        let attempt = tokio::time::timeout(Duration::from_secs(5), TcpStream::connect((addr.as_str(), port))).await;
        let err = match attempt {
            Ok(Ok(s)) => return Ok(s),
            Ok(Err(e)) => e.to_string(),
            Err(_) => "no answer within 5s".into(),
        };
        if tokio::time::Instant::now() + wait > by {
            return Err(format!("the head ({addr}:{port}): {err}"));
        }
        // the head may not listen yet (it starts at the same moment): retry with backoff, up to 2 s apart
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(Duration::from_secs(2));
    }
}

/// A rank ≥ 1: its own rank, reported to the head; stops at the head's word, at an interrupt, or (the head
/// lost) at its own failure, when it ends the allocation itself.
async fn member(c: Ctx) -> Result<Exit, CliError> {
    let Ctx { job, flags, a, argv, profiles, kind } = c;
    let name = a.name.clone().unwrap_or_default();
    let mut rep = reporter(&a, &job);
    let port = job.port;
    // a rank whose command names no API port (vLLM's --headless workers), or whose health answer proves
    // nothing (SGLang's dummy /health on --node-rank >= 1), has no readiness of its own
    let argv_s: Vec<String> = argv.iter().map(|x| String::from_utf8_lossy(x).into_owned()).collect();
    let cmd_spec = kind.as_deref().and_then(|k| profiles.get(k)).map(|p| &p.cmd);
    let follower =
        cmd_spec.is_some_and(|c| c.dummy_health(&argv_s)) || !vigil_core::profile::serves_api(cmd_spec, &argv_s);
    let (node, mut local, mut prx) = start_local(&job, &a, argv, &profiles);
    // the connection: messages queue until it is up; the head's words come back on `hrx`
    let (otx, mut orx) = mpsc::unbounded_channel::<Msg>();
    let (htx, mut hrx) = mpsc::unbounded_channel::<Result<Msg, String>>();
    let hello = Msg::Hello { rank: job.rank, node: job.nodes[job.rank].clone(), group: job.id.clone(), follower };
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
    let mut wants_evidence = false;
    let mut stuck: Option<String> = None;
    let mut interrupted = false;
    let answer_in = a.launch.grace + Duration::from_secs(30);
    loop {
        let serving = own.as_ref().is_some_and(|r| fleet::serves(r.code));
        tokio::select! {
            Some((_, p)) = prx.recv() => { let _ = otx.send(Msg::Phase { phase: p }); }
            r = &mut local, if own.is_none() => {
                let r = r.unwrap_or_else(|e| HostResult { note: format!("watch: {e}"), ..HostResult::new(&job.nodes[job.rank], Some(job.rank), &name) });
                let stuck = r.report.as_ref().and_then(|x| vigil_core::evidence::stopped_line(&x.evidence)).cloned();
                let report = r.report.as_ref().map(|x| RankVerdict { verdict: x.verdict, phase: x.phase, cause: x.cause });
                let _ = otx.send(Msg::End { code: r.code, verdict: hosts::verdict_text(&r), note: first_line(&r.note), consequence: r.consequence, stuck, report });
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
                    let _ = otx.send(Msg::End { code: Exit::Interrupted, verdict: "interrupted".into(), note: "interrupted".into(), consequence: false, stuck: None, report: None });
                    interrupted = true;
                    break;
                }
                let x = &end.exit;
                // a rank's server that ends after ready without being asked to (status 0 included: vLLM's
                // --headless node exits 0 once its worker died, seen on the GPU machine, issue #32) fails the server
                let (code, note, report) = if end.requested {
                    (Exit::Ready, crate::node::up::stopped_how(x, end.requested, None), None)
                } else {
                    let cause = after_ready_cause(&name, kind.as_deref(), &profiles);
                    let why = cause.map(|c| format!(" ({c})")).unwrap_or_default();
                    let note = format!("its server {} after ready: crashed{why}", crate::node::up::exit_how(x.code, x.signal));
                    (Exit::Crashed, note, Some(RankVerdict { verdict: vigil_core::Verdict::Crashed, phase: Phase::Serving, cause }))
                };
                rep.note(t0.elapsed().as_millis() as u64, &note);
                let _ = otx.send(Msg::End { code, verdict: if code == Exit::Crashed { "crashed".into() } else { "stopped".into() }, note, consequence: false, stuck: None, report });
                if let Some(r) = own.as_mut() { r.code = code; }
                failed_at = Some(tokio::time::Instant::now());
            }
            m = hrx.recv() => match m {
                Some(Ok(Msg::Serving)) if own.is_none() => {
                    local.abort();
                    let note = "ready: the other ranks are (no readiness of its own: no API port)";
                    rep.note(t0.elapsed().as_millis() as u64, note);
                    own = Some(HostResult { code: Exit::Ready, note: note.into(), ..HostResult::new(&job.nodes[job.rank], Some(job.rank), &name) });
                }
                Some(Ok(Msg::Stop { code, why, evidence })) => {
                    wants_evidence = evidence;
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
                let _ = otx.send(Msg::End { code: Exit::Interrupted, verdict: "interrupted".into(), note: "interrupted".into(), consequence: false, stuck: None, report: None });
                interrupted = true;
                break;
            }
        }
    }
    if own.is_none() {
        local.abort();
        // another rank failed: this rank's stacks and memory say whether it only waited
        if wants_evidence {
            stuck = own_evidence(&node, &name, &mut rep, t0).await;
        }
    }
    if let Some(why) = &head_lost {
        rep.note(t0.elapsed().as_millis() as u64, &format!("the head node is lost: {why}"));
    }
    let mut ok = true;
    if !(a.keep && interrupted) {
        ok = node.stop(&name, a.launch.grace, &mut rep).await?;
    }
    let _ = otx.send(Msg::Stopped { ok, stuck });
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

    fn slurm(job: u64, step: Option<u64>) -> Group {
        Group {
            launcher: Launcher::Slurm { job, step },
            id: job.to_string(),
            rank: 0,
            nodes: vec!["a".into()],
            head: "a".into(),
            port: 1,
        }
    }

    #[test]
    fn scancel_targets() {
        let j = slurm(7, Some(0));
        assert_eq!(j.target(Scancel::Step).as_deref(), Some("7.0"));
        assert_eq!(j.target(Scancel::Job).as_deref(), Some("7"));
        assert_eq!(j.target(Scancel::None), None);
        assert_eq!(slurm(7, None).target(Scancel::Step).as_deref(), Some("7"));
        let other = Group { launcher: Launcher::Flags, ..slurm(7, Some(0)) };
        assert_eq!(other.target(Scancel::Job), None, "only a Slurm job is cancelled");
    }

    #[test]
    fn a_launcher_names_the_place_by_flags() {
        let f = Flags { rank: Some(1), ranks: Some(2), rendezvous: Some("10.0.0.5:24810".into()), ..Flags::default() };
        let g = Group::from_flags(&f).unwrap();
        assert_eq!((g.rank, g.nodes.len(), g.head.as_str(), g.port), (1, 2, "10.0.0.5", 24810));
        assert_eq!(g.nodes[0], "10.0.0.5");
        assert_eq!(g.run_name("sglang"), "sglang.n1");
        assert_eq!(parse_rendezvous("[::1]:7000").unwrap(), ("::1".to_string(), 7000));
        for bad in ["host", "host:0", ":80", "host:x", "a b:1"] {
            assert!(parse_rendezvous(bad).is_err(), "{bad}");
        }
        let partial = Flags { rank: Some(0), ..Flags::default() };
        assert!(Group::from_flags(&partial).unwrap_err().message().contains("all three"));
        let outside = Flags { rank: Some(2), ranks: Some(2), rendezvous: Some("h:1".into()), ..Flags::default() };
        assert!(Group::from_flags(&outside).is_err());
    }

    #[tokio::test]
    async fn protocol_lines_round_trip_and_are_bounded() {
        let m = Msg::End {
            report: None,
            code: Exit::Crashed,
            verdict: "crashed".into(),
            note: "x".into(),
            consequence: true,
            stuck: None,
        };
        let line = line_of(&m);
        let mut r = BufReader::new(&line[..]);
        assert!(matches!(next_msg(&mut r).await, Some(Msg::End { code: Exit::Crashed, consequence: true, .. })));
        // an older rank's End without the field reads as a failure of its own
        let mut r = BufReader::new(&b"{\"msg\":\"end\",\"code\":3,\"verdict\":\"crashed\",\"note\":\"\"}\n"[..]);
        assert!(matches!(next_msg(&mut r).await, Some(Msg::End { consequence: false, .. })));
        let long = vec![b'a'; MAX_LINE + 10];
        let mut r = BufReader::new(&long[..]);
        assert!(next_msg(&mut r).await.is_none());
        let mut r = BufReader::new(&b"{\"msg\":\"bogus\"}\n"[..]);
        assert!(next_msg(&mut r).await.is_none());
    }
}
