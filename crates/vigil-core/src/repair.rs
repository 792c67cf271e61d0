//! Which repair, if any, for a failed start (issue #35: `vigil up --repair`). Pure: the failure (verdict,
//! cause, phase, the log's lines, who holds the port), the command line, the profiles' `[[repair]]` rules and
//! the attempts made so far go in; a [`Decision`] comes out: a [`RepairPlan`] (a flag edit, or stopping an
//! earlier attempt of this same run) or [`Decision::NoRepair`] with the reason. The binary stops, relaunches
//! and tells; it never decides.
//!
//! Never a blind retry: no repair for an unknown cause, for a process this run did not start (named), when
//! the cause the last repair answered comes back, or past the attempts allowed. A repair that changes what
//! the user set (the context length, eager mode instead of CUDA graphs) needs `--repair=any`. Values move
//! only in their rule's direction and within its bounds (the server's own limits, or vigil's margin inside
//! them, each rule says which).

use crate::types::{Cause, Phase, Verdict};
use regex::Regex;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// `[[repair]]` in a profile, as written.
#[derive(Debug, Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub struct RepairSpec {
    pub name: String,
    /// The verdicts it answers: `crashed`, `stalled`, `refused` (a launch vigil refused before any server
    /// ran: a taken port, an earlier attempt still alive). Default: `crashed`.
    #[serde(default)]
    pub verdict: Vec<String>,
    /// The causes it answers (any when empty).
    #[serde(default)]
    pub cause: Vec<String>,
    /// The phases it answers (any when empty).
    #[serde(default)]
    pub phase: Vec<String>,
    /// Lines the log must hold, all of them; their named groups are numbers the values use (`$name`).
    #[serde(default)]
    pub log: Vec<LogFactSpec>,
    /// `set` (a flag's value), `unset` (remove a flag and its value: the server chooses), `add` (arguments), `stop_leftover` (stop an earlier attempt of this same run
    /// that holds the port or the GPU) or `refuse` (no repair, `why` says why).
    pub action: String,
    /// `set`/`unset`: the flag and its other spellings; absent from the command, `set` adds the first.
    #[serde(default)]
    pub flag: Vec<String>,
    /// Regexes on the command line (its arguments joined by spaces): the rule does not apply when one matches.
    #[serde(default)]
    pub unless: Vec<String>,
    /// `set`: the value when the command does not give the flag (the server's default, or a log number):
    /// expressions tried in order.
    #[serde(default)]
    pub current: Vec<String>,
    /// `set`: expressions for the new value, tried in order; the first whose numbers are all known wins.
    #[serde(default)]
    pub value: Vec<String>,
    pub min: Option<f64>,
    pub max: Option<f64>,
    /// `set`: `up` or `down`: the only way the value may move.
    pub direction: Option<String>,
    /// `set`: the value is a whole number (rounded down).
    #[serde(default)]
    pub integer: bool,
    /// `add`: the arguments added (a rule whose arguments are all there already does not apply).
    #[serde(default)]
    pub args: Vec<String>,
    /// `keep` (plain `--repair`) or `any` (`--repair=any`: it changes what the user set).
    pub level: Option<String>,
    /// For `any`: what it changes, in words ("the context length").
    pub changes: Option<String>,
    /// Why, in a few words ("the KV cache does not fit").
    pub why: String,
    /// The server's own message or code this comes from.
    pub source: String,
    /// The server versions it was read in.
    pub versions: String,
}

/// A log line a rule needs, and which of several matches counts.
#[derive(Debug, Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub struct LogFactSpec {
    #[serde(rename = "match")]
    pub pattern: String,
    /// `last` (default), `max` or `min` of each group over the matching lines.
    pub take: Option<String>,
    /// The rule applies without this line too (its numbers are then unknown).
    #[serde(default)]
    pub optional: bool,
}

/// What a repair does.
#[derive(Debug, Clone, PartialEq)]
pub enum ActionKind {
    Set,
    Unset,
    Add,
    StopLeftover,
    Refuse,
}

/// How far a repair may go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Level {
    /// Plain `--repair`: memory shares, capture sizes, this start's own leftovers.
    Keep,
    /// `--repair=any`: also what the user set (context length, eager mode).
    Any,
}

impl Level {
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Keep => "keep",
            Level::Any => "any",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Take {
    Last,
    Max,
    Min,
}

/// A compiled `[[repair]]` rule.
#[derive(Debug, Clone)]
pub struct Repair {
    pub name: String,
    pub profile: String,
    verdicts: Vec<Option<Verdict>>,
    causes: Vec<Cause>,
    phases: Vec<Phase>,
    log: Vec<(Regex, Take, bool)>,
    pub action: ActionKind,
    flags: Vec<String>,
    unless: Vec<Regex>,
    current: Vec<Expr>,
    values: Vec<Expr>,
    min: Option<f64>,
    max: Option<f64>,
    up: Option<bool>,
    integer: bool,
    args: Vec<String>,
    pub level: Level,
    changes: Option<String>,
    pub why: String,
    pub source: String,
    pub versions: String,
}

impl Repair {
    /// Compiles a rule; a bad one is an error naming it (`origin`: the file).
    pub fn compile(origin: &str, profile: &str, s: &RepairSpec) -> Result<Repair, String> {
        let what = format!("{origin}: repair '{}'", s.name);
        let mut verdicts = Vec::new();
        for v in if s.verdict.is_empty() { vec!["crashed".to_string()] } else { s.verdict.clone() } {
            verdicts.push(match v.as_str() {
                "crashed" => Some(Verdict::Crashed),
                "stalled" => Some(Verdict::Stalled),
                "refused" => None,
                _ => return Err(format!("{what}: verdict is crashed, stalled or refused, not '{v}'")),
            });
        }
        let causes = s
            .cause
            .iter()
            .map(|c| Cause::parse(c).ok_or_else(|| format!("{what}: unknown cause '{c}'")))
            .collect::<Result<Vec<_>, _>>()?;
        let phases = s
            .phase
            .iter()
            .map(|p| Phase::parse(p).ok_or_else(|| format!("{what}: unknown phase '{p}'")))
            .collect::<Result<Vec<_>, _>>()?;
        let mut log = Vec::new();
        for l in &s.log {
            let re = Regex::new(&l.pattern).map_err(|e| format!("{what}: bad regex: {e}"))?;
            let take = match l.take.as_deref().unwrap_or("last") {
                "last" => Take::Last,
                "max" => Take::Max,
                "min" => Take::Min,
                t => return Err(format!("{what}: take is last, max or min, not '{t}'")),
            };
            log.push((re, take, l.optional));
        }
        let action = match s.action.as_str() {
            "set" => ActionKind::Set,
            "unset" => ActionKind::Unset,
            "add" => ActionKind::Add,
            "stop_leftover" => ActionKind::StopLeftover,
            "refuse" => ActionKind::Refuse,
            a => return Err(format!("{what}: action is set, unset, add, stop_leftover or refuse, not '{a}'")),
        };
        let level = match s.level.as_deref().unwrap_or("keep") {
            "keep" => Level::Keep,
            "any" => Level::Any,
            l => return Err(format!("{what}: level is keep or any, not '{l}'")),
        };
        let up = match s.direction.as_deref() {
            None => None,
            Some("up") => Some(true),
            Some("down") => Some(false),
            Some(d) => return Err(format!("{what}: direction is up or down, not '{d}'")),
        };
        let parse = |e: &str| Expr::parse(e).map_err(|x| format!("{what}: value '{e}': {x}"));
        let current = s.current.iter().map(|v| parse(v)).collect::<Result<Vec<_>, _>>()?;
        let unless = s
            .unless
            .iter()
            .map(|u| Regex::new(u).map_err(|e| format!("{what}: bad regex in unless: {e}")))
            .collect::<Result<Vec<_>, _>>()?;
        let values = s.value.iter().map(|v| parse(v)).collect::<Result<Vec<_>, _>>()?;
        match action {
            ActionKind::Set if s.flag.is_empty() || values.is_empty() || up.is_none() => {
                return Err(format!("{what}: set needs flag, value and direction"))
            }
            ActionKind::Unset if s.flag.is_empty() => return Err(format!("{what}: unset needs flag")),
            ActionKind::Add if s.args.is_empty() => return Err(format!("{what}: add needs args")),
            _ => {}
        }
        if level == Level::Any && s.changes.is_none() {
            return Err(format!("{what}: level any needs `changes` (what the user set that it changes)"));
        }
        Ok(Repair {
            name: s.name.clone(),
            profile: profile.to_string(),
            verdicts,
            causes,
            phases,
            log,
            action,
            flags: s.flag.clone(),
            unless,
            current,
            values,
            min: s.min,
            max: s.max,
            up,
            integer: s.integer,
            args: s.args.clone(),
            level,
            changes: s.changes.clone(),
            why: s.why.clone(),
            source: s.source.clone(),
            versions: s.versions.clone(),
        })
    }

    fn answers(&self, f: &Failure) -> bool {
        self.verdicts.contains(&f.verdict)
            && (self.causes.is_empty() || f.cause.is_some_and(|c| self.causes.contains(&c)))
            && (self.phases.is_empty() || self.phases.contains(&f.phase))
    }

    /// The numbers the rule's log lines give, or None when a line it needs is not there.
    fn log_facts(&self, lines: &[String]) -> Option<BTreeMap<String, f64>> {
        let mut out = BTreeMap::new();
        for (re, take, optional) in &self.log {
            let mut seen = false;
            for l in lines {
                let Some(c) = re.captures(l) else { continue };
                seen = true;
                for name in re.capture_names().flatten() {
                    let Some(v) = c.name(name).and_then(|m| m.as_str().parse::<f64>().ok()) else { continue };
                    let e = out.entry(name.to_string()).or_insert(v);
                    *e = match take {
                        Take::Last => v,
                        Take::Max => e.max(v),
                        Take::Min => e.min(v),
                    };
                }
            }
            if !seen && !optional {
                return None;
            }
        }
        Some(out)
    }
}

/// Who holds the port (or the GPU) the server needs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Holder {
    pub pid: i32,
    /// Its command line (redacted by the caller), for the reason.
    pub cmd: String,
    pub of: HolderOf,
    /// What it holds: `port 8080`, `GPU 0`.
    pub holds: String,
}

/// Whose a holder is, from its environment mark (`VIGIL_RUN_DIR`, set by a run's keeper).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HolderOf {
    /// An earlier attempt of this same run (its mark names this run's folder).
    ThisRun,
    /// This same run, alive under its keeper: a running run, not an earlier attempt (`--replace` stops it).
    LiveRun,
    /// Another run of vigil's.
    OtherRun(String),
    /// A process vigil did not start.
    NotVigils,
}

/// The failure to repair.
#[derive(Debug, Clone)]
pub struct Failure<'a> {
    /// The verdict; None when vigil refused the launch before any server ran.
    pub verdict: Option<Verdict>,
    pub cause: Option<Cause>,
    pub phase: Phase,
    /// The log's lines (the verdict's evidence and the log's tail): the numbers repairs derive from.
    pub lines: &'a [String],
    /// Who holds what the server needs, where known.
    pub holders: &'a [Holder],
}

/// A repair already made in this `up`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Done {
    pub cause: Option<Cause>,
    pub rule: String,
    /// The edit in words: `-c 100000000 -> 512`, `stopped pids 41, 42`.
    pub edit: String,
    pub why: String,
}

/// What the planner may do, and what it knows beside the failure.
#[derive(Debug, Clone)]
pub struct Setting<'a> {
    pub level: Level,
    /// Attempts allowed after the first (`--repair=N`).
    pub max: usize,
    pub argv: &'a [String],
    /// The rules that apply: the server's own, then the framework layer's.
    pub rules: &'a [&'a Repair],
    pub done: &'a [Done],
    /// Numbers known beside the log (`gpu_total_gib`: the GPU's memory from NVML).
    pub facts: &'a BTreeMap<String, f64>,
}

/// A flag edit: `before` None when the command did not give the flag (`default`: what the server used).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FlagEdit {
    pub flag: String,
    pub before: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default: Option<String>,
    /// None: the flag is removed (the server chooses).
    pub after: Option<String>,
}

/// What a repair does to the start.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum RepairAction {
    /// A flag's value changes (or the flag is added).
    Set(FlagEdit),
    /// Arguments are added.
    Add { args: Vec<String> },
    /// An earlier attempt of this same run is stopped (its release proven) before the relaunch.
    StopLeftover { pids: Vec<i32>, holds: Vec<String> },
}

/// One repair, ready to apply.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RepairPlan {
    pub rule: String,
    pub profile: String,
    pub cause: Option<Cause>,
    pub action: RepairAction,
    /// The command line after the repair.
    pub argv: Vec<String>,
    pub level: Level,
    /// What the user set that it changes (`--repair=any` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub changes: Option<String>,
    pub why: String,
    pub source: String,
    pub versions: String,
}

impl RepairPlan {
    /// The edit in words: `-c 100000000 -> 512`, `--gpu-memory-utilization (unset: 0.92) -> 0.97`,
    /// `+ --enforce-eager`, `stopped pids 41, 42 (port 8080)`.
    pub fn edit_text(&self) -> String {
        match &self.action {
            RepairAction::Set(e) => {
                let before = match (&e.before, &e.default) {
                    (Some(b), _) => b.clone(),
                    (None, Some(d)) => format!("(unset: {d})"),
                    (None, None) => "(unset)".into(),
                };
                let after = e.after.clone().unwrap_or_else(|| "(removed: the server chooses)".into());
                format!("{} {before} -> {after}", e.flag)
            }
            RepairAction::Add { args } => format!("+ {}", args.join(" ")),
            RepairAction::StopLeftover { pids, holds } => {
                let p = pids.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(", ");
                format!("stop the earlier attempt (pid {p}, holding {})", holds.join(", "))
            }
        }
    }

    pub fn done(&self) -> Done {
        Done { cause: self.cause, rule: self.rule.clone(), edit: self.edit_text(), why: self.why.clone() }
    }
}

/// The planner's answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    Repair(Box<RepairPlan>),
    NoRepair { why: String },
}

fn no(why: impl Into<String>) -> Decision {
    Decision::NoRepair { why: why.into() }
}

/// Decides the repair for a failure, or why there is none.
pub fn plan(f: &Failure, s: &Setting) -> Decision {
    match f.verdict {
        Some(Verdict::Timeout) => return no("the overall --timeout passed: no time is left for another attempt"),
        Some(Verdict::Ready | Verdict::Starting | Verdict::Unhealthy) => {
            return no(format!("vigil repairs a start that failed, not a {} one", f.verdict.unwrap()))
        }
        _ => {}
    }
    if s.done.len() >= s.max {
        return no(format!(
            "{} repair{} made, the most --repair={} allows",
            s.done.len(),
            if s.done.len() == 1 { "" } else { "s" },
            s.max
        ));
    }
    // Never a process this run did not start: name it and stop there.
    let foreign: Vec<&Holder> = f.holders.iter().filter(|h| h.of != HolderOf::ThisRun).collect();
    if let Some(h) = foreign.first() {
        let whose = match &h.of {
            HolderOf::OtherRun(n) => format!("run '{n}' of vigil's"),
            HolderOf::LiveRun => "this run itself, alive under its keeper (--replace stops a running run)".to_string(),
            _ => "a process vigil did not start".to_string(),
        };
        return no(format!(
            "{} is held by pid {} ({}), {whose}: vigil stops only what it started for this run",
            h.holds, h.pid, h.cmd
        ));
    }
    if let Some(last) = s.done.last() {
        if f.verdict.is_some() && last.cause.is_some() && last.cause == f.cause {
            return no(format!(
                "the repair did not help: {} again after {} ({})",
                f.cause.unwrap(),
                last.edit,
                last.why
            ));
        }
    }
    if f.verdict == Some(Verdict::Crashed) && matches!(f.cause, None | Some(Cause::Unknown)) {
        return no("the cause is unknown: vigil repairs only a failure whose cause it knows");
    }
    // Why rules that answered gave nothing: the first that needs --repair=any, the first for another reason.
    let mut held_back: Option<String> = None;
    let mut needs_any: Option<String> = None;
    for r in s.rules {
        if !r.answers(f) {
            continue;
        }
        let Some(mut vars) = r.log_facts(f.lines) else { continue };
        let joined = s.argv.join(" ");
        if r.unless.iter().any(|u| u.is_match(&joined)) {
            continue;
        }
        match r.action {
            // a refusal speaks only when no rule before it answered (theirs is the better reason)
            ActionKind::Refuse if held_back.is_none() && needs_any.is_none() => return no(r.why.clone()),
            ActionKind::Refuse => continue,
            ActionKind::StopLeftover => {
                let mine: Vec<&Holder> = f.holders.iter().filter(|h| h.of == HolderOf::ThisRun).collect();
                if mine.is_empty() {
                    continue;
                }
                let mut pids: Vec<i32> = mine.iter().map(|h| h.pid).collect();
                pids.dedup();
                let mut holds: Vec<String> = mine.iter().map(|h| h.holds.clone()).collect();
                holds.dedup();
                return Decision::Repair(Box::new(RepairPlan {
                    rule: r.name.clone(),
                    profile: r.profile.clone(),
                    cause: f.cause,
                    action: RepairAction::StopLeftover { pids, holds },
                    argv: s.argv.to_vec(),
                    level: r.level,
                    changes: None,
                    why: r.why.clone(),
                    source: r.source.clone(),
                    versions: r.versions.clone(),
                }));
            }
            _ => {}
        }
        if r.level > s.level {
            needs_any.get_or_insert_with(|| {
                format!(
                    "{}: {} is what you set; --repair=any may change it",
                    r.why,
                    r.changes.as_deref().unwrap_or("the setting")
                )
            });
            continue;
        }
        for (k, v) in s.facts {
            vars.entry(k.clone()).or_insert(*v);
        }
        match r.action {
            ActionKind::Add => {
                if r.args.iter().all(|a| s.argv.contains(a)) {
                    held_back.get_or_insert_with(|| format!("{}: {} is already there", r.why, r.args.join(" ")));
                    continue;
                }
                let mut argv = s.argv.to_vec();
                argv.extend(r.args.iter().filter(|a| !s.argv.contains(a)).cloned());
                return Decision::Repair(Box::new(plan_of(r, f, RepairAction::Add { args: r.args.clone() }, argv)));
            }
            ActionKind::Unset => {
                let Some((_, name, _)) = find_flag(s.argv, &r.flags) else { continue };
                // every occurrence goes, the last one's value is the one that was in force
                let mut argv = s.argv.to_vec();
                let mut before = None;
                while let Some((i, _, eq)) = find_flag(&argv, &r.flags) {
                    let v = match eq {
                        Some(v) => {
                            argv.remove(i);
                            v
                        }
                        None => {
                            let v = argv.get(i + 1).cloned().unwrap_or_default();
                            argv.drain(i..(i + 2).min(argv.len()));
                            v
                        }
                    };
                    before.get_or_insert(v);
                }
                let before = before.unwrap_or_default();
                let edit = FlagEdit { flag: name, before: Some(before), default: None, after: None };
                return Decision::Repair(Box::new(plan_of(r, f, RepairAction::Set(edit), argv)));
            }
            ActionKind::Set => match set_value(r, s.argv, &mut vars) {
                Ok((edit, argv)) => return Decision::Repair(Box::new(plan_of(r, f, RepairAction::Set(edit), argv))),
                Err(why) => {
                    held_back.get_or_insert(why);
                }
            },
            _ => {}
        }
    }
    match (held_back, needs_any) {
        (Some(h), Some(a)) => return no(format!("{h}; {a}")),
        (Some(w), None) | (None, Some(w)) => return no(w),
        (None, None) => {}
    }
    let what = match f.verdict {
        Some(v) => format!("{v} in {}{}", f.phase, f.cause.map(|c| format!(", cause {c}")).unwrap_or_default()),
        None => "this refusal".to_string(),
    };
    no(format!("no repair is known for {what}"))
}

fn plan_of(r: &Repair, f: &Failure, action: RepairAction, argv: Vec<String>) -> RepairPlan {
    RepairPlan {
        rule: r.name.clone(),
        profile: r.profile.clone(),
        cause: f.cause,
        action,
        argv,
        level: r.level,
        changes: if r.level == Level::Any { r.changes.clone() } else { None },
        why: r.why.clone(),
        source: r.source.clone(),
        versions: r.versions.clone(),
    }
}

/// Where a flag is on the command line: (index of the flag, the spelling used, the value of `--flag=value`).
/// The last one given: the servers' parsers (argparse, llama.cpp's) keep the last, and a wrapper before the
/// server (`sh -c '...' sh llama-server ... -c N`) may use the same letters for its own flags.
fn find_flag(argv: &[String], names: &[String]) -> Option<(usize, String, Option<String>)> {
    for (i, a) in argv.iter().enumerate().rev() {
        for n in names {
            if a == n {
                return Some((i, n.clone(), None));
            }
            if let Some(v) = a.strip_prefix(n.as_str()).and_then(|r| r.strip_prefix('=')) {
                return Some((i, n.clone(), Some(v.to_string())));
            }
        }
    }
    None
}

/// The new value of a `set` rule and the command line with it, or why the rule cannot give one.
fn set_value(r: &Repair, argv: &[String], vars: &mut BTreeMap<String, f64>) -> Result<(FlagEdit, Vec<String>), String> {
    let found = find_flag(argv, &r.flags);
    let given = found.as_ref().map(|(i, _, eq)| eq.clone().or_else(|| argv.get(i + 1).cloned()));
    let flag = found.as_ref().map(|f| f.1.clone()).unwrap_or_else(|| r.flags[0].clone());
    let (current, default) = match given {
        Some(Some(v)) => match v.trim().parse::<f64>() {
            Ok(x) => (x, None),
            Err(_) => return Err(format!("{}: {flag} {v} is not a number vigil can change", r.why)),
        },
        Some(None) => return Err(format!("{}: {flag} has no value", r.why)),
        None => {
            let mut missing = None;
            let mut got = None;
            for e in &r.current {
                match e.eval(vars) {
                    Ok(x) => {
                        got = Some(x);
                        break;
                    }
                    Err(m) => {
                        missing.get_or_insert(m);
                    }
                }
            }
            match got {
                Some(x) => (x, Some(x)),
                None => {
                    let m = missing.map(|m| format!(" (the log does not give {m})")).unwrap_or_default();
                    return Err(format!(
                        "{}: {flag} is not given and the value the server used is not known{m}",
                        r.why
                    ));
                }
            }
        }
    };
    vars.insert("current".into(), current);
    let mut missing = None;
    let mut new = None;
    for e in &r.values {
        match e.eval(vars) {
            Ok(x) if x.is_finite() => {
                new = Some(x);
                break;
            }
            Ok(_) => {}
            Err(m) => {
                missing.get_or_insert(m);
            }
        }
    }
    let Some(mut new) = new else {
        return Err(format!("{}: the log does not give {}", r.why, missing.unwrap_or_else(|| "a value".into())));
    };
    if let Some(m) = r.max {
        new = new.min(m);
    }
    if let Some(m) = r.min {
        new = new.max(m);
    }
    if r.integer {
        new = new.floor();
    }
    let fmt_v = |x: f64| fmt_num(x, r.integer);
    let moves = if r.up == Some(true) { new > current } else { new < current };
    if !moves || fmt_v(new) == fmt_v(current) {
        let bound = if r.up == Some(true) { r.max } else { r.min };
        return Err(format!(
            "{}: {flag} is {} already{}",
            r.why,
            fmt_v(current),
            bound.map(|b| format!(", at the bound vigil keeps ({})", fmt_v(b))).unwrap_or_default()
        ));
    }
    let after = fmt_v(new);
    let mut out = argv.to_vec();
    let before = match &found {
        Some((i, name, Some(v))) => {
            out[*i] = format!("{name}={after}");
            Some(v.clone())
        }
        Some((i, _, None)) => {
            let b = out[i + 1].clone();
            out[i + 1] = after.clone();
            Some(b)
        }
        None => {
            out.push(flag.clone());
            out.push(after.clone());
            None
        }
    };
    Ok((FlagEdit { flag, before, default: default.map(fmt_v), after: Some(after) }, out))
}

/// A number as a flag takes it: whole numbers without a point, others with at most 4 decimals.
pub fn fmt_num(x: f64, integer: bool) -> String {
    if integer || x.fract() == 0.0 {
        return format!("{}", x as i64);
    }
    let s = format!("{x:.4}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// A value expression: numbers, `$name` (a log number, `current`, a fact), `+ - * /`, parentheses,
/// `min(a, b)`, `max(a, b)`.
#[derive(Debug, Clone)]
pub struct Expr(Node);

#[derive(Debug, Clone)]
enum Node {
    Num(f64),
    Var(String),
    Neg(Box<Node>),
    Bin(char, Box<Node>, Box<Node>),
    Call(bool, Box<Node>, Box<Node>),
}

impl Expr {
    pub fn parse(s: &str) -> Result<Expr, String> {
        let toks = lex(s)?;
        let mut p = Parser { t: &toks, i: 0 };
        let n = p.expr()?;
        if p.i != toks.len() {
            return Err(format!("unexpected '{}'", toks[p.i]));
        }
        Ok(Expr(n))
    }

    /// The value, or the name of the first number it needs that is not known.
    pub fn eval(&self, vars: &BTreeMap<String, f64>) -> Result<f64, String> {
        eval(&self.0, vars)
    }
}

fn eval(n: &Node, vars: &BTreeMap<String, f64>) -> Result<f64, String> {
    Ok(match n {
        Node::Num(x) => *x,
        Node::Var(v) => *vars.get(v).ok_or_else(|| format!("${v}"))?,
        Node::Neg(a) => -eval(a, vars)?,
        Node::Bin(op, a, b) => {
            let (a, b) = (eval(a, vars)?, eval(b, vars)?);
            match op {
                '+' => a + b,
                '-' => a - b,
                '*' => a * b,
                _ => a / b,
            }
        }
        Node::Call(is_max, a, b) => {
            let (a, b) = (eval(a, vars)?, eval(b, vars)?);
            if *is_max {
                a.max(b)
            } else {
                a.min(b)
            }
        }
    })
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Num(f64),
    Var(String),
    Ident(String),
    Op(char),
}

impl fmt::Display for Tok {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Tok::Num(x) => write!(f, "{x}"),
            Tok::Var(v) => write!(f, "${v}"),
            Tok::Ident(i) => f.write_str(i),
            Tok::Op(c) => write!(f, "{c}"),
        }
    }
}

fn lex(s: &str) -> Result<Vec<Tok>, String> {
    let b: Vec<char> = s.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    let word = |i: &mut usize| {
        let st = *i;
        while *i < b.len() && (b[*i].is_ascii_alphanumeric() || b[*i] == '_') {
            *i += 1;
        }
        b[st..*i].iter().collect::<String>()
    };
    while i < b.len() {
        let c = b[i];
        if c.is_whitespace() {
            i += 1;
        } else if c.is_ascii_digit() || c == '.' {
            let st = i;
            while i < b.len() && (b[i].is_ascii_digit() || b[i] == '.') {
                i += 1;
            }
            let t: String = b[st..i].iter().collect();
            out.push(Tok::Num(t.parse().map_err(|_| format!("bad number '{t}'"))?));
        } else if c == '$' {
            i += 1;
            let w = word(&mut i);
            if w.is_empty() {
                return Err("'$' without a name".into());
            }
            out.push(Tok::Var(w));
        } else if c.is_ascii_alphabetic() {
            out.push(Tok::Ident(word(&mut i)));
        } else if "+-*/(),".contains(c) {
            out.push(Tok::Op(c));
            i += 1;
        } else {
            return Err(format!("unexpected '{c}'"));
        }
    }
    Ok(out)
}

struct Parser<'a> {
    t: &'a [Tok],
    i: usize,
}

impl Parser<'_> {
    fn peek_op(&self) -> Option<char> {
        match self.t.get(self.i) {
            Some(Tok::Op(c)) => Some(*c),
            _ => None,
        }
    }

    fn eat(&mut self, c: char) -> Result<(), String> {
        if self.peek_op() == Some(c) {
            self.i += 1;
            Ok(())
        } else {
            Err(format!("expected '{c}'"))
        }
    }

    fn expr(&mut self) -> Result<Node, String> {
        let mut a = self.term()?;
        while let Some(op @ ('+' | '-')) = self.peek_op() {
            self.i += 1;
            a = Node::Bin(op, Box::new(a), Box::new(self.term()?));
        }
        Ok(a)
    }

    fn term(&mut self) -> Result<Node, String> {
        let mut a = self.factor()?;
        while let Some(op @ ('*' | '/')) = self.peek_op() {
            self.i += 1;
            a = Node::Bin(op, Box::new(a), Box::new(self.factor()?));
        }
        Ok(a)
    }

    fn factor(&mut self) -> Result<Node, String> {
        let t = self.t.get(self.i).cloned().ok_or("the expression ends early")?;
        self.i += 1;
        match t {
            Tok::Num(x) => Ok(Node::Num(x)),
            Tok::Var(v) => Ok(Node::Var(v)),
            Tok::Op('-') => Ok(Node::Neg(Box::new(self.factor()?))),
            Tok::Op('(') => {
                let n = self.expr()?;
                self.eat(')')?;
                Ok(n)
            }
            Tok::Ident(f) if f == "min" || f == "max" => {
                self.eat('(')?;
                let a = self.expr()?;
                self.eat(',')?;
                let b = self.expr()?;
                self.eat(')')?;
                Ok(Node::Call(f == "max", Box::new(a), Box::new(b)))
            }
            t => Err(format!("unexpected '{t}'")),
        }
    }
}

#[cfg(test)]
mod tests;
