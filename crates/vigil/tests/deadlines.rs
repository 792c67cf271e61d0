//! Issue #36, items 6 and 7 and the smaller findings of the audit: every deadline holds (a log that never
//! ends, a FIFO fed without end, a health answer whose headers never end, a completion whose body never
//! ends, a stop's grace), durations of 0 are refused, a broken user profile blocks only the commands that
//! need it, and the output a terminal shows or a run stores can be trusted (control bytes escaped, the
//! `stopped` event redacted). Scripted HTTP servers here (`scripted_http`) play behaviour no real server
//! shows; tests named `e2e_` use the real llama-server. Runs as root and as the unprivileged CI user.

mod common;
use common::*;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(60);

/// A scripted HTTP server (no real server behaves so): runs `behave` for every connection, with the
/// request's first line.
fn scripted_http(behave: fn(std::net::TcpStream, String)) -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut s in l.incoming().flatten() {
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                let n = s.read(&mut buf).unwrap_or(0);
                let first = String::from_utf8_lossy(&buf[..n]).lines().next().unwrap_or("").to_string();
                behave(s, first)
            });
        }
    });
    port
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// `vigil wait` on a log that never ends (`/dev/zero`: bytes without a newline, as fast as they can be
/// read) ends at its --timeout (it ran 694 s at 98 % CPU and ignored SIGTERM).
#[test]
fn a_log_that_never_ends_ends_at_the_timeout() {
    let mut c = vigil();
    c.args(["wait", "--json", "--server", "llama-cpp", "--timeout", "3s", "--log", "/dev/zero"]);
    let t0 = Instant::now();
    let o = run_bounded(c, T);
    let dt = t0.elapsed();
    eprintln!("wait --log /dev/zero --timeout 3s ended after {dt:?}");
    assert_eq!(o.status.code(), Some(5), "{}", String::from_utf8_lossy(&o.stdout));
    assert!(dt < Duration::from_secs(10), "took {dt:?}");
}

/// A FIFO: fed by `yes` without end, or with a writer that never writes (opening and reading it used to
/// block the one runtime thread). Each ends at --timeout with memory bounded; SIGTERM ends it at once.
#[test]
fn a_fifo_without_end_or_without_data_ends_at_the_timeout_and_on_sigterm() {
    let d = TempDir::new("fifo-log");
    let fifo = d.path("server.log");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo with a valid C string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
    let writer = |cmd: &str| {
        let mut w = Command::new("sh");
        w.arg("-c").arg(format!("exec {cmd} > '{}'", fifo.display())).stdout(Stdio::null()).stderr(Stdio::null());
        Guard(w.spawn().unwrap())
    };
    for feed in ["yes", "sleep 60"] {
        let _w = writer(feed);
        let mut c = vigil();
        c.args(["wait", "--json", "--server", "llama-cpp", "--timeout", "3s", "--log"]).arg(&fifo);
        c.stdout(Stdio::null()).stderr(Stdio::null()).stdin(Stdio::null());
        let t0 = Instant::now();
        let mut child = c.spawn().unwrap();
        let (st, rss_kib) = wait_rusage(&mut child, T);
        let dt = t0.elapsed();
        eprintln!("wait --log FIFO fed by `{feed}` --timeout 3s: ended after {dt:?}, peak RSS {rss_kib} KiB");
        assert_eq!(st.code(), Some(5), "{feed}: {st:?}");
        assert!(dt < Duration::from_secs(10), "{feed}: took {dt:?}");
        assert!(rss_kib < 100 * 1024, "{feed}: vigil grew to {rss_kib} KiB");
    }
    // SIGTERM while `yes` feeds it: acted on at once (the handler is looked at every 20 ms)
    let _w = writer("yes");
    let mut c = vigil();
    c.args(["wait", "--json", "--server", "llama-cpp", "--timeout", "60s", "--log"]).arg(&fifo);
    let (mut child, mut events) = spawn_json(c);
    while events.next().expect("vigil ended early")["event"] != "start" {}
    signal(child.id() as i32, libc::SIGTERM);
    let t0 = Instant::now();
    let st = wait_bounded(&mut child, T);
    let dt = t0.elapsed();
    eprintln!("SIGTERM to wait --log FIFO fed by yes: exited {dt:?} after it");
    assert_eq!(st.code(), Some(130), "{st:?}");
    assert!(dt < Duration::from_secs(2), "took {dt:?}");
}

/// `wait --log DIR` waited silently; it is a one-line usage error.
#[test]
fn a_log_that_is_a_directory_is_one_line_error() {
    let d = TempDir::new("log-dir");
    let mut c = vigil();
    c.args(["wait", "--server", "llama-cpp", "--timeout", "5s", "--log"]).arg(&d.0);
    let o = run_bounded(c, T);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("is a directory"), "{err}");
}

fn wait_url(port: u16, extra: &[&str]) -> (i32, Vec<serde_json::Value>, Duration) {
    let mut c = vigil();
    c.args(["wait", "--json", "--server", "llama-cpp", "--interval", "200ms", "--url"]);
    c.arg(format!("http://127.0.0.1:{port}/health")).args(extra);
    let t0 = Instant::now();
    let o = run_bounded(c, T);
    (o.status.code().unwrap(), json_lines(&o), t0.elapsed())
}

/// A 200 whose headers never end (trickled, or endless) is not an answer: the probe counts a status only
/// once the headers end, within its timeout and 16 KiB (it was READY on the status line alone).
#[test]
fn a_200_whose_headers_never_end_is_not_ready() {
    let trickle = scripted_http(|mut s, _| {
        let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n");
        for _ in 0..300 {
            if s.write_all(b"X-Pad: a\r\n").is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    let (code, v, dt) = wait_url(trickle, &["--no-generate", "--timeout", "3s", "--probe-timeout", "1s"]);
    assert_eq!(code, 5, "{v:?}");
    assert!(dt < Duration::from_secs(10), "took {dt:?}");
    let p = v.iter().find(|x| x["event"] == "probe").expect("a probe event");
    assert_eq!(p["outcome"], "timeout", "{p}");
    assert!(p["note"].as_str().unwrap().contains("headers never ended"), "{p}");
    let endless = scripted_http(|mut s, _| {
        let _ = s.write_all(b"HTTP/1.1 200 OK\r\n");
        let pad = vec![b'a'; 4096];
        while s.write_all(b"X-Pad: ").and_then(|_| s.write_all(&pad)).is_ok() {}
    });
    let (code, v, _) = wait_url(endless, &["--no-generate", "--timeout", "3s", "--probe-timeout", "1s"]);
    assert_eq!(code, 5, "{v:?}");
    assert!(
        v.iter().any(|x| x["event"] == "probe" && x["note"].as_str().unwrap_or("").contains("headers longer than")),
        "{v:?}"
    );
}

/// Writes `head`, then a body a byte every 100 ms for a minute (a body that never ends, for the test).
fn trickle(mut s: std::net::TcpStream, head: &[u8]) {
    let _ = s.write_all(head);
    for _ in 0..600 {
        if s.write_all(b"a").is_err() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A health URL that answers 200 while the completion's body never ends (trickled), then one whose every
/// answer's body never ends: `--timeout 4s` holds, for the proof too (it became 121 s: the proof's own 120 s
/// budget).
#[test]
fn the_timeout_bounds_the_generation_proof() {
    let port = scripted_http(|mut s, first| {
        if first.starts_with("GET") {
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 15\r\n\r\n{\"status\":\"ok\"}");
            return;
        }
        trickle(s, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{\"content\":\"")
    });
    let (code, v, dt) = wait_url(port, &["--timeout", "4s"]);
    eprintln!("wait --timeout 4s with a completion that never ends: ended after {dt:?}");
    assert_eq!(code, 5, "{v:?}");
    let r = verdict(&v);
    assert_eq!(r["verdict"], "timeout", "{r}");
    assert!(r["detail"].as_str().unwrap().contains("while proving generation"), "{r}");
    assert!(dt < Duration::from_secs(12), "took {dt:?}");
    // every answer, the health one included, a 200 whose body never ends (trickled): ready on the headers or
    // not, the timeout holds
    let port = scripted_http(|s, _| {
        trickle(s, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n{\"")
    });
    let (code, v, dt) = wait_url(port, &["--timeout", "4s"]);
    eprintln!("wait --timeout 4s with a health answer and a completion that never end: ended after {dt:?}");
    assert_eq!(code, 5, "{v:?}");
    assert_eq!(verdict(&v)["verdict"], "timeout", "{v:?}");
    assert!(dt < Duration::from_secs(12), "took {dt:?}");
}

/// `--stall 0s` was accepted (a healthy server was called stalled and stopped in 0.43 s); 0 is refused
/// wherever it makes no sense, in one line, before anything is launched.
#[test]
fn zero_durations_are_refused_in_one_line() {
    let d = TempDir::new("zero");
    let marker = d.path("started");
    let launch = format!("touch {}; exec sleep 30", marker.display());
    for args in [
        vec!["wait", "--url", "http://127.0.0.1:1/", "--stall", "0s"],
        vec!["wait", "--url", "http://127.0.0.1:1/", "--stall", "weights=0"],
        vec!["wait", "--url", "http://127.0.0.1:1/", "--timeout", "0s"],
        vec!["wait", "--url", "http://127.0.0.1:1/", "--interval", "0ms"],
        vec!["up", "--name", "z", "--no-check", "--stall", "0s", "--", "sh", "-c", &launch],
    ] {
        let mut c = vigil();
        c.env("VIGIL_STATE_DIR", d.path("state")).args(&args);
        let o = run_bounded(c, T);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.starts_with("vigil: error: ") && err.contains("above zero"), "{args:?}: {err}");
    }
    assert!(!marker.exists(), "a server was started");
}

/// A syntax error in a user profile blocked `status` and `down --all`: it is a warning for every command
/// that does not need the profiles, and still an error for those that do.
#[test]
fn a_broken_user_profile_blocks_only_what_needs_it() {
    let d = TempDir::new("badprof");
    let dir = d.path("config/vigil/profiles");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("mine.toml"), "name = 'mine'\n[[rule]\nname = 'x'\n").unwrap();
    let run = |args: &[&str]| {
        let mut c = vigil();
        c.env("XDG_CONFIG_HOME", d.path("config")).env("VIGIL_STATE_DIR", d.path("state")).args(args);
        run_bounded(c, T)
    };
    for args in [&["status"][..], &["down", "--all"], &["ps"], &["status", "--json"]] {
        let o = run(args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains("warning") && err.contains("mine.toml") && err.contains("built-in"), "{args:?}: {err}");
    }
    let o = run(&["wait", "--url", "http://127.0.0.1:1/"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("profile error") && err.contains("mine.toml"), "{err}");
}

/// Root's `vigil ps` printed another user's process title raw: its escape codes set the terminal's title
/// and cleared the screen. Control bytes from other processes are shown escaped in human output (and
/// kept, JSON-escaped, in `--json`). As root the process belongs to `nobody`.
#[test]
fn control_bytes_of_other_processes_are_escaped() {
    let evil = "\x1b]0;pwned\x07\x1b[2J\u{9b}31m";
    let mut p = Command::new("python3");
    p.arg0("llama-server").args(["-c", "import time; time.sleep(60)", evil]);
    p.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
    if is_root() {
        p.uid(65534).gid(65534);
    }
    let g = Guard(p.spawn().expect("python3"));
    let pid = g.pid().to_string();
    let found = poll_until(Duration::from_secs(10), Duration::from_millis(10), || {
        std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c.windows(5).any(|w| w == b"pwned"))
    });
    assert!(found, "the process did not start");
    let o = run_bounded(
        {
            let mut c = vigil();
            c.arg("ps");
            c
        },
        T,
    );
    let out = String::from_utf8_lossy(&o.stdout);
    let row = out.lines().find(|l| l.contains(&pid)).unwrap_or_else(|| panic!("pid {pid} not listed: {out}"));
    assert!(!o.stdout.iter().any(|b| *b == 0x1b || *b == 0x07), "raw control bytes in: {out:?}");
    assert!(!out.contains('\u{9b}'), "a raw C1 control in: {out:?}");
    assert!(row.contains("\\x1b]0;pwned\\x07\\x1b[2J\\u{9b}31m"), "{row}");
    let o = run_bounded(
        {
            let mut c = vigil();
            c.args(["ps", "--json"]);
            c
        },
        T,
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let rows = v.as_array().unwrap();
    assert!(rows.iter().any(|r| r["cmd"].as_str().unwrap_or("").contains(evil)), "{v}");
    // a log line with them, echoed by `wait`: escaped too
    let d = TempDir::new("esc-log");
    let log = d.path("server.log");
    std::fs::write(&log, format!("0.00.001.000 I srv    load_model: loading model '{evil}'\n")).unwrap();
    let mut c = vigil();
    c.args(["wait", "--echo", "--server", "llama-cpp", "--timeout", "1s", "--log"]).arg(&log);
    let o = run_bounded(c, T);
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(5), "{out}");
    assert!(out.contains("loading model '\\x1b]0;pwned"), "{out}");
    assert!(!o.stdout.iter().any(|b| *b == 0x1b || *b == 0x07), "raw control bytes in: {out:?}");
}

/// Waits until `pid` has SIGTERM pending (a stopped process keeps it pending: the kernel shows it in
/// /proc/PID/status), the moment a stop's grace has begun.
fn sigterm_pending(pid: i32) -> bool {
    poll_until(Duration::from_secs(20), Duration::from_millis(5), || {
        std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|s| {
            s.lines().filter(|l| l.starts_with("ShdPnd:") || l.starts_with("SigPnd:")).any(|l| {
                u64::from_str_radix(l.split_whitespace().nth(1).unwrap_or("0"), 16)
                    .is_ok_and(|m| m & (1 << (libc::SIGTERM - 1)) != 0)
            })
        })
    })
}

fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !matches!(s.rsplit_once(')').and_then(|(_, r)| r.split_whitespace().next()), Some("Z") | Some("X")))
        .unwrap_or(false)
}

/// `vigil down --pid` of a tree that ignores SIGTERM, with a 30 s grace: Ctrl-C during the grace kills at
/// once (it waited the whole grace).
#[test]
fn down_pid_grace_is_cut_short_by_ctrl_c() {
    let mut p = Command::new("sh");
    p.args(["-c", "trap '' TERM; while :; do sleep 1; done"]).stdout(Stdio::null()).stderr(Stdio::null());
    let g = Guard(p.spawn().unwrap());
    let mut c = vigil();
    c.args(["down", "--json", "--grace", "30s", "--pid", &g.pid().to_string()]);
    let (mut child, mut events) = spawn_json(c);
    loop {
        let j = events.next().expect("down ended early");
        if j["message"].as_str().is_some_and(|m| m.starts_with("sent SIGTERM")) {
            break;
        }
    }
    let t0 = Instant::now();
    signal(child.id() as i32, libc::SIGINT);
    let st = wait_bounded(&mut child, T);
    let dt = t0.elapsed();
    eprintln!("down --pid --grace 30s: Ctrl-C ended the stop {dt:?} after it");
    assert_eq!(st.code(), Some(0), "{st:?}");
    assert!(dt < Duration::from_secs(5), "took {dt:?}");
    assert!(!alive(g.pid()), "the tree is gone");
}

fn state_dir_cmd(state: &Path) -> Command {
    let mut c = vigil();
    c.env("VIGIL_STATE_DIR", state);
    c
}

fn tiny(e: &Env, model: &Path, extra: &[&str]) -> Vec<String> {
    let mut v = vec![e.server.display().to_string(), "-m".into(), model.display().to_string()];
    v.extend(["--host", "127.0.0.1", "--port", &free_port().to_string(), "-c", "256", "-t", "1"].map(String::from));
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

fn run_state(state: &Path, name: &str) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(state.join("runs").join(name).join("state.json")).unwrap()).unwrap()
}

/// `vigil down --grace 30s` of a run whose server does not stop on SIGTERM (held by SIGSTOP): Ctrl-C
/// during the grace kills at once, whatever the keeper is doing; `down` still proves nothing is left.
#[test]
fn e2e_down_grace_is_cut_short_by_ctrl_c() {
    let Some(e) = env() else { return };
    let d = TempDir::new("down-int");
    let mut c = state_dir_cmd(&d.0);
    c.args(["up", "--name", "g", "--detach", "--"]).args(tiny(&e, &e.models.join("tiny.gguf"), &[]));
    assert_eq!(run_bounded(c, T).status.code(), Some(0));
    let st = run_state(&d.0, "g");
    let (server, keeper) = (st["server_pid"].as_i64().unwrap() as i32, st["keeper_pid"].as_i64().unwrap() as i32);
    signal(server, libc::SIGSTOP);
    let mut c = state_dir_cmd(&d.0);
    c.args(["down", "g", "--grace", "30s"]).stdout(Stdio::null()).stderr(Stdio::null());
    let mut child = c.spawn().unwrap();
    assert!(sigterm_pending(server), "the stop's SIGTERM never reached the server");
    let t0 = Instant::now();
    signal(child.id() as i32, libc::SIGINT);
    let status = wait_bounded(&mut child, T);
    let dt = t0.elapsed();
    eprintln!("down --grace 30s: Ctrl-C ended the stop {dt:?} after it");
    assert_eq!(status.code(), Some(0), "{status:?}");
    assert!(dt < Duration::from_secs(5), "took {dt:?}");
    assert!(!alive(server), "the server is gone");
    assert!(poll_until(Duration::from_secs(10), Duration::from_millis(10), || !alive(keeper)), "the keeper is gone");
}

/// The `stopped` event a run stores in its events.jsonl held the server's command line with `--api-key`'s
/// value in clear: it goes through the redactor like every other record.
#[test]
fn e2e_the_stored_stop_is_redacted() {
    let Some(e) = env() else { return };
    let d = TempDir::new("redact-stop");
    let key = "sk-vigil-test-4f1c9a7e";
    let mut c = state_dir_cmd(&d.0);
    c.args(["up", "--name", "k", "--detach", "--"]).args(tiny(&e, &e.models.join("tiny.gguf"), &["--api-key", key]));
    let o = run_bounded(c, T);
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stdout));
    let mut c = state_dir_cmd(&d.0);
    c.args(["down", "k"]);
    assert_eq!(run_bounded(c, T).status.code(), Some(0));
    let events = std::fs::read_to_string(d.0.join("runs/k/events.jsonl")).unwrap();
    assert!(events.contains("\"stopped\""), "{events}");
    assert!(events.contains("--api-key ***"), "{events}");
    // every record of the run, and the history store; only secrets/k.json keeps it (0600, to replay the
    // command on `restart`)
    let mut files: Vec<std::path::PathBuf> =
        std::fs::read_dir(d.0.join("runs/k")).unwrap().flatten().map(|f| f.path()).collect();
    files.push(d.0.join("history.db"));
    for f in files {
        let text = String::from_utf8_lossy(&std::fs::read(&f).unwrap_or_default()).into_owned();
        assert!(!text.contains(key), "{} holds the key", f.display());
    }
}

/// A foreground `vigil up` whose start is stopped by `vigil down` from another shell says so (a `stopped`
/// event, exit 0, as under --watch), not "CRASHED, killed by a signal from outside".
#[test]
fn e2e_a_start_stopped_by_down_elsewhere_is_no_crash() {
    let Some(e) = env() else { return };
    let d = TempDir::new("down-start");
    let model = fifo_model(&d);
    let mut c = state_dir_cmd(&d.0);
    c.args(["up", "--name", "f", "--json", "--grace", "2s", "--"]).args(tiny(&e, &model, &[]));
    let (mut child, mut events) = spawn_json(c);
    // held loading its weights (the model is a FIFO nobody writes)
    while events.next().expect("up ended early")["phase"] != "weights" {}
    let mut c = state_dir_cmd(&d.0);
    c.args(["down", "f"]);
    assert_eq!(run_bounded(c, T).status.code(), Some(0));
    let rest: Vec<serde_json::Value> = events.collect();
    assert_eq!(wait_bounded(&mut child, T).code(), Some(0), "{rest:?}");
    let stopped = rest.iter().find(|j| j["event"] == "stopped").unwrap_or_else(|| panic!("no stopped event: {rest:?}"));
    assert_eq!(stopped["requested"], true, "{stopped}");
    assert!(stopped["how"].as_str().unwrap().contains("before ready"), "{stopped}");
    assert!(!rest.iter().any(|j| j["event"] == "verdict"), "no verdict for a start called off: {rest:?}");
}

/// After ready in the foreground, Ctrl-C stops the server and exits 130 (the README's table: SIGINT after
/// ready too); SIGTERM, a service manager's stop, exits 0.
#[test]
fn e2e_interrupt_after_ready_in_the_foreground() {
    let Some(e) = env() else { return };
    for (sig, code) in [(libc::SIGINT, 130), (libc::SIGTERM, 0)] {
        let d = TempDir::new("fg-int");
        let mut c = state_dir_cmd(&d.0);
        c.args(["up", "--name", "i", "--json", "--"]).args(tiny(&e, &e.models.join("tiny.gguf"), &[]));
        let (mut child, mut events) = spawn_json(c);
        while events.next().expect("up ended early")["verdict"] != "ready" {}
        let server = run_state(&d.0, "i")["server_pid"].as_i64().unwrap() as i32;
        signal(child.id() as i32, sig);
        assert_eq!(wait_bounded(&mut child, T).code(), Some(code), "signal {sig}");
        assert!(poll_until(Duration::from_secs(10), Duration::from_millis(10), || !alive(server)), "signal {sig}");
    }
}
