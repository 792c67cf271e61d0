//! The proof stage, on virtual time: the judge's `ready` only says that the server's health is good; one
//! real completion proves that it generates (and, when speculation was asked for, that it speculates).
//! After ready, each generation probe becomes a probe fact for the judge. I/O code sends the requests and
//! feeds the answers here; every verdict of this stage (ready, degraded, unhealthy) is decided here.
//!
//! Speculation is judged on facts the profile says where to find (`[proof]`, `[proof.speculation]`):
//! drafted and accepted counts in the proof's own answer (llama-server, SGLang), the delta of the engine's
//! counters on its metrics page over the proof request (vLLM), the server's average accept length
//! (SGLang's `/server_info`), or the counts of the server's last periodic log line. Nothing drafted is
//! `degraded` (speculation off), drafts with none accepted is `degraded` (speculation useless); a server
//! whose numbers cannot be read leaves speculation unverified, which is not a failure.

use crate::engine_metrics::prom_sum;
use crate::judge::{fmt_ms, ProbeOutcome, Report};
use crate::profile::{Profiles, ProofSpec, SpecMetricsSpec, SpeculationSpec};
use crate::Verdict;
use regex::Regex;
use serde::Serialize;
use serde_json::Value;

/// Where speculation numbers came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SpecFrom {
    /// The proof request's own answer (llama-server `timings`, SGLang `meta_info`).
    Answer,
    /// The engine's counters on its metrics page, read before and after the proof request (vLLM).
    Metrics,
    /// The server's last periodic log line (an interval of its traffic, not the proof request).
    Log,
}

/// What the server says about speculative decoding.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(untagged)]
pub enum SpecStats {
    /// Draft tokens proposed and accepted, with the verification steps when known.
    Counts {
        drafted: u64,
        accepted: u64,
        #[serde(skip_serializing_if = "Option::is_none")]
        steps: Option<u64>,
        /// Tokens per verification step, the bonus token included: 1 + accepted / steps (vLLM's
        /// convention, `vllm/v1/spec_decode/metrics.py:114`), or the log line's own figure.
        #[serde(skip_serializing_if = "Option::is_none")]
        accept_length: Option<f64>,
        from: SpecFrom,
    },
    /// The server's average accept length (SGLang's `/server_info`): above 1 means drafts are accepted.
    AcceptLength { accept_length: f64 },
}

impl SpecStats {
    /// Counts with the accept length derived from the steps.
    pub fn counts(drafted: u64, accepted: u64, steps: Option<u64>, from: SpecFrom) -> SpecStats {
        let accept_length = steps.filter(|s| *s > 0).map(|s| 1.0 + accepted as f64 / s as f64);
        SpecStats::Counts { drafted, accepted, steps, accept_length, from }
    }
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
    /// Why the speculation numbers could not be read (a metrics page that does not answer or lacks the
    /// counters): speculation is then unverified, not off.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spec_note: Option<String>,
}

/// Speculation as the command line asks for it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SpecAsk {
    /// The method the command names (`EAGLE3`, `eagle3`, `draft-simple`), when it names one.
    pub method: Option<String>,
    /// The method's drafts come from the text itself (n-gram lookup): on a short proof, drafting or
    /// accepting nothing does not prove it off.
    pub text_drafter: bool,
}

/// Does this command line ask for speculation, by the rules of one profile's `[proof.speculation]`?
pub fn spec_asked(s: &SpeculationSpec, argv: &[String]) -> Option<SpecAsk> {
    let norm: Vec<String>;
    let argv = if s.underscores {
        // `--speculative_config=X` → `--speculative-config=X`: only the flag's name, never its value
        norm = argv
            .iter()
            .map(|a| match a.strip_prefix("--") {
                Some(rest) => {
                    let (k, v) = rest.split_once('=').map_or((rest, None), |(k, v)| (k, Some(v)));
                    let k = k.replace('_', "-");
                    v.map_or(format!("--{k}"), |v| format!("--{k}={v}"))
                }
                None => a.clone(),
            })
            .collect();
        &norm[..]
    } else {
        argv
    };
    let present = |f: &str| argv.iter().any(|a| a == f || a.strip_prefix(f).is_some_and(|r| r.starts_with('=')));
    let asks = s
        .flags
        .iter()
        .any(|f| present(f) && !crate::arg_value(argv, f).is_some_and(|v| s.off_values.iter().any(|o| o == v)));
    if !asks {
        return None;
    }
    let method = s.method.iter().find_map(|m| {
        let v = crate::arg_value(argv, &m.flag)?;
        match &m.pointer {
            None => Some(v.to_string()),
            Some(p) => serde_json::from_str::<serde_json::Value>(v).ok()?.pointer(p)?.as_str().map(String::from),
        }
    });
    let text_drafter = match (&s.text_drafters, &method) {
        (Some(r), Some(m)) => Regex::new(r).is_ok_and(|r| r.is_match(m)),
        _ => false,
    };
    Some(SpecAsk { method, text_drafter })
}

/// Does the command ask for speculation? By the rules of the server kind's own profile when it has some,
/// else (kind unknown, or a kind without them) by the first profile whose rules say it does.
pub fn speculation_asked(profiles: &Profiles, kind: Option<&str>, argv: &[String]) -> Option<SpecAsk> {
    let rules = |p: &crate::profile::Profile| p.proof.as_ref().and_then(|p| p.speculation.clone());
    match kind.and_then(|k| profiles.get(k)).and_then(rules) {
        Some(s) => spec_asked(&s, argv),
        None => profiles.list.iter().filter_map(rules).find_map(|s| spec_asked(&s, argv)),
    }
}

/// The first of the JSON pointers that holds a value.
fn first<'a>(v: &'a Value, paths: &[String]) -> Option<&'a Value> {
    paths.iter().find_map(|p| v.pointer(p).filter(|x| !x.is_null()))
}

fn num(v: &Value) -> Option<u64> {
    v.as_u64().or_else(|| v.as_f64().filter(|f| *f >= 0.0).map(|f| f as u64))
}

/// What a proof's answer says, read by the profile's pointers: the tokens generated (one when no count
/// came back but text did) and the speculation counts the answer carries.
pub fn read_answer(spec: &ProofSpec, v: &Value) -> (u64, Option<SpecStats>) {
    let count = first(v, &spec.tokens).and_then(num).unwrap_or(0);
    let text_len = first(v, &spec.text).and_then(Value::as_str).map_or(0, str::len);
    let tokens = if count == 0 && text_len > 0 { 1 } else { count };
    let stats = first(v, &spec.drafted).and_then(num).map(|drafted| {
        let accepted = first(v, &spec.accepted).and_then(num).unwrap_or(0);
        SpecStats::counts(drafted, accepted, first(v, &spec.steps).and_then(num), SpecFrom::Answer)
    });
    (tokens, stats)
}

/// The average accept length in the answer of the profile's accept-length endpoint (SGLang `/server_info`).
pub fn read_accept_length(spec: &ProofSpec, v: &Value) -> Option<SpecStats> {
    first(v, &spec.accept_length).and_then(Value::as_f64).map(|accept_length| SpecStats::AcceptLength { accept_length })
}

/// The speculation counters' growth over the proof request, from the metrics page read just before
/// (`before`: its text, `None` when it did not answer) and just after. A counter absent before the
/// request counts from 0. `Err` says why the numbers cannot be read (then speculation is unverified).
pub fn metrics_delta(before: Option<&str>, after: &str, m: &SpecMetricsSpec) -> Result<SpecStats, String> {
    let Some(d1) = prom_sum(after, &m.drafted) else {
        return Err(format!("the metrics page has no `{}`", m.drafted));
    };
    let Some(before) = before else {
        return Err("the metrics page did not answer before the proof request".into());
    };
    let a1 = prom_sum(after, &m.accepted).unwrap_or(0.0);
    let (d0, a0) = (prom_sum(before, &m.drafted).unwrap_or(0.0), prom_sum(before, &m.accepted).unwrap_or(0.0));
    if d1 < d0 || a1 < a0 {
        return Err("the speculation counters went back during the proof request (a restart?)".into());
    }
    let steps = m.steps.as_deref().and_then(|n| {
        let s1 = prom_sum(after, n)?;
        let s0 = prom_sum(before, n).unwrap_or(0.0);
        (s1 >= s0).then(|| (s1 - s0).round() as u64)
    });
    Ok(SpecStats::counts((d1 - d0).round() as u64, (a1 - a0).round() as u64, steps, SpecFrom::Metrics))
}

/// The counts of a periodic log line (the profile's `log` pattern with `drafted`, `accepted` and
/// optionally `length`), if this message is one.
pub fn spec_from_log(re: &Regex, message: &str) -> Option<SpecStats> {
    let c = re.captures(message)?;
    let drafted = c.name("drafted")?.as_str().parse::<u64>().ok()?;
    let accepted = c.name("accepted")?.as_str().parse::<u64>().ok()?;
    let accept_length = c.name("length").and_then(|l| l.as_str().parse::<f64>().ok()).filter(|l| l.is_finite());
    Some(SpecStats::Counts { drafted, accepted, steps: None, accept_length, from: SpecFrom::Log })
}

#[derive(Debug, Clone)]
pub struct ProofConfig {
    /// Prove readiness with a completion (off: `--no-generate`, no URL, or a dummy health endpoint).
    pub generate: bool,
    /// The command asks for speculative decoding (and how).
    pub spec: Option<SpecAsk>,
    /// With speculation asked for, a proof that brings no speculation numbers at all means speculation
    /// is off (the profile's `no_drafts`): else it is only unverified.
    pub no_drafts_degraded: bool,
    /// The server's periodic log line with speculation counts (the profile's `[proof.speculation] log`).
    pub spec_log: Option<Regex>,
    /// Give up proving after this long: `unhealthy`.
    pub timeout_ms: u64,
    /// `--timeout`, on the watch's clock: the startup, proof included, has a verdict by then (`timeout` when
    /// the proof has not finished).
    pub deadline_ms: Option<u64>,
    /// A failed attempt is retried after this long.
    pub retry_ms: u64,
    /// Keep watching after ready.
    pub watch: bool,
}

impl Default for ProofConfig {
    fn default() -> Self {
        ProofConfig {
            generate: true,
            spec: None,
            no_drafts_degraded: true,
            spec_log: None,
            timeout_ms: 120_000,
            deadline_ms: None,
            retry_ms: 1000,
            watch: false,
        }
    }
}

impl ProofConfig {
    /// Speculation as a server kind's profile sees this command line: asked for (and how), what no numbers
    /// mean, the log line that carries counts.
    pub fn set_speculation(&mut self, profiles: &Profiles, kind: Option<&str>, argv: &[String]) {
        let proof = profiles.proof_for(kind);
        self.spec = speculation_asked(profiles, kind, argv);
        self.no_drafts_degraded = proof.no_drafts_is_degraded();
        // checked when the profile was loaded
        self.spec_log = proof.speculation.as_ref().and_then(|s| s.log.as_deref()).and_then(|l| Regex::new(l).ok());
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
    /// `--timeout` passed while proving: the startup's deadline holds for the proof too.
    Timeout(Box<Report>),
    /// While watching: the generation probe's outcome, a probe fact for the judge.
    Probe(ProbeOutcome),
}

#[derive(Debug, Clone)]
pub struct Proof {
    cfg: ProofConfig,
    stage: Stage,
    /// The counts of the server's last speculation log line, a fact for when the proof brings none.
    log_spec: Option<SpecStats>,
}

impl Proof {
    pub fn new(cfg: ProofConfig) -> Proof {
        Proof { cfg, stage: Stage::Starting, log_spec: None }
    }

    /// A log message of the server: keeps the counts of its speculation log line, while they can still
    /// matter (speculation asked for, no verdict yet).
    pub fn line(&mut self, message: &str) {
        if self.cfg.spec.is_none() || self.stage == Stage::Watching {
            return;
        }
        if let Some(s) = self.cfg.spec_log.as_ref().and_then(|re| spec_from_log(re, message)) {
            self.log_spec = Some(s);
        }
    }

    pub fn config_mut(&mut self) -> &mut ProofConfig {
        &mut self.cfg
    }

    pub fn config(&self) -> &ProofConfig {
        &self.cfg
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
        let r = finish_ready(r, None, &self.cfg, log_degraded, self.log_spec.as_ref());
        self.ready(r)
    }

    fn ready(&mut self, r: Report) -> Step {
        self.stage = Stage::Watching;
        Step::Ready { report: Box::new(r), watching: self.cfg.watch }
    }

    /// How long the next generation attempt may take at `at`: `budget`, cut to what is left before
    /// `--timeout` (at least 1 ms).
    pub fn attempt_ms(&self, at: u64, budget: u64) -> u64 {
        match self.cfg.deadline_ms {
            Some(d) => budget.min(d.saturating_sub(at)).max(1),
            None => budget,
        }
    }

    /// Time passes: past `--timeout` while proving, the verdict is `timeout` (the proof never outlasts the
    /// startup's deadline); otherwise nothing.
    pub fn tick(&mut self, at: u64) -> Step {
        let (Stage::Proving { since, report }, Some(d)) = (&self.stage, self.cfg.deadline_ms) else {
            return Step::Wait;
        };
        if at < d {
            return Step::Wait;
        }
        let mut r = (**report).clone();
        r.verdict = Verdict::Timeout;
        r.detail = Some(format!(
            "--timeout {} passed while proving generation: health answers, and no completion came back in {}",
            fmt_ms(d),
            fmt_ms(at.saturating_sub(*since))
        ));
        r.hint = Some(
            "the HTTP side is up but no completion finished in time: read the server log, try the completion by hand, or raise --timeout"
                .into(),
        );
        self.stage = Stage::Watching;
        Step::Timeout(Box::new(r))
    }

    /// A generation attempt came back at `at`.
    pub fn generation(&mut self, at: u64, g: &Generation, log_degraded: Option<&str>) -> Step {
        // a failed attempt that came back past --timeout: the startup's deadline decides
        if !g.ok {
            if let Step::Timeout(r) = self.tick(at) {
                return Step::Timeout(r);
            }
        }
        match &self.stage {
            Stage::Starting => Step::Wait,
            Stage::Watching => Step::Probe(if g.ok { ProbeOutcome::Ok } else { ProbeOutcome::Error }),
            Stage::Proving { since, report } => {
                let since = *since;
                if g.ok {
                    let r = finish_ready((**report).clone(), Some(g), &self.cfg, log_degraded, self.log_spec.as_ref());
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

/// The ready report with the generation proof and the speculation verdict folded in. `log_spec`: the
/// counts of the server's last speculation log line, used when the proof brought none.
pub fn finish_ready(
    mut r: Report,
    g: Option<&Generation>,
    cfg: &ProofConfig,
    log_degraded: Option<&str>,
    log_spec: Option<&SpecStats>,
) -> Report {
    let mut details = Vec::new();
    if let Some(g) = g {
        details.push(format!("generation proof: {} via {}", g.note, g.endpoint));
    }
    if let Some(ask) = &cfg.spec {
        match log_degraded {
            Some(d) => r.degraded = Some(d.to_string()),
            None => {
                let (detail, degraded) = speculation(ask, g, log_spec, cfg.no_drafts_degraded);
                details.extend(detail);
                r.degraded = degraded;
            }
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

/// The speculation verdict: a detail, or what is degraded.
fn speculation(
    ask: &SpecAsk,
    g: Option<&Generation>,
    log_spec: Option<&SpecStats>,
    no_drafts_degraded: bool,
) -> (Option<String>, Option<String>) {
    let m = ask.method.as_deref().map(|m| format!(" ({m})")).unwrap_or_default();
    let from = |f: SpecFrom| match f {
        SpecFrom::Answer => "",
        SpecFrom::Metrics => ", from the engine's counters over the proof request",
        SpecFrom::Log => ", from the server's last speculation log line",
    };
    let facts = g.and_then(|g| g.spec).or(log_spec.copied());
    match facts {
        Some(SpecStats::Counts { drafted: 0, from: f, .. }) => {
            let one_token = f != SpecFrom::Log && g.is_some_and(|g| g.tokens < 2);
            if one_token || ask.text_drafter {
                let why = if one_token {
                    "the proof generated one token, so there was no decode step to draft for"
                } else {
                    "this method drafts only where the text repeats itself"
                };
                (Some(format!("speculation asked for{m}; nothing drafted{}, and {why}: not verified", from(f))), None)
            } else {
                (None, Some(format!("speculation off: asked for{m}, but the proof request drafted no tokens{}", from(f))))
            }
        }
        Some(SpecStats::Counts { drafted, accepted: 0, from: f, .. }) if ask.text_drafter => (
            Some(format!(
                "speculation asked for{m}; {drafted} tokens drafted, 0 accepted{}, which says little of a method that drafts from the text itself: not verified",
                from(f)
            )),
            None,
        ),
        Some(SpecStats::Counts { drafted, accepted: 0, from: f, .. }) => {
            let label = ask.method.as_deref().map(|m| format!("{m}: ")).unwrap_or_default();
            (None, Some(format!("speculation accepts nothing: {label}{drafted} tokens drafted, 0 accepted{}", from(f))))
        }
        Some(SpecStats::Counts { drafted, accepted, accept_length, from: f, .. }) => {
            let len = accept_length.map(|l| format!(", accept length {l:.2}")).unwrap_or_default();
            let pct = 100.0 * accepted as f64 / drafted as f64;
            (Some(format!("speculation on: {accepted}/{drafted} drafted tokens accepted ({pct:.0}%{len}){m}{}", from(f))), None)
        }
        Some(SpecStats::AcceptLength { accept_length }) => {
            let d = format!("speculation on{m}: average accept length {accept_length:.2}");
            let off = (accept_length <= 1.0).then(|| "speculation off: average accept length is not above 1".into());
            (Some(d), off)
        }
        None => match g {
            Some(Generation { spec_note: Some(n), .. }) => {
                (Some(format!("speculation asked for{m}; could not be verified: {n}")), None)
            }
            Some(_) if no_drafts_degraded => {
                (None, Some(format!("speculation off: asked for{m}, but the proof request drafted no tokens")))
            }
            _ => (Some(format!("speculation asked for{m}; not verified for this server")), None),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::MethodSpec;
    use crate::Phase;

    fn ready_report() -> Report {
        Report { server: Some("llama-cpp".into()), elapsed_ms: Some(1000), ..Report::bare(Verdict::Ready, Phase::Http) }
    }

    fn gen(ok: bool, spec: Option<SpecStats>) -> Generation {
        Generation {
            ok,
            endpoint: "/completion".into(),
            tokens: if ok { 2 } else { 0 },
            ms: 3,
            note: if ok { "2 tokens in 3 ms".into() } else { "HTTP 503: loading".into() },
            spec,
            spec_note: None,
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

    /// issue #36: `--timeout` bounds the proof too: an attempt gets at most what is left of it, and past it
    /// the verdict is `timeout`, long before the proof's own budget would say `unhealthy`.
    #[test]
    fn the_startup_deadline_bounds_the_proof() {
        let mut p = Proof::new(ProofConfig { deadline_ms: Some(15_000), ..ProofConfig::default() });
        assert_eq!(p.tick(14_000), Step::Wait, "not proving yet");
        p.judge_ready(1000, ready_report(), None);
        assert_eq!(p.attempt_ms(1000, 30_000), 14_000);
        assert_eq!(p.attempt_ms(20_000, 30_000), 1);
        assert_eq!(p.tick(14_999), Step::Wait);
        let Step::Timeout(r) = p.tick(15_000) else { panic!() };
        assert_eq!(r.verdict, Verdict::Timeout);
        assert!(r.detail.unwrap().contains("passed while proving generation"));
        assert!(p.watching(), "one verdict");
        // an attempt that fails after the deadline: timeout, not a retry
        let mut p = Proof::new(ProofConfig { deadline_ms: Some(15_000), ..ProofConfig::default() });
        p.judge_ready(1000, ready_report(), None);
        assert!(matches!(p.generation(16_000, &gen(false, None), None), Step::Timeout(_)));
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
        ProofConfig { spec: Some(SpecAsk::default()), no_drafts_degraded, ..ProofConfig::default() }
    }

    #[test]
    fn a_dummy_or_foreign_answer_proves_nothing() {
        assert_eq!(health_fact(ProbeOutcome::Ok, false, false), ProbeOutcome::Ok);
        assert_eq!(health_fact(ProbeOutcome::Ok, true, false), ProbeOutcome::NotReady);
        assert_eq!(health_fact(ProbeOutcome::Ok, false, true), ProbeOutcome::NotReady);
        assert_eq!(health_fact(ProbeOutcome::Error, true, true), ProbeOutcome::Error);
    }

    fn counts(drafted: u64, accepted: u64) -> Option<SpecStats> {
        Some(SpecStats::counts(drafted, accepted, None, SpecFrom::Answer))
    }

    fn fin(g: &Generation, cfg: &ProofConfig) -> Report {
        finish_ready(ready_report(), Some(g), cfg, None, None)
    }

    #[test]
    fn speculation_verdicts() {
        let r = fin(&gen(true, counts(12, 9)), &spec_cfg(true));
        assert!(r.degraded.is_none());
        assert!(r.detail.unwrap().contains("speculation on: 9/12 drafted tokens accepted (75%)"));

        let r = fin(&gen(true, counts(0, 0)), &spec_cfg(true));
        assert_eq!(r.degraded.as_deref(), Some("speculation off: asked for, but the proof request drafted no tokens"));

        // a server that reports no drafts per request: unverified, never degraded
        let r = fin(&gen(true, None), &spec_cfg(false));
        assert!(r.degraded.is_none());
        assert!(r.detail.unwrap().contains("not verified for this server"));
        // one that always reports them: their absence is speculation off
        let r = fin(&gen(true, None), &spec_cfg(true));
        assert!(r.degraded.unwrap().contains("drafted no tokens"));

        let low = Some(SpecStats::AcceptLength { accept_length: 1.0 });
        let r = fin(&gen(true, low), &spec_cfg(true));
        assert_eq!(r.degraded.as_deref(), Some("speculation off: average accept length is not above 1"));
        let good = Some(SpecStats::AcceptLength { accept_length: 3.1 });
        let r = fin(&gen(true, good), &spec_cfg(true));
        assert!(r.degraded.is_none() && r.detail.unwrap().contains("average accept length 3.10"));

        // the log's word wins: the draft failed to load
        let r = finish_ready(
            ready_report(),
            Some(&gen(true, counts(12, 9))),
            &spec_cfg(true),
            Some("draft model failed"),
            None,
        );
        assert_eq!(r.degraded.as_deref(), Some("draft model failed"));
    }

    #[test]
    fn drafts_without_acceptance_are_degraded_with_the_numbers() {
        let cfg = ProofConfig {
            spec: Some(SpecAsk { method: Some("EAGLE3".into()), ..SpecAsk::default() }),
            ..spec_cfg(true)
        };
        let r = fin(&gen(true, counts(96, 0)), &cfg);
        assert_eq!(r.degraded.as_deref(), Some("speculation accepts nothing: EAGLE3: 96 tokens drafted, 0 accepted"));
        assert_eq!(r.verdict, Verdict::Ready);
        // with the steps, the accept length is shown (1 + accepted / steps)
        let g = gen(true, Some(SpecStats::counts(15, 9, Some(5), SpecFrom::Answer)));
        let r = fin(&g, &cfg);
        assert!(r.degraded.is_none());
        let d = r.detail.unwrap();
        assert!(d.contains("speculation on: 9/15 drafted tokens accepted (60%, accept length 2.80) (EAGLE3)"), "{d}");
    }

    #[test]
    fn nothing_drafted_proves_nothing_for_text_drafters_and_one_token_answers() {
        // n-gram lookup drafts only where the text repeats: not verified, not degraded
        let ngram =
            ProofConfig { spec: Some(SpecAsk { method: Some("ngram".into()), text_drafter: true }), ..spec_cfg(true) };
        let r = fin(&gen(true, counts(0, 0)), &ngram);
        assert!(r.degraded.is_none());
        assert!(r.detail.unwrap().contains("speculation asked for (ngram); nothing drafted, and this method drafts"));
        // nor does accepting none of its drafts on a text without repeats
        let r = fin(&gen(true, counts(8, 0)), &ngram);
        assert!(r.degraded.is_none() && r.detail.unwrap().contains("(ngram); 8 tokens drafted, 0 accepted"));
        // an answer of one token had no decode step to draft for
        let mut g = gen(true, counts(0, 0));
        g.tokens = 1;
        let r = fin(&g, &spec_cfg(true));
        assert!(r.degraded.is_none() && r.detail.unwrap().contains("no decode step"));
    }

    #[test]
    fn unreadable_numbers_leave_speculation_unverified() {
        let mut g = gen(true, None);
        g.spec_note = Some("the metrics page has no `vllm:spec_decode_num_draft_tokens_total`".into());
        // even where no numbers would mean off: the numbers could not be read at all
        let r = fin(&g, &spec_cfg(true));
        assert!(r.degraded.is_none());
        assert!(r.detail.unwrap().contains("speculation asked for; could not be verified: the metrics page has no"));
    }

    #[test]
    fn without_speculation_asked_nothing_is_said() {
        let r = fin(&gen(true, counts(0, 0)), &ProofConfig::default());
        assert!(r.degraded.is_none());
        assert!(!r.detail.unwrap().contains("speculation"));
    }

    #[test]
    fn metrics_deltas() {
        let m = SpecMetricsSpec {
            path: None,
            drafted: "d_total".into(),
            accepted: "a_total".into(),
            steps: Some("s_total".into()),
        };
        let before = "d_total{engine=\"0\"} 100.0\na_total{engine=\"0\"} 40.0\ns_total{engine=\"0\"} 50.0\n";
        let after = "d_total{engine=\"0\"} 115.0\na_total{engine=\"0\"} 49.0\ns_total{engine=\"0\"} 55.0\n";
        let s = metrics_delta(Some(before), after, &m).unwrap();
        assert_eq!(
            s,
            SpecStats::Counts {
                drafted: 15,
                accepted: 9,
                steps: Some(5),
                accept_length: Some(2.8),
                from: SpecFrom::Metrics
            }
        );
        // a counter first seen after the request counted from 0
        assert!(matches!(metrics_delta(Some(""), after, &m), Ok(SpecStats::Counts { drafted: 115, .. })));
        // no counters at all (metrics off): unreadable, with the name
        assert_eq!(metrics_delta(Some(before), "other 1\n", &m).unwrap_err(), "the metrics page has no `d_total`");
        assert!(metrics_delta(None, after, &m).unwrap_err().contains("did not answer before"));
        assert!(metrics_delta(Some(after), before, &m).unwrap_err().contains("went back"));
    }

    #[test]
    fn log_counts_are_a_fact_when_the_proof_brings_none() {
        let re = Regex::new(r"Accepted: (?P<accepted>\d+) tokens, Drafted: (?P<drafted>\d+) tokens").unwrap();
        let mut p = Proof::new(ProofConfig { spec_log: Some(re.clone()), ..spec_cfg(false) });
        p.line("SpecDecoding metrics: Accepted: 0 tokens, Drafted: 801 tokens, more");
        p.line("an unrelated line");
        p.judge_ready(0, ready_report(), None);
        let Step::Ready { report, .. } = p.generation(10, &gen(true, None), None) else { panic!() };
        assert_eq!(
            report.degraded.as_deref(),
            Some("speculation accepts nothing: 801 tokens drafted, 0 accepted, from the server's last speculation log line")
        );
        // the proof's own numbers come first
        let mut p = Proof::new(ProofConfig { spec_log: Some(re), ..spec_cfg(false) });
        p.line("Accepted: 0 tokens, Drafted: 801 tokens");
        p.judge_ready(0, ready_report(), None);
        let Step::Ready { report, .. } = p.generation(10, &gen(true, counts(10, 7)), None) else { panic!() };
        assert!(report.degraded.is_none());
        // without speculation asked for, the line is ignored
        let mut p = Proof::new(ProofConfig::default());
        p.line("Accepted: 0 tokens, Drafted: 801 tokens");
        assert!(p.log_spec.is_none());
    }

    #[test]
    fn answers_are_read_by_pointer() {
        let spec = ProofSpec {
            tokens: vec!["/tokens_predicted".into(), "/timings/predicted_n".into()],
            text: vec!["/content".into()],
            drafted: vec!["/new/d".into(), "/old/d".into()],
            accepted: vec!["/new/a".into(), "/old/a".into()],
            steps: vec!["/steps".into()],
            ..ProofSpec::default()
        };
        let v =
            serde_json::json!({"timings": {"predicted_n": 3}, "content": "abc", "old": {"d": 6, "a": 2}, "steps": 3});
        assert_eq!(read_answer(&spec, &v), (3, Some(SpecStats::counts(6, 2, Some(3), SpecFrom::Answer))));
        // text without a count is one token; no drafted count is no speculation numbers
        let v = serde_json::json!({"content": "abc", "new": {"d": null}});
        assert_eq!(read_answer(&spec, &v), (1, None));
    }

    fn argv(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn asked_for_by_the_rules_of_a_profile() {
        let s = SpeculationSpec {
            flags: vec!["--speculative-config".into(), "-sc".into(), "--spec-type".into()],
            off_values: vec!["none".into()],
            underscores: true,
            method: vec![MethodSpec { flag: "--speculative-config".into(), pointer: Some("/method".into()) }],
            text_drafters: Some("^(?:ngram|suffix)$".into()),
            ..SpeculationSpec::default()
        };
        assert_eq!(spec_asked(&s, &argv(&["vllm", "serve", "m"])), None);
        let a =
            spec_asked(&s, &argv(&["vllm", "serve", "m", "--speculative-config", r#"{"method":"eagle3"}"#])).unwrap();
        assert_eq!((a.method.as_deref(), a.text_drafter), (Some("eagle3"), false));
        let a = spec_asked(&s, &argv(&["vllm", "--speculative_config={\"method\": \"ngram\"}"])).unwrap();
        assert_eq!((a.method.as_deref(), a.text_drafter), (Some("ngram"), true));
        assert!(spec_asked(&s, &argv(&["vllm", "-sc", "{}"])).is_some_and(|a| a.method.is_none()));
        // a value that asks for none, and a flag that only starts like one
        assert_eq!(spec_asked(&s, &argv(&["x", "--spec-type", "none"])), None);
        assert_eq!(spec_asked(&s, &argv(&["x", "--speculative-configs", "1"])), None);
        // without `underscores`, `_` is another flag
        let strict = SpeculationSpec { underscores: false, ..s };
        assert_eq!(spec_asked(&strict, &argv(&["x", "--speculative_config", "{}"])), None);
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
