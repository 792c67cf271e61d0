//! The process tree as a fact, on virtual time: which processes are engines, and what their death
//! means to the judge before and after ready.

use regex::Regex;
use vigil_core::judge::ProbeOutcome;
use vigil_core::tree::EngineBy;
use vigil_core::*;

fn p(pid: i32, title: &str, gpu_mib: u64) -> ProcSample {
    ProcSample { pid, start: pid as u64 * 10, title: title.into(), gpu_mib }
}

fn sample(root_alive: bool, procs: Vec<ProcSample>) -> TreeSample {
    TreeSample { root_alive, procs }
}

fn titles() -> Vec<Regex> {
    // the built-in SGLang and vLLM titles
    let ps = Profiles::builtin();
    let mut v = ps.get("sglang").unwrap().engine_titles.clone();
    v.extend(ps.get("vllm").unwrap().engine_titles.clone());
    v
}

#[test]
fn titled_engine_death_while_root_lives_is_named() {
    let mut w = TreeWatch::new(titles());
    assert!(w.observe(0, &sample(true, vec![p(10, "python3 -m sglang.launch_server", 0)])).is_empty());
    // setproctitle runs after the fork: the title appears in a later sample
    assert!(w
        .observe(500, &sample(true, vec![p(10, "sglang::scheduler_TP0", 0), p(11, "sglang::detokenizer", 0)]))
        .is_empty());
    let d = w.observe(1000, &sample(true, vec![p(11, "sglang::detokenizer", 0)]));
    assert_eq!(d.len(), 1);
    assert_eq!(
        (d[0].pid, d[0].title.as_str(), d[0].by, d[0].lived_ms),
        (10, "sglang::scheduler_TP0", EngineBy::Title, 1000)
    );
    assert!(d[0].describe().contains("sglang::scheduler_TP0"), "{}", d[0].describe());
}

#[test]
fn vllm_titles_are_engines() {
    let mut w = TreeWatch::new(titles());
    w.observe(0, &sample(true, vec![p(20, "VLLM::EngineCore", 0), p(21, "VLLM::Worker_TP1", 0)]));
    assert_eq!(w.engines().len(), 2);
    let d = w.observe(100, &sample(true, vec![p(20, "VLLM::EngineCore", 0)]));
    assert_eq!(d[0].title, "VLLM::Worker_TP1");
}

#[test]
fn untitled_gpu_holder_is_an_engine_and_a_helper_is_not() {
    let mut w = TreeWatch::new(vec![]);
    w.observe(0, &sample(true, vec![p(30, "python3 worker.py", 70_000), p(31, "/usr/bin/gcc -O2 x.c", 0)]));
    // the compiler ends: nothing
    assert!(w.observe(100, &sample(true, vec![p(30, "python3 worker.py", 70_000)])).is_empty());
    // a short-lived tokenizer pool comes and goes: nothing
    w.observe(200, &sample(true, vec![p(30, "python3 worker.py", 70_000), p(32, "python3 -c tokenize", 0)]));
    assert!(w.observe(300, &sample(true, vec![p(30, "python3 worker.py", 70_000)])).is_empty());
    let d = w.observe(400, &sample(true, vec![]));
    assert_eq!((d[0].pid, d[0].by, d[0].gpu_mib), (30, EngineBy::Gpu, 70_000));
    assert!(d[0].describe().contains("68.4 GiB"), "{}", d[0].describe());
}

#[test]
fn a_reused_pid_is_another_process() {
    let mut w = TreeWatch::new(titles());
    w.observe(0, &sample(true, vec![p(40, "VLLM::EngineCore", 0)]));
    let other = ProcSample { pid: 40, start: 999, title: "sh -c true".into(), gpu_mib: 0 };
    let d = w.observe(100, &sample(true, vec![other]));
    assert_eq!(d.len(), 1, "the engine died even though its pid lives on in another process");
}

#[test]
fn nothing_when_the_root_died_too() {
    let mut w = TreeWatch::new(titles());
    w.observe(0, &sample(true, vec![p(50, "VLLM::EngineCore", 0)]));
    assert!(w.observe(100, &sample(false, vec![])).is_empty(), "the server's exit is the fact then");
}

fn death() -> EngineDeath {
    EngineDeath { pid: 77, title: "standin::engine".into(), by: EngineBy::Title, gpu_mib: 0, lived_ms: 5000 }
}

fn live() -> JudgeConfig {
    JudgeConfig {
        live: true,
        stall_enabled: true,
        require_probe: true,
        stall_default_ms: Some(600_000),
        unhealthy_after_ms: Some(30_000),
        ..JudgeConfig::default()
    }
}

fn feed(j: &mut Judge, at: u64, i: Input) -> Option<Report> {
    j.feed(Fact { at: Some(at), input: i }).into_iter().find_map(|e| match e {
        Event::Verdict(r) => Some(*r),
        _ => None,
    })
}

#[test]
fn engine_death_before_ready_is_crashed_engine_dead_after_the_quiet_period() {
    let mut j = Judge::new(live());
    feed(&mut j, 0, Input::Tick);
    assert!(feed(&mut j, 1000, Input::EngineDied(death())).is_none(), "the log gets its chance first");
    assert!(feed(&mut j, 2000, Input::Tick).is_none());
    let r = feed(&mut j, 2500, Input::Tick).expect("verdict after the quiet period");
    assert_eq!((r.verdict, r.cause), (Verdict::Crashed, Some(Cause::EngineDead)));
    assert!(r.detail.as_deref().unwrap().contains("standin::engine"), "{:?}", r.detail);
    assert!(r.detail.as_deref().unwrap().contains("pid 77"), "{:?}", r.detail);
}

#[test]
fn engine_death_after_ready_is_unhealthy_engine_dead() {
    let mut j = Judge::new(live());
    feed(&mut j, 0, Input::Tick);
    let r = feed(&mut j, 100, Input::Probe(ProbeOutcome::Ok)).unwrap();
    assert_eq!(r.verdict, Verdict::Ready);
    feed(&mut j, 5000, Input::EngineDied(death()));
    // health still answers: the process tree decides, not the probe
    assert!(feed(&mut j, 5500, Input::Probe(ProbeOutcome::Ok)).is_none());
    let r = feed(&mut j, 6600, Input::Tick).expect("verdict");
    assert_eq!((r.verdict, r.phase, r.cause), (Verdict::Unhealthy, Phase::Serving, Some(Cause::EngineDead)));
    assert!(r.detail.as_deref().unwrap().contains("standin::engine"));
}

#[test]
fn the_servers_exit_within_the_quiet_period_wins_and_names_the_engine() {
    let mut j = Judge::new(live());
    feed(&mut j, 0, Input::Tick);
    feed(&mut j, 1000, Input::EngineDied(death()));
    let r = feed(&mut j, 1200, Input::Exit(ExitInfo { code: None, signal: Some(9), ours: true })).unwrap();
    assert_eq!((r.verdict, r.cause), (Verdict::Crashed, Some(Cause::Killed)));
    assert!(r.detail.as_deref().unwrap().contains("standin::engine"), "{:?}", r.detail);
}

#[test]
fn a_log_cause_in_the_quiet_period_wins() {
    let ps = Profiles::builtin();
    let mut c = Classifier::new(&ps, Some("sglang"));
    let mut j = Judge::new(live());
    feed(&mut j, 0, Input::Tick);
    feed(&mut j, 1000, Input::EngineDied(death()));
    let l = c.classify("[2025-08-08 09:09:09 TP0] Scheduler hit an exception: Traceback (most recent call last):");
    feed(&mut j, 1100, Input::Line(Box::new(l)));
    let l = c.classify("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB");
    feed(&mut j, 1200, Input::Line(Box::new(l)));
    let r = feed(&mut j, 4000, Input::Tick).expect("verdict");
    assert_eq!(r.verdict, Verdict::Crashed);
    assert_eq!(r.cause, Some(Cause::GpuOom), "{r:?}");
    assert!(r.detail.as_deref().unwrap_or("").contains("standin::engine"), "{:?}", r.detail);
}

#[test]
fn an_orderly_shutdown_is_not_an_engine_death() {
    let ps = Profiles::builtin();
    let mut c = Classifier::new(&ps, Some("vllm"));
    let mut j = Judge::new(live());
    feed(&mut j, 0, Input::Tick);
    feed(&mut j, 100, Input::Probe(ProbeOutcome::Ok));
    let l = c.classify("INFO 08-08 09:09:09 [launcher.py:80] Shutting down FastAPI HTTP server.");
    feed(&mut j, 200, Input::Line(Box::new(l)));
    feed(&mut j, 300, Input::EngineDied(death()));
    assert!(feed(&mut j, 5000, Input::Tick).is_none());
    assert_eq!(j.state(), Verdict::Ready);
}
