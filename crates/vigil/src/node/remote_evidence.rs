//! Evidence of a run on a remote node (issue #17), over the run's SSH connection: one small shell script
//! runs on the node (the node has no vigil binary) and prints, for every process of the run's tree, its
//! state, wait channel, title and the output of py-spy and eu-stack where they are installed there, each
//! tool run bounded by `timeout 10` and `head -c 1 MiB`. vigil parses it here with the same core parsers,
//! saves the raw output locally and summarises it like a local capture.

use crate::node::remote::Conn;
use crate::sinks::redact::Redactor;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use vigil_core::evidence::{self, Evidence, ProcEvidence};

/// The whole script's deadline: 8 processes' tools at 10 s each would be the worst of a stuck node.
const SCRIPT_DEADLINE: Duration = Duration::from_secs(120);

const SCRIPT: &str = r#"[ -f "$D/pid" ] || { echo "@@none"; exit 3; }
read sp kp < "$D/pid"
kill -0 "$sp" 2>/dev/null || { echo "@@dead"; exit 4; }
tree=$(ps -e -o pid= -o ppid= 2>/dev/null | awk -v r="$sp" '{par[$1]=$2} END{t[r]=1; c=1; while(c){c=0; for(p in par) if(!(p in t) && (par[p] in t)){t[p]=1; c=1}} print r; for(p in t) if(p!=r) print p}' | head -n 128)
spy=$(command -v py-spy 2>/dev/null)
eu=$(command -v eu-stack 2>/dev/null)
for p in $tree; do
  [ -d "/proc/$p" ] || continue
  echo "@@proc $p"
  echo "@@state $(sed 's/.*) //' "/proc/$p/stat" 2>/dev/null | cut -d' ' -f1)"
  echo "@@wchan $(cat "/proc/$p/wchan" 2>/dev/null)"
  echo "@@title $(head -c 512 "/proc/$p/cmdline" 2>/dev/null | tr '\000\n' '  ')"
  exe=$(readlink "/proc/$p/exe" 2>/dev/null)
  case "${exe##*/}" in python*)
    s="$spy"; [ -z "$s" ] && [ -x "${exe%/*}/py-spy" ] && s="${exe%/*}/py-spy"
    if [ -n "$s" ]; then echo "@@py-spy"; timeout 10 "$s" dump --native --pid "$p" 2>&1 | head -c 1048576; echo; echo "@@end"
    else echo "@@note py-spy not found on the node (PATH, beside the interpreter): pip install py-spy"; fi;;
  esac
  if [ -n "$eu" ]; then echo "@@eu-stack"; timeout 10 "$eu" -p "$p" 2>&1 | head -c 1048576; echo; echo "@@end"
  else echo "@@note eu-stack not found on the node: apt-get install elfutils"; fi
done
# NCCL flight-recorder dumps the tree's environment enables (the rules of evidence.rs nccl_prefix), in hex
seen=" "; n=0
for p in $tree; do
  env=$(head -c 1048576 "/proc/$p/environ" 2>/dev/null | tr '\000' '\n')
  get() { printf '%s\n' "$env" | sed -n "s/^$1=//p" | head -n 1; }
  size=$(get TORCH_NCCL_TRACE_BUFFER_SIZE); [ -n "$size" ] || size=$(get TORCH_FR_BUFFER_SIZE)
  case "$size" in ''|0|*[!0-9]*) continue;; esac
  pre=$(get TORCH_NCCL_DEBUG_INFO_TEMP_FILE); [ -n "$pre" ] || pre=$(get TORCH_FR_DUMP_TEMP_FILE)
  [ -n "$pre" ] || pre=/tmp/nccl_trace_rank_
  case "$seen" in *" $pre "*) continue;; esac
  seen="$seen$pre "
  for f in "$pre"*; do
    [ -f "$f" ] || continue
    n=$((n+1)); [ "$n" -le 16 ] || break
    echo "@@nccl ${f##*/}"; head -c 4194304 "$f" | od -An -v -tx1 | tr -d ' \n'; echo; echo "@@end"
  done
done
"#;

/// An NCCL flight-recorder dump read on the node: its file name there and its bytes.
#[derive(Debug, Default, PartialEq)]
struct Dump {
    name: String,
    bytes: Vec<u8>,
}

/// The hex the script prints (`od -tx1`), back to bytes; None when it is not hex.
fn unhex(s: &str) -> Option<Vec<u8>> {
    let s = s.trim().as_bytes();
    if !s.len().is_multiple_of(2) {
        return None;
    }
    s.chunks(2).map(|c| u8::from_str_radix(std::str::from_utf8(c).ok()?, 16).ok()).collect()
}

#[derive(Debug, Default)]
struct Raw {
    pid: i32,
    state: Option<char>,
    wchan: Option<String>,
    title: String,
    py_spy: Option<String>,
    eu_stack: Option<String>,
    notes: Vec<String>,
}

/// What a `@@name` ... `@@end` block of the script holds.
enum Block {
    PySpy,
    EuStack,
    /// An NCCL dump, by its file name on the node (kept only as a plain file name here).
    Nccl(String),
}

/// Splits the script's output into processes and NCCL dumps.
fn parse(out: &str) -> (Vec<Raw>, Vec<Dump>) {
    let mut v: Vec<Raw> = Vec::new();
    let mut dumps = Vec::new();
    let mut block: Option<(Block, String)> = None;
    for l in out.lines() {
        if let Some((which, text)) = &mut block {
            if l == "@@end" {
                let t = std::mem::take(text);
                match which {
                    Block::Nccl(name) => {
                        if let Some(bytes) = unhex(&t) {
                            dumps.push(Dump { name: std::mem::take(name), bytes });
                        }
                    }
                    Block::PySpy => {
                        if let Some(r) = v.last_mut() {
                            r.py_spy = Some(t);
                        }
                    }
                    Block::EuStack => {
                        if let Some(r) = v.last_mut() {
                            r.eu_stack = Some(t);
                        }
                    }
                }
                block = None;
            } else {
                text.push_str(l);
                text.push('\n');
            }
            continue;
        }
        if let Some(name) = l.strip_prefix("@@nccl ") {
            let name: String = name
                .trim()
                .chars()
                .map(|c| if c.is_ascii_alphanumeric() || "-_.".contains(c) { c } else { '_' })
                .collect();
            block = Some((Block::Nccl(name.trim_start_matches('.').to_string()), String::new()));
            continue;
        }
        if let Some(p) = l.strip_prefix("@@proc ") {
            v.push(Raw { pid: p.trim().parse().unwrap_or(0), ..Raw::default() });
            continue;
        }
        let Some(r) = v.last_mut() else { continue };
        if let Some(s) = l.strip_prefix("@@state ") {
            r.state = s.trim().chars().next();
        } else if let Some(s) = l.strip_prefix("@@wchan") {
            r.wchan = Some(s.trim().to_string()).filter(|s| !s.is_empty());
        } else if let Some(s) = l.strip_prefix("@@title") {
            r.title = s.trim().to_string();
        } else if let Some(s) = l.strip_prefix("@@note ") {
            r.notes.push(s.trim().to_string());
        } else if l == "@@py-spy" {
            block = Some((Block::PySpy, String::new()));
        } else if l == "@@eu-stack" {
            block = Some((Block::EuStack, String::new()));
        }
    }
    (v, dumps)
}

/// Where a remote run's evidence is kept on this machine.
fn local_dir(host: &str, name: &str) -> PathBuf {
    let h: String =
        host.chars().map(|c| if c.is_ascii_alphanumeric() || "-_.@".contains(c) { c } else { '_' }).collect();
    crate::state::state_root()
        .unwrap_or_else(|_| std::env::temp_dir().join("vigil"))
        .join("evidence")
        .join("remote")
        .join(h)
        .join(format!("{name}-{}", crate::state::now_ms()))
}

fn tool_text(t: &str, red: &Redactor, dir: &Path, file: &str, files: &mut Vec<String>, notes: &mut Vec<String>) {
    if crate::state::write_private(&dir.join(file), red.redact(t).as_bytes()).is_ok() {
        files.push(file.to_string());
    }
    // a tool that failed printed its error instead of stacks
    let first = t.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    if first.starts_with("Error") || first.contains("Operation not permitted") || first.contains("cannot") {
        notes.push(first.chars().take(200).collect());
    }
}

/// Captures the run `name` on the node behind `c`.
pub async fn capture(c: &Conn, name: &str, secrets: &[String]) -> Result<Evidence, String> {
    let t0 = Instant::now();
    let mut s = c.prelude(name);
    s.extend_from_slice(SCRIPT.as_bytes());
    let (code, out, _) = c.exec(&s, SCRIPT_DEADLINE).await.map_err(|e| format!("{e:?}"))?;
    let text = String::from_utf8_lossy(&out).into_owned();
    match code {
        3 => return Err(format!("no run named '{name}' on {}", c.dest)),
        4 => return Err(format!("the server of '{name}' on {} is not running", c.dest)),
        _ => {}
    }
    let mut red = Redactor::default();
    for s in secrets {
        red.add(s);
    }
    let dir = local_dir(&c.dest, name);
    let mut notes = vec![format!("captured on {}", c.dest)];
    if crate::state::mkdir_private(&dir).is_err() {
        notes.push(format!("cannot create {}: nothing saved", dir.display()));
    }
    let mut procs = Vec::new();
    let (raws, dumps) = parse(&text);
    let mut nccl_dumps = Vec::new();
    for d in dumps.into_iter().filter(|d| !d.name.is_empty()) {
        let keep = format!("nccl-{}", d.name);
        if crate::state::write_private(&dir.join(&keep), &d.bytes).is_ok() {
            nccl_dumps.push(keep);
        }
    }
    for r in raws {
        let (mut files, mut pnotes) = (Vec::new(), r.notes.clone());
        let py = r.py_spy.as_deref().map(evidence::parse_py_spy).unwrap_or_default();
        let nat = r.eu_stack.as_deref().map(evidence::parse_eu_stack).unwrap_or_default();
        if let Some(t) = &r.py_spy {
            tool_text(t, &red, &dir, &format!("pid-{}.py-spy.txt", r.pid), &mut files, &mut pnotes);
        }
        if let Some(t) = &r.eu_stack {
            tool_text(t, &red, &dir, &format!("pid-{}.eu-stack.txt", r.pid), &mut files, &mut pnotes);
        }
        procs.push(ProcEvidence {
            pid: r.pid,
            title: red.redact(&r.title),
            state: r.state,
            at: evidence::summarize(r.pid, &py, &nat, r.wchan.as_deref()),
            wchan: r.wchan,
            files,
            notes: pnotes,
        });
    }
    let ev =
        Evidence { dir: dir.display().to_string(), procs, nccl_dumps, notes, took_ms: t0.elapsed().as_millis() as u64 };
    let _ = crate::node::run::write_json(&dir.join("evidence.json"), &ev);
    Ok(ev)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nccl_dumps_come_back_byte_for_byte_and_only_as_plain_names() {
        let out = "@@proc 42\n@@state S\n@@wchan futex_wait\n@@title python3 -m sglang\n\
                   @@nccl nccl_trace_rank_0\n00ff800a41\n@@end\n@@nccl ../../etc/passwd\n6869\n@@end\n\
                   @@nccl bad\nzz\n@@end\n";
        let (procs, dumps) = parse(out);
        assert_eq!(procs.len(), 1);
        assert_eq!(procs[0].wchan.as_deref(), Some("futex_wait"));
        assert_eq!(
            dumps,
            vec![
                Dump { name: "nccl_trace_rank_0".into(), bytes: vec![0x00, 0xff, 0x80, 0x0a, 0x41] },
                Dump { name: "_.._etc_passwd".into(), bytes: b"hi".to_vec() },
            ]
        );
    }
}
