//! The run-management commands, written once over [`Node`]: `status`, `down`, `logs` and `ps` on this
//! machine or on every host of `--host/--hosts` (each host over its own connection, at most `--parallel`
//! at once). `up`, `wait` and `check` reach nodes through the watch's sources and the fleet drivers.

pub mod diagnose;
pub mod history;
pub mod kprobe;
pub mod timeline;

use crate::error::CliError;
use crate::exit::Exit;
use crate::node::{AnyNode, LocalNode, Node};
use crate::sinks::events::WatchEvent;
use crate::sinks::report::{out_line, Reporter};
use crate::sources::follow::SourceMsg;
use crate::supervise::nodes::{fold, gather, Nodes};
use crate::supervise::up::UpArgs;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use vigil_core::judge::fmt_ms;
use vigil_core::{Profiles, Verdict};

/// `vigil status`: every run with its state and phase.
pub async fn status(nodes: &Nodes, json: bool, profiles: &Profiles) -> Result<Exit, CliError> {
    table(nodes, json, profiles, |n, p| async move { n.status(&p).await }, crate::sinks::tables::status).await
}

/// `vigil ps`: inference servers that vigil did not start.
pub async fn ps(nodes: &Nodes, json: bool, profiles: &Profiles) -> Result<Exit, CliError> {
    table(nodes, json, profiles, |n, p| async move { n.ps(&p).await }, crate::sinks::tables::ps).await
}

/// Rows from every node (each over its own connection), shown as one table; the exit code is the worst
/// node's, and the rows that did come are shown even when a node failed.
async fn table<T, F, Fut>(
    nodes: &Nodes,
    json: bool,
    profiles: &Profiles,
    rows_of: F,
    render: fn(&[T], bool),
) -> Result<Exit, CliError>
where
    T: 'static,
    F: Fn(AnyNode, Profiles) -> Fut + Clone + 'static,
    Fut: std::future::Future<Output = Result<Vec<T>, CliError>> + 'static,
{
    let p = profiles.clone();
    let r = nodes.each(move |n| rows_of(n, p.clone())).await;
    let (rows, code) = gather(r);
    if code.is_ok() || !rows.is_empty() {
        render(&rows, json);
    }
    code
}

/// `vigil down NAME…|--all`: stops runs, proving that nothing (and no GPU memory) is left.
pub async fn down(nodes: &Nodes, names: Vec<String>, all: bool, grace: Duration, json: bool) -> Result<Exit, CliError> {
    if names.is_empty() && !all {
        return Err(CliError::usage("down: give a run name, --all or --pid PID"));
    }
    for n in &names {
        crate::node::run::valid_name(n)?;
    }
    let tag = nodes.several();
    let r = nodes
        .each(move |n| {
            let names = names.clone();
            async move {
                let mut rep = Reporter::new(json, false);
                if let (true, Some(h)) = (tag, n.host()) {
                    rep.tagged(h, None);
                }
                let names = if all { n.runs().await? } else { names };
                let mut code = Exit::Ready;
                let mut first_err = None;
                for name in names {
                    // one run that cannot be stopped (a refused folder) does not keep the others running
                    match n.stop(&name, grace, &mut rep).await {
                        Ok(true) => {}
                        Ok(false) => code = code.max(Exit::NotStopped),
                        Err(e) if all => {
                            code = code.max(e.code());
                            rep.note(0, &format!("'{name}': {}", e.message()));
                        }
                        Err(e) => {
                            first_err.get_or_insert(e);
                        }
                    }
                }
                match first_err {
                    Some(e) if code == Exit::Ready => Err(e),
                    Some(e) => {
                        rep.note(0, &e.message());
                        Ok(code.max(Exit::Usage))
                    }
                    None => Ok(code),
                }
            }
        })
        .await;
    fold(r)
}

/// `vigil logs NAME [-f] [-n N]`: the last lines of a run's log, redacted; `-f` follows it (over SSH
/// through reconnects, no line lost or repeated) until Ctrl-C.
pub async fn logs(nodes: &Nodes, name: String, follow: bool, lines: usize) -> Result<Exit, CliError> {
    crate::node::run::valid_name(&name)?;
    let n = nodes.one("logs").await?;
    let tail = n.log_tail(&name, lines).await?;
    let redactor = n.redactor(&name);
    for l in &tail.lines {
        out_line(&redactor.redact(l));
    }
    if !follow {
        return Ok(Exit::Ready);
    }
    let (tx, mut rx) = mpsc::unbounded_channel();
    let follower = n.follow_log(&name, tail.offset, tx);
    tokio::pin!(follower);
    // once the follower ends (its sender dropped), the rest of its lines are still read, then None ends
    let mut following = true;
    let host = n.host().unwrap_or("the node").to_string();
    let mut down = false;
    loop {
        tokio::select! {
            _ = crate::signals::next_interrupt() => return Ok(Exit::Ready),
            _ = &mut follower, if following => following = false,
            m = rx.recv() => match m {
                Some(SourceMsg::Line(l)) => out_line(&redactor.redact(&l)),
                Some(SourceMsg::Disconnected) if !down => {
                    down = true;
                    eprintln!("vigil: the SSH connection to {host} dropped: reconnecting");
                }
                Some(SourceMsg::Reconnected { host, down_ms, .. }) => {
                    down = false;
                    eprintln!("vigil: reconnected to {host} after {}", fmt_ms(down_ms));
                }
                Some(SourceMsg::Resumed) => down = false,
                Some(SourceMsg::Lost(why)) => return Err(CliError::Unreachable(why)),
                Some(_) => {}
                None => return Ok(Exit::Ready),
            }
        }
    }
}

/// `vigil up -- CMD`: launches the server on this machine or one host, watches it to a verdict, and
/// then, by the flags: leaves it (`--detach`), keeps watching (`--watch`), or serves in the foreground
/// until Ctrl-C or its end. Interrupted, it stops what it launched (unless `--keep`). Several hosts are
/// a fleet or a multi-node server (`hosts::up`).
pub async fn up(
    nodes: &Nodes,
    local: Option<LocalNode>,
    a: UpArgs,
    argv: Vec<Vec<u8>>,
    profiles: Profiles,
) -> Result<Exit, CliError> {
    if argv.is_empty() {
        return Err(CliError::usage(
            "up: give the server command after --, e.g. vigil up -- llama-server -m model.gguf",
        ));
    }
    crate::supervise::up::start_listener(&a)?;
    if let Nodes::Remote(hs) = nodes {
        if hs.list.len() > 1 || hs.multi_node {
            if a.repair.is_some() {
                return Err(CliError::usage(
                    "up --repair: one node at a time (a fleet or a multi-node server is not repaired)",
                ));
            }
            return crate::supervise::hosts::up(hs.clone(), a, argv, profiles).await;
        }
    }
    let node = match local {
        Some(l) => AnyNode::Local(l),
        None => nodes.one("up").await?,
    };
    let node = Arc::new(node);
    let label = node.host().unwrap_or("local").to_string();
    let a = Arc::new(a);
    let profiles = Arc::new(profiles);
    let r = match a.repair {
        Some(mode) => crate::supervise::repair::up(node.clone(), &label, a.clone(), argv, profiles.clone(), mode).await,
        None => {
            crate::supervise::hosts::up_one(
                node.clone(),
                &label,
                None,
                1,
                false,
                a.clone(),
                argv,
                profiles.clone(),
                None,
                None,
            )
            .await
        }
    };
    let (name, interrupted, ready) =
        (r.name.clone(), r.interrupted, r.report.as_ref().is_some_and(|x| x.verdict == Verdict::Ready));
    let server = r.report.as_ref().and_then(|x| x.server.clone());
    let launched = r.report.is_some() || r.interrupted;
    let code = r.into_single()?;
    if !launched {
        return Ok(code);
    }
    let on = node.host().map(|h| format!(" on {h}")).unwrap_or_default();
    let mut rep = Reporter::new(a.launch.json, a.quiet);
    if interrupted {
        if a.keep {
            rep.note(0, &format!("--keep: '{name}' keeps running{on}; stop it with `vigil down {name}`"));
            return Ok(code);
        }
        // SIGTERM after ready is an orderly stop (exit 0); before a verdict it stays 130
        let ok = node.stop(&name, a.launch.grace, &mut rep).await?;
        return Ok(if ok { code } else { Exit::NotStopped });
    }
    if a.detach || crate::supervise::up::watching(&a) || !ready {
        return Ok(code);
    }
    // Foreground after ready: stay until the server ends or Ctrl-C stops it.
    rep.note(0, &format!("'{name}' is serving{on}; Ctrl-C stops it (--detach to leave it running)"));
    // a run here: its keeper's death (the server living on, its output lost) ends serving with exit 13
    let (keeper_tx, mut keeper_rx) = mpsc::unbounded_channel::<String>();
    if node.host().is_none() {
        if let Ok(dir) = crate::node::run::run_dir(&name) {
            if let Some(pid) = crate::node::up::find_run(&dir).server {
                crate::node::up::watch_keeper(dir, pid, keeper_tx);
            }
        }
    }
    tokio::select! {
        _ = crate::signals::next_interrupt() => {}
        Some(line) = keeper_rx.recv() => {
            rep.note(0, &line);
            return Ok(Exit::KeeperDied);
        }
        end = node.wait_exit(&name) => {
            // The core judges the end. A stop that was asked for (`vigil down` from another shell) ends serving in
            // order. Not asked for, the core reads the log's end (no judge follows it after ready here): a fatal
            // block there is a crash even with status 0 (vLLM 0.26 exits 0 after EngineDeadError); otherwise a
            // clean status 0 is in order and any other exit a crash.
            let x = &end.exit;
            let failed = if end.requested {
                None
            } else {
                let tail = node.log_tail(&name, 4000).await.map(|t| t.lines.join("\n")).unwrap_or_default();
                let d = vigil_core::diagnose_text(&profiles, server.as_deref(), &tail);
                (d.verdict == Verdict::Crashed).then_some(d)
            };
            if let Some(d) = failed {
                let cause = d.cause.map(|c| c.as_str()).unwrap_or("unknown");
                rep.note(
                    0,
                    &format!(
                        "the server {} after ready, ending on a failure: crashed, cause {cause}{}",
                        crate::node::up::exit_how(x.code, x.signal),
                        d.evidence.last().map(|l| format!(" ({})", rep.redact(l))).unwrap_or_default()
                    ),
                );
                return Ok(Exit::Crashed);
            }
            if x.orderly_after_ready(end.requested) {
                let how = crate::node::up::stopped_how(x, end.requested, None);
                let ev = WatchEvent::Stopped { how: &how, exit_code: x.code, signal: x.signal, requested: end.requested };
                rep.emit(None, &ev);
                return Ok(Exit::Ready);
            }
            rep.note(0, &format!("the server {} after ready", crate::node::up::exit_how(x.code, x.signal)));
            return Ok(Exit::Crashed);
        }
    }
    // Ctrl-C after ready is an interrupt (130, as under --watch and in the README's table); SIGTERM (a service
    // manager's stop) is an orderly stop (0)
    let code = if crate::signals::last_interrupt_was_sigterm() { Exit::Ready } else { Exit::Interrupted };
    let ok = node.stop(&name, a.launch.grace, &mut rep).await?;
    Ok(if ok { code } else { Exit::NotStopped })
}

/// `vigil restart NAME`: stops the run and launches its recorded command again (detached).
pub async fn restart(name: &str, a: UpArgs, profiles: Profiles) -> Result<Exit, CliError> {
    let (dir, rec) = crate::node::run::load(name)?;
    let secrets: crate::sinks::redact::Secrets = crate::node::run::stored_secrets(name, None);
    let (argv, mut env) = crate::node::run::unredact(&rec, &secrets);
    // records written before vigil kept systemd's variables out still hold them: never replay them
    env.retain(|(k, _)| !crate::sinks::notify::NOTIFY_VARS.contains(&k.as_str()));
    let mut rep = Reporter::new(a.launch.json, a.quiet);
    let surv = crate::node::up::stop_run(&dir, a.launch.grace, &mut rep).await?;
    if !surv.is_empty() {
        return Ok(Exit::NotStopped);
    }
    if !rec.repairs.is_empty() {
        // the command `up --repair` reached, not the one first typed: say so, and keep the record saying so
        let n = rec.repairs.len();
        rep.note(
            0,
            &format!(
                "replaying the command as `vigil up --repair` repaired it ({n} repair{}: {})",
                if n == 1 { "" } else { "s" },
                rec.repairs.join("; ")
            ),
        );
    }
    let launch = crate::node::LaunchSettings { replace: true, repairs: rec.repairs.clone(), ..a.launch };
    let a = UpArgs { detach: true, name: Some(name.to_string()), server: rec.server.clone(), launch, ..a };
    let n = crate::node::run::restarts(&dir) + 1;
    crate::node::run::write_atomic(&dir.join("restarts"), n.to_string().as_bytes())?;
    let node = LocalNode::with_command(env, std::path::PathBuf::from(&rec.cwd));
    let argv = argv.into_iter().map(String::into_bytes).collect();
    up(&Nodes::Local, Some(node), a, argv, profiles).await
}

/// `vigil watch NAME`: the watch of a run of `vigil up` on this machine, kept after ready.
pub async fn watch(name: &str, mut w: crate::supervise::wait::Args, profiles: Profiles) -> Result<Exit, CliError> {
    w.take(LocalNode::default().attach(name, None, true, &profiles).await?);
    Ok(crate::supervise::wait::run(w, profiles).await?.code)
}

/// `vigil gpu`: what the GPUs hold now, by process (their command lines redacted).
pub fn gpu(json: bool) -> Result<Exit, CliError> {
    let reader = match crate::sources::gpu::Reader::open() {
        Ok(r) => r,
        Err(e) => {
            crate::sinks::report::out_line(&e);
            return Ok(Exit::Ready);
        }
    };
    let s = reader.sample().map_err(CliError::Internal)?;
    // the command lines only for the table (JSON carries none)
    let cmdlines = if json {
        Default::default()
    } else {
        s.procs.iter().filter_map(|p| Some((p.pid, crate::sources::follow::cmdline(p.pid)?.join(" ")))).collect()
    };
    crate::sinks::tables::gpu(&s, &cmdlines, crate::state::now_ms(), json);
    Ok(Exit::Ready)
}

/// `vigil wait`: watches a server to a verdict: what the flags name, or the run NAME of `vigil up` on this
/// machine or one host. Several hosts are a fleet or a multi-node server (`hosts::wait`).
pub async fn wait(
    nodes: &Nodes,
    name: Option<String>,
    mut w: crate::supervise::wait::Args,
    profiles: Profiles,
) -> Result<Exit, CliError> {
    if let Nodes::Remote(hs) = nodes {
        let Some(name) = name.clone() else {
            return Err(CliError::usage("wait --host: give the NAME of a run started with `vigil up --host`"));
        };
        if hs.list.len() > 1 || hs.multi_node {
            return crate::supervise::hosts::wait(hs.clone(), name, w, profiles).await;
        }
        crate::node::run::valid_name(&name)?;
    }
    let node = nodes.one("wait").await?;
    if let Some(n) = &name {
        let h = node.attach(n, w.server.as_deref(), w.url.is_none(), &profiles).await?;
        w.take(h);
    }
    Ok(crate::supervise::wait::run(w, profiles).await?.code)
}

/// `vigil check -- CMD`: the preflight check of a server command on this machine or one host (model files
/// read through the node, its port and GPUs). Ctrl-C ends it with exit 130 whatever it waits on.
pub async fn check(
    nodes: &Nodes,
    argv: Vec<String>,
    server: Option<String>,
    json: bool,
    profiles: Profiles,
) -> Result<Exit, CliError> {
    if argv.is_empty() {
        return Err(CliError::usage("check: give the server command after --"));
    }
    let node = nodes.one("check").await?;
    let kind = server.or_else(|| profiles.detect_cmd(&argv).map(String::from));
    let rep = tokio::select! {
        r = node.check(&argv, kind, &profiles) => r?,
        _ = crate::signals::next_interrupt() => {
            eprintln!("vigil: interrupted");
            return Ok(Exit::Interrupted);
        }
    };
    crate::sinks::tables::check(&rep, json);
    Ok(if rep.errors() > 0 { Exit::CheckFailed } else { Exit::Ready })
}

/// `vigil dump NAME`: where every process of a run's server is now, captured on its node (this machine or
/// one host) and saved with the run; `--pid` captures a local tree vigil did not start.
pub async fn dump(nodes: &Nodes, name: Option<String>, pid: Option<i32>, json: bool) -> Result<Exit, CliError> {
    let name = match (name, pid, nodes) {
        (None, Some(p), Nodes::Local) => return crate::supervise::evidence::dump_pid(p, json),
        (_, Some(_), Nodes::Remote(_)) => return Err(CliError::usage("dump --host: give a run NAME (--pid is local)")),
        (Some(n), _, _) => n,
        (None, None, _) => return Err(CliError::usage("dump: give a run NAME or --pid PID")),
    };
    crate::node::run::valid_name(&name)?;
    let node = nodes.one("dump").await?;
    let (ev, secrets) = node.evidence(&name).await?;
    let mut rep = Reporter::new(json, false);
    for s in &secrets {
        rep.add_secret(s);
    }
    rep.event(ev.took_ms, &vigil_core::Event::Evidence(Box::new(ev)));
    Ok(Exit::Ready)
}
