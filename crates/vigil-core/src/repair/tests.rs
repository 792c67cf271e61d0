//! The planner on the built-in profiles' rules: every reason for no repair, the bounds, the same cause twice,
//! and one repair of each action.

use super::*;
use crate::Profiles;

fn argv(s: &str) -> Vec<String> {
    s.split_whitespace().map(String::from).collect()
}

fn lines(s: &[&str]) -> Vec<String> {
    s.iter().map(|x| x.to_string()).collect()
}

struct Case {
    kind: &'static str,
    verdict: Option<Verdict>,
    cause: Option<Cause>,
    phase: Phase,
    lines: Vec<String>,
    holders: Vec<Holder>,
    argv: Vec<String>,
    level: Level,
    max: usize,
    done: Vec<Done>,
    facts: BTreeMap<String, f64>,
}

impl Case {
    fn new(kind: &'static str, cause: Cause, phase: Phase, cmd: &str, log: &[&str]) -> Case {
        Case {
            kind,
            verdict: Some(Verdict::Crashed),
            cause: Some(cause),
            phase,
            lines: lines(log),
            holders: vec![],
            argv: argv(cmd),
            level: Level::Keep,
            max: 2,
            done: vec![],
            facts: BTreeMap::new(),
        }
    }

    fn plan(&self) -> Decision {
        let p = Profiles::builtin();
        let rules = p.repairs_for(Some(self.kind));
        let f = Failure {
            verdict: self.verdict,
            cause: self.cause,
            phase: self.phase,
            lines: &self.lines,
            holders: &self.holders,
        };
        let s = Setting {
            level: self.level,
            max: self.max,
            argv: &self.argv,
            rules: &rules,
            done: &self.done,
            facts: &self.facts,
        };
        plan(&f, &s)
    }

    fn repaired(&self) -> RepairPlan {
        match self.plan() {
            Decision::Repair(p) => *p,
            Decision::NoRepair { why } => panic!("no repair: {why}"),
        }
    }

    fn why(&self) -> String {
        match self.plan() {
            Decision::Repair(p) => panic!("repaired: {}", p.edit_text()),
            Decision::NoRepair { why } => why,
        }
    }
}

const LLAMA_CTX: &[&str] = &[
    "llama_context: n_ctx_seq (100000000) > n_ctx_train (512) -- possible training context overflow",
    "ggml_backend_cpu_buffer_type_alloc_buffer: failed to allocate buffer of size 25600000000",
    "llama_init_from_model: failed to initialize the context: failed to allocate buffer for kv cache",
];

fn llama_ctx() -> Case {
    Case::new("llama-cpp", Cause::HostOom, Phase::KvCache, "llama-server -m m.gguf -c 100000000 --port 8080", LLAMA_CTX)
}

#[test]
fn a_context_over_the_trained_one_becomes_the_trained_one_under_any() {
    let mut c = llama_ctx();
    c.level = Level::Any;
    let p = c.repaired();
    assert_eq!(p.rule, "context-over-train");
    assert_eq!(p.argv, argv("llama-server -m m.gguf -c 512 --port 8080"));
    assert_eq!(p.edit_text(), "-c 100000000 -> 512");
    assert_eq!(p.level, Level::Any);
    assert_eq!(p.changes.as_deref(), Some("the context length"));
    // four sequences sharing the context: the trained context for each
    c.lines[0] = "llama_context: n_ctx_seq (25000000) > n_ctx_train (512) -- possible training context overflow".into();
    assert_eq!(c.repaired().edit_text(), "-c 100000000 -> 2048");
    // a wrapper's own -c before the server's is not the server's
    c.lines = lines(LLAMA_CTX);
    c.argv = argv("sh -c x sh llama-server -m m.gguf -c 100000000");
    assert_eq!(c.repaired().argv, argv("sh -c x sh llama-server -m m.gguf -c 512"));
    // --ctx-size=N is edited in its own spelling
    c.argv = argv("llama-server -m m.gguf --ctx-size=100000000");
    assert_eq!(c.repaired().argv, argv("llama-server -m m.gguf --ctx-size=512"));
}

#[test]
fn the_context_the_user_set_is_kept_under_plain_repair() {
    let w = llama_ctx().why();
    assert!(w.ends_with("the context length is what you set; --repair=any may change it"), "{w}");
}

#[test]
fn a_context_within_the_trained_one_goes_to_the_servers_fit_step_unless_fit_is_off() {
    let mut c = Case::new(
        "llama-cpp",
        Cause::GpuOom,
        Phase::KvCache,
        "llama-server -m m.gguf -c 65536 -ngl 99",
        &["llama_init_from_model: failed to initialize the context: failed to allocate buffer for kv cache"],
    );
    c.level = Level::Any;
    let p = c.repaired();
    assert_eq!(p.rule, "context-to-fit");
    assert_eq!(p.argv, argv("llama-server -m m.gguf -ngl 99"));
    assert_eq!(p.edit_text(), "-c 65536 -> (removed: the server chooses)");
    // given twice: both go (the last was in force)
    c.argv = argv("llama-server -c 1024 -m m.gguf --ctx-size=65536");
    assert_eq!(c.repaired().argv, argv("llama-server -m m.gguf"));
    assert_eq!(c.repaired().edit_text(), "--ctx-size 65536 -> (removed: the server chooses)");
    c.argv = argv("llama-server -m m.gguf -c 65536 -fit off");
    assert!(c.why().starts_with("no repair is known for crashed in kv_cache"), "{}", c.why());
}

#[test]
fn a_foreign_holder_is_named_and_never_repaired() {
    let mut c = Case::new("llama-cpp", Cause::PortInUse, Phase::Http, "llama-server -m m.gguf --port 8080", &[]);
    c.verdict = None;
    c.holders = vec![Holder {
        pid: 77,
        cmd: "python3 -c import socket".into(),
        of: HolderOf::NotVigils,
        holds: "port 8080".into(),
    }];
    let w = c.why();
    assert!(w.contains("port 8080 is held by pid 77 (python3 -c import socket), a process vigil did not start"), "{w}");
    c.holders[0].of = HolderOf::OtherRun("other".into());
    assert!(c.why().contains("run 'other' of vigil's"), "{}", c.why());
    // one of this run's beside a foreign one: still nothing is touched
    c.holders.push(Holder { pid: 5, cmd: "llama-server".into(), of: HolderOf::ThisRun, holds: "port 8080".into() });
    assert!(c.why().contains("pid 77"));
}

#[test]
fn an_earlier_attempt_of_this_run_is_stopped() {
    let mut c = Case::new("llama-cpp", Cause::PortInUse, Phase::Launch, "llama-server -m m.gguf --port 8080", &[]);
    c.verdict = None;
    c.cause = None;
    c.holders = vec![
        Holder { pid: 41, cmd: "llama-server".into(), of: HolderOf::ThisRun, holds: "port 8080".into() },
        Holder { pid: 41, cmd: "llama-server".into(), of: HolderOf::ThisRun, holds: "port 8080".into() },
    ];
    let p = c.repaired();
    assert_eq!(p.rule, "earlier-attempt");
    assert_eq!(p.action, RepairAction::StopLeftover { pids: vec![41], holds: vec!["port 8080".into()] });
    assert_eq!(p.argv, c.argv, "the command is not changed");
    assert_eq!(p.edit_text(), "stop the earlier attempt (pid 41, holding port 8080)");
    // after a crash the run's processes are the attempt that crashed: never a reason to relaunch
    c.verdict = Some(Verdict::Crashed);
    c.cause = Some(Cause::Unknown);
    assert_eq!(c.why(), "the cause is unknown: vigil repairs only a failure whose cause it knows");
    c.cause = Some(Cause::PortInUse);
    assert_eq!(c.why(), "no repair is known for crashed in launch, cause port_in_use");
}

#[test]
fn an_unknown_cause_is_not_repaired() {
    let mut c = llama_ctx();
    c.level = Level::Any;
    c.cause = Some(Cause::Unknown);
    assert_eq!(c.why(), "the cause is unknown: vigil repairs only a failure whose cause it knows");
    c.cause = None;
    assert_eq!(c.why(), "the cause is unknown: vigil repairs only a failure whose cause it knows");
}

#[test]
fn a_model_config_error_is_not_repaired() {
    let c = Case::new(
        "vllm",
        Cause::Config,
        Phase::Launch,
        "vllm serve /m --max-model-len 100000",
        &["pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig"],
    );
    assert!(c.why().starts_with("the server refused the model or its configuration"), "{}", c.why());
    let c = Case::new("llama-cpp", Cause::ModelFile, Phase::Weights, "llama-server -m m.gguf", &[]);
    assert!(c.why().starts_with("the server refused the model"), "{}", c.why());
}

#[test]
fn the_same_cause_after_its_repair_is_not_repaired_again() {
    let mut c = Case::new(
        "sglang",
        Cause::GpuOom,
        Phase::KvCache,
        "python -m sglang.launch_server --model-path /m --mem-fraction-static 0.07",
        &["ValueError: Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=0.07. Raise --mem-fraction-static above 0.074 (minimum viable = 1 - available/pre = 0.0732)."],
    );
    c.done = vec![Done {
        cause: Some(Cause::GpuOom),
        rule: "kv-short".into(),
        edit: "--mem-fraction-static 0.05 -> 0.07".into(),
        why: "the weights leave no memory for the KV cache".into(),
    }];
    assert_eq!(
        c.why(),
        "the repair did not help: gpu_oom again after --mem-fraction-static 0.05 -> 0.07 (the weights leave no memory for the KV cache)"
    );
    // another cause after it may be repaired
    c.done[0].cause = Some(Cause::PortInUse);
    assert_eq!(c.repaired().edit_text(), "--mem-fraction-static 0.07 -> 0.094");
}

#[test]
fn attempts_are_bounded() {
    let mut c = llama_ctx();
    c.level = Level::Any;
    c.max = 1;
    c.done =
        vec![Done { cause: Some(Cause::PortInUse), rule: "earlier-attempt".into(), edit: "x".into(), why: "y".into() }];
    assert_eq!(c.why(), "1 repair made, the most --repair=1 allows");
    c.max = 0;
    c.done.clear();
    assert_eq!(c.why(), "0 repairs made, the most --repair=0 allows");
}

#[test]
fn a_timeout_is_never_repaired() {
    let mut c = llama_ctx();
    c.verdict = Some(Verdict::Timeout);
    assert!(c.why().starts_with("the overall --timeout passed"));
}

#[test]
fn shares_stay_within_the_bound_and_move_only_up() {
    let log = ["(EngineCore pid=1) ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization`",
        "(EngineCore pid=1) INFO 12-01 15:58:19 [gpu_worker.py:560] Available KV cache memory: -3.47 GiB"];
    let mut c = Case::new("vllm", Cause::GpuOom, Phase::KvCache, "vllm serve /m --gpu-memory-utilization 0.5", &log);
    // without the GPU's size: the step
    assert_eq!(c.repaired().edit_text(), "--gpu-memory-utilization 0.5 -> 0.55");
    // with it: what is missing plus 1 GiB
    c.facts.insert("gpu_total_gib".into(), 100.0);
    assert_eq!(c.repaired().edit_text(), "--gpu-memory-utilization 0.5 -> 0.5447");
    // unset: from vLLM's default, to the bound at most
    c.argv = argv("vllm serve /m");
    let p = c.repaired();
    assert_eq!(p.edit_text(), "--gpu-memory-utilization (unset: 0.92) -> 0.95");
    assert_eq!(p.argv, argv("vllm serve /m --gpu-memory-utilization 0.95"));
    // at the bound: no repair, and says why
    c.argv = argv("vllm serve /m --gpu-memory-utilization=0.95");
    let w = c.why();
    assert!(w.contains("--gpu-memory-utilization is 0.95 already, at the bound vigil keeps (0.95)"), "{w}");
    // a value vigil cannot read is left alone
    c.argv = argv("vllm serve /m --gpu-memory-utilization lots");
    assert!(c.why().contains("is not a number vigil can change"), "{}", c.why());
}

#[test]
fn the_kv_message_sizes_the_share_and_the_context_is_the_last_resort_under_any() {
    let log = ["ValueError: To serve at least one request with the model's max seq len (131072), (16.0 GiB KV cache is needed, which is larger than the available KV cache memory (4.0 GiB). Based on the available memory, the estimated maximum model length is 32768. Try increasing `gpu_memory_utilization`"];
    let mut c = Case::new("vllm", Cause::Config, Phase::KvCache, "vllm serve /m --gpu-memory-utilization 0.8", &log);
    c.facts.insert("gpu_total_gib".into(), 140.0);
    assert_eq!(c.repaired().edit_text(), "--gpu-memory-utilization 0.8 -> 0.8957");
    // at the bound, plain --repair stops; --repair=any takes the server's estimate
    c.argv = argv("vllm serve /m --gpu-memory-utilization 0.95");
    let w = c.why();
    assert!(w.contains("the context length (--max-model-len) is what you set; --repair=any may change it"), "{w}");
    c.level = Level::Any;
    let p = c.repaired();
    assert_eq!(p.edit_text(), "--max-model-len (unset: 131072) -> 32768");
    assert_eq!(p.changes.as_deref(), Some("the context length (--max-model-len)"));
}

#[test]
fn a_foreign_gpu_holder_in_vllms_words_is_not_repaired() {
    let log = ["ValueError: Free memory on device cuda:0 (6.0/139.8 GiB) on startup is less than desired GPU memory utilization (0.92, 128.6 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes."];
    let c = Case::new("vllm", Cause::GpuOom, Phase::Launch, "vllm serve /m", &log);
    assert!(c.why().starts_with("another process holds the GPU memory vLLM was told to take"), "{}", c.why());
}

#[test]
fn capture_oom_halves_the_capture_size_from_the_servers_own_number() {
    let log = ["INFO [core.py:116] Initializing a V1 LLM engine (v0.26.0) with config: compilation_config={'max_cudagraph_capture_size': 512}",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"];
    let c = Case::new("vllm", Cause::GpuOom, Phase::CudaGraphs, "vllm serve /m", &log);
    assert_eq!(c.repaired().edit_text(), "--max-cudagraph-capture-size (unset: 512) -> 256");
    let log = [
        "Capturing batches (bs=160 avail_mem=38.07 GB):   2%|| 1/36",
        "Capturing batches (bs=152 avail_mem=38.0 GB)",
        "Exception: Capture cuda graph failed: CUDA out of memory.",
    ];
    let mut c =
        Case::new("sglang", Cause::GpuOom, Phase::CudaGraphs, "python -m sglang.launch_server --model-path /m", &log);
    assert_eq!(c.repaired().edit_text(), "--cuda-graph-max-bs-decode (unset: 160) -> 80");
    // the deprecated spelling is edited where the user wrote it; down to 1 at least
    c.argv = argv("python -m sglang.launch_server --cuda-graph-max-bs 1");
    assert!(c.why().contains("--cuda-graph-max-bs is 1 already, at the bound vigil keeps (1)"), "{}", c.why());
}

#[test]
fn a_stalled_capture_runs_without_graphs_only_under_any() {
    let mut c = Case::new("vllm", Cause::Unknown, Phase::CudaGraphs, "vllm serve /m", &[]);
    c.verdict = Some(Verdict::Stalled);
    c.cause = None;
    assert!(c.why().contains("CUDA graphs (--enforce-eager runs without them) is what you set"), "{}", c.why());
    c.level = Level::Any;
    let p = c.repaired();
    assert_eq!(p.argv, argv("vllm serve /m --enforce-eager"));
    assert_eq!(p.edit_text(), "+ --enforce-eager");
    // a stall elsewhere has no known repair
    c.phase = Phase::Weights;
    assert_eq!(c.why(), "no repair is known for stalled in weights");
}

#[test]
fn a_rule_whose_numbers_the_log_lacks_says_so() {
    let mut c = Case::new(
        "sglang",
        Cause::GpuOom,
        Phase::KvCache,
        "python -m sglang.launch_server --model-path /m",
        &["RuntimeError: Not enough memory. Please try to increase --mem-fraction-static."],
    );
    let w = c.why();
    assert!(w.contains("--mem-fraction-static is not given and the value the server used is not known (the log does not give $mfs)"), "{w}");
    c.lines.push("RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. Current value: mem_fraction_static=0.81".into());
    assert_eq!(c.repaired().edit_text(), "--mem-fraction-static (unset: 0.81) -> 0.86");
}

#[test]
fn expressions() {
    let v = BTreeMap::from([("a".to_string(), 3.0), ("b".to_string(), 4.0)]);
    let e = |s: &str| Expr::parse(s).unwrap().eval(&v);
    assert_eq!(e("$a + $b * 2").unwrap(), 11.0);
    assert_eq!(e("($a + $b) * 2").unwrap(), 14.0);
    assert_eq!(e("-$a + max($b, 10) - min(1, 2) / 2").unwrap(), 6.5);
    assert_eq!(e("$c + 1").unwrap_err(), "$c");
    for bad in ["$a +", "max($a)", "3 $a", "$ + 1", "a # b", "(1"] {
        assert!(Expr::parse(bad).is_err(), "{bad}");
    }
    assert_eq!(fmt_num(0.5447000001, false), "0.5447");
    assert_eq!(fmt_num(512.0, true), "512");
    assert_eq!(fmt_num(0.95, false), "0.95");
}

#[test]
fn a_bad_rule_is_an_error_naming_it() {
    let bad = |extra: &str| {
        let t =
            format!("name = \"x\"\n[[repair]]\nname = \"r\"\nwhy = \"w\"\nsource = \"s\"\nversions = \"v\"\n{extra}\n");
        Profiles::load(&[("u.toml".into(), t)]).err().map(|e| e.0).unwrap_or_default()
    };
    assert!(bad("action = \"set\"").contains("repair 'r': set needs flag, value and direction"));
    assert!(bad("action = \"mend\"").contains("action is set, unset, add"));
    assert!(bad("action = \"add\"\nargs = [\"--x\"]\nlevel = \"any\"").contains("level any needs `changes`"));
    assert!(bad("action = \"refuse\"\ncause = [\"bad\"]").contains("unknown cause 'bad'"));
    assert!(bad("action = \"set\"\nflag = [\"-c\"]\nvalue = [\"$a +\"]\ndirection = \"up\"").contains("value '$a +'"));
    assert_eq!(bad("action = \"refuse\""), "");
}

#[test]
fn every_built_in_repair_cites_its_source_and_versions() {
    let p = Profiles::builtin();
    let mut n = 0;
    for prof in p.names() {
        for r in &p.get(prof).unwrap().repairs {
            assert!(r.source.len() > 20 && !r.versions.is_empty(), "{prof}/{}", r.name);
            n += 1;
        }
    }
    assert!(n >= 14, "{n}");
}
