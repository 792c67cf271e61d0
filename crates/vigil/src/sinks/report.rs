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
}

pub fn is_tty(fd: i32) -> bool {
    // SAFETY: isatty only inspects the descriptor.
    unsafe { libc::isatty(fd) == 1 }
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

    fn print(&mut self, s: &str) {
        let s = match &self.tag {
            Some((h, Some(r))) => format!("[{h} rank {r}] {s}"),
            Some((h, None)) => format!("[{h}] {s}"),
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
        if self.mode == Mode::Json {
            if matches!(ev, WatchEvent::Disconnected) {
                return; // `reconnected` reports the drop in JSON
            }
            let mut v = serde_json::to_value(ev).unwrap_or_default();
            if let (Some(t), Some(m)) = (t_ms, v.as_object_mut()) {
                m.insert("t_ms".into(), t.into());
            }
            return self.json(v);
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
            WatchEvent::Match { line, profile, rule, text, kind, phase, cause, .. } => {
                let what = match phase {
                    Some(p) => format!("{kind}→{p}"),
                    None => kind.clone(),
                };
                let cause = cause.map(|c| format!(" cause={c}")).unwrap_or_default();
                return self.line(&format!("L{line}: {profile}/{rule} [{}]{cause} | {text}", what.to_lowercase()));
            }
            // JSON only: the live line and the verdict show these to people
            WatchEvent::Start { .. }
            | WatchEvent::Detected { .. }
            | WatchEvent::Probe { .. }
            | WatchEvent::Gpu { .. }
            | WatchEvent::Generation(_)
            | WatchEvent::TreeStopped { .. } => return,
        };
        self.note(t, &text);
    }

    pub fn json(&mut self, mut v: serde_json::Value) {
        if let (Some((h, r)), Some(m)) = (&self.tag, v.as_object_mut()) {
            m.insert("host".into(), h.clone().into());
            if let Some(r) = r {
                m.insert("rank".into(), (*r).into());
            }
        }
        let s = self.redact(&v.to_string());
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
        match self.mode {
            Mode::Json => self.json(serde_json::json!({"event": "note", "t_ms": t_ms, "message": msg})),
            Mode::Quiet => {}
            _ => self.print(&format!("[{:>7}] {msg}", fmt_t(t_ms))),
        }
    }

    /// `--echo`: a log line as read.
    pub fn echo(&mut self, t_ms: u64, line: &str) {
        match self.mode {
            Mode::Json => self.json(serde_json::json!({"event": "line", "t_ms": t_ms, "text": line})),
            _ => self.print(&format!("  | {line}")),
        }
    }

    pub fn event(&mut self, t_ms: u64, ev: &Event) {
        match (self.mode, ev) {
            (_, Event::Verdict(_)) => {}
            (Mode::Json, e) => {
                let mut v = serde_json::to_value(e).unwrap_or_default();
                if let Some(m) = v.as_object_mut() {
                    m.insert("t_ms".into(), t_ms.into());
                }
                self.json(v);
            }
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
                    s.push_str(&format!("  (behind: {})", laggards.join(", ")));
                }
                self.print(&s);
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
                }
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
                self.print(&format!("[{:>7}] {}", fmt_t(t_ms), self.paint(&s, "33")));
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
                let s = self.redact(&s);
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
        match self.mode {
            Mode::Json => {
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
            _ => {
                let text = summary(r, file, |s, c| self.paint(s, c));
                if self.mode == Mode::Quiet {
                    // one line only
                    let first = text.lines().next().unwrap_or("").to_string();
                    self.print(&first);
                } else {
                    self.print(&text);
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

/// Writes one line to stdout; a closed pipe is not an error.
pub fn out_line(s: &str) {
    let mut o = std::io::stdout().lock();
    let _ = writeln!(o, "{s}");
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
        head.push_str(&format!(" ({s})"));
    }
    if let Some(f) = file {
        head.push_str(&format!(" [{f}]"));
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
    out.join("\n")
}
