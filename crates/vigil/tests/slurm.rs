//! vigil inside a Slurm job (issue #27), end to end with a real Slurm: Debian's slurmctld and two slurmd
//! (nodes n1 and n2 on loopback, `scripts/slurm-setup.sh`, started by `scripts/test.sh`), munge, real
//! `sbatch`/`srun`/`scancel`, and the real llama-server as the payload. Each test submits the sbatch script
//! of docs/slurm.md, unchanged (read from the doc at build time), with `SERVER` the llama-server command and
//! `VIGIL_FLAGS` extra vigil flags (JSON lines, short limits). Runs as root and as an unprivileged user.

mod common;
use common::*;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The doc the script comes from: the test and the doc are one.
const DOC: &str = include_str!("../../../docs/slurm.md");
/// Every job here ends (or is ready) well within this.
const T: Duration = Duration::from_secs(120);

/// The first ```bash block of docs/slurm.md that is a script.
fn doc_script() -> String {
    let start = DOC.find("```bash\n#!/bin/bash\n").expect("docs/slurm.md has an sbatch script") + "```bash\n".len();
    let len = DOC[start..].find("\n```").expect("the script's block ends");
    format!("{}\n", &DOC[start..start + len])
}

/// The lines of docs/slurm.md that run `vigil status`, `logs` and `dump` on every node of a job.
fn doc_job_commands() -> String {
    let start = DOC.find("```bash\nN=$(squeue").expect("docs/slurm.md has the per-job commands") + "```bash\n".len();
    let len = DOC[start..].find("\n```").expect("the block ends");
    format!("{}\n", &DOC[start..start + len])
}

/// The Slurm to submit to: `SLURM_CONF` (scripts/test.sh exports it), or scripts/slurm-setup.sh's default.
/// Missing or not answering: a failure under CI=true, a skip otherwise.
fn slurm_conf() -> Option<String> {
    let conf = std::env::var("SLURM_CONF")
        .ok()
        .filter(|c| !c.is_empty())
        .unwrap_or_else(|| "/var/tmp/vigil-slurm/slurm.conf".into());
    let ok = Path::new("/usr/bin/sbatch").is_file() && Path::new(&conf).is_file() && {
        let mut c = Command::new("timeout");
        c.args(["10", "sinfo", "-h", "-o", "%t"]).env("SLURM_CONF", &conf);
        c.output().map(|o| o.status.success() && !o.stdout.is_empty()).unwrap_or(false)
    };
    if ok {
        return Some(conf);
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("no Slurm to submit to ({conf}): run scripts/slurm-setup.sh as root (scripts/test.sh does)");
    }
    eprintln!("SKIP: no Slurm (run scripts/slurm-setup.sh as root)");
    None
}

/// A bounded Slurm client call; its stdout.
fn slurm_cmd(conf: &str, args: &[&str]) -> String {
    let mut c = Command::new("timeout");
    c.arg("15").args(args).env("SLURM_CONF", conf);
    let o = run_bounded(c, Duration::from_secs(20));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A submitted job: `sbatch --wait` running until the job ends.
struct Job {
    id: String,
    sbatch: Guard,
    out: PathBuf,
    conf: String,
    dir: PathBuf,
}

impl Job {
    /// Submits the doc's script with two nodes; `server` is the llama-server command (with `{node_rank}`).
    fn submit(d: &TempDir, conf: &str, server: &str, scancel: &str, flags: &str) -> Job {
        let script = d.path("sglang-vigil.sbatch");
        std::fs::write(&script, doc_script()).unwrap();
        // `vigil` on the job's PATH: the binary under test
        let bin = d.path("bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::os::unix::fs::symlink(vigil_bin(), bin.join("vigil")).unwrap();
        let path = format!("{}:/usr/bin:/bin", bin.display());
        let out = d.path("job.out");
        let mut c = Command::new("sbatch");
        c.args(["--wait", "--parsable", "--time=5", "--chdir"]).arg(&d.0).arg("--output").arg(&out).arg(&script);
        c.env("SLURM_CONF", conf)
            .env("PATH", path)
            .env("SERVER", server)
            .env("SCANCEL", scancel)
            .env("VIGIL_FLAGS", flags)
            .env("VIGIL_STATE_DIR", d.path("state"))
            .env("XDG_CONFIG_HOME", "/nonexistent-vigil-test")
            .env_remove("NO_COLOR")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let mut child = c.spawn().expect("sbatch");
        let mut first = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut first).unwrap();
        let id = first.trim().split(';').next().unwrap_or("").to_string();
        assert!(!id.is_empty() && id.chars().all(|c| c.is_ascii_digit()), "sbatch gave no job id: {first:?}");
        Job { id, sbatch: Guard(child), out, conf: conf.to_string(), dir: d.0.clone() }
    }

    /// Waits (bounded) for the job to end: `sbatch --wait` returns then.
    /// Runs a shell script with the job's environment (`JOB`, the vigil under test on PATH), bounded.
    fn shell(&self, script: &str) -> std::process::Output {
        let mut c = Command::new("bash");
        c.arg("-c").arg(script);
        c.env("JOB", &self.id)
            .env("SLURM_CONF", &self.conf)
            .env("PATH", format!("{}:/usr/bin:/bin", self.dir.join("bin").display()))
            .env("VIGIL_STATE_DIR", self.dir.join("state"))
            .env("XDG_CONFIG_HOME", "/nonexistent-vigil-test")
            .current_dir(&self.dir);
        run_bounded(c, Duration::from_secs(60))
    }

    fn wait_end(&mut self) {
        wait_bounded(&mut self.sbatch.0, T);
    }

    /// The output file of task (node rank) `t`: the doc's script gives each its own (`--output`).
    fn task_out(&self, t: usize) -> PathBuf {
        self.dir.join(format!("vigil-{}.{t}.out", self.id))
    }

    /// The job's output, then each task's: everything Slurm, the script and every vigil wrote.
    fn text(&self) -> String {
        let mut s = std::fs::read_to_string(&self.out).unwrap_or_default();
        for t in 0..2 {
            s.push_str(&std::fs::read_to_string(self.task_out(t)).unwrap_or_default());
        }
        s
    }

    /// Waits (bounded) until the job's output or a task's has `needle`. Polls the files: the text is the event.
    fn wait_for(&self, needle: &str, deadline: Duration) -> bool {
        poll_until(deadline, Duration::from_millis(5), || self.text().contains(needle))
    }

    /// The JSON lines of every node's vigil, each read from its own task's file, where every line is
    /// whole: a line that is not JSON there is a failure (srun's own lines are in the job's output).
    fn events(&self) -> Vec<serde_json::Value> {
        let mut v = Vec::new();
        for t in 0..2 {
            let text = std::fs::read_to_string(self.task_out(t)).unwrap_or_default();
            for l in text.lines().filter(|l| l.starts_with('{')) {
                v.push(serde_json::from_str(l).unwrap_or_else(|e| panic!("task {t}: a broken JSON line ({e}): {l}")));
            }
        }
        v
    }

    fn state(&self) -> String {
        let s = slurm_cmd(&self.conf, &["scontrol", "show", "job", &self.id]);
        s.split_whitespace().find_map(|w| w.strip_prefix("JobState=")).unwrap_or("").to_string()
    }

    /// The job's state once Slurm has finished it (its processes killed, the epilog done): `scontrol` says
    /// COMPLETING until then, and no event announces the end, so this polls (bounded).
    fn final_state(&self) -> String {
        let mut st = String::new();
        let done = poll_until(Duration::from_secs(60), Duration::from_millis(200), || {
            st = self.state();
            !matches!(st.as_str(), "COMPLETING" | "RUNNING" | "PENDING" | "")
        });
        assert!(done, "job {} still {st} after 60 s", self.id);
        st
    }

    /// The run directory of rank `r` on its node.
    fn run_dir(&self, r: usize) -> PathBuf {
        self.dir.join("state/runs").join(format!("llama-cpp.job{}.n{r}", self.id))
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        // a failed test leaves no job behind
        let _ = Command::new("timeout").args(["15", "scancel", &self.id]).env("SLURM_CONF", &self.conf).status();
    }
}

/// Processes whose command line names `dir` (the servers and keepers of this test's job).
fn left_in(dir: &Path) -> Vec<String> {
    let needle = dir.to_string_lossy().into_owned();
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        if pid == std::process::id() {
            continue;
        }
        if let Ok(b) = std::fs::read(e.path().join("cmdline")) {
            let s = String::from_utf8_lossy(&b).replace('\0', " ");
            if s.contains(&needle) && !s.starts_with("sbatch") {
                v.push(format!("{pid}: {s}"));
            }
        }
    }
    v
}

/// A free port for `--rendezvous-port`, below the ephemeral range (where other tests' ports come from) and
/// below the servers' ports (33000 up).
fn rendezvous_port() -> u16 {
    static N: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let start = 32_100 + (std::process::id() % 300) as u16 + n * 97;
    (start..32_700).find(|p| std::net::TcpListener::bind(("0.0.0.0", *p)).is_ok()).expect("a free port")
}

/// Two free ports PREFIX·10 and PREFIX·10+1, for `--port PREFIX{node_rank}`.
fn port_prefix() -> u32 {
    // each call starts elsewhere: tests of one process run at once, and a port probed free here is only
    // taken when the job's server starts
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let start = 3300 + (std::process::id() % 1000) + n * 300;
    (start..6000)
        .find(|k: &u32| {
            let a = std::net::TcpListener::bind(("127.0.0.1", (k * 10) as u16));
            let b = std::net::TcpListener::bind(("127.0.0.1", (k * 10 + 1) as u16));
            a.is_ok() && b.is_ok()
        })
        .expect("two free ports")
}

fn server_cmd(e: &Env, d: &TempDir) -> String {
    format!(
        "{} -m {}/m{{node_rank}}.gguf --host 127.0.0.1 --port {}{{node_rank}} -c 256 -t 1",
        e.server.display(),
        d.0.display(),
        port_prefix()
    )
}

fn by_rank<'a>(ev: &'a [serde_json::Value], event: &str, rank: u64) -> Option<&'a serde_json::Value> {
    ev.iter().find(|v| v["event"] == event && v["rank"] == rank)
}

fn said(ev: &[serde_json::Value], rank: u64, text: &str) -> bool {
    ev.iter().any(|v| v["rank"] == rank && v["message"].as_str().is_some_and(|m| m.contains(text)))
}

/// The second node's model in a two-node test (the first is always the tiny good one).
enum Second {
    Good,
    Truncated,
    /// a FIFO: the server blocks opening it (a stuck load)
    Stuck,
}

/// A test's real parts (llama-server, Slurm) and its folder, with `m0.gguf` and `m1.gguf` as the two nodes'
/// models; None (a skip, or a failure under CI, as `env` decides) when a part is missing.
fn two_nodes(name: &str, second: Second) -> Option<(Env, String, TempDir)> {
    let e = env()?;
    let conf = slurm_conf()?;
    let d = TempDir::new(name);
    std::os::unix::fs::symlink(e.models.join("tiny.gguf"), d.path("m0.gguf")).unwrap();
    match second {
        Second::Good => std::os::unix::fs::symlink(e.models.join("tiny.gguf"), d.path("m1.gguf")).unwrap(),
        Second::Truncated => std::os::unix::fs::symlink(e.models.join("truncated.gguf"), d.path("m1.gguf")).unwrap(),
        Second::Stuck => std::fs::rename(fifo_model(&d), d.path("m1.gguf")).unwrap(),
    }
    Some((e, conf, d))
}

/// The doc's script runs as written: two nodes, both ranks ready (each proven by a real completion),
/// one combined verdict on the head; the step's end (SIGTERM from Slurm) stops both servers in order,
/// every vigil exits 0, and vigil ends nothing itself.
#[test]
fn e2e_slurm_good_start_two_nodes_then_the_steps_end_stops_both() {
    let Some((e, conf, d)) = two_nodes("slurm-ok", Second::Good) else { return };
    // the rendezvous port derived from the job id (no --rendezvous-port)
    let mut job = Job::submit(&d, &conf, &server_cmd(&e, &d), "step", "--json --no-check");
    assert!(job.wait_for("\"multi_node_verdict\"", T), "no combined verdict:\n{}", job.text());
    // the head's serving note follows the table (it is printed by the same vigil)
    assert!(job.wait_for("serving on all 2 ranks", Duration::from_secs(10)), "{}", job.text());
    let ev = job.events();
    for r in 0..2u64 {
        let v = by_rank(&ev, "verdict", r).unwrap_or_else(|| panic!("no verdict from rank {r}:\n{}", job.text()));
        assert_eq!(v["verdict"], "ready", "rank {r}: {v}");
        assert_eq!(v["host"], format!("n{}", r + 1), "rank {r} runs on node n{}: {v}", r + 1);
    }
    let m = ev.iter().find(|v| v["event"] == "multi_node_verdict").unwrap();
    assert_eq!(m["verdict"], "ready", "{m}");
    let hosts = m["hosts"].as_array().unwrap();
    assert_eq!(hosts.len(), 2, "{m}");
    assert_eq!((hosts[0]["host"].as_str(), hosts[1]["host"].as_str()), (Some("n1"), Some("n2")), "{m}");
    assert!(hosts.iter().all(|h| h["verdict"] == "ready"), "{m}");
    assert_eq!(job.state(), "RUNNING", "a ready server's job keeps running");
    assert!(!left_in(&d.0).is_empty(), "the servers run while the job runs");
    // status, logs and dump on every node of the job, as docs/slurm.md gives them
    let o = job.shell(&doc_job_commands());
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success(), "{out}{}", String::from_utf8_lossy(&o.stderr));
    for t in 0..2 {
        let name = format!("llama-cpp.job{}.n{t}", job.id);
        let status = out.lines().any(|l| l.starts_with(&format!("{t}: {name} ")) && l.contains("ready"));
        assert!(status, "task {t} lists its node's run {name} as ready:\n{out}");
        // the log's last lines (llama-server stamps each line 0.00.xxx.xxx)
        assert!(out.lines().any(|l| l.starts_with(&format!("{t}: 0.0"))), "task {t} shows its log:\n{out}");
        assert!(out.lines().any(|l| l.starts_with(&format!("{t}: ")) && l.contains("evidence of 1 process")), "{out}");
        let dumps = std::fs::read_dir(job.run_dir(t)).unwrap().flatten();
        assert!(
            dumps.into_iter().any(|e| e.file_name().to_string_lossy().starts_with("evidence-")),
            "dump saved on node {t}"
        );
    }
    assert_eq!(job.state(), "RUNNING", "dump leaves the server running");
    // the step's end as a person (or the job's time limit) gives it: SIGTERM to the step's processes; every
    // vigil stops its server in order and exits 0, and the script goes on
    slurm_cmd(&conf, &["scancel", "--signal=TERM", &format!("{}.0", job.id)]);
    job.wait_end();
    let ev = job.events();
    let text = job.text();
    assert!(!text.contains("ending Slurm"), "vigil ended nothing itself:\n{text}");
    // the step's end reached both nodes: no rank was taken for lost, no failure code
    assert!(!text.contains("went away"), "{text}");
    assert!(text.contains("vigil exit: 0"), "every vigil exited 0:\n{text}");
    // each server is gone: stopped by its vigil, or ended by the same SIGTERM first
    for r in 0..2u64 {
        let stopped = said(&ev, r, "none left") || said(&ev, r, "nothing running");
        assert!(stopped, "rank {r} stopped its server:\n{text}");
    }
    assert_eq!(job.final_state(), "COMPLETED");
    assert!(left_in(&d.0).is_empty(), "left running: {:?}", left_in(&d.0));
}

/// Rank 1 crashes (a truncated model): its verdict and evidence on its node, the combined verdict
/// crashed decided by rank 1 on the head, rank 0 stopped, and with `--scancel job` the job is ended at
/// once (state CANCELLED, long before its time limit), nothing left running.
#[test]
fn e2e_slurm_crash_on_one_node_ends_the_job() {
    let Some((e, conf, d)) = two_nodes("slurm-crash", Second::Truncated) else { return };
    let flags = format!("--json --no-check --rendezvous-port {}", rendezvous_port());
    let t0 = Instant::now();
    let mut job = Job::submit(&d, &conf, &server_cmd(&e, &d), "job", &flags);
    job.wait_end();
    let took = t0.elapsed();
    let ev = job.events();
    let v1 = by_rank(&ev, "verdict", 1).unwrap_or_else(|| panic!("no verdict from rank 1:\n{}", job.text()));
    assert_eq!((v1["verdict"].as_str(), v1["cause"].as_str()), (Some("crashed"), Some("model_file")), "{v1}");
    let m = ev.iter().find(|v| v["event"] == "multi_node_verdict").unwrap_or_else(|| panic!("{}", job.text()));
    assert_eq!(m["verdict"], "crashed", "{m}");
    assert_eq!(m["decided_by"]["rank"], 1, "{m}");
    assert!(said(&ev, 0, &format!("ending Slurm job {} (scancel)", job.id)), "{}", job.text());
    assert!(said(&ev, 0, "none left") || said(&ev, 0, "nothing running"), "rank 0 stopped:\n{}", job.text());
    assert_eq!(job.final_state(), "CANCELLED", "{}", job.text());
    assert!(took < Duration::from_secs(60), "the job ended in {took:?}, not at its 5-minute limit");
    assert!(left_in(&d.0).is_empty(), "left running: {:?}", left_in(&d.0));
    // the evidence: rank 1's verdict with the log lines that prove it, saved in its run directory
    let saved = std::fs::read_to_string(job.run_dir(1).join("verdict.json")).unwrap();
    assert!(saved.contains("crashed") && saved.contains("not within the file bounds"), "{saved}");
}

/// Rank 1 stalls in weight loading (its model on storage that never answers: a FIFO); past the stall
/// limit its node saves the evidence (where the server is blocked), the head decides stalled, every rank
/// is stopped and the step ends (`--scancel step`): the script goes on and exits with vigil's 4.
#[test]
fn e2e_slurm_stall_on_one_node_ends_the_step_with_evidence() {
    let Some((e, conf, d)) = two_nodes("slurm-stall", Second::Stuck) else { return };
    let flags = "--json --no-check --stall 3s";
    let mut job = Job::submit(&d, &conf, &server_cmd(&e, &d), "step", flags);
    job.wait_end();
    let ev = job.events();
    let text = job.text();
    let v1 = by_rank(&ev, "verdict", 1).unwrap_or_else(|| panic!("no verdict from rank 1:\n{text}"));
    assert_eq!((v1["verdict"].as_str(), v1["phase"].as_str()), (Some("stalled"), Some("weights")), "{v1}");
    let v0 = by_rank(&ev, "verdict", 0).unwrap_or_else(|| panic!("no verdict from rank 0:\n{text}"));
    assert_eq!(v0["verdict"], "ready", "{v0}");
    let m = ev.iter().find(|v| v["event"] == "multi_node_verdict").unwrap_or_else(|| panic!("{text}"));
    assert_eq!((m["verdict"].as_str(), m["decided_by"]["rank"].as_u64()), (Some("stalled"), Some(1)), "{m}");
    // every rank confirmed its stop: the step ends as the vigils exit, each with the verdict's code
    let ends = format!("every rank stopped its server: Slurm step {}.0 ends as its vigils exit (exit 4)", job.id);
    assert!(said(&ev, 0, &ends), "{text}");
    assert!(text.contains("vigil exit: 4"), "the script went on after the step, with vigil's code:\n{text}");
    assert_eq!(job.final_state(), "FAILED");
    let info = slurm_cmd(&conf, &["scontrol", "show", "job", &job.id]);
    assert!(info.contains("JobState=FAILED") && info.contains("ExitCode=4:0"), "{info}");
    assert!(left_in(&d.0).is_empty(), "left running: {:?}", left_in(&d.0));
    // the evidence, saved on rank 1's node before anything was stopped: the server blocked opening its model
    let evd = ev.iter().find(|v| v["event"] == "evidence" && v["rank"] == 1).unwrap_or_else(|| panic!("{text}"));
    let dir = PathBuf::from(evd["dir"].as_str().unwrap());
    assert!(dir.starts_with(job.run_dir(1)), "{evd}");
    assert!(std::fs::read_dir(&dir).map(|r| r.count()).unwrap_or(0) > 0, "evidence files in {}", dir.display());
    assert!(evd.to_string().contains("m1.gguf"), "{evd}");
    // the history records each node's start under its run name, which carries the job id
    let o = job.shell("vigil history --json");
    let h = String::from_utf8_lossy(&o.stdout).into_owned();
    let name = format!("llama-cpp.job{}.n1", job.id);
    let rec = h.lines().filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()).find(|v| v["name"] == name);
    let rec = rec.unwrap_or_else(|| panic!("no history record of rank 1 of job {}:\n{h}", job.id));
    assert!(rec.to_string().contains("stalled"), "{rec}");
}

/// The vigils of this job (`vigil up --multi-node` with this test's server command) and their node.
fn vigils_of(dir: &Path) -> Vec<(i32, String)> {
    let needle = dir.to_string_lossy().into_owned();
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else { continue };
        let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else { continue };
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if !(cmd.contains("vigil up --multi-node") && cmd.contains(&needle)) || cmd.starts_with("srun") {
            continue;
        }
        let env = std::fs::read(e.path().join("environ")).unwrap_or_default();
        let node = env
            .split(|b| *b == 0)
            .find_map(|kv| kv.strip_prefix(b"SLURMD_NODENAME="))
            .map(|n| String::from_utf8_lossy(n).into_owned());
        if let Some(n) = node {
            v.push((pid, n));
        }
    }
    v
}

/// Rank 1's vigil is lost after ready (SIGKILL). The vigil is that node's task, and Slurm ends a node's part
/// of the step with its last task, the server included (seen here with a head that did not end the step:
/// that server stopped answering within 2 s): the server as a whole
/// cannot serve, so the head decides unreachable and, that rank unable to confirm a stop, ends the step
/// itself (`scancel JOB.STEP`). Nothing is left running.
#[test]
fn e2e_slurm_vigil_lost_after_ready_the_head_ends_the_step() {
    let Some((e, conf, d)) = two_nodes("slurm-lost-ready", Second::Good) else { return };
    let mut job = Job::submit(&d, &conf, &server_cmd(&e, &d), "step", "--json --no-check");
    assert!(job.wait_for("serving on all 2 ranks", T), "not ready:\n{}", job.text());
    let ports = server_ports(&job);
    assert!(ports.iter().all(|p| completes(*p)), "both serve before");
    kill_rank1_vigil(&d, &mut job);
    let ev = job.events();
    let text = job.text();
    assert!(said(&ev, 0, "vigil on n2 went away"), "the head saw rank 1's vigil go:\n{text}");
    head_ended_the_step(&ev, &job, &d);
}

/// SIGKILL of rank 1's vigil (on n2), then the job's end.
fn kill_rank1_vigil(d: &TempDir, job: &mut Job) {
    let vs = vigils_of(&d.0);
    let (pid, _) = vs.iter().find(|(_, n)| n == "n2").unwrap_or_else(|| panic!("rank 1's vigil: {vs:?}"));
    signal(*pid, libc::SIGKILL);
    job.wait_end();
}

/// The head ended the step itself (`scancel JOB.0`), Slurm says the step was cancelled, nothing is left.
fn head_ended_the_step(ev: &[serde_json::Value], job: &Job, d: &TempDir) {
    let text = job.text();
    assert!(said(ev, 0, &format!("ending Slurm step {}.0 (scancel)", job.id)), "{text}");
    // Slurm's word that the step was cancelled: srun's, and slurmstepd's when a task was still running
    let cancelled =
        text.contains("srun: Job step aborted") || text.contains(&format!("STEP {}.0 ON n1 CANCELLED", job.id));
    assert!(cancelled, "Slurm ended the step:\n{text}");
    job.final_state();
    assert!(left_in(&d.0).is_empty(), "left running: {:?}", left_in(&d.0));
}

/// The servers' ports, from the launches the job's output names (`--port PREFIX{node_rank}`).
fn server_ports(job: &Job) -> Vec<u16> {
    let ev = job.events();
    let mut v: Vec<u16> = ev
        .iter()
        .filter(|x| x["event"] == "start")
        .filter_map(|x| x["url"].as_str()?.rsplit(':').next()?.split('/').next()?.parse().ok())
        .collect();
    v.sort();
    v.dedup();
    assert_eq!(v.len(), 2, "two servers: {v:?}");
    v
}

/// One real completion from the llama-server on `port` (bounded).
fn completes(port: u16) -> bool {
    let mut c = Command::new("timeout");
    c.args(["20", "python3", "-c"]).arg(format!(
        "import json,urllib.request as u;r=u.urlopen(u.Request('http://127.0.0.1:{port}/completion',data=json.dumps({{'prompt':'hi','n_predict':2}}).encode(),headers={{'Content-Type':'application/json'}}),timeout=15);print(json.load(r)['content'] is not None)"
    ));
    let o = run_bounded(c, Duration::from_secs(30));
    String::from_utf8_lossy(&o.stdout).trim() == "True"
}

/// Rank 1's vigil is lost while its server starts (SIGKILL in weight loading, the model on storage that
/// never answers): no verdict can come from that rank, so the head decides unreachable (12); that rank
/// cannot confirm a stop, so the head ends the step itself (`scancel JOB.STEP`), and Slurm's end of the
/// step takes the orphaned server: nothing is left running.
#[test]
fn e2e_slurm_vigil_lost_while_starting_the_head_ends_the_step() {
    let Some((e, conf, d)) = two_nodes("slurm-lost-start", Second::Stuck) else { return };
    let mut job = Job::submit(&d, &conf, &server_cmd(&e, &d), "step", "--json --no-check");
    // the events: rank 1 reported in at the head, and reports its weights phase (its server blocks opening
    // the model)
    assert!(job.wait_for("rank 1 (n2) reported in", T), "{}", job.text());
    assert!(job.wait_for("\"host\":\"n2\",\"phase\":\"weights\"", T), "{}", job.text());
    kill_rank1_vigil(&d, &mut job);
    let ev = job.events();
    let text = job.text();
    let m = ev.iter().find(|v| v["event"] == "multi_node_verdict").unwrap_or_else(|| panic!("{text}"));
    assert_eq!((m["verdict"].as_str(), m["decided_by"]["rank"].as_u64()), (Some("unreachable"), Some(1)), "{m}");
    head_ended_the_step(&ev, &job, &d);
}
