//! Process facts from /proc: the tree under a pid, command lines, ages, listening ports and their
//! holders, and stopping a tree with proof (SIGTERM, grace, SIGKILL, then verify nothing is left).

/// What stopping a tree did: an event payload, defined with the events it travels in.
use crate::sinks::events::{StopReport, Stopped};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
pub struct Proc {
    pub pid: i32,
    pub ppid: i32,
    pub comm: String,
    pub state: char,
    /// Start time in clock ticks after boot.
    pub start_ticks: u64,
}

pub fn read_proc(pid: i32) -> Option<Proc> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let open = s.find('(')?;
    let close = s.rfind(')')?;
    let comm = s[open + 1..close].to_string();
    let rest: Vec<&str> = s[close + 1..].split_whitespace().collect();
    // rest[0]=state rest[1]=ppid ... rest[19]=starttime
    Some(Proc {
        pid,
        ppid: rest.get(1)?.parse().ok()?,
        comm,
        state: rest.first()?.chars().next()?,
        start_ticks: rest.get(19)?.parse().ok()?,
    })
}

/// The machine's boot id (`/proc/sys/kernel/random/boot_id`): with a pid and its start time it names one
/// process for all time (a pid alone is reused, and start times restart at every boot).
pub fn boot_id() -> String {
    static ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    ID.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/random/boot_id").map(|s| s.trim().to_string()).unwrap_or_default()
    })
    .clone()
}

/// One process for all time: its pid, its start time (`/proc/PID/stat` field 22, clock ticks after boot) and
/// the boot it started in. A pid that no longer matches is another process, never to be signalled.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ProcId {
    pub pid: i32,
    pub start_ticks: u64,
    pub boot_id: String,
}

impl ProcId {
    /// The identity of the live (not zombie) process `pid` now.
    pub fn of(pid: i32) -> Option<ProcId> {
        let p = read_proc(pid).filter(|p| p.state != 'Z' && p.state != 'X')?;
        Some(ProcId { pid, start_ticks: p.start_ticks, boot_id: boot_id() })
    }

    /// Is this very process alive (same pid, start time and boot)?
    pub fn is_live(&self) -> bool {
        self.pid > 0 && ProcId::of(self.pid).is_some_and(|now| now == *self)
    }

    /// Sends `sig` to this process, and only to it: through a pidfd opened and then checked against the
    /// identity (a pid reused between the check and the signal cannot receive it), else (kernels before
    /// 5.3) by kill after the check. `value` travels with the signal (`sigqueue`'s value). False when the
    /// process is not this one any more.
    pub fn signal(&self, sig: i32, value: Option<i32>) -> bool {
        // SAFETY: pidfd_open on a pid; the descriptor is closed below.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, self.pid, 0) } as i32;
        if fd < 0 {
            if !self.is_live() {
                return false;
            }
            // SAFETY: kill/sigqueue on a pid we just checked.
            return unsafe {
                match value {
                    Some(v) => {
                        libc::sigqueue(self.pid, sig, libc::sigval { sival_ptr: v as usize as *mut libc::c_void }) == 0
                    }
                    None => libc::kill(self.pid, sig) == 0,
                }
            };
        }
        let ok = self.is_live() && {
            let info = value.map(|v| QueueInfo::new(sig, v));
            let ptr = info.as_ref().map_or(std::ptr::null(), |i| i as *const QueueInfo);
            // SAFETY: pidfd_send_signal on our descriptor with a siginfo laid out as the kernel reads it.
            unsafe { libc::syscall(libc::SYS_pidfd_send_signal, fd, sig, ptr, 0) == 0 }
        };
        // SAFETY: closing the descriptor we opened.
        unsafe { libc::close(fd) };
        ok
    }
}

/// A `siginfo_t` as `sigqueue` fills it (`SI_QUEUE`, our pid and uid, the value): what `pidfd_send_signal`
/// needs to carry a value. The kernel's layout on 64-bit Linux: three ints, padding, then the union.
#[repr(C)]
struct QueueInfo {
    signo: i32,
    errno: i32,
    code: i32,
    #[cfg(target_pointer_width = "64")]
    _pad: i32,
    pid: i32,
    uid: u32,
    value: usize,
    _rest: [u8; QUEUE_INFO_REST],
}

/// `siginfo_t` is 128 bytes; what follows the value is zero.
const QUEUE_INFO_REST: usize = 112 - 2 * std::mem::size_of::<usize>();

impl QueueInfo {
    fn new(sig: i32, v: i32) -> QueueInfo {
        QueueInfo {
            signo: sig,
            errno: 0,
            code: libc::SI_QUEUE,
            #[cfg(target_pointer_width = "64")]
            _pad: 0,
            pid: std::process::id() as i32,
            // SAFETY: getuid has no preconditions.
            uid: unsafe { libc::getuid() },
            value: v as usize,
            _rest: [0; QUEUE_INFO_REST],
        }
    }
}

/// Is the process ours (its `/proc/PID` owned by our effective uid)? A process of another user is never
/// taken for one of our runs, whatever its command line or environment says.
pub fn ours(pid: i32) -> bool {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    std::fs::metadata(format!("/proc/{pid}")).is_ok_and(|m| m.uid() == me)
}

/// Every live process of ours whose environment holds `key=value` (a run's mark), other than vigil itself.
pub fn marked(key: &str, value: &str) -> Vec<i32> {
    let me = std::process::id() as i32;
    all_procs()
        .into_iter()
        .filter(|p| p.state != 'Z' && p.state != 'X' && p.pid != me && ours(p.pid))
        .filter(|p| env_var(p.pid, key).as_deref() == Some(value))
        .map(|p| p.pid)
        .collect()
}

/// The value of `key` in a process's environment (bounded read of `/proc/PID/environ`; None when it is not
/// readable, e.g. another user's process).
pub fn env_var(pid: i32, key: &str) -> Option<String> {
    use std::io::Read;
    let f = std::fs::File::open(format!("/proc/{pid}/environ")).ok()?;
    let mut buf = Vec::new();
    f.take(1 << 20).read_to_end(&mut buf).ok()?;
    let want = format!("{key}=");
    buf.split(|b| *b == 0)
        .find_map(|kv| kv.strip_prefix(want.as_bytes()).map(|v| String::from_utf8_lossy(v).into_owned()))
}

pub fn all_procs() -> Vec<Proc> {
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return vec![];
    };
    rd.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok()).filter_map(read_proc).collect()
}

/// Live (non-zombie) descendants of `root`, not including it.
/// Every live descendant of `root`. Read through the kernel's `/proc/PID/task/TID/children` lists (a few
/// small reads for a server's tree, whatever the machine runs), else by scanning every process (kernels
/// without CONFIG_PROC_CHILDREN). Watches sample the tree every second or two: on a node with thousands of
/// processes the scan was most of vigil's CPU while waiting.
pub fn descendants(root: i32) -> Vec<i32> {
    static CHILDREN_FILES: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if *CHILDREN_FILES.get_or_init(|| std::path::Path::new("/proc/thread-self/children").exists()) {
        descendants_by_children(root)
    } else {
        descendants_by_scan(root)
    }
}

fn descendants_by_children(root: i32) -> Vec<i32> {
    let mut out = Vec::new();
    let mut stack = vec![root];
    let mut seen = BTreeSet::new();
    while let Some(p) = stack.pop() {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) else { continue };
        for t in tasks.flatten() {
            let Ok(b) = read_small(&t.path().join("children"), 1 << 20) else { continue };
            for c in String::from_utf8_lossy(&b).split_whitespace().filter_map(|c| c.parse::<i32>().ok()) {
                // a zombie is dead for every caller (its parent has not reaped it yet)
                if read_proc(c).is_some_and(|x| x.state != 'Z' && x.state != 'X') && seen.insert(c) {
                    out.push(c);
                    stack.push(c);
                }
            }
        }
    }
    out
}

fn descendants_by_scan(root: i32) -> Vec<i32> {
    let procs = all_procs();
    let mut kids: BTreeMap<i32, Vec<i32>> = BTreeMap::new();
    for p in &procs {
        if p.state != 'Z' && p.state != 'X' {
            kids.entry(p.ppid).or_default().push(p.pid);
        }
    }
    let mut out = Vec::new();
    let mut stack = vec![root];
    let mut seen = BTreeSet::new();
    while let Some(p) = stack.pop() {
        for &c in kids.get(&p).map(|v| v.as_slice()).unwrap_or(&[]) {
            if seen.insert(c) {
                out.push(c);
                stack.push(c);
            }
        }
    }
    out
}

pub fn alive(pid: i32) -> bool {
    crate::sources::follow::pid_alive(pid)
}

/// Seconds since the process started.
pub fn age_secs(p: &Proc) -> Option<u64> {
    let up: f64 = std::fs::read_to_string("/proc/uptime").ok()?.split_whitespace().next()?.parse().ok()?;
    // SAFETY: sysconf is always safe to call.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Some((up - p.start_ticks as f64 / hz).max(0.0) as u64)
}

/// Listening TCP ports → socket inode: from the kernel's socket diagnostics (netlink `sock_diag`, asking for
/// listening sockets only: tens on a busy node), else from `/proc/net/tcp{,6}` (which lists every
/// connection: thousands of lines on a serving node).
fn listening() -> Vec<(u16, u64)> {
    listening_diag().unwrap_or_else(listening_proc)
}

/// `NETLINK_SOCK_DIAG` with `SOCK_DIAG_BY_FAMILY` and a state mask of `TCP_LISTEN`, for IPv4 and IPv6
/// (linux/inet_diag.h). `None` when netlink is not available (a seccomp filter, an old kernel).
fn listening_diag() -> Option<Vec<(u16, u64)>> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    const NETLINK_SOCK_DIAG: i32 = 4;
    const SOCK_DIAG_BY_FAMILY: u16 = 20;
    const NLMSG_ERROR: u16 = 2;
    const NLMSG_DONE: u16 = 3;
    const TCP_LISTEN: u32 = 10;
    // SAFETY: socket(2) returns a new descriptor or -1; ownership passes to OwnedFd.
    let fd = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, NETLINK_SOCK_DIAG) };
    if fd < 0 {
        return None;
    }
    // SAFETY: a fresh descriptor nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let tv = libc::timeval { tv_sec: 1, tv_usec: 0 };
    // SAFETY: setsockopt with a valid timeval: every recv below is bounded.
    unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as u32,
        );
    }
    let mut out = Vec::new();
    for (seq, family) in [(1u32, libc::AF_INET as u8), (2, libc::AF_INET6 as u8)] {
        // nlmsghdr (16) + inet_diag_req_v2 (56): family, protocol, ext, pad, states, inet_diag_sockid (48)
        let mut req = [0u8; 72];
        req[0..4].copy_from_slice(&72u32.to_ne_bytes());
        req[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
        req[6..8].copy_from_slice(&((libc::NLM_F_REQUEST | libc::NLM_F_DUMP) as u16).to_ne_bytes());
        req[8..12].copy_from_slice(&seq.to_ne_bytes());
        req[16] = family;
        req[17] = libc::IPPROTO_TCP as u8;
        req[20..24].copy_from_slice(&(1u32 << TCP_LISTEN).to_ne_bytes());
        // SAFETY: sending a local buffer on a valid socket (the kernel is the default destination).
        if unsafe { libc::send(fd.as_raw_fd(), req.as_ptr().cast(), req.len(), 0) } != req.len() as isize {
            return None;
        }
        let mut buf = vec![0u8; 64 * 1024];
        'recv: for _ in 0..1024 {
            // SAFETY: receiving into a local buffer; bounded by SO_RCVTIMEO.
            let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n <= 0 {
                return None;
            }
            let mut off = 0usize;
            let n = n as usize;
            while off + 16 <= n {
                let len = u32::from_ne_bytes(buf[off..off + 4].try_into().ok()?) as usize;
                let kind = u16::from_ne_bytes(buf[off + 4..off + 6].try_into().ok()?);
                if len < 16 || off + len > n {
                    return None;
                }
                match kind {
                    NLMSG_DONE => break 'recv,
                    NLMSG_ERROR => return None,
                    SOCK_DIAG_BY_FAMILY if len >= 16 + 72 => {
                        // inet_diag_msg: family, state, timer, retrans, id (sport big-endian first), expires,
                        // rqueue, wqueue, uid, inode
                        let m = &buf[off + 16..off + len];
                        let sport = u16::from_be_bytes([m[4], m[5]]);
                        let inode = u32::from_ne_bytes(m[68..72].try_into().ok()?);
                        out.push((sport, inode as u64));
                    }
                    _ => {}
                }
                off += (len + 3) & !3;
            }
        }
    }
    Some(out)
}

/// `/proc/net/tcp{,6}`: every TCP socket of the network namespace, listening ones kept.
fn listening_proc() -> Vec<(u16, u64)> {
    let mut out = Vec::new();
    for f in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(s) = std::fs::read_to_string(f) else {
            continue;
        };
        for l in s.lines().skip(1) {
            let cols: Vec<&str> = l.split_whitespace().collect();
            if cols.len() < 10 || cols[3] != "0A" {
                continue;
            }
            let Some(port) = cols[1].rsplit(':').next().and_then(|p| u16::from_str_radix(p, 16).ok()) else {
                continue;
            };
            if let Ok(ino) = cols[9].parse::<u64>() {
                out.push((port, ino));
            }
        }
    }
    out
}

pub fn socket_inodes(pid: i32) -> BTreeSet<u64> {
    let mut out = BTreeSet::new();
    if let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/fd")) {
        for e in rd.flatten() {
            if let Ok(t) = std::fs::read_link(e.path()) {
                let t = t.to_string_lossy();
                if let Some(n) = t.strip_prefix("socket:[").and_then(|x| x.strip_suffix(']')) {
                    if let Ok(n) = n.parse() {
                        out.insert(n);
                    }
                }
            }
        }
    }
    out
}

/// TCP ports a process listens on.
pub fn ports_of(pid: i32) -> Vec<u16> {
    let inodes = socket_inodes(pid);
    let mut v: Vec<u16> = listening().into_iter().filter(|(_, i)| inodes.contains(i)).map(|(p, _)| p).collect();
    v.sort();
    v.dedup();
    v
}

/// Socket inodes listening on `port`.
pub fn port_inodes(port: u16) -> BTreeSet<u64> {
    listening().into_iter().filter(|(p, _)| *p == port).map(|(_, i)| i).collect()
}

/// Who listens on `port` (pid and command line), if this user can see it.
pub fn port_holder(port: u16) -> Option<(i32, String)> {
    let inodes: BTreeSet<u64> = listening().into_iter().filter(|(p, _)| *p == port).map(|(_, i)| i).collect();
    if inodes.is_empty() {
        return None;
    }
    for p in all_procs() {
        if socket_inodes(p.pid).iter().any(|i| inodes.contains(i)) {
            let cmd = crate::sources::follow::cmdline(p.pid).map(|v| v.join(" ")).unwrap_or(p.comm);
            return Some((p.pid, cmd));
        }
    }
    None
}

/// The holder of a port for messages: "pid 1234 (cmd, secrets redacted)".
pub fn port_holder_text(port: u16) -> String {
    match port_holder(port) {
        Some((pid, cmd)) => format!("pid {pid} ({})", crate::sinks::redact::redact_cmdline(&cmd)),
        None => "a process this user cannot see".into(),
    }
}

/// Does /proc show this pid (in our pid namespace)?
pub fn exists(pid: i32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// Is the port free to bind on this machine (any address)?
pub fn port_free(port: u16) -> bool {
    std::net::TcpListener::bind(("0.0.0.0", port)).is_ok() && std::net::TcpListener::bind(("127.0.0.1", port)).is_ok()
}

pub fn signal(pid: i32, sig: i32) -> bool {
    // SAFETY: kill(2) on a pid; failure is reported by the return value.
    unsafe { libc::kill(pid, sig) == 0 }
}

/// `stop_tree_until` for async code: its waits (up to `grace` + 5 s) run on a blocking thread, so the runtime
/// (other watches, interrupts) goes on meanwhile. A panic inside is resumed here.
pub async fn stop_tree_async(
    root: i32,
    include_root: bool,
    grace: Duration,
    mut on_event: impl FnMut(&str, &[i32]) + Send + 'static,
    kill_now: impl Fn() -> bool + Send + 'static,
) -> StopReport {
    match tokio::task::spawn_blocking(move || stop_tree_until(root, include_root, grace, &mut on_event, &kill_now))
        .await
    {
        Ok(r) => r,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}

/// Stops `root` and its descendants: SIGTERM to all, wait up to `grace`, SIGKILL what is left,
/// then wait (bounded) until every one is gone. New descendants that appear meanwhile are included.
pub fn stop_tree(root: i32, include_root: bool, grace: Duration, on_event: &mut dyn FnMut(&str, &[i32])) -> StopReport {
    stop_tree_until(root, include_root, grace, on_event, &|| false)
}

/// [`stop_tree`] whose grace ends early when `kill_now` says so (checked every 20 ms: a second Ctrl-C).
pub fn stop_tree_until(
    root: i32,
    include_root: bool,
    grace: Duration,
    on_event: &mut dyn FnMut(&str, &[i32]),
    kill_now: &dyn Fn() -> bool,
) -> StopReport {
    let t0 = Instant::now();
    let mut all: BTreeMap<i32, (String, String)> = BTreeMap::new();
    // Every process seen once stays in the set: a child orphaned when its parent died (reparented to
    // init or a subreaper) is no longer a descendant, but it was part of the tree and is stopped too.
    let tree = |all: &mut BTreeMap<i32, (String, String)>| {
        let mut v = if include_root { vec![root] } else { vec![] };
        v.extend(descendants(root));
        v.extend(all.keys().copied().filter(|p| !v.contains(p)).collect::<Vec<_>>());
        for p in v.iter().copied().filter(|p| alive(*p)) {
            // the command line as every stored record keeps it: through the redactor (a `stopped` event in a
            // run's events.jsonl must not hold `--api-key`'s value)
            all.entry(p).or_insert_with(|| {
                let cmd = crate::sources::follow::cmdline(p).map(|c| c.join(" ")).unwrap_or_default();
                (crate::sinks::redact::redact_cmdline(&cmd), String::new())
            });
        }
        v.into_iter().filter(|p| alive(*p)).collect::<Vec<_>>()
    };
    let live = tree(&mut all);
    for p in &live {
        signal(*p, libc::SIGTERM);
        all.get_mut(p).unwrap().1 = "SIGTERM".into();
    }
    on_event("SIGTERM", &live);
    // The grace period starts once the SIGTERM is sent and recorded: SIGKILL never comes sooner.
    let deadline = Instant::now() + grace;
    loop {
        let live = tree(&mut all);
        for p in &live {
            if all[p].1.is_empty() {
                signal(*p, libc::SIGTERM);
                all.get_mut(p).unwrap().1 = "SIGTERM".into();
            }
        }
        if live.is_empty() || Instant::now() >= deadline || kill_now() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let live = tree(&mut all);
    if !live.is_empty() {
        for p in &live {
            signal(*p, libc::SIGKILL);
            all.get_mut(p).unwrap().1 = "SIGKILL".into();
        }
        on_event("SIGKILL", &live);
        let kill_deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < kill_deadline && !tree(&mut all).is_empty() {
            for p in tree(&mut all) {
                signal(p, libc::SIGKILL);
                all.get_mut(&p).unwrap().1 = "SIGKILL".into();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let mut stopped = Vec::new();
    let mut survivors = Vec::new();
    for (pid, (cmd, how)) in all {
        let s = Stopped { pid, cmd, how: if how.is_empty() { "already gone".into() } else { how } };
        if alive(pid) {
            survivors.push(s);
        } else {
            stopped.push(s);
        }
    }
    StopReport { stopped, survivors, elapsed_ms: t0.elapsed().as_millis() as u64 }
}

/// Opens a regular file for reading; a FIFO, a device or a socket is refused. Looked at before opening
/// (opening a FIFO for reading blocks until a writer comes), and opened non-blocking so that a file swapped
/// for a FIFO in between cannot block either.
pub fn open_regular(path: &std::path::Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let not_regular = || std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a regular file");
    if !std::fs::metadata(path)?.is_file() {
        return Err(not_regular());
    }
    let f = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path)?;
    if !f.metadata()?.is_file() {
        return Err(not_regular());
    }
    Ok(f)
}

/// Reads a small regular file, at most `max` bytes: a FIFO, a device or a socket is refused (reading one
/// can block forever or never end), and a larger file is an error, never a growing buffer.
pub fn read_small(path: &std::path::Path, max: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let f = open_regular(path)?;
    let mut buf = Vec::new();
    f.take(max + 1).read_to_end(&mut buf)?;
    if buf.len() as u64 > max {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, format!("larger than {} MiB", max >> 20)));
    }
    Ok(buf)
}

/// Runs a command with its output captured, killed at the deadline (a hung `nvidia-smi` on a wedged GPU
/// node, a Python interpreter that never answers). Output is bounded by what the pipe buffers hold before
/// the deadline; callers use it for short reports.
pub fn output_within(mut cmd: std::process::Command, deadline: Duration) -> std::io::Result<std::process::Output> {
    use std::io::Read;
    use std::process::Stdio;
    let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
    let (mut out, mut err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let t_out = std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = (&mut out).take(4 << 20).read_to_end(&mut b);
        b
    });
    let t_err = std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = (&mut err).take(1 << 20).read_to_end(&mut b);
        b
    });
    let t0 = std::time::Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break s;
        }
        if t0.elapsed() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no answer within {:.0} s", deadline.as_secs_f64()),
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    Ok(std::process::Output {
        status,
        stdout: t_out.join().unwrap_or_default(),
        stderr: t_err.join().unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An identity names one process: a stale one (another start time, another boot) is not it and is never
    /// signalled; the live one is, with a value.
    #[test]
    fn a_stale_identity_is_never_signalled() {
        use std::os::unix::process::ExitStatusExt;
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let id = ProcId::of(child.id() as i32).unwrap();
        assert!(id.is_live());
        assert_eq!(id.boot_id.len(), 36, "{}", id.boot_id);
        let later = ProcId { start_ticks: id.start_ticks + 1, ..id.clone() };
        let other_boot = ProcId { boot_id: "another boot".into(), ..id.clone() };
        for stale in [&later, &other_boot] {
            assert!(!stale.is_live());
            assert!(!stale.signal(libc::SIGKILL, None));
            assert!(!stale.signal(libc::SIGKILL, Some(5)));
        }
        assert!(child.try_wait().unwrap().is_none(), "a stale identity was signalled");
        assert!(id.signal(libc::SIGTERM, Some(1234)));
        assert_eq!(child.wait().unwrap().signal(), Some(libc::SIGTERM));
        assert!(!id.is_live(), "a reaped process is gone");
        assert!(!id.signal(libc::SIGTERM, None));
    }

    /// A run's mark is read from a process's environment: present in a child given it, absent in one
    /// without it (another server sharing the GPU is not the stopped run's leftover).
    #[test]
    fn env_var_reads_a_childs_environment() {
        let mut marked = std::process::Command::new("sleep").arg("30").env("VIGIL_RUN", "kimi").spawn().unwrap();
        let mut plain = std::process::Command::new("sleep").arg("30").env_remove("VIGIL_RUN").spawn().unwrap();
        assert_eq!(env_var(marked.id() as i32, "VIGIL_RUN").as_deref(), Some("kimi"));
        assert_eq!(env_var(plain.id() as i32, "VIGIL_RUN"), None);
        assert_eq!(env_var(-1, "VIGIL_RUN"), None);
        let _ = marked.kill();
        let _ = plain.kill();
        let _ = marked.wait();
        let _ = plain.wait();
    }

    /// The kernel's children lists and a scan of every process find the same tree.
    #[test]
    fn both_ways_of_finding_descendants_agree() {
        let mut sh = std::process::Command::new("sh").args(["-c", "sleep 30 & sleep 30 & wait"]).spawn().unwrap();
        let pid = sh.id() as i32;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while descendants_by_scan(pid).len() < 2 && std::time::Instant::now() < deadline {
            std::thread::yield_now();
        }
        let mut a = descendants_by_scan(pid);
        let mut b = descendants(pid);
        let mut c = descendants_by_children(pid);
        a.sort();
        b.sort();
        c.sort();
        let _ = sh.kill();
        for x in &a {
            signal(*x, libc::SIGKILL);
        }
        let _ = sh.wait();
        assert_eq!(a.len(), 2, "{a:?}");
        assert_eq!((&a, &a), (&b, &c));
    }

    /// Netlink's answer equals /proc's for a socket this test listens on.
    #[test]
    fn sock_diag_agrees_with_proc() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let proc_ = super::listening_proc();
        let want: Vec<_> = proc_.iter().filter(|(p, _)| *p == port).collect();
        assert_eq!(want.len(), 1, "{proc_:?}");
        match super::listening_diag() {
            Some(d) => assert!(d.contains(want[0]), "netlink {d:?} lacks {want:?}"),
            None if std::env::var("CI").as_deref() == Ok("true") => panic!("netlink sock_diag unavailable"),
            None => eprintln!("SKIP: netlink sock_diag unavailable"),
        }
    }

    /// The async stop leaves the runtime free (issue #25): a task on the same single-threaded runtime keeps
    /// running through the grace period of a tree that ignores SIGTERM, which the stop then kills.
    #[tokio::test]
    async fn an_async_stop_never_blocks_the_runtime() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let script = "trap '' TERM; while :; do sleep 1; done";
        let mut sh = std::process::Command::new("sh").args(["-c", script]).spawn().unwrap();
        let pid = sh.id() as i32;
        // the trap is set once the loop has started its first sleep
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while descendants(pid).is_empty() && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let ticks = std::sync::Arc::new(AtomicUsize::new(0));
        let t = ticks.clone();
        let counter = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(20)).await;
                t.fetch_add(1, Ordering::SeqCst);
            }
        });
        let r = stop_tree_async(pid, true, Duration::from_millis(600), |_, _| {}, || false).await;
        counter.abort();
        let _ = sh.wait();
        assert!(r.survivors.is_empty(), "{r:?}");
        assert!(r.stopped.iter().any(|s| s.pid == pid && s.how == "SIGKILL"), "{r:?}");
        let n = ticks.load(Ordering::SeqCst);
        assert!(n >= 10, "the runtime was blocked: {n} ticks of 20 ms in a {} ms stop", r.elapsed_ms);
    }

    #[test]
    fn own_process_facts() {
        let me = std::process::id() as i32;
        let p = read_proc(me).unwrap();
        assert!(p.ppid > 0);
        assert!(age_secs(&p).is_some());
    }

    #[test]
    fn port_holder_is_found() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        assert!(!port_free(port));
        let (pid, _) = port_holder(port).expect("holder");
        assert_eq!(pid, std::process::id() as i32);
        assert!(ports_of(pid).contains(&port));
    }
}
