//! How the startup history reads to people (docs/history.md): the usual duration and ETA of a phase line,
//! the live line's part, a slow phase, the verdict summary's history lines, what changed, and the lines
//! and JSON of `vigil history`. The facts and the store are `sources::history`; the judgement is
//! `vigil_core::history`.

use std::collections::BTreeMap;
use vigil_core::history::{self as core, Slow, Startup};
use vigil_core::judge::fmt_ms;
use vigil_core::{Judge, Phase, Report};

/// " · usually 12s · ETA 40s" for a phase line, or nothing without history.
pub fn usual_text(usual: Option<u64>, eta: Option<u64>) -> String {
    let mut s = String::new();
    if let Some(u) = usual {
        s.push_str(&format!("  (usually {}", fmt_ms(u)));
        if let Some(e) = eta {
            s.push_str(&format!(", ready in ~{}", fmt_ms(e)));
        }
        s.push(')');
    } else if let Some(e) = eta {
        s.push_str(&format!("  (ready in ~{})", fmt_ms(e)));
    }
    s
}

/// The live line's part: " · usually 12s · ETA 40s".
pub fn live_text(j: &Judge) -> String {
    let mut s = String::new();
    if let Some(u) = j.usual_ms(j.phase()) {
        s.push_str(&format!(" · usually {}", fmt_ms(u)));
    }
    if let Some(e) = j.eta_ms() {
        s.push_str(&format!(" · ETA {}", fmt_ms(e)));
    }
    s
}

pub fn slow_text(x: &Slow) -> String {
    format!(
        "slow: {} {} so far, {:.1}× slower than the median {} of {} startups",
        x.phase,
        fmt_ms(x.in_phase_ms),
        x.ratio,
        fmt_ms(x.median_ms),
        x.startups
    )
}

/// The verdict summary's history lines: baseline, slow phases, what changed.
/// Changes a verdict shows people (the command line's first): all of them are in `vigil history` and the JSON.
const SHOWN_CHANGES: usize = 10;

pub fn summary_lines(r: &Report) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(b) = &r.baseline {
        let mut s = format!("  usual: {} good startups", b.startups);
        if let Some(m) = b.total_ms_median {
            s.push_str(&format!(", median total {}", fmt_ms(m)));
        }
        if let Some(x) = b.ratio {
            s.push_str(&format!(", this one {x:.2}×"));
        }
        if !b.differs.is_empty() {
            s.push_str(&format!(" (nearest key: {})", b.differs.join(", ")));
        }
        out.push(s);
    }
    for x in &r.slow {
        out.push(format!("  {}", slow_text(x)));
    }
    if !r.changes.is_empty() {
        out.push("  changed since the last good start:".into());
        for c in r.changes.iter().take(SHOWN_CHANGES) {
            out.push(format!("    {}", change_text(c)));
        }
        if r.changes.len() > SHOWN_CHANGES {
            let more = r.changes.len() - SHOWN_CHANGES;
            out.push(format!("    … and {more} more (`vigil history`, the JSON verdict)"));
        }
    }
    out
}

pub(crate) fn change_text(c: &core::Change) -> String {
    format!("{}: {} → {}", c.item, c.before.as_deref().unwrap_or("unset"), c.after.as_deref().unwrap_or("unset"))
}

/// A start `vigil up --repair` reached after repairs: "ready after 1 repair: -c 100000000 -> 512, the
/// context does not fit memory" (each repair is `EDIT, WHY`).
pub fn repaired_text(verdict: vigil_core::Verdict, repairs: &[String]) -> String {
    let n = repairs.len();
    let list = repairs.join("; ");
    format!("{verdict} after {n} repair{}: {list}", if n == 1 { "" } else { "s" })
}

pub(crate) fn fmt_phases(p: &BTreeMap<Phase, u64>) -> String {
    p.iter().map(|(k, v)| format!("{k} {}", fmt_ms(*v))).collect::<Vec<_>>().join(" · ")
}

pub fn fmt_time(unix_ms: u64) -> String {
    let secs = (unix_ms / 1000) as i64;
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // civil from days (Howard Hinnant's algorithm)
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02} UTC", rem / 3600, (rem % 3600) / 60)
}

/// One line of `history --json`: the recorded startup (name, key, verdict, cause, total_ms, phases,
/// ranks, gaps, rates, gpu_mib, facts, started_unix_ms, slow), its key's id, and what changed since the
/// previous good start of its key.
#[derive(serde::Serialize)]
pub(crate) struct JsonLine<'a> {
    #[serde(flatten)]
    pub startup: &'a Startup,
    pub key_id: String,
    pub changes: &'a [core::Change],
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_render_in_utc() {
        assert_eq!(fmt_time(0), "1970-01-01 00:00 UTC");
        assert_eq!(fmt_time(1_764_560_000_000), "2025-12-01 03:33 UTC");
    }
}
