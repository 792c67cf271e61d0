//! The watch as a machine (issue #25): `Watch::on(now, Input) -> Vec<Action>`.
//!
//! Everything `wait` decides while it watches lives here: when to probe and when to send a generation,
//! the exit drain (an exit is judged once the log has caught up), which outcome ends the run, and what is
//! told to the sinks. The core's `Judge` decides phases, stalls, crashes and readiness; its `Proof` the
//! proof stage. The machine is synchronous and reads no clock: `now` is the milliseconds since the watch
//! began, passed in with every input, so every path runs on virtual time in `tests.rs`.
//!
//! The I/O loop in `wait.rs` turns futures (log lines, probe and generation answers, the process exit,
//! GPU samples, engine metrics, ticks, interrupts) into `Input`s and executes the `Action`s in order.

use crate::exit::Exit;
use crate::node::ServerEnd;
use crate::sinks::events::Typed;
use crate::sinks::notify::Notify;
use crate::sources::follow::SourceMsg;
use crate::sources::gpu::Held;
use crate::sources::probe::ProbeResult;
use crate::sources::proof::Generation;
use std::time::Duration;
use vigil_core::engine_metrics::MetricsSample;
use vigil_core::gpu_health::GpuEvent;
use vigil_core::profile::ProofSpec;
use vigil_core::proof::{Proof, Stage, Step};
use vigil_core::{
    Classifier, Event, Fact, GpuFact, Judge, Phase, ProbeOutcome, Profiles, Report, TreeSample, TreeWatch, Verdict,
};

#[cfg(test)]
mod tests;

/// An exit is judged only once the log has caught up: quiet for this long...
pub const EXIT_DRAIN_MS: u64 = 150;
/// ...or at most this long (three times this for a remote log whose size at the exit is known).
pub const EXIT_DRAIN_MAX_MS: u64 = 2000;

/// How `wait` ended: the exit code and, when a verdict was reached, its report.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub code: Exit,
    pub report: Option<Report>,
    /// Ended by SIGINT/SIGTERM (the caller stops what it launched).
    pub interrupted: bool,
}

impl Outcome {
    pub fn verdict(code: Exit, r: Report) -> Outcome {
        Outcome { code, report: Some(r), interrupted: false }
    }
}

/// What happened, as the I/O loop saw it.
#[derive(Debug)]
pub enum Input {
    /// A message of the log source (a line, a `\r` redraw, a note, the SSH link's state).
    Source(SourceMsg),
    /// The log source ended.
    LogEnded,
    /// The server exited; `log_bytes`: a remote log's size at that moment (judge once it is all here).
    Exit { end: ServerEnd, log_bytes: Option<u64> },
    /// The run's keeper died while its server lives (the line says so): the server's output no longer
    /// reaches the log, so nothing more can be judged.
    KeeperDied(String),
    /// The kernel's OOM-kill counters, read as the exit came (told before it).
    KernelOom(vigil_core::KernelOom),
    /// A health probe came back; `holder`: the port is held outside the server's tree (asked for only
    /// when `Watch::asks_holder` says so).
    Probe { result: ProbeResult, holder: Option<Holder> },
    /// A generation (the proof, or a probe while watching) came back.
    Generated(Generation),
    /// A compiler runs in the server's tree.
    Compiling(String),
    /// GPU memory held by the server's tree.
    Gpu(Held),
    /// An Xid or ECC event from NVML.
    GpuEvent(GpuEvent),
    /// The server's own metrics page (None: it did not answer).
    EngineMetrics(Option<MetricsSample>),
    /// A sample of the server's process tree.
    Tree(TreeSample),
    /// Time passes; `log_bytes`: a remote log's bytes received so far.
    Tick { log_bytes: Option<u64> },
    /// SIGINT or SIGTERM.
    Interrupt { sigterm: bool },
}

/// The process that holds a loopback target's port, when it is not in the server's tree (its command
/// line already redacted).
#[derive(Debug, Clone, PartialEq)]
pub struct Holder {
    pub port: u16,
    pub pid: i32,
    pub cmd: String,
}

/// A watch event for the reporter (the owned form of `events::WatchEvent`).
#[derive(Debug, Clone, PartialEq)]
pub enum Say {
    Detected { server: String },
    Probe { outcome: ProbeOutcome, status: Option<u16>, latency_ms: u64, note: String },
    Gpu(Held),
    Generation(Generation),
    Disconnected,
    Reconnected { to: String, down_ms: u64, log_offset: u64 },
    Stopped { how: String, exit_code: Option<i32>, signal: Option<i32>, requested: bool },
}

/// What the I/O loop does, in order.
#[derive(Debug, Clone)]
pub enum Action {
    Note(String),
    /// A note with data (`sinks::events::Typed`).
    Typed(String, Typed),
    /// `--echo`: a log line as read.
    Echo(String),
    Say(Say),
    /// A core event for the reporter.
    Event(Event),
    Notify(Notify),
    /// Multi-node: a rank's phase changed (for the driver).
    Phase {
        rank: usize,
        phase: Phase,
    },
    /// Send a health probe (never two at once).
    Probe {
        timeout: Duration,
    },
    /// Send a generation (never two at once); `read_spec`: read the speculation numbers.
    Generate {
        spec: Box<ProofSpec>,
        timeout: Duration,
        tokens: u32,
        read_spec: bool,
    },
    CancelProbe,
    CancelGenerate,
    /// A probe's latency, for the metrics.
    ProbeLatency(Duration),
    /// The live status line (from the judge), with the probe and GPU text.
    Live {
        probe: Option<String>,
    },
    /// Refresh the metrics from the judge, with this verdict.
    Metrics(Verdict),
    /// Record and print a verdict (history, metrics, verdict.json, systemd, the reporter).
    Verdict(Box<Report>),
    /// An orderly stop: the run's verdict.json gets this report (its detail says how).
    VerdictFile(Box<Report>),
    /// A verdict that ends the watch: save the evidence, apply the `--on-stall` policy, record and print
    /// it, end with its exit code.
    Conclude(Box<Report>),
    /// The watch ends.
    End(Box<Outcome>),
    /// The connection to the node is gone for good: the watch ends with an error.
    Unreachable(String),
}

/// What the watch knows before it starts (from `wait::Args` and the server's command line).
pub struct Settings {
    /// A log is followed (a file, `--log-cmd`, a remote stream).
    has_log: bool,
    /// A health URL is probed.
    has_target: bool,
    /// The server's `/health` always answers 200 (SGLang's `--node-rank >= 1`).
    dummy_health: bool,
    /// `--pid` and a target: a 200 is checked against the port's holder before ready.
    check_holder: bool,
    /// `--echo`: every log line is shown as read.
    echo: bool,
    /// Multi-node: the rank whose phases go to the driver.
    rank: Option<usize>,
    /// `--timeout`: systemd's start deadline never goes past it (the judge has its own copy).
    timeout: Duration,
    /// `--interval`: probes this often once the log says the server is up (rarer before).
    interval: Duration,
    /// `--generate-every`: a generation probe this often while watching.
    generate_every: Duration,
    /// `--generate-timeout`: no single generation outlasts the proof's budget.
    generate_timeout: Duration,
    /// `--probe-timeout` (else the profile's, learned when the kind is detected).
    probe_timeout: Option<Duration>,
    /// The server's command line (speculation asked for, once the kind is known).
    argv: Vec<String>,
}

impl Settings {
    /// From the watch's arguments (their command line already completed from `--pid`); `has_target`: a
    /// health URL is probed; `dummy_health`: its answer proves nothing.
    pub fn new(a: &crate::supervise::wait::Args, has_target: bool, dummy_health: bool) -> Settings {
        Settings {
            has_log: a.has_log(),
            has_target,
            dummy_health,
            check_holder: a.pid.is_some() && has_target,
            echo: a.echo,
            rank: a.phase_tx.as_ref().and(a.tag.as_ref().and_then(|t| t.1)),
            timeout: a.timeout,
            interval: a.interval,
            generate_every: a.generate_every,
            generate_timeout: a.generate_timeout,
            probe_timeout: a.probe_timeout,
            argv: a.argv.clone(),
        }
    }
}

/// The parts the watch is made of (built by `wait` from its settings, or by a test).
pub struct Parts<'p> {
    pub profiles: &'p Profiles,
    pub judge: Judge,
    pub classifier: Classifier<'p>,
    pub proof: Proof,
    pub tree: TreeWatch,
    pub history: Option<crate::sources::history::Recorder>,
    /// The server kind, when known before the log tells it.
    pub server: Option<String>,
    pub probe_timeout: Duration,
}

struct PendingExit {
    end: ServerEnd,
    /// The last line since the exit, and the exit itself.
    last: u64,
    first: u64,
    need: Option<u64>,
}

pub struct Watch<'p> {
    set: Settings,
    profiles: &'p Profiles,
    judge: Judge,
    classifier: Classifier<'p>,
    proof: Proof,
    tree: TreeWatch,
    history: Option<crate::sources::history::Recorder>,
    server: Option<String>,
    probe_timeout: Duration,
    next_probe: u64,
    probe_asap: bool,
    log_says_up: bool,
    probing: bool,
    generating: bool,
    next_gen: u64,
    last_probe: Option<(ProbeOutcome, String)>,
    cert_noted: bool,
    squatter_noted: bool,
    lines_open: bool,
    /// The SSH connection is down: probes say nothing about the server then, and pause.
    link_down: bool,
    last_gpu: Option<Held>,
    emetrics_live: bool,
    emetrics_last: Option<MetricsSample>,
    pending_exit: Option<PendingExit>,
    ended: bool,
}

impl<'p> Watch<'p> {
    pub fn new(set: Settings, p: Parts<'p>) -> Watch<'p> {
        let lines_open = set.has_log;
        Watch {
            set,
            profiles: p.profiles,
            judge: p.judge,
            classifier: p.classifier,
            proof: p.proof,
            tree: p.tree,
            history: p.history,
            server: p.server,
            probe_timeout: p.probe_timeout,
            next_probe: 0,
            probe_asap: false,
            log_says_up: false,
            probing: false,
            generating: false,
            next_gen: 0,
            last_probe: None,
            cert_noted: false,
            squatter_noted: false,
            lines_open,
            link_down: false,
            last_gpu: None,
            emetrics_live: false,
            emetrics_last: None,
            pending_exit: None,
            ended: false,
        }
    }

    /// What the sinks are told with: the history recorder (the first sink), the judge and the server kind.
    pub fn for_sinks(&mut self) -> (Option<&mut crate::sources::history::Recorder>, &Judge, Option<&str>) {
        (self.history.as_mut(), &self.judge, self.server.as_deref())
    }

    /// The log source is still open (the loop stops reading it once it ended).
    pub fn lines_open(&self) -> bool {
        self.lines_open
    }

    /// A probe with this outcome should be checked against the port's holder: a 200 from a process
    /// outside the server's tree (a squatter) proves nothing. Asked only before ready, where it matters.
    pub fn asks_holder(&self, outcome: ProbeOutcome) -> bool {
        self.set.check_holder && outcome == ProbeOutcome::Ok && !self.set.dummy_health && !self.proof.watching()
    }

    fn feed(&mut self, now: u64, input: vigil_core::Input) -> Vec<Event> {
        self.judge.feed(Fact { at: Some(now), input })
    }

    /// One input at `now` (ms since the watch began): what to do, in order. After an `End`, a
    /// `Conclude` or an `Unreachable`, the watch is over and answers nothing more.
    pub fn on(&mut self, now: u64, input: Input) -> Vec<Action> {
        let mut out = Vec::new();
        if self.ended {
            return out;
        }
        let mut events: Vec<Event> = Vec::new();
        let mut generated = None;
        let mut exit_now = None;
        match input {
            Input::Interrupt { sigterm } => {
                self.interrupted(sigterm, &mut out);
                return self.end(out);
            }
            Input::Source(msg) => match msg {
                SourceMsg::Line(raw) => {
                    if let Some(p) = &mut self.pending_exit {
                        p.last = now;
                    }
                    if self.set.echo {
                        out.push(Action::Echo(raw.clone()));
                    }
                    if raw.trim().is_empty() {
                        return out;
                    }
                    events = self.line(now, &raw, &mut out);
                }
                SourceMsg::Note(n, t) => out.push(Action::Typed(n, t)),
                SourceMsg::Disconnected => {
                    // in-flight probes went through the dead connection; none start until it is back
                    let was_down = std::mem::replace(&mut self.link_down, true);
                    if std::mem::take(&mut self.probing) {
                        out.push(Action::CancelProbe);
                    }
                    if std::mem::take(&mut self.generating) {
                        out.push(Action::CancelGenerate);
                    }
                    if !was_down {
                        out.push(Action::Say(Say::Disconnected));
                    }
                }
                SourceMsg::Resumed => self.link_down = false,
                SourceMsg::Reconnected { host, down_ms, offset } => {
                    // probes resume on their schedule: a drop changes nothing the server does
                    self.link_down = false;
                    out.push(Action::Say(Say::Reconnected { to: host, down_ms, log_offset: offset }));
                }
                SourceMsg::Lost(why) => {
                    out.push(Action::Unreachable(why));
                    return self.end(out);
                }
            },
            Input::KeeperDied(line) => {
                out.push(Action::Note(line));
                let report = self.judge.report().cloned();
                out.push(Action::End(Box::new(Outcome { code: Exit::KeeperDied, report, interrupted: false })));
                return self.end(out);
            }
            Input::LogEnded => {
                self.lines_open = false;
                out.push(Action::Typed("the log source ended".into(), Typed::LogSource { state: "ended", path: None }));
                events = self.feed(now, vigil_core::Input::Eof);
            }
            Input::Exit { end, log_bytes } => {
                if self.set.has_log && self.lines_open {
                    self.pending_exit = Some(PendingExit { end, last: now, first: now, need: log_bytes });
                } else {
                    exit_now = Some(end);
                }
            }
            Input::KernelOom(k) => events = self.feed(now, vigil_core::Input::KernelOom(k)),
            Input::Probe { result, holder } => events = self.probed(now, result, holder, &mut out),
            Input::Compiling(c) => events = self.feed(now, vigil_core::Input::Compiling(c)),
            Input::Gpu(h) => {
                if self.last_gpu.as_ref() != Some(&h) {
                    if h.host_pids && self.last_gpu.as_ref().is_none_or(|l| !l.host_pids) {
                        out.push(Action::Note(
                            "NVML reports pids of another pid namespace (a container?): using per-GPU totals".into(),
                        ));
                    }
                    out.push(Action::Say(Say::Gpu(h.clone())));
                }
                let fact = GpuFact { total_mib: h.total_mib, describe: crate::sources::gpu::describe(&h.per_gpu) };
                self.last_gpu = Some(h);
                events = self.feed(now, vigil_core::Input::Gpu(fact));
            }
            Input::GpuEvent(g) => {
                // the server's GPUs: those its tree holds memory on (all, before a reading)
                let ours =
                    self.last_gpu.as_ref().is_none_or(|h| h.per_gpu.is_empty() || h.per_gpu.contains_key(&g.gpu));
                if ours {
                    events = self.feed(now, vigil_core::Input::GpuEvent(g));
                }
            }
            Input::EngineMetrics(m) => {
                self.emetrics_live = m.is_some();
                if let Some(s) = m {
                    if self.emetrics_last.as_ref() != Some(&s) {
                        self.emetrics_last = Some(s.clone());
                        events.push(Event::EngineMetrics(s.clone()));
                    }
                    events.extend(self.feed(now, vigil_core::Input::Metrics(s)));
                }
            }
            Input::Tree(s) => {
                if let Some(p) = self.server.as_deref().and_then(|k| self.profiles.get(k)) {
                    self.tree.set_titles(&p.engine_titles);
                }
                for d in self.tree.observe(now, &s) {
                    events.extend(self.feed(now, vigil_core::Input::EngineDied(d)));
                }
                events.extend(self.tree.new_engines().into_iter().map(Event::Engine));
            }
            Input::Generated(g) => {
                self.generating = false;
                generated = Some(g);
            }
            Input::Tick { log_bytes } => {
                if self.drained(now, log_bytes) {
                    exit_now = self.pending_exit.take().map(|p| p.end);
                } else {
                    events = self.feed(now, vigil_core::Input::Tick);
                }
            }
        }
        if let Some(end) = exit_now {
            // An exit that was asked for (`vigil down`, before or after ready) or, after ready, a clean status 0
            // ends the watch in order: not a crash, and not a later "unhealthy" from probes of a server that is
            // gone.
            if self.judge.exit_ends_in_order(&end.exit, end.requested, self.proof.watching()) {
                self.stopped(end, &mut out);
                return self.end(out);
            }
            events.extend(self.feed(now, vigil_core::Input::Exit(end.exit)));
        }
        if let Some(h) = &mut self.history {
            h.observe(&self.judge);
        }
        let phase_changed = self.told(now, events, &mut out);
        if out.last().is_some_and(ends) {
            return self.end(out);
        }
        if let Some(g) = generated {
            self.generation(now, g, &mut out);
            if out.last().is_some_and(ends) {
                return self.end(out);
            }
        }
        // --timeout holds while proving too (issue #36): a proof that never finishes is `timeout`
        if let Step::Timeout(r) = self.proof.tick(now) {
            self.proof_timed_out(r, &mut out);
            return self.end(out);
        }
        self.schedule(now, &mut out);
        self.status(now, phase_changed, &mut out);
        out
    }

    fn end(&mut self, out: Vec<Action>) -> Vec<Action> {
        self.ended = true;
        out
    }

    fn interrupted(&mut self, sigterm: bool, out: &mut Vec<Action>) {
        let report = self.judge.report().cloned();
        if self.proof.watching() {
            // After ready, SIGTERM is an orderly stop (systemctl stop, docker stop): exit 0.
            out.push(Action::Note(
                if sigterm { "SIGTERM while watching: stopping in order" } else { "interrupted while watching" }.into(),
            ));
            out.push(Action::Notify(Notify::Stopping(if sigterm { "SIGTERM" } else { "interrupted" }.into())));
            let code = if sigterm { Exit::Ready } else { Exit::Interrupted };
            out.push(Action::End(Box::new(Outcome { code, report, interrupted: true })));
            return;
        }
        out.push(Action::Note("interrupted before a verdict".into()));
        out.push(Action::Notify(Notify::Status("interrupted before a verdict".into())));
        out.push(Action::End(Box::new(Outcome { code: Exit::Interrupted, report, interrupted: true })));
    }

    /// A log line: the server kind when it first shows, the history's and the proof's facts, the judge.
    fn line(&mut self, now: u64, raw: &str, out: &mut Vec<Action>) -> Vec<Event> {
        let line = self.classifier.classify(raw);
        if self.server.is_none() {
            if let Some(k) = self.classifier.kind() {
                let name = k.name.clone();
                let secs = k.probe_timeout_secs;
                self.judge.set_server(&name);
                self.proof.config_mut().set_speculation(self.profiles, Some(&name), &self.set.argv);
                if self.set.probe_timeout.is_none() {
                    self.probe_timeout = Duration::from_secs_f64(secs);
                }
                out.push(Action::Say(Say::Detected { server: name.clone() }));
                if let Some(h) = &mut self.history {
                    h.detected(self.profiles, &name);
                }
                self.server = Some(name);
            }
        }
        if let Some(h) = &mut self.history {
            h.line(raw, &mut self.judge);
            out.extend(std::mem::take(&mut h.notes).into_iter().map(Action::Note));
        }
        // the server's own speculation counts (vLLM's periodic log line), a fact for the proof
        self.proof.line(&line.message);
        self.feed(now, vigil_core::Input::Line(Box::new(line)))
    }

    fn probed(&mut self, now: u64, r: ProbeResult, holder: Option<Holder>, out: &mut Vec<Action>) -> Vec<Event> {
        self.probing = false;
        let key = (r.outcome, r.note.clone());
        if self.last_probe.as_ref() != Some(&key) {
            let latency_ms = r.latency.as_millis() as u64;
            out.push(Action::Say(Say::Probe {
                outcome: r.outcome,
                status: r.status,
                latency_ms,
                note: r.note.clone(),
            }));
            self.last_probe = Some(key);
        }
        if r.cert_error && !self.cert_noted {
            // Said once, whatever the output mode: retrying will not fix it unless the server's
            // certificate changes (an ingress serving a placeholder until its secret loads does).
            out.push(Action::Typed(format!("health probe: {}", r.note), Typed::CertError));
            self.cert_noted = true;
        }
        out.push(Action::ProbeLatency(r.latency));
        if let Some(h) = &holder {
            if !self.squatter_noted {
                out.push(Action::Typed(
                    format!(
                        "port {} answers, but it is held by pid {} ({}), not the server's process tree: not ready",
                        h.port, h.pid, h.cmd
                    ),
                    Typed::ProbeRefused { port: h.port, holder_pid: h.pid },
                ));
                self.squatter_noted = true;
            }
        }
        let outcome = vigil_core::proof::health_fact(r.outcome, self.set.dummy_health, holder.is_some());
        if outcome == ProbeOutcome::Ok && self.proof.watching() {
            out.push(Action::Notify(Notify::Healthy));
        }
        let events = self.feed(now, vigil_core::Input::Probe(outcome));
        let rare = self.set.interval.max(Duration::from_secs(5));
        let every = if !self.set.has_log || self.log_says_up { self.set.interval } else { rare };
        self.next_probe = now + every.as_millis() as u64;
        events
    }

    /// A pending exit is judged once every byte of a remote log is here (its size at the exit is known),
    /// else once the log is quiet; never later than the drain's maximum, at once when the log ended.
    fn drained(&self, now: u64, got: Option<u64>) -> bool {
        let Some(p) = &self.pending_exit else { return false };
        match (p.need, got) {
            (Some(n), Some(g)) => g >= n || now.saturating_sub(p.first) >= EXIT_DRAIN_MAX_MS * 3 || !self.lines_open,
            _ => {
                now.saturating_sub(p.last) >= EXIT_DRAIN_MS
                    || now.saturating_sub(p.first) >= EXIT_DRAIN_MAX_MS
                    || !self.lines_open
            }
        }
    }

    fn stopped(&mut self, end: ServerEnd, out: &mut Vec<Action>) {
        let (x, asked) = (end.exit, end.requested);
        let before = (!self.proof.watching()).then(|| self.judge.phase());
        let how = crate::node::up::stopped_how(&x, asked, before);
        let stop = Say::Stopped { how: how.clone(), exit_code: x.code, signal: x.signal, requested: asked };
        out.push(Action::Say(stop));
        out.push(Action::Notify(Notify::Stopping(how.clone())));
        let mut r = self.judge.report().cloned().unwrap_or_else(|| self.judge.final_report());
        r.detail = Some(how);
        out.push(Action::VerdictFile(Box::new(r)));
        out.push(Action::End(Box::new(Outcome { code: Exit::Ready, report: None, interrupted: false })));
    }

    /// The judge's events go to the sinks; its verdict goes to the proof stage (ready) or ends the watch.
    /// Returns whether the phase changed.
    fn told(&mut self, now: u64, events: Vec<Event>, out: &mut Vec<Action>) -> bool {
        let name = self.server.clone().unwrap_or_else(|| "server".into());
        let verdict = events.iter().find_map(|e| match e {
            Event::Verdict(r) => Some((**r).clone()),
            _ => None,
        });
        let mut phase_changed = false;
        for ev in events {
            match &ev {
                Event::ProbeNow { .. } => {
                    self.log_says_up = true;
                    self.probe_asap = true;
                }
                Event::Phase { phase, .. } => {
                    if let Some(rank) = self.set.rank {
                        out.push(Action::Phase { rank, phase: *phase });
                    }
                    phase_changed = true;
                    out.push(Action::Notify(Notify::Status(format!("{name} {phase}"))));
                }
                Event::Progress { phase, progress, .. } => {
                    out.push(Action::Notify(Notify::Status(format!("{name} {phase} {}/{}", progress.k, progress.n))));
                }
                _ => {}
            }
            out.push(Action::Event(ev));
        }
        let Some(r) = verdict else { return phase_changed };
        if r.verdict == Verdict::Ready && *self.proof.stage() == Stage::Starting {
            match self.proof.judge_ready(now, r, self.judge.degraded()) {
                Step::Prove => {
                    out.push(Action::Typed(
                        "health is good: proving generation with one real completion".into(),
                        Typed::ProofStage { stage: "proving", why: None },
                    ));
                    self.next_gen = now;
                }
                Step::Ready { report, watching } => self.ready(now, report, watching, out),
                _ => {}
            }
        } else {
            if std::mem::take(&mut self.probing) {
                out.push(Action::CancelProbe);
            }
            out.push(Action::Conclude(Box::new(r)));
        }
        phase_changed
    }

    fn ready(&mut self, at: u64, report: Box<Report>, watching: bool, out: &mut Vec<Action>) {
        let code = if report.degraded.is_some() { Exit::Degraded } else { Exit::Ready };
        out.push(Action::Verdict(report.clone()));
        if watching {
            out.push(Action::Typed(
                "watching: health and generation probes, the log, the process".into(),
                Typed::ProofStage { stage: "watching", why: None },
            ));
            self.next_gen = at + self.set.generate_every.as_millis() as u64;
        } else {
            out.push(Action::End(Box::new(Outcome::verdict(code, *report))));
        }
    }

    /// A generation came back: the proof stage decides (ready, retry, unhealthy, or a probe fact).
    fn generation(&mut self, now: u64, g: Generation, out: &mut Vec<Action>) {
        out.push(Action::Say(Say::Generation(g.clone())));
        match self.proof.generation(now, &g, self.judge.degraded()) {
            Step::Ready { report, watching } => self.ready(now, report, watching, out),
            Step::Unhealthy(r) => {
                out.push(Action::Verdict(r.clone()));
                out.push(Action::End(Box::new(Outcome::verdict(Exit::Unhealthy, *r))));
            }
            Step::Timeout(r) => self.proof_timed_out(r, out),
            Step::RetryAt { at, note } => {
                let msg = format!("generation proof failed ({note}), retrying");
                out.push(Action::Typed(msg, Typed::ProofStage { stage: "retrying", why: Some(note) }));
                self.next_gen = at.max(now);
            }
            Step::Probe(outcome) => {
                if !g.ok {
                    let why = Some(g.note.clone());
                    let msg = format!("generation probe failed: {}", g.note);
                    out.push(Action::Typed(msg, Typed::ProofStage { stage: "probe_failed", why }));
                }
                let ev = self.feed(now, vigil_core::Input::Probe(outcome));
                if let Some(Event::Verdict(r)) = ev.into_iter().find(|e| matches!(e, Event::Verdict(_))) {
                    let code = Exit::for_verdict(r.verdict);
                    out.push(Action::Verdict(r.clone()));
                    out.push(Action::End(Box::new(Outcome::verdict(code, *r))));
                    return;
                }
                self.next_gen = now + self.set.generate_every.as_millis() as u64;
            }
            Step::Prove | Step::Wait => {}
        }
    }

    /// `--timeout` passed while proving: what is in flight is cancelled and the verdict concluded.
    fn proof_timed_out(&mut self, r: Box<Report>, out: &mut Vec<Action>) {
        if std::mem::take(&mut self.probing) {
            out.push(Action::CancelProbe);
        }
        if std::mem::take(&mut self.generating) {
            out.push(Action::CancelGenerate);
        }
        out.push(Action::Conclude(r));
    }

    /// The next probe and generation; never two at once.
    fn schedule(&mut self, now: u64, out: &mut Vec<Action>) {
        if !self.set.has_target || self.link_down {
            return;
        }
        if !self.probing && (self.probe_asap || now >= self.next_probe) {
            self.probe_asap = false;
            self.probing = true;
            out.push(Action::Probe { timeout: self.probe_timeout });
        }
        // while the server's own metrics show engine progress, no generation probes (issue #17)
        let want_gen = self.proof.wants_generation() && !(self.proof.watching() && self.emetrics_live);
        if want_gen && !self.generating && now >= self.next_gen {
            self.generating = true;
            let spec = Box::new(self.profiles.proof_for(self.server.as_deref()).clone());
            // speculation numbers are read for the proof, not for every later generation probe
            let wants_spec = self.proof.config().spec.is_some();
            let read_spec = wants_spec && !self.proof.watching();
            // one attempt never outlasts the whole proof budget, nor (while proving) --timeout
            let budget = self.probe_timeout.max(Duration::from_secs(30)).min(self.set.generate_timeout);
            let timeout = if self.proof.watching() {
                budget
            } else {
                Duration::from_millis(self.proof.attempt_ms(now, budget.as_millis() as u64))
            };
            out.push(Action::Generate {
                spec,
                timeout,
                tokens: crate::sources::proof::proof_tokens(wants_spec),
                read_spec,
            });
        }
    }

    /// The live line, the metrics, and systemd's start deadline.
    fn status(&self, now: u64, phase_changed: bool, out: &mut Vec<Action>) {
        let watching = self.proof.watching();
        let gpu = self
            .last_gpu
            .as_ref()
            .filter(|h| h.total_mib > 0)
            .map(|h| format!("GPU {}", crate::sources::gpu::describe(&h.per_gpu)));
        let probe = match (&self.last_probe, gpu) {
            (Some((_, n)), Some(g)) => Some(format!("{n} · {g}")),
            (Some((_, n)), None) => Some(n.clone()),
            (None, g) => g,
        };
        if !watching {
            out.push(Action::Live { probe });
        }
        out.push(Action::Metrics(self.judge.state()));
        // systemd's start deadline follows vigil's own judgement: while starting, it is kept beyond the
        // moment vigil would call the startup stalled (or timed out), renewed on every sign of progress
        // (a log line, a phase change, a GPU memory change: the judge's `since_progress`) and, in a
        // silent phase, for as long as the phase's stall limit allows.
        if !watching {
            let to_timeout = (self.set.timeout.as_millis() as u64).saturating_sub(now);
            let left = if self.set.has_log {
                let limit = self.judge.config().stall_limit_ms(self.judge.phase());
                limit.saturating_sub(self.judge.since_progress_ms()).min(to_timeout)
            } else {
                to_timeout
            };
            out.push(Action::Notify(Notify::Extend { left: Duration::from_millis(left), now: phase_changed }));
        }
    }
}

/// Whether an action ends the watch.
pub fn ends(a: &Action) -> bool {
    matches!(a, Action::End(_) | Action::Conclude(_) | Action::Unreachable(_))
}
