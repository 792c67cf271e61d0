//! vigil: brings up and watches LLM inference servers.

mod cli;
mod diagnose;
mod exit;
mod follow;
mod lines;
mod probe;
mod report;
mod wait;

use clap::{Parser, Subcommand};
use cli::{check_server, load_profiles, parse_duration, CliError};
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "vigil",
    version,
    about = "Brings up and watches LLM inference servers (SGLang, vLLM, llama-server, TGI)"
)]
struct Cli {
    /// Extra profile directory (*.toml); also read: $XDG_CONFIG_HOME/vigil/profiles/
    #[arg(long = "profiles", global = true, value_name = "DIR")]
    profiles: Vec<PathBuf>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Offline post-mortem of server logs: phase timeline, verdict, cause, evidence, hint.
    Diagnose {
        #[arg(required = true, value_name = "FILE")]
        files: Vec<String>,
        /// JSON lines; the last line of each file is its verdict object.
        #[arg(long)]
        json: bool,
        /// Show which pattern of which profile matched which line.
        #[arg(long)]
        explain: bool,
        /// Only the verdict line.
        #[arg(long, short)]
        quiet: bool,
        /// Server kind (default: detected from the log).
        #[arg(long, value_name = "KIND")]
        server: Option<String>,
    },
    /// Attach to a server started elsewhere and wait for a verdict.
    Wait {
        /// Health URL to probe (http://HOST:PORT/PATH).
        #[arg(long)]
        url: Option<String>,
        /// Log file to follow (may not exist yet; survives truncation and rotation), or - for stdin.
        #[arg(long, value_name = "FILE")]
        log: Option<String>,
        /// Command whose output is the log (e.g. 'kubectl logs -f POD').
        #[arg(long, value_name = "CMD")]
        log_cmd: Option<String>,
        /// Process to watch (its exit is a crash before ready).
        #[arg(long)]
        pid: Option<i32>,
        /// Server kind (default: detected from the log).
        #[arg(long, value_name = "KIND")]
        server: Option<String>,
        /// Overall deadline.
        #[arg(long, default_value = "2h", value_parser = parse_duration)]
        timeout: std::time::Duration,
        /// Probe interval once the port may be open.
        #[arg(long, default_value = "1s", value_parser = parse_duration)]
        interval: std::time::Duration,
        /// Probe timeout (default from the profile: SGLang 25s, others 5-10s).
        #[arg(long, value_parser = parse_duration)]
        probe_timeout: Option<std::time::Duration>,
        /// Environment variable holding the API key (sent as a bearer token, never printed).
        #[arg(long, value_name = "VAR")]
        api_key_env: Option<String>,
        /// Stall limit: DUR for every phase, or PHASE=DUR (repeatable).
        #[arg(long, value_name = "[PHASE=]DUR")]
        stall: Vec<String>,
        #[arg(long)]
        json: bool,
        #[arg(long, short)]
        quiet: bool,
        /// Print each log line as it is read.
        #[arg(long)]
        echo: bool,
    },
    /// List the server profiles (built-in and user).
    Profiles,
}

fn main() {
    let cli = Cli::parse();
    let code = match run(cli) {
        Ok(c) => c,
        Err(CliError::Usage(m)) => {
            eprintln!("vigil: error: {m}");
            exit::USAGE
        }
        Err(CliError::Internal(m)) => {
            eprintln!("vigil: internal error: {m}");
            exit::INTERNAL
        }
    };
    std::process::exit(code);
}

fn run(cli: Cli) -> Result<i32, CliError> {
    let profiles = load_profiles(&cli.profiles)?;
    match cli.cmd {
        Cmd::Diagnose {
            files,
            json,
            explain,
            quiet,
            server,
        } => {
            check_server(&profiles, &server)?;
            diagnose::run(
                diagnose::Args {
                    files,
                    json,
                    explain,
                    quiet,
                    server,
                },
                &profiles,
            )
        }
        Cmd::Wait {
            url,
            log,
            log_cmd,
            pid,
            server,
            timeout,
            interval,
            probe_timeout,
            api_key_env,
            stall,
            json,
            quiet,
            echo,
        } => {
            check_server(&profiles, &server)?;
            if interval.is_zero() {
                return Err(CliError::usage("--interval must be above zero"));
            }
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| CliError::Internal(format!("runtime: {e}")))?;
            rt.block_on(wait::run(
                wait::Args {
                    url,
                    log,
                    log_cmd,
                    pid,
                    server,
                    timeout,
                    interval,
                    probe_timeout,
                    api_key_env,
                    stall,
                    json,
                    quiet,
                    echo,
                },
                profiles,
            ))
        }
        Cmd::Profiles => {
            for p in &profiles.list {
                crate::report::out_line(&format!(
                    "{:<10} port {:<5} {:<8} probe timeout {:>4}s  {} rules  {}",
                    p.name,
                    p.port,
                    p.health_path,
                    p.probe_timeout_secs,
                    p.rules.len(),
                    p.description
                ));
            }
            Ok(exit::READY)
        }
    }
}
