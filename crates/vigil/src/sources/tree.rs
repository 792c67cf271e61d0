//! Samples the server's process tree for the core's `TreeWatch`: every descendant of the root with its
//! start time, title (`/proc/PID/cmdline`, bounded) and the GPU memory it holds. Only gathers facts;
//! `vigil_core::tree` decides which processes are engines and what their death means.

use crate::gpu;
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
pub fn sample(root: i32, gpu: Option<&gpu::Snapshot>) -> TreeSample {
    let root_alive = crate::procs::alive(root);
    let mut procs = Vec::new();
    for pid in crate::procs::descendants(root) {
        let Some(p) = crate::procs::read_proc(pid) else { continue };
        let gpu_mib = gpu.map_or(0, |s| s.procs.iter().filter(|g| g.pid == pid).map(|g| g.used_mib).sum());
        procs.push(ProcSample { pid, start: p.start_ticks, title: title(pid, &p.comm), gpu_mib });
    }
    TreeSample { root_alive, procs }
}

/// Samples the tree every `every` (GPU memory every `gpu_every`, when a reader opens) on a thread of its
/// own until the root dies or the receiver is gone.
pub fn spawn(root: i32, every: Duration, gpu_every: Duration, tx: mpsc::UnboundedSender<TreeSample>) {
    std::thread::spawn(move || {
        let reader = gpu::Reader::open().ok();
        let mut last_gpu: Option<(Instant, gpu::Snapshot)> = None;
        loop {
            if let Some(r) = &reader {
                if last_gpu.as_ref().is_none_or(|(t, _)| t.elapsed() >= gpu_every) {
                    if let Ok(s) = r.sample() {
                        last_gpu = Some((Instant::now(), s));
                    }
                }
            }
            let s = sample(root, last_gpu.as_ref().map(|(_, s)| s));
            let alive = s.root_alive;
            if tx.send(s).is_err() || !alive {
                return;
            }
            std::thread::sleep(every);
        }
    });
}
