//! Line sources for `wait`: a followed log file (may not exist yet; may be truncated in place or
//! renamed and recreated), stdin, or a command's output (`kubectl logs -f`, `journalctl -fu`).

use crate::sinks::events::Typed;
use crate::sources::lines::Splitter;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::sync::mpsc::Sender;

/// The typed side of a log-source note.
fn log_state(state: &'static str, path: &std::path::Path) -> Typed {
    Typed::LogSource { state, path: Some(path.display().to_string()) }
}

#[derive(Debug)]
pub enum SourceMsg {
    Line(String),
    /// A note for the user (file appeared, rotated, command ended), with what it says as data.
    Note(String, Typed),
    /// The SSH connection carrying the log dropped (probes pause until it is back).
    Disconnected,
    /// Connected again; the log resumes at byte `offset`.
    Reconnected {
        host: String,
        down_ms: u64,
        offset: u64,
    },
    /// The stream resumed on the same connection (a remote `tail` ended on its own).
    Resumed,
    /// The connection is gone for good.
    Lost(String),
}

const POLL: Duration = Duration::from_millis(25);
/// A redraw (a progress bar's state after `\r`) is handed on once its source has been quiet this long: the
/// bar's writer puts each state in one write, so a read that stops inside one is only a torn read.
pub const REDRAW_QUIET: Duration = Duration::from_millis(10);
/// With change notification, a slow poll still runs as a safety net (an event lost to a full queue).
const SAFETY_POLL: Duration = Duration::from_secs(1);

/// Wakes the follower when something in the log's directory changes (inotify: a write, a truncation, the
/// file created, renamed or replaced), so a new line is read within a wake-up instead of a poll period.
/// Network filesystems (NFS, SMB/CIFS, Lustre, GPFS, CephFS, FUSE, 9p) never report writes made on
/// other hosts, so there, and wherever inotify is unavailable, the follower polls every 25 ms as before.
struct Waker {
    fd: Option<tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>>,
}

impl Waker {
    fn new(path: &std::path::Path) -> Waker {
        Waker { fd: Self::watch(path) }
    }

    fn watch(path: &std::path::Path) -> Option<tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>> {
        use std::os::fd::FromRawFd;
        use std::os::unix::ffi::OsStrExt;
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
        let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
        if network_fs(&c) {
            return None;
        }
        // SAFETY: inotify_init1 returns a new descriptor or -1; ownership passes to OwnedFd.
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        if fd < 0 {
            return None;
        }
        // SAFETY: fd is a fresh, valid descriptor that nothing else owns.
        let owned = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        let mask = libc::IN_MODIFY
            | libc::IN_ATTRIB
            | libc::IN_CLOSE_WRITE
            | libc::IN_CREATE
            | libc::IN_DELETE
            | libc::IN_MOVED_FROM
            | libc::IN_MOVED_TO;
        // SAFETY: a valid inotify descriptor and a NUL-terminated path.
        if unsafe { libc::inotify_add_watch(fd, c.as_ptr(), mask) } < 0 {
            return None;
        }
        // SAFETY: `owned` is an open descriptor the AsyncFd takes ownership of; it stays open and the same
        // until the AsyncFd is dropped.
        unsafe { tokio::io::unix::AsyncFd::register_with_interest(owned, tokio::io::Interest::READABLE) }.ok()
    }

    /// Until something changes (or the safety poll), or one poll period without notification.
    async fn wait(&self) {
        use std::os::fd::AsRawFd;
        let Some(fd) = &self.fd else {
            tokio::time::sleep(POLL).await;
            return;
        };
        tokio::select! {
            r = fd.readable() => {
                if let Ok(mut g) = r {
                    let mut buf = [0u8; 4096];
                    // SAFETY: reading into a local buffer from a valid non-blocking descriptor.
                    while unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) } > 0 {}
                    g.clear_ready();
                }
            }
            _ = tokio::time::sleep(SAFETY_POLL) => {}
        }
    }
}

/// Is the path on a network filesystem (the history store keeps off those: SQLite's locks)?
pub fn network_fs_path(p: &std::path::Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(p.as_os_str().as_bytes()).is_ok_and(|c| network_fs(&c))
}

/// Is the directory on a network filesystem, where inotify does not see other hosts' writes?
fn network_fs(dir: &std::ffi::CStr) -> bool {
    // SAFETY: statfs fills a zeroed struct from a NUL-terminated path.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(dir.as_ptr(), &mut st) } != 0 {
        return true; // cannot tell: poll
    }
    const NETWORK: [i64; 10] = [
        0x6969,     // NFS
        0x517B,     // SMB
        0xFF534D42, // CIFS
        0xFE534D42, // SMB2
        0x65735546, // FUSE
        0x00C36400, // CephFS
        0x0BD00BD0, // Lustre
        0x47504653, // GPFS
        0x01021997, // 9p
        0x5346414F, // AFS
    ];
    NETWORK.contains(&(st.f_type as i64))
}

/// How many messages a log source may have queued for the watch: a source that reads faster than the watch
/// judges (a FIFO fed by `yes`, a log growing by gigabytes) waits for it, so memory stays bounded (at most
/// this many lines of at most 64 KiB each).
pub const QUEUE: usize = 256;
/// At most this many bytes are read from a file in one wake-up before the follower yields: a log that grows
/// faster than it is read never keeps the runtime (interrupts, deadlines, probes) waiting.
const READ_PER_WAKE: usize = 1 << 20;

/// Sends every line `push` gives, in order; false once the watch is gone.
async fn send_lines(split: &mut Splitter, data: &[u8], tx: &Sender<SourceMsg>) -> bool {
    let mut lines = Vec::new();
    split.push(data, &mut |l| lines.push(l));
    for l in lines {
        if tx.send(SourceMsg::Line(l)).await.is_err() {
            return false;
        }
    }
    true
}

/// Follows a file by path. Reads from its start, then new data as it comes. Detects truncation
/// (size below our offset: read again from 0) and replacement (another inode at the path: finish
/// the old file, then read the new one from 0). A path that is not a regular file (a FIFO, a character
/// device such as `/dev/zero`) is read as a stream ([`follow_stream`]). Runs until the receiver is gone.
pub async fn follow_file(path: PathBuf, tx: Sender<SourceMsg>) {
    let mut file: Option<(std::fs::File, u64)> = None; // (file, inode)
    let mut offset: u64 = 0;
    let mut split = Splitter::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut waited_note = false;
    let mut redraw_quiet = false;
    let waker = Waker::new(&path);
    loop {
        if tx.is_closed() {
            return;
        }
        if file.is_none() {
            // a FIFO or a device: never opened here (opening a FIFO blocks until a writer comes)
            if std::fs::metadata(&path).is_ok_and(|m| !m.is_file() && !m.is_dir()) {
                if waited_note {
                    let _ = tx
                        .send(SourceMsg::Note(format!("log {} appeared", path.display()), log_state("appeared", &path)))
                        .await;
                }
                return follow_stream(path, tx).await;
            }
            match std::fs::File::open(&path) {
                Ok(f) if f.metadata().is_ok_and(|m| m.is_file()) => {
                    let ino = f.metadata().map(|m| m.ino()).unwrap_or(0);
                    if waited_note {
                        let _ = tx
                            .send(SourceMsg::Note(
                                format!("log {} appeared", path.display()),
                                log_state("appeared", &path),
                            ))
                            .await;
                    }
                    file = Some((f, ino));
                    offset = 0;
                }
                // not there yet, or a directory (said at the start; one made later is waited past)
                _ => {
                    if !waited_note {
                        let n = format!("waiting for log {} to appear", path.display());
                        let _ = tx.send(SourceMsg::Note(n, log_state("waiting", &path))).await;
                        waited_note = true;
                    }
                    waker.wait().await;
                    continue;
                }
            }
        }
        let (f, ino) = file.as_mut().unwrap();
        // Truncated in place?
        if let Ok(m) = f.metadata() {
            if m.len() < offset {
                if let Some(l) = split.finish() {
                    let _ = tx.send(SourceMsg::Line(l)).await;
                }
                let _ = tx
                    .send(SourceMsg::Note(
                        "log truncated: reading it again from the start".into(),
                        log_state("truncated", &path),
                    ))
                    .await;
                offset = 0;
                let _ = f.seek(SeekFrom::Start(0));
            }
        }
        let mut got = 0usize;
        loop {
            match f.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    got += n;
                    redraw_quiet = false;
                    offset += n as u64;
                    if !send_lines(&mut split, &buf[..n], &tx).await {
                        return;
                    }
                    if got >= READ_PER_WAKE {
                        break;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
        }
        if got >= READ_PER_WAKE {
            // more may be there: read on after everything else that waits had its turn
            tokio::task::yield_now().await;
            continue;
        }
        if got == 0 {
            // At the end of the old file: has the path been replaced?
            match std::fs::metadata(&path) {
                Ok(m) if m.ino() != *ino => {
                    if let Some(l) = split.finish() {
                        let _ = tx.send(SourceMsg::Line(l)).await;
                    }
                    let _ = tx
                        .send(SourceMsg::Note(
                            "log replaced (rotated): following the new file".into(),
                            log_state("rotated", &path),
                        ))
                        .await;
                    file = None;
                    continue;
                }
                _ => {}
            }
            if split.redraw_waiting() {
                // a bar's state without its end (its end is the next state): handed on once the file was
                // quiet for REDRAW_QUIET
                if !redraw_quiet {
                    redraw_quiet = true;
                    tokio::time::sleep(REDRAW_QUIET).await;
                    continue;
                }
                if let Some(l) = split.take_redraw() {
                    let _ = tx.send(SourceMsg::Line(l)).await;
                }
            }
            waker.wait().await;
        }
    }
}

/// A log path that is no regular file: a FIFO (read until its writer closes, then opened again for the next
/// one) or a character device (`/dev/zero` never ends: its bytes are read, bounded, until the deadline). Its
/// reads run on the blocking pool (`tokio::fs`), so a FIFO that is quiet, or has no writer yet, never blocks
/// the runtime, and a source that never ends is read one bounded chunk per wake-up.
async fn follow_stream(path: PathBuf, tx: Sender<SourceMsg>) {
    loop {
        let f = match tokio::fs::File::open(&path).await {
            Ok(f) => f,
            Err(e) => {
                let _ =
                    tx.send(SourceMsg::Note(format!("log {}: {e}", path.display()), log_state("error", &path))).await;
                return;
            }
        };
        read_stream(f, tx.clone()).await;
        let fifo = std::fs::metadata(&path).is_ok_and(|m| m.file_type().is_fifo());
        if !fifo || tx.is_closed() {
            return;
        }
        let n = format!("log {} (a FIFO): its writer closed; waiting for the next", path.display());
        if tx.send(SourceMsg::Note(n, log_state("writer_closed", &path))).await.is_err() {
            return;
        }
    }
}

/// What one read of a live stream gave.
pub enum Got {
    /// This many bytes, in the buffer.
    Data(usize),
    /// The stream was quiet for `REDRAW_QUIET` while a redraw waited for its end: the redraw as it stands.
    Redraw(String),
    /// The end of the stream, or an error.
    End,
}

/// One read of a stream; while a redraw waits for its end, a read that finds the stream quiet for
/// `REDRAW_QUIET` gives the redraw as it stands instead.
pub async fn read_live<R: tokio::io::AsyncRead + Unpin>(r: &mut R, buf: &mut [u8], split: &mut Splitter) -> Got {
    loop {
        let got = if split.redraw_waiting() {
            match tokio::time::timeout(REDRAW_QUIET, r.read(buf)).await {
                Ok(got) => got,
                Err(_) => match split.take_redraw() {
                    Some(l) => return Got::Redraw(l),
                    None => continue,
                },
            }
        } else {
            r.read(buf).await
        };
        return match got {
            Ok(0) | Err(_) => Got::End,
            Ok(n) => Got::Data(n),
        };
    }
}

/// Reads any async stream (stdin, a child's pipe, a FIFO) into lines until EOF, waiting for the watch when
/// its queue is full.
pub async fn read_stream<R: tokio::io::AsyncRead + Unpin>(mut r: R, tx: Sender<SourceMsg>) {
    let mut split = Splitter::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match read_live(&mut r, &mut buf, &mut split).await {
            Got::Data(n) => {
                if !send_lines(&mut split, &buf[..n], &tx).await {
                    return;
                }
            }
            Got::Redraw(l) => {
                if tx.send(SourceMsg::Line(l)).await.is_err() {
                    return;
                }
            }
            Got::End => break,
        }
    }
    if let Some(l) = split.finish() {
        let _ = tx.send(SourceMsg::Line(l)).await;
    }
}

/// Runs `sh -c CMD` and reads its stdout and stderr as log lines.
pub fn spawn_log_cmd(cmd: &str, tx: Sender<SourceMsg>) -> std::io::Result<tokio::process::Child> {
    let mut child = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let out = child.stdout.take().unwrap();
    let err = child.stderr.take().unwrap();
    let tx2 = tx.clone();
    tokio::spawn(read_stream(out, tx));
    tokio::spawn(read_stream(err, tx2));
    Ok(child)
}

/// Is the process alive? A zombie (exited, not yet reaped) is not alive.
pub fn pid_alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => {
            // state is the field after the last ')' (the command name may contain spaces and parens)
            let state = s.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next());
            !matches!(state, Some("Z") | Some("X") | None)
        }
        Err(_) => false,
    }
}

/// The command line of a process (`/proc/PID/cmdline`), if readable.
pub fn cmdline(pid: i32) -> Option<Vec<String>> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let v: Vec<String> =
        raw.split(|b| *b == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
    (!v.is_empty()).then_some(v)
}

pub use vigil_core::arg_value;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arg_values() {
        let a: Vec<String> = ["x", "--port", "30000", "--node-rank=1"].iter().map(|s| s.to_string()).collect();
        assert_eq!(arg_value(&a, "--port"), Some("30000"));
        assert_eq!(arg_value(&a, "--node-rank"), Some("1"));
        assert_eq!(arg_value(&a, "--tp"), None);
    }

    /// The next message's line, waiting at most 5 s (the event is the message itself).
    async fn next_line(rx: &mut tokio::sync::mpsc::Receiver<SourceMsg>) -> Option<String> {
        loop {
            match tokio::time::timeout(Duration::from_secs(5), rx.recv()).await.expect("no message within 5 s") {
                Some(SourceMsg::Line(l)) => return Some(l),
                Some(_) => continue,
                None => return None,
            }
        }
    }

    /// A stream (stdin, `--log-cmd`, the remote `tail`) hands on each state of a `\r` bar while it is the
    /// bar's latest, and never twice.
    #[tokio::test]
    async fn a_stream_hands_on_each_bar_state_before_its_end() {
        use tokio::io::AsyncWriteExt;
        let (mut w, r) = tokio::io::duplex(4096);
        let (tx, mut rx) = tokio::sync::mpsc::channel(QUEUE);
        tokio::spawn(read_stream(r, tx));
        w.write_all(b"phase line\n\rbar 1/3").await.unwrap();
        assert_eq!(next_line(&mut rx).await.as_deref(), Some("phase line"));
        assert_eq!(next_line(&mut rx).await.as_deref(), Some("bar 1/3"));
        w.write_all(b"\rbar 2/3").await.unwrap();
        assert_eq!(next_line(&mut rx).await.as_deref(), Some("bar 2/3"));
        w.write_all(b"\n").await.unwrap();
        drop(w);
        assert_eq!(next_line(&mut rx).await, None);
    }

    /// A followed file written by the server itself (raw tqdm bytes, as on a remote node or with `--log`)
    /// gives the same lines.
    #[tokio::test]
    async fn a_followed_file_hands_on_each_bar_state_before_its_end() {
        use std::io::Write;
        let dir = std::env::temp_dir().join(format!("vigil-follow-bar-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("server.log");
        let mut f = std::fs::File::create(&path).unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::channel(QUEUE);
        let h = tokio::spawn(follow_file(path.clone(), tx));
        f.write_all(b"phase line\n\rbar 1/3").unwrap();
        assert_eq!(next_line(&mut rx).await.as_deref(), Some("phase line"));
        assert_eq!(next_line(&mut rx).await.as_deref(), Some("bar 1/3"));
        f.write_all(b"\rbar 2/3").unwrap();
        assert_eq!(next_line(&mut rx).await.as_deref(), Some("bar 2/3"));
        f.write_all(b"\nafter\n").unwrap();
        assert_eq!(next_line(&mut rx).await.as_deref(), Some("after"), "the bar's end gave nothing again");
        h.abort();
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn own_cmdline_and_liveness() {
        let me = std::process::id() as i32;
        assert!(pid_alive(me));
        assert!(cmdline(me).is_some());
        assert!(!pid_alive(i32::MAX));
    }
}
