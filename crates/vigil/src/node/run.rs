//! The run directory: `$XDG_STATE_HOME/vigil/runs/<name>/` (mode 0700, files 0600), written atomically.
//!
//! - `run.json`   what was launched: command (secrets redacted), cwd, environment (secrets redacted), kind, port, log
//! - `state.json` written by the keeper: keeper pid, server pid/pgid, start, exit status and signal
//! - `events.jsonl` the keeper's stop actions (signals sent, when)
//! - `stop.json`  a stop request (grace) from `down`
//! - `verdict.json` every verdict a watch of the run reaches, and the report of an orderly stop
//!   ([`VerdictFile`], one of the watch's sinks; `status` reads it)
//! - `startup.json` the verdict and per-phase durations of the last startup (baselines)
//! - `server.log` (+ `.1`, `.2` …) the server's stdout and stderr, secrets redacted
//!
//! Secret values (needed to replay the exact command on `restart`) are kept apart, in
//! `$XDG_STATE_HOME/vigil/secrets/<name>.json` (0600), never in the run directory. What counts as a
//! secret, and the redactor, are `sinks::redact`'s; the state root and the clock are `state.rs`'s.

use crate::error::CliError;
use crate::sinks::redact::{Redactor, Secrets};
use crate::state::state_root;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
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

/// The run's `verdict.json` as a sink of its watch: every verdict, and the report of an orderly stop.
/// A file that cannot be written is not an error of the watch.
pub struct VerdictFile(pub PathBuf);

impl crate::sinks::sink::Sink for VerdictFile {
    fn verdict(&mut self, _t_ms: u64, r: &vigil_core::Report) {
        let _ = write_json(&self.0, r);
    }

    fn stopped(&mut self, r: &vigil_core::Report) {
        let _ = write_json(&self.0, r);
    }
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

/// The redactor of a run: its stored secrets (local, or `host` for a run on a remote node); none when
/// there are none.
pub fn redactor_for(name: &str, host: Option<&str>) -> Redactor {
    Redactor::from_secrets(&stored_secrets(name, host))
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
    use crate::sinks::redact::{redact, secret_values};

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
