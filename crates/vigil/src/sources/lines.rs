//! Bounded line splitting: `\n`, `\r\n` and bare `\r` (progress bars) end a line; a line longer than
//! the bound keeps its head and says how much was cut; invalid UTF-8 is replaced, never a panic.
//!
//! A bare `\r` starts a redraw of the line: tqdm writes `\r` before each state of a bar, so a state's end is
//! the next state, which may be a while off. Live readers hand the state on as it stands once their source
//! goes quiet (`take_redraw`); the end that follows does not hand it on again unless it grew meanwhile.
//! Empty redraws (the `\r` right after a newline) are dropped; a blank `\r\n` line is kept.
//!
//! A writer that tags each line with its process (vLLM's multiproc workers: `(Worker_TP0 pid=15885) ` at the
//! start of every line, `vllm/utils/system_utils.py` `_add_prefix`) writes the tag and then the bar's `\r`: the
//! tag is the start of the line the bar redraws, so it heads each of the bar's states (`(Worker_TP0 pid=15885)
//! Capturing CUDA graphs ...`), and the state counts for that rank (seen on the GPU machine, issue #32: the
//! untagged bar of TP0 left the rank in `compile` while it captured). A line's first segment is taken for a tag
//! when it is short and ends in `) ` or `] `.

pub const MAX_LINE: usize = 64 * 1024;

#[derive(Debug, Default)]
pub struct Splitter {
    buf: Vec<u8>,
    cut: usize,
    /// The last byte was `\r`: a `\n` now ends a `\r\n`, not a line of its own.
    last_was_cr: bool,
    /// That `\r` ended an empty segment: a blank line if a `\n` follows, nothing otherwise.
    empty_cr: bool,
    /// The current segment follows a bare `\r`: it redraws the line.
    redraw: bool,
    /// The current segment was handed on (by `take_redraw`) at this length.
    shown: Option<usize>,
    /// The writer's tag that started this line, before its first `\r`: it heads each redraw of the line.
    tag: Option<Vec<u8>>,
}

/// Longest line tag carried onto a bar's states.
const MAX_TAG: usize = 96;

/// A line's first segment, ended by `\r`, that is a writer's tag: short, ending in `) ` or `] `.
fn is_tag(seg: &[u8]) -> bool {
    seg.len() <= MAX_TAG && (seg.ends_with(b") ") || seg.ends_with(b"] "))
}

impl Splitter {
    pub fn new() -> Splitter {
        Splitter::default()
    }

    /// Feeds bytes; calls `out` for each complete line.
    pub fn push(&mut self, data: &[u8], out: &mut dyn FnMut(String)) {
        let mut start = 0;
        for (i, &b) in data.iter().enumerate() {
            if b != b'\n' && b != b'\r' {
                continue;
            }
            self.append(&data[start..i]);
            start = i + 1;
            let empty = self.len() == 0;
            if b == b'\n' {
                if empty && self.last_was_cr {
                    // the `\n` of a `\r\n`: the line ended at its `\r`, unless that one was blank
                    if self.empty_cr {
                        out(String::new());
                    }
                } else {
                    self.end(out);
                }
                self.redraw = false;
                self.empty_cr = false;
                self.tag = None;
            } else {
                if !empty && !self.redraw && self.cut == 0 && is_tag(&self.buf) {
                    // the line's tag: it heads the redraws that follow, not a line of its own
                    self.tag = Some(std::mem::take(&mut self.buf));
                    self.shown = None;
                } else if !empty {
                    self.end(out);
                }
                self.empty_cr = empty;
                self.redraw = true;
            }
            self.last_was_cr = b == b'\r';
        }
        if start < data.len() {
            self.append(&data[start..]);
            self.last_was_cr = false;
            self.empty_cr = false;
        }
    }

    /// Is a redraw waiting for its end that was not handed on as it stands now?
    pub fn redraw_waiting(&self) -> bool {
        self.redraw && self.len() > 0 && self.shown != Some(self.len())
    }

    /// The redraw waiting for its end, as it stands (once: until it grows, it is not given again). For live
    /// readers whose source went quiet; an ordinary partial line waits for its end.
    pub fn take_redraw(&mut self) -> Option<String> {
        if !self.redraw_waiting() {
            return None;
        }
        self.shown = Some(self.len());
        Some(self.text())
    }

    fn len(&self) -> usize {
        self.buf.len() + self.cut
    }

    fn append(&mut self, d: &[u8]) {
        let room = MAX_LINE.saturating_sub(self.buf.len());
        let n = room.min(d.len());
        self.buf.extend_from_slice(&d[..n]);
        self.cut += d.len() - n;
    }

    fn text(&self) -> String {
        let mut s = match (&self.tag, self.redraw) {
            (Some(t), true) => String::from_utf8_lossy(&[&t[..], &self.buf[..]].concat()).into_owned(),
            _ => String::from_utf8_lossy(&self.buf).into_owned(),
        };
        if self.cut > 0 {
            s.push_str(&format!(" [… {} bytes cut]", self.cut));
        }
        s
    }

    /// Ends the current segment: hands it on unless it was already, unchanged.
    fn end(&mut self, out: &mut dyn FnMut(String)) {
        if self.shown != Some(self.len()) {
            out(self.text());
        }
        self.buf.clear();
        self.cut = 0;
        self.shown = None;
    }

    /// A last line without a newline (at end of input or when the source changes).
    pub fn finish(&mut self) -> Option<String> {
        let mut last = None;
        if self.len() > 0 {
            self.end(&mut |l| last = Some(l));
        }
        (self.last_was_cr, self.empty_cr, self.redraw) = (false, false, false);
        self.tag = None;
        last
    }
}

/// What a terminal shows of a log line whose progress bar redrew it with `\r`: its last non-empty state
/// (`vigil logs` prints that, not every state the bar went through). A line without `\r` is itself.
pub fn final_state(line: &str) -> &str {
    line.rsplit('\r').find(|s| !s.is_empty()).unwrap_or("")
}

/// `hay` with every `needle` replaced by `with`, left to right, byte for byte (secrets in a log line, rank
/// placeholders in a command's arguments).
pub fn replace_bytes(hay: &[u8], needle: &[u8], with: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(hay.len());
    let mut i = 0;
    while i < hay.len() {
        if !needle.is_empty() && hay[i..].starts_with(needle) {
            out.extend_from_slice(with);
            i += needle.len();
        } else {
            out.push(hay[i]);
            i += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(chunks: &[&[u8]]) -> Vec<String> {
        let mut s = Splitter::new();
        let mut v = Vec::new();
        for c in chunks {
            s.push(c, &mut |l| v.push(l));
        }
        v.extend(s.finish());
        v
    }

    #[test]
    fn splits_all_endings() {
        assert_eq!(split(&[b"a\nb\r\nc\rd"]), vec!["a", "b", "c", "d"]);
        assert_eq!(split(&[b"ab", b"c\n", b"d"]), vec!["abc", "d"]);
        assert_eq!(split(&[b"a\r", b"\nb\n"]), vec!["a", "b"]);
        assert_eq!(split(&[b"\n\nx\n"]), vec!["", "", "x"]);
    }

    /// Pushes each write as one chunk and, after it, asks for a waiting redraw (a live reader whose source
    /// went quiet after every write).
    fn live(writes: &[&[u8]]) -> Vec<String> {
        let mut s = Splitter::new();
        let mut v = Vec::new();
        for w in writes {
            s.push(w, &mut |l| v.push(l));
            v.extend(s.take_redraw());
        }
        v.extend(s.finish());
        v
    }

    #[test]
    fn a_bar_state_is_handed_on_when_written_once_and_never_twice() {
        // tqdm: `\r` before each state, a newline after the last
        let writes: [&[u8]; 5] = [b"phase line\n", b"\rbar 0/3", b"\rbar 1/3", b"\rbar 3/3", b"\n"];
        assert_eq!(live(&writes), vec!["phase line", "bar 0/3", "bar 1/3", "bar 3/3"]);
        // the same bytes read at once (diagnose): the same lines
        assert_eq!(split(&[&writes.concat()]), vec!["phase line", "bar 0/3", "bar 1/3", "bar 3/3"]);
        // a writer that puts `\r` after each state instead
        assert_eq!(live(&[b"a 1/2\r", b"a 2/2\r", b"\n", b"next\n"]), vec!["a 1/2", "a 2/2", "next"]);
    }

    #[test]
    fn a_writers_line_tag_heads_each_state_of_its_bar() {
        // vLLM 0.26.0's TP0 worker on the GPU machine (issue #32): the tag, then tqdm's `\r` states
        let writes: [&[u8]; 4] = [b"(Worker_TP0 pid=15885) ", b"\rCapturing 0/51", b"\rCapturing 1/51", b"\n"];
        let want = vec!["(Worker_TP0 pid=15885) Capturing 0/51", "(Worker_TP0 pid=15885) Capturing 1/51"];
        assert_eq!(live(&writes), want);
        assert_eq!(split(&[&writes.concat()]), want);
        // the next line has its own tag, or none
        assert_eq!(split(&[b"[x TP1] \rbar 1/2\nplain\rbar 2/2\n"]), vec!["[x TP1] bar 1/2", "plain", "bar 2/2"]);
        // a line's text before a `\r` that is not a tag is a line of its own
        assert_eq!(split(&[b"loading weights...\rbar 1/2\n"]), vec!["loading weights...", "bar 1/2"]);
    }

    #[test]
    fn a_redraw_that_grows_after_being_shown_is_given_again_whole() {
        let mut s = Splitter::new();
        let mut v = Vec::new();
        s.push(b"\rCapturing 12/5", &mut |l| v.push(l));
        assert_eq!(s.take_redraw().as_deref(), Some("Capturing 12/5"));
        assert_eq!(s.take_redraw(), None, "once");
        s.push(b"1\rCapturing 13/51", &mut |l| v.push(l));
        assert_eq!(v, vec!["Capturing 12/51"]);
        assert_eq!(s.take_redraw().as_deref(), Some("Capturing 13/51"));
        assert_eq!(s.finish(), None, "shown and unchanged at the end: not again");
    }

    #[test]
    fn ordinary_partial_lines_wait_for_their_end() {
        let mut s = Splitter::new();
        let mut v = Vec::new();
        s.push(b"INFO half a li", &mut |l| v.push(l));
        assert!(!s.redraw_waiting());
        assert_eq!(s.take_redraw(), None);
        s.push(b"ne\n", &mut |l| v.push(l));
        assert_eq!(v, vec!["INFO half a line"]);
        // a partial line at the end of input is still kept
        assert_eq!(split(&[b"a\nlast without newline"]), vec!["a", "last without newline"]);
        assert_eq!(split(&[b"\rbar 1/2\rbar 2/2"]), vec!["bar 1/2", "bar 2/2"]);
    }

    #[test]
    fn crlf_and_empty_redraws() {
        // a blank CRLF line stays; the empty segment before a bar's first `\r` does not
        assert_eq!(split(&[b"a\r\n\r\nb\r\n"]), vec!["a", "", "b"]);
        assert_eq!(split(&[b"a\r", b"\n", b"\r", b"\nb\n"]), vec!["a", "", "b"]);
        assert_eq!(split(&[b"x\n\ry\n"]), vec!["x", "y"]);
        assert_eq!(split(&[b"x\n\r\r\ry\r\n"]), vec!["x", "y"]);
        // a `\r\n` split across reads is one ending, and its line is not a redraw
        assert_eq!(live(&[b"a\r", b"\nb"]), vec!["a", "b"]);
    }

    /// A live reader's bar, state by state through the splitter, the classifier and the judge on virtual
    /// time: each new count is progress in cuda_graphs when its state is written (not a period later, when
    /// the next state's `\r` ends it), and once the bar stops the stall comes at the limit.
    #[test]
    fn bar_states_reach_the_judge_as_progress_when_written() {
        use vigil_core::{Classifier, Event, Fact, Input, Judge, JudgeConfig, Phase, Profiles, Verdict};
        let profiles = Profiles::builtin();
        let mut c = Classifier::new(&profiles, Some("vllm"));
        let cfg = JudgeConfig { live: true, stall_enabled: true, stall_default_ms: Some(3_000), ..Default::default() };
        let mut j = Judge::new(cfg);
        let mut s = Splitter::new();
        let mut progress = Vec::new();
        let mut verdict = None;
        let mut judge = |j: &mut Judge, at: u64, input: Input, progress: &mut Vec<(u64, u64)>| {
            for e in j.feed(Fact { at: Some(at), input }) {
                match e {
                    Event::Progress { phase: Phase::CudaGraphs, progress: p, .. } => progress.push((at, p.k)),
                    Event::Verdict(r) => verdict = Some((at, r.verdict)),
                    _ => {}
                }
            }
        };
        let mut lines = Vec::new();
        s.push(
            b"INFO 02-08 08:54:10 [kv_cache_utils.py:853] Maximum concurrency for 16,384 tokens: 43.38x\n",
            &mut |l| lines.push(l),
        );
        for at in (0..20_000u64).step_by(100) {
            if at % 1000 == 0 && at <= 10_000 {
                let k = at / 1000;
                let state =
                    format!("\rCapturing CUDA graphs (mixed prefill-decode, PIECEWISE):  {k}%|| {k}/51 [00:0{k}]");
                s.push(state.as_bytes(), &mut |l| lines.push(l));
                lines.extend(s.take_redraw());
            }
            if lines.is_empty() {
                judge(&mut j, at, Input::Tick, &mut progress);
            }
            for l in lines.drain(..) {
                judge(&mut j, at, Input::Line(Box::new(c.classify(&l))), &mut progress);
            }
        }
        let want: Vec<(u64, u64)> = (0..=10).map(|k| (k * 1000, k)).collect();
        assert_eq!(progress, want);
        assert_eq!(verdict, Some((13_000, Verdict::Stalled)));
    }

    #[test]
    fn the_final_state_of_a_redrawn_line() {
        assert_eq!(final_state("plain"), "plain");
        assert_eq!(final_state("\rbar 1/3\rbar 2/3\rbar 3/3"), "bar 3/3");
        assert_eq!(final_state("bar 1/3\rbar 3/3\r"), "bar 3/3");
        assert_eq!(final_state("\r\r"), "");
    }

    #[test]
    fn bounds_long_lines_and_bad_utf8() {
        let big = vec![b'x'; MAX_LINE + 10];
        let v = split(&[&big, b"\nok\n"]);
        assert_eq!(v.len(), 2);
        assert!(v[0].ends_with("[… 10 bytes cut]"));
        assert_eq!(v[1], "ok");
        let v = split(&[b"\xff\xfe ok\n"]);
        assert!(v[0].ends_with(" ok"));
        // an overlong redraw: bounded too, and handed on once
        let v = live(&[b"\r", &big, b"\rnext\n"]);
        assert_eq!(v.len(), 2);
        assert!(v[0].ends_with("[… 10 bytes cut]") && v[0].len() < MAX_LINE + 40);
        assert_eq!(v[1], "next");
    }
}
