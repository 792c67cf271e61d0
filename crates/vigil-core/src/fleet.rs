//! Several watches, one answer, on virtual time: a fleet (the same server on several hosts, each its own
//! verdict) and a multi-node server (one server over several ranks). The rules: the worst outcome is the
//! command's; in a multi-node server the first rank to end badly decides and ready needs every rank; the
//! server's live phase is the least advanced rank's among those still starting.

use crate::outcome::Exit;
use crate::Phase;

/// A watch that ended well: the server serves (degraded included).
pub fn serves(e: Exit) -> bool {
    matches!(e, Exit::Ready | Exit::Degraded)
}

/// The command's outcome over its members: the most severe, and which member decided it (the first with
/// that outcome; none when all are ready).
pub fn combine(exits: &[Exit]) -> (Exit, Option<usize>) {
    let worst = exits.iter().copied().max().unwrap_or(Exit::Ready);
    let decider = (worst != Exit::Ready).then(|| exits.iter().position(|e| *e == worst)).flatten();
    (worst, decider)
}

/// A multi-node server's ranks as they progress and end.
#[derive(Debug, Clone)]
pub struct MultiNode {
    phases: Vec<Phase>,
    ended: Vec<Option<Exit>>,
    shown: Option<Phase>,
}

/// What a multi-node driver does after a rank ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MultiStep {
    /// Keep watching the other ranks.
    Wait,
    /// The server is decided: stop watching the ranks still running (a bad rank fails the server; or
    /// every rank has ended).
    Done,
}

impl MultiNode {
    pub fn new(ranks: usize) -> MultiNode {
        MultiNode { phases: vec![Phase::Launch; ranks], ended: vec![None; ranks], shown: None }
    }

    /// A rank's phase changed. Returns the server's phase and its slowest rank when that phase changes:
    /// the least advanced phase among the ranks still starting.
    pub fn phase(&mut self, rank: usize, phase: Phase) -> Option<(Phase, usize)> {
        *self.phases.get_mut(rank)? = phase;
        let slow = (0..self.phases.len()).filter(|i| self.ended[*i].is_none()).min_by_key(|i| self.phases[*i])?;
        let p = self.phases[slow];
        (self.shown != Some(p)).then(|| {
            self.shown = Some(p);
            (p, slow)
        })
    }

    /// A rank's watch ended with `exit`.
    pub fn ended(&mut self, rank: usize, exit: Exit) -> MultiStep {
        if let Some(e) = self.ended.get_mut(rank) {
            *e = Some(exit);
        }
        if !serves(exit) || self.ended.iter().all(Option::is_some) {
            MultiStep::Done
        } else {
            MultiStep::Wait
        }
    }

    /// The outcome per rank once decided: ranks whose watch was stopped because another rank failed count
    /// as still starting (`Starting`, below every failure).
    pub fn exits(&self) -> Vec<Exit> {
        self.ended.iter().map(|e| e.unwrap_or(Exit::Starting)).collect()
    }

    /// The server's outcome: the worst rank's, decided by the first rank with it.
    pub fn outcome(&self) -> (Exit, Option<usize>) {
        combine(&self.exits())
    }
}

/// Whether a multi-node server's outcome ends its batch allocation (issue #27, `scancel` in a Slurm job):
/// only a failure of the server itself (crashed, stalled, past its deadline, unhealthy, a rank refused or
/// lost). Never a serving server, a stop the person asked for (interrupted), nor vigil's own error.
pub fn ends_allocation(e: Exit) -> bool {
    matches!(e, Exit::Crashed | Exit::Stalled | Exit::Timeout | Exit::Unhealthy | Exit::Refused | Exit::Unreachable)
}

/// The least advanced of the phases the members reached (a multi-node verdict's phase).
pub fn least_phase(phases: impl IntoIterator<Item = Phase>) -> Option<Phase> {
    phases.into_iter().min()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worst_outcome_wins_and_names_its_member() {
        // issue #14: one host crashed and another degraded: crashed (3), decided by the crashed host
        assert_eq!(combine(&[Exit::Degraded, Exit::Crashed, Exit::Ready]), (Exit::Crashed, Some(1)));
        assert_eq!(combine(&[Exit::Ready, Exit::Ready]), (Exit::Ready, None));
        assert_eq!(combine(&[Exit::Ready, Exit::Degraded]), (Exit::Degraded, Some(1)));
        assert_eq!(combine(&[Exit::Stalled, Exit::Unreachable, Exit::Stalled]), (Exit::Unreachable, Some(1)));
        assert_eq!(combine(&[]), (Exit::Ready, None));
    }

    #[test]
    fn only_a_failed_server_ends_the_allocation() {
        for e in Exit::ALL {
            let ends = ends_allocation(e);
            let failure = matches!(
                e,
                Exit::Crashed | Exit::Stalled | Exit::Timeout | Exit::Unhealthy | Exit::Refused | Exit::Unreachable
            );
            assert_eq!(ends, failure, "{e:?}");
        }
        assert!(!ends_allocation(Exit::Ready) && !ends_allocation(Exit::Degraded));
        assert!(!ends_allocation(Exit::Interrupted) && !ends_allocation(Exit::Starting));
    }

    #[test]
    fn ready_needs_every_rank() {
        let mut m = MultiNode::new(3);
        assert_eq!(m.ended(0, Exit::Ready), MultiStep::Wait);
        assert_eq!(m.ended(2, Exit::Degraded), MultiStep::Wait);
        assert_eq!(m.ended(1, Exit::Ready), MultiStep::Done);
        assert_eq!(m.outcome(), (Exit::Degraded, Some(2)));
    }

    #[test]
    fn the_first_bad_rank_decides() {
        let mut m = MultiNode::new(4);
        assert_eq!(m.ended(0, Exit::Ready), MultiStep::Wait);
        assert_eq!(m.ended(3, Exit::Crashed), MultiStep::Done);
        // the others' watches are stopped: still starting, below the crash
        assert_eq!(m.exits(), vec![Exit::Ready, Exit::Starting, Exit::Starting, Exit::Crashed]);
        assert_eq!(m.outcome(), (Exit::Crashed, Some(3)));
    }

    #[test]
    fn the_live_phase_is_the_least_advanced_starting_rank() {
        let mut m = MultiNode::new(3);
        assert_eq!(m.phase(0, Phase::Weights), Some((Phase::Launch, 1)));
        assert_eq!(m.phase(1, Phase::Weights), None, "rank 2 still in launch");
        assert_eq!(m.phase(2, Phase::KvCache), Some((Phase::Weights, 0)));
        assert_eq!(m.phase(0, Phase::CudaGraphs), None, "rank 1 still in weights");
        // rank 1 ends ready (its phase no longer counts); ranks 0 and 2 are at cuda_graphs and kv_cache
        m.ended(1, Exit::Ready);
        assert_eq!(m.phase(2, Phase::CudaGraphs), Some((Phase::CudaGraphs, 0)));
        assert_eq!(m.phase(9, Phase::Http), None, "an unknown rank changes nothing");
        assert_eq!(least_phase([Phase::Http, Phase::Weights, Phase::Serving]), Some(Phase::Weights));
    }
}
