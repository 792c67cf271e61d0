//! Captures evidence of where every process of a server's tree is (issue #17): `py-spy dump --native` for
//! Python processes, `eu-stack` native stacks where elfutils is installed, the kernel wait channel from
//! `/proc` always, and NCCL flight-recorder dumps when the server's environment enables them. Bounded:
//! each tool run has a deadline, every file kept is cut at a size, at most `MAX_PROCS` processes. The raw
//! output goes to a folder of the run; `vigil_core::evidence` parses and summarises it.

use crate::sinks::redact::Redactor;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use vigil_core::evidence::{self, Evidence, ProcEvidence};

/// A tool run on one process (py-spy and eu-stack each) gets this long.
pub const TOOL_DEADLINE: Duration = Duration::from_secs(10);
/// Every file kept is cut at this size.
pub const MAX_FILE: u64 = 1 << 20;
/// Processes captured at most (a 16-GPU server has ~40 with its helpers).
pub const MAX_PROCS: usize = 128;
/// No new batch of processes is started after this long: the verdict waits for the evidence.
pub const TOTAL_DEADLINE: Duration = Duration::from_secs(60);
/// NCCL flight-recorder dumps copied at most, each at most `MAX_DUMP` bytes.
const MAX_DUMPS: usize = 64;
const MAX_DUMP: u64 = 16 << 20;

/// Where py-spy may be: `$VIGIL_PY_SPY`, beside the server's interpreter (a venv's bin/), on PATH.
pub fn find_py_spy(exe: Option<&Path>) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("VIGIL_PY_SPY").map(PathBuf::from).filter(|p| p.is_file()) {
        return Some(p);
    }
    if let Some(p) = exe.and_then(|e| e.parent()).map(|d| d.join("py-spy")).filter(|p| p.is_file()) {
        return Some(p);
    }
    on_path("py-spy")
}

fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(name)).find(|p| p.is_file())
}

fn eu_stack() -> Option<PathBuf> {
    on_path("eu-stack").or_else(|| Some(PathBuf::from("/usr/bin/eu-stack")).filter(|p| p.is_file()))
}

fn read_bounded(p: &Path, max: u64) -> Option<String> {
    let mut b = Vec::new();
    std::fs::File::open(p).ok()?.take(max).read_to_end(&mut b).ok()?;
    Some(String::from_utf8_lossy(&b).into_owned())
}

/// True for a Python interpreter: its executable's name starts with `python` (python3.11, python3).
fn is_python(exe: Option<&Path>) -> bool {
    exe.and_then(|e| e.file_name()).and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("python"))
}

/// Runs a tool with a deadline; its stdout (cut at `MAX_FILE`), or why not.
fn run_tool(cmd: std::process::Command) -> Result<String, String> {
    let what = cmd.get_program().to_string_lossy().rsplit('/').next().unwrap_or("").to_string();
    match crate::sources::procs::output_within(cmd, TOOL_DEADLINE) {
        Ok(o) if o.status.success() => {
            let mut s = String::from_utf8_lossy(&o.stdout).into_owned();
            s.truncate(MAX_FILE as usize);
            Ok(s)
        }
        Ok(o) => {
            let err = String::from_utf8_lossy(&o.stderr);
            let first = err.lines().find(|l| !l.trim().is_empty()).unwrap_or("failed").trim();
            Err(format!("{what}: {}", first.chars().take(200).collect::<String>()))
        }
        Err(e) => Err(format!("{what}: {e}")),
    }
}

fn save(dir: &Path, name: &str, text: &str, red: &Redactor, files: &mut Vec<String>) {
    let p = dir.join(name);
    if crate::state::write_private(&p, red.redact(text).as_bytes()).is_ok() {
        files.push(name.to_string());
    }
}

/// Captures one process. `py_spy` is the tool found for the tree (if any).
fn capture(pid: i32, dir: &Path, py_spy: Option<&Path>, eu: Option<&Path>, red: &Redactor) -> ProcEvidence {
    let stat = crate::sources::procs::read_proc(pid);
    let title = crate::sources::tree::title(pid, stat.as_ref().map_or("", |p| p.comm.as_str()));
    let wchan = read_bounded(Path::new(&format!("/proc/{pid}/wchan")), 256).map(|s| s.trim().to_string());
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok();
    let mut files = Vec::new();
    let mut notes = Vec::new();
    let mut py_threads = vec![];
    if is_python(exe.as_deref()) {
        let tool = py_spy.map(Path::to_path_buf).or_else(|| find_py_spy(exe.as_deref()));
        match tool {
            Some(t) => {
                // A stopped process (state T: SIGSTOP, a debugger) cannot be paused by py-spy's ptrace attach,
                // and `dump` then fails ("Failed to get stack traces", seen on the H200 with a SIGSTOPped
                // VLLM::EngineCore); `--nonblocking` reads its memory without pausing it, which a stopped
                // process allows. --native needs the pause, so it is skipped there.
                let stopped = stat.as_ref().is_some_and(|p| matches!(p.state, 'T' | 't'));
                let mut c = std::process::Command::new(&t);
                if stopped {
                    c.args(["dump", "--nonblocking", "--pid", &pid.to_string()]);
                } else {
                    c.args(["dump", "--native", "--pid", &pid.to_string()]);
                }
                let mut out = run_tool(c);
                if out.is_err() && !stopped {
                    // --native needs unwind info that some builds lack: the Python stack alone still tells
                    let mut c = std::process::Command::new(&t);
                    c.args(["dump", "--pid", &pid.to_string()]);
                    out = run_tool(c).map_err(|e| format!("{} (and with --native: {})", e, out.unwrap_err()));
                }
                match out {
                    Ok(s) => {
                        py_threads = evidence::parse_py_spy(&s);
                        save(dir, &format!("pid-{pid}.py-spy.txt"), &s, red, &mut files);
                    }
                    Err(e) => notes.push(e),
                }
            }
            None => notes.push(
                "py-spy not found (PATH, beside the interpreter, $VIGIL_PY_SPY): `pip install py-spy` in the server's environment"
                    .into(),
            ),
        }
    }
    let mut native = vec![];
    match eu {
        Some(t) => {
            let mut c = std::process::Command::new(t);
            c.args(["-p", &pid.to_string()]);
            match run_tool(c) {
                Ok(s) => {
                    native = evidence::parse_eu_stack(&s);
                    save(dir, &format!("pid-{pid}.eu-stack.txt"), &s, red, &mut files);
                }
                Err(e) => notes.push(e),
            }
        }
        None => notes.push("eu-stack not found: native stacks need elfutils (apt-get install elfutils)".into()),
    }
    let at = evidence::summarize(pid, &py_threads, &native, wchan.as_deref());
    ProcEvidence {
        pid,
        title: red.redact(&title),
        state: stat.map(|p| p.state),
        wchan: wchan.filter(|w| !w.is_empty()),
        at,
        files,
        notes,
    }
}

/// NCCL flight-recorder dumps named by a process's environment: with `TORCH_NCCL_TRACE_BUFFER_SIZE`
/// (newer PyTorch: `TORCH_FR_BUFFER_SIZE`) above 0, PyTorch's ProcessGroupNCCL writes one file per rank
/// at `TORCH_NCCL_DEBUG_INFO_TEMP_FILE` (`TORCH_FR_DUMP_TEMP_FILE`; default `/tmp/nccl_trace_rank_`) +
/// rank when its watchdog fires (TORCH_NCCL_DUMP_ON_TIMEOUT). See the PyTorch docs page "PYTORCH
/// ProcessGroupNCCL Environment Variables" and torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp.
fn nccl_prefix(pid: i32) -> Option<String> {
    let env = read_bounded(Path::new(&format!("/proc/{pid}/environ")), 1 << 20)?;
    let get = |k: &str| env.split('\0').find_map(|kv| kv.strip_prefix(k)?.strip_prefix('=').map(str::to_string));
    let size = get("TORCH_NCCL_TRACE_BUFFER_SIZE").or_else(|| get("TORCH_FR_BUFFER_SIZE"))?;
    if size.trim().parse::<u64>().ok()? == 0 {
        return None;
    }
    Some(
        get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
            .or_else(|| get("TORCH_FR_DUMP_TEMP_FILE"))
            .unwrap_or_else(|| "/tmp/nccl_trace_rank_".into()),
    )
}

fn copy_dumps(prefix: &str, dir: &Path, out: &mut Vec<String>) {
    let p = Path::new(prefix);
    let (Some(d), Some(stem)) = (p.parent(), p.file_name().and_then(|s| s.to_str())) else { return };
    let Ok(rd) = std::fs::read_dir(d) else { return };
    for e in rd.flatten().take(10_000) {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.starts_with(stem) || out.len() >= MAX_DUMPS {
            continue;
        }
        let Ok(b) = crate::sources::procs::read_small(&e.path(), MAX_DUMP) else { continue };
        let keep = format!("nccl-{name}");
        if crate::state::write_private(&dir.join(&keep), &b).is_ok() {
            out.push(keep);
        }
    }
}

/// Captures every process of the tree under `root` (root included) into `dir`, in parallel, bounded.
pub fn gather(root: i32, dir: &Path, secrets: &[String]) -> Evidence {
    let t0 = Instant::now();
    let mut red = Redactor::default();
    for s in secrets {
        red.add(s);
    }
    let mut notes = Vec::new();
    if crate::state::mkdir_private(dir).is_err() {
        notes.push(format!("cannot create {}: nothing saved", dir.display()));
    }
    let mut pids = vec![root];
    pids.extend(crate::sources::procs::descendants(root));
    if pids.len() > MAX_PROCS {
        notes.push(format!("{} processes: the first {MAX_PROCS} captured", pids.len()));
        pids.truncate(MAX_PROCS);
    }
    let root_exe = std::fs::read_link(format!("/proc/{root}/exe")).ok();
    let py_spy = find_py_spy(root_exe.as_deref());
    let eu = eu_stack();
    // at most 8 tool runs at once: a stalled 8-GPU server is captured in about the time of one
    let mut procs = Vec::new();
    for (i, chunk) in pids.chunks(8).enumerate() {
        if t0.elapsed() >= TOTAL_DEADLINE {
            notes.push(format!(
                "capture stopped after {} s: {} process(es) left out",
                TOTAL_DEADLINE.as_secs(),
                pids.len() - i * 8
            ));
            break;
        }
        let hs: Vec<_> = chunk
            .iter()
            .map(|&pid| {
                let (dir, py, eu, red) = (dir.to_path_buf(), py_spy.clone(), eu.clone(), red.clone());
                std::thread::spawn(move || capture(pid, &dir, py.as_deref(), eu.as_deref(), &red))
            })
            .collect();
        procs.extend(hs.into_iter().filter_map(|h| h.join().ok()));
    }
    procs.retain(|p| p.state.is_some() || !p.files.is_empty());
    let mut nccl_dumps = Vec::new();
    let mut prefixes: Vec<String> = pids.iter().filter_map(|p| nccl_prefix(*p)).collect();
    prefixes.sort();
    prefixes.dedup();
    for p in &prefixes {
        copy_dumps(p, dir, &mut nccl_dumps);
    }
    let ev =
        Evidence { dir: dir.display().to_string(), procs, nccl_dumps, notes, took_ms: t0.elapsed().as_millis() as u64 };
    let _ = crate::node::run::write_json(&dir.join("evidence.json"), &ev);
    ev
}

/// The folder for evidence taken now: inside the run's folder when there is one, else under the state
/// folder (`evidence/pid-N-<ms>`).
pub fn dir_for(run_dir: Option<&Path>, root: i32) -> PathBuf {
    let stamp = crate::state::now_ms();
    match run_dir {
        Some(d) => d.join(format!("evidence-{stamp}")),
        None => crate::state::state_root()
            .unwrap_or_else(|_| std::env::temp_dir().join("vigil"))
            .join("evidence")
            .join(format!("pid-{root}-{stamp}")),
    }
}
