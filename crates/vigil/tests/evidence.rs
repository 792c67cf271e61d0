//! Issue #17 end to end: the process tree as a fact, evidence at a stall, the stall policy.
//!
//! The multi-process server here is a stand-in (tests/standin/engine_server.py): no real server loses
//! its engine process, or hangs in a known Python function, on demand. Its engine child is named by its
//! process title in a test profile (`standin::engine`), as SGLang and vLLM name theirs.

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

const T: Duration = Duration::from_secs(60);

fn standin_script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/standin/engine_server.py")
}

fn python() -> Option<PathBuf> {
    tool("/usr/bin/python3", "python3")
}

/// A user profile for the stand-in: its engine is named by title.
fn profile_dir(d: &TempDir) -> PathBuf {
    let dir = d.path("profiles");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("standin.toml"),
        "name = 'standin'\n[server]\ndescription = 'test stand-in'\ndetect_cmd = ['engine_server\\.py']\n\
         health_path = '/health'\nport_opens = 'launch'\nengine_titles = ['^standin::engine']\n",
    )
    .unwrap();
    dir
}

fn start_standin(py: &Path, d: &TempDir, port: u16, ready: bool, log: &Path) -> Guard {
    let f = std::fs::File::create(log).unwrap();
    let mut c = Command::new(py);
    c.arg(standin_script()).args(["--port", &port.to_string(), "--dir", d.0.to_str().unwrap()]);
    if ready {
        c.arg("--ready");
    }
    let child = c.stdin(Stdio::null()).stdout(f.try_clone().unwrap()).stderr(f).spawn().expect("start stand-in");
    Guard(child)
}

fn read_pid(p: &Path) -> i32 {
    wait_file(p);
    for _ in 0..1000 {
        if let Some(n) = std::fs::read_to_string(p).ok().and_then(|s| s.trim().parse().ok()) {
            return n;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("no pid in {}", p.display());
}

fn wait_file(p: &Path) {
    let t0 = std::time::Instant::now();
    while !p.exists() {
        assert!(t0.elapsed() < T, "{} never appeared", p.display());
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn engine_death_case(ready: bool) -> serde_json::Value {
    let Some(py) = python() else { return serde_json::Value::Null };
    let d = TempDir::new("engine");
    let port = free_port();
    let log = d.path("server.log");
    let server = start_standin(&py, &d, port, ready, &log);
    let engine = read_pid(&d.path("engine.pid"));
    let mut c = vigil();
    c.arg("--profiles").arg(profile_dir(&d));
    c.args(["wait", "--json", "--no-generate", "--server", "standin", "--pid", &server.pid().to_string()]);
    c.args(["--url", &format!("http://127.0.0.1:{port}/health"), "--timeout", "60s"]);
    if ready {
        c.arg("--watch");
    }
    let (mut child, mut lines) = spawn_json(c);
    // the engine is recognised by its title before anything happens to it (and, when ready, the ready
    // verdict: in either order)
    let (mut seen, mut was_ready) = (None, !ready);
    while seen.is_none() || !was_ready {
        let v = lines.next().expect("vigil ended early");
        match v["event"].as_str() {
            Some("engine") => seen = Some(v),
            Some("verdict") => {
                assert_eq!(v["verdict"], "ready", "{v}");
                was_ready = true;
            }
            _ => {}
        }
    }
    let seen = seen.unwrap();
    assert_eq!(seen["pid"], engine);
    assert_eq!(seen["title"].as_str().unwrap().split(' ').next(), Some("standin::engine"));
    assert_eq!(seen["by"], "title");
    // a short-lived helper child (no title, no GPU) comes and goes: nothing happens
    wait_file(&d.path("helper.done"));
    signal(engine, libc::SIGKILL);
    let rest: Vec<serde_json::Value> = lines.collect();
    wait_bounded(&mut child, T);
    let deaths: Vec<_> = rest.iter().filter(|v| v["event"] == "engine_died").collect();
    assert_eq!(deaths.len(), 1, "only the engine's death is a fact: {rest:?}");
    assert_eq!(deaths[0]["pid"], engine);
    // the parent still answers /health: the tree, not the probe, decided
    assert_eq!(http_get(port, "/health", &[]).map(|r| r.0).unwrap_or(0), if ready { 200 } else { 503 });
    drop(server);
    verdict(&rest).clone()
}

#[test]
fn e2e_engine_child_dying_before_ready_is_crashed_engine_dead_naming_it() {
    let v = engine_death_case(false);
    if v.is_null() {
        return;
    }
    assert_eq!(v["verdict"], "crashed", "{v}");
    assert_eq!(v["cause"], "engine_dead", "{v}");
    assert!(v["detail"].as_str().unwrap().contains("standin::engine"), "{v}");
}

#[test]
fn e2e_engine_child_dying_after_ready_is_unhealthy_engine_dead_naming_it() {
    let v = engine_death_case(true);
    if v.is_null() {
        return;
    }
    assert_eq!(v["verdict"], "unhealthy", "{v}");
    assert_eq!(v["cause"], "engine_dead", "{v}");
    assert_eq!(v["phase"], "serving", "{v}");
    assert!(v["detail"].as_str().unwrap().contains("standin::engine"), "{v}");
}
