//! Line classification: clean a raw log line, strip the server's prefix (timestamp, rank tag,
//! level), detect the server kind, and match the profile rules.

use crate::profile::{Profile, Profiles, Rule, RuleKind};
use crate::types::{Cause, Phase};
use regex::Regex;
use serde::Serialize;
use std::sync::OnceLock;

/// Longest line text kept for matching; longer lines are cut (the reader bounds what it reads too).
pub const MAX_MATCH_LEN: usize = 64 * 1024;
/// Longest line text kept as evidence.
pub const MAX_EVIDENCE_LEN: usize = 2048;

/// What a matched rule says about a line.
#[derive(Debug, Clone, Serialize)]
pub struct Hit {
    pub profile: String,
    pub rule: String,
    #[serde(skip)]
    pub kind: RuleKind,
    #[serde(skip)]
    pub phase: Option<Phase>,
    #[serde(skip)]
    pub again: Option<Phase>,
    #[serde(skip)]
    pub cause: Option<Cause>,
    #[serde(skip)]
    pub hint: Option<String>,
    #[serde(skip)]
    pub terminal: bool,
    #[serde(skip)]
    pub force: bool,
    #[serde(skip)]
    pub k: Option<u64>,
    #[serde(skip)]
    pub n: Option<u64>,
    #[serde(skip)]
    pub detail: Option<String>,
    pub source: Option<String>,
}

/// A classified line.
#[derive(Debug, Clone)]
pub struct Line {
    /// The cleaned line (ANSI and quoting removed), bounded for evidence.
    pub text: String,
    /// The message after the log prefix.
    pub message: String,
    pub rank: Option<String>,
    pub level: Option<String>,
    /// Stamp in the log's own scale (milliseconds), when the prefix carried one.
    pub stamp: Option<i64>,
    /// The line began with a recognised log record prefix: one with a stamp or a level. A prefix that is
    /// only a process tag (vLLM's `(EngineCore_0 pid=N) ` on every line a process writes) does not start
    /// a record: such a line continues the record before it, like an untagged line.
    pub prefixed: bool,
    pub hit: Option<Hit>,
}

impl Line {
    pub fn kind(&self) -> Option<RuleKind> {
        self.hit.as_ref().map(|h| h.kind)
    }

    /// Looks like part of a traceback or error block rather than a new log record.
    pub fn is_continuation(&self) -> bool {
        if !self.prefixed {
            return true;
        }
        if let Some(l) = &self.level {
            if matches!(l.as_str(), "ERROR" | "E" | "CRITICAL" | "FATAL") {
                return true;
            }
        }
        let m = &self.message;
        m.starts_with(' ') || m.starts_with('\t') || m.starts_with("Traceback") || m.is_empty()
    }
}

fn ansi_re() -> &'static Regex {
    static R: OnceLock<Regex> = OnceLock::new();
    R.get_or_init(|| Regex::new(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07]*\x07|[\x00-\x08\x0b-\x1f\x7f]").unwrap())
}

/// ANSI colour codes that a log shipper wrote out as text: CloudWatch and rsyslog `#033[`, journald and
/// terminals `^[[`, `ESC[`, escaped JSON `\u001b[`, Python reprs `\x1b[` and `\033[`.
fn literal_ansi_re() -> &'static Regex {
    static R: OnceLock<Regex> = OnceLock::new();
    R.get_or_init(|| Regex::new(r"(?:#033|\\033|\^\[|ESC|\\x1[bB]|\\u001[bB])\[[0-9;]*m").unwrap())
}

/// One pass over the line's `[` bytes (most lines have none or one or two): is one of them the end of a
/// written-out escape (`033[`, `^[[`, `ESC[`, `1b[`, `1B[`)?
fn has_literal_ansi(s: &str) -> bool {
    let b = s.as_bytes();
    let mut from = 0;
    while let Some(i) = b[from..].iter().position(|&c| c == b'[') {
        let at = from + i;
        let before = &b[..at];
        if before.ends_with(b"033")
            || before.ends_with(b"^[")
            || before.ends_with(b"ESC")
            || before.ends_with(b"1b")
            || before.ends_with(b"1B")
        {
            return true;
        }
        from = at + 1;
    }
    false
}

fn quote_re() -> &'static Regex {
    static R: OnceLock<Regex> = OnceLock::new();
    // Markdown quotes (`> `, `>   | ` from issue threads) and docker-compose service prefixes (`svc-1  | `).
    R.get_or_init(|| Regex::new(r"^(?:(?:> ?)+(?:\s*\|\s+)?|[A-Za-z0-9_.-]+\s+\| )").unwrap())
}

/// A syslog or journald record's own head, put before the program's line by the host's logger:
/// `Dec 03 08:03:11 host prog[56938]: ` (RFC 3164 / `journalctl -o short`) or
/// `2026-07-28T20:08:36.626065-04:00 host prog[1686919]: ` (RFC 3339 stamps, `-o short-iso`). The program's
/// `[pid]` is required, so that a server's own `stamp LEVEL target: ` prefix (TGI) is never taken for one.
fn syslog_re() -> &'static Regex {
    static R: OnceLock<Regex> = OnceLock::new();
    R.get_or_init(|| {
        Regex::new(
            r"^(?:[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)) \S+ [^\s\[\]:]+\[\d+\]: ",
        )
        .unwrap()
    })
}

/// Cheap test before the regex, on fixed byte positions: `Mmm dd hh:mm:ss` or `yyyy-mm-ddThh`.
fn may_have_syslog_head(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() > 24
        && ((b[0].is_ascii_uppercase() && b[3] == b' ' && b[6] == b' ' && b[9] == b':')
            || (b[0].is_ascii_digit() && b[4] == b'-' && b[7] == b'-' && b[10] == b'T'))
}

fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut i = max;
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    &s[..i]
}

/// Removes ANSI colour, control characters and issue/compose quoting.
pub fn clean(raw: &str) -> String {
    let raw = truncate(raw, MAX_MATCH_LEN);
    let s = if raw.bytes().any(|b| b < 0x20 && b != b'\t' || b == 0x7f) {
        ansi_re().replace_all(raw, "")
    } else {
        std::borrow::Cow::Borrowed(raw)
    };
    let s = if has_literal_ansi(&s) {
        std::borrow::Cow::Owned(literal_ansi_re().replace_all(&s, "").into_owned())
    } else {
        s
    };
    let s = s.trim_end();
    let s = match may_have_syslog_head(s).then(|| syslog_re().find(s)).flatten() {
        Some(m) => &s[m.end()..],
        None => s,
    };
    let first = s.as_bytes().first().copied().unwrap_or(b' ');
    if first != b'>' && !s.contains(" | ") {
        return s.to_string();
    }
    match quote_re().find(s) {
        Some(m) => s[m.end()..].to_string(),
        None => s.to_string(),
    }
}

struct Stripped<'a> {
    message: &'a str,
    /// The prefix carried a stamp or a level (a record's head), not only a process tag.
    record: bool,
    rank: Option<String>,
    level: Option<String>,
    stamp: Option<i64>,
}

fn strip_prefix<'a>(p: &Profile, s: &'a str) -> Option<Stripped<'a>> {
    for pre in &p.prefixes {
        // The fast engine finds the span; groups are then read from the (short) prefix only.
        let Some(m) = pre.re.find(s) else { continue };
        if m.start() != 0 || m.end() == 0 {
            continue;
        }
        if let Some(c) = pre.re.captures(&s[..m.end()]) {
            let stamp = match (c.name("ts"), pre.time) {
                (Some(t), Some(f)) => f.parse(t.as_str()),
                _ => None,
            };
            let rank = c.name("rank").map(|r| r.as_str().trim().to_string()).filter(|r| !r.is_empty());
            let level = c.name("level").map(|l| l.as_str().trim().to_string()).filter(|l| !l.is_empty());
            let record = c.name("ts").is_some() || c.name("level").is_some();
            return Some(Stripped { message: &s[m.end()..], record, rank, level, stamp });
        }
    }
    None
}

fn match_rules(p: &Profile, message: &str) -> Option<Hit> {
    // One pass over all patterns; groups are read only for the winning rule, and only if it has any.
    let i = p.rule_set().matches(message.as_bytes()).next()?;
    hit_of(&p.rules[i], message)
}

/// The first error rule of `p` matching `message` that names a cause, with its hint filled in from the line.
fn cause_in(p: &Profile, message: &str) -> Option<(Cause, Option<String>)> {
    let set = p.rule_set().matches(message.as_bytes());
    let r = set.map(|i| &p.rules[i]).find(|r| r.kind == RuleKind::Error && r.cause.is_some())?;
    let hint = match r.hint.as_deref() {
        Some(h) if r.re.groups() > 0 => Some(fill(h, r.re.get().captures(message).as_ref())),
        h => h.map(String::from),
    };
    Some((r.cause?, hint))
}

/// A hint's `{group}` (or `{a|b}`: the first of them the line captured) replaced by what the rule's named group
/// captured on the line: the path, the flag, the variable the error names. A group the line did not capture
/// reads "the one the error names".
pub fn fill(hint: &str, c: Option<&regex::Captures>) -> String {
    let mut out = String::with_capacity(hint.len());
    let mut rest = hint;
    while let Some(i) = rest.find('{') {
        let Some(j) = rest[i..].find('}') else { break };
        let names = &rest[i + 1..i + j];
        if names.is_empty() || !names.chars().all(|ch| ch.is_ascii_alphanumeric() || ch == '_' || ch == '|') {
            out.push_str(&rest[..=i]);
            rest = &rest[i + 1..];
            continue;
        }
        out.push_str(&rest[..i]);
        let got =
            names.split('|').find_map(|n| c.and_then(|c| c.name(n)).map(|m| m.as_str()).filter(|v| !v.is_empty()));
        out.push_str(got.unwrap_or("the one the error names"));
        rest = &rest[i + j + 1..];
    }
    out.push_str(rest);
    out
}

fn hit_of(r: &Rule, message: &str) -> Option<Hit> {
    if r.re.groups() == 0 {
        return Some(hit(r, None));
    }
    r.re.get().captures(message).map(|c| hit(r, Some(&c)))
}

fn hit(r: &Rule, c: Option<&regex::Captures>) -> Hit {
    let group = |n: &str| c.and_then(|c| c.name(n)).map(|m| m.as_str());
    let num = |n: &str| group(n).and_then(|m| m.parse::<u64>().ok());
    Hit {
        profile: r.profile.clone(),
        rule: r.name.clone(),
        kind: r.kind,
        phase: r.phase,
        again: r.again,
        cause: r.cause,
        hint: r.hint.as_deref().map(|h| fill(h, c)),
        terminal: r.terminal,
        force: r.force,
        k: num("k"),
        n: num("n"),
        detail: group("detail").map(String::from),
        source: r.source.clone(),
    }
}

/// Classifies lines of one log. Detects the server kind from the first line that names it, unless forced.
pub struct Classifier<'p> {
    profiles: &'p Profiles,
    kind: Option<usize>,
    forced: bool,
    /// The table file of the frame line just read (its code line may name the next call).
    frame_file: Option<&'static str>,
}

impl<'p> Classifier<'p> {
    pub fn new(profiles: &'p Profiles, forced: Option<&str>) -> Classifier<'p> {
        let kind = forced.and_then(|f| profiles.list.iter().position(|p| p.name == f));
        Classifier { profiles, kind, forced: kind.is_some(), frame_file: None }
    }

    /// The detected (or forced) server kind.
    pub fn kind(&self) -> Option<&'p Profile> {
        self.kind.map(|i| &self.profiles.list[i])
    }

    pub fn classify(&mut self, raw: &str) -> Line {
        let text = clean(raw);
        if self.kind.is_none() && !self.forced {
            self.kind = self.profiles.list.iter().position(|p| p.detect.iter().any(|r| r.is_match(&text)));
        }
        // The detected kind and the framework layer, else every profile in order (no allocation per line).
        let (pair, all): (Option<[&Profile; 2]>, &[Profile]) = match self.kind {
            Some(i) => (Some([&self.profiles.list[i], self.profiles.generic()]), &[]),
            None => (None, &self.profiles.list),
        };
        let candidates = || pair.into_iter().flatten().chain(all.iter());
        // The prefix comes from the first candidate whose prefix matches.
        let mut stripped = None;
        for p in candidates() {
            if let Some(s) = strip_prefix(p, &text) {
                stripped = Some(s);
                break;
            }
        }
        let (message, rank, level, stamp, prefixed) = match stripped {
            Some(s) => (s.message.to_string(), s.rank, s.level, s.stamp, s.record),
            None => (text.clone(), None, None, None, false),
        };
        let mut hit = candidates().find_map(|p| match_rules(p, &message));
        // A traceback frame of a server's own code: the frame table says its phase, where no rule matched or
        // the rule that did names only a cause (vLLM's busy-loop frames: engine_dead).
        // (The framework layer's plain frame rule, which opens a block and says nothing more, gives way.)
        let table_may = match &hit {
            None => true,
            Some(h) => h.phase.is_none() && matches!(h.kind, RuleKind::Implies | RuleKind::Error) && !h.terminal,
        };
        let table = crate::frames::FrameTable::builtin();
        // A code line under a frame of a file the table knows (`    self.maybe_init_draft_worker()`): the
        // function it calls, in that file, is where the process went next (a pasted traceback often ends there).
        let is_frame = message.contains("File \"");
        let found = match (self.frame_file.take(), &hit) {
            _ if is_frame => {
                let loc = table.locate(&message);
                self.frame_file = loc.map(|l| l.0);
                loc.and_then(|(file, func)| table.get(file, func))
            }
            // (the code is what follows the last four-space indent: a process tag may come before it)
            (Some(file), None) if message.contains("    ") => {
                let code = message.rsplit("    ").next().unwrap_or("");
                crate::frames::called(code).and_then(|f| table.get(file, f))
            }
            _ => None,
        };
        if table_may {
            if let Some((row, file, func)) = found {
                if let Some(h) = hit.as_mut().filter(|h| h.cause.is_some() || h.hint.is_some()) {
                    h.phase = Some(row.phase);
                    h.kind = RuleKind::Implies;
                } else {
                    hit = Some(Hit {
                        profile: row.server.to_string(),
                        rule: "frames".to_string(),
                        kind: RuleKind::Implies,
                        phase: Some(row.phase),
                        again: None,
                        cause: None,
                        hint: None,
                        terminal: false,
                        force: false,
                        k: None,
                        n: None,
                        detail: None,
                        source: Some(format!("profiles/frames.tsv: {file} {func}")),
                    });
                }
            }
        }
        // A server's frame or error rule that names no cause does not hide the framework layer's cause on
        // the same line (vLLM's "while processing method init_device: NCCL error: ..." is the init phase
        // and an NCCL error at once).
        if let Some(h) = hit.as_mut().filter(|h| {
            h.cause.is_none()
                && h.profile != "generic"
                && matches!(h.kind, RuleKind::Error | RuleKind::Implies | RuleKind::Unhealthy)
        }) {
            if let Some((c, hint)) = cause_in(self.profiles.generic(), &message) {
                h.cause = Some(c);
                if h.hint.is_none() {
                    h.hint = hint;
                }
            }
        }
        Line { text: truncate(&text, MAX_EVIDENCE_LEN).to_string(), message, rank, level, stamp, prefixed, hit }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cleans_ansi_and_quotes() {
        assert_eq!(clean("\x1b[32mINFO\x1b[0m hi"), "INFO hi");
        assert_eq!(clean("> main: couldn't bind"), "main: couldn't bind");
        // colour codes a log shipper wrote out as text
        assert_eq!(clean("#033[2m2024-04-18T22:45:31Z#033[0m #033[32m INFO#033[0m x"), "2024-04-18T22:45:31Z  INFO x");
        assert_eq!(clean("^[[32mINFO^[[0m y"), "INFO y");
        assert_eq!(clean(r"\u001b[31mERROR\u001b[0m z"), "ERROR z");
        assert_eq!(clean(">   | [2024] INFO: x"), "[2024] INFO: x");
        assert_eq!(clean("sglang_service-1  | [2026-09-22 15:00:54] x"), "[2026-09-22 15:00:54] x");
        // syslog and journald heads (the program's [pid] is required)
        assert_eq!(clean("Dec 03 08:03:11 kamala llama-server[56938]: slot x"), "slot x");
        assert_eq!(clean("2026-07-28T20:08:36.626065-04:00 t0 llama-server[1686919]: [42751] y"), "[42751] y");
        let tgi = "2024-04-15T14:03:19.035250Z ERROR shard-manager: text_generation_launcher: z";
        assert_eq!(clean(tgi), tgi);
        assert_eq!(
            clean("Loading safetensors checkpoint shards:   0% Completed | 0/8"),
            "Loading safetensors checkpoint shards:   0% Completed | 0/8"
        );
    }

    #[test]
    fn sglang_prefix_and_rank() {
        let p = Profiles::builtin();
        let mut c = Classifier::new(&p, Some("sglang"));
        let l = c.classify("[2025-10-16 09:06:22 DP0 TP5] Load weight begin. avail mem=70.00 GB");
        assert_eq!(l.rank.as_deref(), Some("DP0 TP5"));
        assert!(l.stamp.is_some());
        assert_eq!(l.hit.unwrap().phase, Some(Phase::Weights));
        // newer builds: level and file:line after the stamp
        let l = c.classify("[2026-05-01 10:00:00 TP1] INFO model_runner.py:123: Load weight begin. avail mem=70.00 GB");
        assert_eq!(l.rank.as_deref(), Some("TP1"));
        assert_eq!(l.hit.unwrap().phase, Some(Phase::Weights));
    }

    #[test]
    fn a_process_tag_alone_continues_the_record_before_it() {
        let p = Profiles::builtin();
        let mut c = Classifier::new(&p, Some("vllm"));
        let rec = c.classify(
            "(EngineCore_0 pid=3045) INFO 09-16 01:38:51 [default_loader.py:262] Loading weights took 3.35 seconds",
        );
        assert!(rec.prefixed && !rec.is_continuation());
        // the second line of a multi-line message: the process tag, no stamp, no level
        let cont = c.classify("(EngineCore_0 pid=1518379) ', please check the stack trace above for the root cause");
        assert!(!cont.prefixed && cont.is_continuation());
    }

    #[test]
    fn vllm_worker_tags_name_their_ranks() {
        let p = Profiles::builtin();
        let mut c = Classifier::new(&p, Some("vllm"));
        let l = c.classify("(Worker_DP1_TP6_EP14 pid=51857) INFO 07-23 02:43:59 [weight_utils.py:856] Prefetching checkpoint files: 80% (9/11)");
        assert_eq!(l.rank.as_deref(), Some("Worker_DP1_TP6_EP14"));
        assert_eq!(l.hit.unwrap().phase, Some(Phase::Weights));
        let l = c.classify("(VllmWorker TP1 pid=7) INFO 05-01 10:00:00 [gpu_worker.py:1] x");
        assert_eq!(l.rank.as_deref(), Some("VllmWorker TP1"));
    }

    #[test]
    fn detects_kind() {
        let p = Profiles::builtin();
        let mut c = Classifier::new(&p, None);
        c.classify("some noise");
        assert!(c.kind().is_none());
        c.classify("0.00.008.333 I srv    load_model: loading model 'tiny.gguf'");
        assert_eq!(c.kind().unwrap().name, "llama-cpp");
    }

    #[test]
    fn progress_numbers() {
        let p = Profiles::builtin();
        let mut c = Classifier::new(&p, Some("sglang"));
        let l =
            c.classify("Capturing batches (bs=200 avail_mem=10.71 GB):  14%|█▍        | 1/7 [00:02<00:13,  2.28s/it]");
        let h = l.hit.unwrap();
        assert_eq!((h.k, h.n), (Some(1), Some(7)));
        assert_eq!(h.detail.as_deref(), Some("bs=200 avail_mem=10.71 GB"));
    }
}
