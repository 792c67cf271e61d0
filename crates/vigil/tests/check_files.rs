//! Issue #34: `vigil check` on the model files and the machine as facts, on real files the tests write:
//! tiny safetensors checkpoints in the shapes of the GPU kit's make_tiny.py (the data part a hole, the
//! header real), a draft whose config disagrees with its weights, a checkpoint whose shapes disagree with
//! its config, a missing and a truncated shard, a missing LoRA folder, CUDA_VISIBLE_DEVICES without NVML,
//! and the kit's good starts (scenarios.sh, two-nodes.sh), which must pass with nothing blocking.

mod common;
use common::*;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::Duration;

const T: Duration = Duration::from_secs(60);

// make_tiny.py: vocab 32000, hidden 512, 4 layers, 4 heads / 2 KV heads of 128, FFN 1536, draft vocab 8192.
const V: u64 = 32000;
const H: u64 = 512;
const L: u64 = 4;
const Q: u64 = 4 * 128;
const KV: u64 = 2 * 128;
const F: u64 = 1536;
const DV: u64 = 8192;

fn dtype_bytes(d: &str) -> u64 {
    match d {
        "I64" => 8,
        "BOOL" => 1,
        _ => 2,
    }
}

/// A safetensors file as the format says (8-byte little-endian length, the JSON table, the data), the
/// data left as a hole. Returns the file's length.
fn write_st(path: &Path, tensors: &[(String, &str, Vec<u64>)]) -> u64 {
    let mut table = serde_json::Map::new();
    table.insert("__metadata__".into(), json!({"format": "pt"}));
    let mut off = 0u64;
    for (name, dtype, shape) in tensors {
        let n = shape.iter().product::<u64>() * dtype_bytes(dtype);
        table.insert(name.clone(), json!({"dtype": dtype, "shape": shape, "data_offsets": [off, off + n]}));
        off += n;
    }
    let mut head = serde_json::to_vec(&Value::Object(table)).unwrap();
    while !head.len().is_multiple_of(8) {
        head.push(b' ');
    }
    let mut bytes = (head.len() as u64).to_le_bytes().to_vec();
    bytes.extend(&head);
    std::fs::write(path, &bytes).unwrap();
    let len = bytes.len() as u64 + off;
    std::fs::OpenOptions::new().write(true).open(path).unwrap().set_len(len).unwrap();
    len
}

fn t(name: &str, dtype: &'static str, shape: &[u64]) -> (String, &'static str, Vec<u64>) {
    (name.to_string(), dtype, shape.to_vec())
}

fn llama_config(over: Value) -> Value {
    let mut c = json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": V,
        "hidden_size": H, "intermediate_size": F, "num_hidden_layers": L,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 128,
        "hidden_act": "silu", "max_position_embeddings": 8192, "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    });
    for (k, v) in over.as_object().unwrap() {
        c[k] = v.clone();
    }
    c
}

/// make_tiny.py `write_target`: the tensors of the tiny Llama.
fn target_tensors(layers: u64, ffn: u64) -> Vec<(String, &'static str, Vec<u64>)> {
    let mut w = vec![
        t("model.embed_tokens.weight", "BF16", &[V, H]),
        t("model.norm.weight", "BF16", &[H]),
        t("lm_head.weight", "BF16", &[V, H]),
    ];
    for i in 0..layers {
        let p = format!("model.layers.{i}.");
        for (n, s) in [
            ("input_layernorm.weight", vec![H]),
            ("post_attention_layernorm.weight", vec![H]),
            ("self_attn.q_proj.weight", vec![Q, H]),
            ("self_attn.k_proj.weight", vec![KV, H]),
            ("self_attn.v_proj.weight", vec![KV, H]),
            ("self_attn.o_proj.weight", vec![H, Q]),
            ("mlp.gate_proj.weight", vec![ffn, H]),
            ("mlp.up_proj.weight", vec![ffn, H]),
            ("mlp.down_proj.weight", vec![H, ffn]),
        ] {
            w.push((format!("{p}{n}"), "BF16", s));
        }
    }
    w
}

fn write_target(dir: &Path, config: Value, tensors: &[(String, &'static str, Vec<u64>)]) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("config.json"), serde_json::to_vec_pretty(&config).unwrap()).unwrap();
    write_st(&dir.join("model.safetensors"), tensors);
    dir.to_path_buf()
}

/// make_tiny.py `write_eagle3`: the published EAGLE-3 layout, and its config.
fn write_eagle3(dir: &Path, over: Value, lm_head_rows: u64) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let w = vec![
        t("fc.weight", "BF16", &[H, 3 * H]),
        t("norm.weight", "BF16", &[H]),
        t("lm_head.weight", "BF16", &[lm_head_rows, H]),
        t("midlayer.input_layernorm.weight", "BF16", &[H]),
        t("midlayer.hidden_norm.weight", "BF16", &[H]),
        t("midlayer.post_attention_layernorm.weight", "BF16", &[H]),
        t("midlayer.self_attn.q_proj.weight", "BF16", &[Q, 2 * H]),
        t("midlayer.self_attn.k_proj.weight", "BF16", &[KV, 2 * H]),
        t("midlayer.self_attn.v_proj.weight", "BF16", &[KV, 2 * H]),
        t("midlayer.self_attn.o_proj.weight", "BF16", &[H, Q]),
        t("midlayer.mlp.gate_proj.weight", "BF16", &[F, H]),
        t("midlayer.mlp.up_proj.weight", "BF16", &[F, H]),
        t("midlayer.mlp.down_proj.weight", "BF16", &[H, F]),
        t("d2t", "I64", &[DV]),
        t("t2d", "BOOL", &[V]),
    ];
    write_st(&dir.join("model.safetensors"), &w);
    let mut cfg = llama_config(json!({
        "architectures": ["LlamaForCausalLMEagle3"], "num_hidden_layers": 1, "draft_vocab_size": DV,
        "target_hidden_size": H, "eagle_aux_hidden_state_layer_ids": [1, 2, 3],
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 2], "use_aux_hidden_state": true},
    }));
    for (k, v) in over.as_object().unwrap() {
        cfg[k] = v.clone();
    }
    std::fs::write(dir.join("config.json"), serde_json::to_vec_pretty(&cfg).unwrap()).unwrap();
    dir.to_path_buf()
}

/// A fake Python environment whose package metadata says `pkg` `version` (what check reads; never run).
fn venv(root: &Path, pkg: &str, version: &str) -> String {
    let v = root.join(format!("venv-{pkg}-{version}"));
    let di = v.join("lib/python3.12/site-packages").join(format!("{pkg}-{version}.dist-info"));
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

fn check(args: &[String], env: &[(&str, &str)]) -> (i32, Value) {
    let mut c = vigil();
    for k in ["CUDA_VISIBLE_DEVICES", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_IB_HCA", "HF_HUB_OFFLINE"] {
        c.env_remove(k);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    c.args(["check", "--json", "--"]).args(args);
    let o = run_bounded(c, T);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
    });
    (o.status.code().unwrap(), v)
}

fn with_rule(v: &Value, rule: &str, sev: &str) -> Vec<Value> {
    v["findings"].as_array().unwrap().iter().filter(|f| f["rule"] == rule && f["severity"] == sev).cloned().collect()
}

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

/// `vllm serve MODEL ...` with the venv's entry script (version 0.26.0, as on the GPU machine).
fn vllm(root: &Path, model: &Path, extra: &[&str]) -> Vec<String> {
    let mut a = vec![venv(root, "vllm", "0.26.0"), "serve".into(), model.display().to_string()];
    a.extend(s(extra));
    a.extend(["--port".into(), free_port().to_string()]);
    a
}

fn sglang(root: &Path, model: &Path, extra: &[&str]) -> Vec<String> {
    let mut a = vec![venv(root, "sglang", "0.5.17"), "-m".into(), "sglang.launch_server".into()];
    a.extend(["--model-path".into(), model.display().to_string()]);
    a.extend(s(extra));
    a.extend(["--port".into(), free_port().to_string()]);
    a
}

/// Zero false refusals: the starts of the GPU kit (scenarios.sh a, c1, f; two-nodes.sh sN, vN) on models
/// of make_tiny.py's shapes pass with nothing blocking, and the headers are read (bytes in the JSON).
#[test]
fn kit_good_starts_pass_check() {
    let d = TempDir::new("kit");
    let m = write_target(&d.0.join("target"), llama_config(json!({})), &target_tensors(L, F));
    let e = write_eagle3(&d.0.join("eagle3"), json!({}), DV);
    let spec = format!("{{\"method\":\"eagle3\",\"model\":\"{}\",\"num_speculative_tokens\":3}}", e.display());
    let env = [("HF_HUB_OFFLINE", "1")];
    let two = [("HF_HUB_OFFLINE", "1"), ("NCCL_SOCKET_IFNAME", "lo"), ("GLOO_SOCKET_IFNAME", "lo")];
    let eagle = e.display().to_string();
    type Env<'a> = &'a [(&'a str, &'a str)];
    let cases: Vec<(&str, Vec<String>, Env)> = vec![
        ("vllm a", vllm(&d.0, &m, &["--host", "127.0.0.1"]), &env),
        ("vllm c1", vllm(&d.0, &m, &["--gpu-memory-utilization", "0.002"]), &env),
        ("vllm f", vllm(&d.0, &m, &["--speculative-config", &spec]), &env),
        (
            "vllm vN",
            vllm(
                &d.0,
                &m,
                &[
                    "--tensor-parallel-size",
                    "2",
                    "--nnodes",
                    "2",
                    "--master-addr",
                    "127.0.0.1",
                    "--master-port",
                    "29556",
                    "--gpu-memory-utilization",
                    "0.4",
                    "--node-rank",
                    "0",
                ],
            ),
            &two,
        ),
        (
            "sglang a",
            sglang(&d.0, &m, &["--attention-backend", "triton", "--sampling-backend", "pytorch", "--enable-metrics"]),
            &env,
        ),
        ("sglang c1", sglang(&d.0, &m, &["--mem-fraction-static", "0.001"]), &env),
        (
            "sglang f",
            sglang(
                &d.0,
                &m,
                &[
                    "--speculative-algorithm",
                    "EAGLE3",
                    "--speculative-draft-model-path",
                    &eagle,
                    "--speculative-num-steps",
                    "3",
                    "--speculative-eagle-topk",
                    "1",
                    "--speculative-num-draft-tokens",
                    "4",
                ],
            ),
            &env,
        ),
        (
            "sglang sN",
            sglang(
                &d.0,
                &m,
                &[
                    "--tp-size",
                    "2",
                    "--nnodes",
                    "2",
                    "--dist-init-addr",
                    "127.0.0.1:29555",
                    "--mem-fraction-static",
                    "0.35",
                    "--disable-custom-all-reduce",
                    "--node-rank",
                    "0",
                ],
            ),
            &two,
        ),
    ];
    for (name, argv, env) in cases {
        let (code, v) = check(&argv, env);
        assert_eq!(v["blocking"], 0, "{name}: a good start of the kit is refused: {v}");
        assert_eq!(code, 0, "{name}: errors on a good start: {v}");
        let read: Vec<&Value> = v["findings"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|f| f["rule"] == "weights" && f["data"]["bytes_read"].as_u64().is_some())
            .collect();
        assert!(!read.is_empty(), "{name}: no header read reported: {v}");
        assert!(read[0]["data"]["bytes_read"].as_u64().unwrap() < 64 << 10, "{name}: read more than headers: {v}");
        assert_eq!(read[0]["data"]["tensors"], 3 + 9 * L, "{name}: {v}");
        if name.ends_with(" f") {
            assert!(
                read.iter().any(|f| f["data"]["role"] == "draft-model" && f["data"]["tensors"] == 15),
                "{name}: {v}"
            );
        }
    }
}

/// An EAGLE-3 draft whose config disagrees with its own weights (draft_vocab_size 16384, lm_head has 8192
/// rows; hidden_size 1024 against 512-wide tensors) is refused by both servers' loaders: confirmed, exit 10.
/// Without a known server version the same finding is an error that does not block.
#[test]
fn draft_config_disagreeing_with_its_weights_is_refused() {
    let d = TempDir::new("draftcfg");
    let m = write_target(&d.0.join("target"), llama_config(json!({})), &target_tensors(L, F));
    let e = write_eagle3(&d.0.join("eagle3"), json!({"draft_vocab_size": 16384}), DV);
    let spec = format!("{{\"method\":\"eagle3\",\"model\":\"{}\",\"num_speculative_tokens\":3}}", e.display());
    let (code, v) = check(&vllm(&d.0, &m, &["--speculative-config", &spec]), &[]);
    assert_eq!(code, 10, "{v}");
    let f = with_rule(&v, "draft-shape", "error");
    assert_eq!(f.len(), 1, "{v}");
    let msg = f[0]["message"].as_str().unwrap();
    assert!(msg.contains("lm_head.weight is [8192, 512]") && msg.contains("[16384, 512]"), "{msg}");
    assert!(f[0]["confirmed"].is_string(), "{v}");
    let (code, v) = check(
        &sglang(
            &d.0,
            &m,
            &["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", &e.display().to_string()],
        ),
        &[],
    );
    assert_eq!((code, v["blocking"].as_u64()), (10, Some(1)), "{v}");
    // Unknown version: shown, not blocking.
    let mut argv = s(&["python3", "-m", "sglang.launch_server", "--model-path"]);
    argv.extend([m.display().to_string(), "--speculative-algorithm".into(), "EAGLE3".into()]);
    argv.extend(["--speculative-draft-model-path".into(), e.display().to_string()]);
    argv.extend(["--port".into(), free_port().to_string()]);
    let (code, v) = check(&argv, &[]);
    assert_eq!((code, v["blocking"].as_u64()), (10, Some(0)), "{v}");
    // The kit's draft with a config saying hidden_size 1024 (and target_hidden_size 1024): every midlayer
    // and fc shape disagrees, besides the target's hidden size.
    let e2 = write_eagle3(&d.0.join("eagle3-wide"), json!({"hidden_size": 1024, "target_hidden_size": 1024}), DV);
    let spec = format!("{{\"method\":\"eagle3\",\"model\":\"{}\"}}", e2.display());
    let (_, v) = check(&vllm(&d.0, &m, &["--speculative-config", &spec]), &[]);
    let f = with_rule(&v, "draft-shape", "error");
    assert!(f[0]["message"].as_str().unwrap().contains("fc.weight is [512, 1536]"), "{v}");
}

/// A checkpoint whose shapes disagree with its config (intermediate_size 2048 in config.json, 1536 in the
/// weights), and one with fewer layers in config.json than in the weights.
#[test]
fn checkpoint_disagreeing_with_its_config() {
    let d = TempDir::new("shapes");
    let m = write_target(&d.0.join("ffn"), llama_config(json!({"intermediate_size": 2048})), &target_tensors(L, F));
    for argv in [vllm(&d.0, &m, &[]), sglang(&d.0, &m, &[])] {
        let (code, v) = check(&argv, &[]);
        assert_eq!(code, 10, "{v}");
        let f = with_rule(&v, "weights-shape", "error");
        assert_eq!(f.len(), 1, "{v}");
        let msg = f[0]["message"].as_str().unwrap();
        assert!(msg.contains("12 of the checkpoint's tensors") && msg.contains("intermediate_size 2048"), "{msg}");
        assert!(f[0]["confirmed"].is_string(), "{v}");
    }
    let m = write_target(&d.0.join("layers"), llama_config(json!({"num_hidden_layers": 3})), &target_tensors(L, F));
    let (code, v) = check(&vllm(&d.0, &m, &[]), &[]);
    assert_eq!((code, v["blocking"].as_u64()), (10, Some(1)), "{v}");
    assert!(with_rule(&v, "weights-layers", "error")[0]["message"].as_str().unwrap().contains("model.layers.3"), "{v}");
    // SGLang only warns about parameters it does not know and runs: an error, not confirmed.
    let (code, v) = check(&sglang(&d.0, &m, &[]), &[]);
    assert_eq!((code, v["blocking"].as_u64()), (10, Some(0)), "{v}");
    // A 5-layer config over 4 layers of weights: vLLM's load check refuses the missing tensors.
    let m = write_target(&d.0.join("short"), llama_config(json!({"num_hidden_layers": 5})), &target_tensors(L, F));
    let (_, v) = check(&vllm(&d.0, &m, &[]), &[]);
    let f = with_rule(&v, "weights-missing", "error");
    assert!(f[0]["message"].as_str().unwrap().contains("model.layers.4.self_attn.q_proj.weight"), "{v}");
    assert!(f[0]["confirmed"].is_string(), "{v}");
    // An architecture whose layout is not modelled: no shape finding at all, a line saying so.
    let m = write_target(
        &d.0.join("other"),
        llama_config(
            json!({"architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox", "intermediate_size": 2048}),
        ),
        &target_tensors(L, F),
    );
    let (_, v) = check(&vllm(&d.0, &m, &[]), &[]);
    assert!(with_rule(&v, "weights-shape", "error").is_empty(), "{v}");
    assert_eq!(with_rule(&v, "weights-shape", "info").len(), 1, "{v}");
}

/// A shard the index names that is not on disk, and a shard cut short (a download stopped halfway).
#[test]
fn missing_and_truncated_shards() {
    let d = TempDir::new("shards");
    let dir = d.0.join("sharded");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("config.json"), serde_json::to_vec(&llama_config(json!({}))).unwrap()).unwrap();
    let all = target_tensors(L, F);
    let (a, b) = all.split_at(all.len() / 2);
    let names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"];
    let len_a = write_st(&dir.join(names[0]), a);
    write_st(&dir.join(names[1]), b);
    let mut map = serde_json::Map::new();
    for (i, part) in [a, b].iter().enumerate() {
        for (n, _, _) in part.iter() {
            map.insert(n.clone(), json!(names[i]));
        }
    }
    std::fs::write(dir.join("model.safetensors.index.json"), json!({"metadata": {}, "weight_map": map}).to_string())
        .unwrap();
    let (code, v) = check(&vllm(&d.0, &dir, &[]), &[]);
    assert_eq!(code, 0, "two whole shards: {v}");
    // A `huggingface-cli download --local-dir` still under way: an error, not confirmed (the partial file
    // may not be one the server loads).
    let partial = dir.join(".cache/huggingface/download");
    std::fs::create_dir_all(&partial).unwrap();
    std::fs::write(partial.join("abc.incomplete"), b"").unwrap();
    let (code, v) = check(&vllm(&d.0, &dir, &[]), &[]);
    assert_eq!((code, v["blocking"].as_u64()), (10, Some(0)), "{v}");
    std::fs::remove_dir_all(dir.join(".cache")).unwrap();
    std::fs::remove_file(dir.join(names[1])).unwrap();
    for argv in [vllm(&d.0, &dir, &[]), sglang(&d.0, &dir, &[])] {
        let (code, v) = check(&argv, &[]);
        assert_eq!(code, 10, "{v}");
        let f = with_rule(&v, "weights", "error");
        assert!(
            f.iter().any(|f| f["message"].as_str().unwrap().contains(names[1]) && f["confirmed"].is_string()),
            "{v}"
        );
    }
    write_st(&dir.join(names[1]), b);
    std::fs::OpenOptions::new().write(true).open(dir.join(names[0])).unwrap().set_len(len_a - 1000).unwrap();
    let (code, v) = check(&sglang(&d.0, &dir, &[]), &[]);
    assert_eq!(code, 10, "{v}");
    let f = with_rule(&v, "weights", "error");
    assert!(
        f.iter().any(|f| f["message"].as_str().unwrap().contains("1000 bytes short") && f["confirmed"].is_string()),
        "{v}"
    );
    // No *.safetensors at all beside *.bin files: both servers glob *.safetensors, find none and load the
    // .bin files without the index; nothing is refused.
    let bin = d.0.join("bin-only");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::write(bin.join("config.json"), serde_json::to_vec(&llama_config(json!({}))).unwrap()).unwrap();
    std::fs::copy(dir.join("model.safetensors.index.json"), bin.join("model.safetensors.index.json")).unwrap();
    std::fs::write(bin.join("pytorch_model.bin"), b"PK").unwrap();
    let (_, v) = check(&vllm(&d.0, &bin, &[]), &[]);
    assert_eq!(v["blocking"], 0, "{v}");
    assert!(with_rule(&v, "weights", "info").iter().any(|f| f["message"].as_str().unwrap().contains("*.bin")), "{v}");
}

/// A LoRA folder that does not exist (vLLM `--lora-modules`, SGLang `--lora-paths`), one without
/// adapter_config.json, a tokenizer and a chat template that do not exist.
#[test]
fn missing_adapter_tokenizer_and_template_paths() {
    let d = TempDir::new("paths");
    let m = write_target(&d.0.join("target"), llama_config(json!({})), &target_tensors(L, F));
    let gone = d.0.join("no-such-adapter").display().to_string();
    let (code, v) = check(&vllm(&d.0, &m, &["--enable-lora", "--lora-modules", &format!("sql={gone}")]), &[]);
    assert_eq!((code, v["blocking"].as_u64()), (10, Some(1)), "{v}");
    assert!(with_rule(&v, "lora", "error")[0]["message"].as_str().unwrap().contains("does not exist"), "{v}");
    let empty = d.0.join("empty-adapter");
    std::fs::create_dir_all(&empty).unwrap();
    let (code, v) = check(&sglang(&d.0, &m, &["--lora-paths", &format!("a={}", empty.display())]), &[]);
    assert_eq!(code, 10, "{v}");
    assert!(with_rule(&v, "lora", "error")[0]["message"].as_str().unwrap().contains("adapter_config.json"), "{v}");
    std::fs::write(empty.join("adapter_config.json"), "{}").unwrap();
    let (code, v) = check(&sglang(&d.0, &m, &["--lora-paths", &format!("a={}", empty.display())]), &[]);
    assert_eq!(code, 0, "{v}");
    // A Hub id is not a path: not checked here.
    let (code, v) = check(&vllm(&d.0, &m, &["--enable-lora", "--lora-modules", "sql=org/sql-lora"]), &[]);
    assert_eq!(code, 0, "{v}");
    let tmpl = d.0.join("no.jinja").display().to_string();
    let (code, v) = check(&vllm(&d.0, &m, &["--chat-template", &tmpl, "--tokenizer", &gone]), &[]);
    assert_eq!((code, v["blocking"].as_u64()), (10, Some(2)), "{v}");
    // With --skip-tokenizer-init no tokenizer is loaded: its path is not checked.
    let (code, v) = check(&vllm(&d.0, &m, &["--tokenizer", &gone, "--skip-tokenizer-init"]), &[]);
    assert_eq!(code, 0, "{v}");
    // Template text is not a path.
    let (code, v) = check(&vllm(&d.0, &m, &["--chat-template", "{{ messages }}"]), &[]);
    assert_eq!(code, 0, "{v}");
}

/// CUDA_VISIBLE_DEVICES naming a device that may not exist, on a machine without NVML: the check says
/// which facts it could not read and refuses nothing. A variable that leaves fewer entries than the
/// ranks of one node need is a fact without NVML ("0" for TP 2; "0,0" shows no device at all).
#[test]
fn cuda_visible_devices_without_nvml() {
    if Path::new("/usr/bin/nvidia-smi").exists() || Path::new("/usr/local/nvidia/lib64").exists() {
        eprintln!("SKIP: this machine has GPU tools");
        return;
    }
    let d = TempDir::new("cvd");
    let m = write_target(&d.0.join("target"), llama_config(json!({})), &target_tensors(L, F));
    for cvd in ["7", "GPU-deadbeef", "MIG-0000"] {
        for argv in [vllm(&d.0, &m, &[]), sglang(&d.0, &m, &[])] {
            let (code, v) = check(&argv, &[("CUDA_VISIBLE_DEVICES", cvd)]);
            assert_eq!(code, 0, "CUDA_VISIBLE_DEVICES={cvd}: refused on a guess: {v}");
            let info = with_rule(&v, "gpus", "info");
            assert!(
                info.iter().any(|f| {
                    let m = f["message"].as_str().unwrap();
                    m.contains("not read: GPU count") && m.contains(&format!("CUDA_VISIBLE_DEVICES={cvd}"))
                }),
                "CUDA_VISIBLE_DEVICES={cvd}: the check does not say what it could not read: {v}"
            );
        }
    }
    // TP 2 with one entry: vLLM 0.26 raises before loading; confirmed without reading NVML.
    let (code, v) = check(&vllm(&d.0, &m, &["-tp", "2"]), &[("CUDA_VISIBLE_DEVICES", "0")]);
    assert_eq!((code, v["blocking"].as_u64()), (10, Some(1)), "{v}");
    assert!(with_rule(&v, "gpus", "error")[0]["message"].as_str().unwrap().contains("World size (2)"), "{v}");
    // Two nodes of one rank each (two-nodes.sh) need one GPU here.
    let (code, v) =
        check(&sglang(&d.0, &m, &["--tp", "2", "--nnodes", "2", "--node-rank", "0"]), &[("CUDA_VISIBLE_DEVICES", "0")]);
    assert_eq!(code, 0, "{v}");
    // "0,0": CUDA shows no device.
    let (code, v) = check(&sglang(&d.0, &m, &[]), &[("CUDA_VISIBLE_DEVICES", "0,0")]);
    assert_eq!((code, v["blocking"].as_u64()), (10, Some(1)), "{v}");
}

/// NCCL_SOCKET_IFNAME naming no interface of this machine, for a multi-GPU start (an error, not confirmed),
/// and NCCL's `=`/`^` forms that do match.
#[test]
fn nccl_interfaces_that_do_not_exist() {
    let d = TempDir::new("nccl");
    let m = write_target(&d.0.join("target"), llama_config(json!({})), &target_tensors(L, F));
    let argv = sglang(&d.0, &m, &["--tp", "2", "--nnodes", "2", "--node-rank", "0"]);
    let (code, v) = check(&argv, &[("NCCL_SOCKET_IFNAME", "nosuchif9")]);
    assert_eq!((code, v["blocking"].as_u64()), (10, Some(0)), "{v}");
    assert!(with_rule(&v, "nccl-env", "error")[0]["message"].as_str().unwrap().contains("nosuchif9"), "{v}");
    for ok in ["lo", "=lo", "^nosuchif9"] {
        let (code, v) = check(&argv, &[("NCCL_SOCKET_IFNAME", ok), ("GLOO_SOCKET_IFNAME", "lo")]);
        assert_eq!(code, 0, "NCCL_SOCKET_IFNAME={ok}: {v}");
    }
    let (_, v) = check(&argv, &[("GLOO_SOCKET_IFNAME", "lo0x")]);
    assert_eq!(with_rule(&v, "nccl-env", "error").len(), 1, "{v}");
}

/// `vigil up` refuses a start whose files the server refuses (exit 10, the finding printed, nothing
/// launched): the program named would write a marker if it ran.
#[test]
fn up_refuses_a_truncated_shard_before_launching() {
    let d = TempDir::new("upref");
    let m = write_target(&d.0.join("target"), llama_config(json!({})), &target_tensors(L, F));
    let st = m.join("model.safetensors");
    let len = std::fs::metadata(&st).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&st).unwrap().set_len(len / 2).unwrap();
    let marker = d.0.join("launched");
    let argv = vllm(&d.0, &m, &[]);
    // The venv's `vllm` entry script, made to record a launch.
    std::fs::write(&argv[0], format!("#!/bin/sh\ntouch {}\n", marker.display())).unwrap();
    std::fs::set_permissions(&argv[0], std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mut c = vigil();
    c.env("VIGIL_STATE_DIR", d.0.join("state")).args(["up", "--name", "t", "--no-probe", "--"]).args(&argv);
    let o = run_bounded(c, T);
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(10), "{out}{err}");
    assert!(out.contains("ERROR [weights]") && out.contains("bytes short"), "{out}");
    assert!(err.contains("not launching"), "{err}");
    assert!(!marker.exists(), "the server was launched");
}
