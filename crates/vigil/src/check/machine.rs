//! The machine as facts (issue #34): the GPUs CUDA will show the server (NVML's count and UUIDs resolved
//! against `CUDA_VISIBLE_DEVICES` as torch and CUDA read it), the parallel layout asked for on this node,
//! the network interfaces and InfiniBand HCAs the NCCL/Gloo variables name, and the free disk where the
//! compile caches are written. Where a fact cannot be read (no NVML, no nvidia-smi), the check says which
//! and refuses nothing on it.

use super::derive::{self, Srv};
use super::{evidence, Launch};
use crate::sinks::records::{CheckReport as Report, Severity};
use crate::sources::follow::arg_value;
use std::path::Path;

/// `CUDA_VISIBLE_DEVICES` as torch parses it (torch/cuda/__init__.py `_parse_visible_devices`, which
/// follows CUDA's own reading): a list that starts with `GPU-` or `MIG-` keeps entries with that prefix up
/// to the first without it; otherwise each entry is read like `strtoul` (`1gpu2` is 1) up to the first that
/// is not a number; a repeated entry makes the list empty (CUDA shows no device: "0,0" measured on the GPU
/// machine shows none).
#[derive(Debug, Clone, PartialEq)]
pub enum Visible {
    Ordinals(Vec<u64>),
    Uuids(Vec<String>),
    Mig(Vec<String>),
}

impl Visible {
    fn len(&self) -> u64 {
        match self {
            Visible::Ordinals(v) => v.len() as u64,
            Visible::Uuids(v) | Visible::Mig(v) => v.len() as u64,
        }
    }
}

fn strtoul(s: &str) -> Option<u64> {
    let digits: String = s.chars().take_while(|c| c.is_ascii_digit()).collect();
    if digits.is_empty() {
        return None;
    }
    digits.parse().ok()
}

pub fn parse_visible(var: &str) -> Visible {
    for (prefix, mig) in [("GPU-", false), ("MIG-", true)] {
        if var.starts_with(prefix) {
            let mut v: Vec<String> = Vec::new();
            for e in var.split(',') {
                if v.iter().any(|x| x == e) {
                    v.clear();
                    break;
                }
                if !e.starts_with(prefix) {
                    break;
                }
                v.push(e.to_string());
            }
            return if mig { Visible::Mig(v) } else { Visible::Uuids(v) };
        }
    }
    let mut v: Vec<u64> = Vec::new();
    for e in var.split(',') {
        let Some(x) = strtoul(e.trim()) else { break };
        if v.contains(&x) {
            return Visible::Ordinals(vec![]);
        }
        v.push(x);
    }
    Visible::Ordinals(v)
}

/// How many GPUs CUDA shows: `exact` with NVML's UUIDs (torch `_device_count_nvml`: ordinals trimmed at
/// the first that is not below the count; UUID prefixes matched, an ambiguous one empties the list, one
/// that matches nothing ends it), else `at_most` from the variable alone.
#[derive(Debug, Clone, PartialEq)]
pub struct Seen {
    pub exact: Option<u64>,
    pub at_most: Option<u64>,
    /// Entries that name no device (with NVML), for the message.
    pub dropped: Vec<String>,
}

pub fn resolve(var: Option<&str>, uuids: Option<&[String]>) -> Seen {
    let n = uuids.map(|u| u.len() as u64);
    let Some(var) = var else { return Seen { exact: n, at_most: None, dropped: vec![] } };
    let vis = parse_visible(var);
    let at_most = Some(vis.len());
    let Some(uuids) = uuids else { return Seen { exact: None, at_most, dropped: vec![] } };
    let raw: Vec<&str> = var.split(',').collect();
    let mut dropped = Vec::new();
    let exact = match &vis {
        Visible::Ordinals(o) => {
            let k = o.iter().position(|x| *x >= uuids.len() as u64).unwrap_or(o.len());
            dropped.extend(raw.iter().skip(k).map(|s| s.to_string()));
            Some(k as u64)
        }
        Visible::Uuids(c) => {
            let mut ords: Vec<usize> = Vec::new();
            let mut k = 0u64;
            // torch `_transform_uuid_to_ordinals`: a prefix that matches no GPU, or more than one, ends the
            // list; one that names a GPU already listed empties it.
            for cand in c {
                let m: Vec<usize> = (0..uuids.len()).filter(|i| uuids[*i].starts_with(cand.as_str())).collect();
                match m.as_slice() {
                    [i] if ords.contains(i) => {
                        k = 0;
                        break;
                    }
                    [i] => {
                        ords.push(*i);
                        k += 1;
                    }
                    _ => break,
                }
            }
            dropped.extend(raw.iter().skip(k as usize).map(|s| s.to_string()));
            Some(k)
        }
        // MIG instances are not enumerated here: torch falls back to CUDA's own count.
        Visible::Mig(_) => None,
    };
    if vis.len() < raw.len() as u64 && dropped.is_empty() {
        dropped.extend(raw.iter().skip(vis.len() as usize).map(|s| s.to_string()));
    }
    Seen { exact, at_most, dropped }
}

/// The GPUs one node's ranks take, in the server's own arithmetic, and the first it would fail on.
struct Need {
    gpus: u64,
    how: String,
    /// The server's own refusal applies (vLLM: TP×PP above the count with the default executor on one
    /// node; SGLang: a TP/PP rank's gpu_id past the count).
    refused_by_server: bool,
}

fn need(srv: Option<Srv>, l: &Launch, argv: &[String]) -> Need {
    let name = srv.map(|s| match s {
        Srv::Vllm => "vllm",
        Srv::Sglang => "sglang",
    });
    let how = l.gpus_how(name);
    let gpus = l.gpus_per_node(name);
    match srv {
        Some(Srv::Vllm) => {
            // config/parallel.py:883-905 (0.26.0): only with no --distributed-executor-backend, on one node,
            // and TP × PP (the world of one DP rank) above the count.
            let default_backend = arg_value(argv, "--distributed-executor-backend").is_none();
            let world = l.tp * l.pp;
            Need { gpus, how, refused_by_server: default_backend && l.nnodes <= 1 && world > 1 && gpus == world }
        }
        Some(Srv::Sglang) if l.nnodes <= 1 && (l.dp <= 1 || l.dp_attention) => {
            // Each TP/PP rank sets its device: gpu_id = base + pp_rank × tp + tp_rank × step
            // (srt/weight_cache/protocol.py compute_local_gpu_id, 0.5.17).
            let base = arg_value(argv, "--base-gpu-id").and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
            let step = arg_value(argv, "--gpu-id-step").and_then(|v| v.parse::<u64>().ok()).unwrap_or(1).max(1);
            let top = base + (l.pp.max(1) - 1) * l.tp.max(1) + (l.tp.max(1) - 1) * step + 1;
            let how =
                if base > 0 || step > 1 { format!("{how}, --base-gpu-id {base} --gpu-id-step {step}") } else { how };
            Need { gpus: top.max(gpus), how, refused_by_server: true }
        }
        _ => Need { gpus, how, refused_by_server: false },
    }
}

/// What NVML (or nvidia-smi) says, once per check.
pub struct Gpus {
    pub uuids: Option<Vec<String>>,
    pub source: Option<&'static str>,
    pub why_not: Option<String>,
}

pub fn read_gpus() -> Gpus {
    match crate::sources::gpu::Reader::open() {
        Ok(r) => match r.uuids() {
            Ok(u) => Gpus { uuids: Some(u), source: Some(r.name()), why_not: None },
            Err(e) => Gpus { uuids: None, source: None, why_not: Some(format!("{}: {e}", r.name())) },
        },
        Err(e) => Gpus { uuids: None, source: None, why_not: Some(e) },
    }
}

/// The GPUs of this node against the layout the command asks for.
pub fn check_gpus(srv: Option<Srv>, l: &Launch, argv: &[String], env: &[(String, String)], g: &Gpus, rep: &mut Report) {
    let get = |k: &str| env.iter().find(|(ek, _)| ek == k).map(|(_, v)| v.as_str());
    let cvd = get("CUDA_VISIBLE_DEVICES");
    let seen = resolve(cvd, g.uuids.as_deref());
    let n = need(srv, l, argv);
    if let Some(why) = &g.why_not {
        let about = match cvd {
            Some(v) => format!(
                "whether CUDA_VISIBLE_DEVICES={v} names devices that exist (only its {} usable entries bound what the server sees)",
                seen.at_most.unwrap_or(0)
            ),
            None => "how many GPUs this node has".to_string(),
        };
        rep.add(
            Severity::Info,
            "gpus",
            format!("not read: GPU count, UUIDs and memory ({why}); not checked: {about}"),
            None,
        );
    }
    if let Some(v) = get("NVIDIA_VISIBLE_DEVICES") {
        rep.add(
            Severity::Info,
            "gpus",
            format!("NVIDIA_VISIBLE_DEVICES={v} is read by the NVIDIA container runtime when a container starts, not by CUDA: it does not choose this launch's GPUs (CUDA_VISIBLE_DEVICES does)"),
            None,
        );
    }
    if let (Some(v), false) = (cvd, seen.dropped.is_empty()) {
        let shown = seen.exact.or(seen.at_most).unwrap_or(0);
        rep.add(
            if shown < n.gpus { Severity::Warning } else { Severity::Info },
            "gpus",
            format!(
                "CUDA_VISIBLE_DEVICES={v}: CUDA ignores {} and every entry after it (an entry that names no device, a repeat, or one that is not a number), so the server sees {shown} GPU(s)",
                seen.dropped.first().cloned().unwrap_or_default(),
            ),
            Some("list each GPU once, by index or by the UUID nvidia-smi -L prints".into()),
        );
    }
    let (count, from) = match (seen.exact, seen.at_most, cvd) {
        (Some(e), _, Some(v)) => {
            (e, format!("{} GPU(s) CUDA shows with CUDA_VISIBLE_DEVICES={v} ({})", e, g.source.unwrap_or("?")))
        }
        (Some(e), _, None) => (e, format!("{e} GPU(s) on this node ({})", g.source.unwrap_or("?"))),
        (None, Some(m), Some(v)) => (m, format!("at most {m} GPU(s): the usable entries of CUDA_VISIBLE_DEVICES={v}")),
        _ => return,
    };
    if count >= n.gpus {
        return;
    }
    let msg = format!("{} GPUs needed on this node ({}), {from}", n.gpus, n.how);
    let fix = "use fewer GPUs (--tp/--pp/--dp), widen CUDA_VISIBLE_DEVICES, or spread the ranks over nodes (--nnodes)"
        .to_string();
    let srv_ok = srv.is_some_and(|s| {
        derive::at_least(
            rep.version.as_deref(),
            match s {
                Srv::Vllm => &[0, 26, 0],
                Srv::Sglang => &[0, 5, 17],
            },
        ) == Some(true)
    });
    // vLLM 0.26 reads the dtype at launch from the GPU's capability, asking NVML for the device whose index is
    // the first CUDA_VISIBLE_DEVICES entry (platforms/cuda.py:733-737 `get_device_capability` through
    // `visible_device_id_to_physical_device_id`; NVML does not read CUDA_VISIBLE_DEVICES): an index past NVML's
    // count raises NVMLError_InvalidArgument, whatever the layout (seen on the H200, 2026-12-02: p8 with
    // CUDA_VISIBLE_DEVICES=1, `vllm serve` exited 1 at launch)
    let first_past_nvml = match (cvd.map(|v| v.split(',').next().unwrap_or("").trim()), g.uuids.as_ref()) {
        (Some(first), Some(u)) => first.parse::<u64>().ok().filter(|i| *i >= u.len() as u64),
        _ => None,
    };
    match srv {
        Some(Srv::Vllm) if srv_ok && first_past_nvml.is_some() => {
            let i = first_past_nvml.unwrap_or_default();
            let said = format!("vLLM asks NVML for GPU {i} (the first CUDA_VISIBLE_DEVICES entry) at launch and fails with `NVMLError_InvalidArgument`: this node has {} GPU(s)", g.uuids.as_ref().map_or(0, Vec::len));
            rep.add_confirmed("gpus", format!("{msg}: {said}"), Some(fix), evidence::GPUS_VISIBLE);
        }
        Some(s) if n.refused_by_server && srv_ok => {
            let said = match s {
                Srv::Vllm => format!("vLLM raises `World size ({}) is larger than the number of available GPUs ({count}) in this node` before loading", l.tp * l.pp),
                Srv::Sglang => format!("SGLang's rank on GPU {} fails `set_device` (invalid device ordinal) before loading", count),
            };
            rep.add_confirmed("gpus", format!("{msg}: {said}"), Some(fix), evidence::GPUS_VISIBLE);
        }
        _ => {
            let why = match (srv, rep.version.as_deref()) {
                (None, _) => "server not recognised".to_string(),
                (Some(_), _) if !n.refused_by_server => "a layout whose refusal is not cited".to_string(),
                (Some(s), None) => format!("{} version unknown", s.name()),
                (Some(s), Some(v)) => format!("{} {v} is older than the release read for this rule", s.name()),
            };
            rep.add(Severity::Error, "gpus", format!("{msg} ({why}: not confirmed)"), Some(fix))
        }
    }
}

/// vLLM refuses to start when a GPU's free memory at startup is below `total × --gpu-memory-utilization`
/// (v1/worker/utils.py:425-443 `request_memory` in 0.26.0, from gpu_worker.py:389): `Free memory on device
/// ... is less than desired GPU memory utilization`. `gpus`: (NVML index, total MiB, used MiB). NVML's free
/// memory is above what CUDA reports once the worker's context exists, but CUDA's total can be a little below
/// NVML's, and which GPUs the ranks get depends on CUDA's order: an error with the numbers, not confirmed.
pub fn check_vllm_free(gpus: &[(u32, u64, u64)], util: f64, needed: u64, rep: &mut Report) {
    let short: Vec<String> = gpus
        .iter()
        .filter(|(_, total, used)| (total.saturating_sub(*used) as f64) < *total as f64 * util)
        .map(|(i, total, used)| {
            format!(
                "GPU {i}: {} MiB free of {total}, {:.0} MiB asked",
                total.saturating_sub(*used),
                *total as f64 * util
            )
        })
        .collect();
    let enough = gpus.len() - short.len();
    if short.is_empty() || (enough as u64) >= needed {
        return;
    }
    rep.add(
        Severity::Error,
        "gpu-free",
        format!(
            "--gpu-memory-utilization {util} asks for more than is free ({}): vLLM raises `Free memory on device ... on startup is less than desired GPU memory utilization` (other processes hold the rest; not confirmed: NVML's and CUDA's totals differ slightly)",
            short.join("; ")
        ),
        Some("stop what holds the GPU (vigil ps, vigil gpu), or lower --gpu-memory-utilization below the free share".into()),
    );
}

/// The NCCL/Gloo variables naming interfaces and HCAs this machine does not have.
pub fn check_net(env: &[(String, String)], multi_gpu: bool, rep: &mut Report) {
    let get = |k: &str| env.iter().find(|(ek, _)| ek == k).map(|(_, v)| v.as_str());
    let names = |dir: &str| -> Option<Vec<String>> {
        let rd = std::fs::read_dir(dir).ok()?;
        Some(rd.flatten().take(4096).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
    };
    let ifaces = names("/sys/class/net");
    if let (Some(v), Some(have)) = (get("NCCL_SOCKET_IFNAME"), &ifaces) {
        if nccl_select(v, have).is_empty() {
            rep.add(
                if multi_gpu { Severity::Error } else { Severity::Warning },
                "nccl-env",
                format!("NCCL_SOCKET_IFNAME={v} matches none of this machine's interfaces ({}): NCCL finds no socket interface and its bootstrap fails", have.join(", ")),
                Some("name an interface `ip -br link` lists (a prefix such as eth matches eth0; =eth0 matches exactly; ^ excludes)".into()),
            );
        }
    }
    if let (Some(v), Some(have)) = (get("GLOO_SOCKET_IFNAME"), &ifaces) {
        let gone: Vec<&str> =
            v.split(',').map(str::trim).filter(|x| !x.is_empty() && !have.iter().any(|h| h == x)).collect();
        if !gone.is_empty() {
            rep.add(
                Severity::Error,
                "nccl-env",
                format!("GLOO_SOCKET_IFNAME={v}: no interface named {} here ({}): torch's Gloo group cannot bind to it (Gloo takes exact names)", gone.join(", "), have.join(", ")),
                Some("name an interface `ip -br link` lists, exactly".into()),
            );
        }
    }
    if let Some(v) = get("NCCL_IB_HCA") {
        let have = names("/sys/class/infiniband").unwrap_or_default();
        let bare: Vec<String> = v.split(',').map(|e| e.split(':').next().unwrap_or("").to_string()).collect();
        if nccl_select(&bare.join(","), &have).is_empty() {
            rep.add(
                Severity::Warning,
                "nccl-env",
                format!(
                    "NCCL_IB_HCA={v} matches no InfiniBand device here ({}): NCCL uses no IB and falls back to sockets (slow between nodes)",
                    if have.is_empty() { "/sys/class/infiniband is empty".to_string() } else { have.join(", ") }
                ),
                None,
            );
        }
    }
}

/// The names NCCL's filter keeps (NCCL docs, NCCL_SOCKET_IFNAME / NCCL_IB_HCA): a comma list of prefixes;
/// `^` before the list excludes them instead; `=` before an entry matches it exactly.
pub fn nccl_select(spec: &str, have: &[String]) -> Vec<String> {
    let (exclude, list) = match spec.strip_prefix('^') {
        Some(r) => (true, r),
        None => (false, spec),
    };
    let (exact, list) = match list.strip_prefix('=') {
        Some(r) => (true, r),
        None => (false, list),
    };
    let pats: Vec<&str> = list.split(',').map(str::trim).filter(|p| !p.is_empty()).collect();
    have.iter()
        .filter(|h| {
            let m = pats.iter().any(|p| if exact { h.as_str() == *p } else { h.starts_with(p) });
            m != exclude
        })
        .cloned()
        .collect()
}

/// Free disk where the compile caches are written (vLLM's torch.compile cache, Inductor, Triton).
pub fn check_caches(srv: Option<Srv>, env: &[(String, String)], free: &dyn Fn(&Path) -> Option<u64>, rep: &mut Report) {
    let get = |k: &str| env.iter().find(|(ek, _)| ek == k).map(|(_, v)| v.to_string());
    let home = get("HOME").unwrap_or_else(|| "/root".into());
    let xdg = get("XDG_CACHE_HOME").unwrap_or_else(|| format!("{home}/.cache"));
    let user = get("USER").unwrap_or_else(|| "root".into());
    let mut dirs: Vec<(String, String)> = vec![
        ("Triton's kernel cache".into(), get("TRITON_CACHE_DIR").unwrap_or_else(|| format!("{home}/.triton/cache"))),
        (
            "torch Inductor's cache".into(),
            get("TORCHINDUCTOR_CACHE_DIR").unwrap_or_else(|| format!("/tmp/torchinductor_{user}")),
        ),
    ];
    if srv == Some(Srv::Vllm) {
        dirs.push((
            "vLLM's torch.compile cache".into(),
            get("VLLM_CACHE_ROOT").unwrap_or_else(|| format!("{xdg}/vllm")),
        ));
    }
    for (what, d) in dirs {
        if let Some(f) = free(Path::new(&d)) {
            if f < 1 << 30 {
                rep.add(
                    Severity::Warning,
                    "disk",
                    format!(
                        "only {} MiB free under {d} ({what}): compiling kernels there can fail with ENOSPC",
                        f >> 20
                    ),
                    Some("free space there, or point the variable for it elsewhere".into()),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn vllm_first_visible_index_past_nvml_is_confirmed_and_only_for_vllm() {
        let argv = u(&["vllm", "serve", "m"]);
        let l = crate::check::launch::parse(&argv, Some("vllm"), None, Some("0.26.0")).unwrap();
        let g = Gpus { uuids: Some(u(&["GPU-a"])), source: Some("nvml"), why_not: None };
        let run = |srv, env: &[(&str, &str)], version: &str| {
            let mut rep = Report { version: Some(version.into()), ..Report::default() };
            let env: Vec<(String, String)> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            check_gpus(srv, &l, &argv, &env, &g, &mut rep);
            rep.findings.iter().filter(|f| f.confirmed.is_some()).count()
        };
        assert_eq!(run(Some(Srv::Vllm), &[("CUDA_VISIBLE_DEVICES", "1")], "0.26.0"), 1, "p8 on the H200");
        assert_eq!(run(Some(Srv::Vllm), &[("CUDA_VISIBLE_DEVICES", "0")], "0.26.0"), 0, "a GPU that exists");
        assert_eq!(run(Some(Srv::Vllm), &[], "0.26.0"), 0, "no variable");
        // "0,0": the first entry exists, CUDA shows none (torch's repeat rule): not this refusal's path
        assert_eq!(run(Some(Srv::Vllm), &[("CUDA_VISIBLE_DEVICES", "0,0")], "0.26.0"), 0);
        assert_eq!(run(Some(Srv::Vllm), &[("CUDA_VISIBLE_DEVICES", "1")], "0.25.0"), 0, "a release not read");
    }

    #[test]
    fn cuda_visible_devices_as_torch_reads_it() {
        assert_eq!(parse_visible("0,2,-1,1"), Visible::Ordinals(vec![0, 2]));
        assert_eq!(parse_visible("1gpu2,2ampere"), Visible::Ordinals(vec![1, 2]));
        assert_eq!(parse_visible("0,0"), Visible::Ordinals(vec![]));
        assert_eq!(parse_visible(""), Visible::Ordinals(vec![]));
        assert_eq!(parse_visible("GPU-ab,GPU-cd,3"), Visible::Uuids(u(&["GPU-ab", "GPU-cd"])));
        assert_eq!(parse_visible("MIG-x"), Visible::Mig(u(&["MIG-x"])));
        let two = u(&["GPU-aaaa-1", "GPU-bbbb-2"]);
        assert_eq!(resolve(Some("0,1"), Some(&two)).exact, Some(2));
        let s = resolve(Some("1,7,0"), Some(&two));
        assert_eq!((s.exact, s.dropped.clone()), (Some(1), u(&["7", "0"])));
        assert_eq!(resolve(Some("GPU-bbbb"), Some(&two)).exact, Some(1));
        assert_eq!(resolve(Some("GPU-bbbb,GPU-"), Some(&two)).exact, Some(1), "an ambiguous prefix ends the list");
        assert_eq!(resolve(Some("GPU-bbbb,GPU-bb"), Some(&two)).exact, Some(0), "a GPU named twice empties it");
        assert_eq!(resolve(Some("GPU-cccc"), Some(&two)).exact, Some(0));
        // Without NVML: only the upper bound.
        let s = resolve(Some("7"), None);
        assert_eq!((s.exact, s.at_most), (None, Some(1)));
        assert_eq!(resolve(None, Some(&two)).exact, Some(2));
    }

    #[test]
    fn vllm_free_memory_rule() {
        let mut rep = Report::default();
        // The kit's c2: a process holds all but 6 GiB of an H200; vLLM's default 0.9 is refused.
        check_vllm_free(&[(0, 143_771, 137_627)], 0.9, 1, &mut rep);
        assert_eq!(rep.findings.len(), 1);
        assert!(rep.findings[0].message.contains("GPU 0: 6144 MiB free of 143771"), "{}", rep.findings[0].message);
        let mut rep = Report::default();
        check_vllm_free(&[(0, 143_771, 600)], 0.9, 1, &mut rep);
        check_vllm_free(&[(0, 143_771, 137_627), (1, 143_771, 600)], 0.9, 1, &mut rep);
        check_vllm_free(&[(0, 143_771, 137_627)], 0.04, 1, &mut rep);
        assert!(rep.findings.is_empty());
    }

    #[test]
    fn nccl_filters() {
        let have = u(&["lo", "eth0", "eth1", "docker0", "ib0"]);
        assert_eq!(nccl_select("eth", &have), u(&["eth0", "eth1"]));
        assert_eq!(nccl_select("=eth", &have), Vec::<String>::new());
        assert_eq!(nccl_select("=eth1", &have), u(&["eth1"]));
        assert_eq!(nccl_select("^docker,lo", &have), u(&["eth0", "eth1", "ib0"]));
        assert_eq!(nccl_select("^=eth0", &have), u(&["lo", "eth1", "docker0", "ib0"]));
        assert!(nccl_select("enp", &have).is_empty());
    }
}
