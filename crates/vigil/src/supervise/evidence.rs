//! What happens to evidence at a verdict (issue #17): a stuck server's processes are captured on its node
//! (`node::evidence` here, `node::remote_evidence` over SSH) and told as an event; `vigil dump --pid`.

use crate::exit::Exit;
use crate::node::evidence::{dir_for, gather};
use crate::sinks::events::Typed;
use std::path::Path;

/// At a verdict that leaves the server alive and stuck (stalled, unhealthy): captures the evidence, tells
/// it as an event, and puts one line per process at the head of the verdict's evidence. Local servers
/// only (`--pid`); a server watched over SSH is captured with `vigil dump` on its node.
pub async fn at_verdict(
    rep: &mut crate::sinks::report::Reporter,
    t_ms: u64,
    r: &mut vigil_core::Report,
    pid: Option<i32>,
    run_dir: Option<&Path>,
    secrets: &[String],
    remote: Option<&crate::node::remote::RemoteWatch>,
) {
    use vigil_core::Verdict;
    if !matches!(r.verdict, Verdict::Stalled | Verdict::Unhealthy) {
        return;
    }
    if let (None, Some(w)) = (pid, remote) {
        // a run on a node: the capture runs there, over the run's connection
        match crate::node::remote_evidence::capture(&w.conn, &w.name, secrets).await {
            Ok(ev) => {
                let mut lines = ev.lines();
                lines.push(format!("evidence saved in {}", ev.dir));
                lines.append(&mut r.evidence);
                r.evidence = lines;
                rep.event(t_ms, &vigil_core::Event::Evidence(Box::new(ev)));
            }
            Err(e) => rep.typed(t_ms, &format!("evidence on the node: {e}"), &Typed::EvidenceFailed),
        }
        return;
    }
    let Some(pid) = pid.filter(|p| crate::sources::procs::alive(*p)) else { return };
    let dir = dir_for(run_dir, pid);
    let secrets = secrets.to_vec();
    let ev = match tokio::task::spawn_blocking(move || gather(pid, &dir, &secrets)).await {
        Ok(ev) => ev,
        Err(e) => {
            rep.typed(t_ms, &format!("evidence capture failed: {e}"), &Typed::EvidenceFailed);
            return;
        }
    };
    let mut lines = ev.lines();
    lines.push(format!("evidence saved in {}", ev.dir));
    lines.append(&mut r.evidence);
    r.evidence = lines;
    rep.event(t_ms, &vigil_core::Event::Evidence(Box::new(ev)));
}

/// `vigil dump --pid PID`: the evidence of a process tree vigil did not start, saved under the state
/// directory. (A run's evidence comes through its node: `commands::dump`.)
pub fn dump_pid(p: i32, json: bool) -> Result<Exit, crate::error::CliError> {
    use crate::error::CliError;
    if p <= 0 || !crate::sources::procs::alive(p) {
        return Err(CliError::usage(format!("dump --pid {p}: no such live process")));
    }
    let ev = gather(p, &dir_for(None, p), &[]);
    crate::sinks::report::Reporter::new(json, false).event(ev.took_ms, &vigil_core::Event::Evidence(Box::new(ev)));
    Ok(Exit::Ready)
}
