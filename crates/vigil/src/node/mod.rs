//! One node, local or over SSH, with one control vocabulary: list its runs and their state, stop a run
//! (with grace, proving nothing is left), read and follow a run's log from an offset, list the inference
//! servers it runs that vigil did not start. [`LocalNode`] works on this machine's run directories and
//! /proc; [`SshNode`] sends small scripts over one SSH connection and reads their answers. The commands
//! (`commands.rs`) are written once over [`Node`]; [`Nodes`] runs them on this machine or on every host.

pub mod keeper;
pub mod local;
pub mod remote;
pub mod run;
pub mod ssh;
pub mod up;

use crate::check::Report as CheckReport;
use crate::error::CliError;
use crate::exit::Exit;
use crate::follow::SourceMsg;
use crate::report::Reporter;
use crate::run::Redactor;
use crate::up::UpArgs;
use crate::wait;
use std::time::Duration;
use tokio::sync::mpsc::UnboundedSender;
use vigil_core::evidence::Evidence;
use vigil_core::judge::ExitInfo;
use vigil_core::{Profiles, Report};

pub use crate::sinks::records::{ProcRow, RunRow};
pub use local::LocalNode;
pub use ssh::SshNode;

/// The end of a run's log: its last lines, and the byte offset after them (where following resumes).
pub struct LogTail {
    pub lines: Vec<String>,
    pub offset: u64,
}

/// What `up` asks a node to launch.
pub struct Launch<'a> {
    pub name: &'a str,
    /// The server command, byte for byte (a local launch needs UTF-8).
    pub argv: &'a [Vec<u8>],
    pub a: &'a UpArgs,
    pub kind: Option<String>,
    pub profiles: &'a Profiles,
    /// Multi-node: this node's rank of `n`.
    pub rank: Option<usize>,
    pub n: usize,
}

/// How a run's server ended: the status its keeper recorded, and whether a stop was asked for (`vigil down`
/// records its request with the run before it signals). The core judges the pair
/// ([`ExitInfo::orderly_after_ready`]): after ready, a stop that was asked for ends in order, not as a crash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerEnd {
    pub exit: ExitInfo,
    pub requested: bool,
}

/// A launch's answer: the watch's settings, or why the node refused (exit code, one line).
pub type Launched = Result<wait::Args, (Exit, String)>;

/// What every node offers.
#[allow(async_fn_in_trait)]
pub trait Node {
    /// The host, for a remote node (tags lines and rows).
    fn host(&self) -> Option<&str>;
    /// The names of the runs on the node.
    async fn runs(&self) -> Result<Vec<String>, CliError>;
    /// Every run with its state and phase.
    async fn status(&self, profiles: &Profiles) -> Result<Vec<RunRow>, CliError>;
    /// Stops a run: SIGTERM, `grace`, SIGKILL, then proves no process (and no GPU memory) is left.
    /// True when nothing is left.
    async fn stop(&self, run: &str, grace: Duration, rep: &mut Reporter) -> Result<bool, CliError>;
    /// The last `lines` lines of a run's log.
    async fn log_tail(&self, run: &str, lines: usize) -> Result<LogTail, CliError>;
    /// Follows a run's log from byte `from`: lines (and connection notes) go to `tx` until it closes.
    async fn follow_log(&self, run: &str, from: u64, tx: UnboundedSender<SourceMsg>);
    /// Inference servers on the node that vigil did not start.
    async fn ps(&self, profiles: &Profiles) -> Result<Vec<ProcRow>, CliError>;
    /// What to hide in a run's output: its stored secrets.
    fn redactor(&self, run: &str) -> Redactor;
    /// Launches a server under a keeper on the node, after its checks (an earlier run of the name, the
    /// port, the preflight check).
    async fn launch(&self, l: &Launch<'_>, rep: &mut Reporter) -> Result<Launched, CliError>;
    /// Fills a watch's settings for a run on the node: its log and exit status, process, health URL,
    /// secrets.
    async fn attach(&self, run: &str, w: &mut wait::Args, profiles: &Profiles, probe: bool) -> Result<(), CliError>;
    /// Resolves when the run's server exits; how it ended.
    async fn wait_exit(&self, run: &str) -> ServerEnd;
    /// Keeps the report of a run's startup with the run (local: `startup.json`).
    fn record_startup(&self, run: &str, r: &Report);
    /// Where every process of a run's server is now (stacks, wait channels, NCCL dumps), captured on the
    /// node and saved with the run; with the secrets that output of it must hide.
    async fn evidence(&self, run: &str) -> Result<(Evidence, Vec<String>), CliError>;
    /// The preflight check of a server command against this node: its model files, port and GPUs.
    async fn check(&self, argv: &[String], kind: Option<String>, profiles: &Profiles) -> Result<CheckReport, CliError>;
}

/// This machine, or a remote node: the two implementations behind one type for the drivers.
pub enum AnyNode {
    Local(LocalNode),
    Ssh(SshNode),
}

macro_rules! each {
    ($s:expr, $n:ident => $e:expr) => {
        match $s {
            AnyNode::Local($n) => $e,
            AnyNode::Ssh($n) => $e,
        }
    };
}

impl Node for AnyNode {
    fn host(&self) -> Option<&str> {
        each!(self, n => n.host())
    }
    async fn runs(&self) -> Result<Vec<String>, CliError> {
        each!(self, n => n.runs().await)
    }
    async fn status(&self, profiles: &Profiles) -> Result<Vec<RunRow>, CliError> {
        each!(self, n => n.status(profiles).await)
    }
    async fn stop(&self, run: &str, grace: Duration, rep: &mut Reporter) -> Result<bool, CliError> {
        each!(self, n => n.stop(run, grace, rep).await)
    }
    async fn log_tail(&self, run: &str, lines: usize) -> Result<LogTail, CliError> {
        each!(self, n => n.log_tail(run, lines).await)
    }
    async fn follow_log(&self, run: &str, from: u64, tx: UnboundedSender<SourceMsg>) {
        each!(self, n => n.follow_log(run, from, tx).await)
    }
    async fn ps(&self, profiles: &Profiles) -> Result<Vec<ProcRow>, CliError> {
        each!(self, n => n.ps(profiles).await)
    }
    fn redactor(&self, run: &str) -> Redactor {
        each!(self, n => n.redactor(run))
    }
    async fn launch(&self, l: &Launch<'_>, rep: &mut Reporter) -> Result<Launched, CliError> {
        each!(self, n => n.launch(l, rep).await)
    }
    async fn attach(&self, run: &str, w: &mut wait::Args, profiles: &Profiles, probe: bool) -> Result<(), CliError> {
        each!(self, n => n.attach(run, w, profiles, probe).await)
    }
    async fn wait_exit(&self, run: &str) -> ServerEnd {
        each!(self, n => n.wait_exit(run).await)
    }
    fn record_startup(&self, run: &str, r: &Report) {
        each!(self, n => n.record_startup(run, r))
    }
    async fn evidence(&self, run: &str) -> Result<(Evidence, Vec<String>), CliError> {
        each!(self, n => n.evidence(run).await)
    }
    async fn check(&self, argv: &[String], kind: Option<String>, profiles: &Profiles) -> Result<CheckReport, CliError> {
        each!(self, n => n.check(argv, kind, profiles).await)
    }
}

/// Where a command runs: this machine, or every host of `--host/--hosts`.
pub enum Nodes {
    Local,
    Remote(crate::hosts::Hosts),
}

impl Nodes {
    /// Several nodes: lines are tagged with their host.
    pub fn several(&self) -> bool {
        matches!(self, Nodes::Remote(h) if h.list.len() > 1)
    }

    /// The one node a command works on: this machine, or the single `--host` (connected).
    pub async fn one(&self, cmd: &str) -> Result<AnyNode, CliError> {
        match self {
            Nodes::Local => Ok(AnyNode::Local(LocalNode::default())),
            Nodes::Remote(hs) if hs.list.len() == 1 => Ok(AnyNode::Ssh(SshNode::open(&hs.ssh, &hs.list[0]).await?)),
            Nodes::Remote(_) => Err(CliError::usage(format!("{cmd}: give one --host"))),
        }
    }

    /// Runs `f` on every node (hosts at most `--parallel` at once, each over its own connection); the
    /// results in node order, each with the node's name.
    pub async fn each<T, F, Fut>(&self, f: F) -> Vec<(String, Result<T, CliError>)>
    where
        T: 'static,
        F: Fn(AnyNode) -> Fut + Clone + 'static,
        Fut: std::future::Future<Output = Result<T, CliError>> + 'static,
    {
        match self {
            Nodes::Local => vec![("local".into(), f(AnyNode::Local(LocalNode::default())).await)],
            Nodes::Remote(hs) => {
                let jobs: Vec<_> = hs
                    .list
                    .iter()
                    .map(|h| {
                        let (h, ssh, f) = (h.clone(), hs.ssh.clone(), f.clone());
                        move || async move {
                            let r = match SshNode::open(&ssh, &h).await {
                                Ok(n) => f(AnyNode::Ssh(n)).await,
                                Err(e) => Err(e),
                            };
                            (h, r)
                        }
                    })
                    .collect();
                crate::hosts::drive_fleet(hs.parallel, jobs).await
            }
        }
    }
}

/// One node: its result as is; several: errors printed per node, the worst code.
pub fn fold(mut v: Vec<(String, Result<Exit, CliError>)>) -> Result<Exit, CliError> {
    if v.len() == 1 {
        return v.pop().unwrap().1;
    }
    let mut code = Exit::Ready;
    for (h, r) in v {
        match r {
            Ok(c) => code = code.max(c),
            Err(e) => {
                code = code.max(e.code());
                eprintln!("vigil: {h}: {}", e.message());
            }
        }
    }
    Ok(code)
}

/// Rows gathered from every node, and the exit code: when every node failed, only their errors.
pub fn gather<T>(r: Vec<(String, Result<Vec<T>, CliError>)>) -> (Vec<T>, Result<Exit, CliError>) {
    let mut rows = Vec::new();
    let mut codes = Vec::new();
    for (h, x) in r {
        match x {
            Ok(v) => {
                rows.extend(v);
                codes.push((h, Ok(Exit::Ready)));
            }
            Err(e) => codes.push((h, Err(e))),
        }
    }
    (rows, fold(codes))
}
