//! GPU health on readings captured on the lent H200 machine (crates/vigil/tests/gpu-captures/health, see
//! its README) replayed, and on readings derived from them with the values NVML and nvidia-smi document for
//! the faults that machine does not have (ECC errors, pending remaps, a narrow link, no P2P, an NVLink down).

use vigil_core::gpu_health::*;

const SMI_Q: &str = include_str!("../../vigil/tests/gpu-captures/health/smi-q.txt");
const NVML: &str = include_str!("../../vigil/tests/gpu-captures/health/nvml-health.json");
const TOPO: &str = include_str!("../../vigil/tests/gpu-captures/health/topo.txt");

fn nvml() -> NvmlReadings {
    serde_json::from_str(NVML).expect("the capture parses as NVML readings")
}

fn section<'a>(text: &'a str, title: &str) -> &'a str {
    let start = text.find(title).unwrap() + title.len();
    let rest = &text[start..];
    &rest[..rest.find("\n## ").unwrap_or(rest.len())]
}

#[test]
fn captured_smi_q_reads_the_h200_as_healthy() {
    let g = parse_smi_q(SMI_Q);
    assert_eq!(g.len(), 1);
    let g0 = &g[0];
    assert_eq!(
        (g0.index, g0.name.as_deref(), g0.bus_id.as_deref()),
        (0, Some("NVIDIA H200"), Some("00000000:00:06.0"))
    );
    assert_eq!(
        (g0.pcie_gen, g0.pcie_gen_max, g0.pcie_width, g0.pcie_width_max),
        (Some(5), Some(5), Some(16), Some(16))
    );
    assert_eq!((g0.persistence, g0.ecc_enabled, g0.ecc_uncorrected_volatile), (Some(true), Some(true), Some(0)));
    assert_eq!((g0.remapped_pending, g0.remapped_failure, g0.retired_pending), (Some(false), Some(false), None));
    assert!(findings(&g, &[], None).is_empty(), "{:?}", findings(&g, &[], None));
}

#[test]
fn captured_nvml_readings_agree_with_smi_q() {
    let (g, p2p) = nvml().health();
    assert_eq!(g.len(), 1);
    let s = &parse_smi_q(SMI_Q)[0];
    let n = &g[0];
    assert_eq!(
        (n.pcie_gen, n.pcie_gen_max, n.pcie_width, n.pcie_width_max),
        (s.pcie_gen, s.pcie_gen_max, s.pcie_width, s.pcie_width_max)
    );
    assert_eq!(
        (n.persistence, n.ecc_enabled, n.ecc_uncorrected_volatile),
        (s.persistence, s.ecc_enabled, s.ecc_uncorrected_volatile)
    );
    assert_eq!((n.remapped_pending, n.remapped_failure), (s.remapped_pending, s.remapped_failure));
    // retired pages are not supported on Hopper (ret 3), nor are NVLinks in this VM: unknown, not "down"
    assert_eq!(n.retired_pending, None);
    assert!(n.nvlink_active.is_empty());
    // one GPU: only the self pair, never judged
    assert_eq!(p2p.len(), 1);
    assert!(findings(&g, &p2p, None).is_empty());
}

#[test]
fn captured_topo_p2p_matrix_of_one_gpu_has_no_pairs() {
    assert!(parse_topo_p2p(section(TOPO, "## nvidia-smi topo -p2p r")).is_empty());
    assert!(p2p_from_topo(section(TOPO, "## nvidia-smi topo -p2p r"), section(TOPO, "## nvidia-smi topo -p2p w"))
        .is_empty());
}

#[test]
fn derived_smi_q_faults_are_warnings() {
    let t = SMI_Q
        .replacen("DRAM Uncorrectable                         : 0", "DRAM Uncorrectable                         : 3", 1)
        .replacen(
            "        Pending                                        : No\n        Remapping",
            "        Pending                                        : Yes\n        Remapping",
            1,
        )
        .replacen(
            "                Current                                : 16x",
            "                Current                                : 8x",
            1,
        )
        .replacen(
            "                Current                                : 5\n",
            "                Current                                : 1\n",
            1,
        )
        .replacen(
            "Persistence Mode                                   : Enabled",
            "Persistence Mode                                   : Disabled",
            1,
        );
    let g = parse_smi_q(&t);
    assert_eq!(g[0].ecc_uncorrected_volatile, Some(3));
    let f = findings(&g, &[], None);
    let codes: Vec<(&str, Level)> = f.iter().map(|f| (f.code, f.level)).collect();
    assert_eq!(
        codes,
        vec![
            ("ecc_uncorrected", Level::Warning),
            ("remapped_pending", Level::Warning),
            ("pcie_width", Level::Warning),
            ("pcie_gen", Level::Info),
            ("persistence_off", Level::Info),
        ],
        "{f:?}"
    );
    assert!(f[2].message.contains("x8, below its x16"), "{}", f[2].message);
}

#[test]
fn derived_nvml_faults_p2p_and_nvlink() {
    let mut r = nvml();
    let mut g1 = r.gpus[0].clone();
    g1.index = 1;
    // NVLink: link 3 down while the others are up (nvmlDeviceGetNvLinkState: NVML_FEATURE_DISABLED = 0)
    for l in g1.nvlink.iter_mut() {
        l.ret = 0;
        l.active = Some(u32::from(l.link != 3));
    }
    g1.remapped_rows.failure = Some(1);
    r.gpus.push(g1);
    // two PCIe cards without P2P: NVML_P2P_STATUS_CHIPSET_NOT_SUPPORTED (1) for read and write
    let bad = P2pStatusReading { ret: 0, status: Some(1) };
    r.p2p.push(NvmlP2p { a: 0, b: 1, read: bad.clone(), write: bad });
    let (g, p2p) = r.health();
    let f = findings(&g, &p2p, Some(&[0, 1]));
    let codes: Vec<&str> = f.iter().map(|f| f.code).collect();
    assert_eq!(codes, vec!["remap_failure", "nvlink_down", "no_p2p"], "{f:?}");
    assert!(f[1].message.contains("[3]"), "{}", f[1].message);
    assert!(f[2].message.contains("chipset not supported"), "{}", f[2].message);
    // a server on GPU 0 only does not care about P2P between 0 and 1
    assert!(!findings(&g, &p2p, Some(&[0])).iter().any(|f| f.code == "no_p2p"));
    // no finding is ever an error: a false refusal is the worst bug
    assert!(f.iter().all(|f| f.level <= Level::Warning));
}

#[test]
fn derived_topo_p2p_matrix_of_two_pcie_cards() {
    let r = " \tGPU0\tGPU1\t\n GPU0\tX\tCNS\t\n GPU1\tCNS\tX\t\n\nLegend:\n\n  X    = Self\n";
    let w = " \tGPU0\tGPU1\t\n GPU0\tX\tOK\t\n GPU1\tOK\tX\t\n";
    let p = p2p_from_topo(r, w);
    assert_eq!(p.len(), 2);
    assert_eq!(
        (p[0].a, p[0].b, p[0].read.as_deref(), p[0].write.as_deref()),
        (0, 1, Some("chipset not supported"), Some("ok"))
    );
    assert_eq!(findings(&[], &p, None).len(), 1);
}

/// During a watch an Xid on the server's GPU is a fact the verdict names (a stall here).
#[test]
fn an_xid_during_the_watch_is_named_by_the_verdict() {
    use vigil_core::{Event, Fact, Input, Judge, JudgeConfig, Verdict};
    let cfg = JudgeConfig { live: true, stall_enabled: true, stall_default_ms: Some(10_000), ..JudgeConfig::default() };
    let mut j = Judge::new(cfg);
    j.feed(Fact { at: Some(0), input: Input::Tick });
    let ev = j.feed(Fact { at: Some(2_000), input: Input::GpuEvent(GpuEvent { gpu: 3, xid: Some(79), kind: "xid" }) });
    assert!(ev.iter().any(|e| matches!(e, Event::GpuEvent(g) if g.xid == Some(79))));
    let r = j
        .feed(Fact { at: Some(10_000), input: Input::Tick })
        .into_iter()
        .find_map(|e| match e {
            Event::Verdict(r) => Some(r),
            _ => None,
        })
        .expect("stalled");
    assert_eq!(r.verdict, Verdict::Stalled);
    assert!(r.detail.as_deref().unwrap().contains("Xid 79 on GPU 3 at 2.0s"), "{:?}", r.detail);
}
