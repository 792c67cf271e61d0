//! The run-management commands, written once over [`Node`]: `status`, `down`, `logs` and `ps` on this
//! machine or on every host of `--host/--hosts` (each host over its own connection, at most `--parallel`
//! at once). `up`, `wait` and `check` reach nodes through the watch's sources and the fleet drivers.

use crate::error::CliError;
use crate::exit;
use crate::follow::SourceMsg;
use crate::node::{fold, gather, Node, Nodes};
use crate::report::{out_line, Reporter};
use std::time::Duration;
use tokio::sync::mpsc;
use vigil_core::judge::fmt_ms;
use vigil_core::Profiles;

/// `vigil status`: every run with its state and phase.
pub async fn status(nodes: &Nodes, json: bool, profiles: &Profiles) -> Result<i32, CliError> {
    let p = profiles.clone();
    let r = nodes
        .each(move |n| {
            let p = p.clone();
            async move { n.status(&p).await }
        })
        .await;
    let (rows, code) = gather(r);
    if code.is_ok() || !rows.is_empty() {
        crate::tables::status(&rows, json);
    }
    code
}

/// `vigil ps`: inference servers that vigil did not start.
pub async fn ps(nodes: &Nodes, json: bool, profiles: &Profiles) -> Result<i32, CliError> {
    let p = profiles.clone();
    let r = nodes
        .each(move |n| {
            let p = p.clone();
            async move { n.ps(&p).await }
        })
        .await;
    let (rows, code) = gather(r);
    if code.is_ok() || !rows.is_empty() {
        crate::tables::ps(&rows, json);
    }
    code
}

/// `vigil down NAME…|--all`: stops runs, proving that nothing (and no GPU memory) is left.
pub async fn down(nodes: &Nodes, names: Vec<String>, all: bool, grace: Duration, json: bool) -> Result<i32, CliError> {
    if names.is_empty() && !all {
        return Err(CliError::usage("down: give a run name, --all or --pid PID"));
    }
    for n in &names {
        crate::run::valid_name(n)?;
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
                let mut code = exit::READY;
                for name in names {
                    if !n.stop(&name, grace, &mut rep).await? {
                        code = exit::NOT_STOPPED;
                    }
                }
                Ok(code)
            }
        })
        .await;
    fold(r)
}

/// `vigil logs NAME [-f] [-n N]`: the last lines of a run's log, redacted; `-f` follows it (over SSH
/// through reconnects, no line lost or repeated) until Ctrl-C.
pub async fn logs(nodes: &Nodes, name: String, follow: bool, lines: usize) -> Result<i32, CliError> {
    crate::run::valid_name(&name)?;
    if let Nodes::Remote(h) = nodes {
        if h.list.len() != 1 {
            return Err(CliError::usage("logs: give one --host"));
        }
    }
    let r = nodes
        .each(move |n| {
            let name = name.clone();
            async move {
                let tail = n.log_tail(&name, lines).await?;
                let redactor = n.redactor(&name);
                for l in &tail.lines {
                    out_line(&redactor.redact(l));
                }
                if !follow {
                    return Ok(exit::READY);
                }
                let (tx, mut rx) = mpsc::unbounded_channel();
                let follower = n.follow_log(&name, tail.offset, tx);
                tokio::pin!(follower);
                let host = n.host().unwrap_or("the node").to_string();
                let mut down = false;
                loop {
                    tokio::select! {
                        _ = crate::signals::next_interrupt() => return Ok(exit::READY),
                        _ = &mut follower => {}
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
                            None => return Ok(exit::READY),
                        }
                    }
                }
            }
        })
        .await;
    fold(r)
}
