//! The whole logs captured from a real vLLM 0.26.0 and SGLang 0.5.17 on the GPU machine (`corpus/captured/`,
//! issue #23), replayed through the judge as the live watch runs it: live mode, the server kind known from the
//! command, one line every 20 ms of virtual time, the health probe answering once the log says the HTTP side is
//! up, then the end the run had — the process's exit status from the keeper (`LIVE.tsv`), or, for a start that
//! stopped moving, ticks past the stall limit. The verdict must be the one `LIVE.tsv` names, written from the
//! logs before any rule change (not from what vigil said on the GPU).
//!
//! The offline reading of the same files is the corpus test (`corpus.rs`); `vigil diagnose` on them is
//! `crates/vigil/tests/diagnose_cli.rs`.

use std::path::PathBuf;

use vigil_core::classify::Classifier;
use vigil_core::judge::{Event, ExitInfo, Fact, Input, Judge, JudgeConfig, ProbeOutcome};
use vigil_core::profile::Profiles;
use vigil_core::types::{Phase, Verdict};

const STEP_MS: u64 = 20;
const STALL_MS: u64 = 15_000;

struct Case {
    file: String,
    running: bool,
    code: Option<i32>,
    signal: Option<i32>,
    verdicts: Vec<String>,
    cause: Option<String>,
}

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../corpus/captured")
}

fn cases() -> Vec<Case> {
    let t = std::fs::read_to_string(dir().join("LIVE.tsv")).expect("corpus/captured/LIVE.tsv");
    t.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            let num = |s: &str| s.parse::<i32>().ok();
            let (v, c) = f[3].split_once('/').map_or((f[3], None), |(v, c)| (v, Some(c.to_string())));
            Case {
                file: f[0].to_string(),
                running: f[1] == "running",
                code: num(f[1]),
                signal: num(f[2]),
                verdicts: v.split('|').map(str::to_string).collect(),
                cause: c,
            }
        })
        .collect()
}

fn body(file: &str) -> (String, String) {
    let raw = std::fs::read(dir().join(file)).unwrap();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\n# ---\n").expect("header terminator");
    let server = head.lines().find_map(|l| l.strip_prefix("# SERVER: ")).unwrap().trim().to_string();
    (server, body.to_string())
}

/// The verdict, phase and cause the live judge reaches for one captured run.
fn replay(profiles: &Profiles, c: &Case) -> (Verdict, Phase, Option<String>) {
    let (server, body) = body(&c.file);
    let mut cfg = JudgeConfig {
        live: true,
        require_probe: true,
        stall_enabled: true,
        stall_default_ms: Some(10 * 60_000),
        ..JudgeConfig::default()
    };
    if c.verdicts.iter().any(|v| v == "stalled") {
        // the runs that stopped moving were watched with `--stall cuda_graphs=15s`
        cfg.stall_ms.insert(Phase::CudaGraphs, STALL_MS);
    }
    let mut j = Judge::new(cfg);
    j.set_server(&server);
    let mut cl = Classifier::new(profiles, Some(&server));
    let mut now = 0;
    let mut probe_ok = false;
    let mut last = None;
    let mut take = |evs: Vec<Event>, probe_ok: &mut bool| {
        for e in evs {
            match e {
                Event::ProbeNow { .. } => *probe_ok = true,
                Event::Verdict(r) => last = Some(*r),
                _ => {}
            }
        }
    };
    for raw in body.split(['\n', '\r']) {
        now += STEP_MS;
        let line = cl.classify(raw);
        let evs = j.feed(Fact { at: Some(now), input: Input::Line(Box::new(line)) });
        take(evs, &mut probe_ok);
        if probe_ok && j.state() == Verdict::Starting {
            let evs = j.feed(Fact { at: Some(now), input: Input::Probe(ProbeOutcome::Ok) });
            take(evs, &mut probe_ok);
        }
    }
    let exited = !c.running && c.verdicts.iter().all(|v| v != "stalled" && v != "starting");
    if c.running {
        // alive and ready when the capture was taken: time passes, nothing else
        for _ in 0..5 {
            now += 1000;
            let evs = j.feed(Fact { at: Some(now), input: Input::Tick });
            take(evs, &mut probe_ok);
        }
    } else if exited {
        // the keeper's exit status, once the log has drained
        now += 200;
        let x = ExitInfo { code: c.code, signal: c.signal, ours: true };
        let evs = j.feed(Fact { at: Some(now), input: Input::Exit(x) });
        take(evs, &mut probe_ok);
    } else {
        // alive and silent: ticks until the stall limit has passed
        for _ in 0..40 {
            now += 1000;
            let evs = j.feed(Fact { at: Some(now), input: Input::Tick });
            take(evs, &mut probe_ok);
        }
    }
    let r = last.unwrap_or_else(|| j.final_report());
    (r.verdict, r.phase, r.cause.map(|c| c.as_str().to_string()))
}

#[test]
fn captured_runs_reach_their_live_verdict() {
    let profiles = Profiles::builtin();
    let cases = cases();
    assert!(cases.len() >= 40, "LIVE.tsv lists {} runs", cases.len());
    let mut bad = Vec::new();
    for c in &cases {
        let (v, p, cause) = replay(&profiles, c);
        let ok_v = c.verdicts.iter().any(|x| x == v.as_str());
        let ok_c = c.cause.as_ref().is_none_or(|want| cause.as_deref() == Some(want.as_str()));
        let line =
            format!("{:<40} {:<10} {:<18} {:<12}", c.file, v.as_str(), p.as_str(), cause.as_deref().unwrap_or("-"));
        println!("{line} {}", if ok_v && ok_c { "ok" } else { "MISMATCH" });
        if !(ok_v && ok_c) {
            bad.push(format!("{line} (want {} {})", c.verdicts.join("|"), c.cause.as_deref().unwrap_or("-")));
        }
    }
    assert!(bad.is_empty(), "live replays off:\n{}", bad.join("\n"));
}
