//! What vigil does with a server it leaves stuck (issue #17): `--on-stall keep|stop`.
//!
//! A stalled server left unattended holds its GPUs for hours (the seed's 8-hour zombie); a crashed one
//! whose HTTP process lingers, or one whose engine died while the front end answers, is no better. After
//! the evidence is saved, `stop` stops its tree and proves the port and GPU memory free; `keep` leaves it
//! for a person to look at. Defaults (chosen by the caller): `stop` for a server vigil launched (`up`),
//! `keep` for one it attached to (`wait`): a server vigil did not start is not vigil's to stop.

use crate::judge::Report;
use crate::types::{Cause, Verdict};
use serde::Serialize;

/// Keep is the default: a server vigil only attached to is not vigil's to stop.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OnStall {
    #[default]
    Keep,
    Stop,
}

impl OnStall {
    pub fn parse(s: &str) -> Option<OnStall> {
        match s {
            "keep" => Some(OnStall::Keep),
            "stop" => Some(OnStall::Stop),
            _ => None,
        }
    }
}

/// The verdicts the policy is about, when processes of the server still live: stalled; crashed (its HTTP
/// process or a child lingers); unhealthy because the engine died. Not `timeout` (still progressing: the
/// deadline was the caller's, the server may well finish) and not other `unhealthy` verdicts (failing
/// probes can pass; stopping a server that would recover is the worst mistake).
pub fn applies(r: &Report) -> bool {
    match r.verdict {
        Verdict::Stalled | Verdict::Crashed => true,
        Verdict::Unhealthy => r.cause == Some(Cause::EngineDead),
        _ => false,
    }
}

/// What the policy did, told as an event.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct StallAction {
    pub action: OnStall,
    /// Processes of the server's tree when the policy applied.
    pub pids: Vec<i32>,
    /// Processes still alive after a stop (empty: none left).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub survivors: Vec<i32>,
    /// The server's port, when known, and whether it was free after the stop.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port_free: Option<bool>,
    /// Whether the GPU memory the tree held was released (absent: no GPU reading, or the tree held none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_released: Option<bool>,
    /// The node the run is on, for a run over SSH (its pids are the node's; a stop is proven there).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// Why the stop could not be done or proven (the node did not answer): nothing is claimed then.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failed: Option<String>,
}
