//! Speculation proofs driven by the built-in profiles: every case of `tests/proof/cases.toml` (a command
//! line, the server's answer, its metrics page before and after the proof, its server-info answer, its
//! log) goes through the profile's pointers and names, the core's readers and the proof stage, as the
//! binary's I/O would feed them (`crates/vigil/src/sources/proof.rs`, which the replaying stand-in test
//! in `crates/vigil/tests/proof.rs` runs on the same cases).

use serde::Deserialize;
use serde_json::Value;
use std::path::{Path, PathBuf};
use vigil_core::proof::{self, Generation, Proof, ProofConfig, Step};
use vigil_core::*;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Cases {
    case: Vec<Case>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    name: String,
    server: String,
    argv: Vec<String>,
    answer: String,
    metrics_before: Option<String>,
    metrics_after: Option<String>,
    server_info: Option<String>,
    log: Option<String>,
    verdict: String,
    says: String,
    /// Where the files came from: rendered from a server's source, or captured from a run.
    rendered: String,
}

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/proof")
}

fn read(name: &str) -> String {
    std::fs::read_to_string(dir().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn cases() -> Vec<Case> {
    toml::from_str::<Cases>(&read("cases.toml")).expect("cases.toml").case
}

/// What the binary's proof gathers for a case (the order of `sources/proof.rs::generate_with`): the answer's
/// own numbers, else the metrics delta, else the accept length; an absent page answers 404.
fn gather(profiles: &Profiles, c: &Case, read_spec: bool) -> Generation {
    let spec = profiles.proof_for(Some(&c.server));
    let v: Value = serde_json::from_str(&read(&c.answer)).expect("answer is JSON");
    let (tokens, mut stats) = proof::read_answer(spec, &v);
    let mut note = None;
    let counters = spec.speculation.as_ref().and_then(|s| s.metrics.as_ref()).filter(|_| read_spec);
    if let (Some(m), None) = (counters, &stats) {
        let path = m.path.clone().unwrap_or_else(|| "/metrics".into());
        let before = c.metrics_before.as_deref().map(read);
        match c.metrics_after.as_deref().map(read) {
            Some(after) => match proof::metrics_delta(before.as_deref(), &after, m) {
                Ok(s) => stats = Some(s),
                Err(e) => note = Some(format!("{e} ({path})")),
            },
            None => note = Some(format!("{path} answered HTTP 404")),
        }
    }
    if let (true, None, None, Some(ep)) = (read_spec, &stats, &note, &spec.accept_length_endpoint) {
        match c.server_info.as_deref().map(read) {
            Some(t) => stats = proof::read_accept_length(spec, &serde_json::from_str(&t).expect("server info JSON")),
            None => note = Some(format!("{ep} answered HTTP 404")),
        }
    }
    Generation {
        ok: tokens > 0,
        endpoint: spec.endpoint.clone(),
        tokens,
        ms: 5,
        note: format!("{tokens} tokens in 5 ms"),
        spec: stats,
        spec_note: note,
    }
}

/// The judge's ready, then the proof stage on the case's log and gathered answer.
fn run(profiles: &Profiles, c: &Case) -> Report {
    let mut cfg = ProofConfig::default();
    cfg.set_speculation(profiles, Some(&c.server), &c.argv);
    let read_spec = cfg.spec.is_some();
    let mut p = Proof::new(cfg);
    let mut classifier = Classifier::new(profiles, Some(&c.server));
    for raw in c.log.as_deref().map(read).unwrap_or_default().lines() {
        p.line(&classifier.classify(raw).message);
    }
    let mut j = Judge::new(JudgeConfig::default());
    j.set_server(&c.server);
    let ev = j.feed(Fact { at: Some(1000), input: Input::Probe(ProbeOutcome::Ok) });
    let Some(Event::Verdict(r)) = ev.into_iter().find(|e| matches!(e, Event::Verdict(_))) else {
        panic!("{}: no ready from the judge", c.name)
    };
    assert_eq!(p.judge_ready(1000, *r, None), Step::Prove, "{}", c.name);
    let g = gather(profiles, c, read_spec);
    assert!(g.ok, "{}: the answer has no tokens", c.name);
    match p.generation(1100, &g, None) {
        Step::Ready { report, .. } => *report,
        s => panic!("{}: {s:?}", c.name),
    }
}

#[test]
fn every_case_gets_its_verdict_from_the_profiles() {
    let profiles = Profiles::builtin();
    let cases = cases();
    assert!(cases.len() >= 10);
    for c in &cases {
        assert!(!c.rendered.trim().is_empty(), "{}: say where the files came from", c.name);
        let r = run(&profiles, c);
        assert_eq!(r.verdict, Verdict::Ready, "{}", c.name);
        match c.verdict.as_str() {
            "degraded" => {
                let d = r.degraded.as_deref().unwrap_or_else(|| panic!("{}: not degraded: {:?}", c.name, r.detail));
                assert!(d.contains(&c.says), "{}: degraded {d:?} lacks {:?}", c.name, c.says);
            }
            "ready" => {
                assert!(r.degraded.is_none(), "{}: degraded {:?}", c.name, r.degraded);
                let d = r.detail.unwrap_or_default();
                assert!(d.contains(&c.says), "{}: detail {d:?} lacks {:?}", c.name, c.says);
            }
            v => panic!("{}: verdict is ready or degraded, not {v}", c.name),
        }
    }
}

/// Without speculation on the command line, nothing is said of it, whatever the answer carries.
#[test]
fn no_speculation_asked_says_nothing_of_it() {
    let profiles = Profiles::builtin();
    for c in cases().iter().filter(|c| c.name.ends_with("-no-speculation")) {
        let d = run(&profiles, c).detail.unwrap_or_default();
        assert!(!d.contains("speculation"), "{}: {d}", c.name);
    }
    // and the SGLang answer with counts, under a command without --speculative-algorithm
    let mut c = cases().into_iter().find(|c| c.name == "sglang-eagle3-random-draft").unwrap();
    c.argv = vec!["python3".into(), "-m".into(), "sglang.launch_server".into(), "--model-path".into(), "m".into()];
    let r = run(&profiles, &c);
    assert!(r.degraded.is_none() && !r.detail.unwrap_or_default().contains("speculation"));
}

/// The command lines each built-in profile reads as asking for speculation (and the method it names).
#[test]
fn the_profiles_read_the_command_lines() {
    let p = Profiles::builtin();
    let argv = |s: &str| s.split_whitespace().map(String::from).collect::<Vec<_>>();
    let asked = |k: &str, s: &str| proof::speculation_asked(&p, Some(k), &argv(s));
    let method = |k: &str, s: &str| asked(k, s).and_then(|a| a.method);
    // vLLM: the JSON config (any spelling), the split flags, the old flags
    assert_eq!(method("vllm", r#"vllm serve m --speculative-config {"method":"eagle3"}"#).as_deref(), Some("eagle3"));
    assert_eq!(method("vllm", r#"vllm serve m --speculative_config={"method":"mtp"}"#).as_deref(), Some("mtp"));
    assert_eq!(method("vllm", "vllm serve m --spec-method draft_model --spec-model d").as_deref(), Some("draft_model"));
    assert!(asked("vllm", "vllm serve m --spec-tokens 3").is_some());
    assert!(asked("vllm", "python -m vllm.entrypoints.openai.api_server --speculative-model [ngram]")
        .is_some_and(|a| a.text_drafter));
    assert!(asked("vllm", r#"vllm serve m -sc {"method":"suffix"}"#).is_some_and(|a| a.text_drafter));
    assert!(asked("vllm", "vllm serve m --max-model-len 4096").is_none());
    // SGLang: the algorithm, NGRAM in any case
    assert_eq!(method("sglang", "sglang serve --speculative-algorithm EAGLE3").as_deref(), Some("EAGLE3"));
    assert!(asked("sglang", "sglang serve --speculative-algorithm ngram").is_some_and(|a| a.text_drafter));
    assert!(asked("sglang", "sglang serve --speculative-draft-model-path d").is_none());
    // llama-server: a draft model, or a --spec-type other than none
    assert!(asked("llama-cpp", "llama-server -m t.gguf -md d.gguf").is_some());
    assert!(asked("llama-cpp", "llama-server -m t.gguf --spec-type none").is_none());
    assert!(asked("llama-cpp", "llama-server -m t.gguf --spec-type ngram-simple,ngram-map-k")
        .is_some_and(|a| a.text_drafter));
    assert!(asked("llama-cpp", "llama-server -m t.gguf --spec-type ngram-simple,draft-simple")
        .is_some_and(|a| !a.text_drafter));
    // a kind without its own rules (TGI) or an unknown one: any profile's rules
    assert!(asked("tgi", "wrapper.sh --speculative-algorithm EAGLE").is_some());
    assert!(proof::speculation_asked(&p, None, &argv("run.sh -md d.gguf")).is_some());
    assert!(proof::speculation_asked(&p, None, &argv("run.sh --port 1")).is_none());
}
