//! Judge rules on virtual time, with real log lines classified by the built-in profiles.

use proptest::prelude::*;
use vigil_core::judge::ProbeOutcome;
use vigil_core::*;

fn builtin() -> &'static Profiles {
    static P: std::sync::OnceLock<Profiles> = std::sync::OnceLock::new();
    P.get_or_init(Profiles::builtin)
}

fn line(p: &Profiles, kind: &str, s: &str) -> Input {
    let mut c = Classifier::new(p, Some(kind));
    Input::Line(Box::new(c.classify(s)))
}

fn live(stall_ms: u64) -> JudgeConfig {
    JudgeConfig { live: true, stall_enabled: true, stall_default_ms: Some(stall_ms), ..JudgeConfig::default() }
}

fn feed(j: &mut Judge, at: u64, i: Input) -> Vec<Event> {
    j.feed(Fact { at: Some(at), input: i })
}

fn verdict_of(ev: &[Event]) -> Option<&Report> {
    ev.iter().find_map(|e| match e {
        Event::Verdict(r) => Some(&**r),
        _ => None,
    })
}

const LOAD: &str = "0.00.003.985 I srv    load_model: loading model 'm.gguf'";
const LOADED: &str = "0.00.095.288 I srv  llama_server: model loaded";
const MISSING: &str =
    "0.00.004.092 E gguf_init_from_file: failed to open GGUF file 'm.gguf' (No such file or directory)";
const FAILED: &str = "0.00.004.279 E srv    load_model: failed to load model, 'm.gguf'";
const CLEANUP: &str = "0.00.004.281 I srv    operator(): operator(): cleaning up before exit...";

#[test]
fn ready_marker_gives_ready_offline() {
    let p = builtin();
    let mut j = Judge::new(JudgeConfig::default());
    feed(&mut j, 0, line(p, "llama-cpp", LOAD));
    let ev = feed(&mut j, 90, line(p, "llama-cpp", LOADED));
    let r = verdict_of(&ev).expect("verdict");
    assert_eq!((r.verdict, r.phase), (Verdict::Ready, Phase::Serving));
    let tl: Vec<_> = r.timeline.iter().map(|e| (e.phase, e.duration_ms)).collect();
    assert_eq!(tl[1], (Phase::Weights, Some(90)));
}

#[test]
fn with_require_probe_the_marker_asks_for_a_probe() {
    let p = builtin();
    let mut j = Judge::new(JudgeConfig { require_probe: true, ..live(10_000) });
    let ev = feed(&mut j, 10, line(p, "llama-cpp", LOADED));
    assert!(ev.iter().any(|e| matches!(e, Event::ProbeNow { .. })));
    assert_eq!(j.state(), Verdict::Starting);
    feed(&mut j, 11, Input::Probe(ProbeOutcome::NotReady));
    assert_eq!(j.state(), Verdict::Starting);
    let ev = feed(&mut j, 12, Input::Probe(ProbeOutcome::Ok));
    assert_eq!(verdict_of(&ev).unwrap().verdict, Verdict::Ready);
}

#[test]
fn crash_verdict_at_end_of_block_with_cause_and_evidence() {
    let p = builtin();
    let mut j = Judge::new(live(60_000));
    feed(&mut j, 0, line(p, "llama-cpp", LOAD));
    feed(&mut j, 1, line(p, "llama-cpp", MISSING));
    let ev = feed(&mut j, 2, line(p, "llama-cpp", FAILED));
    assert!(verdict_of(&ev).is_none(), "verdict waits for the end of the block");
    let ev = feed(&mut j, 3, line(p, "llama-cpp", CLEANUP));
    let r = verdict_of(&ev).expect("verdict at the next record");
    assert_eq!((r.verdict, r.phase, r.cause), (Verdict::Crashed, Phase::Weights, Some(Cause::ModelFile)));
    assert!(r.evidence.iter().any(|l| l.contains("failed to open GGUF file")));
    assert!(r.hint.as_deref().unwrap().contains("-m"));
}

#[test]
fn terminal_block_closes_after_quiet_period_not_before() {
    let p = builtin();
    let mut j = Judge::new(JudgeConfig { quiet_ms: 1500, ..live(60_000) });
    feed(&mut j, 0, line(p, "llama-cpp", LOAD));
    feed(&mut j, 100, line(p, "llama-cpp", FAILED));
    assert!(verdict_of(&feed(&mut j, 1599, Input::Tick)).is_none());
    let r = feed(&mut j, 1600, Input::Tick);
    assert_eq!(verdict_of(&r).unwrap().verdict, Verdict::Crashed);
}

#[test]
fn traceback_alone_is_not_fatal_but_is_the_cause_at_exit() {
    let p = builtin();
    let s = |x: &str| line(p, "sglang", x);
    // a traceback closed by a normal record is dropped
    let mut j = Judge::new(live(60_000));
    feed(&mut j, 0, s("[2025-01-01 00:00:00] Load weight begin. avail mem=10 GB"));
    feed(&mut j, 1, s("Traceback (most recent call last):"));
    feed(&mut j, 2, s("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB"));
    feed(&mut j, 3, s("[2025-01-01 00:00:01] INFO:     127.0.0.1:1 - \"POST /generate HTTP/1.1\" 500"));
    assert_eq!(j.state(), Verdict::Starting);
    // the same traceback followed by the exit is the crash and its cause
    let mut j = Judge::new(live(60_000));
    feed(&mut j, 0, s("[2025-01-01 00:00:00] Load weight begin. avail mem=10 GB"));
    feed(&mut j, 1, s("Traceback (most recent call last):"));
    feed(&mut j, 2, s("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB"));
    let ev = feed(&mut j, 3, Input::Exit(ExitInfo { code: Some(1), signal: None, ours: true }));
    let r = verdict_of(&ev).unwrap();
    assert_eq!((r.verdict, r.phase, r.cause), (Verdict::Crashed, Phase::Weights, Some(Cause::GpuOom)));
    assert!(r.hint.as_deref().unwrap().contains("tensor parallelism"), "weights OOM advice: {:?}", r.hint);
}

#[test]
fn same_cause_different_advice_by_place() {
    let p = builtin();
    let d = |t: &str| diagnose_text(p, Some("sglang"), t);
    let graph = d(
        "[2025-01-01 00:00:00] Capture cuda graph begin.\nException: Capture cuda graph failed: CUDA out of memory.\n",
    );
    let kv = d("[2025-01-01 00:00:00] Load weight end.\nRuntimeError: Not enough memory. Please try to increase --mem-fraction-static.\n");
    assert_eq!(graph.cause, Some(Cause::GpuOom));
    assert_eq!(kv.cause, Some(Cause::GpuOom));
    assert!(graph.hint.as_deref().unwrap().contains("lower --mem-fraction-static"));
    assert!(kv.hint.as_deref().unwrap().contains("raise --mem-fraction-static"));
}

#[test]
fn exit_before_ready() {
    let p = builtin();
    let mut j = Judge::new(live(60_000));
    feed(&mut j, 0, line(p, "llama-cpp", LOAD));
    let r = feed(&mut j, 5, Input::Exit(ExitInfo { code: None, signal: Some(9), ours: true }));
    let r = verdict_of(&r).unwrap();
    assert_eq!((r.verdict, r.cause), (Verdict::Crashed, Some(Cause::Killed)));
    assert!(r.detail.as_deref().unwrap().contains("SIGKILL"));
    let mut j = Judge::new(live(60_000));
    feed(&mut j, 0, line(p, "llama-cpp", LOAD));
    let r = feed(&mut j, 5, Input::Exit(ExitInfo { code: None, signal: None, ours: false }));
    let r = verdict_of(&r).unwrap();
    assert_eq!((r.verdict, r.cause), (Verdict::Crashed, Some(Cause::Unknown)));
    assert!(r.detail.as_deref().unwrap().contains("not our child"));
}

/// Issue #33: blame on the OOM killer needs the kernel's record. A SIGKILL with an OOM kill counted during the
/// run is host_oom and cites the counter; with the counters read and still, killed from outside; a server's own
/// guess ("a common cause is the OS OOM killer") stays a hint.
#[test]
fn host_oom_needs_the_kernels_record() {
    let p = builtin();
    let sigkill = ExitInfo { code: None, signal: Some(9), ours: true };
    let end = |k: Option<KernelOom>, x: ExitInfo, text: &str| {
        let mut j = Judge::new(live(60_000));
        feed(&mut j, 0, line(p, "llama-cpp", LOAD));
        if !text.is_empty() {
            feed(&mut j, 1, line(p, "sglang", text));
        }
        if let Some(k) = k {
            feed(&mut j, 4, Input::KernelOom(k));
        }
        verdict_of(&feed(&mut j, 5, Input::Exit(x))).unwrap().clone()
    };
    let moved = KernelOom { read: vec!["/proc/vmstat oom_kill 3 -> 4".into()], machine: Some(true), cgroup: None };
    let r = end(Some(moved.clone()), sigkill.clone(), "");
    assert_eq!((r.verdict, r.cause), (Verdict::Crashed, Some(Cause::HostOom)));
    let d = r.detail.unwrap();
    assert!(d.contains("killed by SIGKILL: the kernel's OOM killer (/proc/vmstat oom_kill 3 -> 4)"), "{d}");
    // the counters read and still: someone else's SIGKILL
    let still = KernelOom { read: vec!["/proc/vmstat oom_kill 3 -> 3".into()], machine: Some(false), cgroup: None };
    let r = end(Some(still), sigkill.clone(), "");
    assert_eq!(r.cause, Some(Cause::Killed));
    let d = r.detail.unwrap();
    assert!(
        d.contains("killed by SIGKILL from outside; the kernel recorded no OOM kill (/proc/vmstat oom_kill 3 -> 3)"),
        "{d}"
    );
    // the machine counted a kill, the server's own cgroup none: another process was the victim
    let elsewhere = KernelOom {
        read: vec!["/proc/vmstat oom_kill 3 -> 4".into(), "memory.events of cgroup /srv: oom_kill 0 -> 0".into()],
        machine: Some(true),
        cgroup: Some(false),
    };
    let r = end(Some(elsewhere), sigkill.clone(), "");
    assert_eq!(r.cause, Some(Cause::Killed));
    assert!(r.detail.unwrap().contains("the kernel recorded no OOM kill of the server's cgroup"));
    // nothing readable: nothing claimed either way
    let r = end(Some(KernelOom::default()), sigkill.clone(), "");
    assert_eq!(r.cause, Some(Cause::Killed));
    assert!(!r.detail.unwrap().contains("OOM"));
    // the machine's counter moved but the server ended on its own (status 1): another process's OOM kill
    let r = end(Some(moved), ExitInfo { code: Some(1), signal: None, ours: true }, "");
    assert_ne!(r.cause, Some(Cause::HostOom));
    // the server's own cgroup counted one: its child was the victim, however the root then ended
    let ours = KernelOom {
        read: vec!["/proc/vmstat oom_kill 3 -> 4".into(), "memory.events of cgroup /srv: oom_kill 0 -> 1".into()],
        machine: Some(true),
        cgroup: Some(true),
    };
    let died = "[2026-01-01 00:00:01] Rank 0 scheduler died during initialization (exit code: -9). If exit code is -9 (SIGKILL), a common cause is the OS OOM killer. Run `dmesg -T | grep -i oom` to check.";
    let r = end(Some(ours.clone()), ExitInfo { code: Some(1), signal: None, ours: true }, died);
    assert_eq!(r.cause, Some(Cause::HostOom));
    // an engine that vanished while the server lives, with the kill counted in the server's cgroup
    let mut j = Judge::new(JudgeConfig { quiet_ms: 1_500, ..live(60_000) });
    feed(&mut j, 0, line(p, "llama-cpp", LOAD));
    let gone = EngineDeath {
        pid: 7,
        title: "sglang::scheduler".into(),
        by: vigil_core::tree::EngineBy::Title,
        gpu_mib: 0,
        lived_ms: 5_000,
    };
    feed(&mut j, 10, Input::KernelOom(ours.clone()));
    feed(&mut j, 10, Input::EngineDied(gone));
    let r = verdict_of(&feed(&mut j, 2_000, Input::Tick)).unwrap().clone();
    assert_eq!((r.verdict, r.cause), (Verdict::Crashed, Some(Cause::HostOom)));
    assert!(r.detail.unwrap().contains("died while the server process lives: the kernel's OOM killer (/proc/vmstat"));
    // offline, the server's sentence alone is no evidence
    let r = vigil_core::diagnose_text(p, Some("sglang"), died);
    assert_eq!(r.cause, Some(Cause::Killed));
    assert!(r.hint.unwrap().contains("OOM killer is a common cause"));
}

#[test]
fn stall_fires_at_last_progress_plus_limit() {
    let p = builtin();
    let mut j = Judge::new(live(2000));
    feed(&mut j, 0, line(p, "llama-cpp", LOAD));
    feed(
        &mut j,
        500,
        line(p, "llama-cpp", "0.00.500.000 I llama_model_loader: - kv 0: general.architecture str = llama"),
    );
    assert!(verdict_of(&feed(&mut j, 2499, Input::Tick)).is_none());
    let ev = feed(&mut j, 2500, Input::Tick);
    let r = verdict_of(&ev).unwrap();
    assert_eq!((r.verdict, r.phase), (Verdict::Stalled, Phase::Weights));
    assert!(r.detail.as_deref().unwrap().contains("no progress for 2.0s in weights"));
}

#[test]
fn heartbeats_and_noise_are_not_progress() {
    let p = builtin();
    let mut j = Judge::new(live(1000));
    feed(&mut j, 0, line(p, "tgi", "2023-02-20T16:45:14.079644Z  INFO text_generation_launcher: Starting shard 0"));
    for t in [300, 600, 900] {
        feed(
            &mut j,
            t,
            line(
                p,
                "tgi",
                "2023-02-20T16:45:24.091665Z  INFO text_generation_launcher: Waiting for shard 0 to be ready...",
            ),
        );
    }
    let r = feed(&mut j, 1000, Input::Tick);
    assert_eq!(verdict_of(&r).unwrap().verdict, Verdict::Stalled);
}

#[test]
fn per_phase_stall_override() {
    let p = builtin();
    let mut cfg = live(1000);
    cfg.stall_ms.insert(Phase::Weights, 5000);
    let mut j = Judge::new(cfg);
    feed(&mut j, 0, line(p, "llama-cpp", LOAD));
    assert!(verdict_of(&feed(&mut j, 4999, Input::Tick)).is_none());
    assert_eq!(verdict_of(&feed(&mut j, 5000, Input::Tick)).unwrap().verdict, Verdict::Stalled);
}

#[test]
fn timeout_is_not_stall() {
    let p = builtin();
    let mut j = Judge::new(JudgeConfig { timeout_ms: Some(5000), ..live(2000) });
    feed(&mut j, 0, line(p, "llama-cpp", LOAD));
    let mut last = None;
    for t in (500..=5000).step_by(500) {
        let ev = feed(&mut j, t, line(p, "llama-cpp", "0.00.500.000 I llama_model_loader: - kv"));
        if let Some(r) = verdict_of(&ev) {
            last = Some((t, r.verdict));
            break;
        }
    }
    assert_eq!(last, Some((5000, Verdict::Timeout)));
}

#[test]
fn least_advanced_rank_and_laggards() {
    let p = builtin();
    let s = |x: &str| line(p, "sglang", x);
    let mut j = Judge::new(JudgeConfig::default());
    feed(&mut j, 0, s("[2025-01-01 00:00:00 TP0] Load weight begin. avail mem=70 GB"));
    feed(&mut j, 0, s("[2025-01-01 00:00:00 TP1] Load weight begin. avail mem=70 GB"));
    feed(&mut j, 1, s("[2025-01-01 00:00:01 TP0] KV Cache is allocated. #tokens: 1"));
    feed(&mut j, 2, s("[2025-01-01 00:00:02 TP0] Capture cuda graph begin. avail mem=1 GB"));
    assert_eq!(j.phase(), Phase::Weights);
    assert_eq!(j.laggards(), vec!["TP1 (weights)".to_string()]);
    feed(&mut j, 3, s("[2025-01-01 00:00:03 TP1] KV Cache is allocated. #tokens: 1"));
    feed(&mut j, 3, s("[2025-01-01 00:00:03 TP1] Capture cuda graph begin. avail mem=1 GB"));
    assert_eq!(j.phase(), Phase::CudaGraphs);
    assert!(j.laggards().is_empty());
}

#[test]
fn draft_phases_after_target_graphs() {
    let p = builtin();
    let r = diagnose_text(
        p,
        Some("sglang"),
        "[2025-01-01 00:00:00] Load weight begin. avail mem=70 GB\n\
         [2025-01-01 00:00:10] Capture cuda graph begin. avail mem=9 GB\n\
         [2025-01-01 00:00:20] Capture cuda graph end. Time elapsed: 10 s\n\
         [2025-01-01 00:00:21] Load weight begin. avail mem=8 GB\n",
    );
    assert_eq!(r.phase, Phase::DraftWeights);
    let r2 = diagnose_text(
        p,
        Some("sglang"),
        "[2025-01-01 00:00:00] Load weight begin. avail mem=70 GB\n\
         [2025-01-01 00:00:21] Load weight begin. avail mem=8 GB\n\
         [2025-01-01 00:00:30] Capture draft cuda graph begin. avail mem=8 GB\n",
    );
    assert_eq!(r2.phase, Phase::DraftCudaGraphs);
}

/// Issue #12: a startup without a draft never passes through a phantom draft_weights phase (the
/// `Load weight end` line, or another untagged process's shard bar while the weights still load), so the
/// stall limit of `weights` applies.
#[test]
fn no_phantom_draft_phase_while_the_weights_load() {
    let p = builtin();
    let mut cfg = live(600_000);
    cfg.stall_ms.insert(Phase::Weights, 8_000);
    let mut j = Judge::new(cfg);
    let lines = [
        "[2025-01-01 00:00:00] Load weight begin. avail mem=70 GB",
        "Loading safetensors checkpoint shards:  50% Completed | 1/2 [00:01<00:01,  1.00s/it]",
        "[2025-01-01 00:00:02] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=60 GB",
        "Loading safetensors checkpoint shards: 100% Completed | 2/2 [00:02<00:00,  1.00s/it]",
    ];
    for (i, l) in lines.iter().enumerate() {
        feed(&mut j, i as u64 * 100, line(p, "sglang", l));
        assert_eq!(j.phase(), Phase::Weights, "after {l}");
    }
    let ev = feed(&mut j, 300 + 8_000, Input::Tick);
    let r = verdict_of(&ev).expect("the weights stall limit applies");
    assert_eq!((r.verdict, r.phase), (Verdict::Stalled, Phase::Weights));
}

#[test]
fn orderly_shutdown_after_ready_stays_ready() {
    let p = builtin();
    let mut j = Judge::new(live(60_000));
    feed(&mut j, 0, line(p, "llama-cpp", LOADED));
    feed(&mut j, 1, line(p, "llama-cpp", CLEANUP));
    feed(&mut j, 2, Input::Exit(ExitInfo { code: Some(0), signal: None, ours: true }));
    assert_eq!(j.state(), Verdict::Ready);
    let mut j = Judge::new(live(60_000));
    feed(&mut j, 0, line(p, "llama-cpp", LOADED));
    feed(&mut j, 2, Input::Exit(ExitInfo { code: None, signal: Some(11), ours: true }));
    assert_eq!(j.state(), Verdict::Crashed);
    assert_eq!(j.report().unwrap().cause, Some(Cause::Segfault));
}

#[test]
fn unhealthy_after_ready_when_probes_fail_for_the_limit() {
    let p = builtin();
    let cfg = JudgeConfig { require_probe: true, unhealthy_after_ms: Some(30_000), ..live(60_000) };
    let mut j = Judge::new(cfg);
    feed(&mut j, 0, line(p, "llama-cpp", LOADED));
    let ev = feed(&mut j, 1, Input::Probe(ProbeOutcome::Ok));
    assert_eq!(verdict_of(&ev).unwrap().verdict, Verdict::Ready);
    // failing from 10 s; a success in between restarts the count
    feed(&mut j, 10_000, Input::Probe(ProbeOutcome::Error));
    feed(&mut j, 20_000, Input::Probe(ProbeOutcome::Ok));
    feed(&mut j, 25_000, Input::Probe(ProbeOutcome::Error));
    assert!(verdict_of(&feed(&mut j, 54_999, Input::Tick)).is_none());
    let ev = feed(&mut j, 55_000, Input::Tick);
    let r = verdict_of(&ev).expect("unhealthy at 30 s of failing");
    assert_eq!((r.verdict, r.phase), (Verdict::Unhealthy, Phase::Serving));
    assert!(r.detail.as_deref().unwrap().contains("failing for 30s (limit 30s)"), "{:?}", r.detail);
    // without a watch limit, failing probes after ready never give a verdict
    let mut j = Judge::new(JudgeConfig { require_probe: true, ..live(60_000) });
    feed(&mut j, 0, line(p, "llama-cpp", LOADED));
    feed(&mut j, 1, Input::Probe(ProbeOutcome::Ok));
    feed(&mut j, 2, Input::Probe(ProbeOutcome::Error));
    assert!(verdict_of(&feed(&mut j, 10_000_000, Input::Tick)).is_none());
    assert_eq!(j.state(), Verdict::Ready);
}

#[test]
fn exits_after_ready_orderly_or_not() {
    let clean = ExitInfo { code: Some(0), signal: None, ours: true };
    let killed = ExitInfo { code: None, signal: Some(9), ours: true };
    let foreign = ExitInfo { code: None, signal: None, ours: false };
    assert!(clean.orderly_after_ready(false));
    assert!(!killed.orderly_after_ready(false));
    assert!(killed.orderly_after_ready(true), "vigil down asked for it");
    assert!(!foreign.orderly_after_ready(false), "a status we cannot know is not a clean one");
    let p = builtin();
    let mut j = Judge::new(live(60_000));
    feed(&mut j, 0, line(p, "llama-cpp", LOADED));
    let ev = feed(&mut j, 5, Input::Exit(foreign));
    let r = verdict_of(&ev).expect("a post-ready death is a crash");
    assert_eq!(r.verdict, Verdict::Crashed);
}

#[test]
fn unknown_durations_are_not_invented() {
    let p = builtin();
    let r =
        diagnose_text(p, Some("llama-cpp"), "srv    load_model: loading model 'x'\nsrv  llama_server: model loaded\n");
    assert_eq!(r.verdict, Verdict::Ready);
    assert!(r.timeline.iter().all(|e| e.duration_ms.is_none()));
    assert_eq!(r.elapsed_ms, None);
}

#[test]
fn backwards_stamps_are_tolerated() {
    let p = builtin();
    let r = diagnose_text(
        p,
        Some("sglang"),
        "[2025-01-01 00:00:10] Load weight begin.\n[2025-01-01 00:00:05] KV Cache is allocated.\n[2025-01-01 00:00:20] Capture cuda graph begin.\n",
    );
    assert_eq!(r.phase, Phase::CudaGraphs);
    assert!(r.timeline.iter().all(|e| e.duration_ms.is_some()));
}

// ------------------------------------------------------------------ property tests

#[derive(Debug, Clone)]
enum Step {
    Line(usize),
    Probe(bool),
    Tick,
    Exit,
}

const POOL: &[&str] = &[
    LOAD,
    "0.00.500.000 I llama_model_loader: - kv 0: general.architecture str = llama",
    "0.00.600.000 I srv    load_model: initializing, n_slots = 4",
    LOADED,
    MISSING,
    FAILED,
    CLEANUP,
    "0.00.700.000 I slot print_timing: id  3 | task 0 | total time = 9.35 ms",
    "Traceback (most recent call last):",
    "random text 123",
];

fn step() -> impl Strategy<Value = (u64, Step)> {
    let s = prop_oneof![
        6 => (0..POOL.len()).prop_map(Step::Line),
        2 => any::<bool>().prop_map(Step::Probe),
        3 => Just(Step::Tick),
        1 => Just(Step::Exit),
    ];
    (0u64..3000, s)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn judge_invariants(steps in prop::collection::vec(step(), 1..60), require_probe in any::<bool>()) {
        let p = builtin();
        let limit = 2000;
        let mut j = Judge::new(JudgeConfig { require_probe, ..live(limit) });
        let mut t = 0u64;
        let mut marker_or_ok = false;
        let mut terminal: Option<Verdict> = None;
        for (dt, s) in steps {
            t += dt;
            let input = match &s {
                Step::Line(i) => line(p, "llama-cpp", POOL[*i]),
                Step::Probe(ok) => Input::Probe(if *ok { ProbeOutcome::Ok } else { ProbeOutcome::NotReady }),
                Step::Tick => Input::Tick,
                Step::Exit => Input::Exit(ExitInfo { code: Some(1), signal: None, ours: true }),
            };
            let before = j.state();
            let since_before = j.since_progress_ms() + if before == Verdict::Starting { dt } else { 0 };
            let ev = feed(&mut j, t, input);
            match &s {
                // the ready marker, or a line only a serving server writes (a slot's per-task timing)
                Step::Line(i) if (POOL[*i] == LOADED || POOL[*i].contains("print_timing")) && !require_probe => {
                    marker_or_ok = true
                }
                Step::Probe(true) => marker_or_ok = true,
                _ => {}
            }
            if let Some(r) = verdict_of(&ev) {
                if r.verdict == Verdict::Ready {
                    prop_assert!(marker_or_ok, "ready without a ready marker or a good probe");
                }
                if r.verdict == Verdict::Stalled {
                    prop_assert!(since_before >= limit, "stall before last progress + limit");
                }
            }
            if before == Verdict::Starting && j.state() == Verdict::Starting {
                prop_assert!(j.since_progress_ms() < limit, "a stall was due but did not fire");
            }
            if let Some(v) = terminal {
                prop_assert_eq!(j.state(), v, "a terminal verdict changed");
            }
            if j.state().is_terminal() {
                terminal = Some(j.state());
            }
        }
    }

    #[test]
    fn rank_interleaving_does_not_change_the_verdict(order in prop::collection::vec(0usize..4, 24)) {
        let p = builtin();
        let seq = |r: usize| -> Vec<String> {
            vec![
                format!("[2025-01-01 00:00:00 TP{r}] Load weight begin. avail mem=70 GB"),
                format!("[2025-01-01 00:00:01 TP{r}] Load weight end. avail mem=30 GB"),
                format!("[2025-01-01 00:00:02 TP{r}] KV Cache is allocated. #tokens: 1"),
                format!("[2025-01-01 00:00:03 TP{r}] Capture cuda graph begin. avail mem=9 GB"),
                format!("[2025-01-01 00:00:04 TP{r}] Capture cuda graph end. Time elapsed: 1 s"),
                if r == 2 { "Exception: Capture cuda graph failed: CUDA out of memory".into() } else { format!("[2025-01-01 00:00:05 TP{r}] Memory pool end.") },
            ]
        };
        let seqs: Vec<Vec<String>> = (0..4).map(seq).collect();
        let sequential: String = seqs.iter().flatten().cloned().collect::<Vec<_>>().join("\n");
        // interleave following `order`, then append what is left
        let mut idx = [0usize; 4];
        let mut mixed = Vec::new();
        for r in order {
            if idx[r] < seqs[r].len() - 1 { // keep the fatal line last for its rank
                mixed.push(seqs[r][idx[r]].clone());
                idx[r] += 1;
            }
        }
        for r in 0..4 {
            mixed.extend(seqs[r][idx[r]..].iter().cloned());
        }
        let a = diagnose_text(p, Some("sglang"), &sequential);
        let b = diagnose_text(p, Some("sglang"), &mixed.join("\n"));
        prop_assert_eq!((a.verdict, a.cause), (b.verdict, b.cause));
    }
}

/// vLLM's last kv-cache line before its capture bar (corpus vllm-mineru-4516).
const KV_LINE: &str = "(EngineCore_0 pid=71136) INFO 02-08 08:54:10 [kv_cache_utils.py:853] Maximum concurrency for 16,384 tokens per request: 43.38x";

/// One state of vLLM's capture bar as tqdm draws it (the `\r` before it is the reader's business).
fn capture_state(k: u64, n: u64, secs: u64) -> String {
    let fill = "█".repeat((10 * k / n) as usize);
    format!(
        "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): {:3}%|{fill:<10}| {k}/{n} [{:02}:{:02}<00:00,  1.00it/s]",
        100 * k / n,
        secs / 60,
        secs % 60
    )
}

/// Issue #23 step 4 with the acceptance's numbers, on virtual time: a capture whose bar advances every
/// second for five minutes is never stalled under a 30 s limit for cuda_graphs; once it stops it is stalled
/// exactly 30 s after its last advance, and a redraw of the stuck bar at the same count (tqdm's monitor
/// thread refreshes one after 10 s) does not count as progress.
#[test]
fn capture_bar_advancing_every_second_for_five_minutes_is_never_stalled() {
    let p = builtin();
    let mut cfg = live(600_000);
    cfg.stall_ms.insert(Phase::CudaGraphs, 30_000);
    let mut j = Judge::new(cfg);
    feed(&mut j, 0, line(p, "vllm", KV_LINE));
    let mut seen = Vec::new();
    for t in (100..=300_000u64).step_by(100) {
        let ev = if t % 1000 == 0 {
            feed(&mut j, t, line(p, "vllm", &capture_state(t / 1000, 400, t / 1000)))
        } else {
            feed(&mut j, t, Input::Tick)
        };
        assert!(verdict_of(&ev).is_none(), "a verdict at {t} ms while the bar advances");
        seen.extend(ev.iter().filter_map(|e| match e {
            Event::Progress { phase: Phase::CudaGraphs, progress, .. } => Some((t, progress.k)),
            _ => None,
        }));
    }
    assert_eq!(j.phase(), Phase::CudaGraphs);
    assert_eq!(seen.len(), 300, "every new count is a progress event");
    assert!(seen.iter().all(|(t, k)| *t == k * 1000));
    let mut stalled = None;
    for t in (300_100..=340_000u64).step_by(100) {
        let ev = if t == 310_000 {
            feed(&mut j, t, line(p, "vllm", &capture_state(300, 400, 310)))
        } else {
            feed(&mut j, t, Input::Tick)
        };
        if let Some(r) = verdict_of(&ev) {
            stalled = Some((t, r.clone()));
            break;
        }
    }
    let (t, r) = stalled.expect("the stopped bar is stalled");
    assert_eq!((r.verdict, r.phase), (Verdict::Stalled, Phase::CudaGraphs));
    assert_eq!(t, 330_000, "stalled 30 s after the last advance, not after the redraw at the same count");
    assert!(r.detail.as_deref().unwrap().contains("in cuda_graphs (300/400)"), "{:?}", r.detail);
}

/// A redraw of a bar at the same count is not progress; a new count is, and any other line still is.
#[test]
fn only_a_new_count_of_a_bar_is_progress() {
    let p = builtin();
    let mut cfg = live(600_000);
    cfg.stall_ms.insert(Phase::CudaGraphs, 5_000);
    let mut j = Judge::new(cfg);
    feed(&mut j, 0, line(p, "vllm", &capture_state(1, 51, 0)));
    assert_eq!(j.phase(), Phase::CudaGraphs);
    feed(&mut j, 3_000, line(p, "vllm", &capture_state(1, 51, 3)));
    assert_eq!(j.since_progress_ms(), 3_000, "the same count again is not progress");
    feed(&mut j, 4_000, line(p, "vllm", &capture_state(2, 51, 4)));
    assert_eq!(j.since_progress_ms(), 0, "a new count is");
    feed(&mut j, 4_500, line(p, "vllm", "(EngineCore_0 pid=1) INFO 02-08 08:54:14 [core.py:1] something else"));
    assert_eq!(j.since_progress_ms(), 0);
    assert!(verdict_of(&feed(&mut j, 9_499, Input::Tick)).is_none());
    assert_eq!(verdict_of(&feed(&mut j, 9_500, Input::Tick)).unwrap().verdict, Verdict::Stalled);
}

/// Issue #24's framework lines, rendered from their sources: glibc's assert() message and the shells' job-death
/// lines end a text that had reached serving as a crash, never as ready (the one false ready of the blind round).
#[test]
fn libc_asserts_and_shell_job_deaths_after_serving_are_crashes() {
    let p = builtin();
    let serving = "[2025-01-01 00:00:00] Load weight begin. avail mem=70 GB\n\
                   [2025-01-01 00:00:30] The server is fired up and ready to roll!\n\
                   [2025-01-01 00:00:31] Decode batch, #running-req: 1, #token: 40, token usage: 0.00, gen throughput (token/s): 50.0, #queue-req: 0\n";
    for tail in [
        // glibc assert/assert.c __assert_fail_base
        "python3: /build/nccl/src/enqueue.cc:1121: ncclResult_t f(): Assertion `comm->rank >= 0' failed.\n",
        // zsh Src/jobs.c: the signal's message, then the command
        "zsh: killed     python -m sglang.launch_server --model-path m\n",
        "zsh: abort      python -m sglang.launch_server --model-path m\n",
        // bash jobs.c: a script's line, the pid, the signal's description
        "./serve.sh: line 3: 41822 Killed                  python -m sglang.launch_server --model-path m\n",
    ] {
        let r = diagnose_text(p, Some("sglang"), &format!("{serving}{tail}"));
        assert_eq!(r.verdict, Verdict::Crashed, "{tail}");
        assert_eq!(r.phase, Phase::Serving, "{tail}");
    }
    // the same words inside an ordinary line are no death
    let r = diagnose_text(
        p,
        Some("sglang"),
        &format!("{serving}[2025-01-01 00:00:32] note: zsh: killed is a shell message\n"),
    );
    assert_eq!(r.verdict, Verdict::Ready);
}
