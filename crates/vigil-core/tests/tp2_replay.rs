//! Real tensor-parallel-2 starts of vLLM 0.26.0 and SGLang 0.5.17 on the GPU machine, every rank under vigil
//! (issue #32, `tests/gpu/tp2.sh`: two nodes on one GPU), replayed here through the multi-node judge on virtual
//! time, so CI checks what the GPU run saw. Each capture (`crates/vigil/tests/gpu-captures/<server>-tp2-<name>/`)
//! holds both ranks' whole `server.log` (`rankN.log`), how each rank's server ended (`rankN.end`: `exit CODE`,
//! `signal N`, `running` or `stalled`, from the run's state and the scenario's notes), both vigils' `--json`
//! lines (`rankN.jsonl`: the live verdict and, at a failure, each rank's evidence) and `LABEL`, written from what
//! was done to which rank before vigil's output was read: `verdict phase cause rank`.
//!
//! Each rank's log goes through the live judge as the watch runs it (captured_live.rs: one line every 20 ms, the
//! probe answering once the log says HTTP is up for rank 0, then the rank's end); the ranks' ends go to
//! `fleet::MultiNode` with rank 0's FIRST (the rank that complains loudest), a failure whose root-cause lines
//! say a peer went away as a consequence (`Profiles::peer_gone`), and the evidence lines of a stopped process
//! as the stuck rank. The outcome must be the label's, and the one the head said live.

use std::path::{Path, PathBuf};

use vigil_core::classify::Classifier;
use vigil_core::fleet::{MultiNode, MultiStep, SETTLE_MS};
use vigil_core::judge::{Event, ExitInfo, Fact, Input, Judge, JudgeConfig, ProbeOutcome, Report};
use vigil_core::outcome::Exit;
use vigil_core::profile::Profiles;
use vigil_core::types::{Phase, Verdict};

const STEP_MS: u64 = 20;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../vigil/tests/gpu-captures")
}

fn captures() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(root())
        .map(|d| d.flatten().map(|e| e.path()).filter(|p| p.join("LABEL").is_file()).collect())
        .unwrap_or_default();
    v.retain(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.contains("-tp2-")));
    v.sort();
    v
}

/// How a rank's server ended.
enum End {
    Exit(ExitInfo),
    Running,
    Stalled,
}

fn end_of(dir: &Path, r: usize) -> End {
    let t = std::fs::read_to_string(dir.join(format!("rank{r}.end"))).unwrap_or_default();
    let w: Vec<&str> = t.split_whitespace().collect();
    match w.as_slice() {
        ["exit", c] => End::Exit(ExitInfo { code: c.parse().ok(), signal: None, ours: true }),
        ["signal", s] => End::Exit(ExitInfo { code: None, signal: s.parse().ok(), ours: true }),
        ["stalled"] => End::Stalled,
        _ => End::Running,
    }
}

/// Rank `r`'s log through the live judge, then its end; its first verdict's report and the virtual time of the verdict.
fn replay_rank(profiles: &Profiles, server: &str, dir: &Path, r: usize, stall: Option<u64>) -> Report {
    let text = std::fs::read(dir.join(format!("rank{r}.log"))).expect("rank log");
    let text = String::from_utf8_lossy(&text);
    let mut cfg = JudgeConfig {
        live: true,
        require_probe: r == 0,
        stall_enabled: true,
        stall_default_ms: Some(10 * 60_000),
        ..JudgeConfig::default()
    };
    if let Some(ms) = stall {
        cfg.stall_ms.insert(Phase::CudaGraphs, ms);
    }
    let mut j = Judge::new(cfg);
    j.set_server(server);
    let mut cl = Classifier::new(profiles, Some(server));
    let (mut now, mut probe_ok, mut last) = (0u64, false, None);
    let mut take = |evs: Vec<Event>, probe_ok: &mut bool| {
        for e in evs {
            match e {
                Event::ProbeNow { .. } => *probe_ok = true,
                // the first verdict: a watch ends at ready (or at a failure); what comes after ready is the
                // multi-node driver's, modelled in the test below
                Event::Verdict(rep) if last.is_none() => last = Some(*rep),
                _ => {}
            }
        }
    };
    for raw in live_lines(&text) {
        now += STEP_MS;
        let evs = j.feed(Fact { at: Some(now), input: Input::Line(Box::new(cl.classify(&raw))) });
        take(evs, &mut probe_ok);
        if r == 0 && probe_ok && j.state() == Verdict::Starting {
            let evs = j.feed(Fact { at: Some(now), input: Input::Probe(ProbeOutcome::Ok) });
            take(evs, &mut probe_ok);
        }
    }
    match end_of(dir, r) {
        End::Exit(x) => {
            now += 200;
            let evs = j.feed(Fact { at: Some(now), input: Input::Exit(x) });
            take(evs, &mut probe_ok);
        }
        End::Stalled => {
            for _ in 0..40 {
                now += 1000;
                let evs = j.feed(Fact { at: Some(now), input: Input::Tick });
                take(evs, &mut probe_ok);
            }
        }
        End::Running => {}
    }
    last.unwrap_or_else(|| j.final_report())
}

/// The log's lines as the live reader hands them on (crates/vigil/src/sources/lines.rs): `\n`, `\r\n` and bare
/// `\r` end a line, and a writer's line tag before a bar's first `\r` (vLLM's `(Worker_TP0 pid=N) `) heads each
/// state of that bar.
fn live_lines(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in text.split('\n') {
        let mut parts = line.split('\r');
        let first = parts.next().unwrap_or("");
        let rest: Vec<&str> = parts.filter(|p| !p.is_empty()).collect();
        let tag = !rest.is_empty() && first.len() <= 96 && (first.ends_with(") ") || first.ends_with("] "));
        if tag {
            out.extend(rest.iter().map(|p| format!("{first}{p}")));
        } else {
            out.extend(std::iter::once(first).chain(rest).map(String::from));
        }
    }
    out
}

/// A rank's own evidence, as its vigil saved it (its `evidence` events, its verdict's evidence lines), shows a
/// stopped process. Notes are not evidence: the head repeats a rank's stopped line in its own output.
fn evidence_says_stopped(dir: &Path, r: usize) -> bool {
    let t = std::fs::read_to_string(dir.join(format!("rank{r}.jsonl"))).unwrap_or_default();
    t.lines().filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()).any(|e| match e["event"].as_str() {
        Some("evidence") => e["procs"].as_array().is_some_and(|ps| ps.iter().any(|p| p["state"].as_str() == Some("T"))),
        Some("verdict") => e["evidence"].as_array().is_some_and(|ls| {
            ls.iter().any(|l| l.as_str().is_some_and(|l| l.contains(vigil_core::evidence::STOPPED_MARK)))
        }),
        _ => false,
    })
}

/// The head's live combined verdict: the last `multi_node_verdict` of rank 0's `--json` lines (its exit code
/// and deciding rank). A capture whose live verdict was wrong, and fixed after the run, says so in `LIVE`.
struct Live {
    exit: i64,
    by: Option<u64>,
    /// The head's phase and cause (captures before b5ad55b carry none).
    phase: Option<String>,
    cause: Option<String>,
}

fn live(dir: &Path) -> Option<Live> {
    let t = std::fs::read_to_string(dir.join("rank0.jsonl")).ok()?;
    let v = t
        .lines()
        .rev()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|e| e["event"] == "multi_node_verdict")?;
    Some(Live {
        exit: v["exit"].as_i64().unwrap_or(-1),
        by: v["decided_by"]["rank"].as_u64(),
        phase: v["phase"].as_str().map(String::from),
        cause: v["cause"].as_str().map(String::from),
    })
}

#[test]
fn tp2_captures_replay_to_their_label_and_to_what_the_head_said() {
    let profiles = Profiles::builtin();
    let caps = captures();
    let mut bad = Vec::new();
    for dir in &caps {
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        let server = if name.starts_with("sglang") { "sglang" } else { "vllm" };
        let label = std::fs::read_to_string(dir.join("LABEL")).unwrap();
        let f: Vec<&str> = label.split_whitespace().collect();
        let (want_v, want_p, want_c, want_r) = (f[0], f[1], f[2], f[3].parse::<usize>().unwrap());
        let stall = f.get(4).and_then(|s| s.strip_prefix("stall_ms=")).and_then(|s| s.parse().ok());
        let mut m = MultiNode::new(2);
        let mut reports = Vec::new();
        for r in 0..2 {
            let rep = replay_rank(&profiles, server, dir, r, stall);
            reports.push(rep);
        }
        // rank 0 first: the one that complains loudest
        let mut step = MultiStep::Wait;
        for (r, rep) in reports.iter().enumerate() {
            if rep.verdict == Verdict::Starting {
                continue;
            }
            let lines = rep.evidence.iter().map(String::as_str).chain(rep.detail.as_deref());
            let consequence = rep.verdict != Verdict::Ready && profiles.peer_gone(Some(server), lines);
            if step == MultiStep::Wait {
                step = m.ended_at(r, Exit::for_verdict(rep.verdict), consequence, 1_000 + r as u64);
            }
        }
        if step == MultiStep::Wait {
            let _ = m.settled(1_000 + SETTLE_MS);
        }
        for r in 0..2 {
            if evidence_says_stopped(dir, r) {
                m.stuck(r);
            }
        }
        let failed = |r: &Report| r.verdict != Verdict::Starting && r.verdict != Verdict::Ready;
        // rank 0 ready: the server served (a rank without readiness of its own follows it); a rank's end after
        // that is a crash of the server, in serving, of the cause its log names (supervise/multinode.rs)
        let after_ready =
            (reports[0].verdict == Verdict::Ready).then(|| (1..2).find(|&r| failed(&reports[r]))).flatten();
        let (exit, by) = match after_ready {
            Some(r) => (Exit::Crashed, Some(r)),
            None => m.outcome(),
        };
        let decider = by.map(|r| &reports[r]);
        let got_v = match exit {
            Exit::Ready => "ready",
            Exit::Crashed => "crashed",
            Exit::Stalled => "stalled",
            Exit::Timeout => "timeout",
            Exit::Unhealthy => "unhealthy",
            _ => "starting",
        };
        // the server's phase as the head decides it (fleet::server_phase): a rank's own verdict's phase where it
        // failed, else the phase its log reached
        let mut own: Vec<Option<Phase>> = reports.iter().map(|r| failed(r).then_some(r.phase)).collect();
        if let Some(r) = after_ready {
            own[r] = Some(Phase::Serving);
        }
        let seen: Vec<Option<Phase>> = reports.iter().map(|r| Some(r.phase)).collect();
        let got_p = vigil_core::fleet::server_phase(&own, &seen, exit, by).map_or("-", |p| p.as_str());
        let got_c = decider.and_then(|r| r.cause).map_or("-", |c| c.as_str());
        let got_r = by.map_or("-".to_string(), |r| r.to_string());
        let line = format!("{name:<28} {got_v:<9} {got_p:<12} {got_c:<12} rank {got_r}");
        let ok = got_v == want_v
            && (want_p == "-" || want_p.split('|').any(|p| p == got_p))
            && (want_c == "-" || want_c.split('|').any(|c| c == got_c))
            && by == (want_v != "ready").then_some(want_r);
        let live = live(dir);
        let want_exit = match want_v {
            "ready" => 0,
            "crashed" => 3,
            "stalled" => 4,
            _ => -1,
        };
        let fixed_after = std::fs::read_to_string(dir.join("LIVE")).ok();
        let fits = |want: &str, got: &Option<String>| {
            want == "-" || got.as_deref().is_none_or(|g| want.split('|').any(|w| w == g))
        };
        let live_ok = fixed_after.is_some()
            || live.as_ref().is_none_or(|l| {
                l.exit == want_exit
                    && (want_v == "ready" || l.by == Some(want_r as u64))
                    && fits(want_p, &l.phase)
                    && fits(want_c, &l.cause)
            });
        let said = live.as_ref().map(|l| format!("exit {} rank {:?} {:?} {:?}", l.exit, l.by, l.phase, l.cause));
        println!("{line}  label {}  live {said:?}  {}", label.trim(), if ok && live_ok { "ok" } else { "MISMATCH" });
        if !(ok && live_ok) {
            bad.push(format!("{line} (label {}; live {said:?})", label.trim()));
        }
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        assert!(caps.len() >= 8, "the TP=2 captures are missing ({} found under {})", caps.len(), root().display());
    }
    assert!(bad.is_empty(), "TP=2 replays off:\n{}", bad.join("\n"));
}
