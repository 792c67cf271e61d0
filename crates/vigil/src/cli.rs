//! The command line as clap sees it: flags, subcommands, their help, and the value parsers that type a
//! value as it is read. Nothing here acts; `settings.rs` turns these into validated settings.

use crate::help;
use crate::sinks::metrics;
use clap::{Parser, Subcommand};
use std::path::PathBuf;
pub use vigil_core::limits::{parse_duration, parse_nonzero_duration, parse_stall, Stall};

#[derive(Parser)]
#[command(
    name = "vigil",
    version = help::VERSION,
    about = "Brings up and watches LLM inference servers (SGLang, vLLM, llama-server, TGI)",
    long_about = help::ABOUT,
    after_long_help = help::VIGIL
)]
pub(crate) struct Cli {
    /// Extra profile directory (*.toml), repeatable; also read: $XDG_CONFIG_HOME/vigil/profiles/
    #[arg(long = "profiles", global = true, value_name = "DIR", help_heading = help::PROFILES)]
    pub(crate) profiles: Vec<PathBuf>,
    #[command(flatten)]
    pub(crate) remote: RemoteFlags,
    #[command(subcommand)]
    pub(crate) cmd: Cmd,
}

/// Remote nodes (up, wait, status, logs, down, ps): the system ssh client, one connection per host.
#[derive(clap::Args)]
pub(crate) struct RemoteFlags {
    /// Run on a remote node over SSH: [USER@]NODE, a Host of your ssh config, or ssh://[USER@]NODE[:PORT].
    ///
    /// Works with up, wait, status, logs, down, ps and check. Your ~/.ssh/config applies (ProxyJump,
    /// agent, keys); never a prompt: an unknown host key or a refused key is a one-line error (exit 12).
    #[arg(long, global = true, value_name = "[USER@]NODE", help_heading = help::REMOTE)]
    pub(crate) host: Option<String>,
    /// Several hosts, comma-separated: a fleet (each host on its own), or with --multi-node one server.
    #[arg(long, global = true, value_name = "H1,H2,...", help_heading = help::REMOTE)]
    pub(crate) hosts: Option<String>,
    /// Hosts from a file, one a line (# comments).
    #[arg(long, global = true, value_name = "FILE", help_heading = help::REMOTE)]
    pub(crate) hosts_file: Option<PathBuf>,
    /// The hosts run one server together: rank i on the i-th host; one verdict (implied by --nnodes N>1).
    #[arg(long, global = true, help_heading = help::REMOTE)]
    pub(crate) multi_node: bool,
    /// Fleets: at most this many hosts at once.
    #[arg(long, global = true, default_value_t = 8, value_name = "N", help_heading = help::REMOTE)]
    pub(crate) parallel: usize,
    /// ssh config file (ssh -F); default: ssh's own (~/.ssh/config).
    #[arg(long, global = true, value_name = "FILE", env = "VIGIL_SSH_CONFIG", help_heading = help::REMOTE)]
    pub(crate) ssh_config: Option<PathBuf>,
    /// SSH connect timeout, TCP and the SSH banner (duration: 10s, 1m); past it: exit 12.
    #[arg(long, global = true, default_value = "10s", value_name = "DUR", value_parser = parse_duration, help_heading = help::REMOTE)]
    pub(crate) connect_timeout: std::time::Duration,
    /// After the connection drops, keep reconnecting this long (backoff 0.25 s doubling to 5 s); then exit 12.
    #[arg(long, global = true, default_value = "2m", value_name = "DUR", value_parser = parse_duration, help_heading = help::REMOTE)]
    pub(crate) reconnect_for: std::time::Duration,
    /// Runs directory on the remote (default ${XDG_STATE_HOME:-~/.local/state}/vigil/remote).
    #[arg(long, global = true, value_name = "DIR", env = "VIGIL_REMOTE_DIR", help_heading = help::REMOTE)]
    pub(crate) remote_dir: Option<String>,
}

#[derive(Subcommand)]
pub(crate) enum HistoryCmd {
    /// Reads old server logs into the history (phase durations from their timestamps).
    Import {
        /// Server log files (any size; their own timestamps give the phase durations).
        #[arg(required = true, value_name = "LOG")]
        files: Vec<PathBuf>,
    },
}

#[derive(Subcommand)]
pub(crate) enum Cmd {
    /// Offline post-mortem of server logs: phase timeline, verdict, cause, evidence, hint.
    #[command(after_long_help = help::DIAGNOSE)]
    Diagnose {
        /// Server log files to read, or - for stdin (exit code: the worst verdict of them).
        #[arg(required = true, value_name = "FILE")]
        files: Vec<String>,
        /// JSON lines; the last line of each file is its verdict object.
        #[arg(long, help_heading = help::OUTPUT)]
        json: bool,
        /// Show which pattern of which profile matched which line.
        #[arg(long, help_heading = help::OUTPUT)]
        explain: bool,
        /// Only the verdict line.
        #[arg(long, short, help_heading = help::OUTPUT)]
        quiet: bool,
        /// Server kind (default: detected from the log).
        #[arg(long, value_name = "KIND")]
        server: Option<String>,
    },
    /// Attach to a server started elsewhere (or a run of `vigil up`, by NAME) and wait for a verdict.
    #[command(after_long_help = help::WAIT)]
    Wait {
        /// A run started with `vigil up` (reads its log, pid and URL from the run directory).
        #[arg(value_name = "NAME")]
        name: Option<String>,
        #[command(flatten)]
        f: WaitFlags,
    },
    /// Watch a run after ready: health and generation probes, the log, the process (= wait NAME --watch).
    #[command(after_long_help = help::WATCH)]
    Watch {
        /// A run started with `vigil up` (see `vigil status`).
        name: String,
        #[command(flatten)]
        proof: ProofFlags,
        /// JSON lines on stdout, one event a line (schema: docs/events.md).
        #[arg(long, help_heading = help::OUTPUT)]
        json: bool,
    },
    /// One readiness check for Kubernetes exec probes: exit 0 ready, 1 not; one line.
    #[command(after_long_help = help::PROBE)]
    Probe {
        /// A run of `vigil up`.
        #[arg(value_name = "NAME")]
        name: Option<String>,
        /// Health URL to probe (http://HOST:PORT/PATH; default with NAME: the run's port and profile path).
        #[arg(long, help_heading = help::PROBING)]
        url: Option<String>,
        /// The server's log: a fatal marker in it means not ready.
        #[arg(long, value_name = "FILE", help_heading = help::TARGET)]
        log: Option<String>,
        /// Also send one real completion.
        #[arg(long, help_heading = help::PROBING)]
        generate: bool,
        /// Time for the whole check, probe and completion included; past it: not ready.
        #[arg(long, default_value = "5s", value_name = "DUR", value_parser = parse_nonzero_duration, help_heading = help::PROBING)]
        timeout: std::time::Duration,
        /// Server kind (sglang, vllm, llama-cpp, tgi, generic; default: the run's, else detected from the log).
        #[arg(long, value_name = "KIND", help_heading = help::TARGET)]
        server: Option<String>,
        #[command(flatten)]
        tls: TlsFlags,
    },
    /// List the server profiles (built-in and user).
    #[command(after_long_help = help::PROFILES_CMD)]
    Profiles,
    /// Check a server command, its model configs and this machine before launching.
    #[command(after_long_help = help::CHECK)]
    Check {
        /// JSON: every finding with its values, where they came from, the fix and "confirmed".
        #[arg(long, help_heading = help::OUTPUT)]
        json: bool,
        /// Server kind (default: detected from the command line).
        #[arg(long, value_name = "KIND")]
        server: Option<String>,
        /// Memory of each GPU for the fit estimate (80g, 141GiB, 81559m), for a node vigil cannot see;
        /// default: the smallest GPU NVML or nvidia-smi shows here.
        #[arg(long, value_name = "SIZE", value_parser = parse_gpu_mem)]
        gpu_mem: Option<u64>,
        /// The server command, after --, as you would launch it (nothing is run).
        #[arg(last = true, required = true, value_name = "CMD")]
        cmd: Vec<String>,
    },
    /// Launch a server under a keeper and watch it until a verdict.
    #[command(after_long_help = help::UP)]
    Up {
        #[command(flatten)]
        up: UpFlags,
        #[command(flatten)]
        group: GroupFlags,
        /// The server command (with --host, passed byte for byte to the remote server).
        #[arg(last = true, required = true, value_name = "CMD", value_parser = clap::value_parser!(std::ffi::OsString))]
        cmd: Vec<std::ffi::OsString>,
    },
    /// Stop a run's whole process tree and prove nothing is left.
    #[command(after_long_help = help::DOWN)]
    Down {
        /// Runs to stop (see `vigil status`).
        #[arg(value_name = "NAME")]
        names: Vec<String>,
        /// Stop every run of this machine (or of each --host).
        #[arg(long)]
        all: bool,
        /// A server tree vigil did not start (see `vigil ps`).
        #[arg(long)]
        pid: Option<i32>,
        /// Time between SIGTERM and SIGKILL (0: SIGKILL at once; Ctrl-C during it kills at once).
        #[arg(long, default_value = "10s", value_name = "DUR", value_parser = parse_duration)]
        grace: std::time::Duration,
        /// JSON lines: the signals sent, the stop report, GPU memory released.
        #[arg(long, help_heading = help::OUTPUT)]
        json: bool,
    },
    /// One line per run: server, phase or verdict, time in it, port, pid, log age.
    #[command(after_long_help = help::STATUS)]
    Status {
        /// One line of JSON: an array with one object per run.
        #[arg(long, help_heading = help::OUTPUT)]
        json: bool,
    },
    /// Where every process of a server is now: Python stacks (py-spy), native stacks (eu-stack), kernel
    /// wait channels, NCCL flight-recorder dumps; saved in the run's folder.
    #[command(after_long_help = help::DUMP)]
    Dump {
        /// A run started with `vigil up` (see `vigil status`).
        name: Option<String>,
        /// A server process vigil did not start (its whole tree is captured).
        #[arg(long, value_name = "PID", conflicts_with = "name")]
        pid: Option<i32>,
        /// One JSON `evidence` event on stdout (schema: docs/events.md).
        #[arg(long)]
        json: bool,
    },
    /// A run's log (secrets redacted).
    #[command(after_long_help = help::LOGS)]
    Logs {
        /// A run started with `vigil up` (see `vigil status`).
        name: String,
        /// Keep printing lines as the server writes them (follows rotation); Ctrl-C to stop.
        #[arg(short = 'f', long)]
        follow: bool,
        /// Print the last N lines first.
        #[arg(short = 'n', long, value_name = "N", default_value_t = 50)]
        lines: usize,
    },
    /// Stop a run and start it again: same command, working directory and environment.
    #[command(after_long_help = help::RESTART)]
    Restart {
        /// The run to restart (see `vigil status`).
        #[arg(id = "run_name", value_name = "NAME")]
        name: String,
        #[command(flatten)]
        up: UpFlags,
    },
    /// Inference servers on this machine that vigil did not start.
    #[command(after_long_help = help::PS)]
    Ps {
        /// One line of JSON: an array with one object per server (pid, kind, age, ports, GPU MiB, command).
        #[arg(long, help_heading = help::OUTPUT)]
        json: bool,
    },
    /// GPU readings (NVML, else nvidia-smi): per GPU memory and utilisation, per process memory.
    #[command(after_long_help = help::GPU)]
    Gpu {
        /// One JSON object: GPUs, processes, source, time.
        #[arg(long, help_heading = help::OUTPUT)]
        json: bool,
    },
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell) to stdout.
    #[command(after_long_help = help::COMPLETIONS)]
    Completions {
        /// The shell to complete for.
        #[arg(value_name = "SHELL")]
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff) to stdout, or write one page per command with --dir.
    #[command(after_long_help = help::MAN)]
    Man {
        /// Write vigil.1, vigil-up.1, ... into DIR (created if missing) instead of printing vigil.1.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
    /// Past startups (newest last), per-phase medians and spread; `history import LOG…` fills it from old logs.
    #[command(after_long_help = help::HISTORY, args_conflicts_with_subcommands = true)]
    History {
        /// Only the startups of this run (or imported log) name.
        #[arg(value_name = "NAME")]
        name: Option<String>,
        /// JSON lines: name, key, verdict, total_ms, phases (phase → ms), and more.
        #[arg(long, help_heading = help::OUTPUT)]
        json: bool,
        #[command(subcommand)]
        sub: Option<HistoryCmd>,
    },
    /// The startup as a picture: a lane per rank, a bar per phase, the history's median, the verdict.
    #[command(after_long_help = help::TIMELINE)]
    Timeline {
        /// A run of `vigil up` (its log), or a server log file.
        #[arg(value_name = "NAME|LOG")]
        target: String,
        /// Write a standalone SVG to FILE instead of the terminal rendering.
        #[arg(long, value_name = "FILE")]
        svg: Option<PathBuf>,
    },
    /// Internal: the keeper process of a run (started by `vigil up`, not by hand).
    #[command(name = "__keeper", hide = true)]
    Keeper {
        /// The run directory.
        dir: PathBuf,
    },
}

#[derive(clap::Args)]
pub(crate) struct WaitFlags {
    /// Health URL to probe (http://HOST:PORT/PATH or https://...); with it, a 2xx is required for ready.
    #[arg(long, help_heading = help::PROBING)]
    pub(crate) url: Option<String>,
    #[command(flatten)]
    pub(crate) tls: TlsFlags,
    /// Log file to follow (may not exist yet; survives truncation and rotation), or - for stdin.
    #[arg(long, value_name = "FILE", help_heading = help::TARGET)]
    pub(crate) log: Option<String>,
    /// Command whose output is the log (e.g. 'kubectl logs -f POD').
    #[arg(long, value_name = "CMD", help_heading = help::TARGET)]
    pub(crate) log_cmd: Option<String>,
    /// Process to watch (its exit is a crash before ready).
    #[arg(long, help_heading = help::TARGET)]
    pub(crate) pid: Option<i32>,
    /// Server kind (default: detected from the log).
    #[arg(long, value_name = "KIND", help_heading = help::TARGET)]
    pub(crate) server: Option<String>,
    /// Overall deadline, the generation proof included (exit 5 if still progressing then).
    #[arg(long, default_value = "2h", value_name = "DUR", value_parser = parse_nonzero_duration, help_heading = help::LIMITS)]
    pub(crate) timeout: std::time::Duration,
    /// Probe interval once the port may be open.
    #[arg(long, default_value = "1s", value_name = "DUR", value_parser = parse_nonzero_duration, help_heading = help::PROBING)]
    pub(crate) interval: std::time::Duration,
    /// Probe timeout (default from the profile: SGLang 25s, others 5-10s).
    #[arg(long, value_name = "DUR", value_parser = parse_nonzero_duration, help_heading = help::PROBING)]
    pub(crate) probe_timeout: Option<std::time::Duration>,
    /// Environment variable holding the API key (sent as a bearer token, never printed).
    #[arg(long, value_name = "VAR", help_heading = help::PROBING)]
    pub(crate) api_key_env: Option<String>,
    /// Stall limit: DUR for every phase, or PHASE=DUR (repeatable).
    ///
    /// Alive with no progress (no progress line in the log, no change in GPU memory) for this long:
    /// `stalled`, exit 4. Phases: launch, dist_init, weights, draft_weights, kv_cache, compile,
    /// cuda_graphs, draft_cuda_graphs, http, warmup, serving. Defaults: http 2m; launch, kv_cache and
    /// serving 5m; compile 15m; the others 10m. A limit must be above zero.
    #[arg(long, value_name = "[PHASE=]DUR", value_parser = parse_stall, help_heading = help::LIMITS)]
    pub(crate) stall: Vec<Stall>,
    /// JSON lines on stdout, one event a line (schema: docs/events.md).
    #[arg(long, help_heading = help::OUTPUT)]
    pub(crate) json: bool,
    /// Only the verdict line (no phase lines, no live status).
    #[arg(long, short, help_heading = help::OUTPUT)]
    pub(crate) quiet: bool,
    /// Print each log line as it is read.
    #[arg(long, help_heading = help::OUTPUT)]
    pub(crate) echo: bool,
    #[command(flatten)]
    pub(crate) proof: ProofFlags,
}

/// Trust for `https://` URLs (health probes and the generation proof).
#[derive(clap::Args, Clone)]
pub(crate) struct TlsFlags {
    /// PEM file of the CA(s) that signed the server's certificate, or of the server's own (self-signed)
    /// certificate, trusted instead of the system store.
    #[arg(long, value_name = "FILE", help_heading = help::PROBING)]
    pub(crate) ca_cert: Option<PathBuf>,
    /// Do not verify the server's TLS certificate (said once on stderr).
    #[arg(long, conflicts_with = "ca_cert", help_heading = help::PROBING)]
    pub(crate) insecure: bool,
}

#[derive(clap::Args, Clone)]
pub(crate) struct ProofFlags {
    /// Do not prove readiness with a real completion.
    #[arg(long, help_heading = help::PROOF)]
    pub(crate) no_generate: bool,
    /// Give up proving generation after this long (verdict unhealthy).
    #[arg(long, default_value = "120s", value_name = "DUR", value_parser = parse_nonzero_duration, help_heading = help::PROOF)]
    pub(crate) generate_timeout: std::time::Duration,
    /// Keep watching after ready (health and generation probes, the log, the process).
    #[arg(long, help_heading = help::PROOF)]
    pub(crate) watch: bool,
    /// Watch: probes failing this long give `unhealthy`.
    #[arg(long, default_value = "30s", value_name = "DUR", value_parser = parse_nonzero_duration, help_heading = help::PROOF)]
    pub(crate) unhealthy_after: std::time::Duration,
    /// Watch: one generation probe this often.
    #[arg(long, default_value = "60s", value_name = "DUR", value_parser = parse_nonzero_duration, help_heading = help::PROOF)]
    pub(crate) generate_every: std::time::Duration,
    /// Serve what vigil knows over HTTP on PORT or HOST:PORT (loopback by default), from launch to the end
    /// of the watch: /livez, /startupz, /readyz, /status, /events (SSE), /metrics and a live page at /.
    ///
    /// Read-only (GET and HEAD). A non-loopback address needs --listen-token-file or --listen-public.
    #[arg(long, value_name = "ADDR", value_parser = metrics::parse_addr, help_heading = help::OUTPUT)]
    pub(crate) listen: Option<std::net::SocketAddr>,
    /// The same as --listen (the listener serves Prometheus metrics at /metrics).
    #[arg(long, value_name = "ADDR", value_parser = metrics::parse_addr, help_heading = help::OUTPUT)]
    pub(crate) metrics: Option<std::net::SocketAddr>,
    /// --listen: every request must carry `Authorization: Bearer TOKEN`, the token being this file's first line.
    #[arg(long, value_name = "FILE", help_heading = help::OUTPUT)]
    pub(crate) listen_token_file: Option<PathBuf>,
    /// --listen on a non-loopback address without a token: anyone who reaches it may read the state.
    #[arg(long, help_heading = help::OUTPUT)]
    pub(crate) listen_public: bool,
    /// --listen over TLS: the certificate chain (PEM); with --listen-key.
    #[arg(long, value_name = "FILE", requires = "listen_key", help_heading = help::OUTPUT)]
    pub(crate) listen_cert: Option<PathBuf>,
    /// --listen over TLS: the private key (PEM); with --listen-cert.
    #[arg(long, value_name = "FILE", requires = "listen_cert", help_heading = help::OUTPUT)]
    pub(crate) listen_key: Option<PathBuf>,
    /// Keep serving --listen this long after a verdict that ends vigil (crashed, stalled, …) so it is read.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub(crate) metrics_linger: std::time::Duration,
    /// GPU sampling interval (NVML or nvidia-smi; off when neither exists).
    #[arg(long, default_value = "2s", value_name = "DUR", value_parser = parse_nonzero_duration, help_heading = help::PROOF)]
    pub(crate) gpu_interval: std::time::Duration,
    /// Health probe timeout while watching (default from the profile).
    #[arg(long = "watch-probe-timeout", value_name = "DUR", value_parser = parse_nonzero_duration, help_heading = help::PROOF)]
    pub(crate) watch_probe_timeout: Option<std::time::Duration>,
    /// A stalled server (or a crashed one whose processes linger, or one whose engine died): after its
    /// evidence is saved, `stop` its process tree and prove the port and GPU memory free, or `keep` it.
    /// Default: stop for `up` (a server vigil launched; keep with --keep), keep for `wait`.
    #[arg(long, value_name = "keep|stop", value_parser = parse_on_stall, help_heading = help::SUPERVISION)]
    pub(crate) on_stall: Option<vigil_core::policy::OnStall>,
}

fn parse_repair(s: &str) -> Result<crate::supervise::repair::RepairMode, String> {
    crate::supervise::repair::RepairMode::parse(s)
}

fn parse_on_stall(s: &str) -> Result<vigil_core::policy::OnStall, String> {
    vigil_core::policy::OnStall::parse(s).ok_or_else(|| format!("'{s}': say keep or stop"))
}

#[derive(clap::Args)]
pub(crate) struct UpFlags {
    /// Run name (default: the server kind or the program name).
    #[arg(long, help_heading = help::LAUNCH)]
    pub(crate) name: Option<String>,
    /// Return at the verdict and leave the server running.
    #[arg(long, help_heading = help::SUPERVISION)]
    pub(crate) detach: bool,
    /// On Ctrl-C, leave the server running.
    #[arg(long, help_heading = help::SUPERVISION)]
    pub(crate) keep: bool,
    /// Stop an earlier run of the same name first.
    #[arg(long, help_heading = help::LAUNCH)]
    pub(crate) replace: bool,
    /// Extra environment for the server (KEY=VALUE, repeatable).
    #[arg(long = "env", value_name = "KEY=VALUE", help_heading = help::LAUNCH)]
    pub(crate) env: Vec<String>,
    /// Environment file for the server: KEY=VALUE lines, # comments, optional `export`; --env wins.
    #[arg(long, value_name = "FILE", help_heading = help::LAUNCH)]
    pub(crate) env_file: Option<PathBuf>,
    /// Server kind (sglang, vllm, llama-cpp, tgi, generic; default: detected from the command).
    #[arg(long, value_name = "KIND", help_heading = help::LAUNCH)]
    pub(crate) server: Option<String>,
    /// Grace period between SIGTERM and SIGKILL when stopping.
    #[arg(long, default_value = "10s", value_name = "DUR", value_parser = parse_duration, help_heading = help::SUPERVISION)]
    pub(crate) grace: std::time::Duration,
    /// Overall deadline for the startup (exit 5 if still progressing then; the server keeps running).
    #[arg(long, default_value = "2h", value_name = "DUR", value_parser = parse_nonzero_duration, help_heading = help::LIMITS)]
    pub(crate) timeout: std::time::Duration,
    /// Stall limit: DUR for every phase, or PHASE=DUR (repeatable).
    ///
    /// Alive with no progress (no progress line in the log, no change in GPU memory) for this long:
    /// `stalled`, exit 4. Phases: launch, dist_init, weights, draft_weights, kv_cache, compile,
    /// cuda_graphs, draft_cuda_graphs, http, warmup, serving. Defaults: http 2m; launch, kv_cache and
    /// serving 5m; compile 15m; the others 10m. A limit must be above zero.
    #[arg(long, value_name = "[PHASE=]DUR", value_parser = parse_stall, help_heading = help::LIMITS)]
    pub(crate) stall: Vec<Stall>,
    /// Rotate the run log at this size (bytes, or with a suffix k, m, g).
    #[arg(long, default_value = "64m", value_name = "SIZE", value_parser = parse_size, help_heading = help::SUPERVISION)]
    pub(crate) log_max_size: u64,
    /// Skip the preflight check (vigil check) before launching.
    #[arg(long, help_heading = help::LAUNCH)]
    pub(crate) no_check: bool,
    /// After a crash or stall whose diagnosis carries a repair, stop the run, repair its command and
    /// relaunch it (docs/repair.md): N attempts (default 2); `any` may also change what you set (context
    /// length, eager mode); `dry` prints the repaired command and launches nothing. Combine with commas:
    /// `--repair=any,3`.
    #[arg(long, value_name = "N|any|dry", num_args = 0..=1, require_equals = true, default_missing_value = "2",
          value_parser = parse_repair, help_heading = help::SUPERVISION)]
    pub(crate) repair: Option<crate::supervise::repair::RepairMode>,
    /// Do not probe the health URL: the log alone proves readiness.
    #[arg(long, help_heading = help::PROBING)]
    pub(crate) no_probe: bool,
    /// Probe interval once the port may be open.
    #[arg(long, default_value = "1s", value_name = "DUR", value_parser = parse_nonzero_duration, help_heading = help::PROBING)]
    pub(crate) interval: std::time::Duration,
    /// Rotated run logs kept (server.log.1 … .N).
    #[arg(long, value_name = "N", default_value_t = 3, help_heading = help::SUPERVISION)]
    pub(crate) log_keep: u32,
    /// JSON lines on stdout, one event a line (schema: docs/events.md).
    #[arg(long, help_heading = help::OUTPUT)]
    pub(crate) json: bool,
    /// Only the verdict line (no phase lines, no live status).
    #[arg(long, short, help_heading = help::OUTPUT)]
    pub(crate) quiet: bool,
    #[command(flatten)]
    pub(crate) proof: ProofFlags,
}

/// `up --multi-node` without a host list: one vigil per rank, each started by the launcher that starts the
/// server there (docs/multi-node.md; Slurm: docs/slurm.md).
#[derive(clap::Args)]
pub(crate) struct GroupFlags {
    /// This rank's place under any launcher (with --ranks and --rendezvous): 0 is the head.
    #[arg(long, value_name = "N", help_heading = help::SLURM)]
    pub(crate) rank: Option<usize>,
    /// How many ranks the server has (with --rank and --rendezvous).
    #[arg(long, value_name = "M", value_parser = clap::value_parser!(u64).range(1..), help_heading = help::SLURM)]
    pub(crate) ranks: Option<u64>,
    /// Where the head (rank 0) listens for the other ranks: HOST:PORT (with --rank and --ranks).
    #[arg(long, value_name = "HOST:PORT", help_heading = help::SLURM)]
    pub(crate) rendezvous: Option<String>,
    /// Slurm: at a failure verdict (crashed, stalled, timeout, unhealthy, a rank refused or lost), after the
    /// evidence is saved and every rank stopped: scancel the job step (default), the whole job, or nothing.
    #[arg(long, value_enum, value_name = "WHAT", help_heading = help::SLURM)]
    pub(crate) scancel: Option<crate::supervise::multinode::Scancel>,
    /// TCP port of the head where the other ranks report (Slurm: default from the job id; a LeaderWorkerSet:
    /// 24810).
    #[arg(long, value_name = "PORT", value_parser = clap::value_parser!(u16).range(1..), help_heading = help::SLURM)]
    pub(crate) rendezvous_port: Option<u16>,
    /// How long the head waits for every rank to report in, and a rank to reach the head.
    #[arg(long, default_value = "5m", value_name = "DUR", value_parser = parse_nonzero_duration, help_heading = help::SLURM)]
    pub(crate) join_timeout: std::time::Duration,
}

impl GroupFlags {
    pub(crate) fn flags(&self) -> crate::supervise::multinode::Flags {
        crate::supervise::multinode::Flags {
            scancel: self.scancel,
            port: self.rendezvous_port,
            join: self.join_timeout,
            rank: self.rank,
            ranks: self.ranks.map(|r| r as usize),
            rendezvous: self.rendezvous.clone(),
        }
    }
}

fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim().to_ascii_lowercase();
    let (n, m) = if let Some(n) = t.strip_suffix('k') {
        (n, 1u64 << 10)
    } else if let Some(n) = t.strip_suffix('m') {
        (n, 1 << 20)
    } else if let Some(n) = t.strip_suffix('g') {
        (n, 1 << 30)
    } else {
        (t.as_str(), 1)
    };
    n.parse::<u64>().map(|v| v * m).map_err(|_| format!("bad size '{s}' (e.g. 64m, 512k)"))
}

/// `check --gpu-mem SIZE` (crates/vigil/src/check/fit.rs `parse_size`).
fn parse_gpu_mem(s: &str) -> Result<u64, String> {
    crate::check::fit::parse_size(s).ok_or_else(|| format!("not a size: '{s}' (say 80g, 141GiB or 81559m)"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("5m").unwrap(), Duration::from_secs(300));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        for bad in ["", "x", "-1s", "1d", "nan", "1e300"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}
