//! This machine: runs are the run directories under the state directory, their processes are read from
//! /proc, and a stop goes through the run's keeper.

use super::{Launch, Launched, LogTail, Node, ProcRow, RunRow, ServerEnd};
use crate::error::CliError;
use crate::node::run;
use crate::node::up::{find_run, run_state, stop_run};
use crate::node::RunHandle;
use crate::sinks::records::CheckReport;
use crate::sinks::redact::Redactor;
use crate::sinks::report::Reporter;
use crate::sources::follow::{cmdline, SourceMsg};
use crate::{sources::gpu, sources::procs};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::sync::mpsc::UnboundedSender;
use vigil_core::evidence::Evidence;
use vigil_core::judge::{fmt_ms, ExitInfo};
use vigil_core::{Profiles, Report, Verdict};

/// This machine. A launch takes vigil's own environment and working directory, unless the node was made
/// for a recorded command (`restart`).
#[derive(Default)]
pub struct LocalNode {
    command: Option<(Vec<(String, String)>, PathBuf)>,
}

impl LocalNode {
    /// A node that launches with this environment and working directory (a run's record).
    pub fn with_command(env: Vec<(String, String)>, cwd: PathBuf) -> LocalNode {
        LocalNode { command: Some((env, cwd)) }
    }
}

/// How a server that died ended, from its keeper's `state.json` (a run of ours: the keeper records the status
/// once it has reaped the server, a moment after the process is gone) and the run's stop request; without a
/// run (`--pid` of a process we did not start) the status is unknown.
pub async fn recorded_end(state: Option<&std::path::Path>) -> ServerEnd {
    let requested = state.and_then(|p| p.parent()).is_some_and(run::stop_requested);
    if let Some(p) = state {
        for _ in 0..50 {
            if let Some(st) = run::read_json::<run::State>(p) {
                if !st.running && (st.exit_code.is_some() || st.exit_signal.is_some()) {
                    let exit = ExitInfo { code: st.exit_code, signal: st.exit_signal, ours: true };
                    return ServerEnd { exit, requested };
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    ServerEnd { exit: ExitInfo { code: None, signal: None, ours: false }, requested }
}

/// What `status` reads of a run's verdict.json (the report of the last verdict vigil reached).
#[derive(serde::Deserialize)]
struct Recorded {
    verdict: Verdict,
}

impl Node for LocalNode {
    fn host(&self) -> Option<&str> {
        None
    }

    async fn runs(&self) -> Result<Vec<String>, CliError> {
        run::list_runs()
    }

    async fn status(&self, profiles: &Profiles) -> Result<Vec<RunRow>, CliError> {
        let mut rows = Vec::new();
        let runs = run::runs_dir()?;
        for n in run::list_runs()? {
            // one run that cannot be read is named; the others are still shown
            let dir = runs.join(&n);
            if let Err(e) = crate::state::check_private(&dir) {
                eprintln!("vigil: {}", e.message());
                continue;
            }
            let rec = match run::read_json_checked::<run::RunRecord>(&dir.join("run.json")) {
                Ok(r) => r,
                Err(why) => {
                    eprintln!("vigil: {}", run::unreadable("run.json", &n, &why));
                    None
                }
            };
            let now = find_run(&dir);
            if let Some(why) = &now.state_err {
                eprintln!("vigil: {}", run::unreadable("state.json", &n, why));
            }
            let st = now.state.clone().unwrap_or_default();
            let alive = !now.pids.is_empty();
            let log = rec.as_ref().map_or_else(|| dir.join("server.log"), |r| PathBuf::from(&r.log));
            let log_text = std::fs::read(&log).unwrap_or_default();
            let server = rec.as_ref().and_then(|r| r.server.clone());
            let report = vigil_core::diagnose_text(profiles, server.as_deref(), &String::from_utf8_lossy(&log_text));
            let recorded: Option<Recorded> = run::read_json(&dir.join("verdict.json"));
            let mut state =
                run_state(alive, recorded.as_ref().map(|r| r.verdict), report.verdict, st.exit_code, st.exit_signal);
            if now.keeper_died() {
                let at = crate::node::up::keeper_died_at(&dir);
                eprintln!("vigil: {}", crate::node::up::keeper_died_line(&n, at));
                state = "keeper died".into();
            }
            let since = if alive { st.started_unix_ms } else { st.ended_unix_ms.unwrap_or(st.started_unix_ms) };
            let age = std::fs::metadata(&log)
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .map(|d| d.as_secs());
            rows.push(RunRow {
                host: None,
                name: n,
                server,
                state,
                phase: report.phase.to_string(),
                in_state: (since > 0).then(|| fmt_ms(crate::state::now_ms().saturating_sub(since))),
                port: rec.as_ref().and_then(|r| r.port),
                pid: now.server.or(st.server_pid.filter(|_| alive)).map(i64::from),
                keeper_pid: now.keeper.as_ref().map_or(0, |k| k.pid).into(),
                last_log_line_age_s: age,
            });
        }
        Ok(rows)
    }

    async fn stop(&self, name: &str, grace: Duration, rep: &mut Reporter) -> Result<bool, CliError> {
        // no record is read to stop a run: its keeper (or its processes' mark) is enough
        let dir = run::run_dir(name)?;
        if !dir.is_dir() {
            return Err(CliError::usage(format!("no run named '{name}' (see vigil status)")));
        }
        let now = find_run(&dir);
        if let Some(why) = &now.state_err {
            rep.note(0, &run::unreadable("state.json", name, why));
        }
        if now.pids.is_empty() {
            rep.note(0, &format!("'{name}': nothing running"));
            return Ok(true);
        }
        if now.keeper_died() {
            rep.note(0, &crate::node::up::keeper_died_line(name, crate::node::up::keeper_died_at(&dir)));
        }
        Ok(stop_run(&dir, grace, rep).await?.is_empty())
    }

    async fn log_tail(&self, name: &str, n: usize) -> Result<LogTail, CliError> {
        let (_, rec) = run::load(name)?;
        let (data, offset) = read_tail(Path::new(&rec.log), LOG_TAIL_MAX);
        let text = String::from_utf8_lossy(&data);
        let lines: Vec<&str> = text.lines().collect();
        let lines = lines[lines.len().saturating_sub(n)..]
            .iter()
            .map(|l| crate::sources::lines::final_state(l).to_string())
            .collect();
        Ok(LogTail { lines, offset })
    }

    async fn follow_log(&self, name: &str, from: u64, tx: UnboundedSender<SourceMsg>) {
        use std::io::{Read, Seek, SeekFrom};
        use std::os::unix::fs::MetadataExt;
        let Ok((_, rec)) = run::load(name) else { return };
        let path = PathBuf::from(&rec.log);
        let Ok(mut f) = std::fs::File::open(&path) else { return };
        let mut ino = f.metadata().map(|m| m.ino()).unwrap_or(0);
        let mut pos = from;
        let _ = f.seek(SeekFrom::Start(pos));
        let mut split = crate::sources::lines::Splitter::new();
        let mut buf = vec![0u8; 64 * 1024];
        let mut redraw_quiet = false;
        while !tx.is_closed() {
            let k = f.read(&mut buf).unwrap_or(0);
            if k > 0 {
                pos += k as u64;
                redraw_quiet = false;
                split.push(&buf[..k], &mut |l| {
                    let _ = tx.send(SourceMsg::Line(l));
                });
                continue;
            }
            if split.redraw_waiting() {
                // a bar's state without its end: shown once the log was quiet for REDRAW_QUIET
                if !redraw_quiet {
                    redraw_quiet = true;
                    tokio::time::sleep(crate::sources::follow::REDRAW_QUIET).await;
                    continue;
                }
                if let Some(l) = split.take_redraw() {
                    let _ = tx.send(SourceMsg::Line(l));
                }
            }
            // rotated (a new inode) or truncated: read the new file from its start
            if let Ok(m) = std::fs::metadata(&path) {
                if m.ino() != ino || m.len() < pos {
                    if let Ok(nf) = std::fs::File::open(&path) {
                        f = nf;
                        ino = m.ino();
                        pos = 0;
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn ps(&self, profiles: &Profiles) -> Result<Vec<ProcRow>, CliError> {
        let all = procs::all_procs();
        let keepers: Vec<i32> = all
            .iter()
            .filter(|p| cmdline(p.pid).is_some_and(|c| c.iter().any(|a| a == "__keeper")))
            .map(|p| p.pid)
            .collect();
        let ours: BTreeSet<i32> = keepers.iter().flat_map(|k| procs::descendants(*k)).collect();
        let mut matched: Vec<(i32, i32, String, String)> = Vec::new(); // pid, ppid, kind, cmd
        for p in &all {
            if p.state == 'Z' || ours.contains(&p.pid) || p.pid == std::process::id() as i32 {
                continue;
            }
            let cmd = cmdline(p.pid).map(|c| c.join(" ")).unwrap_or_else(|| p.comm.clone());
            if let Some(k) = profiles.ps_kind(&cmd).or_else(|| profiles.ps_kind(&p.comm)) {
                // a server whose keeper died is still a run's (status names it, down stops it by its mark)
                let marked = procs::env_var(p.pid, crate::node::up::MARK).map(PathBuf::from);
                if marked.is_some_and(|d| find_run(&d).pids.contains(&p.pid)) {
                    continue;
                }
                matched.push((p.pid, p.ppid, k.to_string(), cmd));
            }
        }
        let pids: BTreeSet<i32> = matched.iter().map(|m| m.0).collect();
        let sample = gpu::Reader::open().and_then(|r| r.sample()).ok();
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
            let gpu_mib = sample.as_ref().map(|s| {
                let mut tree: BTreeSet<i32> = procs::descendants(pid).into_iter().collect();
                tree.insert(pid);
                gpu::held_by(s, &tree, &procs::exists).total_mib
            });
            rows.push(ProcRow {
                host: None,
                pid,
                server: kind,
                age_s: procs::read_proc(pid).as_ref().and_then(procs::age_secs),
                ports,
                gpu_mib,
                cmd: crate::sinks::redact::redact_cmdline(&cmd),
            });
        }
        Ok(rows)
    }

    fn redactor(&self, name: &str) -> Redactor {
        run::redactor_for(name, None)
    }

    async fn launch(&self, l: &Launch<'_>, rep: &mut Reporter) -> Result<Launched, CliError> {
        let argv = l
            .argv
            .iter()
            .enumerate()
            .map(|(i, a)| {
                String::from_utf8(a.clone()).map_err(|_| {
                    CliError::usage(format!(
                        "argument {} of the server command is not valid UTF-8 (local runs need UTF-8; --host passes any bytes)",
                        i + 1
                    ))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let (env, cwd) = match &self.command {
            Some((env, cwd)) => (env.clone(), cwd.clone()),
            None => (
                crate::node::up::local_env(l.a)?,
                std::env::current_dir().map_err(|e| CliError::usage(format!("current directory: {e}")))?,
            ),
        };
        // an API port to probe: named on the command line, and not a flag that starts no API (vLLM --headless)
        let cmd_spec = l.kind.as_deref().and_then(|k| l.profiles.get(k)).map(|p| &p.cmd);
        let explicit_port = vigil_core::profile::serves_api(cmd_spec, &argv);
        let mut out = crate::node::up::launch(l.name, argv, env, cwd, l.kind.clone(), l.a, l.profiles, rep).await;
        if let (Ok(Ok(h)), true) = (&mut out, l.rank.unwrap_or(0) > 0) {
            // a multi-node rank other than the head serves no API: no generation proof, and a probe only of a
            // port its command names (SGLang's dummy health server on a worker's --port); the profile's default
            // port would be the head's on a machine that runs both (two nodes on one GPU)
            h.no_generate = true;
            if !explicit_port {
                h.url = None;
            }
        }
        out
    }

    async fn attach(
        &self,
        name: &str,
        _server: Option<&str>,
        probe: bool,
        profiles: &Profiles,
    ) -> Result<RunHandle, CliError> {
        let (dir, rec) = run::load(name)?;
        Ok(RunHandle::of_run(&dir, &rec, profiles, probe))
    }

    async fn wait_exit(&self, name: &str) -> ServerEnd {
        let Ok((dir, _)) = run::load(name) else { return recorded_end(None).await };
        let pid = find_run(&dir).server;
        while pid.is_some_and(procs::alive) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        recorded_end(Some(&dir.join("state.json"))).await
    }

    async fn check(&self, argv: &[String], kind: Option<String>, profiles: &Profiles) -> Result<CheckReport, CliError> {
        let env: Vec<(String, String)> = std::env::vars_os()
            .map(|(k, v)| (k.to_string_lossy().into_owned(), v.to_string_lossy().into_owned()))
            .collect();
        let cwd = std::env::current_dir().map_err(|e| CliError::usage(e.to_string()))?;
        let (argv, profiles) = (argv.to_vec(), profiles.clone());
        // file reads and child processes block: on their own thread, so that Ctrl-C still ends the command
        tokio::task::spawn_blocking(move || {
            let i = crate::check::Inputs {
                argv: &argv,
                server: kind,
                env: &env,
                cwd: &cwd,
                local_machine: true,
                version: None,
                state_root: crate::state::state_root().ok(),
            };
            crate::check::check(&i, &profiles)
        })
        .await
        .map_err(|e| CliError::Internal(format!("check: {e}")))?
    }

    async fn evidence(&self, name: &str) -> Result<(Evidence, Vec<String>), CliError> {
        let (dir, _) = run::load(name)?;
        let pid = find_run(&dir)
            .server
            .filter(|p| procs::alive(*p))
            .ok_or_else(|| CliError::usage(format!("dump: run {name} has no live server process")))?;
        let secrets = crate::sinks::redact::secret_values(&run::stored_secrets(name, None));
        let dir = crate::node::evidence::dir_for(Some(&dir), pid);
        let s = secrets.clone();
        // py-spy and eu-stack are child processes with their own bounds: on a blocking thread
        let ev = tokio::task::spawn_blocking(move || crate::node::evidence::gather(pid, &dir, &s))
            .await
            .map_err(|e| CliError::Internal(format!("dump: {e}")))?;
        Ok((ev, secrets))
    }

    fn record_startup(&self, name: &str, r: &Report) {
        if let Ok(dir) = run::run_dir(name) {
            let _ = run::write_json(&dir.join("startup.json"), r);
        }
    }
}

/// What `vigil logs` reads of a run's log: its last 16 MiB (the remote node's `tail -c` reads the same).
const LOG_TAIL_MAX: u64 = 16 << 20;

/// The last `max` bytes of a file (from its first whole line when that is not the file's start) and the
/// byte offset where they end; an unreadable file is empty.
pub(crate) fn read_tail(path: &Path, max: u64) -> (Vec<u8>, u64) {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = std::fs::File::open(path) else { return (Vec::new(), 0) };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let start = len.saturating_sub(max);
    if f.seek(SeekFrom::Start(start)).is_err() {
        return (Vec::new(), 0);
    }
    let mut data = Vec::new();
    let _ = f.take(max).read_to_end(&mut data);
    let end = start + data.len() as u64;
    if start > 0 {
        let cut = data.iter().position(|b| *b == b'\n').map_or(data.len(), |i| i + 1);
        data.drain(..cut);
    }
    (data, end)
}
