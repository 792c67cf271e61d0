//! vigil-core: the pure part of vigil. Server profiles (data), line classification, the judge state
//! machine and the verdict types. No tokio, no printing, no clock reads: time comes in with each fact.

pub mod classify;
pub mod engine_metrics;
pub mod evidence;
pub mod fleet;
pub mod frames;
pub mod gpu_health;
pub mod history;
pub mod judge;
pub mod limits;
pub mod outcome;
pub mod policy;
pub mod profile;
pub mod proof;
pub mod repair;
pub mod time;
pub mod tree;
pub mod types;

pub use classify::{Classifier, Line};
pub use judge::{Event, ExitInfo, Fact, GpuFact, Input, Judge, JudgeConfig, KernelOom, ProbeOutcome, Report};
pub use profile::{Profile, Profiles};
pub use tree::{EngineDeath, ProcSample, TreeSample, TreeWatch};
pub use types::{Cause, Phase, Verdict};

/// The value of `--flag V` or `--flag=V` in an argument list.
pub fn arg_value<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    let eq = format!("{flag}=");
    args.iter().enumerate().find_map(|(i, a)| {
        if a == flag {
            args.get(i + 1).map(|s| s.as_str())
        } else {
            a.strip_prefix(eq.as_str())
        }
    })
}

/// Runs a whole text through a classifier and an offline judge. Lines are split on `\n` and `\r`.
pub fn diagnose_text(profiles: &Profiles, forced: Option<&str>, text: &str) -> Report {
    let mut o = Offline::new(profiles, forced);
    for raw in text.split(['\n', '\r']) {
        o.push(raw, &mut |_| {});
    }
    o.finish(&mut |_| {})
}

/// What the offline reader saw, for callers that show it (`diagnose --explain`, `--json`).
pub enum Seen<'a> {
    /// A line about to be judged; `detected` is set on the line that revealed the server kind.
    Line { line: &'a Line, detected: Option<&'a str> },
    /// The events the judge gave for it.
    Events(Vec<Event>),
}

/// The offline reading of one log: a leading comment header skipped, lines classified, log stamps
/// turned into judge time, the offline judge. Fed line by line, so a caller can stream any size.
pub struct Offline<'p> {
    c: Classifier<'p>,
    j: Judge,
    stamper: Stamper,
    header: HeaderSkipper,
    announced: bool,
}

impl<'p> Offline<'p> {
    pub fn new(profiles: &'p Profiles, forced: Option<&str>) -> Offline<'p> {
        Offline {
            c: Classifier::new(profiles, forced),
            j: Judge::new(JudgeConfig::default()),
            stamper: Stamper::default(),
            header: HeaderSkipper::default(),
            announced: false,
        }
    }

    /// Feeds one raw line (without its line ending).
    pub fn push(&mut self, raw: &str, each: &mut dyn FnMut(Seen)) {
        if self.header.skip(raw) {
            return;
        }
        for held in self.header.release() {
            self.feed(&held, each);
        }
        self.feed(raw, each);
    }

    /// The judge, for what it measured (per-rank timelines, silent gaps) after `finish`.
    pub fn judge(&self) -> &Judge {
        &self.j
    }

    /// Ends the text (lines held as a possible header are judged after all) and gives the verdict.
    pub fn finish(&mut self, each: &mut dyn FnMut(Seen)) -> Report {
        for held in self.header.release() {
            self.feed(&held, each);
        }
        self.j.feed(Fact { at: None, input: Input::Eof });
        self.j.final_report()
    }

    fn feed(&mut self, raw: &str, each: &mut dyn FnMut(Seen)) {
        if raw.trim().is_empty() {
            return;
        }
        let line = self.c.classify(raw);
        let mut detected = None;
        if !self.announced {
            if let Some(k) = self.c.kind() {
                self.announced = true;
                self.j.set_server(&k.name);
                detected = Some(k.name.as_str());
            }
        }
        each(Seen::Line { line: &line, detected });
        let at = self.stamper.at(line.stamp);
        let events = self.j.feed(Fact { at, input: Input::Line(Box::new(line)) });
        each(Seen::Events(events));
    }
}

/// Turns log stamps (any scale) into judge time for offline reading: the first stamp is 0; lines
/// without a stamp carry the last one; before any stamp, time is unknown.
#[derive(Debug, Default, Clone)]
pub struct Stamper {
    first: Option<i64>,
}

impl Stamper {
    pub fn at(&mut self, stamp: Option<i64>) -> Option<u64> {
        let s = stamp?;
        let f = *self.first.get_or_insert(s);
        Some((s - f).max(0) as u64)
    }
}

/// Skips a leading comment header: lines starting with `#` at the very start of the input, closed
/// by a line that is exactly `# ---` (the corpus format, also handy for annotated logs). Such a
/// header is never classified. Without the closing line nothing is skipped: the held lines are
/// handed back by [`HeaderSkipper::release`].
#[derive(Debug, Default, Clone)]
pub struct HeaderSkipper {
    done: bool,
    held: Vec<String>,
}

impl HeaderSkipper {
    /// True when the line belongs to the header (held or skipped). Call `release` when it returns
    /// false for the first time, to get back lines held in vain.
    pub fn skip(&mut self, line: &str) -> bool {
        if self.done {
            return false;
        }
        if line == "# ---" && !self.held.is_empty() {
            self.held.clear();
            self.done = true;
            return true;
        }
        if line.starts_with('#') && self.held.len() < 64 {
            self.held.push(line.to_string());
            return true;
        }
        self.done = true;
        false
    }

    /// Lines held while it looked like a header that turned out not to be one.
    pub fn release(&mut self) -> Vec<String> {
        std::mem::take(&mut self.held)
    }
}
