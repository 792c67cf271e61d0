//! The hostile-input suite: every case asserts a verdict or a clear error, no hang (every run is
//! bounded), no orphan process. Scripted HTTP servers here are named as such: they play behaviour no
//! real server shows (never answering, trickling, squatting). Test names start with `e2e_` where they
//! use the real llama-server.

mod common;
use common::*;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(60);

/// A scripted HTTP server: runs `behave` for every connection.
fn scripted(behave: fn(std::net::TcpStream)) -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            std::thread::spawn(move || behave(s));
        }
    });
    port
}

fn read_req(s: &mut std::net::TcpStream) {
    let mut buf = [0u8; 4096];
    let _ = s.read(&mut buf);
}

fn wait_url(port: u16, extra: &[&str]) -> (i32, Vec<serde_json::Value>, Duration) {
    let mut c = vigil();
    c.args([
        "wait",
        "--json",
        "--server",
        "llama-cpp",
        "--url",
        &format!("http://127.0.0.1:{port}/health"),
        "--interval",
        "200ms",
    ]);
    c.args(extra);
    let t0 = Instant::now();
    let o = run_bounded(c, T);
    (o.status.code().unwrap(), json_lines(&o), t0.elapsed())
}

#[test]
fn http_accept_and_never_answer() {
    let port = scripted(|s| {
        std::thread::sleep(Duration::from_secs(30));
        drop(s);
    });
    let (code, v, dt) = wait_url(port, &["--timeout", "3s", "--probe-timeout", "500ms"]);
    assert_eq!(code, 5, "{v:?}");
    assert!(dt < Duration::from_secs(10), "took {dt:?}");
    assert!(v.iter().any(|x| x["event"] == "probe" && x["outcome"] == "timeout"), "{v:?}");
}

#[test]
fn http_headers_then_no_body_and_trickled_body() {
    // health answers 200 at once, but the completion (with a body) never finishes / trickles
    for behave in [
        (|mut s: std::net::TcpStream| {
            read_req(&mut s);
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n");
            std::thread::sleep(Duration::from_secs(30));
        }) as fn(std::net::TcpStream),
        |mut s: std::net::TcpStream| {
            read_req(&mut s);
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n");
            for _ in 0..30 {
                if s.write_all(b"x").is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_secs(1));
            }
        },
    ] {
        let port = scripted(behave);
        let (code, v, dt) = wait_url(port, &["--generate-timeout", "2s", "--probe-timeout", "1s"]);
        assert_eq!(code, 6, "health answers, generation never completes: unhealthy: {v:?}");
        assert!(dt < Duration::from_secs(45), "took {dt:?}");
    }
}

#[test]
fn http_huge_body_is_bounded() {
    // 200 OK then an endless body: the reads are bounded, memory does not grow
    let port = scripted(|mut s| {
        read_req(&mut s);
        let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 1073741824\r\n\r\n");
        let chunk = vec![b'a'; 1 << 16];
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(20) && s.write_all(&chunk).is_ok() {}
    });
    let (code, v, _) = wait_url(port, &["--generate-timeout", "2s", "--probe-timeout", "2s"]);
    assert_eq!(code, 6, "{v:?}");
    assert!(
        v.iter().any(|x| x["event"] == "generation" && x["note"].as_str().unwrap_or("").contains("larger than")),
        "{v:?}"
    );
    // SAFETY: getrusage into a struct we own; children of this test process only.
    let maxrss_kb = unsafe {
        let mut r: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_CHILDREN, &mut r);
        r.ru_maxrss
    };
    assert!(maxrss_kb < 100 * 1024, "vigil grew to {maxrss_kb} KiB on a 1 GB body");
}

#[test]
fn http_reset_and_garbage() {
    for behave in [
        (|s: std::net::TcpStream| {
            // connection reset: RST via SO_LINGER 0
            use std::os::fd::AsRawFd;
            let l = libc::linger { l_onoff: 1, l_linger: 0 };
            // SAFETY: setsockopt on a socket we own, with a struct of the right size.
            unsafe {
                libc::setsockopt(
                    s.as_raw_fd(),
                    libc::SOL_SOCKET,
                    libc::SO_LINGER,
                    &l as *const libc::linger as *const libc::c_void,
                    std::mem::size_of::<libc::linger>() as u32,
                );
            }
            drop(s);
        }) as fn(std::net::TcpStream),
        |mut s: std::net::TcpStream| {
            read_req(&mut s);
            let _ = s.write_all(b"\x00\xff garbage, not HTTP at all\r\n\r\n");
        },
        |mut s: std::net::TcpStream| {
            read_req(&mut s);
            let _ = s.write_all(b"SSH-2.0-OpenSSH_9.2\r\n");
        },
    ] {
        let port = scripted(behave);
        let (code, v, dt) = wait_url(port, &["--timeout", "2s"]);
        assert_eq!(code, 5, "{v:?}");
        assert!(dt < Duration::from_secs(10));
        assert!(v.iter().any(|x| x["event"] == "probe" && x["outcome"] == "error"), "{v:?}");
    }
}

/// A scripted TLS stand-in (no real server does this): it accepts, reads the ClientHello and never
/// answers it. The handshake is inside the probe's deadline: a probe timeout, not a hang.
#[test]
fn https_accept_and_never_finish_the_handshake() {
    let port = scripted(|mut s| {
        read_req(&mut s);
        std::thread::sleep(Duration::from_secs(30));
    });
    let url = format!("https://127.0.0.1:{port}/health");
    // `vigil probe`: one probe, bounded by --timeout; measured.
    let mut c = vigil();
    c.args(["probe", "--url", &url, "--timeout", "1s"]);
    let t0 = Instant::now();
    let o = run_bounded(c, T);
    let dt = t0.elapsed();
    let out = String::from_utf8_lossy(&o.stdout);
    eprintln!("handshake stall: vigil probe --timeout 1s ended after {dt:?}");
    assert_eq!(o.status.code(), Some(1), "{out}");
    // The whole command is bounded by --timeout: the probe gets what is left after the set-up.
    assert!(out.contains("no answer within") && out.contains("(TLS handshake not finished)"), "{out}");
    assert!(dt >= Duration::from_secs(1) && dt < Duration::from_secs(5), "took {dt:?}");
    // `vigil wait`: every probe times out at --probe-timeout; the verdict comes at --timeout.
    let mut c = vigil();
    c.args(["wait", "--json", "--server", "llama-cpp", "--url", &url, "--interval", "200ms"]);
    c.args(["--timeout", "3s", "--probe-timeout", "500ms"]);
    let t0 = Instant::now();
    let o = run_bounded(c, T);
    let dt = t0.elapsed();
    let v = json_lines(&o);
    assert_eq!(o.status.code(), Some(5), "{v:?}");
    assert!(dt < Duration::from_secs(10), "took {dt:?}");
    let p = v.iter().find(|x| x["event"] == "probe").expect("no probe event");
    assert_eq!(p["outcome"], "timeout", "{p}");
    let ms = p["latency_ms"].as_u64().unwrap();
    eprintln!("handshake stall: wait --probe-timeout 500ms: probe ended after {ms} ms");
    assert!((500..1500).contains(&ms), "{p}");
}

/// A scripted stand-in that answers the ClientHello with bytes that are not TLS: an error at once.
#[test]
fn https_garbage_instead_of_a_server_hello() {
    let port = scripted(|mut s| {
        read_req(&mut s);
        let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
    });
    let mut c = vigil();
    c.args(["probe", "--url", &format!("https://127.0.0.1:{port}/health"), "--timeout", "5s"]);
    let t0 = Instant::now();
    let o = run_bounded(c, T);
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(out.contains("TLS handshake") && out.contains("plain http://"), "{out}");
    assert!(t0.elapsed() < Duration::from_secs(3), "took {:?}", t0.elapsed());
}

/// `localhost` URL against a server on 127.0.0.1 only (the ::1-first order is tested in probe.rs's
/// `ipv6_first_falls_back_to_ipv4`: this machine's resolver gives 127.0.0.1 only).
#[test]
fn e2e_localhost_url_reaches_an_ipv4_only_server() {
    let Some(e) = env() else { return };
    let d = TempDir::new("localhost");
    let port = free_port();
    let log = d.path("server.log");
    let _s = start_server(&e, &e.models.join("tiny.gguf"), port, &log, &[]);
    let mut c = vigil();
    c.args([
        "wait",
        "--json",
        "--url",
        &format!("http://localhost:{port}/health"),
        "--server",
        "llama-cpp",
        "--interval",
        "100ms",
    ]);
    let o = run_bounded(c, T);
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stdout));
}

/// A scripted squatter answers 200 on the URL's port, but the server (held loading) is another process:
/// vigil must not call it ready.
#[test]
fn e2e_a_200_from_a_process_not_in_our_tree_is_not_ready() {
    let Some(e) = env() else { return };
    let d = TempDir::new("squat");
    let sport = scripted(|mut s| {
        read_req(&mut s);
        let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 15\r\n\r\n{\"status\":\"ok\"}");
    });
    let log = d.path("server.log");
    let fifo = fifo_model(&d);
    let srv = start_server(&e, &fifo, free_port(), &log, &[]);
    let mut c = vigil();
    c.args([
        "wait",
        "--json",
        "--timeout",
        "3s",
        "--pid",
        &srv.pid().to_string(),
        "--url",
        &format!("http://127.0.0.1:{sport}/health"),
        "--log",
    ]);
    c.arg(&log);
    let o = run_bounded(c, T);
    let v = json_lines(&o);
    assert_eq!(o.status.code(), Some(5), "{v:?}");
    assert!(
        v.iter()
            .any(|x| x["event"] == "note" && x["message"].as_str().unwrap().contains("not the server's process tree")),
        "{v:?}"
    );
}

#[test]
fn logs_that_never_appear_or_are_deleted_and_recreated() {
    let d = TempDir::new("logs");
    // never appears: a timeout verdict, no hang
    let mut c = vigil();
    c.args(["wait", "--json", "--server", "llama-cpp", "--timeout", "2s", "--log"]).arg(d.path("never.log"));
    let o = run_bounded(c, T);
    assert_eq!(o.status.code(), Some(5));
    assert!(String::from_utf8_lossy(&o.stdout).contains("waiting for log"));
    // deleted and recreated: the new file is read from its start
    let log = d.path("server.log");
    std::fs::write(&log, "0.00.001.000 I srv    load_model: loading model 'm.gguf'\n").unwrap();
    let mut c = vigil();
    c.args(["wait", "--json", "--echo", "--server", "llama-cpp", "--timeout", "20s", "--log"]).arg(&log);
    let (mut child, mut events) = spawn_json(c);
    // the echoed first line: the old file was read
    while !events.next().expect("vigil ended early").to_string().contains("loading model") {}
    std::fs::remove_file(&log).unwrap();
    std::fs::write(&log, "0.00.002.000 I srv  llama_server: model loaded\n").unwrap();
    let rest: Vec<serde_json::Value> = events.collect();
    assert_eq!(wait_bounded(&mut child, T).code(), Some(0), "{rest:?}");
    assert!(rest.iter().any(|v| v["verdict"] == "ready"), "{rest:?}");
}

fn up(state: &Path, args: &[&str], cmd: &[String]) -> Command {
    let mut c = vigil();
    c.env("VIGIL_STATE_DIR", state).arg("up").args(args).arg("--").args(cmd);
    c
}

fn tiny(e: &Env, model: &Path) -> Vec<String> {
    vec![
        e.server.display().to_string(),
        "-m".into(),
        model.display().to_string(),
        "--host".into(),
        "127.0.0.1".into(),
        "--port".into(),
        free_port().to_string(),
        "-c".into(),
        "256".into(),
    ]
}

fn state(state: &Path, name: &str) -> Option<serde_json::Value> {
    serde_json::from_slice(&std::fs::read(state.join("runs").join(name).join("state.json")).ok()?).ok()
}

fn all_dead(state_dir: &Path, name: &str) -> bool {
    let Some(st) = state(state_dir, name) else { return true };
    let alive = |p: i64| {
        std::fs::read_to_string(format!("/proc/{p}/stat"))
            .map(|s| {
                !matches!(s.rsplit_once(')').and_then(|(_, r)| r.split_whitespace().next()), Some("Z") | Some("X"))
            })
            .unwrap_or(false)
    };
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(15) {
        if !alive(st["keeper_pid"].as_i64().unwrap_or(0)) && !st["server_pid"].as_i64().is_some_and(alive) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// SIGINT and SIGTERM to vigil in each of its states; nothing is left behind.
#[test]
fn e2e_signals_to_vigil_in_each_state() {
    let Some(e) = env() else { return };
    // (a) right away (before or while spawning)
    let d = TempDir::new("sig-a");
    let mut c = up(&d.0, &["--name", "a", "--json"], &tiny(&e, &e.models.join("tiny.gguf")));
    c.stdout(Stdio::null()).stderr(Stdio::null());
    let mut child = c.spawn().unwrap();
    signal(child.id() as i32, libc::SIGTERM);
    let st = wait_bounded(&mut child, T);
    // Before its handlers are installed (the first instructions of main) the default action ends vigil,
    // and nothing is started yet; after, it is handled: exit 130, nothing started or all stopped.
    use std::os::unix::process::ExitStatusExt;
    assert!(st.code() == Some(130) || st.signal() == Some(libc::SIGTERM), "{st:?}");
    assert!(all_dead(&d.0, "a"), "a process was left after SIGTERM at start");
    // handled for sure: a SIGTERM while the preflight check runs (it reads a FIFO-free model config)
    let d2 = TempDir::new("sig-a2");
    let mut c = up(&d2.0, &["--name", "a2", "--json"], &tiny(&e, &e.models.join("tiny.gguf")));
    c.stdout(Stdio::null()).stderr(Stdio::null());
    let mut child = c.spawn().unwrap();
    std::thread::sleep(Duration::from_millis(5));
    signal(child.id() as i32, libc::SIGTERM);
    let st = wait_bounded(&mut child, T);
    assert!(st.code() == Some(130) || st.signal() == Some(libc::SIGTERM), "{st:?}");
    assert!(all_dead(&d2.0, "a2"), "a process was left after SIGTERM during the launch");
    // (b) waiting, with the server held by SIGSTOP while loading: SIGTERM → tree stopped (SIGKILL after grace)
    let d = TempDir::new("sig-b");
    let fifo = fifo_model(&d);
    let c = up(&d.0, &["--name", "b", "--json", "--grace", "500ms"], &tiny(&e, &fifo));
    let (mut child, mut events) = spawn_json(c);
    let mut server = 0;
    loop {
        let j = events.next().expect("vigil ended early");
        if j["event"] == "launched" {
            server = j["pid"].as_i64().unwrap() as i32;
        }
        if j["event"] == "phase" && j["phase"] == "weights" {
            break;
        }
    }
    signal(server, libc::SIGSTOP);
    signal(child.id() as i32, libc::SIGTERM);
    assert_eq!(wait_bounded(&mut child, T).code(), Some(130));
    assert!(all_dead(&d.0, "b"));
    // (c) after ready, in the foreground: SIGINT stops the server, exit 130 (the README's table)
    let d = TempDir::new("sig-c");
    let c = up(&d.0, &["--name", "c", "--json"], &tiny(&e, &e.models.join("tiny.gguf")));
    let (mut child, mut events) = spawn_json(c);
    while events.next().expect("vigil ended early")["verdict"] != "ready" {}
    signal(child.id() as i32, libc::SIGINT);
    assert_eq!(wait_bounded(&mut child, T).code(), Some(130));
    assert!(all_dead(&d.0, "c"));
    // (d) during down: one SIGINT does not abandon the stop
    let d = TempDir::new("sig-d");
    let c = up(&d.0, &["--name", "d", "--detach"], &tiny(&e, &e.models.join("tiny.gguf")));
    assert_eq!(run_bounded(c, T).status.code(), Some(0));
    let srv = state(&d.0, "d").unwrap()["server_pid"].as_i64().unwrap() as i32;
    signal(srv, libc::SIGSTOP); // SIGTERM stays pending: down waits for the grace period
    let mut c = vigil();
    c.env("VIGIL_STATE_DIR", &d.0).args(["down", "d", "--grace", "1s"]);
    c.stdout(Stdio::null()).stderr(Stdio::null());
    let mut child = c.spawn().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    signal(child.id() as i32, libc::SIGINT);
    let st = wait_bounded(&mut child, T);
    assert_eq!(st.code(), Some(0), "down was abandoned: {st:?}");
    assert!(all_dead(&d.0, "d"));
}

#[test]
fn e2e_stdout_closed_early_and_a_grandchild_holding_the_pipe() {
    let Some(_) = env() else { return };
    // the server closes its stdout and runs on: readiness still comes through stderr
    let d = TempDir::new("pipes");
    let script = "exec 1>&-; echo '0.00.095.288 I srv  llama_server: model loaded' >&2; exec sleep 60";
    let c = up(
        &d.0,
        &["--name", "closed", "--detach", "--no-check", "--no-probe", "--server", "llama-cpp"],
        &["sh".into(), "-c".into(), script.into()],
    );
    let o = run_bounded(c, T);
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stdout));
    let mut c = vigil();
    c.env("VIGIL_STATE_DIR", &d.0).args(["down", "closed"]);
    assert_eq!(run_bounded(c, T).status.code(), Some(0));
    // the server exits while a grandchild keeps its stdout open: crashed at once, not when the pipe closes
    let script = "sleep 60 & echo '0.00.001.000 I srv    load_model: loading model x'; exit 1";
    let t0 = Instant::now();
    let c = up(
        &d.0,
        &["--name", "gc", "--json", "--no-check", "--no-probe", "--server", "llama-cpp"],
        &["sh".into(), "-c".into(), script.into()],
    );
    let o = run_bounded(c, T);
    let v = json_lines(&o);
    assert_eq!(o.status.code(), Some(3), "{v:?}");
    assert!(verdict(&v)["detail"].as_str().unwrap().contains("exited with status 1"), "{v:?}");
    assert!(t0.elapsed() < Duration::from_secs(10), "took {:?}", t0.elapsed());
    let mut c = vigil();
    c.env("VIGIL_STATE_DIR", &d.0).args(["down", "gc"]);
    assert_eq!(run_bounded(c, T).status.code(), Some(0), "the grandchild must be stopped too");
    assert!(all_dead(&d.0, "gc"));
}

/// The run directory not writable, or the disk full (RLIMIT_FSIZE: this sandbox may not mount a tmpfs):
/// a clear error, and the server is not started.
#[test]
fn e2e_unwritable_or_full_run_directory() {
    let Some(e) = env() else { return };
    let d = TempDir::new("disk");
    let marker = d.path("started");
    let cmd = vec!["sh".to_string(), "-c".into(), format!("touch {}; exec sleep 60", marker.display())];
    // not writable: the state directory lies under a regular file
    let blocker = d.path("file");
    std::fs::write(&blocker, "x").unwrap();
    let c = up(&blocker.join("state"), &["--name", "x", "--no-check", "--no-probe"], &cmd);
    let o = run_bounded(c, T);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("cannot create"), "{err}");
    assert!(!marker.exists(), "the server was started");
    // full: writes past 1 KiB fail (SIGXFSZ ignored, so they fail with EFBIG)
    let st = d.path("state2");
    let mut c = Command::new("sh");
    c.arg("-c").arg(format!(
        "trap '' XFSZ; ulimit -f 1; exec {} up --name y --no-check --no-probe -- sh -c 'touch {}; exec sleep 60'",
        vigil_bin().display(),
        marker.display()
    ));
    c.env("VIGIL_STATE_DIR", &st).env("XDG_CONFIG_HOME", "/nonexistent-vigil-test");
    let o = run_bounded(c, T);
    assert_eq!(o.status.code(), Some(2), "{}", String::from_utf8_lossy(&o.stderr));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("cannot write") && err.contains("run.json"), "{err}");
    assert!(!marker.exists(), "the server was started");
    let _ = e;
}
