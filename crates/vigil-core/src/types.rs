//! The shared vocabulary (see `shared/corpus/README.md`): phases, causes, verdicts.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Where a rank (or the server) is in its startup. Ordered: a later variant is further along.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Launch,
    DistInit,
    Weights,
    DraftWeights,
    KvCache,
    Compile,
    CudaGraphs,
    DraftCudaGraphs,
    Http,
    Warmup,
    Serving,
}

impl Phase {
    pub const ALL: [Phase; 11] = [
        Phase::Launch,
        Phase::DistInit,
        Phase::Weights,
        Phase::DraftWeights,
        Phase::KvCache,
        Phase::Compile,
        Phase::CudaGraphs,
        Phase::DraftCudaGraphs,
        Phase::Http,
        Phase::Warmup,
        Phase::Serving,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Launch => "launch",
            Phase::DistInit => "dist_init",
            Phase::Weights => "weights",
            Phase::DraftWeights => "draft_weights",
            Phase::KvCache => "kv_cache",
            Phase::Compile => "compile",
            Phase::CudaGraphs => "cuda_graphs",
            Phase::DraftCudaGraphs => "draft_cuda_graphs",
            Phase::Http => "http",
            Phase::Warmup => "warmup",
            Phase::Serving => "serving",
        }
    }

    pub fn parse(s: &str) -> Option<Phase> {
        Phase::ALL.iter().copied().find(|p| p.as_str() == s)
    }

    /// Phases from `http` on belong to the whole server (the HTTP front end), not to one rank.
    pub fn is_server_wide(self) -> bool {
        self >= Phase::Http
    }

    /// Default stall limit (seconds without a progress signal) for this phase. Chosen from the
    /// reference notes: silent FlashInfer/DeepGEMM JIT compiles and torch.compile take minutes
    /// (vllm#52682: ~3.5 min of silent JIT), NCCL rendezvous on multi-node waits for peers,
    /// SGLang's warmup request has a 600 s timeout of its own.
    pub fn default_stall_secs(self) -> u64 {
        match self {
            Phase::Launch => 300,
            Phase::DistInit => 600,
            Phase::Weights | Phase::DraftWeights => 600,
            Phase::KvCache => 300,
            Phase::Compile => 900,
            Phase::CudaGraphs | Phase::DraftCudaGraphs => 600,
            Phase::Http => 120,
            Phase::Warmup => 600,
            Phase::Serving => 300,
        }
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a server crashed (or stalled / went unhealthy, where known).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Cause {
    GpuOom,
    HostOom,
    Nccl,
    Config,
    PortInUse,
    GraphCapture,
    Watchdog,
    ModelFile,
    CudaError,
    Segfault,
    Killed,
    EngineDead,
    Unknown,
}

impl Cause {
    pub const ALL: [Cause; 13] = [
        Cause::GpuOom,
        Cause::HostOom,
        Cause::Nccl,
        Cause::Config,
        Cause::PortInUse,
        Cause::GraphCapture,
        Cause::Watchdog,
        Cause::ModelFile,
        Cause::CudaError,
        Cause::Segfault,
        Cause::Killed,
        Cause::EngineDead,
        Cause::Unknown,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Cause::GpuOom => "gpu_oom",
            Cause::HostOom => "host_oom",
            Cause::Nccl => "nccl",
            Cause::Config => "config",
            Cause::PortInUse => "port_in_use",
            Cause::GraphCapture => "graph_capture",
            Cause::Watchdog => "watchdog",
            Cause::ModelFile => "model_file",
            Cause::CudaError => "cuda_error",
            Cause::Segfault => "segfault",
            Cause::Killed => "killed",
            Cause::EngineDead => "engine_dead",
            Cause::Unknown => "unknown",
        }
    }

    pub fn parse(s: &str) -> Option<Cause> {
        Cause::ALL.iter().copied().find(|c| c.as_str() == s)
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The state the evidence proves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Still in a startup phase; not a verdict yet (offline: the text ended while starting).
    Starting,
    Ready,
    Crashed,
    Unhealthy,
    /// Live only: alive, no progress for the phase's stall limit.
    Stalled,
    /// Live only: the overall deadline passed while still making progress.
    Timeout,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Starting => "starting",
            Verdict::Ready => "ready",
            Verdict::Crashed => "crashed",
            Verdict::Unhealthy => "unhealthy",
            Verdict::Stalled => "stalled",
            Verdict::Timeout => "timeout",
        }
    }

    /// Terminal verdicts never change once reached.
    pub fn is_terminal(self) -> bool {
        matches!(self, Verdict::Crashed | Verdict::Stalled | Verdict::Timeout)
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
