//! Samples the server's process tree for the core's `TreeWatch`: every descendant of the root with its
//! start time, title (`/proc/PID/cmdline`, bounded) and the GPU memory it holds. Only gathers facts;
//! `vigil_core::tree` decides which processes are engines and what their death means.

use crate::sources::gpu;
use std::io::Read;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use vigil_core::{ProcSample, TreeSample};

/// A title is the process's name, not its whole command line: 512 bytes hold any engine title.
const TITLE_MAX: u64 = 512;

/// The title `ps` shows: cmdline with NULs as spaces (setproctitle rewrites it), else the comm.
pub fn title(pid: i32, comm: &str) -> String {
    let mut b = Vec::new();
    if let Ok(f) = std::fs::File::open(format!("/proc/{pid}/cmdline")) {
        let _ = f.take(TITLE_MAX).read_to_end(&mut b);
    }
    let s: String = String::from_utf8_lossy(&b).replace('\0', " ").trim().to_string();
    if s.is_empty() {
        comm.to_string()
    } else {
        s
    }
}

/// One sample of the tree below `root`; `gpu` (when a reading is at hand) gives each process's memory.
/// Also the first process whose name is in `compilers` (a JIT build in the tree), if any.
pub fn sample(
    root: i32,
    gpu: Option<&crate::sinks::records::Snapshot>,
    compilers: &[String],
) -> (TreeSample, Option<String>) {
    let root_alive = crate::sources::procs::alive(root);
    let mut procs = Vec::new();
    let mut compiling = None;
    for pid in crate::sources::procs::descendants(root) {
        let Some(p) = crate::sources::procs::read_proc(pid) else { continue };
        if compiling.is_none() && compilers.contains(&p.comm) {
            compiling = Some(p.comm.clone());
        }
        let gpu_mib = gpu.map_or(0, |s| s.procs.iter().filter(|g| g.pid == pid).map(|g| g.used_mib).sum());
        procs.push(ProcSample { pid, start: p.start_ticks, title: title(pid, &p.comm), gpu_mib });
    }
    (TreeSample { root_alive, procs }, compiling)
}

/// What the one walk of the tree feeds besides the tree samples: the GPU memory the tree holds (a reader,
/// its interval, where `Held` goes) and the compilers that count as progress (their names, where a found one
/// goes).
pub struct Extras {
    pub gpu: Option<(gpu::Reader, Duration, mpsc::UnboundedSender<gpu::Held>)>,
    pub compilers: Option<(Vec<String>, mpsc::UnboundedSender<String>)>,
}

/// Samples the tree every `every` on a thread of its own until the root dies or the receiver is gone: one
/// walk of the tree serves the engine watch, the GPU memory the tree holds (read every GPU interval) and the
/// compiler check.
pub fn spawn(root: i32, every: Duration, extras: Extras, tx: mpsc::UnboundedSender<TreeSample>) {
    std::thread::spawn(move || {
        let Extras { gpu, compilers } = extras;
        let names = compilers.as_ref().map(|(n, _)| n.clone()).unwrap_or_default();
        let mut last_gpu: Option<(Instant, crate::sinks::records::Snapshot)> = None;
        loop {
            let mut fresh = false;
            if let Some((r, gpu_every, _)) = &gpu {
                if last_gpu.as_ref().is_none_or(|(t, _)| t.elapsed() >= *gpu_every) {
                    if let Ok(s) = r.sample() {
                        last_gpu = Some((Instant::now(), s));
                        fresh = true;
                    }
                }
            }
            let (s, compiling) = sample(root, last_gpu.as_ref().map(|(_, s)| s), &names);
            if let (true, Some((_, _, held_tx)), Some((_, snap))) = (fresh, &gpu, &last_gpu) {
                let mut pids: std::collections::BTreeSet<i32> = s.procs.iter().map(|p| p.pid).collect();
                pids.insert(root);
                let _ = held_tx.send(gpu::held_by(snap, &pids, &crate::sources::procs::exists));
            }
            if let (Some(c), Some((_, busy_tx))) = (compiling, &compilers) {
                let _ = busy_tx.send(c);
            }
            let alive = s.root_alive;
            if tx.send(s).is_err() || !alive {
                return;
            }
            std::thread::sleep(every);
        }
    });
}
