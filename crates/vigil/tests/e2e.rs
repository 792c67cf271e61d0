//! End-to-end tests against the real llama.cpp llama-server (built by scripts/setup.sh).
//! Every test name starts with `e2e_`; .ci/run counts them.

mod common;
use common::*;
use std::io::Write;
use std::process::Stdio;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(60);

#[test]
fn e2e_ready_with_phase_timeline() {
    let Some(e) = env() else { return };
    let d = TempDir::new("ready");
    let port = free_port();
    let log = d.path("server.log");
    let _s = start_server(&e, &e.models.join("tiny.gguf"), port, &log, &[]);
    let mut c = vigil();
    c.args(["wait", "--json", "--log"]).arg(&log).args(["--url", &format!("http://127.0.0.1:{port}/health")]);
    let o = run_bounded(c, T);
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stdout));
    let v = json_lines(&o);
    let r = verdict(&v);
    assert_eq!(r["verdict"], "ready");
    assert_eq!(r["phase"], "serving");
    assert_eq!(r["server"], "llama-cpp");
    assert!(r["timeline"].as_array().unwrap().len() >= 2, "timeline: {}", r["timeline"]);
    assert!(v.iter().any(|x| x["event"] == "probe" && x["outcome"] == "ok"));
}

fn crash_case(tag: &str, model: std::path::PathBuf, cause: &str, evidence: &str) {
    let Some(e) = env() else { return };
    let d = TempDir::new(tag);
    let port = free_port();
    let log = d.path("server.log");
    let s = start_server(&e, &model, port, &log, &[]);
    let mut c = vigil();
    c.args(["wait", "--json", "--log"]).arg(&log).args(["--pid", &s.pid().to_string()]);
    c.args(["--url", &format!("http://127.0.0.1:{port}/health")]);
    let o = run_bounded(c, T);
    let v = json_lines(&o);
    let r = verdict(&v);
    assert_eq!(o.status.code(), Some(3), "{r}");
    assert_eq!(r["verdict"], "crashed");
    assert_eq!(r["cause"], cause, "{r}");
    assert_eq!(r["phase"], if cause == "port_in_use" { "http" } else { "weights" }, "{r}");
    let ev = r["evidence"].as_array().unwrap();
    assert!(ev.iter().any(|l| l.as_str().unwrap().contains(evidence)), "evidence lacks {evidence:?}: {r}");
    assert!(r["hint"].as_str().is_some_and(|h| !h.is_empty()));
}

#[test]
fn e2e_truncated_gguf_is_crashed_model_file() {
    let Some(e) = env() else { return };
    crash_case("trunc", e.models.join("truncated.gguf"), "model_file", "data is not within the file bounds");
}

#[test]
fn e2e_missing_model_is_crashed_model_file() {
    crash_case("missing", "/nonexistent/vigil/model.gguf".into(), "model_file", "failed to open GGUF file");
}

#[test]
fn e2e_port_in_use() {
    let Some(e) = env() else { return };
    let holder = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = holder.local_addr().unwrap().port();
    let d = TempDir::new("port");
    let log = d.path("server.log");
    let s = start_server(&e, &e.models.join("tiny.gguf"), port, &log, &[]);
    let mut c = vigil();
    c.args(["wait", "--json", "--log"]).arg(&log).args(["--pid", &s.pid().to_string()]);
    let o = run_bounded(c, T);
    let v = json_lines(&o);
    let r = verdict(&v);
    assert_eq!(o.status.code(), Some(3), "{r}");
    assert_eq!(
        (r["verdict"].as_str(), r["phase"].as_str(), r["cause"].as_str()),
        (Some("crashed"), Some("http"), Some("port_in_use"))
    );
    assert!(r["evidence"].to_string().contains("couldn't bind HTTP server socket"));
    drop(holder);
}

/// The server is held in weight loading (model path is a FIFO: slow storage) and SIGSTOPped when
/// its `loading model` line appears. vigil must say stalled, in weights, no earlier than last progress + --stall.
#[test]
fn e2e_stalled_when_sigstopped_while_loading() {
    let Some(e) = env() else { return };
    let d = TempDir::new("stall");
    let port = free_port();
    let log = d.path("server.log");
    let fifo = fifo_model(&d);
    let s = start_server(&e, &fifo, port, &log, &[]);
    let mut c = vigil();
    c.args(["wait", "--json", "--stall", "2s", "--log"]).arg(&log).args(["--pid", &s.pid().to_string()]);
    let (mut child, events) = spawn_json(c);
    let mut lines = Vec::new();
    let mut stopped_at_ms = None;
    let t0 = Instant::now();
    for v in events {
        // the event: vigil reports the weights phase (it read the `loading model` line)
        if stopped_at_ms.is_none() && v["event"] == "phase" && v["phase"] == "weights" {
            signal(s.pid(), libc::SIGSTOP);
            stopped_at_ms = Some(v["t_ms"].as_u64().unwrap());
        }
        lines.push(v);
        assert!(t0.elapsed() < T, "no verdict");
    }
    let status = child.wait().unwrap();
    signal(s.pid(), libc::SIGCONT);
    let r = verdict(&lines);
    assert_eq!(status.code(), Some(4), "{r}");
    assert_eq!(r["verdict"], "stalled");
    assert_eq!(r["phase"], "weights");
    let last_progress = stopped_at_ms.expect("weights phase was reported");
    let at = r["t_ms"].as_u64().unwrap();
    // the phase event is stamped when printed, up to 1 ms after the judge saw the line
    assert!(at + 1 >= last_progress + 2000, "verdict at {at} ms, before last progress {last_progress} + 2000");
    assert!(r["detail"].as_str().unwrap().contains("no progress for"));
}

/// A server SIGKILLed while loading under `wait --pid` (not vigil's child): crashed, status unknown.
#[test]
fn e2e_sigkill_under_wait_pid() {
    let Some(e) = env() else { return };
    let d = TempDir::new("kill");
    let port = free_port();
    let log = d.path("server.log");
    let fifo = fifo_model(&d);
    let s = start_server(&e, &fifo, port, &log, &[]);
    assert!(wait_for_text(&log, "loading model", T), "server never reached loading");
    let mut c = vigil();
    c.args(["wait", "--json", "--log"]).arg(&log).args(["--pid", &s.pid().to_string()]);
    let (mut child, events) = spawn_json(c);
    let mut lines = Vec::new();
    let mut killed = false;
    for v in events {
        if !killed && v["event"] == "phase" && v["phase"] == "weights" {
            signal(s.pid(), libc::SIGKILL);
            killed = true;
        }
        lines.push(v);
    }
    let status = child.wait().unwrap();
    let v = verdict(&lines);
    assert_eq!(status.code(), Some(3), "{v}");
    assert_eq!(v["verdict"], "crashed");
    assert_eq!(v["phase"], "weights");
    assert!(v["cause"] == "unknown" || v["cause"] == "killed", "{v}");
    assert!(v["detail"].as_str().unwrap().contains("not our child"), "{v}");
}

/// The prober is lazy: while the log says the server is still loading, /health is asked rarely.
/// A small counting proxy (named as such) sits between vigil and the real server.
#[test]
fn e2e_lazy_probing_counted_by_proxy() {
    let Some(e) = env() else { return };
    let d = TempDir::new("lazy");
    let port = free_port();
    let log = d.path("server.log");
    let fifo = fifo_model(&d);
    let _s = start_server(&e, &fifo, port, &log, &[]);
    assert!(wait_for_text(&log, "loading model", T));
    let (proxy_port, count) = counting_proxy(port);
    let url = format!("http://127.0.0.1:{proxy_port}/health");
    // with the log: vigil knows the server is loading and probes rarely
    let mut c = vigil();
    c.args(["wait", "--json", "--timeout", "4s", "--log"]).arg(&log).args(["--url", &url]);
    let o = run_bounded(c, T);
    assert_eq!(o.status.code(), Some(5), "timeout expected: {}", String::from_utf8_lossy(&o.stdout));
    let with_log = count.swap(0, std::sync::atomic::Ordering::SeqCst);
    // without the log: one probe per --interval
    let mut c = vigil();
    c.args(["wait", "--json", "--timeout", "4s", "--interval", "500ms", "--url", &url]);
    let o = run_bounded(c, T);
    assert_eq!(o.status.code(), Some(5));
    let without = count.load(std::sync::atomic::Ordering::SeqCst);
    eprintln!("/health requests during a 4 s load: {with_log} with --log, {without} without");
    assert!((1..=2).contains(&with_log), "with --log: {with_log} requests in 4 s");
    assert!((4..=10).contains(&without), "without --log at 500ms: {without} requests in 4 s");
}

/// A counting proxy (test helper): forwards TCP to `to`, counts requests whose first line asks for /health.
fn counting_proxy(to: u16) -> (u16, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::io::Read;
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let count = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let c2 = count.clone();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut a) = s else { continue };
            let c = c2.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                let n = a.read(&mut buf).unwrap_or(0);
                if buf[..n].starts_with(b"GET /health") {
                    c.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
                let Ok(mut b) = std::net::TcpStream::connect(("127.0.0.1", to)) else {
                    return;
                };
                let _ = b.write_all(&buf[..n]);
                let mut b2 = b.try_clone().unwrap();
                let mut a2 = a.try_clone().unwrap();
                let t = std::thread::spawn(move || {
                    let _ = std::io::copy(&mut a2, &mut b2);
                });
                let _ = std::io::copy(&mut b, &mut a);
                drop(t);
            });
        }
    });
    (port, count)
}

#[test]
fn e2e_api_key_never_printed() {
    let Some(e) = env() else { return };
    let d = TempDir::new("key");
    let port = free_port();
    let log = d.path("server.log");
    let key = "sk-vigil-test-9f8e7d6c5b4a";
    // a line in the log that carries the key, as servers that print their own args do
    std::fs::write(&log, format!("server_args: --api-key {key}\n")).unwrap();
    let _s = start_server(&e, &e.models.join("tiny.gguf"), port, &log, &["--api-key", key]);
    for json in [true, false] {
        let mut c = vigil();
        c.env("VIGIL_TEST_KEY", key);
        c.args(["wait", "--echo", "--api-key-env", "VIGIL_TEST_KEY", "--log"]).arg(&log);
        c.args(["--url", &format!("http://127.0.0.1:{port}/health")]);
        if json {
            c.arg("--json");
        }
        let o = run_bounded(c, T);
        assert_eq!(o.status.code(), Some(0));
        let all = [o.stdout, o.stderr].concat();
        let text = String::from_utf8_lossy(&all);
        assert!(text.contains("server_args: --api-key ***"), "the line is shown, redacted: {text}");
        assert!(!text.contains(key), "the key leaked: {text}");
    }
}

/// A numbered-line writer opening the log with O_APPEND (as a server started with `>>`);
/// the log is truncated in place in the middle. Every line must be seen once.
#[test]
fn e2e_log_truncated_in_place_no_line_lost_or_repeated() {
    log_rotation_case(false);
}

/// A numbered-line writer that reopens the log by path after it is renamed (as a server whose log
/// is rotated by rename-and-recreate). Every line must be seen once.
#[test]
fn e2e_log_renamed_and_recreated_no_line_lost_or_repeated() {
    log_rotation_case(true);
}

fn log_rotation_case(rename: bool) {
    let d = TempDir::new(if rename { "rename" } else { "truncate" });
    let log = d.path("server.log");
    let open = || std::fs::OpenOptions::new().create(true).append(true).open(&log).unwrap();
    let mut w = open();
    let mut c = vigil();
    c.args(["wait", "--json", "--echo", "--server", "llama-cpp", "--log"]).arg(&log);
    let (mut child, mut events) = spawn_json(c);
    let mut seen: Vec<u32> = Vec::new();
    let mut next_line = || events.next().expect("vigil ended early");
    for i in 1..=500 {
        writeln!(w, "numbered line {i}").unwrap();
    }
    // wait (an event) until vigil has echoed line 500, then rotate
    loop {
        let v = next_line();
        if v["event"] == "line" {
            let n: u32 = v["text"].as_str().unwrap().trim_start_matches("numbered line ").parse().unwrap();
            seen.push(n);
            if n == 500 {
                break;
            }
        }
    }
    if rename {
        std::fs::rename(&log, d.path("server.log.1")).unwrap();
        writeln!(w, "numbered line 501").unwrap(); // still into the old file
        w = open(); // the writer reopens by path
    } else {
        w.set_len(0).unwrap();
    }
    // wait until vigil notices, then write the rest
    loop {
        let v = next_line();
        if v["event"] == "line" {
            seen.push(v["text"].as_str().unwrap().trim_start_matches("numbered line ").parse().unwrap());
        }
        if v["event"] == "note"
            && v["message"].as_str().unwrap().contains(if rename { "replaced" } else { "truncated" })
        {
            break;
        }
    }
    let start = if rename { 502 } else { 501 };
    for i in start..=1000 {
        writeln!(w, "numbered line {i}").unwrap();
    }
    writeln!(w, "0.00.095.288 I srv  llama_server: model loaded").unwrap();
    loop {
        let v = next_line();
        if v["event"] == "line" {
            if let Ok(n) = v["text"].as_str().unwrap().trim_start_matches("numbered line ").parse::<u32>() {
                seen.push(n);
            }
        }
        if v["event"] == "verdict" {
            assert_eq!(v["verdict"], "ready");
            break;
        }
    }
    let _ = child.wait();
    let want: Vec<u32> = (1..=1000).collect();
    assert_eq!(seen, want, "lines lost or repeated");
}

/// A profile file dropped into $XDG_CONFIG_HOME/vigil/profiles/ changes the verdict on a real log.
#[test]
fn e2e_user_profile_changes_verdict_on_real_log() {
    let Some(e) = env() else { return };
    let d = TempDir::new("profile");
    let port = free_port();
    let log = d.path("server.log");
    let mut s = start_server(&e, &e.models.join("tiny.gguf"), port, &log, &[]);
    assert!(wait_for_text(&log, "listening on", T));
    signal(s.pid(), libc::SIGINT);
    let _ = s.0.wait();
    let diag = |xdg: Option<&std::path::Path>| {
        let mut c = vigil();
        if let Some(x) = xdg {
            c.env("XDG_CONFIG_HOME", x);
        }
        c.args(["diagnose", "--json"]).arg(&log);
        let o = run_bounded(c, T);
        verdict(&json_lines(&o)).clone()
    };
    let base = diag(None);
    assert_eq!(base["verdict"], "ready");
    let cfg = d.path("config");
    std::fs::create_dir_all(cfg.join("vigil/profiles")).unwrap();
    // an added fatal marker
    std::fs::write(
        cfg.join("vigil/profiles/site.toml"),
        "name = \"llama-cpp\"\n[[rule]]\nname = \"site-policy\"\nmatch = 'security: no API key is set'\nkind = \"error\"\nterminal = true\ncause = \"config\"\nhint = \"site policy: servers must run with --api-key\"\n",
    )
    .unwrap();
    let r = diag(Some(&cfg));
    assert_eq!((r["verdict"].as_str(), r["cause"].as_str()), (Some("crashed"), Some("config")), "{r}");
    assert!(r["hint"].as_str().unwrap().contains("site policy"));
    // a changed ready marker: only a line that never appears proves readiness here
    std::fs::write(
        cfg.join("vigil/profiles/site.toml"),
        "name = \"llama-cpp\"\n[[rule]]\nname = \"not-yet\"\nmatch = 'llama_server: model loaded|all slots are idle'\nkind = \"noise\"\n",
    )
    .unwrap();
    let r = diag(Some(&cfg));
    assert_eq!(r["verdict"], "starting", "{r}");
    // a broken profile is one clear line and exit 2
    std::fs::write(cfg.join("vigil/profiles/site.toml"), "name = \"x\"\n[server]\nbogus = 1\n").unwrap();
    let mut c = vigil();
    c.env("XDG_CONFIG_HOME", &cfg).args(["diagnose"]).arg(&log);
    let o = run_bounded(c, T);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("bogus"), "{err}");
}

/// `wait --pid` alone: the server kind and port come from the process's command line.
#[test]
fn e2e_wait_pid_alone_reads_kind_and_port_from_cmdline() {
    let Some(e) = env() else { return };
    let d = TempDir::new("cmdline");
    let port = free_port();
    let log = d.path("server.log");
    let s = start_server(&e, &e.models.join("tiny.gguf"), port, &log, &[]);
    let mut c = vigil();
    c.args(["wait", "--json", "--interval", "100ms", "--pid", &s.pid().to_string()]);
    let o = run_bounded(c, T);
    let v = json_lines(&o);
    let start = v.iter().find(|x| x["event"] == "start").expect("start event");
    assert_eq!(start["url"], format!("http://127.0.0.1:{port}/health"), "{start}");
    assert_eq!(start["server"], "llama-cpp");
    assert_eq!(verdict(&v)["verdict"], "ready");
    assert_eq!(o.status.code(), Some(0));
}

/// The log through a command (`--log-cmd`, as with `kubectl logs -f`) and through stdin (`--log -`).
#[test]
fn e2e_log_cmd_and_stdin() {
    let Some(e) = env() else { return };
    let d = TempDir::new("logcmd");
    let port = free_port();
    let log = d.path("server.log");
    let _s = start_server(&e, &e.models.join("tiny.gguf"), port, &log, &[]);
    let mut c = vigil();
    c.args(["wait", "--json", "--log-cmd", &format!("tail -n +1 -F {}", log.display())]);
    // no --url: the command's output alone must prove readiness
    let o = run_bounded(c, T);
    let v = json_lines(&o);
    assert_eq!(verdict(&v)["verdict"], "ready");
    assert!(
        v.iter().any(|x| x["event"] == "detected" && x["server"] == "llama-cpp"),
        "kind detected from the command's output"
    );
    // stdin: the whole log piped in; the log alone decides
    assert!(wait_for_text(&log, "listening on", T));
    let mut c = vigil();
    c.args(["wait", "--json", "--log", "-"]).stdin(std::fs::File::open(&log).unwrap());
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    let o = c.output().unwrap();
    let v = json_lines(&o);
    assert_eq!(verdict(&v)["verdict"], "ready", "{v:?}");
}
