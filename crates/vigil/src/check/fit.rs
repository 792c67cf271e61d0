//! "Will it fit?" (issue #13 item 5): per GPU, the weights, what is left for the KV cache after them, and
//! the tokens that buys against the context asked for, from the checkpoint, the flags and the GPUs'
//! memory. Every finding is a WARNING at most: some way to run it always exists (offload,
//! `--quantization`, llama.cpp's auto-fit, `--load-format dummy`), so `vigil up` never refuses on it.
//!
//! The arithmetic is the servers' own, cited per function; what it ignores is in [`IGNORES`]. It is
//! scored against real logs in docs/fit.md (`tests/fit-scoring.json`, replayed by the unit tests here).

use crate::check::{Config, Inputs, Launch, Report, Severity};
use crate::sources::follow::arg_value;
use crate::sources::gguf::GgufInfo;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::path::Path;
use std::sync::OnceLock;

const GIB: f64 = (1u64 << 30) as f64;

/// What the llama.cpp estimate leaves out.
pub const IGNORES_LLAMA: &str = "ignores: compute buffers (0.2-1 GiB), the CUDA context, other processes' \
     memory, sliding-window caches (counted as full) and MLA layouts";

/// What the estimate leaves out, said with every fit finding.
pub const IGNORES: &str = "ignores: activations beyond the servers' own reserve rules, CUDA graphs, NCCL and \
     other processes' memory, vision towers' extra reserve, LoRA, speculative draft models, sliding-window \
     and linear-attention pools beyond counting their layers, and on-the-fly quantization other than fp8";

static GPU_MEM: OnceLock<u64> = OnceLock::new();

/// `vigil check --gpu-mem SIZE`: the memory of each GPU of a node vigil cannot see (set once by main).
pub fn set_gpu_mem(bytes: u64) {
    let _ = GPU_MEM.set(bytes);
}

/// `80g`, `80GiB`, `141gb`, `81559m`, `512k` or plain bytes; `g`/`gb`/`gib` all mean GiB (what
/// nvidia-smi's MiB columns and the servers' logs count in).
pub fn parse_size(s: &str) -> Option<u64> {
    let t = s.trim().to_ascii_lowercase();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().ok().filter(|n: &f64| n.is_finite() && *n > 0.0)?;
    let mul = match unit.trim() {
        "" | "b" => 1.0,
        "k" | "kb" | "kib" => 1024.0,
        "m" | "mb" | "mib" => 1024.0 * 1024.0,
        "g" | "gb" | "gib" => GIB,
        "t" | "tb" | "tib" => GIB * 1024.0,
        _ => return None,
    };
    let v = n * mul;
    (v < 1e16).then_some(v as u64)
}

/// The model's attention layout, as the servers size their KV caches from it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelFacts {
    /// Layers that hold a KV cache (full-attention layers of a hybrid/linear model; all others).
    pub kv_layers: u64,
    pub num_layers: u64,
    pub kv_heads: u64,
    pub head_dim: u64,
    pub v_head_dim: u64,
    /// MLA (DeepSeek-V2/V3, Kimi): `kv_lora_rank + qk_rope_head_dim` per layer, not split by TP.
    #[serde(default)]
    pub mla_dim: Option<u64>,
    /// Bytes per weight element of the checkpoint dtype (2 for bf16/fp16).
    #[serde(default = "two")]
    pub dtype_bytes: f64,
    /// Already quantized (`quantization_config` present): on-the-fly fp8 changes nothing.
    #[serde(default)]
    pub prequantized: bool,
    #[serde(default)]
    pub hidden: u64,
    #[serde(default)]
    pub intermediate: u64,
    #[serde(default)]
    pub sliding_layers: u64,
}

fn two() -> f64 {
    2.0
}

/// Reads the attention layout from a config.json (the text config for multimodal models).
/// SGLang `ModelConfig` (`head_dim`, `get_num_kv_heads`, `kv_lora_rank`), vLLM `ModelConfig.get_head_size`.
pub fn model_facts(c: &Config) -> Option<ModelFacts> {
    let j = &c.json;
    let t = ["text_config", "language_config", "llm_config"]
        .iter()
        .find_map(|k| j.get(*k).filter(|v| v.is_object()))
        .unwrap_or(j);
    let u = |k: &str| t.get(k).and_then(|v| v.as_u64()).or_else(|| j.get(k).and_then(|v| v.as_u64()));
    let num_layers = u("num_hidden_layers").or_else(|| u("n_layer")).or_else(|| u("num_layers"))?;
    let heads = u("num_attention_heads").or_else(|| u("n_head")).unwrap_or(0);
    let kv_heads = u("num_key_value_heads").filter(|k| *k > 0).unwrap_or(heads);
    let hidden = u("hidden_size").or_else(|| u("n_embd")).unwrap_or(0);
    let head_dim = u("head_dim").filter(|h| *h > 0).or_else(|| (heads > 0).then(|| hidden / heads)).unwrap_or(0);
    let v_head_dim = u("v_head_dim").filter(|_| u("kv_lora_rank").is_none()).unwrap_or(head_dim);
    let mla_dim = match (u("kv_lora_rank"), u("qk_rope_head_dim")) {
        (Some(r), Some(p)) => Some(r + p),
        _ => None,
    };
    // Hybrid models: only full-attention layers keep a per-token KV cache (SGLang
    // `mambaish.full_attention_layer_ids`, vLLM's per-layer `KVCacheSpec`).
    let types: Vec<String> = t
        .get("layer_types")
        .and_then(|v| v.as_array())
        .map(|a| a.iter().filter_map(|x| x.as_str().map(String::from)).take(4096).collect())
        .unwrap_or_default();
    let full = types.iter().filter(|x| x.contains("full") || *x == "attention").count() as u64;
    let sliding = types.iter().filter(|x| x.contains("sliding")).count() as u64;
    let linear = types.iter().filter(|x| x.contains("linear") || x.contains("mamba")).count() as u64;
    let kv_layers = if linear > 0 {
        full
    } else if let Some(iv) = u("full_attention_interval").filter(|i| *i > 0) {
        num_layers / iv
    } else {
        num_layers
    };
    let dtype =
        t.get("torch_dtype").or_else(|| t.get("dtype")).or_else(|| j.get("torch_dtype")).and_then(|v| v.as_str());
    let dtype_bytes = match dtype {
        Some("float32") => 4.0,
        _ => 2.0,
    };
    Some(ModelFacts {
        kv_layers,
        num_layers,
        kv_heads,
        head_dim,
        v_head_dim,
        mla_dim,
        dtype_bytes,
        prequantized: j.get("quantization_config").is_some() || t.get("quantization_config").is_some(),
        hidden,
        intermediate: u("intermediate_size").unwrap_or(0),
        sliding_layers: sliding,
    })
}

/// Bytes of one KV element for a `--kv-cache-dtype` (`auto`: the model dtype).
pub fn kv_dtype_bytes(s: Option<&str>, model_bytes: f64) -> f64 {
    match s.map(|x| x.to_ascii_lowercase()) {
        Some(x) if x.starts_with("fp8") || x == "int8" => 1.0,
        Some(x) if x.starts_with("fp4") || x == "nvfp4" => 0.5,
        Some(x) if x == "float32" || x == "fp32" => 4.0,
        Some(x) if x == "auto" => model_bytes.min(2.0),
        None => model_bytes.min(2.0),
        Some(_) => 2.0,
    }
}

/// ggml type names of `-ctk/-ctv` → bytes per element (block bytes / block elements, ggml.c `type_traits`).
pub fn ggml_type_bytes(s: Option<&str>) -> f64 {
    match s.map(|x| x.to_ascii_lowercase()).as_deref() {
        None | Some("f16") | Some("bf16") => 2.0,
        Some("f32") => 4.0,
        Some("q8_0") => 34.0 / 32.0,
        Some("q4_0") | Some("iq4_nl") => 18.0 / 32.0,
        Some("q4_1") => 20.0 / 32.0,
        Some("q5_0") => 22.0 / 32.0,
        Some("q5_1") => 24.0 / 32.0,
        Some(_) => 2.0,
    }
}

/// The inputs of one estimate: the checkpoint, the parallel layout and memory flags, one GPU's memory.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HfInput {
    pub model: ModelFacts,
    /// Checkpoint bytes (safetensors index `metadata.total_size`, else the shards' sizes).
    pub weights_bytes: u64,
    pub tp: u64,
    #[serde(default = "one")]
    pub pp: u64,
    /// `--mem-fraction-static` / `--gpu-memory-utilization`; None: the server's default rule.
    #[serde(default)]
    pub mem_fraction: Option<f64>,
    #[serde(default)]
    pub kv_cache_dtype: Option<String>,
    /// On-the-fly `--quantization` (only fp8 is modelled: half the bytes of a 16-bit checkpoint).
    #[serde(default)]
    pub quantization: Option<String>,
    #[serde(default)]
    pub cpu_offload_gib: f64,
    pub gpu_total_bytes: u64,
    /// The context asked for (`--context-length` / `--max-model-len`, else the model's).
    #[serde(default)]
    pub context: Option<u64>,
    /// vLLM `--max-num-batched-tokens`: the tokens of its profile run (None: vLLM's default, see
    /// [`vllm_profile_tokens`]).
    #[serde(default)]
    pub max_num_batched_tokens: Option<u64>,
}

fn one() -> u64 {
    1
}

/// The numbers of one estimate, per GPU (GiB as the servers print "GB": 2^30 bytes).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Estimate {
    pub server: String,
    pub gpu_total_gib: f64,
    pub weights_gib_per_gpu: f64,
    /// The memory the server lets weights + KV take (SGLang: pre-load free × mem_fraction_static; vLLM:
    /// total × gpu_memory_utilization − activations; llama.cpp: the whole GPU).
    pub usable_gib: f64,
    pub mem_fraction: f64,
    pub kv_gib: f64,
    pub kv_bytes_per_token: f64,
    pub kv_tokens: u64,
    pub context: Option<u64>,
}

/// The memory a fresh process finds free before loading weights: the total less the CUDA context,
/// cuBLAS/NCCL workspaces (≈1 GiB, read from the `Load weight begin. avail mem` lines of the scored logs).
fn pre_load_gib(total_gib: f64) -> f64 {
    (total_gib - 1.0).max(0.0)
}

fn weights_per_gpu(i: &HfInput) -> f64 {
    let mut w = i.weights_bytes as f64 / GIB;
    let q = i.quantization.as_deref().map(|q| q.to_ascii_lowercase()).unwrap_or_default();
    if q.starts_with("fp8") && !i.model.prequantized && i.model.dtype_bytes >= 2.0 {
        w *= 0.5;
    }
    (w / (i.tp.max(1) * i.pp.max(1)) as f64 - i.cpu_offload_gib).max(0.0)
}

/// Per-token KV bytes on one GPU. SGLang `DefaultPoolConfigurator._compute_cell_size`
/// (srt/model_executor/pool_configurator.py): MHA/GQA `get_num_kv_heads(tp) × (head_dim + v_head_dim)
/// × layers × itemsize`; MLA `(kv_lora_rank + qk_rope_head_dim) × layers × itemsize`. vLLM
/// `FullAttentionSpec.page_size_bytes / block_size` and `MLAAttentionSpec` are the same per token.
pub fn kv_bytes_per_token(m: &ModelFacts, tp: u64, pp: u64, kv_bytes: f64) -> f64 {
    let layers = (m.kv_layers as f64 / pp.max(1) as f64).ceil();
    match m.mla_dim {
        Some(d) => d as f64 * layers * kv_bytes,
        None => {
            // `get_num_kv_heads`: max(1, kv_heads / tp): replicated when TP exceeds the KV heads.
            let per_tp = (m.kv_heads / tp.max(1)).max(1) as f64;
            per_tp * (m.head_dim + m.v_head_dim) as f64 * layers * kv_bytes
        }
    }
}

/// SGLang 0.5.23 `handle_gpu_memory_settings` (srt/arg_groups/memory_hook.py): reserved MB =
/// max(512 + max(chunked_prefill, 2048) × 1.5 + tp×pp/8 × 1024 + decode graph max_bs × 2, 10240 on GPUs
/// over 60 GB); chunked_prefill and max_bs by GPU size; mem_fraction_static = (gpu − reserved) / gpu.
pub fn sglang_default_mem_fraction(gpu_mib: f64, tp: u64, pp: u64) -> f64 {
    let (chunk, max_bs) = if gpu_mib < 20.0 * 1024.0 {
        (2048.0, 8.0)
    } else if gpu_mib < 35.0 * 1024.0 {
        (4096.0, if tp < 4 { 48.0 } else { 160.0 })
    } else if gpu_mib < 60.0 * 1024.0 {
        (4096.0, if tp < 4 { 32.0 } else { 160.0 })
    } else if gpu_mib < 160.0 * 1024.0 {
        (8192.0, if tp < 4 { 256.0 } else { 512.0 })
    } else {
        (16384.0, 512.0)
    };
    let mut reserved = 512.0 + f64::max(chunk, 2048.0) * 1.5 + (tp * pp) as f64 / 8.0 * 1024.0 + max_bs * 2.0;
    if gpu_mib > 60.0 * 1024.0 {
        reserved = reserved.max(10240.0);
    }
    (((gpu_mib - reserved) / gpu_mib) * 1000.0).round() / 1000.0
}

/// SGLang: `KVCacheConfigurator._profile_available_bytes` (srt/mem_cache/kv_cache_configurator.py):
/// rest = free after weights − pre-load free × (1 − mem_fraction_static), i.e. pre-load × mfs − weights;
/// `max_total_num_tokens = rest // cell_size` (pool_configurator.py `calculate_pool_sizes`).
pub fn sglang(i: &HfInput) -> Estimate {
    let total = i.gpu_total_bytes as f64 / GIB;
    let mfs = i.mem_fraction.unwrap_or_else(|| sglang_default_mem_fraction(total * 1024.0, i.tp, i.pp));
    let pre = pre_load_gib(total);
    let w = weights_per_gpu(i);
    let usable = pre * mfs;
    let kv = (usable - w).max(0.0);
    let cell =
        kv_bytes_per_token(&i.model, i.tp, i.pp, kv_dtype_bytes(i.kv_cache_dtype.as_deref(), i.model.dtype_bytes));
    Estimate {
        server: "sglang".into(),
        gpu_total_gib: total,
        weights_gib_per_gpu: w,
        usable_gib: usable,
        mem_fraction: mfs,
        kv_gib: kv,
        kv_bytes_per_token: cell,
        kv_tokens: if cell > 0.0 { (kv * GIB / cell) as u64 } else { 0 },
        context: i.context,
    }
}

/// The tokens of vLLM's profile run: `GPUModelRunner.profile_run` runs `_dummy_run(max_num_tokens)`,
/// `max_num_tokens = scheduler_config.max_num_batched_tokens`. Unset, `EngineArgs.get_batch_defaults`
/// (engine/arg_utils.py) gives the API server 8192 on GPUs of 70 GiB or more (A100 excepted, which vigil
/// cannot tell from the size alone) and 2048 below.
pub fn vllm_profile_tokens(i: &HfInput) -> u64 {
    i.max_num_batched_tokens.filter(|t| *t > 0).unwrap_or(if i.gpu_total_bytes >= 70 << 30 { 8192 } else { 2048 })
}

/// vLLM 0.33: `Worker.determine_available_memory` (v1/worker/gpu_worker.py): available KV =
/// total × gpu_memory_utilization (`request_memory`, default 0.92) − non-KV memory (weights + peak
/// activation + non-torch) − the CUDA graph estimate. The profile run is not reproducible offline:
/// activations are taken as the profile run's tokens ([`vllm_profile_tokens`]) × (4·hidden +
/// 3·intermediate/tp) × 2 bytes, plus 1 GiB for non-torch memory and CUDA graphs. Tokens:
/// `get_kv_cache_capacity` → blocks × block size.
pub fn vllm(i: &HfInput) -> Estimate {
    let total = i.gpu_total_bytes as f64 / GIB;
    let util = i.mem_fraction.unwrap_or(0.92);
    let w = weights_per_gpu(i);
    let m = &i.model;
    let per_token = (4.0 * m.hidden as f64 + 3.0 * m.intermediate as f64 / i.tp.max(1) as f64) * 2.0;
    let act = vllm_profile_tokens(i) as f64 * per_token / GIB + 1.0;
    let usable = total * util - act;
    let kv = (usable - w).max(0.0);
    let cell = kv_bytes_per_token(m, i.tp, i.pp, kv_dtype_bytes(i.kv_cache_dtype.as_deref(), m.dtype_bytes));
    let tokens = if cell > 0.0 { ((kv * GIB / cell) as u64 / 16) * 16 } else { 0 };
    Estimate {
        server: "vllm".into(),
        gpu_total_gib: total,
        weights_gib_per_gpu: w,
        usable_gib: usable,
        mem_fraction: util,
        kv_gib: kv,
        kv_bytes_per_token: cell,
        kv_tokens: tokens,
        context: i.context,
    }
}

/// The inputs of a llama-server estimate: the GGUF header and tensor table, and the flags.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LlamaInput {
    pub n_layer: u64,
    /// `n_embd_k_gqa` and `n_embd_v_gqa` per layer (`head_count_kv × key_length`).
    pub n_embd_k_gqa: u64,
    pub n_embd_v_gqa: u64,
    pub n_ctx_train: u64,
    pub token_embd_bytes: u64,
    pub output_bytes: u64,
    pub block_bytes: Vec<u64>,
    /// `-ngl` (None: llama-server's default, all layers).
    #[serde(default)]
    pub ngl: Option<u64>,
    /// `-c` (None or 0: the trained context).
    #[serde(default)]
    pub ctx: Option<u64>,
    /// `-np` as given (None: auto, unified KV cache).
    #[serde(default)]
    pub np: Option<u64>,
    #[serde(default)]
    pub type_k: Option<String>,
    #[serde(default)]
    pub type_v: Option<String>,
    pub gpu_total_bytes: u64,
}

/// llama.cpp: `llama_context` n_ctx (`params.n_ctx == 0 ? n_ctx_train`, times n_seq when `-np` is given
/// without `-c` and the cache is not unified: `common_params_fit_impl`), padded to 256; the KV cache is
/// `n_ctx × Σ_layers (n_embd_k_gqa × type_k + n_embd_v_gqa × type_v)` (`llama_kv_cache` constructor,
/// src/llama-kv-cache.cpp), on the GPU for offloaded layers. Weights on the GPU: the last `-ngl` blocks,
/// plus the output head when `-ngl` exceeds the blocks (`llama_model::load_tensors`); `token_embd` stays
/// on the CPU.
pub fn llama(i: &LlamaInput) -> Estimate {
    let total = i.gpu_total_bytes as f64 / GIB;
    let n = i.n_layer.max(i.block_bytes.len() as u64);
    // `i_gpu_start = max(n_layer + 1 - ngl, 0)`: the output head is layer n_layer, so `-ngl k` puts the
    // output and the last k - 1 blocks on the GPU ("offloaded 10/33 layers" = 9 blocks + output).
    let ngl = i.ngl.unwrap_or(n + 1).min(n + 1);
    let gpu_blocks = ngl.saturating_sub(1);
    let start = (n - gpu_blocks) as usize;
    let mut w: u64 = i.block_bytes.iter().skip(start).sum();
    if ngl > 0 {
        w = w.saturating_add(i.output_bytes);
    }
    let ctx = match i.ctx.filter(|c| *c > 0) {
        Some(c) => c,
        None => i.n_ctx_train * i.np.unwrap_or(1).max(1),
    };
    let n_ctx = ctx.div_ceil(256) * 256;
    let per_layer = i.n_embd_k_gqa as f64 * ggml_type_bytes(i.type_k.as_deref())
        + i.n_embd_v_gqa as f64 * ggml_type_bytes(i.type_v.as_deref());
    let kv_gpu = n_ctx as f64 * per_layer * gpu_blocks as f64;
    Estimate {
        server: "llama-cpp".into(),
        gpu_total_gib: total,
        weights_gib_per_gpu: w as f64 / GIB,
        usable_gib: total,
        mem_fraction: 1.0,
        kv_gib: kv_gpu / GIB,
        kv_bytes_per_token: per_layer * gpu_blocks as f64,
        kv_tokens: n_ctx,
        context: Some(n_ctx),
    }
}

/// A GGUF header → the llama.cpp inputs (None when it lacks the hyperparameters).
pub fn llama_input(g: &GgufInfo, argv: &[String], gpu_total_bytes: u64) -> Option<LlamaInput> {
    let n_layer = g.block_count?;
    let heads = g.head_count?;
    let kv = g.head_count_kv.unwrap_or(heads);
    let hd_k = g.key_length.or_else(|| g.embedding_length.map(|e| e / heads.max(1)))?;
    let hd_v = g.value_length.unwrap_or(hd_k);
    let num = |f: &[&str]| f.iter().find_map(|f| arg_value(argv, f)).and_then(|v| v.parse::<i64>().ok());
    let s = |f: &[&str]| f.iter().find_map(|f| arg_value(argv, f)).map(String::from);
    Some(LlamaInput {
        n_layer,
        n_embd_k_gqa: kv * hd_k,
        n_embd_v_gqa: kv * hd_v,
        n_ctx_train: g.context_length.unwrap_or(4096),
        token_embd_bytes: g.token_embd_bytes,
        // No `output.weight`: the head is tied to `token_embd`, which llama.cpp then copies to the GPU.
        output_bytes: if g.output_bytes > 0 { g.output_bytes } else { g.token_embd_bytes },
        block_bytes: g.block_bytes.clone(),
        ngl: num(&["-ngl", "--gpu-layers", "--n-gpu-layers"]).map(|v| if v < 0 { 999 } else { v as u64 }),
        ctx: num(&["-c", "--ctx-size"]).map(|v| v.max(0) as u64),
        np: num(&["-np", "--parallel"]).filter(|v| *v > 0).map(|v| v as u64),
        type_k: s(&["-ctk", "--cache-type-k"]),
        type_v: s(&["-ctv", "--cache-type-v"]),
        gpu_total_bytes,
    })
}

/// Checkpoint bytes: the index's `metadata.total_size`, else the sum of `*.safetensors` sizes.
pub fn checkpoint_bytes(dir: &Path) -> Option<u64> {
    let idx = dir.join("model.safetensors.index.json");
    if let Ok(b) = crate::sources::procs::read_small(&idx, 64 << 20) {
        if let Some(t) = serde_json::from_slice::<Value>(&b).ok().and_then(|v| v["metadata"]["total_size"].as_u64()) {
            return Some(t);
        }
    }
    let mut sum = 0u64;
    for e in std::fs::read_dir(dir).ok()?.flatten().take(10_000) {
        if e.file_name().to_string_lossy().ends_with(".safetensors") {
            sum = sum.saturating_add(std::fs::metadata(e.path()).map(|m| m.len()).unwrap_or(0));
        }
    }
    (sum > 0).then_some(sum)
}

/// The GPU memory to plan for: `--gpu-mem`, else the smallest GPU this machine shows (NVML/nvidia-smi).
fn gpu_total(local_machine: bool) -> Option<(u64, String)> {
    if let Some(b) = GPU_MEM.get() {
        return Some((*b, "--gpu-mem".into()));
    }
    if !local_machine {
        return None;
    }
    let s = crate::sources::gpu::Reader::open().and_then(|r| r.sample()).ok()?;
    let min = s.gpus.iter().map(|g| g.total_mib).filter(|m| *m > 0).min()?;
    Some((min << 20, s.source))
}

fn gib(x: f64) -> String {
    format!("{x:.1} GiB")
}

/// The one entry point from `check::check`: adds the fit findings for the launch, if the model and the
/// GPU memory can be read (silently nothing when the model does not resolve: check reports that).
/// `weights`: the checkpoint's tensor bytes from its safetensors headers, when check read them.
pub fn add_findings(inp: &Inputs, l: &Launch, server: Option<&str>, weights: Option<u64>, rep: &mut Report) {
    let Some(m) = &l.model else { return };
    match server {
        Some(s @ ("sglang" | "vllm")) => {
            let Ok((dir, _)) = crate::check::resolve_model(m, inp.cwd) else { return };
            let Ok(target) = crate::check::load_config(&dir) else { return };
            let sglang = s == "sglang";
            let srv = if sglang { crate::check::Srv::Sglang } else { crate::check::Srv::Vllm };
            let ctx = target.context(srv, rep.version.as_deref());
            add_hf_findings(inp.argv, l, sglang, &target, ctx.value, inp.local_machine, weights, rep);
        }
        Some("llama-cpp") => {
            let p = inp.cwd.join(m);
            if !std::fs::metadata(&p).is_ok_and(|x| x.is_file()) {
                return;
            }
            if let Ok(g) = crate::sources::gguf::read(&p) {
                add_llama_findings(&g, inp.argv, inp.local_machine, rep);
            }
        }
        _ => {}
    }
}

/// Adds the fit findings for an SGLang/vLLM launch.
#[allow(clippy::too_many_arguments)]
pub fn add_hf_findings(
    argv: &[String],
    l: &Launch,
    sglang: bool,
    target: &Config,
    ctx_model: u64,
    local: bool,
    weights: Option<u64>,
    rep: &mut Report,
) {
    let Some(dir) = target.path.parent() else { return };
    let Some(model) = model_facts(target) else { return };
    let Some(weights_bytes) = weights.or_else(|| checkpoint_bytes(dir)) else {
        rep.add(Severity::Info, "fit", "no safetensors size found: fit estimate skipped", None);
        return;
    };
    let Some((gpu_bytes, src)) = gpu_total(local) else {
        let per_gpu = weights_bytes as f64 / GIB / (l.tp.max(1) * l.pp.max(1)) as f64;
        rep.add(
            Severity::Info,
            "fit",
            format!(
                "the weights alone need {per_gpu:.2} GiB per GPU (TP {} × PP {}); GPU memory unknown (no NVML/nvidia-smi here): the rest of the fit estimate skipped",
                l.tp,
                l.pp
            ),
            Some("pass --gpu-mem 80g for the GPUs of the node that will run it".into()),
        );
        if let Some(f) = rep.findings.last_mut() {
            f.data = Some(serde_json::json!({"weights_gib_per_gpu": round2(per_gpu), "weights_bytes": weights_bytes}));
        }
        return;
    };
    let argv_flag = |f: &[&str]| f.iter().find_map(|f| arg_value(argv, f)).map(String::from);
    let input = HfInput {
        model,
        weights_bytes,
        tp: l.tp,
        pp: l.pp,
        mem_fraction: l.mem_fraction,
        kv_cache_dtype: argv_flag(&["--kv-cache-dtype"]),
        quantization: argv_flag(&["--quantization", "-q"]),
        cpu_offload_gib: argv_flag(&["--cpu-offload-gb"]).and_then(|v| v.parse().ok()).unwrap_or(0.0),
        gpu_total_bytes: gpu_bytes,
        context: Some(if sglang { l.context_length } else { l.max_model_len }.unwrap_or(ctx_model)),
        max_num_batched_tokens: argv_flag(&["--max-num-batched-tokens"]).and_then(|v| v.parse().ok()),
    };
    let e = if sglang { self::sglang(&input) } else { vllm(&input) };
    report(&e, &src, sglang, rep);
}

/// Adds the fit findings for a llama-server launch.
pub fn add_llama_findings(g: &GgufInfo, argv: &[String], local: bool, rep: &mut Report) {
    let Some((gpu_bytes, src)) = gpu_total(local) else {
        return;
    };
    if !g.tensor_bytes_known {
        rep.add(Severity::Info, "fit", "GGUF tensor types vigil does not know: fit estimate skipped", None);
        return;
    }
    let Some(i) = llama_input(g, argv, gpu_bytes) else { return };
    let e = llama(&i);
    let need = e.weights_gib_per_gpu + e.kv_gib;
    let numbers = numbers_json(&e, &src);
    let msg = format!(
        "llama-server on {} ({src}): weights on the GPU {:.0} MiB, KV cache {:.0} MiB for n_ctx {} ({} of {} layers offloaded); {IGNORES_LLAMA}",
        gib(e.gpu_total_gib),
        e.weights_gib_per_gpu * 1024.0,
        e.kv_gib * 1024.0,
        e.kv_tokens,
        i.ngl.unwrap_or(i.n_layer + 1).min(i.n_layer + 1),
        i.n_layer + 1,
    );
    if need > e.gpu_total_gib {
        push(rep, Severity::Warning, "fit", format!("{msg}: {} needed > the GPU's {}", gib(need), gib(e.gpu_total_gib)), Some("lower -ngl (layers stay on the CPU), -c, or -ctk/-ctv q8_0; llama-server's -fit (on by default) may lower unset ones itself".into()), numbers);
    } else {
        push(rep, Severity::Info, "fit", msg, None, numbers);
    }
}

fn numbers_json(e: &Estimate, src: &str) -> Value {
    serde_json::json!({
        "server": e.server,
        "gpu_total_gib": round2(e.gpu_total_gib),
        "gpu_mem_from": src,
        "weights_gib_per_gpu": round2(e.weights_gib_per_gpu),
        "usable_gib": round2(e.usable_gib),
        "mem_fraction": e.mem_fraction,
        "kv_gib": round2(e.kv_gib),
        "kv_bytes_per_token": e.kv_bytes_per_token,
        "kv_tokens": e.kv_tokens,
        "context": e.context,
    })
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

fn push(rep: &mut Report, sev: Severity, rule: &str, msg: String, fix: Option<String>, data: Value) {
    // Never an error: some way to run it always exists (the module doc).
    let sev = sev.min(Severity::Warning);
    rep.add(sev, rule, msg, fix);
    if let Some(f) = rep.findings.last_mut() {
        f.data = Some(data);
    }
}

fn report(e: &Estimate, src: &str, sglang: bool, rep: &mut Report) {
    let frac = if sglang { "--mem-fraction-static" } else { "--gpu-memory-utilization" };
    let head = format!(
        "per GPU ({} from {src}): weights {}, {frac} {:.3} → {} usable, {} left for the KV cache = {} tokens ({:.0} bytes/token)",
        gib(e.gpu_total_gib),
        gib(e.weights_gib_per_gpu),
        e.mem_fraction,
        gib(e.usable_gib),
        gib(e.kv_gib),
        e.kv_tokens,
        e.kv_bytes_per_token
    );
    let numbers = numbers_json(e, src);
    if e.weights_gib_per_gpu >= e.usable_gib {
        let fix = if sglang {
            "raise --tp, quantize (--quantization fp8), offload (--cpu-offload-gb), or raise --mem-fraction-static"
        } else {
            "raise --tensor-parallel-size, quantize (--quantization fp8), offload (--cpu-offload-gb), or raise --gpu-memory-utilization"
        };
        push(
            rep,
            Severity::Warning,
            "fit-weights",
            format!("the weights do not fit: {head}; {IGNORES}"),
            Some(fix.into()),
            numbers,
        );
        return;
    }
    match e.context {
        Some(c) if e.kv_tokens < c => {
            let fix = format!(
                "lower {} to <= {}, use --kv-cache-dtype fp8, more GPUs, or a larger {frac}",
                if sglang { "--context-length" } else { "--max-model-len" },
                e.kv_tokens
            );
            push(
                rep,
                Severity::Warning,
                "fit-kv",
                format!(
                    "the KV cache holds fewer tokens than one request of the context asked ({c}): {head}; {IGNORES}"
                ),
                Some(fix),
                numbers,
            );
        }
        _ => push(
            rep,
            Severity::Info,
            "fit",
            format!("{head}; context {}; {IGNORES}", e.context.map(|c| c.to_string()).unwrap_or_else(|| "?".into())),
            None,
            numbers,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One row of the scoring table (docs/fit.md): the inputs vigil would read and what the server printed.
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Row {
        id: String,
        source: String,
        #[serde(default)]
        note: String,
        server: String,
        #[serde(default)]
        hf: Option<HfInput>,
        #[serde(default)]
        llama: Option<LlamaInput>,
        #[serde(default)]
        real_weights_gib: Option<f64>,
        #[serde(default)]
        real_kv_tokens: Option<u64>,
        #[serde(default)]
        real_kv_mib: Option<f64>,
        /// Rows known to miss a tolerance, with the reason (docs/fit.md says why); the test asserts they
        /// still miss, so a fix shows up as a test to update.
        #[serde(default)]
        expect_miss: Vec<String>,
    }

    fn rows() -> Vec<Row> {
        let p = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fit-scoring.json");
        serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
    }

    fn err(est: f64, real: f64) -> f64 {
        (est - real) / real * 100.0
    }

    #[test]
    fn scoring_table_within_tolerance() {
        let mut lines = Vec::new();
        let (mut w_in, mut w_n, mut k_in, mut k_n) = (0, 0, 0, 0);
        for r in rows() {
            assert!(!r.source.is_empty(), "{}: a source", r.id);
            let e = match (r.server.as_str(), &r.hf, &r.llama) {
                ("sglang", Some(h), _) => sglang(h),
                ("vllm", Some(h), _) => vllm(h),
                ("llama-cpp", _, Some(l)) => llama(l),
                _ => panic!("{}: inputs do not match the server", r.id),
            };
            let mut misses = Vec::new();
            if let Some(w) = r.real_weights_gib {
                let x = err(e.weights_gib_per_gpu, w);
                w_n += 1;
                if x.abs() <= 10.0 {
                    w_in += 1;
                } else {
                    misses.push("weights".to_string());
                }
                lines.push(format!("{} weights est {:.2} real {w:.2} ({x:+.1}%)", r.id, e.weights_gib_per_gpu));
            }
            if let Some(t) = r.real_kv_tokens {
                let x = err(e.kv_tokens as f64, t as f64);
                k_n += 1;
                if x.abs() <= 25.0 {
                    k_in += 1;
                } else {
                    misses.push("kv_tokens".to_string());
                }
                lines.push(format!("{} kv tokens est {} real {t} ({x:+.1}%)", r.id, e.kv_tokens));
            }
            if let Some(m) = r.real_kv_mib {
                let x = err(e.kv_gib * 1024.0, m);
                assert!(x.abs() <= 1.0, "{}: KV buffer {:.2} MiB vs real {m} ({x:+.1}%)", r.id, e.kv_gib * 1024.0);
            }
            assert_eq!(misses, r.expect_miss, "{}: misses ({}); {}", r.id, lines.join(" | "), r.note);
        }
        eprintln!("{}\nweights within 10%: {w_in}/{w_n}; KV tokens within 25%: {k_in}/{k_n}", lines.join("\n"));
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("80g"), Some(80 << 30));
        assert_eq!(parse_size("141GiB"), Some(141 << 30));
        assert_eq!(parse_size("81559m"), Some(81559 << 20));
        assert_eq!(parse_size("1024"), Some(1024));
        assert_eq!(parse_size("x"), None);
        assert_eq!(parse_size("-3g"), None);
        assert_eq!(parse_size("80q"), None);
        assert_eq!(parse_size("1e400g"), None);
    }

    #[test]
    fn default_mem_fraction_h100_h200() {
        // 0.5.23 on an 80 GB H100 (81559 MiB), TP 1: reserved 512 + 12288 + 128 + 512 = 13440 MB.
        assert_eq!(sglang_default_mem_fraction(81559.0, 1, 1), 0.835);
        assert!(sglang_default_mem_fraction(143771.0, 8, 1) > 0.88);
    }

    #[test]
    fn vllm_profile_run_tokens() {
        // `EngineArgs.get_batch_defaults`: 8192 for the API server at >= 70 GiB, 2048 below; the flag wins.
        let mut i = HfInput { gpu_total_bytes: 81559 << 20, ..Default::default() };
        assert_eq!(vllm_profile_tokens(&i), 8192);
        i.gpu_total_bytes = 24576 << 20;
        assert_eq!(vllm_profile_tokens(&i), 2048);
        i.max_num_batched_tokens = Some(16384);
        assert_eq!(vllm_profile_tokens(&i), 16384);
    }

    #[test]
    fn mla_and_gqa_cells() {
        let gqa = ModelFacts {
            kv_layers: 32,
            num_layers: 32,
            kv_heads: 8,
            head_dim: 128,
            v_head_dim: 128,
            ..Default::default()
        };
        assert_eq!(kv_bytes_per_token(&gqa, 1, 1, 2.0), 131072.0);
        assert_eq!(kv_bytes_per_token(&gqa, 16, 1, 2.0), 16384.0, "one KV head per GPU past the KV heads");
        let mla = ModelFacts { kv_layers: 61, mla_dim: Some(576), ..gqa };
        assert_eq!(kv_bytes_per_token(&mla, 8, 1, 2.0), 576.0 * 61.0 * 2.0, "MLA is not split by TP");
    }

    #[test]
    fn never_an_error() {
        let mut rep = Report::default();
        let e = Estimate {
            server: "sglang".into(),
            gpu_total_gib: 24.0,
            weights_gib_per_gpu: 130.0,
            usable_gib: 20.0,
            mem_fraction: 0.8,
            kv_gib: 0.0,
            kv_bytes_per_token: 1.0,
            kv_tokens: 0,
            context: Some(1),
        };
        report(&e, "--gpu-mem", true, &mut rep);
        assert_eq!(rep.errors(), 0);
        assert_eq!(rep.warnings(), 1);
        assert_eq!(rep.findings[0].data.as_ref().unwrap()["weights_gib_per_gpu"], 130.0);
    }

    #[test]
    fn config_facts() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/configs");
        for (name, layers, kv, mla) in [("deepseek-v3", 61, 128, Some(576)), ("llama-3.1-8b-instruct", 32, 8, None)] {
            let p = std::path::PathBuf::from(format!("{dir}/{name}.json"));
            let c =
                Config { path: p.clone(), json: serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap() };
            let f = model_facts(&c).unwrap();
            assert_eq!((f.kv_layers, f.kv_heads, f.mla_dim), (layers, kv, mla), "{name}");
        }
        let c = Config {
            path: "/x".into(),
            json: serde_json::json!({"num_hidden_layers": 8, "layer_types": ["linear_attention", "full_attention", "linear_attention", "full_attention"]}),
        };
        assert_eq!(model_facts(&c).unwrap().kv_layers, 2, "only full-attention layers keep a KV cache");
        assert!(model_facts(&Config { path: "/x".into(), json: serde_json::json!([1]) }).is_none());
    }
}
