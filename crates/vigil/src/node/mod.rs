//! One node, local or over SSH, with one control vocabulary: list its runs and their state, stop a run
//! (with grace, proving nothing is left), read and follow a run's log from an offset, list the inference
//! servers it runs that vigil did not start. [`LocalNode`] works on this machine's run directories and
//! /proc; [`SshNode`] sends small scripts over one SSH connection and reads their answers. The commands
//! (`commands.rs`) are written once over [`Node`]; [`Nodes`] runs them on this machine or on every host.

pub mod evidence;
pub mod keeper;
pub mod local;
pub mod remote;
pub mod remote_evidence;
pub mod run;
pub mod ssh;
pub mod up;

use crate::error::CliError;
use crate::sinks::records::CheckReport;
use crate::sinks::redact::Redactor;
use crate::sinks::report::Reporter;
use crate::sources::follow::SourceMsg;
use std::path::PathBuf;
use std::time::Duration;
use tokio::sync::mpsc::UnboundedSender;
use vigil_core::evidence::Evidence;
use vigil_core::judge::ExitInfo;
use vigil_core::{Profiles, Report};

use crate::sinks::records::{ProcRow, RunRow};
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
    pub a: &'a LaunchSettings,
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

/// A launch's answer: the run's handle, or why the node refused (outcome, one line).
pub type Launched = Result<RunHandle, (crate::exit::Exit, String)>;

/// What a node needs of `up`'s settings to launch a server (the watch's settings stay with the watch).
#[derive(Debug, Clone, Default)]
pub struct LaunchSettings {
    /// Stop an earlier run of the name first.
    pub replace: bool,
    /// Between SIGTERM and SIGKILL when stopping.
    pub grace: Duration,
    /// No health URL for the run (no port check).
    pub no_probe: bool,
    /// Skip the preflight check.
    pub no_check: bool,
    pub json: bool,
    pub log_max_bytes: u64,
    pub log_keep: u32,
    /// `--env K=V`, `--env-file`.
    pub env: Vec<String>,
    pub env_file: Option<PathBuf>,
    /// The repairs `up --repair` made to reach this command (recorded with the run for `restart`).
    pub repairs: Vec<String>,
}

/// A run on a node as its watch needs it (issue #25): where its log and exit status come from (a local
/// file and state file, or the SSH stream), its server process and kind, the health URL, the values never
/// to print, its command line. The node fills it; the watch's settings take it (`wait::Args::take`),
/// what the command line set winning.
#[derive(Clone, Default)]
pub struct RunHandle {
    pub name: Option<String>,
    pub log: Option<String>,
    pub pid: Option<i32>,
    pub server: Option<String>,
    pub url: Option<String>,
    /// The run's state.json: the keeper records the server's exit status there.
    pub exit_state: Option<PathBuf>,
    /// Where every verdict for the run is recorded (`status` reads it).
    pub verdict_file: Option<PathBuf>,
    pub secrets: Vec<String>,
    pub argv: Vec<String>,
    pub restarts: u64,
    /// A run on a remote node: its log, exit and GPU readings come through the SSH connection.
    pub remote: Option<remote::RemoteWatch>,
    /// No generation can prove this rank (a multi-node server's other ranks serve no API).
    pub no_generate: bool,
}

impl RunHandle {
    /// A run of `vigil up` on this machine, from its folder and record: its log, server pid, kind, health
    /// URL (the generic profile's path for an unknown kind; none without `probe`), exit-status file,
    /// secrets and command line.
    pub fn of_run(dir: &std::path::Path, rec: &run::RunRecord, profiles: &Profiles, probe: bool) -> RunHandle {
        // the server found from the run's keeper; a recorded pid only when it is dead (its exit is then seen
        // at once), never a live process the run does not own
        let now = crate::node::up::find_run(dir);
        let recorded = now.state.as_ref().and_then(|s| s.server_pid);
        let pid = now.server.or(recorded.filter(|p| !crate::sources::procs::alive(*p)));
        let mut url = None;
        if probe {
            let profile = rec.server.as_ref().and_then(|k| profiles.get(k)).or_else(|| profiles.get("generic"));
            if let (Some(p), Some(pr)) = (rec.port, profile) {
                url = Some(format!("http://127.0.0.1:{p}{}", pr.health_path));
            }
        }
        let secrets: crate::sinks::redact::Secrets = run::stored_secrets(&rec.name, None);
        RunHandle {
            name: Some(rec.name.clone()),
            log: Some(rec.log.clone()),
            pid,
            server: rec.server.clone(),
            url,
            exit_state: Some(dir.join("state.json")),
            verdict_file: Some(dir.join("verdict.json")),
            secrets: crate::sinks::redact::secret_values(&secrets),
            argv: run::unredact(rec, &secrets).0,
            restarts: run::restarts(dir),
            remote: None,
            no_generate: false,
        }
    }
}

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
    /// The handle of a run on the node: its log and exit status, process, health URL (with `probe`; the
    /// path of `server`'s profile when given), secrets.
    async fn attach(&self, run: &str, server: Option<&str>, probe: bool, p: &Profiles) -> Result<RunHandle, CliError>;
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
    async fn attach(&self, run: &str, server: Option<&str>, probe: bool, p: &Profiles) -> Result<RunHandle, CliError> {
        each!(self, n => n.attach(run, server, probe, p).await)
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
