//! `vigil timeline NAME|LOG [--svg FILE]`: reads the run's log (or the log given) offline, takes the
//! history's per-phase medians for its name, and draws the picture (`sinks::timeline`) as SVG or text.

use crate::error::CliError;
use crate::exit::Exit;
use crate::sinks::report::{is_tty, out_line, out_raw};
use crate::sinks::timeline::{svg, text, Picture};
use crate::sources::history::{read_log, Store};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use vigil_core::{Phase, Profiles};

/// The history's per-phase medians for a name (good startups only).
fn medians(name: &str) -> BTreeMap<Phase, u64> {
    let Ok((store, _)) = Store::open_default() else {
        return BTreeMap::new();
    };
    let good: Vec<vigil_core::history::Startup> =
        store.list(Some(name)).unwrap_or_default().into_iter().filter(|s| s.good()).collect();
    let mut out = BTreeMap::new();
    for p in Phase::ALL {
        let v: Vec<u64> = good.iter().filter_map(|s| s.phases.get(&p).copied()).collect();
        if let Some(st) = vigil_core::history::PhaseStats::of(&v) {
            out.insert(p, st.median_ms);
        }
    }
    out
}

/// `vigil timeline NAME|LOG [--svg FILE]`.
pub fn run(target: &str, svg_out: Option<&Path>, profiles: &Profiles) -> Result<Exit, CliError> {
    let (log, name) = if Path::new(target).is_file() {
        let n = Path::new(target).file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        (PathBuf::from(target), n)
    } else {
        let (_, rec) = crate::node::run::load(target)?;
        (PathBuf::from(&rec.log), rec.name)
    };
    let o = read_log(&log, profiles).map_err(CliError::usage)?;
    let title = format!("{} — {}", name, o.report.server.as_deref().unwrap_or("server"));
    let pic = Picture::new(title, &o.report, &o.ranks, &o.last_lines, medians(&name));
    if let Some(f) = svg_out {
        std::fs::write(f, svg(&pic)).map_err(|e| CliError::usage(format!("--svg {}: {e}", f.display())))?;
        out_line(&format!("wrote {}", f.display()));
        return Ok(Exit::Ready);
    }
    let tty = is_tty(1);
    let color = tty && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    // the drawing's own colours; its text (phase and rank names) is vigil's
    for l in text(&pic, if tty { 120 } else { 100 }, color) {
        out_raw(&l);
    }
    Ok(Exit::Ready)
}
