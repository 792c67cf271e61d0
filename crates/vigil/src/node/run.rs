//! The run directory: `$XDG_STATE_HOME/vigil/runs/<name>/` (mode 0700, files 0600), written atomically.
//! The state folder, `runs` and the run's folder must be the user's own, never symlinks, never writable by
//! group or others (`state::check_private`); files are created with `O_NOFOLLOW` under the folder's
//! descriptor.
//!
//! - `keeper.lock` the run's name lock: `up` takes it (`flock`, exclusive) before anything else and hands it
//!   to the keeper, which holds it for the run's life; a second `up` of the name finds it taken
//! - `run.json`   what was launched: command (secrets redacted), cwd, environment (secrets redacted), kind, port, log
//! - `state.json` written by the keeper: its identity (pid, start time, boot id), server pid, start, exit
//!   status and signal
//! - `events.jsonl` the keeper's stop actions (stop requested, signals sent, when)
//! - `stop.json`  a stop request (grace) from `down`, written after it signalled (the request itself
//!   travels with the signal)
//! - `keeper-died` when a vigil command first saw the keeper dead while its server lived on
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
    /// The repairs `vigil up --repair` made to reach this command (issue #35), in words: `restart` replays
    /// the command as repaired and says so.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub repairs: Vec<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct State {
    pub keeper_pid: i32,
    /// The keeper as one process for all time (pid, start time, boot id): checked before any signal.
    #[serde(default)]
    pub keeper: Option<crate::sources::procs::ProcId>,
    /// The keeper ended in order: every process of the run had ended before it.
    #[serde(default)]
    pub keeper_done: bool,
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

/// Was a stop of the run in `dir` asked for? The keeper records the request (`stop_requested` in
/// `events.jsonl`) before it signals the server, so an exit it caused always finds it; `down` writes
/// `stop.json` after it signalled, and stops a run whose keeper is gone itself (a launch removes an
/// earlier run's records).
pub fn stop_requested(dir: &Path) -> bool {
    dir.join("stop.json").exists() || read_events(dir).iter().any(|e| e["event"] == "stop_requested")
}

/// The folder of every run, its path checked (`state::check_private`: the state folder and `runs`).
pub fn runs_dir() -> Result<PathBuf, CliError> {
    let root = state_root()?;
    crate::state::check_private(&root)?;
    let d = root.join("runs");
    crate::state::check_private(&d)?;
    Ok(d)
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

/// A run's folder, its path checked (the state folder, `runs`, the run's own folder: none a symlink, none
/// another user's or writable by others).
pub fn run_dir(name: &str) -> Result<PathBuf, CliError> {
    valid_name(name)?;
    let d = runs_dir()?.join(name);
    crate::state::check_private(&d)?;
    Ok(d)
}

/// The name lock of a run: `keeper.lock` in its folder, held (`flock`, exclusive) by the `up` that
/// creates the run and then by its keeper for the run's life. The kernel drops it when its last holder
/// ends, so a lock never outlives the run.
pub struct NameLock(std::fs::File);

pub const LOCK: &str = "keeper.lock";

impl NameLock {
    /// Takes the lock of the run in `dir` (created if need be), or None when another process holds it.
    pub fn try_take(dir: &Path) -> Result<Option<NameLock>, CliError> {
        let p = dir.join(LOCK);
        let f = crate::state::open_private(&p, crate::state::Access::ReadWrite)
            .map_err(|e| CliError::usage(format!("cannot open {}: {e}", p.display())))?;
        use std::os::fd::AsRawFd;
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(Some(NameLock(f)));
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
            return Ok(None);
        }
        Err(CliError::usage(format!("cannot lock {}: {e}", p.display())))
    }

    /// The descriptor, for the keeper to inherit.
    pub fn fd(&self) -> i32 {
        use std::os::fd::AsRawFd;
        self.0.as_raw_fd()
    }
}

/// The process that took the run's name lock, as the kernel lists it (`/proc/locks`: the `up` that created
/// the run; the keeper holds the same lock once it runs), if it is still alive.
pub fn lock_taker(dir: &Path) -> Option<i32> {
    use std::os::unix::fs::MetadataExt;
    let ino = std::fs::symlink_metadata(dir.join(LOCK)).ok().filter(|m| m.is_file())?.ino();
    let text = String::from_utf8(crate::sources::procs::read_small(Path::new("/proc/locks"), 16 << 20).ok()?).ok()?;
    text.lines()
        .filter(|l| l.contains(" FLOCK "))
        .find_map(|l| {
            // "1: FLOCK  ADVISORY  WRITE 4242 fe:00:852363 0 EOF"
            let f: Vec<&str> = l.split_whitespace().collect();
            let file_ino = f.get(5)?.rsplit(':').next()?.parse::<u64>().ok()?;
            (file_ino == ino).then(|| f.get(4)?.parse::<i32>().ok()).flatten()
        })
        .filter(|p| crate::sources::procs::alive(*p))
}

/// Does some process hold the run's name lock? Asked without taking it for more than a moment: a shared
/// lock that cannot be had means an exclusive one is held.
pub fn lock_held(dir: &Path) -> bool {
    use std::os::fd::AsRawFd;
    let Ok(f) =
        std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC).open(dir.join(LOCK))
    else {
        return false;
    };
    // SAFETY: flock on a descriptor we own; the lock (if taken) ends when it closes.
    unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) != 0 }
}

pub fn secrets_path(name: &str) -> Result<PathBuf, CliError> {
    Ok(state_root()?.join("secrets").join(format!("{name}.json")))
}

/// Writes a file atomically, mode 0600: a new temp file (`O_EXCL|O_NOFOLLOW`, so no planted link is
/// followed) created under the folder's descriptor (opened `O_NOFOLLOW`), fsync, rename in the same folder.
pub fn write_atomic(path: &Path, data: &[u8]) -> Result<(), CliError> {
    use std::ffi::CString;
    use std::os::fd::{AsRawFd, FromRawFd};
    use std::os::unix::ffi::OsStrExt;
    let err = |e: std::io::Error| CliError::usage(format!("cannot write {}: {e}", path.display()));
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(err(std::io::Error::from(std::io::ErrorKind::InvalidInput)));
    };
    let parent = if parent.as_os_str().is_empty() { Path::new(".") } else { parent };
    let dir = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(parent)
        .map_err(err)?;
    let tmp_name = format!(".{}.tmp{}", name.to_string_lossy(), std::process::id());
    let cstr = |b: &[u8]| CString::new(b).map_err(|_| err(std::io::Error::from(std::io::ErrorKind::InvalidInput)));
    let (tmp, dst) = (cstr(tmp_name.as_bytes())?, cstr(name.as_bytes())?);
    // SAFETY: unlinkat/openat/renameat on our folder descriptor with valid C strings.
    unsafe { libc::unlinkat(dir.as_raw_fd(), tmp.as_ptr(), 0) };
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            tmp.as_ptr(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            0o600,
        )
    };
    if fd < 0 {
        return Err(err(std::io::Error::last_os_error()));
    }
    // SAFETY: the descriptor was just opened and is owned here.
    let mut f = unsafe { std::fs::File::from_raw_fd(fd) };
    let res = f.write_all(data).and_then(|_| f.sync_all()).and_then(|_| {
        // SAFETY: as above.
        if unsafe { libc::renameat(dir.as_raw_fd(), tmp.as_ptr(), dir.as_raw_fd(), dst.as_ptr()) } == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    });
    res.map_err(|e| {
        // SAFETY: as above.
        unsafe { libc::unlinkat(dir.as_raw_fd(), tmp.as_ptr(), 0) };
        err(e)
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
    read_json_checked(path).ok().flatten()
}

/// The most of a state file that is read (a run record holds the whole environment).
const STATE_FILE_MAX: u64 = 64 << 20;

/// Reads a state file tolerantly: Ok(None) when it does not exist, Err with why when it exists and cannot
/// be read or parsed (a symlink, a FIFO, a torn or corrupted file), so that the caller can name it and go on.
pub fn read_json_checked<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<Option<T>, String> {
    use std::io::Read;
    let f = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => return Err("it is a symbolic link".into()),
        Err(e) => return Err(e.to_string()),
    };
    if !f.metadata().map_err(|e| e.to_string())?.is_file() {
        return Err("not a regular file".into());
    }
    let mut buf = Vec::new();
    f.take(STATE_FILE_MAX + 1).read_to_end(&mut buf).map_err(|e| e.to_string())?;
    if buf.len() as u64 > STATE_FILE_MAX {
        return Err(format!("larger than {} MiB", STATE_FILE_MAX >> 20));
    }
    serde_json::from_slice(&buf).map(Some).map_err(|e| e.to_string())
}

/// A state file of a run that cannot be read, named in one line.
pub fn unreadable(file: &str, run: &str, why: &str) -> String {
    format!("{file} of run {run} is unreadable: {why}")
}

pub fn append_event(dir: &Path, v: serde_json::Value) {
    if let Ok(mut f) = crate::state::open_private(&dir.join("events.jsonl"), crate::state::Access::Append) {
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

/// All run names, sorted: every folder under `runs` with a record, a state or a lock of a run (a run
/// whose `run.json` is corrupted is still listed, and still stoppable), and every entry that is not a
/// plain folder (a planted symlink is named by the commands, never followed).
pub fn list_runs() -> Result<Vec<String>, CliError> {
    let d = runs_dir()?;
    let mut v: Vec<String> = match std::fs::read_dir(&d) {
        Ok(rd) => rd
            .flatten()
            .filter(|e| {
                let p = e.path();
                let plain_dir = e.file_type().is_ok_and(|t| t.is_dir());
                !plain_dir || ["run.json", "state.json", LOCK].iter().any(|f| p.join(f).exists())
            })
            .filter_map(|e| e.file_name().to_str().map(String::from))
            .filter(|n| valid_name(n).is_ok())
            .collect(),
        Err(_) => vec![],
    };
    v.sort();
    Ok(v)
}

pub fn load(name: &str) -> Result<(PathBuf, RunRecord), CliError> {
    let dir = run_dir(name)?;
    match read_json_checked::<RunRecord>(&dir.join("run.json")) {
        Ok(Some(r)) => Ok((dir, r)),
        Ok(None) => Err(CliError::usage(format!("no run named '{name}' (see vigil status)"))),
        Err(why) => Err(CliError::usage(unreadable("run.json", name, &why))),
    }
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
            repairs: vec![],
        };
        let (a2, e2) = unredact(&rec, &s);
        assert_eq!(a2, argv);
        assert_eq!(e2, env);
    }

    /// A state file is replaced whole (never written through a link planted at its name), read tolerantly
    /// (a corrupted one is an error that says why; a missing one is none).
    #[test]
    fn state_files_are_replaced_whole_and_read_tolerantly() {
        let d = std::env::temp_dir().join(format!("vigil-run-files-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let victim = d.join("victim");
        std::fs::write(&victim, "keep").unwrap();
        std::os::unix::fs::symlink(&victim, d.join("state.json")).unwrap();
        let st = State { keeper_pid: 7, ..State::default() };
        write_json(&d.join("state.json"), &st).unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
        assert!(std::fs::symlink_metadata(d.join("state.json")).unwrap().is_file());
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(d.join("state.json")).unwrap().permissions().mode() & 0o777, 0o600);
        let back: State = read_json_checked(&d.join("state.json")).unwrap().unwrap();
        assert_eq!(back.keeper_pid, 7);
        std::fs::write(d.join("state.json"), "{\"keeper_pid\": 1, \"serv").unwrap();
        let e = read_json_checked::<State>(&d.join("state.json")).unwrap_err();
        assert!(e.contains("EOF"), "{e}");
        assert_eq!(unreadable("state.json", "x", &e), format!("state.json of run x is unreadable: {e}"));
        assert!(read_json_checked::<State>(&d.join("missing.json")).unwrap().is_none());
        std::os::unix::fs::symlink(&victim, d.join("run.json")).unwrap();
        assert_eq!(read_json_checked::<RunRecord>(&d.join("run.json")).unwrap_err(), "it is a symbolic link");
        let _ = std::fs::remove_dir_all(&d);
    }

    /// One run per name: while one holder has the lock, no one else takes it; it is free once the holder
    /// lets go (the keeper's death lets go of it too).
    #[test]
    fn the_name_lock_has_one_holder() {
        let d = std::env::temp_dir().join(format!("vigil-run-lock-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        assert!(!lock_held(&d));
        let first = NameLock::try_take(&d).unwrap().expect("free");
        assert!(lock_held(&d));
        assert!(NameLock::try_take(&d).unwrap().is_none(), "a second holder");
        drop(first);
        assert!(!lock_held(&d));
        assert!(NameLock::try_take(&d).unwrap().is_some());
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn names() {
        assert!(valid_name("llama-1").is_ok());
        for bad in ["", "../x", ".hidden", "a/b", "a b"] {
            assert!(valid_name(bad).is_err(), "{bad}");
        }
    }
}
