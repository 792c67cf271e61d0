//! `vigil up`, `down`, `status`, `logs`, `restart`, `ps`: the whole life of a server.

use crate::error::CliError;
use crate::exit::Exit;
use crate::node::run::{self, RunRecord, State, StopRequest};
use crate::sinks::events::{RunEvent, Typed, WatchEvent};
use crate::sinks::report::Reporter;
use crate::sources::follow::{arg_value, cmdline};
use crate::sources::procs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use vigil_core::judge::fmt_ms;
use vigil_core::{Profiles, Verdict};

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
pub fn apply_env_flags(env: &mut Vec<(String, String)>, a: &crate::node::LaunchSettings) -> Result<(), CliError> {
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

/// What the `stopped` event says of an orderly end (`requested`: `vigil down` asked for it), after ready or
/// (`before`: the phase it was in) during the start.
pub fn stopped_how(x: &vigil_core::judge::ExitInfo, requested: bool, before: Option<vigil_core::Phase>) -> String {
    let by = if requested { " (stopped by vigil down)" } else { "" };
    match before {
        Some(p) => format!("the server {} before ready, in {p}{by}", exit_how(x.code, x.signal)),
        None => format!("the server {} after ready{by}", exit_how(x.code, x.signal)),
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

/// A run as this machine shows it now, found from its keeper and never from a pid a file names alone.
#[derive(Debug, Default)]
pub struct RunNow {
    /// The keeper, checked: alive as the very process that was launched (pid, start time, boot id) and
    /// running as this run's keeper (`vigil __keeper RUN_DIR`).
    pub keeper: Option<procs::ProcId>,
    /// Every live process of the run: the keeper and its descendants; with the keeper gone, the processes
    /// that carry the run's mark (`VIGIL_RUN_DIR` in their environment).
    pub pids: Vec<i32>,
    /// The server's root process, when it is among them.
    pub server: Option<i32>,
    /// What `state.json` says, when it can be read.
    pub state: Option<State>,
    /// Why `state.json` cannot be read, when it exists and cannot.
    pub state_err: Option<String>,
}

impl RunNow {
    /// The keeper is gone and processes of the run live on: their output reaches no log any more.
    pub fn keeper_died(&self) -> bool {
        self.keeper.is_none() && !self.pids.is_empty()
    }
}

/// The environment mark of a run's processes: the keeper gives the server `VIGIL_RUN=NAME` and
/// `VIGIL_RUN_DIR=RUN_DIR` (the folder tells runs of one name under two state folders apart).
pub const MARK: &str = "VIGIL_RUN_DIR";

/// Is `pid` the keeper of the run in `dir` (a process of ours whose command line is `vigil __keeper DIR`)?
fn keeper_of(pid: i32, dir: &Path) -> bool {
    cmdline(pid).is_some_and(|c| c.len() >= 3 && c[1] == "__keeper" && Path::new(&c[2]) == dir) && procs::ours(pid)
}

/// The run in `dir` now: its keeper (the identity `state.json` recorded, checked; else, when the run's lock
/// is held or the state unreadable, found among the processes by its command line), its processes.
pub fn find_run(dir: &Path) -> RunNow {
    let (state, state_err) = match run::read_json_checked::<State>(&dir.join("state.json")) {
        Ok(s) => (s, None),
        Err(e) => (None, Some(e)),
    };
    let recorded = state
        .as_ref()
        .and_then(|s| s.keeper.clone().or_else(|| procs::ProcId::of(s.keeper_pid).filter(|_| s.keeper_pid > 0)));
    let mut keeper = recorded.filter(|k| k.is_live() && keeper_of(k.pid, dir));
    if keeper.is_none() && (state.is_none() || run::lock_held(dir)) {
        keeper = procs::all_procs()
            .into_iter()
            .filter(|p| p.state != 'Z' && keeper_of(p.pid, dir))
            .find_map(|p| procs::ProcId::of(p.pid));
    }
    let mut pids = Vec::new();
    if let Some(k) = &keeper {
        pids.push(k.pid);
        pids.extend(procs::descendants(k.pid));
    } else if !state.as_ref().is_some_and(|s| s.keeper_done) {
        pids = procs::marked(MARK, &dir.display().to_string());
    }
    let recorded_server = state.as_ref().and_then(|s| s.server_pid).filter(|p| pids.contains(p));
    let server = recorded_server.or_else(|| match &keeper {
        Some(k) => pids.iter().copied().find(|p| procs::read_proc(*p).is_some_and(|x| x.ppid == k.pid)),
        None => pids.iter().copied().find(|p| procs::read_proc(*p).is_some_and(|x| !pids.contains(&x.ppid))),
    });
    RunNow { keeper, pids, server, state, state_err }
}

/// When the keeper of the run in `dir` was first seen dead with its server alive (ms since the epoch):
/// recorded by the first command that saw it (`keeper-died`), best effort.
pub fn keeper_died_at(dir: &Path) -> u64 {
    let p = dir.join("keeper-died");
    if let Some(t) = std::fs::read_to_string(&p).ok().and_then(|s| s.trim().parse().ok()) {
        return t;
    }
    let t = crate::state::now_ms();
    let _ = run::write_atomic(&p, t.to_string().as_bytes());
    t
}

/// What vigil says of a run whose keeper died while its server lives.
pub fn keeper_died_line(name: &str, at_ms: u64) -> String {
    format!(
        "the keeper of run {name} died at {}: the server lives on but its output after that is lost; `vigil down {name}` stops it",
        at_text(at_ms)
    )
}

/// "2026-12-02 05:42:10 UTC".
fn at_text(at_ms: u64) -> String {
    let t = crate::sinks::history::fmt_time(at_ms);
    match t.strip_suffix(" UTC") {
        Some(hm) => format!("{hm}:{:02} UTC", (at_ms / 1000) % 60),
        None => t,
    }
}

/// Watches the keeper of the run in `dir` while its server `pid` lives: when the keeper dies first (or is
/// already dead when the watch begins), the line that says so goes to `tx` (once).
pub fn watch_keeper(dir: PathBuf, pid: i32, tx: tokio::sync::mpsc::UnboundedSender<String>) {
    tokio::spawn(async move {
        let keeper = tokio::task::spawn_blocking({
            let dir = dir.clone();
            move || find_run(&dir).keeper
        })
        .await
        .ok()
        .flatten();
        let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        while !tx.is_closed() {
            if !keeper.as_ref().is_some_and(|k| k.is_live()) {
                // the keeper ends after the server in order: only a server still alive means it died
                if procs::alive(pid) {
                    let _ = tx.send(keeper_died_line(&name, keeper_died_at(&dir)));
                }
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
}

pub fn read_state(dir: &Path) -> Option<State> {
    run::read_json(&dir.join("state.json"))
}

/// This machine's environment for a server: vigil's own, without systemd's variables (addressed to vigil,
/// never to the server or the run record; an explicit --env still sets them), plus --env-file/--env.
pub fn local_env(a: &crate::node::LaunchSettings) -> Result<Vec<(String, String)>, CliError> {
    let mut env: Vec<(String, String)> = std::env::vars_os()
        .map(|(k, v)| (k.to_string_lossy().into_owned(), v.to_string_lossy().into_owned()))
        .collect();
    env.retain(|(k, _)| !crate::sinks::notify::NOTIFY_VARS.contains(&k.as_str()));
    apply_env_flags(&mut env, a)?;
    Ok(env)
}

/// Launches a server on this machine under its keeper (after the earlier run, port and preflight
/// checks) and returns the watch's settings, or why it refused (exit code, one line).
#[allow(clippy::too_many_arguments)]
pub async fn launch(
    name: &str,
    argv: Vec<String>,
    env: Vec<(String, String)>,
    cwd: PathBuf,
    kind: Option<String>,
    a: &crate::node::LaunchSettings,
    profiles: &Profiles,
    rep: &mut Reporter,
) -> Result<crate::node::Launched, CliError> {
    // One run per name: the name's lock is taken before anything else, and held (by the keeper, once it
    // runs) for the run's life; a second `up` of the name finds it taken.
    let dir = run::runs_dir()?.join(name);
    run::valid_name(name)?;
    crate::state::mkdir_private(&dir)?;
    let deadline = Instant::now() + a.grace + Duration::from_secs(10);
    let lock = loop {
        if let Some(l) = run::NameLock::try_take(&dir)? {
            break l;
        }
        let now = find_run(&dir);
        let holder = match &now.keeper {
            Some(k) => {
                format!("keeper pid {}{}", k.pid, now.server.map(|s| format!(", server pid {s}")).unwrap_or_default())
            }
            None => match run::lock_taker(&dir) {
                Some(p) => format!("vigil pid {p} is starting it"),
                None => "another vigil is starting it".to_string(),
            },
        };
        if !a.replace || now.keeper.is_none() {
            let how = if now.keeper.is_some() { ", or pass --replace" } else { "" };
            return Ok(Err((
                Exit::Refused,
                format!("run '{name}' is already running ({holder}): stop it with `vigil down {name}`{how}"),
            )));
        }
        if Instant::now() > deadline {
            return Ok(Err((Exit::Refused, format!("--replace: run '{name}' still holds its name ({holder})"))));
        }
        let r = stop_run(&dir, a.grace, rep).await?;
        if !r.is_empty() {
            return Ok(Err((
                Exit::NotStopped,
                format!("--replace: could not stop the earlier run (survivors: {})", join_pids(&r)),
            )));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    // An earlier run whose keeper died may have left its server running: never a second one beside it.
    let now = find_run(&dir);
    if !now.pids.is_empty() {
        if !a.replace {
            return Ok(Err((
                Exit::Refused,
                format!(
                    "run '{name}' is still alive without its keeper (pids {}): stop it with `vigil down {name}`, or pass --replace",
                    join_pids(&now.pids)
                ),
            )));
        }
        let r = stop_run(&dir, a.grace, rep).await?;
        if !r.is_empty() {
            return Ok(Err((
                Exit::NotStopped,
                format!("--replace: could not stop the earlier run (survivors: {})", join_pids(&r)),
            )));
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
            return Ok(Err((Exit::Refused, format!("port {p} is taken by {holder}; not launching"))));
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
                state_root: crate::state::state_root().ok(),
            },
            profiles,
        )?;
        if let Some(why) = crate::check::gate(&rep, a.json, "") {
            return Ok(Err((Exit::CheckFailed, why)));
        }
    }
    for f in ["state.json", "events.jsonl", "stop.json", "startup.json", "verdict.json", "keeper-died"] {
        let _ = std::fs::remove_file(dir.join(f));
    }
    let log = dir.join("server.log");
    // the earlier run's log and every rotated copy of it, whatever its --log-keep was
    if let Ok(rd) = std::fs::read_dir(&dir) {
        for e in rd.flatten().filter(|e| e.file_name().to_string_lossy().starts_with("server.log")) {
            let _ = std::fs::remove_file(e.path());
        }
    }
    let (argv_red, env_red, secrets) = crate::sinks::redact::redact(&argv, &env);
    for v in crate::sinks::redact::secret_values(&secrets) {
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
        created_unix_ms: crate::state::now_ms(),
        repairs: a.repairs.clone(),
    };
    let sp = run::secrets_path(name)?;
    if secrets.argv.is_empty() && secrets.env.is_empty() {
        let _ = std::fs::remove_file(&sp);
    } else {
        crate::state::mkdir_private(sp.parent().unwrap())?;
        run::write_json(&sp, &secrets)?;
    }
    run::write_json(&dir.join("run.json"), &rec)?;
    if crate::signals::take_interrupt() {
        return Ok(Err((Exit::Interrupted, "interrupted before the launch: nothing started".into())));
    }
    let keeper = spawn_keeper(&dir, &lock)?;
    // The keeper holds the name's lock now (the descriptor is shared): ours is let go.
    drop(lock);
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
        if keeper.is_finished() {
            return Err(CliError::Internal(format!(
                "the keeper ended before it started the server (see {})",
                dir.join("keeper.err").display()
            )));
        }
        if t0.elapsed() > Duration::from_secs(10) {
            return Err(CliError::Internal("the keeper did not start the server within 10 s".into()));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let server_pid = st.server_pid.unwrap();
    rep.emit(
        Some(0),
        &WatchEvent::Launched {
            name,
            pid: server_pid.into(),
            keeper_pid: st.keeper_pid.into(),
            run_dir: Some(dir.display().to_string()),
            on: None,
            log: Some(log.display().to_string()),
        },
    );
    let mut h = crate::node::RunHandle::of_run(&dir, &rec, profiles, !a.no_probe);
    h.pid = Some(server_pid);
    Ok(Ok(h))
}

/// Starts the keeper of the run in `dir` in its own session, handing it the name's lock (the descriptor is
/// inherited: `VIGIL_KEEPER_LOCK_FD` says which). Returns the thread that reaps it (finished: the keeper ended).
fn spawn_keeper(dir: &Path, lock: &run::NameLock) -> Result<std::thread::JoinHandle<()>, CliError> {
    let exe = std::env::current_exe().map_err(|e| CliError::Internal(format!("own path: {e}")))?;
    let mut c = std::process::Command::new(exe);
    c.arg("__keeper").arg(dir);
    for k in crate::sinks::notify::NOTIFY_VARS {
        c.env_remove(k);
    }
    // a vigil started inside another run's server does not carry that run's mark into its keeper
    c.env_remove("VIGIL_RUN").env_remove(MARK);
    let fd = lock.fd();
    c.env("VIGIL_KEEPER_LOCK_FD", fd.to_string());
    c.stdin(std::process::Stdio::null()).stdout(std::process::Stdio::null());
    let errlog = crate::state::open_private(&dir.join("keeper.err"), crate::state::Access::Append)
        .map_err(|e| CliError::usage(format!("cannot write {}: {e}", dir.display())))?;
    c.stderr(errlog);
    // SAFETY: setsid and fcntl between fork and exec (async-signal-safe): a new session, detached from our
    // terminal; the lock's descriptor kept open across exec.
    unsafe {
        c.pre_exec(move || {
            libc::setsid();
            libc::fcntl(fd, libc::F_SETFD, 0);
            Ok(())
        });
    }
    let mut child = c.spawn().map_err(|e| CliError::Internal(format!("cannot start the keeper: {e}")))?;
    // The keeper is reaped by a thread so it does not linger as our zombie.
    Ok(std::thread::spawn(move || {
        let _ = child.wait();
    }))
}

fn join_pids(v: &[i32]) -> String {
    v.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(", ")
}

/// Stops a run through its keeper (or directly when the keeper is gone) and waits until every
/// process of it is gone. Returns the survivors (empty on success).
/// The stop comes first and the record after: the grace travels with the keeper's signal (a full disk or
/// a read-only state folder never blocks a stop), and only a keeper that is still the launched process
/// is signalled. Async with deadlines: the runtime goes on while it waits, and a second interrupt kills at
/// once.
pub async fn stop_run(dir: &Path, grace: Duration, rep: &mut Reporter) -> Result<Vec<i32>, CliError> {
    let now = find_run(dir);
    let before = now.pids.clone();
    if before.is_empty() {
        return Ok(vec![]);
    }
    let t0 = Instant::now();
    let grace_ms = grace.as_millis().min(i32::MAX as u128) as i32;
    let gpu_before = now.server.and_then(|s| crate::sources::gpu::before_stop(s, &before));
    let keeper = now.keeper.clone().filter(|k| k.signal(libc::SIGTERM, Some(grace_ms)));
    // Ctrl-C during the grace kills at once: seen by whichever tree's stop takes it, acted on by all
    let interrupted = Arc::new(AtomicBool::new(false));
    if keeper.is_none() {
        // the keeper is gone: the run's processes (found by their mark) are stopped here, each tree at once
        let roots: Vec<i32> =
            before.iter().copied().filter(|p| procs::read_proc(*p).is_none_or(|x| !before.contains(&x.ppid))).collect();
        let mut tasks = Vec::new();
        for r in roots {
            let d = dir.to_path_buf();
            let int = interrupted.clone();
            let kill_now = move || {
                if !int.load(Ordering::SeqCst) && crate::signals::take_interrupt() {
                    int.store(true, Ordering::SeqCst);
                }
                int.load(Ordering::SeqCst)
            };
            let on_event = move |sig: &str, pids: &[i32]| {
                run::append_event(
                    &d,
                    RunEvent::Signal { signal: sig, pids, t_unix_ms: crate::state::now_ms() }.to_value(),
                );
            };
            tasks.push(tokio::spawn(procs::stop_tree_async(r, true, grace, on_event, kill_now)));
        }
        for t in tasks {
            if let Ok(r) = t.await {
                run::append_event(dir, RunEvent::Stopped { t_unix_ms: crate::state::now_ms(), report: &r }.to_value());
            }
        }
    }
    // recorded after the signal, best effort (the keeper records the request it received itself)
    let _ = run::write_json(&dir.join("stop.json"), &StopRequest { grace_ms: grace.as_millis() as u64 });
    // Wait until every process is gone: grace + time for SIGKILL to land. A second Ctrl-C kills at once.
    let deadline = t0 + grace + Duration::from_secs(10);
    let mut killed_now = false;
    let mut killed_logged = false;
    loop {
        let mut live: Vec<i32> = before.iter().copied().filter(|p| procs::alive(*p)).collect();
        if let Some(k) = keeper.as_ref().filter(|k| k.is_live()) {
            live.extend(procs::descendants(k.pid));
        }
        if live.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            live.sort();
            live.dedup();
            for p in &live {
                let cmd = cmdline(*p).map(|c| c.join(" ")).unwrap_or_default();
                let msg = format!("still alive: pid {p} {}", rep.redact(&cmd));
                rep.typed(t0.elapsed().as_millis() as u64, &msg, &Typed::StopSurvivor { pid: *p });
            }
            return Ok(live);
        }
        if !killed_now && (interrupted.load(Ordering::SeqCst) || crate::signals::take_interrupt()) {
            killed_now = true;
            if let Some(k) = &keeper {
                k.signal(libc::SIGUSR1, None);
            }
            rep.note(t0.elapsed().as_millis() as u64, "interrupted during the stop's grace: killing at once");
        }
        if killed_now {
            // The keeper carries out one stop at a time: inside the grace of the first it sees SIGUSR1 only
            // after it. The run's processes are killed from here too: the keeper's descendants and the
            // processes found at the start (its tree, or those carrying the run's mark), ours only, never the
            // keeper itself (it records the end when its tree is gone).
            let kpid = keeper.as_ref().map(|k| k.pid);
            let mut tree: Vec<i32> = live.iter().copied().filter(|p| Some(*p) != kpid && procs::ours(*p)).collect();
            tree.sort();
            tree.dedup();
            let killed: Vec<i32> = tree.into_iter().filter(|p| procs::signal(*p, libc::SIGKILL)).collect();
            if !killed.is_empty() && !std::mem::replace(&mut killed_logged, true) {
                let ev = RunEvent::Signal { signal: "SIGKILL", pids: &killed, t_unix_ms: crate::state::now_ms() };
                run::append_event(dir, ev.to_value());
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for e in run::read_events(dir) {
        if e["event"] == "signal" {
            let signal = e["signal"].as_str().unwrap_or("?").to_string();
            let pids: Vec<i32> = e["pids"]
                .as_array()
                .map(|a| a.iter().filter_map(|p| p.as_i64()).map(|p| p as i32).collect())
                .unwrap_or_default();
            let msg = format!("sent {signal} to pids {}", e["pids"]);
            rep.typed(t0.elapsed().as_millis() as u64, &msg, &Typed::StopStep { signal, pids });
        }
    }
    rep.note(
        t0.elapsed().as_millis() as u64,
        &format!("stopped {} process(es) in {}; none left", before.len(), fmt_ms(t0.elapsed().as_millis() as u64)),
    );
    Ok(gpu_release_async(gpu_before, rep, t0).await)
}

/// After a stop: prove the tree's GPU memory is released, or name who still holds it.
fn gpu_release(b: Option<crate::sources::gpu::Before>, rep: &mut Reporter, t0: Instant) -> Vec<i32> {
    let Some(b) = gpu_to_prove(b, rep, t0) else { return vec![] };
    let left = crate::sources::gpu::wait_released(&b, GPU_RELEASE_WAIT);
    gpu_released(&b, &left, rep, t0)
}

/// `gpu_release` for async code (the wait runs on a blocking thread).
async fn gpu_release_async(b: Option<crate::sources::gpu::Before>, rep: &mut Reporter, t0: Instant) -> Vec<i32> {
    let Some(b) = gpu_to_prove(b, rep, t0) else { return vec![] };
    let (b, left) = crate::sources::gpu::released(b, GPU_RELEASE_WAIT).await;
    gpu_released(&b, &left, rep, t0)
}

/// How long a stop waits for the GPU memory of the stopped tree to be released.
const GPU_RELEASE_WAIT: Duration = Duration::from_secs(30);

/// The GPU memory to prove released after a stop: none (and why, noted) when there is no reader or the
/// tree held none.
fn gpu_to_prove(
    b: Option<crate::sources::gpu::Before>,
    rep: &mut Reporter,
    t0: Instant,
) -> Option<crate::sources::gpu::Before> {
    let t = || t0.elapsed().as_millis() as u64;
    let Some(b) = b else {
        if crate::sources::gpu::Reader::open().is_err() {
            rep.typed(t(), "GPU release not checked: no NVML and no nvidia-smi", &Typed::GpuRelease { released: None });
        }
        return None;
    };
    if b.held.total_mib == 0 {
        rep.note(t(), "the tree held no GPU memory");
        return None;
    }
    Some(b)
}

/// Says whether the GPU memory was released, or who holds it (`left`); returns their pids.
fn gpu_released(
    b: &crate::sources::gpu::Before,
    left: &[crate::sources::gpu::Holder],
    rep: &mut Reporter,
    t0: Instant,
) -> Vec<i32> {
    let t = || t0.elapsed().as_millis() as u64;
    if left.is_empty() {
        rep.typed(
            t(),
            &format!(
                "GPU memory released: {} no longer held (proven by {})",
                crate::sources::gpu::describe(&b.held.per_gpu),
                b.reader.name()
            ),
            &Typed::GpuRelease { released: Some(true) },
        );
        return vec![];
    }
    for h in left {
        rep.typed(
            t(),
            &format!(
                "GPU memory NOT released: pid {} ({}) holds {} MiB on GPU {}{}",
                h.pid,
                rep.redact(&h.cmd),
                h.used_mib,
                h.gpu,
                if h.escaped { "; it started after the server and left its process tree" } else { "" }
            ),
            &Typed::GpuRelease { released: Some(false) },
        );
    }
    left.iter().map(|h| h.pid).collect()
}

/// `vigil down --pid PID`: stops a process tree vigil did not start, proving nothing (and no GPU memory)
/// is left.
pub fn down_pid(p: i32, grace: Duration, json: bool) -> Result<Exit, CliError> {
    let mut rep = Reporter::new(json, false);
    if !procs::alive(p) {
        return Err(CliError::usage(format!("--pid {p}: no such live process")));
    }
    let t0 = Instant::now();
    let mut tree = vec![p];
    tree.extend(procs::descendants(p));
    let gpu_before = crate::sources::gpu::before_stop(p, &tree);
    // Ctrl-C during the grace kills at once (`down` is the first stop)
    let r = procs::stop_tree_until(
        p,
        true,
        grace,
        &mut |sig, pids| {
            let what = Typed::StopStep { signal: sig.to_string(), pids: pids.to_vec() };
            rep.typed(0, &format!("sent {sig} to pids {}", join_pids(pids)), &what)
        },
        &crate::signals::take_interrupt,
    );
    rep.emit(None, &WatchEvent::TreeStopped { pid: p, report: &r });
    for s in &r.survivors {
        let msg = format!("still alive: pid {} {}", s.pid, rep.redact(&s.cmd));
        rep.typed(r.elapsed_ms, &msg, &Typed::StopSurvivor { pid: s.pid });
    }
    if r.survivors.is_empty() {
        rep.note(
            r.elapsed_ms,
            &format!("stopped pid {p} and {} other process(es); none left", r.stopped.len().saturating_sub(1)),
        );
    }
    let gpu_left = gpu_release(gpu_before, &mut rep, t0);
    Ok(if r.survivors.is_empty() && gpu_left.is_empty() { Exit::Ready } else { Exit::NotStopped })
}
