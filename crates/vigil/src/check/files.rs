//! The model files as facts (issue #34): the safetensors headers of the checkpoint the server will load
//! (never the weights), checked against its own `config.json` for the Llama family, the EAGLE-3 draft
//! against itself and its target, shards the index names that are missing, shards whose size is not the
//! one their header says, and the other paths a command names (LoRA adapters, tokenizer, chat template).
//!
//! What the servers do with each is cited in docs/preflight-facts.md; a finding is confirmed (blocks
//! `vigil up`) only where the server's own code path refuses it in the versions read there, and only for
//! the tensor layouts modelled here. Anything else is an unconfirmed error or a warning.

use super::derive::{self, Srv};
use super::{evidence, Config};
use crate::sinks::records::{CheckReport as Report, Severity};
use crate::sources::safetensors::{self as st, Checkpoint, StError};
use std::collections::BTreeSet;
use std::path::Path;

/// The releases whose loaders docs/preflight-facts.md cites; a refusal is confirmed from them on.
fn cited(srv: Srv, ver: Option<&str>) -> bool {
    let min: &[u64] = match srv {
        Srv::Vllm => &[0, 26, 0],
        Srv::Sglang => &[0, 5, 17],
    };
    derive::at_least(ver, min) == Some(true)
}

/// A refusal the server's own code makes in the cited releases: confirmed there, else an unconfirmed error
/// that says why.
fn refusal(rep: &mut Report, srv: Srv, rule: &str, msg: String, fix: String, by: &'static str) {
    let ver = rep.version.clone();
    if cited(srv, ver.as_deref()) {
        rep.add_confirmed(rule, msg, Some(fix), by);
    } else {
        let why = match ver {
            None => format!(" ({} version unknown: not confirmed)", srv.name()),
            Some(v) => format!(" ({} {v} is older than the release read for this rule: not confirmed)", srv.name()),
        };
        rep.add(Severity::Error, rule, format!("{msg}{why}"), Some(fix));
    }
}

/// `--load-format` when it reads safetensors the way this module models (`auto`, `safetensors`, unset).
pub fn loads_safetensors(argv: &[String]) -> bool {
    match crate::sources::follow::arg_value(argv, "--load-format") {
        None => true,
        Some(f) => matches!(f, "auto" | "safetensors"),
    }
}

/// What one checkpoint check read, for the fit and the JSON.
pub struct Read {
    pub weight_bytes: u64,
}

/// Reads the checkpoint in `dir` and reports its files: missing shards, sizes, and (for `role`) its shapes
/// against `cfg`. `None` when the folder holds no safetensors.
pub fn check_checkpoint(
    srv: Srv,
    argv: &[String],
    dir: &Path,
    cfg: &Config,
    role: Role,
    rep: &mut Report,
) -> Option<Read> {
    let t0 = std::time::Instant::now();
    let ck = st::read_checkpoint(dir)?;
    let what = role.name();
    // No safetensors file at all beside an index: both servers fall back to `*.bin` (their
    // `_prepare_weights` globs `*.safetensors` first, then `*.bin`), and the index is not used.
    if ck.shards.is_empty() && has_bin(dir) {
        rep.add(
            Severity::Info,
            "weights",
            format!("{what}: no *.safetensors in {}: the server loads its *.bin files (not inspected)", dir.display()),
            None,
        );
        return None;
    }
    if let Some(e) = &ck.index_error {
        rep.add(Severity::Error, "weights", format!("{what}: {e}"), None);
    }
    if !ck.missing.is_empty() {
        let msg = format!(
            "{what}: {} of the shards {} names are not in {}: {}",
            ck.missing.len(),
            ck.index.as_deref().map(|p| p.display().to_string()).unwrap_or_default(),
            dir.display(),
            ck.missing.iter().take(5).cloned().collect::<Vec<_>>().join(", ")
        );
        let fix = "finish the download (huggingface-cli download REPO --local-dir DIR resumes it)".to_string();
        refusal(rep, srv, "weights", msg, fix, evidence::MISSING_SHARD);
    }
    for s in &ck.shards {
        let p = dir.join(&s.file);
        match &s.header {
            Ok(h) if h.file_len != h.expected_len() => {
                let how = if h.file_len < h.expected_len() {
                    format!("{} bytes short: truncated or still downloading", h.expected_len() - h.file_len)
                } else {
                    format!("{} bytes past the last tensor", h.file_len - h.expected_len())
                };
                rep.add_confirmed(
                    "weights",
                    format!(
                        "{}: its header says the file has {} bytes (8 + {} header + {} data), it has {} ({how}): safetensors refuses it (MetadataIncompleteBuffer) when the server opens it",
                        p.display(),
                        h.expected_len(),
                        h.header_len,
                        h.data_end,
                        h.file_len
                    ),
                    Some("download this shard again and compare its size with the Hub's".into()),
                    evidence::SAFETENSORS_SIZE,
                );
            }
            Ok(_) => {}
            Err(StError::Io(e)) => rep.add(Severity::Error, "weights", e.clone(), None),
            Err(e) => rep.add_confirmed(
                "weights",
                format!("{e}: safetensors refuses it when the server opens it"),
                Some("download this shard again".into()),
                evidence::SAFETENSORS_SIZE,
            ),
        }
    }
    match role {
        Role::Target => llama_shapes(srv, argv, cfg, &ck, rep),
        Role::Draft { target, eagle3 } => draft_shapes(srv, argv, cfg, target, eagle3, &ck, rep),
    }
    let bytes_read = ck.bytes_read;
    rep.add(
        Severity::Info,
        "weights",
        format!(
            "{what}: {} shard headers read ({} bytes) in {:.1} ms: {} tensors, {:.2} GiB of weights",
            ck.shards.len(),
            bytes_read,
            t0.elapsed().as_secs_f64() * 1000.0,
            ck.tensors.len(),
            ck.weight_bytes as f64 / (1u64 << 30) as f64
        ),
        None,
    );
    if let Some(f) = rep.findings.last_mut() {
        f.data = Some(serde_json::json!({
            "role": what,
            "shards": ck.shards.len(),
            "tensors": ck.tensors.len(),
            "weight_bytes": ck.weight_bytes,
            "bytes_read": bytes_read,
            "ms": (t0.elapsed().as_secs_f64() * 1e4).round() / 10.0,
        }));
    }
    Some(Read { weight_bytes: ck.weight_bytes })
}

fn has_bin(dir: &Path) -> bool {
    std::fs::read_dir(dir)
        .map(|rd| rd.flatten().take(100_000).any(|e| e.file_name().to_string_lossy().ends_with(".bin")))
        .unwrap_or(false)
}

/// Which model a checkpoint is.
#[derive(Clone, Copy)]
pub enum Role<'a> {
    Target,
    Draft { target: &'a Config, eagle3: bool },
}

impl Role<'_> {
    fn name(&self) -> &'static str {
        match self {
            Role::Target => "model",
            Role::Draft { .. } => "draft-model",
        }
    }
}

/// The architectures whose tensor names and shapes are modelled: the Llama layout (embed_tokens, per-layer
/// q/k/v/o and gate/up/down, lm_head), loaded by vLLM's and SGLang's llama.py / qwen2.py / qwen3.py.
const LLAMA_FAMILY: &[&str] = &["LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"];

/// The dimensions a Llama-layout config implies.
struct Dims {
    vocab: u64,
    hidden: u64,
    layers: u64,
    heads: u64,
    kv_heads: u64,
    head_dim: u64,
    ffn: u64,
    tied: bool,
}

fn dims(srv: Srv, c: &Config) -> Option<Dims> {
    let hidden = c.u64(srv, "hidden_size")?;
    let heads = c.u64(srv, "num_attention_heads").filter(|h| *h > 0)?;
    Some(Dims {
        vocab: c.u64(srv, "vocab_size")?,
        hidden,
        layers: c.u64(srv, "num_hidden_layers")?,
        heads,
        kv_heads: c.u64(srv, "num_key_value_heads").filter(|k| *k > 0).unwrap_or(heads),
        head_dim: c.u64(srv, "head_dim").filter(|d| *d > 0).unwrap_or(hidden / heads),
        ffn: c.u64(srv, "intermediate_size")?,
        tied: c.json.get("tie_word_embeddings").and_then(|v| v.as_bool()).unwrap_or(false),
    })
}

/// One expected tensor: name, shape, and what the shape is made of (for the message).
struct Want {
    name: String,
    shape: Vec<u64>,
    from: String,
}

fn shape_str(s: &[u64]) -> String {
    format!("[{}]", s.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(", "))
}

/// Compares `want` with the checkpoint: shape mismatches (each server's weight loader asserts on them),
/// then missing tensors. Returns (mismatches, missing).
fn compare(ck: &Checkpoint, want: &[Want]) -> (Vec<String>, Vec<String>) {
    let mut bad = Vec::new();
    let mut missing = Vec::new();
    for w in want {
        match ck.tensors.get(&w.name) {
            Some((_, shape)) if *shape != w.shape => bad.push(format!(
                "{} is {} in the checkpoint, {} from config.json ({})",
                w.name,
                shape_str(shape),
                shape_str(&w.shape),
                w.from
            )),
            Some(_) => {}
            None => missing.push(w.name.clone()),
        }
    }
    (bad, missing)
}

/// Quantized checkpoints pack their weights (int4 in int32, fp8 with scales): shapes are not checked.
fn quantized(cfg: &Config, ck: &Checkpoint) -> bool {
    cfg.json.get("quantization_config").is_some()
        || cfg.json.get("text_config").and_then(|t| t.get("quantization_config")).is_some()
        || ck.tensors.values().any(|(d, _)| !matches!(d.as_str(), "BF16" | "F16" | "F32" | "BOOL" | "I64" | "I32"))
}

fn attn_mlp(prefix: &str, d: &Dims, qkv_in: u64, qkv_in_from: &str) -> Vec<Want> {
    let (q, kv) = (d.heads * d.head_dim, d.kv_heads * d.head_dim);
    let qf = format!("num_attention_heads {} × head_dim {}", d.heads, d.head_dim);
    let kf = format!("num_key_value_heads {} × head_dim {}", d.kv_heads, d.head_dim);
    let w = |n: &str, shape: Vec<u64>, from: String| Want { name: format!("{prefix}{n}"), shape, from };
    vec![
        w("self_attn.q_proj.weight", vec![q, qkv_in], format!("{qf}, {qkv_in_from}")),
        w("self_attn.k_proj.weight", vec![kv, qkv_in], format!("{kf}, {qkv_in_from}")),
        w("self_attn.v_proj.weight", vec![kv, qkv_in], format!("{kf}, {qkv_in_from}")),
        w("self_attn.o_proj.weight", vec![d.hidden, q], format!("hidden_size {}, {qf}", d.hidden)),
        w(
            "mlp.gate_proj.weight",
            vec![d.ffn, d.hidden],
            format!("intermediate_size {}, hidden_size {}", d.ffn, d.hidden),
        ),
        w(
            "mlp.up_proj.weight",
            vec![d.ffn, d.hidden],
            format!("intermediate_size {}, hidden_size {}", d.ffn, d.hidden),
        ),
        w(
            "mlp.down_proj.weight",
            vec![d.hidden, d.ffn],
            format!("hidden_size {}, intermediate_size {}", d.hidden, d.ffn),
        ),
    ]
}

fn listed(v: &[String]) -> String {
    let mut s = v.iter().take(3).cloned().collect::<Vec<_>>().join("; ");
    if v.len() > 3 {
        s.push_str(&format!("; and {} more", v.len() - 3));
    }
    s
}

/// The target checkpoint against its own config, for the Llama family.
fn llama_shapes(srv: Srv, argv: &[String], cfg: &Config, ck: &Checkpoint, rep: &mut Report) {
    let arch = cfg.arch();
    if !LLAMA_FAMILY.contains(&arch.as_str()) {
        rep.add(
            Severity::Info,
            "weights-shape",
            format!("architecture {arch}: its tensor layout is not modelled, shapes not checked"),
            None,
        );
        return;
    }
    let Some(d) = dims(srv, cfg) else { return };
    if quantized(cfg, ck) || !ck.tensors.contains_key("model.layers.0.self_attn.q_proj.weight") {
        rep.add(
            Severity::Info,
            "weights-shape",
            format!("{}: quantized or not in the Llama tensor layout: shapes not checked", ck.dir.display()),
            None,
        );
        return;
    }
    let mut want = vec![Want {
        name: "model.embed_tokens.weight".into(),
        shape: vec![d.vocab, d.hidden],
        from: format!("vocab_size {}, hidden_size {}", d.vocab, d.hidden),
    }];
    if !d.tied {
        want.push(Want {
            name: "lm_head.weight".into(),
            shape: vec![d.vocab, d.hidden],
            from: format!("vocab_size {}, hidden_size {}", d.vocab, d.hidden),
        });
    }
    for i in 0..d.layers.min(4096) {
        want.extend(attn_mlp(&format!("model.layers.{i}."), &d, d.hidden, &format!("hidden_size {}", d.hidden)));
    }
    let (bad, missing) = compare(ck, &want);
    let cfgp = cfg.path.display();
    if !bad.is_empty() {
        refusal(
            rep,
            srv,
            "weights-shape",
            format!(
                "{} of the checkpoint's tensors disagree with {cfgp}: {}; {}'s weight loader asserts the shapes when it loads them",
                bad.len(),
                listed(&bad),
                srv.name()
            ),
            "use the config.json that came with these weights (or the weights of this config)".into(),
            evidence::WEIGHT_SHAPE,
        );
    }
    // Layer indexes beyond num_hidden_layers.
    let extra: BTreeSet<u64> = ck
        .tensors
        .keys()
        .filter_map(|n| n.strip_prefix("model.layers.")?.split('.').next()?.parse::<u64>().ok())
        .filter(|i| *i >= d.layers)
        .collect();
    if !extra.is_empty() {
        let msg = format!(
            "the checkpoint has layers up to model.layers.{} but {cfgp} says num_hidden_layers {}",
            extra.iter().next_back().unwrap_or(&0),
            d.layers
        );
        let fix = "use the config.json that came with these weights".to_string();
        match srv {
            Srv::Vllm => refusal(
                rep,
                srv,
                "weights-layers",
                format!("{msg}: vLLM raises `There is no module or parameter named 'model.layers.{}'`", extra.iter().next().unwrap_or(&0)),
                fix,
                evidence::VLLM_UNKNOWN_WEIGHT,
            ),
            Srv::Sglang => rep.add(
                Severity::Error,
                "weights-layers",
                format!("{msg}: SGLang logs `Parameter ... not found in params_dict` and runs without them (not a refusal: not confirmed)"),
                Some(fix),
            ),
        }
    }
    if !missing.is_empty() {
        let msg = format!("{} tensors {cfgp} implies are in no shard: {}", missing.len(), listed(&missing));
        let fix = "finish the download, or use the config.json that came with these weights".to_string();
        // vLLM checks every parameter was loaded only for a model without `quantization`
        // (model_loader/default_loader.py `load_weights`: `default_enable_weights_track`).
        let quant_flag = ["--quantization", "-q"].iter().any(|f| crate::sources::follow::arg_value(argv, f).is_some());
        match srv {
            Srv::Vllm if !quant_flag => refusal(
                rep,
                srv,
                "weights-missing",
                format!("{msg}: vLLM raises `Following weights were not initialized from checkpoint` after loading the rest"),
                fix,
                evidence::VLLM_UNLOADED_WEIGHT,
            ),
            _ => rep.add(
                Severity::Error,
                "weights-missing",
                format!("{msg}: {} runs with those weights uninitialised (it does not check here: not confirmed)", srv.name()),
                Some(fix),
            ),
        }
    }
}

/// An EAGLE-3 draft (the published layout: `midlayer.*`, `fc` over the target's aux hidden states,
/// `lm_head` over the draft vocabulary, `d2t`/`t2d`, no `embed_tokens`) against its own config and its
/// target: vLLM llama_eagle3.py and SGLang llama_eagle3.py build exactly these parameters.
fn draft_shapes(
    srv: Srv,
    argv: &[String],
    cfg: &Config,
    target: &Config,
    eagle3: bool,
    ck: &Checkpoint,
    rep: &mut Report,
) {
    let prefix = if ck.tensors.keys().any(|n| n.starts_with("midlayer.")) {
        "midlayer."
    } else if ck.tensors.keys().any(|n| n.starts_with("layers.0.")) {
        "layers.0."
    } else {
        ""
    };
    if !eagle3 || prefix.is_empty() {
        if !eagle3 {
            return llama_shapes(srv, argv, cfg, ck, rep);
        }
        rep.add(
            Severity::Info,
            "draft-shape",
            format!("{}: not in the published EAGLE-3 layout (midlayer.*): shapes not checked", ck.dir.display()),
            None,
        );
        return;
    }
    if quantized(cfg, ck) {
        return;
    }
    let Some(d) = dims(srv, cfg) else { return };
    let j = &cfg.json;
    let target_hidden = j.get("target_hidden_size").and_then(|v| v.as_u64()).unwrap_or(d.hidden);
    // num_aux: the explicit attribute, else eagle_config's layer ids, else 3 (both servers alike).
    let (naux, naux_from) = match j.get("num_aux_hidden_states").and_then(|v| v.as_u64()) {
        Some(n) => (n, "num_aux_hidden_states"),
        None => match j
            .get("eagle_config")
            .and_then(|e| e.get("eagle_aux_hidden_state_layer_ids"))
            .and_then(|v| v.as_array())
            .filter(|a| !a.is_empty())
        {
            Some(a) => (a.len() as u64, "eagle_config.eagle_aux_hidden_state_layer_ids"),
            None => (3, "the default 3 aux layers"),
        },
    };
    let draft_vocab = j.get("draft_vocab_size").and_then(|v| v.as_u64()).unwrap_or(d.vocab);
    let mut want = vec![
        Want {
            name: "fc.weight".into(),
            shape: vec![d.hidden, target_hidden * naux],
            from: format!("hidden_size {}, target_hidden_size {target_hidden} × {naux} ({naux_from})", d.hidden),
        },
        Want {
            name: "lm_head.weight".into(),
            shape: vec![draft_vocab, d.hidden],
            from: format!("draft_vocab_size {draft_vocab}, hidden_size {}", d.hidden),
        },
    ];
    want.extend(attn_mlp(
        prefix,
        &d,
        2 * d.hidden,
        &format!("2 × hidden_size {} (embeddings and hidden state)", d.hidden),
    ));
    // Optional tensors: checked when present (the servers share the target's embeddings otherwise).
    let mut optional =
        vec![Want { name: "d2t".into(), shape: vec![draft_vocab], from: format!("draft_vocab_size {draft_vocab}") }];
    optional.push(Want {
        name: "embed_tokens.weight".into(),
        shape: vec![d.vocab, d.hidden],
        from: format!("vocab_size {}, hidden_size {}", d.vocab, d.hidden),
    });
    let (mut bad, missing) = compare(ck, &want);
    let (bad_opt, _) = compare(ck, &optional);
    bad.extend(bad_opt);
    let cfgp = cfg.path.display();
    if !bad.is_empty() {
        refusal(
            rep,
            srv,
            "draft-shape",
            format!(
                "the EAGLE-3 draft's tensors disagree with {cfgp}: {}; {}'s EAGLE-3 loader asserts the shapes when it loads the draft, after the target has loaded",
                listed(&bad),
                srv.name()
            ),
            "use the draft's own config.json (draft_vocab_size, hidden_size, target_hidden_size as trained)".into(),
            evidence::WEIGHT_SHAPE,
        );
    }
    if !missing.is_empty() {
        rep.add(
            Severity::Warning,
            "draft-shape",
            format!("the EAGLE-3 draft lacks {}: not in the published layout", listed(&missing)),
            None,
        );
    }
    // t2d (a mask over the target vocabulary) is skipped by both loaders: a wrong length is only a warning.
    if let (Some((_, s)), Some(tv)) = (ck.tensors.get("t2d"), target.u64(srv, "vocab_size")) {
        if s.first().copied() != Some(tv) {
            rep.add(
                Severity::Warning,
                "draft-vocab",
                format!(
                    "the draft's t2d covers {} target tokens, the target's vocab_size is {tv} ({}): this draft was trained for another target",
                    s.first().copied().unwrap_or(0),
                    target.path.display()
                ),
                None,
            );
        }
    }
}

/// The values after a flag that takes several (`--lora-modules a=x b=y`), up to the next option.
pub fn arg_values(argv: &[String], flag: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < argv.len() {
        let a = &argv[i];
        if let Some(v) = a.strip_prefix(flag).and_then(|r| r.strip_prefix('=')) {
            out.push(v.to_string());
        } else if a == flag {
            let mut k = i + 1;
            while k < argv.len() && !(argv[k].starts_with("--") || (argv[k].starts_with('-') && argv[k].len() == 2)) {
                out.push(argv[k].clone());
                k += 1;
            }
            i = k;
            continue;
        }
        i += 1;
    }
    out
}

/// A path written as one (absolute, `./`, `../`, `~`): never a Hugging Face id or a built-in name.
fn path_like(p: &str) -> bool {
    super::path_like(p)
}

fn expand(p: &str, cwd: &Path) -> std::path::PathBuf {
    if let Some(rest) = p.strip_prefix("~/") {
        if let Some(h) = std::env::var_os("HOME") {
            return Path::new(&h).join(rest);
        }
    }
    cwd.join(p)
}

/// LoRA adapters, the tokenizer and the chat template named on the command line.
pub fn check_paths(srv: Srv, argv: &[String], cwd: &Path, rep: &mut Report) {
    // LoRA: vLLM `--lora-modules name=path` (or a JSON object with "path"); SGLang `--lora-paths` entries
    // `name=path`, a bare path, or JSON.
    let flag = match srv {
        Srv::Vllm => "--lora-modules",
        Srv::Sglang => "--lora-paths",
    };
    for v in arg_values(argv, flag) {
        let path = if v.trim_start().starts_with('{') {
            serde_json::from_str::<serde_json::Value>(&v)
                .ok()
                .and_then(|j| j.get("path").or_else(|| j.get("lora_path")).and_then(|p| p.as_str()).map(String::from))
        } else {
            Some(v.split_once('=').map(|(_, p)| p.to_string()).unwrap_or(v.clone()))
        };
        let Some(path) = path else { continue };
        if !path_like(&path) {
            continue;
        }
        let p = expand(&path, cwd);
        let problem = if !p.exists() {
            Some(format!("the LoRA adapter folder {} ({flag} {v}) does not exist", p.display()))
        } else if !p.join("adapter_config.json").is_file() {
            Some(format!("the LoRA adapter folder {} ({flag} {v}) has no adapter_config.json", p.display()))
        } else {
            None
        };
        if let Some(m) = problem {
            let said = match srv {
                Srv::Vllm => "vLLM loads it at startup and raises (`init_static_loras`), after the model has loaded",
                Srv::Sglang => "SGLang reads its adapter_config.json at startup and raises",
            };
            refusal(
                rep,
                srv,
                "lora",
                format!("{m}: {said}"),
                format!("fix the path in {flag}, or download the adapter first"),
                evidence::LORA_PATH,
            );
        }
    }
    // Tokenizer: transformers' from_pretrained on a path that is not a folder takes it for a Hub id, and a
    // path is not a valid one.
    let tflag = match srv {
        Srv::Vllm => "--tokenizer",
        Srv::Sglang => "--tokenizer-path",
    };
    // `--skip-tokenizer-init` (both servers): no tokenizer is loaded, so its path is never opened.
    let skip = argv.iter().any(|a| a == "--skip-tokenizer-init");
    if let Some(t) = crate::sources::follow::arg_value(argv, tflag).filter(|_| !skip) {
        if path_like(t) && !expand(t, cwd).exists() {
            rep.add_confirmed(
                "tokenizer",
                format!("{tflag} {} does not exist", expand(t, cwd).display()),
                Some(format!("fix {tflag}, or leave it out to use the model's own tokenizer")),
                evidence::MISSING_LOCAL_PATH,
            );
        }
    }
    // Chat template: vLLM takes a path or the template text (text has `{`, `}` or a newline); SGLang a
    // built-in name or a path. A path written as one that does not exist is refused by both.
    if let Some(t) = crate::sources::follow::arg_value(argv, "--chat-template") {
        let text = t.contains('{') || t.contains('}') || t.contains('\n');
        if !text && path_like(t) && !expand(t, cwd).exists() {
            let said = match srv {
                Srv::Vllm => "vLLM raises `The supplied chat template (...) looks like a file path, but it failed to be opened`",
                Srv::Sglang => "SGLang raises `Chat template ... is not a built-in template name or a valid chat template file path`",
            };
            refusal(
                rep,
                srv,
                "chat-template",
                format!("--chat-template {} does not exist: {said}", expand(t, cwd).display()),
                "fix the path (or leave --chat-template out to use the tokenizer's own)".into(),
                evidence::CHAT_TEMPLATE_PATH,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_of_a_many_valued_flag() {
        let a: Vec<String> =
            ["vllm", "serve", "m", "--lora-modules", "a=/x", "b=/y", "--port", "1", "--lora-modules=c=/z"]
                .map(String::from)
                .to_vec();
        assert_eq!(arg_values(&a, "--lora-modules"), vec!["a=/x", "b=/y", "c=/z"]);
        assert!(arg_values(&a, "--lora-paths").is_empty());
    }
}
