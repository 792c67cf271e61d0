//! The keeper: one per launched server, like conmon for containers. `vigil up` starts it in its own
//! session (`vigil __keeper RUN_DIR`), so it outlives the terminal, the SSH connection and the vigil
//! that asked for it. It is the server's parent and a child subreaper, so children that double-fork
//! or call setsid stay its descendants; it owns the server's stdout and stderr and writes them to the
//! run log (size-rotated, secrets redacted); it records the exit status and signal; on SIGTERM it
//! stops the whole tree (SIGTERM, grace from stop.json, SIGKILL), on SIGUSR1 it kills it at once.
//! It exits when no descendant is left.

use crate::events::RunEvent;
use crate::procs;
use crate::run::{self, RunRecord, Secrets, State, StopRequest};
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

struct LogWriter {
    path: PathBuf,
    file: std::fs::File,
    size: u64,
    max: u64,
    keep: u32,
    secrets: Vec<Vec<u8>>,
}

fn open_log(p: &Path) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new().create(true).append(true).mode(0o600).open(p)
}

impl LogWriter {
    fn write_line(&mut self, line: &[u8]) {
        let mut data = std::borrow::Cow::Borrowed(line);
        for s in &self.secrets {
            if data.windows(s.len()).any(|w| w == s.as_slice()) {
                data = std::borrow::Cow::Owned(crate::lines::replace_bytes(&data, s, b"***"));
            }
        }
        if self.file.write_all(&data).is_ok() {
            self.size += data.len() as u64;
        }
        if self.max > 0 && self.size >= self.max {
            self.rotate();
        }
    }

    fn rotate(&mut self) {
        let name = |i: u32| PathBuf::from(format!("{}.{i}", self.path.display()));
        let _ = std::fs::remove_file(name(self.keep));
        for i in (1..self.keep).rev() {
            let _ = std::fs::rename(name(i), name(i + 1));
        }
        let _ = std::fs::rename(&self.path, name(1));
        if let Ok(f) = open_log(&self.path) {
            self.file = f;
            self.size = 0;
        }
    }
}

/// Copies one stream into the log, line by line (a line is written whole under the lock).
fn pump(mut r: impl Read, log: Arc<Mutex<LogWriter>>) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut partial: Vec<u8> = Vec::new();
    loop {
        let n = match r.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        let mut start = 0;
        let chunk = &buf[..n];
        let mut lines: Vec<Vec<u8>> = Vec::new();
        for (i, b) in chunk.iter().enumerate() {
            if *b == b'\n' {
                let mut l = std::mem::take(&mut partial);
                l.extend_from_slice(&chunk[start..=i]);
                lines.push(l);
                start = i + 1;
            }
        }
        partial.extend_from_slice(&chunk[start..]);
        if partial.len() > 1 << 20 {
            // a line over 1 MiB is written in pieces
            let mut l = std::mem::take(&mut partial);
            l.push(b'\n');
            lines.push(l);
        }
        if !lines.is_empty() {
            let mut w = log.lock().unwrap();
            for l in lines {
                w.write_line(&l);
            }
        }
    }
    if !partial.is_empty() {
        // the last line without a newline is kept
        partial.push(b'\n');
        log.lock().unwrap().write_line(&partial);
    }
}

fn block_signals() -> libc::sigset_t {
    // SAFETY: plain sigset manipulation on a set we own.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGUSR1, libc::SIGQUIT] {
            libc::sigaddset(&mut set, s);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

fn write_state(dir: &Path, st: &State) {
    let _ = run::write_json(&dir.join("state.json"), st);
}

/// Entry point of `vigil __keeper RUN_DIR`. Returns the keeper's exit code.
pub fn main(dir: PathBuf) -> i32 {
    let Some(rec) = run::read_json::<RunRecord>(&dir.join("run.json")) else {
        return 2;
    };
    let secrets: Secrets = run::stored_secrets(&rec.name, None);
    let (argv, env) = run::unredact(&rec, &secrets);
    let me = std::process::id() as i32;
    // SAFETY: prctl with constant arguments.
    unsafe {
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    }
    let set = block_signals();
    let mut st = State { keeper_pid: me, started_unix_ms: run::now_ms(), ..State::default() };

    let log_path = PathBuf::from(&rec.log);
    let file = match open_log(&log_path) {
        Ok(f) => f,
        Err(e) => {
            st.spawn_error = Some(format!("cannot open log {}: {e}", log_path.display()));
            write_state(&dir, &st);
            return 1;
        }
    };
    let size = file.metadata().map(|m| m.len()).unwrap_or(0);
    let log = Arc::new(Mutex::new(LogWriter {
        path: log_path,
        file,
        size,
        max: rec.log_max_bytes,
        keep: rec.log_keep.max(1),
        secrets: run::secret_values(&secrets).into_iter().map(String::into_bytes).collect(),
    }));

    let mut cmd = std::process::Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env("VIGIL_RUN", &rec.name)
        .current_dir(&rec.cwd)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            let mut empty: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut empty);
            libc::pthread_sigmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
            libc::setpgid(0, 0);
            Ok(())
        });
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            st.spawn_error = Some(format!("cannot start {}: {e}", argv[0]));
            write_state(&dir, &st);
            return 1;
        }
    };
    let server = child.id() as i32;
    st.server_pid = Some(server);
    st.running = true;
    write_state(&dir, &st);
    let out = child.stdout.take().unwrap();
    let err = child.stderr.take().unwrap();
    let (l1, l2) = (log.clone(), log.clone());
    let t_out = std::thread::spawn(move || pump(out, l1));
    let t_err = std::thread::spawn(move || pump(err, l2));

    // Stop requests arrive as signals. While one is being carried out the keeper does not exit, so its
    // record of what it did (events.jsonl) is complete.
    let stopping = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stopping2 = stopping.clone();
    let sdir = dir.clone();
    std::thread::spawn(move || loop {
        let mut sig: libc::c_int = 0;
        // SAFETY: sigwait on the set blocked above.
        if unsafe { libc::sigwait(&set, &mut sig) } != 0 {
            continue;
        }
        stopping2.store(true, std::sync::atomic::Ordering::SeqCst);
        let grace = if sig == libc::SIGUSR1 {
            Duration::ZERO
        } else {
            let req: Option<StopRequest> = run::read_json(&sdir.join("stop.json"));
            Duration::from_millis(req.map_or(10_000, |r| r.grace_ms))
        };
        run::append_event(
            &sdir,
            RunEvent::StopRequested { t_unix_ms: run::now_ms(), grace_ms: grace.as_millis() as u64 }.to_value(),
        );
        let d2 = sdir.clone();
        let rep = procs::stop_tree(me, false, grace, &mut |signal, pids| {
            run::append_event(&d2, RunEvent::Signal { signal, pids, t_unix_ms: run::now_ms() }.to_value());
        });
        run::append_event(&sdir, RunEvent::Stopped { t_unix_ms: run::now_ms(), report: &rep }.to_value());
        stopping2.store(false, std::sync::atomic::Ordering::SeqCst);
    });

    // Reap every descendant (we are their subreaper); record the server's status.
    loop {
        let mut status: libc::c_int = 0;
        // SAFETY: waitpid on our children.
        let pid = unsafe { libc::waitpid(-1, &mut status, 0) };
        if pid < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            break; // ECHILD: nothing left
        }
        if pid == server {
            st.running = false;
            st.ended_unix_ms = Some(run::now_ms());
            if libc::WIFEXITED(status) {
                st.exit_code = Some(libc::WEXITSTATUS(status));
            } else if libc::WIFSIGNALED(status) {
                st.exit_signal = Some(libc::WTERMSIG(status));
            }
            write_state(&dir, &st);
        }
    }
    let t_end = std::time::Instant::now();
    while stopping.load(std::sync::atomic::Ordering::SeqCst) && t_end.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let _ = t_out.join();
    let _ = t_err.join();
    if let Ok(mut w) = log.lock() {
        let _ = w.file.flush();
    }
    0
}
