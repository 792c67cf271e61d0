//! The proof stage, on virtual time: the judge's `ready` only says that the server's health is good; one
//! real completion proves that it generates (and, when speculation was asked for, that it speculates).
//! After ready, each generation probe becomes a probe fact for the judge. I/O code sends the requests and
//! feeds the answers here; every verdict of this stage (ready, degraded, unhealthy) is decided here.

use crate::judge::{fmt_ms, ProbeOutcome, Report};
use crate::Verdict;
use serde::Serialize;

/// What a completion's answer says about speculative decoding.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(untagged)]
pub enum SpecStats {
    /// Drafted and accepted tokens of this request (llama-server's `timings`).
    Counts { drafted: u64, accepted: u64 },
    /// The server's average accept length (SGLang's `/server_info`): above 1 means drafts are accepted.
    AcceptLength { accept_length: f64 },
}

/// One generation attempt, as the I/O code saw it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Generation {
    pub ok: bool,
    pub endpoint: String,
    pub tokens: u64,
    pub ms: u64,
    pub note: String,
    pub spec: Option<SpecStats>,
}

#[derive(Debug, Clone)]
pub struct ProofConfig {
    /// Prove readiness with a completion (off: `--no-generate`, no URL, or a dummy health endpoint).
    pub generate: bool,
    /// The command asks for speculative decoding.
    pub wants_spec: bool,
    /// With speculation asked for, a proof that shows no drafted tokens means speculation is off
    /// (the profile's `no_drafts`): else it is only unverified.
    pub no_drafts_degraded: bool,
    /// Give up proving after this long: `unhealthy`.
    pub timeout_ms: u64,
    /// A failed attempt is retried after this long.
    pub retry_ms: u64,
    /// Keep watching after ready.
    pub watch: bool,
}

impl Default for ProofConfig {
    fn default() -> Self {
        ProofConfig {
            generate: true,
            wants_spec: false,
            no_drafts_degraded: true,
            timeout_ms: 120_000,
            retry_ms: 1000,
            watch: false,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Stage {
    /// The judge decides (phases, crash, stall).
    Starting,
    /// Health is good; proving generation since `since`, with the judge's ready report.
    Proving { since: u64, report: Box<Report> },
    /// Ready and watching (health and generation probes feed the judge).
    Watching,
}

/// What the I/O code does next.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Nothing.
    Wait,
    /// Send a completion now (proving has begun).
    Prove,
    /// The attempt failed; send the next one at this time.
    RetryAt { at: u64, note: String },
    /// The ready verdict (possibly degraded). `watching`: the watch goes on; else the command ends.
    Ready { report: Box<Report>, watching: bool },
    /// Health answers but generation never worked within the budget.
    Unhealthy(Box<Report>),
    /// While watching: the generation probe's outcome, a probe fact for the judge.
    Probe(ProbeOutcome),
}

#[derive(Debug, Clone)]
pub struct Proof {
    cfg: ProofConfig,
    stage: Stage,
}

impl Proof {
    pub fn new(cfg: ProofConfig) -> Proof {
        Proof { cfg, stage: Stage::Starting }
    }

    pub fn config_mut(&mut self) -> &mut ProofConfig {
        &mut self.cfg
    }

    pub fn stage(&self) -> &Stage {
        &self.stage
    }

    pub fn watching(&self) -> bool {
        self.stage == Stage::Watching
    }

    /// Generation requests are wanted now: always while proving, while watching only when proving is on.
    pub fn wants_generation(&self) -> bool {
        match self.stage {
            Stage::Starting => false,
            Stage::Proving { .. } => true,
            Stage::Watching => self.cfg.generate,
        }
    }

    /// The judge's verdict `ready` (its report). `log_degraded`: the log said a feature is off.
    pub fn judge_ready(&mut self, at: u64, r: Report, log_degraded: Option<&str>) -> Step {
        if self.stage != Stage::Starting {
            return Step::Wait;
        }
        if self.cfg.generate {
            self.stage = Stage::Proving { since: at, report: Box::new(r) };
            return Step::Prove;
        }
        let r = finish_ready(r, None, &self.cfg, log_degraded);
        self.ready(r)
    }

    fn ready(&mut self, r: Report) -> Step {
        self.stage = Stage::Watching;
        Step::Ready { report: Box::new(r), watching: self.cfg.watch }
    }

    /// A generation attempt came back at `at`.
    pub fn generation(&mut self, at: u64, g: &Generation, log_degraded: Option<&str>) -> Step {
        match &self.stage {
            Stage::Starting => Step::Wait,
            Stage::Watching => Step::Probe(if g.ok { ProbeOutcome::Ok } else { ProbeOutcome::Error }),
            Stage::Proving { since, report } => {
                let since = *since;
                if g.ok {
                    let r = finish_ready((**report).clone(), Some(g), &self.cfg, log_degraded);
                    return self.ready(r);
                }
                let spent = at.saturating_sub(since);
                if spent >= self.cfg.timeout_ms {
                    let mut r = (**report).clone();
                    r.verdict = Verdict::Unhealthy;
                    r.detail = Some(format!(
                        "health answers but generation fails for {}: {} ({})",
                        fmt_ms(spent),
                        g.note,
                        g.endpoint
                    ));
                    r.hint = Some(
                        "the HTTP side is up but the engine does not generate: read the server log; try the completion by hand"
                            .into(),
                    );
                    self.stage = Stage::Watching;
                    return Step::Unhealthy(Box::new(r));
                }
                Step::RetryAt { at: at + self.cfg.retry_ms, note: g.note.clone() }
            }
        }
    }
}

/// What a health probe's answer proves. A 2xx from a dummy health endpoint (one that always answers, such as
/// SGLang's on nodes of rank >= 1) or from a process outside the server's tree (a squatter on its port)
/// proves nothing: not ready.
pub fn health_fact(outcome: ProbeOutcome, dummy_health: bool, foreign_holder: bool) -> ProbeOutcome {
    if outcome == ProbeOutcome::Ok && (dummy_health || foreign_holder) {
        ProbeOutcome::NotReady
    } else {
        outcome
    }
}

/// The ready report with the generation proof and the speculation verdict folded in.
pub fn finish_ready(mut r: Report, g: Option<&Generation>, cfg: &ProofConfig, log_degraded: Option<&str>) -> Report {
    let mut details = Vec::new();
    if let Some(g) = g {
        details.push(format!("generation proof: {} via {}", g.note, g.endpoint));
    }
    if cfg.wants_spec {
        match (g.and_then(|g| g.spec), log_degraded) {
            (_, Some(d)) => r.degraded = Some(d.to_string()),
            (Some(SpecStats::AcceptLength { accept_length }), None) => {
                details.push(format!("speculation on: average accept length {accept_length:.2}"));
                if accept_length <= 1.0 {
                    r.degraded = Some("speculation off: average accept length is not above 1".into());
                }
            }
            (Some(SpecStats::Counts { drafted, accepted }), None) if drafted > 0 => {
                details.push(format!(
                    "speculation on: {accepted}/{drafted} drafted tokens accepted ({:.0}%)",
                    100.0 * accepted as f64 / drafted as f64
                ));
            }
            (_, None) if g.is_some() && cfg.no_drafts_degraded => {
                r.degraded = Some("speculation off: asked for, but the proof request drafted no tokens".into());
            }
            _ => details.push("speculation asked for; not verified for this server".into()),
        }
    }
    if let Some(d) = &r.degraded {
        details.push(format!("degraded: {d}"));
    }
    if !details.is_empty() {
        r.detail = Some(details.join("; "));
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Phase;

    fn ready_report() -> Report {
        Report {
            verdict: Verdict::Ready,
            phase: Phase::Http,
            cause: None,
            server: Some("llama-cpp".into()),
            hint: None,
            detail: None,
            evidence: vec![],
            last_lines: vec![],
            timeline: vec![],
            laggards: vec![],
            progress: None,
            exit: None,
            elapsed_ms: Some(1000),
            baseline: None,
            slow: vec![],
            changes: vec![],
            degraded: None,
        }
    }

    fn gen(ok: bool, spec: Option<SpecStats>) -> Generation {
        Generation {
            ok,
            endpoint: "/completion".into(),
            tokens: if ok { 2 } else { 0 },
            ms: 3,
            note: if ok { "2 tokens in 3 ms".into() } else { "HTTP 503: loading".into() },
            spec,
        }
    }

    #[test]
    fn ready_waits_for_a_real_completion() {
        let mut p = Proof::new(ProofConfig::default());
        assert!(!p.wants_generation());
        assert_eq!(p.judge_ready(1000, ready_report(), None), Step::Prove);
        assert!(p.wants_generation());
        let s = p.generation(1100, &gen(true, None), None);
        let Step::Ready { report, watching } = s else { panic!("{s:?}") };
        assert_eq!(report.verdict, Verdict::Ready);
        assert!(report.degraded.is_none());
        assert!(!watching);
        assert!(report.detail.unwrap().contains("generation proof: 2 tokens in 3 ms via /completion"));
    }

    #[test]
    fn failing_generation_is_retried_then_unhealthy_at_the_budget() {
        let mut p = Proof::new(ProofConfig { timeout_ms: 5000, ..ProofConfig::default() });
        p.judge_ready(1000, ready_report(), None);
        assert_eq!(
            p.generation(2000, &gen(false, None), None),
            Step::RetryAt { at: 3000, note: "HTTP 503: loading".into() }
        );
        assert!(matches!(p.generation(5999, &gen(false, None), None), Step::RetryAt { .. }));
        let Step::Unhealthy(r) = p.generation(6000, &gen(false, None), None) else { panic!() };
        assert_eq!(r.verdict, Verdict::Unhealthy);
        assert!(r.detail.unwrap().contains("generation fails for 5.0s: HTTP 503: loading (/completion)"));
    }

    #[test]
    fn without_proof_ready_is_immediate() {
        let mut p = Proof::new(ProofConfig { generate: false, watch: true, ..ProofConfig::default() });
        let Step::Ready { report, watching } = p.judge_ready(10, ready_report(), None) else { panic!() };
        assert!(watching && report.detail.is_none());
        assert!(p.watching() && !p.wants_generation());
    }

    #[test]
    fn watching_turns_generations_into_probe_facts() {
        let mut p = Proof::new(ProofConfig { watch: true, ..ProofConfig::default() });
        p.judge_ready(0, ready_report(), None);
        assert!(matches!(p.generation(10, &gen(true, None), None), Step::Ready { watching: true, .. }));
        assert_eq!(p.generation(60_000, &gen(false, None), None), Step::Probe(ProbeOutcome::Error));
        assert_eq!(p.generation(120_000, &gen(true, None), None), Step::Probe(ProbeOutcome::Ok));
        // a second ready from the judge changes nothing
        assert_eq!(p.judge_ready(130_000, ready_report(), None), Step::Wait);
    }

    fn spec_cfg(no_drafts_degraded: bool) -> ProofConfig {
        ProofConfig { wants_spec: true, no_drafts_degraded, ..ProofConfig::default() }
    }

    #[test]
    fn a_dummy_or_foreign_answer_proves_nothing() {
        assert_eq!(health_fact(ProbeOutcome::Ok, false, false), ProbeOutcome::Ok);
        assert_eq!(health_fact(ProbeOutcome::Ok, true, false), ProbeOutcome::NotReady);
        assert_eq!(health_fact(ProbeOutcome::Ok, false, true), ProbeOutcome::NotReady);
        assert_eq!(health_fact(ProbeOutcome::Error, true, true), ProbeOutcome::Error);
    }

    #[test]
    fn speculation_verdicts() {
        let counts = Some(SpecStats::Counts { drafted: 12, accepted: 9 });
        let r = finish_ready(ready_report(), Some(&gen(true, counts)), &spec_cfg(true), None);
        assert!(r.degraded.is_none());
        assert!(r.detail.unwrap().contains("9/12 drafted tokens accepted (75%)"));

        let none = Some(SpecStats::Counts { drafted: 0, accepted: 0 });
        let r = finish_ready(ready_report(), Some(&gen(true, none)), &spec_cfg(true), None);
        assert_eq!(r.degraded.as_deref(), Some("speculation off: asked for, but the proof request drafted no tokens"));

        // a server that reports no drafts per request: unverified, never degraded
        let r = finish_ready(ready_report(), Some(&gen(true, None)), &spec_cfg(false), None);
        assert!(r.degraded.is_none());
        assert!(r.detail.unwrap().contains("not verified for this server"));

        let low = Some(SpecStats::AcceptLength { accept_length: 1.0 });
        let r = finish_ready(ready_report(), Some(&gen(true, low)), &spec_cfg(true), None);
        assert_eq!(r.degraded.as_deref(), Some("speculation off: average accept length is not above 1"));
        let good = Some(SpecStats::AcceptLength { accept_length: 3.1 });
        let r = finish_ready(ready_report(), Some(&gen(true, good)), &spec_cfg(true), None);
        assert!(r.degraded.is_none() && r.detail.unwrap().contains("average accept length 3.10"));

        // the log's word wins: the draft failed to load
        let r = finish_ready(ready_report(), Some(&gen(true, counts)), &spec_cfg(true), Some("draft model failed"));
        assert_eq!(r.degraded.as_deref(), Some("draft model failed"));
    }

    #[test]
    fn degraded_log_without_proof() {
        let mut p = Proof::new(ProofConfig { generate: false, ..spec_cfg(true) });
        let Step::Ready { report, .. } = p.judge_ready(0, ready_report(), Some("speculation disabled")) else {
            panic!()
        };
        assert_eq!(report.degraded.as_deref(), Some("speculation disabled"));
    }
}
