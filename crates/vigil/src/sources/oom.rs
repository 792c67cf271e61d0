//! The kernel's record of OOM kills (issue #33): blame on the OOM killer needs it. Read at the start of a
//! watch and again when the server exits:
//! - `/proc/vmstat` `oom_kill`: the machine's count of OOM kills (Linux 4.13+);
//! - the server's memory cgroup: `memory.events` (cgroup v2: `oom_kill N`) or `memory.oom_control` (v1:
//!   `oom_kill N`), found from `/proc/PID/cgroup`. The server may move itself into a cgroup right after it
//!   starts, so the cgroup is looked up again once a second while it lives, and the first reading of each
//!   cgroup is its baseline.
//!
//! The kernel log (`/dev/kmsg`) is not read: it is root's on most machines (`kernel.dmesg_restrict`), and the
//! counters say the same without it. What the readings mean is decided in the core (`Judge`, `KernelOom`).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use vigil_core::KernelOom;

/// The count in a `name N` line of a kernel stats file.
fn count(text: &str, name: &str) -> Option<u64> {
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Reads at most 64 KiB of a small kernel file.
fn read_small(p: &Path) -> Option<String> {
    use std::io::Read;
    let f = std::fs::File::open(p).ok()?;
    let mut s = String::new();
    f.take(64 * 1024).read_to_string(&mut s).ok()?;
    Some(s)
}

fn vmstat() -> Option<u64> {
    count(&read_small(Path::new("/proc/vmstat"))?, "oom_kill")
}

/// The memory cgroup of `pid` and the file that counts its OOM kills: v1's memory hierarchy when the
/// memory controller is mounted there, else the v2 unified hierarchy (at /sys/fs/cgroup or, in a hybrid
/// layout, /sys/fs/cgroup/unified).
fn cgroup_file(pid: u32) -> Option<(String, PathBuf)> {
    let text = read_small(Path::new(&format!("/proc/{pid}/cgroup")))?;
    let root = Path::new("/sys/fs/cgroup");
    for l in text.lines() {
        let mut it = l.splitn(3, ':');
        let (_, ctrls, path) = (it.next()?, it.next()?, it.next()?);
        let rel = path.trim_start_matches('/');
        if ctrls.split(',').any(|c| c == "memory") {
            let f = root.join("memory").join(rel).join("memory.oom_control");
            if f.is_file() {
                return Some((path.to_string(), f));
            }
        }
    }
    for l in text.lines() {
        if let Some(path) = l.strip_prefix("0::") {
            let rel = path.trim_start_matches('/');
            for base in [root.to_path_buf(), root.join("unified")] {
                let f = base.join(rel).join("memory.events");
                if f.is_file() {
                    return Some((path.to_string(), f));
                }
            }
        }
    }
    None
}

#[derive(Debug, Default)]
struct Seen {
    vmstat: Option<u64>,
    /// The server's cgroup, its counter file, and the count at first sight.
    cgroup: Option<(String, PathBuf, u64)>,
}

/// The readings of one watched server.
#[derive(Clone)]
pub struct OomWatch {
    seen: Arc<Mutex<Seen>>,
}

impl OomWatch {
    /// Takes the baseline now and follows the server's cgroup while `pid` lives.
    pub fn start(pid: u32) -> OomWatch {
        let seen = Arc::new(Mutex::new(Seen { vmstat: vmstat(), cgroup: None }));
        let w = OomWatch { seen };
        w.look(pid);
        let again = w.clone();
        tokio::spawn(async move {
            while std::path::Path::new(&format!("/proc/{pid}")).exists() {
                tokio::time::sleep(Duration::from_secs(1)).await;
                again.look(pid);
            }
        });
        w
    }

    /// Notes the server's cgroup (a new one: its count now is the baseline). A process that has exited (a
    /// zombie not yet reaped) reads as in the root cgroup: only a live process's answer counts, and a move to
    /// the root is taken for that.
    fn look(&self, pid: u32) {
        let live = || {
            read_small(Path::new(&format!("/proc/{pid}/stat")))
                .and_then(|st| st.rsplit_once(") ").map(|(_, rest)| !rest.starts_with(['Z', 'X'])))
                .unwrap_or(false)
        };
        if !live() {
            return;
        }
        let Some((name, file)) = cgroup_file(pid) else { return };
        if !live() {
            return;
        }
        let mut s = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if s.cgroup.as_ref().is_some_and(|c| c.1 == file || name == "/") {
            return;
        }
        let n = read_small(&file).and_then(|t| count(&t, "oom_kill")).unwrap_or(0);
        s.cgroup = Some((name, file, n));
    }

    /// What the kernel counted since the start.
    pub fn record(&self) -> KernelOom {
        let s = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let mut k = KernelOom::default();
        if let (Some(a), Some(b)) = (s.vmstat, vmstat()) {
            k.read.push(format!("/proc/vmstat oom_kill {a} -> {b}"));
            k.machine = Some(b > a);
        }
        if let Some((name, file, a)) = &s.cgroup {
            if let Some(b) = read_small(file).and_then(|t| count(&t, "oom_kill")) {
                let what = file.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
                k.read.push(format!("{what} of cgroup {name}: oom_kill {a} -> {b}"));
                k.cgroup = Some(b > *a);
            }
        }
        k
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_read_from_kernel_files() {
        assert_eq!(count("nr_free_pages 5\noom_kill 7\n", "oom_kill"), Some(7));
        assert_eq!(count("low 0\nhigh 0\nmax 3\noom 2\noom_kill 1\noom_group_kill 0\n", "oom_kill"), Some(1));
        assert_eq!(count("oom_kill_disable 0\nunder_oom 0\noom_kill 4\n", "oom_kill"), Some(4));
        assert_eq!(count("oom_kill_disable 0\n", "oom_kill"), None);
    }

    #[test]
    fn this_machine_reads_its_own_counter() {
        // Linux 4.13+ counts OOM kills in /proc/vmstat; the record of a run names it.
        if vmstat().is_none() {
            return;
        }
        let w = OomWatch { seen: Arc::new(Mutex::new(Seen { vmstat: vmstat(), cgroup: None })) };
        let r = w.record();
        assert!(r.read[0].starts_with("/proc/vmstat oom_kill "), "{r:?}");
    }
}
