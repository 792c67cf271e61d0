//! Engine progress from the server's own metrics, on virtual time: requests waiting while the token
//! counters stand still for the window is `unhealthy`; idle, counting, or a reset is not.

use vigil_core::engine_metrics::{prom_sum, sample, MetricsSample, MetricsWatch};
use vigil_core::judge::ProbeOutcome;
use vigil_core::*;

fn s(waiting: f64, running: f64, tokens: f64) -> MetricsSample {
    MetricsSample { waiting: Some(waiting), running: Some(running), tokens }
}

#[test]
fn prometheus_sums_label_sets_and_skips_comments_and_longer_names() {
    let t = "# HELP vllm:num_requests_waiting Number of requests waiting.\n# TYPE vllm:num_requests_waiting gauge\n\
             vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 3.0\n\
             vllm:num_requests_waiting{engine=\"1\",model_name=\"m\"} 2.0\n\
             vllm:num_requests_waiting_by_reason{reason=\"capacity\"} 9.0\n\
             vllm:generation_tokens_total{model_name=\"m\"} 1234.0\n";
    assert_eq!(prom_sum(t, "vllm:num_requests_waiting"), Some(5.0));
    assert_eq!(prom_sum(t, "vllm:generation_tokens_total"), Some(1234.0));
    assert_eq!(prom_sum(t, "vllm:num_requests_running"), None);
}

#[test]
fn a_page_without_the_token_counters_is_not_this_servers_metrics() {
    let p = Profiles::builtin();
    let spec = p.get("vllm").unwrap().metrics.clone().unwrap();
    assert!(sample("go_goroutines 12\n", &spec).is_none());
    let got =
        sample("vllm:num_requests_running 1\nvllm:generation_tokens_total 10\nvllm:prompt_tokens_total 5\n", &spec)
            .unwrap();
    assert_eq!((got.waiting, got.running, got.tokens), (None, Some(1.0), 15.0));
}

#[test]
fn waiting_with_still_counters_for_the_window_is_stuck() {
    let mut w = MetricsWatch::default();
    assert!(w.observe(0, &s(2.0, 1.0, 100.0), 30_000).is_none());
    assert!(w.observe(10_000, &s(2.0, 1.0, 100.0), 30_000).is_none());
    assert!(w.observe(29_999, &s(2.0, 1.0, 100.0), 30_000).is_none());
    let st = w.observe(30_000, &s(2.0, 1.0, 100.0), 30_000).expect("stuck");
    assert_eq!((st.waiting, st.running, st.still_ms), (2.0, 1.0, 30_000));
}

#[test]
fn idle_or_counting_or_reset_is_never_stuck() {
    let mut w = MetricsWatch::default();
    // idle for an hour: nothing to do is not stuck
    for t in 0..60 {
        assert!(w.observe(t * 60_000, &s(0.0, 0.0, 100.0), 30_000).is_none());
    }
    // busy and counting
    let mut w = MetricsWatch::default();
    for t in 0..100 {
        assert!(w.observe(t * 10_000, &s(4.0, 8.0, 100.0 + t as f64), 30_000).is_none());
    }
    // the counters move once within the window: the window starts again
    let mut w = MetricsWatch::default();
    w.observe(0, &s(1.0, 0.0, 5.0), 30_000);
    w.observe(20_000, &s(1.0, 0.0, 6.0), 30_000);
    assert!(w.observe(40_000, &s(1.0, 0.0, 6.0), 30_000).is_none());
    assert!(w.observe(50_000, &s(1.0, 0.0, 6.0), 30_000).is_some());
    // a restart resets the counters to 0: that is a change, not a stall
    let mut w = MetricsWatch::default();
    w.observe(0, &s(1.0, 0.0, 500.0), 30_000);
    assert!(w.observe(20_000, &s(1.0, 0.0, 0.0), 30_000).is_none());
    assert!(w.observe(45_000, &s(1.0, 0.0, 0.0), 30_000).is_none());
}

fn verdict(ev: Vec<Event>) -> Option<Report> {
    ev.into_iter().find_map(|e| match e {
        Event::Verdict(r) => Some(*r),
        _ => None,
    })
}

#[test]
fn judge_after_ready_gives_unhealthy_from_metrics_alone_while_health_answers() {
    let cfg =
        JudgeConfig { live: true, require_probe: true, metrics_window_ms: Some(30_000), ..JudgeConfig::default() };
    let mut j = Judge::new(cfg);
    let f = |at, input| Fact { at: Some(at), input };
    j.feed(f(0, Input::Tick));
    assert_eq!(verdict(j.feed(f(100, Input::Probe(ProbeOutcome::Ok)))).unwrap().verdict, Verdict::Ready);
    for t in (1..=6).map(|k| k * 5_000) {
        assert!(verdict(j.feed(f(t, Input::Metrics(s(3.0, 1.0, 42.0))))).is_none(), "at {t}");
        assert!(verdict(j.feed(f(t + 1, Input::Probe(ProbeOutcome::Ok)))).is_none());
    }
    let r = verdict(j.feed(f(35_000, Input::Metrics(s(3.0, 1.0, 42.0))))).expect("unhealthy");
    assert_eq!((r.verdict, r.phase), (Verdict::Unhealthy, Phase::Serving));
    assert!(r.detail.as_deref().unwrap().contains("3 request(s) waiting"), "{:?}", r.detail);
}

#[test]
fn judge_before_ready_ignores_metrics() {
    let cfg = JudgeConfig { live: true, metrics_window_ms: Some(1_000), ..JudgeConfig::default() };
    let mut j = Judge::new(cfg);
    for t in 0..10 {
        assert!(verdict(j.feed(Fact { at: Some(t * 1000), input: Input::Metrics(s(1.0, 0.0, 0.0)) })).is_none());
    }
    assert_eq!(j.state(), Verdict::Starting);
}
