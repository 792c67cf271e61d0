//! `vigil check`: the field case, randomised variants of it, real public configs, GGUF files made by
//! the test setup, ports and broken inputs.

mod common;
use common::*;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::Duration;

const T: Duration = Duration::from_secs(60);

fn cfgs() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/configs")
}

fn model_dir(root: &Path, name: &str, config: &Value) -> PathBuf {
    let d = root.join(name);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("config.json"), serde_json::to_vec_pretty(config).unwrap()).unwrap();
    d
}

fn public(name: &str) -> Value {
    serde_json::from_slice(&std::fs::read(cfgs().join(name)).unwrap()).unwrap()
}

/// Runs `vigil check --json -- ARGS` with a clean environment for the variables the rules read.
fn check(args: &[String], extra_env: &[(&str, &str)]) -> (i32, Value) {
    let mut c = vigil();
    c.env_remove("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN").env_remove("CUDA_VISIBLE_DEVICES");
    for (k, v) in extra_env {
        c.env(k, v);
    }
    c.args(["check", "--json", "--"]).args(args);
    let o = run_bounded(c, T);
    let v: Value =
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&o.stdout)));
    (o.status.code().unwrap(), v)
}

fn findings(v: &Value, sev: &str) -> Vec<Value> {
    v["findings"].as_array().unwrap().iter().filter(|f| f["severity"] == sev).cloned().collect()
}

fn sglang(target: &Path, draft: &Path, extra: &[&str]) -> Vec<String> {
    let mut a: Vec<String> =
        ["python3", "-m", "sglang.launch_server", "--model-path"].iter().map(|s| s.to_string()).collect();
    a.push(target.display().to_string());
    a.extend([
        "--speculative-algorithm".into(),
        "EAGLE3".into(),
        "--speculative-draft-model-path".into(),
        draft.display().to_string(),
    ]);
    a.extend(extra.iter().map(|s| s.to_string()));
    a.extend(["--port".into(), free_port().to_string()]);
    a
}

/// The field case: a Kimi-K2-style target (YaRN with original_max_position_embeddings, 262144) and an
/// EAGLE-3 draft at 131072. SGLang >= 0.5.1 would die after loading the 1T target; vigil says so first.
#[test]
fn field_case_kimi_k2_target_with_short_eagle3_draft() {
    let d = TempDir::new("field");
    let mut target = public("deepseek-v3.json");
    target["max_position_embeddings"] = json!(262144);
    target["num_attention_heads"] = json!(64);
    target["num_key_value_heads"] = json!(64);
    target["vocab_size"] = json!(163840);
    target["rope_scaling"] = json!({"type": "yarn", "factor": 64.0, "original_max_position_embeddings": 4096, "beta_fast": 1.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0});
    let mut draft = public("kimi-k25-eagle3-draft.json");
    draft["max_position_embeddings"] = json!(131072);
    let t = model_dir(&d.0, "Kimi-K2-Instruct", &target);
    let dr = model_dir(&d.0, "kimi-k2-eagle3", &draft);
    let (code, v) = check(&sglang(&t, &dr, &["--tp", "8", "--trust-remote-code"]), &[]);
    assert_eq!(code, 10, "{v}");
    let e = findings(&v, "error");
    assert_eq!(e.len(), 1, "{v}");
    let m = e[0]["message"].as_str().unwrap();
    assert_eq!(e[0]["rule"], "draft-context");
    for needle in [
        "131072",
        "262144",
        &t.join("config.json").display().to_string(),
        &dr.join("config.json").display().to_string(),
        "original_max_position_embeddings",
    ] {
        assert!(m.contains(needle), "message lacks {needle}: {m}");
    }
    let fix = e[0]["fix"].as_str().unwrap();
    assert!(
        fix.contains("--context-length 131072") && fix.contains("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"),
        "{fix}"
    );
    // with the env var the server runs on: a warning, not an error
    let (code, v) = check(&sglang(&t, &dr, &["--tp", "8"]), &[("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN", "1")]);
    assert_eq!(code, 0, "{v}");
    assert_eq!(findings(&v, "warning")[0]["rule"], "draft-context");
}

/// Randomised variants of the field case: other values, other fields that carry the length, other
/// rope scalings, sometimes --context-length. Matching fixed numbers cannot pass.
#[test]
fn field_case_randomised_variants() {
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 | 1;
    eprintln!("seed {seed}");
    let mut x = seed;
    let mut rnd = move |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    let keys = ["max_position_embeddings", "seq_length", "max_sequence_length", "max_seq_len", "model_max_length"];
    let d = TempDir::new("variants");
    for i in 0..40 {
        let base = 1024 * (1 + rnd(512));
        let key = keys[rnd(keys.len() as u64) as usize];
        let mut target = json!({"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256});
        target[key] = json!(base);
        let factor = (2 + rnd(7)) as f64;
        let tctx = match rnd(4) {
            0 => base,
            1 => {
                target["rope_scaling"] =
                    json!({"type": "yarn", "factor": factor, "original_max_position_embeddings": 4096});
                base
            }
            2 => {
                target["rope_scaling"] = json!({"rope_type": "llama3", "factor": factor});
                base
            }
            _ => {
                target["rope_scaling"] = json!({"type": "linear", "factor": factor});
                (base as f64 * factor) as u64
            }
        };
        let dkey = keys[rnd(keys.len() as u64) as usize];
        let dctx = 1024 * (1 + rnd(1024));
        let mut draft = json!({"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 4096, "num_hidden_layers": 1, "vocab_size": 128256});
        draft[dkey] = json!(dctx);
        let t = model_dir(&d.0, &format!("t{i}"), &target);
        let dr = model_dir(&d.0, &format!("d{i}"), &draft);
        let cl = if rnd(3) == 0 { Some(1024 * (1 + rnd(tctx / 1024))) } else { None };
        let extra: Vec<String> = cl.map(|c| vec!["--context-length".to_string(), c.to_string()]).unwrap_or_default();
        let extra: Vec<&str> = extra.iter().map(|s| s.as_str()).collect();
        let (code, v) = check(&sglang(&t, &dr, &extra), &[]);
        let eff = cl.unwrap_or(tctx);
        let errs = findings(&v, "error");
        if dctx < eff {
            assert_eq!(code, 10, "case {i} (seed {seed}): target {eff} via {key}, draft {dctx} via {dkey}: {v}");
            let m = errs[0]["message"].as_str().unwrap();
            assert!(m.contains(&eff.to_string()) && m.contains(&dctx.to_string()), "case {i} (seed {seed}): {m}");
            assert!(m.contains(key) || cl.is_some(), "case {i}: the target's field is named: {m}");
            assert!(m.contains(dkey), "case {i}: the draft's field is named: {m}");
        } else {
            assert!(errs.is_empty(), "case {i} (seed {seed}): target {eff}, draft {dctx}: {v}");
        }
    }
}

/// Real public configs: Llama-3.1-8B-Instruct and its EAGLE-3 draft (max_position_embeddings 2048).
#[test]
fn llama31_with_its_eagle3_draft() {
    let d = TempDir::new("llama31");
    // the target from an offline Hugging Face cache, the draft from a local directory
    let hf = d.path("hf");
    let snap =
        hf.join("hub/models--meta-llama--Llama-3.1-8B-Instruct/snapshots/0e9e39f249a16976918f6564b8830bc894c89659");
    std::fs::create_dir_all(&snap).unwrap();
    std::fs::copy(cfgs().join("llama-3.1-8b-instruct.json"), snap.join("config.json")).unwrap();
    let dr = model_dir(&d.0, "EAGLE3-LLaMA3.1-Instruct-8B", &public("eagle3-llama3.1-instruct-8b.json"));
    let hf_env = [("HF_HOME", hf.to_str().unwrap())];
    let t = PathBuf::from("meta-llama/Llama-3.1-8B-Instruct");
    let (code, v) = check(&sglang(&t, &dr, &[]), &hf_env);
    assert_eq!(code, 10, "{v}");
    let ctx = v["findings"].as_array().unwrap().iter().find(|f| f["rule"] == "context").unwrap();
    assert!(ctx["message"].as_str().unwrap().starts_with("target context 131072 "), "{ctx}");
    let e = &findings(&v, "error")[0];
    assert!(
        e["message"].as_str().unwrap().contains("2048") && e["message"].as_str().unwrap().contains("131072"),
        "{e}"
    );
    // the valid pair: --context-length within the draft's window → zero errors, zero warnings
    let (code, v) = check(&sglang(&t, &dr, &["--context-length", "2048"]), &hf_env);
    assert_eq!(code, 0, "{v}");
    assert!(findings(&v, "error").is_empty() && findings(&v, "warning").is_empty(), "{v}");
    // an unfinished download in the cache is an error
    let blobs = hf.join("hub/models--meta-llama--Llama-3.1-8B-Instruct/blobs");
    std::fs::create_dir_all(&blobs).unwrap();
    std::fs::write(blobs.join("abc123.incomplete"), b"x").unwrap();
    let (code, v) = check(&sglang(&t, &dr, &["--context-length", "2048"]), &hf_env);
    assert_eq!(code, 10);
    assert!(findings(&v, "error")[0]["message"].as_str().unwrap().contains(".incomplete"), "{v}");
}

/// DeepSeek-V3 with its built-in MTP draft (NEXTN): YaRN with original_max_position_embeddings gives
/// 163840 in SGLang's code path; TP 8 divides its 128 heads; no errors.
#[test]
fn deepseek_v3_mtp() {
    let d = TempDir::new("dsv3");
    let t = model_dir(&d.0, "DeepSeek-V3", &public("deepseek-v3.json"));
    let mut a: Vec<String> =
        ["python3", "-m", "sglang.launch_server", "--model-path"].iter().map(|s| s.to_string()).collect();
    a.push(t.display().to_string());
    a.extend(["--speculative-algorithm", "NEXTN", "--tp", "8", "--port"].iter().map(|s| s.to_string()));
    a.push(free_port().to_string());
    let (code, v) = check(&a, &[]);
    assert_eq!(code, 0, "{v}");
    let ctx = v["findings"].as_array().unwrap().iter().find(|f| f["rule"] == "context").unwrap();
    assert!(ctx["message"].as_str().unwrap().starts_with("target context 163840 "), "{ctx}");
    // TP 3 does not divide 128 heads
    let i = a.iter().position(|x| x == "--tp").unwrap();
    a[i + 1] = "3".into();
    let (code, v) = check(&a, &[]);
    assert_eq!(code, 10);
    assert!(findings(&v, "error").iter().any(|f| f["rule"] == "tp-heads"), "{v}");
}

/// vLLM `--speculative-config`: the draft's short context is clamped by vLLM: a warning, not an error.
#[test]
fn vllm_speculative_config() {
    let d = TempDir::new("vllm");
    let t = model_dir(&d.0, "Llama-3.1-8B-Instruct", &public("llama-3.1-8b-instruct.json"));
    let dr = model_dir(&d.0, "EAGLE3-LLaMA3.1-Instruct-8B", &public("eagle3-llama3.1-instruct-8b.json"));
    let spec = json!({"model": dr.display().to_string(), "method": "eagle3", "num_speculative_tokens": 3}).to_string();
    let a: Vec<String> = vec![
        "vllm".into(),
        "serve".into(),
        t.display().to_string(),
        "--speculative-config".into(),
        spec,
        "--max-model-len".into(),
        "8192".into(),
        "--port".into(),
        free_port().to_string(),
    ];
    let (code, v) = check(&a, &[]);
    assert_eq!(code, 0, "{v}");
    let w = findings(&v, "warning");
    assert_eq!(w.len(), 1, "{v}");
    assert!(w[0]["message"].as_str().unwrap().contains("vLLM clamps"), "{v}");
    // --max-model-len beyond the model's 131072 is an error
    let mut a2 = a.clone();
    let i = a2.iter().position(|x| x == "--max-model-len").unwrap();
    a2[i + 1] = "200000".into();
    let (code, v) = check(&a2, &[]);
    assert_eq!(code, 10);
    assert!(findings(&v, "error").iter().any(|f| f["rule"] == "max-model-len"), "{v}");
}

/// GGUF files made by the test setup: a llama-spm target with a gpt-2-vocab draft → the speculation
/// warning; a truncated GGUF → an error before launch (`vigil up` does not start it).
#[test]
fn e2e_gguf_draft_vocab_and_truncated_model() {
    let Some(e) = env() else { return };
    let srv = e.server.display().to_string();
    let m = |n: &str| e.models.join(n).display().to_string();
    let (code, v) = check(
        &[
            srv.clone(),
            "-m".into(),
            m("tiny.gguf"),
            "-md".into(),
            m("gpt2-draft.gguf"),
            "--port".into(),
            free_port().to_string(),
        ],
        &[],
    );
    assert_eq!(code, 0, "{v}");
    let w = findings(&v, "warning");
    assert!(w.iter().any(|f| f["message"].as_str().unwrap().contains("WITHOUT speculative decoding")), "{v}");
    // a matching draft, with --spec-type (without it this build does no speculation: M7)
    let (code, v) = check(
        &[
            srv.clone(),
            "-m".into(),
            m("tiny.gguf"),
            "-md".into(),
            m("tiny-draft.gguf"),
            "--spec-type".into(),
            "draft-simple".into(),
        ],
        &[],
    );
    assert_eq!(code, 0);
    assert!(findings(&v, "warning").is_empty(), "{v}");
    // truncated: check says so, and up refuses to launch
    let (code, v) = check(&[srv.clone(), "-m".into(), m("truncated.gguf")], &[]);
    assert_eq!(code, 10);
    assert!(findings(&v, "error")[0]["message"].as_str().unwrap().contains("truncated"), "{v}");
    let d = TempDir::new("upcheck");
    let mut c = vigil();
    c.env("VIGIL_STATE_DIR", &d.0).args([
        "up",
        "--name",
        "t",
        "--",
        &srv,
        "-m",
        &m("truncated.gguf"),
        "--port",
        &free_port().to_string(),
    ]);
    let o = run_bounded(c, T);
    assert_eq!(o.status.code(), Some(10));
    assert!(!d.0.join("runs/t/state.json").exists(), "launched despite the check");
    let (code, v) = check(&[srv, "-m".into(), m("notgguf.gguf")], &[]);
    assert_eq!(code, 10);
    assert!(findings(&v, "error")[0]["message"].as_str().unwrap().contains("invalid magic"), "{v}");
}

#[test]
fn port_held_by_a_real_process_is_named() {
    let d = TempDir::new("port");
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let t = model_dir(&d.0, "m", &public("llama-3.1-8b-instruct.json"));
    let (code, v) = check(
        &[
            "python3".into(),
            "-m".into(),
            "sglang.launch_server".into(),
            "--model-path".into(),
            t.display().to_string(),
            "--port".into(),
            port.to_string(),
        ],
        &[],
    );
    assert_eq!(code, 10);
    let e = &findings(&v, "error")[0];
    assert!(
        e["message"].as_str().unwrap().contains(&format!("port {port} is taken by pid {}", std::process::id())),
        "{e}"
    );
}

#[test]
fn broken_inputs_are_one_clear_line_each() {
    let d = TempDir::new("broken");
    let nocfg = d.path("no-config");
    std::fs::create_dir_all(&nocfg).unwrap();
    let badjson = d.path("bad-json");
    std::fs::create_dir_all(&badjson).unwrap();
    std::fs::write(badjson.join("config.json"), b"{ \"max_position_embeddings\": 4096,").unwrap();
    for (model, needle) in [
        (d.path("missing").display().to_string(), "does not exist"),
        (nocfg.display().to_string(), "has no config.json"),
        (badjson.display().to_string(), "is not valid JSON"),
    ] {
        let (code, v) = check(
            &[
                "python3".into(),
                "-m".into(),
                "sglang.launch_server".into(),
                "--model-path".into(),
                model,
                "--port".into(),
                free_port().to_string(),
            ],
            &[],
        );
        assert_eq!(code, 10, "{v}");
        let e = findings(&v, "error");
        assert_eq!(e.len(), 1, "{v}");
        let m = e[0]["message"].as_str().unwrap();
        assert!(m.contains(needle) && !m.contains('\n'), "{m}");
    }
    // a bad --speculative-config is a usage error, one line
    let mut c = vigil();
    c.args(["check", "--", "vllm", "serve", "x", "--speculative-config", "{nope"]);
    let o = run_bounded(c, T);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(String::from_utf8_lossy(&o.stderr).lines().count(), 1);
}

/// On a machine with no NVML and no nvidia-smi (this one, CI) every command works and says GPU checks
/// were skipped.
#[test]
fn without_gpus_every_command_says_gpu_checks_skipped() {
    if std::path::Path::new("/usr/bin/nvidia-smi").exists() || std::path::Path::new("/usr/local/nvidia/lib64").exists()
    {
        eprintln!("SKIP: this machine has GPU tools");
        return;
    }
    let mut c = vigil();
    c.arg("gpu");
    let o = run_bounded(c, T);
    assert_eq!(o.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&o.stdout).contains("GPU checks skipped"));
    let (code, v) = check(&["llama-server".into(), "-m".into(), "/nonexistent.gguf".into()], &[]);
    assert_eq!(code, 10);
    assert!(
        v["findings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["rule"] == "gpus" && f["message"].as_str().unwrap().contains("GPU checks skipped")),
        "{v}"
    );
    let mut c = vigil();
    c.args(["ps"]);
    assert_eq!(run_bounded(c, T).status.code(), Some(0));
    // wait/up say it once; down says the release was not checked
    let d = TempDir::new("nogpu");
    let mut c = vigil();
    c.env("VIGIL_STATE_DIR", &d.0).args([
        "up",
        "--name",
        "s",
        "--detach",
        "--no-check",
        "--no-probe",
        "--server",
        "llama-cpp",
        "--",
        "sh",
        "-c",
        "echo 'srv  llama_server: model loaded'; exec sleep 60",
    ]);
    let o = run_bounded(c, T);
    assert_eq!(o.status.code(), Some(0));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("GPU checks skipped"),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    let mut c = vigil();
    c.env("VIGIL_STATE_DIR", &d.0).args(["down", "s"]);
    let o = run_bounded(c, T);
    assert_eq!(o.status.code(), Some(0));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("GPU release not checked"),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
}

/// The safety valve (issue #13): an error not confirmed against the server's own code is shown, and
/// `vigil up` launches anyway. The launched program is a stand-in named `sglang.launch_server` (a
/// Python module that records its start and exits 1): only the launch decision is under test here.
#[test]
fn up_launches_despite_an_unconfirmed_error() {
    let d = TempDir::new("valve");
    let pkg = d.0.join("py/sglang");
    std::fs::create_dir_all(&pkg).unwrap();
    std::fs::write(pkg.join("__init__.py"), "").unwrap();
    let marker = d.0.join("launched");
    std::fs::write(
        pkg.join("launch_server.py"),
        format!("open({:?}, 'w').write('yes')\nraise SystemExit(1)\n", marker.display().to_string()),
    )
    .unwrap();
    // --tp 3 does not divide 32 heads: check reports an error, not confirmed by the server's own code.
    let m = model_dir(&d.0, "llama", &public("llama-3.1-8b-instruct.json"));
    let argv: Vec<String> = ["python3", "-m", "sglang.launch_server", "--model-path", &m.display().to_string()]
        .iter()
        .map(|s| s.to_string())
        .chain(["--tp".into(), "3".into(), "--port".into(), free_port().to_string()])
        .collect();
    let (code, v) = check(&argv, &[]);
    assert_eq!(code, 10, "check itself still reports the error: {v}");
    let e = findings(&v, "error");
    assert!(e.iter().any(|f| f["rule"] == "tp-heads" && f.get("confirmed").is_none()), "{v}");
    assert_eq!(v["blocking"], 0, "{v}");
    let mut c = vigil();
    c.env("VIGIL_STATE_DIR", d.0.join("state"))
        .env("PYTHONPATH", d.0.join("py"))
        .args(["up", "--name", "valve", "--no-probe", "--"])
        .args(&argv);
    let o = run_bounded(c, T);
    let err = String::from_utf8_lossy(&o.stderr);
    let out = String::from_utf8_lossy(&o.stdout);
    assert_ne!(o.status.code(), Some(10), "refused on an unconfirmed error: {out}{err}");
    assert!(marker.exists(), "the server was not launched: {out}{err}");
    assert!(err.contains("launching anyway"), "{err}");
    assert!(out.contains("ERROR? [tp-heads]"), "{out}");
}

/// B4: the servers read `true` (and SGLang `yes`) as set, not only `1`.
#[test]
fn allow_long_context_env_accepts_true() {
    let d = TempDir::new("truthy");
    let m = model_dir(&d.0, "llama", &public("llama-3.1-8b-instruct.json"));
    let mut argv: Vec<String> = ["python3", "-m", "sglang.launch_server", "--model-path"].map(String::from).to_vec();
    argv.extend([m.display().to_string(), "--context-length".into(), "262144".into()]);
    let (code, v) = check(&argv, &[]);
    assert_eq!(code, 10, "{v}");
    for val in ["1", "true", "True", "yes"] {
        let (code, v) = check(&argv, &[("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN", val)]);
        assert_eq!(code, 0, "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN={val}: {v}");
    }
    let mut argv: Vec<String> = ["vllm", "serve"].map(String::from).to_vec();
    argv.extend([m.display().to_string(), "--max-model-len".into(), "262144".into()]);
    assert_eq!(check(&argv, &[]).0, 10);
    let (code, v) = check(&argv, &[("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "true")]);
    assert_eq!(code, 0, "{v}");
}

/// B9: a Hugging Face id that is not in the cache yet is downloaded by the server: a warning, not a
/// refusal; with offline mode set it is an error. A missing local path is an error the servers confirm.
#[test]
fn uncached_hf_id_is_a_warning_and_a_missing_path_an_error() {
    let d = TempDir::new("hfid");
    let hf = d.0.join("hf");
    std::fs::create_dir_all(&hf).unwrap();
    let mut c = vigil();
    c.env("HF_HOME", &hf).env("HF_HUB_CACHE", &hf).env("HOME", &d.0).env_remove("HF_HUB_OFFLINE");
    c.env_remove("TRANSFORMERS_OFFLINE");
    c.args(["check", "--json", "--", "vllm", "serve", "Qwen/Qwen2.5-7B-Instruct", "--port", &free_port().to_string()]);
    let o = run_bounded(c, T);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(o.status.code(), Some(0), "{v}");
    let w = findings(&v, "warning");
    assert!(w.iter().any(|f| f["rule"] == "model" && f["message"].as_str().unwrap().contains("download")), "{v}");
    let mut c = vigil();
    c.env("HF_HOME", &hf).env("HF_HUB_CACHE", &hf).env("HOME", &d.0).env("HF_HUB_OFFLINE", "1");
    c.args(["check", "--json", "--", "vllm", "serve", "Qwen/Qwen2.5-7B-Instruct"]);
    let o = run_bounded(c, T);
    assert_eq!(o.status.code(), Some(10));
    let missing = d.0.join("no/such/model").display().to_string();
    let (code, v) = check(&["vllm".into(), "serve".into(), missing], &[]);
    assert_eq!(code, 10, "{v}");
    assert_eq!(v["blocking"], 1, "a missing local path is confirmed: {v}");
}

/// Issue #14: settings are resolved before anything runs. A bad --stall or a taken --metrics port is a
/// usage error (exit 2) and nothing is launched.
#[test]
fn bad_settings_stop_before_the_launch() {
    let d = TempDir::new("settings");
    let marker = d.0.join("launched");
    let cmd = ["sh", "-c", &format!("touch {}; sleep 30", marker.display())].map(String::from);
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    for flags in [vec!["--stall", "bogus=1s"], vec!["--metrics", &port]] {
        let mut c = vigil();
        c.env("VIGIL_STATE_DIR", d.0.join("state")).args(["up", "--name", "s", "--no-check"]).args(&flags);
        c.arg("--").args(&cmd);
        let o = run_bounded(c, T);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{flags:?}: {err}");
        let first = err.lines().next().unwrap_or("");
        assert!(first.contains(flags[1]) && first.contains("error"), "the error names the value: {err}");
        assert!(!marker.exists(), "{flags:?}: the server was launched");
        assert!(!d.0.join("state/runs/s").exists(), "{flags:?}: a run was recorded");
    }
}

/// R1/R2 (issue #13): a config.json that is a FIFO (would block forever) or /dev/zero (would grow until
/// the OOM killer) is one clear error line, at once.
#[test]
fn fifo_and_endless_configs_are_refused_at_once() {
    let d = TempDir::new("endless");
    let fifo = d.path("fifo-model");
    std::fs::create_dir_all(&fifo).unwrap();
    let c = std::ffi::CString::new(fifo.join("config.json").to_str().unwrap()).unwrap();
    // SAFETY: mkfifo with a valid C string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
    let zero = d.path("zero-model");
    std::fs::create_dir_all(&zero).unwrap();
    std::os::unix::fs::symlink("/dev/zero", zero.join("config.json")).unwrap();
    for m in [&fifo, &zero] {
        let t0 = std::time::Instant::now();
        let (code, v) = check(&["vllm".into(), "serve".into(), m.display().to_string()], &[]);
        eprintln!("{}: {:?}", m.display(), t0.elapsed());
        assert_eq!(code, 10, "{v}");
        let e = findings(&v, "error");
        assert!(
            e.iter().any(|f| f["message"].as_str().unwrap().contains("not a regular file")),
            "{}: {v}",
            m.display()
        );
    }
}

/// Issue #13 R1 and #14: SIGTERM while `check` waits on a hung `nvidia-smi` ends it with exit 130.
/// The `nvidia-smi` here is a stand-in script that records its start and never answers, as a wedged
/// GPU node's does (no real one hangs on demand).
#[test]
fn sigterm_during_a_hung_nvidia_smi_ends_check() {
    let d = TempDir::new("hungsmi");
    let bin = d.path("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let started = d.path("smi-started");
    let smi = bin.join("nvidia-smi");
    std::fs::write(&smi, format!("#!/bin/sh\necho started > {}\nexec sleep 600\n", started.display())).unwrap();
    std::fs::set_permissions(&smi, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let m = model_dir(&d.0, "llama", &public("llama-3.1-8b-instruct.json"));
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let mut c = vigil();
    c.env("PATH", path).env_remove("CUDA_VISIBLE_DEVICES");
    c.args(["check", "--", "vllm", "serve", &m.display().to_string(), "--port", &free_port().to_string()]);
    c.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    let mut child = c.spawn().unwrap();
    assert!(wait_for_text(&started, "started", T), "the stand-in nvidia-smi was never called");
    let t0 = std::time::Instant::now();
    signal(child.id() as i32, libc::SIGTERM);
    let st = wait_bounded(&mut child, T);
    eprintln!("check ended {:?} after SIGTERM", t0.elapsed());
    assert_eq!(st.code(), Some(130));
}

// ---- Issue #13: each case below failed (false error or missed error) before the version-keyed rules. ----

/// A fake Python environment whose package metadata says `pkg` `version`: the program to run (python3
/// for SGLang, the `vllm` entry script, whose shebang names that python, for vLLM).
fn venv(root: &Path, pkg: &str, version: &str) -> String {
    let v = root.join(format!("venv-{pkg}-{version}"));
    let di = v.join("lib/python3.11/site-packages").join(format!("{pkg}-{version}.dist-info"));
    std::fs::create_dir_all(&di).unwrap();
    std::fs::write(di.join("METADATA"), format!("Metadata-Version: 2.1\nName: {pkg}\nVersion: {version}\n")).unwrap();
    std::fs::create_dir_all(v.join("bin")).unwrap();
    let py = v.join("bin/python3");
    std::fs::write(&py, "").unwrap();
    if pkg == "vllm" {
        let e = v.join("bin/vllm");
        std::fs::write(&e, format!("#!{}\n", py.display())).unwrap();
        e.display().to_string()
    } else {
        py.display().to_string()
    }
}

fn golden_cfg(name: &str) -> Value {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/configs").join(format!("{name}.json"));
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

fn sg(prog: &str, model: &Path, extra: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = vec![prog.into(), "-m".into(), "sglang.launch_server".into(), "--model-path".into()];
    a.push(model.display().to_string());
    a.extend(extra.iter().map(|s| s.to_string()));
    a.extend(["--port".into(), free_port().to_string()]);
    a
}

fn vl(prog: &str, model: &Path, extra: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = vec![prog.into(), "serve".into(), model.display().to_string()];
    a.extend(extra.iter().map(|s| s.to_string()));
    a.extend(["--port".into(), free_port().to_string()]);
    a
}

fn rule_errors(v: &Value, rule: &str) -> Vec<Value> {
    findings(v, "error").into_iter().filter(|f| f["rule"] == rule).collect()
}

fn ctx_len(v: &Value) -> u64 {
    v["context_len"].as_u64().unwrap_or_else(|| panic!("no context_len: {v}"))
}

/// B1 + B13 + B14: config-class defaults and nested text configs. Gemma-3 multimodal (no
/// max_position_embeddings in text_config) derives the class default 131072; Gemma-3 text (linear
/// factor 8) 131072, not 1048576; InternVL's llm_config 32768; GPT-2's n_positions 1024 (M2).
#[test]
fn b1_b13_b14_m2_config_class_defaults_and_text_configs() {
    let d = TempDir::new("b1");
    for (name, want) in
        [("gemma3-27b-it", 131072), ("medgemma-27b-text-it", 131072), ("internvl3-8b-like", 32768), ("gpt2", 1024)]
    {
        let m = model_dir(&d.0, name, &golden_cfg(name));
        let (code, v) = check(&sg("python3", &m, &[]), &[]);
        assert_eq!((code, ctx_len(&v)), (0, want), "SGLang {name}: {v}");
        if name != "internvl3-8b-like" {
            let (code, v) = check(&vl("vllm", &m, &[]), &[]);
            assert_eq!((code, ctx_len(&v)), (0, want), "vLLM {name}: {v}");
        }
    }
    // the Gemma-3 pair of the field: a 131072 context is no error
    let m = model_dir(&d.0, "g3", &golden_cfg("gemma3-27b-it"));
    let (code, v) = check(&sg("python3", &m, &["--context-length", "131072"]), &[]);
    assert_eq!(code, 0, "{v}");
    // thinker_config wins over text_config (SGLang's priority)
    let cfg = json!({"architectures": ["Qwen2_5OmniModel"], "model_type": "qwen2_5_omni",
        "thinker_config": {"text_config": {"model_type": "qwen2_5_omni_text", "max_position_embeddings": 32768, "num_attention_heads": 28}},
        "text_config": {"max_position_embeddings": 4096, "num_attention_heads": 28}});
    let m = model_dir(&d.0, "omni", &cfg);
    let (_, v) = check(&sg("python3", &m, &[]), &[]);
    assert_eq!(ctx_len(&v), 32768, "{v}");
}

/// B2: vLLM honours model_max_length (Command-R 8192 / 131072).
#[test]
fn b2_vllm_honours_model_max_length() {
    let d = TempDir::new("b2");
    let m = model_dir(&d.0, "command-r", &golden_cfg("command-r-v01"));
    let (code, v) = check(&vl("vllm", &m, &["--max-model-len", "131072"]), &[]);
    assert_eq!((code, ctx_len(&v)), (0, 131072), "{v}");
    let (code, v) = check(&vl("vllm", &m, &[]), &[]);
    assert_eq!((code, ctx_len(&v)), (0, 131072), "{v}");
}

/// B3: human-readable lengths as each server parses them.
#[test]
fn b3_human_readable_lengths() {
    let d = TempDir::new("b3");
    let m = model_dir(&d.0, "llama", &golden_cfg("llama31-8b"));
    for (val, want) in [("32k", 32000), ("32K", 32768), ("auto", 131072), ("-1", 131072), ("25.6k", 25600)] {
        let (code, v) = check(&vl("vllm", &m, &["--max-model-len", val]), &[]);
        assert_eq!((code, ctx_len(&v)), (0, want), "vLLM --max-model-len {val}: {v}");
    }
    let sglang = venv(&d.0, "sglang", "0.5.23");
    let (code, v) = check(&sg(&sglang, &m, &["--context-length", "32k"]), &[]);
    assert_eq!((code, ctx_len(&v)), (0, 32000), "{v}");
    let (code, v) = check(&sg(&sglang, &m, &["--context-length", "32K"]), &[]);
    assert_eq!(code, 10, "{v}");
    assert!(rule_errors(&v, "context-length")[0]["confirmed"].is_string(), "SGLang 0.5.23 refuses 32K: {v}");
    // version unknown: 32k is 32000 in >= 0.5.10, refused before: a warning naming the dependency
    let (code, v) = check(&sg("python3", &m, &["--context-length", "32k"]), &[]);
    assert_eq!(code, 0, "{v}");
    assert!(findings(&v, "warning").iter().any(|f| f["message"].as_str().unwrap().contains("0.5.10")), "{v}");
}

/// B4: env truthiness per server: vLLM reads 1/true/True, not yes/y; SGLang also yes/y.
#[test]
fn b4_env_truthiness_per_server() {
    let d = TempDir::new("b4");
    let m = model_dir(&d.0, "llama", &golden_cfg("llama31-8b"));
    let vllm = venv(&d.0, "vllm", "0.33.0");
    let sglang = venv(&d.0, "sglang", "0.5.23");
    for val in ["yes", "y"] {
        let (code, v) =
            check(&vl(&vllm, &m, &["--max-model-len", "262144"]), &[("VLLM_ALLOW_LONG_MAX_MODEL_LEN", val)]);
        assert_eq!(code, 10, "vLLM refuses with {val}: {v}");
        assert!(rule_errors(&v, "max-model-len")[0]["confirmed"].is_string(), "{v}");
        let (code, v) = check(
            &sg(&sglang, &m, &["--context-length", "262144"]),
            &[("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN", val)],
        );
        assert_eq!(code, 0, "SGLang accepts {val}: {v}");
    }
    let (code, v) = check(&vl(&vllm, &m, &["--max-model-len", "262144"]), &[("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "True")]);
    assert_eq!(code, 0, "{v}");
}

/// B5: SGLang attention DP adds no GPUs; --nnodes N splits the world over the nodes; vLLM DP multiplies.
#[test]
fn b5_gpus_needed_per_node() {
    let d = TempDir::new("b5");
    let m = model_dir(&d.0, "ds", &public("deepseek-v3.json"));
    let eight = [("CUDA_VISIBLE_DEVICES", "0,1,2,3,4,5,6,7")];
    let (_, v) = check(&sg("python3", &m, &["--tp", "8", "--dp", "8", "--enable-dp-attention"]), &eight);
    assert!(rule_errors(&v, "gpus").is_empty(), "{v}");
    let (_, v) = check(&sg("python3", &m, &["--tp", "16", "--nnodes", "2", "--node-rank", "0"]), &eight);
    assert!(rule_errors(&v, "gpus").is_empty(), "{v}");
    let (_, v) = check(&sg("python3", &m, &["--tp", "8", "--dp", "2"]), &eight);
    assert_eq!(rule_errors(&v, "gpus").len(), 1, "{v}");
    let (_, v) = check(&vl("vllm", &m, &["-tp", "8", "-dp", "2"]), &eight);
    assert_eq!(rule_errors(&v, "gpus").len(), 1, "{v}");
}

/// B6 + B7: the one-layer EAGLE-3 rule holds for SGLang <= 0.5.11 only; an EAGLE-3 draft declared
/// LlamaForCausalLM is renamed by vLLM, refused by SGLang.
#[test]
fn b6_b7_eagle3_layers_and_llama_arch_per_server() {
    let d = TempDir::new("b6");
    let t = model_dir(&d.0, "llama", &golden_cfg("llama31-8b"));
    let two = model_dir(&d.0, "eagle3-2layers", &golden_cfg("x-eagle3-2layers"));
    let new = venv(&d.0, "sglang", "0.5.23");
    let old = venv(&d.0, "sglang", "0.5.11");
    let spec = |dr: &Path| {
        ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path"]
            .iter()
            .map(|s| s.to_string())
            .chain([dr.display().to_string(), "--context-length".into(), "2048".into()])
            .collect::<Vec<_>>()
    };
    let s2 = spec(&two);
    let s2: Vec<&str> = s2.iter().map(|s| s.as_str()).collect();
    let (_, v) = check(&sg(&new, &t, &s2), &[]);
    assert!(rule_errors(&v, "eagle3-layers").is_empty(), "0.5.23 loads a 2-layer EAGLE-3 draft: {v}");
    let (_, v) = check(&sg(&old, &t, &s2), &[]);
    assert_eq!(rule_errors(&v, "eagle3-layers").len(), 1, "0.5.11: {v}");
    let sc = json!({"model": two.display().to_string(), "method": "eagle3", "num_speculative_tokens": 3}).to_string();
    let (_, v) = check(&vl("vllm", &t, &["--speculative-config", &sc, "--max-model-len", "2048"]), &[]);
    assert!(findings(&v, "error").is_empty(), "vLLM never had the rule: {v}");
    let la = model_dir(&d.0, "eagle3-llamaarch", &golden_cfg("x-eagle3-llamaarch"));
    let sc = json!({"model": la.display().to_string(), "method": "eagle3", "num_speculative_tokens": 3}).to_string();
    let (_, v) = check(&vl("vllm", &t, &["--speculative-config", &sc, "--max-model-len", "2048"]), &[]);
    assert!(rule_errors(&v, "draft-arch").is_empty(), "vLLM renames it: {v}");
    let sl = spec(&la);
    let sl: Vec<&str> = sl.iter().map(|s| s.as_str()).collect();
    let (_, v) = check(&sg(&new, &t, &sl), &[]);
    assert_eq!(rule_errors(&v, "draft-arch").len(), 1, "SGLang rejects it: {v}");
}

/// B8 + M5 + M4 + M9: vLLM methods without a draft model; the method inferred from the path; a
/// draft_model needs the target's vocabulary size; max_model_len in the speculative config.
#[test]
fn b8_m4_m5_m9_vllm_speculative_config() {
    let d = TempDir::new("b8");
    let t = model_dir(&d.0, "qwen25-7b", &golden_cfg("qwen25-7b"));
    for method in ["suffix", "ngram_gpu", "extract_hidden_states", "mtp", "ngram"] {
        let sc = json!({"method": method, "num_speculative_tokens": 3}).to_string();
        let (code, v) = check(&vl("vllm", &t, &["--speculative-config", &sc]), &[]);
        assert_eq!(code, 0, "{method} needs no draft model: {v}");
    }
    let small = model_dir(&d.0, "qwen25-0.5b", &golden_cfg("qwen25-0.5b"));
    let sc = json!({"model": small.display().to_string(), "num_speculative_tokens": 3}).to_string();
    let (code, v) = check(&vl("vllm", &t, &["--speculative-config", &sc]), &[]);
    assert_eq!(code, 10, "{v}");
    assert!(rule_errors(&v, "draft-vocab")[0]["message"].as_str().unwrap().contains("same vocabulary size"), "{v}");
    // a path with eagle3 in it: inferred eagle3 (the hidden-size rule applies, not the vocab one)
    let e3 = model_dir(&d.0, "my-eagle3-draft", &golden_cfg("sf-llama3-8b-eagle3"));
    let sc = json!({"model": e3.display().to_string(), "num_speculative_tokens": 3}).to_string();
    let (_, v) = check(&vl("vllm", &t, &["--speculative-config", &sc]), &[]);
    assert!(!rule_errors(&v, "draft-hidden").is_empty() && rule_errors(&v, "draft-vocab").is_empty(), "{v}");
    let dr = model_dir(&d.0, "EAGLE3-LLaMA3.1", &public("eagle3-llama3.1-instruct-8b.json"));
    let lt = model_dir(&d.0, "llama", &public("llama-3.1-8b-instruct.json"));
    let sc = json!({"model": dr.display().to_string(), "method": "eagle3", "max_model_len": 4096}).to_string();
    let (code, v) = check(&vl("vllm", &lt, &["--speculative-config", &sc, "--max-model-len", "8192"]), &[]);
    assert_eq!(code, 10, "{v}");
    assert_eq!(rule_errors(&v, "spec-max-model-len").len(), 1, "{v}");
}

/// B10: --json-model-override-args (SGLang) and --hf-overrides (vLLM) apply before the derivation.
#[test]
fn b10_overrides_apply_first() {
    let d = TempDir::new("b10");
    let m = model_dir(&d.0, "qwen", &golden_cfg("qwen25-7b"));
    let o = r#"{"max_position_embeddings": 131072}"#;
    let (code, v) = check(&sg("python3", &m, &["--json-model-override-args", o, "--context-length", "131072"]), &[]);
    assert_eq!((code, ctx_len(&v)), (0, 131072), "{v}");
    let (code, v) = check(&vl("vllm", &m, &["--hf-overrides", o, "--max-model-len", "131072"]), &[]);
    assert_eq!((code, ctx_len(&v)), (0, 131072), "{v}");
}

/// B11: the model after options, or inside --config FILE.yaml.
#[test]
fn b11_model_after_options_or_in_config_yaml() {
    let d = TempDir::new("b11");
    let m = model_dir(&d.0, "qwen", &golden_cfg("qwen25-7b"));
    let a: Vec<String> =
        ["vllm", "serve", "--port", &free_port().to_string(), "--enforce-eager", &m.display().to_string()]
            .map(String::from)
            .to_vec();
    let (code, v) = check(&a, &[]);
    assert_eq!((code, ctx_len(&v)), (0, 32768), "{v}");
    let y = d.0.join("serve.yaml");
    std::fs::write(&y, format!("model: {}\nmax_model_len: 65536\n", m.display())).unwrap();
    let a: Vec<String> = ["vllm", "serve", "--config", &y.display().to_string()].map(String::from).to_vec();
    let (code, v) = check(&a, &[]);
    assert_eq!(code, 10, "the YAML's max_model_len 65536 exceeds 32768: {v}");
    assert_eq!(rule_errors(&v, "max-model-len").len(), 1, "{v}");
}

/// B12: SGLang 0.4.x only warns when --context-length exceeds the model.
#[test]
fn b12_sglang_04_only_warns() {
    let d = TempDir::new("b12");
    let m = model_dir(&d.0, "qwen", &golden_cfg("qwen25-7b"));
    let old = venv(&d.0, "sglang", "0.4.10.post2");
    let (code, v) = check(&sg(&old, &m, &["--context-length", "65536"]), &[]);
    assert_eq!(code, 0, "{v}");
    assert!(findings(&v, "warning").iter().any(|f| f["rule"] == "context-length"), "{v}");
    let new = venv(&d.0, "sglang", "0.5.23");
    let (code, v) = check(&sg(&new, &m, &["--context-length", "65536"]), &[]);
    assert_eq!((code, v["blocking"].as_u64()), (10, Some(1)), "{v}");
}

/// M1: the vLLM version is read, and vLLM >= 0.30 no longer scales YaRN; LongRoPE (phi-3) defaults to
/// 4096 in vLLM but accepts --max-model-len up to 131072.
#[test]
fn m1_vllm_version_keys_yarn_and_longrope() {
    let d = TempDir::new("m1");
    let m = model_dir(&d.0, "qwen3-yarn", &golden_cfg("qwen3-8b-yarn"));
    for (ver, want) in [("0.29.0", 131072), ("0.33.0", 40960)] {
        let p = venv(&d.0, "vllm", ver);
        let (code, v) = check(&vl(&p, &m, &[]), &[]);
        assert_eq!((code, ctx_len(&v), v["version"].as_str()), (0, want, Some(ver)), "{v}");
    }
    let (_, v) = check(&sg("python3", &m, &[]), &[]);
    assert_eq!(ctx_len(&v), 40960, "{v}");
    let phi = model_dir(&d.0, "phi3", &golden_cfg("phi3-mini-128k"));
    let (code, v) = check(&vl("vllm", &phi, &[]), &[]);
    assert_eq!((code, ctx_len(&v)), (0, 4096), "{v}");
    let (code, v) = check(&vl("vllm", &phi, &["--max-model-len", "131072"]), &[]);
    assert_eq!((code, ctx_len(&v)), (0, 131072), "{v}");
    let (_, v) = check(&sg("python3", &phi, &[]), &[]);
    assert_eq!(ctx_len(&v), 131072, "{v}");
}

/// M6: the Hugging Face cache snapshot is the one refs/main names, not the newest by mtime.
#[test]
fn m6_hf_snapshot_from_refs_main() {
    let d = TempDir::new("m6");
    let repo = d.0.join("hf/hub/models--org--model");
    let good = repo.join("snapshots/aaaa");
    let stale = repo.join("snapshots/bbbb");
    std::fs::create_dir_all(&good).unwrap();
    std::fs::write(good.join("config.json"), golden_cfg("qwen25-7b").to_string()).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    std::fs::create_dir_all(&stale).unwrap();
    std::fs::write(stale.join("config.json"), golden_cfg("qwen25-0.5b").to_string().replace("32768", "4096")).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), "aaaa").unwrap();
    let hf = [("HF_HOME", d.0.join("hf").to_str().unwrap().to_string())];
    let hf: Vec<(&str, &str)> = hf.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let (code, v) = check(&vl("vllm", Path::new("org/model"), &["--max-model-len", "32768"]), &hf);
    assert_eq!((code, ctx_len(&v)), (0, 32768), "{v}");
}

/// M8 + the Kimi-K2 row: an unknown model_type is refused without --trust-remote-code (confirmed for a
/// golden-table version); SGLang 0.5.11 refuses kimi_k2 without it, 0.5.23 loads it.
#[test]
fn m8_unknown_model_type_and_kimi_k2() {
    let d = TempDir::new("m8");
    let m = model_dir(&d.0, "foobar", &golden_cfg("x-unknown-arch"));
    let vllm = venv(&d.0, "vllm", "0.33.0");
    let (code, v) = check(&vl(&vllm, &m, &[]), &[]);
    assert_eq!((code, v["blocking"].as_u64()), (10, Some(1)), "{v}");
    let (code, v) = check(&vl("vllm", &m, &[]), &[]);
    assert_eq!((code, v["blocking"].as_u64()), (10, Some(0)), "version unknown: not confirmed: {v}");
    let k = model_dir(&d.0, "kimi", &golden_cfg("kimi-k2-instruct"));
    let (code, v) = check(&sg(&venv(&d.0, "sglang", "0.5.11"), &k, &[]), &[]);
    assert_eq!((code, v["blocking"].as_u64()), (10, Some(1)), "{v}");
    let (code, v) = check(&sg(&venv(&d.0, "sglang", "0.5.23"), &k, &[]), &[]);
    assert_eq!(code, 0, "{v}");
    let (code, v) = check(&sg("python3", &k, &[]), &[]);
    assert_eq!(code, 0, "version unknown: a warning: {v}");
    assert!(findings(&v, "warning").iter().any(|f| f["message"].as_str().unwrap().contains("kimi_k2")), "{v}");
}

/// M7: llama-server -md without --spec-type: recent builds (their --help says `default: none`) load the
/// draft and do no speculation.
#[test]
fn m7_llama_server_draft_without_spec_type() {
    let Some(e) = env() else { return };
    let srv = e.server.display().to_string();
    let m = |n: &str| e.models.join(n).display().to_string();
    let (code, v) = check(&[srv.clone(), "-m".into(), m("tiny.gguf"), "-md".into(), m("tiny-draft.gguf")], &[]);
    assert_eq!(code, 0, "{v}");
    assert!(findings(&v, "warning").iter().any(|f| f["rule"] == "spec-type"), "{v}");
    let (_, v) = check(
        &[
            srv,
            "-m".into(),
            m("tiny.gguf"),
            "-md".into(),
            m("tiny-draft.gguf"),
            "--spec-type".into(),
            "draft-simple".into(),
        ],
        &[],
    );
    assert!(findings(&v, "warning").is_empty(), "{v}");
}

// ---- Issue #23: the golden table covers vLLM 0.20-0.33 and SGLang 0.5.10-0.5.23; TP against heads. ----

/// `venv` plus a transformers dist-info beside the server's.
fn venv_with_transformers(root: &Path, pkg: &str, version: &str, transformers: &str) -> String {
    let p = venv(root, pkg, version);
    let site = root.join(format!("venv-{pkg}-{version}/lib/python3.11/site-packages"));
    let di = site.join(format!("transformers-{transformers}.dist-info"));
    std::fs::create_dir_all(&di).unwrap();
    std::fs::write(
        di.join("METADATA"),
        format!("Metadata-Version: 2.1\nName: transformers\nVersion: {transformers}\n"),
    )
    .unwrap();
    p
}

fn confirmed(v: &Value, rule: &str) -> bool {
    rule_errors(v, rule).iter().any(|f| f["confirmed"].is_string())
}

/// Issue #23 step 5: on vLLM 0.26.0 `--max-model-len 100000` on an 8192-context model was "ERROR? (outside
/// the golden table)", `up` launched and the server crashed. Every version of the covered range is confirmed
/// (a release between two table versions by the lower one); a newer or older one is not.
#[test]
fn issue23_over_long_context_confirmed_on_every_covered_version() {
    let d = TempDir::new("i23len");
    let m = model_dir(&d.0, "tiny", &public("tiny-llama-gqa.json"));
    for (ver, want) in
        [("0.26.0", true), ("0.25.1", true), ("0.33.0", true), ("0.24.0", true), ("0.33.1", false), ("0.19.1", false)]
    {
        let (code, v) = check(&vl(&venv(&d.0, "vllm", ver), &m, &["--max-model-len", "100000"]), &[]);
        assert_eq!((code, confirmed(&v, "max-model-len")), (10, want), "vLLM {ver}: {v}");
        assert_eq!(v["blocking"].as_u64(), Some(want as u64), "vLLM {ver}: {v}");
    }
    let (_, v) = check(&vl(&venv(&d.0, "vllm", "0.25.1"), &m, &["--max-model-len", "100000"]), &[]);
    let msg = rule_errors(&v, "max-model-len")[0]["message"].as_str().unwrap().to_string();
    assert!(msg.contains("vLLM 0.24.0 rows"), "{msg}");
    // vLLM 0.20-0.23 also run with transformers 4.x: confirmed only with transformers 5 beside the server.
    let (_, v) = check(&vl(&venv(&d.0, "vllm", "0.21.0"), &m, &["--max-model-len", "100000"]), &[]);
    assert!(!confirmed(&v, "max-model-len"), "{v}");
    let (_, v) =
        check(&vl(&venv_with_transformers(&d.0, "vllm", "0.23.0", "5.6.0"), &m, &["--max-model-len", "100000"]), &[]);
    assert!(confirmed(&v, "max-model-len"), "{v}");
    for (ver, want) in [("0.5.17", true), ("0.5.18", true), ("0.5.10", true), ("0.5.9", false)] {
        let (code, v) = check(&sg(&venv(&d.0, "sglang", ver), &m, &["--context-length", "100000"]), &[]);
        assert_eq!((code, confirmed(&v, "context-length")), (10, want), "SGLang {ver}: {v}");
    }
    // The issue's run: `vigil up` on vLLM 0.26.0 now refuses instead of launching a server that crashes.
    let mut c = vigil();
    c.env("VIGIL_STATE_DIR", d.0.join("state")).args(["up", "--name", "i23", "--no-probe", "--"]).args(vl(
        &venv(&d.0, "vllm", "0.26.0"),
        &m,
        &["--max-model-len", "100000"],
    ));
    let o = run_bounded(c, T);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(10), "{err}");
    assert!(err.contains("not launching"), "{err}");
}

/// Issue #23 step 2: the attention layers of both servers refuse a TP that does not divide the heads, or
/// that neither divides the KV heads nor is a multiple of them (replication); `check` says so exactly there.
/// The tiny GPU-machine model (4 heads, 2 KV heads): TP 3 refused, TP 2 and TP 4 (KV heads replicated) run.
#[test]
fn issue23_tp_against_attention_and_kv_heads() {
    let d = TempDir::new("i23tp");
    let tiny = model_dir(&d.0, "tiny", &public("tiny-llama-gqa.json"));
    let minimax = model_dir(&d.0, "minimax", &golden_cfg("minimax-m2"));
    let (vllm, sglang) = (venv(&d.0, "vllm", "0.26.0"), venv(&d.0, "sglang", "0.5.17"));
    let tp_errors = |v: &Value| [rule_errors(v, "tp-heads"), rule_errors(v, "tp-kv-heads")].concat();
    for (name, args) in
        [("vllm", vl(&vllm, &tiny, &["--tensor-parallel-size", "3"])), ("sglang", sg(&sglang, &tiny, &["--tp", "3"]))]
    {
        let (code, v) = check(&args, &[]);
        assert_eq!((code, confirmed(&v, "tp-heads")), (10, true), "{name} TP 3: {v}");
    }
    for tp in ["2", "4"] {
        for (name, args) in
            [("vllm", vl(&vllm, &tiny, &["--tensor-parallel-size", tp])), ("sglang", sg(&sglang, &tiny, &["--tp", tp]))]
        {
            let (_, v) = check(&args, &[]);
            assert!(tp_errors(&v).is_empty(), "{name} TP {tp} runs: {v}");
            assert!(!findings(&v, "warning").iter().any(|f| f["rule"] == "tp-kv-heads"), "{name} TP {tp}: {v}");
        }
    }
    // MiniMax-M2: 48 heads divide by 3 and 6 (vLLM's config-level check passes), its 8 KV heads do not.
    for tp in ["3", "6"] {
        for (name, args) in [
            ("vllm", vl(&vllm, &minimax, &["--tensor-parallel-size", tp])),
            ("sglang", sg(&sglang, &minimax, &["--tp", tp])),
        ] {
            let (code, v) = check(&args, &[]);
            assert_eq!((code, confirmed(&v, "tp-kv-heads")), (10, true), "{name} TP {tp}: {v}");
            assert!(rule_errors(&v, "tp-heads").is_empty(), "{name} TP {tp}: {v}");
        }
    }
    // GPT-OSS-120B (64 heads, 8 KV heads) at TP 16: SGLang replicates the KV heads; vLLM's GPT-OSS attention
    // gives each GPU 8 // 16 = 0 of them and its attention layer divides by zero.
    let oss = model_dir(&d.0, "oss", &golden_cfg("gpt-oss-120b"));
    let (code, v) = check(&vl(&vllm, &oss, &["--tensor-parallel-size", "16"]), &[]);
    assert_eq!((code, confirmed(&v, "tp-kv-heads")), (10, true), "{v}");
    let (_, v) = check(&sg(&sglang, &oss, &["--tp", "16"]), &[]);
    assert!(tp_errors(&v).is_empty(), "{v}");
    // num_key_value_heads 0: both servers' attention layers divide by it.
    let zero = model_dir(&d.0, "zero", &golden_cfg("x-zero-kv"));
    for (name, args) in
        [("vllm", vl(&vllm, &zero, &["--tensor-parallel-size", "2"])), ("sglang", sg(&sglang, &zero, &["--tp", "2"]))]
    {
        let (code, v) = check(&args, &[]);
        assert_eq!((code, confirmed(&v, "tp-kv-heads")), (10, true), "{name}: {v}");
    }
    // An architecture the table does not build: still an error, not confirmed (vLLM's config-level heads
    // check is confirmed for any architecture).
    let mut other = public("tiny-llama-gqa.json");
    other["architectures"] = serde_json::json!(["FooForCausalLM"]);
    let other = model_dir(&d.0, "other", &other);
    let (code, v) = check(&sg(&sglang, &other, &["--tp", "3"]), &[]);
    assert_eq!((code, v["blocking"].as_u64(), confirmed(&v, "tp-heads")), (10, Some(0), false), "{v}");
    let (code, v) = check(&vl(&vllm, &other, &["--tensor-parallel-size", "3"]), &[]);
    assert_eq!((code, confirmed(&v, "tp-heads")), (10, true), "{v}");
}
