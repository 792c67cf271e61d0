//! The frame table (issue #24) on tracebacks built from the servers' own call graphs, not from corpus logs:
//! `frames-chains.tsv` holds call chains that `scripts/frames/gen.py` read from the source of SGLang, vLLM and
//! TGI (an entry of a phase, then what it calls, down to a function the table places in that phase). Each
//! becomes a Python traceback (outermost frame first, as CPython prints it) that ends in an exception with no
//! phase line before it, and the judge must name the chain's phase.

use std::collections::{BTreeMap, BTreeSet};
use vigil_core::{diagnose_text, Phase, Profiles, Verdict};

const CHAINS: &str = include_str!("frames-chains.tsv");

struct Chain {
    server: String,
    phase: String,
    frames: Vec<(String, String, String)>,
}

fn chains() -> Vec<Chain> {
    CHAINS
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            let frames = f[3]
                .split(" > ")
                .map(|x| {
                    let mut it = x.splitn(3, ':');
                    (it.next().unwrap().into(), it.next().unwrap().into(), it.next().unwrap().into())
                })
                .collect();
            Chain { server: f[0].into(), phase: f[1].into(), frames }
        })
        .collect()
}

fn traceback(frames: &[(String, String, String)]) -> String {
    let mut t = String::from("Traceback (most recent call last):\n");
    for (file, line, func) in frames {
        t.push_str(&format!("  File \"/opt/venv/lib/python3.12/site-packages/{file}\", line {line}, in {func}\n"));
        t.push_str("    do_the_work()\n");
    }
    t.push_str("RuntimeError: something failed here\n");
    t
}

fn diagnose(server: &str, text: &str) -> (Verdict, Phase) {
    let r = diagnose_text(&Profiles::builtin(), Some(server), text);
    (r.verdict, r.phase)
}

#[test]
fn every_chain_read_from_the_source_gives_its_phase() {
    let mut wrong = Vec::new();
    let all = chains();
    assert!(all.len() >= 30, "{} chains", all.len());
    for c in &all {
        let (v, p) = diagnose(&c.server, &traceback(&c.frames));
        if v != Verdict::Crashed || p.as_str() != c.phase {
            let names: Vec<&str> = c.frames.iter().map(|f| f.2.as_str()).collect();
            wrong.push(format!("{} {}: got {:?}/{} from {}", c.server, c.phase, v, p, names.join(" > ")));
        }
    }
    assert!(wrong.is_empty(), "{} of {} chains wrong:\n{}", wrong.len(), all.len(), wrong.join("\n"));
}

#[test]
fn the_table_covers_every_phase_each_server_has() {
    let mut by: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for c in chains() {
        by.entry(c.server).or_default().insert(c.phase);
    }
    let want = [
        (
            "sglang",
            &[
                "dist_init",
                "weights",
                "draft_weights",
                "kv_cache",
                "cuda_graphs",
                "draft_cuda_graphs",
                "warmup",
                "serving",
            ][..],
        ),
        ("vllm", &["dist_init", "weights", "draft_weights", "kv_cache", "compile", "cuda_graphs", "serving"][..]),
        ("tgi", &["dist_init", "weights", "kv_cache", "cuda_graphs", "warmup", "serving"][..]),
    ];
    for (server, phases) in want {
        for p in phases {
            assert!(by.get(server).is_some_and(|s| s.contains(*p)), "{server}: no chain for {p}: {:?}", by.get(server));
        }
    }
}

fn first(server: &str, phase: &str) -> Vec<(String, String, String)> {
    chains().into_iter().find(|c| c.server == server && c.phase == phase).map(|c| c.frames).unwrap()
}

#[test]
fn the_targets_loader_under_the_draft_workers_init_is_the_drafts() {
    // SGLang's draft worker builds a model runner like the target's: its frames outside, the loader's inside.
    let mut f = first("sglang", "draft_weights");
    f.extend(first("sglang", "weights"));
    assert_eq!(diagnose("sglang", &traceback(&f)), (Verdict::Crashed, Phase::DraftWeights));
    let mut f = first("sglang", "draft_cuda_graphs");
    f.extend(first("sglang", "cuda_graphs"));
    assert_eq!(diagnose("sglang", &traceback(&f)), (Verdict::Crashed, Phase::DraftCudaGraphs));
}

#[test]
fn serving_code_run_by_the_start_is_the_starts_phase() {
    // The capture's and the KV profiling's dummy forward run the same code as a request.
    for (server, phase) in [("sglang", "cuda_graphs"), ("vllm", "kv_cache"), ("vllm", "cuda_graphs")] {
        let mut f = first(server, phase);
        f.extend(first(server, "serving"));
        let (v, p) = diagnose(server, &traceback(&f));
        assert_eq!((v, p.as_str()), (Verdict::Crashed, phase), "{server}");
    }
}
