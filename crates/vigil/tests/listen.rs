//! `--listen` (issue #37): the watching vigil answers over HTTP. Against the real llama-server: `/startupz` while
//! loading, at the ready verdict and after a crash; `/readyz` and `/livez` after SIGSTOP; `/events` replayed and
//! resumed; a multi-node start in `/status`. Without a server (a `wait` on a port nobody answers keeps vigil
//! watching): the loopback rule, the bearer token, and hostile clients (slowloris, oversized heads, path
//! traversal, thousands of idle connections). Test names that need the real server start with `e2e_`.

mod common;
use common::*;
use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(90);

fn v(state: &Path) -> Command {
    let mut c = vigil();
    c.env("VIGIL_STATE_DIR", state);
    c
}

fn cmd(e: &Env, model: &str, port: u16) -> Vec<String> {
    let mut a: Vec<String> =
        vec![e.server.display().to_string(), "-m".into(), e.models.join(model).display().to_string()];
    a.extend(["--host", "127.0.0.1", "--port", &port.to_string(), "-c", "256", "-t", "1"].map(String::from));
    a
}

fn down(state: &Path, name: &str) {
    let mut c = v(state);
    c.args(["down", name]);
    let _ = run_bounded(c, T);
}

/// One GET (HTTP/1.0: never chunked; the answer ends with the connection): status and body.
fn get(port: u16, path: &str) -> (u16, String) {
    http_get(port, path, &[]).unwrap_or_else(|e| panic!("GET {path}: {e}"))
}

fn get_json(port: u16, path: &str) -> (u16, Value) {
    let (code, body) = get(port, path);
    (code, serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {path}: not JSON ({e}): {body}")))
}

/// Reads the JSON lines of a running vigil until `stop` says so (bounded by the lines' own end).
fn until(events: &mut impl Iterator<Item = Value>, seen: &mut Vec<Value>, mut stop: impl FnMut(&Value) -> bool) {
    for j in events.by_ref() {
        let done = stop(&j);
        seen.push(j);
        if done {
            return;
        }
    }
    panic!("vigil ended before the expected event: {seen:?}");
}

/// The SSE events of `/events` (with `extra` headers, from `path`), read until the one whose id is `last`:
/// (id, JSON) pairs, and any `gap` markers.
fn sse(port: u16, path: &str, extra: &[(&str, &str)], last: u64) -> Vec<(u64, Value)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut req = format!("GET {path} HTTP/1.1\r\nHost: x\r\n");
    for (k, v) in extra {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    let mut r = BufReader::new(s);
    let mut head = String::new();
    r.read_line(&mut head).unwrap();
    assert!(head.contains(" 200 "), "{path}: {head}");
    let mut out = Vec::new();
    let mut id = None;
    let mut line = String::new();
    loop {
        line.clear();
        if r.read_line(&mut line).unwrap_or(0) == 0 {
            panic!("{path}: stream ended before id {last}: {out:?}");
        }
        // chunked framing: size lines are hex only, never `id:`/`data:`
        let l = line.trim_end();
        if let Some(x) = l.strip_prefix("id: ") {
            id = Some(x.parse::<u64>().unwrap());
        } else if let Some(d) = l.strip_prefix("data: ") {
            let v: Value = serde_json::from_str(d).unwrap_or_else(|e| panic!("not JSON ({e}): {d}"));
            let i = id.take().unwrap_or(0);
            out.push((i, v));
            if i == last {
                return out;
            }
        }
    }
}

/// `vigil wait` on a port nobody answers, with `--listen`: vigil watches (and serves) until its timeout.
/// Returns the child and its JSON lines once the listener said where it listens.
fn idle_vigil(extra: &[&str]) -> (Guard, u16, Box<dyn Iterator<Item = Value>>) {
    let port = free_port();
    let dead = free_port();
    let mut c = vigil();
    c.args(["wait", "--json", "--timeout", "120s", "--url", &format!("http://127.0.0.1:{dead}/health")]);
    c.args(["--listen", &port.to_string(), "--metrics-linger", "0s"]).args(extra);
    let (child, mut events) = spawn_json(c);
    let child = Guard(child);
    let mut seen = vec![];
    until(&mut events, &mut seen, |j| {
        j["event"] == "note" && j["message"].as_str().unwrap_or("").contains("listening on")
    });
    (child, port, Box::new(events))
}

fn rss_kib(pid: i32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Raises this process's soft descriptor limit toward `want` (children inherit it); returns what it got.
fn raise_nofile(want: u64) -> u64 {
    // SAFETY: getrlimit/setrlimit with a struct we own.
    unsafe {
        let mut r: libc::rlimit = std::mem::zeroed();
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut r);
        if r.rlim_cur < want as libc::rlim_t {
            let mut n = r;
            n.rlim_cur = (want as libc::rlim_t).min(r.rlim_max);
            if libc::setrlimit(libc::RLIMIT_NOFILE, &n) == 0 {
                r = n;
            }
        }
        r.rlim_cur as u64
    }
}

/// `vigil wait --json --listen LPORT` on a server started by the test (its log, pid and port), the listener
/// lingering 30 s after the verdict: the guarded child and its `--json` lines.
fn wait_listening(
    log: &std::path::Path,
    pid: i32,
    port: u16,
    lport: u16,
) -> (Guard, impl Iterator<Item = serde_json::Value>) {
    let mut c = vigil();
    c.args(["wait", "--json", "--listen", &lport.to_string(), "--metrics-linger", "30s", "--log"]).arg(log);
    c.args(["--pid", &pid.to_string(), "--url", &format!("http://127.0.0.1:{port}/health")]);
    let (child, events) = spawn_json(c);
    (Guard(child), events)
}

/// A server held in weight loading (its model is a FIFO) is `starting` in `weights` on `/startupz` (503, with
/// the phase, the rank, elapsed) and not ready on `/readyz`; killed, `/startupz` answers 500 with the verdict's
/// cause. A truncated GGUF: 500 with `model_file` and the hint.
#[test]
fn e2e_listen_startupz_while_loading_then_500_with_the_cause() {
    let Some(e) = env() else { return };
    let d = TempDir::new("listen-load");
    let (port, lport) = (free_port(), free_port());
    let log = d.path("server.log");
    let fifo = fifo_model(&d);
    let s = start_server(&e, &fifo, port, &log, &[]);
    let (_child, mut events) = wait_listening(&log, s.pid(), port, lport);
    let mut seen = vec![];
    until(&mut events, &mut seen, |j| j["event"] == "phase" && j["phase"] == "weights");
    let (code, b) = get_json(lport, "/startupz");
    assert_eq!(code, 503, "{b}");
    assert_eq!((b["state"].as_str(), b["phase"].as_str()), (Some("starting"), Some("weights")), "{b}");
    assert_eq!(b["ranks"][0]["phase"], "weights", "{b}");
    assert!(b["elapsed"].as_u64().is_some() && b.get("eta").is_some(), "{b}");
    let (code, b) = get_json(lport, "/readyz");
    assert_eq!(code, 503, "{b}");
    assert_eq!(get(lport, "/livez").0, 200);
    signal(s.pid(), libc::SIGKILL);
    until(&mut events, &mut seen, |j| j["event"] == "verdict");
    let r = seen.last().unwrap().clone();
    assert_eq!(r["verdict"], "crashed", "{r}");
    let (code, b) = get_json(lport, "/startupz");
    assert_eq!(code, 500, "{b}");
    assert_eq!(
        (b["verdict"].clone(), b["cause"].clone(), b["phase"].clone()),
        (r["verdict"].clone(), r["cause"].clone(), r["phase"].clone())
    );
    assert!(b["cause"].is_string(), "{b}");
    assert_eq!(get(lport, "/livez").0, 200, "the listener lives through --metrics-linger");

    // a truncated model: crashed, model_file, with the core's hint
    let (port, lport) = (free_port(), free_port());
    let log = d.path("trunc.log");
    let s = start_server(&e, &e.models.join("truncated.gguf"), port, &log, &[]);
    let (_child, mut events) = wait_listening(&log, s.pid(), port, lport);
    let mut seen = vec![];
    until(&mut events, &mut seen, |j| j["event"] == "verdict");
    let (code, b) = get_json(lport, "/startupz");
    assert_eq!(code, 500, "{b}");
    assert_eq!((b["verdict"].as_str(), b["cause"].as_str()), (Some("crashed"), Some("model_file")), "{b}");
    assert!(b["hint"].as_str().is_some_and(|h| !h.is_empty()), "{b}");
    assert!(b["detail"].is_string(), "{b}");
    let (code, st) = get_json(lport, "/status");
    assert_eq!(code, 200);
    assert_eq!(st["state"], "crashed", "{st}");
    assert!(st["evidence"].as_array().is_some_and(|e| !e.is_empty()), "{st}");
}

/// `up --listen`: `/startupz` is 503 while starting and 200 from the ready verdict on. The hub is told before the
/// verdict line is written, so every request sent after the line was read answers 200: the ordering, not timing
/// luck. The gap from the line to that first 200 is measured (≤ 50 ms). Then `/events`: every JSON line vigil
/// printed, in order, with ids from 1; resumed from `Last-Event-ID` and `?since=` without loss or duplicates.
#[test]
fn e2e_listen_startupz_200_with_the_ready_verdict_and_events_replay() {
    let Some(e) = env() else { return };
    let d = TempDir::new("listen-ready");
    let (port, lport) = (free_port(), free_port());
    let mut c = v(&d.0);
    c.args(["up", "--name", "lr", "--json", "--listen", &lport.to_string(), "--"]).args(cmd(&e, "tiny.gguf", port));
    let (child, mut events) = spawn_json(c);
    let _child = Guard(child);
    // a poller asks /startupz as fast as it can from the start: (sent, status) samples
    let samples: Arc<Mutex<Vec<(Instant, u16, String)>>> = Arc::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (s2, stop2) = (samples.clone(), stop.clone());
    let poller = std::thread::spawn(move || {
        while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
            let sent = Instant::now();
            if let Ok((code, body)) = http_get(lport, "/startupz", &[]) {
                let phase =
                    serde_json::from_str::<Value>(&body).ok().and_then(|b| b["phase"].as_str().map(String::from));
                s2.lock().unwrap().push((sent, code, phase.unwrap_or_default()));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    });
    let mut seen = vec![];
    until(&mut events, &mut seen, |j| j["event"] == "verdict");
    let line_at = Instant::now();
    let (code, b) = get_json(lport, "/startupz");
    let gap = line_at.elapsed();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    poller.join().unwrap();
    let r = seen.last().unwrap().clone();
    assert_eq!(r["verdict"], "ready", "{r}");
    assert_eq!(code, 200, "{b}");
    assert!(b["proof"]["ok"] == true && b["proof"]["tokens"].as_u64().unwrap_or(0) > 0, "proof included: {b}");
    eprintln!("first /startupz after the ready line: 200 after {:.1} ms", gap.as_secs_f64() * 1000.0);
    assert!(gap <= Duration::from_millis(50), "200 came {gap:?} after the verdict line");
    let samples = samples.lock().unwrap();
    assert!(samples.iter().any(|(_, c, _)| *c == 503), "never seen starting: {samples:?}");
    let late: Vec<_> = samples.iter().filter(|(t, c, _)| *t >= line_at && *c != 200).collect();
    assert!(late.is_empty(), "answers other than 200 sent after the verdict line: {late:?}");
    let (code, b) = get_json(lport, "/readyz");
    assert_eq!(code, 200, "{b}");
    let (_, st) = get_json(lport, "/status");
    assert_eq!((st["state"].as_str(), st["run"]["name"].as_str()), (Some("ready"), Some("lr")), "{st}");
    let (code, m) = get(lport, "/metrics");
    assert!(code == 200 && m.contains("vigil_verdict{run=\"lr\",server=\"llama-cpp\",verdict=\"ready\"} 1"), "{m}");
    // the page: HTML, a Content-Security-Policy with no other origin
    let mut s = TcpStream::connect(("127.0.0.1", lport)).unwrap();
    s.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    let mut page = String::new();
    s.read_to_string(&mut page).unwrap();
    let head = page.split("\r\n\r\n").next().unwrap().to_ascii_lowercase();
    assert!(head.contains("content-type: text/html"), "{head}");
    assert!(
        head.contains("content-security-policy: default-src 'self'") && head.contains("connect-src 'self'"),
        "{head}"
    );

    // /events: the same objects as the JSON lines, in order, ids 1..n
    let n = seen.len() as u64;
    let all = sse(lport, "/events", &[], n);
    assert_eq!(all.iter().map(|x| x.0).collect::<Vec<_>>(), (1..=n).collect::<Vec<_>>());
    for ((_, got), want) in all.iter().zip(&seen) {
        assert_eq!(got, want, "/events differs from --json");
    }
    let k = n / 2;
    let resumed = sse(lport, "/events", &[("Last-Event-ID", &k.to_string())], n);
    assert_eq!(resumed.iter().map(|x| x.0).collect::<Vec<_>>(), ((k + 1)..=n).collect::<Vec<_>>());
    let since = sse(lport, &format!("/events?since={k}"), &[], n);
    assert_eq!(since.iter().map(|x| x.0).collect::<Vec<_>>(), ((k + 1)..=n).collect::<Vec<_>>());
    assert_eq!(since.iter().map(|x| &x.1).collect::<Vec<_>>(), seen[k as usize..].iter().collect::<Vec<_>>());
    down(&d.0, "lr");
}

/// `vigil watch NAME --listen --unhealthy-after 3s`: after SIGSTOP of the server `/readyz` turns 503 within the
/// unhealthy limit (plus one probe timeout, one interval and slack) while `/livez` stays 200.
#[test]
fn e2e_listen_readyz_503_after_sigstop_livez_stays_200() {
    let Some(e) = env() else { return };
    let d = TempDir::new("listen-stop");
    let (port, lport) = (free_port(), free_port());
    let mut c = v(&d.0);
    c.args(["up", "--name", "ls", "--detach", "--json", "--"]).args(cmd(&e, "tiny.gguf", port));
    let o = run_bounded(c, T);
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stdout));
    let server = json_lines(&o).iter().find(|j| j["event"] == "launched").unwrap()["pid"].as_i64().unwrap() as i32;
    let mut c = v(&d.0);
    c.args(["watch", "ls", "--json", "--listen", &lport.to_string(), "--unhealthy-after", "3s"]);
    c.args(["--watch-probe-timeout", "1s", "--generate-every", "1s", "--metrics-linger", "30s", "--on-stall", "keep"]);
    let (child, mut events) = spawn_json(c);
    let _child = Guard(child);
    let mut seen = vec![];
    until(&mut events, &mut seen, |j| j["event"] == "verdict" && j["verdict"] == "ready");
    assert_eq!(get_json(lport, "/readyz").0, 200);
    signal(server, libc::SIGSTOP);
    let t0 = Instant::now();
    let mut livez_bad = vec![];
    let turned = poll_until(Duration::from_secs(20), Duration::from_millis(50), || {
        let l = get(lport, "/livez").0;
        if l != 200 {
            livez_bad.push(l);
        }
        get(lport, "/readyz").0 == 503
    });
    let dt = t0.elapsed();
    let (_, why) = get_json(lport, "/readyz");
    let (lz, _) = get(lport, "/livez");
    let (sz, _) = get_json(lport, "/startupz");
    signal(server, libc::SIGCONT);
    down(&d.0, "ls");
    assert!(turned, "/readyz never turned 503");
    eprintln!("/readyz 503 {:.0} ms after SIGSTOP: {why}", dt.as_secs_f64() * 1000.0);
    // bound: --unhealthy-after 3s + one probe timeout (1s) + one interval (1s) + slack (2s)
    assert!(dt <= Duration::from_secs(7), "/readyz turned 503 after {dt:?}");
    assert!(why["why"].as_str().unwrap_or("").contains("unhealthy"), "{why}");
    assert!(livez_bad.is_empty() && lz == 200, "/livez must stay 200: {livez_bad:?} {lz}");
    assert_eq!(sz, 200, "the startup stays done");
}

#[test]
fn listen_non_loopback_needs_a_token_or_public() {
    for flag in ["--listen", "--metrics"] {
        let mut c = vigil();
        c.args(["wait", "--url", "http://127.0.0.1:9/health", flag, "0.0.0.0:0"]);
        let o = run_bounded(c, Duration::from_secs(20));
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
        assert!(err.contains("--listen-token-file") && err.contains("--listen-public"), "{err}");
    }
    let mut c = vigil();
    c.args(["up", "--detach", "--listen", "9", "--", "true"]);
    let o = run_bounded(c, Duration::from_secs(20));
    assert_eq!(o.status.code(), Some(2), "--listen with --detach: {}", String::from_utf8_lossy(&o.stderr));
}

/// With a token file every request needs `Authorization: Bearer TOKEN` (401 without it or with another), and the
/// token appears nowhere in vigil's output.
#[test]
fn listen_token_is_required_and_never_printed() {
    let d = TempDir::new("listen-token");
    let tok = "s3cr3t-token-4f9a";
    let tf = d.path("token");
    std::fs::write(&tf, format!("{tok}\n")).unwrap();
    let (mut child, port, events) = idle_vigil(&["--listen-token-file", tf.to_str().unwrap()]);
    for path in ["/livez", "/status", "/events", "/metrics", "/", "/nope"] {
        assert_eq!(get(port, path).0, 401, "{path} without a token");
    }
    assert_eq!(http_get(port, "/livez", &[("Authorization", "Bearer s3cr3t-token-4f9b")]).unwrap().0, 401);
    assert_eq!(http_get(port, "/livez", &[("Authorization", "Bearer s3cr3t")]).unwrap().0, 401);
    let auth = format!("Bearer {tok}");
    assert_eq!(http_get(port, "/livez", &[("Authorization", &auth)]).unwrap().0, 200);
    let (c, st) = http_get(port, "/status", &[("Authorization", &auth)]).unwrap();
    assert_eq!(c, 200);
    assert!(!st.contains(tok), "the token in /status: {st}");
    signal(child.pid(), libc::SIGTERM);
    let _ = wait_bounded(&mut child.0, Duration::from_secs(20));
    let out: Vec<String> = events.map(|j| j.to_string()).collect();
    assert!(!out.iter().any(|l| l.contains(tok)), "the token printed: {out:?}");
}

/// Hostile clients against one listener: a slowloris head does not block others and is closed; an oversized
/// head is 431; traversal paths are 404 (nothing is read from disk); other methods 405; 10,000 idle connections
/// (or what the descriptor limit allows an unprivileged user) leave it answering, its memory bounded.
#[test]
fn listen_hostile_clients_are_bounded() {
    // 10,000 where the descriptor limit can be raised that far (root); an unprivileged user takes what its hard
    // limit allows, and the test says so
    let got = raise_nofile(10_500);
    let idle = 10_000.min(got.saturating_sub(300) as usize);
    if idle < 2000 {
        eprintln!("descriptor limit {got}: {idle} idle connections instead of 2,000");
    }
    let (child, port, _events) = idle_vigil(&[]);
    let pid = child.pid();
    // slowloris: half a head, then nothing
    let mut slow = TcpStream::connect(("127.0.0.1", port)).unwrap();
    slow.write_all(b"GET /livez HTTP/1.1\r\nHost: x\r\nX-Slow: ").unwrap();
    let t0 = Instant::now();
    assert_eq!(get(port, "/livez").0, 200);
    assert!(t0.elapsed() < Duration::from_secs(2), "a slow head delayed another client: {:?}", t0.elapsed());
    slow.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let mut buf = [0u8; 512];
    let n = slow.read(&mut buf).unwrap_or(0);
    let closed_after = t0.elapsed();
    assert!(closed_after < Duration::from_secs(12), "the slow head was not cut: {closed_after:?}");
    assert!(n == 0 || String::from_utf8_lossy(&buf[..n]).contains("408"), "{:?}", String::from_utf8_lossy(&buf[..n]));
    // an oversized head
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let big = format!("GET /status HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n", "a".repeat(32 * 1024));
    let _ = s.write_all(big.as_bytes());
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut r = String::new();
    let _ = s.read_to_string(&mut r);
    assert!(r.starts_with("HTTP/1.1 431"), "oversized head: {:?}", r.lines().next());
    // traversal and other paths: 404, and no file content
    for p in [
        "/../../../../etc/passwd",
        "/%2e%2e/%2e%2e/etc/passwd",
        "//etc/passwd",
        "/assets/page.html",
        "/events/../status/x",
        "/status/",
    ] {
        let (code, body) = get(port, p);
        assert_eq!(code, 404, "{p}: {body}");
        assert!(!body.contains("root:"), "{p}");
    }
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(b"POST /status HTTP/1.0\r\nContent-Length: 0\r\n\r\n").unwrap();
    let mut r = String::new();
    s.read_to_string(&mut r).unwrap();
    assert!(r.starts_with("HTTP/1.0 405") || r.starts_with("HTTP/1.1 405"), "{r}");
    // idle connections
    let before = rss_kib(pid);
    let mut conns = Vec::with_capacity(idle);
    let tc = Instant::now();
    for _ in 0..idle {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(c) => conns.push(c),
            Err(e) => panic!("connect #{}: {e}", conns.len()),
        }
    }
    eprintln!("{idle} connections opened in {:?}", tc.elapsed());
    let t0 = Instant::now();
    let (code, st) = get_json(port, "/status");
    let answered = t0.elapsed();
    assert_eq!(code, 200);
    // it waits in the kernel's accept queue behind up to 4,096 of them
    assert!(answered < Duration::from_secs(5), "with {idle} idle connections: answered after {answered:?}");
    let open = st["listener"]["connections"].as_u64().unwrap();
    assert!(open <= 257, "connections held: {open}");
    let after = rss_kib(pid);
    eprintln!("{idle} idle connections: /status in {answered:?}, {open} held, RSS {before} → {after} KiB");
    drop(conns);
    // a second burst: the memory of the first is reused, not added to
    let mut conns = Vec::with_capacity(idle);
    for _ in 0..idle {
        conns.push(TcpStream::connect(("127.0.0.1", port)).unwrap());
    }
    let (code, st) = get_json(port, "/status");
    assert_eq!(code, 200);
    let again = rss_kib(pid);
    eprintln!("a second burst of {idle}: {} held, RSS {again} KiB", st["listener"]["connections"]);
    assert!(after < before + 16 * 1024, "memory grew from {before} to {after} KiB");
    assert!(again < after + 2 * 1024, "a second burst grew memory again: {after} → {again} KiB");
    drop(conns);
}

/// At most 1,024 event streams: the next is answered 503 (not one more task and queue), and the listener answers.
#[test]
fn listen_sse_clients_are_capped() {
    let got = raise_nofile(1500);
    if got < 1200 {
        eprintln!("descriptor limit {got}: cannot open 1,026 event streams; the cap is not reached here");
        return;
    }
    let (_child, port, _events) = idle_vigil(&[]);
    let mut streams = Vec::new();
    let (mut ok, mut busy) = (0, 0);
    for _ in 0..1026 {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.write_all(b"GET /events HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut head = [0u8; 12];
        s.read_exact(&mut head).unwrap();
        match &head[9..12] {
            b"200" => ok += 1,
            b"503" => busy += 1,
            other => panic!("{:?}", String::from_utf8_lossy(other)),
        }
        streams.push(s);
    }
    assert_eq!((ok, busy), (1024, 2), "streams admitted and refused");
    let (code, st) = get_json(port, "/status");
    assert_eq!(code, 200);
    assert_eq!(st["listener"]["sse_clients"], 1024, "{st}");
    drop(streams);
}

/// `--listen-cert`/`--listen-key`: HTTPS (rustls), checked by vigil's own TLS client pinned to the certificate.
#[test]
fn listen_over_tls() {
    let d = TempDir::new("listen-tls");
    let o = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1"])
        .args(["-addext", "subjectAltName=IP:127.0.0.1", "-keyout", "key.pem", "-out", "cert.pem"])
        .current_dir(&d.0)
        .stdin(Stdio::null())
        .output();
    let ok = o.as_ref().is_ok_and(|o| o.status.success());
    if !ok {
        assert_ne!(std::env::var("CI").as_deref(), Ok("true"), "openssl missing: {o:?}");
        eprintln!("SKIP: openssl missing");
        return;
    }
    let (cert, key) = (d.path("cert.pem"), d.path("key.pem"));
    let (_child, port, _events) =
        idle_vigil(&["--listen-cert", cert.to_str().unwrap(), "--listen-key", key.to_str().unwrap()]);
    let mut c = vigil();
    c.args(["probe", "--url", &format!("https://127.0.0.1:{port}/livez"), "--ca-cert", cert.to_str().unwrap()]);
    let o = run_bounded(c, Duration::from_secs(30));
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{out} {}", String::from_utf8_lossy(&o.stderr));
    // plain HTTP on the TLS port gets no HTTP answer
    let plain = http_get(port, "/livez", &[]);
    assert!(plain.as_ref().map_or(true, |(c, _)| *c != 200), "{plain:?}");
    // a key without its certificate is a usage error
    let mut c = vigil();
    c.args(["wait", "--url", "http://127.0.0.1:9/health", "--listen", "0", "--listen-key", key.to_str().unwrap()]);
    assert_eq!(run_bounded(c, Duration::from_secs(20)).status.code(), Some(2));
}

/// Two ranks (llama-server with its layers on ggml's RPC worker), the head with `--listen`: `/status` shows both
/// ranks with their hosts and phases, and the server ready.
#[test]
fn e2e_listen_multi_node_status_shows_every_rank() {
    let Some(e) = env() else { return };
    let Some(rpc) = e.rpc_server() else { return };
    let d = TempDir::new("listen-multi");
    let (rv, rpc_port, http, lport) = (free_port(), free_port(), free_port(), free_port());
    let rank = |r: usize, extra: &[&str], argv: Vec<String>| -> Guard {
        let out = std::fs::File::create(d.path(&format!("rank{r}.jsonl"))).unwrap();
        let mut c = vigil();
        c.args(["up", "--multi-node", "--json", "--name", "llama", "--join-timeout", "60s", "--timeout", "80s"]);
        c.args(["--rank", &r.to_string(), "--ranks", "2", "--rendezvous", &format!("127.0.0.1:{rv}")]).args(extra);
        c.arg("--").args(argv);
        let err = std::fs::File::create(d.path(&format!("rank{r}.stderr"))).unwrap();
        c.env("VIGIL_STATE_DIR", d.path("state")).stdin(Stdio::null()).stdout(out).stderr(err);
        Guard(c.spawn().unwrap())
    };
    let mut worker = vec!["stdbuf".to_string(), "-oL".into(), rpc.display().to_string()];
    worker.extend(["-H", "127.0.0.1", "-p", &rpc_port.to_string(), "-t", "1"].map(String::from));
    let mut r1 = rank(1, &[], worker);
    assert!(wait_for_text(&d.path("state").join("runs/llama.n1/server.log"), "Starting RPC server", T));
    let mut head = cmd(&e, "tiny.gguf", http);
    head.extend(["-ngl", "99", "--rpc", &format!("127.0.0.1:{rpc_port}")].map(String::from));
    let mut r0 = rank(0, &["--listen", &lport.to_string()], head);
    let h = d.path("rank0.jsonl");
    let done = poll_until(T, Duration::from_millis(20), || {
        std::fs::read_to_string(&h).unwrap_or_default().contains("\"multi_node_verdict\"")
    });
    let (code, st) = get_json(lport, "/status");
    let (sz, _) = get_json(lport, "/startupz");
    signal(r1.pid(), libc::SIGTERM);
    signal(r0.pid(), libc::SIGTERM);
    let _ = (wait_bounded(&mut r0.0, T), wait_bounded(&mut r1.0, T));
    let dump = || {
        ["rank0.jsonl", "rank0.stderr", "rank1.jsonl", "rank1.stderr"]
            .map(|f| format!("--- {f}\n{}", std::fs::read_to_string(d.path(f)).unwrap_or_default()))
            .join("\n")
    };
    assert!(done, "no combined verdict:\n{}", dump());
    assert_eq!(code, 200);
    let ranks = st["ranks"].as_array().unwrap();
    let mut got: Vec<u64> = ranks.iter().map(|r| r["rank"].as_u64().unwrap()).collect();
    got.sort();
    assert_eq!(got, vec![0, 1], "every rank in /status: {st}");
    assert!(ranks.iter().all(|r| r["host"].is_string() && r["phase"].is_string()), "{st}");
    assert_eq!((st["multi_node"].as_bool(), st["state"].as_str()), (Some(true), Some("ready")), "{st}");
    assert_eq!(sz, 200);
}
