//! vigil: brings up and watches LLM inference servers.

mod check;
mod cli;
mod diagnose;
mod exit;
mod fit;
mod follow;
mod gguf;
mod gpu;
mod help;
mod history;
mod hosts;
mod keeper;
mod kprobe;
mod lines;
mod metrics;
mod notify;
mod probe;
mod procs;
mod proof;
mod remote;
mod report;
mod run;
mod timeline;
mod tls;
mod up;
mod wait;

use std::sync::atomic::{AtomicUsize, Ordering};

static INTERRUPTS: AtomicUsize = AtomicUsize::new(0);

/// The last of SIGINT/SIGTERM received (0: none).
static LAST_SIGNAL: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

extern "C" fn on_interrupt(sig: libc::c_int) {
    LAST_SIGNAL.store(sig, Ordering::SeqCst);
    INTERRUPTS.fetch_add(1, Ordering::SeqCst);
}

/// Whether the last interrupt was SIGTERM (a service manager's orderly stop) rather than Ctrl-C.
pub fn last_interrupt_was_sigterm() -> bool {
    LAST_SIGNAL.load(Ordering::SeqCst) == libc::SIGTERM
}

/// SIGINT and SIGTERM are counted, not fatal, while vigil watches: the first stops the server (or
/// ends the wait), a second one during a stop kills at once.
fn install_interrupt_handlers() {
    // SAFETY: the handler only touches an atomic.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_interrupt as *const () as usize;
        sa.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGINT, &sa, std::ptr::null_mut());
        libc::sigaction(libc::SIGTERM, &sa, std::ptr::null_mut());
    }
}

static CONSUMED: AtomicUsize = AtomicUsize::new(0);

/// Takes one pending interrupt (SIGINT/SIGTERM since the process started), if any: each interrupt is
/// acted on once, by whoever waits for it (the watch, the stop, the foreground loop).
pub fn take_interrupt() -> bool {
    let n = INTERRUPTS.load(Ordering::SeqCst);
    let c = CONSUMED.load(Ordering::SeqCst);
    if n > c {
        CONSUMED.store(n, Ordering::SeqCst);
        return true;
    }
    false
}

/// Resolves when an interrupt is pending: taking it, or (`shared`: one of several concurrent
/// watches, all of which must see it) leaving it pending.
pub async fn interrupt(shared: bool) {
    if !shared {
        return next_interrupt().await;
    }
    while INTERRUPTS.load(Ordering::SeqCst) <= CONSUMED.load(Ordering::SeqCst) {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Runs a blocking command (file reads, child processes) on its own thread so that Ctrl-C / SIGTERM end it
/// promptly with exit 130 whatever the work is waiting on.
fn interruptible(work: impl FnOnce() -> Result<i32, CliError> + Send + 'static) -> Result<i32, CliError> {
    use std::sync::mpsc::RecvTimeoutError;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(work());
    });
    loop {
        match rx.recv_timeout(std::time::Duration::from_millis(20)) {
            Ok(v) => return v,
            Err(RecvTimeoutError::Disconnected) => {
                return Err(CliError::Internal("the command's worker stopped unexpectedly".into()))
            }
            Err(RecvTimeoutError::Timeout) if take_interrupt() => {
                eprintln!("vigil: interrupted");
                return Ok(exit::INTERRUPTED);
            }
            Err(RecvTimeoutError::Timeout) => {}
        }
    }
}

/// Resolves when an interrupt is pending, and takes it.
pub async fn next_interrupt() {
    while !take_interrupt() {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

use clap::{CommandFactory, Parser, Subcommand};
use cli::{check_server, load_profiles, parse_duration, CliError};
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "vigil",
    version = help::VERSION,
    about = "Brings up and watches LLM inference servers (SGLang, vLLM, llama-server, TGI)",
    long_about = help::ABOUT,
    after_long_help = help::VIGIL
)]
struct Cli {
    /// Extra profile directory (*.toml), repeatable; also read: $XDG_CONFIG_HOME/vigil/profiles/
    #[arg(long = "profiles", global = true, value_name = "DIR", help_heading = help::PROFILES)]
    profiles: Vec<PathBuf>,
    #[command(flatten)]
    remote: RemoteFlags,
    #[command(subcommand)]
    cmd: Cmd,
}

/// Remote nodes (up, wait, status, logs, down, ps): the system ssh client, one connection per host.
#[derive(clap::Args)]
struct RemoteFlags {
    /// Run on a remote node over SSH: [USER@]NODE, a Host of your ssh config, or ssh://[USER@]NODE[:PORT].
    ///
    /// Works with up, wait, status, logs, down, ps and check. Your ~/.ssh/config applies (ProxyJump,
    /// agent, keys); never a prompt: an unknown host key or a refused key is a one-line error (exit 12).
    #[arg(long, global = true, value_name = "[USER@]NODE", help_heading = help::REMOTE)]
    host: Option<String>,
    /// Several hosts, comma-separated: a fleet (each host on its own), or with --multi-node one server.
    #[arg(long, global = true, value_name = "H1,H2,...", help_heading = help::REMOTE)]
    hosts: Option<String>,
    /// Hosts from a file, one a line (# comments).
    #[arg(long, global = true, value_name = "FILE", help_heading = help::REMOTE)]
    hosts_file: Option<PathBuf>,
    /// The hosts run one server together: rank i on the i-th host; one verdict (implied by --nnodes N>1).
    #[arg(long, global = true, help_heading = help::REMOTE)]
    multi_node: bool,
    /// Fleets: at most this many hosts at once.
    #[arg(long, global = true, default_value_t = 8, value_name = "N", help_heading = help::REMOTE)]
    parallel: usize,
    /// ssh config file (ssh -F); default: ssh's own (~/.ssh/config).
    #[arg(long, global = true, value_name = "FILE", env = "VIGIL_SSH_CONFIG", help_heading = help::REMOTE)]
    ssh_config: Option<PathBuf>,
    /// SSH connect timeout, TCP and the SSH banner (duration: 10s, 1m); past it: exit 12.
    #[arg(long, global = true, default_value = "10s", value_name = "DUR", value_parser = parse_duration, help_heading = help::REMOTE)]
    connect_timeout: std::time::Duration,
    /// After the connection drops, keep reconnecting this long (backoff 0.25 s doubling to 5 s); then exit 12.
    #[arg(long, global = true, default_value = "2m", value_name = "DUR", value_parser = parse_duration, help_heading = help::REMOTE)]
    reconnect_for: std::time::Duration,
    /// Runs directory on the remote (default ${XDG_STATE_HOME:-~/.local/state}/vigil/remote).
    #[arg(long, global = true, value_name = "DIR", env = "VIGIL_REMOTE_DIR", help_heading = help::REMOTE)]
    remote_dir: Option<String>,
}

#[derive(Subcommand)]
enum HistoryCmd {
    /// Reads old server logs into the history (phase durations from their timestamps).
    Import {
        /// Server log files (any size; their own timestamps give the phase durations).
        #[arg(required = true, value_name = "LOG")]
        files: Vec<PathBuf>,
    },
}

#[derive(Subcommand)]
enum Cmd {
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
        #[arg(long, default_value = "5s", value_name = "DUR", value_parser = parse_duration, help_heading = help::PROBING)]
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
        /// Time between SIGTERM and SIGKILL.
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
struct WaitFlags {
    /// Health URL to probe (http://HOST:PORT/PATH or https://...); with it, a 2xx is required for ready.
    #[arg(long, help_heading = help::PROBING)]
    url: Option<String>,
    #[command(flatten)]
    tls: TlsFlags,
    /// Log file to follow (may not exist yet; survives truncation and rotation), or - for stdin.
    #[arg(long, value_name = "FILE", help_heading = help::TARGET)]
    log: Option<String>,
    /// Command whose output is the log (e.g. 'kubectl logs -f POD').
    #[arg(long, value_name = "CMD", help_heading = help::TARGET)]
    log_cmd: Option<String>,
    /// Process to watch (its exit is a crash before ready).
    #[arg(long, help_heading = help::TARGET)]
    pid: Option<i32>,
    /// Server kind (default: detected from the log).
    #[arg(long, value_name = "KIND", help_heading = help::TARGET)]
    server: Option<String>,
    /// Overall deadline (exit 5 if still progressing then).
    #[arg(long, default_value = "2h", value_name = "DUR", value_parser = parse_duration, help_heading = help::LIMITS)]
    timeout: std::time::Duration,
    /// Probe interval once the port may be open.
    #[arg(long, default_value = "1s", value_name = "DUR", value_parser = parse_duration, help_heading = help::PROBING)]
    interval: std::time::Duration,
    /// Probe timeout (default from the profile: SGLang 25s, others 5-10s).
    #[arg(long, value_name = "DUR", value_parser = parse_duration, help_heading = help::PROBING)]
    probe_timeout: Option<std::time::Duration>,
    /// Environment variable holding the API key (sent as a bearer token, never printed).
    #[arg(long, value_name = "VAR", help_heading = help::PROBING)]
    api_key_env: Option<String>,
    /// Stall limit: DUR for every phase, or PHASE=DUR (repeatable).
    ///
    /// Alive with no progress (no progress line in the log, no change in GPU memory) for this long:
    /// `stalled`, exit 4. Phases: launch, dist_init, weights, draft_weights, kv_cache, compile,
    /// cuda_graphs, draft_cuda_graphs, http, warmup, serving. Defaults: http 2m; launch, kv_cache and
    /// serving 5m; compile 15m; the others 10m.
    #[arg(long, value_name = "[PHASE=]DUR", value_parser = cli::parse_stall, help_heading = help::LIMITS)]
    stall: Vec<cli::Stall>,
    /// JSON lines on stdout, one event a line (schema: docs/events.md).
    #[arg(long, help_heading = help::OUTPUT)]
    json: bool,
    /// Only the verdict line (no phase lines, no live status).
    #[arg(long, short, help_heading = help::OUTPUT)]
    quiet: bool,
    /// Print each log line as it is read.
    #[arg(long, help_heading = help::OUTPUT)]
    echo: bool,
    #[command(flatten)]
    proof: ProofFlags,
}

impl WaitFlags {
    /// The watch's arguments (local sources are set by the caller).
    fn into_args(self, profiles: &vigil_core::Profiles) -> Result<wait::Args, CliError> {
        check_server(profiles, &self.server)?;
        if self.interval.is_zero() {
            return Err(CliError::usage("--interval must be above zero"));
        }
        let mut w = wait::Args::new();
        self.proof.apply(&mut w);
        w.url = self.url;
        w.log = self.log;
        w.log_cmd = self.log_cmd;
        w.pid = self.pid;
        w.server = self.server;
        w.timeout = self.timeout;
        w.interval = self.interval;
        w.probe_timeout = self.probe_timeout.or(w.probe_timeout);
        w.api_key_env = self.api_key_env;
        w.tls = self.tls.into();
        w.stall = self.stall;
        w.json = self.json;
        w.quiet = self.quiet;
        w.echo = self.echo;
        Ok(w)
    }
}

/// Trust for `https://` URLs (health probes and the generation proof).
#[derive(clap::Args, Clone)]
struct TlsFlags {
    /// PEM file of the CA(s) that signed the server's certificate, trusted instead of the system store.
    #[arg(long, value_name = "FILE", help_heading = help::PROBING)]
    ca_cert: Option<PathBuf>,
    /// Do not verify the server's TLS certificate (said once on stderr).
    #[arg(long, conflicts_with = "ca_cert", help_heading = help::PROBING)]
    insecure: bool,
}

impl From<TlsFlags> for tls::TlsOpts {
    fn from(f: TlsFlags) -> tls::TlsOpts {
        tls::TlsOpts { ca_cert: f.ca_cert, insecure: f.insecure }
    }
}

#[derive(clap::Args, Clone)]
struct ProofFlags {
    /// Do not prove readiness with a real completion.
    #[arg(long, help_heading = help::PROOF)]
    no_generate: bool,
    /// Give up proving generation after this long (verdict unhealthy).
    #[arg(long, default_value = "120s", value_name = "DUR", value_parser = parse_duration, help_heading = help::PROOF)]
    generate_timeout: std::time::Duration,
    /// Keep watching after ready (health and generation probes, the log, the process).
    #[arg(long, help_heading = help::PROOF)]
    watch: bool,
    /// Watch: probes failing this long give `unhealthy`.
    #[arg(long, default_value = "30s", value_name = "DUR", value_parser = parse_duration, help_heading = help::PROOF)]
    unhealthy_after: std::time::Duration,
    /// Watch: one generation probe this often.
    #[arg(long, default_value = "60s", value_name = "DUR", value_parser = parse_duration, help_heading = help::PROOF)]
    generate_every: std::time::Duration,
    /// Serve Prometheus metrics on PORT or HOST:PORT (loopback by default).
    #[arg(long, value_name = "ADDR", value_parser = metrics::parse_addr, help_heading = help::OUTPUT)]
    metrics: Option<std::net::SocketAddr>,
    /// Keep serving --metrics this long after a verdict that ends vigil (crashed, stalled, …) so it is scraped.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    metrics_linger: std::time::Duration,
    /// GPU sampling interval (NVML or nvidia-smi; off when neither exists).
    #[arg(long, default_value = "2s", value_name = "DUR", value_parser = parse_duration, help_heading = help::PROOF)]
    gpu_interval: std::time::Duration,
    /// Health probe timeout while watching (default from the profile).
    #[arg(long = "watch-probe-timeout", value_name = "DUR", value_parser = parse_duration, help_heading = help::PROOF)]
    watch_probe_timeout: Option<std::time::Duration>,
}

impl ProofFlags {
    fn apply(&self, w: &mut wait::Args) {
        w.generate = !self.no_generate;
        w.generate_timeout = self.generate_timeout;
        w.watch = self.watch;
        w.unhealthy_after = self.unhealthy_after;
        w.generate_every = self.generate_every;
        w.metrics = self.metrics;
        w.metrics_linger = self.metrics_linger;
        w.gpu_interval = self.gpu_interval;
        if self.watch_probe_timeout.is_some() {
            w.probe_timeout = self.watch_probe_timeout;
        }
    }
}

#[derive(clap::Args)]
struct UpFlags {
    /// Run name (default: the server kind or the program name).
    #[arg(long, help_heading = help::LAUNCH)]
    name: Option<String>,
    /// Return at the verdict and leave the server running.
    #[arg(long, help_heading = help::SUPERVISION)]
    detach: bool,
    /// On Ctrl-C, leave the server running.
    #[arg(long, help_heading = help::SUPERVISION)]
    keep: bool,
    /// Stop an earlier run of the same name first.
    #[arg(long, help_heading = help::LAUNCH)]
    replace: bool,
    /// Extra environment for the server (KEY=VALUE, repeatable).
    #[arg(long = "env", value_name = "KEY=VALUE", help_heading = help::LAUNCH)]
    env: Vec<String>,
    /// Environment file for the server: KEY=VALUE lines, # comments, optional `export`; --env wins.
    #[arg(long, value_name = "FILE", help_heading = help::LAUNCH)]
    env_file: Option<PathBuf>,
    /// Server kind (sglang, vllm, llama-cpp, tgi, generic; default: detected from the command).
    #[arg(long, value_name = "KIND", help_heading = help::LAUNCH)]
    server: Option<String>,
    /// Grace period between SIGTERM and SIGKILL when stopping.
    #[arg(long, default_value = "10s", value_name = "DUR", value_parser = parse_duration, help_heading = help::SUPERVISION)]
    grace: std::time::Duration,
    /// Overall deadline for the startup (exit 5 if still progressing then; the server keeps running).
    #[arg(long, default_value = "2h", value_name = "DUR", value_parser = parse_duration, help_heading = help::LIMITS)]
    timeout: std::time::Duration,
    /// Stall limit: DUR for every phase, or PHASE=DUR (repeatable).
    ///
    /// Alive with no progress (no progress line in the log, no change in GPU memory) for this long:
    /// `stalled`, exit 4. Phases: launch, dist_init, weights, draft_weights, kv_cache, compile,
    /// cuda_graphs, draft_cuda_graphs, http, warmup, serving. Defaults: http 2m; launch, kv_cache and
    /// serving 5m; compile 15m; the others 10m.
    #[arg(long, value_name = "[PHASE=]DUR", value_parser = cli::parse_stall, help_heading = help::LIMITS)]
    stall: Vec<cli::Stall>,
    /// Rotate the run log at this size (bytes, or with a suffix k, m, g).
    #[arg(long, default_value = "64m", value_name = "SIZE", value_parser = parse_size, help_heading = help::SUPERVISION)]
    log_max_size: u64,
    /// Skip the preflight check (vigil check) before launching.
    #[arg(long, help_heading = help::LAUNCH)]
    no_check: bool,
    /// Do not probe the health URL: the log alone proves readiness.
    #[arg(long, help_heading = help::PROBING)]
    no_probe: bool,
    /// Probe interval once the port may be open.
    #[arg(long, default_value = "1s", value_name = "DUR", value_parser = parse_duration, help_heading = help::PROBING)]
    interval: std::time::Duration,
    /// Rotated run logs kept (server.log.1 … .N).
    #[arg(long, value_name = "N", default_value_t = 3, help_heading = help::SUPERVISION)]
    log_keep: u32,
    /// JSON lines on stdout, one event a line (schema: docs/events.md).
    #[arg(long, help_heading = help::OUTPUT)]
    json: bool,
    /// Only the verdict line (no phase lines, no live status).
    #[arg(long, short, help_heading = help::OUTPUT)]
    quiet: bool,
    #[command(flatten)]
    proof: ProofFlags,
}

impl UpFlags {
    /// The launch settings, resolved before anything runs: the `--metrics` port is bound here, so a taken
    /// one is a usage error before a server is launched.
    fn into_args(self, cmd: Vec<String>) -> Result<up::UpArgs, CliError> {
        let metrics_listener = self.proof.metrics.map(metrics::bind).transpose()?;
        Ok(up::UpArgs {
            name: self.name,
            detach: self.detach,
            keep: self.keep,
            replace: self.replace,
            env: self.env,
            env_file: self.env_file,
            server: self.server,
            grace: self.grace,
            timeout: self.timeout,
            stall: self.stall,
            json: self.json,
            quiet: self.quiet,
            log_max_bytes: self.log_max_size,
            log_keep: self.log_keep,
            no_probe: self.no_probe,
            no_check: self.no_check,
            proof: {
                let mut w = wait::Args::new();
                self.proof.apply(&mut w);
                w.interval = self.interval.max(std::time::Duration::from_millis(10));
                w.metrics_listener = metrics_listener;
                w
            },
            cmd,
        })
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

fn runtime() -> Result<tokio::runtime::Runtime, CliError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::Internal(format!("runtime: {e}")))
}

/// Runs a command's future to its end, then leaves at once: the runtime is shut down in the background, so
/// the exit (what a script waiting on `vigil wait` sees) never waits on a source still blocked in a read.
fn block_on<F: std::future::Future>(f: F) -> Result<F::Output, CliError> {
    let rt = runtime()?;
    let out = rt.block_on(f);
    rt.shutdown_background();
    Ok(out)
}

fn main() {
    let cli = Cli::parse();
    let code = match run(cli) {
        Ok(c) => c,
        Err(CliError::Usage(m)) => {
            eprintln!("vigil: error: {m}");
            exit::USAGE
        }
        Err(CliError::Internal(m)) => {
            eprintln!("vigil: internal error: {m}");
            exit::INTERNAL
        }
        Err(CliError::Unreachable(m)) => {
            eprintln!("vigil: error: {m}");
            exit::UNREACHABLE
        }
    };
    std::process::exit(code);
}

fn run(cli: Cli) -> Result<i32, CliError> {
    if let Cmd::Keeper { dir } = cli.cmd {
        return Ok(keeper::main(dir));
    }
    // Generated from the definitions alone: no profiles, no remote host.
    if let Cmd::Completions { shell } = cli.cmd {
        return help::completions(shell, Cli::command());
    }
    if let Cmd::Man { dir } = &cli.cmd {
        return help::man(Cli::command(), dir.as_deref());
    }
    if !matches!(
        cli.cmd,
        Cmd::Diagnose { .. } | Cmd::Profiles | Cmd::Logs { .. } | Cmd::History { .. } | Cmd::Timeline { .. }
    ) {
        install_interrupt_handlers();
    }
    let profiles = load_profiles(&cli.profiles)?;
    let rf = &cli.remote;
    if rf.connect_timeout.is_zero() {
        return Err(CliError::usage("--connect-timeout must be above zero"));
    }
    let ssh = remote::SshOpts {
        config: rf.ssh_config.clone(),
        connect_timeout: rf.connect_timeout,
        reconnect_for: rf.reconnect_for,
        remote_dir: rf.remote_dir.clone(),
    };
    let hosts =
        hosts::Hosts::parse(rf.host.clone(), rf.hosts.clone(), rf.hosts_file.clone(), rf.multi_node, rf.parallel, ssh)?;
    if let Some(hs) = hosts {
        return run_remote(cli.cmd, hs, profiles);
    }
    match cli.cmd {
        Cmd::Diagnose { files, json, explain, quiet, server } => {
            check_server(&profiles, &server)?;
            diagnose::run(diagnose::Args { files, json, explain, quiet, server }, &profiles)
        }
        Cmd::Wait { name, f } => {
            let mut w = f.into_args(&profiles)?;
            // `wait NAME`: a run of `vigil up`, read from its run directory
            if let Some(n) = &name {
                let (dir, rec) = run::load(n)?;
                w.attach_run(&dir, &rec, &profiles, true);
            }
            let out = block_on(wait::run(w, profiles))??;
            Ok(out.code)
        }
        Cmd::Up { up: f, cmd } => {
            check_server(&profiles, &f.server)?;
            let cmd = cmd
                .into_iter()
                .enumerate()
                .map(|(i, a)| {
                    a.into_string().map_err(|_| {
                        CliError::usage(format!(
                            "argument {} of the server command is not valid UTF-8 (local runs need UTF-8; --host passes any bytes)",
                            i + 1
                        ))
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            block_on(up::up(f.into_args(cmd)?, profiles))?
        }
        Cmd::Restart { name, up: f } => block_on(up::restart(&name, f.into_args(vec![])?, profiles))?,
        Cmd::Down { names, all, pid, grace, json } => up::down(names, all, pid, grace, json),
        Cmd::Status { json } => up::status(json, &profiles),
        Cmd::Logs { name, follow, lines } => up::logs(&name, follow, lines),
        Cmd::Ps { json } => up::ps(json),
        Cmd::Gpu { json } => {
            let reader = match gpu::Reader::open() {
                Ok(r) => r,
                Err(e) => {
                    crate::report::out_line(&e);
                    return Ok(exit::READY);
                }
            };
            let s = reader.sample().map_err(CliError::Internal)?;
            if json {
                let mut v = serde_json::to_value(&s).unwrap_or_default();
                v["t_unix_ms"] = run::now_ms().into();
                crate::report::out_line(&v.to_string());
            } else {
                for g in &s.gpus {
                    crate::report::out_line(&format!(
                        "GPU {}  {:>7} / {:>7} MiB  util {}%  ({})",
                        g.index,
                        g.used_mib,
                        g.total_mib,
                        g.util.map_or("?".into(), |u| u.to_string()),
                        s.source
                    ));
                }
                for p in &s.procs {
                    let cmd = follow::cmdline(p.pid).map(|c| c.join(" ")).unwrap_or_else(|| "?".into());
                    crate::report::out_line(&format!(
                        "  pid {:>7} GPU {} {:>7} MiB  {}",
                        p.pid,
                        p.gpu,
                        p.used_mib,
                        run::redact_cmdline(&cmd)
                    ));
                }
            }
            Ok(exit::READY)
        }
        Cmd::Watch { name, proof, json } => {
            let (dir, rec) = run::load(&name)?;
            let mut w = wait::Args::new();
            proof.apply(&mut w);
            w.watch = true;
            w.json = json;
            w.attach_run(&dir, &rec, &profiles, true);
            Ok(block_on(wait::run(w, profiles))??.code)
        }
        Cmd::Probe { name, url, log, generate, timeout, server, tls } => {
            let k = kprobe::Args { name, url, log, generate, timeout, server, tls: tls.into() };
            block_on(kprobe::run(k, &profiles))?
        }
        Cmd::Check { json, server, gpu_mem, cmd } => {
            check_server(&profiles, &server)?;
            if let Some(b) = gpu_mem {
                fit::set_gpu_mem(b);
            }
            interruptible(move || check::run(cmd, server, json, &profiles))
        }
        Cmd::Timeline { target, svg } => timeline::run(&target, svg.as_deref(), &profiles),
        Cmd::History { name, json, sub } => match sub {
            Some(HistoryCmd::Import { files }) => history::import(&files, &profiles),
            None => history::list(name.as_deref(), json),
        },
        Cmd::Keeper { .. } | Cmd::Completions { .. } | Cmd::Man { .. } => unreachable!("handled above"),
        Cmd::Profiles => {
            for p in &profiles.list {
                crate::report::out_line(&format!(
                    "{:<10} port {:<5} {:<8} probe timeout {:>4}s  {} rules  {}",
                    p.name,
                    p.port,
                    p.health_path,
                    p.probe_timeout_secs,
                    p.rules.len(),
                    p.description
                ));
            }
            Ok(exit::READY)
        }
    }
}

/// The commands that work on remote hosts (`--host`, `--hosts`, `--hosts-file`).
fn run_remote(cmd: Cmd, hs: hosts::Hosts, profiles: vigil_core::Profiles) -> Result<i32, CliError> {
    use std::os::unix::ffi::OsStringExt;
    let rt = runtime()?;
    match cmd {
        Cmd::Up { up: f, cmd } => {
            check_server(&profiles, &f.server)?;
            let argv: Vec<Vec<u8>> = cmd.into_iter().map(|a| a.into_vec()).collect();
            rt.block_on(hosts::up(hs, f.into_args(vec![])?, argv, profiles))
        }
        Cmd::Wait { name, f } => {
            if f.log.is_some() || f.log_cmd.is_some() || f.pid.is_some() {
                return Err(CliError::usage(
                    "wait --host: give the NAME of a run started with `vigil up --host` (--log/--log-cmd/--pid are local)",
                ));
            }
            let Some(name) = name else {
                return Err(CliError::usage("wait --host: give the NAME of a run started with `vigil up --host`"));
            };
            let w = f.into_args(&profiles)?;
            rt.block_on(hosts::wait(hs, name, w, profiles))
        }
        Cmd::Down { names, all, pid, grace, json } => {
            if pid.is_some() {
                return Err(CliError::usage("down --host: give a run name or --all (--pid is local)"));
            }
            rt.block_on(hosts::down(hs, names, all, grace, json))
        }
        Cmd::Status { json } => rt.block_on(hosts::status(hs, json, profiles)),
        Cmd::Logs { name, follow, lines } => rt.block_on(hosts::logs(hs, name, follow, lines)),
        Cmd::Ps { json } => rt.block_on(hosts::ps(hs, json)),
        Cmd::Check { json, server, gpu_mem, cmd } => {
            check_server(&profiles, &server)?;
            if let Some(b) = gpu_mem {
                fit::set_gpu_mem(b);
            }
            rt.block_on(hosts::check(hs, cmd, server, json, profiles))
        }
        _ => Err(CliError::usage("--host/--hosts work with up, wait, status, logs, down, ps and check")),
    }
}

/// `check --gpu-mem SIZE` (crates/vigil/src/fit.rs `parse_size`).
fn parse_gpu_mem(s: &str) -> Result<u64, String> {
    fit::parse_size(s).ok_or_else(|| format!("not a size: '{s}' (say 80g, 141GiB or 81559m)"))
}
