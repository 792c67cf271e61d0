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

/// The stand-in, written into the test's folder (the unprivileged run may not read the source tree).
fn standin_script(d: &TempDir) -> PathBuf {
    let p = d.path("engine_server.py");
    std::fs::write(&p, include_str!("standin/engine_server.py")).unwrap();
    p
}

/// py-spy from PyPI (scripts/test.sh installs it into a cached venv and exports VIGIL_PY_SPY).
fn py_spy() -> Option<PathBuf> {
    let home = std::env::var("HOME").unwrap_or_default();
    let p = std::env::var("VIGIL_PY_SPY")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(home).join(".cache/vigil/venv-py-spy-0.4.3/bin/py-spy"));
    if p.is_file() {
        return Some(p);
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("py-spy missing ({}): scripts/test.sh installs it", p.display());
    }
    eprintln!("SKIP: py-spy missing ({})", p.display());
    None
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
    start_standin_env(py, d, port, ready, log, &[])
}

fn start_standin_env(py: &Path, d: &TempDir, port: u16, ready: bool, log: &Path, env: &[(&str, String)]) -> Guard {
    let f = std::fs::File::create(log).unwrap();
    let mut c = Command::new(py);
    c.envs(env.iter().map(|(k, v)| (*k, v.as_str())));
    c.arg(standin_script(d)).args(["--port", &port.to_string(), "--dir", d.0.to_str().unwrap()]);
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

/// Issue #25 step 8: the policy acting on a crash (the engine died before ready; its HTTP parent lingers) names
/// the crash it acted on in the `on_stall` event (`verdict`, `cause`), never a stall; the verdict's detail stays the
/// root cause (issue #33).
#[test]
fn e2e_on_stall_stop_after_a_crash_names_the_crash() {
    let Some(py) = python() else { return };
    let d = TempDir::new("crashstop");
    let port = free_port();
    let server = start_standin(&py, &d, port, false, &d.path("server.log"));
    let engine = read_pid(&d.path("engine.pid"));
    let mut c = vigil();
    c.arg("--profiles").arg(profile_dir(&d));
    c.args(["wait", "--json", "--no-generate", "--server", "standin", "--on-stall", "stop"]);
    c.args(["--pid", &server.pid().to_string(), "--url", &format!("http://127.0.0.1:{port}/health")]);
    let (mut child, mut lines) = spawn_json(c);
    lines.by_ref().find(|v| v["event"] == "engine").expect("the engine is recognised");
    signal(engine, libc::SIGKILL);
    let rest: Vec<serde_json::Value> = lines.collect();
    wait_bounded(&mut child, T);
    let r = verdict(&rest);
    assert_eq!((r["verdict"].as_str(), r["cause"].as_str()), (Some("crashed"), Some("engine_dead")), "{r}");
    let act = rest.iter().find(|v| v["event"] == "on_stall").unwrap_or_else(|| panic!("no on_stall: {rest:?}"));
    assert_eq!((act["verdict"].as_str(), act["cause"].as_str()), (Some("crashed"), Some("engine_dead")), "{act}");
    assert_eq!(act["action"], "stop", "{act}");
    assert!(act.get("survivors").is_none(), "{act}");
    // issue #33: the detail is the root cause; the clean-up is the on_stall event's, and a crash is no stall
    let detail = r["detail"].as_str().unwrap();
    assert!(detail.contains("died") && !detail.contains("--on-stall"), "{detail}");
    assert!(!detail.contains("stalled") && !detail.contains("stuck"), "{detail}");
    assert!(!pid_alive(server.pid()), "the lingering parent is left");
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

/// A stand-in whose two processes wait forever in named Python functions: the stalled verdict's evidence
/// names each function for each process, and the raw stacks are saved.
#[test]
fn e2e_stalled_standin_evidence_names_the_function_of_every_process() {
    let (Some(py), Some(spy)) = (python(), py_spy()) else { return };
    let d = TempDir::new("evid");
    let port = free_port();
    let log = d.path("server.log");
    // PyTorch's NCCL flight recorder, enabled in the server's environment; a rank's dump is there (as
    // ProcessGroupNCCL writes it when its watchdog fires)
    let prefix = d.path("nccl_trace_rank_").display().to_string();
    std::fs::write(format!("{prefix}0"), b"flight recorder entries of rank 0").unwrap();
    let env = [("TORCH_NCCL_TRACE_BUFFER_SIZE", "2000".to_string()), ("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", prefix)];
    let server = start_standin_env(&py, &d, port, false, &log, &env);
    let engine = read_pid(&d.path("engine.pid"));
    let (status, all) = wait_for_stall(&d, &spy, server.pid(), &log);
    let r = verdict(&all);
    assert_eq!(status.code(), Some(4), "{r}");
    assert_eq!(r["verdict"], "stalled", "{r}");
    let ev = all.iter().find(|v| v["event"] == "evidence").expect("evidence event");
    let procs = ev["procs"].as_array().unwrap();
    let at = |pid: i32| {
        procs.iter().find(|p| p["pid"] == pid).unwrap_or_else(|| panic!("pid {pid} not captured: {ev}"))["at"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert!(at(server.pid()).contains("`waiting_for_engine`"), "{ev}");
    assert!(at(engine).contains("`wedged_in_dist_init`"), "{ev}");
    // the verdict says it too, one line per process
    let evidence: Vec<&str> = r["evidence"].as_array().unwrap().iter().filter_map(|l| l.as_str()).collect();
    assert!(evidence.iter().any(|l| l.contains(&format!("pid {engine}")) && l.contains("wedged_in_dist_init")), "{r}");
    // the raw stacks lie in the evidence folder, bounded
    let dir = PathBuf::from(ev["dir"].as_str().unwrap());
    let raw = std::fs::read_to_string(dir.join(format!("pid-{engine}.py-spy.txt"))).unwrap();
    assert!(raw.contains("wedged_in_dist_init"));
    assert!(dir.join("evidence.json").is_file());
    assert_eq!(ev["nccl_dumps"], serde_json::json!(["nccl-nccl_trace_rank_0"]), "{ev}");
    assert_eq!(std::fs::read(dir.join("nccl-nccl_trace_rank_0")).unwrap(), b"flight recorder entries of rank 0");
}

/// `vigil wait` on the stand-in server with a 2 s stall limit and py-spy: its exit status and every JSON line.
fn wait_for_stall(
    d: &TempDir,
    spy: &Path,
    server: i32,
    log: &Path,
) -> (std::process::ExitStatus, Vec<serde_json::Value>) {
    let mut c = vigil();
    c.env("VIGIL_PY_SPY", spy).env("VIGIL_STATE_DIR", d.path("state"));
    c.arg("--profiles").arg(profile_dir(d));
    c.args(["wait", "--json", "--server", "standin", "--stall", "2s", "--pid", &server.to_string()]);
    c.arg("--log").arg(log);
    let (mut child, lines) = spawn_json(c);
    let all: Vec<serde_json::Value> = lines.collect();
    (wait_bounded(&mut child, T), all)
}

/// The seed's zombie: the engine SIGSTOPped (state T, as a process stopped by a debugger or a job-control
/// signal). py-spy cannot pause a stopped process to read it (`dump` fails, seen on the H200 with a stopped
/// VLLM::EngineCore); vigil reads it without pausing (`--nonblocking`), so its function is still named.
#[test]
fn e2e_stopped_engine_evidence_still_names_its_function() {
    let (Some(py), Some(spy)) = (python(), py_spy()) else { return };
    let d = TempDir::new("evidstop");
    let port = free_port();
    let log = d.path("server.log");
    let server = start_standin_env(&py, &d, port, false, &log, &[]);
    let engine = read_pid(&d.path("engine.pid"));
    // stopped inside its wedged function, not while it still imports
    assert!(wait_for_text(&log, "engine: init_process_group", T), "the stand-in engine never reached its function");
    signal(engine, libc::SIGSTOP);
    let (status, all) = wait_for_stall(&d, &spy, server.pid(), &log);
    signal(engine, libc::SIGCONT);
    assert_eq!(status.code(), Some(4), "{}", verdict(&all));
    let ev = all.iter().find(|v| v["event"] == "evidence").expect("evidence event");
    let p = ev["procs"].as_array().unwrap().iter().find(|p| p["pid"] == engine).unwrap_or_else(|| panic!("{ev}"));
    assert_eq!(p["state"], "T", "{p}");
    assert!(p["at"].as_str().unwrap().contains("`wedged_in_dist_init`"), "{p}");
}

/// The real llama-server stalled opening its model (a FIFO, as on slow storage): its evidence has the
/// kernel wait channel and, with eu-stack (Debian's elfutils, installed by scripts/test.sh), native frames.
#[test]
fn e2e_stalled_llama_server_evidence_has_wait_channel_and_native_frames() {
    let Some(e) = env() else { return };
    let Some(_eu) = tool("/usr/bin/eu-stack", "elfutils") else { return };
    let d = TempDir::new("evid-llama");
    let port = free_port();
    let log = d.path("server.log");
    let fifo = fifo_model(&d);
    let s = start_server(&e, &fifo, port, &log, &[]);
    let mut c = vigil();
    c.env("VIGIL_STATE_DIR", d.path("state"));
    c.args(["wait", "--json", "--stall", "2s", "--log"]).arg(&log).args(["--pid", &s.pid().to_string()]);
    let (mut child, lines) = spawn_json(c);
    let all: Vec<serde_json::Value> = lines.collect();
    wait_bounded(&mut child, T);
    let r = verdict(&all);
    assert_eq!(r["verdict"], "stalled", "{r}");
    let ev = all.iter().find(|v| v["event"] == "evidence").expect("evidence event");
    let p = ev["procs"].as_array().unwrap().iter().find(|p| p["pid"] == s.pid()).expect("server captured");
    let wchan = p["wchan"].as_str().unwrap_or("");
    assert!(!wchan.is_empty() && wchan != "0", "no wait channel: {p}");
    let files: Vec<&str> = p["files"].as_array().unwrap().iter().filter_map(|f| f.as_str()).collect();
    assert!(files.iter().any(|f| f.ends_with(".eu-stack.txt")), "{p}");
    let raw = std::fs::read_to_string(
        PathBuf::from(ev["dir"].as_str().unwrap()).join(format!("pid-{}.eu-stack.txt", s.pid())),
    )
    .unwrap();
    assert!(raw.contains("TID ") && raw.contains("#0 "), "{raw}");
    assert!(p["at"].as_str().unwrap().contains("native `"), "{p}");
}

/// `vigil dump NAME` on a run of `vigil up` (the real llama-server, ready): one evidence event naming the
/// server's process with its wait channel, files saved in the run's folder, and the run left running.
#[test]
fn e2e_dump_of_a_running_server_names_its_process_and_leaves_it_running() {
    let Some(e) = env() else { return };
    let d = TempDir::new("dump");
    let port = free_port();
    let up = |args: &[&str]| {
        let mut c = vigil();
        c.env("VIGIL_STATE_DIR", d.path("state"));
        c.args(args);
        c
    };
    let mut c = up(&["up", "--name", "dm", "--detach", "--no-generate", "--"]);
    c.arg(&e.server).arg("-m").arg(e.models.join("tiny.gguf"));
    c.args(["--host", "127.0.0.1", "--port", &port.to_string(), "-c", "256", "-t", "1"]);
    let o = run_bounded(c, T);
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stdout));
    let st: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.path("state/runs/dm/state.json")).unwrap()).unwrap();
    let server = st["server_pid"].as_i64().unwrap() as i32;
    let o = run_bounded(up(&["dump", "dm", "--json"]), T);
    let lines = json_lines(&o);
    let alive = pid_alive(server);
    let _ = run_bounded(up(&["down", "dm"]), T);
    assert!(alive, "a dump does not stop the server");
    assert_eq!(o.status.code(), Some(0), "{lines:?}");
    let ev = lines.iter().find(|v| v["event"] == "evidence").unwrap_or_else(|| panic!("{lines:?}"));
    let p = ev["procs"].as_array().unwrap().iter().find(|p| p["pid"] == server).unwrap_or_else(|| panic!("{ev}"));
    assert!(!p["wchan"].as_str().unwrap_or("").is_empty(), "{p}");
    assert!(ev["dir"].as_str().unwrap().contains("/runs/dm/"), "saved with the run: {ev}");
    let o = run_bounded(up(&["dump", "nosuchrun"]), T);
    assert_eq!(o.status.code(), Some(2), "an unknown run is a usage error");
}

fn pid_alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !matches!(s.rsplit_once(')').and_then(|(_, r)| r.split_whitespace().next()), Some("Z") | Some("X")))
        .unwrap_or(false)
}

/// `vigil up` of the real llama-server stalled on its model (a FIFO): with `--on-stall stop` the evidence is
/// saved, then the tree is stopped: no process left, the port free (proven by binding it here too).
fn up_stalled(on_stall: &str) -> Option<(TempDir, u16, Vec<serde_json::Value>, i32, i32)> {
    let e = env()?;
    let d = TempDir::new("onstall");
    let port = free_port();
    let fifo = fifo_model(&d);
    let mut c = vigil();
    c.env("VIGIL_STATE_DIR", d.path("state"));
    c.args(["up", "--name", "s1", "--no-check", "--json", "--stall", "2s", "--on-stall", on_stall, "--"]);
    c.arg(&e.server).arg("-m").arg(&fifo);
    c.args(["--host", "127.0.0.1", "--port", &port.to_string(), "-c", "256", "-t", "1"]);
    let o = run_bounded(c, T);
    let lines = json_lines(&o);
    assert_eq!(o.status.code(), Some(4), "{lines:?}");
    let st: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.path("state/runs/s1/state.json")).unwrap()).unwrap();
    let (server, keeper) = (st["server_pid"].as_i64().unwrap() as i32, st["keeper_pid"].as_i64().unwrap() as i32);
    Some((d, port, lines, server, keeper))
}

#[test]
fn e2e_on_stall_stop_leaves_no_process_and_the_port_free() {
    let Some((_d, port, lines, server, keeper)) = up_stalled("stop") else { return };
    let r = verdict(&lines);
    assert_eq!(r["verdict"], "stalled", "{r}");
    let pos = |k: &str| lines.iter().position(|v| v["event"] == k).unwrap_or_else(|| panic!("no {k} event: {lines:?}"));
    assert!(pos("evidence") < pos("on_stall"), "the evidence is saved before the stop");
    let act = &lines[pos("on_stall")];
    assert_eq!(act["action"], "stop", "{act}");
    assert!(act.get("survivors").is_none(), "{act}");
    assert_eq!((act["port"].as_u64(), act["port_free"].as_bool()), (Some(port as u64), Some(true)), "{act}");
    assert!(!pid_alive(server) && !pid_alive(keeper), "a process of the run is left");
    assert!(std::net::TcpListener::bind(("127.0.0.1", port)).is_ok(), "port still taken");
}

#[test]
fn e2e_on_stall_keep_leaves_the_stalled_server_running() {
    let Some((d, port, lines, server, _keeper)) = up_stalled("keep") else { return };
    let act = lines.iter().find(|v| v["event"] == "on_stall").expect("on_stall event");
    assert_eq!(act["action"], "keep", "{act}");
    assert!(pid_alive(server), "kept means kept");
    assert!(act["note"].as_str().is_some_and(|n| n.contains("`vigil down s1` stops it")), "{act}");
    let mut c = vigil();
    c.env("VIGIL_STATE_DIR", d.path("state")).args(["down", "s1"]);
    assert_eq!(run_bounded(c, T).status.code(), Some(0));
    assert!(!pid_alive(server));
    assert!(std::net::TcpListener::bind(("127.0.0.1", port)).is_ok(), "port still taken");
}

fn post(port: u16, path: &str, body: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let req = format!(
        "POST {path} HTTP/1.0\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

/// The watch after ready reads the real llama-server's `/metrics` (`--metrics`): its request gauges and
/// token counters, named in the llama-cpp profile; a completion sent by hand shows as counted tokens.
#[test]
fn e2e_watch_reads_the_real_llama_servers_metrics_counters() {
    let Some(e) = env() else { return };
    let d = TempDir::new("emetrics");
    let port = free_port();
    let log = d.path("server.log");
    let s = start_server(&e, &e.models.join("tiny.gguf"), port, &log, &["--metrics"]);
    let mut c = vigil();
    c.args(["wait", "--json", "--watch", "--pid", &s.pid().to_string()]);
    c.args(["--url", &format!("http://127.0.0.1:{port}/health")]);
    let (mut child, mut lines) = spawn_json(c);
    let first = lines.by_ref().find(|v| v["event"] == "engine_metrics").expect("a metrics reading");
    assert_eq!(first["waiting"], 0.0, "{first}");
    // vigil's own generation proof may be in flight at the first reading (seen once in CI: running 1.0, tokens
    // 6): nothing else runs on this server
    let running = first["running"].as_f64().unwrap();
    assert!(running == 0.0 || running == 1.0, "{first}");
    let before = first["tokens"].as_f64().unwrap();
    let answer = post(port, "/completion", r#"{"prompt":"Hello","n_predict":8}"#);
    assert!(answer.starts_with("HTTP/1.1 200") || answer.starts_with("HTTP/1.0 200"), "{answer}");
    let after = lines
        .by_ref()
        .find(|v| v["event"] == "engine_metrics" && v["tokens"].as_f64().unwrap() > before)
        .expect("the counters moved");
    assert!(after["tokens"].as_f64().unwrap() >= before + 8.0, "{first} → {after}");
    signal(child.id() as i32, libc::SIGINT);
    let rest: Vec<serde_json::Value> = lines.collect();
    wait_bounded(&mut child, T);
    assert!(rest.iter().all(|v| v["verdict"] != "unhealthy"), "an idle server is not stuck: {rest:?}");
}

/// `wait --on-stall stop` on a server vigil did not start (the stand-in's parent and its engine child):
/// after the evidence, the whole tree is stopped and the port proven free.
#[test]
fn e2e_wait_on_stall_stop_stops_an_attached_tree() {
    let Some(py) = python() else { return };
    let d = TempDir::new("waitstop");
    let port = free_port();
    let log = d.path("server.log");
    let server = start_standin(&py, &d, port, false, &log);
    let engine = read_pid(&d.path("engine.pid"));
    let mut c = vigil();
    c.env("VIGIL_STATE_DIR", d.path("state"));
    c.args(["wait", "--json", "--stall", "2s", "--on-stall", "stop", "--pid", &server.pid().to_string()]);
    c.args(["--url", &format!("http://127.0.0.1:{port}/health")]).arg("--log").arg(&log);
    let o = run_bounded(c, T);
    let lines = json_lines(&o);
    assert_eq!(verdict(&lines)["verdict"], "stalled", "{lines:?}");
    let act = lines.iter().find(|v| v["event"] == "on_stall").expect("on_stall event");
    assert_eq!(act["action"], "stop", "{act}");
    assert!(act.get("survivors").is_none(), "{act}");
    assert_eq!(act["port_free"], true, "{act}");
    assert!(!pid_alive(engine), "the engine child is left");
    assert!(std::net::TcpListener::bind(("127.0.0.1", port)).is_ok());
}
