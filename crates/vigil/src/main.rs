//! vigil: brings up and watches LLM inference servers.

// The layers (docs/architecture.md, enforced by tests/layers.rs), top down: commands (the verbs, with
// cli, settings, help), supervise (the watch and the drivers of several nodes), node (one machine's runs),
// check (the preflight), sources (facts), the base (error, exit, signals, state); sinks beside them. Every
// module is named by its folder path: no crate-root aliases.
mod check;
mod cli;
mod commands;
mod error;
mod exit;
mod help;
mod node;
mod settings;
mod signals;
mod sinks;
mod sources;
mod state;
mod supervise;
use signals::install_interrupt_handlers;
use sinks::report::printable;

use clap::{CommandFactory, Parser};
use cli::{Cli, Cmd};
use error::CliError;
use exit::Exit;
use settings::{check_server, load_profiles};
use supervise::nodes::Nodes;

fn runtime() -> Result<tokio::runtime::Runtime, CliError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::Internal(format!("runtime: {e}")))
}

/// Runs a command's future to its end, then leaves at once: the runtime is shut down in the background, so
/// the exit (what a script waiting on `vigil wait` sees) never waits on a source still blocked in a read.
fn block_on<F: std::future::Future>(f: F) -> Result<F::Output, CliError> {
    let rt = runtime()?;
    let out = rt.block_on(f);
    rt.shutdown_background();
    Ok(out)
}

fn main() {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        // a bad value (a duration, a stall limit) is one line, like every other usage error
        Err(e) if e.kind() == clap::error::ErrorKind::ValueValidation => {
            let text = e.render().to_string();
            let first = text.lines().next().unwrap_or("invalid value");
            eprintln!("vigil: {}", first.strip_prefix("error: ").map_or(first.to_string(), |m| format!("error: {m}")));
            std::process::exit(Exit::Usage.code());
        }
        Err(e) => e.exit(),
    };
    let code = match run(cli) {
        Ok(c) => c,
        Err(CliError::Usage(m)) => {
            eprintln!("vigil: error: {}", printable(&m));
            Exit::Usage
        }
        Err(CliError::Internal(m)) => {
            eprintln!("vigil: internal error: {}", printable(&m));
            Exit::Internal
        }
        Err(CliError::Unreachable(m)) => {
            eprintln!("vigil: error: {}", printable(&m));
            Exit::Unreachable
        }
    };
    std::process::exit(code.code());
}

fn run(cli: Cli) -> Result<Exit, CliError> {
    use std::os::unix::ffi::OsStringExt;
    if let Cmd::Keeper { dir } = cli.cmd {
        return Ok(node::keeper::main(dir));
    }
    // Generated from the definitions alone: no profiles, no remote host.
    if let Cmd::Completions { shell } = cli.cmd {
        return help::completions(shell, Cli::command());
    }
    if let Cmd::Man { dir } = &cli.cmd {
        return help::man(Cli::command(), dir.as_deref());
    }
    if !matches!(
        cli.cmd,
        Cmd::Diagnose { .. } | Cmd::Profiles | Cmd::Logs { .. } | Cmd::History { .. } | Cmd::Timeline { .. }
    ) {
        install_interrupt_handlers();
    }
    let rf = &cli.remote;
    // `down` on this machine uses no profile: a broken profile never blocks a stop (it is said, as by every
    // command that does not need the profiles)
    if rf.host.is_none() && rf.hosts.is_none() && rf.hosts_file.is_none() {
        if matches!(cli.cmd, Cmd::Down { .. }) {
            if let Err(CliError::Usage(m)) = load_profiles(&cli.profiles) {
                eprintln!("vigil: warning: {}; going on with the built-in profiles", printable(&m));
            }
        }
        match cli.cmd {
            Cmd::Down { pid: Some(pid), grace, json, .. } => return node::up::down_pid(pid, grace, json),
            Cmd::Down { names, all, pid: None, grace, json } => {
                return block_on(commands::down(&Nodes::Local, names, all, grace, json))?;
            }
            _ => {}
        }
    }
    let profiles = match load_profiles(&cli.profiles) {
        Ok(p) => p,
        // A broken user profile blocks only the commands that judge a server by the profiles; the others
        // (status, down, ps, logs, dump, gpu, history) go on with the built-in ones and say so.
        Err(CliError::Usage(m)) if !needs_profiles(&cli.cmd) => {
            eprintln!("vigil: warning: {}; going on with the built-in profiles", printable(&m));
            vigil_core::Profiles::builtin()
        }
        Err(e) => return Err(e),
    };
    if rf.connect_timeout.is_zero() {
        return Err(CliError::usage("--connect-timeout must be above zero"));
    }
    let ssh = node::remote::SshOpts {
        config: rf.ssh_config.clone(),
        connect_timeout: rf.connect_timeout,
        reconnect_for: rf.reconnect_for,
        remote_dir: rf.remote_dir.clone(),
    };
    // issues #27, #32: `vigil up --multi-node -- CMD` on every rank, started by a launcher (Slurm's srun, a
    // LeaderWorkerSet, --rank/--ranks/--rendezvous): the group's ranks, not a host list
    let no_hosts = rf.host.is_none() && rf.hosts.is_none() && rf.hosts_file.is_none();
    if let (true, true, Cmd::Up { group: sf, .. }) = (rf.multi_node, no_hosts, &cli.cmd) {
        let lws =
            ["LWS_LEADER_ADDRESS", "LWS_GROUP_SIZE", "LWS_WORKER_INDEX"].iter().all(|k| std::env::var_os(k).is_some());
        if sf.flags().named() || lws || std::env::var_os("SLURM_JOB_ID").is_some() {
            let Cmd::Up { up: f, group: sf, cmd } = cli.cmd else { unreachable!() };
            check_server(&profiles, &f.server)?;
            let argv: Vec<Vec<u8>> = cmd.into_iter().map(|a| a.into_vec()).collect();
            let a = f.into_args()?;
            let flags = sf.flags();
            return block_on(async move {
                let Some(group) = supervise::multinode::Group::find(&flags).await? else {
                    return Err(CliError::usage(
                        "--multi-node without --hosts needs a launcher: --rank N --ranks M --rendezvous HOST:PORT, a \
                         LeaderWorkerSet (LWS_*), or a Slurm job (SLURM_JOB_ID)",
                    ));
                };
                supervise::multinode::up(group, flags, a, argv, profiles).await
            })?;
        }
    } else if let Cmd::Up { group: sf, .. } = &cli.cmd {
        if sf.flags().named() {
            return Err(CliError::usage("--rank, --ranks and --rendezvous are for up --multi-node"));
        }
    }
    let hosts = supervise::hosts::Hosts::parse(
        rf.host.clone(),
        rf.hosts.clone(),
        rf.hosts_file.clone(),
        rf.multi_node,
        rf.parallel,
        ssh,
    )?;
    if let Some(hs) = hosts {
        return run_remote(cli.cmd, hs, profiles);
    }
    match cli.cmd {
        Cmd::Diagnose { files, json, explain, quiet, server } => {
            check_server(&profiles, &server)?;
            commands::diagnose::run(commands::diagnose::Args { files, json, explain, quiet, server }, &profiles)
        }
        Cmd::Wait { name, f } => {
            let w = f.into_args(&profiles)?;
            block_on(commands::wait(&Nodes::Local, name, w, profiles))?
        }
        Cmd::Up { up: f, cmd, .. } => {
            check_server(&profiles, &f.server)?;
            let argv: Vec<Vec<u8>> = cmd.into_iter().map(|a| a.into_vec()).collect();
            block_on(commands::up(&Nodes::Local, None, f.into_args()?, argv, profiles))?
        }
        Cmd::Restart { name, up: f } => block_on(commands::restart(&name, f.into_args()?, profiles))?,
        Cmd::Status { json } => block_on(commands::status(&Nodes::Local, json, &profiles))?,
        Cmd::Logs { name, follow, lines } => block_on(commands::logs(&Nodes::Local, name, follow, lines))?,
        Cmd::Dump { name, pid, json } => block_on(commands::dump(&Nodes::Local, name, pid, json))?,
        Cmd::Ps { json } => block_on(commands::ps(&Nodes::Local, json, &profiles))?,
        Cmd::Gpu { json } => commands::gpu(json),
        Cmd::Watch { name, proof, json } => block_on(commands::watch(&name, proof.into_watch(json)?, profiles))?,
        Cmd::Probe { name, url, log, generate, timeout, server, tls } => {
            let k = commands::kprobe::Args { name, url, log, generate, timeout, server, tls: tls.into() };
            block_on(commands::kprobe::run(k, &profiles))?
        }
        Cmd::Check { json, server, gpu_mem, cmd } => {
            check_server(&profiles, &server)?;
            if let Some(b) = gpu_mem {
                check::fit::set_gpu_mem(b);
            }
            block_on(commands::check(&Nodes::Local, cmd, server, json, profiles))?
        }
        Cmd::Timeline { target, svg } => commands::timeline::run(&target, svg.as_deref(), &profiles),
        Cmd::History { name, json, sub } => match sub {
            Some(cli::HistoryCmd::Import { files }) => commands::history::import(&files, &profiles),
            None => commands::history::list(name.as_deref(), json),
        },
        Cmd::Keeper { .. } | Cmd::Completions { .. } | Cmd::Man { .. } | Cmd::Down { .. } => {
            unreachable!("handled above")
        }
        Cmd::Profiles => {
            sinks::tables::profiles(&profiles);
            Ok(Exit::Ready)
        }
    }
}

/// Whether a command cannot do its work without the user's profiles as written (it launches, watches,
/// checks or diagnoses a server by them, or lists them): a profile error is then the command's error; every
/// other command treats it as a warning.
fn needs_profiles(cmd: &Cmd) -> bool {
    match cmd {
        Cmd::Status { .. }
        | Cmd::Down { .. }
        | Cmd::Ps { .. }
        | Cmd::Logs { .. }
        | Cmd::Dump { .. }
        | Cmd::Gpu { .. } => false,
        Cmd::History { sub, .. } => sub.is_some(),
        _ => true,
    }
}

/// The commands that work on remote hosts (`--host`, `--hosts`, `--hosts-file`).
fn run_remote(cmd: Cmd, hs: supervise::hosts::Hosts, profiles: vigil_core::Profiles) -> Result<Exit, CliError> {
    use std::os::unix::ffi::OsStringExt;
    let rt = runtime()?;
    match cmd {
        Cmd::Up { up: f, cmd, .. } => {
            check_server(&profiles, &f.server)?;
            let argv: Vec<Vec<u8>> = cmd.into_iter().map(|a| a.into_vec()).collect();
            rt.block_on(commands::up(&Nodes::Remote(hs), None, f.into_args()?, argv, profiles))
        }
        Cmd::Wait { name, f } => {
            if f.log.is_some() || f.log_cmd.is_some() || f.pid.is_some() {
                return Err(CliError::usage(
                    "wait --host: give the NAME of a run started with `vigil up --host` (--log/--log-cmd/--pid are local)",
                ));
            }
            let Some(name) = name else {
                return Err(CliError::usage("wait --host: give the NAME of a run started with `vigil up --host`"));
            };
            let w = f.into_args(&profiles)?;
            rt.block_on(commands::wait(&Nodes::Remote(hs), Some(name), w, profiles))
        }
        Cmd::Down { names, all, pid, grace, json } => {
            if pid.is_some() {
                return Err(CliError::usage("down --host: give a run name or --all (--pid is local)"));
            }
            rt.block_on(commands::down(&Nodes::Remote(hs), names, all, grace, json))
        }
        Cmd::Status { json } => rt.block_on(commands::status(&Nodes::Remote(hs), json, &profiles)),
        Cmd::Logs { name, follow, lines } => rt.block_on(commands::logs(&Nodes::Remote(hs), name, follow, lines)),
        Cmd::Ps { json } => rt.block_on(commands::ps(&Nodes::Remote(hs), json, &profiles)),
        Cmd::Dump { name, pid, json } => rt.block_on(commands::dump(&Nodes::Remote(hs), name, pid, json)),
        Cmd::Check { json, server, gpu_mem, cmd } => {
            check_server(&profiles, &server)?;
            if let Some(b) = gpu_mem {
                check::fit::set_gpu_mem(b);
            }
            rt.block_on(commands::check(&Nodes::Remote(hs), cmd, server, json, profiles))
        }
        _ => Err(CliError::usage("--host/--hosts work with up, wait, status, logs, down, ps and check")),
    }
}
