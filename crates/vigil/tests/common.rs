//! Helpers shared by the end-to-end tests: the real llama-server and tiny models built by
//! scripts/setup.sh, the vigil binary, ports, temp dirs, bounded waits.
#![allow(dead_code)]

use std::io::Read;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub struct Env {
    pub server: PathBuf,
    pub models: PathBuf,
}

impl Env {
    /// ggml's RPC server, built beside llama-server by scripts/setup.sh (GGML_RPC=ON): the worker rank of
    /// llama.cpp's own multi-node. Missing: a failure under CI=true, a skip (None) otherwise.
    pub fn rpc_server(&self) -> Option<PathBuf> {
        let p = std::env::var("VIGIL_LLAMA_RPC_SERVER")
            .map(PathBuf::from)
            .unwrap_or_else(|_| self.server.with_file_name("ggml-rpc-server"));
        if p.is_file() {
            return Some(p);
        }
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!("ggml-rpc-server missing ({}): run scripts/setup.sh", p.display());
        }
        eprintln!("SKIP: ggml-rpc-server not built (run scripts/setup.sh)");
        None
    }
}

/// The real llama-server and models. Missing: a failure under CI=true, a skip otherwise.
pub fn env() -> Option<Env> {
    let home = std::env::var("HOME").unwrap_or_default();
    let server = std::env::var("VIGIL_LLAMA_SERVER")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(&home).join(".cache/vigil/llama-server-0.3.36-rpc/bin/llama-server"));
    let models = std::env::var("VIGIL_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(&home).join(".cache/vigil/models-v3"));
    if server.is_file() && models.join("random-draft.gguf").is_file() {
        return Some(Env { server, models });
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("llama-server or models missing ({} / {}): run scripts/setup.sh", server.display(), models.display());
    }
    eprintln!("SKIP: llama-server not built (run scripts/setup.sh)");
    None
}

pub fn vigil_bin() -> PathBuf {
    std::env::var("VIGIL_BIN").map(PathBuf::from).unwrap_or_else(|_| PathBuf::from(env!("CARGO_BIN_EXE_vigil")))
}

pub fn vigil() -> Command {
    let mut c = Command::new(vigil_bin());
    c.env_remove("NO_COLOR");
    // keep user profiles out unless a test sets them
    c.env("XDG_CONFIG_HOME", "/nonexistent-vigil-test");
    c
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let p = std::env::temp_dir().join(format!("vigil-test-{}-{tag}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A child killed (whole process) when the test ends, pass or fail.
pub struct Guard(pub Child);

impl Guard {
    pub fn pid(&self) -> i32 {
        self.0.id() as i32
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts the real llama-server with its stdout and stderr appended to `log` (like `>> log 2>&1`).
pub fn start_server(e: &Env, model: &Path, port: u16, log: &Path, extra: &[&str]) -> Guard {
    let f = std::fs::OpenOptions::new().create(true).append(true).open(log).unwrap();
    let child = Command::new(&e.server)
        .arg("-m")
        .arg(model)
        .args(["--host", "127.0.0.1", "--port", &port.to_string(), "-c", "256", "-t", "1"])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(f.try_clone().unwrap())
        .stderr(f)
        .spawn()
        .expect("start llama-server");
    Guard(child)
}

/// A model path that is a FIFO: llama-server blocks opening it right after its `loading model`
/// line, as on slow storage, and answers /health with 503 meanwhile. Stands in for a slow load.
pub fn fifo_model(dir: &TempDir) -> PathBuf {
    let p = dir.path("slow-storage.gguf");
    let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo with a valid C string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
    p
}

/// Polls `cond` every `every` until it holds (true) or the deadline passes (false): for states the kernel
/// or a file shows and no event announces.
pub fn poll_until(deadline: Duration, every: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < deadline {
        if cond() {
            return true;
        }
        std::thread::sleep(every);
    }
    false
}

/// Waits (bounded) until the file contains `needle`. Polls the file: the condition is the event.
pub fn wait_for_text(path: &Path, needle: &str, deadline: Duration) -> bool {
    poll_until(deadline, Duration::from_millis(5), || {
        std::fs::read_to_string(path).map(|s| s.contains(needle)).unwrap_or(false)
    })
}

/// Runs a command to completion with a deadline; kills it and fails the test past the deadline.
pub fn run_bounded(mut c: Command, deadline: Duration) -> Output {
    c.stdout(Stdio::piped()).stderr(Stdio::piped()).stdin(Stdio::null());
    let mut child = c.spawn().expect("spawn");
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let to = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = out.read_to_end(&mut v);
        v
    });
    let te = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err.read_to_end(&mut v);
        v
    });
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t0.elapsed() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("command did not finish within {deadline:?}: {c:?}");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    Output { status, stdout: to.join().unwrap(), stderr: te.join().unwrap() }
}

/// Starts vigil (`--json`) with stdout piped, stderr discarded, and yields its JSON lines as they
/// come. Keep the iterator alive while vigil runs: dropping it closes vigil's stdout.
pub fn spawn_json(mut c: Command) -> (Child, impl Iterator<Item = serde_json::Value>) {
    use std::io::BufRead;
    c.stdout(Stdio::piped()).stderr(Stdio::null()).stdin(Stdio::null());
    let mut child = c.spawn().expect("spawn vigil");
    let out = std::io::BufReader::new(child.stdout.take().unwrap());
    let lines = out.lines().map(|l| {
        let l = l.expect("read vigil's output");
        serde_json::from_str(&l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"))
    });
    (child, lines)
}

pub fn json_lines(o: &Output) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

pub fn verdict(v: &[serde_json::Value]) -> &serde_json::Value {
    let last = v.last().expect("no output");
    assert_eq!(last["event"], "verdict", "last line is not the verdict: {last}");
    last
}

pub fn signal(pid: i32, sig: i32) {
    // SAFETY: sending a signal to a pid we started.
    unsafe {
        libc::kill(pid, sig);
    }
}

/// Waits for a child with a deadline; kills it and fails the test past it.
pub fn wait_bounded(child: &mut Child, deadline: Duration) -> std::process::ExitStatus {
    let t0 = Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        if t0.elapsed() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("child did not exit within {deadline:?}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A system tool a test needs (Debian's prometheus, promtool, systemd-analyze): its path, or None to skip.
/// Missing under CI=true is a failure, never a skip (scripts/test.sh installs them).
pub fn tool(path: &str, package: &str) -> Option<PathBuf> {
    let p = PathBuf::from(path);
    if p.is_file() {
        return Some(p);
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{path} missing: install Debian's {package} (scripts/test.sh does)");
    }
    eprintln!("SKIP: {path} missing (apt-get install {package})");
    None
}

/// One HTTP/1.0 GET (so the answer is never chunked) on loopback: status and body.
pub fn http_get(port: u16, path: &str, headers: &[(&str, &str)]) -> std::io::Result<(u16, String)> {
    use std::io::Write;
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut req = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes())?;
    let mut b = Vec::new();
    s.read_to_end(&mut b)?;
    let text = String::from_utf8_lossy(&b).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let code = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    Ok((code, body.to_string()))
}

/// Percent-encodes a query-string value.
pub fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Waits for a child (bounded) and returns its status with its peak RSS in KiB (`wait4`'s ru_maxrss).
pub fn wait_rusage(child: &mut Child, deadline: Duration) -> (std::process::ExitStatus, i64) {
    use std::os::unix::process::ExitStatusExt;
    let pid = child.id() as i32;
    let t0 = Instant::now();
    loop {
        let mut status = 0;
        // SAFETY: wait4 on our own child with valid out-pointers.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        let r = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut ru) };
        if r == pid {
            return (std::process::ExitStatus::from_raw(status), ru.ru_maxrss);
        }
        if t0.elapsed() > deadline {
            let _ = child.kill();
            panic!("child did not exit within {deadline:?}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}
