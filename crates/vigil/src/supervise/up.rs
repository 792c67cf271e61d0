//! `up`'s settings as the drivers use them: what a node needs to launch ([`LaunchSettings`], held whole)
//! and the watch after the launch (`wait::Args`, made by [`watch_args`]), in one [`UpArgs`] (built by
//! `settings.rs`).

use crate::node::LaunchSettings;
use crate::supervise::wait;
use std::time::Duration;
use vigil_core::policy::OnStall;

/// `vigil up`'s settings, validated: what the node needs to launch, and the watch's.
#[derive(Clone)]
pub struct UpArgs {
    pub name: Option<String>,
    pub detach: bool,
    pub keep: bool,
    pub server: Option<String>,
    pub timeout: Duration,
    pub stall: Vec<vigil_core::limits::Stall>,
    pub quiet: bool,
    /// What a node is given to launch (`--replace`, `--grace`, `--json`, the log's bounds, `--env`…).
    pub launch: LaunchSettings,
    /// Proof and watch settings for the watch after launch.
    pub proof: wait::Args,
    /// `--repair[=N|dry|any]` (issue #35): relaunch a failed start with the repair its diagnosis carries.
    pub repair: Option<crate::supervise::repair::RepairMode>,
}

/// The watch of a server `up` launched, on this machine or a node: the proof settings, deadlines and
/// output of the flags, and the stall policy (issue #17: a server vigil launched is stopped when stuck,
/// unless --keep or --on-stall keep).
pub fn watch_args(a: &UpArgs) -> wait::Args {
    let mut w = a.proof.clone();
    w.watch = watching(a);
    w.timeout = a.timeout;
    w.stall = a.stall.clone();
    w.json = a.launch.json;
    w.quiet = a.quiet;
    w.on_stall = Some(w.on_stall.unwrap_or(if a.keep { OnStall::Keep } else { OnStall::Stop }));
    w.stop_grace = a.launch.grace;
    w
}

/// `up` keeps watching after ready with `--watch`, and in the foreground with `--listen`/`--metrics` (the
/// values come from the watch: without it they would freeze at ready).
pub fn watching(a: &UpArgs) -> bool {
    a.proof.watch || (a.proof.listen.is_some() && !a.detach)
}

/// `--listen` serves from the launch on: started before the node launches anything (once per process; the
/// watch finds it running).
pub fn start_listener(a: &UpArgs) -> Result<(), crate::error::CliError> {
    if let Some(l) = &a.proof.listen {
        if let Some(url) = crate::sinks::listen::start(l, crate::sources::history::hostname())? {
            let mut rep = crate::sinks::report::Reporter::new(a.launch.json, a.quiet);
            rep.note(0, &format!("listening on {url} (/startupz /readyz /livez /status /events /metrics)"));
        }
    }
    Ok(())
}
