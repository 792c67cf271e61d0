//! Memory of earlier startups, as pure judgement: the key that says which startups are comparable,
//! the per-phase baseline (median and spread of good startups), the `slow` margin, the ETA, the stall
//! limits learned from silent gaps, and "what changed since the last good start". The store (SQLite)
//! and the gathering of facts live in the binary; this module only decides, on plain values.
//!
//! The numbers (docs/history.md):
//! - a phase is `slow` once it has run longer than `max(SLOW_RATIO × median, median + slow floor)`,
//!   the floor 30 s by default: a 2 s phase taking 4 s is noise, a 2 min phase taking 3 min is not;
//! - a learned stall limit is `max(STALL_MULTIPLE × longest silent gap, stall floor)` over the good
//!   startups of the exact key (cache state included), the floor 120 s by default;
//! - both need `MIN_STARTUPS` good startups; fewer and vigil says nothing and keeps its defaults.

use crate::types::{Cause, Phase, Verdict};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A phase is slow past this multiple of its median (and past the median plus the floor).
pub const SLOW_RATIO: f64 = 1.5;
/// The default absolute margin over the median before a phase is called slow.
pub const SLOW_FLOOR_MS: u64 = 30_000;
/// A learned stall limit is this multiple of the longest silent gap seen in good startups.
pub const STALL_MULTIPLE: u64 = 3;
/// The default lowest learned stall limit.
pub const STALL_FLOOR_MS: u64 = 120_000;
/// Good startups needed before a baseline or a learned limit is used.
pub const MIN_STARTUPS: usize = 3;

/// What makes two startups comparable. `args` holds only the arguments that change startup time (the
/// profile's `key_flags`), normalised as flag → value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Key {
    pub server: String,
    #[serde(default)]
    pub version: Option<String>,
    pub model: String,
    #[serde(default)]
    pub model_bytes: Option<u64>,
    #[serde(default)]
    pub args: BTreeMap<String, String>,
    pub host: String,
    #[serde(default)]
    pub gpu: Option<String>,
    #[serde(default)]
    pub gpus: u32,
    /// Some JIT / compile cache directory the server uses was empty (or missing) at launch.
    pub cold_cache: bool,
}

impl Key {
    /// A short stable id (FNV-1a 64 of the canonical JSON form), for the store's index.
    pub fn id(&self) -> String {
        let s = serde_json::to_string(self).unwrap_or_default();
        format!("{:016x}", fnv1a(s.as_bytes()))
    }

    /// Same server and model: comparable at all, with a note of what differs.
    pub fn related(&self, o: &Key) -> bool {
        self.server == o.server && self.model == o.model
    }

    /// What differs from `o`, one short phrase each ("cold cache (was warm)", "--ctx-size 4096 (was 2048)").
    pub fn differences(&self, o: &Key) -> Vec<String> {
        let mut d = Vec::new();
        let mut field = |name: &str, a: String, b: String| {
            if a != b {
                d.push(format!("{name} {a} (was {b})"));
            }
        };
        field("server", self.server.clone(), o.server.clone());
        field("version", opt(&self.version), opt(&o.version));
        field("model", self.model.clone(), o.model.clone());
        field("model size", opt(&self.model_bytes), opt(&o.model_bytes));
        field("host", self.host.clone(), o.host.clone());
        field("GPU", opt(&self.gpu), opt(&o.gpu));
        field("GPUs", self.gpus.to_string(), o.gpus.to_string());
        if self.cold_cache != o.cold_cache {
            d.push(if self.cold_cache { "cold cache (was warm)".into() } else { "warm cache (was cold)".into() });
        }
        for k in self.args.keys().chain(o.args.keys().filter(|k| !self.args.contains_key(*k))) {
            let (a, b) = (self.args.get(k), o.args.get(k));
            if a != b {
                d.push(format!("{k} {} (was {})", a.map_or("unset", |s| s), b.map_or("unset", |s| s)));
            }
        }
        d
    }
}

fn opt<T: ToString>(v: &Option<T>) -> String {
    v.as_ref().map_or_else(|| "unknown".into(), |x| x.to_string())
}

/// FNV-1a, 64 bit: a stable hash for ids and config fingerprints (not a security boundary).
pub fn fnv1a(b: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for x in b {
        h ^= *x as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// One recorded startup.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Startup {
    /// The run (or log) name.
    pub name: String,
    pub key: Key,
    pub verdict: Verdict,
    #[serde(default)]
    pub cause: Option<Cause>,
    /// Milliseconds from the first fact to the verdict.
    #[serde(default)]
    pub total_ms: Option<u64>,
    /// Phase → milliseconds spent in it (the server's least advanced rank).
    #[serde(default)]
    pub phases: BTreeMap<Phase, u64>,
    /// Rank → phase → milliseconds.
    #[serde(default)]
    pub ranks: BTreeMap<String, BTreeMap<Phase, u64>>,
    /// Phase → the longest stretch without a progress signal in it (ms).
    #[serde(default)]
    pub gaps: BTreeMap<Phase, u64>,
    /// Phase → progress steps (k/n) per second, where the log gave k/n.
    #[serde(default)]
    pub rates: BTreeMap<Phase, f64>,
    /// Phase → GPU memory held at the phase's end (MiB), when known.
    #[serde(default)]
    pub gpu_mib: BTreeMap<Phase, u64>,
    /// What the start was made of, compared by "what changed": `version:…`, `config:…` (hashes),
    /// `env:…`, `flag:…` → value.
    #[serde(default)]
    pub facts: BTreeMap<String, String>,
    /// Unix milliseconds at the start.
    #[serde(default)]
    pub started_unix_ms: u64,
    /// Phases that ran past their usual duration by the margin (the `slow` events).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub slow: Vec<Phase>,
    /// The repairs `vigil up --repair` made before this start (issue #35), in words
    /// (`-c 100000000 -> 512, the context does not fit memory ...`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub repairs: Vec<String>,
}

impl Startup {
    pub fn good(&self) -> bool {
        self.verdict == Verdict::Ready
    }
}

/// The exact key's startups when there are enough good ones, else the nearest related key's (same
/// server and model, fewest differences), with what differs.
#[derive(Debug, Clone, PartialEq)]
pub struct Matched<'a> {
    pub startups: Vec<&'a Startup>,
    /// Empty for an exact match.
    pub differs: Vec<String>,
}

impl Matched<'_> {
    pub fn exact(&self) -> bool {
        self.differs.is_empty()
    }
}

/// Chooses the comparable past startups for `key` among `past` (any order).
pub fn match_key<'a>(key: &Key, past: &'a [Startup]) -> Option<Matched<'a>> {
    let exact: Vec<&Startup> = past.iter().filter(|s| s.key == *key).collect();
    if exact.iter().filter(|s| s.good()).count() >= MIN_STARTUPS {
        return Some(Matched { startups: exact, differs: vec![] });
    }
    // the nearest related key with enough good startups
    let mut by_key: Vec<(&Key, Vec<&Startup>)> = Vec::new();
    for s in past.iter().filter(|s| s.key.related(key) && s.key != *key) {
        match by_key.iter_mut().find(|(k, _)| **k == s.key) {
            Some((_, v)) => v.push(s),
            None => by_key.push((&s.key, vec![s])),
        }
    }
    by_key
        .into_iter()
        .filter(|(_, v)| v.iter().filter(|s| s.good()).count() >= MIN_STARTUPS)
        .map(|(k, v)| (key.differences(k), v))
        .min_by_key(|(d, v)| (d.len(), usize::MAX - v.len()))
        .map(|(differs, startups)| Matched { startups, differs })
        .or_else(|| (!exact.is_empty()).then(|| Matched { startups: exact, differs: vec![] }))
}

/// Median and spread of one phase over good startups.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PhaseStats {
    pub median_ms: u64,
    pub min_ms: u64,
    pub max_ms: u64,
    pub startups: usize,
}

impl PhaseStats {
    pub fn of(v: &[u64]) -> Option<PhaseStats> {
        if v.is_empty() {
            return None;
        }
        let mut s = v.to_vec();
        s.sort_unstable();
        Some(PhaseStats { median_ms: median_sorted(&s), min_ms: s[0], max_ms: s[s.len() - 1], startups: s.len() })
    }
}

fn median_sorted(s: &[u64]) -> u64 {
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2
    }
}

/// What the judge is told about earlier startups: usual durations, and the margins to apply.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Baseline {
    /// Good startups it was made from.
    pub startups: usize,
    pub total_ms_median: Option<u64>,
    pub phases: BTreeMap<Phase, PhaseStats>,
    /// The nearest key's, not the exact one's: what differs.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub differs: Vec<String>,
    /// The absolute margin over the median before `slow` (ms).
    pub slow_floor_ms: u64,
}

impl Baseline {
    /// From the good startups among `m` (failed ones never count); None below `MIN_STARTUPS`.
    pub fn from_matched(m: &Matched, slow_floor_ms: u64) -> Option<Baseline> {
        let good: Vec<&&Startup> = m.startups.iter().filter(|s| s.good()).collect();
        if good.len() < MIN_STARTUPS {
            return None;
        }
        let totals: Vec<u64> = good.iter().filter_map(|s| s.total_ms).collect();
        let mut phases = BTreeMap::new();
        for p in Phase::ALL {
            let v: Vec<u64> = good.iter().filter_map(|s| s.phases.get(&p).copied()).collect();
            if let Some(st) = PhaseStats::of(&v) {
                phases.insert(p, st);
            }
        }
        Some(Baseline {
            startups: good.len(),
            total_ms_median: PhaseStats::of(&totals).map(|s| s.median_ms),
            phases,
            differs: m.differs.clone(),
            slow_floor_ms,
        })
    }

    /// How long `p` may run before it is called slow; None without history for it.
    pub fn slow_after_ms(&self, p: Phase) -> Option<u64> {
        let m = self.phases.get(&p)?.median_ms;
        Some(((m as f64 * SLOW_RATIO) as u64).max(m + self.slow_floor_ms))
    }

    /// Milliseconds left until ready: the current phase's rest (from progress k/n when the log gives it,
    /// else its median) plus the medians of the phases after it. None without history.
    pub fn eta_ms(&self, p: Phase, in_phase_ms: u64, progress: Option<(u64, u64)>) -> Option<u64> {
        let rest_here = match progress {
            Some((k, n)) if k > 0 && n >= k => Some(in_phase_ms.saturating_mul(n - k) / k),
            _ => self.phases.get(&p).map(|s| s.median_ms.saturating_sub(in_phase_ms)),
        }?;
        let later: u64 =
            self.phases.iter().filter(|(q, _)| **q > p && **q < Phase::Serving).map(|(_, s)| s.median_ms).sum();
        Some(rest_here + later)
    }
}

/// The `slow` finding: a phase ran past its usual duration by the margin.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Slow {
    pub phase: Phase,
    pub in_phase_ms: u64,
    pub median_ms: u64,
    pub startups: usize,
    /// in_phase_ms / median_ms, two decimals.
    pub ratio: f64,
}

/// Is phase `p`, `in_phase_ms` into it, slow against the baseline?
pub fn slow(b: &Baseline, p: Phase, in_phase_ms: u64) -> Option<Slow> {
    let after = b.slow_after_ms(p)?;
    let median_ms = b.phases.get(&p)?.median_ms;
    (in_phase_ms > after).then(|| Slow {
        phase: p,
        in_phase_ms,
        median_ms,
        startups: b.startups,
        ratio: ratio(in_phase_ms, median_ms),
    })
}

/// a / b rounded to two decimals (b = 0 counts as 1 ms).
pub fn ratio(a: u64, b: u64) -> f64 {
    (a as f64 / b.max(1) as f64 * 100.0).round() / 100.0
}

/// Per-phase stall limits learned from the longest silent gap of each phase in good startups of the
/// exact key (and so of the same cache state): `max(STALL_MULTIPLE × gap, floor)`. Empty below
/// `MIN_STARTUPS` good startups or for a nearest (not exact) match: a cold start is never judged by
/// limits learned from warm ones. Every phase the good startups went through is learned (issue #36: a
/// stall in a phase the history has seen gets its learned limit): where a startup measured no silent gap in
/// it (a phase left by a probe's answer, not a line), the whole time it spent there stands for it, the
/// longest a gap in it can have been.
pub fn learned_stalls(m: &Matched, floor_ms: u64) -> BTreeMap<Phase, u64> {
    let mut out = BTreeMap::new();
    if !m.exact() {
        return out;
    }
    let good: Vec<&&Startup> = m.startups.iter().filter(|s| s.good()).collect();
    if good.len() < MIN_STARTUPS {
        return out;
    }
    for p in Phase::ALL {
        if p >= Phase::Serving {
            continue;
        }
        // every good startup must have been through the phase: a phase seen once is not learned
        let gaps: Vec<u64> = good.iter().filter_map(|s| s.gaps.get(&p).or(s.phases.get(&p)).copied()).collect();
        if gaps.len() < MIN_STARTUPS {
            continue;
        }
        let longest = gaps.into_iter().max().unwrap_or(0);
        out.insert(p, longest.saturating_mul(STALL_MULTIPLE).max(floor_ms));
    }
    out
}

/// One difference from the last good start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Change {
    /// `version:sglang`, `config:model`, `env:NCCL_ALGO`, `flag:--ctx-size`.
    pub item: String,
    pub before: Option<String>,
    pub after: Option<String>,
}

/// Where a start's facts of one kind came from: `from:flags` is `command` (the launch command: what the user
/// set) or `log` (the arguments a server prints, for a run vigil attached to); `from:env` is `launch` when the
/// environment was read at launch. Not facts themselves: never a change.
pub const FROM_FLAGS: &str = "from:flags";
pub const FROM_ENV: &str = "from:env";

/// What differs in `now` from the facts of `good` (the last good start of the key), user-set items first
/// (flags, environment, model files, then versions and the rest). What the user set is compared (issue #33):
/// a value `now` lacks is a change only where both starts know all of that kind (flags from the launch command,
/// the environment read at launch); a value missing from a crashed start's log (a version line, the arguments a
/// server prints once it got that far) is not a change.
pub fn what_changed(good: &BTreeMap<String, String>, now: &BTreeMap<String, String>) -> Vec<Change> {
    let both =
        |marker: &str, v: &str| good.get(marker).is_some_and(|x| x == v) && now.get(marker).is_some_and(|x| x == v);
    let complete = |k: &str| {
        (k.starts_with("flag:") && both(FROM_FLAGS, "command")) || (k.starts_with("env:") && both(FROM_ENV, "launch"))
    };
    let mut out = Vec::new();
    for k in now.keys().chain(good.keys().filter(|k| !now.contains_key(*k))) {
        if k.starts_with("from:") {
            continue;
        }
        let (a, b) = (good.get(k), now.get(k));
        if a != b && (b.is_some() || complete(k)) {
            out.push(Change { item: k.clone(), before: a.cloned(), after: b.cloned() });
        }
    }
    let rank = |c: &Change| ["flag:", "env:", "config:"].iter().position(|p| c.item.starts_with(p)).unwrap_or(3);
    out.sort_by_key(rank);
    out
}

/// The last good startup among `past` (newest last).
pub fn last_good<'a>(past: &[&'a Startup]) -> Option<&'a Startup> {
    past.iter().rev().find(|s| s.good()).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(cold: bool) -> Key {
        Key { server: "sglang".into(), model: "/m".into(), host: "h".into(), cold_cache: cold, ..Key::default() }
    }

    fn st(k: &Key, v: Verdict, weights: u64, gap: u64) -> Startup {
        Startup {
            name: "r".into(),
            key: k.clone(),
            verdict: v,
            cause: None,
            total_ms: Some(weights + 1000),
            phases: [(Phase::Weights, weights)].into(),
            ranks: BTreeMap::new(),
            gaps: [(Phase::Weights, gap)].into(),
            rates: BTreeMap::new(),
            gpu_mib: BTreeMap::new(),
            facts: BTreeMap::new(),
            started_unix_ms: 0,
            slow: vec![],
            repairs: vec![],
        }
    }

    #[test]
    fn the_median_and_the_slow_margin() {
        let k = key(false);
        let past = vec![
            st(&k, Verdict::Ready, 100_000, 1),
            st(&k, Verdict::Ready, 120_000, 1),
            st(&k, Verdict::Ready, 140_000, 1),
            st(&k, Verdict::Crashed, 1_000, 1),
        ];
        let m = match_key(&k, &past).unwrap();
        let b = Baseline::from_matched(&m, SLOW_FLOOR_MS).unwrap();
        assert_eq!(b.startups, 3);
        assert_eq!(b.phases[&Phase::Weights].median_ms, 120_000);
        assert_eq!(b.slow_after_ms(Phase::Weights), Some(180_000));
        assert!(slow(&b, Phase::Weights, 180_000).is_none());
        let s = slow(&b, Phase::Weights, 180_001).unwrap();
        assert_eq!(s.ratio, 1.5);
        // short phases need the absolute floor too
        let short = vec![st(&k, Verdict::Ready, 2000, 1); 3];
        let b = Baseline::from_matched(&match_key(&k, &short).unwrap(), SLOW_FLOOR_MS).unwrap();
        assert_eq!(b.slow_after_ms(Phase::Weights), Some(32_000));
    }

    #[test]
    fn nearest_key_says_what_differs_and_teaches_no_stall_limit() {
        let warm = key(false);
        let mut other = key(true);
        other.args.insert("--tp".into(), "8".into());
        let past = vec![st(&warm, Verdict::Ready, 1000, 500); 3];
        let m = match_key(&other, &past).unwrap();
        assert_eq!(m.differs, vec!["cold cache (was warm)".to_string(), "--tp 8 (was unset)".to_string()]);
        assert!(learned_stalls(&m, 1000).is_empty());
        let exact = match_key(&warm, &past).unwrap();
        assert_eq!(learned_stalls(&exact, 1000)[&Phase::Weights], 1500);
        assert_eq!(learned_stalls(&exact, 60_000)[&Phase::Weights], 60_000);
    }

    /// issue #36: a phase the good startups went through but measured no silent gap in (llama-server's
    /// `http`, left by the probe's answer) is learned too, from the time spent in it.
    #[test]
    fn a_phase_seen_without_a_gap_is_learned_from_its_duration() {
        let k = key(false);
        let mut past = vec![st(&k, Verdict::Ready, 1000, 500); 3];
        for (i, s) in past.iter_mut().enumerate() {
            s.phases.insert(Phase::Http, 100 + i as u64 * 100);
        }
        let m = match_key(&k, &past).unwrap();
        let l = learned_stalls(&m, 0);
        assert_eq!((l[&Phase::Weights], l[&Phase::Http]), (1500, 900), "{l:?}");
        assert!(!l.contains_key(&Phase::CudaGraphs), "a phase never seen is not learned");
        // seen in fewer good startups than needed: not learned
        past[0].phases.remove(&Phase::Http);
        assert!(!learned_stalls(&match_key(&k, &past).unwrap(), 0).contains_key(&Phase::Http));
    }

    #[test]
    fn failed_startups_never_teach() {
        let k = key(false);
        let past = vec![st(&k, Verdict::Stalled, 1000, 900_000); 5];
        assert!(match_key(&k, &past).is_some_and(|m| Baseline::from_matched(&m, 0).is_none()));
        assert!(learned_stalls(&match_key(&k, &past).unwrap(), 0).is_empty());
    }

    #[test]
    fn eta_from_progress_else_history() {
        let k = key(false);
        let mut s = st(&k, Verdict::Ready, 10_000, 1);
        s.phases.insert(Phase::CudaGraphs, 60_000);
        let past = vec![s; 3];
        let b = Baseline::from_matched(&match_key(&k, &past).unwrap(), 0).unwrap();
        assert_eq!(b.eta_ms(Phase::Weights, 4000, None), Some(6000 + 60_000));
        // 12 of 52 graphs in 30 s: 40 more take 100 s
        assert_eq!(b.eta_ms(Phase::CudaGraphs, 30_000, Some((12, 52))), Some(100_000));
    }

    #[test]
    fn changes_list_each_item() {
        let a: BTreeMap<String, String> =
            [("version:x".into(), "1".into()), ("env:NCCL_ALGO".into(), "ring".into())].into();
        let b: BTreeMap<String, String> =
            [("version:x".into(), "2".into()), ("config:model".into(), "ab".into())].into();
        let c = what_changed(&a, &b);
        // the environment gone from `now` is no change unless both starts read it at launch
        assert_eq!(c.len(), 2);
        assert_eq!(c[0], Change { item: "config:model".into(), before: None, after: Some("ab".into()) });
        assert_eq!(c[1].item, "version:x");
        let launch = |mut m: BTreeMap<String, String>| {
            m.insert(FROM_ENV.into(), "launch".into());
            m
        };
        let c = what_changed(&launch(a), &launch(b));
        assert_eq!(
            c.iter().map(|c| c.item.as_str()).collect::<Vec<_>>(),
            ["env:NCCL_ALGO", "config:model", "version:x"]
        );
    }

    /// Issue #33: what the user set is compared; a crashed start that never printed its arguments (or a version)
    /// changed none of them.
    #[test]
    fn a_value_missing_from_a_crashed_start_is_no_change() {
        let m = |kv: &[(&str, &str)]| -> BTreeMap<String, String> {
            kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
        };
        let good =
            m(&[(FROM_FLAGS, "command"), ("flag:tp_size", "1"), ("flag:port", "30000"), ("version:sglang", "0.5.17")]);
        let now = m(&[(FROM_FLAGS, "command"), ("flag:tp_size", "3"), ("flag:port", "30000")]);
        let c = what_changed(&good, &now);
        assert_eq!(c, vec![Change { item: "flag:tp_size".into(), before: Some("1".into()), after: Some("3".into()) }]);
        // flags a server printed (an attached run): one the crashed start did not print is not unset
        let printed = m(&[(FROM_FLAGS, "log"), ("flag:tp_size", "1"), ("flag:chunked_prefill_size", "8192")]);
        assert!(what_changed(&printed, &m(&[(FROM_FLAGS, "log")])).is_empty());
        // a flag the user dropped from the command line is a change
        let dropped = what_changed(&good, &m(&[(FROM_FLAGS, "command"), ("flag:port", "30000")]));
        assert_eq!(dropped[0], Change { item: "flag:tp_size".into(), before: Some("1".into()), after: None });
    }
}
