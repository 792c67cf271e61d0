//! Multi-node under any launcher (issue #32), end to end with llama.cpp's own multi-node: the real
//! `ggml-rpc-server` as rank 1 (the worker that holds the offloaded layers) and the real `llama-server --rpc` as
//! rank 0 (the head, the API), two ranks on loopback, each started by its own process as a launcher would (a
//! Kubernetes LeaderWorkerSet's leader and worker containers, a `pdsh` loop): no SSH, no Slurm, no shared list
//! of hosts. Each rank's vigil finds the head over TCP from the LeaderWorkerSet environment (`LWS_*`) or from
//! `--rank --ranks --rendezvous`. Runs as root and as an unprivileged user.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::Duration;

/// Every start here is ready well within this (a tiny model over loopback RPC).
const T: Duration = Duration::from_secs(90);

/// How a rank learns its place.
enum Place<'a> {
    /// A LeaderWorkerSet pod: `LWS_LEADER_ADDRESS`, `LWS_GROUP_SIZE`, `LWS_WORKER_INDEX`; the head's port
    /// by `--rendezvous-port`.
    Lws { rank: usize, port: u16 },
    /// `--rank R --ranks 2 --rendezvous 127.0.0.1:PORT`.
    Flags { rank: usize, port: u16, extra: &'a [&'a str] },
}

/// One rank's vigil: `vigil up --multi-node --json` with its server command; stdout into `rankN.jsonl`.
fn start_rank(d: &TempDir, place: Place, cmd: &[String]) -> Child {
    let rank = match place {
        Place::Lws { rank, .. } | Place::Flags { rank, .. } => rank,
    };
    let out = std::fs::File::create(d.path(&format!("rank{rank}.jsonl"))).unwrap();
    let err = std::fs::File::create(d.path(&format!("rank{rank}.stderr"))).unwrap();
    let mut c = vigil();
    c.args(["up", "--multi-node", "--json", "--name", "llama", "--join-timeout", "60s", "--timeout", "80s"]);
    match place {
        Place::Lws { rank, port } => {
            c.args(["--rendezvous-port", &port.to_string()])
                .env("LWS_LEADER_ADDRESS", "127.0.0.1")
                .env("LWS_GROUP_SIZE", "2")
                .env("LWS_WORKER_INDEX", rank.to_string());
        }
        Place::Flags { rank, port, extra } => {
            c.args(["--rank", &rank.to_string(), "--ranks", "2", "--rendezvous", &format!("127.0.0.1:{port}")]);
            c.args(extra);
        }
    }
    c.arg("--").args(cmd);
    c.env("VIGIL_STATE_DIR", d.path("state")).stdin(Stdio::null()).stdout(out).stderr(err);
    c.spawn().expect("start a rank's vigil")
}

/// Rank 1: ggml's RPC server (its banner is printf'd: line-buffered through stdbuf, as docs/multi-node.md says).
fn worker_cmd(rpc: &Path, port: u16) -> Vec<String> {
    let mut v = vec!["stdbuf".to_string(), "-oL".into(), rpc.display().to_string()];
    v.extend(["-H", "127.0.0.1", "-p", &port.to_string(), "-t", "1"].map(String::from));
    v
}

/// Rank 0: llama-server with every layer offloaded to rank 1's RPC device.
fn head_cmd(e: &Env, rpc_port: u16, http: u16) -> Vec<String> {
    let mut v = vec![e.server.display().to_string(), "-m".into(), e.models.join("tiny.gguf").display().to_string()];
    let rest = ["--host", "127.0.0.1", "--port", &http.to_string(), "-c", "256", "-t", "1", "-ngl", "99"];
    v.extend(rest.map(String::from));
    v.extend(["--rpc".to_string(), format!("127.0.0.1:{rpc_port}")]);
    v
}

fn lines(p: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(p)
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

fn find(p: &Path, event: &str) -> Option<serde_json::Value> {
    lines(p).into_iter().rfind(|e| e["event"] == event)
}

fn launched_pid(p: &Path) -> Option<i32> {
    find(p, "launched").and_then(|e| e["pid"].as_i64()).map(|p| p as i32)
}

fn alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    unsafe { libc::kill(pid, 0) == 0 }
}

fn dump(d: &TempDir) -> String {
    let mut s = String::new();
    for f in ["rank0.jsonl", "rank0.stderr", "rank1.jsonl", "rank1.stderr"] {
        s.push_str(&format!("--- {f}\n{}\n", std::fs::read_to_string(d.path(f)).unwrap_or_default()));
    }
    s
}

/// Both ranks up: rank 1 first (llama-server connects to its RPC worker while it loads, as a
/// LeaderWorkerSet's leader waits for its workers), then the head; until the head's combined verdict.
fn start_both(d: &TempDir, e: &Env, rpc: &Path, lws: bool) -> (Child, Child, PathBuf) {
    let (rv, rpc_port, http) = (free_port(), free_port(), free_port());
    let place = |rank| if lws { Place::Lws { rank, port: rv } } else { Place::Flags { rank, port: rv, extra: &[] } };
    let r1 = start_rank(d, place(1), &worker_cmd(rpc, rpc_port));
    let log1 = d.path("state").join("runs/llama.n1/server.log");
    assert!(wait_for_text(&log1, "Starting RPC server", T), "rank 1's RPC server never started:\n{}", dump(d));
    let r0 = start_rank(d, place(0), &head_cmd(e, rpc_port, http));
    let head = d.path("rank0.jsonl");
    let ok = poll_until(T, Duration::from_millis(20), || find(&head, "multi_node_verdict").is_some());
    assert!(ok, "no combined verdict from the head:\n{}", dump(d));
    (r0, r1, head)
}

#[test]
fn e2e_launcher_lws_two_ranks_ready_then_the_launcher_stops_both() {
    let Some(e) = env() else { return };
    let Some(rpc) = e.rpc_server() else { return };
    let d = TempDir::new("lws-good");
    let (mut r0, mut r1, head) = start_both(&d, &e, &rpc, true);
    let v = find(&head, "multi_node_verdict").unwrap();
    assert_eq!(v["verdict"], "ready", "{v}\n{}", dump(&d));
    assert_eq!(v["exit"], 0);
    let hosts = v["hosts"].as_array().unwrap();
    assert_eq!(hosts.len(), 2, "{v}");
    for (i, h) in hosts.iter().enumerate() {
        assert_eq!(h["rank"], i, "{v}");
        assert_eq!(h["verdict"], "ready", "rank {i} not ready: {v}");
    }
    // each rank's own verdict is on its own output: rank 1 (the RPC worker) ready from its log, rank 0 with the
    // generation proof through its worker
    let v1 = find(&d.path("rank1.jsonl"), "verdict").expect("rank 1's own verdict");
    assert_eq!(v1["verdict"], "ready", "{v1}");
    let v0 = find(&head, "verdict").expect("rank 0's own verdict");
    assert_eq!(v0["verdict"], "ready", "{v0}");
    let pids = [launched_pid(&head).unwrap(), launched_pid(&d.path("rank1.jsonl")).unwrap()];
    // the launcher stops the group (a LeaderWorkerSet deleting its pods: SIGTERM to every container)
    signal(r1.id() as i32, libc::SIGTERM);
    signal(r0.id() as i32, libc::SIGTERM);
    let (s0, s1) = (wait_bounded(&mut r0, T), wait_bounded(&mut r1, T));
    assert_eq!((s0.code(), s1.code()), (Some(0), Some(0)), "an orderly stop after ready:\n{}", dump(&d));
    for p in pids {
        assert!(poll_until(Duration::from_secs(10), Duration::from_millis(20), || !alive(p)), "server {p} left");
    }
}

#[test]
fn e2e_launcher_flags_rank_killed_after_ready_is_the_root_cause() {
    let Some(e) = env() else { return };
    let Some(rpc) = e.rpc_server() else { return };
    let d = TempDir::new("flags-kill");
    let (mut r0, mut r1, head) = start_both(&d, &e, &rpc, false);
    assert_eq!(find(&head, "multi_node_verdict").unwrap()["verdict"], "ready", "{}", dump(&d));
    let head_server = launched_pid(&head).unwrap();
    let worker = launched_pid(&d.path("rank1.jsonl")).unwrap();
    // rank 1's server dies (the OOM killer, a node lost): the verdict names rank 1, whatever rank 0 says later
    signal(worker, libc::SIGKILL);
    let (s0, s1) = (wait_bounded(&mut r0, T), wait_bounded(&mut r1, T));
    assert_eq!(s0.code(), Some(3), "the head: crashed\n{}", dump(&d));
    assert_eq!(s1.code(), Some(3), "rank 1: crashed\n{}", dump(&d));
    let v = find(&head, "multi_node_verdict").unwrap();
    assert_eq!(v["verdict"], "crashed", "{v}");
    assert_eq!(v["decided_by"]["rank"], 1, "the killed rank decides: {v}");
    assert!(v["hosts"][1]["detail"].as_str().unwrap_or("").contains("SIGKILL"), "how rank 1's server died: {v}");
    // every rank told to stop: the head's llama-server is gone too
    assert!(poll_until(Duration::from_secs(10), Duration::from_millis(20), || !alive(head_server)), "head server left");
}

#[test]
fn e2e_launcher_bad_place_is_one_line_and_exit_2() {
    let d = TempDir::new("launcher-usage");
    for (args, want) in [
        (vec!["--rank", "0"], "all three"),
        (vec!["--rank", "2", "--ranks", "2", "--rendezvous", "127.0.0.1:1"], "rank 2 of 2"),
        (vec!["--rank", "0", "--ranks", "2", "--rendezvous", "nohost"], "HOST:PORT"),
    ] {
        let mut c = vigil();
        c.args(["up", "--multi-node"]).args(&args).args(["--", "sleep", "1"]);
        c.env("VIGIL_STATE_DIR", d.path("state")).env_remove("SLURM_JOB_ID");
        let o = run_bounded(c, Duration::from_secs(20));
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want) && err.trim().lines().count() == 1, "{args:?}: {err}");
    }
    // the place without --multi-node is a usage error too
    let mut c = vigil();
    c.args(["up", "--rank", "0", "--", "sleep", "1"]).env("VIGIL_STATE_DIR", d.path("state"));
    let o = run_bounded(c, Duration::from_secs(20));
    assert_eq!(o.status.code(), Some(2), "{}", String::from_utf8_lossy(&o.stderr));
}
