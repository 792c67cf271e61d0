//! GPU and node health (issue #17): readings from NVML (the [`NvmlReadings`] struct, filled live by the
//! binary or replayed from a capture) or `nvidia-smi -q` ([`parse_smi_q`]), judged into findings.
//!
//! A finding is a warning, never an error: a false refusal is the worst bug, and none of these readings
//! proves that a server cannot start (a GPU with uncorrectable ECC errors may still run it, wrongly or not).
//! Rules, from NVIDIA's documentation of the readings (NVML API reference: nvmlDeviceGetTotalEccErrors,
//! nvmlDeviceGetRemappedRows, nvmlDeviceGetRetiredPagesPendingStatus, nvmlDeviceGetCurrPcieLinkWidth,
//! nvmlDeviceGetP2PStatus, nvmlDeviceGetNvLinkState; the GPU memory error management and Xid docs):
//! - volatile uncorrectable ECC errors since the driver loaded: the GPU's memory returned bad data;
//! - remapped rows pending (Ampere and later) or retired pages pending (earlier): a GPU reset applies them;
//!   a remapping failure means the GPU needs service;
//! - a PCIe link narrower than its maximum width (a bad riser or slot: every host↔GPU copy is slower);
//!   a generation below its maximum is reported only as information, since GPUs lower it at idle;
//! - an NVLink link inactive while others of the same GPU are active;
//! - no peer-to-peer read/write between two GPUs a tensor-parallel server will use (NCCL then copies
//!   through host memory);
//! - persistence mode off: information (each new CUDA process pays the driver's start).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The health readings of one GPU. `None`: not read or not supported.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuHealth {
    pub index: u32,
    pub name: Option<String>,
    pub bus_id: Option<String>,
    pub persistence: Option<bool>,
    pub pcie_gen: Option<u32>,
    pub pcie_gen_max: Option<u32>,
    pub pcie_width: Option<u32>,
    pub pcie_width_max: Option<u32>,
    pub ecc_enabled: Option<bool>,
    /// Uncorrectable ECC errors since the driver loaded.
    pub ecc_uncorrected_volatile: Option<u64>,
    pub remapped_pending: Option<bool>,
    pub remapped_failure: Option<bool>,
    pub retired_pending: Option<bool>,
    /// Per NVLink link: active or not (links that report "not supported" are left out).
    pub nvlink_active: Vec<(u32, bool)>,
}

/// Peer-to-peer between two GPUs (NVML's P2P status; `None`: not read).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct P2p {
    pub a: u32,
    pub b: u32,
    /// `ok`, or why not (`chipset not supported`, `GPU not supported`, `topology not supported`,
    /// `disabled by registry key`, `not supported`, `unknown`).
    pub read: Option<String>,
    pub write: Option<String>,
}

/// NVML's `nvmlGpuP2PStatus_t` as words.
pub fn p2p_status_name(code: u32) -> &'static str {
    match code {
        0 => "ok",
        1 => "chipset not supported",
        2 => "GPU not supported",
        3 => "topology not supported",
        4 => "disabled by registry key",
        5 => "not supported",
        _ => "unknown",
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Level {
    Info,
    Warning,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub level: Level,
    /// The GPU it is about (the first of a pair for P2P).
    pub gpu: Option<u32>,
    /// A stable key: `ecc_uncorrected`, `remapped_pending`, `remap_failure`, `retired_pending`,
    /// `pcie_width`, `pcie_gen`, `nvlink_down`, `no_p2p`, `persistence_off`.
    pub code: &'static str,
    pub message: String,
}

/// Judges the readings. `tp_gpus`: the GPUs a tensor-parallel server will use (P2P is judged between
/// every pair of them); `None` judges every pair read.
pub fn findings(gpus: &[GpuHealth], p2p: &[P2p], tp_gpus: Option<&[u32]>) -> Vec<Finding> {
    let mut out = Vec::new();
    let mut f = |level, gpu: Option<u32>, code, message: String| out.push(Finding { level, gpu, code, message });
    for g in gpus {
        let i = g.index;
        if let Some(n) = g.ecc_uncorrected_volatile.filter(|n| *n > 0) {
            f(Level::Warning, Some(i), "ecc_uncorrected", format!("GPU {i}: {n} uncorrectable ECC error(s) since the driver loaded: its memory returned bad data; drain the node or reset the GPU (nvidia-smi -r) before trusting results"));
        }
        if g.remapped_failure == Some(true) {
            f(
                Level::Warning,
                Some(i),
                "remap_failure",
                format!("GPU {i}: a row remapping failed: the GPU needs service (RMA)"),
            );
        }
        if g.remapped_pending == Some(true) {
            f(
                Level::Warning,
                Some(i),
                "remapped_pending",
                format!("GPU {i}: row remapping pending: reset the GPU (nvidia-smi -r, or reboot) to apply it"),
            );
        }
        if g.retired_pending == Some(true) {
            f(
                Level::Warning,
                Some(i),
                "retired_pending",
                format!("GPU {i}: page retirement pending: reset the GPU (nvidia-smi -r, or reboot) to apply it"),
            );
        }
        if let (Some(w), Some(m)) = (g.pcie_width, g.pcie_width_max) {
            if w < m {
                f(Level::Warning, Some(i), "pcie_width", format!("GPU {i}: PCIe link trained at x{w}, below its x{m}: host↔GPU copies (weight loading, offload) are slower; reseat the card or check the riser"));
            }
        }
        if let (Some(c), Some(m)) = (g.pcie_gen, g.pcie_gen_max) {
            if c < m {
                f(Level::Info, Some(i), "pcie_gen", format!("GPU {i}: PCIe Gen{c} now, Gen{m} at most (GPUs lower the generation at idle; a problem only under load)"));
            }
        }
        let active = g.nvlink_active.iter().filter(|(_, a)| *a).count();
        let down: Vec<u32> = g.nvlink_active.iter().filter(|(_, a)| !*a).map(|(l, _)| *l).collect();
        if active > 0 && !down.is_empty() {
            f(Level::Warning, Some(i), "nvlink_down", format!("GPU {i}: NVLink link(s) {down:?} inactive while {active} are active: collectives over it are slower or fail"));
        }
        if g.persistence == Some(false) {
            f(
                Level::Info,
                Some(i),
                "persistence_off",
                format!(
                    "GPU {i}: persistence mode off: every new CUDA process pays the driver's start (nvidia-smi -pm 1)"
                ),
            );
        }
    }
    for p in p2p.iter().filter(|p| p.a < p.b) {
        let used = tp_gpus.is_none_or(|t| t.contains(&p.a) && t.contains(&p.b));
        let bad = |s: &Option<String>| s.as_deref().is_some_and(|s| s != "ok");
        if used && (bad(&p.read) || bad(&p.write)) {
            let why = p.read.as_deref().filter(|s| *s != "ok").or(p.write.as_deref()).unwrap_or("unknown");
            f(Level::Warning, Some(p.a), "no_p2p", format!("GPUs {} and {}: no peer-to-peer ({why}): NCCL copies through host memory, all-reduce is several times slower; check the PCIe topology (nvidia-smi topo -m) and ACS/IOMMU settings", p.a, p.b));
        }
    }
    out
}

/// One NVML call's result as the capture script (and vigil's own reader) records it: `ret` is NVML's
/// return code (0 success, 3 not supported, …).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Ret<T> {
    pub ret: i64,
    #[serde(default)]
    pub value: Option<T>,
}

impl<T: Clone> Ret<T> {
    pub fn ok(v: T) -> Ret<T> {
        Ret { ret: 0, value: Some(v) }
    }
    fn get(&self) -> Option<T> {
        if self.ret == 0 {
            self.value.clone()
        } else {
            None
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EccMode {
    pub ret: i64,
    pub current: Option<u32>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RemappedRows {
    pub ret: i64,
    pub pending: Option<u32>,
    pub failure: Option<u32>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LinkState {
    pub link: u32,
    pub ret: i64,
    pub active: Option<u32>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NvmlGpu {
    pub index: u32,
    #[serde(default)]
    pub name: Ret<String>,
    #[serde(default)]
    pub pci_bus_id: Ret<String>,
    #[serde(default)]
    pub persistence_mode: Ret<u32>,
    #[serde(default)]
    pub pcie_gen_current: Ret<u32>,
    #[serde(default)]
    pub pcie_gen_max: Ret<u32>,
    #[serde(default)]
    pub pcie_width_current: Ret<u32>,
    #[serde(default)]
    pub pcie_width_max: Ret<u32>,
    #[serde(default)]
    pub ecc_mode: EccMode,
    #[serde(default)]
    pub ecc_uncorrected_volatile: Ret<u64>,
    #[serde(default)]
    pub remapped_rows: RemappedRows,
    #[serde(default)]
    pub retired_pages_pending: Ret<u32>,
    #[serde(default)]
    pub nvlink: Vec<LinkState>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct P2pStatusReading {
    pub ret: i64,
    pub status: Option<u32>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NvmlP2p {
    pub a: u32,
    pub b: u32,
    #[serde(default)]
    pub read: P2pStatusReading,
    #[serde(default)]
    pub write: P2pStatusReading,
}

/// NVML readings of a node, in the shape of `scripts/gpu-health-capture.py`'s JSON (other keys ignored).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NvmlReadings {
    #[serde(default)]
    pub gpus: Vec<NvmlGpu>,
    #[serde(default)]
    pub p2p: Vec<NvmlP2p>,
}

impl NvmlReadings {
    pub fn health(&self) -> (Vec<GpuHealth>, Vec<P2p>) {
        let gpus = self
            .gpus
            .iter()
            .map(|g| GpuHealth {
                index: g.index,
                name: g.name.get(),
                bus_id: g.pci_bus_id.get(),
                persistence: g.persistence_mode.get().map(|v| v == 1),
                pcie_gen: g.pcie_gen_current.get(),
                pcie_gen_max: g.pcie_gen_max.get(),
                pcie_width: g.pcie_width_current.get(),
                pcie_width_max: g.pcie_width_max.get(),
                ecc_enabled: (g.ecc_mode.ret == 0).then_some(g.ecc_mode.current == Some(1)),
                ecc_uncorrected_volatile: g.ecc_uncorrected_volatile.get(),
                remapped_pending: (g.remapped_rows.ret == 0).then(|| g.remapped_rows.pending.unwrap_or(0) > 0),
                remapped_failure: (g.remapped_rows.ret == 0).then(|| g.remapped_rows.failure.unwrap_or(0) > 0),
                retired_pending: g.retired_pages_pending.get().map(|v| v > 0),
                nvlink_active: g
                    .nvlink
                    .iter()
                    .filter(|l| l.ret == 0)
                    .filter_map(|l| l.active.map(|a| (l.link, a == 1)))
                    .collect(),
            })
            .collect();
        let st = |r: &P2pStatusReading| (r.ret == 0).then(|| p2p_status_name(r.status.unwrap_or(6)).to_string());
        let p2p = self.p2p.iter().map(|p| P2p { a: p.a, b: p.b, read: st(&p.read), write: st(&p.write) }).collect();
        (gpus, p2p)
    }
}

/// Parses `nvidia-smi -q` text: one `GPU <bus id>` section per GPU, `Key : Value` lines indented by
/// section. Reads the health fields only; `N/A` is `None`.
pub fn parse_smi_q(text: &str) -> Vec<GpuHealth> {
    let mut out: Vec<GpuHealth> = Vec::new();
    // the section path of the current line: (indent, name)
    let mut path: Vec<(usize, String)> = Vec::new();
    for raw in text.lines() {
        let line = raw.trim_end();
        if line.trim().is_empty() {
            continue;
        }
        let indent = line.len() - line.trim_start().len();
        let t = line.trim_start();
        if indent == 0 {
            path.clear();
            if let Some(bus) = t.strip_prefix("GPU ") {
                out.push(GpuHealth {
                    index: out.len() as u32,
                    bus_id: Some(bus.trim().to_string()),
                    ..Default::default()
                });
            }
            continue;
        }
        while path.last().is_some_and(|(i, _)| *i >= indent) {
            path.pop();
        }
        let Some(g) = out.last_mut() else { continue };
        let Some((k, v)) = t.split_once(" : ").or_else(|| t.strip_suffix(" :").map(|k| (k, ""))) else {
            path.push((indent, t.to_string()));
            continue;
        };
        let (k, v) = (k.trim(), v.trim());
        let val = (v != "N/A" && !v.is_empty()).then_some(v);
        let num = |v: Option<&str>| v.and_then(|s| s.trim_end_matches('x').trim().parse::<u64>().ok());
        let yes = |v: Option<&str>| v.map(|s| matches!(s, "Yes" | "Enabled"));
        let sect: Vec<&str> = path.iter().map(|(_, n)| n.as_str()).collect();
        match (sect.as_slice(), k) {
            ([], "Product Name") => g.name = val.map(String::from),
            ([], "Minor Number") => {
                if let Some(n) = num(val) {
                    g.index = n as u32;
                }
            }
            ([], "Persistence Mode") => g.persistence = yes(val),
            ([.., "PCIe Generation"], "Max") => g.pcie_gen_max = num(val).map(|n| n as u32),
            ([.., "PCIe Generation"], "Current") => g.pcie_gen = num(val).map(|n| n as u32),
            ([.., "Link Width"], "Max") => g.pcie_width_max = num(val).map(|n| n as u32),
            ([.., "Link Width"], "Current") => g.pcie_width = num(val).map(|n| n as u32),
            (["ECC Mode"], "Current") => g.ecc_enabled = yes(val),
            // Hopper: `SRAM Uncorrectable Parity`, `SRAM Uncorrectable SEC-DED`, `DRAM Uncorrectable`;
            // earlier drivers: a `Double Bit` subsection with its `Total`
            (["ECC Errors", "Volatile"], k) if k.contains("Uncorrectable") => {
                if let Some(n) = num(val) {
                    *g.ecc_uncorrected_volatile.get_or_insert(0) += n;
                }
            }
            (["ECC Errors", "Volatile", "Double Bit"], "Total") => {
                if let Some(n) = num(val) {
                    *g.ecc_uncorrected_volatile.get_or_insert(0) += n;
                }
            }
            (["Retired Pages"], "Pending Page Blacklist") | (["Retired Pages"], "Pending") => {
                g.retired_pending = yes(val)
            }
            (["Remapped Rows"], "Pending") => g.remapped_pending = yes(val),
            (["Remapped Rows"], "Remapping Failure Occurred") => g.remapped_failure = yes(val),
            _ => {}
        }
    }
    out
}

/// Parses `nvidia-smi topo -p2p r` (or `w`): a matrix of `OK`, `X` (self), `CNS`, `GNS`, `TNS`, `NS`, `U`.
/// Returns `(a, b, status)` for every pair a ≠ b, the status in [`p2p_status_name`]'s words.
pub fn parse_topo_p2p(text: &str) -> Vec<(u32, u32, String)> {
    let mut out = Vec::new();
    let clean = |s: &str| s.replace("\u{1b}[4m", "").replace("\u{1b}[0m", "");
    for l in text.lines().map(clean) {
        let mut cells = l.split_whitespace();
        let Some(row) = cells.next().and_then(|c| c.strip_prefix("GPU")).and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        for (col, c) in cells.enumerate() {
            let col = col as u32;
            if col == row || c == "X" {
                continue;
            }
            let status = match c {
                "OK" => "ok",
                "CNS" => "chipset not supported",
                "GNS" => "GPU not supported",
                "TNS" => "topology not supported",
                "NS" => "not supported",
                _ => "unknown",
            };
            out.push((row, col, status.to_string()));
        }
    }
    out
}

/// P2P pairs from the read and write matrices of `nvidia-smi topo -p2p r|w`.
pub fn p2p_from_topo(read: &str, write: &str) -> Vec<P2p> {
    let mut m: BTreeMap<(u32, u32), P2p> = BTreeMap::new();
    for (a, b, s) in parse_topo_p2p(read) {
        m.entry((a, b)).or_insert(P2p { a, b, read: None, write: None }).read = Some(s);
    }
    for (a, b, s) in parse_topo_p2p(write) {
        m.entry((a, b)).or_insert(P2p { a, b, read: None, write: None }).write = Some(s);
    }
    m.into_values().collect()
}

/// An event NVML reported on a GPU during a watch: a critical Xid error or a double-bit ECC error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuEvent {
    pub gpu: u32,
    /// The Xid number (for an Xid event).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub xid: Option<u64>,
    /// `xid` or `ecc_uncorrected`.
    pub kind: &'static str,
}

impl GpuEvent {
    pub fn describe(&self) -> String {
        match self.xid {
            Some(x) => format!("Xid {x} on GPU {}", self.gpu),
            None => format!("uncorrectable ECC error on GPU {}", self.gpu),
        }
    }
}
