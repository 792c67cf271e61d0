//! What `--listen` answers from: the event log (every JSON object the process's reporters render, redacted,
//! each with an id) and the view built from those same objects. The view decides nothing: the verdict, its
//! cause and hint, the phase and the ETA are the core's, read from its events; this module only keeps the
//! latest of each and says which HTTP status a probe gets for it.
//!
//! The log is bounded (`MAX_EVENTS` objects and `MAX_BYTES` of JSON, the oldest dropped first); a client
//! resuming from an id older than the oldest kept gets a `gap` marker before the first event it can have.
//! Pushing never blocks and never awaits: a lock held for one append, and a `watch` channel whose send
//! only replaces a value.

use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// At most this many events are kept for replay.
pub const MAX_EVENTS: usize = 10_000;
/// At most this many bytes of JSON are kept for replay.
pub const MAX_BYTES: usize = 4 << 20;

/// One rank (or the one server of a single watch): its phase and since when (ms since the listener began).
#[derive(Debug, Clone)]
struct Rank {
    phase: String,
    since_ms: u64,
    verdict: Option<String>,
}

/// The latest state, as the events told it.
#[derive(Debug, Default)]
struct View {
    run: Map<String, Value>,
    phase: Option<String>,
    phase_since_ms: u64,
    /// The last phase or progress event's `eta_ms`, and when it came.
    eta: Option<(u64, u64)>,
    usual_ms: Option<u64>,
    progress: Option<Value>,
    ranks: BTreeMap<(String, u64), Rank>,
    /// The overall verdict (untagged, or a multi-node/fleet end), the full object.
    verdict: Option<Value>,
    /// The verdict object of the ready the run reached (kept after a later failure).
    ready: Option<Value>,
    /// The last generation (the proof) event.
    proof: Option<Value>,
    /// An orderly end (`stopped`).
    stopped: Option<Value>,
    evidence: Vec<String>,
    multi: bool,
}

/// The event log and the view, behind one lock.
struct Inner {
    log: VecDeque<(u64, Arc<str>)>,
    bytes: usize,
    next_id: u64,
    view: View,
}

/// The hub the reporters push into and the listener reads.
pub struct Hub {
    t0: Instant,
    host: String,
    inner: Mutex<Inner>,
    last: tokio::sync::watch::Sender<u64>,
}

/// What a probe endpoint answers: the status and a JSON body.
pub struct Answer {
    pub status: u16,
    pub body: Value,
}

/// A batch of events for one SSE client: a gap (ids no longer kept) and the events after its cursor.
pub struct Batch {
    pub gap: Option<(u64, u64)>,
    pub events: Vec<(u64, Arc<str>)>,
}

fn str_of(v: &Value, k: &str) -> Option<String> {
    v.get(k).and_then(Value::as_str).map(String::from)
}

impl Hub {
    pub fn new(host: String) -> Hub {
        let (last, _) = tokio::sync::watch::channel(0);
        Hub {
            t0: Instant::now(),
            host,
            inner: Mutex::new(Inner { log: VecDeque::new(), bytes: 0, next_id: 1, view: View::default() }),
            last,
        }
    }

    fn now_ms(&self) -> u64 {
        self.t0.elapsed().as_millis() as u64
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // a panic while holding it cannot leave the log half-written (every change is one push/pop)
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One event, as the reporter rendered it (a JSON object, already redacted). Never blocks on clients.
    pub fn push(&self, json: &str) {
        let Ok(v) = serde_json::from_str::<Value>(json) else { return };
        let now = self.now_ms();
        let id = {
            let mut g = self.lock();
            g.view.apply(&v, now);
            let id = g.next_id;
            g.next_id += 1;
            g.bytes += json.len();
            g.log.push_back((id, Arc::from(json)));
            while g.log.len() > MAX_EVENTS || (g.bytes > MAX_BYTES && g.log.len() > 1) {
                if let Some((_, e)) = g.log.pop_front() {
                    g.bytes -= e.len();
                }
            }
            id
        };
        self.last.send_replace(id);
    }

    /// Changes of the last id (SSE clients wait on it).
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.last.subscribe()
    }

    /// The id of the last event (0 before the first).
    pub fn last_id(&self) -> u64 {
        self.lock().next_id - 1
    }

    /// Up to `max` events after id `after`, and the gap before them when the log no longer has them all.
    pub fn since(&self, after: u64, max: usize) -> Batch {
        let g = self.lock();
        let first = g.log.front().map_or(g.next_id, |e| e.0);
        let gap = (after + 1 < first && after + 1 < g.next_id).then(|| (after + 1, first - 1));
        let skip = g.log.partition_point(|e| e.0 <= after);
        let events = g.log.iter().skip(skip).take(max).cloned().collect();
        Batch { gap, events }
    }

    /// `/livez`.
    pub fn livez(&self) -> Answer {
        Answer { status: 200, body: json!({"live": true, "elapsed_ms": self.now_ms()}) }
    }

    /// `/startupz`: 503 while starting (phase, ranks, elapsed, ETA), 200 once ready (with the proof), 500
    /// after a verdict that ends the start (crashed, stalled, timeout, unhealthy before ready; or stopped).
    pub fn startupz(&self) -> Answer {
        let now = self.now_ms();
        let g = self.lock();
        let v = &g.view;
        if let Some(r) = &v.ready {
            return Answer {
                status: 200,
                body: json!({"state": "ready", "phase": v.phase, "ranks": v.ranks_json(&self.host), "elapsed": now,
                    "proof": v.proof, "verdict": r}),
            };
        }
        if let Some(r) = &v.verdict {
            return Answer { status: 500, body: failed(r) };
        }
        if let Some(s) = &v.stopped {
            return Answer {
                status: 500,
                body: json!({"state": "stopped", "verdict": "stopped", "phase": v.phase, "cause": null,
                    "detail": s.get("how"), "hint": null}),
            };
        }
        Answer {
            status: 503,
            body: json!({"state": "starting", "phase": v.phase.as_deref().unwrap_or("launch"),
                "ranks": v.ranks_json(&self.host), "elapsed": now, "eta": v.eta_now(now)}),
        }
    }

    /// `/readyz`: 200 only while ready and healthy; otherwise 503 and why.
    pub fn readyz(&self) -> Answer {
        let g = self.lock();
        let v = &g.view;
        let not = |state: &str, why: String| Answer {
            status: 503,
            body: json!({"ready": false, "state": state, "why": why, "phase": v.phase}),
        };
        if let Some(s) = &v.stopped {
            return not("stopped", str_of(s, "how").unwrap_or_else(|| "stopped".into()));
        }
        match (&v.ready, &v.verdict) {
            (Some(_), Some(r)) if str_of(r, "verdict").as_deref() != Some("ready") => {
                let word = str_of(r, "verdict").unwrap_or_default();
                not(&word, why_of(r))
            }
            (Some(r), _) => match r.get("degraded").and_then(Value::as_str) {
                Some(d) => not("degraded", format!("degraded: {d}")),
                None => Answer { status: 200, body: json!({"ready": true, "state": "ready", "phase": v.phase}) },
            },
            (None, Some(r)) => not(&str_of(r, "verdict").unwrap_or_default(), why_of(r)),
            (None, None) => not("starting", format!("starting: phase {}", v.phase.as_deref().unwrap_or("launch"))),
        }
    }

    /// `/status`: the whole state.
    pub fn status(&self, listener: Value) -> Value {
        let now = self.now_ms();
        let g = self.lock();
        let v = &g.view;
        let state = if v.stopped.is_some() {
            "stopped".to_string()
        } else {
            v.verdict.as_ref().and_then(|r| str_of(r, "verdict")).unwrap_or_else(|| "starting".into())
        };
        let mut evidence = v.evidence.clone();
        if let Some(e) = v.verdict.as_ref().and_then(|r| r.get("evidence")).and_then(Value::as_array) {
            evidence.extend(e.iter().filter_map(Value::as_str).map(String::from));
        }
        json!({
            "run": v.run,
            "state": state,
            "phase": v.phase,
            "in_phase_ms": v.phase.as_ref().map(|_| now.saturating_sub(v.phase_since_ms)),
            "elapsed_ms": now,
            "eta_ms": v.eta_now(now),
            "progress": v.progress,
            "multi_node": v.multi,
            "ranks": v.ranks_json(&self.host),
            "verdict": v.verdict,
            "ready": v.ready.is_some(),
            "proof": v.proof,
            "stopped": v.stopped,
            "evidence": evidence,
            "history": {
                "usual_ms": v.usual_ms,
                "eta_ms": v.eta_now(now),
                "baseline": v.verdict.as_ref().and_then(|r| r.get("baseline")),
            },
            "events": {
                "first_id": g.log.front().map(|e| e.0),
                "last_id": g.next_id - 1,
                "kept": g.log.len(),
            },
            "listener": listener,
        })
    }
}

/// The 500 body of `/startupz`: the verdict as the core gave it.
fn failed(r: &Value) -> Value {
    json!({"state": r.get("verdict"), "verdict": r.get("verdict"), "phase": r.get("phase"), "cause": r.get("cause"),
        "detail": r.get("detail"), "hint": r.get("hint"), "evidence": r.get("evidence"), "host": r.get("host")})
}

/// Why a verdict is not ready, in one line (its detail and cause, as the core wrote them).
fn why_of(r: &Value) -> String {
    let word = str_of(r, "verdict").unwrap_or_default();
    let mut s = word;
    if let Some(c) = str_of(r, "cause") {
        s.push_str(&format!(" ({c})"));
    }
    if let Some(d) = str_of(r, "detail") {
        s.push_str(&format!(": {d}"));
    }
    s
}

impl View {
    fn eta_now(&self, now: u64) -> Option<u64> {
        self.eta.map(|(eta, at)| eta.saturating_sub(now.saturating_sub(at)))
    }

    fn ranks_json(&self, local: &str) -> Value {
        if self.ranks.is_empty() {
            return json!([{"rank": 0, "host": local, "phase": self.phase.as_deref().unwrap_or("launch"),
                "since": self.phase_since_ms}]);
        }
        Value::Array(
            self.ranks
                .iter()
                .map(|((h, r), k)| {
                    json!({"rank": r, "host": if h.is_empty() { local } else { h }, "phase": k.phase,
                        "since": k.since_ms, "verdict": k.verdict})
                })
                .collect(),
        )
    }

    /// One event into the view. Only what the core already said is kept; nothing is judged here.
    fn apply(&mut self, v: &Value, now: u64) {
        let ev = v.get("event").and_then(Value::as_str).unwrap_or("");
        let host = str_of(v, "host");
        let rank = v.get("rank").and_then(Value::as_u64);
        let tagged = host.is_some();
        if rank.is_some() {
            self.multi = true;
        }
        let key = (host.clone().unwrap_or_default(), rank.unwrap_or(0));
        match ev {
            "start" | "launched" => {
                if let Some(m) = v.as_object() {
                    for (k, x) in m {
                        if !matches!(k.as_str(), "event" | "t_ms" | "host" | "rank") {
                            self.run.entry(k.clone()).or_insert_with(|| x.clone());
                        }
                    }
                }
                if tagged {
                    self.ranks.entry(key).or_insert(Rank { phase: "launch".into(), since_ms: now, verdict: None });
                }
            }
            "detected" => {
                if let Some(s) = v.get("server") {
                    self.run.insert("server".into(), s.clone());
                }
            }
            "phase" => {
                let phase = str_of(v, "phase").unwrap_or_default();
                let r = self.ranks.entry(key).or_insert(Rank { phase: phase.clone(), since_ms: now, verdict: None });
                r.phase = phase.clone();
                r.since_ms = now;
                if !self.multi || !tagged {
                    self.set_phase(phase, now);
                }
                self.usual_ms = v.get("usual_ms").and_then(Value::as_u64);
                self.eta = v.get("eta_ms").and_then(Value::as_u64).map(|e| (e, now));
                self.progress = None;
            }
            // the head's view of every rank of a multi-node server (members included)
            "rank_phase" => {
                self.multi = true;
                let phase = str_of(v, "phase").unwrap_or_default();
                let key =
                    (str_of(v, "of_host").unwrap_or_default(), v.get("of_rank").and_then(Value::as_u64).unwrap_or(0));
                let r = self.ranks.entry(key).or_insert(Rank { phase: phase.clone(), since_ms: now, verdict: None });
                if r.phase != phase {
                    r.phase = phase;
                    r.since_ms = now;
                }
            }
            "multi_node_phase" => {
                self.multi = true;
                if let Some(p) = str_of(v, "phase") {
                    self.set_phase(p, now);
                }
            }
            "progress" => {
                self.progress = Some(v.clone());
                if let Some(e) = v.get("eta_ms").and_then(Value::as_u64) {
                    self.eta = Some((e, now));
                }
            }
            "generation" => self.proof = Some(v.clone()),
            "evidence" => {
                if let Some(d) = str_of(v, "dir") {
                    self.evidence.push(d);
                }
            }
            "stopped" if v.get("how").is_some() => self.stopped = Some(v.clone()),
            "verdict" => {
                let word = str_of(v, "verdict");
                if tagged {
                    if let Some(r) = self.ranks.get_mut(&key) {
                        r.verdict = word.clone();
                    }
                }
                // a member's verdict is its rank's; the server's is the untagged one, or the group's end
                if !tagged || (!self.multi && self.ranks.len() <= 1) {
                    self.decide(v.clone(), now);
                }
            }
            "multi_node_verdict" | "fleet" => {
                let exit = v.get("exit").and_then(Value::as_i64).unwrap_or(1);
                let word = match (ev, exit) {
                    (_, 0) => "ready".to_string(),
                    ("multi_node_verdict", _) => str_of(v, "verdict").unwrap_or_else(|| "crashed".into()),
                    _ => v
                        .get("hosts")
                        .and_then(Value::as_array)
                        .and_then(|hs| hs.iter().find(|h| h.get("exit").and_then(Value::as_i64) != Some(0)))
                        .and_then(|h| str_of(h, "verdict"))
                        .unwrap_or_else(|| "crashed".into()),
                };
                // every member's end, as the group's verdict lists it
                for h in v.get("hosts").and_then(Value::as_array).into_iter().flatten() {
                    let key =
                        (str_of(h, "host").unwrap_or_default(), h.get("rank").and_then(Value::as_u64).unwrap_or(0));
                    let phase = str_of(h, "phase");
                    let r = self.ranks.entry(key).or_insert(Rank {
                        phase: phase.clone().unwrap_or_else(|| "launch".into()),
                        since_ms: now,
                        verdict: None,
                    });
                    r.verdict = str_of(h, "verdict");
                    if let Some(p) = phase.filter(|p| *p != r.phase) {
                        r.phase = p;
                        r.since_ms = now;
                    }
                }
                let mut o = v.clone();
                if let Some(m) = o.as_object_mut() {
                    m.insert("verdict".into(), word.into());
                    if let Some(h) = v.get("hosts").and_then(Value::as_array) {
                        let bad = h.iter().find(|h| h.get("exit").and_then(Value::as_i64) != Some(0));
                        if let Some(b) = bad {
                            m.entry("detail").or_insert_with(|| b.get("detail").cloned().unwrap_or(Value::Null));
                        }
                    }
                }
                self.decide(o, now);
            }
            _ => {}
        }
    }

    fn set_phase(&mut self, p: String, now: u64) {
        if self.phase.as_deref() != Some(p.as_str()) {
            self.phase = Some(p);
            self.phase_since_ms = now;
        }
    }

    fn decide(&mut self, v: Value, now: u64) {
        if let Some(p) = str_of(&v, "phase") {
            self.set_phase(p, now);
        }
        if str_of(&v, "verdict").as_deref() == Some("ready") {
            self.ready = Some(v.clone());
            self.eta = None;
        }
        self.verdict = Some(v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hub() -> Hub {
        Hub::new("here".into())
    }

    #[test]
    fn startupz_follows_the_verdict_events() {
        let h = hub();
        h.push(r#"{"event":"start","t_ms":0,"log":"/l"}"#);
        let a = h.startupz();
        assert_eq!((a.status, a.body["state"].as_str()), (503, Some("starting")));
        h.push(r#"{"event":"phase","phase":"weights","from":"launch","eta_ms":5000}"#);
        let a = h.startupz();
        assert_eq!(a.body["phase"], "weights");
        assert_eq!(a.body["ranks"][0]["phase"], "weights");
        assert!(a.body["eta"].as_u64().is_some_and(|e| e <= 5000));
        assert_eq!(h.readyz().status, 503);
        h.push(r#"{"event":"generation","ok":true,"tokens":2}"#);
        h.push(r#"{"event":"verdict","verdict":"ready","phase":"serving","cause":null}"#);
        let a = h.startupz();
        assert_eq!((a.status, a.body["proof"]["tokens"].as_u64()), (200, Some(2)));
        assert_eq!(h.readyz().status, 200);
        // the after-ready watch decides unhealthy: startup stays done, readiness goes
        h.push(r#"{"event":"verdict","verdict":"unhealthy","phase":"serving","cause":null,"detail":"probes failing for 3s"}"#);
        assert_eq!(h.startupz().status, 200);
        let r = h.readyz();
        assert_eq!(r.status, 503);
        assert!(r.body["why"].as_str().unwrap().contains("probes failing"), "{}", r.body);
        assert_eq!(h.livez().status, 200);
    }

    #[test]
    fn a_crash_is_500_with_its_cause_and_degraded_is_not_ready() {
        let h = hub();
        h.push(r#"{"event":"verdict","verdict":"crashed","phase":"weights","cause":"model_file","detail":"exited with status 1","hint":"h"}"#);
        let a = h.startupz();
        assert_eq!((a.status, a.body["cause"].as_str()), (500, Some("model_file")));
        assert_eq!(a.body["hint"], "h");
        let h = hub();
        h.push(r#"{"event":"verdict","verdict":"ready","phase":"serving","degraded":"speculation off: x"}"#);
        assert_eq!(h.startupz().status, 200);
        assert_eq!(h.readyz().status, 503);
    }

    #[test]
    fn the_log_replays_resumes_and_marks_a_gap() {
        let h = hub();
        for i in 0..5 {
            h.push(&format!(r#"{{"event":"note","message":"{i}"}}"#));
        }
        let b = h.since(0, 100);
        assert_eq!(b.events.iter().map(|e| e.0).collect::<Vec<_>>(), vec![1, 2, 3, 4, 5]);
        assert!(b.gap.is_none());
        let b = h.since(3, 100);
        assert_eq!(b.events.iter().map(|e| e.0).collect::<Vec<_>>(), vec![4, 5]);
        assert!(h.since(5, 100).events.is_empty());
        for i in 0..MAX_EVENTS {
            h.push(&format!(r#"{{"event":"note","message":"{i}"}}"#));
        }
        let b = h.since(2, 3);
        assert_eq!(b.gap, Some((3, 5)));
        assert_eq!(b.events[0].0, 6);
        assert_eq!(h.lock().log.len(), MAX_EVENTS);
    }

    #[test]
    fn multi_node_ranks_come_from_the_heads_events() {
        let h = hub();
        h.push(r#"{"event":"phase","phase":"weights","from":"launch","host":"a","rank":0}"#);
        h.push(r#"{"event":"rank_phase","of_rank":1,"of_host":"b","phase":"dist_init","host":"a","rank":0}"#);
        h.push(r#"{"event":"multi_node_phase","phase":"dist_init","slowest_rank":1,"slowest_host":"b","host":"a","rank":0}"#);
        let s = h.status(Value::Null);
        let ranks = s["ranks"].as_array().unwrap();
        assert_eq!(ranks.len(), 2, "{s}");
        assert_eq!((ranks[1]["host"].as_str(), ranks[1]["phase"].as_str()), (Some("b"), Some("dist_init")));
        assert_eq!(s["phase"], "dist_init");
        // a rank's own ready is not the server's
        h.push(r#"{"event":"verdict","verdict":"ready","phase":"serving","host":"a","rank":0}"#);
        assert_eq!(h.startupz().status, 503);
        h.push(r#"{"event":"multi_node_verdict","exit":0,"verdict":"ready","phase":"serving","hosts":[]}"#);
        assert_eq!(h.startupz().status, 200);
    }
}
