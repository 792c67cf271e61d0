//! `vigil check -- CMD ARGS...`: catches config and environment errors before a GPU minute is spent.
//! Reads the command line of SGLang, vLLM or llama-server, the model configs (local directories or the
//! Hugging Face cache, never the network), GGUF headers, the installed server version (package
//! metadata, never an import) and the machine (ports, GPUs, /dev/shm, disk, ulimit, NCCL_*).

mod derive;
pub mod files;
pub mod fit;
#[cfg(test)]
mod golden;
mod launch;
pub mod machine;

use crate::error::CliError;
use crate::sinks::records::{CheckReport as Report, Severity};
use crate::sources::gguf;
use crate::sources::procs;
pub(crate) use derive::Srv;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// Evidence for the errors that `vigil up` may refuse a launch on. Every other error is advisory until
/// the golden table of the servers' own code confirms it (issue #13).
pub mod evidence {
    /// llama-server stops on a truncated or non-GGUF model: `tests/check.rs`
    /// `e2e_gguf_draft_vocab_and_truncated_model` and `scripts/demo.sh` run the real server on them.
    pub const GGUF_REAL_SERVER: &str = "the real llama-server stops on this file (tests/check.rs, e2e)";
    /// SGLang >= 0.5.1 raises `Target model's context_length ... is greater than the derived
    /// context_length` (python/sglang/srt/configs/model_config.py) unless the variable is set; seen in the
    /// field case's log. Only with a known installed version.
    pub const SGLANG_DRAFT_CONTEXT: &str =
        "SGLang >= 0.5.1 raises in ModelConfig (sglang/srt/configs/model_config.py), installed version read";
    /// A local model path (not a Hugging Face id) that does not exist: every server stops at load.
    pub const MISSING_LOCAL_PATH: &str = "a local path that does not exist: every server stops at load";
    /// The safetensors library refuses a file whose size is not 8 + header + the last tensor's end, or whose
    /// header is not a safetensors table (safetensors/src/tensor.rs `SafeTensors::read_metadata`:
    /// `MetadataIncompleteBuffer`, `HeaderTooLarge`, `InvalidHeaderLength`); both servers open every shard
    /// of the checkpoint with it (docs/preflight-facts.md).
    pub const SAFETENSORS_SIZE: &str =
        "safetensors refuses a file whose size is not its header's (MetadataIncompleteBuffer); docs/preflight-facts.md";
    /// A shard the index names is not on disk: vLLM >= 0.26.0 raises `Weight files referenced in index but
    /// missing` (model_executor/model_loader/weight_utils.py:602), SGLang >= 0.5.17 `references N shard
    /// file(s) missing` (srt/model_loader/weight_utils.py:693), both before loading.
    pub const MISSING_SHARD: &str =
        "the server's filter_duplicate_safetensors_files raises on a missing shard (docs/preflight-facts.md)";
    /// A tensor whose shape is not the one the config implies: the parallel linear layers' and the vocabulary
    /// embedding's `weight_loader` assert the shapes (docs/preflight-facts.md lists the lines per server).
    pub const WEIGHT_SHAPE: &str =
        "the server's weight_loader asserts each tensor's shape against the config (docs/preflight-facts.md)";
    /// vLLM's AutoWeightsLoader raises on a checkpoint layer the config does not build
    /// (model_executor/models/utils.py:390 in 0.26.0).
    pub const VLLM_UNKNOWN_WEIGHT: &str =
        "vLLM's AutoWeightsLoader raises `There is no module or parameter named` (docs/preflight-facts.md)";
    /// vLLM checks every parameter was loaded (unquantized models; model_loader/default_loader.py:467 in 0.26.0).
    pub const VLLM_UNLOADED_WEIGHT: &str =
        "vLLM raises `Following weights were not initialized from checkpoint` (docs/preflight-facts.md)";
    /// A LoRA adapter folder that does not exist or has no adapter_config.json: vLLM's `init_static_loras`
    /// raises (entrypoints/openai/models/serving.py:139 in 0.26.0), SGLang's LoRAConfig opens
    /// adapter_config.json (srt/lora/lora_config.py:75-84 in 0.5.17).
    pub const LORA_PATH: &str =
        "the server loads every --lora-* adapter at startup and raises (docs/preflight-facts.md)";
    /// vLLM's `load_chat_template` (entrypoints/chat_utils.py:1341 in 0.26.0) and SGLang's template manager
    /// (srt/parser/template_manager.py:196 in 0.5.17) raise on a path that does not open.
    pub const CHAT_TEMPLATE_PATH: &str =
        "the server raises on a --chat-template path that does not open (docs/preflight-facts.md)";
    /// More GPUs asked on this node than CUDA shows: vLLM raises `World size (N) is larger than the number
    /// of available GPUs` (config/parallel.py:896-905 in 0.26.0); SGLang's TP rank fails `set_device`
    /// (srt/model_executor/model_runner.py:352 in 0.5.17). The GPUs CUDA shows are what torch's
    /// `_parse_visible_devices` / `_device_count_nvml` make of CUDA_VISIBLE_DEVICES.
    pub const GPUS_VISIBLE: &str =
        "the server needs a visible GPU per local rank and refuses fewer (docs/preflight-facts.md)";
    /// `tests/golden/check-golden.jsonl` `#over#` rows: the server's ModelConfig raises on a length flag
    /// above the derived length without the allow variable (`Srv::golden_versions`).
    pub const GOLDEN_LENGTH: &str =
        "golden table: the server's own ModelConfig refuses this length (tests/golden, #over# rows)";
    /// Golden `#derive` rows: the config does not load (not an integer length, unknown model_type).
    pub const GOLDEN_CONFIG_LOAD: &str =
        "golden table: the server's own config loading refuses this config (tests/golden, #derive rows)";
    /// Golden `#parse#`/`#mc#` rows: SGLang's argparse refuses `--context-length 32K`.
    pub const GOLDEN_SGLANG_PARSE: &str =
        "golden table: SGLang's argparse refuses this --context-length (tests/golden, #parse# rows)";
    /// Golden `#tp#` rows: vLLM `ModelConfig.verify_with_parallel_config`.
    pub const GOLDEN_VLLM_TP: &str =
        "golden table: vLLM's verify_with_parallel_config refuses this TP (tests/golden, #tp# rows)";
    /// Golden `#attn#` rows: the model's attention layer, built at this TP size, asserts on its heads.
    pub const GOLDEN_ATTENTION: &str =
        "golden table: the model's own attention layer refuses this TP when built (tests/golden, #attn# rows)";
}

/// A model config read from disk (with the command line's overrides applied).
pub struct Config {
    pub path: PathBuf,
    pub json: Value,
}

impl Config {
    fn obj(&self) -> &serde_json::Map<String, Value> {
        static EMPTY: std::sync::OnceLock<serde_json::Map<String, Value>> = std::sync::OnceLock::new();
        self.json.as_object().unwrap_or_else(|| EMPTY.get_or_init(serde_json::Map::new))
    }
    /// A number from the text config the server reads, else from the top level.
    fn u64(&self, srv: Srv, k: &str) -> Option<u64> {
        let t = derive::text_config(srv, self.obj());
        t.get(k).and_then(|v| v.as_u64()).or_else(|| self.json.get(k).and_then(|v| v.as_u64()))
    }
    fn arch(&self) -> String {
        self.json["architectures"][0].as_str().unwrap_or("?").to_string()
    }
    fn path_str(&self) -> String {
        self.path.display().to_string()
    }
    /// The context length `srv` derives (version-keyed).
    pub fn context(&self, srv: Srv, version: Option<&str>) -> Ctx {
        match srv {
            Srv::Sglang => derive::sglang_context(self.obj(), &self.path_str()),
            Srv::Vllm => derive::vllm_context(self.obj(), &self.path_str(), version),
        }
    }
    /// SGLang `--json-model-override-args` (`config.update(...)`: top-level keys) and vLLM `--hf-overrides`
    /// (nested dicts update the sub-config): applied before anything is derived.
    fn apply_overrides(&mut self, srv: Srv, o: &Value) {
        fn merge(dst: &mut Value, src: &Value, deep: bool) {
            match (dst.as_object_mut(), src.as_object()) {
                (Some(d), Some(s)) => {
                    for (k, v) in s {
                        match d.get_mut(k) {
                            Some(dv) if deep && dv.is_object() && v.is_object() => merge(dv, v, deep),
                            _ => {
                                d.insert(k.clone(), v.clone());
                            }
                        }
                    }
                }
                _ => *dst = src.clone(),
            }
        }
        if o.is_object() && self.json.is_object() {
            merge(&mut self.json, o, srv == Srv::Vllm);
        }
    }
}

pub use derive::Ctx;
pub use launch::Launch;

/// The command line without reading a `--config` file (the remote path: the file is on the node).
pub fn parse_launch(argv: &[String], server: Option<&str>) -> Result<Launch, CliError> {
    launch::parse(argv, server, None, None)
}

fn hf_cache_dirs() -> Vec<PathBuf> {
    let mut v = Vec::new();
    if let Some(h) = std::env::var_os("HF_HUB_CACHE") {
        v.push(PathBuf::from(h));
    }
    if let Some(h) = std::env::var_os("HF_HOME") {
        v.push(PathBuf::from(h).join("hub"));
    }
    if let Some(h) = std::env::var_os("HOME") {
        v.push(PathBuf::from(h).join(".cache/huggingface/hub"));
    }
    v
}

/// Why a model argument resolved to no local directory.
pub(crate) enum Unresolved {
    /// A path (absolute or `./`, `../`, `~`) that does not exist: every server stops at load.
    Missing(String),
    /// A name that may be a Hugging Face id not (yet) in the local cache: the server downloads it
    /// (or resumes an `.incomplete` blob) unless offline mode is set.
    NotCached(String),
}

/// The snapshot a Hugging Face cache repository serves: the commit `refs/main` names (what
/// `from_pretrained` loads), else, with no `refs/main`, the newest snapshot by mtime.
pub(crate) fn hf_snapshot(repo: &Path) -> Option<PathBuf> {
    let snaps = repo.join("snapshots");
    if let Ok(b) = procs::read_small(&repo.join("refs/main"), 256) {
        let c = String::from_utf8_lossy(&b).trim().to_string();
        if !c.is_empty() && !c.contains('/') && snaps.join(&c).is_dir() {
            return Some(snaps.join(c));
        }
    }
    let rd = std::fs::read_dir(&snaps).ok()?;
    let mut s: Vec<PathBuf> = rd.flatten().map(|e| e.path()).collect();
    s.sort_by_key(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok());
    s.pop()
}

/// A model argument written as a path (absolute, `./`, `../`, `~`), never a Hugging Face id.
pub(crate) fn path_like(m: &str) -> bool {
    m.starts_with('/') || m.starts_with("./") || m.starts_with("../") || m.starts_with('~')
}

/// A model argument → a local directory: the path itself, or the `refs/main` snapshot in the HF cache.
pub(crate) fn resolve_model(m: &str, cwd: &Path) -> Result<(PathBuf, Option<PathBuf>), Unresolved> {
    let p = cwd.join(m);
    if p.exists() {
        return Ok((p, None));
    }
    if !path_like(m) && m.matches('/').count() <= 1 {
        let name = format!("models--{}", m.replace('/', "--"));
        for c in hf_cache_dirs() {
            let repo = c.join(&name);
            if let Some(snap) = hf_snapshot(&repo) {
                return Ok((snap, Some(repo)));
            }
        }
        return Err(Unresolved::NotCached(format!(
            "'{m}' is not a local path and not in the Hugging Face cache ({})",
            hf_cache_dirs().iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
        )));
    }
    Err(Unresolved::Missing(format!("model path {} does not exist", p.display())))
}

/// Reports a model that did not resolve: a missing path is an error the servers confirm; a name that
/// may be a Hugging Face id is downloaded by the server, so only a warning, unless offline mode is on.
fn report_unresolved(u: Unresolved, rule: &str, env: &[(String, String)], rep: &mut Report) {
    match u {
        Unresolved::Missing(m) => rep.add_confirmed(rule, m, None, evidence::MISSING_LOCAL_PATH),
        Unresolved::NotCached(m) => {
            let offline =
                ["HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"].iter().find(|k| env_get(env, k).is_some_and(hf_true));
            match offline {
                Some(k) => rep.add(
                    Severity::Error,
                    rule,
                    format!("{m}; {k} is set, so the server cannot download it"),
                    Some(format!("download it first, or unset {k}")),
                ),
                None => rep.add(
                    Severity::Warning,
                    rule,
                    format!("{m}: the server will download it (config checks skipped; vigil never downloads)"),
                    None,
                ),
            }
        }
    }
}

/// `HF_HUB_OFFLINE` / `TRANSFORMERS_OFFLINE` as huggingface_hub reads them (`1`, `on`, `yes`, `true`).
fn hf_true(v: &str) -> bool {
    matches!(v.trim().to_ascii_lowercase().as_str(), "1" | "on" | "yes" | "true")
}

/// The largest config file read (a real config.json is a few KiB; a FIFO or /dev/zero must not hang or
/// fill memory).
const MAX_CONFIG_BYTES: u64 = 4 << 20;

pub(crate) fn load_config(dir: &Path) -> Result<Config, String> {
    if dir.is_file() {
        return Err(format!("{} is a file, not a model directory with config.json", dir.display()));
    }
    let p = dir.join("config.json");
    let bytes = procs::read_small(&p, MAX_CONFIG_BYTES).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            format!("{} has no config.json", dir.display())
        } else {
            format!("cannot read {}: {e}", p.display())
        }
    })?;
    let text = String::from_utf8_lossy(&bytes);
    let json: Value = serde_json::from_str(&text).map_err(|e| format!("{} is not valid JSON: {e}", p.display()))?;
    if !json.is_object() {
        return Err(format!("{} is not a JSON object", p.display()));
    }
    Ok(Config { path: p, json })
}

/// The interpreter a command names: `python -m ...` directly, else the shebang of the entry script.
fn interpreter(program: &str, env_path: &str) -> Option<PathBuf> {
    let find = |p: &str| -> Option<PathBuf> {
        if p.contains('/') {
            return Some(PathBuf::from(p));
        }
        env_path.split(':').map(|d| Path::new(d).join(p)).find(|c| c.is_file())
    };
    let exe = find(program)?;
    let base = exe.file_name()?.to_string_lossy().to_string();
    if base.starts_with("python") {
        return Some(exe);
    }
    let mut head = [0u8; 256];
    let n = std::io::Read::read(&mut std::fs::File::open(&exe).ok()?, &mut head).ok()?;
    let line = String::from_utf8_lossy(&head[..n]).lines().next()?.to_string();
    let interp = line.strip_prefix("#!")?.split_whitespace().next()?.to_string();
    Some(PathBuf::from(interp))
}

/// Version of a package from its `*.dist-info/METADATA` beside the interpreter (never imported).
pub fn package_version(interp: &Path, pkg: &str) -> Option<String> {
    let bin = interp.parent()?;
    let prefix = bin.parent()?;
    let mut roots = vec![];
    for lib in ["lib", "lib64", "local/lib"] {
        if let Ok(rd) = std::fs::read_dir(prefix.join(lib)) {
            for e in rd.flatten() {
                if e.file_name().to_string_lossy().starts_with("python") {
                    roots.push(e.path().join("site-packages"));
                    roots.push(e.path().join("dist-packages"));
                }
            }
        }
    }
    roots.push(PathBuf::from("/usr/lib/python3/dist-packages"));
    let want = pkg.replace('-', "_").to_ascii_lowercase();
    for r in roots {
        let Ok(rd) = std::fs::read_dir(&r) else {
            continue;
        };
        for e in rd.flatten() {
            let n = e.file_name().to_string_lossy().to_ascii_lowercase();
            if n.ends_with(".dist-info") && n.starts_with(&format!("{want}-")) {
                let meta = procs::read_small(&e.path().join("METADATA"), 4 << 20).ok()?;
                let meta = String::from_utf8_lossy(&meta);
                return meta.lines().find_map(|l| l.strip_prefix("Version: ")).map(|v| v.trim().to_string());
            }
        }
    }
    None
}

pub struct Inputs<'a> {
    pub argv: &'a [String],
    pub server: Option<String>,
    pub env: &'a [(String, String)],
    pub cwd: &'a Path,
    /// Check this machine too (ports, GPUs, /dev/shm, disk, the interpreter's packages); off when
    /// the server runs elsewhere (`check --host`: the model files are a local mirror).
    pub local_machine: bool,
    /// The installed server version when the caller knows it (the golden-table test); `None`: read
    /// from the package metadata beside the interpreter (on this machine only).
    pub version: Option<String>,
    /// Where the node keeps its runs' logs (the disk check), when the caller runs servers here.
    pub state_root: Option<std::path::PathBuf>,
}

fn env_get<'a>(env: &'a [(String, String)], k: &str) -> Option<&'a str> {
    env.iter().find(|(ek, _)| ek == k).map(|(_, v)| v.as_str())
}

/// An allow-longer variable as `srv` (in the installed version) reads it; a note when versions differ.
fn allow_var(inp: &Inputs, srv: Srv, version: Option<&str>, rep: &mut Report) -> bool {
    let var = match srv {
        Srv::Sglang => "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN",
        Srv::Vllm => "VLLM_ALLOW_LONG_MAX_MODEL_LEN",
    };
    let Some(v) = env_get(inp.env, var) else { return false };
    let (set, note) = derive::env_true(srv, version, v);
    if let Some(n) = note {
        rep.add(
            Severity::Warning,
            "env",
            format!("{var}={v}: {n}"),
            Some(format!("set {var}=1 (every version reads it)")),
        );
    } else if !set && !matches!(v.trim().to_ascii_lowercase().as_str(), "0" | "false" | "") {
        rep.add(
            Severity::Warning,
            "env",
            format!(
                "{var}={v} is not read as set by {} (it takes {})",
                srv.name(),
                match srv {
                    Srv::Vllm => "1 or true",
                    Srv::Sglang => "1, true, yes or y",
                }
            ),
            Some(format!("set {var}=1")),
        );
    }
    set
}

/// An error the golden table shows this server version refusing: confirmed with `by` when the installed
/// version is known and the table stands for it (`derive::golden_version`: the nearest table version at or
/// below it), else an unconfirmed error (`ERROR?`, `up` launches).
fn add_refusal(rep: &mut Report, srv: Srv, rule: &str, msg: String, fix: Option<String>, by: &'static str) {
    let ver = rep.version.as_deref();
    let why = match (ver, derive::golden_version(srv, ver)) {
        (None, _) => Err(format!(" ({} version unknown: not confirmed)", srv.name())),
        (Some(v), None) => Err(format!(
            " ({} {v} is outside the golden table's versions {}-{}: not confirmed)",
            srv.name(),
            srv.golden_versions()[0],
            srv.golden_versions().last().copied().unwrap_or("?")
        )),
        // vLLM < 0.24 also runs with transformers 4.56+, whose config classes differ; the table was made with
        // transformers 5 (the newest its pin allows).
        (Some(v), Some(_))
            if srv == Srv::Vllm
                && derive::at_least(Some(v), &[0, 24, 0]) == Some(false)
                && derive::at_least(rep.transformers.as_deref(), &[5, 0, 0]) != Some(true) =>
        {
            Err(format!(
                " (vLLM {v} also runs with transformers 4.x, transformers {} here; the golden table was made with transformers 5: not confirmed)",
                rep.transformers.as_deref().unwrap_or("unknown")
            ))
        }
        (Some(v), Some(g)) if derive::version_tuple(v) != derive::version_tuple(g) => {
            Ok(format!(" (the golden table's {} {g} rows: no rule change from {g} to {v})", srv.name()))
        }
        (Some(_), Some(_)) => Ok(String::new()),
    };
    match why {
        Ok(note) => rep.add_confirmed(rule, format!("{msg}{note}"), fix, by),
        Err(why) => rep.add(Severity::Error, rule, format!("{msg}{why}"), fix),
    }
}

pub fn check(inp: &Inputs, profiles: &vigil_core::Profiles) -> Result<Report, CliError> {
    let mut rep = Report::default();
    let server = inp.server.clone().or_else(|| profiles.detect_cmd(inp.argv).map(String::from));
    rep.server = server.clone();
    if server.is_none() {
        rep.add(
            Severity::Info,
            "server",
            "server kind not recognised from the command line: only environment checks ran",
            None,
        );
    }
    let path_env = env_get(inp.env, "PATH").unwrap_or("/usr/bin:/bin").to_string();
    let program = inp.argv.first().cloned().unwrap_or_default();
    // Server version from package metadata (SGLang and vLLM alike), before the command line is read:
    // length flags parse per version.
    let pkg = match server.as_deref() {
        Some("sglang") => Some("sglang"),
        Some("vllm") => Some("vllm"),
        _ => None,
    };
    if let Some(pkg) = pkg {
        let interp = inp.local_machine.then(|| interpreter(&program, &path_env)).flatten();
        let v = match &inp.version {
            Some(v) => Some(v.clone()),
            None => interp.as_deref().and_then(|i| package_version(i, pkg)),
        };
        rep.transformers = interp.as_deref().and_then(|i| package_version(i, "transformers"));
        match &v {
            Some(v) => {
                rep.add(Severity::Info, "version", format!("{pkg} {v} (from its installed package metadata)"), None)
            }
            None if inp.local_machine => rep.add(
                Severity::Info,
                "version",
                format!(
                    "{pkg} version unknown (no package metadata beside the interpreter): assuming the newest behaviour"
                ),
                None,
            ),
            None => {}
        }
        rep.version = v;
    }
    let l = launch::parse(inp.argv, server.as_deref(), Some(inp.cwd), rep.version.as_deref())?;
    for n in &l.notes {
        rep.add(Severity::Warning, "command", n.clone(), None);
    }
    // The checkpoint's weight bytes from its safetensors headers, for the fit.
    let mut weights = None;
    match server.as_deref() {
        Some("sglang") => check_hf(inp, &l, Srv::Sglang, &mut rep, &mut weights),
        Some("vllm") => check_hf(inp, &l, Srv::Vllm, &mut rep, &mut weights),
        Some("llama-cpp") => check_gguf(inp, &l, &mut rep),
        _ => {}
    }
    // Will it fit? (issue #13 item 5; warnings at most: crates/vigil/src/check/fit.rs).
    fit::add_findings(inp, &l, server.as_deref(), weights, &mut rep);
    if inp.local_machine {
        check_env(inp, &l, server.as_deref(), profiles, &mut rep);
    }
    Ok(rep)
}

/// Loads a model config for `srv`: the config (overrides applied), or `None` after reporting why the
/// server would not load it.
fn load_for(inp: &Inputs, l: &Launch, srv: Srv, dir: &Path, rule: &str, rep: &mut Report) -> Option<Config> {
    let mut c = match load_config(dir) {
        Ok(c) => c,
        Err(e) => {
            rep.add(Severity::Error, rule, e, None);
            return None;
        }
    };
    if let Some(o) = &l.overrides {
        c.apply_overrides(srv, o);
    }
    let _ = inp;
    match derive::load_refusal(srv, rep.version.as_deref(), rep.transformers.as_deref(), c.obj(), l.trust_remote_code) {
        Ok(None) => {}
        Ok(Some(note)) => rep.add(Severity::Warning, rule, format!("{}: {note}", c.path.display()), None),
        Err((m, None)) => {
            let fix = m.contains("model_type").then(|| {
                "pass --trust-remote-code if the repository ships its config code, or upgrade the server".to_string()
            });
            add_refusal(rep, srv, rule, format!("{}: {m}", c.path.display()), fix, evidence::GOLDEN_CONFIG_LOAD);
            return None;
        }
        Err((m, Some(dep))) => {
            rep.add(Severity::Warning, rule, format!("{}: {m}; depends on {dep}", c.path.display()), None);
        }
    }
    Some(c)
}

/// The speculative method and whether it needs a draft model: vLLM's `method` (absent: `ngram` for the
/// model `ngram`, `eagle`/`eagle3` when the path says so, else `draft_model`); SGLang's algorithm.
fn spec_method(l: &Launch, srv: Srv) -> Option<(String, bool)> {
    match srv {
        Srv::Sglang => {
            let a = l.spec_algo.clone()?;
            let needs = !matches!(a.as_str(), "NGRAM" | "NEXTN" | "MTP" | "DEEPSEEK_MTP");
            Some((a, needs))
        }
        Srv::Vllm => {
            let sc = l.spec_config.as_ref()?;
            let m = match (&l.spec_algo, sc.get("model").and_then(|m| m.as_str())) {
                (Some(a), _) => a.to_ascii_lowercase(),
                (None, Some("ngram" | "[ngram]")) => "ngram".into(),
                (None, Some(p)) if p.to_ascii_lowercase().contains("eagle-") => "eagle".into(),
                (None, Some(p)) if p.to_ascii_lowercase().contains("eagle3") => "eagle3".into(),
                (None, Some(_)) => "draft_model".into(),
                (None, None) => return None,
            };
            let needs = matches!(m.as_str(), "eagle" | "eagle3" | "draft_model" | "medusa" | "mlp_speculator");
            Some((m.to_ascii_uppercase(), needs))
        }
    }
}

fn check_hf(inp: &Inputs, l: &Launch, srv: Srv, rep: &mut Report, weights: &mut Option<u64>) {
    let sglang = srv == Srv::Sglang;
    let version = rep.version.clone();
    let ver = version.as_deref();
    files::check_paths(srv, inp.argv, inp.cwd, rep);
    let safetensors = files::loads_safetensors(inp.argv);
    let Some(m) = &l.model else {
        rep.add(Severity::Error, "model", "no model given (--model-path / vllm serve MODEL / --config FILE)", None);
        return;
    };
    let (d, repo) = match resolve_model(m, inp.cwd) {
        Ok(x) => x,
        Err(u) => return report_unresolved(u, "model", inp.env, rep),
    };
    if let Some(repo) = &repo {
        check_incomplete_blobs(repo, rep);
    }
    // `huggingface-cli download --local-dir` keeps its partial files here.
    check_incomplete_local(&d, rep);
    let Some(target) = load_for(inp, l, srv, &d, "model", rep) else { return };
    if safetensors {
        *weights =
            files::check_checkpoint(srv, inp.argv, &d, &target, files::Role::Target, rep).map(|r| r.weight_bytes);
    }
    let tctx = target.context(srv, ver);
    rep.add(Severity::Info, "context", format!("target context {} ({})", tctx.value, tctx.how), None);
    check_tp_heads(l, srv, &target, rep);
    // Length flags.
    if let Some(bad) = &l.bad_len {
        if sglang {
            add_refusal(
                rep,
                srv,
                "context-length",
                bad.clone(),
                Some("write the length as a plain integer".into()),
                evidence::GOLDEN_SGLANG_PARSE,
            );
        } else {
            rep.add(Severity::Error, "max-model-len", bad.clone(), Some("write the length as a plain integer".into()));
        }
    }
    if let Some(n) = &l.len_note {
        rep.add(Severity::Warning, if sglang { "context-length" } else { "max-model-len" }, n.clone(), None);
    }
    let mut effective = tctx.value;
    if !sglang {
        if let Some(mml) = l.max_model_len {
            effective = mml;
            let mml_ok = target.u64(srv, "model_max_length").is_some_and(|m| mml <= m);
            if mml > tctx.limit && !mml_ok && !allow_var(inp, srv, ver, rep) {
                add_refusal(rep, srv, "max-model-len", format!("--max-model-len {mml} exceeds the model's context {} ({}): vLLM raises `User-specified max_model_len ({mml}) is greater than the derived max_model_len`", tctx.limit, tctx.how), Some(format!("use --max-model-len <= {}, or set VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 if you know the model extrapolates", tctx.limit)), evidence::GOLDEN_LENGTH);
            }
        }
    } else if let Some(cl) = l.context_length {
        effective = cl;
        if cl > tctx.value && !allow_var(inp, srv, ver, rep) {
            let msg =
                format!("--context-length {cl} exceeds the model's derived context {} ({})", tctx.value, tctx.how);
            let fix = Some(format!("use --context-length <= {}", tctx.value));
            match derive::at_least(ver, &[0, 5, 1]) {
                Some(false) => rep.add(Severity::Warning, "context-length", format!("{msg}; SGLang {} only warns (0.4.x) and runs past the model's window", ver.unwrap_or("?")), fix),
                _ => add_refusal(rep, srv, "context-length", format!("{msg}: SGLang >= 0.5.1 raises `User-specified context_length ({cl}) is greater than the derived context_length ({})` (0.4.x only warned)", tctx.value), fix, evidence::GOLDEN_LENGTH),
            }
        }
    }
    rep.context = Some(effective);
    // Speculative decoding.
    let Some((algo, needs_draft)) = spec_method(l, srv) else { return };
    let draft = match &l.draft {
        Some(d) => match resolve_model(d, inp.cwd) {
            Err(u) => return report_unresolved(u, "draft-model", inp.env, rep),
            Ok((p, _)) => match load_for(inp, l, srv, &p, "draft-model", rep) {
                Some(c) => {
                    if safetensors {
                        let role = files::Role::Draft { target: &target, eagle3: algo == "EAGLE3" };
                        files::check_checkpoint(srv, inp.argv, &p, &c, role, rep);
                    }
                    c
                }
                None => return,
            },
        },
        None if !needs_draft => return,
        None if target.json.get("num_nextn_predict_layers").and_then(|v| v.as_u64()).unwrap_or(0) > 0 => return,
        None => {
            rep.add(
                Severity::Error,
                "draft-model",
                if sglang {
                    format!("--speculative-algorithm {algo} needs a draft model (--speculative-draft-model-path)")
                } else {
                    format!(
                        "speculative method {} needs a draft model (\"model\" in --speculative-config)",
                        algo.to_ascii_lowercase()
                    )
                },
                None,
            );
            return;
        }
    };
    let target_src = match (sglang, l.context_length, l.max_model_len) {
        (true, Some(c), _) => format!("--context-length {c}"),
        (false, _, Some(c)) => format!("--max-model-len {c}"),
        _ => tctx.how.clone(),
    };
    let dctx = draft.context(srv, ver);
    rep.draft_context = Some(dctx.value);
    if dctx.value < effective {
        let msg = format!(
            "the draft's context length {} ({}) is below the target's {} ({})",
            dctx.value, dctx.how, effective, target_src
        );
        let fix = Some(format!(
            "pass {} {} (<= the draft's), use a draft trained on a context of {}, or {}",
            if sglang { "--context-length" } else { "--max-model-len" },
            dctx.value,
            effective,
            if sglang {
                "set SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 and accept degraded speculation past the draft's window"
            } else {
                "accept that vLLM clamps the draft and speculation degrades past it"
            }
        ));
        if sglang {
            let allowed = allow_var(inp, srv, ver, rep);
            let old = derive::at_least(ver, &[0, 5, 1]) == Some(false);
            if allowed || old {
                rep.add(Severity::Warning, "draft-context", format!("{msg}; SGLang {} runs on with the draft overridden: speculation degrades past the draft's window{}", ver.unwrap_or("(unknown version)"), if old { " and 0.4.x risks illegal memory access at runtime (sglang#9388)" } else { "" }), fix);
            } else {
                let msg = format!("{msg}; SGLang >= 0.5.1 stops with `Target model's context_length ({effective}) is greater than the derived context_length ({})` after the target has loaded and captured its graphs", dctx.value);
                if ver.is_some() {
                    rep.add_confirmed("draft-context", msg, fix, evidence::SGLANG_DRAFT_CONTEXT);
                } else {
                    rep.add(Severity::Error, "draft-context", msg, fix);
                }
            }
        } else {
            rep.add(
                Severity::Warning,
                "draft-context",
                format!("{msg}; vLLM clamps the draft's max_model_len and speculation degrades past it"),
                fix,
            );
        }
    }
    if !sglang {
        check_vllm_spec(l, &algo, &target, &draft, effective, &dctx, rep);
    }
    check_draft_shape(srv, ver, &algo, &target, &draft, rep);
}

/// TP against the attention heads and KV heads. vLLM refuses `heads % tp != 0` before the model is built
/// (`ModelConfig.verify_with_parallel_config`, vllm/config/model.py; golden `#tp#` rows), for any
/// architecture. The attention layers of both servers then assert `heads % tp == 0` and, for the KV heads,
/// `kv % tp == 0` when `kv >= tp`, else `tp % kv == 0` (replicated): vLLM
/// vllm/model_executor/models/llama.py `LlamaAttention.__init__` (0.26.0 lines 142-152), SGLang
/// sglang/srt/models/llama.py (0.5.20 lines 159-169), and alike in every attention class of the golden
/// table's `#attn#` rows; those are confirmed for the architectures the rows cover (`derive::tp_rule_covered`).
fn check_tp_heads(l: &Launch, srv: Srv, target: &Config, rep: &mut Report) {
    let tp = l.tp;
    let Some(h) = target.u64(srv, "num_attention_heads").filter(|_| tp > 1) else { return };
    let kv = target.u64(srv, "num_key_value_heads");
    let arch = derive::attention_arch(srv, target.obj());
    let path = target.path.display();
    let layer = format!("{}'s attention layer", srv.name());
    // The first refusal the server meets: (rule, message, fix).
    let found = if !h.is_multiple_of(tp) {
        let said = match srv {
            Srv::Vllm => format!("vLLM raises `Total number of attention heads ({h}) must be divisible by tensor parallel size ({tp})` before loading"),
            Srv::Sglang => format!("{layer} asserts `total_num_heads % tp_size == 0` when it builds the model"),
        };
        Some((
            "tp-heads",
            format!("--tp {tp} does not divide num_attention_heads {h} ({path}): {said}"),
            format!("use a tensor-parallel size that divides {h}"),
        ))
    } else {
        match kv {
            Some(0) => Some(("tp-kv-heads", format!("num_key_value_heads is 0 ({path}): {layer} divides by it (`tp_size % total_num_kv_heads`) when it builds the model"), "set num_key_value_heads in config.json".to_string())),
            Some(kv) if kv >= tp && !kv.is_multiple_of(tp) => Some(("tp-kv-heads", format!("--tp {tp} does not divide num_key_value_heads {kv} ({path}): {layer} asserts `total_num_kv_heads % tp_size == 0` when it splits them, as it builds the model"), format!("use a tensor-parallel size that divides {kv} or is a multiple of it"))),
            Some(kv) if kv < tp && !tp.is_multiple_of(kv) => Some(("tp-kv-heads", format!("--tp {tp} is not a multiple of num_key_value_heads {kv} ({path}): {layer} asserts `tp_size % total_num_kv_heads == 0` when it replicates them, as it builds the model"), format!("use a tensor-parallel size that divides {kv} or is a multiple of it"))),
            // vLLM's GPT-OSS attention does not replicate KV heads: `num_local_key_value_heads =
            // config.num_key_value_heads // tp_size` (vllm/model_executor/models/gpt_oss.py:138 in 0.26.0), 0 when
            // kv < tp, and the Attention layer's `num_heads % num_kv_heads` then divides by zero
            // (vllm/model_executor/layers/attention/attention.py:330 in 0.26.0).
            Some(kv) if kv < tp && srv == Srv::Vllm && arch == "GptOssForCausalLM" => Some(("tp-kv-heads", format!("--tensor-parallel-size {tp} is above num_key_value_heads {kv} ({path}): vLLM's GPT-OSS attention gives each GPU {kv} // {tp} = 0 KV heads instead of replicating them, and its attention layer fails with ZeroDivisionError (`num_heads % num_kv_heads`) when it builds the model"), format!("use a tensor-parallel size of at most {kv}"))),
            _ => None,
        }
    };
    let Some((rule, msg, fix)) = found else { return };
    // SGLang with DP attention: some attention classes split over `attn_tp_size` (tp / dp), others over tp.
    if srv == Srv::Sglang && l.dp_attention && l.dp > 1 {
        let msg = format!("{msg}; with --enable-dp-attention the attention layers of some models split over tp/dp ({}) instead: not checked", tp / l.dp);
        return rep.add(Severity::Warning, rule, msg, Some(fix));
    }
    let by = if rule == "tp-heads" && srv == Srv::Vllm {
        Some(evidence::GOLDEN_VLLM_TP)
    } else {
        derive::tp_rule_covered(srv, &arch).then_some(evidence::GOLDEN_ATTENTION)
    };
    match by {
        Some(by) => add_refusal(rep, srv, rule, msg, Some(fix), by),
        None => rep.add(
            Severity::Error,
            rule,
            format!("{msg} (architecture {arch} is not among the golden table's attention layers: not confirmed)"),
            Some(fix),
        ),
    }
}

/// vLLM's SpeculativeConfig: `max_model_len` in the speculative config may not exceed the draft's or the
/// target's (`_maybe_override_draft_max_model_len`), and a `draft_model` needs the target's vocabulary
/// size (`verify_equal_vocab_size_if_draft_model`). Not in the golden table: unconfirmed errors.
fn check_vllm_spec(l: &Launch, algo: &str, target: &Config, draft: &Config, tlen: u64, dctx: &Ctx, rep: &mut Report) {
    let sc = l.spec_config.as_ref();
    if let Some(sm) = sc.and_then(|s| s.get("max_model_len")).and_then(|v| v.as_u64()) {
        if sm > dctx.value {
            rep.add(Severity::Error, "spec-max-model-len", format!("--speculative-config max_model_len {sm} is larger than the draft's {} ({}): vLLM raises `speculative_max_model_len=… cannot be larger than draft_max_model_len`", dctx.value, dctx.how), Some(format!("use max_model_len <= {}", dctx.value)));
        } else if sm > tlen {
            rep.add(Severity::Error, "spec-max-model-len", format!("--speculative-config max_model_len {sm} is larger than the target's {tlen}: vLLM raises `cannot be larger than target_max_model_len`"), Some(format!("use max_model_len <= {tlen}")));
        }
    }
    if algo == "DRAFT_MODEL"
        && !sc.and_then(|s| s.get("use_heterogeneous_vocab")).and_then(|v| v.as_bool()).unwrap_or(false)
    {
        if let (Some(tv), Some(dv)) = (target.u64(Srv::Vllm, "vocab_size"), draft.u64(Srv::Vllm, "vocab_size")) {
            if tv != dv {
                rep.add(Severity::Error, "draft-vocab", format!("vLLM draft_model: the target's vocab_size {tv} ({}) differs from the draft's {dv} ({}): vLLM raises `Target and draft model should have the same vocabulary size`", target.path.display(), draft.path.display()), Some("use a draft with the target's vocabulary size (the same tokenizer family and padding)".into()));
            }
        }
    }
}

/// The draft against the target: EAGLE-3 architecture, layers, hidden size, vocabulary.
fn check_draft_shape(srv: Srv, ver: Option<&str>, algo: &str, target: &Config, draft: &Config, rep: &mut Report) {
    let sglang = srv == Srv::Sglang;
    let darch = draft.arch();
    let eagle3 = algo == "EAGLE3";
    if eagle3 && !darch.to_ascii_lowercase().contains("eagle3") {
        if sglang {
            rep.add(
                Severity::Error,
                "draft-arch",
                format!(
                    "--speculative-algorithm EAGLE3 but the draft's architectures[0] is {darch} ({}): SGLang loads that class, not an EAGLE-3 head",
                    draft.path.display()
                ),
                Some("use an EAGLE-3 draft (LlamaForCausalLMEagle3) or the matching --speculative-algorithm".into()),
            );
        } else {
            rep.add(
                Severity::Info,
                "draft-arch",
                format!(
                    "the EAGLE-3 draft declares {darch} ({}): vLLM renames it to its EAGLE-3 class",
                    draft.path.display()
                ),
                None,
            );
        }
    }
    if algo == "EAGLE" && darch.contains("Eagle3") {
        rep.add(
            Severity::Error,
            "draft-arch",
            format!("speculative method EAGLE with an EAGLE-3 draft ({darch}, {})", draft.path.display()),
            Some(if sglang { "pass --speculative-algorithm EAGLE3" } else { "set \"method\": \"eagle3\"" }.into()),
        );
    }
    if eagle3 && sglang {
        if let Some(n) = draft.u64(srv, "num_hidden_layers").filter(|n| *n != 1) {
            let msg = format!(
                "an EAGLE-3 draft with num_hidden_layers {n} ({}): SGLang <= 0.5.11 raises `EAGLE3 currently only supports 1 layer`",
                draft.path.display()
            );
            match derive::at_least(ver, &[0, 5, 12]) {
                Some(true) => {}
                Some(false) => rep.add(
                    Severity::Error,
                    "eagle3-layers",
                    msg,
                    Some("use a 1-layer EAGLE-3 draft, or SGLang >= 0.5.12".into()),
                ),
                None => rep.add(
                    Severity::Warning,
                    "eagle3-layers",
                    format!("{msg}; newer releases load it; depends on the installed SGLang version (unknown)"),
                    None,
                ),
            }
        }
    }
    if eagle3 {
        let th = target.u64(srv, "hidden_size");
        let dh = draft
            .json
            .get("target_hidden_size")
            .and_then(|v| v.as_u64())
            .map(|v| (v, "target_hidden_size"))
            .or(draft.u64(srv, "hidden_size").map(|v| (v, "hidden_size")));
        if let (Some(th), Some((dh, key))) = (th, dh) {
            if th != dh {
                rep.add(
                    Severity::Error,
                    "draft-hidden",
                    format!(
                        "the draft's {key} {dh} ({}) differs from the target's hidden_size {th} ({})",
                        draft.path.display(),
                        target.path.display()
                    ),
                    Some("set target_hidden_size in the draft config, or use a draft trained for this target".into()),
                );
            }
        }
        if let (Some(dv), Some(tv)) =
            (draft.json.get("draft_vocab_size").and_then(|v| v.as_u64()), target.u64(srv, "vocab_size"))
        {
            if dv > tv {
                rep.add(
                    Severity::Error,
                    "draft-vocab",
                    format!("the draft's draft_vocab_size {dv} exceeds the target's vocab_size {tv}"),
                    None,
                );
            }
        }
    }
    if algo != "DRAFT_MODEL" {
        if let (Some(dv), Some(tv)) = (draft.u64(srv, "vocab_size"), target.u64(srv, "vocab_size")) {
            if dv != tv {
                rep.add(Severity::Warning, "draft-vocab", format!("the draft's vocab_size {dv} ({}) differs from the target's {tv} ({}): a different tokenizer family gives accept length ~1", draft.path.display(), target.path.display()), None);
            }
        }
    }
}

/// Partial files of `huggingface-cli download --local-dir DIR` (`DIR/.cache/huggingface/download/*.incomplete`).
fn check_incomplete_local(dir: &Path, rep: &mut Report) {
    let d = dir.join(".cache/huggingface/download");
    if let Ok(rd) = std::fs::read_dir(&d) {
        let inc =
            rd.flatten().take(100_000).filter(|e| e.file_name().to_string_lossy().ends_with(".incomplete")).count();
        if inc > 0 {
            rep.add(
                Severity::Error,
                "weights",
                format!("{inc} unfinished downloads (*.incomplete) in {}", d.display()),
                Some("finish the download (the same huggingface-cli download command resumes it)".into()),
            );
        }
    }
}

fn check_incomplete_blobs(repo: &Path, rep: &mut Report) {
    if let Ok(rd) = std::fs::read_dir(repo.join("blobs")) {
        let inc: Vec<String> = rd
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".incomplete"))
            .collect();
        if !inc.is_empty() {
            rep.add(
                Severity::Error,
                "weights",
                format!("{} unfinished downloads (*.incomplete) in {}", inc.len(), repo.join("blobs").display()),
                Some("finish or restart the download".into()),
            );
        }
    }
}

fn gguf_finding(path: &Path, rep: &mut Report) -> Option<gguf::GgufInfo> {
    // A FIFO or device would block or mislead the header read.
    if let Ok(m) = std::fs::metadata(path) {
        if !m.is_file() {
            rep.add(
                Severity::Info,
                "model-file",
                format!("{} is not a regular file: not inspected", path.display()),
                None,
            );
            return None;
        }
    }
    match gguf::read(path) {
        Ok(i) => Some(i),
        Err(gguf::GgufError::Io(e)) => {
            rep.add(
                Severity::Error,
                "model-file",
                format!("cannot read {}: {e}", path.display()),
                Some("check -m (a relative path resolves against the working directory)".into()),
            );
            None
        }
        Err(e) => {
            rep.add_confirmed(
                "model-file",
                format!("{}: {e}", path.display()),
                Some("download the model again and compare its size or sha256".into()),
                evidence::GGUF_REAL_SERVER,
            );
            None
        }
    }
}

fn check_gguf(inp: &Inputs, l: &Launch, rep: &mut Report) {
    let Some(m) = &l.model else {
        rep.add(
            Severity::Info,
            "model",
            "no -m: llama-server runs in router mode (models load on demand); nothing to inspect",
            None,
        );
        return;
    };
    let Some(t) = gguf_finding(&inp.cwd.join(m), rep) else {
        return;
    };
    if let (Some(c), Some(tc)) = (l.context_length, t.context_length) {
        if c > tc {
            rep.add(
                Severity::Warning,
                "context-length",
                format!("-c {c} exceeds the model's trained context {tc} ({m})"),
                Some(format!("use -c <= {tc}")),
            );
        }
    }
    let Some(d) = &l.draft else { return };
    if l.spec_type.is_none() && inp.local_machine {
        if let Some(default) = llama_spec_type_default(&l.program) {
            if default == "none" {
                rep.add(
                    Severity::Warning,
                    "spec-type",
                    format!("-md {d} without --spec-type: this llama-server build defaults --spec-type to none (its --help says so), so it loads the draft and does NO speculative decoding"),
                    Some("add --spec-type draft-simple (or the type your draft is for)".into()),
                );
            }
        }
    }
    let Some(di) = gguf_finding(&inp.cwd.join(d), rep) else {
        return;
    };
    let tv = (t.tokenizer_model.clone().unwrap_or_default(), t.vocab_size.unwrap_or(0));
    let dv = (di.tokenizer_model.clone().unwrap_or_default(), di.vocab_size.unwrap_or(0));
    if tv.0 != dv.0 || tv.1.abs_diff(dv.1) > 128 {
        rep.add(
            Severity::Warning,
            "draft-vocab",
            format!(
                "the draft's vocabulary ({} tokenizer, {} tokens, {d}) does not match the target's ({} tokenizer, {} tokens, {m}): llama-server logs `failed to initialize speculative decoding context` and runs WITHOUT speculative decoding",
                dv.0, dv.1, tv.0, tv.1
            ),
            Some("use a draft with the target's tokenizer".into()),
        );
    }
}

/// The default of `--spec-type` as this llama-server build's `--help` states it (`None`: the build has
/// no `--spec-type`, or the help could not be read within 5 s). Builds from mid-2026 default to `none`.
fn llama_spec_type_default(program: &str) -> Option<String> {
    let mut c = std::process::Command::new(program);
    c.arg("--help").stdin(std::process::Stdio::null());
    let o = procs::output_within(c, std::time::Duration::from_secs(5)).ok()?;
    let text = String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
    let i = text.find("--spec-type")?;
    let tail: String = text[i..].chars().take(800).filter(|c| !c.is_whitespace()).collect();
    let j = tail.find("(default:")? + "(default:".len();
    Some(tail[j..].split(')').next()?.to_string())
}

fn shm_bytes() -> Option<u64> {
    let c = std::ffi::CString::new("/dev/shm").ok()?;
    // SAFETY: statvfs into a struct we own.
    unsafe {
        let mut s: libc::statvfs = std::mem::zeroed();
        (libc::statvfs(c.as_ptr(), &mut s) == 0).then(|| s.f_blocks as u64 * s.f_frsize as u64)
    }
}

fn free_bytes(p: &Path) -> Option<u64> {
    let mut q = p.to_path_buf();
    while !q.exists() {
        q = q.parent()?.to_path_buf();
    }
    let c = std::ffi::CString::new(q.to_str()?).ok()?;
    // SAFETY: statvfs into a struct we own.
    unsafe {
        let mut s: libc::statvfs = std::mem::zeroed();
        (libc::statvfs(c.as_ptr(), &mut s) == 0).then(|| s.f_bavail as u64 * s.f_frsize as u64)
    }
}

fn check_env(inp: &Inputs, l: &Launch, server: Option<&str>, profiles: &vigil_core::Profiles, rep: &mut Report) {
    let port = l.port.or_else(|| server.and_then(|s| profiles.get(s)).map(|p| p.port));
    if let Some(p) = port {
        if !procs::port_free(p) {
            let holder = procs::port_holder_text(p);
            rep.add(
                Severity::Error,
                "port",
                format!("port {p} is taken by {holder}"),
                Some(format!("stop it (vigil down --pid, vigil ps) or choose another --port than {p}")),
            );
        }
    }
    let gpus_needed = l.gpus_per_node(server);
    let srv = match server {
        Some("vllm") => Some(Srv::Vllm),
        Some("sglang") => Some(Srv::Sglang),
        _ => None,
    };
    // The GPUs CUDA will show the server, against the layout asked for (check/machine.rs).
    let gpus = machine::read_gpus();
    machine::check_gpus(srv, l, inp.argv, inp.env, &gpus, rep);
    let smi = gpus.uuids.as_ref().map(|u| u.len() as u64);
    machine::check_net(inp.env, gpus_needed > 1 || l.nnodes > 1, rep);
    machine::check_caches(srv, inp.env, &free_bytes, rep);
    // GPU memory held by processes that are not this launch: memory the new server will not get.
    // (check/machine.rs said which GPU facts could not be read when there is no reader.)
    if let Some(s) = gpus.source.and_then(|_| crate::sources::gpu::Reader::open().and_then(|r| r.sample()).ok()) {
        if srv == Some(Srv::Vllm) {
            let free: Vec<(u32, u64, u64)> = s.gpus.iter().map(|g| (g.index, g.total_mib, g.used_mib)).collect();
            machine::check_vllm_free(&free, l.mem_fraction.unwrap_or(0.9), gpus_needed, rep);
        }
        {
            for p in &s.procs {
                let cmd = crate::sources::follow::cmdline(p.pid)
                    .map(|c| c.join(" "))
                    .unwrap_or_else(|| "a process of another pid namespace".into());
                rep.add(
                    Severity::Warning,
                    "gpu-foreign",
                    format!(
                        "GPU {}: pid {} ({}) already holds {} MiB",
                        p.gpu,
                        p.pid,
                        crate::sinks::redact::redact_cmdline(&cmd),
                        p.used_mib
                    ),
                    Some(format!("stop it first (`vigil down --pid {}`) if it is a leftover", p.pid)),
                );
            }
        }
    }
    // issue #17: Xid-prone hardware shows in NVML before a launch: ECC, remaps, PCIe, NVLink, P2P (warnings)
    crate::sources::gpu_health::check(env_get(inp.env, "CUDA_VISIBLE_DEVICES"), gpus_needed, smi.is_some(), rep);
    if gpus_needed > 1 {
        if let Some(b) = shm_bytes() {
            if b < 1 << 30 {
                rep.add(
                    Severity::Warning,
                    "shm",
                    format!(
                        "/dev/shm is {} MiB: NCCL between {gpus_needed} GPUs needs more (containers default to 64 MiB)",
                        b >> 20
                    ),
                    Some("docker run --shm-size 16g (or --ipc=host)".into()),
                );
            }
        }
    }
    if let Some(root) = &inp.state_root {
        if let Some(f) = free_bytes(root) {
            if f < 1 << 30 {
                rep.add(
                    Severity::Warning,
                    "disk",
                    format!("only {} MiB free for the run log under {}", f >> 20, root.display()),
                    None,
                );
            }
        }
    }
    // SAFETY: getrlimit into a struct we own.
    let nofile = unsafe {
        let mut r: libc::rlimit = std::mem::zeroed();
        (libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0).then_some(r.rlim_cur)
    };
    if let Some(n) = nofile {
        if n < 4096 {
            rep.add(
                Severity::Warning,
                "ulimit",
                format!("ulimit -n is {n}: servers open many sockets and files"),
                Some("ulimit -n 65536".into()),
            );
        }
    }
    let nccl: Vec<String> =
        inp.env.iter().filter(|(k, _)| k.starts_with("NCCL_")).map(|(k, v)| format!("{k}={v}")).collect();
    if !nccl.is_empty() {
        rep.add(Severity::Info, "nccl-env", format!("the server will see {}", nccl.join(" ")), None);
    }
}

/// The preflight gate of `vigil up` (local and over SSH): prints the report when it has errors and
/// says whether to refuse. Only confirmed errors refuse; the others are shown and the launch goes on,
/// with one line saying so.
pub fn gate(rep: &Report, json: bool, where_: &str) -> Option<String> {
    if rep.errors() == 0 {
        return None;
    }
    crate::sinks::tables::check(rep, json);
    let n = rep.blocking();
    if n > 0 {
        return Some(format!(
            "preflight check found {n} error(s){where_} that the server is known to refuse; not launching (--no-check to skip)"
        ));
    }
    eprintln!(
        "vigil: warning: preflight check found {} error(s){where_} not yet confirmed against the server's own code; launching anyway",
        rep.errors()
    );
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(j: Value) -> Config {
        Config { path: PathBuf::from("/x/config.json"), json: j }
    }

    #[test]
    fn llama31_is_131072_not_1048576() {
        let c = cfg(
            serde_json::json!({"max_position_embeddings": 131072, "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192, "rope_type": "llama3"}}),
        );
        assert_eq!(c.context(Srv::Sglang, None).value, 131072);
        assert_eq!(c.context(Srv::Vllm, None).value, 131072);
    }

    #[test]
    fn key_order_and_rope_factor() {
        let s = |j: Value| cfg(j).context(Srv::Sglang, None).value;
        assert_eq!(s(serde_json::json!({"seq_length": 4096, "max_position_embeddings": 32768})), 4096);
        assert_eq!(
            s(serde_json::json!({"max_position_embeddings": 4096, "rope_scaling": {"type": "linear", "factor": 4.0}})),
            16384
        );
        assert_eq!(
            s(serde_json::json!({"text_config": {"max_position_embeddings": 8192}, "max_position_embeddings": 1})),
            8192
        );
        assert_eq!(s(serde_json::json!({})), 2048);
    }

    #[test]
    fn versions() {
        use derive::version_tuple;
        assert!(version_tuple("0.4.10.post2") < vec![0, 5, 1]);
        assert!(version_tuple("0.5.1") >= vec![0, 5, 1]);
        assert!(version_tuple("0.5.23rc1") >= vec![0, 5, 1]);
    }
}
