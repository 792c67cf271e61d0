//! The watch on virtual time: every verdict path (ready, crash, stall, timeout, unhealthy, orderly stop,
//! degraded, interrupt), the exit drain, and the probe schedule. No clock, no I/O: inputs in, actions out.

use super::*;
use crate::exit::Exit;
use vigil_core::judge::ExitInfo;
use vigil_core::proof::ProofConfig;
use vigil_core::JudgeConfig;

const READY_LINE: &str = "main: model loaded";
const LAUNCH_LINE: &str = "main: build = 1 (abc)";
const LOAD_FAILED: &str = "srv    load_model: failed to load model, '/m/x.gguf'";

struct Opts {
    log: bool,
    target: bool,
    watch: bool,
    generate: bool,
    stall_ms: Option<u64>,
    timeout_ms: u64,
    generate_timeout_ms: u64,
    argv: Vec<String>,
    rank: Option<usize>,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            log: true,
            target: true,
            watch: false,
            generate: false,
            stall_ms: None,
            timeout_ms: 600_000,
            generate_timeout_ms: 120_000,
            argv: vec![],
            rank: None,
        }
    }
}

/// A watch of a llama-server, made as `wait` makes it (without a history store).
fn machine(o: Opts) -> Watch<'static> {
    let profiles: &'static Profiles = Box::leak(Box::new(Profiles::builtin()));
    let cfg = JudgeConfig {
        live: true,
        require_probe: o.target,
        stall_enabled: o.log,
        stall_default_ms: o.stall_ms,
        timeout_ms: Some(o.timeout_ms),
        unhealthy_after_ms: o.watch.then_some(30_000),
        metrics_window_ms: o.watch.then_some(30_000),
        ..JudgeConfig::default()
    };
    let mut judge = Judge::new(cfg);
    judge.set_server("llama-cpp");
    let mut pc = ProofConfig {
        generate: o.generate && o.target,
        timeout_ms: o.generate_timeout_ms,
        deadline_ms: Some(o.timeout_ms),
        retry_ms: 1000,
        watch: o.watch,
        ..ProofConfig::default()
    };
    pc.set_speculation(profiles, Some("llama-cpp"), &o.argv);
    let set = Settings {
        has_log: o.log,
        has_target: o.target,
        dummy_health: false,
        check_holder: o.target,
        echo: false,
        rank: o.rank,
        timeout: Duration::from_millis(o.timeout_ms),
        interval: Duration::from_secs(1),
        generate_every: Duration::from_secs(60),
        generate_timeout: Duration::from_millis(o.generate_timeout_ms),
        probe_timeout: None,
        argv: o.argv,
    };
    let parts = Parts {
        profiles,
        judge,
        classifier: Classifier::new(profiles, Some("llama-cpp")),
        proof: Proof::new(pc),
        tree: TreeWatch::new(vec![]),
        history: None,
        server: Some("llama-cpp".into()),
        probe_timeout: Duration::from_secs(5),
    };
    Watch::new(set, parts)
}

fn line(s: &str) -> Input {
    Input::Source(SourceMsg::Line(s.into()))
}

fn probe(outcome: ProbeOutcome) -> Input {
    let status = (outcome == ProbeOutcome::Ok).then_some(200);
    let note = format!("{outcome:?}");
    let result = ProbeResult { outcome, status, latency: Duration::from_millis(3), note, cert_error: false };
    Input::Probe { result, holder: None }
}

fn generated(ok: bool) -> Input {
    Input::Generated(Generation {
        ok,
        endpoint: "/completion".into(),
        tokens: if ok { 8 } else { 0 },
        ms: 12,
        note: if ok { "8 tokens".into() } else { "HTTP 500".into() },
        spec: None,
        spec_note: None,
    })
}

fn tick() -> Input {
    Input::Tick { log_bytes: None }
}

fn exit(code: i32, requested: bool) -> Input {
    let exit = ExitInfo { code: Some(code), signal: None, ours: true };
    Input::Exit { end: ServerEnd { exit, requested }, log_bytes: None }
}

fn ended(acts: &[Action]) -> Option<&Outcome> {
    acts.iter().find_map(|a| match a {
        Action::End(o) => Some(&**o),
        _ => None,
    })
}

fn concluded(acts: &[Action]) -> Option<&Report> {
    acts.iter().find_map(|a| match a {
        Action::Conclude(r) => Some(&**r),
        _ => None,
    })
}

/// No verdict and no end among the actions.
fn undecided(acts: &[Action]) -> bool {
    !acts.iter().any(|a| matches!(a, Action::Verdict(_) | Action::VerdictFile(_)) || ends(a))
}

fn probes(acts: &[Action]) -> usize {
    acts.iter().filter(|a| matches!(a, Action::Probe { .. })).count()
}

fn generates(acts: &[Action]) -> usize {
    acts.iter().filter(|a| matches!(a, Action::Generate { .. })).count()
}

fn notes(acts: &[Action]) -> Vec<&str> {
    acts.iter()
        .filter_map(|a| match a {
            Action::Note(n) | Action::Typed(n, _) => Some(n.as_str()),
            _ => None,
        })
        .collect()
}

/// Ticks every 25 ms from `from` to `to` (inclusive), as the loop's interval does; all actions.
fn ticks(w: &mut Watch, from: u64, to: u64) -> Vec<Action> {
    let mut out = vec![];
    let mut t = from;
    while t <= to {
        out.extend(w.on(t, tick()));
        t += 25;
    }
    out
}

/// A llama-server that reaches ready: launch line, a refused probe, the ready marker, a good probe.
fn to_ready(w: &mut Watch) -> Vec<Action> {
    let first = w.on(0, line(LAUNCH_LINE));
    assert_eq!(probes(&first), 1, "the first input sends the first probe");
    assert!(ended(&w.on(10, probe(ProbeOutcome::Refused))).is_none());
    let up = w.on(100, line(READY_LINE));
    assert_eq!(probes(&up), 1, "the ready marker asks for a probe at once: {up:?}");
    w.on(110, probe(ProbeOutcome::Ok))
}

/// The judge's ready does not end the watch (a proof follows, or watching): the note that says what next.
fn ready_goes_on(o: Opts, note: &str) -> (Watch<'static>, Vec<Action>) {
    let mut w = machine(o);
    let acts = to_ready(&mut w);
    assert!(ended(&acts).is_none(), "the watch goes on: {acts:?}");
    assert!(notes(&acts).iter().any(|n| n.starts_with(note)), "{acts:?}");
    (w, acts)
}

#[test]
fn ready_when_the_log_and_a_probe_agree() {
    let mut w = machine(Opts::default());
    let acts = to_ready(&mut w);
    assert!(acts.iter().any(|a| matches!(a, Action::Verdict(r) if r.verdict == Verdict::Ready)));
    let o = ended(&acts).expect("ready ends a wait");
    assert_eq!((o.code, o.interrupted), (Exit::Ready, false));
    assert_eq!(o.report.as_ref().map(|r| r.verdict), Some(Verdict::Ready));
    assert!(w.on(200, tick()).is_empty(), "an ended watch answers nothing");
}

#[test]
fn probes_wait_for_the_log_before_it_says_up() {
    let mut w = machine(Opts::default());
    assert_eq!(probes(&w.on(0, line(LAUNCH_LINE))), 1);
    w.on(10, probe(ProbeOutcome::Refused));
    // before the log says the server is up, probes are rare (5 s), and never two at once
    assert_eq!(probes(&ticks(&mut w, 25, 5000)), 0);
    let later = ticks(&mut w, 5010, 5100);
    assert_eq!(probes(&later), 1, "{later:?}");
    assert_eq!(probes(&ticks(&mut w, 5125, 20_000)), 0, "one probe in flight at a time");
}

#[test]
fn ready_needs_one_real_completion() {
    let (mut w, acts) = ready_goes_on(Opts { generate: true, ..Opts::default() }, "health is good: proving generation");
    assert_eq!(generates(&acts), 1);
    let done = w.on(300, generated(true));
    assert!(done.iter().any(|a| matches!(a, Action::Say(Say::Generation(g)) if g.ok)));
    let o = ended(&done).expect("the proof ends the wait");
    assert_eq!(o.code, Exit::Ready);
    assert!(o.report.as_ref().unwrap().detail.as_deref().unwrap_or("").contains("generation proof"));
}

#[test]
fn generation_that_never_works_is_unhealthy() {
    let mut w = machine(Opts { generate: true, generate_timeout_ms: 3000, ..Opts::default() });
    to_ready(&mut w);
    let mut t = 200;
    let mut retries = 0;
    let o = loop {
        let acts = w.on(t, generated(false));
        if let Some(o) = ended(&acts) {
            assert!(acts.iter().any(|a| matches!(a, Action::Verdict(r) if r.verdict == Verdict::Unhealthy)));
            break o.clone();
        }
        assert!(notes(&acts).iter().any(|n| n.starts_with("generation proof failed")), "{acts:?}");
        retries += 1;
        // the next attempt waits for the retry time
        assert_eq!(generates(&ticks(&mut w, t + 25, t + 975)), 0);
        assert_eq!(generates(&w.on(t + 1000, tick())), 1);
        t += 1100;
        assert!(retries < 10, "the proof budget ends the retries");
    };
    assert_eq!(o.code, Exit::Unhealthy);
    assert_eq!(o.report.map(|r| r.verdict), Some(Verdict::Unhealthy));
}

/// issue #36: `--timeout` bounds the proof too: a completion that never comes back (an endless body) ends
/// at the deadline as `timeout`, not at the proof's own 120 s budget; the attempt is given only what is left.
#[test]
fn the_deadline_bounds_a_proof_that_never_answers() {
    let mut w = machine(Opts { generate: true, timeout_ms: 15_000, ..Opts::default() });
    let acts = to_ready(&mut w);
    let attempt = acts.iter().find_map(|a| match a {
        Action::Generate { timeout, .. } => Some(*timeout),
        _ => None,
    });
    assert_eq!(attempt, Some(Duration::from_millis(14_890)), "{acts:?}");
    assert!(concluded(&ticks(&mut w, 125, 14_975)).is_none(), "not before the deadline");
    let acts = w.on(15_000, tick());
    let r = concluded(&acts).expect("timeout at the deadline");
    assert_eq!(r.verdict, Verdict::Timeout);
    assert!(acts.iter().any(|a| matches!(a, Action::CancelGenerate)), "the attempt in flight is cancelled");
    assert!(w.on(15_025, tick()).is_empty());
}

/// issue #36: a start stopped by `vigil down` from another shell ends in order (a `stopped` event, exit 0),
/// not as a crash "killed by a signal from outside"; the same exit not asked for is a crash.
#[test]
fn a_stop_asked_for_before_ready_is_no_crash() {
    let killed = |requested| {
        let exit = ExitInfo { code: None, signal: Some(15), ours: true };
        Input::Exit { end: ServerEnd { exit, requested }, log_bytes: None }
    };
    let mut w = machine(Opts::default());
    w.on(0, line(LAUNCH_LINE));
    assert!(undecided(&w.on(1000, killed(true))), "drained first");
    let acts = ticks(&mut w, 1025, 1200);
    assert!(concluded(&acts).is_none(), "{acts:?}");
    let how = acts.iter().find_map(|a| match a {
        Action::Say(Say::Stopped { how, requested: true, .. }) => Some(how.clone()),
        _ => None,
    });
    assert!(how.as_deref().is_some_and(|h| h.contains("before ready") && h.contains("vigil down")), "{acts:?}");
    let o = ended(&acts).expect("the watch ends");
    assert_eq!((o.code, o.interrupted), (Exit::Ready, false));
    let mut w = machine(Opts::default());
    w.on(0, line(LAUNCH_LINE));
    w.on(1000, killed(false));
    let r = concluded(&ticks(&mut w, 1025, 1200)).cloned().expect("a crash");
    assert_eq!(r.verdict, Verdict::Crashed);
}

#[test]
fn crash_is_judged_after_the_exit_drain() {
    let mut w = machine(Opts::default());
    w.on(0, line(LAUNCH_LINE));
    assert!(undecided(&w.on(1000, exit(1, false))), "an exit waits for the log's last lines");
    // the dying server's last line arrives after its exit: it names the cause
    assert!(concluded(&w.on(1050, line(LOAD_FAILED))).is_none());
    assert!(concluded(&ticks(&mut w, 1075, 1175)).is_none(), "quiet for less than the drain");
    let acts = w.on(1200, tick());
    let r = concluded(&acts).expect("crashed after the drain");
    assert_eq!(r.verdict, Verdict::Crashed);
    assert!(r.evidence.iter().chain(&r.last_lines).any(|l| l.contains("failed to load model")), "{r:?}");
    assert!(matches!(acts.last(), Some(Action::Conclude(_))), "the conclusion is the last action");
}

#[test]
fn exit_drain_ends_at_its_maximum_while_the_log_talks() {
    let mut w = machine(Opts::default());
    w.on(0, line(LAUNCH_LINE));
    w.on(1000, exit(1, false));
    let mut t = 1100;
    while t < 3000 {
        let mut acts = w.on(t, line("llama_model_loader: - kv   0: general.architecture str = llama"));
        acts.extend(w.on(t + 25, tick()));
        assert!(concluded(&acts).is_none(), "still draining at {t}");
        t += 100;
    }
    let acts = w.on(3000, tick());
    assert_eq!(concluded(&acts).map(|r| r.verdict), Some(Verdict::Crashed));
}

#[test]
fn exit_without_a_log_is_judged_at_once() {
    let mut w = machine(Opts { log: false, ..Opts::default() });
    w.on(0, probe(ProbeOutcome::Refused));
    let acts = w.on(500, exit(1, false));
    assert_eq!(concluded(&acts).map(|r| r.verdict), Some(Verdict::Crashed));
}

#[test]
fn silence_past_the_stall_limit_is_stalled() {
    let mut w = machine(Opts { stall_ms: Some(6000), ..Opts::default() });
    w.on(0, line(LAUNCH_LINE));
    w.on(10, probe(ProbeOutcome::Refused));
    assert!(concluded(&ticks(&mut w, 25, 5975)).is_none());
    let acts = ticks(&mut w, 6000, 6100);
    let r = concluded(&acts).expect("stalled");
    assert_eq!((r.verdict, r.phase), (Verdict::Stalled, Phase::Launch));
    // the probe in flight (sent at 5010: rare probes every 5 s) is dropped before the conclusion
    assert!(matches!(acts[acts.len() - 2..], [Action::CancelProbe, Action::Conclude(_)]), "{acts:?}");
}

#[test]
fn no_answer_until_the_deadline_is_timeout() {
    let mut w = machine(Opts { log: false, timeout_ms: 10_000, ..Opts::default() });
    let mut t = 0;
    while t < 10_000 {
        let mut acts = w.on(t, tick());
        if probes(&acts) == 1 {
            acts.extend(w.on(t + 5, probe(ProbeOutcome::Refused)));
        }
        assert!(concluded(&acts).is_none(), "no verdict at {t}");
        t += 25;
    }
    let acts = ticks(&mut w, 10_000, 10_050);
    assert_eq!(concluded(&acts).map(|r| r.verdict), Some(Verdict::Timeout));
}

#[test]
fn failing_probes_while_watching_are_unhealthy() {
    let (mut w, _) = ready_goes_on(Opts { watch: true, ..Opts::default() }, "watching: health and generation");
    let mut t = 200;
    let r = loop {
        let mut acts = w.on(t, tick());
        if probes(&acts) == 1 {
            acts.extend(w.on(t + 5, probe(ProbeOutcome::Refused)));
        }
        if let Some(r) = concluded(&acts) {
            break r.clone();
        }
        assert!(t < 40_000, "unhealthy after 30 s of failing probes");
        t += 25;
    };
    assert_eq!(r.verdict, Verdict::Unhealthy);
    assert!(t >= 30_000, "not before the limit: {t}");
}

#[test]
fn clean_exit_after_ready_is_an_orderly_stop() {
    let mut w = machine(Opts { watch: true, ..Opts::default() });
    to_ready(&mut w);
    assert!(undecided(&w.on(5000, exit(0, false))), "drained first");
    let acts = ticks(&mut w, 5025, 5200);
    assert!(acts.iter().any(|a| matches!(a, Action::Say(Say::Stopped { exit_code: Some(0), requested: false, .. }))));
    assert!(acts.iter().any(|a| matches!(a, Action::Notify(Notify::Stopping(_)))));
    let file = acts.iter().find_map(|a| match a {
        Action::VerdictFile(r) => Some(r),
        _ => None,
    });
    assert!(file.and_then(|r| r.detail.as_deref()).is_some_and(|d| d.contains("after ready")), "{acts:?}");
    let o = ended(&acts).expect("the watch ends");
    assert_eq!((o.code, o.report.is_none(), o.interrupted), (Exit::Ready, true, false));
    assert!(concluded(&acts).is_none());
}

#[test]
fn failing_exit_after_ready_is_a_crash() {
    let mut w = machine(Opts { watch: true, log: false, ..Opts::default() });
    w.on(0, probe(ProbeOutcome::Ok));
    let acts = w.on(5000, exit(1, false));
    assert_eq!(concluded(&acts).map(|r| r.verdict), Some(Verdict::Crashed), "{acts:?}");
}

#[test]
fn speculation_the_log_says_is_off_is_degraded() {
    let argv = vec!["llama-server".into(), "-m".into(), "/m/t.gguf".into(), "-md".into(), "/m/d.gguf".into()];
    let mut w = machine(Opts { argv, ..Opts::default() });
    w.on(0, line(LAUNCH_LINE));
    w.on(50, line("failed to initialize speculative decoding context"));
    w.on(60, probe(ProbeOutcome::Refused));
    let up = w.on(100, line(READY_LINE));
    assert_eq!(probes(&up), 1);
    let acts = w.on(110, probe(ProbeOutcome::Ok));
    let o = ended(&acts).expect("ready, degraded");
    assert_eq!(o.code, Exit::Degraded);
    assert!(o.report.as_ref().and_then(|r| r.degraded.as_deref()).is_some());
}

#[test]
fn interrupt_before_a_verdict() {
    let mut w = machine(Opts::default());
    w.on(0, line(LAUNCH_LINE));
    let acts = w.on(300, Input::Interrupt { sigterm: false });
    assert_eq!(notes(&acts), ["interrupted before a verdict"]);
    let o = ended(&acts).unwrap();
    assert_eq!((o.code, o.interrupted), (Exit::Interrupted, true));
    assert!(w.on(400, tick()).is_empty());
}

#[test]
fn sigterm_while_watching_stops_in_order() {
    let mut w = machine(Opts { watch: true, ..Opts::default() });
    to_ready(&mut w);
    let acts = w.on(9000, Input::Interrupt { sigterm: true });
    assert!(acts.iter().any(|a| matches!(a, Action::Notify(Notify::Stopping(s)) if s == "SIGTERM")));
    let o = ended(&acts).unwrap();
    assert_eq!((o.code, o.interrupted), (Exit::Ready, true));
    assert_eq!(o.report.as_ref().map(|r| r.verdict), Some(Verdict::Ready));
    let mut w = machine(Opts { watch: true, ..Opts::default() });
    to_ready(&mut w);
    let o = w.on(9000, Input::Interrupt { sigterm: false });
    assert_eq!(ended(&o).map(|o| o.code), Some(Exit::Interrupted));
}

#[test]
fn a_squatter_on_the_port_is_not_ready() {
    let mut w = machine(Opts::default());
    w.on(0, line(LAUNCH_LINE));
    w.on(100, line(READY_LINE));
    assert!(w.asks_holder(ProbeOutcome::Ok));
    assert!(!w.asks_holder(ProbeOutcome::Refused));
    let squat = |w: &mut Watch, t| {
        let Input::Probe { result, .. } = probe(ProbeOutcome::Ok) else { unreachable!() };
        let holder = Some(Holder { port: 8080, pid: 4242, cmd: "python3 -m http.server".into() });
        w.on(t, Input::Probe { result, holder })
    };
    let acts = squat(&mut w, 110);
    assert!(ended(&acts).is_none() && concluded(&acts).is_none());
    assert_eq!(notes(&acts).iter().filter(|n| n.contains("held by pid 4242")).count(), 1);
    let again = squat(&mut w, 1200);
    assert!(notes(&again).is_empty(), "said once: {again:?}");
}

#[test]
fn a_dropped_link_pauses_probes() {
    let mut w = machine(Opts { log: false, ..Opts::default() });
    assert_eq!(probes(&w.on(0, tick())), 1);
    let acts = w.on(100, Input::Source(SourceMsg::Disconnected));
    assert!(matches!(acts[..2], [Action::CancelProbe, Action::Say(Say::Disconnected)]), "{acts:?}");
    assert!(!w.on(150, Input::Source(SourceMsg::Disconnected)).iter().any(|a| matches!(a, Action::Say(_))));
    assert_eq!(probes(&ticks(&mut w, 200, 5000)), 0);
    let back = Input::Source(SourceMsg::Reconnected { host: "gpu1".into(), down_ms: 5000, offset: 10 });
    let acts = w.on(5100, back);
    assert_eq!(probes(&acts), 1, "{acts:?}");
}

#[test]
fn a_lost_link_ends_the_watch_unreachable() {
    let mut w = machine(Opts::default());
    let acts = w.on(10, Input::Source(SourceMsg::Lost("gone".into())));
    assert!(matches!(acts[..], [Action::Unreachable(ref s)] if s == "gone"));
    assert!(w.on(20, tick()).is_empty());
}

#[test]
fn blank_lines_and_log_end() {
    let mut w = machine(Opts::default());
    assert!(w.on(0, line("   ")).is_empty(), "a blank line is nothing");
    let acts = w.on(10, Input::LogEnded);
    assert_eq!(notes(&acts), ["the log source ended"]);
    assert!(!w.lines_open());
    // with the log ended, an exit is judged at once
    let acts = w.on(20, exit(1, false));
    assert_eq!(concluded(&acts).map(|r| r.verdict), Some(Verdict::Crashed));
}

#[test]
fn engine_metrics_pause_generation_probes_while_watching() {
    let (mut w, _) = ready_goes_on(Opts { watch: true, generate: true, ..Opts::default() }, "health is good");
    let acts = w.on(300, generated(true));
    assert!(notes(&acts).iter().any(|n| n.starts_with("watching")), "{acts:?}");
    let idle = MetricsSample { waiting: Some(0.0), running: Some(0.0), tokens: 10.0 };
    let acts = w.on(1000, Input::EngineMetrics(Some(idle.clone())));
    assert!(acts.iter().any(|a| matches!(a, Action::Event(Event::EngineMetrics(m)) if *m == idle)));
    assert!(!w.on(1500, Input::EngineMetrics(Some(idle))).iter().any(|a| matches!(a, Action::Event(_))), "told once");
    // the next generation probe was due 60 s after ready; the server's own metrics stand in for it
    let mut t = 1525;
    while t < 61_000 {
        let acts = w.on(t, tick());
        assert!(generates(&acts) == 0 && undecided(&acts), "at {t}: {acts:?}");
        if probes(&acts) == 1 {
            w.on(t + 5, probe(ProbeOutcome::Ok));
        }
        t += 250;
    }
    // the metrics page stops answering: generation probes come back
    assert_eq!(generates(&w.on(61_500, Input::EngineMetrics(None))), 1);
}

#[test]
fn a_ranks_phases_go_to_the_multi_node_driver() {
    const WEIGHTS: &str = "main: loading model";
    let mut w = machine(Opts { rank: Some(3), ..Opts::default() });
    w.on(0, line(LAUNCH_LINE));
    let acts = w.on(100, line(WEIGHTS));
    let at = acts.iter().position(|a| matches!(a, Action::Phase { rank: 3, phase: Phase::Weights }));
    let status = acts.iter().position(|a| matches!(a, Action::Notify(Notify::Status(s)) if s == "llama-cpp weights"));
    assert!(at.is_some() && at < status, "the driver hears it before systemd: {acts:?}");
    let mut solo = machine(Opts::default());
    solo.on(0, line(LAUNCH_LINE));
    let acts = solo.on(100, line(WEIGHTS));
    assert!(acts.iter().any(|a| matches!(a, Action::Event(Event::Phase { phase: Phase::Weights, .. }))));
    assert!(!acts.iter().any(|a| matches!(a, Action::Phase { .. })), "no driver, no rank: {acts:?}");
}

#[test]
fn a_remote_exit_waits_for_every_byte_written_before_it() {
    let remote_exit = |need| {
        let exit = ExitInfo { code: Some(1), signal: None, ours: true };
        Input::Exit { end: ServerEnd { exit, requested: false }, log_bytes: Some(need) }
    };
    let got = |n| Input::Tick { log_bytes: Some(n) };
    let mut w = machine(Opts::default());
    w.on(0, line(LAUNCH_LINE));
    w.on(1000, remote_exit(4096));
    // quiet for longer than the local drain, but the bytes are still on their way
    for t in [1200, 2500, 3900] {
        assert!(undecided(&w.on(t, got(1024))), "at {t}");
    }
    w.on(4000, line(LOAD_FAILED));
    assert_eq!(concluded(&w.on(4025, got(4096))).map(|r| r.verdict), Some(Verdict::Crashed));
    // bytes that never come: judged at three times the drain's maximum
    let mut w = machine(Opts::default());
    w.on(0, line(LAUNCH_LINE));
    w.on(1000, remote_exit(4096));
    assert!(undecided(&w.on(6975, got(0))));
    assert_eq!(concluded(&w.on(7000, got(0))).map(|r| r.verdict), Some(Verdict::Crashed));
}
