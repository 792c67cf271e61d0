//! The judge: a pure state machine. Facts (classified lines, probe results, process exits, ticks) come
//! in with their time; events and one current state come out. No I/O, no clock reads: the same facts
//! at the same times give the same verdict, which is what makes it testable on virtual time.

use crate::classify::Line;
use crate::history::{Baseline, Change, Slow};
use crate::profile::RuleKind;
use crate::tree::EngineDeath;
use crate::types::{Cause, Phase, Verdict};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// Lines of an error block kept as evidence: the first few and the last many.
const BLOCK_HEAD: usize = 6;
const BLOCK_TAIL: usize = 30;
/// Lines remembered before a verdict.
const RECENT: usize = 12;

#[derive(Debug, Clone)]
pub struct JudgeConfig {
    /// Live mode: stall and timeout rules apply, ticks matter. Offline (diagnose) they never fire.
    pub live: bool,
    /// A ready marker alone is not enough: a good probe must prove readiness.
    pub require_probe: bool,
    /// Stall rules apply (live, with a log to show progress).
    pub stall_enabled: bool,
    /// Per-phase stall limits (ms); phases not named use `stall_default_ms`, then the phase default.
    pub stall_ms: BTreeMap<Phase, u64>,
    pub stall_default_ms: Option<u64>,
    /// Overall deadline (ms after the first fact).
    pub timeout_ms: Option<u64>,
    /// A terminal error block is closed after this much quiet.
    pub quiet_ms: u64,
    /// After ready: probes failing for this long give `unhealthy` (watch mode). None: never.
    pub unhealthy_after_ms: Option<u64>,
    /// After ready: requests waiting or running with the server's token counters still this long give
    /// `unhealthy` (from its own metrics). None: metrics are not judged.
    pub metrics_window_ms: Option<u64>,
    /// Earlier startups of the same key (docs/history.md): usual durations, ETA, the `slow` event,
    /// and `baseline` in the verdict. None: no history.
    pub baseline: Option<Baseline>,
    /// Phases whose entry in `stall_ms` was learned from history (the stall detail says so).
    pub stall_learned: BTreeSet<Phase>,
    /// What differs from the last good start of the key: listed in a slow or failed verdict.
    pub changes: Vec<Change>,
}

impl Default for JudgeConfig {
    fn default() -> Self {
        JudgeConfig {
            live: false,
            require_probe: false,
            stall_enabled: false,
            stall_ms: BTreeMap::new(),
            stall_default_ms: None,
            timeout_ms: None,
            quiet_ms: 1500,
            unhealthy_after_ms: None,
            metrics_window_ms: None,
            baseline: None,
            stall_learned: BTreeSet::new(),
            changes: Vec::new(),
        }
    }
}

impl JudgeConfig {
    pub fn stall_limit_ms(&self, p: Phase) -> u64 {
        self.stall_ms.get(&p).copied().or(self.stall_default_ms).unwrap_or(p.default_stall_secs() * 1000)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProbeOutcome {
    /// 2xx: the server answered as ready.
    Ok,
    /// Answered, not ready (e.g. 503 "Loading model").
    NotReady,
    /// Connection refused: nothing listens.
    Refused,
    /// No answer within the probe timeout.
    Timeout,
    /// Anything else: reset, garbage, unexpected status.
    Error,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ExitInfo {
    pub code: Option<i32>,
    pub signal: Option<i32>,
    /// We are the parent and know the status; false for `--pid` of a process we did not start.
    pub ours: bool,
}

impl ExitInfo {
    /// An exit after ready that ends the watch in order rather than as a crash: one that was asked for
    /// (`vigil down`, an operator's shutdown) or a clean status 0 of our own child.
    pub fn orderly_after_ready(&self, requested: bool) -> bool {
        requested || (self.ours && self.code == Some(0) && self.signal.is_none())
    }

    pub fn describe(&self) -> String {
        if !self.ours {
            return "exited; exit status unknown (not our child)".into();
        }
        match (self.code, self.signal) {
            (_, Some(s)) => format!("killed by {}", signal_name(s)),
            (Some(c), None) => format!("exited with status {c}"),
            (None, None) => "exited".into(),
        }
    }

    fn cause(&self) -> Cause {
        match self.signal {
            Some(11) | Some(7) => Cause::Segfault,
            Some(6) | None => Cause::Unknown,
            Some(_) => Cause::Killed,
        }
    }
}

pub fn signal_name(s: i32) -> String {
    let n = match s {
        1 => "SIGHUP",
        2 => "SIGINT",
        3 => "SIGQUIT",
        4 => "SIGILL",
        6 => "SIGABRT",
        7 => "SIGBUS",
        8 => "SIGFPE",
        9 => "SIGKILL",
        11 => "SIGSEGV",
        13 => "SIGPIPE",
        15 => "SIGTERM",
        _ => return format!("signal {s}"),
    };
    n.to_string()
}

/// GPU memory held by the server's process tree, from one sample.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuFact {
    pub total_mib: u64,
    /// Human form, e.g. "76.0 GiB held on each of GPUs 0-7".
    pub describe: String,
}

/// What the kernel recorded of OOM kills while the server ran, read by the binary when the exit came (issue #33):
/// blame on the OOM killer needs this evidence, not a server's guess.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KernelOom {
    /// Each place that was read, with what it showed: "/proc/vmstat oom_kill 3 -> 4",
    /// "memory.events of cgroup /x: oom_kill 0 -> 0". Empty: nothing could be read, so nothing is known.
    pub read: Vec<String>,
    /// The machine's count (`/proc/vmstat`) moved during the run; None: not read.
    pub machine: Option<bool>,
    /// The count of the server's own memory cgroup moved; None: not read. The kernel counts a kill in the
    /// victim's cgroup, so this one names the server's processes, where the machine's may be anyone's.
    pub cgroup: Option<bool>,
}

impl KernelOom {
    fn evidence(&self) -> String {
        self.read.join("; ")
    }

    /// The kernel OOM-killed one of the server's processes: its cgroup counted a kill; without a readable
    /// cgroup, the machine counted one and the server itself died of SIGKILL.
    fn blames(&self, sigkill: bool) -> bool {
        match self.cgroup {
            Some(c) => c,
            None => sigkill && self.machine == Some(true),
        }
    }
}

#[derive(Debug, Clone)]
pub enum Input {
    Line(Box<Line>),
    /// The kernel's OOM-kill record, told just before the exit it explains.
    KernelOom(KernelOom),
    /// A GPU sample: any change in the tree's GPU memory is progress; utilisation never counts.
    Gpu(GpuFact),
    Probe(ProbeOutcome),
    Exit(ExitInfo),
    /// An engine process of the server's tree died while the server process lives (see `tree`).
    EngineDied(EngineDeath),
    /// A reading of the server's own metrics (after ready).
    Metrics(crate::engine_metrics::MetricsSample),
    /// NVML reported a critical Xid or an uncorrectable ECC error on a GPU: every later verdict names it.
    GpuEvent(crate::gpu_health::GpuEvent),
    /// A compiler runs in the server's process tree (nvcc, ptxas, cicc, ninja, …): a JIT build is
    /// progress even while the log is silent.
    Compiling(String),
    /// Time passes.
    Tick,
    /// Offline: the text ended.
    Eof,
}

/// One timestamped fact. `at` is milliseconds on the source's clock; `None` when unknown.
#[derive(Debug, Clone)]
pub struct Fact {
    pub at: Option<u64>,
    pub input: Input,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Progress {
    pub k: u64,
    pub n: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TimelineEntry {
    pub phase: Phase,
    /// Milliseconds from the first timed fact; null when the log gave no time.
    pub at_ms: Option<u64>,
    /// Null when it cannot be known (no stamps), never invented.
    pub duration_ms: Option<u64>,
    /// The phase's median in earlier good startups, when there is history.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub median_ms: Option<u64>,
}

/// The history's summary in a verdict: how many good startups, their median total, and this one's
/// total over it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct BaselineSummary {
    pub startups: usize,
    pub total_ms_median: Option<u64>,
    pub ratio: Option<f64>,
    /// The baseline is the nearest key's: what differs.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub differs: Vec<String>,
}

/// The verdict with everything needed to explain it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Report {
    pub verdict: Verdict,
    pub phase: Phase,
    pub cause: Option<Cause>,
    pub server: Option<String>,
    pub hint: Option<String>,
    pub detail: Option<String>,
    pub evidence: Vec<String>,
    pub last_lines: Vec<String>,
    pub timeline: Vec<TimelineEntry>,
    pub laggards: Vec<String>,
    pub progress: Option<Progress>,
    pub exit: Option<ExitInfo>,
    /// Milliseconds from the first timed fact to the verdict, when known.
    pub elapsed_ms: Option<u64>,
    /// Ready, but with a feature off (e.g. "speculation off").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub degraded: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub baseline: Option<BaselineSummary>,
    /// Phases that ran past their usual duration by the margin.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub slow: Vec<Slow>,
    /// On a slow or failed start: what differs from the last good start of the key.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub changes: Vec<Change>,
}

impl Report {
    /// A verdict in a phase and nothing else yet: what a report starts from before the judge (or a test)
    /// fills in its cause, explanation and measurements.
    pub fn bare(verdict: Verdict, phase: Phase) -> Report {
        Report {
            verdict,
            phase,
            cause: None,
            server: None,
            hint: None,
            detail: None,
            evidence: vec![],
            last_lines: vec![],
            timeline: vec![],
            laggards: vec![],
            progress: None,
            exit: None,
            elapsed_ms: None,
            degraded: None,
            baseline: None,
            slow: vec![],
            changes: vec![],
        }
    }
}

#[derive(Debug, Clone, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// The server phase changed.
    Phase {
        phase: Phase,
        from: Phase,
        at_ms: Option<u64>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        laggards: Vec<String>,
        /// The new phase's median in earlier good startups.
        #[serde(skip_serializing_if = "Option::is_none")]
        usual_ms: Option<u64>,
        /// Milliseconds left until ready, from history.
        #[serde(skip_serializing_if = "Option::is_none")]
        eta_ms: Option<u64>,
    },
    Progress {
        phase: Phase,
        #[serde(flatten)]
        progress: Progress,
        /// Milliseconds left until ready: this phase's rest from k/n, the later phases from history.
        #[serde(skip_serializing_if = "Option::is_none")]
        eta_ms: Option<u64>,
    },
    /// A phase ran past its usual duration by the margin (once per phase).
    Slow(Slow),
    /// The log says the HTTP server is up, or the ready marker appeared while a probe must confirm it: probe now.
    ProbeNow { reason: String },
    /// A GPU event (Xid, uncorrectable ECC) during the watch; later verdicts name it in their detail.
    GpuEvent(crate::gpu_health::GpuEvent),
    /// A changed reading of the server's own metrics (after ready): told by the reader, judged by the judge.
    EngineMetrics(crate::engine_metrics::MetricsSample),
    /// What `--on-stall` did with a stuck server (kept it, or stopped it with proof): told by the binary.
    OnStall(crate::policy::StallAction),
    /// Where every process of the server's tree was at a verdict (or on request): told by the capture,
    /// not the judge.
    Evidence(Box<crate::evidence::Evidence>),
    /// An engine process of the server's tree was recognised (by title or GPU memory): its death while
    /// the server lives will be a verdict. Told by the tree watch, not the judge.
    Engine(crate::tree::EngineSeen),
    /// An engine process of the server's tree died while the server process lives (the verdict follows
    /// after the quiet period, unless the log or the server's exit names a better cause first).
    EngineDied(EngineDeath),
    /// An error block that would have ended the start was followed by progress in the same or an earlier
    /// phase: the server retried and went on (llama.cpp's fit step loads the model once to measure it, logs
    /// its failure, and then loads it for real). Recorded, not a crash (issue #24).
    Retried {
        /// The phase the server went on in.
        phase: Phase,
        /// The block's first line and the line that showed the server going on.
        error: String,
        went_on: String,
    },
    /// A terminal or state-changing verdict.
    Verdict(Box<Report>),
}

#[derive(Debug, Clone, Default)]
struct RankState {
    phase: Option<Phase>,
    visited: u16,
    steps: u32,
    /// When each phase was entered (ms from the first timed fact; None before any time).
    entered: Vec<(Phase, Option<u64>)>,
    /// Per phase, the time of the rank's last line in it: a rank whose last line in a phase comes long before
    /// the next phase starts was done and waiting for the others (SGLang ranks wait for the slowest one to
    /// load its weights before the KV cache is sized).
    last_line: BTreeMap<Phase, u64>,
}

impl RankState {
    fn current(&self) -> Phase {
        self.phase.unwrap_or(Phase::Launch)
    }
    fn visited(&self, p: Phase) -> bool {
        self.visited & (1 << p as u16) != 0
    }
    /// Moves to `p` (or `again` when `p` was already visited). Returns true on a change.
    fn enter(&mut self, p: Phase, again: Option<Phase>) -> bool {
        // Forward only, except that `again` may lead back to a draft phase (SGLang loads and captures
        // the draft after the target's graphs): only once the rank has moved past the phase, so a phase's
        // own closing line (`Load weight end`) or another untagged process's shard bar while the weights
        // still load is not a phantom draft phase.
        let (target, via_again) = match again {
            Some(a) if self.visited(p) && self.current() > p => (a, true),
            _ => (p, false),
        };
        let cur = self.current();
        if self.visited(target) || (target < cur && (!via_again || cur.is_server_wide())) {
            return false;
        }
        self.phase = Some(target);
        self.visited |= 1 << target as u16;
        self.steps += 1;
        true
    }
}

#[derive(Debug, Clone, Default)]
struct Block {
    head: Vec<String>,
    tail: VecDeque<String>,
    dropped: usize,
    cause: Option<Cause>,
    hint: Option<String>,
    terminal: bool,
    /// The furthest phase the block's error lines name.
    implied: Option<Phase>,
    forced: Option<Phase>,
    /// Traceback frames (the frame table, `implies` rules): the innermost startup frame's phase, whether a
    /// draft worker's frame is outside it, whether a serving frame was seen.
    frame: Option<Phase>,
    draft_frame: bool,
    serving_frame: bool,
    /// An error rule matched in the block (not only frames).
    error: bool,
    /// The rank tag of the line that opened the block (None: untagged).
    rank: Option<String>,
    last_at: u64,
    /// Holds a request-scoped failure: the block does not prove a crash when the text ends in it.
    benign: bool,
    /// The root cause in one line (issue #33): the line that named the block's cause, else its last error line
    /// that is not a frame (the exception at the bottom of a traceback); with `root_named` once a cause named it.
    root: Option<String>,
    root_named: bool,
}

impl Block {
    /// What the block's frames say (issue #24): the innermost frame the table knows, as Python prints the
    /// innermost last. Serving code under a startup frame was run by the start (the KV profiling's or the
    /// capture's dummy forward, TGI's warmup prefill), so a serving frame decides only when no startup frame
    /// is there. A draft worker's frame outside a frame of the target's phases (its init builds a model
    /// runner like the target's; its capture is the draft's) makes it the draft's phase.
    fn frame_phase(&self) -> Option<Phase> {
        match self.frame {
            Some(p) if self.draft_frame && p < Phase::DraftWeights => Some(Phase::DraftWeights),
            Some(Phase::CudaGraphs) if self.draft_frame => Some(Phase::DraftCudaGraphs),
            Some(p) => Some(p),
            None => self.serving_frame.then_some(Phase::Serving),
        }
    }

    fn push(&mut self, s: &str) {
        if self.head.len() < BLOCK_HEAD {
            self.head.push(s.to_string());
        } else {
            if self.tail.len() == BLOCK_TAIL {
                self.tail.pop_front();
                self.dropped += 1;
            }
            self.tail.push_back(s.to_string());
        }
    }
    fn lines(&self) -> Vec<String> {
        let mut v = self.head.clone();
        if self.dropped > 0 {
            v.push(format!("[… {} lines …]", self.dropped));
        }
        v.extend(self.tail.iter().cloned());
        v
    }
}

/// The state machine.
#[derive(Debug, Clone)]
pub struct Judge {
    cfg: JudgeConfig,
    server: Option<String>,
    ranks: BTreeMap<String, RankState>,
    phase: Phase,
    progress: Option<(Phase, Progress)>,
    now: u64,
    origin: Option<u64>,
    last_progress: u64,
    phase_since: Option<u64>,
    timeline: Vec<(Phase, Option<u64>)>,
    recent: VecDeque<String>,
    block: Option<Block>,
    state: Verdict,
    report: Option<Report>,
    ready_marker: bool,
    shutdown: bool,
    exit: Option<ExitInfo>,
    kernel_oom: Option<KernelOom>,
    degraded: Option<String>,
    probe_fail_since: Option<u64>,
    gpu: Option<GpuFact>,
    last_line_at: Option<u64>,
    last_probe_ok: Option<bool>,
    /// An engine death waiting for the log to catch up (its last lines may name a better cause).
    engine_death: Option<(EngineDeath, u64)>,
    metrics: crate::engine_metrics::MetricsWatch,
    /// GPU events seen, with their time (ms from the origin), at most 16.
    gpu_events: Vec<(crate::gpu_health::GpuEvent, u64)>,
    /// Phase → the longest silent stretch in it.
    gaps: BTreeMap<Phase, u64>,
    /// Phase → (first k, at, last k, at) of its progress lines.
    rates: BTreeMap<Phase, (u64, u64, u64, u64)>,
    /// Phase → GPU MiB held when it ended.
    gpu_at_end: BTreeMap<Phase, u64>,
    slowed: Vec<Slow>,
}

impl Judge {
    pub fn new(cfg: JudgeConfig) -> Judge {
        Judge {
            cfg,
            server: None,
            ranks: BTreeMap::new(),
            phase: Phase::Launch,
            progress: None,
            now: 0,
            origin: None,
            last_progress: 0,
            phase_since: None,
            timeline: vec![(Phase::Launch, None)],
            recent: VecDeque::new(),
            block: None,
            state: Verdict::Starting,
            report: None,
            ready_marker: false,
            shutdown: false,
            exit: None,
            kernel_oom: None,
            degraded: None,
            probe_fail_since: None,
            gpu: None,
            last_line_at: None,
            last_probe_ok: None,
            engine_death: None,
            metrics: Default::default(),
            gpu_events: vec![],
            gaps: BTreeMap::new(),
            rates: BTreeMap::new(),
            gpu_at_end: BTreeMap::new(),
            slowed: Vec::new(),
        }
    }

    /// Phase → the longest stretch without a progress signal in it (ms), for the history.
    pub fn gaps(&self) -> &BTreeMap<Phase, u64> {
        &self.gaps
    }

    /// Phase → progress steps per second where the log gave k/n over some time.
    pub fn rates(&self) -> BTreeMap<Phase, f64> {
        self.rates
            .iter()
            .filter(|(_, (k0, t0, k1, t1))| k1 > k0 && t1 > t0)
            .map(|(p, (k0, t0, k1, t1))| (*p, ((k1 - k0) as f64 * 1000.0 / (t1 - t0) as f64 * 100.0).round() / 100.0))
            .collect()
    }

    /// Phase → GPU memory held (MiB) when the phase ended, where GPU readings were on.
    pub fn gpu_at_end(&self) -> &BTreeMap<Phase, u64> {
        &self.gpu_at_end
    }

    /// Rank → (phase, entered at ms) in order. The untagged rank is "".
    pub fn rank_timelines(&self) -> BTreeMap<String, Vec<(Phase, Option<u64>)>> {
        self.ranks.iter().map(|(k, r)| (k.clone(), r.entered.clone())).collect()
    }

    /// The phase's median in earlier good startups.
    pub fn usual_ms(&self, p: Phase) -> Option<u64> {
        self.cfg.baseline.as_ref()?.phases.get(&p).map(|s| s.median_ms)
    }

    /// Milliseconds left until ready, from progress k/n and history; None without history.
    pub fn eta_ms(&self) -> Option<u64> {
        let b = self.cfg.baseline.as_ref()?;
        b.eta_ms(self.phase, self.in_phase_ms().unwrap_or(0), self.progress().map(|p| (p.k, p.n)))
    }

    /// The last GPU fact, if GPU readings are on.
    pub fn gpu(&self) -> Option<&GpuFact> {
        self.gpu.as_ref()
    }

    /// What the log says is off (e.g. "speculation off"), if anything.
    pub fn degraded(&self) -> Option<&str> {
        self.degraded.as_deref()
    }

    pub fn config(&self) -> &JudgeConfig {
        &self.cfg
    }

    /// History learned once the key is known (an attached run's arguments come from its log): the
    /// baseline, stall limits learned per phase (never where `keep` already sets one, i.e. `--stall`),
    /// and what changed since the last good start.
    pub fn set_history(
        &mut self,
        baseline: Option<Baseline>,
        learned: BTreeMap<Phase, u64>,
        keep: &BTreeSet<Phase>,
        changes: Vec<Change>,
    ) {
        self.cfg.baseline = baseline;
        for (p, v) in learned {
            if !keep.contains(&p) {
                self.cfg.stall_ms.insert(p, v);
                self.cfg.stall_learned.insert(p);
            }
        }
        self.cfg.changes = changes;
    }

    /// What differs from the last good start (versions arrive in the log after the start).
    pub fn set_changes(&mut self, changes: Vec<Change>) {
        self.cfg.changes = changes;
    }

    /// The server kind, once set or detected.
    pub fn server(&self) -> Option<&str> {
        self.server.as_deref()
    }

    pub fn set_server(&mut self, name: &str) {
        self.server = Some(name.to_string());
    }

    pub fn state(&self) -> Verdict {
        self.state
    }

    pub fn phase(&self) -> Phase {
        self.phase
    }

    pub fn progress(&self) -> Option<&Progress> {
        match &self.progress {
            Some((p, pr)) if *p == self.phase => Some(pr),
            _ => None,
        }
    }

    /// Milliseconds in the current phase, when known.
    pub fn in_phase_ms(&self) -> Option<u64> {
        self.phase_since.map(|s| self.now.saturating_sub(s))
    }

    pub fn elapsed_ms(&self) -> Option<u64> {
        self.origin.map(|o| self.now.saturating_sub(o))
    }

    pub fn since_progress_ms(&self) -> u64 {
        self.now.saturating_sub(self.last_progress)
    }

    pub fn report(&self) -> Option<&Report> {
        self.report.as_ref()
    }

    pub fn ready_marker_seen(&self) -> bool {
        self.ready_marker
    }

    /// Ranks behind the most advanced one.
    pub fn laggards(&self) -> Vec<String> {
        let tagged: Vec<_> = self.ranks.iter().filter(|(k, _)| !k.is_empty()).collect();
        let Some(max) = tagged.iter().map(|(_, r)| r.steps).max() else {
            return vec![];
        };
        tagged.iter().filter(|(_, r)| r.steps < max).map(|(k, r)| format!("{k} ({})", r.current())).collect()
    }

    /// Feeds one fact; returns the events it caused.
    pub fn feed(&mut self, fact: Fact) -> Vec<Event> {
        let mut ev = Vec::new();
        if let Some(at) = fact.at {
            if self.origin.is_none() {
                self.origin = Some(at);
                self.now = at;
                self.last_progress = at;
                self.phase_since = Some(at);
                self.timeline[0].1 = Some(0);
            }
            // Stamps that go backwards are tolerated: time never runs back.
            self.now = self.now.max(at);
        }
        if self.state.is_terminal() {
            if let Input::Line(l) = &fact.input {
                self.remember(&l.text);
            }
            return ev;
        }
        let (gap_phase, progress_before) = (self.phase, self.last_progress);
        match fact.input {
            Input::Line(l) => {
                self.last_line_at = Some(self.now);
                self.on_line(*l, &mut ev)
            }
            Input::Gpu(g) => {
                let changed = match &self.gpu {
                    Some(prev) => prev.total_mib != g.total_mib,
                    None => g.total_mib > 0,
                };
                if changed && self.state == Verdict::Starting {
                    self.last_progress = self.now;
                }
                self.gpu = Some(g);
            }
            Input::Compiling(_) => {
                if self.state == Verdict::Starting {
                    self.last_progress = self.now;
                }
            }
            Input::Probe(p) => self.on_probe(p, &mut ev),
            Input::Exit(x) => self.on_exit(x, &mut ev),
            Input::KernelOom(k) => self.kernel_oom = Some(k),
            Input::EngineDied(d) => {
                let open = matches!(self.state, Verdict::Starting | Verdict::Ready | Verdict::Unhealthy);
                if open && !self.shutdown && self.engine_death.is_none() {
                    ev.push(Event::EngineDied(d.clone()));
                    self.engine_death = Some((d, self.now));
                }
            }
            Input::Metrics(s) => self.on_metrics(s, &mut ev),
            Input::GpuEvent(g) => {
                if self.gpu_events.len() < 16 {
                    let at = self.rel(Some(self.now)).unwrap_or(self.now);
                    self.gpu_events.push((g.clone(), at));
                }
                ev.push(Event::GpuEvent(g));
            }
            Input::Tick => {}
            Input::Eof => self.on_eof(&mut ev),
        }
        if self.last_progress != progress_before && self.origin.is_some() {
            let gap = self.last_progress.saturating_sub(progress_before);
            let g = self.gaps.entry(gap_phase).or_insert(0);
            *g = (*g).max(gap);
        }
        self.check_timers(&mut ev);
        ev
    }

    fn remember(&mut self, s: &str) {
        if self.recent.len() == RECENT {
            self.recent.pop_front();
        }
        self.recent.push_back(s.to_string());
    }

    fn rel(&self, at: Option<u64>) -> Option<u64> {
        match (at, self.origin) {
            (Some(a), Some(o)) => Some(a.saturating_sub(o)),
            _ => None,
        }
    }

    fn on_line(&mut self, l: Line, ev: &mut Vec<Event>) {
        let kind = l.kind();
        let hit = l.hit.clone();
        // A startup line after an orderly shutdown is a new process writing the same log (a restart by
        // systemd, Docker or a script): offline, the text's verdict is the new start's.
        if !self.cfg.live
            && self.shutdown
            && self.block.is_none()
            && hit.as_ref().is_some_and(|h| h.kind == RuleKind::Phase && h.phase == Some(Phase::Launch))
        {
            let server = self.server.clone();
            *self = Judge::new(self.cfg.clone());
            self.server = server;
        }
        // 1. Error blocks: open, extend or close.
        let opens = matches!(kind, Some(RuleKind::Error) | Some(RuleKind::Implies) | Some(RuleKind::RequestError));
        if let Some(b) = &mut self.block {
            if opens || l.is_continuation() {
                b.push(&l.text);
                b.last_at = self.now;
            } else {
                let b = self.block.take().unwrap();
                // Progress in the phase the start is in, or an earlier one (not a new process's first line),
                // right after the block: the server went on, so the block was an error it retried.
                let went_on = hit.as_ref().and_then(|h| match h.kind {
                    RuleKind::Phase | RuleKind::Progress => h.phase,
                    _ => None,
                });
                // (the same rank's progress: another rank going on says nothing of the failed one)
                let retried = went_on.filter(|p| {
                    b.error
                        && !b.benign
                        && l.rank == b.rank
                        && *p != Phase::Launch
                        && *p <= self.rank_phase(l.rank.as_deref())
                        && self.state == Verdict::Starting
                });
                if let Some(phase) = retried {
                    let error = b.head.first().cloned().unwrap_or_default();
                    ev.push(Event::Retried { phase, error, went_on: l.text.clone() });
                } else if b.terminal {
                    self.crash(b, ev);
                    self.remember(&l.text);
                    return;
                }
            }
        } else if opens {
            let mut b = Block { last_at: self.now, rank: l.rank.clone(), ..Block::default() };
            b.push(&l.text);
            self.block = Some(b);
        }
        if let (Some(h), Some(b)) = (&hit, &mut self.block) {
            b.benign |= h.kind == RuleKind::RequestError;
            b.error |= h.kind == RuleKind::Error && h.profile != "generic" || h.cause.is_some() || h.terminal;
            let framework_only = h.profile == "generic" && matches!(h.rule.as_str(), "traceback" | "python-frame");
            let names_error = h.kind == RuleKind::Error && !framework_only && !l.message.contains("File \"");
            if names_error && (h.cause.is_some() || !b.root_named) {
                b.root = Some(l.message.trim().chars().take(240).collect());
                b.root_named |= h.cause.is_some();
            }
            if matches!(h.kind, RuleKind::Error | RuleKind::Implies) {
                if let Some(c) = h.cause {
                    b.cause = Some(c);
                    b.hint = h.hint.clone();
                } else if b.hint.is_none() && h.hint.is_some() && b.cause.is_none() {
                    b.hint = h.hint.clone();
                }
                b.terminal |= h.terminal;
                if let Some(p) = h.phase {
                    if h.force {
                        b.forced = Some(p);
                    } else if h.kind == RuleKind::Implies {
                        // Python prints frames outermost first: a deeper frame that implies a phase of its
                        // own decides over a forced outer one (vLLM's capture under _initialize_kv_caches).
                        b.forced = None;
                        match p {
                            Phase::Serving => b.serving_frame = true,
                            Phase::DraftWeights | Phase::DraftCudaGraphs => {
                                b.draft_frame = true;
                                b.frame = Some(p);
                            }
                            _ => b.frame = Some(p),
                        }
                    } else {
                        b.implied = Some(b.implied.map_or(p, |q| q.max(p)));
                    }
                }
            }
        }
        self.remember(&l.text);

        // 2. Phases, progress, markers.
        let mut progressed = !matches!(kind, Some(RuleKind::Noise) | Some(RuleKind::Heartbeat));
        if let Some(h) = &hit {
            match h.kind {
                RuleKind::Phase | RuleKind::Progress | RuleKind::Heartbeat | RuleKind::HttpUp => {
                    let mut entered = false;
                    if let Some(p) = h.phase {
                        if self.enter(l.rank.as_deref(), p, h.again, ev) {
                            (progressed, entered) = (true, true);
                        }
                    }
                    if h.kind == RuleKind::Progress {
                        if let (Some(k), Some(n)) = (h.k, h.n) {
                            let rank_phase = self.rank_phase(l.rank.as_deref());
                            let pr = Progress { k, n, detail: h.detail.clone() };
                            let same = self.progress.as_ref() == Some(&(rank_phase, pr.clone()));
                            // A bar redrawn at the count it had (tqdm's monitor refreshes a stuck bar; a
                            // reader hands a `\r` state on before its end and again once it grew) is not
                            // progress: only a new count is, so a capture that stops stalls on time.
                            if same && !entered {
                                progressed = false;
                            }
                            if !same {
                                self.progress = Some((rank_phase, pr.clone()));
                                let now = self.now;
                                let r = self.rates.entry(rank_phase).or_insert((k, now, k, now));
                                if k >= r.2 {
                                    (r.2, r.3) = (k, now);
                                }
                                if rank_phase == self.phase {
                                    let eta_ms = self.eta_ms();
                                    ev.push(Event::Progress { phase: rank_phase, progress: pr, eta_ms });
                                }
                            }
                        }
                    }
                    if h.kind == RuleKind::HttpUp {
                        ev.push(Event::ProbeNow { reason: "the log says the HTTP server is up".into() });
                    }
                }
                RuleKind::Ready => {
                    self.ready_marker = true;
                    if self.state == Verdict::Starting {
                        if self.cfg.require_probe {
                            ev.push(Event::ProbeNow { reason: "the log shows the ready marker".into() });
                        } else {
                            self.become_ready(ev);
                        }
                    }
                }
                RuleKind::Unhealthy => {
                    // Offline, a line that only a serving server writes (a request failing inside it)
                    // proves it was ready first, also in a fragment that lost the ready marker.
                    if !self.cfg.live && self.state == Verdict::Starting {
                        self.ready_marker = true;
                        self.become_ready(ev);
                    }
                    if matches!(self.state, Verdict::Ready) {
                        self.state = Verdict::Unhealthy;
                        let r = self.make_report(
                            Verdict::Unhealthy,
                            self.phase,
                            Some(h.cause.unwrap_or(Cause::Unknown)),
                            h.hint.clone(),
                            Some(format!("the server reported: {}", l.message.trim())),
                            vec![l.text.clone()],
                        );
                        self.emit(r, ev);
                    }
                }
                RuleKind::RequestError => {
                    // a request failed inside the server: it was serving
                    self.ready_marker = true;
                    if self.state == Verdict::Starting && !self.cfg.require_probe {
                        self.become_ready(ev);
                    }
                }
                // The server's own shutdown lines after a fatal error are its reaction to it, not a stop
                // that someone asked for.
                RuleKind::Shutdown if !self.block.as_ref().is_some_and(|b| b.terminal) => self.shutdown = true,
                RuleKind::Degraded => {
                    self.degraded = Some(h.hint.clone().unwrap_or_else(|| h.rule.clone()));
                }
                _ => {}
            }
        }
        self.mark_rank_line(l.rank.as_deref());
        if progressed {
            self.last_progress = self.now;
        }
    }

    /// Keeps the time of a tagged rank's line in its current phase (after the line's own phase change).
    fn mark_rank_line(&mut self, rank: Option<&str>) {
        let (Some(rank), Some(at)) = (rank, self.rel(self.origin.map(|_| self.now))) else { return };
        if let Some(r) = self.ranks.get_mut(rank) {
            let p = r.current();
            r.last_line.insert(p, at);
        }
    }

    /// Per tagged rank, the time of its last line in each phase it reached.
    pub fn rank_last_lines(&self) -> BTreeMap<String, BTreeMap<Phase, u64>> {
        self.ranks.iter().filter(|(k, _)| !k.is_empty()).map(|(k, r)| (k.clone(), r.last_line.clone())).collect()
    }

    fn rank_phase(&self, rank: Option<&str>) -> Phase {
        self.ranks.get(rank.unwrap_or("")).map_or(Phase::Launch, |r| r.current())
    }

    /// Enters a phase for a rank (or, for server-wide phases, for every rank). True when something changed.
    fn enter(&mut self, rank: Option<&str>, p: Phase, again: Option<Phase>, ev: &mut Vec<Event>) -> bool {
        let at = self.rel(self.origin.map(|_| self.now));
        let stamp = |r: &mut RankState| {
            let moved = r.enter(p, again);
            if moved {
                r.entered.push((r.current(), at));
            }
            moved
        };
        let changed = if p.is_server_wide() {
            self.ranks.entry(String::new()).or_default();
            let mut any = false;
            for r in self.ranks.values_mut() {
                any |= stamp(r);
            }
            any
        } else {
            stamp(self.ranks.entry(rank.unwrap_or("").to_string()).or_default())
        };
        if changed {
            self.recompute_phase(ev);
        }
        changed
    }

    fn recompute_phase(&mut self, ev: &mut Vec<Event>) {
        let tagged = self.ranks.iter().any(|(k, _)| !k.is_empty());
        let new = self
            .ranks
            .iter()
            .filter(|(k, _)| !tagged || !k.is_empty())
            .min_by_key(|(_, r)| (r.steps, r.current()))
            .map_or(Phase::Launch, |(_, r)| r.current());
        if new != self.phase {
            let from = self.phase;
            if let Some(g) = &self.gpu {
                self.gpu_at_end.insert(from, g.total_mib);
            }
            self.phase = new;
            self.phase_since = Some(self.now);
            let at = self.rel(self.origin.map(|_| self.now));
            self.timeline.push((new, at));
            let (usual_ms, eta_ms) = (self.usual_ms(new), self.eta_ms());
            ev.push(Event::Phase { phase: new, from, at_ms: at, laggards: self.laggards(), usual_ms, eta_ms });
        }
    }

    fn become_ready(&mut self, ev: &mut Vec<Event>) {
        self.enter(None, Phase::Serving, None, ev);
        self.state = Verdict::Ready;
        let r = self.make_report(Verdict::Ready, Phase::Serving, None, None, None, vec![]);
        self.emit(r, ev);
    }

    fn on_probe(&mut self, p: ProbeOutcome, ev: &mut Vec<Event>) {
        self.last_probe_ok = Some(p == ProbeOutcome::Ok);
        if p == ProbeOutcome::Ok && self.state == Verdict::Starting {
            self.become_ready(ev);
        }
        if self.state == Verdict::Ready {
            if p == ProbeOutcome::Ok {
                self.probe_fail_since = None;
            } else if self.probe_fail_since.is_none() {
                self.probe_fail_since = Some(self.now);
            }
        }
    }

    /// Whether an exit after ready ends the watch in order: asked for (`requested`: `vigil down`; or the
    /// server's own shutdown lines), or a clean status 0 of our child with no fatal block open and no engine
    /// death seen. A clean status after a fatal block is the server ending itself on that failure.
    pub fn exit_is_orderly(&self, x: &ExitInfo, requested: bool) -> bool {
        if requested {
            return true;
        }
        let fatal = self.block.as_ref().is_some_and(|b| b.terminal) || self.engine_death.is_some();
        !fatal && x.orderly_after_ready(self.shutdown)
    }

    /// Whether an exit ends the watch in order rather than as a verdict: a stop that was asked for
    /// (`requested`: `vigil down`) at any stage (before ready it calls the start off: no crash, issue #36), or,
    /// after ready (`ready`), an exit [`Judge::exit_is_orderly`] calls orderly.
    pub fn exit_ends_in_order(&self, x: &ExitInfo, requested: bool, ready: bool) -> bool {
        requested || (ready && self.exit_is_orderly(x, false))
    }

    fn on_exit(&mut self, x: ExitInfo, ev: &mut Vec<Event>) {
        self.exit = Some(x.clone());
        // judged before the open block is taken: a clean status after a fatal block is no orderly stop
        // (vLLM's API server exits 0 after EngineDeadError: captured vllm-0.26.0-e)
        let orderly = self.exit_is_orderly(&x, false);
        let block = self.block.take();
        let crash = match self.state {
            Verdict::Starting => true,
            Verdict::Ready | Verdict::Unhealthy => !orderly,
            _ => false,
        };
        if crash {
            self.crash_with_exit(block.unwrap_or_default(), x, ev);
        }
    }

    fn crash_with_exit(&mut self, mut b: Block, x: ExitInfo, ev: &mut Vec<Event>) {
        if b.cause.is_none() {
            let c = x.cause();
            if c != Cause::Unknown {
                b.cause = Some(c);
            }
        }
        let mut detail = x.describe();
        // Blame on the OOM killer needs the kernel's record (issue #33): a SIGKILL of the server with an OOM kill
        // counted during the run, or one counted in the server's own cgroup however the server then ended
        // (SGLang's root exits on its own after a child was killed). A SIGKILL with the counters read and still
        // is someone else's.
        let sigkill = x.ours && x.signal == Some(9);
        if let Some(k) = self.kernel_oom.clone().filter(|k| !k.read.is_empty()) {
            let soft = matches!(b.cause, None | Some(Cause::Killed | Cause::EngineDead | Cause::Unknown));
            if k.blames(sigkill) && soft {
                b.cause = Some(Cause::HostOom);
                b.hint = None;
                detail = format!("{detail}: the kernel's OOM killer ({})", k.evidence());
            } else if sigkill && !k.blames(sigkill) {
                let whose = if k.cgroup.is_some() { " of the server's cgroup" } else { "" };
                detail = format!("{detail} from outside; the kernel recorded no OOM kill{whose} ({})", k.evidence());
                if b.cause == Some(Cause::Killed) {
                    b.hint = Some(
                        "the process was SIGKILLed from outside, not by the OOM killer (the kernel counted none): look \
                         for who sent it (an operator's kill, systemd's stop timeout, the kubelet, a job scheduler's \
                         limit)"
                            .into(),
                    );
                }
            }
        }
        let detail = detail + &self.engine_note();
        self.crash_detail(b, Some(detail), ev);
    }

    /// The end of the text. A terminal block is a crash. Offline, a text that ends inside an error block
    /// (a traceback, an exception, an error record with nothing normal after it) also proves one: the
    /// process printed its failure and nothing shows it went on; unless the block is request-scoped
    /// (an HTTP handler's traceback), which a serving process survives, or requests were already failing
    /// while the server lived (unhealthy). Live, the process decides
    /// (its exit judges the open block), so a live text end changes nothing.
    fn on_eof(&mut self, ev: &mut Vec<Event>) {
        if let Some(b) = self.block.take() {
            // once requests fail while the server lives (unhealthy), a later non-terminal block is one more
            // failing request, not an end
            let ends = !self.cfg.live && !b.benign && matches!(self.state, Verdict::Starting | Verdict::Ready);
            if b.terminal || ends {
                self.crash(b, ev);
            }
        }
    }

    fn crash(&mut self, b: Block, ev: &mut Vec<Event>) {
        let note = self.engine_note();
        let detail = (!note.is_empty()).then(|| note.trim_start_matches("; ").to_string());
        self.crash_detail(b, detail, ev);
    }

    /// "; engine process `x` (pid n) died at 12.0s" when an engine death is known, else empty.
    fn engine_note(&self) -> String {
        match &self.engine_death {
            Some((d, at)) => format!("; {} died at {}", d.describe(), fmt_ms(self.rel(Some(*at)).unwrap_or(*at))),
            None => String::new(),
        }
    }

    /// After ready, the server's own counters: requests waiting or running with no token counted for the
    /// window is a stuck engine (`unhealthy`), without a generation probe.
    fn on_metrics(&mut self, s: crate::engine_metrics::MetricsSample, ev: &mut Vec<Event>) {
        let Some(window) = self.cfg.metrics_window_ms else { return };
        if self.state != Verdict::Ready {
            return;
        }
        if let Some(st) = self.metrics.observe(self.now, &s, window) {
            self.state = Verdict::Unhealthy;
            let d = format!(
                "the server's metrics: {} request(s) waiting, {} running, token counters still at {} for {} (window {})",
                st.waiting,
                st.running,
                st.tokens,
                fmt_ms(st.still_ms),
                fmt_ms(window)
            );
            let hint = "the engine stopped generating while requests wait: a hung forward pass or collective; the evidence shows where each process is".to_string();
            let r = self.make_report(Verdict::Unhealthy, Phase::Serving, None, Some(hint), Some(d), vec![]);
            self.emit(r, ev);
        }
    }

    /// An engine died and the log named nothing better within the quiet period: before ready the start
    /// failed (`crashed`), after ready the server answers without an engine (`unhealthy`); both `engine_dead`.
    fn judge_engine_death(&mut self, ev: &mut Vec<Event>) {
        let Some((d, at)) = self.engine_death.clone() else { return };
        if self.now.saturating_sub(at) < self.cfg.quiet_ms || self.shutdown {
            return;
        }
        let mut detail = format!("{} died while the server process lives", d.describe());
        // an engine that vanished without a word, with the kernel's OOM kill counted for the server's cgroup (or,
        // none readable, the machine's): the OOM killer's victim (issue #33)
        let oom = self.kernel_oom.clone().filter(|k| k.blames(true));
        if let Some(k) = &oom {
            detail = format!("{detail}: the kernel's OOM killer ({})", k.evidence());
        }
        match self.state {
            Verdict::Starting => {
                let mut b = self.block.take().unwrap_or_default();
                if b.cause.is_none() || (oom.is_some() && b.cause == Some(Cause::Unknown)) {
                    b.cause = Some(if oom.is_some() { Cause::HostOom } else { Cause::EngineDead });
                    b.hint = None;
                }
                self.crash_detail(b, Some(detail), ev);
            }
            Verdict::Ready | Verdict::Unhealthy => {
                self.state = Verdict::Unhealthy;
                let lines = self.block.take().map(|b| b.lines()).unwrap_or_default();
                let hint = hint_for(Cause::EngineDead, Phase::Serving).to_string();
                let r = self.make_report(
                    Verdict::Unhealthy,
                    Phase::Serving,
                    Some(Cause::EngineDead),
                    Some(hint),
                    Some(detail),
                    lines,
                );
                self.emit(r, ev);
                // said once
                self.engine_death = None;
            }
            _ => {}
        }
    }

    fn crash_detail(&mut self, b: Block, detail: Option<String>, ev: &mut Vec<Event>) {
        // The block's frames may prove the process got further than its last phase line (vLLM's
        // capture_model under `_initialize_kv_caches`, with no capture line printed yet): the furthest of the two.
        // Except serving: the batch loop's frames also run the warmup request, so once the HTTP side is up
        // they do not prove a request beyond it (corpus sglang-gptqmodel2537).
        // A start-up frame says where the failing process was, which the last phase line of the whole log
        // may not (vLLM prints its compile lines from inside the KV-cache profiling): the frames decide then.
        let frames = b.frame_phase();
        let phase = b.forced.unwrap_or(match (self.phase, b.implied, frames) {
            (_, e, Some(f)) if f != Phase::Serving => e.map_or(f, |e| e.max(f)),
            (p, e, f) => match e.max(f) {
                Some(Phase::Serving) if p >= Phase::Http => p,
                Some(q) => p.max(q),
                None => p,
            },
        });
        let cause = b.cause.unwrap_or(Cause::Unknown);
        let hint = b.hint.clone().or_else(|| Some(hint_for(cause, phase).to_string()));
        // the detail leads with the root cause the text names, then how the process ended
        let detail = match (b.root.clone(), detail) {
            (Some(r), Some(d)) => Some(format!("{r}; {d}")),
            (r, d) => r.or(d),
        };
        self.state = Verdict::Crashed;
        let r = self.make_report(Verdict::Crashed, phase, Some(cause), hint, detail, b.lines());
        self.emit(r, ev);
    }

    fn check_timers(&mut self, ev: &mut Vec<Event>) {
        if !self.cfg.live {
            return;
        }
        // A terminal block closes after a quiet period: the server may stay alive after its fatal line.
        if let Some(b) = &self.block {
            if b.terminal && self.now.saturating_sub(b.last_at) >= self.cfg.quiet_ms {
                let b = self.block.take().unwrap();
                self.crash(b, ev);
                return;
            }
        }
        if self.engine_death.is_some() {
            self.judge_engine_death(ev);
            if self.state.is_terminal() || self.state == Verdict::Unhealthy {
                return;
            }
        }
        if self.state == Verdict::Ready {
            if let (Some(limit), Some(since)) = (self.cfg.unhealthy_after_ms, self.probe_fail_since) {
                let failing = self.now.saturating_sub(since);
                if failing >= limit {
                    self.state = Verdict::Unhealthy;
                    let d = format!(
                        "health and generation probes failing for {} (limit {})",
                        fmt_ms(failing),
                        fmt_ms(limit)
                    );
                    let hint = "the process lives but does not answer: a hung engine or a stopped process; the evidence shows where each process is (`vigil dump NAME` takes it again), or restart it".to_string();
                    let r = self.make_report(Verdict::Unhealthy, Phase::Serving, None, Some(hint), Some(d), vec![]);
                    self.emit(r, ev);
                }
            }
            return;
        }
        if self.state != Verdict::Starting || self.origin.is_none() {
            return;
        }
        if let Some(b) = &self.cfg.baseline {
            if let Some(s) = crate::history::slow(b, self.phase, self.in_phase_ms().unwrap_or(0)) {
                if !self.slowed.iter().any(|x| x.phase == s.phase) {
                    self.slowed.push(s.clone());
                    ev.push(Event::Slow(s));
                }
            }
        }
        if self.cfg.stall_enabled {
            let limit = self.cfg.stall_limit_ms(self.phase);
            let quiet = self.since_progress_ms();
            if quiet >= limit {
                self.state = Verdict::Stalled;
                let progress = self.progress().map(|p| match &p.detail {
                    Some(x) => format!(" ({x}, {}/{})", p.k, p.n),
                    None => format!(" ({}/{})", p.k, p.n),
                });
                let mut d = match &self.gpu {
                    // The zombie: alive, GPU memory held and flat, no log progress.
                    Some(g) if g.total_mib > 0 => {
                        let silent = match self.last_line_at {
                            Some(t) => format!("no log line for {}", fmt_ms(self.now.saturating_sub(t))),
                            None => "no log line at all".into(),
                        };
                        format!(
                            "alive {}, {} and flat, {silent}, last phase {}{}",
                            fmt_ms(self.elapsed_ms().unwrap_or(0)),
                            g.describe,
                            self.phase,
                            progress.clone().unwrap_or_default()
                        )
                    }
                    _ => format!("no progress for {} in {}{}", fmt_ms(quiet), self.phase, progress.unwrap_or_default()),
                };
                if self.last_probe_ok == Some(false) {
                    d.push_str("; health not answering");
                }
                d.push_str(&format!("; stall limit {}", fmt_ms(limit)));
                if self.cfg.stall_learned.contains(&self.phase) {
                    d.push_str(&format!(
                        " (learned: {}× the longest silent gap of this phase in good startups, at least the floor)",
                        crate::history::STALL_MULTIPLE
                    ));
                }
                let hint = stall_hint(self.phase).to_string();
                let r = self.make_report(Verdict::Stalled, self.phase, None, Some(hint), Some(d), vec![]);
                self.emit(r, ev);
                return;
            }
        }
        if let (Some(t), Some(e)) = (self.cfg.timeout_ms, self.elapsed_ms()) {
            if e >= t {
                self.state = Verdict::Timeout;
                let d = format!(
                    "--timeout {} passed while still progressing in {} (last progress {} ago)",
                    fmt_ms(t),
                    self.phase,
                    fmt_ms(self.since_progress_ms())
                );
                let r = self.make_report(
                    Verdict::Timeout,
                    self.phase,
                    None,
                    Some("the server is still making progress: raise --timeout if this startup is expected to take longer".into()),
                    Some(d),
                    vec![],
                );
                self.emit(r, ev);
            }
        }
    }

    fn make_report(
        &self,
        verdict: Verdict,
        phase: Phase,
        cause: Option<Cause>,
        hint: Option<String>,
        detail: Option<String>,
        evidence: Vec<String>,
    ) -> Report {
        let mut timeline: Vec<TimelineEntry> = Vec::new();
        let end = self.rel(self.origin.map(|_| self.now));
        for (i, (p, at)) in self.timeline.iter().enumerate() {
            let next = self.timeline.get(i + 1).map(|x| x.1).unwrap_or(end);
            let duration_ms = match (at, next) {
                (Some(a), Some(b)) => Some(b.saturating_sub(*a)),
                _ => None,
            };
            timeline.push(TimelineEntry { phase: *p, at_ms: *at, duration_ms, median_ms: self.usual_ms(*p) });
        }
        // a GPU that reported an Xid or an uncorrectable ECC error is named in every verdict but ready
        let detail = match (verdict, self.gpu_events.is_empty()) {
            (Verdict::Ready, _) | (_, true) => detail,
            _ => {
                let g: Vec<String> =
                    self.gpu_events.iter().map(|(e, at)| format!("{} at {}", e.describe(), fmt_ms(*at))).collect();
                let g = format!("GPU events: {}", g.join(", "));
                Some(match detail {
                    Some(d) => format!("{d}; {g}"),
                    None => g,
                })
            }
        };
        let baseline = self.cfg.baseline.as_ref().map(|b| BaselineSummary {
            startups: b.startups,
            total_ms_median: b.total_ms_median,
            ratio: match (end, b.total_ms_median) {
                (Some(e), Some(m)) => Some(crate::history::ratio(e, m)),
                _ => None,
            },
            differs: b.differs.clone(),
        });
        let changes =
            if verdict != Verdict::Ready || !self.slowed.is_empty() { self.cfg.changes.clone() } else { vec![] };
        Report {
            verdict,
            phase,
            cause,
            server: self.server.clone(),
            hint,
            detail,
            evidence,
            last_lines: self.recent.iter().cloned().collect(),
            timeline,
            laggards: self.laggards(),
            progress: self.progress().cloned(),
            exit: self.exit.clone(),
            elapsed_ms: end,
            degraded: self.degraded.clone(),
            baseline,
            slow: self.slowed.clone(),
            changes,
        }
    }

    fn emit(&mut self, r: Report, ev: &mut Vec<Event>) {
        self.report = Some(r.clone());
        ev.push(Event::Verdict(Box::new(r)));
    }

    /// The offline verdict at the end of the text (`starting` when nothing decided it).
    pub fn final_report(&self) -> Report {
        match &self.report {
            Some(r) if r.verdict == self.state => {
                let mut r = r.clone();
                r.last_lines = self.recent.iter().cloned().collect();
                r
            }
            _ => self.make_report(self.state, self.phase, None, None, None, vec![]),
        }
    }
}

/// Advice for a cause where the matching rule gave none: the same cause needs different advice by phase.
pub fn hint_for(cause: Cause, phase: Phase) -> &'static str {
    use Phase::*;
    match (cause, phase) {
        (Cause::GpuOom, Weights | DraftWeights | Launch | DistInit) => {
            "the weights do not fit in GPU memory: use more tensor parallelism (--tp) or a quantized model"
        }
        (Cause::GpuOom, CudaGraphs | DraftCudaGraphs | Compile) => {
            "out of GPU memory during graph capture/compile: lower the memory fraction (--mem-fraction-static / --gpu-memory-utilization) or the CUDA-graph max batch size"
        }
        (Cause::GpuOom, KvCache) => {
            "too little memory left for the KV cache: raise the memory fraction or lower the context length"
        }
        (Cause::GpuOom, _) => "out of GPU memory while serving: lower the batch size / max running requests or the memory fraction",
        (Cause::HostOom, _) => "the OS OOM killer ended a process: the host ran out of RAM; check `dmesg -T | grep -i oom`",
        (Cause::Nccl, _) => "NCCL failed: rerun with NCCL_DEBUG=INFO and check the network interfaces and GPU visibility of every rank",
        (Cause::Config, _) => "a configuration check failed: the message above names the values; `vigil check` catches most before launch",
        (Cause::PortInUse, _) => "a port the server needs is taken: stop the holder or choose another port",
        (Cause::GraphCapture, _) => "CUDA-graph capture failed: try a smaller max capture batch size or disable CUDA graphs to confirm",
        (Cause::Watchdog, _) => "the server's own watchdog fired: a forward pass hung (collective or device); see the dump above",
        (Cause::ModelFile, _) => "the model file is missing, truncated or not a model: check the path and the file's size",
        (Cause::CudaError, _) => "a CUDA kernel failed: rerun with CUDA_LAUNCH_BLOCKING=1 to locate it",
        (Cause::Segfault, _) => "a native crash (segfault): the frames above show where; note the server, torch and driver versions",
        (Cause::Killed, _) => "the process was killed by a signal from outside (operator, orchestrator or OOM killer): check who sent it (dmesg, systemd, kubelet)",
        (Cause::EngineDead, _) => "the engine died while the HTTP front end lived: restart the server; the root cause is the first exception above",
        (Cause::Unknown, _) => "the log does not name a cause: read the evidence lines; the root cause is usually the first exception in them",
    }
}

fn stall_hint(p: Phase) -> &'static str {
    match p {
        Phase::DistInit => "stuck in distributed init: a rank or node did not join (NCCL/TCP store); check every node is up and NCCL_SOCKET_IFNAME",
        Phase::Weights | Phase::DraftWeights => "weight loading stopped progressing: check the filesystem (network storage?) and host memory",
        Phase::CudaGraphs | Phase::DraftCudaGraphs => "CUDA-graph capture stopped progressing: a JIT compile can be silent for minutes, a hang holds GPU memory flat; the evidence shows where each rank is (`vigil dump NAME` takes it again), or disable CUDA graphs to confirm",
        Phase::Compile => "torch.compile is silent for long stretches: raise --stall compile=DUR if this is a cold cache",
        _ => "the server stopped making progress: the last lines show where it was",
    }
}

/// Formats milliseconds as a short human duration, as measured (1.2s, 29.8s, 30s, 3m05s, 8h12m): tenths under a
/// minute (not a whole ten seconds' `.0`), rounded down so a limit not yet reached never reads as reached.
pub fn fmt_ms(ms: u64) -> String {
    let s = ms / 1000;
    if ms < 1000 {
        format!("{ms}ms")
    } else if s < 10 || (s < 60 && ms % 1000 >= 100) {
        format!("{}.{}s", s, (ms % 1000) / 100)
    } else if s < 60 {
        format!("{s}s")
    } else if s < 3600 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{}h{:02}m", s / 3600, (s % 3600) / 60)
    }
}
