//! Settings, resolved before anything runs: the flags clap read (`cli.rs`) become validated, typed
//! values for the commands (`wait::Args`, `crate::supervise::up::UpArgs`): the server kind checked against the profiles,
//! stall limits per phase, the `--listen` (`--metrics`) listener bound, the proof settings. A bad setting is a usage
//! error here, before a keeper or a server exists.

use crate::cli::{ProofFlags, TlsFlags, UpFlags, WaitFlags};
use crate::error::CliError;
use crate::{sinks::listen, sources::tls, supervise::wait};
use std::path::PathBuf;
use vigil_core::Profiles;

impl WaitFlags {
    /// The watch's arguments (local sources are set by the caller).
    pub fn into_args(self, profiles: &vigil_core::Profiles) -> Result<wait::Args, CliError> {
        check_server(profiles, &self.server)?;
        if self.interval.is_zero() {
            return Err(CliError::usage("--interval must be above zero"));
        }
        let mut w = wait::Args::new();
        self.proof.apply(&mut w);
        w.listen = self.proof.listen()?;
        w.url = self.url;
        w.log = self.log;
        w.log_cmd = self.log_cmd;
        w.pid = self.pid;
        w.server = self.server;
        w.timeout = self.timeout;
        w.interval = self.interval;
        w.probe_timeout = self.probe_timeout.or(w.probe_timeout);
        w.api_key_env = self.api_key_env;
        w.tls = self.tls.into();
        w.stall = self.stall;
        w.json = self.json;
        w.quiet = self.quiet;
        w.echo = self.echo;
        Ok(w)
    }
}

impl From<TlsFlags> for tls::TlsOpts {
    fn from(f: TlsFlags) -> tls::TlsOpts {
        tls::TlsOpts { ca_cert: f.ca_cert, insecure: f.insecure }
    }
}

impl ProofFlags {
    /// `vigil watch NAME`'s settings: the proof flags, watching after ready.
    pub fn into_watch(self, json: bool) -> Result<wait::Args, CliError> {
        let mut w = wait::Args::new();
        self.apply(&mut w);
        w.listen = self.listen()?;
        w.watch = true;
        w.json = json;
        Ok(w)
    }

    /// `--listen` (or `--metrics`, its alias) checked and bound now, before anything runs: a non-loopback
    /// address without a token or `--listen-public`, a taken port or an unreadable token is a usage error.
    pub fn listen(&self) -> Result<Option<std::sync::Arc<listen::Settings>>, CliError> {
        let (addr, flag) = match (self.listen, self.metrics) {
            (Some(l), Some(m)) if l != m => {
                return Err(CliError::usage(format!(
                    "--metrics is an alias of --listen: give one address (--listen {l}, --metrics {m})"
                )))
            }
            (Some(l), _) => (l, "--listen"),
            (None, Some(m)) => (m, "--metrics"),
            (None, None) => {
                if self.listen_token_file.is_some() || self.listen_public || self.listen_cert.is_some() {
                    return Err(CliError::usage(
                        "--listen-token-file, --listen-public and --listen-cert need --listen ADDR",
                    ));
                }
                return Ok(None);
            }
        };
        let s = listen::resolve(listen::Flags {
            addr,
            flag,
            token_file: self.listen_token_file.as_deref(),
            public: self.listen_public,
            cert: self.listen_cert.as_deref(),
            key: self.listen_key.as_deref(),
        })?;
        Ok(Some(std::sync::Arc::new(s)))
    }

    pub fn apply(&self, w: &mut wait::Args) {
        w.generate = !self.no_generate;
        w.generate_timeout = self.generate_timeout;
        w.watch = self.watch;
        w.unhealthy_after = self.unhealthy_after;
        w.generate_every = self.generate_every;
        w.metrics_linger = self.metrics_linger;
        w.gpu_interval = self.gpu_interval;
        w.on_stall = self.on_stall;
        if self.watch_probe_timeout.is_some() {
            w.probe_timeout = self.watch_probe_timeout;
        }
    }
}

impl UpFlags {
    /// The launch settings, resolved before anything runs: the `--metrics` port is bound here, so a taken
    /// one is a usage error before a server is launched.
    pub fn into_args(self) -> Result<crate::supervise::up::UpArgs, CliError> {
        if self.detach && (self.proof.listen.is_some() || self.proof.metrics.is_some()) {
            return Err(CliError::usage(
                "--listen serves while this vigil watches, and --detach ends it at ready: leave out --detach, or \
                 run `vigil watch NAME --listen ADDR` after",
            ));
        }
        let listen = self.proof.listen()?;
        Ok(crate::supervise::up::UpArgs {
            name: self.name,
            detach: self.detach,
            keep: self.keep,
            server: self.server,
            timeout: self.timeout,
            stall: self.stall,
            quiet: self.quiet,
            launch: crate::node::LaunchSettings {
                replace: self.replace,
                grace: self.grace,
                no_probe: self.no_probe,
                no_check: self.no_check,
                json: self.json,
                log_max_bytes: self.log_max_size,
                log_keep: self.log_keep,
                env: self.env,
                env_file: self.env_file,
                repairs: vec![],
            },
            repair: self.repair,
            proof: {
                let mut w = wait::Args::new();
                self.proof.apply(&mut w);
                w.interval = self.interval.max(std::time::Duration::from_millis(10));
                w.listen = listen;
                w
            },
        })
    }
}

fn profile_dirs(extra: &[PathBuf]) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")));
    if let Some(b) = base {
        dirs.push(b.join("vigil/profiles"));
    }
    dirs.extend(extra.iter().cloned());
    dirs
}

/// Built-in profiles extended by `$XDG_CONFIG_HOME/vigil/profiles/*.toml` and `--profiles DIR`.
pub fn load_profiles(extra: &[PathBuf]) -> Result<Profiles, CliError> {
    let mut files = Vec::new();
    for d in profile_dirs(extra) {
        let rd = match std::fs::read_dir(&d) {
            Ok(rd) => rd,
            Err(e) => {
                if extra.contains(&d) {
                    return Err(CliError::usage(format!("--profiles {}: {e}", d.display())));
                }
                continue;
            }
        };
        let mut names: Vec<PathBuf> = rd
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "toml"))
            .collect();
        names.sort();
        for p in names {
            let text =
                std::fs::read_to_string(&p).map_err(|e| CliError::usage(format!("profile {}: {e}", p.display())))?;
            files.push((p.display().to_string(), text));
        }
    }
    Profiles::load(&files).map_err(|e| CliError::usage(format!("profile error: {e}")))
}

pub fn check_server(p: &Profiles, s: &Option<String>) -> Result<(), CliError> {
    if let Some(s) = s {
        if p.get(s).is_none() {
            return Err(CliError::usage(format!(
                "--server: unknown server kind '{s}' (known: {})",
                p.names().join(", ")
            )));
        }
    }
    Ok(())
}
