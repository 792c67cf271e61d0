//! Supervision: the watch loop (`wait`) that turns sources into facts and the core's events into sink
//! calls; the drivers of several nodes (`hosts`: fleets and multi-node servers); what happens at a bad
//! verdict (`evidence` from every process, `remote_evidence` on a node, the `--on-stall` `policy`).

pub mod evidence;
pub mod hosts;
pub mod multinode;
pub mod nodes;
pub mod policy;
pub mod repair;
pub mod up;
pub mod wait;
pub mod watch;
