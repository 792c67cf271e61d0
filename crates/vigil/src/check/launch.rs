//! What a server command line says: every place a model can be named (`--model-path`, `--model`, the
//! positional `vllm serve MODEL` anywhere among the options, a `--config FILE.yaml`), the length flags
//! (human-readable, per server and version), parallelism, overrides and speculative decoding.

use super::derive::{self, Parsed, Srv};
use crate::error::CliError;
use crate::sources::follow::arg_value;
use crate::sources::procs;
use serde_json::Value;
use std::path::Path;

/// What the command line says.
#[derive(Debug, Default)]
pub struct Launch {
    /// The program (llama-server: asked for its `--help`).
    pub program: String,
    pub model: Option<String>,
    pub draft: Option<String>,
    pub spec_algo: Option<String>,
    pub spec_config: Option<Value>,
    /// `--context-length` (SGLang) / `-c` (llama-server), as the server parses it.
    pub context_length: Option<u64>,
    /// vLLM `--max-model-len` (`None` also for `auto`/`-1`: the derived length).
    pub max_model_len: Option<u64>,
    /// A length flag the server refuses to parse (argparse exits 2): the message.
    pub bad_len: Option<String>,
    /// A length flag whose reading depends on the installed version: the note.
    pub len_note: Option<String>,
    pub tp: u64,
    pub dp: u64,
    pub pp: u64,
    /// SGLang `--enable-dp-attention`: DP ranks share the TP group's GPUs.
    pub dp_attention: bool,
    /// vLLM `--data-parallel-size-local`: the DP ranks on this node.
    pub dp_local: Option<u64>,
    pub nnodes: u64,
    pub trust_remote_code: bool,
    /// `--json-model-override-args` (SGLang) / `--hf-overrides` (vLLM): applied to the config first.
    pub overrides: Option<Value>,
    /// llama-server `--spec-type` (or `--spec-default`).
    pub spec_type: Option<String>,
    pub port: Option<u16>,
    pub mem_fraction: Option<f64>,
    /// Notes about the command line itself (a `--config` file that could not be read, ...).
    pub notes: Vec<String>,
}

impl Launch {
    /// GPUs this node needs: TP×PP, times DP unless SGLang's attention DP shares them (vLLM's DP always
    /// multiplies; `--data-parallel-size-local` is the DP on this node), divided over `--nnodes`.
    pub fn gpus_per_node(&self, server: Option<&str>) -> u64 {
        let sglang = server == Some("sglang");
        let (dp, nodes) = match (sglang, self.dp_local) {
            (true, _) if self.dp_attention => (1, self.nnodes.max(1)),
            (false, Some(local)) => (local, 1),
            _ => (self.dp, self.nnodes.max(1)),
        };
        let world = self.tp * self.pp * dp;
        world.div_ceil(nodes).max(1)
    }
    /// How `gpus_per_node` was counted, for messages.
    pub fn gpus_how(&self, server: Option<&str>) -> String {
        let sglang = server == Some("sglang");
        let mut s = format!("TP {} × PP {}", self.tp, self.pp);
        if sglang && self.dp_attention {
            s.push_str(&format!(" (DP {} is attention DP: no extra GPUs)", self.dp));
        } else if let (false, Some(l)) = (sglang, self.dp_local) {
            s.push_str(&format!(" × local DP {l}"));
        } else if self.dp > 1 {
            s.push_str(&format!(" × DP {}", self.dp));
        }
        if self.nnodes > 1 && (sglang || self.dp_local.is_none()) {
            s.push_str(&format!(" over {} nodes", self.nnodes));
        }
        s
    }
}

fn first<'a>(argv: &'a [String], flags: &[&str]) -> Option<&'a str> {
    flags.iter().find_map(|f| arg_value(argv, f))
}

fn has(argv: &[String], flags: &[&str]) -> bool {
    argv.iter().any(|a| flags.contains(&a.as_str()))
}

/// Flags that take no value (so the token after one may be the positional model).
fn is_switch(flag: &str) -> bool {
    let f = flag.trim_start_matches('-');
    f.starts_with("enable-")
        || f.starts_with("disable-")
        || f.starts_with("no-")
        || matches!(
            f,
            "trust-remote-code"
                | "enforce-eager"
                | "headless"
                | "skip-tokenizer-init"
                | "async-scheduling"
                | "fully-sharded-loras"
                | "use-tqdm-on-load"
                | "return-tokens-as-token-ids"
                | "allow-credentials"
                | "log-requests"
                | "help"
        )
}

/// `vllm serve [OPTIONS] MODEL [OPTIONS]`: the first token after `serve` that is neither an option nor
/// an option's value.
fn positional_after(argv: &[String], word: &str) -> Option<String> {
    let i = argv.iter().position(|a| a == word)?;
    let mut k = i + 1;
    while k < argv.len() {
        let a = &argv[k];
        if a.starts_with('-') && a.len() > 1 {
            k += if a.contains('=') || is_switch(a) { 1 } else { 2 };
            continue;
        }
        return Some(a.clone());
    }
    None
}

/// The vLLM spelling of options: `--foo_bar` → `--foo-bar` (vLLM's parser accepts both).
fn dashed(argv: &[String]) -> Vec<String> {
    argv.iter()
        .map(|a| match a.strip_prefix("--") {
            Some(rest) => {
                let (k, v) = rest.split_once('=').map(|(k, v)| (k, Some(v))).unwrap_or((rest, None));
                let k = k.replace('_', "-");
                match v {
                    Some(v) => format!("--{k}={v}"),
                    None => format!("--{k}"),
                }
            }
            None => a.clone(),
        })
        .collect()
}

/// The largest `--config` file read.
const MAX_YAML_BYTES: u64 = 1 << 20;

/// `--config FILE.yaml` (vLLM and SGLang): its top-level `key: value` pairs as options, placed after
/// the command line's own (the command line wins, as in both servers). Scalars, `true` switches,
/// inline lists and maps (`{...}` / `[...]`), and one level of nested block maps (as JSON).
fn config_file_args(path: &Path, notes: &mut Vec<String>) -> Vec<String> {
    let text = match procs::read_small(path, MAX_YAML_BYTES) {
        Ok(b) => String::from_utf8_lossy(&b).into_owned(),
        Err(e) => {
            notes.push(format!("--config {}: cannot read it ({e}): options in it not checked", path.display()));
            return vec![];
        }
    };
    let scalar = |v: &str| -> Value {
        let v = v.trim();
        let unq = v
            .strip_prefix('"')
            .and_then(|x| x.strip_suffix('"'))
            .or_else(|| v.strip_prefix('\'').and_then(|x| x.strip_suffix('\'')));
        if let Some(u) = unq {
            return Value::String(u.to_string());
        }
        serde_json::from_str(v).unwrap_or_else(|_| Value::String(v.to_string()))
    };
    let mut pairs: Vec<(String, Value)> = Vec::new();
    let mut nested: Option<(String, serde_json::Map<String, Value>)> = None;
    for raw in text.lines() {
        let line = match raw.find(" #") {
            Some(i) if !raw[..i].contains('"') && !raw[..i].contains('\'') => &raw[..i],
            _ => raw,
        };
        if line.trim().is_empty() || line.trim_start().starts_with('#') || line.trim() == "---" {
            continue;
        }
        let indented = line.starts_with(' ') || line.starts_with('\t');
        let Some((k, v)) = line.trim().split_once(':') else { continue };
        let (k, v) = (k.trim().trim_matches('"').to_string(), v.trim());
        if indented {
            if let Some((_, m)) = nested.as_mut() {
                m.insert(k, scalar(v));
            }
            continue;
        }
        if let Some((nk, m)) = nested.take() {
            pairs.push((nk, Value::Object(m)));
        }
        if v.is_empty() {
            nested = Some((k, serde_json::Map::new()));
        } else {
            pairs.push((k, scalar(v)));
        }
    }
    if let Some((nk, m)) = nested.take() {
        pairs.push((nk, Value::Object(m)));
    }
    let mut out = Vec::new();
    for (k, v) in pairs {
        let flag = format!("--{}", k.replace('_', "-"));
        match v {
            Value::Bool(true) => out.push(flag),
            Value::Bool(false) | Value::Null => {}
            Value::String(s) => out.extend([flag, s]),
            Value::Number(n) => out.extend([flag, n.to_string()]),
            other => out.extend([flag, other.to_string()]),
        }
    }
    out
}

/// Parses a command line. `cwd`: where a `--config` file is read from (none: not read, e.g. the file
/// is on a remote node). `version`: the installed server version (length flags parse per version).
pub fn parse(
    argv: &[String],
    server: Option<&str>,
    cwd: Option<&Path>,
    version: Option<&str>,
) -> Result<Launch, CliError> {
    let mut l = Launch {
        program: argv.first().cloned().unwrap_or_default(),
        tp: 1,
        dp: 1,
        pp: 1,
        nnodes: 1,
        ..Launch::default()
    };
    let mut argv: Vec<String> = if server == Some("vllm") { dashed(argv) } else { argv.to_vec() };
    if matches!(server, Some("sglang") | Some("vllm")) {
        if let Some(c) = arg_value(&argv, "--config").map(String::from) {
            match cwd {
                Some(cwd) => {
                    let extra = config_file_args(&cwd.join(&c), &mut l.notes);
                    argv.extend(extra);
                }
                None => l.notes.push(format!("--config {c}: read on the node only; options in it not checked")),
            }
        }
    }
    let argv = &argv[..];
    let num = |f: &[&str]| -> Result<Option<u64>, CliError> {
        match first(argv, f) {
            None => Ok(None),
            Some(v) => {
                v.parse::<u64>().map(Some).map_err(|_| CliError::usage(format!("{}: not a number: '{v}'", f[0])))
            }
        }
    };
    let json = |f: &str| -> Result<Option<Value>, CliError> {
        match arg_value(argv, f) {
            None => Ok(None),
            Some(s) => serde_json::from_str::<Value>(s)
                .map(Some)
                .map_err(|e| CliError::usage(format!("{f} is not valid JSON: {e}"))),
        }
    };
    let len_flag = |l: &mut Launch, srv: Srv, flag: &str| -> Option<u64> {
        let v = arg_value(argv, flag)?;
        match derive::parse_len(srv, version, flag, v) {
            Parsed::Len(n) => Some(n),
            Parsed::Auto => None,
            Parsed::Refused(m) => {
                l.bad_len = Some(m);
                None
            }
            Parsed::Depends(n, note) => {
                l.len_note = Some(note);
                Some(n)
            }
        }
    };
    match server {
        Some("sglang") => {
            l.model =
                first(argv, &["--model-path", "--model"]).map(String::from).or_else(|| positional_after(argv, "serve"));
            l.draft = first(argv, &["--speculative-draft-model-path", "--speculative-draft-model"]).map(String::from);
            l.spec_algo = first(argv, &["--speculative-algorithm"]).map(|s| s.to_ascii_uppercase());
            l.context_length = len_flag(&mut l, Srv::Sglang, "--context-length");
            l.tp = num(&["--tp", "--tp-size", "--tensor-parallel-size"])?.unwrap_or(1);
            l.dp = num(&["--dp", "--dp-size", "--data-parallel-size"])?.unwrap_or(1);
            l.pp = num(&["--pp", "--pp-size", "--pipeline-parallel-size"])?.unwrap_or(1);
            l.nnodes = num(&["--nnodes"])?.unwrap_or(1).max(1);
            l.dp_attention = has(argv, &["--enable-dp-attention"]);
            l.mem_fraction = first(argv, &["--mem-fraction-static"]).and_then(|v| v.parse().ok());
            l.overrides = json("--json-model-override-args")?;
        }
        Some("vllm") => {
            l.model = first(argv, &["--model"]).map(String::from).or_else(|| positional_after(argv, "serve"));
            l.max_model_len = len_flag(&mut l, Srv::Vllm, "--max-model-len");
            l.tp = num(&["-tp", "--tensor-parallel-size"])?.unwrap_or(1);
            l.pp = num(&["-pp", "--pipeline-parallel-size"])?.unwrap_or(1);
            l.dp = num(&["-dp", "--data-parallel-size"])?.unwrap_or(1);
            l.dp_local = num(&["-dpl", "--data-parallel-size-local"])?;
            l.nnodes = num(&["--nnodes"])?.unwrap_or(1).max(1);
            l.mem_fraction = first(argv, &["--gpu-memory-utilization"]).and_then(|v| v.parse().ok());
            l.overrides = json("--hf-overrides")?;
            if let Some(v) = json("--speculative-config")? {
                l.draft = v.get("model").and_then(|m| m.as_str()).map(String::from);
                l.spec_algo = v.get("method").and_then(|m| m.as_str()).map(|s| s.to_ascii_uppercase());
                l.spec_config = Some(v);
            }
        }
        Some("llama-cpp") => {
            l.model = first(argv, &["-m", "--model"]).map(String::from);
            l.draft = first(argv, &["-md", "--model-draft", "--spec-draft-model"]).map(String::from);
            l.context_length = num(&["-c", "--ctx-size"])?;
            l.spec_type = first(argv, &["--spec-type"]).map(String::from);
        }
        _ => {}
    }
    l.trust_remote_code = has(argv, &["--trust-remote-code"]);
    l.port = first(argv, &["--port"]).and_then(|p| p.parse().ok());
    Ok(l)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> Vec<String> {
        s.split(' ').map(String::from).collect()
    }

    #[test]
    fn model_after_options_and_in_config_file() {
        let l = parse(&a("vllm serve --port 8000 --enforce-eager /m/x --tp 2"), Some("vllm"), None, None).unwrap();
        assert_eq!(l.model.as_deref(), Some("/m/x"));
        let d = std::env::temp_dir().join(format!("vigil-yaml-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(
            d.join("c.yaml"),
            "# a comment\nmodel: /m/y\nmax_model_len: 32k\ntrust-remote-code: true\nhf_overrides:\n  max_position_embeddings: 8192\n",
        )
        .unwrap();
        let l = parse(&a("vllm serve --config c.yaml"), Some("vllm"), Some(&d), None).unwrap();
        assert_eq!(l.model.as_deref(), Some("/m/y"));
        assert_eq!(l.max_model_len, Some(32000));
        assert!(l.trust_remote_code);
        assert_eq!(l.overrides.unwrap()["max_position_embeddings"], 8192);
        std::fs::write(d.join("s.yaml"), "model-path: /m/z\ncontext-length: 4096\n").unwrap();
        let l = parse(&a("python -m sglang.launch_server --config s.yaml"), Some("sglang"), Some(&d), None).unwrap();
        assert_eq!((l.model.as_deref(), l.context_length), (Some("/m/z"), Some(4096)));
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn gpus_per_node() {
        let l =
            parse(&a("sglang serve --model-path m --tp 8 --dp 8 --enable-dp-attention"), Some("sglang"), None, None)
                .unwrap();
        assert_eq!(l.gpus_per_node(Some("sglang")), 8);
        let l = parse(&a("sglang serve --model-path m --tp 16 --nnodes 2"), Some("sglang"), None, None).unwrap();
        assert_eq!(l.gpus_per_node(Some("sglang")), 8);
        let l = parse(&a("vllm serve m -tp 4 -dp 2"), Some("vllm"), None, None).unwrap();
        assert_eq!(l.gpus_per_node(Some("vllm")), 8);
    }
}
