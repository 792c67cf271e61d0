//! `vigil wait`: attach to a server started elsewhere and reach a verdict.
//!
//! One `tokio::select!` loop owns all state (classifier, judge, probe schedule); workers (log
//! follower, `--log-cmd` readers, the pid watcher, one probe at a time) talk to it over channels.

use crate::cli::{parse_stalls, CliError};
use crate::exit;
use crate::follow::{self, SourceMsg};
use crate::probe::{self, ProbeResult, Target};
use crate::report::Reporter;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use vigil_core::{
    Classifier, Event, ExitInfo, Fact, Input, Judge, JudgeConfig, Phase, ProbeOutcome, Profiles, Verdict,
};

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
    pub stall: Vec<String>,
    pub json: bool,
    pub quiet: bool,
    pub echo: bool,
    /// A run's state.json: the keeper records the server's exit status there (we are not its parent).
    pub exit_state: Option<PathBuf>,
    /// Values never to print (a run's secrets).
    pub secrets: Vec<String>,
}

/// How `wait` ended: the exit code and, when a verdict was reached, its report.
pub struct Outcome {
    pub code: i32,
    pub report: Option<vigil_core::Report>,
}

pub async fn run(a: Args, profiles: Profiles) -> Result<Outcome, CliError> {
    let t0 = Instant::now();
    let ms = move || t0.elapsed().as_millis() as u64;
    let mut rep = Reporter::new(a.json, a.quiet);
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

    let has_log = a.log.is_some() || a.log_cmd.is_some();
    // The command line of --pid names the server kind, its port, and (SGLang) its node rank.
    let argv = a.pid.and_then(follow::cmdline).unwrap_or_default();
    let server_name = a.server.clone().or_else(|| profiles.detect_cmd(&argv).map(String::from));
    let forced = server_name.as_ref().and_then(|s| profiles.get(s)).cloned();
    // SGLang nodes with --node-rank >= 1 serve a dummy /health that is always 200: never proof of readiness.
    let dummy_health = forced.as_ref().is_some_and(|p| p.name == "sglang")
        && follow::arg_value(&argv, "--node-rank").and_then(|v| v.parse::<u32>().ok()).is_some_and(|r| r >= 1);
    let cmd_port = follow::arg_value(&argv, "--port").and_then(|p| p.parse::<u16>().ok());
    let target = match (&a.url, &forced) {
        (Some(u), _) => Some(Target::parse(u).map_err(CliError::usage)?),
        (None, Some(p)) if !has_log => Some(
            Target::parse(&format!("http://127.0.0.1:{}{}", cmd_port.unwrap_or(p.port), p.health_path))
                .map_err(CliError::usage)?,
        ),
        _ => None,
    };
    if target.is_none() && !has_log && a.pid.is_none() {
        return Err(CliError::usage("wait: nothing to watch: give --url, --log, --log-cmd, --pid or --server"));
    }
    if let Some(pid) = a.pid {
        // A process that already ended is fine when its log can still tell what happened.
        if pid <= 0 || (!has_log && !follow::pid_alive(pid)) {
            return Err(CliError::usage(format!("--pid {pid}: no such live process")));
        }
    }
    let (stall_all, stall_per) = parse_stalls(&a.stall)?;
    let mut cfg = JudgeConfig {
        live: true,
        require_probe: target.is_some(),
        stall_enabled: has_log,
        stall_default_ms: stall_all,
        timeout_ms: Some(a.timeout.as_millis() as u64),
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
    if let Some(cmd) = &a.log_cmd {
        _log_child =
            Some(follow::spawn_log_cmd(cmd, tx.clone()).map_err(|e| CliError::usage(format!("--log-cmd: {e}")))?);
    }
    drop(tx);
    let (exit_tx, mut exit_rx) = mpsc::unbounded_channel::<ExitInfo>();
    if let Some(pid) = a.pid {
        let state_path = a.exit_state.clone();
        tokio::spawn(async move {
            loop {
                if !follow::pid_alive(pid) {
                    let _ = exit_tx.send(exit_info(state_path.as_deref()).await);
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
    }

    if dummy_health {
        rep.note(0, "SGLang --node-rank >= 1: its /health is a dummy that always answers 200; readiness comes from the log only");
    }
    if rep.mode == crate::report::Mode::Json {
        let mut start = serde_json::json!({"event": "start", "t_ms": 0});
        if let Some(t) = &target {
            start["url"] = t.url().into();
        }
        if let Some(l) = &a.log {
            start["log"] = l.clone().into();
        }
        if let Some(p) = a.pid {
            start["pid"] = p.into();
        }
        if let Some(s) = &server {
            start["server"] = s.clone().into();
        }
        rep.json(start);
    }

    let rare = a.interval.max(Duration::from_secs(5));
    let mut next_probe = Instant::now();
    let mut probe_asap = false;
    let mut log_says_up = false;
    let mut probe_task: Option<tokio::task::JoinHandle<ProbeResult>> = None;
    let mut last_probe: Option<(ProbeOutcome, String)> = None;
    let mut lines_open = has_log;
    // An exit is judged only once the log has caught up (quiet for EXIT_DRAIN, at most EXIT_DRAIN_MAX):
    // the last lines a dying server writes hold the cause.
    const EXIT_DRAIN: Duration = Duration::from_millis(150);
    const EXIT_DRAIN_MAX: Duration = Duration::from_secs(2);
    let mut pending_exit: Option<(ExitInfo, Instant, Instant)> = None; // (exit, last line, first seen)
    let mut tick = tokio::time::interval(Duration::from_millis(25));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let interrupt_base = crate::interrupts();

    loop {
        let mut events: Vec<Event> = Vec::new();
        tokio::select! {
            _ = crate::next_interrupt(interrupt_base) => {
                rep.note(ms(), "interrupted before a verdict");
                return Ok(Outcome { code: exit::INTERRUPTED, report: None });
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
                            if a.probe_timeout.is_none() {
                                probe_timeout = Duration::from_secs_f64(k.probe_timeout_secs);
                            }
                            if rep.mode == crate::report::Mode::Json {
                                rep.json(serde_json::json!({"event": "detected", "t_ms": ms(), "server": k.name}));
                            } else {
                                rep.note(ms(), &format!("server kind: {}", k.name));
                            }
                        }
                    }
                    events = judge.feed(Fact { at: Some(ms()), input: Input::Line(Box::new(line)) });
                }
                Some(SourceMsg::Note(n)) => rep.note(ms(), &n),
                None => {
                    lines_open = false;
                    rep.note(ms(), "the log source ended");
                    events = judge.feed(Fact { at: Some(ms()), input: Input::Eof });
                }
            },
            Some(x) = exit_rx.recv() => {
                if has_log && lines_open {
                    let now = Instant::now();
                    pending_exit = Some((x, now, now));
                } else {
                    events = judge.feed(Fact { at: Some(ms()), input: Input::Exit(x) });
                }
            }
            r = async { match probe_task.as_mut() { Some(h) => h.await, None => std::future::pending().await } } => {
                probe_task = None;
                let r = r.map_err(|e| CliError::Internal(format!("probe task: {e}")))?;
                let key = (r.outcome, r.note.clone());
                if last_probe.as_ref() != Some(&key) {
                    if rep.mode == crate::report::Mode::Json {
                        rep.json(serde_json::json!({"event": "probe", "t_ms": ms(), "outcome": r.outcome, "status": r.status, "latency_ms": r.latency.as_millis() as u64, "note": r.note}));
                    }
                    last_probe = Some(key);
                }
                let outcome = if dummy_health && r.outcome == ProbeOutcome::Ok {
                    ProbeOutcome::NotReady
                } else {
                    r.outcome
                };
                events = judge.feed(Fact { at: Some(ms()), input: Input::Probe(outcome) });
                let every = if !has_log || log_says_up { a.interval } else { rare };
                next_probe = Instant::now() + every;
            }
            _ = tick.tick() => {
                let drained = pending_exit.as_ref().is_some_and(|(_, last, first)| {
                    last.elapsed() >= EXIT_DRAIN || first.elapsed() >= EXIT_DRAIN_MAX || !lines_open
                });
                events = if drained {
                    let (x, _, _) = pending_exit.take().unwrap();
                    judge.feed(Fact { at: Some(ms()), input: Input::Exit(x) })
                } else {
                    judge.feed(Fact { at: Some(ms()), input: Input::Tick })
                };
            }
        }
        for ev in &events {
            if let Event::ProbeNow { .. } = ev {
                log_says_up = true;
                probe_asap = true;
            }
            rep.event(ms(), ev);
        }
        if let Some(Event::Verdict(r)) = events.iter().find(|e| matches!(e, Event::Verdict(_))) {
            if let Some(h) = probe_task.take() {
                h.abort();
            }
            rep.verdict(ms(), r, None);
            return Ok(Outcome { code: exit::for_verdict(r.verdict), report: Some((**r).clone()) });
        }
        if judge.state() != Verdict::Starting {
            let r = judge.final_report();
            rep.verdict(ms(), &r, None);
            return Ok(Outcome { code: exit::for_verdict(r.verdict), report: Some(r) });
        }
        if let Some(t) = &target {
            if probe_task.is_none() && (probe_asap || Instant::now() >= next_probe) {
                probe_asap = false;
                let t = t.clone();
                let b = bearer.clone();
                let pt = probe_timeout;
                probe_task = Some(tokio::spawn(async move { probe::probe(&t, pt, b.as_deref()).await }));
            }
        }
        let probe_txt = last_probe.as_ref().map(|(_, n)| n.as_str());
        rep.live(ms(), &judge, server.as_deref(), probe_txt);
    }
}

/// The exit status of a process that died: from the keeper's state.json when it is a run of ours
/// (the keeper reaps it and records code and signal), else unknown (not our child).
async fn exit_info(state: Option<&std::path::Path>) -> ExitInfo {
    if let Some(p) = state {
        for _ in 0..50 {
            if let Some(st) = crate::run::read_json::<crate::run::State>(p) {
                if !st.running && (st.exit_code.is_some() || st.exit_signal.is_some()) {
                    return ExitInfo { code: st.exit_code, signal: st.exit_signal, ours: true };
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    ExitInfo { code: None, signal: None, ours: false }
}
