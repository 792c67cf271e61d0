//! The golden-table test (issue #13): every row of `tests/golden/check-golden.jsonl` that is not a
//! `harness_error` is run as a `vigil check` of the same command line, configs, environment and server
//! version, and vigil's answer is compared with what the server's own code returned: the derived context
//! length, accepted or refused (and, for a refused draft, the draft's derived length in the message).
//! Refresh the table with `python3 scripts/golden/refresh.py`, then run this test.

use super::*;
use crate::sinks::records::Finding;
use serde_json::Value;
use std::collections::BTreeMap;

/// Rows outside what vigil models, with the reason. Keep it short.
const EXCLUDED: &[(&str, &str)] = &[];

fn manifest() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Lays every config out as a model directory, as `scripts/golden/refresh.py` does.
fn lay_out(root: &Path) -> BTreeMap<String, PathBuf> {
    let mut m = BTreeMap::new();
    for (dir, prefix) in [(manifest().join("tests/golden/configs"), ""), (manifest().join("tests/configs"), "repo:")] {
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(stem) = name.strip_suffix(".json") else { continue };
            if stem.ends_with(".model.safetensors.index") {
                continue;
            }
            let key = format!("{prefix}{stem}");
            let d = root.join(key.replace(':', "_"));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::copy(e.path(), d.join("config.json")).unwrap();
            m.insert(key, d);
        }
    }
    let empty = root.join("x-empty");
    std::fs::create_dir_all(&empty).unwrap();
    m.insert("x-empty".into(), empty);
    m
}

fn derived_in(msg: &str) -> Option<u64> {
    let i = msg.find("derived context_length (")? + "derived context_length (".len();
    msg[i..].split(')').next()?.parse().ok()
}

#[test]
fn golden_table() {
    let text = std::fs::read_to_string(manifest().join("tests/golden/check-golden.jsonl")).unwrap();
    let root = std::env::temp_dir().join(format!("vigil-golden-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let models = lay_out(&root);
    let profiles = vigil_core::Profiles::builtin();
    let (mut compared, mut skipped, mut excluded) = (0, 0, 0);
    let mut confirmed_refusals = 0;
    let mut bad: Vec<String> = Vec::new();
    let rows: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    // vLLM refuses a TP that does not divide the heads before it builds the model: an `#attn#` row stands
    // for a launch only together with the `#tp#` row of the same config, version and size.
    let tp_refused: std::collections::BTreeSet<(String, String)> = rows
        .iter()
        .filter(|r| r["case"].as_str().unwrap().contains("#tp#") && r["result"]["accepted"] == false)
        .map(|r| (r["version"].as_str().unwrap().to_string(), r["case"].as_str().unwrap().replace("#tp#", "#attn#")))
        .collect();
    for r in &rows {
        if r["result"].get("harness_error").is_some() {
            skipped += 1;
            continue;
        }
        let case = r["case"].as_str().unwrap();
        let (server, version) = (r["server"].as_str().unwrap(), r["version"].as_str().unwrap());
        if EXCLUDED.iter().any(|(c, _)| *c == case) {
            excluded += 1;
            continue;
        }
        let kind = case.split('#').nth(1).unwrap_or("");
        let inputs = &r["inputs"];
        let res = &r["result"];
        let dir = &models[inputs["config"].as_str().unwrap()];
        let flags: Vec<String> =
            inputs["flags"].as_array().unwrap().iter().map(|f| f.as_str().unwrap().to_string()).collect();
        let env: Vec<(String, String)> = inputs["env"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
            .chain([("PATH".to_string(), "/nonexistent".to_string())])
            .collect();
        let mut argv: Vec<String> = match server {
            "sglang" => ["python3", "-m", "sglang.launch_server", "--model-path"].map(String::from).to_vec(),
            _ => ["vllm", "serve"].map(String::from).to_vec(),
        };
        argv.push(dir.display().to_string());
        argv.extend(flags.iter().cloned());
        if let Some(d) = inputs["draft"].as_str() {
            argv.extend([
                "--speculative-algorithm".into(),
                "EAGLE3".into(),
                "--speculative-draft-model-path".into(),
                models[d].display().to_string(),
            ]);
        }
        let mut accepted = res.get("accepted").and_then(|a| a.as_bool()).unwrap_or(res.get("context_len").is_some());
        if kind == "attn" && tp_refused.contains(&(version.to_string(), case.to_string())) {
            accepted = false;
        }
        let want = |k: &str| res.get(k).and_then(|v| v.as_i64());
        compared += 1;
        let tag = format!("{server} {version} {case} {:?} env {:?}", flags, inputs["env"]);
        if kind == "parse" {
            let l = launch::parse(&argv, Some(server), None, Some(version)).unwrap();
            let got = if server == "sglang" { l.context_length } else { l.max_model_len };
            match (accepted, want("parsed")) {
                (true, Some(-1)) if got.is_none() && l.bad_len.is_none() => {}
                (true, Some(n)) if got == Some(n as u64) && l.bad_len.is_none() => {}
                (false, _) if l.bad_len.is_some() => {}
                _ => bad.push(format!("{tag}: server {res}, vigil parsed {got:?} bad {:?}", l.bad_len)),
            }
            continue;
        }
        let inp = Inputs {
            argv: &argv,
            server: Some(server.to_string()),
            env: &env,
            cwd: &root,
            local_machine: false,
            version: Some(version.to_string()),
            state_root: None,
        };
        let rep = match check(&inp, &profiles) {
            Ok(r) => r,
            Err(e) => {
                bad.push(format!("{tag}: vigil usage error {e:?}"));
                continue;
            }
        };
        // The rules each kind of row speaks to (the table covers config-level checks only).
        let rules: &[&str] = match kind {
            "tp" => &["tp-heads", "model"],
            "attn" => &["tp-heads", "tp-kv-heads", "model"],
            "draft" => &["draft-context", "context-length", "model", "draft-model"],
            _ => &["model", "context-length", "max-model-len"],
        };
        let errs: Vec<&Finding> =
            rep.findings.iter().filter(|f| f.severity == Severity::Error && rules.contains(&f.rule.as_str())).collect();
        let summary = || {
            let e: Vec<String> = errs.iter().map(|f| format!("[{}] {}", f.rule, f.message)).collect();
            format!("context {:?} draft {:?} errors {e:?}", rep.context, rep.draft_context)
        };
        if accepted {
            if !errs.is_empty() {
                bad.push(format!("{tag}: server accepts ({res}), vigil: {}", summary()));
                continue;
            }
            if let Some(n) = want("context_len") {
                if rep.context != Some(n as u64) {
                    bad.push(format!("{tag}: server context_len {n}, vigil: {}", summary()));
                }
            }
        } else {
            if errs.is_empty() {
                bad.push(format!("{tag}: server refuses ({}), vigil: {}", res["message"], summary()));
                continue;
            }
            if errs.iter().any(|f| f.confirmed.is_some()) {
                confirmed_refusals += 1;
            }
            let msg = res["message"].as_str().unwrap_or("");
            if kind == "draft" && msg.contains("Target model's") {
                if let Some(y) = derived_in(msg) {
                    if rep.draft_context != Some(y) {
                        bad.push(format!("{tag}: server's draft derives {y}, vigil: {}", summary()));
                    }
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(&root);
    eprintln!(
        "golden: {compared} rows compared, {skipped} harness_error rows skipped, {excluded} excluded, {confirmed_refusals} refusals confirmed"
    );
    assert!(bad.is_empty(), "{} of {compared} rows disagree:\n{}", bad.len(), bad.join("\n"));
    assert!(compared > 1900, "only {compared} rows compared");
}

/// The versions `check` confirms with (`Srv::golden_versions`) are exactly the table's, and those of
/// `VERSIONS` in scripts/golden/refresh.py: a version added to one and not the others fails here.
#[test]
fn golden_versions_match_the_table() {
    let text = std::fs::read_to_string(manifest().join("tests/golden/check-golden.jsonl")).unwrap();
    let mut in_table: std::collections::BTreeSet<(String, String)> = std::collections::BTreeSet::new();
    for line in text.lines() {
        let r: Value = serde_json::from_str(line).unwrap();
        in_table.insert((r["server"].as_str().unwrap().into(), r["version"].as_str().unwrap().into()));
    }
    let refresh = std::fs::read_to_string(manifest().join("../../scripts/golden/refresh.py")).unwrap();
    let listed: std::collections::BTreeSet<(String, String)> = refresh
        .lines()
        .filter_map(|l| l.trim().strip_prefix("(\"")?.split_once("\", \""))
        .filter_map(|(s, rest)| Some((s.to_string(), rest.split_once('"')?.0.to_string())))
        .filter(|(s, _)| s == "sglang" || s == "vllm")
        .collect();
    let vigil: std::collections::BTreeSet<(String, String)> = [(Srv::Sglang, "sglang"), (Srv::Vllm, "vllm")]
        .iter()
        .flat_map(|(srv, name)| srv.golden_versions().iter().map(move |v| (name.to_string(), v.to_string())))
        .collect();
    assert_eq!(in_table, vigil, "the table's versions vs Srv::golden_versions");
    assert_eq!(listed, vigil, "refresh.py VERSIONS vs Srv::golden_versions");
}

/// Issue #23: a version between two table versions is confirmed by the lower one; outside the table it is not.
#[test]
fn golden_version_maps_to_the_nearest_lower_table_version() {
    use derive::golden_version as g;
    assert_eq!(g(Srv::Vllm, Some("0.26.0")), Some("0.26.0"));
    assert_eq!(g(Srv::Vllm, Some("0.25.1")), Some("0.24.0"));
    assert_eq!(g(Srv::Vllm, Some("0.28.0")), Some("0.26.0"));
    assert_eq!(g(Srv::Vllm, Some("0.19.1")), None);
    assert_eq!(g(Srv::Vllm, Some("0.33.1")), None, "newer than the table: never diffed");
    assert_eq!(g(Srv::Vllm, None), None);
    assert_eq!(g(Srv::Sglang, Some("0.5.17")), Some("0.5.17"));
    assert_eq!(g(Srv::Sglang, Some("0.5.19")), Some("0.5.17"));
    assert_eq!(g(Srv::Sglang, Some("0.5.10.post1")), Some("0.5.10"));
    assert_eq!(g(Srv::Sglang, Some("0.5.23.post1")), Some("0.5.23"));
    assert_eq!(g(Srv::Sglang, Some("0.5.9")), None);
}

/// Every architecture whose heads / KV-heads refusals `check` confirms (`derive::tp_rule_covered`) has
/// attention-layer rows (`#attn#`, not harness errors) in every table version of both servers.
#[test]
fn golden_attention_rows_cover_the_confirmed_architectures() {
    let text = std::fs::read_to_string(manifest().join("tests/golden/check-golden.jsonl")).unwrap();
    let root = std::env::temp_dir().join(format!("vigil-golden-arch-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let models = lay_out(&root);
    let mut built: BTreeMap<(String, String), std::collections::BTreeSet<String>> = BTreeMap::new();
    for line in text.lines() {
        let r: Value = serde_json::from_str(line).unwrap();
        let case = r["case"].as_str().unwrap();
        if !case.contains("#attn#") || r["result"].get("harness_error").is_some() {
            continue;
        }
        let srv = if r["server"] == "vllm" { Srv::Vllm } else { Srv::Sglang };
        let c = load_config(&models[r["inputs"]["config"].as_str().unwrap()]).unwrap();
        built
            .entry((r["server"].as_str().unwrap().into(), r["version"].as_str().unwrap().into()))
            .or_default()
            .insert(derive::attention_arch(srv, c.obj()));
    }
    let _ = std::fs::remove_dir_all(&root);
    for (srv, name) in [(Srv::Sglang, "sglang"), (Srv::Vllm, "vllm")] {
        for v in srv.golden_versions() {
            let got = built.get(&(name.to_string(), v.to_string())).cloned().unwrap_or_default();
            let missing: Vec<&&str> =
                derive::ATTN_ARCHS.iter().filter(|a| derive::tp_rule_covered(srv, a) && !got.contains(**a)).collect();
            assert!(missing.is_empty(), "{name} {v}: no #attn# rows for {missing:?}");
        }
    }
}
