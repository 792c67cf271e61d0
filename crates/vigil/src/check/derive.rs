//! What SGLang and vLLM derive from a model config, keyed to their versions: the text config they read,
//! the defaults and attribute aliases the transformers config classes supply, the context length, the
//! configs they refuse to load, their human-readable integers and their environment truthiness.
//! Each rule names the server code it follows; `tests/golden` holds what that code returned.

use serde_json::{Map, Value};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Srv {
    Sglang,
    Vllm,
}

impl Srv {
    pub fn name(self) -> &'static str {
        match self {
            Srv::Sglang => "SGLang",
            Srv::Vllm => "vLLM",
        }
    }
    /// The server versions of the golden table (`tests/golden/check-golden.jsonl`; `VERSIONS` in
    /// `scripts/golden/refresh.py`), oldest first. Every release of the covered range in which a rule that
    /// `check` models changed is one of them (tests/golden/README.md, "Versions"), so a release between two
    /// table versions behaves as the lower one.
    pub fn golden_versions(self) -> &'static [&'static str] {
        match self {
            Srv::Sglang => &["0.5.10", "0.5.11", "0.5.12", "0.5.14", "0.5.17", "0.5.20", "0.5.22", "0.5.23"],
            Srv::Vllm => &["0.20.0", "0.21.0", "0.23.0", "0.24.0", "0.26.0", "0.29.0", "0.30.0", "0.32.0", "0.33.0"],
        }
    }
}

/// The golden-table version whose rows stand for the installed `v`: the newest table version at or below
/// it, for a `v` from the oldest table version up to the newest (its post releases included: `0.5.23.post1`
/// reads as 0.5.23). `None`: unknown, older, or newer than the table (a newer release was never diffed).
pub fn golden_version(srv: Srv, v: Option<&str>) -> Option<&'static str> {
    let t = version_tuple(v?);
    let table = srv.golden_versions();
    if t.as_slice() > version_tuple(table.last()?).as_slice() {
        return None;
    }
    table.iter().rev().find(|g| version_tuple(g).as_slice() <= t.as_slice()).copied()
}

/// The architectures whose attention layer the golden table builds at each TP size (`#attn#` rows;
/// `ATTN_CLASSES` in scripts/golden/runner.py): their heads / KV-heads refusals are confirmed.
pub const ATTN_ARCHS: &[&str] = &[
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Phi3ForCausalLM",
    "LlamaForCausalLMEagle3",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "Qwen3MoeForCausalLM",
    "MixtralForCausalLM",
    "Gemma3ForCausalLM",
    "Gemma3ForConditionalGeneration",
    "CohereForCausalLM",
    "Glm4MoeForCausalLM",
    "MiniMaxM2ForCausalLM",
    "GptOssForCausalLM",
    "DeepseekV3ForCausalLM",
];

/// The architecture whose attention layer a server builds: the text config's own `architectures` (InternVL's
/// `llm_config`: Qwen2ForCausalLM), else the config's.
pub fn attention_arch(srv: Srv, j: &Map<String, Value>) -> String {
    let first = |o: &Map<String, Value>| {
        o.get("architectures").and_then(|a| a.get(0)).and_then(|a| a.as_str()).map(String::from)
    };
    first(text_config(srv, j).obj).or_else(|| first(j)).unwrap_or_else(|| "?".into())
}

/// Whether the golden table's `#attn#` rows cover `arch` for `srv` in every table version. vLLM's DeepSeek MLA
/// attention imports a CUDA-only prefill backend from 0.26 on (`compile_flash_attn_varlen_func_from_specs`,
/// vllm/v1/attention/backends/fa_utils.py), so the table cannot build it; its heads check is
/// `verify_with_parallel_config`'s, confirmed for every architecture.
pub fn tp_rule_covered(srv: Srv, arch: &str) -> bool {
    ATTN_ARCHS.contains(&arch) && !(srv == Srv::Vllm && arch == "DeepseekV3ForCausalLM")
}

/// `0.5.23rc1` → [0, 5, 23]; `0.4.10.post2` → [0, 4, 10].
pub fn version_tuple(v: &str) -> Vec<u64> {
    v.split(['.', '+', '-', 'r', 'p'])
        .take(3)
        .map(|x| x.chars().take_while(|c| c.is_ascii_digit()).collect::<String>().parse().unwrap_or(0))
        .collect()
}

/// `Some(version >= min)`, `None` when the version is unknown.
pub fn at_least(v: Option<&str>, min: &[u64]) -> Option<bool> {
    v.map(|v| version_tuple(v).as_slice() >= min)
}

/// A boolean environment variable as each server reads it. vLLM (`vllm/envs.py`):
/// `value.strip().lower() in ("1", "true")`. SGLang >= 0.5.3 (`EnvBool`, `sglang/srt/environ.py`):
/// `value.lower() in ("true", "1", "yes", "y")`; older releases (`get_bool_env_var`): `true`, `1`.
/// Returns `(set, note)`: the note names the version dependency where versions differ.
pub fn env_true(srv: Srv, version: Option<&str>, v: &str) -> (bool, Option<String>) {
    match srv {
        Srv::Vllm => (matches!(v.trim().to_ascii_lowercase().as_str(), "1" | "true"), None),
        Srv::Sglang => {
            let l = v.to_ascii_lowercase();
            if matches!(l.as_str(), "1" | "true") {
                return (true, None);
            }
            if !matches!(l.as_str(), "yes" | "y") {
                return (false, None);
            }
            match at_least(version, &[0, 5, 3]) {
                Some(new) => (new, None),
                None => (
                    true,
                    Some(format!(
                        "'{v}' counts as set in SGLang >= 0.5.3 (EnvBool) but not in older releases (only 1/true); the installed version is unknown"
                    )),
                ),
            }
        }
    }
}

/// A length flag's value as the server's argparse `type=` reads it.
#[derive(Debug, Clone, PartialEq)]
pub enum Parsed {
    /// A number of tokens.
    Len(u64),
    /// vLLM `-1`/`auto`: the derived length.
    Auto,
    /// The server stops with a usage error (argparse exit 2): the message.
    Refused(String),
    /// Versions differ: accepted by the newest as the value, refused by older ones (the note says which).
    Depends(u64, String),
}

/// `--max-model-len` (vLLM `human_readable_int_or_auto`) and `--context-length` (SGLang >= 0.5.10
/// `human_readable_int`; before, a plain `int`).
pub fn parse_len(srv: Srv, version: Option<&str>, flag: &str, value: &str) -> Parsed {
    let v = value.trim();
    let plain = |s: &str| -> Option<i64> {
        let s = s.strip_prefix('+').unwrap_or(s);
        if s.is_empty() || !s.trim_start_matches('-').chars().all(|c| c.is_ascii_digit()) {
            return None;
        }
        s.parse::<i64>().ok()
    };
    let suffixed = |units: &[(&str, u64, bool)]| -> Option<Result<u64, String>> {
        for (suf, mult, decimals) in units {
            if let Some(num) = v.strip_suffix(suf) {
                let ok = !num.is_empty()
                    && num.chars().all(|c| c.is_ascii_digit() || c == '.')
                    && num.matches('.').count() <= 1
                    && !num.starts_with('.')
                    && !num.ends_with('.');
                if !ok {
                    return None;
                }
                if num.contains('.') && !decimals {
                    return Some(Err(format!("{flag} {value}: decimals are not allowed with the binary suffix {suf}")));
                }
                let f: f64 = num.parse().ok()?;
                return Some(Ok((f * *mult as f64) as u64));
            }
        }
        None
    };
    match srv {
        Srv::Vllm => {
            if v == "-1" || v.eq_ignore_ascii_case("auto") {
                return Parsed::Auto;
            }
            let units: &[(&str, u64, bool)] = &[
                ("k", 1_000, true),
                ("m", 1_000_000, true),
                ("g", 1_000_000_000, true),
                ("t", 1_000_000_000_000, true),
                ("K", 1 << 10, false),
                ("M", 1 << 20, false),
                ("G", 1 << 30, false),
                ("T", 1 << 40, false),
            ];
            match suffixed(units) {
                Some(Ok(n)) => Parsed::Len(n),
                Some(Err(e)) => Parsed::Refused(e),
                None => match plain(v) {
                    Some(n) if n >= 0 => Parsed::Len(n as u64),
                    Some(_) => Parsed::Refused(format!("{flag} {value}: negative (only -1 means auto)")),
                    None => {
                        Parsed::Refused(format!("{flag} {value}: not an integer (vLLM takes 32768, 32k, 32K, auto)"))
                    }
                },
            }
        }
        Srv::Sglang => {
            if let Some(n) = plain(v) {
                return if n >= 0 {
                    Parsed::Len(n as u64)
                } else {
                    Parsed::Refused(format!("{flag} {value}: negative"))
                };
            }
            let units: &[(&str, u64, bool)] = &[
                ("Ki", 1 << 10, false),
                ("Mi", 1 << 20, false),
                ("Gi", 1 << 30, false),
                ("Ti", 1 << 40, false),
                ("k", 1_000, true),
                ("M", 1_000_000, true),
                ("G", 1_000_000_000, true),
                ("T", 1_000_000_000_000, true),
            ];
            let refused = format!(
                "{flag} {value}: SGLang's argparse stops with `Invalid integer value: '{v}'` (suffixes are case-sensitive: 32k = 32000, 32Ki = 32768)"
            );
            match suffixed(units) {
                Some(Ok(n)) => match at_least(version, &[0, 5, 10]) {
                    Some(true) => Parsed::Len(n),
                    Some(false) => Parsed::Refused(format!(
                        "{flag} {value}: SGLang {} reads a plain integer only (suffixes came in 0.5.10)",
                        version.unwrap_or("?")
                    )),
                    None => Parsed::Depends(
                        n,
                        format!("{flag} {value} is {n} in SGLang >= 0.5.10; older releases take a plain integer only and stop; the installed version is unknown"),
                    ),
                },
                Some(Err(e)) => Parsed::Refused(e),
                None => Parsed::Refused(refused),
            }
        }
    }
}

/// Model types the servers of the golden table load without remote code (see the file's header).
const MODEL_TYPES: &str = include_str!("model_types.txt");

/// Whether `server` knows `model_type` without remote code: `Some(true/false)`; `None` for a kind
/// without a list.
pub fn known_model_type(srv: Srv, mt: &str) -> bool {
    let tag = match srv {
        Srv::Sglang => 's',
        Srv::Vllm => 'v',
    };
    MODEL_TYPES.lines().filter(|l| !l.starts_with('#')).any(|l| {
        let mut it = l.split(' ');
        it.next() == Some(mt) && it.next().is_some_and(|t| t.contains('t') || t.contains(tag))
    })
}

/// Config-class defaults of `max_position_embeddings` (transformers 5.x `XConfig()`), for the model types
/// in common use: what the servers read when config.json leaves the key out.
const CLASS_MAX_POS: &[(&str, u64)] = &[
    ("llama", 2048),
    ("mistral", 131072),
    ("mixtral", 131072),
    ("ministral", 131072),
    ("qwen2", 32768),
    ("qwen2_moe", 32768),
    ("qwen3", 32768),
    ("qwen3_moe", 32768),
    ("qwen3_next", 32768),
    ("qwen2_vl_text", 32768),
    ("qwen2_5_vl_text", 32768),
    ("gemma", 8192),
    ("gemma2", 8192),
    ("gemma3_text", 131072),
    ("gemma3n_text", 32768),
    ("mllama_text_model", 131072),
    ("gpt2", 1024),
    ("gpt_bigcode", 1024),
    ("gptj", 2048),
    ("codegen", 2048),
    ("gpt_neox", 2048),
    ("phi", 2048),
    ("phi3", 4096),
    ("phimoe", 131072),
    ("cohere", 8192),
    ("cohere2", 8192),
    ("deepseek_v2", 2048),
    ("deepseek_v3", 4096),
    ("gpt_oss", 131072),
    ("glm", 131072),
    ("glm4", 131072),
    ("glm4_moe", 131072),
    ("minimax_m2", 196608),
    ("falcon", 2048),
    ("starcoder2", 4096),
    ("opt", 2048),
    ("olmo", 2048),
    ("olmo2", 2048),
    ("granite", 2048),
    ("granitemoe", 2048),
    ("exaone4", 2048),
    ("dbrx", 2048),
    ("jamba", 262144),
    ("ernie4_5", 131072),
    ("ernie4_5_moe", 131072),
    ("hunyuan_v1_dense", 2048),
    ("seed_oss", 524288),
    ("smollm3", 32768),
    ("nemotron", 4096),
    ("arcee", 4096),
    ("apertus", 65536),
];

/// transformers `attribute_map` of the model types in common use: the standard name → the key the
/// config file carries (GPT-2: `max_position_embeddings` is `n_positions`, `num_attention_heads` is `n_head`).
const GPT2_MAP: &[(&str, &str)] = &[
    ("max_position_embeddings", "n_positions"),
    ("hidden_size", "n_embd"),
    ("num_attention_heads", "n_head"),
    ("num_hidden_layers", "n_layer"),
];
const ALIASES: &[(&str, &[(&str, &str)])] = &[
    ("gpt2", GPT2_MAP),
    ("gpt_bigcode", GPT2_MAP),
    ("gptj", GPT2_MAP),
    ("codegen", GPT2_MAP),
    (
        "dbrx",
        &[
            ("max_position_embeddings", "max_seq_len"),
            ("hidden_size", "d_model"),
            ("num_attention_heads", "n_heads"),
            ("num_hidden_layers", "n_layers"),
        ],
    ),
    ("mpt", &[("hidden_size", "d_model"), ("num_attention_heads", "n_heads"), ("num_hidden_layers", "n_layers")]),
    ("bloom", &[("num_attention_heads", "n_head"), ("num_hidden_layers", "n_layer")]),
];

fn aliases(model_type: &str) -> &'static [(&'static str, &'static str)] {
    ALIASES.iter().find(|(t, _)| *t == model_type).map(|(_, a)| *a).unwrap_or(&[])
}

/// The model type of a nested text config that does not name its own (the parent class's default).
const SUB_TEXT_TYPE: &[(&str, &str)] = &[
    ("gemma3", "gemma3_text"),
    ("mllama", "mllama_text_model"),
    ("llava", "llama"),
    ("qwen2_vl", "qwen2_vl_text"),
    ("qwen2_5_vl", "qwen2_5_vl_text"),
    ("mistral3", "mistral"),
];

fn lookup<'a>(t: &'a [(&str, &'a str)], k: &str) -> Option<&'a str> {
    t.iter().find(|(a, _)| *a == k).map(|(_, b)| *b)
}

/// The text config a server reads, with its model type.
pub struct Text<'a> {
    pub obj: &'a Map<String, Value>,
    pub model_type: String,
    /// Where it sits (`text_config`, `llm_config`, ... or empty for the config itself).
    pub at: &'static str,
}

impl<'a> Text<'a> {
    /// A key as the config class answers it: the value in the file, else through the class's
    /// attribute alias, else the class default for `max_position_embeddings`.
    pub fn get(&self, k: &str) -> Option<&'a Value> {
        if let Some(v) = self.obj.get(k).filter(|v| !v.is_null()) {
            return Some(v);
        }
        aliases(&self.model_type).iter().find_map(|(std, key)| {
            let other = if *std == k {
                key
            } else if *key == k {
                std
            } else {
                return None;
            };
            self.obj.get(*other).filter(|v| !v.is_null())
        })
    }
    /// A length key as a number, with the class default for `max_position_embeddings` (and its alias).
    pub fn len(&self, k: &str) -> Option<(u64, bool)> {
        if let Some(v) = self.get(k) {
            // A float or a numeric string loads where transformers does not validate the field (< 5.4, see
            // `load_refusal`); the servers then read the number (SGLang 0.5.10: 32768.0 and "32768" → 32768).
            let n = v
                .as_u64()
                .or_else(|| v.as_f64().filter(|f| *f >= 0.0 && f.fract() == 0.0).map(|f| f as u64))
                .or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()));
            return n.map(|n| (n, false));
        }
        let alias = aliases(&self.model_type).iter().find(|(s, _)| *s == "max_position_embeddings").map(|(_, a)| *a);
        if k == "max_position_embeddings" || alias == Some(k) {
            return CLASS_MAX_POS.iter().find(|(t, _)| *t == self.model_type).map(|(_, n)| (*n, true));
        }
        None
    }
    fn prefix(&self) -> String {
        if self.at.is_empty() {
            String::new()
        } else {
            format!("{}.", self.at)
        }
    }
}

/// The text config: SGLang `get_hf_text_config` (priority thinker_config (its text_config) > llm_config >
/// language_config > text_config; `Llava*ForCausalLM` reads the config itself); vLLM
/// `get_hf_text_config` (transformers `get_text_config`: thinker's text_config, text_config,
/// language_config, llm_config).
pub fn text_config(srv: Srv, j: &Map<String, Value>) -> Text<'_> {
    let obj = |k: &str| j.get(k).and_then(|v| v.as_object());
    let top_type = j.get("model_type").and_then(|v| v.as_str()).unwrap_or("").to_string();
    let arch = j.get("architectures").and_then(|a| a.get(0)).and_then(|a| a.as_str()).unwrap_or("");
    fn mk<'b>(o: &'b Map<String, Value>, at: &'static str, top_type: &str) -> Text<'b> {
        let model_type = o
            .get("model_type")
            .and_then(|v| v.as_str())
            .map(String::from)
            .or_else(|| lookup(SUB_TEXT_TYPE, top_type).map(String::from))
            .unwrap_or_default();
        Text { obj: o, model_type, at }
    }
    let thinker_text = obj("thinker_config").map(|t| match t.get("text_config").and_then(|v| v.as_object()) {
        Some(tt) => (tt, "thinker_config.text_config"),
        None => (t, "thinker_config"),
    });
    let order: Vec<Option<(&Map<String, Value>, &'static str)>> = match srv {
        Srv::Sglang if arch.starts_with("Llava") && arch.ends_with("ForCausalLM") => vec![],
        Srv::Sglang => vec![
            thinker_text,
            obj("llm_config").map(|o| (o, "llm_config")),
            obj("language_config").map(|o| (o, "language_config")),
            obj("text_config").map(|o| (o, "text_config")),
        ],
        Srv::Vllm => vec![
            thinker_text,
            obj("text_config").map(|o| (o, "text_config")),
            obj("language_config").map(|o| (o, "language_config")),
            obj("llm_config").map(|o| (o, "llm_config")),
        ],
    };
    match order.into_iter().flatten().next() {
        Some((o, at)) => mk(o, at, &top_type),
        None => Text { obj: j, model_type: top_type, at: "" },
    }
}

/// A derived context length and how it was derived (for the message).
#[derive(Debug, Clone, PartialEq)]
pub struct Ctx {
    /// What the server runs with when no length flag is given.
    pub value: u64,
    /// The most a length flag may ask for without the allow-longer variable (vLLM: the derived length
    /// before the LongRoPE default, or the config's model_max_length; SGLang: `value`).
    pub limit: u64,
    pub how: String,
}

/// The rope scaling of a text config as transformers 5 presents it (`rope_scaling` / `rope_parameters`):
/// `None` when absent, or nested per layer type (Gemma-3: `{"sliding_attention": …, "full_attention": …}`),
/// which has no top-level `factor`.
fn rope(t: &Text) -> Option<Map<String, Value>> {
    let r = t.obj.get("rope_scaling").or_else(|| t.obj.get("rope_parameters"))?.as_object()?;
    if r.is_empty() || t.model_type.starts_with("gemma3") {
        return None;
    }
    let mut r = r.clone();
    if let Some(ty) = r.get("type").cloned() {
        r.entry("rope_type").or_insert(ty);
    }
    Some(r)
}

/// SGLang `get_context_length(get_hf_text_config(config))` (`srt/utils/hf_transformers/common.py`): the
/// first of max_sequence_length, seq_length, max_seq_len, model_max_length, max_position_embeddings (as
/// the config class answers: defaults and aliases included); times the rope-scaling `factor` unless the
/// scaling names `original_max_position_embeddings` or is `rope_type: llama3`; 2048 when none is set.
pub fn sglang_context(j: &Map<String, Value>, path: &str) -> Ctx {
    let t = text_config(Srv::Sglang, j);
    let (factor, why) = match rope(&t) {
        None => (1.0, String::new()),
        Some(r) => {
            let f = r.get("factor").and_then(|f| f.as_f64()).unwrap_or(1.0);
            if r.contains_key("original_max_position_embeddings") {
                (1.0, ", rope_scaling factor not applied (it has original_max_position_embeddings)".to_string())
            } else if r.get("rope_type").and_then(|x| x.as_str()) == Some("llama3") {
                (1.0, ", rope_scaling factor not applied (rope_type llama3)".to_string())
            } else if f != 1.0 {
                (f, format!(" × rope_scaling factor {f}"))
            } else {
                (1.0, String::new())
            }
        }
    };
    for k in ["max_sequence_length", "seq_length", "max_seq_len", "model_max_length", "max_position_embeddings"] {
        if let Some((v, default)) = t.len(k) {
            let value = (factor * v as f64) as u64;
            let src = if default {
                format!("{path}: no {k}, the {} config class's default {v}", t.model_type)
            } else {
                format!("{path} {}{k} = {v}", t.prefix())
            };
            return Ctx { value, limit: value, how: format!("{src}{why}") };
        }
    }
    Ctx { value: 2048, limit: 2048, how: format!("{path}: no length key, SGLang's default 2048") }
}

/// vLLM `_get_and_verify_max_len` (`vllm/config/model.py`) with `derive_max_model_len_and_key`: the
/// smallest of the length keys of the text config, replaced by `model_max_length` when set (Command-R);
/// times the rope-scaling factor, except for su/longrope/llama3 and Gemma-3. vLLM <= 0.29 scales YaRN
/// (`original_max_position_embeddings × factor`); from 0.30 YaRN is not scaled (the length is already
/// scaled). With LongRoPE the default is `original_max_position_embeddings`, while a flag may ask up to
/// the derived length.
pub fn vllm_context(j: &Map<String, Value>, path: &str, version: Option<&str>) -> Ctx {
    let t = text_config(Srv::Vllm, j);
    let keys = [
        "max_position_embeddings",
        "n_positions",
        "max_seq_len",
        "seq_length",
        "model_max_length",
        "max_target_positions",
        "max_sequence_length",
        "max_seq_length",
        "seq_len",
    ];
    let mut best: Option<(u64, &str, bool)> = None;
    for k in keys {
        if let Some((v, default)) = t.len(k) {
            if best.is_none_or(|(b, _, _)| v < b) {
                best = Some((v, k, default));
            }
        }
    }
    if let Some(m) = t.get("model_max_length").and_then(|v| v.as_u64()).filter(|m| *m > 0) {
        best = Some((m, "model_max_length", false));
    }
    let Some((mut v, key, default)) = best else {
        return Ctx { value: 2048, limit: 2048, how: format!("{path}: no length key, vLLM's default 2048") };
    };
    let mut how = if default {
        format!("{path}: no {key}, the {} config class's default {v}", t.model_type)
    } else {
        format!("{path} {}{key} = {v}", t.prefix())
    };
    let top_type = j.get("model_type").and_then(|v| v.as_str()).unwrap_or("");
    let r = rope(&t);
    let ty = r.as_ref().and_then(|r| r.get("rope_type")).and_then(|x| x.as_str()).unwrap_or("default").to_string();
    if let Some(r) = r.as_ref().filter(|_| !top_type.contains("gemma3")) {
        let old_yarn = at_least(version, &[0, 30, 0]) == Some(false);
        let exempt: &[&str] = if old_yarn {
            &["su", "longrope", "llama3"]
        } else {
            &["su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling"]
        };
        if !exempt.contains(&ty.as_str()) {
            if let Some(f) = r.get("factor").and_then(|f| f.as_f64()) {
                if old_yarn && ty == "yarn" {
                    if let Some(o) = r.get("original_max_position_embeddings").and_then(|o| o.as_u64()) {
                        v = o;
                        how = format!("{path} original_max_position_embeddings = {o}");
                    }
                }
                if f != 1.0 {
                    v = (v as f64 * f) as u64;
                    how.push_str(&format!(
                        " × rope_scaling factor {f}{}",
                        if old_yarn && ty == "yarn" { " (vLLM <= 0.29 scales YaRN)" } else { "" }
                    ));
                }
            }
        } else if ty == "yarn" {
            how.push_str(&format!(
                ", YaRN factor not applied (vLLM >= 0.30{})",
                if version.is_none() {
                    "; vLLM <= 0.29 would derive original × factor; the version is unknown"
                } else {
                    ""
                }
            ));
        }
    }
    let limit = v;
    let mut value = v;
    if ty == "longrope" {
        let o = j
            .get("original_max_position_embeddings")
            .and_then(|o| o.as_u64())
            .or_else(|| r.as_ref().and_then(|r| r.get("original_max_position_embeddings")).and_then(|o| o.as_u64()));
        if let Some(o) = o {
            value = o;
            how.push_str(&format!(
                "; LongRoPE: vLLM defaults to original_max_position_embeddings {o} (--max-model-len may ask up to {limit})"
            ));
        }
    }
    Ctx { value, limit, how }
}

/// Whether transformers validates config fields (`@strict` dataclasses, a float or a string where an int
/// belongs stops the load): from 5.4.0 (5.3.0 has no `@strict`, 5.4.0 decorates e.g. `Qwen2Config`). The installed
/// transformers when known, else what the server pins: SGLang 0.5.10 `==5.3.0`, 0.5.11 and newer `>=5.6.0`;
/// vLLM 0.24 and newer `>=5.5.3` (older vLLM also allows 4.x: assumed strict, and add_refusal leaves it
/// unconfirmed).
pub fn transformers_strict(srv: Srv, version: Option<&str>, transformers: Option<&str>) -> bool {
    match (transformers, srv) {
        (Some(t), _) => at_least(Some(t), &[5, 4, 0]) == Some(true),
        (None, Srv::Sglang) => at_least(version, &[0, 5, 11]) != Some(false),
        (None, Srv::Vllm) => true,
    }
}

/// Why a server refuses to load this config at all: a length that is not an integer (transformers' strict
/// dataclass validation, `transformers_strict`), a model type transformers and the server do not know (without
/// remote code), and SGLang <= 0.5.11 with `kimi_k2`. `Ok(None)`: loads; `Ok(Some(note))`: loads, with a note
/// (remote code not modelled); `Err((message, depends))`: refused; `depends` names what the answer depends on
/// when versions differ.
pub fn load_refusal(
    srv: Srv,
    version: Option<&str>,
    transformers: Option<&str>,
    j: &Map<String, Value>,
    trust_remote_code: bool,
) -> Result<Option<String>, (String, Option<String>)> {
    let t = text_config(srv, j);
    let strict = transformers_strict(srv, version, transformers);
    for k in ["max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "max_sequence_length"] {
        if let Some(v) = t.obj.get(k) {
            if !v.is_null() && !v.is_u64() && !v.is_i64() {
                let kind = if v.is_f64() {
                    "a float"
                } else if v.is_string() {
                    "a string"
                } else {
                    "not an integer"
                };
                if !strict {
                    return Ok(Some(format!("{}{k} is {kind} ({v}): transformers < 5.4 ({}) loads it as the number; 5.4 and newer stop with `Field '{k}' expected int`", t.prefix(), transformers.map_or_else(|| format!("pinned by {} {}", srv.name(), version.unwrap_or("?")), |t| format!("{t} installed")))));
                }
                return Err((
                    format!(
                        "{}{k} is {kind} ({v}): transformers >= 5.4 ({}) stops with `Field '{k}' expected int`",
                        t.prefix(),
                        match (transformers, srv) {
                            (Some(t), _) => format!("{t} installed"),
                            (None, Srv::Sglang) => "pinned by SGLang >= 0.5.11".to_string(),
                            (None, Srv::Vllm) => "required by vLLM >= 0.24; 0.20-0.23 also allow 4.x".to_string(),
                        }
                    ),
                    None,
                ));
            }
        }
    }
    // No model_type: transformers guesses from the directory name, or stops; not modelled (no finding).
    let Some(mt) = j.get("model_type").and_then(|v| v.as_str()) else {
        return Ok(None);
    };
    let remote = j.get("auto_map").is_some_and(|a| a.is_object());
    let kimi_old = srv == Srv::Sglang && mt == "kimi_k2";
    if known_model_type(srv, mt) && !kimi_old {
        return Ok(None);
    }
    if trust_remote_code {
        return Ok(Some(if remote {
            format!("model_type {mt} loads the repository's own config code (--trust-remote-code): its defaults are not modelled")
        } else {
            format!(
                "model_type {mt} is not one vigil knows; --trust-remote-code is given but config.json has no auto_map"
            )
        }));
    }
    let why = if remote {
        format!(
            "model_type {mt} needs the repository's own code: transformers stops with `contains custom code which must be executed` without --trust-remote-code"
        )
    } else {
        format!(
            "model_type {mt} is not known to transformers or {}: `Transformers does not recognize this architecture`",
            srv.name()
        )
    };
    // SGLang 0.5.12 registers kimi_k2 itself (`_CONFIG_REGISTRY["kimi_k2"] = _KimiK2ConfigAlias`,
    // sglang/srt/utils/hf_transformers/common.py:133); 0.5.11 and older have no config class for it.
    if kimi_old {
        return match at_least(version, &[0, 5, 12]) {
            Some(false) => {
                Err((format!("{why} (SGLang {} has no kimi_k2 config class)", version.unwrap_or("?")), None))
            }
            Some(true) => Ok(None),
            None => Err((
                format!("{why} in SGLang <= 0.5.11; SGLang >= 0.5.12 registers kimi_k2 itself"),
                Some(format!(
                    "the installed SGLang version ({}): pass --trust-remote-code to be safe",
                    version.unwrap_or("unknown")
                )),
            )),
        };
    }
    Err((why, None))
}
