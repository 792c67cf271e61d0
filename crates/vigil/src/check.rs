//! `vigil check -- CMD ARGS...`: catches config and environment errors before a GPU minute is spent.
//! Reads the command line of SGLang, vLLM or llama-server, the model configs (local directories or the
//! Hugging Face cache, never the network), GGUF headers, the installed server version (package
//! metadata, never an import) and the machine (ports, GPUs, /dev/shm, disk, ulimit, NCCL_*).

use crate::cli::CliError;
use crate::follow::arg_value;
use crate::gguf;
use crate::procs;
use crate::report::out_line;
use serde::Serialize;
use serde_json::Value;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Info,
    Warning,
    Error,
}

#[derive(Debug, Clone, Serialize)]
pub struct Finding {
    pub severity: Severity,
    pub rule: String,
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
    /// For an error: the evidence that the server itself refuses these inputs (a test against the real
    /// server, or the golden table of the server's own code). `None`: not confirmed, and `vigil up`
    /// treats the error as a warning and launches (the safety valve: a false refusal is the worst bug).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub confirmed: Option<&'static str>,
    /// The numbers behind a finding, for `--json` (the fit estimate's `weights_gib_per_gpu`, `kv_tokens`, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
}

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
}

#[derive(Default)]
pub struct Report {
    pub server: Option<String>,
    pub version: Option<String>,
    pub findings: Vec<Finding>,
}

impl Report {
    pub fn add(&mut self, severity: Severity, rule: &str, message: impl Into<String>, fix: Option<String>) {
        self.findings.push(Finding {
            severity,
            rule: rule.into(),
            message: message.into(),
            fix,
            confirmed: None,
            data: None,
        });
    }
    /// An error the server is known to refuse (see [`evidence`]): the only kind `vigil up` stops on.
    pub fn add_confirmed(&mut self, rule: &str, message: impl Into<String>, fix: Option<String>, by: &'static str) {
        self.findings.push(Finding {
            severity: Severity::Error,
            rule: rule.into(),
            message: message.into(),
            fix,
            confirmed: Some(by),
            data: None,
        });
    }
    pub fn errors(&self) -> usize {
        self.findings.iter().filter(|f| f.severity == Severity::Error).count()
    }
    /// Errors confirmed against the server: `vigil up` launches nothing when there is one.
    pub fn blocking(&self) -> usize {
        self.findings.iter().filter(|f| f.severity == Severity::Error && f.confirmed.is_some()).count()
    }
    pub fn warnings(&self) -> usize {
        self.findings.iter().filter(|f| f.severity == Severity::Warning).count()
    }
}

/// A model config read from disk.
pub struct Config {
    pub path: PathBuf,
    pub json: Value,
}

impl Config {
    /// The text config SGLang uses (`get_hf_text_config`): `text_config`, else `language_config`, else the config.
    fn text(&self) -> &Value {
        let j = &self.json;
        if j.get("text_config").is_some_and(|t| t.is_object()) {
            &j["text_config"]
        } else if j.get("language_config").is_some_and(|t| t.is_object()) {
            &j["language_config"]
        } else {
            j
        }
    }
    fn u64(&self, k: &str) -> Option<u64> {
        self.text().get(k).and_then(|v| v.as_u64()).or_else(|| self.json.get(k).and_then(|v| v.as_u64()))
    }
    fn arch(&self) -> String {
        self.json["architectures"][0].as_str().unwrap_or("?").to_string()
    }
}

/// A derived context length and how it was derived (for the message).
#[derive(Debug, Clone, PartialEq)]
pub struct Ctx {
    pub value: u64,
    pub how: String,
}

/// SGLang `hf_transformers_utils.get_context_length(get_hf_text_config(config))`: the first of
/// max_sequence_length, seq_length, max_seq_len, model_max_length, max_position_embeddings; times the
/// rope-scaling factor, except when the scaling names `original_max_position_embeddings` or is
/// `rope_type: llama3`; 2048 when none is set.
pub fn sglang_context(c: &Config) -> Ctx {
    let t = c.text();
    let rs = t.get("rope_scaling").filter(|r| r.is_object() && !r.as_object().unwrap().is_empty());
    let (factor, why) = match rs {
        None => (1.0, String::new()),
        Some(r) => {
            let f = r.get("factor").and_then(|f| f.as_f64()).unwrap_or(1.0);
            if r.get("original_max_position_embeddings").is_some() {
                (1.0, ", rope_scaling factor not applied (it has original_max_position_embeddings)".to_string())
            } else if r.get("rope_type").and_then(|x| x.as_str()) == Some("llama3") {
                (1.0, ", rope_scaling factor not applied (rope_type llama3)".to_string())
            } else {
                (f, format!(" × rope_scaling factor {f}"))
            }
        }
    };
    for k in ["max_sequence_length", "seq_length", "max_seq_len", "model_max_length", "max_position_embeddings"] {
        if let Some(v) = t.get(k).and_then(|v| v.as_f64()) {
            return Ctx { value: (factor * v) as u64, how: format!("{} {k} = {}{why}", c.path.display(), v as u64) };
        }
    }
    Ctx { value: 2048, how: format!("{}: no length key, SGLang's default 2048", c.path.display()) }
}

/// vLLM `_get_and_verify_max_len` (as recalled from vllm/config: the minimum of the length keys present,
/// rope scaling applied except for su/longrope/llama3; YaRN from original_max_position_embeddings).
pub fn vllm_context(c: &Config) -> Ctx {
    let t = c.text();
    let keys = [
        "max_position_embeddings",
        "n_positions",
        "max_seq_len",
        "seq_length",
        "model_max_length",
        "max_sequence_length",
        "max_seq_length",
        "seq_len",
    ];
    let mut best: Option<(u64, &str)> = None;
    for k in keys {
        if let Some(v) = t.get(k).and_then(|v| v.as_u64()) {
            if best.is_none_or(|(b, _)| v < b) {
                best = Some((v, k));
            }
        }
    }
    let Some((mut v, key)) = best else {
        return Ctx { value: 2048, how: format!("{}: no length key, vLLM's default 2048", c.path.display()) };
    };
    let mut how = format!("{} {key} = {v}", c.path.display());
    if let Some(r) = t.get("rope_scaling").filter(|r| r.is_object()) {
        let ty = r.get("rope_type").or_else(|| r.get("type")).and_then(|x| x.as_str()).unwrap_or("");
        if !matches!(ty, "su" | "longrope" | "llama3") {
            if let Some(f) = r.get("factor").and_then(|f| f.as_f64()) {
                if ty == "yarn" {
                    if let Some(o) = r.get("original_max_position_embeddings").and_then(|o| o.as_u64()) {
                        v = o;
                        how = format!("{} original_max_position_embeddings = {o}", c.path.display());
                    }
                }
                v = (v as f64 * f) as u64;
                how.push_str(&format!(" × rope_scaling factor {f}"));
            }
        }
    }
    Ctx { value: v, how }
}

/// What the command line says.
#[derive(Debug, Default)]
pub struct Launch {
    pub program: String,
    pub model: Option<String>,
    pub draft: Option<String>,
    pub spec_algo: Option<String>,
    pub spec_config: Option<Value>,
    pub context_length: Option<u64>,
    pub max_model_len: Option<u64>,
    pub tp: u64,
    pub dp: u64,
    pub pp: u64,
    pub port: Option<u16>,
    pub mem_fraction: Option<f64>,
}

fn first<'a>(argv: &'a [String], flags: &[&str]) -> Option<&'a str> {
    flags.iter().find_map(|f| arg_value(argv, f))
}

pub fn parse_launch(argv: &[String], server: Option<&str>) -> Result<Launch, CliError> {
    let mut l = Launch { program: argv.first().cloned().unwrap_or_default(), tp: 1, dp: 1, pp: 1, ..Launch::default() };
    let num = |f: &[&str]| -> Result<Option<u64>, CliError> {
        match first(argv, f) {
            None => Ok(None),
            Some(v) => {
                v.parse::<u64>().map(Some).map_err(|_| CliError::usage(format!("{}: not a number: '{v}'", f[0])))
            }
        }
    };
    match server {
        Some("sglang") => {
            l.model = first(argv, &["--model-path", "--model"]).map(String::from);
            l.draft = first(argv, &["--speculative-draft-model-path", "--speculative-draft-model"]).map(String::from);
            l.spec_algo = first(argv, &["--speculative-algorithm"]).map(|s| s.to_ascii_uppercase());
            l.context_length = num(&["--context-length"])?;
            l.tp = num(&["--tp", "--tp-size", "--tensor-parallel-size"])?.unwrap_or(1);
            l.dp = num(&["--dp", "--dp-size", "--data-parallel-size"])?.unwrap_or(1);
            l.pp = num(&["--pp", "--pp-size", "--pipeline-parallel-size"])?.unwrap_or(1);
            l.mem_fraction = first(argv, &["--mem-fraction-static"]).and_then(|v| v.parse().ok());
        }
        Some("vllm") => {
            // `vllm serve MODEL` or --model
            l.model = first(argv, &["--model"]).map(String::from).or_else(|| {
                argv.iter()
                    .position(|a| a == "serve")
                    .and_then(|i| argv.get(i + 1))
                    .filter(|m| !m.starts_with('-'))
                    .cloned()
            });
            l.max_model_len = num(&["--max-model-len"])?;
            l.tp = num(&["-tp", "--tensor-parallel-size"])?.unwrap_or(1);
            l.pp = num(&["-pp", "--pipeline-parallel-size"])?.unwrap_or(1);
            l.dp = num(&["-dp", "--data-parallel-size"])?.unwrap_or(1);
            l.mem_fraction = first(argv, &["--gpu-memory-utilization"]).and_then(|v| v.parse().ok());
            if let Some(sc) = first(argv, &["--speculative-config", "--speculative_config"]) {
                let v: Value = serde_json::from_str(sc)
                    .map_err(|e| CliError::usage(format!("--speculative-config is not valid JSON: {e}")))?;
                l.draft = v.get("model").and_then(|m| m.as_str()).map(String::from);
                l.spec_algo = v.get("method").and_then(|m| m.as_str()).map(|s| s.to_ascii_uppercase());
                l.spec_config = Some(v);
            }
        }
        Some("llama-cpp") => {
            l.model = first(argv, &["-m", "--model"]).map(String::from);
            l.draft = first(argv, &["-md", "--model-draft", "--spec-draft-model"]).map(String::from);
            l.context_length = num(&["-c", "--ctx-size"])?;
        }
        _ => {}
    }
    l.port = first(argv, &["--port"]).and_then(|p| p.parse().ok());
    Ok(l)
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

/// A model argument → a local directory: the path itself, or the newest snapshot in the HF cache.
pub(crate) fn resolve_model(m: &str, cwd: &Path) -> Result<(PathBuf, Option<PathBuf>), Unresolved> {
    let p = cwd.join(m);
    if p.exists() {
        return Ok((p, None));
    }
    let path_like = m.starts_with('/') || m.starts_with("./") || m.starts_with("../") || m.starts_with('~');
    if !path_like && m.matches('/').count() <= 1 {
        let name = format!("models--{}", m.replace('/', "--"));
        for c in hf_cache_dirs() {
            let repo = c.join(&name);
            let snaps = repo.join("snapshots");
            if let Ok(rd) = std::fs::read_dir(&snaps) {
                let mut s: Vec<PathBuf> = rd.flatten().map(|e| e.path()).collect();
                s.sort_by_key(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok());
                if let Some(last) = s.pop() {
                    return Ok((last, Some(repo)));
                }
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
                ["HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"].iter().find(|k| env_get(env, k).is_some_and(env_true));
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

/// A boolean environment value as the servers read them. vLLM's `envs.py` takes `1` and `true`; SGLang's
/// `get_bool_env_var` takes `true` and `1`, and recent releases also `yes` and `y` (case-insensitive). The
/// widest set is taken: reading a value as "set" can only turn an error into a warning, never refuse.
fn env_true(v: &str) -> bool {
    matches!(v.trim().to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "y")
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

fn version_tuple(v: &str) -> Vec<u64> {
    v.split(['.', '+', '-', 'r', 'p'])
        .take(3)
        .map(|x| x.chars().take_while(|c| c.is_ascii_digit()).collect::<String>().parse().unwrap_or(0))
        .collect()
}

pub struct Inputs<'a> {
    pub argv: &'a [String],
    pub server: Option<String>,
    pub env: &'a [(String, String)],
    pub cwd: &'a Path,
    /// Check this machine too (ports, GPUs, /dev/shm, disk, the interpreter's packages); off when
    /// the server runs elsewhere (`check --host`: the model files are a local mirror).
    pub local_machine: bool,
}

fn env_get<'a>(env: &'a [(String, String)], k: &str) -> Option<&'a str> {
    env.iter().find(|(ek, _)| ek == k).map(|(_, v)| v.as_str())
}

pub fn check(inp: &Inputs, profiles: &vigil_core::Profiles) -> Result<Report, CliError> {
    let mut rep = Report::default();
    let server = inp.server.clone().or_else(|| profiles.detect_cmd(inp.argv).map(String::from));
    rep.server = server.clone();
    let l = parse_launch(inp.argv, server.as_deref())?;
    if server.is_none() {
        rep.add(
            Severity::Info,
            "server",
            "server kind not recognised from the command line: only environment checks ran",
            None,
        );
    }
    let path_env = env_get(inp.env, "PATH").unwrap_or("/usr/bin:/bin").to_string();
    // Server version from package metadata.
    let pkg = match server.as_deref() {
        Some("sglang") => Some("sglang"),
        Some("vllm") => Some("vllm"),
        _ => None,
    };
    if let Some(pkg) = pkg.filter(|_| inp.local_machine) {
        let v = interpreter(&l.program, &path_env).and_then(|i| package_version(&i, pkg));
        match &v {
            Some(v) => {
                rep.add(Severity::Info, "version", format!("{pkg} {v} (from its installed package metadata)"), None)
            }
            None => rep.add(
                Severity::Info,
                "version",
                format!(
                    "{pkg} version unknown (no package metadata beside the interpreter): assuming the newest behaviour"
                ),
                None,
            ),
        }
        rep.version = v;
    }
    match server.as_deref() {
        Some("sglang") | Some("vllm") => check_hf(inp, &l, &mut rep),
        Some("llama-cpp") => check_gguf(inp, &l, &mut rep),
        _ => {}
    }
    // Will it fit? (issue #13 item 5; warnings at most: crates/vigil/src/fit.rs).
    crate::fit::add_findings(inp, &l, server.as_deref(), &mut rep);
    if inp.local_machine {
        check_env(inp, &l, server.as_deref(), profiles, &mut rep);
    }
    Ok(rep)
}

fn check_hf(inp: &Inputs, l: &Launch, rep: &mut Report) {
    let sglang = rep.server.as_deref() == Some("sglang");
    let Some(m) = &l.model else {
        rep.add(Severity::Error, "model", "no model given (--model-path / vllm serve MODEL)", None);
        return;
    };
    let (d, repo) = match resolve_model(m, inp.cwd) {
        Ok(x) => x,
        Err(u) => return report_unresolved(u, "model", inp.env, rep),
    };
    if let Some(repo) = &repo {
        check_incomplete_blobs(repo, rep);
    }
    check_shards(&d, rep);
    let target = match load_config(&d) {
        Ok(c) => c,
        Err(e) => {
            rep.add(Severity::Error, "model", e, None);
            return;
        }
    };
    let tctx = if sglang { sglang_context(&target) } else { vllm_context(&target) };
    rep.add(Severity::Info, "context", format!("target context {} ({})", tctx.value, tctx.how), None);
    // TP must divide heads.
    if let Some(h) = target.u64("num_attention_heads") {
        if l.tp > 1 && !h.is_multiple_of(l.tp) {
            rep.add(
                Severity::Error,
                "tp-heads",
                format!("--tp {} does not divide num_attention_heads {h} ({})", l.tp, target.path.display()),
                Some(format!("use a tensor-parallel size that divides {h}")),
            );
        }
        if let Some(kv) = target.u64("num_key_value_heads") {
            if l.tp > 1 && !kv.is_multiple_of(l.tp) && !l.tp.is_multiple_of(kv) {
                rep.add(Severity::Error, "tp-kv-heads", format!("--tp {} neither divides num_key_value_heads {kv} nor is a multiple of it (KV heads cannot be split or replicated evenly)", l.tp), Some(format!("use a tensor-parallel size that divides {kv} or is a multiple of it")));
            }
        }
    }
    // vLLM --max-model-len against the model.
    if !sglang {
        if let Some(mml) = l.max_model_len {
            if mml > tctx.value && !env_get(inp.env, "VLLM_ALLOW_LONG_MAX_MODEL_LEN").is_some_and(env_true) {
                rep.add(Severity::Error, "max-model-len", format!("--max-model-len {mml} exceeds the model's context {} ({})", tctx.value, tctx.how), Some(format!("use --max-model-len <= {}, or set VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 if you know the model extrapolates", tctx.value)));
            }
        }
    } else if let Some(cl) = l.context_length {
        if cl > tctx.value && !env_get(inp.env, "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN").is_some_and(env_true) {
            rep.add(
                Severity::Error,
                "context-length",
                format!("--context-length {cl} exceeds the model's derived context {} ({})", tctx.value, tctx.how),
                Some(format!("use --context-length <= {}", tctx.value)),
            );
        }
    }
    // Speculative decoding.
    let Some(algo) = l.spec_algo.clone() else {
        return;
    };
    let mtp = matches!(algo.as_str(), "NEXTN" | "MTP" | "DEEPSEEK_MTP")
        || target.json.get("num_nextn_predict_layers").and_then(|v| v.as_u64()).unwrap_or(0) > 0 && l.draft.is_none();
    let draft = match &l.draft {
        Some(d) => match resolve_model(d, inp.cwd) {
            Err(u) => return report_unresolved(u, "draft-model", inp.env, rep),
            Ok((p, _)) => match load_config(&p) {
                Ok(c) => c,
                Err(e) => {
                    rep.add(Severity::Error, "draft-model", e, None);
                    return;
                }
            },
        },
        None if mtp || algo == "NGRAM" => return,
        None => {
            rep.add(
                Severity::Error,
                "draft-model",
                format!("--speculative-algorithm {algo} needs a draft model (--speculative-draft-model-path)"),
                None,
            );
            return;
        }
    };
    let effective_target =
        if sglang { l.context_length.unwrap_or(tctx.value) } else { l.max_model_len.unwrap_or(tctx.value) };
    let target_src = if sglang {
        match l.context_length {
            Some(c) => format!("--context-length {c}"),
            None => tctx.how.clone(),
        }
    } else {
        match l.max_model_len {
            Some(c) => format!("--max-model-len {c}"),
            None => tctx.how.clone(),
        }
    };
    let dctx = if sglang { sglang_context(&draft) } else { vllm_context(&draft) };
    if dctx.value < effective_target {
        let msg = format!(
            "the draft's context length {} ({}) is below the target's {} ({})",
            dctx.value, dctx.how, effective_target, target_src
        );
        let fix = Some(format!(
            "pass {} {} (<= the draft's), use a draft trained on a context of {}, or {}",
            if sglang { "--context-length" } else { "--max-model-len" },
            dctx.value,
            effective_target,
            if sglang {
                "set SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 and accept degraded speculation past the draft's window"
            } else {
                "accept that vLLM clamps the draft and speculation degrades past it"
            }
        ));
        if sglang {
            let allowed = env_get(inp.env, "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN").is_some_and(env_true);
            let old = rep.version.as_deref().is_some_and(|v| version_tuple(v) < vec![0, 5, 1]);
            if allowed || old {
                rep.add(Severity::Warning, "draft-context", format!("{msg}; SGLang {} runs on with the draft overridden: speculation degrades past the draft's window{}", rep.version.clone().unwrap_or_else(|| "(unknown version)".into()), if old { " and 0.4.x risks illegal memory access at runtime (sglang#9388)" } else { "" }), fix);
            } else {
                let msg = format!("{msg}; SGLang >= 0.5.1 stops with `Target model's context_length ... is greater than the derived context_length` after the target has loaded and captured its graphs");
                if rep.version.is_some() {
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
    let darch = draft.arch();
    let eagle3 = algo == "EAGLE3";
    if eagle3 && !darch.contains("Eagle3") && !darch.to_ascii_lowercase().contains("eagle3") {
        rep.add(
            Severity::Error,
            "draft-arch",
            format!(
                "--speculative-algorithm EAGLE3 but the draft's architectures[0] is {darch} ({})",
                draft.path.display()
            ),
            Some("use an EAGLE-3 draft (LlamaForCausalLMEagle3) or the matching --speculative-algorithm".into()),
        );
    }
    if algo == "EAGLE" && darch.contains("Eagle3") {
        rep.add(
            Severity::Error,
            "draft-arch",
            format!("--speculative-algorithm EAGLE with an EAGLE-3 draft ({darch}, {})", draft.path.display()),
            Some("pass --speculative-algorithm EAGLE3".into()),
        );
    }
    if eagle3 {
        if let Some(n) = draft.u64("num_hidden_layers") {
            if n != 1 {
                rep.add(
                    Severity::Error,
                    "eagle3-layers",
                    format!(
                        "an EAGLE-3 draft must have exactly 1 hidden layer; {} has num_hidden_layers {n}",
                        draft.path.display()
                    ),
                    Some("SGLang raises `EAGLE3 currently only supports 1 layer`: use a 1-layer EAGLE-3 draft".into()),
                );
            }
        }
        let th = target.u64("hidden_size");
        let dh = draft
            .json
            .get("target_hidden_size")
            .and_then(|v| v.as_u64())
            .map(|v| (v, "target_hidden_size"))
            .or(draft.u64("hidden_size").map(|v| (v, "hidden_size")));
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
            (draft.json.get("draft_vocab_size").and_then(|v| v.as_u64()), target.u64("vocab_size"))
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
    if let (Some(dv), Some(tv)) = (draft.u64("vocab_size"), target.u64("vocab_size")) {
        if dv != tv {
            rep.add(Severity::Warning, "draft-vocab", format!("the draft's vocab_size {dv} ({}) differs from the target's {tv} ({}): a different tokenizer family gives accept length ~1", draft.path.display(), target.path.display()), None);
        }
    }
}

fn check_shards(dir: &Path, rep: &mut Report) {
    let idx = dir.join("model.safetensors.index.json");
    let Ok(text) = procs::read_small(&idx, 64 << 20).map(|b| String::from_utf8_lossy(&b).into_owned()) else {
        return;
    };
    let Ok(v) = serde_json::from_str::<Value>(&text) else {
        rep.add(Severity::Error, "weights", format!("{} is not valid JSON", idx.display()), None);
        return;
    };
    let mut shards: Vec<String> = v["weight_map"]
        .as_object()
        .map(|m| m.values().filter_map(|s| s.as_str().map(String::from)).collect())
        .unwrap_or_default();
    shards.sort();
    shards.dedup();
    let mut missing = Vec::new();
    let mut empty = Vec::new();
    for s in &shards {
        match std::fs::metadata(dir.join(s)) {
            Err(_) => missing.push(s.clone()),
            Ok(m) if m.len() < 16 => empty.push(s.clone()),
            _ => {}
        }
    }
    if !missing.is_empty() {
        rep.add(
            Severity::Error,
            "weights",
            format!(
                "{} of {} shards named in {} are missing: {}",
                missing.len(),
                shards.len(),
                idx.display(),
                missing.iter().take(5).cloned().collect::<Vec<_>>().join(", ")
            ),
            Some("finish the download (huggingface-cli download …) before launching".into()),
        );
    }
    if !empty.is_empty() {
        rep.add(Severity::Error, "weights", format!("shards too small to be weights: {}", empty.join(", ")), None);
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
    let gpus_needed = l.tp * l.pp * l.dp;
    let visible =
        env_get(inp.env, "CUDA_VISIBLE_DEVICES").map(|v| v.split(',').filter(|x| !x.trim().is_empty()).count() as u64);
    let mut smi = std::process::Command::new("nvidia-smi");
    smi.args(["--query-gpu=index", "--format=csv,noheader"]);
    let smi = procs::output_within(smi, crate::gpu::SMI_TIMEOUT)
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).lines().count() as u64);
    match (visible, smi) {
        (Some(v), _) if v < gpus_needed => rep.add(
            Severity::Error,
            "gpus",
            format!("TP×PP×DP = {gpus_needed} GPUs needed, CUDA_VISIBLE_DEVICES shows {v}"),
            Some("widen CUDA_VISIBLE_DEVICES or lower --tp/--dp".into()),
        ),
        (None, Some(n)) if n < gpus_needed => rep.add(
            Severity::Error,
            "gpus",
            format!("TP×PP×DP = {gpus_needed} GPUs needed, nvidia-smi shows {n}"),
            None,
        ),
        _ => {}
    }
    // GPU memory held by processes that are not this launch: memory the new server will not get.
    match crate::gpu::Reader::open().and_then(|r| r.sample()) {
        Ok(s) => {
            for p in &s.procs {
                let cmd = crate::follow::cmdline(p.pid)
                    .map(|c| c.join(" "))
                    .unwrap_or_else(|| "a process of another pid namespace".into());
                rep.add(
                    Severity::Warning,
                    "gpu-foreign",
                    format!(
                        "GPU {}: pid {} ({}) already holds {} MiB",
                        p.gpu,
                        p.pid,
                        crate::run::redact_cmdline(&cmd),
                        p.used_mib
                    ),
                    Some(format!("stop it first (`vigil down --pid {}`) if it is a leftover", p.pid)),
                );
            }
            let n = s.gpus.len() as u64;
            if smi.is_none() && visible.is_none() && n < gpus_needed {
                rep.add(
                    Severity::Error,
                    "gpus",
                    format!("TP×PP×DP = {gpus_needed} GPUs needed, {} shows {n}", s.source),
                    None,
                );
            }
        }
        Err(why) => rep.add(Severity::Info, "gpus", why, None),
    }
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
    if let Ok(root) = crate::run::state_root() {
        if let Some(f) = free_bytes(&root) {
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
    print(rep, json);
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

pub fn print(rep: &Report, json: bool) {
    if json {
        let v = serde_json::json!({"event": "check", "server": rep.server, "version": rep.version, "findings": rep.findings, "errors": rep.errors(), "blocking": rep.blocking(), "warnings": rep.warnings()});
        out_line(&v.to_string());
        return;
    }
    for f in &rep.findings {
        let tag = match f.severity {
            Severity::Error if f.confirmed.is_none() => "ERROR?",
            Severity::Error => "ERROR",
            Severity::Warning => "WARN  ",
            Severity::Info => "info  ",
        };
        out_line(&format!("{tag} [{}] {}", f.rule, f.message));
        if let Some(fix) = &f.fix {
            out_line(&format!("      fix: {fix}"));
        }
    }
    let unconfirmed = rep.errors() - rep.blocking();
    out_line(&format!(
        "vigil check: {} error(s){}, {} warning(s)",
        rep.errors(),
        if unconfirmed > 0 {
            format!(" ({unconfirmed} marked ERROR? not confirmed against the server: `vigil up` launches anyway)")
        } else {
            String::new()
        },
        rep.warnings()
    ));
}

pub fn run(
    argv: Vec<String>,
    server: Option<String>,
    json: bool,
    profiles: &vigil_core::Profiles,
) -> Result<i32, CliError> {
    if argv.is_empty() {
        return Err(CliError::usage("check: give the server command after --"));
    }
    let env: Vec<(String, String)> = std::env::vars_os()
        .map(|(k, v)| (k.to_string_lossy().into_owned(), v.to_string_lossy().into_owned()))
        .collect();
    let cwd = std::env::current_dir().map_err(|e| CliError::usage(e.to_string()))?;
    let rep = check(&Inputs { argv: &argv, server, env: &env, cwd: &cwd, local_machine: true }, profiles)?;
    print(&rep, json);
    Ok(if rep.errors() > 0 { crate::exit::CHECK_FAILED } else { crate::exit::READY })
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
        assert_eq!(sglang_context(&c).value, 131072);
        assert_eq!(vllm_context(&c).value, 131072);
    }

    #[test]
    fn key_order_and_rope_factor() {
        let c = cfg(serde_json::json!({"seq_length": 4096, "max_position_embeddings": 32768}));
        assert_eq!(sglang_context(&c).value, 4096, "seq_length is read before max_position_embeddings");
        let c = cfg(
            serde_json::json!({"max_position_embeddings": 4096, "rope_scaling": {"type": "linear", "factor": 4.0}}),
        );
        assert_eq!(sglang_context(&c).value, 16384);
        let c =
            cfg(serde_json::json!({"text_config": {"max_position_embeddings": 8192}, "max_position_embeddings": 1}));
        assert_eq!(sglang_context(&c).value, 8192, "hf_text_config");
        assert_eq!(sglang_context(&cfg(serde_json::json!({}))).value, 2048);
    }

    #[test]
    fn versions() {
        assert!(version_tuple("0.4.10.post2") < vec![0, 5, 1]);
        assert!(version_tuple("0.5.1") >= vec![0, 5, 1]);
        assert!(version_tuple("0.5.23rc1") >= vec![0, 5, 1]);
    }
}
