//! Reporters: a live status line on a TTY, plain lines otherwise, JSON lines with `--json`.
//! Every string printed passes through the redactor: secret values never reach the output.
//! A reporter writes into a writer it owns: stdout, or a buffer ([`Reporter::to_writer`]), so the human
//! output of a list of events is rendered in tests (`tests` below: snapshots of the plain text). It is
//! the last of a watch's sinks (`sinks::sink::Sink`).

use crate::sinks::events::WatchEvent;
use std::io::Write;
use std::time::{Duration, Instant};
use vigil_core::judge::fmt_ms;
use vigil_core::{Event, Judge, Report, Verdict};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Tty,
    Plain,
    Json,
    Quiet,
}

pub struct Reporter {
    pub mode: Mode,
    /// Where lines go: stdout, or a buffer in tests (a closed stdout is not an error).
    out: Box<dyn Write + Send>,
    color: bool,
    redactor: crate::sinks::redact::Redactor,
    live_len: usize,
    last_live: Option<Instant>,
    last_heartbeat: Instant,
    pub heartbeat_every: Duration,
    /// The host (and multi-node rank) this reporter speaks for: a prefix on lines, fields in JSON.
    tag: Option<(String, Option<usize>)>,
    /// People see the judge's phase changes (a watch); off for `diagnose`, whose text output is the verdict.
    judge_events_in_text: bool,
    /// Lines an evidence event already showed people (its per-process lines and where it was saved): the
    /// verdict's summary does not repeat them (the JSON verdict keeps them all).
    told_evidence: Vec<String>,
}

pub fn is_tty(fd: i32) -> bool {
    // SAFETY: isatty only inspects the descriptor.
    unsafe { libc::isatty(fd) == 1 }
}

/// A command line as a person reads it: arguments with spaces or quotes in single quotes.
fn shown_argv(argv: &[String]) -> String {
    argv.iter()
        .map(|a| {
            if a.is_empty() || a.contains(|c: char| c.is_whitespace() || "'\"$`\\".contains(c)) {
                format!("'{}'", a.replace('\'', "'\\''"))
            } else {
                a.clone()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

impl Reporter {
    pub fn new(json: bool, quiet: bool) -> Reporter {
        let mode = if json {
            Mode::Json
        } else if quiet {
            Mode::Quiet
        } else if is_tty(1) {
            Mode::Tty
        } else {
            Mode::Plain
        };
        let color = mode == Mode::Tty && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
        Reporter::to_writer(mode, color, Box::new(std::io::stdout()))
    }

    /// A reporter in `mode` that writes into `out` (`color`: ANSI colors, TTY mode only).
    pub fn to_writer(mode: Mode, color: bool, out: Box<dyn Write + Send>) -> Reporter {
        Reporter {
            mode,
            out,
            color,
            redactor: crate::sinks::redact::Redactor::default(),
            live_len: 0,
            last_live: None,
            last_heartbeat: Instant::now(),
            heartbeat_every: Duration::from_secs(60),
            tag: None,
            judge_events_in_text: true,
            told_evidence: Vec::new(),
        }
    }

    /// Offline (`diagnose`): no live line, and in text only the verdicts (JSON keeps every event).
    pub fn offline(&mut self) {
        if self.mode == Mode::Tty {
            self.mode = Mode::Plain;
        }
        self.judge_events_in_text = false;
    }

    /// Speak for one host of several: lines get a `[host]` prefix, JSON objects `host` (and `rank`),
    /// and no live status line (several would fight over one terminal line).
    pub fn tagged(&mut self, host: &str, rank: Option<usize>) {
        self.tag = Some((host.to_string(), rank));
        if self.mode == Mode::Tty {
            self.mode = Mode::Plain;
            self.color = false;
        }
    }

    /// Values that must never be printed (API keys, tokens).
    pub fn add_secret(&mut self, s: &str) {
        self.redactor.add(s);
    }

    pub fn redact(&self, s: &str) -> String {
        self.redactor.redact(s)
    }

    /// Writes `s` in one call (after clearing the live line, when one is drawn) and flushes.
    fn write_out(&mut self, s: &str) {
        let clear = if std::mem::take(&mut self.live_len) > 0 { "\r\x1b[2K" } else { "" };
        let _ = self.out.write_all(format!("{clear}{s}\n").as_bytes());
        let _ = self.out.flush();
    }

    /// Prints human text: redacted, its control characters escaped (line breaks kept).
    fn print(&mut self, s: &str) {
        let s = printable_lines(s).to_string();
        self.print_painted(&s);
    }

    /// Prints text whose foreign parts were made [`printable`] already, painted with vigil's own colours.
    fn print_painted(&mut self, s: &str) {
        // every line carries the tag: a fleet's ranks print into one stream, a verdict's lines included
        let s = match &self.tag {
            Some((h, r)) => {
                let tag = match r {
                    Some(r) => format!("[{h} rank {r}] "),
                    None => format!("[{h}] "),
                };
                s.lines().map(|l| format!("{tag}{l}")).collect::<Vec<_>>().join("\n")
            }
            None => s.to_string(),
        };
        let s = self.redact(&s);
        self.write_out(&s);
    }

    /// A plain output line (redacted; a closed stdout is not an error).
    pub fn line(&mut self, s: &str) {
        self.print(s);
    }

    /// Renders one event of the stream: a JSON line (with `t_ms` when given), or what people are shown of it.
    pub fn emit(&mut self, t_ms: Option<u64>, ev: &WatchEvent) {
        if self.wants_json() && !matches!(ev, WatchEvent::Disconnected) {
            // (`reconnected` reports the drop in JSON)
            let mut v = serde_json::to_value(ev).unwrap_or_default();
            if let (Some(t), Some(m)) = (t_ms, v.as_object_mut()) {
                m.insert("t_ms".into(), t.into());
            }
            self.json(v);
        }
        if self.mode == Mode::Json {
            return;
        }
        let t = t_ms.unwrap_or(0);
        let text = match ev {
            WatchEvent::Detected { server, line: None } => format!("server kind: {server}"),
            WatchEvent::Launched { name, pid, keeper_pid, on: Some(h), .. } => {
                format!("launched '{name}' on {h}: server pid {pid}, keeper pid {keeper_pid}")
            }
            WatchEvent::Launched { name, pid, keeper_pid, on: None, log, .. } => format!(
                "launched '{name}': server pid {pid}, keeper pid {keeper_pid}, log {}",
                log.as_deref().unwrap_or("-")
            ),
            WatchEvent::Disconnected => {
                "SSH connection lost: reconnecting (the server keeps running; probes paused)".to_string()
            }
            WatchEvent::Reconnected { to, down_ms, log_offset } => {
                format!("reconnected to {to} after {}; the log resumes at byte {log_offset}", fmt_ms(*down_ms))
            }
            WatchEvent::Stopped { how, .. } => format!("{how}: the watch ends"),
            WatchEvent::MultiNodePhase { phase, slowest_rank, slowest_host } => {
                format!("multi-node: {phase} (least advanced: rank {slowest_rank} on {slowest_host})")
            }
            WatchEvent::Repair { attempt, edit, why, changes, argv, dry, .. } => {
                let any = changes.map(|c| format!(" (--repair=any changes what you set: {c})")).unwrap_or_default();
                let cmd = shown_argv(argv);
                if *dry {
                    format!("repair (dry run) of attempt {attempt}: {edit}, {why}{any}; would run: {cmd}")
                } else {
                    format!("repair of attempt {attempt}: {edit}, {why}{any}; relaunching: {cmd}")
                }
            }
            WatchEvent::Repairs { repairs, verdict, no_repair, .. } => match (no_repair, verdict) {
                (Some(w), _) => format!("no repair: {w}"),
                (None, Some(v)) if !repairs.is_empty() => crate::sinks::history::repaired_text(*v, repairs),
                _ => return,
            },
            WatchEvent::Match { line, profile, rule, text, kind, phase, cause, .. } => {
                let what = match phase {
                    Some(p) => format!("{kind}→{p}"),
                    None => kind.clone(),
                };
                let cause = cause.map(|c| format!(" cause={c}")).unwrap_or_default();
                return self.line(&format!("L{line}: {profile}/{rule} [{}]{cause} | {text}", what.to_lowercase()));
            }
            // JSON only: the live line and the verdict show these to people
            WatchEvent::RankPhase { .. }
            | WatchEvent::Start { .. }
            | WatchEvent::Detected { .. }
            | WatchEvent::Probe { .. }
            | WatchEvent::Gpu { .. }
            | WatchEvent::Generation(_)
            | WatchEvent::TreeStopped { .. } => return,
        };
        self.note(t, &text);
    }

    /// The JSON object of an event is wanted: `--json`, or a `--listen` listener in this process (which gets
    /// every object, whatever this reporter shows people).
    fn wants_json(&self) -> bool {
        self.mode == Mode::Json || crate::sinks::listen::active()
    }

    /// One JSON object of the stream (tagged, redacted): to the listener when one serves, and on stdout
    /// with `--json`. The listener gets it first, so a client that reads the line finds the state updated.
    pub fn json(&mut self, mut v: serde_json::Value) {
        if let (Some((h, r)), Some(m)) = (&self.tag, v.as_object_mut()) {
            m.insert("host".into(), h.clone().into());
            if let Some(r) = r {
                m.insert("rank".into(), (*r).into());
            }
        }
        if let Some(m) = v.as_object_mut() {
            m.insert("v".into(), crate::sinks::events::SCHEMA.into());
        }
        let s = self.redact(&v.to_string());
        crate::sinks::listen::publish(&s);
        if self.mode != Mode::Json {
            return;
        }
        let _ = self.out.write_all(format!("{s}\n").as_bytes());
        let _ = self.out.flush();
    }

    fn paint(&self, s: &str, code: &str) -> String {
        if self.color {
            format!("\x1b[{code}m{s}\x1b[0m")
        } else {
            s.to_string()
        }
    }

    pub fn note(&mut self, t_ms: u64, msg: &str) {
        if self.wants_json() {
            self.json(serde_json::json!({"event": "note", "t_ms": t_ms, "message": msg}));
        }
        match self.mode {
            Mode::Json | Mode::Quiet => {}
            _ => self.print(&format!("[{:>7}] {msg}", fmt_t(t_ms))),
        }
    }

    /// A note with data: in JSON the `note` object with `type` and the fields; for people, the note.
    pub fn typed(&mut self, t_ms: u64, msg: &str, what: &crate::sinks::events::Typed) {
        if self.wants_json() {
            let mut v = serde_json::json!({"event": "note", "t_ms": t_ms, "message": msg});
            if let (Some(m), Ok(serde_json::Value::Object(f))) = (v.as_object_mut(), serde_json::to_value(what)) {
                m.extend(f);
            }
            self.json(v);
        }
        match self.mode {
            Mode::Json | Mode::Quiet => {}
            _ => self.print(&format!("[{:>7}] {msg}", fmt_t(t_ms))),
        }
    }

    /// `--echo`: a log line as read.
    pub fn echo(&mut self, t_ms: u64, line: &str) {
        if self.wants_json() {
            self.json(serde_json::json!({"event": "line", "t_ms": t_ms, "text": line}));
        }
        if self.mode != Mode::Json {
            self.print(&format!("  | {line}"));
        }
    }

    pub fn event(&mut self, t_ms: u64, ev: &Event) {
        if self.wants_json() && !matches!(ev, Event::Verdict(_)) {
            let mut v = serde_json::to_value(ev).unwrap_or_default();
            if let Some(m) = v.as_object_mut() {
                m.insert("t_ms".into(), t_ms.into());
            }
            self.json(v);
        }
        match (self.mode, ev) {
            (_, Event::Verdict(_)) | (Mode::Json, _) => {}
            (Mode::Quiet, _) => {}
            // An error the server went on from is said in text offline too (`vigil diagnose`).
            (_, Event::Retried { phase, error, went_on }) => {
                let s = format!("[{:>7}] retried in {phase}: `{error}`, then `{went_on}`", fmt_t(t_ms));
                self.print(&s);
            }
            _ if !self.judge_events_in_text => {}
            (_, Event::Phase { phase, from, laggards, usual_ms, eta_ms, .. }) => {
                let mut s = format!("[{:>7}] phase {} → {}", fmt_t(t_ms), from, self.paint(phase.as_str(), "1"));
                s.push_str(&crate::sinks::history::usual_text(*usual_ms, *eta_ms));
                if !laggards.is_empty() {
                    s.push_str(&format!("  (behind: {})", printable(&laggards.join(", "))));
                }
                self.print_painted(&s);
            }
            (_, Event::OnStall(s)) => self.print(&format!("[{:>7}] {}", fmt_t(t_ms), s.line())),
            (_, Event::Evidence(e)) => {
                let s = format!(
                    "[{:>7}] evidence of {} process(es) in {} ({}):",
                    fmt_t(t_ms),
                    e.procs.len(),
                    e.dir,
                    fmt_ms(e.took_ms)
                );
                self.print(&s);
                for l in e.lines() {
                    self.print(&format!("            {l}"));
                    self.told_evidence.push(l);
                }
                self.told_evidence.push(format!("evidence saved in {}", e.dir));
                let mut notes: Vec<&String> = e.notes.iter().chain(e.procs.iter().flat_map(|p| &p.notes)).collect();
                notes.sort();
                notes.dedup();
                for n in notes {
                    self.print(&format!("            note: {n}"));
                }
            }
            (_, Event::GpuEvent(g)) => {
                let s = format!("[{:>7}] GPU event: {}", fmt_t(t_ms), g.describe());
                self.print(&s);
            }
            (_, Event::Engine(e)) => {
                let by = match e.by {
                    vigil_core::tree::EngineBy::Title => "by its title",
                    vigil_core::tree::EngineBy::Gpu => "it holds GPU memory",
                };
                let s = format!(
                    "[{:>7}] engine process `{}` (pid {}): {by}",
                    fmt_t(t_ms),
                    vigil_core::tree::short_title(&e.title),
                    e.pid
                );
                self.print(&s);
            }
            (_, Event::EngineDied(d)) => {
                let s = format!("[{:>7}] {} died; the server process lives", fmt_t(t_ms), d.describe());
                self.print(&s);
            }
            (_, Event::Slow(x)) => {
                let s = crate::sinks::history::slow_text(x);
                self.print_painted(&format!("[{:>7}] {}", fmt_t(t_ms), self.paint(&printable(&s), "33")));
            }
            (_, Event::Progress { .. }) | (_, Event::ProbeNow { .. }) | (_, Event::EngineMetrics(_)) => {}
        }
    }

    /// Refreshes the live status line (TTY) or prints a heartbeat at most once a `heartbeat_every` (plain).
    pub fn live(&mut self, t_ms: u64, j: &Judge, server: Option<&str>, probe: Option<&str>) {
        let mut s = format!("{} {}", server.unwrap_or("server"), j.phase());
        if let Some(p) = j.progress() {
            s.push_str(&format!(" {}/{}", p.k, p.n));
            if let Some(d) = &p.detail {
                s.push_str(&format!(" ({d})"));
            }
        }
        if let Some(ms) = j.in_phase_ms() {
            s.push_str(&format!(" · {} in phase", fmt_ms(ms)));
        }
        s.push_str(&crate::sinks::history::live_text(j));
        s.push_str(&format!(" · {} total", fmt_ms(t_ms)));
        if let Some(p) = probe {
            s.push_str(&format!(" · probe {p}"));
        }
        match self.mode {
            Mode::Tty => {
                if self.last_live.is_some_and(|t| t.elapsed() < Duration::from_millis(200)) {
                    return;
                }
                self.last_live = Some(Instant::now());
                let s = printable(&self.redact(&s)).into_owned();
                let width = terminal_width().saturating_sub(1).max(20);
                let shown: String = s.chars().take(width).collect();
                let _ = self.out.write_all(format!("\r\x1b[2K{shown}").as_bytes());
                let _ = self.out.flush();
                self.live_len = shown.len();
            }
            Mode::Plain if self.last_heartbeat.elapsed() >= self.heartbeat_every => {
                self.last_heartbeat = Instant::now();
                self.print(&format!("[{:>7}] still {s}", fmt_t(t_ms)));
            }
            _ => {}
        }
    }

    pub fn verdict(&mut self, t_ms: u64, r: &Report, file: Option<&str>) {
        if self.wants_json() {
            let mut v = serde_json::to_value(r).unwrap_or_default();
            if let Some(m) = v.as_object_mut() {
                m.insert("event".into(), "verdict".into());
                m.insert("t_ms".into(), t_ms.into());
                if let Some(f) = file {
                    m.insert("file".into(), f.into());
                }
            }
            self.json(v);
        }
        match self.mode {
            Mode::Json => {}
            _ => {
                // what the evidence event showed is not repeated under the verdict
                let told = std::mem::take(&mut self.told_evidence);
                let shown;
                let r = if told.is_empty() {
                    r
                } else {
                    let mut c = r.clone();
                    c.evidence.retain(|l| !told.contains(l));
                    shown = c;
                    &shown
                };
                // its foreign parts are made printable inside, vigil's colours kept
                let text = summary(r, file, |s, c| self.paint(s, c));
                if self.mode == Mode::Quiet {
                    // one line only
                    let first = text.lines().next().unwrap_or("").to_string();
                    self.print_painted(&first);
                } else {
                    self.print_painted(&text);
                }
            }
        }
    }
}

/// The reporter is the last sink a watch tells: what people (or `--json` readers) see of each call.
impl crate::sinks::sink::Sink for Reporter {
    fn note(&mut self, t_ms: u64, msg: &str) {
        Reporter::note(self, t_ms, msg);
    }

    fn echo(&mut self, t_ms: u64, line: &str) {
        Reporter::echo(self, t_ms, line);
    }

    fn typed(&mut self, t_ms: u64, msg: &str, what: &crate::sinks::events::Typed) {
        Reporter::typed(self, t_ms, msg, what);
    }

    fn emit(&mut self, t_ms: Option<u64>, ev: &WatchEvent<'_>) {
        Reporter::emit(self, t_ms, ev);
    }

    fn event(&mut self, t_ms: u64, ev: &Event) {
        Reporter::event(self, t_ms, ev);
    }

    fn live(&mut self, t_ms: u64, j: &Judge, server: Option<&str>, probe: Option<&str>) {
        Reporter::live(self, t_ms, j, server, probe);
    }

    fn verdict(&mut self, t_ms: u64, r: &Report) {
        Reporter::verdict(self, t_ms, r, None);
    }
}

/// Writes one line of human output to stdout, its control characters escaped ([`printable`]); a closed
/// pipe is not an error.
pub fn out_line(s: &str) {
    out_raw(&printable(s));
}

/// Writes one line to stdout as it is (JSON, whose strings escape their control characters; vigil's own
/// colours); a closed pipe is not an error.
pub fn out_raw(s: &str) {
    let mut o = std::io::stdout().lock();
    let _ = writeln!(o, "{s}");
}

/// Text that may come from other processes (their titles and command lines, a server's log) as a terminal
/// may be given it: every control character but the tab (C0, DEL, C1) is written escaped (`\x1b`, `\x07`,
/// `\u{9b}`), so no escape sequence in it can set the terminal's title, clear the screen or move the cursor.
pub fn printable(s: &str) -> std::borrow::Cow<'_, str> {
    let bad = |c: char| c.is_control() && c != '\t';
    if !s.chars().any(bad) {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        match c {
            c if !bad(c) => out.push(c),
            c if (c as u32) < 0x80 => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
        }
    }
    std::borrow::Cow::Owned(out)
}

/// [`printable`] line by line: the line breaks of vigil's own multi-line text are kept.
fn printable_lines(s: &str) -> String {
    s.split('\n').map(printable).collect::<Vec<_>>().join("\n")
}

fn fmt_t(ms: u64) -> String {
    format!("{:.2}s", ms as f64 / 1000.0)
}

fn terminal_width() -> usize {
    // SAFETY: TIOCGWINSZ fills a winsize struct we own.
    unsafe {
        let mut ws: libc::winsize = std::mem::zeroed();
        if libc::ioctl(1, libc::TIOCGWINSZ, &mut ws) == 0 && ws.ws_col > 0 {
            return ws.ws_col as usize;
        }
    }
    100
}

/// The human summary of a verdict: one headline, then detail, hint, timeline, evidence.
pub fn summary(r: &Report, file: Option<&str>, paint: impl Fn(&str, &str) -> String) -> String {
    let word = r.verdict.as_str().to_uppercase();
    let color = match r.verdict {
        Verdict::Ready => "32",
        Verdict::Starting => "33",
        _ => "31",
    };
    let mut head = format!("vigil: {}", paint(&word, color));
    if r.verdict != Verdict::Ready {
        head.push_str(&format!(" in {}", r.phase));
    }
    if let Some(c) = r.cause {
        head.push_str(&format!(" — cause {c}"));
    }
    if let Some(ms) = r.elapsed_ms {
        head.push_str(&format!(" after {}", fmt_ms(ms)));
    }
    if let Some(s) = &r.server {
        head.push_str(&format!(" ({})", printable(s)));
    }
    if let Some(f) = file {
        head.push_str(&format!(" [{}]", printable(f)));
    }
    let mut out = vec![head];
    if let Some(d) = &r.detail {
        out.push(format!("  detail: {d}"));
    }
    if !r.laggards.is_empty() {
        out.push(format!("  behind: {}", r.laggards.join(", ")));
    }
    if let Some(h) = &r.hint {
        out.push(format!("  hint: {h}"));
    }
    let tl: Vec<String> = r
        .timeline
        .iter()
        .map(|e| match e.duration_ms {
            Some(d) => format!("{} {}", e.phase, fmt_ms(d)),
            None => format!("{} ?", e.phase),
        })
        .collect();
    out.push(format!("  timeline: {}", tl.join(" → ")));
    out.extend(crate::sinks::history::summary_lines(r));
    if !r.evidence.is_empty() {
        out.push("  evidence:".into());
        for l in &r.evidence {
            out.push(format!("    | {l}"));
        }
    } else if r.verdict != Verdict::Ready && !r.last_lines.is_empty() {
        out.push("  last lines:".into());
        for l in &r.last_lines {
            out.push(format!("    | {l}"));
        }
    }
    // every line but the painted headline holds text from the server (its log, its processes): printable
    let rest = out.split_off(1).into_iter().map(|l| printable(&l).into_owned());
    out.extend(rest);
    out.join("\n")
}

/// Snapshots of the human output: event lists rendered in plain mode (no color, fixed times) into a
/// buffer, compared with the exact text a person reads.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::sinks::sink::Sink;
    use std::sync::{Arc, Mutex};
    use vigil_core::evidence::{Evidence, ProcEvidence};
    use vigil_core::judge::TimelineEntry;
    use vigil_core::policy::{OnStall, StallAction};
    use vigil_core::{Cause, Phase};

    /// A writer the test keeps a handle on.
    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Buf {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    #[test]
    fn a_typed_note_reads_as_before_and_carries_its_data_in_json() {
        let what = crate::sinks::events::Typed::StopStep { signal: "SIGTERM".into(), pids: vec![7, 8] };
        let (mut r, b) = plain();
        r.typed(1500, "sent SIGTERM to pids [7,8]", &what);
        assert_eq!(b.text(), "[  1.50s] sent SIGTERM to pids [7,8]\n");
        let b = Buf::default();
        let mut r = Reporter::to_writer(Mode::Json, false, Box::new(b.clone()));
        r.typed(1500, "sent SIGTERM to pids [7,8]", &what);
        let v: serde_json::Value = serde_json::from_str(b.text().trim()).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"event": "note", "t_ms": 1500, "message": "sent SIGTERM to pids [7,8]",
                "type": "stop_step", "signal": "SIGTERM", "pids": [7, 8], "v": crate::sinks::events::SCHEMA})
        );
    }

    fn plain() -> (Reporter, Buf) {
        let b = Buf::default();
        (Reporter::to_writer(Mode::Plain, false, Box::new(b.clone())), b)
    }

    fn phase(from: Phase, to: Phase) -> Event {
        Event::Phase { phase: to, from, at_ms: None, laggards: vec![], usual_ms: None, eta_ms: None }
    }

    fn tl(phase: Phase, at_ms: u64, duration_ms: Option<u64>) -> TimelineEntry {
        TimelineEntry { phase, at_ms: Some(at_ms), duration_ms, median_ms: None }
    }

    fn report(verdict: Verdict, phase: Phase) -> Report {
        Report { server: Some("vllm".into()), ..Report::bare(verdict, phase) }
    }

    /// What a watch's executor does with each item, through the `Sink` trait.
    enum Told {
        Note(u64, &'static str),
        Emit(u64, WatchEvent<'static>),
        Event(u64, Event),
        Verdict(u64, Box<Report>),
    }

    fn render(r: &mut Reporter, told: Vec<Told>) {
        let s: &mut dyn Sink = r;
        for t in told {
            match t {
                Told::Note(t, m) => s.note(t, m),
                Told::Emit(t, e) => s.emit(Some(t), &e),
                Told::Event(t, e) => s.event(t, &e),
                Told::Verdict(t, rep) => s.verdict(t, &rep),
            }
        }
    }

    #[test]
    fn a_good_start() {
        let (mut r, out) = plain();
        let mut ready = report(Verdict::Ready, Phase::Serving);
        ready.elapsed_ms = Some(83_400);
        ready.timeline = vec![
            tl(Phase::Launch, 0, Some(2_100)),
            tl(Phase::Weights, 2_100, Some(41_300)),
            tl(Phase::KvCache, 43_400, Some(6_900)),
            tl(Phase::CudaGraphs, 50_300, Some(29_800)),
            tl(Phase::Http, 80_100, Some(3_300)),
            tl(Phase::Serving, 83_400, None),
        ];
        let mut weights = phase(Phase::Launch, Phase::Weights);
        if let Event::Phase { usual_ms, eta_ms, .. } = &mut weights {
            (*usual_ms, *eta_ms) = (Some(40_000), Some(81_000));
        }
        render(
            &mut r,
            vec![
                Told::Emit(
                    0,
                    WatchEvent::Start {
                        url: None,
                        log: Some("/runs/a/server.log"),
                        pid: Some(42),
                        server: None,
                        remote_run: None,
                    },
                ),
                Told::Note(0, "GPU readings: NVML"),
                Told::Emit(
                    0,
                    WatchEvent::Launched {
                        name: "a",
                        pid: 42,
                        keeper_pid: 41,
                        run_dir: Some("/runs/a".into()),
                        on: None,
                        log: Some("/runs/a/server.log".into()),
                    },
                ),
                Told::Emit(1_250, WatchEvent::Detected { server: "vllm", line: None }),
                Told::Event(2_100, weights),
                Told::Event(
                    9_000,
                    Event::Progress {
                        phase: Phase::Weights,
                        progress: vigil_core::judge::Progress { k: 3, n: 8, detail: None },
                        eta_ms: None,
                    },
                ),
                Told::Event(43_400, phase(Phase::Weights, Phase::KvCache)),
                Told::Event(50_300, phase(Phase::KvCache, Phase::CudaGraphs)),
                Told::Event(80_100, phase(Phase::CudaGraphs, Phase::Http)),
                Told::Emit(
                    83_000,
                    WatchEvent::Probe {
                        outcome: vigil_core::ProbeOutcome::Ok,
                        status: Some(200),
                        latency_ms: 3,
                        note: "",
                    },
                ),
                Told::Event(83_400, phase(Phase::Http, Phase::Serving)),
                Told::Verdict(83_400, Box::new(ready)),
            ],
        );
        let want = concat!(
            "[  0.00s] GPU readings: NVML\n",
            "[  0.00s] launched 'a': server pid 42, keeper pid 41, log /runs/a/server.log\n",
            "[  1.25s] server kind: vllm\n",
            "[  2.10s] phase launch → weights  (usually 40s, ready in ~1m21s)\n",
            "[ 43.40s] phase weights → kv_cache\n",
            "[ 50.30s] phase kv_cache → cuda_graphs\n",
            "[ 80.10s] phase cuda_graphs → http\n",
            "[ 83.40s] phase http → serving\n",
            "vigil: READY after 1m23s (vllm)\n",
            "  timeline: launch 2.1s → weights 41.3s → kv_cache 6.9s → cuda_graphs 29.8s → http 3.3s → serving ?\n",
        );
        assert_eq!(out.text(), want);
    }

    #[test]
    fn a_crash_with_its_cause_and_evidence() {
        let (mut r, out) = plain();
        let mut crashed = report(Verdict::Crashed, Phase::CudaGraphs);
        crashed.cause = Some(Cause::GpuOom);
        crashed.elapsed_ms = Some(61_700);
        crashed.hint = Some(
            "out of GPU memory during graph capture/compile: lower the memory fraction (--mem-fraction-static / \
             --gpu-memory-utilization) or the CUDA-graph max batch size"
                .into(),
        );
        crashed.detail = Some(
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 672.00 MiB.; exited with status 1".into(),
        );
        crashed.timeline = vec![
            tl(Phase::Launch, 0, Some(1_900)),
            tl(Phase::Weights, 1_900, Some(38_000)),
            tl(Phase::KvCache, 39_900, Some(7_400)),
            tl(Phase::CudaGraphs, 47_300, None),
        ];
        crashed.evidence = vec![
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 672.00 MiB.".into(),
            "GPU 0 has a total capacity of 79.19 GiB of which 200.75 MiB is free.".into(),
        ];
        // with evidence, the last lines are not shown
        crashed.last_lines = vec!["INFO last line".into()];
        // the clean-up after a crash is its own line, and names no --on-stall (a crash is no stall)
        let mut cleanup = StallAction::new(OnStall::Stop, &crashed);
        (cleanup.pids, cleanup.port, cleanup.port_free) = (vec![42, 43], Some(8000), Some(true));
        render(
            &mut r,
            vec![
                Told::Event(1_900, phase(Phase::Launch, Phase::Weights)),
                Told::Event(39_900, phase(Phase::Weights, Phase::KvCache)),
                Told::Event(47_300, phase(Phase::KvCache, Phase::CudaGraphs)),
                Told::Event(
                    61_000,
                    Event::Retried {
                        phase: Phase::CudaGraphs,
                        error: "RuntimeError: NCCL timeout".into(),
                        went_on: "Capturing batches (bs=16)".into(),
                    },
                ),
                Told::Event(61_700, Event::OnStall(cleanup)),
                Told::Verdict(61_700, Box::new(crashed)),
            ],
        );
        let want = concat!(
            "[  1.90s] phase launch → weights\n",
            "[ 39.90s] phase weights → kv_cache\n",
            "[ 47.30s] phase kv_cache → cuda_graphs\n",
            "[ 61.00s] retried in cuda_graphs: `RuntimeError: NCCL timeout`, then `Capturing batches (bs=16)`\n",
            "[ 61.70s] crashed: stopped the leftover processes: 2 process(es), none left; port 8000 free\n",
            "vigil: CRASHED in cuda_graphs — cause gpu_oom after 1m01s (vllm)\n",
            "  detail: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 672.00 MiB.; exited with status 1\n",
            "  hint: out of GPU memory during graph capture/compile: lower the memory fraction (--mem-fraction-static / \
             --gpu-memory-utilization) or the CUDA-graph max batch size\n",
            "  timeline: launch 1.9s → weights 38s → kv_cache 7.4s → cuda_graphs ?\n",
            "  evidence:\n",
            "    | torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 672.00 MiB.\n",
            "    | GPU 0 has a total capacity of 79.19 GiB of which 200.75 MiB is free.\n",
        );
        assert_eq!(out.text(), want);
    }

    #[test]
    fn a_stall_with_its_evidence_event() {
        let (mut r, out) = plain();
        let ev = Evidence {
            dir: "/runs/a/evidence-20250101-120000".into(),
            procs: vec![
                ProcEvidence {
                    pid: 42,
                    title: "python3 -m vllm.entrypoints.openai.api_server".into(),
                    state: Some('S'),
                    wchan: Some("do_epoll_wait".into()),
                    at: "`run_engine_core` in vllm/v1/engine/core.py:390".into(),
                    files: vec!["42.py-spy.txt".into()],
                    notes: vec![],
                },
                ProcEvidence {
                    pid: 43,
                    title: "VllmWorker-0".into(),
                    state: Some('R'),
                    wchan: None,
                    at: "`all_reduce` in torch/distributed/distributed_c10d.py:2501".into(),
                    files: vec!["43.py-spy.txt".into()],
                    notes: vec!["py-spy: no native frames (run as root for --native)".into()],
                },
                ProcEvidence {
                    pid: 44,
                    title: "VllmWorker-1".into(),
                    state: Some('R'),
                    wchan: None,
                    at: "`all_reduce` in torch/distributed/distributed_c10d.py:2501".into(),
                    files: vec!["44.py-spy.txt".into()],
                    notes: vec!["py-spy: no native frames (run as root for --native)".into()],
                },
            ],
            nccl_dumps: vec![],
            notes: vec![],
            took_ms: 1_840,
        };
        let mut stalled = report(Verdict::Stalled, Phase::CudaGraphs);
        stalled.elapsed_ms = Some(712_000);
        stalled.detail = Some(
            "alive 11m52s, 76.0 GiB held on each of GPUs 0-1 and flat, no log line for 10m00s, last phase cuda_graphs \
             (3/35); stall limit 10m00s"
                .into(),
        );
        stalled.hint = Some(
            "CUDA-graph capture stopped progressing: a JIT compile can be silent for minutes, a hang holds GPU memory \
             flat; the evidence shows where each rank is (`vigil dump NAME` takes it again), or disable CUDA graphs \
             to confirm"
                .into(),
        );
        stalled.timeline = vec![
            tl(Phase::Launch, 0, Some(2_000)),
            tl(Phase::Weights, 2_000, Some(90_000)),
            tl(Phase::CudaGraphs, 92_000, None),
        ];
        let mut lines = ev.lines();
        lines.push(format!("evidence saved in {}", ev.dir));
        stalled.evidence = lines;
        let mut kept = StallAction::new(OnStall::Keep, &stalled);
        kept.pids = vec![42, 43, 44];
        render(
            &mut r,
            vec![
                Told::Event(2_000, phase(Phase::Launch, Phase::Weights)),
                Told::Event(92_000, phase(Phase::Weights, Phase::CudaGraphs)),
                Told::Event(
                    700_000,
                    Event::Slow(vigil_core::history::Slow {
                        phase: Phase::CudaGraphs,
                        in_phase_ms: 608_000,
                        median_ms: 31_000,
                        startups: 4,
                        ratio: 19.61,
                    }),
                ),
                Told::Event(713_840, Event::Evidence(Box::new(ev))),
                Told::Event(713_900, Event::OnStall(kept)),
                Told::Verdict(713_900, Box::new(stalled)),
            ],
        );
        let want = concat!(
            "[  2.00s] phase launch → weights\n",
            "[ 92.00s] phase weights → cuda_graphs\n",
            "[700.00s] slow: cuda_graphs 10m08s so far, 19.6× slower than the median 31s of 4 startups\n",
            "[713.84s] evidence of 3 process(es) in /runs/a/evidence-20250101-120000 (1.8s):\n",
            "            pid 42 `python3 -m vllm.entrypoints.openai.api_server`: `run_engine_core` in vllm/v1/engine/core.py:390\n",
            "            pids 43, 44 (`VllmWorker-0` and 1 more): `all_reduce` in torch/distributed/distributed_c10d.py:2501\n",
            "            note: py-spy: no native frames (run as root for --native)\n",
            "[713.90s] stalled: kept the stuck server running (--on-stall keep): 3 process(es) left as they are\n",
            "vigil: STALLED in cuda_graphs after 11m52s (vllm)\n",
            "  detail: alive 11m52s, 76.0 GiB held on each of GPUs 0-1 and flat, no log line for 10m00s, last phase \
             cuda_graphs (3/35); stall limit 10m00s\n",
            "  hint: CUDA-graph capture stopped progressing: a JIT compile can be silent for minutes, a hang holds GPU \
             memory flat; the evidence shows where each rank is (`vigil dump NAME` takes it again), or disable CUDA \
             graphs to confirm\n",
            "  timeline: launch 2.0s → weights 1m30s → cuda_graphs ?\n",
        );
        assert_eq!(out.text(), want);
    }

    /// issue #36: text from other processes (a log line, a process title in the evidence, a verdict's last
    /// lines) cannot drive the terminal: its control characters are written escaped; vigil's own colours and
    /// line breaks stay.
    #[test]
    fn control_characters_from_outside_are_escaped() {
        let out = Buf::default();
        let mut r = Reporter::to_writer(Mode::Tty, true, Box::new(out.clone()));
        r.echo(10, "loading \x1b]0;pwned\x07\x1b[2J\u{9b}m done\tok");
        let mut crashed = report(Verdict::Crashed, Phase::Weights);
        crashed.evidence = vec!["pid 7 `\x1b[31mtitle`".into()];
        r.verdict(20, &crashed, None);
        let text = out.text();
        assert!(text.contains("  | loading \\x1b]0;pwned\\x07\\x1b[2J\\u{9b}m done\tok\n"), "{text:?}");
        assert!(text.contains("    | pid 7 `\\x1b[31mtitle`"), "{text:?}");
        assert!(text.contains("vigil: \x1b[31mCRASHED\x1b[0m in weights"), "vigil's own colour: {text:?}");
        assert!(!text.contains('\x07') && !text.contains('\u{9b}'), "{text:?}");
        assert_eq!(printable("plain text\tkept"), "plain text\tkept");
        assert_eq!(printable("a\x7fb\rc"), "a\\x7fb\\x0dc");
    }

    /// `up --repair`: the repair line says the edit, why, what `--repair=any` changes and the command run next;
    /// the chain ends with what the repairs did, or why there was none.
    #[test]
    fn a_repaired_start() {
        let (mut r, out) = plain();
        let action = vigil_core::repair::RepairAction::Add { args: vec!["--enforce-eager".into()] };
        let argv: Vec<String> = ["vllm", "serve", "/m a", "--enforce-eager"].iter().map(|s| s.to_string()).collect();
        let e = WatchEvent::Repair {
            attempt: 1,
            cause: None,
            rule: "capture-stall",
            profile: "vllm",
            edit: "+ --enforce-eager",
            action: &action,
            why: "CUDA-graph capture stalled",
            level: vigil_core::repair::Level::Any,
            changes: Some("CUDA graphs (--enforce-eager runs without them)"),
            argv: &argv,
            source: "s",
            dry: false,
        };
        r.emit(Some(5), &e);
        let words = vec!["+ --enforce-eager, CUDA-graph capture stalled".to_string()];
        r.emit(
            Some(9),
            &WatchEvent::Repairs {
                attempts: 2,
                repairs: &words,
                verdict: Some(Verdict::Ready),
                exit: 0,
                no_repair: None,
            },
        );
        r.emit(
            Some(9),
            &WatchEvent::Repairs {
                attempts: 1,
                repairs: &[],
                verdict: Some(Verdict::Crashed),
                exit: 3,
                no_repair: Some("the cause is unknown"),
            },
        );
        assert_eq!(
            out.text(),
            "[  0.01s] repair of attempt 1: + --enforce-eager, CUDA-graph capture stalled (--repair=any changes what you set: CUDA graphs (--enforce-eager runs without them)); relaunching: vllm serve '/m a' --enforce-eager\n\
             [  0.01s] ready after 1 repair: + --enforce-eager, CUDA-graph capture stalled\n\
             [  0.01s] no repair: the cause is unknown\n"
        );
    }

    /// Several hosts: each watch's reporter is tagged and shares stdout; the driver tells the least advanced
    /// rank's phase; the end is the multi-node headline and the per-host table (`tables::fleet_text`).
    #[test]
    fn a_multi_node_end() {
        use crate::sinks::events::{FleetEnd, HostLine};
        let out = Buf::default();
        let tagged = |host: &str, rank| {
            let mut r = Reporter::to_writer(Mode::Tty, true, Box::new(out.clone()));
            r.tagged(host, Some(rank));
            r
        };
        let (mut a, mut b) = (tagged("node-a", 0), tagged("node-b", 1));
        let mut driver = Reporter::to_writer(Mode::Plain, false, Box::new(out.clone()));
        a.event(900, &phase(Phase::Launch, Phase::Weights));
        b.event(1_200, &phase(Phase::Launch, Phase::Weights));
        driver.emit(
            Some(1_200),
            &WatchEvent::MultiNodePhase { phase: Phase::Weights, slowest_rank: 1, slowest_host: "node-b" },
        );
        a.event(4_000, &phase(Phase::Weights, Phase::KvCache));
        let mut crashed = report(Verdict::Crashed, Phase::Weights);
        crashed.server = Some("llama-cpp".into());
        crashed.cause = Some(Cause::ModelFile);
        crashed.elapsed_ms = Some(4_300);
        crashed.hint =
            Some("the model file is missing, truncated or not a model: check the path and the file's size".into());
        crashed.timeline = vec![tl(Phase::Launch, 0, Some(1_200)), tl(Phase::Weights, 1_200, None)];
        crashed.evidence = vec!["gguf_init_from_file_impl: failed to read tensor data".into()];
        Sink::verdict(&mut b, 4_300, &crashed);
        driver.note(4_300, "one rank failed: stopping the other ranks (a multi-node server cannot run without them)");
        a.note(6_100, "stopped: 1 process(es), none left");
        // The DETAIL column here is one line; a real watch's is its whole verdict summary (see the report).
        let host = |h: &str, rank, verdict: &str, exit, phase, detail: &str| HostLine {
            host: h.into(),
            rank: Some(rank),
            verdict: verdict.into(),
            exit,
            phase: Some(phase),
            cause: None,
            detail: detail.into(),
        };
        let end = FleetEnd {
            multi: true,
            exit: 3,
            hosts: vec![
                host("node-a", 0, "stopped", 1, Phase::KvCache, "watch stopped: another rank failed"),
                host("node-b", 1, "crashed", 3, Phase::Weights, "model_file in weights after 4.3s"),
            ],
            decider: Some(1),
            phase: Some(Phase::Weights),
            verdict: "crashed".into(),
        };
        let mut text = out.text();
        for l in crate::sinks::tables::fleet_text(&end, false) {
            text.push_str(&l);
            text.push('\n');
        }
        // TTY reporters that are tagged turn plain and lose their color; every line of a verdict carries the
        // tag (ranks print into one stream).
        let want = concat!(
            "[node-a rank 0] [  0.90s] phase launch → weights\n",
            "[node-b rank 1] [  1.20s] phase launch → weights\n",
            "[  1.20s] multi-node: weights (least advanced: rank 1 on node-b)\n",
            "[node-a rank 0] [  4.00s] phase weights → kv_cache\n",
            "[node-b rank 1] vigil: CRASHED in weights — cause model_file after 4.3s (llama-cpp)\n",
            "[node-b rank 1]   hint: the model file is missing, truncated or not a model: check the path and the file's size\n",
            "[node-b rank 1]   timeline: launch 1.2s → weights ?\n",
            "[node-b rank 1]   evidence:\n",
            "[node-b rank 1]     | gguf_init_from_file_impl: failed to read tensor data\n",
            "[  4.30s] one rank failed: stopping the other ranks (a multi-node server cannot run without them)\n",
            "[node-a rank 0] [  6.10s] stopped: 1 process(es), none left\n",
            "multi-node server: CRASHED — rank 1 on node-b: model_file in weights after 4.3s\n",
            "HOST                     RANK  VERDICT            PHASE        DETAIL\n",
            "node-a                   0     stopped            kv_cache     watch stopped: another rank failed\n",
            "node-b                   1     crashed            weights      model_file in weights after 4.3s\n",
        );
        assert_eq!(text, want);
    }

    /// The verdict of a live judge: the llama-server's loading line, the kernel's OOM record (if any), the exit.
    fn judged(oom: Option<vigil_core::KernelOom>, exit: vigil_core::ExitInfo) -> Report {
        use vigil_core::{Classifier, Fact, Input, Judge, JudgeConfig, Profiles};
        let p = Profiles::builtin();
        let cfg = JudgeConfig { live: true, ..JudgeConfig::default() };
        let mut j = Judge::new(cfg);
        let mut c = Classifier::new(&p, Some("llama-cpp"));
        let at = |ms, input| Fact { at: Some(ms), input };
        let lines = [
            "0.00.001.000 I main: build 1 (0c1e570) with cc for x86_64-linux-gnu",
            "0.00.003.985 I srv    load_model: loading model '/models/tiny.gguf'",
        ];
        for (i, l) in lines.iter().enumerate() {
            j.feed(at(i as u64 * 4, Input::Line(Box::new(c.classify(l)))));
        }
        if let Some(k) = oom {
            j.feed(at(29_790, Input::KernelOom(k)));
        }
        let ev = j.feed(at(29_800, Input::Exit(exit)));
        ev.iter()
            .find_map(|e| match e {
                Event::Verdict(r) => Some((**r).clone()),
                _ => None,
            })
            .expect("a verdict at the exit")
    }

    /// Issue #33: a SIGKILL from outside, the kernel's counters read and still.
    #[test]
    fn a_kill_from_outside() {
        let (mut r, out) = plain();
        let still = vigil_core::KernelOom {
            read: vec![
                "/proc/vmstat oom_kill 0 -> 0".into(),
                "memory.events of cgroup /user.slice/run-7.scope: oom_kill 0 -> 0".into(),
            ],
            machine: Some(false),
            cgroup: Some(false),
        };
        let v = judged(Some(still), vigil_core::ExitInfo { code: None, signal: Some(9), ours: true });
        render(&mut r, vec![Told::Verdict(29_800, Box::new(v))]);
        let want = concat!(
            "vigil: CRASHED in weights — cause killed after 29.8s\n",
            "  detail: killed by SIGKILL from outside; the kernel recorded no OOM kill of the server's cgroup \
             (/proc/vmstat oom_kill 0 -> 0; memory.events of cgroup /user.slice/run-7.scope: oom_kill 0 -> 0)\n",
            "  hint: the process was SIGKILLed from outside, not by the OOM killer (the kernel counted none): look for \
             who sent it (an operator's kill, systemd's stop timeout, the kubelet, a job scheduler's limit)\n",
            "  timeline: launch 4ms → weights 29.7s\n",
            "  last lines:\n",
            "    | 0.00.001.000 I main: build 1 (0c1e570) with cc for x86_64-linux-gnu\n",
            "    | 0.00.003.985 I srv    load_model: loading model '/models/tiny.gguf'\n",
        );
        assert_eq!(out.text(), want);
    }

    /// Issue #33: the kernel's OOM killer, with its record cited.
    #[test]
    fn an_oom_kill() {
        let (mut r, out) = plain();
        let moved = vigil_core::KernelOom {
            read: vec![
                "/proc/vmstat oom_kill 2 -> 3".into(),
                "memory.oom_control of cgroup /vigil-test: oom_kill 0 -> 1".into(),
            ],
            machine: Some(true),
            cgroup: Some(true),
        };
        let v = judged(Some(moved), vigil_core::ExitInfo { code: None, signal: Some(9), ours: true });
        render(&mut r, vec![Told::Verdict(29_800, Box::new(v))]);
        let want = concat!(
            "vigil: CRASHED in weights — cause host_oom after 29.8s\n",
            "  detail: killed by SIGKILL: the kernel's OOM killer (/proc/vmstat oom_kill 2 -> 3; memory.oom_control of \
             cgroup /vigil-test: oom_kill 0 -> 1)\n",
            "  hint: the OS OOM killer ended a process: the host ran out of RAM; check `dmesg -T | grep -i oom`\n",
            "  timeline: launch 4ms → weights 29.7s\n",
            "  last lines:\n",
            "    | 0.00.001.000 I main: build 1 (0c1e570) with cc for x86_64-linux-gnu\n",
            "    | 0.00.003.985 I srv    load_model: loading model '/models/tiny.gguf'\n",
        );
        assert_eq!(out.text(), want);
    }
}
