//! `vigil wait` (and the watch of `vigil up`): attach to a server and reach a verdict.
//!
//! One `tokio::select!` loop owns all state (classifier, judge, probe schedule, stage); workers (log
//! follower, `--log-cmd` readers, the pid watcher, one probe and one generation at a time) talk to it
//! over channels or join handles. Stages: starting (the judge decides) → proving (one real
//! completion, and speculation when asked for) → ready; with `--watch`, then watching (health and
//! generation probes, the log, the process) until crashed, unhealthy or interrupted.

use crate::error::CliError;
use crate::events::WatchEvent;
use crate::exit;
use crate::follow::{self, SourceMsg};
use crate::metrics::Metrics;
use crate::node::ServerEnd;
use crate::notify::Notifier;
use crate::probe::{self, ProbeResult, Target};
use crate::proof::{self, Generation};
use crate::report::Reporter;
use crate::settings::parse_stalls;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use vigil_core::proof::{Proof, ProofConfig, Step};
use vigil_core::{Classifier, Event, Fact, Input, Judge, JudgeConfig, Phase, ProbeOutcome, Profiles, Report, Verdict};

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
    pub tls: crate::tls::TlsOpts,
    pub stall: Vec<crate::cli::Stall>,
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
    pub metrics: Option<std::net::SocketAddr>,
    /// The `--metrics` listener when `up` bound it before launching.
    pub metrics_listener: Option<std::sync::Arc<std::net::TcpListener>>,
    /// After a verdict that ends vigil (not ready), keep `--metrics` served this long so that the
    /// verdict is scraped (an interrupt cuts it short).
    pub metrics_linger: Duration,
    /// The run's name for the `run` label (a run of `vigil up`; else what is watched).
    pub run_name: Option<String>,
    /// Where every verdict vigil reaches for a run is recorded (`status` reads it).
    pub verdict_file: Option<PathBuf>,
    pub restarts: u64,
    /// GPU sampling interval (when a GPU reader and a pid exist).
    pub gpu_interval: Duration,
    /// A run on a remote host: its log and exit status come through the SSH connection.
    pub remote: Option<crate::remote::RemoteWatch>,
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
            tls: crate::tls::TlsOpts::default(),
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
            metrics: None,
            metrics_listener: None,
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
        }
    }
}

impl Args {
    /// Fills in what a run of `vigil up` knows: its log, server pid, kind, health URL (the generic
    /// profile's path for an unknown kind), exit-status file, secrets and command line. Fields already
    /// set (from the command line) win.
    pub fn attach_run(&mut self, dir: &std::path::Path, rec: &crate::run::RunRecord, profiles: &Profiles, probe: bool) {
        use crate::run;
        let st: run::State = run::read_json(&dir.join("state.json")).unwrap_or_default();
        self.log = self.log.take().or_else(|| Some(rec.log.clone()));
        self.pid = self.pid.or(st.server_pid);
        self.server = self.server.take().or_else(|| rec.server.clone());
        if self.url.is_none() && probe {
            let profile = rec.server.as_ref().and_then(|k| profiles.get(k)).or_else(|| profiles.get("generic"));
            if let (Some(p), Some(pr)) = (rec.port, profile) {
                self.url = Some(format!("http://127.0.0.1:{p}{}", pr.health_path));
            }
        }
        self.exit_state = Some(dir.join("state.json"));
        self.verdict_file = Some(dir.join("verdict.json"));
        self.run_name = self.run_name.take().or_else(|| Some(rec.name.clone()));
        let secrets: run::Secrets = run::stored_secrets(&rec.name, None);
        self.secrets.extend(run::secret_values(&secrets));
        if self.argv.is_empty() {
            self.argv = run::unredact(rec, &secrets).0;
        }
        self.restarts = run::restarts(dir);
    }
}

/// How `wait` ended: the exit code and, when a verdict was reached, its report.
pub struct Outcome {
    pub code: i32,
    pub report: Option<Report>,
    /// Ended by SIGINT/SIGTERM (the caller stops what it launched).
    pub interrupted: bool,
}

impl Outcome {
    fn verdict(code: i32, r: Report) -> Outcome {
        Outcome { code, report: Some(r), interrupted: false }
    }
}

/// Where a verdict goes besides the reporter: systemd, the metrics, the run's record.
struct Sinks {
    notifier: Option<Notifier>,
    metrics: Option<Metrics>,
    verdict_file: Option<PathBuf>,
    history: Option<crate::history::Recorder>,
}

impl Sinks {
    fn verdict(&mut self, r: &Report) {
        if let Some(h) = &mut self.history {
            h.finish(r);
        }
        if let Some(m) = &self.metrics {
            m.set_verdict(r.verdict);
        }
        if let Some(p) = &self.verdict_file {
            let _ = crate::run::write_json(p, r);
        }
        if let Some(n) = &self.notifier {
            if r.verdict == Verdict::Ready {
                n.ready(&format!(
                    "ready{}",
                    r.degraded.as_ref().map(|d| format!(" (degraded: {d})")).unwrap_or_default()
                ));
            } else {
                let cause = r.cause.map(|c| format!(" ({c})")).unwrap_or_default();
                n.status(&format!("{}{cause} in {}", r.verdict, r.phase));
            }
        }
    }

    /// The watch ends in order (a stop was asked for, or the server exited with status 0 after ready).
    fn stopping(&self, why: &str) {
        if let Some(n) = &self.notifier {
            n.send(&format!("STOPPING=1\nSTATUS=stopping: {}", why.replace('\n', " ")));
        }
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
    let out = run_inner(a, profiles, &mut metrics).await?;
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

async fn run_inner(mut a: Args, profiles: Profiles, metrics_out: &mut Option<Metrics>) -> Result<Outcome, CliError> {
    let t0 = Instant::now();
    let ms = move || t0.elapsed().as_millis() as u64;
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

    let has_log = a.log.is_some() || a.log_cmd.is_some() || a.remote.is_some();
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
    let mut classifier = Classifier::new(&profiles, server_name.as_deref());
    let mut server: Option<String> = forced.as_ref().map(|p| p.name.clone());
    if let Some(s) = &server {
        judge.set_server(s);
    }
    let mut probe_timeout = a
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
    let metrics = match a.metrics {
        Some(addr) => {
            let m = Metrics::new(&run_name, server_name_for_metrics(&forced), a.restarts);
            let l = match &a.metrics_listener {
                Some(l) => l.clone(),
                None => crate::metrics::bind(addr)?,
            };
            let local = m.clone().serve(&l).map_err(|e| CliError::usage(format!("--metrics {addr}: {e}")))?;
            rep.note(0, &format!("metrics on http://{local}/metrics"));
            *metrics_out = Some(m.clone());
            Some(m)
        }
        None => None,
    };
    // Startup history (docs/history.md): the judge learns usual durations, and the verdict is recorded.
    let remote_host = a.remote.as_ref().map(|w| w.conn.dest.clone());
    let mut history = crate::history::Recorder::new(crate::history::Setup {
        profiles: &profiles,
        server: server.as_deref(),
        argv: &argv,
        pid: a.pid,
        name: &run_name,
        remote_host: remote_host.as_deref(),
        stall_phases,
        stall_all: stall_all.is_some(),
    });
    history.apply(&mut judge);
    for n in std::mem::take(&mut history.notes) {
        rep.note(0, &n);
    }
    // compiler processes in the tree count as progress (found by the tree sampler below)
    let (busy_tx, mut busy_rx) = mpsc::unbounded_channel::<String>();
    let compilers = (a.pid.is_some() && has_log).then(|| (history.compilers(), busy_tx));
    let mut sinks =
        Sinks { notifier, metrics: metrics.clone(), verdict_file: a.verdict_file.clone(), history: Some(history) };

    // Sources.
    let (tx, mut rx) = mpsc::unbounded_channel::<SourceMsg>();
    let mut _log_child = None;
    if let Some(l) = &a.log {
        if l == "-" {
            tokio::spawn(follow::read_stream(tokio::io::stdin(), tx.clone()));
        } else {
            tokio::spawn(follow::follow_file(PathBuf::from(l), tx.clone()));
        }
    }
    let (exit_tx, mut exit_rx) = mpsc::unbounded_channel::<(ServerEnd, Option<u64>)>();
    if let Some(w) = &a.remote {
        tokio::spawn(crate::remote::follow_log(w.clone(), tx.clone()));
        tokio::spawn(crate::remote::wait_exit(w.clone(), exit_tx.clone()));
    }
    if let Some(cmd) = &a.log_cmd {
        _log_child =
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
    let (gpu_tx, mut gpu_rx) = mpsc::unbounded_channel::<crate::gpu::Held>();
    if let Some(w) = &a.remote {
        tokio::spawn(crate::remote::gpu_stream(w.clone(), a.gpu_interval, gpu_tx.clone()));
    }
    // The tree's GPU memory is read by the tree sampler below (one walk of the tree for every fact).
    let mut gpu_reader = None;
    if a.pid.is_some() {
        match crate::gpu::Reader::open() {
            Ok(reader) => {
                rep.note(0, &format!("GPU readings: {}", reader.name()));
                gpu_reader = Some(reader);
            }
            Err(why) => rep.note(0, &why),
        }
    }
    let mut last_gpu: Option<crate::gpu::Held> = None;
    // issue #17: engine progress from the server's own metrics while watching (probes are the fallback)
    let (emetrics_tx, mut emetrics_rx) = mpsc::unbounded_channel();
    if let (true, Some(t), Some(spec)) = (a.watch, &target, forced.as_ref().and_then(|p| p.metrics.clone())) {
        crate::engine_metrics::spawn(t, spec, probe_timeout, bearer.clone(), emetrics_tx);
    }
    let (mut emetrics_live, mut emetrics_last) = (false, None);
    // issue #17: Xid and uncorrectable ECC events from NVML, named by the verdict (local servers)
    let (gpu_ev_tx, mut gpu_ev_rx) = mpsc::unbounded_channel::<vigil_core::gpu_health::GpuEvent>();
    if a.pid.is_some() {
        crate::gpu_health::watch_events(gpu_ev_tx);
    }
    // issue #17: the process tree as a fact (an engine process dying while the server lives).
    let (tree_tx, mut tree_rx) = mpsc::unbounded_channel::<vigil_core::TreeSample>();
    let mut tree_watch =
        vigil_core::TreeWatch::new(forced.as_ref().map(|p| p.engine_titles.clone()).unwrap_or_default());
    if let Some(pid) = a.pid {
        let gpu = gpu_reader.map(|r| (r, a.gpu_interval, gpu_tx.clone()));
        crate::tree::spawn(pid, Duration::from_secs(1), crate::tree::Extras { gpu, compilers }, tree_tx);
    }

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

    let rare = a.interval.max(Duration::from_secs(5));
    let mut next_probe = Instant::now();
    let mut probe_asap = false;
    let mut log_says_up = false;
    let mut probe_task: Option<JoinHandle<ProbeResult>> = None;
    let mut gen_task: Option<JoinHandle<Generation>> = None;
    let mut next_gen = Instant::now();
    let mut last_probe: Option<(ProbeOutcome, String)> = None;
    let mut cert_noted = false;
    let mut lines_open = has_log;
    let mut squatter_noted = false;
    let mut proof_cfg = ProofConfig {
        generate,
        timeout_ms: a.generate_timeout.as_millis() as u64,
        retry_ms: 1000,
        watch: a.watch,
        ..ProofConfig::default()
    };
    proof_cfg.set_speculation(&profiles, server.as_deref(), &argv);
    let mut proof = Proof::new(proof_cfg);
    // An exit is judged only once the log has caught up (quiet for EXIT_DRAIN, at most EXIT_DRAIN_MAX):
    // the last lines a dying server writes hold the cause.
    const EXIT_DRAIN: Duration = Duration::from_millis(150);
    const EXIT_DRAIN_MAX: Duration = Duration::from_secs(2);
    let mut pending_exit: Option<(ServerEnd, Instant, Instant, Option<u64>)> = None;
    // The SSH connection is down: probes say nothing about the server then, and pause.
    let mut link_down = false;
    let mut tick = tokio::time::interval(Duration::from_millis(25));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);

    loop {
        let mut events: Vec<Event> = Vec::new();
        let mut gen_done: Option<Generation> = None;
        let mut exit_now: Option<ServerEnd> = None;
        tokio::select! {
            _ = a.interrupts.recv(a.tag.is_some()) => {
                if proof.watching() {
                    // After ready, SIGTERM is an orderly stop (systemctl stop, docker stop): exit 0.
                    let term = a.interrupts.was_sigterm();
                    rep.note(ms(), if term { "SIGTERM while watching: stopping in order" } else { "interrupted while watching" });
                    sinks.stopping(if term { "SIGTERM" } else { "interrupted" });
                    let code = if term { exit::READY } else { exit::INTERRUPTED };
                    return Ok(Outcome { code, report: judge.report().cloned(), interrupted: true });
                }
                rep.note(ms(), "interrupted before a verdict");
                if let Some(n) = &sinks.notifier {
                    n.status("interrupted before a verdict");
                }
                return Ok(Outcome { code: exit::INTERRUPTED, report: judge.report().cloned(), interrupted: true });
            }
            m = rx.recv(), if lines_open => match m {
                Some(SourceMsg::Line(raw)) => {
                    if let Some(p) = &mut pending_exit {
                        p.1 = Instant::now();
                    }
                    if a.echo {
                        rep.echo(ms(), &raw);
                    }
                    if raw.trim().is_empty() {
                        continue;
                    }
                    let line = classifier.classify(&raw);
                    if server.is_none() {
                        if let Some(k) = classifier.kind() {
                            server = Some(k.name.clone());
                            judge.set_server(&k.name);
                            proof.config_mut().set_speculation(&profiles, Some(&k.name), &argv);
                            if a.probe_timeout.is_none() {
                                probe_timeout = Duration::from_secs_f64(k.probe_timeout_secs);
                            }
                            rep.emit(Some(ms()), &WatchEvent::Detected { server: &k.name, line: None });
                            if let Some(h) = &mut sinks.history {
                                h.detected(&profiles, &k.name);
                            }
                        }
                    }
                    if let Some(h) = &mut sinks.history {
                        h.line(&raw, &mut judge);
                        for n in std::mem::take(&mut h.notes) {
                            rep.note(ms(), &n);
                        }
                    }
                    // the server's own speculation counts (vLLM's periodic log line), a fact for the proof
                    proof.line(&line.message);
                    events = judge.feed(Fact { at: Some(ms()), input: Input::Line(Box::new(line)) });
                }
                Some(SourceMsg::Note(n)) => rep.note(ms(), &n),
                Some(SourceMsg::Disconnected) => {
                    // in-flight probes went through the dead connection; none start until it is back
                    let was_down = std::mem::replace(&mut link_down, true);
                    if let Some(h) = probe_task.take() {
                        h.abort();
                    }
                    if let Some(h) = gen_task.take() {
                        h.abort();
                    }
                    if !was_down {
                        rep.emit(Some(ms()), &WatchEvent::Disconnected);
                    }
                }
                Some(SourceMsg::Resumed) => link_down = false,
                Some(SourceMsg::Reconnected { host, down_ms, offset }) => {
                    // probes resume on their schedule: a drop changes nothing the server does
                    link_down = false;
                    rep.emit(Some(ms()), &WatchEvent::Reconnected { to: &host, down_ms, log_offset: offset });
                }
                Some(SourceMsg::Lost(why)) => {
                    return Err(CliError::Unreachable(why));
                }
                None => {
                    lines_open = false;
                    rep.note(ms(), "the log source ended");
                    events = judge.feed(Fact { at: Some(ms()), input: Input::Eof });
                }
            },
            Some((x, need)) = exit_rx.recv() => {
                if has_log && lines_open {
                    let now = Instant::now();
                    pending_exit = Some((x, now, now, need));
                } else {
                    exit_now = Some(x);
                }
            }
            r = pending(&mut probe_task) => {
                probe_task = None;
                let r = r.map_err(|e| CliError::Internal(format!("probe task: {e}")))?;
                let key = (r.outcome, r.note.clone());
                if last_probe.as_ref() != Some(&key) {
                    let latency_ms = r.latency.as_millis() as u64;
                    rep.emit(Some(ms()), &WatchEvent::Probe { outcome: r.outcome, status: r.status, latency_ms, note: &r.note });
                    last_probe = Some(key);
                }
                if r.cert_error && !cert_noted {
                    // Said once, whatever the output mode: retrying will not fix it unless the server's
                    // certificate changes (an ingress serving a placeholder until its secret loads does).
                    rep.note(ms(), &format!("health probe: {}", r.note));
                    cert_noted = true;
                }
                if let Some(m) = &metrics {
                    m.probe_latency(r.latency.as_secs_f64());
                }
                // A 200 from a process outside the server's tree (a squatter on the port) proves nothing:
                // asked only before ready, where it matters and the scan is affordable.
                let mut foreign = None;
                if r.outcome == ProbeOutcome::Ok && !dummy_health && !proof.watching() {
                    if let (Some(pid), Some(t)) = (a.pid, &target) {
                        foreign = foreign_holder(pid, t).map(|h| (t.port, h));
                    }
                }
                if let Some((port, h)) = &foreign {
                    if !squatter_noted {
                        rep.note(ms(), &format!("port {port} answers, but it is held by pid {} ({}), not the server's process tree: not ready", h.0, rep.redact(&h.1)));
                        squatter_noted = true;
                    }
                }
                let outcome = vigil_core::proof::health_fact(r.outcome, dummy_health, foreign.is_some());
                if outcome == ProbeOutcome::Ok && proof.watching() {
                    if let Some(n) = &mut sinks.notifier {
                        n.healthy();
                    }
                }
                events = judge.feed(Fact { at: Some(ms()), input: Input::Probe(outcome) });
                let every = if !has_log || log_says_up { a.interval } else { rare };
                next_probe = Instant::now() + every;
            }
            Some(c) = busy_rx.recv() => {
                events = judge.feed(Fact { at: Some(ms()), input: Input::Compiling(c) });
            }
            Some(h) = gpu_rx.recv() => {
                if last_gpu.as_ref() != Some(&h) {
                    if h.host_pids && last_gpu.as_ref().is_none_or(|l| !l.host_pids) {
                        rep.note(ms(), "NVML reports pids of another pid namespace (a container?): using per-GPU totals");
                    }
                    rep.emit(Some(ms()), &WatchEvent::Gpu { held_mib: h.total_mib, per_gpu_mib: &h.per_gpu, host_pids: h.host_pids });
                }
                let fact = vigil_core::GpuFact { total_mib: h.total_mib, describe: crate::gpu::describe(&h.per_gpu) };
                last_gpu = Some(h);
                events = judge.feed(Fact { at: Some(ms()), input: Input::Gpu(fact) });
            }
            Some(g) = gpu_ev_rx.recv() => {
                // the server's GPUs: those its tree holds memory on (all, before a reading)
                let ours = last_gpu.as_ref().is_none_or(|h| h.per_gpu.is_empty() || h.per_gpu.contains_key(&g.gpu));
                if ours {
                    events = judge.feed(Fact { at: Some(ms()), input: Input::GpuEvent(g) });
                }
            }
            Some(m) = emetrics_rx.recv() => {
                emetrics_live = m.is_some();
                if let Some(s) = m {
                    if emetrics_last.as_ref() != Some(&s) {
                        emetrics_last = Some(s.clone());
                        events.push(Event::EngineMetrics(s.clone()));
                    }
                    events.extend(judge.feed(Fact { at: Some(ms()), input: Input::Metrics(s) }));
                }
            }
            Some(s) = tree_rx.recv() => {
                if let Some(p) = server.as_deref().and_then(|k| profiles.get(k)) {
                    tree_watch.set_titles(&p.engine_titles);
                }
                for d in tree_watch.observe(ms(), &s) {
                    events.extend(judge.feed(Fact { at: Some(ms()), input: Input::EngineDied(d) }));
                }
                events.extend(tree_watch.new_engines().into_iter().map(Event::Engine));
            }
            g = pending(&mut gen_task) => {
                gen_task = None;
                gen_done = Some(g.map_err(|e| CliError::Internal(format!("generation task: {e}")))?);
            }
            _ = tick.tick() => {
                // A remote exit tells the log size at that moment: judge once every byte of it is here.
                let got = a.remote.as_ref().map(|w| w.bytes.load(std::sync::atomic::Ordering::SeqCst));
                let drained = pending_exit.as_ref().is_some_and(|(_, last, first, need)| match (need, got) {
                    (Some(n), Some(g)) => g >= *n || first.elapsed() >= EXIT_DRAIN_MAX * 3 || !lines_open,
                    _ => last.elapsed() >= EXIT_DRAIN || first.elapsed() >= EXIT_DRAIN_MAX || !lines_open,
                });
                events = if drained {
                    let (x, _, _, _) = pending_exit.take().unwrap();
                    exit_now = Some(x);
                    vec![]
                } else {
                    judge.feed(Fact { at: Some(ms()), input: Input::Tick })
                };
            }
        }
        if let Some(ServerEnd { exit: x, requested: asked }) = exit_now.take() {
            // After ready, an exit that was asked for (`vigil down`) or a clean status 0 ends the watch in
            // order: not a crash, and not a later "unhealthy" from probes of a server that is gone.
            if proof.watching() && judge.exit_is_orderly(&x, asked) {
                let how = crate::up::stopped_how(&x, asked);
                rep.emit(
                    Some(ms()),
                    &WatchEvent::Stopped { how: &how, exit_code: x.code, signal: x.signal, requested: asked },
                );
                sinks.stopping(&how);
                if let Some(p) = &sinks.verdict_file {
                    let mut r = judge.report().cloned().unwrap_or_else(|| judge.final_report());
                    r.detail = Some(how.clone());
                    let _ = crate::run::write_json(p, &r);
                }
                return Ok(Outcome { code: exit::READY, report: None, interrupted: false });
            }
            events.extend(judge.feed(Fact { at: Some(ms()), input: Input::Exit(x) }));
        }
        if let Some(h) = &mut sinks.history {
            h.observe(&judge);
        }
        let mut phase_changed = false;
        for ev in &events {
            match ev {
                Event::ProbeNow { .. } => {
                    log_says_up = true;
                    probe_asap = true;
                }
                Event::Phase { phase, .. } => {
                    if let (Some(tx), Some((_, Some(r)))) = (&a.phase_tx, &a.tag) {
                        let _ = tx.send((*r, *phase));
                    }
                    phase_changed = true;
                    if let Some(n) = &sinks.notifier {
                        n.status(&format!("{} {phase}", server.as_deref().unwrap_or("server")));
                    }
                }
                Event::Progress { phase, progress, .. } => {
                    if let Some(n) = &sinks.notifier {
                        n.status(&format!(
                            "{} {phase} {}/{}",
                            server.as_deref().unwrap_or("server"),
                            progress.k,
                            progress.n
                        ));
                    }
                }
                Event::Verdict(_)
                | Event::Slow(_)
                | Event::EngineDied(_)
                | Event::Engine(_)
                | Event::Evidence(_)
                | Event::OnStall(_)
                | Event::EngineMetrics(_)
                | Event::GpuEvent(_) => {}
            }
            rep.event(ms(), ev);
        }
        // A verdict from the judge.
        if let Some(Event::Verdict(r)) = events.iter().find(|e| matches!(e, Event::Verdict(_))) {
            let r = (**r).clone();
            if r.verdict == Verdict::Ready && *proof.stage() == vigil_core::proof::Stage::Starting {
                match proof.judge_ready(ms(), r, judge.degraded()) {
                    Step::Prove => {
                        rep.note(ms(), "health is good: proving generation with one real completion");
                        next_gen = Instant::now();
                    }
                    Step::Ready { report, watching } => {
                        if let Some(o) = announce_ready(&mut rep, &mut sinks, ms(), &report, watching) {
                            return Ok(o);
                        }
                        next_gen = Instant::now() + a.generate_every;
                    }
                    _ => {}
                }
            } else {
                if let Some(h) = probe_task.take() {
                    h.abort();
                }
                // issue #17: where every process of a stuck server is, before the verdict is told
                let mut r = r;
                let run_dir = a.exit_state.as_deref().and_then(|p| p.parent());
                crate::evidence::at_verdict(&mut rep, ms(), &mut r, a.pid, run_dir, &a.secrets, a.remote.as_ref())
                    .await;
                let port = target
                    .as_ref()
                    .filter(|t| t.host == "localhost" || t.host.starts_with("127."))
                    .map(|t| t.port)
                    .or(cmd_port);
                match (a.pid, a.remote.as_ref()) {
                    (None, Some(w)) => crate::policy::on_verdict_remote(&mut rep, ms(), &mut r, &a, w).await,
                    _ => crate::policy::on_verdict(&mut rep, ms(), &mut r, &a, port),
                }
                update_metrics(&metrics, &judge, server.as_deref(), r.verdict);
                sinks.verdict(&r);
                rep.verdict(ms(), &r, None);
                return Ok(Outcome::verdict(exit::for_verdict(r.verdict), r));
            }
        }
        // A generation proof came back.
        if let Some(g) = gen_done {
            rep.emit(Some(ms()), &WatchEvent::Generation(&g));
            match proof.generation(ms(), &g, judge.degraded()) {
                Step::Ready { report, watching } => {
                    if let Some(o) = announce_ready(&mut rep, &mut sinks, ms(), &report, watching) {
                        return Ok(o);
                    }
                    next_gen = Instant::now() + a.generate_every;
                }
                Step::Unhealthy(r) => {
                    sinks.verdict(&r);
                    rep.verdict(ms(), &r, None);
                    return Ok(Outcome::verdict(exit::UNHEALTHY, *r));
                }
                Step::RetryAt { at, note } => {
                    rep.note(ms(), &format!("generation proof failed ({note}), retrying"));
                    next_gen = Instant::now() + Duration::from_millis(at.saturating_sub(ms()));
                }
                Step::Probe(outcome) => {
                    if !g.ok {
                        rep.note(ms(), &format!("generation probe failed: {}", g.note));
                    }
                    let ev = judge.feed(Fact { at: Some(ms()), input: Input::Probe(outcome) });
                    if let Some(Event::Verdict(r)) = ev.iter().find(|e| matches!(e, Event::Verdict(_))) {
                        sinks.verdict(r);
                        rep.verdict(ms(), r, None);
                        return Ok(Outcome::verdict(exit::for_verdict(r.verdict), (**r).clone()));
                    }
                    next_gen = Instant::now() + a.generate_every;
                }
                Step::Prove | Step::Wait => {}
            }
        }
        // Schedule the next probe and generation; never two at once.
        if let Some(t) = target.as_ref().filter(|_| !link_down) {
            if probe_task.is_none() && (probe_asap || Instant::now() >= next_probe) {
                probe_asap = false;
                let t = t.clone();
                let b = bearer.clone();
                let pt = probe_timeout;
                probe_task = Some(tokio::spawn(async move { probe::probe(&t, pt, b.as_deref()).await }));
            }
            // while the server's own metrics show engine progress, no generation probes (issue #17)
            let want_gen = proof.wants_generation() && !(proof.watching() && emetrics_live);
            if want_gen && gen_task.is_none() && Instant::now() >= next_gen {
                let t = t.clone();
                let b = bearer.clone();
                let spec = profiles.proof_for(server.as_deref()).clone();
                // speculation numbers are read for the proof, not for every later generation probe
                let wants_spec = proof.config().spec.is_some();
                let read_spec = wants_spec && !proof.watching();
                // one attempt never outlasts the whole proof budget
                let to = probe_timeout.max(Duration::from_secs(30)).min(a.generate_timeout);
                let hint = proof::model_hint(&argv);
                let tokens = proof::proof_tokens(wants_spec);
                gen_task = Some(tokio::spawn(async move {
                    proof::generate_with(&spec, &t, to, b.as_deref(), hint, tokens, read_spec).await
                }));
            }
        }
        let gpu_txt =
            last_gpu.as_ref().filter(|h| h.total_mib > 0).map(|h| format!("GPU {}", crate::gpu::describe(&h.per_gpu)));
        let probe_txt = match (&last_probe, &gpu_txt) {
            (Some((_, n)), Some(g)) => Some(format!("{n} · {g}")),
            (Some((_, n)), None) => Some(n.clone()),
            (None, Some(g)) => Some(g.clone()),
            (None, None) => None,
        };
        let probe_txt = probe_txt.as_deref();
        if !proof.watching() {
            rep.live(ms(), &judge, server.as_deref(), probe_txt);
        }
        update_metrics(&metrics, &judge, server.as_deref(), judge.state());
        // systemd's start deadline follows vigil's own judgement: while starting, it is kept beyond the
        // moment vigil would call the startup stalled (or timed out), renewed on every sign of progress
        // (a log line, a phase change, a GPU memory change: the judge's `since_progress`) and, in a
        // silent phase, for as long as the phase's stall limit allows.
        if !proof.watching() {
            if let Some(n) = &mut sinks.notifier {
                let to_timeout = a.timeout.saturating_sub(t0.elapsed());
                let left = if has_log {
                    let limit = judge.config().stall_limit_ms(judge.phase());
                    Duration::from_millis(limit.saturating_sub(judge.since_progress_ms())).min(to_timeout)
                } else {
                    to_timeout
                };
                n.extend(left, phase_changed);
            }
        }
    }
}

fn server_name_for_metrics(p: &Option<vigil_core::profile::Profile>) -> Option<&str> {
    p.as_ref().map(|p| p.name.as_str())
}

fn update_metrics(m: &Option<Metrics>, j: &Judge, server: Option<&str>, v: Verdict) {
    if let Some(m) = m {
        if let Some(s) = server {
            m.set_server(s);
        }
        m.update(j.phase(), Duration::from_millis(j.in_phase_ms().unwrap_or(0)), v);
    }
}

/// Prints the ready verdict, tells systemd; returns the outcome unless watching continues.
fn announce_ready(rep: &mut Reporter, sinks: &mut Sinks, t: u64, r: &Report, watch: bool) -> Option<Outcome> {
    sinks.verdict(r);
    rep.verdict(t, r, None);
    let code = if r.degraded.is_some() { exit::DEGRADED } else { exit::READY };
    if watch {
        rep.note(t, "watching: health and generation probes, the log, the process");
        return None;
    }
    Some(Outcome::verdict(code, r.clone()))
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
    let inodes = crate::procs::port_inodes(t.port);
    if inodes.is_empty() {
        return None;
    }
    let ours = |p: &i32| crate::procs::socket_inodes(*p).iter().any(|i| inodes.contains(i));
    if ours(&pid) {
        return None; // the usual case: the server itself listens
    }
    let mut tree = vec![pid];
    tree.extend(crate::procs::descendants(pid));
    if tree.iter().any(ours) {
        return None;
    }
    // Not ours: name the holder (a scan of every process this user can see).
    let (holder, cmd) = crate::procs::port_holder(t.port)?;
    (!tree.contains(&holder)).then_some((holder, cmd))
}
