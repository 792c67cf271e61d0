//! Corpus test: real logs with labels (`../shared/corpus` and the project's own `corpus/`), each fed body only
//! (header stripped, under no name), measured as an ML engineer would (issue #12):
//! - accuracy per server and per field, lenient (any listed alternative) and strict (the first only);
//! - a confusion table of verdicts, and every false "ready" named;
//! - every rule that matches in exactly one corpus log.
//!
//! What it asserts:
//! - the shared corpus matches exactly, but for the entries in `tests/corpus-exceptions.txt` (each with the
//!   line that contradicts its label);
//! - no false "ready" anywhere;
//! - every rule that matches in a single corpus log says why it cannot be more general (`narrow`);
//! - the strict scores over all logs do not fall below the floors in `corpus/floors.txt` (a ratchet: raise
//!   them when the rules improve, never lower them to make a change pass);
//! - alternatives stay the exception in the project corpus (at most 15 % of logs with several verdicts, 25 %
//!   with several phases or causes).
//!
//! Under CI=true a missing corpus fails.
//!
//! `corpus/heldback/` (issue #24: 20 % of the project's public-tracker logs by source, drawn once by
//! `scripts/heldback.py`, seed in its README) is not part of the above: nobody reads it while writing rules,
//! and `heldback_scores_near_the_rest` prints only its totals next to the rest's and asserts the gap.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use vigil_core::{Offline, Profiles, Seen};

pub struct Case {
    /// `shared/<server>/<file>` or `project/<server>/<file>`.
    pub rel: String,
    pub body: String,
    pub header: String,
    pub server: String,
    pub verdict: Vec<String>,
    pub phase: Vec<String>,
    pub cause: Vec<String>,
}

fn shared_dir() -> Option<PathBuf> {
    let d = match std::env::var_os("VIGIL_CORPUS") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/corpus"),
    };
    d.is_dir().then_some(d)
}

/// `VIGIL_PROJECT_CORPUS` points the test at another checkout's `corpus/` (a worktree adding logs).
fn project_dir() -> PathBuf {
    match std::env::var_os("VIGIL_PROJECT_CORPUS") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../corpus"),
    }
}

fn split(bytes: &[u8]) -> (String, String) {
    // Header lines end with a line that is exactly "# ---"; the body is everything after, byte for byte.
    let text = String::from_utf8_lossy(bytes);
    let marker = "\n# ---\n";
    let i = text.find(marker).expect("header terminator");
    (text[..i].to_string(), text[i + marker.len()..].to_string())
}

fn load_dir(dir: &Path, tag: &str, out: &mut Vec<Case>) {
    let mut files: Vec<PathBuf> = Vec::new();
    for sub in std::fs::read_dir(dir).unwrap() {
        let sub = sub.unwrap().path();
        if sub.is_dir() && !sub.ends_with("heldback") {
            for f in std::fs::read_dir(&sub).unwrap() {
                let f = f.unwrap().path();
                if f.extension().is_some_and(|e| e == "log") {
                    files.push(f);
                }
            }
        }
    }
    files.sort();
    for f in files {
        let rel = format!("{tag}/{}", f.strip_prefix(dir).unwrap().display());
        let (header, body) = split(&std::fs::read(&f).unwrap());
        let head = |k: &str| -> String {
            header
                .lines()
                .find_map(|l| l.strip_prefix(&format!("# {k}:")))
                .unwrap_or_else(|| panic!("{rel}: no {k} line"))
                .trim()
                .to_string()
        };
        let exp = head("EXPECT");
        let field = |k: &str| -> Vec<String> {
            exp.split_whitespace()
                .find_map(|kv| kv.strip_prefix(&format!("{k}=")))
                .unwrap_or_else(|| panic!("{rel}: EXPECT has no {k}="))
                .split('|')
                .map(|s| if s == "-" { "null".to_string() } else { s.to_string() })
                .collect()
        };
        out.push(Case {
            server: head("SERVER"),
            verdict: field("verdict"),
            phase: field("phase"),
            cause: field("cause"),
            rel,
            header,
            body,
        });
    }
}

pub fn load() -> Vec<Case> {
    let mut out = Vec::new();
    match shared_dir() {
        Some(d) => load_dir(&d, "shared", &mut out),
        None if std::env::var("CI").as_deref() == Ok("true") => {
            panic!("shared corpus not found (set VIGIL_CORPUS or check out shared/ beside the repo)")
        }
        None => eprintln!("SKIP: shared corpus not found"),
    }
    let p = project_dir();
    if p.is_dir() {
        load_dir(&p, "project", &mut out);
    } else if std::env::var("CI").as_deref() == Ok("true") {
        panic!("project corpus not found at {}", p.display());
    }
    out
}

/// The held-back slice, `corpus/heldback/<server>/*.log`.
fn load_heldback() -> Vec<Case> {
    let mut out = Vec::new();
    let d = project_dir().join("heldback");
    if d.is_dir() {
        load_dir(&d, "heldback", &mut out);
    } else if std::env::var("CI").as_deref() == Ok("true") {
        panic!("held-back corpus not found at {}", d.display());
    }
    out
}

fn exceptions() -> Vec<String> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/corpus-exceptions.txt");
    std::fs::read_to_string(p)
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|l| l.split('\t').next().unwrap().to_string())
        .collect()
}

/// `field<TAB>minimum percent`: the ratchet for strict scores over all logs.
fn floors() -> BTreeMap<String, f64> {
    let p = project_dir().join("floors.txt");
    std::fs::read_to_string(p)
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            Some((it.next()?.to_string(), it.next()?.parse().ok()?))
        })
        .collect()
}

/// The built-in profiles, less the rules named in `VIGIL_CORPUS_WITHOUT` (`profile/rule,...`): how a rule that
/// matches one log is found to change nothing (issue #24: such a rule is removed).
fn profiles_under_test() -> Profiles {
    let mut p = Profiles::builtin();
    if let Ok(without) = std::env::var("VIGIL_CORPUS_WITHOUT") {
        for pr in without.split(',').filter(|s| !s.is_empty()) {
            let (prof, name) = pr.split_once('/').expect("VIGIL_CORPUS_WITHOUT: profile/rule");
            let i = p.list.iter().position(|x| x.name == prof).expect("VIGIL_CORPUS_WITHOUT: no such profile");
            let n = p.list[i].rules.len();
            p.list[i].rules.retain(|r| r.name != name);
            assert!(p.list[i].rules.len() < n, "VIGIL_CORPUS_WITHOUT: no rule {pr}");
        }
    }
    p
}

struct Got {
    verdict: String,
    phase: String,
    cause: String,
    rules: BTreeSet<String>,
}

fn diagnose(profiles: &Profiles, body: &str) -> Got {
    let mut o = Offline::new(profiles, None);
    let mut rules = BTreeSet::new();
    let mut each = |s: Seen| {
        if let Seen::Line { line, .. } = s {
            if let Some(h) = &line.hit {
                rules.insert(format!("{}/{}", h.profile, h.rule));
            }
        }
    };
    for raw in body.split(['\n', '\r']) {
        o.push(raw, &mut each);
    }
    let r = o.finish(&mut each);
    Got {
        verdict: r.verdict.as_str().to_string(),
        phase: r.phase.as_str().to_string(),
        cause: r.cause.map_or("null".to_string(), |c| c.as_str().to_string()),
        rules,
    }
}

#[derive(Default, Clone, Copy)]
struct Score {
    n: usize,
    lenient: [usize; 3],
    strict: [usize; 3],
}

fn pct(k: usize, n: usize) -> f64 {
    if n == 0 {
        100.0
    } else {
        100.0 * k as f64 / n as f64
    }
}

#[test]
fn corpus_matches_expectations() {
    let cases = load();
    if cases.is_empty() {
        return;
    }
    let profiles = profiles_under_test();
    let exc = exceptions();
    let mut fails = Vec::new();
    let mut false_ready = Vec::new();
    let mut by_server: BTreeMap<String, Score> = BTreeMap::new();
    let mut confusion: BTreeMap<(String, String), usize> = BTreeMap::new();
    let mut rule_logs: BTreeMap<String, Vec<String>> = BTreeMap::new();
    println!("{:<72} {:<9} {:<18} {:<12} result", "log", "verdict", "phase", "cause");
    for c in &cases {
        let g = diagnose(&profiles, &c.body);
        for r in &g.rules {
            rule_logs.entry(r.clone()).or_default().push(c.rel.clone());
        }
        let got = [&g.verdict, &g.phase, &g.cause];
        let want = [&c.verdict, &c.phase, &c.cause];
        let len: Vec<bool> = (0..3).map(|i| want[i].contains(got[i])).collect();
        let st: Vec<bool> = (0..3).map(|i| want[i][0] == *got[i]).collect();
        for key in [c.server.clone(), "all".to_string(), c.rel.split('/').next().unwrap().to_string()] {
            let s = by_server.entry(key).or_default();
            s.n += 1;
            for i in 0..3 {
                s.lenient[i] += len[i] as usize;
                s.strict[i] += st[i] as usize;
            }
        }
        *confusion.entry((c.verdict[0].clone(), g.verdict.clone())).or_default() += 1;
        if g.verdict == "ready" && !c.verdict.iter().any(|v| v == "ready") {
            false_ready.push(format!("{}: want {:?}", c.rel, c.verdict));
        }
        let good = len.iter().all(|x| *x);
        let status = if good {
            "ok"
        } else if exc.contains(&c.rel) {
            "EXCEPTION"
        } else {
            if c.rel.starts_with("shared/") {
                fails.push(format!(
                    "{}: got {}/{}/{}, want {:?}/{:?}/{:?}",
                    c.rel, g.verdict, g.phase, g.cause, c.verdict, c.phase, c.cause
                ));
            }
            "MISMATCH"
        };
        println!("{:<72} {:<9} {:<18} {:<12} {status}", c.rel, g.verdict, g.phase, g.cause);
    }
    println!();
    println!("corpus accuracy (%), lenient = any listed alternative, strict = the first only");
    println!(
        "{:<10} {:>5} | {:>8} {:>8} | {:>8} {:>8} | {:>8} {:>8}",
        "set", "logs", "verdict", "strict", "phase", "strict", "cause", "strict"
    );
    for (k, s) in &by_server {
        println!(
            "{:<10} {:>5} | {:>8.1} {:>8.1} | {:>8.1} {:>8.1} | {:>8.1} {:>8.1}",
            k,
            s.n,
            pct(s.lenient[0], s.n),
            pct(s.strict[0], s.n),
            pct(s.lenient[1], s.n),
            pct(s.strict[1], s.n),
            pct(s.lenient[2], s.n),
            pct(s.strict[2], s.n)
        );
    }
    println!();
    let verdicts = ["ready", "starting", "crashed", "unhealthy"];
    println!("verdict confusion (rows: label, first alternative; columns: vigil)");
    println!("{:<10} {}", "", verdicts.iter().map(|v| format!("{v:>10}")).collect::<String>());
    for w in verdicts {
        let row: String = verdicts
            .iter()
            .map(|g| format!("{:>10}", confusion.get(&(w.to_string(), g.to_string())).copied().unwrap_or(0)))
            .collect();
        println!("{w:<10} {row}");
    }
    let single: Vec<_> = rule_logs.iter().filter(|(_, v)| v.len() == 1).collect();
    println!();
    println!(
        "rules matching in exactly one corpus log: {} of {} rules that match at all ({:.1} %; the aim is at most 10 %)",
        single.len(),
        rule_logs.len(),
        pct(single.len(), rule_logs.len())
    );
    // Each says why it cannot be more general (`narrow` in its profile).
    let mut unexplained = Vec::new();
    for (r, logs) in &single {
        let (prof, name) = r.split_once('/').unwrap();
        let why =
            profiles.get(prof).and_then(|p| p.rules.iter().find(|x| x.name == name)).and_then(|x| x.narrow.clone());
        println!("  {r}: {}  [{}]", logs[0], why.as_deref().unwrap_or("NO REASON GIVEN"));
        if why.is_none() {
            unexplained.push(r.to_string());
        }
    }
    println!("false ready: {}", false_ready.len());
    for f in &false_ready {
        println!("  {f}");
    }
    let all = by_server["all"];
    println!(
        "corpus score: {}/{} strict verdict, {}/{} strict phase, {}/{} strict cause; {} listed exceptions",
        all.strict[0],
        all.n,
        all.strict[1],
        all.n,
        all.strict[2],
        all.n,
        exc.len()
    );
    assert!(exc.len() * 100 <= cases.len() * 3 + 100, "more than 3 % of logs in the exceptions file");
    assert!(false_ready.is_empty(), "false ready:\n{}", false_ready.join("\n"));
    assert!(
        unexplained.is_empty(),
        "rules that match a single corpus log must say why they cannot be more general (`narrow`): {}",
        unexplained.join(", ")
    );
    assert!(fails.is_empty(), "shared corpus mismatches:\n{}", fails.join("\n"));
    let fl = floors();
    for (i, field) in ["verdict", "phase", "cause"].iter().enumerate() {
        let got = pct(all.strict[i], all.n);
        if let Some(min) = fl.get(*field) {
            assert!(got + 1e-9 >= *min, "strict {field} accuracy {got:.1} % fell below the floor {min} %");
        }
    }
}

/// Alternatives are the exception: a label lists several values only when the text cannot decide.
#[test]
fn project_corpus_alternatives_are_the_exception() {
    let cases: Vec<Case> = load().into_iter().filter(|c| c.rel.starts_with("project/")).collect();
    if cases.is_empty() {
        return;
    }
    let n = cases.len();
    let multi_v = cases.iter().filter(|c| c.verdict.len() > 1).count();
    let multi_pc = cases.iter().filter(|c| c.phase.len() > 1 || c.cause.len() > 1).count();
    println!("{n} logs: {multi_v} with several verdicts, {multi_pc} with several phases or causes");
    assert!(multi_v * 100 <= n * 15, "{multi_v} of {n} logs list several verdicts (at most 15 %)");
    assert!(multi_pc * 100 <= n * 25, "{multi_pc} of {n} logs list several phases or causes (at most 25 %)");
    let vocab_v = ["ready", "starting", "crashed", "unhealthy"];
    for c in &cases {
        for v in &c.verdict {
            assert!(vocab_v.contains(&v.as_str()), "{}: verdict {v} is not in the vocabulary", c.rel);
        }
        for p in &c.phase {
            assert!(vigil_core::Phase::parse(p).is_some(), "{}: phase {p} is not in the vocabulary", c.rel);
        }
        for k in &c.cause {
            assert!(k == "null" || vigil_core::Cause::parse(k).is_some(), "{}: cause {k} not in the vocabulary", c.rel);
        }
    }
}

#[test]
fn header_does_not_change_the_verdict() {
    let profiles = Profiles::builtin();
    let mut diff = Vec::new();
    for c in load() {
        let a = vigil_core::diagnose_text(&profiles, None, &c.body);
        let b = vigil_core::diagnose_text(&profiles, None, &format!("{}\n# ---\n{}", c.header, c.body));
        if (a.verdict, a.phase, a.cause) != (b.verdict, b.phase, b.cause) {
            diff.push(format!("{}: {:?} vs {:?}", c.rel, (a.verdict, a.phase, a.cause), (b.verdict, b.phase, b.cause)));
        }
    }
    assert!(diff.is_empty(), "the header changed the result:\n{}", diff.join("\n"));
}

/// Strict scores (verdict, phase, cause) and the number of false "ready" over a set of logs.
fn strict_totals(profiles: &Profiles, cases: &[Case]) -> ([usize; 3], usize) {
    let mut strict = [0; 3];
    let mut false_ready = 0;
    for c in cases {
        let g = diagnose(profiles, &c.body);
        for (i, (got, want)) in
            [(&g.verdict, &c.verdict), (&g.phase, &c.phase), (&g.cause, &c.cause)].iter().enumerate()
        {
            strict[i] += (want[0] == **got) as usize;
        }
        false_ready += (g.verdict == "ready" && !c.verdict.iter().any(|v| v == "ready")) as usize;
    }
    (strict, false_ready)
}

/// The held-back slice (issue #24) against the rest: only totals are printed, never a log's name or result,
/// so that the slice stays unread while rules are written. Verdict within 3 points, phase within 5, no false
/// ready.
#[test]
fn heldback_scores_near_the_rest() {
    let held = load_heldback();
    if held.is_empty() {
        return;
    }
    let rest = load();
    let profiles = Profiles::builtin();
    let (h, hf) = strict_totals(&profiles, &held);
    let (r, rf) = strict_totals(&profiles, &rest);
    println!("strict accuracy (%)   logs | verdict  phase  cause | false ready");
    for (name, s, n, f) in [("held back", h, held.len(), hf), ("the rest", r, rest.len(), rf)] {
        println!("{name:<20} {n:>5} | {:>7.1} {:>6.1} {:>6.1} | {f}", pct(s[0], n), pct(s[1], n), pct(s[2], n));
    }
    let gap = |i: usize| pct(r[i], rest.len()) - pct(h[i], held.len());
    assert_eq!(hf, 0, "{hf} false ready in the held-back slice");
    assert!(gap(0) <= 3.0, "held-back verdict {:.1} points below the rest (at most 3)", gap(0));
    assert!(gap(1) <= 5.0, "held-back phase {:.1} points below the rest (at most 5)", gap(1));
}
