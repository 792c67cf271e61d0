//! `--on-stall keep|stop` (issue #17): after the evidence is saved, stop a stuck server's tree and prove
//! its port and GPU memory free, or leave it running and say how to stop it. The decision of which
//! verdicts it applies to is `vigil_core::policy::applies`; this only acts and reports.

use crate::sinks::report::Reporter;
use std::path::Path;
use std::time::{Duration, Instant};
use vigil_core::policy::{OnStall, StallAction};
use vigil_core::{Event, Report};

/// After a port is closed by the stop, the proof waits this long for the kernel to release it.
const PORT_WAIT: Duration = Duration::from_secs(5);

/// Applies the policy to a verdict that ends vigil's watch: the server's root process is `a.pid`, its
/// run (stopped through its keeper) the folder of `a.exit_state`; `port` is the server's port when known.
/// Async with deadlines: the stop, the GPU release and the port wait never block the runtime.
pub async fn on_verdict(
    rep: &mut Reporter,
    t_ms: u64,
    r: &mut Report,
    a: &crate::supervise::wait::Args,
    port: Option<u16>,
) {
    let policy = a.on_stall.unwrap_or_default();
    let (pid, grace) = (a.pid, a.stop_grace);
    let run_dir = a.exit_state.as_deref().and_then(Path::parent);
    if !vigil_core::policy::applies(r) {
        return;
    }
    let Some(pid) = pid else { return };
    let run = run_dir.map(crate::node::up::find_run);
    let mut pids: Vec<i32> = crate::sources::procs::descendants(pid);
    if crate::sources::procs::alive(pid) {
        pids.insert(0, pid);
    }
    // a run's keeper is a subreaper: children the dead server left behind are its descendants
    if let Some(k) = run.as_ref().and_then(|r| r.keeper.as_ref()) {
        for d in crate::sources::procs::descendants(k.pid) {
            if !pids.contains(&d) {
                pids.push(d);
            }
        }
    }
    if pids.is_empty() {
        return; // nothing lingers
    }
    let mut act = StallAction { pids: pids.clone(), port, ..StallAction::new(policy, r) };
    match policy {
        OnStall::Keep => {
            let how = match run_dir.and_then(|d| d.file_name()).and_then(|n| n.to_str()) {
                Some(n) => format!("`vigil down {n}`"),
                None => format!("`vigil down --pid {pid}`"),
            };
            act.note = Some(format!("{how} stops it"));
        }
        OnStall::Stop => {
            act.survivors = match (run_dir, run.filter(|r| !r.pids.is_empty())) {
                (Some(d), Some(_)) => crate::node::up::stop_run(d, grace, rep).await.unwrap_or(pids.clone()),
                _ => {
                    // not a run of ours (stop_run proves a run's GPU release itself): prove it here
                    let before = crate::sources::gpu::before_stop(pid, &pids).filter(|b| b.held.total_mib > 0);
                    let s = crate::sources::procs::stop_tree_async(
                        pid,
                        true,
                        grace,
                        |_, _| {},
                        crate::signals::take_interrupt,
                    )
                    .await;
                    let mut left: Vec<i32> = s.survivors.iter().map(|p| p.pid).collect();
                    if let Some(b) = before {
                        let (_, holders) = crate::sources::gpu::released(b, Duration::from_secs(30)).await;
                        act.gpu_released = Some(holders.is_empty());
                        for h in holders {
                            if !left.contains(&h.pid) {
                                left.push(h.pid);
                            }
                        }
                    }
                    left
                }
            };
            if let Some(p) = port {
                let deadline = Instant::now() + PORT_WAIT;
                let mut free = crate::sources::procs::port_free(p);
                while !free && Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    free = crate::sources::procs::port_free(p);
                }
                act.port_free = Some(free);
            }
            if let (Some(p), Some(false)) = (act.port, act.port_free) {
                act.note = Some(crate::sources::procs::port_holder_text(p));
            }
        }
    }
    rep.event(t_ms, &Event::OnStall(act));
}

/// The policy for a run on a node (`up --host`): the stop goes through the node's own stop, which proves
/// there that no process of the run is left and its GPU memory is released; keep says how to stop it.
pub async fn on_verdict_remote(
    rep: &mut Reporter,
    t_ms: u64,
    r: &mut Report,
    a: &crate::supervise::wait::Args,
    w: &crate::node::remote::RemoteWatch,
) {
    if !vigil_core::policy::applies(r) {
        return;
    }
    let policy = a.on_stall.unwrap_or_default();
    let host = w.conn.dest.clone();
    let mut act = StallAction { host: Some(host.clone()), ..StallAction::new(policy, r) };
    match policy {
        OnStall::Keep => act.note = Some(format!("`vigil --host {host} down {}` stops it", w.name)),
        OnStall::Stop => match crate::node::ssh::stopped(&w.conn, &w.name, a.stop_grace, rep).await {
            Ok(s) => {
                act.survivors = s.survivors;
                act.gpu_released = s.gpu_released;
            }
            Err(e) => act.failed = Some(e.message()),
        },
    }
    rep.event(t_ms, &Event::OnStall(act));
}
