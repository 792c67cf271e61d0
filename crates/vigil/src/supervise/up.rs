//! `up`'s settings as the drivers use them: what a node needs to launch ([`LaunchSettings`]) and the
//! watch after the launch (`wait::Args`), made from one [`UpArgs`] (built by `settings.rs`).

use crate::node::LaunchSettings;
use crate::supervise::wait;
use std::path::PathBuf;
use std::time::Duration;
use vigil_core::policy::OnStall;

/// `vigil up`'s settings, validated.
pub struct UpArgs {
    pub name: Option<String>,
    pub detach: bool,
    pub keep: bool,
    pub replace: bool,
    pub env: Vec<String>,
    pub env_file: Option<PathBuf>,
    pub server: Option<String>,
    pub grace: Duration,
    pub timeout: Duration,
    pub stall: Vec<vigil_core::limits::Stall>,
    pub json: bool,
    pub quiet: bool,
    pub log_max_bytes: u64,
    pub log_keep: u32,
    pub no_probe: bool,
    pub no_check: bool,
    /// Proof and watch settings for the watch after launch.
    pub proof: wait::Args,
}

impl UpArgs {
    /// What a node needs of these settings to launch.
    pub fn launch_settings(&self) -> LaunchSettings {
        LaunchSettings {
            replace: self.replace,
            grace: self.grace,
            no_probe: self.no_probe,
            no_check: self.no_check,
            json: self.json,
            log_max_bytes: self.log_max_bytes,
            log_keep: self.log_keep,
            env: self.env.clone(),
            env_file: self.env_file.clone(),
        }
    }
}

/// The watch of a server `up` launched, on this machine or a node: the proof settings, deadlines and
/// output of the flags, and the stall policy (issue #17: a server vigil launched is stopped when stuck,
/// unless --keep or --on-stall keep).
pub fn watch_args(a: &UpArgs) -> wait::Args {
    let mut w = a.proof.clone();
    w.watch = watching(a);
    w.timeout = a.timeout;
    w.stall = a.stall.clone();
    w.json = a.json;
    w.quiet = a.quiet;
    w.on_stall = Some(w.on_stall.unwrap_or(if a.keep { OnStall::Keep } else { OnStall::Stop }));
    w.stop_grace = a.grace;
    w
}

/// `up` keeps watching after ready with `--watch`, and in the foreground with `--metrics` (the values
/// come from the watch: without it they would freeze at ready).
pub fn watching(a: &UpArgs) -> bool {
    a.proof.watch || (a.proof.metrics.is_some() && !a.detach)
}
