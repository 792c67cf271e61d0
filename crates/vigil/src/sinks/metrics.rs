//! Prometheus metrics, served at `/metrics` by the `--listen` listener (`--metrics ADDR` is its alias;
//! `sinks/listen/`).
//!
//! One label set per run: `run` (the run's name) and `server` (its kind, known from the command line
//! when given, else once the log names it). Every series carries both; when the kind becomes known the
//! old label set is gone from the next scrape (nothing keeps a stale `server="unknown"` series at 1).
//! Exactly one `vigil_phase` and one `vigil_verdict` series is 1 at any time.
//!
//! The exposition is written here, not by a client library, because both formats are needed: the
//! classic text format 0.0.4 (what `promtool check metrics` reads) and OpenMetrics 1.0 (what
//! Prometheus asks for first); the `Accept` header chooses. Values are computed at scrape time (time
//! in phase), so they never freeze while vigil runs. A watch tells its `Metrics` as a `sinks::sink::Sink`
//! (gauges from the judge, probe latencies, the verdict).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use vigil_core::{Phase, Verdict};

/// Every verdict a run can be in (one of them is 1).
pub const VERDICTS: [Verdict; 6] =
    [Verdict::Starting, Verdict::Ready, Verdict::Crashed, Verdict::Stalled, Verdict::Timeout, Verdict::Unhealthy];

const PROBE_BUCKETS: &[f64] = &[0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];
const PHASE_BUCKETS: &[f64] = &[1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0, 7200.0];

#[derive(Clone, Debug)]
struct Hist {
    bounds: &'static [f64],
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Hist {
    fn new(bounds: &'static [f64]) -> Hist {
        Hist { bounds, counts: vec![0; bounds.len()], sum: 0.0, count: 0 }
    }
    fn observe(&mut self, v: f64) {
        if let Some(i) = self.bounds.iter().position(|b| v <= *b) {
            self.counts[i] += 1;
        }
        self.sum += v;
        self.count += 1;
    }
}

#[derive(Debug)]
struct State {
    run: String,
    server: String,
    phase: Phase,
    /// Unix seconds at which the current phase began.
    phase_since: f64,
    verdict: Verdict,
    restarts: u64,
    probe: Hist,
    /// Startup phases that ended, with how long each took.
    phase_durations: BTreeMap<&'static str, Hist>,
}

#[derive(Clone)]
pub struct Metrics {
    st: Arc<Mutex<State>>,
}

fn now_unix() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

/// The two exposition formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Prometheus text format 0.0.4.
    Text,
    /// OpenMetrics 1.0.0.
    OpenMetrics,
}

impl Format {
    /// From an `Accept` header: OpenMetrics when the client names it (Prometheus does, first), else text.
    pub fn from_accept(accept: Option<&str>) -> Format {
        let om = accept.is_some_and(|a| {
            a.split(',').any(|part| {
                let mut it = part.split(';').map(str::trim);
                let ty = it.next().unwrap_or("");
                let q0 = it.any(|p| p.replace(' ', "") == "q=0" || p.replace(' ', "") == "q=0.0");
                ty.eq_ignore_ascii_case("application/openmetrics-text") && !q0
            })
        });
        if om {
            Format::OpenMetrics
        } else {
            Format::Text
        }
    }
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Text => "text/plain; version=0.0.4; charset=utf-8",
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }
}

fn esc(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

fn num(v: f64) -> String {
    if v.is_infinite() {
        return if v > 0.0 { "+Inf".into() } else { "-Inf".into() };
    }
    if v.fract() == 0.0 && v.abs() < 1e15 {
        return format!("{}", v as i64);
    }
    format!("{v}")
}

impl Metrics {
    /// `server`: the kind when the command line names it; "unknown" until the log does.
    pub fn new(run: &str, server: Option<&str>, restart_count: u64) -> Metrics {
        Metrics {
            st: Arc::new(Mutex::new(State {
                run: run.to_string(),
                server: server.unwrap_or("unknown").to_string(),
                phase: Phase::Launch,
                phase_since: now_unix(),
                verdict: Verdict::Starting,
                restarts: restart_count,
                probe: Hist::new(PROBE_BUCKETS),
                phase_durations: BTreeMap::new(),
            })),
        }
    }

    pub fn set_server(&self, s: &str) {
        self.st.lock().unwrap().server = s.to_string();
    }

    /// The judge's view: the current phase (and how long it has lasted) and the verdict. A phase change
    /// during startup records the duration of the phase that ended.
    pub fn update(&self, phase: Phase, in_phase: Duration, verdict: Verdict) {
        let mut st = self.st.lock().unwrap();
        let now = now_unix();
        if phase != st.phase {
            let start = now - in_phase.as_secs_f64();
            if st.verdict == Verdict::Starting {
                let took = (start - st.phase_since).max(0.0);
                let old = st.phase.as_str();
                st.phase_durations.entry(old).or_insert_with(|| Hist::new(PHASE_BUCKETS)).observe(took);
            }
            st.phase = phase;
            st.phase_since = start;
        }
        st.verdict = verdict;
    }

    pub fn set_verdict(&self, v: Verdict) {
        self.st.lock().unwrap().verdict = v;
    }

    pub fn probe_latency(&self, s: f64) {
        self.st.lock().unwrap().probe.observe(s);
    }

    pub fn render(&self, f: Format) -> String {
        let st = self.st.lock().unwrap();
        let now = now_unix();
        let base = format!("run=\"{}\",server=\"{}\"", esc(&st.run), esc(&st.server));
        let mut o = String::with_capacity(4096);
        let head = |o: &mut String, name: &str, ty: &str, unit: Option<&str>, help: &str| {
            // the text format names a counter by its sample (`_total`); OpenMetrics by its family
            let fam = if f == Format::OpenMetrics { name.strip_suffix("_total").unwrap_or(name) } else { name };
            let _ = writeln!(o, "# HELP {fam} {help}");
            let _ = writeln!(o, "# TYPE {fam} {ty}");
            if let (Format::OpenMetrics, Some(u)) = (f, unit) {
                let _ = writeln!(o, "# UNIT {fam} {u}");
            }
        };
        head(&mut o, "vigil_phase", "gauge", None, "1 for the server's current phase, 0 for the others.");
        for p in Phase::ALL {
            let _ = writeln!(o, "vigil_phase{{{base},phase=\"{}\"}} {}", p.as_str(), u8::from(p == st.phase));
        }
        head(
            &mut o,
            "vigil_phase_started_timestamp_seconds",
            "gauge",
            Some("seconds"),
            "Unix time at which the current phase began.",
        );
        let _ = writeln!(o, "vigil_phase_started_timestamp_seconds{{{base}}} {}", num(st.phase_since));
        head(&mut o, "vigil_phase_seconds", "gauge", Some("seconds"), "Seconds in the current phase.");
        let _ =
            writeln!(o, "vigil_phase_seconds{{{base}}} {}", num(((now - st.phase_since) * 1000.0).round() / 1000.0));
        head(
            &mut o,
            "vigil_verdict",
            "gauge",
            None,
            "1 for the run's current verdict (starting, ready, crashed, stalled, timeout, unhealthy), 0 for the others.",
        );
        for v in VERDICTS {
            let _ = writeln!(o, "vigil_verdict{{{base},verdict=\"{}\"}} {}", v.as_str(), u8::from(v == st.verdict));
        }
        let hist = |o: &mut String, name: &str, labels: &str, h: &Hist| {
            let mut cum = 0;
            for (b, c) in h.bounds.iter().zip(&h.counts) {
                cum += c;
                let _ = writeln!(o, "{name}_bucket{{{labels},le=\"{}\"}} {cum}", num(*b));
            }
            let _ = writeln!(o, "{name}_bucket{{{labels},le=\"+Inf\"}} {}", h.count);
            let _ = writeln!(o, "{name}_sum{{{labels}}} {}", num(h.sum));
            let _ = writeln!(o, "{name}_count{{{labels}}} {}", h.count);
        };
        head(&mut o, "vigil_probe_latency_seconds", "histogram", Some("seconds"), "Latency of health probes.");
        hist(&mut o, "vigil_probe_latency_seconds", &base, &st.probe);
        head(
            &mut o,
            "vigil_phase_duration_seconds",
            "histogram",
            Some("seconds"),
            "How long each startup phase took (observed when the phase ends).",
        );
        for (p, h) in &st.phase_durations {
            hist(&mut o, "vigil_phase_duration_seconds", &format!("{base},phase=\"{p}\""), h);
        }
        head(&mut o, "vigil_restarts_total", "counter", None, "Restarts of this run (vigil restart).");
        let _ = writeln!(o, "vigil_restarts_total{{{base}}} {}", st.restarts);
        if f == Format::OpenMetrics {
            o.push_str("# EOF\n");
        }
        o
    }
}

/// `--metrics 9464` → 127.0.0.1:9464; `--metrics HOST:PORT` as given.
pub fn parse_addr(s: &str) -> Result<std::net::SocketAddr, String> {
    if let Ok(p) = s.parse::<u16>() {
        return Ok(std::net::SocketAddr::from(([127, 0, 0, 1], p)));
    }
    s.parse().map_err(|_| format!("bad address '{s}' (PORT or HOST:PORT)"))
}

/// The watch's gauges: the judge's phase and verdict after each input, probe latencies, the verdict.
impl crate::sinks::sink::Sink for Metrics {
    fn gauges(&mut self, j: &vigil_core::Judge, server: Option<&str>, v: Verdict) {
        if let Some(s) = server {
            self.set_server(s);
        }
        self.update(j.phase(), Duration::from_millis(j.in_phase_ms().unwrap_or(0)), v);
    }

    fn probe_latency(&mut self, latency: Duration) {
        Metrics::probe_latency(self, latency.as_secs_f64());
    }

    fn verdict(&mut self, _t_ms: u64, r: &vigil_core::Report) {
        self.set_verdict(r.verdict);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples(body: &str) -> BTreeMap<String, f64> {
        body.lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .map(|l| {
                let (k, v) = l.rsplit_once(' ').unwrap();
                (k.to_string(), v.parse::<f64>().unwrap_or(f64::NAN))
            })
            .collect()
    }

    #[test]
    fn one_label_set_and_one_phase_and_verdict() {
        let m = Metrics::new("kimi", None, 2);
        m.update(Phase::Weights, Duration::ZERO, Verdict::Starting);
        m.set_server("kind-a");
        m.update(Phase::KvCache, Duration::from_millis(5), Verdict::Starting);
        m.update(Phase::Serving, Duration::ZERO, Verdict::Ready);
        for f in [Format::Text, Format::OpenMetrics] {
            let body = m.render(f);
            assert!(!body.contains("unknown"), "{body}");
            let s = samples(&body);
            for k in s.keys() {
                assert!(k.contains("run=\"kimi\",server=\"kind-a\""), "unlabelled: {k}");
            }
            let ones = |prefix: &str| s.iter().filter(|(k, v)| k.starts_with(prefix) && **v == 1.0).count();
            assert_eq!(ones("vigil_phase{"), 1, "{body}");
            assert_eq!(ones("vigil_verdict{"), 1, "{body}");
            assert_eq!(s["vigil_verdict{run=\"kimi\",server=\"kind-a\",verdict=\"ready\"}"], 1.0);
            assert_eq!(s["vigil_restarts_total{run=\"kimi\",server=\"kind-a\"}"], 2.0);
            assert_eq!(
                s["vigil_phase_duration_seconds_count{run=\"kimi\",server=\"kind-a\",phase=\"weights\"}"], 1.0,
                "{body}"
            );
            // every family has HELP and TYPE
            for fam in ["vigil_phase", "vigil_verdict", "vigil_probe_latency_seconds", "vigil_phase_duration_seconds"] {
                assert!(body.contains(&format!("# HELP {fam} ")) && body.contains(&format!("# TYPE {fam} ")), "{fam}");
            }
        }
        let om = m.render(Format::OpenMetrics);
        assert!(om.ends_with("# EOF\n"));
        assert!(om.contains("# TYPE vigil_restarts counter\n") && om.contains("# UNIT vigil_phase_seconds seconds\n"));
        let text = m.render(Format::Text);
        assert!(
            text.contains("# TYPE vigil_restarts_total counter\n")
                && !text.contains("# EOF")
                && !text.contains("# UNIT")
        );
    }

    #[test]
    fn histogram_is_cumulative() {
        let m = Metrics::new("r", Some("kind-b"), 0);
        for v in [0.001, 0.02, 0.02, 3.0, 100.0] {
            m.probe_latency(v);
        }
        let s = samples(&m.render(Format::Text));
        let b = |le: &str| s[&format!("vigil_probe_latency_seconds_bucket{{run=\"r\",server=\"kind-b\",le=\"{le}\"}}")];
        assert_eq!((b("0.005"), b("0.025"), b("5"), b("30"), b("+Inf")), (1.0, 3.0, 4.0, 4.0, 5.0));
    }

    #[test]
    fn negotiation() {
        let prom = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert_eq!(Format::from_accept(Some(prom)), Format::OpenMetrics);
        assert!(Format::OpenMetrics.content_type().starts_with("application/openmetrics-text"));
        assert_eq!(Format::from_accept(Some("text/plain")), Format::Text);
        assert!(Format::Text.content_type().starts_with("text/plain; version=0.0.4"));
        assert_eq!(Format::from_accept(None), Format::Text);
        assert_eq!(Format::from_accept(Some("application/openmetrics-text; q=0")), Format::Text);
    }
}
