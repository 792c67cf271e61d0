//! Startup history end to end (docs/history.md): `vigil up` of the real llama-server records every
//! startup; later starts of the same key show the usual duration, an ETA and `slow`, carry the baseline
//! in the verdict, list what changed, and stall at a limit learned from good starts. Test names start
//! with `e2e_`; scripts/test.sh runs them again as an unprivileged user.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(90);

/// vigil with a private state directory (the store is `history.db` in it).
fn v(state: &Path) -> Command {
    let mut c = vigil();
    c.env("VIGIL_STATE_DIR", state);
    c.env_remove("VIGIL_HISTORY");
    c
}

fn tiny_cmd(e: &Env, model: &Path, port: u16) -> Vec<String> {
    let mut v: Vec<String> = vec![e.server.display().to_string(), "-m".into(), model.display().to_string()];
    v.extend(["--host", "127.0.0.1", "--port", &port.to_string(), "-c", "256", "-t", "1"].map(String::from));
    v
}

/// One detached `vigil up` to its verdict, then `vigil down`; returns the verdict line.
fn start_and_stop(state: &Path, name: &str, cmd: &[String], code: i32) -> serde_json::Value {
    let mut c = v(state);
    c.args(["up", "--name", name, "--detach", "--json", "--"]).args(cmd);
    let o = run_bounded(c, T);
    let lines = json_lines(&o);
    assert_eq!(o.status.code(), Some(code), "{lines:?} {}", String::from_utf8_lossy(&o.stderr));
    let r = verdict(&lines).clone();
    let mut c = v(state);
    c.args(["down", name]);
    let o = run_bounded(c, T);
    assert!(o.status.code().is_some_and(|c| c == 0 || c == 2), "down: {}", String::from_utf8_lossy(&o.stdout));
    r
}

fn history_json(state: &Path, name: Option<&str>) -> Vec<serde_json::Value> {
    let mut c = v(state);
    c.arg("history").args(name).arg("--json");
    let o = run_bounded(c, T);
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    json_lines(&o)
}

/// Three normal startups, then a fourth whose server is stopped (SIGSTOP) as its weights load and
/// continued when vigil says `slow`: the weights phase event carries the usual duration and an ETA,
/// `slow` comes once, the verdict carries the baseline, and `history --json` lists all four.
#[test]
fn e2e_history_fourth_start_held_in_loading_is_slow_with_baseline() {
    let Some(e) = env() else { return };
    let d = TempDir::new("hist-slow");
    let port = free_port();
    let cmd = tiny_cmd(&e, &e.models.join("tiny.gguf"), port);
    for _ in 0..3 {
        assert_eq!(start_and_stop(&d.0, "h", &cmd, 0)["verdict"], "ready");
    }
    // the run directory of the earlier starts goes, so that only this start's log and pid are seen
    std::fs::remove_dir_all(d.0.join("runs/h")).unwrap();
    let stopper = stop_when_loading(d.0.join("runs/h"));
    let mut c = v(&d.0);
    // a 1 s margin over the (sub-second) usual durations, instead of the 30 s default
    c.env("VIGIL_SLOW_FLOOR", "1s");
    c.args(["up", "--name", "h", "--detach", "--json", "--"]).args(&cmd);
    let (mut child, events) = spawn_json(c);
    let (mut server, mut lines) = (0, Vec::new());
    let t0 = Instant::now();
    for j in events {
        if j["event"] == "launched" {
            server = j["pid"].as_i64().unwrap() as i32;
        }
        if j["event"] == "slow" {
            signal(server, libc::SIGCONT);
        }
        lines.push(j);
        assert!(t0.elapsed() < T, "no verdict");
    }
    let status = wait_bounded(&mut child, T);
    signal(server, libc::SIGCONT);
    assert_eq!(stopper.join().unwrap(), Some(server), "the server was stopped while loading");
    let r = verdict(&lines).clone();
    assert_eq!(status.code(), Some(0), "{r}");
    assert_eq!(r["verdict"], "ready");
    let ph = lines
        .iter()
        .find(|j| j["event"] == "phase" && j["phase"] == "weights")
        .expect("the weights phase was reported");
    assert!(ph["usual_ms"].is_u64(), "the phase event carries the usual duration: {ph}");
    assert!(ph["eta_ms"].is_u64(), "the phase event carries an ETA: {ph}");
    let slows: Vec<&serde_json::Value> = lines.iter().filter(|j| j["event"] == "slow").collect();
    assert_eq!(slows.len(), 1, "slow is said once: {lines:?}");
    assert!(slows[0]["ratio"].as_f64().unwrap() > 1.5, "{}", slows[0]);
    assert_eq!(slows[0]["startups"], 3);
    let b = &r["baseline"];
    assert_eq!(b["startups"], 3, "{r}");
    assert!(b["total_ms_median"].is_u64() && b["ratio"].as_f64().unwrap() > 1.0, "{b}");
    let mut c = v(&d.0);
    c.args(["down", "h"]);
    run_bounded(c, T);
    let h = history_json(&d.0, Some("h"));
    assert_eq!(h.len(), 4, "{h:?}");
    for x in &h {
        assert_eq!(x["name"], "h");
        assert_eq!(x["verdict"], "ready");
        assert!(x["total_ms"].is_u64() && x["phases"]["weights"].is_u64(), "{x}");
        assert_eq!(x["key"]["server"], "llama-cpp");
    }
    assert!(h[3]["phases"]["weights"].as_u64().unwrap() > 1000, "the held phase is recorded long: {}", h[3]);
    assert!(!h[3]["slow"].as_array().unwrap().is_empty(), "the slow start is marked slow: {}", h[3]);
    // plain lines: phase lines say the usual duration, the verdict summary the baseline
    let mut c = v(&d.0);
    c.args(["up", "--name", "h", "--detach", "--"]).args(&cmd);
    let o = run_bounded(c, T);
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(out.lines().any(|l| l.contains("phase launch → weights") && l.contains("(usually ")), "{out}");
    assert!(out.contains("usual: 4 good startups, median total"), "{out}");
    let mut c = v(&d.0);
    c.args(["down", "h"]);
    run_bounded(c, T);
}

/// Two `vigil up` of two servers finishing at once, into one store: both startups are recorded.
#[test]
fn e2e_history_two_ups_finishing_at_once_lose_no_record() {
    let Some(e) = env() else { return };
    let d = TempDir::new("hist-two");
    let kids: Vec<_> = ["a", "b"]
        .iter()
        .map(|n| {
            let mut c = v(&d.0);
            c.args(["up", "--name", n, "--detach", "--json", "--"]).args(tiny_cmd(
                &e,
                &e.models.join("tiny.gguf"),
                free_port(),
            ));
            std::thread::spawn(move || run_bounded(c, T))
        })
        .collect();
    let mut errs = String::new();
    for k in kids {
        let o = k.join().unwrap();
        assert_eq!(o.status.code(), Some(0));
        errs.push_str(&String::from_utf8_lossy(&o.stderr));
    }
    for n in ["a", "b"] {
        let mut c = v(&d.0);
        c.args(["down", n]);
        run_bounded(c, T);
    }
    let h = history_json(&d.0, None);
    let mut names: Vec<&str> = h.iter().map(|x| x["name"].as_str().unwrap()).collect();
    names.sort();
    assert_eq!(names, vec!["a", "b"], "stderr of the two ups: {errs}\n{h:?}");
}

/// Stops the server (SIGSTOP) as soon as its log, polled every millisecond, shows `loading model`:
/// weight loading of the tiny model takes about 150 ms, so the stop lands inside it. Returns its pid.
fn stop_when_loading(run_dir: PathBuf) -> std::thread::JoinHandle<Option<i32>> {
    std::thread::spawn(move || {
        let t0 = Instant::now();
        while t0.elapsed() < T {
            let pid = std::fs::read(run_dir.join("state.json"))
                .ok()
                .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
                .and_then(|v| v["server_pid"].as_i64());
            let loading =
                std::fs::read_to_string(run_dir.join("server.log")).is_ok_and(|l| l.contains("loading model"));
            if let (Some(p), true) = (pid, loading) {
                signal(p as i32, libc::SIGSTOP);
                return Some(p as i32);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        None
    })
}

/// Writes one byte of the model's GGUF metadata: `general.architecture` "llama" becomes "llamb".
fn edit_one_key(model: &Path) {
    let mut b = std::fs::read(model).unwrap();
    let key = b"general.architecture";
    let i = b.windows(key.len()).position(|w| w == key).expect("architecture key");
    // key, type (u32), length (u64), then the value
    let v = i + key.len() + 4 + 8;
    assert_eq!(&b[v..v + 5], b"llama");
    b[v + 4] = b'b';
    std::fs::write(model, b).unwrap();
}

/// A good start, then the same command after one metadata key of the model was edited: the start
/// fails and its verdict lists the model config's change; `history` lists it too.
#[test]
fn e2e_history_changed_model_config_is_listed() {
    let Some(e) = env() else { return };
    let d = TempDir::new("hist-change");
    let model: PathBuf = d.path("model.gguf");
    std::fs::copy(e.models.join("tiny.gguf"), &model).unwrap();
    let port = free_port();
    let cmd = tiny_cmd(&e, &model, port);
    assert_eq!(start_and_stop(&d.0, "c", &cmd, 0)["verdict"], "ready");
    edit_one_key(&model);
    let r = start_and_stop(&d.0, "c", &cmd, 3);
    assert_eq!(r["verdict"], "crashed", "{r}");
    let changes = r["changes"].as_array().unwrap_or_else(|| panic!("no changes in {r}"));
    let c = changes.iter().find(|c| c["item"] == "config:model").unwrap_or_else(|| panic!("{changes:?}"));
    assert!(c["before"].is_string() && c["after"].is_string() && c["before"] != c["after"], "{c}");
    assert_eq!(changes.len(), 1, "only the file changed: {changes:?}");
    let h = history_json(&d.0, Some("c"));
    assert_eq!(h.len(), 2);
    assert_eq!(h[1]["changes"][0]["item"], "config:model", "{}", h[1]);
    let mut c = v(&d.0);
    c.args(["history", "c"]);
    let o = run_bounded(c, T);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("changed: config:model"),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
}

/// After three good starts, a start stopped (SIGSTOP) as it is launched is stalled at the limit learned
/// from them (3 × the longest silent gap, here the 2 s floor), not at the 300/600 s defaults.
///
/// The moment of the stop is made certain (issue #36: a SIGSTOP sent from here landed in `http` one day in
/// three runs, where the server had got by then): the server is started through `sh`, which stops itself
/// before it execs the server when a marker file exists, so the fourth start is silent in `launch` from its
/// first moment. The command line is the same for all four starts (the marker is an argument), so the history
/// key is too. That a stall in any phase the good starts went through (`http` included) gets its learned
/// limit is the core's `a_phase_seen_without_a_gap_is_learned_from_its_duration`.
#[test]
fn e2e_history_learned_stall_limit_fires() {
    let Some(e) = env() else { return };
    let d = TempDir::new("hist-stall");
    let port = free_port();
    let marker = d.path("stop-before-exec");
    let mut cmd: Vec<String> = vec!["sh".into(), "-c".into(), "[ -e \"$0\" ] && kill -STOP $$; exec \"$@\"".into()];
    cmd.push(marker.display().to_string());
    cmd.extend(tiny_cmd(&e, &e.models.join("tiny.gguf"), port));
    let up = |state: &Path| {
        let mut c = v(state);
        c.args(["up", "--name", "s", "--server", "llama-cpp", "--no-check", "--grace", "1s", "--detach", "--json"]);
        c.arg("--").args(&cmd);
        c
    };
    for _ in 0..3 {
        let o = run_bounded(up(&d.0), T);
        let lines = json_lines(&o);
        assert_eq!(verdict(&lines)["verdict"], "ready", "{lines:?}");
        let mut c = v(&d.0);
        c.args(["down", "s"]);
        assert_eq!(run_bounded(c, T).status.code(), Some(0));
    }
    std::fs::write(&marker, "").unwrap();
    let mut c = up(&d.0);
    c.env("VIGIL_STALL_FLOOR", "2s");
    let (mut child, events) = spawn_json(c);
    let (mut server, mut launched_at, mut lines) = (0, None, Vec::new());
    for j in events {
        if j["event"] == "launched" {
            server = j["pid"].as_i64().unwrap() as i32;
            launched_at = Some(j["t_ms"].as_u64().unwrap());
        }
        lines.push(j);
    }
    let status = wait_bounded(&mut child, T);
    signal(server, libc::SIGCONT);
    let r = verdict(&lines).clone();
    assert_eq!(status.code(), Some(4), "{r}");
    assert_eq!(r["verdict"], "stalled", "{r}");
    assert_eq!(r["phase"], "launch", "the server stopped itself before its first line: {r}");
    let detail = r["detail"].as_str().unwrap();
    // the 2 s floor, or 3 × a launch that was slower than 667 ms on a loaded machine: learned either way
    assert!(detail.contains("stall limit ") && detail.contains("(learned"), "{detail}");
    let at = r["t_ms"].as_u64().unwrap();
    let from = launched_at.unwrap();
    assert!(at + 1 >= from + 2000, "stalled at {at} ms, before {from} + 2000");
    assert!(at < from + 20_000, "stalled at {at} ms: not the learned limit");
    assert!(
        lines
            .iter()
            .any(|j| j["event"] == "note" && j["message"].as_str().unwrap_or("").contains("stall limits learned")),
        "the learned limits are shown"
    );
    let mut c = v(&d.0);
    c.args(["down", "s"]);
    run_bounded(c, T);
}

/// Real corpus logs, compiled in (the test may run as a user who cannot read the checkout).
const LOGS: [(&str, &str); 3] = [
    ("tgi-3181.log", include_str!("../../../corpus/tgi/tgi-3181-compose-vlm-after-warmup.log")),
    ("llamacpp-ready.log", include_str!("../../../corpus/llama-cpp/llama-cpp-13661-listening-all-slots-idle.log")),
    ("vllm-head.log", include_str!("../../../corpus/vllm/vllm-pr24162-v0.10.2dev-tp2-startup-head-no-prefix.log")),
];

fn write_logs(d: &TempDir) -> Vec<PathBuf> {
    LOGS.iter()
        .map(|(n, t)| {
            let p = d.path(n);
            std::fs::write(&p, t).unwrap();
            p
        })
        .collect()
}

/// `history import` of a corpus log records the phase durations its timestamps give. By hand, from
/// corpus/tgi/tgi-3181-compose-vlm-after-warmup.log (ms, as the log's stamps are read):
/// launch 17:56:56.805 → 57.035 (`Waiting for shard`) = 230; weights → 57.215 (`Starting Webserver`)
/// = 180; http → 57.310 (`Warming up model`) = 95; warmup → 17:57:01.163 (the last line) = 3853;
/// total 4358.
#[test]
fn store_import_records_phase_durations_from_the_timestamps() {
    let d = TempDir::new("hist-import");
    let logs = write_logs(&d);
    let mut c = v(&d.0);
    c.args(["history", "import"]).arg(&logs[0]);
    let o = run_bounded(c, T);
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    let h = history_json(&d.0, Some("tgi-3181"));
    assert_eq!(h.len(), 1);
    let p = &h[0]["phases"];
    let got: Vec<(&str, u64)> =
        ["launch", "weights", "http", "warmup"].iter().map(|k| (*k, p[*k].as_u64().unwrap_or(0))).collect();
    assert_eq!(got, vec![("launch", 230), ("weights", 180), ("http", 95), ("warmup", 3853)], "{p}");
    assert_eq!(h[0]["total_ms"], 4358);
    assert_eq!(h[0]["key"]["server"], "tgi");
}

/// Several vigil processes writing the store at once lose no record.
#[test]
fn store_concurrent_writers_lose_nothing() {
    let d = TempDir::new("hist-conc");
    let logs = write_logs(&d);
    let mut kids = Vec::new();
    // eight at once into a store none of them finds: they race to create it, switch it to WAL and lay out
    // its tables, then to write
    for _ in 0..8 {
        let mut c = v(&d.0);
        c.args(["history", "import"]).args(&logs).stdout(std::process::Stdio::null());
        kids.push(c.spawn().unwrap());
    }
    for mut k in kids {
        assert_eq!(wait_bounded(&mut k, T).code(), Some(0));
    }
    assert_eq!(history_json(&d.0, None).len(), 8 * logs.len());
}

/// A store that is not a database: one warning line, and the exit code of the watch is unchanged.
#[test]
fn store_corrupt_warns_once_and_keeps_the_exit_code() {
    let d = TempDir::new("hist-corrupt");
    let logs = write_logs(&d);
    std::fs::write(d.0.join("history.db"), vec![0x5a; 8192]).unwrap();
    let mut c = v(&d.0);
    // the llama-server log ends serving: `wait` says ready (exit 0) from the log alone
    c.args(["wait", "--log"]).arg(&logs[1]).args(["--server", "llama-cpp", "--timeout", "20s"]);
    let o = run_bounded(c, T);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{} {err}", String::from_utf8_lossy(&o.stdout));
    assert_eq!(err.lines().filter(|l| l.contains("warning: history")).count(), 1, "{err}");
}
