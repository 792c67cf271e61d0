//! vigil-core: the pure part of vigil. Server profiles (data), line classification, the judge state
//! machine and the verdict types. No tokio, no printing, no clock reads: time comes in with each fact.

pub mod classify;
pub mod judge;
pub mod profile;
pub mod time;
pub mod types;

pub use classify::{Classifier, Line};
pub use judge::{Event, ExitInfo, Fact, GpuFact, Input, Judge, JudgeConfig, ProbeOutcome, Report};
pub use profile::{Profile, Profiles};
pub use types::{Cause, Phase, Verdict};

/// Runs a whole text through a classifier and an offline judge. Lines are split on `\n` and `\r`.
pub fn diagnose_text(profiles: &Profiles, forced: Option<&str>, text: &str) -> Report {
    let mut c = Classifier::new(profiles, forced);
    let mut j = Judge::new(JudgeConfig::default());
    let mut stamper = Stamper::default();
    let mut header = HeaderSkipper::default();
    let mut feed = |raw: &str, c: &mut Classifier, j: &mut Judge| {
        if raw.trim().is_empty() {
            return;
        }
        let line = c.classify(raw);
        if let Some(k) = c.kind() {
            j.set_server(&k.name);
        }
        let at = stamper.at(line.stamp);
        j.feed(Fact { at, input: Input::Line(Box::new(line)) });
    };
    for raw in text.split(['\n', '\r']) {
        if header.skip(raw) {
            continue;
        }
        for held in header.release() {
            feed(&held, &mut c, &mut j);
        }
        feed(raw, &mut c, &mut j);
    }
    for held in header.release() {
        feed(&held, &mut c, &mut j);
    }
    j.feed(Fact { at: None, input: Input::Eof });
    j.final_report()
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
