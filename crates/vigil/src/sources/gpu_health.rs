//! GPU and node health readings (issue #17): NVML through `nvml-wrapper` into the core's `NvmlReadings`
//! (the shape of the captures the tests replay), else `nvidia-smi -q` and `topo -p2p`; and NVML's event
//! set for Xid and ECC events during a watch. Only gathers; `vigil_core::gpu_health` judges.

use crate::sources::gpu::SMI_TIMEOUT;
use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError, P2pCapabilitiesIndex};
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Nvml;
use vigil_core::gpu_health::{self as gh, GpuHealth, NvmlReadings, P2p, Ret};

/// NVML has at most 18 NVLink links a GPU (NVML_NVLINK_MAX_LINKS).
const NVLINK_MAX: u32 = 18;

fn ret<T: Clone>(r: Result<T, NvmlError>) -> Ret<T> {
    match r {
        Ok(v) => Ret::ok(v),
        // NVML_ERROR_NOT_SUPPORTED is 3; anything else is recorded as 999 (read, failed)
        Err(NvmlError::NotSupported) => Ret { ret: 3, value: None },
        Err(_) => Ret { ret: 999, value: None },
    }
}

fn code<T>(r: &Result<T, NvmlError>) -> i64 {
    match r {
        Ok(_) => 0,
        Err(NvmlError::NotSupported) => 3,
        Err(_) => 999,
    }
}

/// Reads every GPU's health and the P2P status of every pair through NVML. Remapped rows are not in
/// nvml-wrapper 0.11: they come from `nvidia-smi --query-gpu` when it is there.
pub fn read_nvml(n: &Nvml) -> NvmlReadings {
    let count = n.device_count().unwrap_or(0);
    let devs: Vec<_> = (0..count).filter_map(|i| n.device_by_index(i).ok().map(|d| (i, d))).collect();
    let mut r = NvmlReadings::default();
    for (i, d) in &devs {
        let ecc = d.is_ecc_enabled();
        let mut g = gh::NvmlGpu {
            index: *i,
            name: ret(d.name()),
            pci_bus_id: ret(d.pci_info().map(|p| p.bus_id)),
            persistence_mode: ret(d.is_in_persistent_mode().map(u32::from)),
            pcie_gen_current: ret(d.current_pcie_link_gen()),
            pcie_gen_max: ret(d.max_pcie_link_gen()),
            pcie_width_current: ret(d.current_pcie_link_width()),
            pcie_width_max: ret(d.max_pcie_link_width()),
            ecc_mode: gh::EccMode { ret: code(&ecc), current: ecc.ok().map(|e| u32::from(e.currently_enabled)) },
            ecc_uncorrected_volatile: ret(d.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)),
            remapped_rows: gh::RemappedRows { ret: 999, pending: None, failure: None },
            retired_pages_pending: ret(d.are_pages_pending_retired().map(u32::from)),
            nvlink: vec![],
        };
        for l in 0..NVLINK_MAX {
            let a = d.link_wrapper_for(l).is_active();
            g.nvlink.push(gh::LinkState { link: l, ret: code(&a), active: a.ok().map(u32::from) });
        }
        r.gpus.push(g);
    }
    for (a, da) in &devs {
        for (b, db) in devs.iter().filter(|(b, _)| b > a) {
            let st = |idx| {
                let s = da.p2p_status(db, idx);
                gh::P2pStatusReading { ret: code(&s), status: s.ok().map(|s| s as u32) }
            };
            r.p2p.push(gh::NvmlP2p {
                a: *a,
                b: *b,
                read: st(P2pCapabilitiesIndex::Read),
                write: st(P2pCapabilitiesIndex::Write),
            });
        }
    }
    r
}

fn smi(args: &[&str]) -> Option<String> {
    let mut c = std::process::Command::new("nvidia-smi");
    c.args(args);
    let o = crate::sources::procs::output_within(c, SMI_TIMEOUT).ok().filter(|o| o.status.success())?;
    Some(String::from_utf8_lossy(&o.stdout).into_owned())
}

/// The node's health: NVML when it opens (remapped rows added from nvidia-smi), else nvidia-smi alone;
/// `None` without either (no GPU here). `smi_answers`: nvidia-smi answered a moment ago (a wedged one is
/// not asked again).
pub fn collect(smi_answers: bool) -> Option<(Vec<GpuHealth>, Vec<P2p>, &'static str)> {
    if std::env::var_os("VIGIL_NO_GPU").is_some() {
        return None;
    }
    if let Ok(crate::sources::gpu::Reader::Nvml(n)) = crate::sources::gpu::Reader::open() {
        let (mut gpus, p2p) = read_nvml(&n).health();
        let remaps = smi_answers
            .then(|| smi(&["--query-gpu=index,remapped_rows.pending,remapped_rows.failure", "--format=csv,noheader"]))
            .flatten();
        if let Some(t) = remaps {
            for l in t.lines() {
                let v: Vec<&str> = l.split(',').map(str::trim).collect();
                let Some(i) = v.first().and_then(|i| i.parse::<u32>().ok()) else { continue };
                if let Some(g) = gpus.iter_mut().find(|g| g.index == i) {
                    let yes = |s: Option<&&str>| match s.copied() {
                        Some("Yes") => Some(true),
                        Some("No") => Some(false),
                        _ => None,
                    };
                    g.remapped_pending = yes(v.get(1));
                    g.remapped_failure = yes(v.get(2));
                }
            }
        }
        return Some((gpus, p2p, "NVML"));
    }
    if !smi_answers {
        return None;
    }
    let q = smi(&["-q"])?;
    let gpus = gh::parse_smi_q(&q);
    let p2p = match (smi(&["topo", "-p2p", "r"]), smi(&["topo", "-p2p", "w"])) {
        (Some(r), Some(w)) => gh::p2p_from_topo(&r, &w),
        _ => vec![],
    };
    Some((gpus, p2p, "nvidia-smi"))
}

/// `vigil check`: the node's GPU health as warnings (never errors) about the GPUs the server will use
/// (`CUDA_VISIBLE_DEVICES`'s first `needed`, else GPUs 0..needed).
pub fn check(visible: Option<&str>, needed: u64, smi_answers: bool, rep: &mut crate::sinks::records::CheckReport) {
    let Some((gpus, p2p, source)) = collect(smi_answers) else { return };
    let used: Vec<u32> = match visible {
        Some(v) => v.split(',').filter_map(|x| x.trim().parse().ok()).take(needed as usize).collect(),
        None => (0..needed as u32).collect(),
    };
    let tp = (needed > 1).then_some(used.as_slice());
    for f in gh::findings(&gpus, &p2p, tp) {
        let on_ours = f.gpu.is_none_or(|g| used.is_empty() || used.contains(&g) || f.code == "no_p2p");
        if !on_ours {
            continue;
        }
        let sev = match f.level {
            gh::Level::Warning => crate::sinks::records::Severity::Warning,
            gh::Level::Info => crate::sinks::records::Severity::Info,
        };
        rep.add(sev, "gpu-health", format!("{} (from {source})", f.message), None);
    }
}

/// Waits for NVML's critical Xid and double-bit ECC events on every GPU, on a thread of its own, and sends
/// them until the receiver is gone. Off without NVML or when the GPUs support neither event.
pub fn watch_events(tx: tokio::sync::mpsc::UnboundedSender<gh::GpuEvent>) {
    std::thread::spawn(move || {
        use nvml_wrapper::bitmasks::event::EventTypes;
        let Ok(crate::sources::gpu::Reader::Nvml(n)) = crate::sources::gpu::Reader::open() else { return };
        let Ok(mut set) = n.create_event_set() else { return };
        let count = n.device_count().unwrap_or(0);
        let mut any = false;
        for i in 0..count {
            let Ok(d) = n.device_by_index(i) else { continue };
            let want = EventTypes::CRITICAL_XID_ERROR | EventTypes::DOUBLE_BIT_ECC_ERROR;
            let types = d.supported_event_types().map(|s| s & want).unwrap_or(EventTypes::empty());
            if types.is_empty() {
                continue;
            }
            match d.register_events(types, set) {
                Ok(s) => {
                    set = s;
                    any = true;
                }
                // a failed registration releases the set (nvml-wrapper): events are off
                Err(_) => return,
            }
        }
        if !any {
            return;
        }
        loop {
            match set.wait(1000) {
                Ok(ev) => {
                    let gpu = ev.device.index().unwrap_or(u32::MAX);
                    let e = if ev.event_type.contains(EventTypes::CRITICAL_XID_ERROR) {
                        let xid = match ev.event_data {
                            Some(nvml_wrapper::enums::event::XidError::Value(v)) => Some(v),
                            _ => None,
                        };
                        gh::GpuEvent { gpu, xid, kind: "xid" }
                    } else {
                        gh::GpuEvent { gpu, xid: None, kind: "ecc_uncorrected" }
                    };
                    if tx.send(e).is_err() {
                        return;
                    }
                }
                Err(NvmlError::Timeout) => {
                    if tx.is_closed() {
                        return;
                    }
                }
                Err(_) => return,
            }
        }
    });
}
