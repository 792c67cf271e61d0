//! The tables and one-shot reports of the commands that are not watches (`status`, `ps`, `gpu`, `check`,
//! the per-host listings of `--host`): each renders typed rows either as JSON or as aligned text, here
//! and nowhere else. The rows are `records.rs`'s; what rendering needs beyond them (a process's command
//! line, the time) the caller passes in. Watches report through the event stream (`events.rs`, `report.rs`).

use crate::sinks::events::FleetEnd;
use crate::sinks::records::{CheckReport, ProcRow, RunRow, Severity, Snapshot};
use crate::sinks::redact::redact_cmdline;
use crate::sinks::report::{out_line, out_raw};
use std::collections::BTreeMap;
use vigil_core::judge::fmt_ms;

/// Rows as one JSON array, or a header and a line per row (`empty` when there are none).
pub fn rows<T: serde::Serialize>(rows: &[T], json: bool, empty: &str, header: &str, line: impl Fn(&T) -> String) {
    if json {
        out_raw(&serde_json::to_string(&rows).unwrap_or_default());
    } else if rows.is_empty() {
        out_line(empty);
    } else {
        out_line(header);
        for row in rows {
            out_line(&line(row));
        }
    }
}

/// The HOST column: shown only when some row is on a remote node.
struct HostColumn(bool);

impl HostColumn {
    fn of<'a>(hosts: impl IntoIterator<Item = &'a Option<String>>) -> HostColumn {
        HostColumn(hosts.into_iter().any(Option::is_some))
    }
    fn cell(&self, h: &Option<String>) -> String {
        if self.0 {
            format!("{:<20} ", h.as_deref().unwrap_or("-"))
        } else {
            String::new()
        }
    }
    fn header(&self) -> String {
        self.cell(&Some("HOST".into()))
    }
}

/// `vigil status` (with a HOST column for runs on remote nodes).
pub fn status(rows: &[RunRow], json: bool) {
    let host = HostColumn::of(rows.iter().map(|r| &r.host));
    let header = format!(
        "{}{:<16} {:<10} {:<14} {:<12} {:>8} {:>6} {:>8} {:>9}",
        host.header(),
        "NAME",
        "SERVER",
        "STATE",
        "PHASE",
        "FOR",
        "PORT",
        "PID",
        "LOG AGE"
    );
    self::rows(rows, json, "no runs", &header, |r| {
        format!(
            "{}{:<16} {:<10} {:<14} {:<12} {:>8} {:>6} {:>8} {:>9}",
            host.cell(&r.host),
            r.name,
            r.server.clone().unwrap_or_else(|| "-".into()),
            r.state,
            r.phase,
            r.in_state.clone().unwrap_or_else(|| "-".into()),
            r.port.map_or("-".into(), |p| p.to_string()),
            r.pid.map_or("-".into(), |p| p.to_string()),
            r.last_log_line_age_s.map_or("-".into(), |a| format!("{a}s")),
        )
    });
}

/// `vigil ps` (with a HOST column for remote nodes).
pub fn ps(rows: &[ProcRow], json: bool) {
    let host = HostColumn::of(rows.iter().map(|r| &r.host));
    let header =
        format!("{}{:>8} {:<10} {:>8} {:<12} {:>9} CMD", host.header(), "PID", "SERVER", "AGE", "PORTS", "GPU MiB");
    self::rows(rows, json, "no inference servers found that vigil did not start", &header, |r| {
        let ports = r.ports.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(",");
        format!(
            "{}{:>8} {:<10} {:>8} {:<12} {:>9} {}",
            host.cell(&r.host),
            r.pid,
            r.server,
            r.age_s.map_or("-".into(), |a| fmt_ms(a * 1000)),
            if ports.is_empty() { "-".into() } else { ports },
            r.gpu_mib.map_or("-".into(), |m| m.to_string()),
            r.cmd
        )
    });
}

/// `vigil gpu`: one sample of every GPU (taken at `t_unix_ms`) and the processes holding memory, each with
/// its command line (`cmdlines`, by pid; redacted here).
pub fn gpu(s: &Snapshot, cmdlines: &BTreeMap<i32, String>, t_unix_ms: u64, json: bool) {
    if json {
        let mut v = serde_json::to_value(s).unwrap_or_default();
        v["t_unix_ms"] = t_unix_ms.into();
        out_raw(&v.to_string());
    } else {
        for g in &s.gpus {
            out_line(&format!(
                "GPU {}  {:>7} / {:>7} MiB  util {}%  ({})",
                g.index,
                g.used_mib,
                g.total_mib,
                g.util.map_or("?".into(), |u| u.to_string()),
                s.source
            ));
        }
        for p in &s.procs {
            let cmd = cmdlines.get(&p.pid).map_or("?", String::as_str);
            out_line(&format!("  pid {:>7} GPU {} {:>7} MiB  {}", p.pid, p.gpu, p.used_mib, redact_cmdline(cmd)));
        }
    }
}

/// `check`'s findings and summary line.
pub fn check(rep: &CheckReport, json: bool) {
    if json {
        let v = serde_json::json!({"event": "check", "server": rep.server, "version": rep.version, "context_len": rep.context, "draft_context_len": rep.draft_context, "findings": rep.findings, "errors": rep.errors(), "blocking": rep.blocking(), "warnings": rep.warnings()});
        out_raw(&v.to_string());
        return;
    }
    for f in &rep.findings {
        let tag = match f.severity {
            Severity::Error if f.confirmed.is_none() => "ERROR?",
            Severity::Error => "ERROR",
            Severity::Warning => "WARN  ",
            Severity::Info => "info  ",
        };
        out_line(&format!("{tag} [{}] {}", f.rule, f.message));
        if let Some(fix) = &f.fix {
            out_line(&format!("      fix: {fix}"));
        }
    }
    let unconfirmed = rep.errors() - rep.blocking();
    out_line(&format!(
        "vigil check: {} error(s){}, {} warning(s)",
        rep.errors(),
        if unconfirmed > 0 {
            format!(" ({unconfirmed} marked ERROR? not confirmed against the server: `vigil up` launches anyway)")
        } else {
            String::new()
        },
        rep.warnings()
    ));
}

/// The end of a fleet or multi-node watch: one JSON object, or the headline (multi-node) and a line per host.
pub fn fleet(end: &FleetEnd, json: bool, quiet: bool) {
    let mut v = end.to_json();
    if let Some(m) = v.as_object_mut() {
        m.insert("v".into(), crate::sinks::events::SCHEMA.into());
    }
    let v = v.to_string();
    crate::sinks::listen::publish(&v);
    if json {
        out_raw(&v);
        return;
    }
    for l in fleet_text(end, quiet) {
        out_line(&l);
    }
}

/// The text of a fleet's or multi-node server's end: the headline (multi-node), then the table (not with
/// `quiet`; a quiet fleet says nothing).
pub fn fleet_text(end: &FleetEnd, quiet: bool) -> Vec<String> {
    let mut out = Vec::new();
    if quiet && !end.multi {
        return out;
    }
    if end.multi {
        let line = match end.decider.map(|i| &end.hosts[i]) {
            Some(d) => format!(
                "multi-node server: {} — rank {} on {}: {}",
                d.verdict.to_uppercase(),
                d.rank.unwrap_or(0),
                d.host,
                d.detail
            ),
            None => format!("multi-node server: READY — all {} ranks ready", end.hosts.len()),
        };
        out.push(line);
        if quiet {
            return out;
        }
    }
    out.push(format!("{:<24} {:<5} {:<18} {:<12} DETAIL", "HOST", "RANK", "VERDICT", "PHASE"));
    for r in &end.hosts {
        out.push(format!(
            "{:<24} {:<5} {:<18} {:<12} {}",
            r.host,
            r.rank.map_or("-".into(), |x| x.to_string()),
            r.verdict,
            r.phase.map_or("-".into(), |x| x.to_string()),
            r.detail
        ));
    }
    out
}

/// `vigil profiles`: the server kinds known, with their port, health path, probe timeout and rule count.
pub fn profiles(profiles: &vigil_core::Profiles) {
    for p in &profiles.list {
        out_line(&format!(
            "{:<10} port {:<5} {:<8} probe timeout {:>4}s  {} rules  {}",
            p.name,
            p.port,
            p.health_path,
            p.probe_timeout_secs,
            p.rules.len(),
            p.description
        ));
    }
}

/// `vigil history`: past startups newest last (and what changed since the last good start of their key),
/// then per key the per-phase medians and spread of the good ones; JSON: one line per startup.
pub fn history(all: &[vigil_core::history::Startup], changes: &[Vec<vigil_core::history::Change>], json: bool) {
    use vigil_core::Phase;
    if json {
        for (s, c) in all.iter().zip(changes) {
            let line = crate::sinks::history::JsonLine { key_id: s.key.id(), startup: s, changes: c };
            out_raw(&serde_json::to_string(&line).unwrap_or_default());
        }
        return;
    }
    for (s, c) in all.iter().zip(changes) {
        let cause = match (s.cause, s.slow.is_empty()) {
            (Some(c), _) => format!(" ({c})"),
            (None, false) => " (slow)".into(),
            _ => String::new(),
        };
        out_line(&format!(
            "{}  {:<16} {:<9} {:>7}  {}",
            crate::sinks::history::fmt_time(s.started_unix_ms),
            s.name,
            format!("{}{cause}", s.verdict),
            s.total_ms.map(fmt_ms).unwrap_or_else(|| "?".into()),
            crate::sinks::history::fmt_phases(&s.phases)
        ));
        if !s.repairs.is_empty() {
            out_line(&format!("    {}", crate::sinks::history::repaired_text(s.verdict, &s.repairs)));
        }
        for x in c {
            out_line(&format!("    changed: {}", crate::sinks::history::change_text(x)));
        }
    }
    // per key: medians and spread of the good ones
    let mut keys: Vec<&vigil_core::history::Key> = Vec::new();
    for s in all {
        if !keys.contains(&&s.key) {
            keys.push(&s.key);
        }
    }
    for k in keys {
        let good: Vec<&vigil_core::history::Startup> = all.iter().filter(|s| s.key == *k && s.good()).collect();
        if good.is_empty() {
            continue;
        }
        out_line(&format!(
            "\n{} {} on {}{} — {} good startups",
            k.server,
            k.model,
            k.host,
            if k.cold_cache { " (cold cache)" } else { "" },
            good.len()
        ));
        for p in Phase::ALL {
            let v: Vec<u64> = good.iter().filter_map(|s| s.phases.get(&p).copied()).collect();
            if let Some(st) = vigil_core::history::PhaseStats::of(&v) {
                out_line(&format!(
                    "  {:<18} median {:>7}  ({} – {})",
                    p.as_str(),
                    fmt_ms(st.median_ms),
                    fmt_ms(st.min_ms),
                    fmt_ms(st.max_ms)
                ));
            }
        }
        let t: Vec<u64> = good.iter().filter_map(|s| s.total_ms).collect();
        if let Some(st) = vigil_core::history::PhaseStats::of(&t) {
            out_line(&format!(
                "  {:<18} median {:>7}  ({} – {})",
                "total",
                fmt_ms(st.median_ms),
                fmt_ms(st.min_ms),
                fmt_ms(st.max_ms)
            ));
        }
    }
}
