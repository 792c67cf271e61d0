//! The keeper: one per launched server, like conmon for containers. `vigil up` starts it in its own
//! session (`vigil __keeper RUN_DIR`), so it outlives the terminal, the SSH connection and the vigil
//! that asked for it. It is the server's parent and a child subreaper, so children that double-fork
//! or call setsid stay its descendants; it owns the server's stdout and stderr and writes them to the
//! run log (size-rotated, secrets redacted); it records the exit status and signal; on SIGTERM it
//! stops the whole tree (SIGTERM, the grace that came with the signal, SIGKILL), on SIGUSR1 it kills it
//! at once. It exits when no descendant is left.
//!
//! A run is its keeper: the keeper holds the run's name lock (`keeper.lock`, handed over by `vigil up`)
//! for its whole life, records its own identity (pid, start time, boot id) in `state.json`, and marks the
//! server's environment (`VIGIL_RUN`, `VIGIL_RUN_DIR`) so that a server whose keeper died is still found.
//!
//! # Lines and redraws in the log
//! Ordinary lines are written whole, when their `\n` comes. A progress bar (tqdm: CUDA-graph capture,
//! checkpoint shards) redraws one line with `\r` and ends it with `\n` only when it is done, and tqdm
//! writes the `\r` *before* each state, so a state's own end is the next state. Each state is written as
//! soon as it arrives, ended by a `\r` of the keeper's (`state\r`), so whoever follows the log reads it at
//! once as a line of its own; a `cat` of the log still shows the bar redrawn in place. A line of redraws
//! is written whole up to `REDRAW_LINE_MAX` bytes; past that its states are thinned to one per
//! `REDRAW_EVERY` (the latest one is kept and written when its turn comes, the ones in between are
//! dropped) and the line is broken every `REDRAW_LINE_MAX` bytes. The final state (the one its `\n`
//! ends) is always written. A state written before its end leaves out any tail that could be the start of
//! a secret, so no part of a secret reaches the log before the whole of it can be redacted.

use crate::exit::Exit;
use crate::node::run::{self, RunRecord, State, StopRequest};
use crate::sinks::events::RunEvent;
use crate::sinks::redact::Secrets;
use crate::sources::procs;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A line of redraws is written whole up to this many bytes; past it, states are thinned and the line is
/// broken every this many bytes.
const REDRAW_LINE_MAX: usize = 64 * 1024;
/// Past `REDRAW_LINE_MAX`, at most one state of a bar per this period reaches the log.
const REDRAW_EVERY: Duration = Duration::from_secs(1);
/// A line without any end is written in pieces of about this size, each ended by a newline.
const PIECE_MAX: usize = 1 << 20;

struct LogWriter {
    path: PathBuf,
    file: std::fs::File,
    size: u64,
    max: u64,
    keep: u32,
    secrets: Vec<Vec<u8>>,
    /// The stream (0 stdout, 1 stderr) whose line is open in the log: the last bytes written were its
    /// states, ended by `\r`, not by a newline.
    open: Option<usize>,
    /// Per stream: its open line was ended by a newline of the keeper's (the other stream wrote, or the
    /// log rotated), so its own newline that follows is not written again.
    broken: [bool; 2],
}

fn open_log(p: &Path) -> std::io::Result<std::fs::File> {
    crate::state::open_private(p, crate::state::Access::Append)
}

impl LogWriter {
    /// Writes one piece of a stream (a whole line, or states of a bar), redacted.
    fn write(&mut self, who: usize, piece: &[u8]) {
        if piece.is_empty() {
            return;
        }
        if let Some(o) = self.open.filter(|o| *o != who) {
            // a line of the other stream comes while this one's bar is open: the bar's line ends here
            self.raw(b"\n");
            self.broken[o] = true;
            self.open = None;
        }
        if std::mem::take(&mut self.broken[who]) && piece == b"\n" {
            return;
        }
        let mut data = std::borrow::Cow::Borrowed(piece);
        for s in &self.secrets {
            if data.windows(s.len()).any(|w| w == s.as_slice()) {
                data = std::borrow::Cow::Owned(crate::sources::lines::replace_bytes(&data, s, b"***"));
            }
        }
        self.raw(&data);
        self.open = (!data.ends_with(b"\n")).then_some(who);
        if self.max > 0 && self.size >= self.max {
            self.rotate();
        }
    }

    fn raw(&mut self, data: &[u8]) {
        if self.file.write_all(data).is_ok() {
            self.size += data.len() as u64;
        }
    }

    fn rotate(&mut self) {
        if let Some(o) = self.open.take() {
            // the old file ends with a whole line; the bar goes on in the new one
            self.raw(b"\n");
            self.broken[o] = true;
        }
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

/// How many bytes at the end of `data` could be the start of a secret (a proper prefix of one): a state
/// written before its end leaves them out.
fn secret_tail(data: &[u8], secrets: &[Vec<u8>]) -> usize {
    let mut keep = 0;
    for s in secrets {
        for k in (keep + 1..s.len().min(data.len() + 1)).rev() {
            if data.ends_with(&s[..k]) {
                keep = k;
                break;
            }
        }
    }
    keep
}

/// One stream's bytes on their way to the log, split into lines and redraw states (module docs). Pure but
/// for the time passed in, so its rules are tested on virtual time; `pump` drives it.
struct Pump {
    secrets: Vec<Vec<u8>>,
    /// The current segment (since the last `\n` or `\r`), not yet written as a line.
    seg: Vec<u8>,
    /// `seg[..n]` was written as a state before its end.
    shown: Option<usize>,
    /// The segment follows a bare `\r`: it is a state of a bar, written before its end when the stream
    /// pauses.
    redraw: bool,
    /// Bytes written of the stream's current line (since its last newline).
    line: usize,
    /// The line passed `REDRAW_LINE_MAX`: states are thinned.
    thin: bool,
    /// A thinned state waiting for its turn (the latest one), and whether its end came.
    held: Option<(Vec<u8>, bool)>,
    /// When a state was last written.
    last_state: Option<Instant>,
}

impl Pump {
    fn new(secrets: Vec<Vec<u8>>) -> Pump {
        Pump {
            secrets,
            seg: Vec::new(),
            shown: None,
            redraw: false,
            line: 0,
            thin: false,
            held: None,
            last_state: None,
        }
    }

    /// Takes what a read returned; `out` gets the pieces to write, in order. The read's end is a pause of
    /// the stream: a state still without its end is written as it stands.
    fn feed(&mut self, data: &[u8], now: Instant, out: &mut Vec<Vec<u8>>) {
        let mut start = 0;
        for (i, &b) in data.iter().enumerate() {
            if b != b'\n' && b != b'\r' {
                continue;
            }
            self.seg.extend_from_slice(&data[start..i]);
            start = i + 1;
            if b == b'\n' {
                self.end_line(out);
            } else {
                self.end_state(now, out);
            }
        }
        self.seg.extend_from_slice(&data[start..]);
        if self.seg.len() > PIECE_MAX {
            // a line without an end: a piece of it, ended by a newline
            let n = self.seg.len() - secret_tail(&self.seg, &self.secrets);
            let mut p: Vec<u8> = self.seg.drain(..n).collect();
            p.push(b'\n');
            self.put(p, out);
            (self.shown, self.redraw, self.thin, self.held) = (None, false, false, None);
        }
        if self.redraw && !self.seg.is_empty() && self.shown != Some(self.seg.len()) {
            self.state(false, now, out);
        }
    }

    /// When a thinned state is due to be written, if one waits.
    fn due(&self) -> Option<Instant> {
        self.held.as_ref()?;
        self.last_state.map(|t| t + REDRAW_EVERY)
    }

    /// Writes the waiting state once it is due.
    fn tick(&mut self, now: Instant, out: &mut Vec<Vec<u8>>) {
        if self.due().is_some_and(|t| t <= now) {
            let (s, complete) = self.held.take().unwrap();
            let n = self.write_state(s, complete, now, out);
            if !complete {
                // a held state without its end is the current segment: its end writes it whole if cut
                self.shown = Some(n);
            }
        }
    }

    /// The stream ended: what is left, and the line closed.
    fn finish(&mut self, out: &mut Vec<Vec<u8>>) {
        if !self.seg.is_empty() && self.shown != Some(self.seg.len()) {
            let mut p = std::mem::take(&mut self.seg);
            p.push(b'\n');
            self.put(p, out);
        } else if let Some((mut s, _)) = self.held.take() {
            s.push(b'\n');
            self.put(s, out);
        } else if self.line > 0 {
            self.put(b"\n".to_vec(), out);
        }
        self.seg.clear();
    }

    /// A `\n` ends the segment and the line: its last state is written whole unless it already was.
    fn end_line(&mut self, out: &mut Vec<Vec<u8>>) {
        let seg = std::mem::take(&mut self.seg);
        let held = self.held.take();
        let mut p = if !seg.is_empty() && self.shown != Some(seg.len()) {
            seg
        } else if let Some((s, _)) = held {
            s
        } else {
            Vec::new()
        };
        self.break_line(p.len(), out);
        p.push(b'\n');
        self.put(p, out);
        (self.shown, self.redraw, self.thin, self.last_state) = (None, false, false, None);
    }

    /// A `\r` ends the segment, one state of a bar.
    fn end_state(&mut self, now: Instant, out: &mut Vec<Vec<u8>>) {
        if !self.seg.is_empty() && self.shown != Some(self.seg.len()) {
            self.state(true, now, out);
        } else if let Some((s, complete)) = &mut self.held {
            // the held state was this segment before its end: now it is whole
            *complete |= *s == self.seg;
        }
        self.seg.clear();
        self.shown = None;
        self.redraw = true;
    }

    /// The current segment is a state (`complete`: its end came): written now, or held while thinned.
    fn state(&mut self, complete: bool, now: Instant, out: &mut Vec<Vec<u8>>) {
        if self.thin && self.last_state.is_some_and(|t| now < t + REDRAW_EVERY) {
            self.held = Some((self.seg.clone(), complete));
            if !complete {
                self.shown = Some(self.seg.len());
            }
            return;
        }
        self.held = None;
        let s = self.seg.clone();
        let n = self.write_state(s, complete, now, out);
        if !complete {
            self.shown = Some(n);
        }
    }

    /// Writes a state ended by `\r` (an incomplete one without a possible secret's start); returns how
    /// many of its bytes were written.
    fn write_state(&mut self, mut s: Vec<u8>, complete: bool, now: Instant, out: &mut Vec<Vec<u8>>) -> usize {
        if !complete {
            s.truncate(s.len() - secret_tail(&s, &self.secrets));
        }
        let n = s.len();
        if n == 0 {
            return 0;
        }
        self.break_line(n, out);
        s.push(b'\r');
        self.put(s, out);
        self.last_state = Some(now);
        n
    }

    /// A thinned line is broken before it passes `REDRAW_LINE_MAX`.
    fn break_line(&mut self, next: usize, out: &mut Vec<Vec<u8>>) {
        if self.thin && self.line > 0 && self.line + next > REDRAW_LINE_MAX {
            self.put(b"\n".to_vec(), out);
        }
    }

    fn put(&mut self, p: Vec<u8>, out: &mut Vec<Vec<u8>>) {
        match p.iter().rposition(|b| *b == b'\n') {
            Some(i) => self.line = p.len() - i - 1,
            None => self.line += p.len(),
        }
        if self.line >= REDRAW_LINE_MAX {
            self.thin = true;
        }
        out.push(p);
    }
}

/// Copies one stream (`who`: 0 stdout, 1 stderr) into the log through a `Pump`; the pieces of one read
/// are written under one lock. While a thinned state waits, the stream is polled until its turn.
fn pump(mut r: impl Read + AsRawFd, who: usize, log: Arc<Mutex<LogWriter>>) {
    let secrets = log.lock().unwrap().secrets.clone();
    let mut p = Pump::new(secrets);
    let mut buf = vec![0u8; 64 * 1024];
    let mut out = Vec::new();
    let flush = |out: &mut Vec<Vec<u8>>| {
        if !out.is_empty() {
            let mut w = log.lock().unwrap();
            for piece in out.drain(..) {
                w.write(who, &piece);
            }
        }
    };
    loop {
        if let Some(at) = p.due() {
            let wait = at.saturating_duration_since(Instant::now());
            if !readable_within(r.as_raw_fd(), wait) {
                p.tick(Instant::now(), &mut out);
                flush(&mut out);
                continue;
            }
        }
        let n = match r.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        p.feed(&buf[..n], Instant::now(), &mut out);
        flush(&mut out);
    }
    p.finish(&mut out);
    flush(&mut out);
}

/// Waits until `fd` is readable (or at its end), at most `wait`. An interrupted wait says no (the caller
/// waits again for what is left); another error says yes (the read then blocks, as without a poll).
fn readable_within(fd: std::os::fd::RawFd, wait: Duration) -> bool {
    let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    let ms = wait.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: poll on one valid descriptor we own, with a stack pollfd.
    let r = unsafe { libc::poll(&mut pfd, 1, ms) };
    r > 0 || (r < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR))
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
/// The keeper's own end (the server's is in its state file): no run record is a usage error, a log it
/// cannot open an internal one.
pub fn main(dir: PathBuf) -> Exit {
    // The run's name lock, handed over by `vigil up` (held on our side from now on; never passed to the
    // server), else taken here.
    let inherited = std::env::var("VIGIL_KEEPER_LOCK_FD").ok().and_then(|v| v.parse::<i32>().ok());
    let _lock = match inherited {
        // SAFETY: fcntl on the descriptor `up` left open for us: close-on-exec from now on.
        Some(fd) if unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } == 0 => None,
        _ => match run::NameLock::try_take(&dir) {
            Ok(Some(l)) => Some(l),
            _ => return Exit::Refused,
        },
    };
    let Some(rec) = run::read_json::<RunRecord>(&dir.join("run.json")) else {
        return Exit::Usage;
    };
    let secrets: Secrets = run::stored_secrets(&rec.name, None);
    let (argv, env) = run::unredact(&rec, &secrets);
    let me = std::process::id() as i32;
    // SAFETY: prctl with constant arguments.
    unsafe {
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    }
    let set = block_signals();
    let mut st = State {
        keeper_pid: me,
        keeper: procs::ProcId::of(me),
        started_unix_ms: crate::state::now_ms(),
        ..State::default()
    };

    let log_path = PathBuf::from(&rec.log);
    let file = match open_log(&log_path) {
        Ok(f) => f,
        Err(e) => {
            st.spawn_error = Some(format!("cannot open log {}: {e}", log_path.display()));
            write_state(&dir, &st);
            return Exit::Internal;
        }
    };
    let size = file.metadata().map(|m| m.len()).unwrap_or(0);
    let log = Arc::new(Mutex::new(LogWriter {
        path: log_path,
        file,
        size,
        max: rec.log_max_bytes,
        keep: rec.log_keep.max(1),
        secrets: crate::sinks::redact::secret_values(&secrets).into_iter().map(String::into_bytes).collect(),
        open: None,
        broken: [false; 2],
    }));

    let mut cmd = std::process::Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env("VIGIL_RUN", &rec.name)
        .env(crate::node::up::MARK, &dir)
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
            return Exit::Internal;
        }
    };
    let server = child.id() as i32;
    st.server_pid = Some(server);
    st.running = true;
    write_state(&dir, &st);
    let out = child.stdout.take().unwrap();
    let err = child.stderr.take().unwrap();
    let (l1, l2) = (log.clone(), log.clone());
    let t_out = std::thread::spawn(move || pump(out, 0, l1));
    let t_err = std::thread::spawn(move || pump(err, 1, l2));

    // Stop requests arrive as signals. While one is being carried out the keeper does not exit, so its
    // record of what it did (events.jsonl) is complete.
    let stopping = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stopping2 = stopping.clone();
    let sdir = dir.clone();
    std::thread::spawn(move || loop {
        // SAFETY: sigwaitinfo on the set blocked above, into a siginfo we own.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        let sig = unsafe { libc::sigwaitinfo(&set, &mut info) };
        if sig < 0 {
            continue;
        }
        stopping2.store(true, std::sync::atomic::Ordering::SeqCst);
        // `vigil down` sends the grace with the signal (sigqueue's value): a stop never waits on a file.
        // SAFETY: the value of a queued signal is set by its sender.
        let queued = (info.si_code == libc::SI_QUEUE).then(|| unsafe { info.si_value().sival_ptr as usize as i32 });
        let grace = if sig == libc::SIGUSR1 {
            Duration::ZERO
        } else if let Some(ms) = queued.filter(|ms| *ms >= 0) {
            Duration::from_millis(ms as u64)
        } else {
            let req: Option<StopRequest> = run::read_json(&sdir.join("stop.json"));
            Duration::from_millis(req.map_or(10_000, |r| r.grace_ms))
        };
        run::append_event(
            &sdir,
            RunEvent::StopRequested { t_unix_ms: crate::state::now_ms(), grace_ms: grace.as_millis() as u64 }
                .to_value(),
        );
        let d2 = sdir.clone();
        let rep = procs::stop_tree(me, false, grace, &mut |signal, pids| {
            run::append_event(&d2, RunEvent::Signal { signal, pids, t_unix_ms: crate::state::now_ms() }.to_value());
        });
        run::append_event(&sdir, RunEvent::Stopped { t_unix_ms: crate::state::now_ms(), report: &rep }.to_value());
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
            st.ended_unix_ms = Some(crate::state::now_ms());
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
    // every process of the run has ended: commands need not look for its processes any more
    st.keeper_done = true;
    write_state(&dir, &st);
    Exit::Ready
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds each read at its time (ms after `t0`) and returns the bytes that reach the log.
    fn run(secrets: &[&str], reads: &[(u64, &[u8])]) -> Vec<u8> {
        let t0 = Instant::now();
        let mut p = Pump::new(secrets.iter().map(|s| s.as_bytes().to_vec()).collect());
        let mut out = Vec::new();
        for (at, data) in reads {
            let now = t0 + Duration::from_millis(*at);
            p.tick(now, &mut out);
            p.feed(data, now, &mut out);
        }
        p.finish(&mut out);
        out.concat()
    }

    #[test]
    fn lines_are_written_whole_and_partial_ones_at_the_end() {
        assert_eq!(run(&[], &[(0, b"a\nb"), (1, b"c\nd")]), b"a\nbc\nd\n");
        assert_eq!(run(&[], &[(0, b"crlf\r\n\r\nnext\r"), (1, b"\n")]), b"crlf\r\n\nnext\r\n");
        assert_eq!(run(&[], &[(0, b"\n\n")]), b"\n\n");
        assert_eq!(run(&[], &[]), b"");
    }

    #[test]
    fn each_bar_state_is_written_when_it_comes_ended_by_cr() {
        let t0 = Instant::now();
        let mut p = Pump::new(vec![]);
        let mut out = Vec::new();
        p.feed(b"phase line\n", t0, &mut out);
        assert_eq!(out.concat(), b"phase line\n");
        out.clear();
        // tqdm: the `\r` comes before each state; each state is in the log before the next one comes
        for (i, s) in [&b"\rbar 0/3"[..], b"\rbar 1/3", b"\rbar 2/3"].iter().enumerate() {
            p.feed(s, t0 + Duration::from_secs(i as u64), &mut out);
            assert_eq!(out.concat(), [&s[1..], b"\r"].concat());
            out.clear();
        }
        // the last state and the newline that closes the bar, in two writes as tqdm's close does
        p.feed(b"\rbar 3/3", t0 + Duration::from_secs(3), &mut out);
        p.feed(b"\n", t0 + Duration::from_secs(3), &mut out);
        assert_eq!(out.concat(), b"bar 3/3\r\n");
        // a writer that ends its states with `\r` instead gives the same log
        assert_eq!(run(&[], &[(0, b"a 1/2\r"), (1, b"a 2/2\r"), (2, b"\n")]), b"a 1/2\ra 2/2\r\n");
        // a bar cut short (the server died mid-bar): its line is closed
        assert_eq!(run(&[], &[(0, b"x\n\rbar 1/9")]), b"x\nbar 1/9\r\n");
    }

    #[test]
    fn a_state_torn_across_reads_is_written_again_whole() {
        let log = run(&[], &[(0, b"\rCapturing 12/5"), (1, b"1 [00:01]\rCapturing 13/51"), (2, b"\n")]);
        assert_eq!(log, b"Capturing 12/5\rCapturing 12/51 [00:01]\rCapturing 13/51\r\n");
    }

    #[test]
    fn ordinary_partial_lines_are_not_written_before_their_end() {
        let t0 = Instant::now();
        let mut p = Pump::new(vec![]);
        let mut out = Vec::new();
        p.feed(b"INFO half a li", t0, &mut out);
        assert!(out.is_empty());
        p.feed(b"ne\n", t0, &mut out);
        assert_eq!(out.concat(), b"INFO half a line\n");
    }

    #[test]
    fn an_overlong_line_is_written_in_pieces() {
        let big = vec![b'x'; PIECE_MAX + 10];
        let log = run(&[], &[(0, &big), (1, b"yz\n")]);
        let lines: Vec<&[u8]> = log.split(|b| *b == b'\n').collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0].len(), PIECE_MAX + 10);
        assert_eq!(lines[1], b"yz");
        // an overlong state too
        let log = run(&[], &[(0, b"\r"), (1, &big), (2, b"\rnext\n")]);
        assert!(log.ends_with(b"\nnext\r\n") || log.ends_with(b"\nnext\n"), "{:?}", &log[log.len() - 12..]);
        assert!(log.split(|b| *b == b'\n').all(|l| l.len() <= PIECE_MAX + 11));
    }

    #[test]
    fn past_the_cap_states_are_thinned_to_one_a_second_and_the_last_is_kept() {
        // 10 states a second for 10 minutes, 200 bytes each: 12 MB without a bound
        let state = |k: u32| format!("\rCapturing batches (bs={k:<170}): {k}/6000");
        let t0 = Instant::now();
        let mut p = Pump::new(vec![]);
        let mut out = Vec::new();
        let mut seen_at: Vec<(u32, Duration)> = Vec::new();
        for k in 0..6000u32 {
            let now = t0 + Duration::from_millis(100 * k as u64);
            p.tick(now, &mut out);
            p.feed(state(k).as_bytes(), now, &mut out);
            for piece in out.drain(..) {
                let text = String::from_utf8(piece).unwrap();
                if let Some(n) = text.rsplit(": ").next().and_then(|x| x.trim_end().strip_suffix("/6000")) {
                    seen_at.push((n.parse().unwrap(), now - t0));
                }
            }
        }
        // the bar stops at 5999 for 3 s: its last state gets its turn within the period
        let stop = t0 + Duration::from_millis(599_900);
        let due = p.due().expect("the last state waits");
        assert!(due <= stop + REDRAW_EVERY);
        p.tick(due, &mut out);
        assert!(String::from_utf8(out.concat()).unwrap().contains("5999/6000\r"), "the last state is written");
        out.clear();
        p.feed(b"\n", stop + Duration::from_secs(3), &mut out);
        assert_eq!(out.concat(), b"\n");
        // the first 64 KiB hold every state; past them, about one a second
        let full = seen_at.iter().enumerate().take_while(|(i, (k, _))| *k as usize == *i).count();
        assert!(full > 300 && full < 340, "{full} states before thinning");
        let thinned = seen_at.len() - full;
        assert!((560..=600).contains(&thinned), "{thinned} states in 9.5 minutes past the cap");
        assert!(seen_at.windows(2).skip(full).all(|w| w[1].1 - w[0].1 >= REDRAW_EVERY));
    }

    #[test]
    fn a_thinned_bar_keeps_its_lines_bounded() {
        let mut log = Vec::new();
        let t0 = Instant::now();
        let mut p = Pump::new(vec![]);
        for k in 0..20_000u64 {
            let now = t0 + Duration::from_millis(50 * k);
            p.tick(now, &mut log);
            p.feed(format!("\rstate {k:>150}").as_bytes(), now, &mut log);
        }
        p.feed(b"\rfinal\n", t0 + Duration::from_secs(1001), &mut log);
        let log = log.concat();
        assert!(log.ends_with(b"final\n"));
        for l in log.split(|b| *b == b'\n') {
            assert!(l.len() <= REDRAW_LINE_MAX + 200, "a line of {} bytes", l.len());
        }
        assert!(log.len() < 2 * REDRAW_LINE_MAX + 1000 * 200, "{} bytes", log.len());
    }

    #[test]
    fn a_state_written_before_its_end_holds_back_a_possible_secret_start() {
        let secret = "hf_abcdef1234";
        let t0 = Instant::now();
        let mut p = Pump::new(vec![secret.as_bytes().to_vec()]);
        let mut out = Vec::new();
        p.feed(b"\rDownloading token=hf_abc", t0, &mut out);
        assert_eq!(out.concat(), b"Downloading token=\r", "the secret's start waits");
        out.clear();
        p.feed(b"def1234 1/2\rnext", t0, &mut out);
        let log = out.concat();
        assert_eq!(log, b"Downloading token=hf_abcdef1234 1/2\rnext\r");
        // the same while thinned: the held state, written at its turn without the possible start, is
        // written whole at the line's end
        let mut p = Pump::new(vec![secret.as_bytes().to_vec()]);
        let mut out = Vec::new();
        p.feed(&[b"\r".as_slice(), &vec![b'x'; REDRAW_LINE_MAX]].concat(), t0, &mut out);
        assert!(p.thin);
        out.clear();
        p.feed(b"\rstate hf_ab", t0 + Duration::from_millis(100), &mut out);
        assert!(out.is_empty(), "thinned: held until its turn");
        p.tick(t0 + REDRAW_EVERY, &mut out);
        assert_eq!(out.concat(), b"\nstate \r");
        out.clear();
        p.feed(b"\n", t0 + REDRAW_EVERY, &mut out);
        assert_eq!(out.concat(), b"state hf_ab\n");
        assert_eq!(secret_tail(b"xx hf_", &[secret.as_bytes().to_vec()]), 3);
        assert_eq!(secret_tail(b"xx hf_abcdef1234", &[secret.as_bytes().to_vec()]), 0, "a whole one is redacted");
        assert_eq!(secret_tail(b"", &[secret.as_bytes().to_vec()]), 0);
    }

    fn writer(dir: &Path, secrets: &[&str]) -> LogWriter {
        let path = dir.join("server.log");
        LogWriter {
            file: open_log(&path).unwrap(),
            path,
            size: 0,
            max: 0,
            keep: 1,
            secrets: secrets.iter().map(|s| s.as_bytes().to_vec()).collect(),
            open: None,
            broken: [false; 2],
        }
    }

    fn temp(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("vigil-keeper-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn the_other_stream_ends_an_open_bar_line_and_secrets_are_redacted() {
        let d = temp("interleave");
        let mut w = writer(&d, &["sekrit-value"]);
        w.write(1, b"bar 1/9 sekrit-value\r");
        w.write(0, b"INFO a log line\n");
        w.write(1, b"bar 2/9\r");
        w.write(1, b"\n");
        w.write(1, b"bar 3/9\r");
        w.write(0, b"INFO another\n");
        w.write(1, b"\n"); // the bar's own newline: its line already ended
        w.write(0, b"last\n");
        let log = std::fs::read(d.join("server.log")).unwrap();
        assert_eq!(log, b"bar 1/9 ***\r\nINFO a log line\nbar 2/9\r\nbar 3/9\r\nINFO another\nlast\n");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn rotation_ends_an_open_bar_line_in_the_old_file() {
        let d = temp("rotate");
        let mut w = writer(&d, &[]);
        w.max = 10;
        w.write(0, b"bar 1/9 ...\r");
        w.write(0, b"bar 2/9\r");
        w.write(0, b"\n");
        assert_eq!(std::fs::read(d.join("server.log.1")).unwrap(), b"bar 1/9 ...\r\n");
        assert_eq!(std::fs::read(d.join("server.log")).unwrap(), b"bar 2/9\r\n");
        let _ = std::fs::remove_dir_all(&d);
    }
}
