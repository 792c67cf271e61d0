//! vigil: brings up and watches LLM inference servers.

mod check;
mod cli;
mod diagnose;
mod exit;
mod follow;
mod gguf;
mod gpu;
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

/// Runs blocking work (file reads, child processes) on its own thread so that Ctrl-C / SIGTERM end the
/// command promptly with exit 130 whatever the work is waiting on.
fn interruptible<T>(work: impl FnOnce() -> T + Send + 'static) -> T
where
    T: From<InterruptedMarker> + Send + 'static,
{
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(work());
    });
    loop {
        match rx.recv_timeout(std::time::Duration::from_millis(20)) {
            Ok(v) => return v,
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                return T::from(InterruptedMarker::Panicked);
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) if take_interrupt() => {
                return T::from(InterruptedMarker::Interrupted);
            }
            Err(_) => {}
        }
    }
}

/// How an [`interruptible`] piece of work ended without its own result.
enum InterruptedMarker {
    Interrupted,
    Panicked,
}

impl From<InterruptedMarker> for Result<i32, CliError> {
    fn from(m: InterruptedMarker) -> Self {
        match m {
            InterruptedMarker::Interrupted => {
                eprintln!("vigil: interrupted");
                Ok(exit::INTERRUPTED)
            }
            InterruptedMarker::Panicked => Err(CliError::Internal("the check stopped unexpectedly".into())),
        }
    }
}

/// Resolves when an interrupt is pending, and takes it.
pub async fn next_interrupt() {
    while !take_interrupt() {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

use clap::{Parser, Subcommand};
use cli::{check_server, load_profiles, parse_duration, CliError};
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "vigil",
    version,
    about = "Brings up and watches LLM inference servers (SGLang, vLLM, llama-server, TGI)"
)]
struct Cli {
    /// Extra profile directory (*.toml); also read: $XDG_CONFIG_HOME/vigil/profiles/
    #[arg(long = "profiles", global = true, value_name = "DIR")]
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
    #[arg(long, global = true, value_name = "[USER@]NODE")]
    host: Option<String>,
    /// Several hosts, comma-separated: a fleet (each host on its own), or with --multi-node one server.
    #[arg(long, global = true, value_name = "H1,H2,...")]
    hosts: Option<String>,
    /// Hosts from a file, one a line (# comments).
    #[arg(long, global = true, value_name = "FILE")]
    hosts_file: Option<PathBuf>,
    /// The hosts run one server together: rank i on the i-th host; one verdict (implied by --nnodes N>1).
    #[arg(long, global = true)]
    multi_node: bool,
    /// Fleets: at most this many hosts at once.
    #[arg(long, global = true, default_value_t = 8, value_name = "N")]
    parallel: usize,
    /// ssh config file (ssh -F); default: ssh's own (~/.ssh/config).
    #[arg(long, global = true, value_name = "FILE", env = "VIGIL_SSH_CONFIG")]
    ssh_config: Option<PathBuf>,
    /// SSH connect timeout (TCP and the SSH banner).
    #[arg(long, global = true, default_value = "10s", value_parser = parse_duration)]
    connect_timeout: std::time::Duration,
    /// After the connection drops, keep reconnecting this long (backoff 0.25 s doubling to 5 s).
    #[arg(long, global = true, default_value = "2m", value_parser = parse_duration)]
    reconnect_for: std::time::Duration,
    /// Runs directory on the remote (default ${XDG_STATE_HOME:-~/.local/state}/vigil/remote).
    #[arg(long, global = true, value_name = "DIR", env = "VIGIL_REMOTE_DIR")]
    remote_dir: Option<String>,
}

#[derive(Subcommand)]
enum Cmd {
    /// Offline post-mortem of server logs: phase timeline, verdict, cause, evidence, hint.
    Diagnose {
        #[arg(required = true, value_name = "FILE")]
        files: Vec<String>,
        /// JSON lines; the last line of each file is its verdict object.
        #[arg(long)]
        json: bool,
        /// Show which pattern of which profile matched which line.
        #[arg(long)]
        explain: bool,
        /// Only the verdict line.
        #[arg(long, short)]
        quiet: bool,
        /// Server kind (default: detected from the log).
        #[arg(long, value_name = "KIND")]
        server: Option<String>,
    },
    /// Attach to a server started elsewhere (or a run of `vigil up`, by NAME) and wait for a verdict.
    Wait {
        /// A run started with `vigil up` (reads its log, pid and URL from the run directory).
        #[arg(value_name = "NAME")]
        name: Option<String>,
        #[command(flatten)]
        f: WaitFlags,
    },
    /// Watch a run after ready: health and generation probes, the log, the process (= wait NAME --watch).
    Watch {
        name: String,
        #[command(flatten)]
        proof: ProofFlags,
        #[arg(long)]
        json: bool,
    },
    /// One readiness check for Kubernetes exec probes: exit 0 ready, 1 not; one line.
    Probe {
        /// A run of `vigil up`.
        #[arg(value_name = "NAME")]
        name: Option<String>,
        #[arg(long)]
        url: Option<String>,
        /// The server's log: a fatal marker in it means not ready.
        #[arg(long, value_name = "FILE")]
        log: Option<String>,
        /// Also send one real completion.
        #[arg(long)]
        generate: bool,
        #[arg(long, default_value = "5s", value_parser = parse_duration)]
        timeout: std::time::Duration,
        #[arg(long, value_name = "KIND")]
        server: Option<String>,
    },
    /// List the server profiles (built-in and user).
    Profiles,
    /// Check a server command, its model configs and this machine before launching.
    Check {
        #[arg(long)]
        json: bool,
        #[arg(long, value_name = "KIND")]
        server: Option<String>,
        #[arg(last = true, required = true, value_name = "CMD")]
        cmd: Vec<String>,
    },
    /// Launch a server under a keeper and watch it until a verdict.
    Up {
        #[command(flatten)]
        up: UpFlags,
        /// The server command (with --host, passed byte for byte to the remote server).
        #[arg(last = true, required = true, value_name = "CMD", value_parser = clap::value_parser!(std::ffi::OsString))]
        cmd: Vec<std::ffi::OsString>,
    },
    /// Stop a run's whole process tree and prove nothing is left.
    Down {
        #[arg(value_name = "NAME")]
        names: Vec<String>,
        #[arg(long)]
        all: bool,
        /// A server tree vigil did not start (see `vigil ps`).
        #[arg(long)]
        pid: Option<i32>,
        #[arg(long, default_value = "10s", value_parser = parse_duration)]
        grace: std::time::Duration,
        #[arg(long)]
        json: bool,
    },
    /// One line per run: server, phase or verdict, time in it, port, pid, log age.
    Status {
        #[arg(long)]
        json: bool,
    },
    /// A run's log (secrets redacted).
    Logs {
        name: String,
        #[arg(short = 'f', long)]
        follow: bool,
        #[arg(short = 'n', long, default_value_t = 50)]
        lines: usize,
    },
    /// Stop a run and start it again: same command, working directory and environment.
    Restart {
        #[arg(id = "run_name", value_name = "NAME")]
        name: String,
        #[command(flatten)]
        up: UpFlags,
    },
    /// Inference servers on this machine that vigil did not start.
    Ps {
        #[arg(long)]
        json: bool,
    },
    /// GPU readings (NVML, else nvidia-smi): per GPU memory and utilisation, per process memory.
    Gpu {
        #[arg(long)]
        json: bool,
    },
    #[command(name = "__keeper", hide = true)]
    Keeper { dir: PathBuf },
}

#[derive(clap::Args)]
struct WaitFlags {
    /// Health URL to probe (http://HOST:PORT/PATH).
    #[arg(long)]
    url: Option<String>,
    /// Log file to follow (may not exist yet; survives truncation and rotation), or - for stdin.
    #[arg(long, value_name = "FILE")]
    log: Option<String>,
    /// Command whose output is the log (e.g. 'kubectl logs -f POD').
    #[arg(long, value_name = "CMD")]
    log_cmd: Option<String>,
    /// Process to watch (its exit is a crash before ready).
    #[arg(long)]
    pid: Option<i32>,
    /// Server kind (default: detected from the log).
    #[arg(long, value_name = "KIND")]
    server: Option<String>,
    /// Overall deadline.
    #[arg(long, default_value = "2h", value_parser = parse_duration)]
    timeout: std::time::Duration,
    /// Probe interval once the port may be open.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    interval: std::time::Duration,
    /// Probe timeout (default from the profile: SGLang 25s, others 5-10s).
    #[arg(long, value_parser = parse_duration)]
    probe_timeout: Option<std::time::Duration>,
    /// Environment variable holding the API key (sent as a bearer token, never printed).
    #[arg(long, value_name = "VAR")]
    api_key_env: Option<String>,
    /// Stall limit: DUR for every phase, or PHASE=DUR (repeatable).
    #[arg(long, value_name = "[PHASE=]DUR", value_parser = cli::parse_stall)]
    stall: Vec<cli::Stall>,
    #[arg(long)]
    json: bool,
    #[arg(long, short)]
    quiet: bool,
    /// Print each log line as it is read.
    #[arg(long)]
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
        w.stall = self.stall;
        w.json = self.json;
        w.quiet = self.quiet;
        w.echo = self.echo;
        Ok(w)
    }
}

#[derive(clap::Args, Clone)]
struct ProofFlags {
    /// Do not prove readiness with a real completion.
    #[arg(long)]
    no_generate: bool,
    /// Give up proving generation after this long (verdict unhealthy).
    #[arg(long, default_value = "120s", value_parser = parse_duration)]
    generate_timeout: std::time::Duration,
    /// Keep watching after ready (health and generation probes, the log, the process).
    #[arg(long)]
    watch: bool,
    /// Watch: probes failing this long give `unhealthy`.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    unhealthy_after: std::time::Duration,
    /// Watch: one generation probe this often.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    generate_every: std::time::Duration,
    /// Serve Prometheus metrics on PORT or HOST:PORT (loopback by default).
    #[arg(long, value_name = "ADDR", value_parser = metrics::parse_addr)]
    metrics: Option<std::net::SocketAddr>,
    /// Keep serving --metrics this long after a verdict that ends vigil (crashed, stalled, …) so it is scraped.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    metrics_linger: std::time::Duration,
    /// GPU sampling interval (NVML or nvidia-smi; off when neither exists).
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    gpu_interval: std::time::Duration,
    /// Health probe timeout while watching (default from the profile).
    #[arg(long = "watch-probe-timeout", value_parser = parse_duration)]
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
    #[arg(long)]
    name: Option<String>,
    /// Return at the verdict and leave the server running.
    #[arg(long)]
    detach: bool,
    /// On Ctrl-C, leave the server running.
    #[arg(long)]
    keep: bool,
    /// Stop an earlier run of the same name first.
    #[arg(long)]
    replace: bool,
    /// Extra environment for the server (KEY=VALUE, repeatable).
    #[arg(long = "env", value_name = "KEY=VALUE")]
    env: Vec<String>,
    #[arg(long, value_name = "FILE")]
    env_file: Option<PathBuf>,
    #[arg(long, value_name = "KIND")]
    server: Option<String>,
    /// Grace period between SIGTERM and SIGKILL when stopping.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    grace: std::time::Duration,
    #[arg(long, default_value = "2h", value_parser = parse_duration)]
    timeout: std::time::Duration,
    /// Stall limit: DUR for every phase, or PHASE=DUR (repeatable).
    #[arg(long, value_name = "[PHASE=]DUR", value_parser = cli::parse_stall)]
    stall: Vec<cli::Stall>,
    /// Rotate the run log at this size (bytes; suffixes k, m).
    #[arg(long, default_value = "64m", value_parser = parse_size)]
    log_max_size: u64,
    /// Skip the preflight check (vigil check) before launching.
    #[arg(long)]
    no_check: bool,
    /// Do not probe the health URL: the log alone proves readiness.
    #[arg(long)]
    no_probe: bool,
    /// Probe interval once the port may be open.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    interval: std::time::Duration,
    /// Rotated run logs kept (server.log.1 … .N).
    #[arg(long, default_value_t = 3)]
    log_keep: u32,
    #[arg(long)]
    json: bool,
    #[arg(long, short)]
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
    if !matches!(cli.cmd, Cmd::Diagnose { .. } | Cmd::Profiles | Cmd::Logs { .. }) {
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
            let rt = runtime()?;
            // `wait NAME`: a run of `vigil up`, read from its run directory
            if let Some(n) = &name {
                let (dir, rec) = run::load(n)?;
                w.attach_run(&dir, &rec, &profiles, true);
            }
            let out = rt.block_on(wait::run(w, profiles))?;
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
            runtime()?.block_on(up::up(f.into_args(cmd)?, profiles))
        }
        Cmd::Restart { name, up: f } => runtime()?.block_on(up::restart(&name, f.into_args(vec![])?, profiles)),
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
            Ok(runtime()?.block_on(wait::run(w, profiles))?.code)
        }
        Cmd::Probe { name, url, log, generate, timeout, server } => {
            runtime()?.block_on(kprobe::run(name, url, log, generate, timeout, server, &profiles))
        }
        Cmd::Check { json, server, cmd } => {
            check_server(&profiles, &server)?;
            interruptible(move || check::run(cmd, server, json, &profiles))
        }
        Cmd::Keeper { .. } => unreachable!("handled above"),
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
        Cmd::Check { json, server, cmd } => {
            check_server(&profiles, &server)?;
            rt.block_on(hosts::check(hs, cmd, server, json, profiles))
        }
        _ => Err(CliError::usage("--host/--hosts work with up, wait, status, logs, down, ps and check")),
    }
}
