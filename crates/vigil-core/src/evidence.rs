//! Evidence of where every process of a server's tree is: stacks as `py-spy dump` and `eu-stack` print
//! them, the kernel wait channel, and one line per process that names the innermost meaningful frame
//! ("`wedged_in_dist_init` in engine.py:4 → `sleep`"). Pure: the text comes in, typed data comes out;
//! the binary runs the tools and stores the raw output with the run.

use serde::Serialize;

/// One stack frame, innermost first in a [`Thread`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Frame {
    pub func: String,
    /// Source file (Python) or module (native), as the tool printed it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<u32>,
    /// A Python frame (its file is a `.py`); else native.
    pub python: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Thread {
    /// Thread id as printed (py-spy: `0x7F..` or a native tid; eu-stack: the tid).
    pub id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// py-spy's `(idle)`: the thread waits (sleep, lock, I/O) rather than runs.
    pub idle: bool,
    pub frames: Vec<Frame>,
}

/// Parses `py-spy dump [--native]` text: `Thread <id> (<status>): "<name>"` headers, then one frame a
/// line, innermost first, as `func (file.py:line)` or, for native frames, `func (module)`.
/// (py-spy's dump output, `src/dump.rs` of benfred/py-spy, as printed by py-spy 0.4.)
pub fn parse_py_spy(text: &str) -> Vec<Thread> {
    let mut out: Vec<Thread> = Vec::new();
    for raw in text.lines() {
        let l = raw.trim_end();
        if let Some(rest) = l.strip_prefix("Thread ") {
            let (id, after) = rest.split_once(' ').unwrap_or((rest, ""));
            let idle = after.contains("idle");
            let name = after.split_once('"').and_then(|(_, n)| n.rsplit_once('"')).map(|(n, _)| n.to_string());
            out.push(Thread { id: id.to_string(), name, idle, frames: vec![] });
            continue;
        }
        let t = l.trim_start();
        if t.is_empty() || !l.starts_with(' ') {
            continue;
        }
        let Some(th) = out.last_mut() else { continue };
        // `Arguments:` / `Locals:` blocks (with --locals) are deeper-indented name = value lines
        if l.starts_with("        ") || !t.ends_with(')') {
            continue;
        }
        if let Some(f) = frame_of(t) {
            th.frames.push(f);
        }
    }
    out
}

fn frame_of(t: &str) -> Option<Frame> {
    let open = t.rfind(" (")?;
    let func = t[..open].trim().to_string();
    let loc = &t[open + 2..t.len() - 1];
    let (file, line) = match loc.rsplit_once(':') {
        Some((f, n)) if n.chars().all(|c| c.is_ascii_digit()) && !n.is_empty() => (f.to_string(), n.parse().ok()),
        _ => (loc.to_string(), None),
    };
    // `<string>` (python -c), `<frozen importlib._bootstrap>`: Python code without a file
    let python = file.ends_with(".py") || file.starts_with('<');
    Some(Frame { func, file: (!file.is_empty()).then_some(file), line, python })
}

/// Parses `eu-stack -p PID` text: `TID <tid>:` headers, then `#N  0xADDR name` frames, innermost first.
/// (elfutils `src/stack.c`: frame lines are `#%-2u 0x%0*PRIx64 %s`, the name empty when unknown.)
pub fn parse_eu_stack(text: &str) -> Vec<Thread> {
    let mut out: Vec<Thread> = Vec::new();
    for l in text.lines() {
        let t = l.trim();
        if let Some(rest) = t.strip_prefix("TID ") {
            let id = rest.trim_end_matches(':').trim().to_string();
            out.push(Thread { id, name: None, idle: false, frames: vec![] });
            continue;
        }
        let Some(rest) = t.strip_prefix('#') else { continue };
        let Some(th) = out.last_mut() else { continue };
        let mut parts = rest.split_whitespace();
        let _n = parts.next();
        let _addr = parts.next();
        let name: Vec<&str> = parts.collect();
        let func = if name.is_empty() { "??".to_string() } else { name.join(" ") };
        th.frames.push(Frame { func, file: None, line: None, python: false });
    }
    out
}

/// Frames that only wait on behalf of their caller: the standard library's threading, queues, selectors,
/// sockets and multiprocessing pipes. The meaningful frame is the first caller outside them.
fn plumbing(f: &Frame) -> bool {
    let Some(file) = f.file.as_deref() else { return !f.python };
    let base = file.rsplit('/').next().unwrap_or(file);
    let stdlib = (file.contains("/lib/python3") || file.contains("/lib64/python3")) && !file.contains("-packages/");
    stdlib
        || matches!(
            base,
            "threading.py"
                | "queue.py"
                | "selectors.py"
                | "socket.py"
                | "connection.py"
                | "synchronize.py"
                | "subprocess.py"
        )
}

/// Native frames that only wait on behalf of their caller: the C library's and the kernel interface's
/// (`__futex_abstimed_wait_common`, `pthread_cond_clockwait@GLIBC_2.30`, `clock_nanosleep`, `epoll_wait`).
fn native_plumbing(f: &str) -> bool {
    let name = f.split('@').next().unwrap_or(f);
    f.contains("@GLIBC")
        || name.starts_with("__")
        || name.starts_with("pthread_")
        || name.starts_with("sem_")
        || matches!(
            name,
            "clock_nanosleep"
                | "nanosleep"
                | "epoll_wait"
                | "poll"
                | "ppoll"
                | "select"
                | "read"
                | "write"
                | "syscall"
                | "futex_wait"
                | "do_futex_wait"
                | "wait4"
                | "waitpid"
                | "accept"
                | "recv"
                | "recvfrom"
        )
}

fn base(file: &Option<String>) -> String {
    file.as_deref().map(|f| f.rsplit('/').next().unwrap_or(f).to_string()).unwrap_or_default()
}

/// The thread that tells where a process is: the main thread, else the first non-idle one, else the first.
fn main_thread(threads: &[Thread], pid: i32) -> Option<&Thread> {
    let pid = pid.to_string();
    threads
        .iter()
        .find(|t| t.name.as_deref() == Some("MainThread") || t.id == pid)
        .or_else(|| threads.iter().find(|t| !t.idle))
        .or_else(|| threads.first())
}

/// One line for one process: the innermost meaningful Python frame of its main thread (with the innermost
/// frame when that is plumbing, and the innermost native frame when there is one), else the innermost
/// named native frames; the kernel wait channel when known.
pub fn summarize(pid: i32, python: &[Thread], native: &[Thread], wchan: Option<&str>) -> String {
    let mut s = String::new();
    if let Some(t) = main_thread(python, pid) {
        let py: Vec<&Frame> = t.frames.iter().filter(|f| f.python).collect();
        let meaningful = py.iter().find(|f| !plumbing(f)).or(py.first());
        if let Some(m) = meaningful {
            s = format!("`{}` in {}", m.func, base(&m.file));
            if let Some(n) = m.line {
                s.push_str(&format!(":{n}"));
            }
            if let Some(inner) = py.first().filter(|f| !std::ptr::eq(**f, *m)) {
                s.push_str(&format!(" → `{}` ({})", inner.func, base(&inner.file)));
            }
            if let Some(nat) = t.frames.first().filter(|f| !f.python) {
                s.push_str(&format!(" → native `{}`", nat.func));
            }
        }
    }
    if s.is_empty() {
        if let Some(t) = main_thread(native, pid) {
            let named: Vec<&str> = t.frames.iter().map(|f| f.func.as_str()).filter(|f| *f != "??").collect();
            let meaningful = named.iter().find(|f| !native_plumbing(f)).or(named.first());
            if let Some(m) = meaningful {
                s = format!("native `{m}`");
                if let Some(inner) = named.first().filter(|f| *f != m) {
                    s.push_str(&format!(" → `{inner}`"));
                }
            }
        }
    }
    match wchan.filter(|w| !w.is_empty() && *w != "0") {
        Some(w) if s.is_empty() => format!("kernel wait `{w}`"),
        Some(w) => format!("{s} (kernel wait `{w}`)"),
        None if s.is_empty() => "no stack (see the notes)".into(),
        None => s,
    }
}

/// What was captured for one process of the tree.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ProcEvidence {
    pub pid: i32,
    pub title: String,
    /// `/proc/PID/stat` state (R running, S sleeping, D uninterruptible, T stopped, Z zombie).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state: Option<char>,
    /// `/proc/PID/wchan`: the kernel function the process waits in (`0` or absent when running).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wchan: Option<String>,
    /// The innermost meaningful frame (see [`summarize`]).
    pub at: String,
    /// Files saved for this process (relative to the evidence folder).
    pub files: Vec<String>,
    /// Why something could not be captured (tool missing, permission, timeout).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// Evidence of one moment: every process of the tree, the NCCL flight-recorder dumps found, where it lies.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Evidence {
    /// The folder holding the raw output.
    pub dir: String,
    pub procs: Vec<ProcEvidence>,
    /// NCCL flight-recorder dump files copied into `dir`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub nccl_dumps: Vec<String>,
    /// Capture-wide notes (how to get a missing tool, processes left out by the bound).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// How long the capture took.
    pub took_ms: u64,
}

impl Evidence {
    /// One line per place, for the verdict: processes at the same place share a line, in the order of
    /// their first process ("pid 42 `sglang::scheduler_TP3`: `capture` in …", "pids 43, 44, 45
    /// (`sglang::scheduler_TP0` and 2 more): `all_reduce` in …"): eight ranks in one collective are one line.
    /// A stopped process (state T, `t`: SIGSTOP, a debugger) is said so first ("pid 7 `sglang::scheduler_TP1`:
    /// STOPPED (state T) at …"): in a multi-node server it is the rank that is stuck, the others only wait.
    pub fn lines(&self) -> Vec<String> {
        let mut groups: Vec<((&str, bool), Vec<&ProcEvidence>)> = Vec::new();
        for p in &self.procs {
            let key = (p.at.as_str(), p.stopped());
            match groups.iter_mut().find(|(k, _)| *k == key) {
                Some((_, v)) => v.push(p),
                None => groups.push((key, vec![p])),
            }
        }
        groups
            .into_iter()
            .map(|((at, stopped), v)| {
                let first = crate::tree::short_title(&v[0].title);
                let at = if stopped { format!("{STOPPED_MARK} at {at}") } else { at.to_string() };
                if v.len() == 1 {
                    return format!("pid {} `{first}`: {at}", v[0].pid);
                }
                let pids: Vec<String> = v.iter().map(|p| p.pid.to_string()).collect();
                format!("pids {} (`{first}` and {} more): {at}", pids.join(", "), v.len() - 1)
            })
            .collect()
    }

    /// The processes of the tree that are stopped (state T or t).
    pub fn stopped(&self) -> Vec<&ProcEvidence> {
        self.procs.iter().filter(|p| p.stopped()).collect()
    }
}

/// How an evidence line says its process is stopped (see [`Evidence::lines`]).
pub const STOPPED_MARK: &str = "STOPPED (state T: SIGSTOP or a debugger)";

/// The first of evidence lines that says a process is stopped.
pub fn stopped_line<'a>(lines: impl IntoIterator<Item = &'a String>) -> Option<&'a String> {
    lines.into_iter().find(|l| l.contains(STOPPED_MARK))
}

impl ProcEvidence {
    /// In state T: stopped by a signal (SIGSTOP, SIGTSTP). Not t (a tracer's stop): vigil's own py-spy, or a
    /// second evidence pass, can hold a process in t for the moment its state is read (seen on the GPU machine:
    /// SGLang's `scheduler_TP0` in t with kernel wait `ptrace_stop` while it only waited for its stopped peer,
    /// issue #32), and a tracer's stop says nothing about where the server is stuck.
    pub fn stopped(&self) -> bool {
        matches!(self.state, Some('T'))
    }
}
