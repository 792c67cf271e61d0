//! `vigil diagnose FILE...`: offline post-mortem of logs, streamed in constant memory.

use crate::error::CliError;
use crate::exit::Exit;
use crate::sinks::events::WatchEvent;
use crate::sinks::report::Reporter;
use crate::sources::lines::Splitter;
use std::io::Read;
use vigil_core::{Offline, Profiles, Seen};

pub struct Args {
    pub files: Vec<String>,
    pub json: bool,
    pub explain: bool,
    pub quiet: bool,
    pub server: Option<String>,
}

pub fn run(a: Args, profiles: &Profiles) -> Result<Exit, CliError> {
    if a.files.is_empty() {
        return Err(CliError::usage("diagnose: give at least one log file"));
    }
    let mut rep = Reporter::new(a.json, a.quiet);
    rep.offline();
    let mut code = Exit::Ready;
    let many = a.files.len() > 1;
    for f in &a.files {
        let c = one(f, &a, profiles, &mut rep, many)?;
        code = code.max(c);
    }
    Ok(code)
}

fn one(path: &str, a: &Args, profiles: &Profiles, rep: &mut Reporter, many: bool) -> Result<Exit, CliError> {
    let mut file: Box<dyn Read> = if path == "-" {
        Box::new(std::io::stdin())
    } else {
        let f = std::fs::File::open(path).map_err(|e| CliError::usage(format!("cannot read {path}: {e}")))?;
        if f.metadata().map(|m| m.is_dir()).unwrap_or(false) {
            return Err(CliError::usage(format!("cannot read {path}: is a directory")));
        }
        Box::new(f)
    };
    let mut offline = Offline::new(profiles, a.server.as_deref());
    let mut split = Splitter::new();
    let mut buf = vec![0u8; 256 * 1024];
    let mut lineno: u64 = 0;
    // What to show of each line: the detection, the explain line, the JSON events.
    let show = |seen: Seen, n: u64, rep: &mut Reporter| match seen {
        Seen::Line { line, detected } => {
            if let Some(k) = detected {
                rep.emit(None, &WatchEvent::Detected { server: k, line: Some(n) });
            }
            if let (true, Some(h)) = (a.explain, &line.hit) {
                let ev = WatchEvent::Match {
                    line: n,
                    profile: &h.profile,
                    rule: &h.rule,
                    source: h.source.as_deref(),
                    text: &line.text,
                    kind: format!("{:?}", h.kind),
                    phase: h.phase,
                    cause: h.cause,
                };
                rep.emit(None, &ev);
            }
        }
        Seen::Events(evs) => {
            for ev in evs.iter().filter(|e| !matches!(e, vigil_core::Event::Verdict(_))) {
                rep.event(ev_time(ev), ev);
            }
        }
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
            lineno += 1;
            offline.push(&l, &mut |seen| show(seen, lineno, rep));
        }
    }
    if let Some(l) = split.finish() {
        lineno += 1;
        offline.push(&l, &mut |seen| show(seen, lineno, rep));
    }
    let r = offline.finish(&mut |seen| show(seen, lineno, rep));
    let t = r.elapsed_ms.unwrap_or(0);
    rep.verdict(t, &r, many.then_some(path));
    Ok(Exit::for_verdict(r.verdict))
}

fn ev_time(ev: &vigil_core::Event) -> u64 {
    match ev {
        vigil_core::Event::Phase { at_ms, .. } => at_ms.unwrap_or(0),
        _ => 0,
    }
}
