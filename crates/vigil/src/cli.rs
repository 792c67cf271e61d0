//! Shared command-line helpers: durations, profile loading, errors.

use std::path::PathBuf;
use std::time::Duration;
use vigil_core::{Phase, Profiles};

/// An error the user can act on (exit 2) or an internal one (exit 1), printed as one line.
#[derive(Debug)]
pub enum CliError {
    Usage(String),
    Internal(String),
    /// A remote host could not be reached, or the connection was lost for good (exit 12).
    Unreachable(String),
}

impl CliError {
    pub fn usage(s: impl Into<String>) -> CliError {
        CliError::Usage(s.into())
    }

    /// The exit code this error ends vigil (or one host's work) with.
    pub fn code(&self) -> i32 {
        match self {
            CliError::Usage(_) => crate::exit::USAGE,
            CliError::Internal(_) => crate::exit::INTERNAL,
            CliError::Unreachable(_) => crate::exit::UNREACHABLE,
        }
    }

    /// The one-line message.
    pub fn message(self) -> String {
        match self {
            CliError::Usage(m) | CliError::Internal(m) | CliError::Unreachable(m) => m,
        }
    }
}

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

/// Stall limits from the command line: one for every phase, and per-phase ones (ms).
pub type Stalls = (Option<u64>, Vec<(Phase, u64)>);

/// One `--stall` flag, parsed when the command line is (so a bad one stops before any launch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stall {
    /// `None`: every phase.
    pub phase: Option<Phase>,
    pub ms: u64,
}

/// `--stall DUR` (every phase) or `--stall PHASE=DUR`: clap's value parser.
pub fn parse_stall(s: &str) -> Result<Stall, String> {
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

/// The stall flags as one limit for every phase (the last given) and per-phase ones.
pub fn parse_stalls(v: &[Stall]) -> Stalls {
    let all = v.iter().filter(|s| s.phase.is_none()).map(|s| s.ms).next_back();
    let per = v.iter().filter_map(|s| s.phase.map(|p| (p, s.ms))).collect();
    (all, per)
}

fn profile_dirs(extra: &[PathBuf]) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")));
    if let Some(b) = base {
        dirs.push(b.join("vigil/profiles"));
    }
    dirs.extend(extra.iter().cloned());
    dirs
}

/// Built-in profiles extended by `$XDG_CONFIG_HOME/vigil/profiles/*.toml` and `--profiles DIR`.
pub fn load_profiles(extra: &[PathBuf]) -> Result<Profiles, CliError> {
    let mut files = Vec::new();
    for d in profile_dirs(extra) {
        let rd = match std::fs::read_dir(&d) {
            Ok(rd) => rd,
            Err(e) => {
                if extra.contains(&d) {
                    return Err(CliError::usage(format!("--profiles {}: {e}", d.display())));
                }
                continue;
            }
        };
        let mut names: Vec<PathBuf> = rd
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "toml"))
            .collect();
        names.sort();
        for p in names {
            let text =
                std::fs::read_to_string(&p).map_err(|e| CliError::usage(format!("profile {}: {e}", p.display())))?;
            files.push((p.display().to_string(), text));
        }
    }
    Profiles::load(&files).map_err(|e| CliError::usage(format!("profile error: {e}")))
}

pub fn check_server(p: &Profiles, s: &Option<String>) -> Result<(), CliError> {
    if let Some(s) = s {
        if p.get(s).is_none() {
            return Err(CliError::usage(format!(
                "--server: unknown server kind '{s}' (known: {})",
                p.names().join(", ")
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("5m").unwrap(), Duration::from_secs(300));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        for bad in ["", "x", "-1s", "1d", "nan", "1e300"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn stalls() {
        let v = [parse_stall("2s").unwrap(), parse_stall("cuda_graphs=10m").unwrap()];
        let (a, p) = parse_stalls(&v);
        assert_eq!(a, Some(2000));
        assert_eq!(p, vec![(Phase::CudaGraphs, 600_000)]);
        assert!(parse_stall("bogus=1s").is_err());
        assert!(parse_stall("weights=soon").is_err());
    }
}
