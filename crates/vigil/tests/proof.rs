//! Proof of readiness, the watch after ready, and the hooks into systemd, Kubernetes and Prometheus,
//! against the real llama-server. Test names start with `e2e_`.

mod common;
use common::*;
use std::io::{Read, Write};
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(90);

fn v(state: &Path) -> Command {
    let mut c = vigil();
    c.env("VIGIL_STATE_DIR", state);
    c
}

fn cmd(e: &Env, port: u16, extra: &[&str]) -> Vec<String> {
    let mut a: Vec<String> =
        vec![e.server.display().to_string(), "-m".into(), e.models.join("tiny.gguf").display().to_string()];
    a.extend(["--host", "127.0.0.1", "--port"].iter().map(|s| s.to_string()));
    a.push(port.to_string());
    a.extend(["-c", "256", "-t", "1"].iter().map(|s| s.to_string()));
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

fn down(state: &Path, name: &str) {
    let mut c = v(state);
    c.args(["down", name]);
    let _ = run_bounded(c, T);
}

#[test]
fn e2e_ready_only_after_a_real_completion() {
    let Some(e) = env() else { return };
    let d = TempDir::new("gen");
    let port = free_port();
    let mut c = v(&d.0);
    c.args(["up", "--name", "g", "--detach", "--json", "--"]).args(cmd(&e, port, &[]));
    let o = run_bounded(c, T);
    assert_eq!(o.status.code(), Some(0));
    let lines = json_lines(&o);
    let gi = lines.iter().position(|l| l["event"] == "generation").expect("no generation proof");
    assert_eq!(lines[gi]["ok"], true);
    assert!(lines[gi]["tokens"].as_u64().unwrap() > 0);
    let r = verdict(&lines);
    assert_eq!(r["verdict"], "ready");
    assert!(r["detail"].as_str().unwrap().contains("generation proof"), "{r}");
    down(&d.0, "g");
}

/// A small proxy (named as such) that forwards /health to the real server but answers every other
/// request with a 500: the server must not be called ready.
#[test]
fn e2e_health_ok_but_completion_failing_is_not_ready() {
    let Some(e) = env() else { return };
    let d = TempDir::new("genfail");
    let port = free_port();
    let log = d.path("server.log");
    let _s = start_server(&e, &e.models.join("tiny.gguf"), port, &log, &[]);
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let pport = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut a) = s else { continue };
            std::thread::spawn(move || {
                let mut buf = [0u8; 8192];
                let n = a.read(&mut buf).unwrap_or(0);
                if buf[..n].starts_with(b"GET /health") {
                    if let Ok(mut b) = std::net::TcpStream::connect(("127.0.0.1", port)) {
                        let _ = b.write_all(&buf[..n]);
                        let _ = std::io::copy(&mut b, &mut a);
                    }
                } else {
                    let _ = a.write_all(
                        b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 5\r\nConnection: close\r\n\r\nerror",
                    );
                }
            });
        }
    });
    let mut c = vigil();
    c.args(["wait", "--json", "--server", "llama-cpp", "--generate-timeout", "2s", "--log"]).arg(&log);
    c.args(["--url", &format!("http://127.0.0.1:{pport}/health")]);
    let o = run_bounded(c, T);
    let lines = json_lines(&o);
    let r = verdict(&lines);
    assert_eq!(o.status.code(), Some(6), "{r}");
    assert_eq!(r["verdict"], "unhealthy");
    assert!(r["detail"].as_str().unwrap().contains("generation fails"), "{r}");
    assert!(!lines.iter().any(|l| l["event"] == "verdict" && l["verdict"] == "ready"));
}

fn spec_run(e: &Env, d: &TempDir, name: &str, draft: &str) -> (i32, serde_json::Value) {
    let port = free_port();
    let draft = e.models.join(draft).display().to_string();
    let mut c = v(&d.0);
    c.args(["up", "--name", name, "--detach", "--json", "--"]).args(cmd(
        e,
        port,
        &["-md", &draft, "--spec-type", "draft-simple"],
    ));
    let o = run_bounded(c, T);
    let r = verdict(&json_lines(&o)).clone();
    down(&d.0, name);
    (o.status.code().unwrap(), r)
}

#[test]
fn e2e_speculation_proven_or_degraded() {
    let Some(e) = env() else { return };
    let d = TempDir::new("spec");
    // the target as its own draft: every drafted token accepted
    let (code, r) = spec_run(&e, &d, "self", "tiny.gguf");
    assert_eq!(code, 0, "{r}");
    let det = r["detail"].as_str().unwrap().to_string();
    let (acc, drafted) = parse_accept(&det);
    assert!(drafted > 0 && acc * 2 >= drafted, "high acceptance expected: {det}");
    // a random draft (its own random output head): drafts, none accepted
    let (code, r) = spec_run(&e, &d, "rand", "random-draft.gguf");
    assert_eq!(code, 0, "{r}");
    let (acc, drafted) = parse_accept(r["detail"].as_str().unwrap());
    assert!(drafted > 0 && acc == 0, "{r}");
    // a gpt-2-vocab draft: llama-server logs the failure and runs on without speculation
    let (code, r) = spec_run(&e, &d, "gpt2", "gpt2-draft.gguf");
    assert_eq!(code, 11, "{r}");
    assert_eq!(r["verdict"], "ready");
    assert!(r["degraded"].as_str().unwrap().contains("speculation off"), "{r}");
    // the same server seen without its log: the missing draft_n alone proves it
    let port = free_port();
    let log = d.path("gpt2.log");
    let s = start_server(
        &e,
        &e.models.join("tiny.gguf"),
        port,
        &log,
        &["-md", &e.models.join("gpt2-draft.gguf").display().to_string(), "--spec-type", "draft-simple"],
    );
    let mut c = vigil();
    c.args(["wait", "--json", "--pid", &s.pid().to_string(), "--interval", "100ms"]);
    let o = run_bounded(c, T);
    let r = verdict(&json_lines(&o)).clone();
    assert_eq!(o.status.code(), Some(11), "{r}");
    assert!(r["degraded"].as_str().unwrap().contains("drafted no tokens"), "{r}");
}

fn parse_accept(detail: &str) -> (u64, u64) {
    // "speculation on: A/D drafted tokens accepted"
    let s = detail.split("speculation on: ").nth(1).unwrap_or_else(|| panic!("no speculation proof: {detail}"));
    let frac = s.split_whitespace().next().unwrap();
    let (a, d) = frac.split_once('/').unwrap();
    (a.parse().unwrap(), d.parse().unwrap())
}

/// `up --watch`: a server SIGSTOPped after ready is `unhealthy` within the configured bound; a server
/// SIGKILLed after ready is `crashed`.
#[test]
fn e2e_watch_after_ready_unhealthy_and_crashed() {
    let Some(e) = env() else { return };
    for (sig, want_code, want) in [(libc::SIGSTOP, 6, "unhealthy"), (libc::SIGKILL, 3, "crashed")] {
        let d = TempDir::new("watch");
        let port = free_port();
        let mut c = v(&d.0);
        c.args([
            "up",
            "--name",
            "w",
            "--watch",
            "--json",
            "--unhealthy-after",
            "2s",
            "--watch-probe-timeout",
            "1s",
            "--generate-every",
            "1s",
            "--",
        ]);
        c.args(cmd(&e, port, &[]));
        let (mut child, events) = spawn_json(c);
        let mut server = 0;
        let mut sent_at = None;
        let mut last = serde_json::Value::Null;
        for j in events {
            if j["event"] == "launched" {
                server = j["pid"].as_i64().unwrap() as i32;
            }
            if j["event"] == "verdict" && j["verdict"] == "ready" && sent_at.is_none() {
                signal(server, sig);
                sent_at = Some(j["t_ms"].as_u64().unwrap());
            }
            last = j;
        }
        let status = child.wait().unwrap();
        signal(server, libc::SIGCONT);
        assert_eq!(status.code(), Some(want_code), "{last}");
        assert_eq!(last["verdict"], want, "{last}");
        let dt = last["t_ms"].as_u64().unwrap() - sent_at.unwrap();
        if want == "unhealthy" {
            // bound: --unhealthy-after 2s + one probe timeout (1s) + one interval (1s) + slack
            assert!((2000..=6000).contains(&dt), "unhealthy after {dt} ms");
        } else {
            assert_eq!(last["cause"], "killed", "{last}");
            assert!(dt <= 3000, "crash seen after {dt} ms");
        }
        down(&d.0, "w");
    }
}

/// systemd: a notify socket read by the test (as systemd would). STATUS= carries the phases,
/// READY=1 comes only with the verdict, WATCHDOG=1 while healthy.
#[test]
fn e2e_systemd_notify_socket() {
    let Some(e) = env() else { return };
    let d = TempDir::new("notify");
    let sock_path = d.path("notify.sock");
    let sock = std::os::unix::net::UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
    let msgs: Arc<Mutex<Vec<(Instant, String)>>> = Arc::new(Mutex::new(Vec::new()));
    let m2 = msgs.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        loop {
            if let Ok(n) = sock.recv(&mut buf) {
                m2.lock().unwrap().push((Instant::now(), String::from_utf8_lossy(&buf[..n]).into_owned()));
            }
        }
    });
    let port = free_port();
    let log = d.path("server.log");
    let s = start_server(&e, &e.models.join("tiny.gguf"), port, &log, &[]);
    signal(s.pid(), libc::SIGSTOP); // held before it loads: a window in which READY=1 must not come
    let mut c = vigil();
    c.env("NOTIFY_SOCKET", &sock_path).env("WATCHDOG_USEC", "500000");
    c.args(["wait", "--json", "--watch", "--log"])
        .arg(&log)
        .args(["--url", &format!("http://127.0.0.1:{port}/health")]);
    let (mut child, mut events) = spawn_json(c);
    let mut verdict_at = None;
    let started = Instant::now();
    let mut continued = false;
    for j in events.by_ref() {
        if !continued && (started.elapsed() > Duration::from_millis(800) || j["event"] == "probe") {
            assert!(
                !msgs.lock().unwrap().iter().any(|(_, m)| m.contains("READY=1")),
                "READY=1 before the server was ready"
            );
            signal(s.pid(), libc::SIGCONT);
            continued = true;
        }
        if j["event"] == "verdict" && j["verdict"] == "ready" {
            verdict_at = Some(Instant::now());
            break;
        }
    }
    // let the watch run long enough for watchdog pings, then stop vigil
    let t0 = Instant::now();
    while t0.elapsed() < T && !msgs.lock().unwrap().iter().any(|(_, m)| m == "WATCHDOG=1") {
        std::thread::sleep(Duration::from_millis(20));
    }
    signal(child.id() as i32, libc::SIGINT);
    let _ = child.wait();
    let m = msgs.lock().unwrap().clone();
    let ready_i = m.iter().position(|(_, x)| x.starts_with("READY=1")).expect("no READY=1");
    assert!(
        m[..ready_i].iter().any(|(_, x)| x.starts_with("STATUS=llama-cpp weights")),
        "no STATUS with the phase before READY=1: {m:?}"
    );
    assert!(m[ready_i].1.contains("STATUS=ready"), "{m:?}");
    assert!(verdict_at.is_some(), "no ready verdict");
    assert!(m.iter().any(|(_, x)| x == "WATCHDOG=1"), "no watchdog ping while healthy: {m:?}");
}

/// `vigil probe` for Kubernetes: exit 1 while starting, 0 when ready, 1 when crashed; one line each.
#[test]
fn e2e_kubernetes_probe_exit_codes() {
    let Some(e) = env() else { return };
    let d = TempDir::new("kprobe");
    // starting: a server held in weight loading (model on a FIFO)
    let port = free_port();
    let log = d.path("starting.log");
    let fifo = fifo_model(&d);
    let _held = start_server(&e, &fifo, port, &log, &[]);
    assert!(wait_for_text(&log, "loading model", T));
    let probe = |args: &[&str]| {
        let mut c = v(&d.0);
        c.arg("probe").args(args);
        let o = run_bounded(c, Duration::from_secs(20));
        let out = String::from_utf8_lossy(&o.stdout).to_string();
        assert_eq!(out.lines().count(), 1, "one line: {out}");
        (o.status.code().unwrap(), out)
    };
    let (code, out) = probe(&["--url", &format!("http://127.0.0.1:{port}/health"), "--log", log.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("not ready: starting in weights"), "{out}");
    // ready
    let port2 = free_port();
    let mut c = v(&d.0);
    c.args(["up", "--name", "k", "--detach", "--"]).args(cmd(&e, port2, &[]));
    assert_eq!(run_bounded(c, T).status.code(), Some(0));
    let (code, out) = probe(&["k"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.starts_with("ready:"), "{out}");
    let (code, out) = probe(&["k", "--generate"]);
    assert_eq!(code, 0, "{out}");
    // crashed
    down(&d.0, "k");
    let mut a = cmd(&e, free_port(), &[]);
    a[2] = e.models.join("truncated.gguf").display().to_string();
    let mut c2 = v(&d.0);
    c2.args(["up", "--name", "bad", "--no-check", "--"]).args(&a);
    assert_eq!(run_bounded(c2, T).status.code(), Some(3));
    let (code, out) = probe(&["bad"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("crashed"), "{out}");
}

/// Prometheus: `--metrics` scraped and parsed.
#[test]
fn e2e_metrics_endpoint_scraped() {
    let Some(e) = env() else { return };
    let d = TempDir::new("metrics");
    let port = free_port();
    let mport = free_port();
    let mut c = v(&d.0);
    c.args(["up", "--name", "m", "--watch", "--json", "--metrics", &mport.to_string(), "--"]).args(cmd(&e, port, &[]));
    let (mut child, mut events) = spawn_json(c);
    loop {
        let j = events.next().expect("vigil ended early");
        if j["event"] == "verdict" {
            assert_eq!(j["verdict"], "ready");
            break;
        }
    }
    let scrape = || {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", mport)).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
        let mut b = String::new();
        s.read_to_string(&mut b).unwrap();
        b
    };
    // the loop refreshes the metrics on its next turn: wait (bounded) for the serving phase
    let t0 = Instant::now();
    let mut body = scrape();
    while !body.contains("phase=\"serving\"} 1") && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
        body = scrape();
    }
    assert!(body.starts_with("HTTP/1.1 200"), "{body}");
    let mut values = std::collections::BTreeMap::new();
    for line in body.lines().filter(|l| l.starts_with("vigil_")) {
        let (k, v) = line.rsplit_once(' ').unwrap();
        values.insert(k.to_string(), v.parse::<f64>().unwrap_or_else(|_| panic!("not a number: {line}")));
    }
    assert_eq!(values.get("vigil_phase{server=\"llama-cpp\",phase=\"serving\"}"), Some(&1.0), "{body}");
    assert_eq!(values.get("vigil_phase{server=\"llama-cpp\",phase=\"weights\"}"), Some(&0.0), "{body}");
    assert_eq!(values.get("vigil_verdict{server=\"llama-cpp\",verdict=\"ready\"}"), Some(&1.0), "{body}");
    assert!(values.contains_key("vigil_probe_latency_seconds"), "{body}");
    assert!(values.contains_key("vigil_phase_seconds"), "{body}");
    assert!(values.keys().any(|k| k.starts_with("vigil_restarts")), "{body}");
    signal(child.id() as i32, libc::SIGINT);
    let st = child.wait().unwrap();
    assert_eq!(st.code(), Some(130));
}
