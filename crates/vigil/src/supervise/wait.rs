//! `vigil wait` (and the watch of `vigil up`): attach to a server and reach a verdict.
//!
//! `start` checks the settings, starts the workers (log follower, `--log-cmd` readers, the pid watcher,
//! the process-tree and GPU sampler, NVML events, the engine's metrics page) and makes the machine
//! (`super::watch::Watch`), which decides everything. `drive` is the I/O loop: one `tokio::select!` turns
//! each completed future (a channel message, the one probe and the one generation in flight, a tick, an
//! interrupt) into a `watch::Input`; `Io` executes the machine's `Action`s in order (spawn a probe or a
//! generation, tell the sinks, save the evidence and apply the policy at a bad verdict, end).

pub use super::watch::Outcome;
use super::watch::{Action, Holder, Input, Parts, Say, Settings, Watch};
use crate::error::CliError;
use crate::exit::Exit;
use crate::node::ServerEnd;
use crate::sinks::events::WatchEvent;
use crate::sinks::metrics::Metrics;
use crate::sinks::notify::{Notifier, Notify};
use crate::sinks::report::Reporter;
use crate::sinks::sink::Sink;
use crate::sources::follow::{self, SourceMsg};
use crate::sources::probe::{self, ProbeResult, Target};
use crate::sources::proof::{self, Generation};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use vigil_core::limits::parse_stalls;
use vigil_core::proof::{Proof, ProofConfig};
use vigil_core::{Classifier, Judge, JudgeConfig, Phase, Profiles, Report, Verdict};

#[derive(Clone)]
pub struct Args {
    pub url: Option<String>,
    pub log: Option<String>,
    pub log_cmd: Option<String>,
    pub pid: Option<i32>,
    pub server: Option<String>,
    pub timeout: Duration,
    pub interval: Duration,
    pub probe_timeout: Option<Duration>,
    pub api_key_env: Option<String>,
    /// Trust for an `https://` URL (`--ca-cert`, `--insecure`).
    pub tls: crate::sources::tls::TlsOpts,
    pub stall: Vec<vigil_core::limits::Stall>,
    pub json: bool,
    pub quiet: bool,
    pub echo: bool,
    /// A run's state.json: the keeper records the server's exit status there (we are not its parent).
    pub exit_state: Option<PathBuf>,
    /// Values never to print (a run's secrets).
    pub secrets: Vec<String>,
    /// The server's command line, when known (speculation asked for? SGLang node rank?).
    pub argv: Vec<String>,
    /// Prove readiness with one real completion (default on).
    pub generate: bool,
    /// Give up proving generation after this long: `unhealthy`.
    pub generate_timeout: Duration,
    /// Keep watching after ready.
    pub watch: bool,
    /// Watch: probes failing this long → unhealthy.
    pub unhealthy_after: Duration,
    /// Watch: a generation probe this often.
    pub generate_every: Duration,
    /// `--listen` (or its alias `--metrics`): the listener, bound while the settings were resolved.
    pub listen: Option<std::sync::Arc<crate::sinks::listen::Settings>>,
    /// After a verdict that ends vigil (not ready), keep the listener serving this long so that the
    /// verdict is read (an interrupt cuts it short).
    pub metrics_linger: Duration,
    /// The run's name for the `run` label (a run of `vigil up`; else what is watched).
    pub run_name: Option<String>,
    /// Where every verdict vigil reaches for a run is recorded (`status` reads it).
    pub verdict_file: Option<PathBuf>,
    pub restarts: u64,
    /// GPU sampling interval (when a GPU reader and a pid exist).
    pub gpu_interval: Duration,
    /// A run on a remote host: its log and exit status come through the SSH connection.
    pub remote: Option<crate::node::remote::RemoteWatch>,
    /// One of several concurrent watches (fleet, multi-node): the host and rank it speaks for, and
    /// interrupts are seen without being taken (the driver takes them).
    pub tag: Option<(String, Option<usize>)>,
    /// Multi-node: phase changes go to the driver, which reports the least advanced rank.
    pub phase_tx: Option<mpsc::UnboundedSender<(usize, Phase)>>,
    /// Where interrupts come from (the process's signals; none in tests).
    pub interrupts: crate::signals::Interrupts,
    /// issue #17: what to do with a stuck server after its evidence is saved (None: keep).
    pub on_stall: Option<vigil_core::policy::OnStall>,
    /// Grace between SIGTERM and SIGKILL when `on_stall` stops the server.
    pub stop_grace: Duration,
    /// The repairs `up --repair` made before this attempt (issue #35), recorded with its startup.
    pub repairs: Vec<String>,
}

impl Args {
    pub fn new() -> Args {
        Args {
            url: None,
            log: None,
            log_cmd: None,
            pid: None,
            server: None,
            timeout: Duration::from_secs(7200),
            interval: Duration::from_secs(1),
            probe_timeout: None,
            api_key_env: None,
            tls: crate::sources::tls::TlsOpts::default(),
            stall: vec![],
            json: false,
            quiet: false,
            echo: false,
            exit_state: None,
            secrets: vec![],
            argv: vec![],
            generate: true,
            generate_timeout: Duration::from_secs(120),
            watch: false,
            unhealthy_after: Duration::from_secs(30),
            generate_every: Duration::from_secs(60),
            listen: None,
            metrics_linger: Duration::from_secs(30),
            run_name: None,
            verdict_file: None,
            restarts: 0,
            gpu_interval: Duration::from_secs(2),
            remote: None,
            tag: None,
            phase_tx: None,
            interrupts: crate::signals::Interrupts::default(),
            on_stall: None,
            stop_grace: Duration::from_secs(10),
            repairs: vec![],
        }
    }
}

impl Args {
    /// A log is followed: a file (or stdin), `--log-cmd`, or a remote run's stream.
    pub fn has_log(&self) -> bool {
        self.log.is_some() || self.log_cmd.is_some() || self.remote.is_some()
    }

    /// Takes what the node knows of a run (its handle): fields already set (from the command line) win;
    /// the exit-status and verdict files, the connection and the restarts are the run's.
    pub fn take(&mut self, h: crate::node::RunHandle) {
        self.log = self.log.take().or(h.log);
        self.pid = self.pid.or(h.pid);
        self.server = self.server.take().or(h.server);
        self.url = self.url.take().or(h.url);
        self.exit_state = h.exit_state.or(self.exit_state.take());
        self.verdict_file = h.verdict_file.or(self.verdict_file.take());
        self.run_name = self.run_name.take().or(h.name);
        self.secrets.extend(h.secrets);
        if self.argv.is_empty() {
            self.argv = h.argv;
        }
        self.restarts = h.restarts;
        self.remote = h.remote.or(self.remote.take());
        if h.no_generate {
            self.generate = false;
        }
    }
}

/// The watch's sinks besides the history recorder (which the machine owns) and the reporter (which the
/// evidence and the policy use too): the metrics, the run's verdict file, systemd. Every call goes to the
/// recorder first, then these in this order, then the reporter ([`Sinks::each`]).
struct Sinks {
    list: Vec<Box<dyn Sink>>,
}

impl Sinks {
    fn new(metrics: Option<Metrics>, verdict_file: Option<PathBuf>, notifier: Option<Notifier>) -> Sinks {
        let mut list: Vec<Box<dyn Sink>> = vec![];
        if let Some(m) = metrics {
            list.push(Box::new(m));
        }
        if let Some(p) = verdict_file {
            list.push(Box::new(crate::node::run::VerdictFile(p)));
        }
        if let Some(n) = notifier {
            list.push(Box::new(n));
        }
        Sinks { list }
    }

    /// Tells every sink, in order: the history recorder, the metrics, the verdict file, systemd, the reporter.
    fn each(
        &mut self,
        history: Option<&mut crate::sources::history::Recorder>,
        rep: &mut Reporter,
        mut f: impl FnMut(&mut dyn Sink),
    ) {
        if let Some(h) = history {
            f(h);
        }
        for s in &mut self.list {
            f(s.as_mut());
        }
        f(rep);
    }
}

async fn pending<T>(h: &mut Option<JoinHandle<T>>) -> Result<T, tokio::task::JoinError> {
    match h.as_mut() {
        Some(h) => h.await,
        None => std::future::pending().await,
    }
}

pub async fn run(a: Args, profiles: Profiles) -> Result<Outcome, CliError> {
    let mut metrics = None;
    let linger = a.metrics_linger;
    let shared = a.tag.is_some();
    let interrupts = a.interrupts;
    let out = match start(a, &profiles, &mut metrics) {
        Ok((w, io, sources)) => drive(w, io, sources).await,
        Err(e) => Err(e),
    }?;
    // A verdict that ends vigil stays scrapeable for a while: vigil exiting takes the endpoint with it.
    let ends_bad = out.report.as_ref().is_some_and(|r| r.verdict != Verdict::Ready);
    if let (Some(m), true, false) = (&metrics, ends_bad, out.interrupted) {
        if let Some(r) = &out.report {
            m.set_verdict(r.verdict);
        }
        if !linger.is_zero() {
            tokio::select! {
                _ = tokio::time::sleep(linger) => {}
                _ = interrupts.recv(shared) => {}
            }
        }
    }
    Ok(out)
}

/// The workers that feed the watch: the log, the exit, the process tree (GPU memory, compilers),
/// NVML events, the server's metrics page, and the tick.
struct Sources {
    lines: mpsc::Receiver<SourceMsg>,
    exit: mpsc::UnboundedReceiver<(ServerEnd, Option<u64>)>,
    busy: mpsc::UnboundedReceiver<String>,
    gpu: mpsc::UnboundedReceiver<crate::sources::gpu::Held>,
    gpu_events: mpsc::UnboundedReceiver<vigil_core::gpu_health::GpuEvent>,
    emetrics: mpsc::UnboundedReceiver<Option<vigil_core::engine_metrics::MetricsSample>>,
    tree: mpsc::UnboundedReceiver<vigil_core::TreeSample>,
    keeper: mpsc::UnboundedReceiver<String>,
    /// The kernel's OOM-kill counters of a local server (read again at its exit).
    oom: Option<crate::sources::oom::OomWatch>,
    tick: tokio::time::Interval,
    _log_child: Option<tokio::process::Child>,
}

impl Sources {
    /// Starts the workers the settings ask for; notes which GPU reader the tree sampler uses.
    fn start(
        a: &Args,
        target: &Option<Target>,
        engine_metrics: Option<vigil_core::profile::MetricsSpec>,
        probe_timeout: Duration,
        bearer: &Option<String>,
        compilers: Vec<String>,
        rep: &mut Reporter,
    ) -> Result<Sources, CliError> {
        // compiler processes in the tree count as progress (found by the tree sampler below)
        let (busy_tx, busy_rx) = mpsc::unbounded_channel::<String>();
        let compilers = (a.pid.is_some() && a.has_log()).then_some((compilers, busy_tx));
        // bounded: a source that reads faster than the watch judges waits for it
        let (tx, rx) = mpsc::channel::<SourceMsg>(follow::QUEUE);
        let mut log_child = None;
        if let Some(l) = &a.log {
            if l == "-" {
                tokio::spawn(follow::read_stream(tokio::io::stdin(), tx.clone()));
            } else {
                if std::fs::metadata(l).is_ok_and(|m| m.is_dir()) {
                    return Err(CliError::usage(format!("--log {l} is a directory: give the server's log file")));
                }
                tokio::spawn(follow::follow_file(PathBuf::from(l), tx.clone()));
            }
        }
        let (exit_tx, exit_rx) = mpsc::unbounded_channel::<(ServerEnd, Option<u64>)>();
        if let Some(w) = &a.remote {
            // the SSH stream comes at the network's pace; it is queued to the watch's bounded queue in order
            let (rtx, mut rrx) = mpsc::unbounded_channel::<SourceMsg>();
            tokio::spawn(crate::node::remote::follow_log(w.clone(), rtx));
            let tx = tx.clone();
            tokio::spawn(async move {
                while let Some(m) = rrx.recv().await {
                    if tx.send(m).await.is_err() {
                        return;
                    }
                }
            });
            tokio::spawn(crate::node::remote::wait_exit(w.clone(), exit_tx.clone()));
        }
        if let Some(cmd) = &a.log_cmd {
            log_child =
                Some(follow::spawn_log_cmd(cmd, tx.clone()).map_err(|e| CliError::usage(format!("--log-cmd: {e}")))?);
        }
        drop(tx);
        if let Some(pid) = a.pid {
            let state_path = a.exit_state.clone();
            let exit_tx = exit_tx.clone();
            tokio::spawn(async move {
                loop {
                    if !follow::pid_alive(pid) {
                        let _ = exit_tx.send((crate::node::local::recorded_end(state_path.as_deref()).await, None));
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            });
        }
        drop(exit_tx);

        // GPU samples of the server's process tree, as facts for the judge.
        let (gpu_tx, gpu_rx) = mpsc::unbounded_channel::<crate::sources::gpu::Held>();
        if let Some(w) = &a.remote {
            tokio::spawn(crate::node::remote::gpu_stream(w.clone(), a.gpu_interval, gpu_tx.clone()));
        }
        // The tree's GPU memory is read by the tree sampler below (one walk of the tree for every fact).
        let mut gpu_reader = None;
        if a.pid.is_some() {
            match crate::sources::gpu::Reader::open() {
                Ok(reader) => {
                    rep.note(0, &format!("GPU readings: {}", reader.name()));
                    gpu_reader = Some(reader);
                }
                Err(why) => rep.note(0, &why),
            }
        }
        // issue #17: engine progress from the server's own metrics while watching (probes are the fallback)
        let (emetrics_tx, emetrics_rx) = mpsc::unbounded_channel();
        if let (true, Some(t), Some(spec)) = (a.watch, target, engine_metrics) {
            crate::sources::engine_metrics::spawn(t, spec, probe_timeout, bearer.clone(), emetrics_tx);
        }
        // issue #17: Xid and uncorrectable ECC events from NVML, named by the verdict (local servers)
        let (gpu_ev_tx, gpu_ev_rx) = mpsc::unbounded_channel::<vigil_core::gpu_health::GpuEvent>();
        if a.pid.is_some() {
            crate::sources::gpu_health::watch_events(gpu_ev_tx);
        }
        // issue #17: the process tree as a fact (an engine process dying while the server lives).
        let (tree_tx, tree_rx) = mpsc::unbounded_channel::<vigil_core::TreeSample>();
        if let Some(pid) = a.pid {
            let gpu = gpu_reader.map(|r| (r, a.gpu_interval, gpu_tx.clone()));
            crate::sources::tree::spawn(
                pid,
                Duration::from_secs(1),
                crate::sources::tree::Extras { gpu, compilers },
                tree_tx,
            );
        }
        // a run of `vigil up` here: its keeper's death (the server living on, its output lost) is a fact
        let (keeper_tx, keeper_rx) = mpsc::unbounded_channel::<String>();
        if let (Some(dir), Some(pid), None) = (a.exit_state.as_deref().and_then(|p| p.parent()), a.pid, &a.remote) {
            crate::node::up::watch_keeper(dir.to_path_buf(), pid, keeper_tx);
        }
        // issue #33: blame on the OOM killer needs the kernel's record of the run
        let oom = a.pid.filter(|_| a.remote.is_none()).map(|pid| crate::sources::oom::OomWatch::start(pid as u32));
        let mut tick = tokio::time::interval(Duration::from_millis(25));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Ok(Sources {
            keeper: keeper_rx,
            lines: rx,
            exit: exit_rx,
            busy: busy_rx,
            gpu: gpu_rx,
            gpu_events: gpu_ev_rx,
            emetrics: emetrics_rx,
            tree: tree_rx,
            oom,
            tick,
            _log_child: log_child,
        })
    }
}

/// The loop: each future that completes becomes one `Input`; the machine's actions are executed in order.
async fn drive(mut w: Watch<'_>, mut io: Io, mut s: Sources) -> Result<Outcome, CliError> {
    loop {
        let input = tokio::select! {
            _ = io.a.interrupts.recv(io.a.tag.is_some()) => Input::Interrupt { sigterm: io.a.interrupts.was_sigterm() },
            m = s.lines.recv(), if w.lines_open() => m.map_or(Input::LogEnded, Input::Source),
            Some((end, log_bytes)) = s.exit.recv() => Input::Exit { end, log_bytes },
            r = pending(&mut io.probe_task) => {
                io.probe_task = None;
                let result = r.map_err(|e| CliError::Internal(format!("probe task: {e}")))?;
                let holder = io.holder(&w, &result);
                Input::Probe { result, holder }
            }
            Some(c) = s.busy.recv() => Input::Compiling(c),
            Some(h) = s.gpu.recv() => Input::Gpu(h),
            Some(g) = s.gpu_events.recv() => Input::GpuEvent(g),
            Some(m) = s.emetrics.recv() => Input::EngineMetrics(m),
            Some(t) = s.tree.recv() => Input::Tree(t),
            Some(line) = s.keeper.recv() => Input::KeeperDied(line),
            g = pending(&mut io.gen_task) => {
                io.gen_task = None;
                Input::Generated(g.map_err(|e| CliError::Internal(format!("generation task: {e}")))?)
            }
            // a remote exit tells the log size at that moment: it is judged once every byte of it is here
            _ = s.tick.tick() => Input::Tick {
                log_bytes: io.a.remote.as_ref().map(|r| r.bytes.load(std::sync::atomic::Ordering::SeqCst)),
            },
        };
        // the kernel's record goes to the judge before the exit it explains
        // (and before each sample of the process tree: an engine that vanishes is judged from the latest record)
        let oom = match (&input, &s.oom) {
            (Input::Exit { .. } | Input::Tree(_), Some(o)) => Some(Input::KernelOom(o.record())),
            _ => None,
        };
        for i in oom.into_iter().chain([input]) {
            for act in w.on(io.ms(), i) {
                if let Some(end) = io.act(&mut w, act).await {
                    return end;
                }
            }
        }
    }
}

/// What executes the machine's actions: the reporter, the sinks, the probe and generation tasks, the
/// evidence and the policy at a bad verdict.
struct Io {
    a: Args,
    t0: Instant,
    rep: Reporter,
    sinks: Sinks,
    target: Option<Target>,
    bearer: Option<String>,
    /// The port of the server's command line (the policy proves it free after a stop).
    cmd_port: Option<u16>,
    model_hint: Option<String>,
    probe_task: Option<JoinHandle<ProbeResult>>,
    gen_task: Option<JoinHandle<Generation>>,
}

impl Io {
    fn ms(&self) -> u64 {
        self.t0.elapsed().as_millis() as u64
    }

    /// A 200 from a process outside the server's tree (a squatter on the port) proves nothing.
    fn holder(&self, w: &Watch<'_>, r: &ProbeResult) -> Option<Holder> {
        if !w.asks_holder(r.outcome) {
            return None;
        }
        let (Some(pid), Some(t)) = (self.a.pid, &self.target) else { return None };
        foreign_holder(pid, t).map(|(holder, cmd)| Holder { port: t.port, pid: holder, cmd: self.rep.redact(&cmd) })
    }

    /// Tells every sink (`Sinks::each`), with the judge and the server kind.
    fn tell(&mut self, w: &mut Watch<'_>, mut f: impl FnMut(&mut dyn Sink, &Judge, Option<&str>)) {
        let (history, judge, server) = w.for_sinks();
        self.sinks.each(history, &mut self.rep, |s| f(s, judge, server));
    }

    /// Executes one action; `Some` when the watch ends.
    async fn act(&mut self, w: &mut Watch<'_>, act: Action) -> Option<Result<Outcome, CliError>> {
        let t = self.ms();
        match act {
            Action::Note(n) => self.tell(w, |s, _, _| s.note(t, &n)),
            Action::Typed(n, what) => self.tell(w, |s, _, _| s.typed(t, &n, &what)),
            Action::Echo(l) => self.tell(w, |s, _, _| s.echo(t, &l)),
            Action::Say(say) => self.say(w, t, &say),
            Action::Event(e) => self.tell(w, |s, _, _| s.event(t, &e)),
            Action::Notify(Notify::Stopping(why)) => self.tell(w, |s, _, _| s.stopping(&why)),
            Action::Notify(n) => self.tell(w, |s, _, _| s.notify(&n)),
            Action::Phase { rank, phase } => {
                if let Some(tx) = &self.a.phase_tx {
                    let _ = tx.send((rank, phase));
                }
            }
            Action::Probe { timeout } => {
                if let Some(t) = self.target.clone() {
                    let b = self.bearer.clone();
                    self.probe_task = Some(tokio::spawn(async move { probe::probe(&t, timeout, b.as_deref()).await }));
                }
            }
            Action::Generate { spec, timeout, tokens, read_spec } => {
                if let Some(t) = self.target.clone() {
                    let (b, hint) = (self.bearer.clone(), self.model_hint.clone());
                    self.gen_task = Some(tokio::spawn(async move {
                        proof::generate_with(&spec, &t, timeout, b.as_deref(), hint, tokens, read_spec).await
                    }));
                }
            }
            Action::CancelProbe => {
                if let Some(h) = self.probe_task.take() {
                    h.abort();
                }
            }
            Action::CancelGenerate => {
                if let Some(h) = self.gen_task.take() {
                    h.abort();
                }
            }
            Action::ProbeLatency(l) => self.tell(w, |s, _, _| s.probe_latency(l)),
            Action::Live { probe } => self.tell(w, |s, j, server| s.live(t, j, server, probe.as_deref())),
            Action::Metrics(v) => self.tell(w, |s, j, server| s.gauges(j, server, v)),
            Action::Verdict(r) => self.tell(w, |s, _, _| s.verdict(t, &r)),
            Action::VerdictFile(r) => self.tell(w, |s, _, _| s.stopped(&r)),
            Action::Conclude(r) => return Some(Ok(self.conclude(w, *r).await)),
            Action::End(o) => return Some(Ok(*o)),
            Action::Unreachable(why) => return Some(Err(CliError::Unreachable(why))),
        }
        None
    }

    fn say(&mut self, w: &mut Watch<'_>, t: u64, s: &Say) {
        let ev = match s {
            Say::Detected { server } => WatchEvent::Detected { server, line: None },
            Say::Probe { outcome, status, latency_ms, note } => {
                WatchEvent::Probe { outcome: *outcome, status: *status, latency_ms: *latency_ms, note }
            }
            Say::Gpu(h) => WatchEvent::Gpu { held_mib: h.total_mib, per_gpu_mib: &h.per_gpu, host_pids: h.host_pids },
            Say::Generation(g) => WatchEvent::Generation(g),
            Say::Disconnected => WatchEvent::Disconnected,
            Say::Reconnected { to, down_ms, log_offset } => {
                WatchEvent::Reconnected { to, down_ms: *down_ms, log_offset: *log_offset }
            }
            Say::Stopped { how, exit_code, signal, requested } => {
                WatchEvent::Stopped { how, exit_code: *exit_code, signal: *signal, requested: *requested }
            }
        };
        self.tell(w, |s, _, _| s.emit(Some(t), &ev));
    }

    /// A verdict that ends the watch (not ready): where every process of a stuck server is (issue #17),
    /// the `--on-stall` policy, then the verdict is recorded and told.
    async fn conclude(&mut self, w: &mut Watch<'_>, mut r: Report) -> Outcome {
        let t0 = self.t0;
        let ms = move || t0.elapsed().as_millis() as u64;
        let a = &self.a;
        let run_dir = a.exit_state.as_deref().and_then(|p| p.parent());
        crate::supervise::evidence::at_verdict(
            &mut self.rep,
            ms(),
            &mut r,
            a.pid,
            run_dir,
            &a.secrets,
            a.remote.as_ref(),
        )
        .await;
        let port = self
            .target
            .as_ref()
            .filter(|t| t.host == "localhost" || t.host.starts_with("127."))
            .map(|t| t.port)
            .or(self.cmd_port);
        match (a.pid, a.remote.as_ref()) {
            (None, Some(rw)) => crate::supervise::policy::on_verdict_remote(&mut self.rep, ms(), &mut r, a, rw).await,
            _ => crate::supervise::policy::on_verdict(&mut self.rep, ms(), &mut r, a, port).await,
        }
        self.tell(w, |s, j, server| s.gauges(j, server, r.verdict));
        let t = ms();
        self.tell(w, |s, _, _| s.verdict(t, &r));
        Outcome::verdict(Exit::for_verdict(r.verdict), r)
    }
}

/// Checks the settings, starts the sources and the sinks, and makes the machine.
fn start<'p>(
    mut a: Args,
    profiles: &'p Profiles,
    metrics_out: &mut Option<Metrics>,
) -> Result<(Watch<'p>, Io, Sources), CliError> {
    let t0 = Instant::now();
    let mut rep = Reporter::new(a.json, a.quiet);
    if let Some((h, r)) = &a.tag {
        rep.tagged(h, *r);
    }
    for s in &a.secrets {
        rep.add_secret(s);
    }
    let bearer = match &a.api_key_env {
        Some(var) => {
            let v =
                std::env::var(var).map_err(|_| CliError::usage(format!("--api-key-env: variable {var} is not set")))?;
            if v.is_empty() {
                return Err(CliError::usage(format!("--api-key-env: variable {var} is empty")));
            }
            rep.add_secret(&v);
            Some(v)
        }
        None => None,
    };

    let has_log = a.has_log();
    // The command line of --pid names the server kind, its port, and (SGLang) its node rank.
    if a.argv.is_empty() {
        a.argv = a.pid.and_then(follow::cmdline).unwrap_or_default();
    }
    let argv = a.argv.clone();
    // A server started with --api-key needs it for the generation proof (sent as a bearer, never printed).
    let bearer = bearer.or_else(|| follow::arg_value(&argv, "--api-key").map(String::from));
    if let Some(b) = &bearer {
        rep.add_secret(b);
    }
    let server_name = a.server.clone().or_else(|| profiles.detect_cmd(&argv).map(String::from));
    let forced = server_name.as_ref().and_then(|s| profiles.get(s)).cloned();
    // Some nodes serve a dummy /health that is always 200 (SGLang's --node-rank >= 1): never proof of readiness.
    let dummy_health = forced.as_ref().is_some_and(|p| p.cmd.dummy_health(&argv));
    let cmd_port = follow::arg_value(&argv, "--port").and_then(|p| p.parse::<u16>().ok());
    let target = match (&a.url, &forced) {
        (Some(u), _) => Some(Target::parse_with(u, &a.tls).map_err(CliError::usage)?),
        (None, Some(p)) if !has_log => Some(
            Target::parse(&format!("http://127.0.0.1:{}{}", cmd_port.unwrap_or(p.port), p.health_path))
                .map_err(CliError::usage)?,
        ),
        _ => None,
    };
    if a.tls.is_set() && !target.as_ref().is_some_and(Target::is_https) {
        return Err(CliError::usage("--ca-cert and --insecure apply to an https:// --url only"));
    }
    if target.is_none() && !has_log && a.pid.is_none() {
        return Err(CliError::usage("wait: nothing to watch: give --url, --log, --log-cmd, --pid or --server"));
    }
    if let Some(pid) = a.pid {
        // A process that already ended is fine when its log can still tell what happened.
        if pid <= 0 || (!has_log && !follow::pid_alive(pid)) {
            return Err(CliError::usage(format!("--pid {pid}: no such live process")));
        }
    }
    let generate = a.generate && target.is_some() && !dummy_health;
    let (stall_all, stall_per) = parse_stalls(&a.stall);
    let stall_phases: std::collections::BTreeSet<Phase> = stall_per.iter().map(|(p, _)| *p).collect();
    let mut cfg = JudgeConfig {
        live: true,
        require_probe: target.is_some(),
        stall_enabled: has_log,
        stall_default_ms: stall_all,
        timeout_ms: Some(a.timeout.as_millis() as u64),
        unhealthy_after_ms: a.watch.then_some(a.unhealthy_after.as_millis() as u64),
        metrics_window_ms: a.watch.then_some(a.unhealthy_after.as_millis() as u64),
        ..JudgeConfig::default()
    };
    if let Some(p) = &forced {
        for ph in Phase::ALL {
            if let Some(s) = p.stall_secs.get(&ph) {
                cfg.stall_ms.insert(ph, s * 1000);
            }
        }
    }
    for (p, v) in stall_per {
        cfg.stall_ms.insert(p, v);
    }
    let mut judge = Judge::new(cfg);
    let classifier = Classifier::new(profiles, server_name.as_deref());
    let server: Option<String> = forced.as_ref().map(|p| p.name.clone());
    if let Some(s) = &server {
        judge.set_server(s);
    }
    let probe_timeout = a
        .probe_timeout
        .unwrap_or_else(|| Duration::from_secs_f64(forced.as_ref().map_or(5.0, |p| p.probe_timeout_secs)));

    let notifier = Notifier::from_env();
    let run_name = a
        .run_name
        .clone()
        .or_else(|| a.tag.as_ref().map(|t| t.0.clone()))
        .or_else(|| a.log.as_ref().filter(|l| *l != "-").cloned())
        .or_else(|| target.as_ref().map(|t| format!("{}:{}", t.host, t.port)))
        .or_else(|| a.pid.map(|p| format!("pid {p}")))
        .unwrap_or_else(|| "wait".into());
    let metrics = match &a.listen {
        Some(l) => {
            // `up` started it before the launch; `wait` and `watch` start it here (once per process)
            if let Some(url) = crate::sinks::listen::start(l, crate::sources::history::hostname())? {
                rep.note(0, &format!("listening on {url} (/startupz /readyz /livez /status /events /metrics)"));
            }
            let m = Metrics::new(&run_name, server_name_for_metrics(&forced), a.restarts);
            crate::sinks::listen::set_metrics(&m);
            *metrics_out = Some(m.clone());
            Some(m)
        }
        None => None,
    };
    // Startup history (docs/history.md): the judge learns usual durations, and the verdict is recorded.
    let remote_host = a.remote.as_ref().map(|w| w.conn.dest.clone());
    let mut history = crate::sources::history::Recorder::new(crate::sources::history::Setup {
        profiles,
        server: server.as_deref(),
        argv: &argv,
        pid: a.pid,
        name: &run_name,
        remote_host: remote_host.as_deref(),
        stall_phases,
        stall_all: stall_all.is_some(),
        repairs: a.repairs.clone(),
    });
    history.apply(&mut judge);
    for n in std::mem::take(&mut history.notes) {
        rep.note(0, &n);
    }
    let sinks = Sinks::new(metrics.clone(), a.verdict_file.clone(), notifier);
    let engine_metrics = forced.as_ref().and_then(|p| p.metrics.clone());
    let sources = Sources::start(&a, &target, engine_metrics, probe_timeout, &bearer, history.compilers(), &mut rep)?;
    let tree_watch = vigil_core::TreeWatch::new(forced.as_ref().map(|p| p.engine_titles.clone()).unwrap_or_default());

    if let (true, Some(p)) = (dummy_health, &forced) {
        let flag = p.cmd.dummy_health_flag.as_deref().unwrap_or_default();
        let v = follow::arg_value(&argv, flag).unwrap_or_default();
        rep.note(
            0,
            &format!(
                "{} {flag} {v}: its /health is a dummy that always answers 200; readiness comes from the log only",
                p.name
            ),
        );
    }
    rep.emit(
        Some(0),
        &WatchEvent::Start {
            url: target.as_ref().map(Target::url),
            log: a.log.as_deref(),
            pid: a.pid,
            server: server.as_deref(),
            remote_run: a.remote.as_ref().map(|w| w.name.as_str()),
        },
    );

    let mut proof_cfg = ProofConfig {
        generate,
        timeout_ms: a.generate_timeout.as_millis() as u64,
        deadline_ms: Some(a.timeout.as_millis() as u64),
        retry_ms: 1000,
        watch: a.watch,
        ..ProofConfig::default()
    };
    proof_cfg.set_speculation(profiles, server.as_deref(), &argv);
    let set = Settings::new(&a, target.is_some(), dummy_health);
    let parts = Parts {
        profiles,
        judge,
        classifier,
        proof: Proof::new(proof_cfg),
        tree: tree_watch,
        history: Some(history),
        server,
        probe_timeout,
    };
    let io = Io {
        model_hint: proof::model_hint(&argv),
        a,
        t0,
        rep,
        sinks,
        target,
        bearer,
        cmd_port,
        probe_task: None,
        gen_task: None,
    };
    Ok((Watch::new(set, parts), io, sources))
}

fn server_name_for_metrics(p: &Option<vigil_core::profile::Profile>) -> Option<&str> {
    p.as_ref().map(|p| p.name.as_str())
}

/// The process listening on a loopback target's port, when it is not `pid` or one of its descendants.
/// Not asked of `https://` targets: a TLS endpoint is usually a terminating proxy in front of the server
/// (stunnel, nginx), another process by design; the certificate check stands in for this one.
fn foreign_holder(pid: i32, t: &Target) -> Option<(i32, String)> {
    let loopback = t.host == "localhost" || t.host == "::1" || t.host.starts_with("127.");
    if !loopback || t.is_https() {
        return None;
    }
    // Cheap first: is the listening socket one of the tree's own file descriptors?
    let inodes = crate::sources::procs::port_inodes(t.port);
    if inodes.is_empty() {
        return None;
    }
    let ours = |p: &i32| crate::sources::procs::socket_inodes(*p).iter().any(|i| inodes.contains(i));
    if ours(&pid) {
        return None; // the usual case: the server itself listens
    }
    let mut tree = vec![pid];
    tree.extend(crate::sources::procs::descendants(pid));
    if tree.iter().any(ours) {
        return None;
    }
    // Not ours: name the holder (a scan of every process this user can see).
    let (holder, cmd) = crate::sources::procs::port_holder(t.port)?;
    (!tree.contains(&holder)).then_some((holder, cmd))
}
