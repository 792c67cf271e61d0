//! `vigil history [NAME] [--json]` and `vigil history import LOG…`: past startups from the store
//! (`sources::history`), rendered by `sinks::tables::history`; old logs read offline into the store.

use crate::error::CliError;
use crate::exit::Exit;
use crate::sinks::history::fmt_phases;
use crate::sinks::report::out_line;
use crate::sources::history::{imported, read_log, Store};
use std::collections::BTreeMap;
use std::path::PathBuf;
use vigil_core::history::{self as core, Startup};
use vigil_core::judge::fmt_ms;
use vigil_core::{Profiles, Verdict};

fn open_for_command() -> Result<Store, CliError> {
    let (store, note) = Store::open_default().map_err(|e| CliError::usage(format!("history: {e}")))?;
    if let Some(n) = note {
        eprintln!("vigil: {n}");
    }
    Ok(store)
}

/// `vigil history [NAME] [--json]`: past startups newest last, then per key the per-phase medians and
/// spread; failed or slow ones with what changed since the last good start of their key.
pub fn list(name: Option<&str>, json: bool) -> Result<Exit, CliError> {
    let store = open_for_command()?;
    let all = store.list(name).map_err(|e| CliError::usage(format!("history: {e}")))?;
    if all.is_empty() && !json {
        out_line(&match name {
            Some(n) => format!("no startups of {n} recorded in {}", store.path.display()),
            None => format!("no startups recorded in {}", store.path.display()),
        });
        return Ok(Exit::Ready);
    }
    // what changed: against the previous good startup of the same key
    let mut last_good: BTreeMap<String, &Startup> = BTreeMap::new();
    let mut changes: Vec<Vec<core::Change>> = Vec::new();
    for s in &all {
        let id = s.key.id();
        let c = match (s.good() && s.slow.is_empty(), last_good.get(&id)) {
            (false, Some(g)) => core::what_changed(&g.facts, &s.facts),
            _ => vec![],
        };
        changes.push(c);
        if s.good() && s.slow.is_empty() {
            last_good.insert(id, s);
        }
    }
    crate::sinks::tables::history(&all, &changes, json);
    Ok(Exit::Ready)
}

/// `vigil history import LOG…`: old logs into the store, so a team's logs count from day one.
pub fn import(files: &[PathBuf], profiles: &Profiles) -> Result<Exit, CliError> {
    let mut store = open_for_command()?;
    let mut worst = Exit::Ready;
    for f in files {
        let o = match read_log(f, profiles) {
            Ok(o) => o,
            Err(e) => {
                eprintln!("vigil: history import: {e}");
                worst = Exit::Usage;
                continue;
            }
        };
        let s = imported(f, &o, profiles);
        store.insert(&s).map_err(|e| CliError::usage(format!("history import: {e}")))?;
        out_line(&format!(
            "imported {}: {} {} — {}",
            f.display(),
            s.verdict,
            s.total_ms.map(fmt_ms).unwrap_or_else(|| "(no timestamps)".into()),
            fmt_phases(&s.phases)
        ));
        if s.verdict == Verdict::Starting && s.phases.is_empty() {
            eprintln!("vigil: history import: {}: no startup phases found", f.display());
        }
    }
    Ok(worst)
}
