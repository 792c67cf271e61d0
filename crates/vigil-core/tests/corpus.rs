//! Corpus test: every real log in `../shared/corpus` (body only, header stripped) must get the verdict,
//! phase and cause its `# EXPECT:` line gives, except for the entries listed with a quoted reason in
//! `tests/corpus-exceptions.txt`. Prints a score table. Under CI=true a missing corpus fails.

use std::path::PathBuf;
use vigil_core::{diagnose_text, Profiles};

pub struct Case {
    pub rel: String,
    pub body: String,
    pub header: String,
    pub verdict: Vec<String>,
    pub phase: Vec<String>,
    pub cause: Vec<String>,
}

fn corpus_dir() -> Option<PathBuf> {
    let d = match std::env::var_os("VIGIL_CORPUS") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/corpus"),
    };
    d.is_dir().then_some(d)
}

fn split(bytes: &[u8]) -> (String, String) {
    // Header lines end with a line that is exactly "# ---"; the body is everything after, byte for byte.
    let text = String::from_utf8_lossy(bytes);
    let marker = "\n# ---\n";
    let i = text.find(marker).expect("header terminator");
    (text[..i].to_string(), text[i + marker.len()..].to_string())
}

pub fn load() -> Vec<Case> {
    let Some(dir) = corpus_dir() else {
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!("corpus not found (set VIGIL_CORPUS or check out shared/ beside the repo)");
        }
        eprintln!("SKIP: corpus not found");
        return vec![];
    };
    let mut out = Vec::new();
    let mut files: Vec<PathBuf> = Vec::new();
    for sub in std::fs::read_dir(&dir).unwrap() {
        let sub = sub.unwrap().path();
        if sub.is_dir() {
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
        let (header, body) = split(&std::fs::read(&f).unwrap());
        let exp = header.lines().find_map(|l| l.strip_prefix("# EXPECT:")).expect("EXPECT line").trim().to_string();
        let field = |k: &str| -> Vec<String> {
            exp.split_whitespace()
                .find_map(|kv| kv.strip_prefix(&format!("{k}=")))
                .unwrap()
                .split('|')
                .map(|s| if s == "-" { "null".to_string() } else { s.to_string() })
                .collect()
        };
        out.push(Case {
            rel: f.strip_prefix(&dir).unwrap().display().to_string(),
            verdict: field("verdict"),
            phase: field("phase"),
            cause: field("cause"),
            header,
            body,
        });
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

#[test]
fn corpus_matches_expectations() {
    let cases = load();
    if cases.is_empty() {
        return;
    }
    let profiles = Profiles::builtin();
    let exc = exceptions();
    assert!(exc.len() <= 2, "at most 2 exceptions allowed");
    let mut fails = Vec::new();
    let mut ok = 0;
    println!("{:<62} {:<9} {:<18} {:<12} result", "log", "verdict", "phase", "cause");
    for c in &cases {
        let r = diagnose_text(&profiles, None, &c.body);
        let got_v = r.verdict.as_str().to_string();
        let got_p = r.phase.as_str().to_string();
        let got_c = r.cause.map_or("null".to_string(), |c| c.as_str().to_string());
        let good = c.verdict.contains(&got_v) && c.phase.contains(&got_p) && c.cause.contains(&got_c);
        let status = if good {
            ok += 1;
            "ok"
        } else if exc.contains(&c.rel) {
            "EXCEPTION"
        } else {
            fails.push(format!(
                "{}: got {got_v}/{got_p}/{got_c}, want {:?}/{:?}/{:?}",
                c.rel, c.verdict, c.phase, c.cause
            ));
            "MISMATCH"
        };
        println!("{:<62} {:<9} {:<18} {:<12} {status}", c.rel, got_v, got_p, got_c);
    }
    println!("corpus score: {ok}/{} exact, {} listed exceptions", cases.len(), exc.len());
    assert!(fails.is_empty(), "corpus mismatches:\n{}", fails.join("\n"));
}

#[test]
fn header_does_not_change_the_verdict() {
    let profiles = Profiles::builtin();
    let mut diff = Vec::new();
    for c in load() {
        let a = diagnose_text(&profiles, None, &c.body);
        let b = diagnose_text(&profiles, None, &format!("{}\n# ---\n{}", c.header, c.body));
        if (a.verdict, a.phase, a.cause) != (b.verdict, b.phase, b.cause) {
            diff.push(format!("{}: {:?} vs {:?}", c.rel, (a.verdict, a.phase, a.cause), (b.verdict, b.phase, b.cause)));
        }
    }
    assert!(diff.is_empty(), "the header changed the result:\n{}", diff.join("\n"));
}
