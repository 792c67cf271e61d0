//! A recovered error is not a crash (issue #24, step 4): an error block that would end the start, followed
//! by progress in the same or an earlier phase, is a `retried` event and the start goes on.

use vigil_core::{Event, Offline, Profiles, Seen, Verdict};

fn run(text: &str) -> (Vec<Event>, vigil_core::Report) {
    let profiles = Profiles::builtin();
    let mut o = Offline::new(&profiles, None);
    let mut events = Vec::new();
    let mut each = |s: Seen| {
        if let Seen::Events(ev) = s {
            events.extend(ev.iter().cloned());
        }
    };
    for l in text.lines() {
        o.push(l, &mut each);
    }
    let r = o.finish(&mut each);
    (events, r)
}

/// llama.cpp's fit step (common/common.cpp common_fit_params) loads the model once to measure it and logs
/// the failure of that load, then loads it for real; the lines are llama-server's own (the failing load's from
/// corpus llama-cpp-captured-not-a-gguf, the good start's from llamacpp-captured-ready-then-sigint).
const FIT_THEN_LOADED: &str = "\
0.00.002.662 I srv  llama_server: initializing ...
0.00.008.333 I srv    load_model: loading model 'tiny.gguf'
0.00.005.882 E llama_model_load: error loading model: llama_model_loader: failed to load model from tiny.gguf
0.00.005.906 E llama_model_load_from_file_impl: failed to load model
0.00.005.952 E common_fit_params: encountered an error while trying to fit params to free device memory: failed to load model
0.00.008.400 I srv    load_model: loading model 'tiny.gguf'
0.00.089.358 I cmn          init: llama threadpool init, n_threads = 2
0.00.093.067 I srv    load_model: initializing, n_slots = 4, n_ctx_slot = 512, kv_unified = 'true'
0.00.095.288 I srv  llama_server: model loaded
0.00.095.292 I srv  llama_server: listening on http://127.0.0.1:51591
";

#[test]
fn an_error_followed_by_progress_in_the_same_phase_is_retried_not_a_crash() {
    let (events, r) = run(FIT_THEN_LOADED);
    let retried: Vec<&Event> = events.iter().filter(|e| matches!(e, Event::Retried { .. })).collect();
    assert_eq!(retried.len(), 1, "one retried event: {events:?}");
    if let Event::Retried { phase, error, went_on } = retried[0] {
        assert_eq!(phase.as_str(), "weights");
        assert!(error.contains("error loading model"), "{error}");
        assert!(went_on.contains("loading model 'tiny.gguf'"), "{went_on}");
    }
    assert_eq!(r.verdict, Verdict::Ready, "{r:?}");
}

#[test]
fn the_same_error_with_nothing_after_it_is_still_a_crash() {
    let cut: String = FIT_THEN_LOADED.lines().take(5).map(|l| format!("{l}\n")).collect();
    let (events, r) = run(&cut);
    assert!(!events.iter().any(|e| matches!(e, Event::Retried { .. })));
    assert_eq!(r.verdict, Verdict::Crashed);
}

#[test]
fn a_terminal_error_then_the_same_phase_again_is_retried() {
    // llama-server's own end-of-load line (terminal), then the load starting again: went on, no crash.
    let text = "\
0.00.008.333 I srv    load_model: loading model 'tiny.gguf'
0.00.006.059 E srv    load_model: failed to load model, 'tiny.gguf'
0.00.008.400 I srv    load_model: loading model 'tiny.gguf'
";
    let (events, r) = run(text);
    assert!(events.iter().any(|e| matches!(e, Event::Retried { .. })), "{events:?}");
    assert_eq!(r.verdict, Verdict::Starting, "{r:?}");
}

#[test]
fn a_terminal_error_then_a_later_phase_is_still_a_crash() {
    // The server did not go back to redo the failed step: the terminal line decides.
    let text = "\
0.00.008.333 I srv    load_model: loading model 'tiny.gguf'
0.00.006.059 E srv    load_model: failed to load model, 'tiny.gguf'
0.00.095.292 I srv  llama_server: listening on http://127.0.0.1:51591
";
    let (events, r) = run(text);
    assert!(!events.iter().any(|e| matches!(e, Event::Retried { .. })), "{events:?}");
    assert_eq!(r.verdict, Verdict::Crashed);
}
