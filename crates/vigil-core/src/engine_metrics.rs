//! Engine progress from the server's own Prometheus metrics (issue #17). After ready, requests waiting or
//! running while every token counter stands still for the window is a stuck engine, seen without sending
//! a generation. The names per server kind are profile data (`[server.metrics]`). Pure: the text and the
//! time come in.

use crate::profile::MetricsSpec;
use serde::Serialize;

/// One reading of the names a profile gives.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MetricsSample {
    /// Requests waiting in the queue (the gauge's sum over its label sets).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waiting: Option<f64>,
    /// Requests being processed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub running: Option<f64>,
    /// The sum of the token counters found.
    pub tokens: f64,
}

/// Sums the samples of `name` (every label set: vLLM labels by model and engine) in Prometheus text.
/// `None` when the name has no sample. Comment lines (`#`) are skipped; a name that is a prefix of
/// another (`x_total` of `x_total_bucket`) is not mistaken for it.
pub fn prom_sum(text: &str, name: &str) -> Option<f64> {
    let mut sum = None;
    for l in text.lines() {
        let l = l.trim();
        let Some(rest) = l.strip_prefix(name) else { continue };
        let rest = match rest.chars().next() {
            Some('{') => match rest.find('}') {
                Some(i) => &rest[i + 1..],
                None => continue,
            },
            Some(' ') | Some('\t') => rest,
            _ => continue,
        };
        let Some(v) = rest.split_whitespace().next().and_then(|v| v.parse::<f64>().ok()) else { continue };
        if v.is_finite() {
            *sum.get_or_insert(0.0) += v;
        }
    }
    sum
}

/// Reads a profile's names from a metrics page. `None` when none of the token counters is there: the
/// page is not this server's metrics (or metrics are off), and the probes stay in charge.
pub fn sample(text: &str, spec: &MetricsSpec) -> Option<MetricsSample> {
    let found: Vec<f64> = spec.tokens.iter().filter_map(|n| prom_sum(text, n)).collect();
    if found.is_empty() {
        return None;
    }
    Some(MetricsSample {
        waiting: spec.waiting.as_deref().and_then(|n| prom_sum(text, n)),
        running: spec.running.as_deref().and_then(|n| prom_sum(text, n)),
        tokens: found.iter().sum(),
    })
}

/// The engine stood still with work to do.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Stuck {
    pub waiting: f64,
    pub running: f64,
    pub tokens: f64,
    /// How long the token counters stood still with requests waiting or running (ms).
    pub still_ms: u64,
}

/// Follows samples over time.
#[derive(Debug, Clone, Default)]
pub struct MetricsWatch {
    last_tokens: Option<f64>,
    /// Since when requests waited (or ran) with the token counters still.
    still_since: Option<u64>,
}

impl MetricsWatch {
    /// Takes a sample at `at` (ms); `Some` once requests have waited or run with no token counted for
    /// `window_ms`. Idle (no request) is never stuck; any growth of a counter, or a reset (a restarted
    /// server's counters start at 0), starts the window again.
    pub fn observe(&mut self, at: u64, s: &MetricsSample, window_ms: u64) -> Option<Stuck> {
        let (waiting, running) = (s.waiting.unwrap_or(0.0), s.running.unwrap_or(0.0));
        let busy = waiting > 0.0 || running > 0.0;
        let moved = self.last_tokens != Some(s.tokens);
        self.last_tokens = Some(s.tokens);
        if !busy {
            self.still_since = None;
            return None;
        }
        if moved {
            // busy and counting (or the first sample): the window starts now
            self.still_since = Some(at);
            return None;
        }
        let since = *self.still_since.get_or_insert(at);
        let still_ms = at.saturating_sub(since);
        (still_ms >= window_ms).then_some(Stuck { waiting, running, tokens: s.tokens, still_ms })
    }
}
