//! The CLI explaining itself: help headings, the examples of each command, the version line, and
//! `vigil completions` / `vigil man`, generated from the same clap definitions as `--help`.
//!
//! The examples live here as text so main.rs keeps only the flag definitions; a test parses every
//! `vigil ...` line of every example with the real parser, so an example cannot drift from the flags.

use crate::error::CliError;
use crate::exit::Exit;
use clap::Command;
use std::io::Write;
use std::path::Path;

/// `vigil --version`: the package version and the commit it was built from (build.rs).
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("VIGIL_GIT_COMMIT"), ")");

// Help headings: every flag of every command sits under one of these (or under "Options").

/// Where the log, the process and the server kind come from (`wait`, `probe`).
pub const TARGET: &str = "What to watch";
/// Health URL, probe pacing and timeouts, the API key.
pub const PROBING: &str = "Probing";
/// The overall deadline and the per-phase stall limits.
pub const LIMITS: &str = "Deadlines and stalls";
/// The real completion that proves readiness, and the watch after ready.
pub const PROOF: &str = "Proof and watch";
/// What vigil prints (JSON lines, quiet, echo) and exports (Prometheus).
pub const OUTPUT: &str = "Output";
/// What `up` launches: the run name, the server kind, its environment, the preflight.
pub const LAUNCH: &str = "Launch";
/// The keeper: detach, keep, stop grace, log rotation.
pub const SUPERVISION: &str = "Supervision";
/// The global remote flags (`--host`, `--hosts`, the SSH connection).
pub const REMOTE: &str = "Remote (SSH)";
/// The global `--profiles`.
pub const PROFILES: &str = "Profiles";
/// `up --multi-node` under a launcher: Slurm, a LeaderWorkerSet, any (docs/multi-node.md, docs/slurm.md).
pub const SLURM: &str = "Multi-node under a launcher (Slurm, LeaderWorkerSet, --rank/--ranks/--rendezvous)";

/// Every heading, for the test that no flag uses a misspelt one.
#[cfg(test)]
pub const HEADINGS: &[&str] = &[TARGET, PROBING, LIMITS, PROOF, OUTPUT, LAUNCH, SUPERVISION, REMOTE, PROFILES, SLURM];

pub const ABOUT: &str = "\
Brings up and watches LLM inference servers (SGLang, vLLM, llama-server, TGI).

vigil reads the server's log to know the phase of every rank (weights, KV cache, CUDA graphs, HTTP, \
warmup), probes lazily, proves readiness with one real completion, and says at every moment whether \
the server is still starting, ready, crashed (with the root-cause lines, the cause and a hint), \
stalled (the phase and the time since progress) or timed out.";

pub const VIGIL: &str = "\
Examples:
  # launch SGLang on 8 GPUs under a keeper; return at the verdict and leave it running
  vigil up --name kimi --detach -- python -m sglang.launch_server --model-path /models/Kimi-K2 --tp 8 --port 30000
  # where every run stands, then one run's log
  vigil status
  vigil logs kimi -f
  # post-mortem of a log that some other tool wrote
  vigil diagnose /var/log/sglang.log --explain

Exit codes:
  0 ready, 1 internal error, 2 bad command line or input, 3 crashed, 4 stalled, 5 timeout,
  6 unhealthy, 7 still starting (diagnose), 8 up refused (port taken, earlier run alive),
  9 not stopped (down), 10 check failed (check, or up's preflight: nothing launched),
  11 degraded (speculation off), 12 host unreachable, 13 the run's keeper died (the server lives on,
  its output lost; down stops it), 130 interrupted.

Durations are written 500ms, 90s, 5m, 1h or a bare number of seconds.
`vigil COMMAND --help` shows a command's flags and examples; `vigil man` the manual page.";

pub const DIAGNOSE: &str = "\
Examples:
  # why did it die: verdict, phase, cause, the root-cause lines and a hint
  vigil diagnose /var/log/sglang.log
  # which pattern of which profile matched which line
  vigil diagnose server.log --explain
  # the previous container's log, from stdin; the last JSON line is the verdict
  kubectl logs sglang-0 --previous | vigil diagnose --json - | tail -1";

pub const WAIT: &str = "\
Examples:
  # a run of `vigil up`, from any shell: same verdict
  vigil wait kimi
  # a server started elsewhere: follow its log, watch its pid, probe its health URL
  vigil wait --log /var/log/sglang.log --pid 12345 --url http://127.0.0.1:30000/health
  # its log through a command, a longer deadline, 20 minutes for CUDA graph capture
  vigil wait --log-cmd 'kubectl logs -f sglang-0' --url http://10.0.0.5:30000/health --timeout 90m --stall cuda_graphs=20m
  # answer probes and dashboards over HTTP: /startupz /readyz /livez /status /events /metrics
  vigil wait kimi --listen 9464";

pub const TIMELINE: &str = "\
Examples:
  # on a terminal: one row per rank, the lagging rank marked
  vigil timeline kimi
  # a standalone SVG of an old log, to attach to a bug report
  vigil timeline /var/log/sglang/node0.log --svg startup.svg";

pub const HISTORY: &str = "\
Examples:
  # past startups of one run, newest last, then per-phase medians and spread
  vigil history kimi
  # JSON lines (name, key, verdict, total_ms, phases) for a dashboard
  vigil history --json
  # a team's old logs count from day one
  vigil history import /var/log/sglang/*.log

Every startup that up, wait and watch follow is recorded (SQLite, ~/.local/state/vigil/history.db or
$VIGIL_HISTORY; kept on a local path when the state directory is on NFS). See docs/history.md.";

pub const WATCH: &str = "\
Examples:
  # after ready: health probes, a real completion every minute, the log, the process
  vigil watch kimi
  # a generation probe every 5 minutes, /readyz and Prometheus metrics on 127.0.0.1:9464
  vigil watch kimi --generate-every 5m --listen 9464
  # on every address, each request with the token of the file
  vigil watch kimi --listen 0.0.0.0:9464 --listen-token-file /run/secrets/vigil-token
  # JSON lines for a log shipper
  vigil watch kimi --json >> /var/log/vigil-kimi.jsonl";

pub const PROBE: &str = "\
Examples:
  # Kubernetes exec probe on a run of `vigil up`
  vigil probe kimi
  # any llama-server: its health URL and its log, and one real completion
  vigil probe --url http://127.0.0.1:8080/health --log /var/log/llama-server.log --generate --timeout 30s";

pub const PROFILES_CMD: &str = "\
Examples:
  # the built-in profiles and yours ($XDG_CONFIG_HOME/vigil/profiles/*.toml)
  vigil profiles
  # with a directory of site rules added
  vigil --profiles ./site-profiles profiles";

pub const CHECK: &str = "\
Examples:
  # SGLang with an EAGLE-3 draft: draft vs target context, hidden size, vocab, TP vs heads
  vigil check -- python -m sglang.launch_server --model-path meta-llama/Llama-3.1-8B-Instruct --speculative-algorithm EAGLE3 --speculative-draft-model-path /models/eagle3-llama3.1-8b --tp 2
  # vLLM, as JSON
  vigil check --json -- vllm serve Qwen/Qwen2.5-7B-Instruct --max-model-len 65536 --tensor-parallel-size 4
  # llama-server with a draft model: GGUF headers and the draft vocabulary
  vigil check -- llama-server -m /models/qwen2.5-7b-q4_k_m.gguf -md /models/qwen2.5-0.5b-q8_0.gguf --port 8080";

pub const UP: &str = "\
Examples:
  # SGLang on 8 GPUs: return at the verdict and leave it running
  vigil up --name kimi --detach -- python -m sglang.launch_server --model-path /models/Kimi-K2 --tp 8 --port 30000
  # vLLM with an env file, 30 minutes for CUDA graphs, watched after ready
  vigil up --name qwen --env-file vllm.env --stall cuda_graphs=30m --watch -- vllm serve Qwen/Qwen2.5-72B-Instruct --tensor-parallel-size 4 --port 8000
  # llama-server with a draft model (vigil proves speculation is on)
  vigil up --name llama -- llama-server -m /models/qwen2.5-7b-q4_k_m.gguf -md /models/qwen2.5-0.5b-q8_0.gguf --port 8080
  # on a remote node over SSH
  vigil --host gpu7 up -- python -m sglang.launch_server --model-path /models/K2 --tp 8
  # in a Slurm job: one vigil per node, the combined verdict on the first node (docs/slurm.md)
  srun --ntasks-per-node=1 vigil up --multi-node --scancel job -- python -m sglang.launch_server --model-path /models/K2 --tp 16 --nnodes 2 --node-rank 0

Nothing launched: exit 8 when the port is taken or an earlier run of the name is alive
(a retry may pass); exit 10 when the preflight check finds errors the server is known to
refuse (fix the command; --no-check skips the check). Otherwise the verdict's code:
0 ready, 3 crashed, 4 stalled, 5 timeout, 11 degraded.";

pub const DOWN: &str = "\
Examples:
  vigil down kimi
  # every run, 30 s between SIGTERM and SIGKILL
  vigil down --all --grace 30s
  # a server vigil did not start (pids from `vigil ps`)
  vigil down --pid 12345";

pub const STATUS: &str = "\
Examples:
  vigil status
  vigil status --json
  # two nodes, one table
  vigil --hosts gpu1,gpu2 status";

pub const LOGS: &str = "\
Examples:
  vigil logs kimi
  # the last 200 lines, then follow
  vigil logs kimi -f -n 200
  # a run on a remote node
  vigil --host gpu7 logs sglang -f";

pub const DUMP: &str = "\
Examples:
  # where every process of the run is now (saved in the run's folder)
  vigil dump kimi
  # a server vigil did not start, as JSON
  vigil dump --pid 4242 --json

Python stacks need py-spy (pip install py-spy; found on PATH, beside the server's interpreter, or
$VIGIL_PY_SPY), native stacks eu-stack (apt-get install elfutils); wait channels are always read.
See docs/evidence.md.";

pub const RESTART: &str = "\
Examples:
  vigil restart kimi
  # a longer grace for the stop and a shorter deadline for the new start
  vigil restart kimi --grace 60s --timeout 1h";

pub const PS: &str = "\
Examples:
  vigil ps
  vigil ps --json
  # then stop one of them, proving nothing is left
  vigil down --pid 12345";

pub const GPU: &str = "\
Examples:
  vigil gpu
  vigil gpu --json
  # every 2 seconds
  watch -n 2 vigil gpu";

pub const COMPLETIONS: &str = "\
Examples:
  vigil completions bash > ~/.local/share/bash-completion/completions/vigil
  # zsh: a directory in $fpath (e.g. fpath=(~/.zfunc $fpath) before compinit in ~/.zshrc)
  vigil completions zsh > ~/.zfunc/_vigil
  vigil completions fish > ~/.config/fish/completions/vigil.fish";

pub const MAN: &str = "\
Examples:
  # read it now
  vigil man | man -l -
  # install one page per command (vigil.1, vigil-up.1, ...), then `man vigil-up`
  vigil man --dir ~/.local/share/man/man1";

/// `vigil completions SHELL`: the completion script on stdout.
pub fn completions(shell: clap_complete::Shell, cmd: Command) -> Result<Exit, CliError> {
    let mut buf = Vec::new();
    clap_complete::generate(shell, &mut without_hidden(cmd), "vigil", &mut buf);
    write_stdout(&buf)
}

/// The root command less its hidden subcommands (`__keeper`), which clap_complete would offer
/// (clap cannot remove a subcommand, so the root is rebuilt from its parts: version, about, flags,
/// the visible subcommands).
fn without_hidden(cmd: Command) -> Command {
    Command::new("vigil")
        .version(VERSION)
        .about(cmd.get_about().cloned().unwrap_or_default())
        .args(cmd.get_arguments().cloned())
        .subcommands(cmd.get_subcommands().filter(|s| !s.is_hide_set()).cloned())
}

/// `vigil man`: the top page on stdout; `--dir DIR`: one page per command written to DIR.
pub fn man(mut cmd: Command, dir: Option<&Path>) -> Result<Exit, CliError> {
    // Building the root first names the subcommands `vigil-up` and their synopsis `vigil up`.
    cmd = cmd.disable_help_subcommand(true);
    cmd.build();
    let Some(dir) = dir else {
        let mut buf = Vec::new();
        render_page(&cmd, &mut buf).map_err(|e| CliError::Internal(format!("man: {e}")))?;
        return write_stdout(&buf);
    };
    let err = |e: std::io::Error| CliError::usage(format!("man --dir {}: {e}", dir.display()));
    std::fs::create_dir_all(dir).map_err(err)?;
    let mut pages = vec![cmd.clone()];
    pages.extend(cmd.get_subcommands().filter(|s| !s.is_hide_set()).cloned());
    for page in &pages {
        let mut buf = Vec::new();
        render_page(page, &mut buf).map_err(err)?;
        let name = format!("{}.1", page.get_display_name().unwrap_or_else(|| page.get_name()));
        std::fs::write(dir.join(&name), &buf).map_err(err)?;
        crate::sinks::report::out_line(&dir.join(&name).display().to_string());
    }
    Ok(Exit::Ready)
}

/// One manual page: clap_mangen's sections, with the long help's trailing text (examples, exit
/// codes) as sections of their own in no-fill mode, so example lines stay one per line.
fn render_page(cmd: &Command, w: &mut Vec<u8>) -> std::io::Result<()> {
    let man = clap_mangen::Man::new(cmd.clone()).source(format!("vigil {VERSION}"));
    man.render_title(w)?;
    man.render_name_section(w)?;
    man.render_synopsis_section(w)?;
    man.render_description_section(w)?;
    if cmd.get_arguments().any(|a| !a.is_hide_set()) {
        man.render_options_section(w)?;
    }
    if cmd.get_subcommands().any(|s| !s.is_hide_set()) {
        man.render_subcommands_section(w)?;
    }
    if let Some(text) = cmd.get_after_long_help() {
        w.extend_from_slice(roff_blocks(&text.to_string()).as_bytes());
    }
    if cmd.get_version().is_some() {
        man.render_version_section(w)?;
    }
    Ok(())
}

/// Turns `Heading:` blocks of plain text into `.SH HEADING` sections with their lines kept as
/// written (`.nf`); other paragraphs become filled ones.
fn roff_blocks(text: &str) -> String {
    let mut out = String::new();
    for block in text.split("\n\n") {
        let mut lines = block.lines();
        let Some(first) = lines.next() else { continue };
        match first.strip_suffix(':').filter(|h| !h.starts_with(' ')) {
            Some(h) => {
                out.push_str(&format!(".SH {}\n.nf\n", h.to_uppercase()));
                for l in lines {
                    out.push_str(&roff_line(l.strip_prefix("  ").unwrap_or(l)));
                    out.push('\n');
                }
                out.push_str(".fi\n");
            }
            None => {
                out.push_str(".PP\n");
                for l in block.lines() {
                    out.push_str(&roff_line(l.trim()));
                    out.push('\n');
                }
            }
        }
    }
    out
}

/// One line of text for roff: backslashes and hyphens escaped, a leading control character guarded.
fn roff_line(l: &str) -> String {
    let s = l.replace('\\', "\\e").replace('-', "\\-");
    if s.starts_with('.') || s.starts_with('\'') {
        format!("\\&{s}")
    } else {
        s
    }
}

/// Writes generated text to stdout; a reader that went away (`vigil man | head`) is not an error.
fn write_stdout(buf: &[u8]) -> Result<Exit, CliError> {
    let mut o = std::io::stdout().lock();
    match o.write_all(buf).and_then(|_| o.flush()) {
        Ok(()) => Ok(Exit::Ready),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(Exit::Ready),
        Err(e) => Err(CliError::Internal(format!("writing to stdout: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::Cli;
    use clap::{CommandFactory, Parser};

    fn built() -> Command {
        let mut c = Cli::command();
        c.build();
        c
    }

    fn walk<'a>(cmd: &'a Command, path: &str, out: &mut Vec<(String, &'a Command)>) {
        out.push((path.to_string(), cmd));
        for s in cmd.get_subcommands() {
            walk(s, &format!("{path} {}", s.get_name()), out);
        }
    }

    /// Issue #16: every flag, argument and subcommand of every command says what it is for.
    #[test]
    fn every_flag_and_subcommand_has_help() {
        let root = built();
        let mut cmds = Vec::new();
        walk(&root, "vigil", &mut cmds);
        let mut missing = Vec::new();
        for (path, cmd) in &cmds {
            if *path != "vigil" && cmd.get_about().is_none_or(|a| a.to_string().trim().is_empty()) {
                missing.push(format!("{path}: subcommand without about"));
            }
            for a in cmd.get_arguments() {
                let id = a.get_id().as_str();
                if id == "help" || id == "version" {
                    continue;
                }
                let name = a.get_long().map(|l| format!("--{l}")).unwrap_or_else(|| format!("<{id}>"));
                if a.get_help().is_none_or(|h| h.to_string().trim().is_empty()) {
                    missing.push(format!("{path} {name}: no help"));
                }
                if let Some(h) = a.get_help_heading() {
                    if !HEADINGS.contains(&h) {
                        missing.push(format!("{path} {name}: unknown heading '{h}'"));
                    }
                }
            }
        }
        assert!(missing.is_empty(), "{} without help:\n{}", missing.len(), missing.join("\n"));
    }

    /// The global remote flags sit under the Remote heading in every command.
    #[test]
    fn remote_flags_are_grouped() {
        let root = built();
        let up = root.find_subcommand("up").unwrap();
        for f in ["host", "hosts", "hosts_file", "multi_node", "parallel", "ssh_config", "connect_timeout"] {
            let a = up.get_arguments().find(|a| a.get_id() == f).unwrap_or_else(|| panic!("{f}"));
            assert_eq!(a.get_help_heading(), Some(REMOTE), "{f}");
        }
    }

    /// Splits an example line as sh would, for the simple quoting the examples use.
    fn words(line: &str) -> Vec<String> {
        let (mut v, mut cur, mut quote, mut any) = (Vec::new(), String::new(), false, false);
        for c in line.chars() {
            match c {
                '\'' => (quote, any) = (!quote, true),
                ' ' if !quote => {
                    if any {
                        v.push(std::mem::take(&mut cur));
                    }
                    any = false;
                }
                c => (cur, any) = (cur + &c.to_string(), true),
            }
        }
        if any {
            v.push(cur);
        }
        v
    }

    /// Every visible command has examples in its long help, and each `vigil ...` example parses.
    #[test]
    fn examples_exist_and_parse() {
        let root = built();
        let mut cmds = Vec::new();
        walk(&root, "vigil", &mut cmds);
        let mut checked = 0;
        for (path, cmd) in cmds.iter().filter(|(p, c)| !c.is_hide_set() && p != "vigil help") {
            if path.matches(' ').count() > 1 {
                continue;
            }
            let text = cmd.get_after_long_help().map(|t| t.to_string()).unwrap_or_default();
            assert!(text.starts_with("Examples:\n"), "{path}: no examples in its long help");
            let mut n = 0;
            let examples = text.split("\n\n").next().unwrap();
            for l in examples.lines().skip(1).map(str::trim).filter(|l| !l.starts_with('#')) {
                // the vigil part of a pipeline or a redirection
                let Some(i) = l.find("vigil ") else { continue };
                let l = &l[i..];
                let l = l.split(" | ").next().unwrap().split(" >").next().unwrap();
                if let Err(e) = Cli::try_parse_from(words(l)) {
                    panic!("{path}: example does not parse: {l}\n{e}");
                }
                n += 1;
            }
            assert!(n >= 2, "{path}: {n} examples");
            checked += 1;
        }
        assert!(checked >= 14, "{checked}");
    }

    /// Completions offer every visible command and none of the hidden ones.
    #[test]
    fn completions_leave_out_hidden_commands() {
        let c = without_hidden(Cli::command());
        let names: Vec<_> = c.get_subcommands().map(|s| s.get_name()).collect();
        assert!(names.contains(&"up") && names.contains(&"man"), "{names:?}");
        assert!(!names.contains(&"__keeper"), "{names:?}");
        assert!(c.get_arguments().any(|a| a.get_id() == "host"));
        assert_eq!(c.get_version(), Some(VERSION));
    }

    #[test]
    fn roff_keeps_example_lines() {
        let r = roff_blocks("Examples:\n  # a\n  vigil up --name x -- a\\b\n\nplain text\n.x");
        assert_eq!(r, ".SH EXAMPLES\n.nf\n# a\nvigil up \\-\\-name x \\-\\- a\\eb\n.fi\n.PP\nplain text\n\\&.x\n");
    }
}
