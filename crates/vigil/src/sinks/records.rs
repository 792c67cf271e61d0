//! The records the one-shot commands print (`status`, `ps`, `check`, `gpu`), as typed data: their rows
//! render in `tables.rs`, as aligned text or JSON. The layers that produce them (nodes, `check`, the GPU
//! reader) fill them in and re-export them from their old homes.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One run of `vigil up` on a node, as `status` shows it.
#[derive(Debug, Serialize)]
pub struct RunRow {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    pub name: String,
    pub server: Option<String>,
    pub state: String,
    pub phase: String,
    pub in_state: Option<String>,
    pub port: Option<u16>,
    pub pid: Option<i64>,
    pub keeper_pid: i64,
    pub last_log_line_age_s: Option<u64>,
}

/// An inference server on a node that vigil did not start, as `ps` shows it.
#[derive(Debug, Serialize)]
pub struct ProcRow {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    pub pid: i32,
    pub server: String,
    pub age_s: Option<u64>,
    pub ports: Vec<u16>,
    /// GPU memory held by the process tree (MiB), when GPU readings exist.
    pub gpu_mib: Option<u64>,
    pub cmd: String,
}

// ---------------------------------------------------------------- `check`

/// How bad a finding is: an error (only a confirmed one stops `vigil up`), a warning, or information.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Info,
    Warning,
    Error,
}

/// One thing `check` found: its rule, what it says, and how to fix it.
#[derive(Debug, Clone, Serialize)]
pub struct Finding {
    pub severity: Severity,
    pub rule: String,
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
    /// For an error: the evidence that the server itself refuses these inputs (a test against the real
    /// server, or the golden table of the server's own code). `None`: not confirmed, and `vigil up`
    /// treats the error as a warning and launches (the safety valve: a false refusal is the worst bug).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub confirmed: Option<&'static str>,
    /// The numbers behind a finding, for `--json` (the fit estimate's `weights_gib_per_gpu`, `kv_tokens`, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
}

/// What `check` found: the findings, and what it read on the way (server, versions, context lengths).
#[derive(Default)]
pub struct CheckReport {
    pub server: Option<String>,
    pub version: Option<String>,
    /// The transformers version beside the server (vLLM < 0.24 runs with 4.x or 5.x).
    pub transformers: Option<String>,
    pub findings: Vec<Finding>,
    /// The context length the server will run with (the length flag, else the derived length).
    pub context: Option<u64>,
    /// The draft's derived context length, when a draft model is read.
    pub draft_context: Option<u64>,
}

impl CheckReport {
    pub fn add(&mut self, severity: Severity, rule: &str, message: impl Into<String>, fix: Option<String>) {
        self.findings.push(Finding {
            severity,
            rule: rule.into(),
            message: message.into(),
            fix,
            confirmed: None,
            data: None,
        });
    }
    /// An error the server is known to refuse (see `check::evidence`): the only kind `vigil up` stops on.
    pub fn add_confirmed(&mut self, rule: &str, message: impl Into<String>, fix: Option<String>, by: &'static str) {
        self.findings.push(Finding {
            severity: Severity::Error,
            rule: rule.into(),
            message: message.into(),
            fix,
            confirmed: Some(by),
            data: None,
        });
    }
    pub fn errors(&self) -> usize {
        self.findings.iter().filter(|f| f.severity == Severity::Error).count()
    }
    /// Errors confirmed against the server: `vigil up` launches nothing when there is one.
    pub fn blocking(&self) -> usize {
        self.findings.iter().filter(|f| f.severity == Severity::Error && f.confirmed.is_some()).count()
    }
    pub fn warnings(&self) -> usize {
        self.findings.iter().filter(|f| f.severity == Severity::Warning).count()
    }
}

// ---------------------------------------------------------------- `gpu`

/// One GPU of a sample.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct GpuDev {
    pub index: u32,
    pub used_mib: u64,
    pub total_mib: u64,
    pub util: Option<u32>,
}

/// A process holding GPU memory.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct GpuProc {
    pub pid: i32,
    pub gpu: u32,
    pub used_mib: u64,
}

/// One sample of every GPU and the processes holding memory (`source`: `nvml` or `nvidia-smi`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Snapshot {
    pub source: String,
    pub gpus: Vec<GpuDev>,
    pub procs: Vec<GpuProc>,
}
