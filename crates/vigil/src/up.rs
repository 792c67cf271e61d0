//! `vigil up`, `down`, `status`, `logs`, `restart`, `ps`: the whole life of a server.

use crate::cli::CliError;
use crate::exit;
use crate::follow::{arg_value, cmdline};
use crate::procs;
use crate::report::{out_line, Reporter};
use crate::run::{self, RunRecord, Secrets, State, StopRequest};
use crate::wait;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use vigil_core::judge::fmt_ms;
use vigil_core::policy::OnStall;
use vigil_core::{Profiles, Verdict};

pub struct UpArgs {
    pub name: Option<String>,
    pub detach: bool,
    pub keep: bool,
    pub replace: bool,
    pub env: Vec<String>,
    pub env_file: Option<PathBuf>,
    pub server: Option<String>,
    pub grace: Duration,
    pub timeout: Duration,
    pub stall: Vec<crate::cli::Stall>,
    pub json: bool,
    pub quiet: bool,
    pub log_max_bytes: u64,
    pub log_keep: u32,
    pub no_probe: bool,
    pub no_check: bool,
    /// Proof and watch settings for the watch after launch.
    pub proof: wait::Args,
    pub cmd: Vec<String>,
}

pub fn parse_env_file(p: &Path) -> Result<Vec<(String, String)>, CliError> {
    let text = std::fs::read_to_string(p).map_err(|e| CliError::usage(format!("--env-file {}: {e}", p.display())))?;
    let mut v = Vec::new();
    for (i, l) in text.lines().enumerate() {
        let l = l.trim();
        if l.is_empty() || l.starts_with('#') {
            continue;
        }
        let l = l.strip_prefix("export ").unwrap_or(l);
        let (k, val) = l
            .split_once('=')
            .ok_or_else(|| CliError::usage(format!("--env-file {}:{}: expected KEY=VALUE", p.display(), i + 1)))?;
        let val = val.trim();
        let val = val.strip_prefix('"').and_then(|x| x.strip_suffix('"')).unwrap_or(val);
        v.push((k.trim().to_string(), val.to_string()));
    }
    Ok(v)
}

/// `--env-file` then `--env K=V` (later wins), set on top of `env`.
pub fn apply_env_flags(env: &mut Vec<(String, String)>, a: &UpArgs) -> Result<(), CliError> {
    if let Some(f) = &a.env_file {
        for (k, v) in parse_env_file(f)? {
            set_env(env, &k, &v);
        }
    }
    for kv in &a.env {
        let (k, v) = kv.split_once('=').ok_or_else(|| CliError::usage(format!("--env {kv}: expected KEY=VALUE")))?;
        set_env(env, k, v);
    }
    Ok(())
}

/// How a server ended: "killed by SIGKILL", "exited with status 1", else "exited".
pub fn exit_how(code: Option<i32>, signal: Option<i32>) -> String {
    match (code, signal) {
        (_, Some(s)) => format!("killed by {}", vigil_core::judge::signal_name(s)),
        (Some(c), _) => format!("exited with status {c}"),
        _ => "exited".into(),
    }
}

/// A run's state for `status`: the last verdict vigil reached for it (`recorded`, from its
/// verdict.json) wins over what the log alone says (`from_log`: a stalled or unhealthy server's log
/// looks like a ready or starting one). Alive: that verdict ("starting", "ready", "stalled", …); ended:
/// how ("exited (SIGKILL)", "exited (1)", "not running"), after a bad verdict named first
/// ("crashed (SIGKILL)", "stalled (exited 0)").
pub fn run_state(
    alive: bool,
    recorded: Option<Verdict>,
    from_log: Verdict,
    code: Option<i32>,
    signal: Option<i32>,
) -> String {
    let verdict = recorded.unwrap_or(from_log);
    if alive {
        return verdict.as_str().to_string();
    }
    let how = match (code, signal) {
        (_, Some(s)) => vigil_core::judge::signal_name(s),
        (Some(c), _) => format!("{c}"),
        _ => return "not running".into(),
    };
    match recorded {
        Some(v @ (Verdict::Crashed | Verdict::Stalled | Verdict::Timeout | Verdict::Unhealthy)) => {
            format!("{} (exited {how})", v.as_str())
        }
        _ => format!("exited ({how})"),
    }
}

fn set_env(env: &mut Vec<(String, String)>, k: &str, v: &str) {
    match env.iter_mut().find(|(ek, _)| ek == k) {
        Some(e) => e.1 = v.to_string(),
        None => env.push((k.to_string(), v.to_string())),
    }
}

/// Live processes of a run: keeper, server and every descendant of the keeper.
pub fn run_pids(st: &State) -> Vec<i32> {
    let mut v = Vec::new();
    if st.keeper_pid > 0 && procs::alive(st.keeper_pid) {
        v.push(st.keeper_pid);
        v.extend(procs::descendants(st.keeper_pid));
    }
    if let Some(s) = st.server_pid {
        if procs::alive(s) && !v.contains(&s) {
            v.push(s);
            v.extend(procs::descendants(s));
        }
    }
    v
}

fn read_state(dir: &Path) -> Option<State> {
    run::read_json(&dir.join("state.json"))
}

pub async fn up(a: UpArgs, profiles: Profiles) -> Result<i32, CliError> {
    if a.cmd.is_empty() {
        return Err(CliError::usage(
            "up: give the server command after --, e.g. vigil up -- llama-server -m model.gguf",
        ));
    }
    let kind = a.server.clone().or_else(|| profiles.detect_cmd(&a.cmd).map(String::from));
    let name = match &a.name {
        Some(n) => n.clone(),
        None => kind.clone().unwrap_or_else(|| {
            Path::new(&a.cmd[0])
                .file_name()
                .map(|f| f.to_string_lossy().into_owned())
                .unwrap_or_else(|| "server".into())
        }),
    };
    let mut env: Vec<(String, String)> = std::env::vars_os()
        .map(|(k, v)| (k.to_string_lossy().into_owned(), v.to_string_lossy().into_owned()))
        .collect();
    // systemd's NOTIFY_SOCKET/WATCHDOG_* are addressed to vigil: never to the server or the run record
    // (an explicit --env still sets them).
    env.retain(|(k, _)| !crate::notify::NOTIFY_VARS.contains(&k.as_str()));
    apply_env_flags(&mut env, &a)?;
    let cwd = std::env::current_dir().map_err(|e| CliError::usage(format!("current directory: {e}")))?;
    launch(&name, a.cmd.clone(), env, cwd, kind, &a, profiles).await
}

async fn launch(
    name: &str,
    argv: Vec<String>,
    env: Vec<(String, String)>,
    cwd: PathBuf,
    kind: Option<String>,
    a: &UpArgs,
    profiles: Profiles,
) -> Result<i32, CliError> {
    let dir = run::run_dir(name)?;
    let mut rep = Reporter::new(a.json, a.quiet);
    // An earlier run with this name still alive?
    if let Some(st) = read_state(&dir) {
        let live = run_pids(&st);
        if !live.is_empty() {
            if !a.replace {
                return Err(CliError::usage(format!(
                    "run '{name}' is still alive (pids {}): stop it with `vigil down {name}`, or pass --replace",
                    join_pids(&live)
                )));
            }
            let r = stop_run(&dir, &st, a.grace, &mut rep)?;
            if !r.is_empty() {
                return Err(CliError::usage(format!(
                    "--replace: could not stop the earlier run (survivors: {})",
                    join_pids(&r)
                )));
            }
        }
    }
    let profile = kind.as_ref().and_then(|k| profiles.get(k)).cloned();
    let port = arg_value(&argv, "--port")
        .and_then(|p| p.parse::<u16>().ok())
        .or(profile.as_ref().map(|p| p.port))
        .filter(|_| !a.no_probe);
    if let Some(p) = port {
        if !procs::port_free(p) {
            let holder = procs::port_holder_text(p);
            rep.note(0, &format!("refused: port {p} is taken by {holder}"));
            eprintln!("vigil: error: port {p} is taken by {holder}; not launching");
            return Ok(exit::REFUSED);
        }
    }
    if !a.no_check {
        let rep = crate::check::check(
            &crate::check::Inputs {
                argv: &argv,
                server: kind.clone(),
                env: &env,
                cwd: &cwd,
                local_machine: true,
                version: None,
            },
            &profiles,
        )?;
        if let Some(why) = crate::check::gate(&rep, a.json, "") {
            eprintln!("vigil: error: {why}");
            return Ok(exit::CHECK_FAILED);
        }
    }
    run::mkdir_private(&dir)?;
    for f in ["state.json", "events.jsonl", "stop.json", "startup.json", "verdict.json"] {
        let _ = std::fs::remove_file(dir.join(f));
    }
    let log = dir.join("server.log");
    // the earlier run's log and every rotated copy of it, whatever its --log-keep was
    if let Ok(rd) = std::fs::read_dir(&dir) {
        for e in rd.flatten().filter(|e| e.file_name().to_string_lossy().starts_with("server.log")) {
            let _ = std::fs::remove_file(e.path());
        }
    }
    let (argv_red, env_red, secrets) = run::redact(&argv, &env);
    for v in run::secret_values(&secrets) {
        rep.add_secret(&v);
    }
    let rec = RunRecord {
        name: name.to_string(),
        argv: argv_red,
        cwd: cwd.display().to_string(),
        env: env_red,
        server: kind.clone(),
        port,
        log: log.display().to_string(),
        log_max_bytes: a.log_max_bytes,
        log_keep: a.log_keep.max(1),
        created_unix_ms: run::now_ms(),
    };
    let sp = run::secrets_path(name)?;
    if secrets.argv.is_empty() && secrets.env.is_empty() {
        let _ = std::fs::remove_file(&sp);
    } else {
        run::mkdir_private(sp.parent().unwrap())?;
        run::write_json(&sp, &secrets)?;
    }
    run::write_json(&dir.join("run.json"), &rec)?;
    if crate::take_interrupt() {
        rep.note(0, "interrupted before the launch: nothing started");
        return Ok(exit::INTERRUPTED);
    }
    spawn_keeper(&dir)?;
    // The keeper writes state.json once the server runs (or could not start).
    let t0 = Instant::now();
    let st = loop {
        if let Some(st) = read_state(&dir) {
            if let Some(e) = st.spawn_error {
                return Err(CliError::usage(e));
            }
            if st.server_pid.is_some() {
                break st;
            }
        }
        if t0.elapsed() > Duration::from_secs(10) {
            return Err(CliError::Internal("the keeper did not start the server within 10 s".into()));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let server_pid = st.server_pid.unwrap();
    if rep.mode == crate::report::Mode::Json {
        rep.json(serde_json::json!({"event": "launched", "t_ms": 0, "name": name, "pid": server_pid, "keeper_pid": st.keeper_pid, "run_dir": dir.display().to_string()}));
    } else {
        rep.note(
            0,
            &format!("launched '{name}': server pid {server_pid}, keeper pid {}, log {}", st.keeper_pid, log.display()),
        );
    }
    let out = watch(&dir, &rec, server_pid, a, profiles.clone()).await?;
    if let Some(r) = &out.report {
        let _ = run::write_json(&dir.join("startup.json"), r);
    }
    if out.interrupted {
        if a.keep {
            rep.note(0, &format!("--keep: '{name}' keeps running; stop it with `vigil down {name}`"));
            return Ok(out.code);
        }
        let st = read_state(&dir).unwrap_or(st);
        let surv = stop_run(&dir, &st, a.grace, &mut rep)?;
        // SIGTERM after ready is an orderly stop (exit 0); before a verdict it stays 130
        return Ok(if surv.is_empty() { out.code } else { exit::NOT_STOPPED });
    }
    if a.detach || watching(a) || out.report.as_ref().is_none_or(|r| r.verdict != Verdict::Ready) {
        return Ok(out.code);
    }
    // Foreground after ready: stay until the server ends or Ctrl-C stops it.
    rep.note(0, &format!("'{name}' is serving; Ctrl-C stops it (--detach to leave it running)"));
    loop {
        tokio::select! {
            _ = crate::next_interrupt() => break,
            _ = tokio::time::sleep(Duration::from_millis(100)) => {
                if !procs::alive(server_pid) {
                    let st = read_state(&dir).unwrap_or_default();
                    rep.note(0, &format!("the server {} after ready", exit_how(st.exit_code, st.exit_signal)));
                    return Ok(exit::CRASHED);
                }
            }
        }
    }
    let st = read_state(&dir).unwrap_or(st);
    let surv = stop_run(&dir, &st, a.grace, &mut rep)?;
    Ok(if surv.is_empty() { exit::READY } else { exit::NOT_STOPPED })
}

/// `up` keeps watching after ready with `--watch`, and in the foreground with `--metrics` (the values
/// come from the watch: without it they would freeze at ready).
fn watching(a: &UpArgs) -> bool {
    a.proof.watch || (a.proof.metrics.is_some() && !a.detach)
}

fn spawn_keeper(dir: &Path) -> Result<(), CliError> {
    let exe = std::env::current_exe().map_err(|e| CliError::Internal(format!("own path: {e}")))?;
    let mut c = std::process::Command::new(exe);
    c.arg("__keeper").arg(dir);
    for k in crate::notify::NOTIFY_VARS {
        c.env_remove(k);
    }
    c.stdin(std::process::Stdio::null()).stdout(std::process::Stdio::null());
    use std::os::unix::fs::OpenOptionsExt;
    let errlog = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(dir.join("keeper.err"))
        .map_err(|e| CliError::usage(format!("cannot write {}: {e}", dir.display())))?;
    c.stderr(errlog);
    // SAFETY: setsid between fork and exec: a new session, detached from our terminal.
    unsafe {
        c.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = c.spawn().map_err(|e| CliError::Internal(format!("cannot start the keeper: {e}")))?;
    // The keeper is reaped by a thread so it does not linger as our zombie.
    std::thread::spawn(move || {
        let _ = child.wait();
    });
    Ok(())
}

async fn watch(
    dir: &Path,
    rec: &RunRecord,
    pid: i32,
    a: &UpArgs,
    profiles: Profiles,
) -> Result<wait::Outcome, CliError> {
    let mut w = a.proof.clone();
    w.watch = watching(a);
    w.pid = Some(pid);
    w.timeout = a.timeout;
    w.stall = a.stall.clone();
    w.json = a.json;
    w.quiet = a.quiet;
    // issue #17: a server vigil launched is stopped when stuck, unless --keep or --on-stall keep
    w.on_stall = Some(w.on_stall.unwrap_or(if a.keep { OnStall::Keep } else { OnStall::Stop }));
    w.stop_grace = a.grace;
    w.attach_run(dir, rec, &profiles, !a.no_probe);
    wait::run(w, profiles).await
}

fn join_pids(v: &[i32]) -> String {
    v.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(", ")
}

/// Stops a run through its keeper (or directly when the keeper is gone) and waits until every
/// process of it is gone. Returns the survivors (empty on success).
pub fn stop_run(dir: &Path, st: &State, grace: Duration, rep: &mut Reporter) -> Result<Vec<i32>, CliError> {
    let before = run_pids(st);
    if before.is_empty() {
        return Ok(vec![]);
    }
    let t0 = Instant::now();
    let gpu_before = st.server_pid.and_then(|s| crate::gpu::before_stop(s, &before));
    run::write_json(&dir.join("stop.json"), &StopRequest { grace_ms: grace.as_millis() as u64 })?;
    let keeper_alive = st.keeper_pid > 0 && procs::alive(st.keeper_pid);
    if keeper_alive {
        procs::signal(st.keeper_pid, libc::SIGTERM);
    } else if let Some(s) = st.server_pid {
        let r = procs::stop_tree(s, true, grace, &mut |sig, pids| {
            run::append_event(
                dir,
                serde_json::json!({"event": "signal", "signal": sig, "pids": pids, "t_unix_ms": run::now_ms()}),
            );
        });
        run::append_event(dir, serde_json::json!({"event": "stopped", "t_unix_ms": run::now_ms(), "report": r}));
    }
    // Wait until every process is gone: grace + time for SIGKILL to land. A second Ctrl-C kills at once.
    let deadline = t0 + grace + Duration::from_secs(10);
    let mut killed_now = false;
    loop {
        let live: Vec<i32> = before.iter().copied().filter(|p| procs::alive(*p)).chain(run_pids(st)).collect();
        if live.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            let mut live = live;
            live.sort();
            live.dedup();
            for p in &live {
                let cmd = cmdline(*p).map(|c| c.join(" ")).unwrap_or_default();
                rep.note(t0.elapsed().as_millis() as u64, &format!("still alive: pid {p} {}", rep.redact(&cmd)));
            }
            return Ok(live);
        }
        if !killed_now && crate::take_interrupt() {
            killed_now = true;
            if keeper_alive {
                procs::signal(st.keeper_pid, libc::SIGUSR1);
            }
            rep.note(t0.elapsed().as_millis() as u64, "second interrupt: killing at once");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    for e in run::read_events(dir) {
        if e["event"] == "signal" {
            rep.note(
                t0.elapsed().as_millis() as u64,
                &format!("sent {} to pids {}", e["signal"].as_str().unwrap_or("?"), e["pids"]),
            );
        }
    }
    rep.note(
        t0.elapsed().as_millis() as u64,
        &format!("stopped {} process(es) in {}; none left", before.len(), fmt_ms(t0.elapsed().as_millis() as u64)),
    );
    Ok(gpu_release(gpu_before, rep, t0))
}

/// After a stop: prove the tree's GPU memory is released, or name who still holds it.
fn gpu_release(b: Option<crate::gpu::Before>, rep: &mut Reporter, t0: Instant) -> Vec<i32> {
    let t = || t0.elapsed().as_millis() as u64;
    let Some(b) = b else {
        if crate::gpu::Reader::open().is_err() {
            rep.note(t(), "GPU release not checked: no NVML and no nvidia-smi");
        }
        return vec![];
    };
    if b.held.total_mib == 0 {
        rep.note(t(), "the tree held no GPU memory");
        return vec![];
    }
    let left = crate::gpu::wait_released(&b, Duration::from_secs(30));
    if left.is_empty() {
        rep.note(
            t(),
            &format!(
                "GPU memory released: {} no longer held (proven by {})",
                crate::gpu::describe(&b.held.per_gpu),
                b.reader.name()
            ),
        );
        return vec![];
    }
    for h in &left {
        rep.note(
            t(),
            &format!(
                "GPU memory NOT released: pid {} ({}) holds {} MiB on GPU {}{}",
                h.pid,
                rep.redact(&h.cmd),
                h.used_mib,
                h.gpu,
                if h.escaped { "; it started after the server and left its process tree" } else { "" }
            ),
        );
    }
    left.iter().map(|h| h.pid).collect()
}

pub fn down(names: Vec<String>, all: bool, pid: Option<i32>, grace: Duration, json: bool) -> Result<i32, CliError> {
    let mut rep = Reporter::new(json, false);
    if let Some(p) = pid {
        if !procs::alive(p) {
            return Err(CliError::usage(format!("--pid {p}: no such live process")));
        }
        let t0 = Instant::now();
        let mut tree = vec![p];
        tree.extend(procs::descendants(p));
        let gpu_before = crate::gpu::before_stop(p, &tree);
        let r = procs::stop_tree(p, true, grace, &mut |sig, pids| {
            rep.note(0, &format!("sent {sig} to pids {}", join_pids(pids)))
        });
        if rep.mode == crate::report::Mode::Json {
            rep.json(serde_json::json!({"event": "stopped", "pid": p, "report": r}));
        }
        for s in &r.survivors {
            rep.note(r.elapsed_ms, &format!("still alive: pid {} {}", s.pid, rep.redact(&s.cmd)));
        }
        if r.survivors.is_empty() {
            rep.note(
                r.elapsed_ms,
                &format!("stopped pid {p} and {} other process(es); none left", r.stopped.len().saturating_sub(1)),
            );
        }
        let gpu_left = gpu_release(gpu_before, &mut rep, t0);
        return Ok(if r.survivors.is_empty() && gpu_left.is_empty() { exit::READY } else { exit::NOT_STOPPED });
    }
    let names = if all { run::list_runs()? } else { names };
    if names.is_empty() {
        return Err(CliError::usage("down: give a run name, --all or --pid PID"));
    }
    let mut code = exit::READY;
    for n in names {
        let (dir, _) = run::load(&n)?;
        let st = read_state(&dir).unwrap_or_default();
        if run_pids(&st).is_empty() {
            rep.note(0, &format!("'{n}': nothing running"));
            continue;
        }
        let surv = stop_run(&dir, &st, grace, &mut rep)?;
        if !surv.is_empty() {
            code = exit::NOT_STOPPED;
        }
    }
    Ok(code)
}

/// What `status` reads of a run's verdict.json (the report of the last verdict vigil reached).
#[derive(serde::Deserialize)]
struct Recorded {
    verdict: Verdict,
}

#[derive(serde::Serialize)]
struct StatusRow {
    name: String,
    server: Option<String>,
    state: String,
    phase: String,
    in_state: Option<String>,
    port: Option<u16>,
    pid: Option<i32>,
    keeper_pid: i32,
    last_log_line_age_s: Option<u64>,
}

pub fn status(json: bool, profiles: &Profiles) -> Result<i32, CliError> {
    let mut rows = Vec::new();
    for n in run::list_runs()? {
        let (dir, rec) = run::load(&n)?;
        let st = read_state(&dir).unwrap_or_default();
        let alive = st.server_pid.is_some_and(procs::alive);
        let log_text = std::fs::read(&rec.log).unwrap_or_default();
        let report = vigil_core::diagnose_text(profiles, rec.server.as_deref(), &String::from_utf8_lossy(&log_text));
        let recorded: Option<Recorded> = run::read_json(&dir.join("verdict.json"));
        let state =
            run_state(alive, recorded.as_ref().map(|r| r.verdict), report.verdict, st.exit_code, st.exit_signal);
        let since = if alive { st.started_unix_ms } else { st.ended_unix_ms.unwrap_or(st.started_unix_ms) };
        let age = std::fs::metadata(&rec.log)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .map(|d| d.as_secs());
        rows.push(StatusRow {
            name: n,
            server: rec.server.clone(),
            state,
            phase: report.phase.to_string(),
            in_state: (since > 0).then(|| fmt_ms(run::now_ms().saturating_sub(since))),
            port: rec.port,
            pid: st.server_pid,
            keeper_pid: st.keeper_pid,
            last_log_line_age_s: age,
        });
    }
    if json {
        out_line(&serde_json::to_string(&rows).unwrap_or_default());
    } else if rows.is_empty() {
        out_line("no runs");
    } else {
        out_line(&format!(
            "{:<16} {:<10} {:<14} {:<12} {:>8} {:>6} {:>8} {:>9}",
            "NAME", "SERVER", "STATE", "PHASE", "FOR", "PORT", "PID", "LOG AGE"
        ));
        for r in rows {
            out_line(&format!(
                "{:<16} {:<10} {:<14} {:<12} {:>8} {:>6} {:>8} {:>9}",
                r.name,
                r.server.unwrap_or_else(|| "-".into()),
                r.state,
                r.phase,
                r.in_state.unwrap_or_else(|| "-".into()),
                r.port.map_or("-".into(), |p| p.to_string()),
                r.pid.map_or("-".into(), |p| p.to_string()),
                r.last_log_line_age_s.map_or("-".into(), |a| format!("{a}s")),
            ));
        }
    }
    Ok(exit::READY)
}

pub fn logs(name: &str, follow: bool, n: usize) -> Result<i32, CliError> {
    let (_, rec) = run::load(name)?;
    let redactor = run::Redactor::for_run(name, None);
    let redact = |s: &str| redactor.redact(s);
    let path = PathBuf::from(&rec.log);
    let data = std::fs::read(&path).unwrap_or_default();
    let text = String::from_utf8_lossy(&data);
    let lines: Vec<&str> = text.lines().collect();
    for l in &lines[lines.len().saturating_sub(n)..] {
        out_line(&redact(l));
    }
    if !follow {
        return Ok(exit::READY);
    }
    use std::io::{Read, Seek, SeekFrom};
    use std::os::unix::fs::MetadataExt;
    let mut f = std::fs::File::open(&path).map_err(|e| CliError::usage(format!("{}: {e}", path.display())))?;
    let mut ino = f.metadata().map(|m| m.ino()).unwrap_or(0);
    let mut pos = data.len() as u64;
    let _ = f.seek(SeekFrom::Start(pos));
    let mut split = crate::lines::Splitter::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let k = f.read(&mut buf).unwrap_or(0);
        if k > 0 {
            pos += k as u64;
            split.push(&buf[..k], &mut |l| out_line(&redact(&l)));
            continue;
        }
        if let Ok(m) = std::fs::metadata(&path) {
            if m.ino() != ino || m.len() < pos {
                if let Ok(nf) = std::fs::File::open(&path) {
                    f = nf;
                    ino = m.ino();
                    pos = 0;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

pub async fn restart(name: &str, a: UpArgs, profiles: Profiles) -> Result<i32, CliError> {
    let (dir, rec) = run::load(name)?;
    let secrets: Secrets = run::stored_secrets(name, None);
    let (argv, mut env) = run::unredact(&rec, &secrets);
    // records written before vigil kept systemd's variables out still hold them: never replay them
    env.retain(|(k, _)| !crate::notify::NOTIFY_VARS.contains(&k.as_str()));
    let mut rep = Reporter::new(a.json, a.quiet);
    if let Some(st) = read_state(&dir) {
        let surv = stop_run(&dir, &st, a.grace, &mut rep)?;
        if !surv.is_empty() {
            return Ok(exit::NOT_STOPPED);
        }
    }
    let a = UpArgs { detach: true, replace: true, ..a };
    let n = run::restarts(&dir) + 1;
    run::write_atomic(&dir.join("restarts"), n.to_string().as_bytes())?;
    launch(name, argv, env, PathBuf::from(&rec.cwd), rec.server.clone(), &a, profiles).await
}

#[derive(serde::Serialize)]
struct PsRow {
    pid: i32,
    server: String,
    age_s: Option<u64>,
    ports: Vec<u16>,
    /// GPU memory held by the process tree (MiB), when GPU readings exist.
    gpu_mib: Option<u64>,
    cmd: String,
}

/// Inference servers on this machine that vigil did not start.
pub fn ps(json: bool) -> Result<i32, CliError> {
    let pats: Vec<(String, regex::Regex)> =
        procs::SERVER_PATTERNS.iter().map(|(k, p)| (k.to_string(), regex::Regex::new(p).unwrap())).collect();
    let all = procs::all_procs();
    let keepers: Vec<i32> = all
        .iter()
        .filter(|p| cmdline(p.pid).is_some_and(|c| c.iter().any(|a| a == "__keeper")))
        .map(|p| p.pid)
        .collect();
    let ours: std::collections::BTreeSet<i32> = keepers.iter().flat_map(|k| procs::descendants(*k)).collect();
    let mut matched: Vec<(i32, i32, String, String)> = Vec::new(); // pid, ppid, kind, cmd
    for p in &all {
        if p.state == 'Z' || ours.contains(&p.pid) || p.pid == std::process::id() as i32 {
            continue;
        }
        let cmd = cmdline(p.pid).map(|c| c.join(" ")).unwrap_or_else(|| p.comm.clone());
        if let Some((k, _)) = pats.iter().find(|(_, r)| r.is_match(&cmd) || r.is_match(&p.comm)) {
            matched.push((p.pid, p.ppid, k.clone(), cmd));
        }
    }
    let pids: std::collections::BTreeSet<i32> = matched.iter().map(|m| m.0).collect();
    let gpu = crate::gpu::Reader::open().and_then(|r| r.sample()).ok();
    let mut rows = Vec::new();
    for (pid, ppid, kind, cmd) in matched {
        if pids.contains(&ppid) {
            continue; // shown with its parent
        }
        let mut ports = procs::ports_of(pid);
        for d in procs::descendants(pid) {
            ports.extend(procs::ports_of(d));
        }
        ports.sort();
        ports.dedup();
        let gpu_mib = gpu.as_ref().map(|s| {
            let mut tree: std::collections::BTreeSet<i32> = procs::descendants(pid).into_iter().collect();
            tree.insert(pid);
            crate::gpu::held_by(s, &tree, &procs::exists).total_mib
        });
        rows.push(PsRow {
            pid,
            server: kind,
            age_s: procs::read_proc(pid).as_ref().and_then(procs::age_secs),
            ports,
            gpu_mib,
            cmd: run::redact_cmdline(&cmd),
        });
    }
    if json {
        out_line(&serde_json::to_string(&rows).unwrap_or_default());
    } else if rows.is_empty() {
        out_line("no inference servers found that vigil did not start");
    } else {
        out_line(&format!("{:>8} {:<10} {:>8} {:<12} {:>9} CMD", "PID", "SERVER", "AGE", "PORTS", "GPU MiB"));
        for r in rows {
            let ports = r.ports.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(",");
            out_line(&format!(
                "{:>8} {:<10} {:>8} {:<12} {:>9} {}",
                r.pid,
                r.server,
                r.age_s.map_or("-".into(), |a| fmt_ms(a * 1000)),
                if ports.is_empty() { "-".into() } else { ports },
                r.gpu_mib.map_or("-".into(), |m| m.to_string()),
                r.cmd
            ));
        }
    }
    Ok(exit::READY)
}
