//! The run directory: `$XDG_STATE_HOME/vigil/runs/<name>/` (mode 0700, files 0600), written atomically.
//!
//! - `run.json`   what was launched: command (secrets redacted), cwd, environment (secrets redacted), kind, port, log
//! - `state.json` written by the keeper: keeper pid, server pid/pgid, start, exit status and signal
//! - `events.jsonl` the keeper's stop actions (signals sent, when)
//! - `stop.json`  a stop request (grace) from `down`
//! - `startup.json` the verdict and per-phase durations of the last startup (baselines)
//! - `server.log` (+ `.1`, `.2` …) the server's stdout and stderr, secrets redacted
//!
//! Secret values (needed to replay the exact command on `restart`) are kept apart, in
//! `$XDG_STATE_HOME/vigil/secrets/<name>.json` (0600), never in the run directory.

use crate::error::CliError;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunRecord {
    pub name: String,
    /// The command as launched, secret values replaced by `***`.
    pub argv: Vec<String>,
    pub cwd: String,
    /// The full environment the server got, secret values replaced by `***`.
    pub env: Vec<(String, String)>,
    pub server: Option<String>,
    pub port: Option<u16>,
    pub log: String,
    pub log_max_bytes: u64,
    pub log_keep: u32,
    pub created_unix_ms: u64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Secrets {
    /// (index into argv, real value)
    pub argv: Vec<(usize, String)>,
    /// (variable, real value)
    pub env: Vec<(String, String)>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct State {
    pub keeper_pid: i32,
    pub server_pid: Option<i32>,
    pub started_unix_ms: u64,
    pub running: bool,
    pub exit_code: Option<i32>,
    pub exit_signal: Option<i32>,
    pub ended_unix_ms: Option<u64>,
    pub spawn_error: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StopRequest {
    pub grace_ms: u64,
}

/// Was a stop of the run in `dir` asked for? `down` writes `stop.json` before it signals, so an exit it
/// caused always finds it (a launch removes an earlier run's).
pub fn stop_requested(dir: &Path) -> bool {
    dir.join("stop.json").exists()
}

pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

fn home() -> Option<PathBuf> {
    if let Some(h) = std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        return Some(PathBuf::from(h));
    }
    // Under `env -i` HOME is unset: ask the password database.
    // SAFETY: getpwuid_r with buffers we own.
    unsafe {
        let mut pw: libc::passwd = std::mem::zeroed();
        let mut buf = vec![0 as libc::c_char; 4096];
        let mut out: *mut libc::passwd = std::ptr::null_mut();
        if libc::getpwuid_r(libc::getuid(), &mut pw, buf.as_mut_ptr(), buf.len(), &mut out) == 0 && !out.is_null() {
            let dir = std::ffi::CStr::from_ptr(pw.pw_dir).to_string_lossy().into_owned();
            return Some(PathBuf::from(dir));
        }
    }
    None
}

/// `$VIGIL_STATE_DIR`, else `$XDG_STATE_HOME/vigil`, else `~/.local/state/vigil`.
pub fn state_root() -> Result<PathBuf, CliError> {
    if let Some(d) = std::env::var_os("VIGIL_STATE_DIR").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("XDG_STATE_HOME").map(PathBuf::from).filter(|d| d.is_absolute()) {
        return Ok(d.join("vigil"));
    }
    home()
        .map(|h| h.join(".local/state/vigil"))
        .ok_or_else(|| CliError::usage("cannot find the state directory: set HOME, XDG_STATE_HOME or VIGIL_STATE_DIR"))
}

pub fn runs_dir() -> Result<PathBuf, CliError> {
    Ok(state_root()?.join("runs"))
}

pub fn valid_name(n: &str) -> Result<(), CliError> {
    if n.is_empty()
        || n.len() > 64
        || n.starts_with('.')
        || !n.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    {
        return Err(CliError::usage(format!("bad run name '{n}': use letters, digits, '-', '_', '.' (at most 64)")));
    }
    Ok(())
}

pub fn run_dir(name: &str) -> Result<PathBuf, CliError> {
    valid_name(name)?;
    Ok(runs_dir()?.join(name))
}

pub fn secrets_path(name: &str) -> Result<PathBuf, CliError> {
    Ok(state_root()?.join("secrets").join(format!("{name}.json")))
}

pub fn mkdir_private(p: &Path) -> Result<(), CliError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(p)
        .map_err(|e| CliError::usage(format!("cannot create {}: {e}", p.display())))?;
    let _ = std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o700));
    Ok(())
}

/// Writes a file atomically (temp file, fsync, rename), mode 0600.
pub fn write_atomic(path: &Path, data: &[u8]) -> Result<(), CliError> {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let res = (|| -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp)?;
        f.write_all(data)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    res.map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        CliError::usage(format!("cannot write {}: {e}", path.display()))
    })
}

pub fn write_json<T: Serialize>(path: &Path, v: &T) -> Result<(), CliError> {
    let s = serde_json::to_vec_pretty(v).map_err(|e| CliError::Internal(e.to_string()))?;
    write_atomic(path, &s)
}

pub fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Option<T> {
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}

pub fn append_event(dir: &Path, v: serde_json::Value) {
    if let Ok(mut f) = std::fs::OpenOptions::new().append(true).create(true).mode(0o600).open(dir.join("events.jsonl"))
    {
        // one write call per line: readers never see half a record
        let _ = f.write_all(format!("{v}\n").as_bytes());
    }
}

pub fn read_events(dir: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(dir.join("events.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// Flags whose next argument (or `=value`) is a secret.
const SECRET_FLAGS: &[&str] = &["--api-key", "--hf-token", "--token", "--admin-api-key", "--api-keys"];

/// Is this environment variable a secret? (`HF_TOKEN`, `*_API_KEY`, `*_TOKEN`, `*_SECRET*`, `*PASSWORD*`)
pub fn secret_var(k: &str) -> bool {
    let u = k.to_ascii_uppercase();
    u == "HF_TOKEN"
        || u == "HUGGING_FACE_HUB_TOKEN"
        || u.ends_with("_API_KEY")
        || u == "API_KEY"
        || u.ends_with("_TOKEN")
        || u.contains("SECRET")
        || u.contains("PASSWORD")
}

/// Splits a command and an environment into a redacted copy and the secrets it held.
pub fn redact(argv: &[String], env: &[(String, String)]) -> (Vec<String>, Vec<(String, String)>, Secrets) {
    let mut s = Secrets::default();
    let mut out = argv.to_vec();
    let mut i = 0;
    while i < out.len() {
        let a = out[i].clone();
        if SECRET_FLAGS.contains(&a.as_str()) && i + 1 < out.len() {
            s.argv.push((i + 1, out[i + 1].clone()));
            out[i + 1] = "***".into();
            i += 2;
            continue;
        }
        if let Some((flag, val)) = a.split_once('=') {
            if SECRET_FLAGS.contains(&flag) {
                s.argv.push((i, a.clone()));
                out[i] = format!("{flag}=***");
                let _ = val;
            }
        }
        i += 1;
    }
    let env_out = env
        .iter()
        .map(|(k, v)| {
            if secret_var(k) && !v.is_empty() {
                s.env.push((k.clone(), v.clone()));
                (k.clone(), "***".into())
            } else {
                (k.clone(), v.clone())
            }
        })
        .collect();
    (out, env_out, s)
}

/// A command line given as one string (from /proc), secret flag values replaced by `***`.
pub fn redact_cmdline(cmd: &str) -> String {
    redact(&cmd.split(' ').map(String::from).collect::<Vec<_>>(), &[]).0.join(" ")
}

/// The one redactor every output goes through (terminal, plain, JSON, logs, local and remote): the secret
/// values known for the run (stored apart from the run record) and the values of secret flags in any
/// `--flag value` / `--flag=value` shape.
#[derive(Debug, Clone, Default)]
pub struct Redactor {
    values: Vec<String>,
}

impl Redactor {
    pub fn from_secrets(s: &Secrets) -> Redactor {
        let mut r = Redactor::default();
        for v in secret_values(s) {
            r.add(&v);
        }
        r
    }

    /// The stored secrets of a run (local, or `host` for a run on a remote node); none when there are none.
    pub fn for_run(name: &str, host: Option<&str>) -> Redactor {
        Redactor::from_secrets(&stored_secrets(name, host))
    }

    /// A value that must never be printed (short values are not redacted: they would mangle text).
    pub fn add(&mut self, v: &str) {
        if v.len() >= 4 && !self.values.iter().any(|x| x == v) {
            self.values.push(v.to_string());
        }
    }

    pub fn redact(&self, s: &str) -> String {
        let mut out = s.to_string();
        for v in &self.values {
            if out.contains(v.as_str()) {
                out = out.replace(v.as_str(), "***");
            }
        }
        if SECRET_FLAGS.iter().any(|f| out.contains(f)) {
            out = redact_cmdline(&out);
        }
        out
    }
}

/// The secrets kept apart for a run (`host`: a run on a remote node); empty when there are none or they
/// cannot be read.
pub fn stored_secrets(name: &str, host: Option<&str>) -> Secrets {
    let p = match host {
        None => secrets_path(name),
        Some(h) => remote_secrets_path(h, name),
    };
    p.ok().and_then(|p| read_json(&p)).unwrap_or_default()
}

/// Where the secret values of a run on a remote node are kept on this machine (0600), so that
/// `logs --host` and `wait --host` hide them as the local commands do.
pub fn remote_secrets_path(host: &str, name: &str) -> Result<PathBuf, CliError> {
    let h: String =
        host.chars().map(|c| if c.is_ascii_alphanumeric() || "-_.@".contains(c) { c } else { '_' }).collect();
    Ok(state_root()?.join("secrets").join("remote").join(h).join(format!("{name}.json")))
}

/// Secret values as they appear in text (the `--flag=value` form contributes its value).
pub fn secret_values(s: &Secrets) -> Vec<String> {
    let mut v: Vec<String> = s
        .argv
        .iter()
        .map(|(_, a)| {
            a.split_once('=')
                .filter(|(f, _)| f.starts_with("--"))
                .map(|(_, v)| v.to_string())
                .unwrap_or_else(|| a.clone())
        })
        .chain(s.env.iter().map(|(_, v)| v.clone()))
        .filter(|v| v.len() >= 4)
        .collect();
    v.sort();
    v.dedup();
    v
}

/// Restores the real command and environment from a record and its secrets.
pub fn unredact(r: &RunRecord, s: &Secrets) -> (Vec<String>, Vec<(String, String)>) {
    let mut argv = r.argv.clone();
    for (i, v) in &s.argv {
        if let Some(a) = argv.get_mut(*i) {
            *a = v.clone();
        }
    }
    let env = r
        .env
        .iter()
        .map(|(k, v)| match s.env.iter().find(|(sk, _)| sk == k) {
            Some((_, real)) => (k.clone(), real.clone()),
            None => (k.clone(), v.clone()),
        })
        .collect();
    (argv, env)
}

/// All run names, sorted.
pub fn list_runs() -> Result<Vec<String>, CliError> {
    let d = runs_dir()?;
    let mut v: Vec<String> = match std::fs::read_dir(&d) {
        Ok(rd) => rd
            .flatten()
            .filter(|e| e.path().join("run.json").is_file())
            .filter_map(|e| e.file_name().to_str().map(String::from))
            .collect(),
        Err(_) => vec![],
    };
    v.sort();
    Ok(v)
}

pub fn load(name: &str) -> Result<(PathBuf, RunRecord), CliError> {
    let dir = run_dir(name)?;
    let r: RunRecord = read_json(&dir.join("run.json"))
        .ok_or_else(|| CliError::usage(format!("no run named '{name}' (see vigil status)")))?;
    Ok((dir, r))
}

/// How many times a run was restarted (`vigil restart`), from its `restarts` file.
pub fn restarts(dir: &Path) -> u64 {
    std::fs::read_to_string(dir.join("restarts")).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_flags_and_vars() {
        let argv: Vec<String> = ["srv", "--api-key", "sk-1234", "--hf-token=hf_abcd", "--port", "1"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let env = vec![
            ("HF_TOKEN".to_string(), "hf_zzzz".to_string()),
            ("NCCL_DEBUG".into(), "INFO".into()),
            ("OPENAI_API_KEY".into(), "sk-env".into()),
        ];
        let (a, e, s) = redact(&argv, &env);
        assert_eq!(a, vec!["srv", "--api-key", "***", "--hf-token=***", "--port", "1"]);
        assert_eq!(e[0].1, "***");
        assert_eq!(e[1].1, "INFO");
        assert_eq!(e[2].1, "***");
        let mut vals = secret_values(&s);
        vals.sort();
        assert_eq!(vals, vec!["hf_abcd", "hf_zzzz", "sk-1234", "sk-env"]);
        let rec = RunRecord {
            name: "x".into(),
            argv: a,
            cwd: "/".into(),
            env: e,
            server: None,
            port: None,
            log: String::new(),
            log_max_bytes: 0,
            log_keep: 0,
            created_unix_ms: 0,
        };
        let (a2, e2) = unredact(&rec, &s);
        assert_eq!(a2, argv);
        assert_eq!(e2, env);
    }

    #[test]
    fn names() {
        assert!(valid_name("llama-1").is_ok());
        for bad in ["", "../x", ".hidden", "a/b", "a b"] {
            assert!(valid_name(bad).is_err(), "{bad}");
        }
    }
}
