//! Evidence parsing and summaries, on output captured from the real py-spy 0.4.3 and eu-stack (elfutils
//! 0.188) against the stand-in server of crates/vigil/tests/standin (the path in it shortened).

use vigil_core::evidence::{parse_eu_stack, parse_py_spy, summarize};

const PY: &str = include_str!("evidence/standin-parent.py-spy.txt");
const EU: &str = include_str!("evidence/standin-parent.eu-stack.txt");
const PID: i32 = 16829;

#[test]
fn py_spy_threads_and_frames() {
    let t = parse_py_spy(PY);
    assert_eq!(t.len(), 3);
    assert_eq!(t[0].name.as_deref(), Some("MainThread"));
    assert!(t[0].idle);
    let f = &t[0].frames;
    assert_eq!((f[0].func.as_str(), f[0].python), ("clock_nanosleep", false));
    assert_eq!(
        (f[2].func.as_str(), f[2].file.as_deref(), f[2].line),
        ("waiting_for_engine", Some("engine_server.py"), Some(73))
    );
    assert!(f[2].python);
    assert_eq!(t[2].name.as_deref(), Some("Thread-2 (serve_forever)"));
}

#[test]
fn eu_stack_threads_and_frames() {
    let t = parse_eu_stack(EU);
    assert!(!t.is_empty());
    assert_eq!(t[0].id, PID.to_string());
    assert!(t[0].frames.len() > 3);
    assert!(t[0].frames[0].func.contains("nanosleep"), "{:?}", t[0].frames[0]);
}

#[test]
fn summary_names_the_main_threads_innermost_meaningful_frame() {
    let s = summarize(PID, &parse_py_spy(PY), &parse_eu_stack(EU), Some("hrtimer_nanosleep"));
    assert_eq!(
        s,
        "`waiting_for_engine` in engine_server.py:73 → native `clock_nanosleep` (kernel wait `hrtimer_nanosleep`)"
    );
}

#[test]
fn stdlib_plumbing_is_skipped_for_the_first_caller_outside_it() {
    let text = "Thread 7 (idle): \"MainThread\"\n    wait (threading.py:320)\n    get (queue.py:171)\n    \
                event_loop (/usr/lib/python3/dist-packages/sglang/srt/managers/scheduler.py:900)\n    <module> (x.py:1)\n";
    let s = summarize(7, &parse_py_spy(text), &[], None);
    assert_eq!(s, "`event_loop` in scheduler.py:900 → `wait` (threading.py)");
}

#[test]
fn without_python_the_native_frames_tell_and_without_both_the_wait_channel() {
    let s = summarize(PID, &[], &parse_eu_stack(EU), Some("hrtimer_nanosleep"));
    assert_eq!(s, "native `time_sleep` → `clock_nanosleep@GLIBC_2.2.5` (kernel wait `hrtimer_nanosleep`)");
    assert_eq!(summarize(1, &[], &[], Some("pipe_read")), "kernel wait `pipe_read`");
    assert_eq!(summarize(1, &[], &[], Some("0")), "no stack (see the notes)");
}

#[test]
fn processes_at_the_same_place_share_a_line() {
    use vigil_core::evidence::{Evidence, ProcEvidence};
    let p = |pid: i32, title: &str, at: &str| ProcEvidence {
        pid,
        title: title.into(),
        state: Some('S'),
        wchan: None,
        at: at.into(),
        files: vec![],
        notes: vec![],
    };
    let ev = Evidence {
        dir: "/x".into(),
        procs: vec![
            p(10, "VLLM::EngineCore", "`run_busy_loop` in core.py:100"),
            p(11, "VLLM::Worker_TP0", "`all_reduce` in parallel_state.py:400"),
            p(12, "VLLM::Worker_TP1", "`capture` in cuda_graph.py:9"),
            p(13, "VLLM::Worker_TP2", "`all_reduce` in parallel_state.py:400"),
            p(14, "VLLM::Worker_TP3", "`all_reduce` in parallel_state.py:400"),
        ],
        nccl_dumps: vec![],
        notes: vec![],
        took_ms: 1,
    };
    assert_eq!(
        ev.lines(),
        vec![
            "pid 10 `VLLM::EngineCore`: `run_busy_loop` in core.py:100",
            "pids 11, 13, 14 (`VLLM::Worker_TP0` and 2 more): `all_reduce` in parallel_state.py:400",
            "pid 12 `VLLM::Worker_TP1`: `capture` in cuda_graph.py:9",
        ]
    );
}

#[test]
fn native_plumbing_is_skipped_for_the_first_caller_outside_it() {
    // the real llama-server's main thread waiting for work (eu-stack, elfutils 0.188)
    let text = "PID 7 - process\nTID 7:\n#0  0x00007f1 __futex_abstimed_wait_common\n#1  0x00007f2 pthread_cond_clockwait@GLIBC_2.30\n\
                #2  0x00007f3 server_queue::start_loop(long)\n#3  0x00007f4 main\n";
    let s = summarize(7, &[], &parse_eu_stack(text), Some("futex_do_wait"));
    assert_eq!(
        s,
        "native `server_queue::start_loop(long)` → `__futex_abstimed_wait_common` (kernel wait `futex_do_wait`)"
    );
}
