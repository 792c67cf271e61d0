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
///
/// Root cause (issue #32): when one rank dies, the others' collectives, stores and sockets fail right after
/// it (gloo "Connection reset by peer", the c10d store's "Broken pipe", NCCL's "remote process exited"), and
/// the rank that complains loudest, or first, is often not the one that failed. A rank whose failure is such
/// a consequence (its evidence says a peer went away: the framework layer's `[multi_node] peer_gone`) does
/// not decide while another rank may still show its own failure: the decision waits [`SETTLE_MS`] for the
/// others' verdicts, and a rank that failed on its own (killed, crashed with its own error, stalled, lost)
/// is the root cause over every consequence.
#[derive(Debug, Clone)]
pub struct MultiNode {
    phases: Vec<Phase>,
    ended: Vec<Option<Exit>>,
    /// Per rank: its failure is a consequence of a peer's (see above).
    consequence: Vec<bool>,
    /// Per rank: the order its end came in.
    order: Vec<Option<usize>>,
    ends: usize,
    /// When the first consequence came, while no rank had failed on its own.
    settle_from: Option<u64>,
    /// Per rank: its evidence shows a stopped process (state T): of a stuck server, the stuck rank.
    stuck: Vec<bool>,
    /// Per rank: it has no readiness of its own (no API, no ready line: vLLM's `--headless` workers); it is
    /// ready when every other rank is, as long as it lives.
    follower: Vec<bool>,
    shown: Option<Phase>,
}

/// How long a multi-node decision waits after a rank failed as a consequence of a peer (its evidence says a
/// peer went away) for the rank that failed first to report: the dead rank's own watch needs its server's
/// exit, or its last error line, and the head a message over TCP (docs/gpu-e2e.md has what the real servers
/// took).
pub const SETTLE_MS: u64 = 10_000;

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
        MultiNode {
            phases: vec![Phase::Launch; ranks],
            ended: vec![None; ranks],
            consequence: vec![false; ranks],
            order: vec![None; ranks],
            ends: 0,
            settle_from: None,
            stuck: vec![false; ranks],
            follower: vec![false; ranks],
            shown: None,
        }
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

    /// The last phase `rank` reported (`Launch` before any).
    pub fn phase_of(&self, rank: usize) -> Option<Phase> {
        self.phases.get(rank).copied()
    }

    /// A rank's watch ended with `exit` (a failure of its own: see [`MultiNode::ended_at`]).
    pub fn ended(&mut self, rank: usize, exit: Exit) -> MultiStep {
        self.ended_at(rank, exit, false, 0)
    }

    /// A rank's watch ended with `exit` at `now_ms`; `consequence`: its failure followed a peer's (its
    /// evidence says a peer went away). A failure of its own decides at once; a consequence waits for the
    /// others up to [`SETTLE_MS`] ([`MultiNode::settle_until`], then [`MultiNode::settled`]).
    pub fn ended_at(&mut self, rank: usize, exit: Exit, consequence: bool, now_ms: u64) -> MultiStep {
        let Some(e) = self.ended.get_mut(rank) else { return MultiStep::Wait };
        if e.is_some() {
            return MultiStep::Wait;
        }
        *e = Some(exit);
        self.order[rank] = Some(self.ends);
        self.ends += 1;
        let failed = !serves(exit);
        self.consequence[rank] = failed && consequence;
        if self.ended.iter().all(Option::is_some) {
            return MultiStep::Done;
        }
        if !failed {
            return if self.leaders_ready() { MultiStep::Done } else { MultiStep::Wait };
        }
        if !self.consequence[rank] {
            return MultiStep::Done;
        }
        self.settle_from.get_or_insert(now_ms);
        MultiStep::Wait
    }

    /// While a consequence waits for the rank that failed first: when the decision is due.
    pub fn settle_until(&self) -> Option<u64> {
        self.settle_from.map(|t| t + SETTLE_MS)
    }

    /// The time is `now_ms`: `Done` once the wait for a root cause is over.
    pub fn settled(&mut self, now_ms: u64) -> MultiStep {
        match self.settle_until() {
            Some(t) if now_ms >= t => MultiStep::Done,
            _ => MultiStep::Wait,
        }
    }

    /// A rank without readiness of its own (see [`MultiNode`]'s `follower`).
    pub fn follows(&mut self, rank: usize) {
        if let Some(f) = self.follower.get_mut(rank) {
            *f = true;
        }
    }

    /// Whether a rank follows (has no readiness of its own).
    pub fn is_follower(&self, rank: usize) -> bool {
        self.follower.get(rank).copied().unwrap_or(false)
    }

    /// Every rank with readiness of its own is ready (at least one), and no follower has ended.
    fn leaders_ready(&self) -> bool {
        let leads: Vec<usize> = (0..self.ended.len()).filter(|i| !self.follower[*i]).collect();
        !leads.is_empty()
            && leads.iter().all(|i| self.ended[*i].is_some_and(serves))
            && (0..self.ended.len())
                .filter(|i| self.follower[*i])
                .all(|i| !matches!(self.ended[i], Some(e) if !serves(e)))
    }

    /// The outcome per rank once decided: ranks whose watch was stopped because another rank failed count
    /// as still starting (`Starting`, below every failure); a follower still running when every other rank
    /// is ready is ready.
    pub fn exits(&self) -> Vec<Exit> {
        let ready = self.leaders_ready();
        (0..self.ended.len())
            .map(|i| match self.ended[i] {
                Some(e) => e,
                None if ready && self.follower[i] => Exit::Ready,
                None => Exit::Starting,
            })
            .collect()
    }

    /// Per rank: its failure was a consequence of a peer's.
    pub fn consequences(&self) -> &[bool] {
        &self.consequence
    }

    /// A rank's evidence, taken at the decision, shows a stopped process.
    pub fn stuck(&mut self, rank: usize) {
        if let Some(s) = self.stuck.get_mut(rank) {
            *s = true;
        }
    }

    /// The server's outcome and the rank that decided it: the first rank that failed on its own (the root
    /// cause), with its outcome; else, every failure a consequence, the worst rank's, decided by the first
    /// with it. A server that is stuck (stalled, past its deadline, unhealthy) is decided by the rank whose
    /// evidence shows a stopped process, when the rank that stalled first shows none: the others only
    /// waited for it in their collectives (issue #32, the seed's rank stuck in CUDA-graph capture).
    pub fn outcome(&self) -> (Exit, Option<usize>) {
        let (exit, by) = root_cause(&self.exits(), &self.consequence, &self.order);
        let stuck_server = matches!(exit, Exit::Stalled | Exit::Timeout | Exit::Unhealthy);
        match (by, self.stuck.iter().position(|s| *s)) {
            (Some(b), Some(s)) if stuck_server && !self.stuck[b] => (exit, Some(s)),
            _ => (exit, by),
        }
    }
}

/// The outcome of a multi-node server from its ranks' exits, which failures were consequences of a peer's,
/// and the order the ends came in: the earliest failure of a rank's own decides, with its outcome; without
/// one, the worst outcome, decided by the first rank to end with it.
pub fn root_cause(exits: &[Exit], consequence: &[bool], order: &[Option<usize>]) -> (Exit, Option<usize>) {
    let own = (0..exits.len())
        .filter(|&i| !serves(exits[i]) && exits[i] != Exit::Starting && !consequence.get(i).copied().unwrap_or(false))
        .min_by_key(|&i| order.get(i).copied().flatten().unwrap_or(usize::MAX));
    if let Some(i) = own {
        return (exits[i], Some(i));
    }
    let (worst, _) = combine(exits);
    let first = (0..exits.len())
        .filter(|&i| exits[i] == worst && worst != Exit::Ready)
        .min_by_key(|&i| order.get(i).copied().flatten().unwrap_or(usize::MAX));
    (worst, first)
}

/// Whether a multi-node server's outcome ends its batch allocation (issue #27, `scancel` in a Slurm job):
/// only a failure of the server itself (crashed, stalled, past its deadline, unhealthy, a rank refused or
/// lost). Never a serving server, a stop the person asked for (interrupted), nor vigil's own error.
pub fn ends_allocation(e: Exit) -> bool {
    matches!(e, Exit::Crashed | Exit::Stalled | Exit::Timeout | Exit::Unhealthy | Exit::Refused | Exit::Unreachable)
}

/// A multi-node server's phase, from each rank's own verdict's phase (`own`) and the last phase it reported
/// (`seen`): `serving` once it served; a failure's is where its root-cause rank's own verdict put it; a
/// root-cause rank without a verdict of its own (stopped by the head, its process found stopped) is as far as
/// the furthest rank got: the ranks move through the start together in their collectives, and some servers
/// log a phase on one rank only (vLLM 0.26's capture bar is rank 0's, seen on the GPU machine, issue #32).
/// Without a decider, the least advanced rank's.
pub fn server_phase(
    own: &[Option<Phase>],
    seen: &[Option<Phase>],
    worst: Exit,
    decider: Option<usize>,
) -> Option<Phase> {
    if serves(worst) {
        return Some(Phase::Serving);
    }
    let at = |i: usize| own.get(i).copied().flatten().or(seen.get(i).copied().flatten());
    match decider {
        Some(d) if own.get(d).copied().flatten().is_some() => own[d],
        Some(_) => (0..own.len().max(seen.len())).filter_map(at).max(),
        None => least_phase((0..own.len().max(seen.len())).filter_map(at)),
    }
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
    fn a_consequence_waits_for_the_rank_that_failed_first() {
        // issue #32: rank 1 SIGKILLed; rank 0's gloo socket fails first ("Connection reset by peer")
        let mut m = MultiNode::new(2);
        assert_eq!(m.ended_at(0, Exit::Crashed, true, 1_000), MultiStep::Wait, "a consequence does not decide");
        assert_eq!(m.settle_until(), Some(1_000 + SETTLE_MS));
        assert_eq!(m.settled(5_000), MultiStep::Wait);
        // rank 1's own watch: killed; every rank has ended
        assert_eq!(m.ended_at(1, Exit::Crashed, false, 2_500), MultiStep::Done);
        assert_eq!(m.outcome(), (Exit::Crashed, Some(1)), "the killed rank is the root cause, not the loudest");
        assert_eq!(m.consequences(), &[true, false]);
    }

    #[test]
    fn a_root_cause_decides_over_a_worse_consequence_and_alone_after_the_wait() {
        // rank 2 stalled (stopped by a signal); rank 0 crashed on a peer's timeout: stalled, decided by 2
        let mut m = MultiNode::new(3);
        assert_eq!(m.ended_at(0, Exit::Crashed, true, 0), MultiStep::Wait);
        assert_eq!(m.ended_at(2, Exit::Stalled, false, 100), MultiStep::Done);
        assert_eq!(m.outcome(), (Exit::Stalled, Some(2)));
        // only consequences, and the wait runs out: the first of the worst decides
        let mut m = MultiNode::new(3);
        assert_eq!(m.ended_at(1, Exit::Crashed, true, 0), MultiStep::Wait);
        assert_eq!(m.ended_at(0, Exit::Crashed, true, 10), MultiStep::Wait);
        assert_eq!(m.settle_until(), Some(SETTLE_MS), "the wait counts from the first consequence");
        assert_eq!(m.settled(SETTLE_MS), MultiStep::Done);
        assert_eq!(m.outcome(), (Exit::Crashed, Some(1)));
        // a second end of one rank changes nothing
        assert_eq!(m.ended_at(1, Exit::Ready, false, 20), MultiStep::Wait);
        assert_eq!(m.exits()[1], Exit::Crashed);
    }

    #[test]
    fn a_follower_is_ready_with_the_others_and_fails_on_its_own() {
        // vLLM's --headless rank 1: no API, no ready line; ready once rank 0 is
        let mut m = MultiNode::new(2);
        m.follows(1);
        assert_eq!(m.ended_at(0, Exit::Ready, false, 0), MultiStep::Done);
        assert_eq!(m.exits(), vec![Exit::Ready, Exit::Ready]);
        assert_eq!(m.outcome(), (Exit::Ready, None));
        // a follower that crashes fails the server
        let mut m = MultiNode::new(3);
        m.follows(2);
        assert_eq!(m.ended_at(2, Exit::Crashed, false, 0), MultiStep::Done);
        assert_eq!(m.outcome(), (Exit::Crashed, Some(2)));
        // rank 1 (not a follower) still starting: not ready yet
        let mut m = MultiNode::new(3);
        m.follows(2);
        assert_eq!(m.ended_at(0, Exit::Ready, false, 0), MultiStep::Wait);
        assert_eq!(m.ended_at(1, Exit::Ready, false, 5), MultiStep::Done);
        assert_eq!(m.exits()[2], Exit::Ready);
    }

    #[test]
    fn a_stopped_rank_decides_a_stuck_server() {
        // issue #32: rank 1's engine SIGSTOPped in capture; rank 0 waits in its collective and stalls first
        let mut m = MultiNode::new(2);
        assert_eq!(m.ended_at(0, Exit::Stalled, false, 15_000), MultiStep::Done);
        assert_eq!(m.outcome(), (Exit::Stalled, Some(0)));
        m.stuck(1);
        assert_eq!(m.outcome(), (Exit::Stalled, Some(1)), "the stopped rank, not the one that waited");
        // a crash is its own rank's, whatever another rank's state
        let mut c = MultiNode::new(2);
        c.ended_at(0, Exit::Crashed, false, 0);
        c.stuck(1);
        assert_eq!(c.outcome(), (Exit::Crashed, Some(0)));
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
