//! Limits as the command line gives them: durations (`90s`, `5m`, `500ms`) and stall limits (`--stall DUR`
//! for every phase, `--stall PHASE=DUR` for one). Pure parsers, shared by every layer that reads them.

use crate::Phase;
use std::time::Duration;

/// Parses `90s`, `5m`, `1h`, `500ms`, `1.5s` or a bare number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let (num, mult) = if let Some(n) = t.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = t.strip_suffix('m') {
        (n, 60.0)
    } else if let Some(n) = t.strip_suffix('h') {
        (n, 3600.0)
    } else {
        (t, 1.0)
    };
    let v: f64 = num.trim().parse().map_err(|_| format!("bad duration '{s}' (use e.g. 90s, 5m, 1h, 500ms)"))?;
    if !v.is_finite() || v < 0.0 || v * mult > 1e9 {
        return Err(format!("bad duration '{s}'"));
    }
    Ok(Duration::from_secs_f64(v * mult))
}

/// A duration that must be above zero: a deadline, an interval, a timeout (0 would fire at once, or spin).
pub fn parse_nonzero_duration(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d < Duration::from_millis(1) {
        return Err(format!("'{s}': must be above zero (e.g. 500ms, 90s, 5m)"));
    }
    Ok(d)
}

/// One `--stall` flag, parsed when the command line is (so a bad one stops before any launch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stall {
    /// `None`: every phase.
    pub phase: Option<Phase>,
    pub ms: u64,
}

/// `--stall DUR` (every phase) or `--stall PHASE=DUR`: clap's value parser. A limit of 0 is refused: it
/// would call a healthy server stalled at its first silent millisecond.
pub fn parse_stall(s: &str) -> Result<Stall, String> {
    let st = stall_of(s)?;
    if st.ms == 0 {
        return Err(format!("'{s}': a stall limit must be above zero (0 calls every server stalled at once)"));
    }
    Ok(st)
}

fn stall_of(s: &str) -> Result<Stall, String> {
    match s.split_once('=') {
        Some((p, d)) => {
            let phase = Phase::parse(p.trim()).ok_or_else(|| {
                let names: Vec<_> = Phase::ALL.iter().map(|p| p.as_str()).collect();
                format!("unknown phase '{p}' (one of {})", names.join(", "))
            })?;
            Ok(Stall { phase: Some(phase), ms: parse_duration(d)?.as_millis() as u64 })
        }
        None => Ok(Stall { phase: None, ms: parse_duration(s)?.as_millis() as u64 }),
    }
}

/// The stall limits as one for every phase (the last given) and per-phase ones, in milliseconds.
pub type Stalls = (Option<u64>, Vec<(Phase, u64)>);

/// The stall flags as one limit for every phase (the last given) and per-phase ones.
pub fn parse_stalls(v: &[Stall]) -> Stalls {
    let all = v.iter().filter(|s| s.phase.is_none()).map(|s| s.ms).next_back();
    let per = v.iter().filter_map(|s| s.phase.map(|p| (p, s.ms))).collect();
    (all, per)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stalls() {
        let v = [parse_stall("2s").unwrap(), parse_stall("cuda_graphs=10m").unwrap()];
        let (a, p) = parse_stalls(&v);
        assert_eq!(a, Some(2000));
        assert_eq!(p, vec![(Phase::CudaGraphs, 600_000)]);
        assert!(parse_stall("bogus=1s").is_err());
        assert!(parse_stall("weights=soon").is_err());
    }

    /// issue #36: `--stall 0s` stopped a healthy server in 0.43 s; a zero deadline or interval makes no sense.
    #[test]
    fn zero_is_refused_where_it_makes_no_sense() {
        for s in ["0s", "0", "weights=0s", "0.0001s", "http=0ms"] {
            let e = parse_stall(s).unwrap_err();
            assert!(e.contains("above zero"), "{s}: {e}");
        }
        assert_eq!(parse_stall("1ms").unwrap().ms, 1);
        assert!(parse_nonzero_duration("0s").unwrap_err().contains("above zero"));
        assert_eq!(parse_nonzero_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("0s").unwrap(), Duration::ZERO, "a grace of 0 still means kill at once");
    }
}
