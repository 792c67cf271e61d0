//! Startup history in the judge, on virtual time: usual durations and ETA on phase events, the `slow`
//! event once, the baseline in the verdict, learned stall limits (and a cold start not judged by them).

use std::collections::{BTreeMap, BTreeSet};
use vigil_core::history::{self, Baseline, Key, Startup, STALL_FLOOR_MS};
use vigil_core::*;

fn builtin() -> &'static Profiles {
    static P: std::sync::OnceLock<Profiles> = std::sync::OnceLock::new();
    P.get_or_init(Profiles::builtin)
}

fn line(s: &str) -> Input {
    let mut c = Classifier::new(builtin(), Some("llama-cpp"));
    Input::Line(Box::new(c.classify(s)))
}

fn feed(j: &mut Judge, at: u64, i: Input) -> Vec<Event> {
    j.feed(Fact { at: Some(at), input: i })
}

const LAUNCH: &str = "0.00.000.100 I main: build = 4205 (c6bc7395)";
const LOAD: &str = "0.00.003.985 I srv    load_model: loading model 'm.gguf'";
const LOADED: &str = "0.00.095.288 I srv  llama_server: model loaded";

fn key(cold: bool) -> Key {
    Key { server: "llama-cpp".into(), model: "/m.gguf".into(), host: "h".into(), cold_cache: cold, ..Key::default() }
}

/// A good startup: weights took `weights_ms`, its longest silence in weights `gap_ms`.
fn good(k: &Key, weights_ms: u64, gap_ms: u64) -> Startup {
    Startup {
        name: "m".into(),
        key: k.clone(),
        verdict: Verdict::Ready,
        cause: None,
        total_ms: Some(weights_ms + 500),
        phases: [(Phase::Launch, 500), (Phase::Weights, weights_ms)].into(),
        ranks: BTreeMap::new(),
        gaps: [(Phase::Launch, 100), (Phase::Weights, gap_ms)].into(),
        rates: BTreeMap::new(),
        gpu_mib: BTreeMap::new(),
        facts: BTreeMap::new(),
        started_unix_ms: 0,
        slow: vec![],
        repairs: vec![],
    }
}

fn live() -> JudgeConfig {
    JudgeConfig { live: true, stall_enabled: true, ..JudgeConfig::default() }
}

fn with_history(past: &[Startup], k: &Key, slow_floor: u64, stall_floor: u64) -> Judge {
    let m = history::match_key(k, past).expect("related history");
    let b = Baseline::from_matched(&m, slow_floor);
    let learned = history::learned_stalls(&m, stall_floor);
    let mut j = Judge::new(live());
    j.set_history(b, learned, &BTreeSet::new(), vec![]);
    j
}

#[test]
fn phase_events_carry_the_usual_duration_and_an_eta() {
    let k = key(false);
    let past = vec![good(&k, 10_000, 200), good(&k, 12_000, 200), good(&k, 14_000, 200)];
    let mut j = with_history(&past, &k, 1000, STALL_FLOOR_MS);
    feed(&mut j, 0, line(LAUNCH));
    let ev = feed(&mut j, 500, line(LOAD));
    let (usual, eta) = ev
        .iter()
        .find_map(|e| match e {
            Event::Phase { phase: Phase::Weights, usual_ms, eta_ms, .. } => Some((*usual_ms, *eta_ms)),
            _ => None,
        })
        .expect("phase event");
    assert_eq!(usual, Some(12_000));
    assert_eq!(eta, Some(12_000));
    feed(&mut j, 6500, Input::Tick);
    assert_eq!(j.eta_ms(), Some(6000));
}

#[test]
fn slow_is_said_once_past_the_margin_and_the_verdict_carries_the_baseline() {
    let k = key(false);
    let past = vec![good(&k, 10_000, 200); 3];
    // margin: max(1.5 × 10 s, 10 s + 2 s floor) = 15 s
    let mut j = with_history(&past, &k, 2000, STALL_FLOOR_MS);
    let change = history::Change { item: "config:model".into(), before: Some("a".into()), after: Some("b".into()) };
    j.set_changes(vec![change.clone()]);
    feed(&mut j, 0, line(LAUNCH));
    feed(&mut j, 500, line(LOAD));
    let mut slows = 0;
    for t in (1000..=30_000).step_by(250) {
        for e in feed(&mut j, t, Input::Tick) {
            if let Event::Slow(s) = e {
                slows += 1;
                assert_eq!(s.phase, Phase::Weights);
                assert!(s.in_phase_ms > 15_000 && s.in_phase_ms <= 15_250, "{}", s.in_phase_ms);
                assert_eq!((s.median_ms, s.startups), (10_000, 3));
            }
        }
    }
    assert_eq!(slows, 1, "slow is said once");
    let ev = feed(&mut j, 31_000, line(LOADED));
    let r = ev.iter().find_map(|e| if let Event::Verdict(r) = e { Some(r) } else { None }).expect("ready");
    let b = r.baseline.as_ref().expect("baseline in the verdict");
    assert_eq!((b.startups, b.total_ms_median), (3, Some(10_500)));
    assert_eq!(b.ratio, Some(2.95));
    assert_eq!(r.slow.len(), 1);
    // a slow start lists what changed since the last good one; a start at the usual pace does not
    assert_eq!(r.changes, vec![change.clone()]);
    let mut j = with_history(&past, &k, 2000, STALL_FLOOR_MS);
    j.set_changes(vec![change]);
    feed(&mut j, 0, line(LAUNCH));
    feed(&mut j, 500, line(LOAD));
    let ev = feed(&mut j, 9000, line(LOADED));
    let r = ev.iter().find_map(|e| if let Event::Verdict(r) = e { Some(r) } else { None }).expect("ready");
    assert!(r.changes.is_empty() && r.slow.is_empty(), "{:?}", r.changes);
}

#[test]
fn a_learned_stall_limit_fires_at_that_limit() {
    let k = key(false);
    let past = vec![good(&k, 10_000, 400), good(&k, 10_000, 700), good(&k, 10_000, 500)];
    // 3 × the longest gap (700 ms) = 2.1 s, above a 1 s floor
    let mut j = with_history(&past, &k, 1000, 1000);
    assert_eq!(j.config().stall_limit_ms(Phase::Weights), 2100);
    feed(&mut j, 0, line(LAUNCH));
    feed(&mut j, 500, line(LOAD));
    assert!(feed(&mut j, 2599, Input::Tick).is_empty());
    assert_eq!(j.state(), Verdict::Starting);
    let ev = feed(&mut j, 2600, Input::Tick);
    let r = ev.iter().find_map(|e| if let Event::Verdict(r) = e { Some(r) } else { None }).expect("stalled");
    assert_eq!((r.verdict, r.phase), (Verdict::Stalled, Phase::Weights));
    assert!(r.detail.as_deref().unwrap().contains("learned"), "{:?}", r.detail);
}

#[test]
fn a_cold_cache_start_is_not_stalled_by_limits_learned_from_warm_starts() {
    let warm = key(false);
    let past = vec![good(&warm, 10_000, 300); 5];
    let cold = key(true);
    let mut j = with_history(&past, &cold, 1000, 1000);
    // the nearest key (warm) gives a baseline with a note, but no stall limit
    assert_eq!(j.config().baseline.as_ref().unwrap().differs, vec!["cold cache (was warm)".to_string()]);
    assert!(j.config().stall_learned.is_empty());
    feed(&mut j, 0, line(LAUNCH));
    feed(&mut j, 500, line(LOAD));
    // a 4-minute silent compile: the phase default (600 s for weights) applies, not 3 × 300 ms
    feed(&mut j, 240_000, Input::Tick);
    assert_eq!(j.state(), Verdict::Starting);
}

#[test]
fn a_compiler_in_the_tree_is_progress() {
    let k = key(false);
    let past = vec![good(&k, 10_000, 300); 3];
    let mut j = with_history(&past, &k, 1000, 1000);
    feed(&mut j, 0, line(LAUNCH));
    feed(&mut j, 500, line(LOAD));
    for t in (1000..20_000).step_by(500) {
        feed(&mut j, t, Input::Compiling("ptxas".into()));
    }
    assert_eq!(j.state(), Verdict::Starting);
    feed(&mut j, 20_500 + 1000, Input::Tick);
    assert_eq!(j.state(), Verdict::Stalled);
}

#[test]
fn the_judge_measures_silent_gaps_rates_and_rank_times() {
    let mut j = Judge::new(JudgeConfig::default());
    feed(&mut j, 0, line(LAUNCH));
    feed(&mut j, 100, line(LOAD));
    feed(&mut j, 2100, line("0.00.010.000 I srv    load_model: still loading"));
    feed(&mut j, 2600, line(LOADED));
    assert_eq!(j.gaps().get(&Phase::Weights), Some(&2000));
    let tl = j.rank_timelines();
    let only = tl.get("").expect("untagged rank");
    assert!(only.contains(&(Phase::Weights, Some(100))), "{only:?}");
}

fn sglang(s: &str) -> Input {
    let mut c = Classifier::new(builtin(), Some("sglang"));
    Input::Line(Box::new(c.classify(s)))
}

/// Progress events carry an ETA from k/n: 12 of 52 CUDA graphs in 30 s leave 100 s.
#[test]
fn progress_events_carry_an_eta_from_k_of_n() {
    let k = key(false);
    let mut s = good(&k, 10_000, 200);
    s.phases.insert(Phase::CudaGraphs, 60_000);
    let past = vec![s; 3];
    let mut j = with_history(&past, &k, 1000, STALL_FLOOR_MS);
    feed(
        &mut j,
        0,
        sglang(
            "[2025-01-01 00:00:00] Capture cuda graph begin. This can take up to several minutes. avail mem=40.00 GB",
        ),
    );
    let ev = feed(
        &mut j,
        30_000,
        sglang("Capturing batches (bs=96 avail_mem=39.00 GB):  23%|##   | 12/52 [00:30<01:40,  2.50s/it]"),
    );
    let eta = ev.iter().find_map(|e| match e {
        Event::Progress { progress, eta_ms, .. } if progress.k == 12 => Some(*eta_ms),
        _ => None,
    });
    assert_eq!(eta, Some(Some(100_000)), "{ev:?}");
}

/// GPU memory held at a phase's end is kept for the history.
#[test]
fn gpu_memory_at_each_phase_end() {
    let mut j = Judge::new(live());
    feed(&mut j, 0, line(LAUNCH));
    feed(&mut j, 100, line(LOAD));
    feed(&mut j, 200, Input::Gpu(GpuFact { total_mib: 4096, describe: "4.0 GiB".into() }));
    feed(&mut j, 300, line(LOADED));
    assert_eq!(j.gpu_at_end().get(&Phase::Weights), Some(&4096));
}
