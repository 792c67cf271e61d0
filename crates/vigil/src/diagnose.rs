//! `vigil diagnose FILE...`: offline post-mortem of logs, streamed in constant memory.

use crate::cli::CliError;
use crate::exit;
use crate::lines::Splitter;
use crate::report::{Mode, Reporter};
use std::io::Read;
use vigil_core::{Classifier, Fact, HeaderSkipper, Input, Judge, JudgeConfig, Profiles, Stamper};

pub struct Args {
    pub files: Vec<String>,
    pub json: bool,
    pub explain: bool,
    pub quiet: bool,
    pub server: Option<String>,
}

pub fn run(a: Args, profiles: &Profiles) -> Result<i32, CliError> {
    if a.files.is_empty() {
        return Err(CliError::usage("diagnose: give at least one log file"));
    }
    let mut rep = Reporter::new(a.json, a.quiet);
    if rep.mode == Mode::Tty {
        rep.mode = Mode::Plain;
    }
    let mut code = exit::READY;
    let many = a.files.len() > 1;
    for f in &a.files {
        let c = one(f, &a, profiles, &mut rep, many)?;
        code = exit::worst(code, c);
    }
    Ok(code)
}

fn one(path: &str, a: &Args, profiles: &Profiles, rep: &mut Reporter, many: bool) -> Result<i32, CliError> {
    let mut file: Box<dyn Read> = if path == "-" {
        Box::new(std::io::stdin())
    } else {
        let f = std::fs::File::open(path).map_err(|e| CliError::usage(format!("cannot read {path}: {e}")))?;
        if f.metadata().map(|m| m.is_dir()).unwrap_or(false) {
            return Err(CliError::usage(format!("cannot read {path}: is a directory")));
        }
        Box::new(f)
    };
    let mut c = Classifier::new(profiles, a.server.as_deref());
    let mut j = Judge::new(JudgeConfig::default());
    let mut stamper = Stamper::default();
    let mut header = HeaderSkipper::default();
    let mut split = Splitter::new();
    let mut buf = vec![0u8; 256 * 1024];
    let mut lineno: u64 = 0;
    let mut announced = false;
    let mut handle = |raw: String, c: &mut Classifier, j: &mut Judge, rep: &mut Reporter, lineno: &mut u64| {
        *lineno += 1;
        let mut feed = |raw: &str, n: u64, c: &mut Classifier, j: &mut Judge, rep: &mut Reporter| {
            if raw.trim().is_empty() {
                return;
            }
            let line = c.classify(raw);
            if let Some(k) = c.kind() {
                if !announced {
                    announced = true;
                    j.set_server(&k.name);
                    if rep.mode == Mode::Json {
                        rep.json(serde_json::json!({"event": "detected", "server": k.name, "line": n}));
                    }
                }
            }
            if a.explain {
                if let Some(h) = &line.hit {
                    let what = match h.phase {
                        Some(p) => format!("{:?}→{}", h.kind, p),
                        None => format!("{:?}", h.kind),
                    };
                    let msg = format!(
                        "L{n}: {}/{} [{}]{} | {}",
                        h.profile,
                        h.rule,
                        what.to_lowercase(),
                        h.cause.map(|c| format!(" cause={c}")).unwrap_or_default(),
                        line.text
                    );
                    if rep.mode == Mode::Json {
                        rep.json(serde_json::json!({"event": "match", "line": n, "profile": h.profile, "rule": h.rule, "source": h.source, "text": line.text}));
                    } else {
                        rep.line(&msg);
                    }
                }
            }
            let at = stamper.at(line.stamp);
            for ev in j.feed(Fact { at, input: Input::Line(Box::new(line)) }) {
                let t = ev_time(&ev);
                if !matches!(ev, vigil_core::Event::Verdict(_)) && rep.mode == Mode::Json {
                    rep.event(t, &ev);
                }
            }
        };
        if header.skip(&raw) {
            return;
        }
        for held in header.release() {
            feed(&held, *lineno, c, j, rep);
        }
        feed(&raw, *lineno, c, j, rep);
    };
    loop {
        let n = match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(CliError::usage(format!("cannot read {path}: {e}"))),
        };
        let mut lines = Vec::new();
        split.push(&buf[..n], &mut |l| lines.push(l));
        for l in lines {
            handle(l, &mut c, &mut j, rep, &mut lineno);
        }
    }
    if let Some(l) = split.finish() {
        handle(l, &mut c, &mut j, rep, &mut lineno);
    }
    for held in header.release() {
        let line = c.classify(&held);
        j.feed(Fact { at: None, input: Input::Line(Box::new(line)) });
    }
    j.feed(Fact { at: None, input: Input::Eof });
    let r = j.final_report();
    let t = r.elapsed_ms.unwrap_or(0);
    rep.verdict(t, &r, many.then_some(path));
    Ok(exit::for_verdict(r.verdict))
}

fn ev_time(ev: &vigil_core::Event) -> u64 {
    match ev {
        vigil_core::Event::Phase { at_ms, .. } => at_ms.unwrap_or(0),
        _ => 0,
    }
}
