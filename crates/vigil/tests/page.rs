//! The live page (`crates/vigil/assets/page.html`, served at `/` by `--listen`) in a real headless browser:
//! Debian's chromium, driven through the DevTools protocol (tests/browser). Each rank's phase and the verdict
//! (cause, hint, evidence) must appear within 1 s of their events, no request may leave the page's origin, and
//! a hostile log line must show as text, creating no element and no request.
//!
//! Most checks serve the page from a scripted stand-in
//! for `vigil --listen` (below): `/` with the listener's Content-Security-Policy, `/events` as Server-Sent
//! Events with ids, replayed from the start and resumed from `Last-Event-ID`, whose events the test sends.
//! `e2e_page_against_vigil_up_listen` runs the same checks against the real `vigil up --listen` and the real
//! llama-server (the stand-in stays: it sends hostile and multi-rank events no tiny start shows).

mod browser;
mod common;
use browser::*;
use common::*;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

const PAGE: &str = include_str!("../assets/page.html");
/// The Content-Security-Policy the listener sends with the page.
const CSP: &str = "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'";
const WITHIN: Duration = Duration::from_secs(1);
/// The paths the page may ask (chromium may ask the icon by itself).
const PATHS: &[&str] = &["/", "/events", "/favicon.ico"];

/// Scripted stand-in for vigil --listen, until the h37 branch merges: serves the page and an SSE stream of the
/// events the test sends (never a real server's behaviour; only the wire format of `/events`).
struct StandIn {
    port: u16,
    events: Arc<(Mutex<Vec<String>>, Condvar)>,
    /// Bumped to end every open `/events` stream (a dropped connection); `u64::MAX`: the stand-in ends.
    cut: Arc<AtomicU64>,
}

impl StandIn {
    fn start() -> StandIn {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let events = Arc::new((Mutex::new(Vec::new()), Condvar::new()));
        let cut = Arc::new(AtomicU64::new(0));
        let (ev, ct) = (events.clone(), cut.clone());
        std::thread::spawn(move || {
            for c in l.incoming() {
                if ct.load(SeqCst) == u64::MAX {
                    break;
                }
                let Ok(c) = c else { continue };
                let (ev, ct) = (ev.clone(), ct.clone());
                std::thread::spawn(move || {
                    let _ = serve(c, ev, ct);
                });
            }
        });
        StandIn { port, events, cut }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/", self.port)
    }

    /// Sends one event to every `/events` client (and to every later one, by replay); when it was written.
    /// Ends every `/events` stream open now, as a dropped connection would; later ones are served.
    fn cut_streams(&self) {
        self.cut.fetch_add(1, SeqCst);
        self.events.1.notify_all();
    }

    fn send(&self, ev: &Value) -> Instant {
        let (m, cv) = &*self.events;
        m.lock().unwrap().push(ev.to_string());
        cv.notify_all();
        Instant::now()
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        self.cut.store(u64::MAX, SeqCst);
        self.events.1.notify_all();
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// One connection: a bounded request head, then the page, the event stream, or 404.
fn serve(c: TcpStream, events: Arc<(Mutex<Vec<String>>, Condvar)>, cut: Arc<AtomicU64>) -> std::io::Result<()> {
    let generation = cut.load(SeqCst);
    c.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut r = BufReader::new(c.try_clone()?.take(16 * 1024));
    let mut line = String::new();
    r.read_line(&mut line)?;
    let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
    let mut last_id: Option<usize> = None;
    loop {
        let mut h = String::new();
        if r.read_line(&mut h)? == 0 || h == "\r\n" || h == "\n" {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            if k.trim().eq_ignore_ascii_case("last-event-id") {
                last_id = v.trim().parse().ok();
            }
        }
    }
    let mut w = c;
    match path.split('?').next().unwrap_or("") {
        "/" => {
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\nContent-Security-Policy: {CSP}\r\n\
                 X-Content-Type-Options: nosniff\r\nCache-Control: no-store\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                PAGE.len()
            );
            w.write_all(head.as_bytes())?;
            w.write_all(PAGE.as_bytes())
        }
        "/events" => {
            w.write_all(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n")?;
            // ids count from 0; a client that has seen id N gets N+1 onwards
            let mut next = last_id.map_or(0, |n| n + 1);
            let (m, cv) = &*events;
            loop {
                let batch: Vec<String> = {
                    let mut g = m.lock().unwrap();
                    while g.len() <= next && cut.load(SeqCst) == generation {
                        g = cv.wait_timeout(g, Duration::from_millis(200)).unwrap().0;
                    }
                    g[next.min(g.len())..].to_vec()
                };
                if cut.load(SeqCst) != generation {
                    return Ok(());
                }
                let mut out = String::new();
                for e in batch {
                    out.push_str(&format!("id: {next}\ndata: {e}\n\n"));
                    next += 1;
                }
                w.write_all(out.as_bytes())?;
                w.flush()?;
            }
        }
        _ => w.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"),
    }
}

/// A hostile log line: markup that would load an image (a request) and run code if it were parsed as HTML.
const HOSTILE: &str =
    r#"<img src=x onerror="window.__pwned=1;fetch('http://evil.invalid/x')"><script>window.__pwned=2</script>"#;

/// A two-rank SGLang start over two hosts (`--hosts --multi-node`: every event carries `host` and `rank`),
/// rank 1 running out of GPU memory in weights: the events' fields as docs/events.md and the captured
/// multi-node run (tests/gpu-captures/sglang-0.5.17-tp2-t1) have them.
fn two_ranks_crash() -> Vec<Value> {
    let tag = |mut v: Value, rank: u64| {
        v["host"] = json!(["gpu1", "gpu2"][rank as usize]);
        v["rank"] = json!(rank);
        v
    };
    let evidence = vec![
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.75 GiB. GPU 0 has a total capacity of 79.19 GiB".to_string(),
        format!("log line: {HOSTILE}"),
    ];
    vec![
        tag(
            json!({"event":"launched","name":"kimi","pid":16491,"keeper_pid":16489,"run_dir":"/var/lib/vigil/runs/kimi.n0","t_ms":0}),
            0,
        ),
        tag(
            json!({"event":"start","log":"/var/lib/vigil/runs/kimi.n0/server.log","pid":16491,"server":"sglang","t_ms":0,"url":"http://127.0.0.1:30000/health"}),
            0,
        ),
        tag(json!({"event":"phase","phase":"dist_init","from":"launch","at_ms":61969,"t_ms":62006}), 0),
        tag(json!({"event":"phase","phase":"dist_init","from":"launch","at_ms":62511,"t_ms":62540}), 1),
        json!({"event":"multi_node_phase","phase":"dist_init","slowest_rank":1,"slowest_host":"gpu2","host":"gpu1","rank":0,"t_ms":63309}),
        tag(
            json!({"event":"phase","phase":"weights","from":"dist_init","at_ms":67023,"usual_ms":2100,"eta_ms":70000,"t_ms":67059}),
            0,
        ),
        tag(json!({"event":"progress","phase":"weights","k":12,"n":52,"eta_ms":66000,"t_ms":67179}), 0),
        tag(json!({"event":"phase","phase":"weights","from":"dist_init","at_ms":67400,"t_ms":67431}), 1),
        tag(json!({"event":"line","text":HOSTILE,"t_ms":68001}), 1),
        tag(json!({"event":"note","message":format!("rank 1 (gpu2): {HOSTILE}"),"t_ms":68002}), 0),
        // an event kind the page does not know (issue #37 step 2 types more notes): shown as text, fields and all
        tag(json!({"event":"future_kind","state":"replaced","text":HOSTILE,"t_ms":68500}), 1),
        tag(json!({"event":"phase","phase":"kv_cache","from":"weights","at_ms":68847,"t_ms":68883}), 0),
        tag(
            json!({
                "event":"verdict","t_ms":69120,"verdict":"crashed","phase":"weights","cause":"gpu_oom","server":"sglang",
                "hint":"the weights do not fit: raise --tp or lower --mem-fraction-static",
                "detail":"exited with status 1","evidence":evidence,
                "last_lines":[HOSTILE, "[2026-12-02 06:56:42 TP1] Scheduler hit an exception"],
                "timeline":[{"phase":"launch","at_ms":0,"duration_ms":62511},{"phase":"dist_init","at_ms":62511,"duration_ms":4889},
                            {"phase":"weights","at_ms":67400,"duration_ms":1720,"median_ms":2100}],
                "laggards":[],"progress":null,"exit":{"code":1,"signal":null,"ours":true},"elapsed_ms":69120,
                "baseline":{"startups":3,"total_ms_median":136510,"ratio":0.51}
            }),
            1,
        ),
        json!({"event":"multi_node_verdict","exit":3,"verdict":"crashed","phase":"weights","decided_by":{"host":"gpu2","rank":1},
               "hosts":[{"host":"gpu1","rank":0,"verdict":"crashed","exit":3,"phase":"kv_cache","detail":"stopped: rank 1 failed"},
                        {"host":"gpu2","rank":1,"verdict":"crashed","exit":3,"phase":"weights","detail":"exited with status 1"}]}),
    ]
}

/// `page_check` over the stand-in: each event is sent once the page showed the one before (so every gap is
/// the page's own), then the checks on the finished page.
fn check_standin(script: &[Value]) -> Option<(Browser, Seen, StandIn)> {
    let s = StandIn::start();
    let mut it = script.iter();
    let mut next = || it.next().map(|ev| (s.send(ev), ev.clone()));
    let (b, seen) = page_check(&s.url(), Expectations { next: &mut next, within: WITHIN, paths: PATHS })?;
    for (what, gap) in &seen.gaps {
        eprintln!("{what}: on the page after {gap:?}");
    }
    Some((b, seen, s))
}

#[test]
fn page_shows_each_rank_and_the_verdict_live_with_no_request_off_origin() {
    let script = two_ranks_crash();
    let Some((mut b, seen, s)) = check_standin(&script) else { return };
    // every phase of both ranks, the least advanced rank, each rank's verdict and the group's were checked
    let names: Vec<&str> = seen.gaps.iter().map(|g| g.0.as_str()).collect();
    assert!(names.contains(&"rank 1 phase \"weights\""), "{names:?}");
    assert!(names.contains(&"rank 0 phase \"kv_cache\""), "{names:?}");
    assert!(names.contains(&"multi-node verdict \"crashed\" cause \"gpu_oom\""), "{names:?}");
    // one row per rank, each in its own phase
    let lanes = b.eval("Array.from(document.querySelectorAll('#timeline .lane')).map(function (l) { return [l.getAttribute('data-rank'), l.getAttribute('data-host'), l.getAttribute('data-phase')]; })");
    assert_eq!(lanes, json!([["0", "gpu1", "kv_cache"], ["1", "gpu2", "weights"]]));
    // the verdict: the group's, with the deciding rank's cause, hint, detail and evidence
    let v = b.eval("(function (v) { return [v.getAttribute('data-verdict'), v.getAttribute('data-cause'), v.getAttribute('data-phase'), document.getElementById('hint').textContent, document.getElementById('detail').textContent, document.getElementById('verdict-line').textContent]; })(document.getElementById('verdict'))");
    assert_eq!(v[0], "crashed");
    assert_eq!(v[1], "gpu_oom");
    assert_eq!(v[2], "weights");
    assert_eq!(v[3], "the weights do not fit: raise --tp or lower --mem-fraction-static");
    assert_eq!(v[4], "exited with status 1");
    assert!(v[5].as_str().unwrap().contains("decided by rank 1 on gpu2"), "{v}");
    // the history baseline (the verdict's) and the phase's usual duration as a ghost bar
    let base = b.eval("[document.getElementById('baseline').hidden, document.getElementById('baseline').textContent, document.querySelectorAll('#timeline .ghost').length]");
    assert_eq!(base[0], false);
    assert!(base[1].as_str().unwrap().contains("3 good startups, median total 2m16s"), "{base}");
    assert!(base[2].as_u64().unwrap() >= 1, "{base}");
    hostile_is_text(&mut b);
    let unknown = b.eval("Array.from(document.querySelectorAll('#log li[data-kind=\"future_kind\"]')).map(function (l) { return l.textContent; })");
    assert!(unknown[0].as_str().is_some_and(|t| t.contains("future_kind {\"state\":\"replaced\"")), "{unknown}");
    // the hostile lines asked for nothing either (every request so far: own origin, allowed paths)
    check_requests(&mut b, &s.url(), PATHS);
}

/// The hostile markup shows as text wherever an event carries it: no element, no code run, no request.
fn hostile_is_text(b: &mut Browser) {
    let r = b.eval(&format!(
        "(function (h) {{ return [document.querySelectorAll('img').length, document.querySelectorAll('script').length, \
         typeof window.__pwned, document.getElementById('log').textContent.indexOf(h) >= 0, \
         document.getElementById('evidence').textContent.indexOf(h) >= 0, document.getElementById('last-lines').textContent.indexOf(h) >= 0]; }})({})",
        serde_json::to_string(HOSTILE).unwrap()
    ));
    assert_eq!(
        r,
        json!([0, 1, "undefined", true, true, true]),
        "[img, script, __pwned, in log, in evidence, in last lines]"
    );
}

/// A single-rank llama-server start that crashes: the verdict with its cause, hint, detail and evidence
/// within 1 s (the verdict object of docs/events.md, as the truncated-GGUF e2e test sees it).
#[test]
fn page_single_rank_crash_shows_cause_hint_and_evidence() {
    let script = vec![
        json!({"event":"start","log":"/var/log/llama.log","pid":4242,"server":"llama-cpp","t_ms":0}),
        json!({"event":"phase","phase":"weights","from":"launch","at_ms":5,"t_ms":6}),
        json!({"event":"verdict","t_ms":26,"verdict":"crashed","phase":"weights","cause":"model_file","server":"llama-cpp",
               // the hint of the llama-cpp profile's model_file rule (crates/vigil-core/profiles/llama-cpp.toml)
               "hint":"the model file cannot be used: check -m (missing? a relative path resolves against the server's working directory), compare its size or sha256 with the source (an interrupted download truncates it), or update llama.cpp / re-convert it (unknown architecture, tokenizer or GGUF version)",
               "detail":"exited with status 1",
               "evidence":["gguf_init_from_file_impl: tensor 'blk.0.attn_q.weight' data is not within the file bounds, model is corrupted or incomplete"],
               "last_lines":["llama_model_load: error loading model: llama_model_loader: failed to load model from /m/truncated.gguf"],
               "timeline":[{"phase":"launch","at_ms":0,"duration_ms":5},{"phase":"weights","at_ms":5,"duration_ms":21}],
               "laggards":[],"progress":null,"exit":{"code":1,"signal":null,"ours":false},"elapsed_ms":26}),
    ];
    let Some((mut b, seen, s)) = check_standin(&script) else { return };
    assert!(seen.gaps.iter().any(|g| g.0 == "verdict \"crashed\" cause \"model_file\""), "{:?}", seen.gaps);
    let v = b.eval("[document.getElementById('verdict-line').textContent, document.getElementById('detail').textContent, \
        document.querySelectorAll('#timeline .lane').length, document.querySelector('#timeline .lane').getAttribute('data-verdict'), \
        document.getElementById('elapsed').textContent]");
    assert_eq!(v, json!(["crashed in weights after 26ms", "exited with status 1", 1, "crashed", "26ms"]));
    check_requests(&mut b, &s.url(), PATHS);
}

/// A single-rank llama-server start with history: one row, the current phase with progress k/n and ETA while
/// starting, then the ready verdict with its baseline; a reload resumes from the start (replay) with no
/// duplicate row or bar.
#[test]
fn page_single_rank_progress_eta_and_ready() {
    let script = vec![
        json!({"event":"start","log":"/var/log/llama.log","pid":4242,"server":"llama-cpp","url":"http://127.0.0.1:8080/health","t_ms":0}),
        json!({"event":"detected","server":"llama-cpp","t_ms":3}),
        json!({"event":"phase","phase":"weights","from":"launch","at_ms":5,"usual_ms":30000,"eta_ms":52000,"t_ms":6}),
        json!({"event":"progress","phase":"weights","k":7,"n":52,"detail":"bs=160 avail_mem=38.07 GB","eta_ms":48000,"t_ms":4006}),
    ];
    let Some((mut b, _seen, s)) = check_standin(&script) else { return };
    // the progress event has no check of its own in page_check: wait until the page applied it (id 3)
    assert!(
        b.wait_true("document.body.getAttribute('data-last-id') === '3'", WITHIN).is_some(),
        "progress not applied"
    );
    let now = b.eval("[document.querySelectorAll('#timeline .lane').length, document.getElementById('phase').getAttribute('data-phase'), \
        document.getElementById('progress').textContent, document.getElementById('progress-box').hidden, document.getElementById('eta-box').hidden, \
        document.getElementById('server').textContent, document.getElementById('usual').textContent]");
    assert_eq!(now, json!([1, "weights", "7/52", false, false, "llama-cpp", "30s"]));
    let eta = b.eval("parseInt(document.getElementById('eta').getAttribute('data-ms'), 10)").as_u64().unwrap();
    assert!(eta <= 48000 && eta > 30000, "ETA {eta} ms");
    let more = [
        json!({"event":"phase","phase":"kv_cache","from":"weights","at_ms":31000,"t_ms":31002}),
        json!({"event":"phase","phase":"serving","from":"kv_cache","at_ms":33000,"t_ms":33004}),
        json!({"event":"verdict","t_ms":33120,"verdict":"ready","phase":"serving","cause":null,"server":"llama-cpp","hint":null,
               "detail":"generation proof: 2 tokens in 43 ms via /completion","evidence":[],"last_lines":[],
               "timeline":[{"phase":"launch","at_ms":0,"duration_ms":5},{"phase":"weights","at_ms":5,"duration_ms":30995,"median_ms":30000},
                           {"phase":"kv_cache","at_ms":31000,"duration_ms":2000,"median_ms":1900},{"phase":"serving","at_ms":33000,"duration_ms":0}],
               "laggards":[],"progress":null,"exit":null,"elapsed_ms":33120,"baseline":{"startups":5,"total_ms_median":32000,"ratio":1.04}}),
    ];
    for ev in &more {
        let sent = s.send(ev);
        let (what, js) = expectation(ev, None).unwrap();
        let shown = b.wait_true(&js, WITHIN * 5).unwrap_or_else(|| panic!("{what} not shown"));
        assert!(sent.elapsed() < WITHIN, "{what}: {shown:?}");
    }
    let done = b.eval("[document.getElementById('verdict').getAttribute('data-verdict'), document.getElementById('progress-box').hidden, \
        document.getElementById('eta-box').hidden, document.getElementById('baseline').getAttribute('data-startups'), \
        Array.from(document.querySelectorAll('#timeline .bar')).map(function (b) { return b.getAttribute('data-phase') + ' ' + b.getAttribute('data-ms'); })]");
    assert_eq!(done, json!(["ready", true, true, "5", ["launch 5", "weights 30995", "kv_cache 2000"]]));
    // a reload: the stream replays from the start; the page is the same, once
    b.eval("window.__before_reload = 1");
    b.call("Page.reload", json!({}));
    let again = "typeof window.__before_reload === 'undefined' && document.getElementById('verdict').getAttribute('data-verdict') === 'ready' && document.querySelectorAll('#timeline .bar').length === 3 \
        && document.querySelectorAll('#timeline .lane').length === 1 && document.body.getAttribute('data-last-id') === '6'";
    assert!(b.wait_true(again, Duration::from_secs(20)).is_some(), "{}", b.eval("document.body.innerText"));
    check_requests(&mut b, &s.url(), PATHS);
}

/// An SSE connection that drops mid-stream is resumed by the browser with `Last-Event-ID` (the stand-in
/// serves from the next id): nothing is lost, nothing shown twice.
#[test]
fn page_resumes_after_the_stream_drops() {
    let s = StandIn::start();
    let Some(mut b) = Browser::start() else { return };
    s.send(&json!({"event":"start","server":"vllm","t_ms":0}));
    s.send(&json!({"event":"phase","phase":"weights","from":"launch","at_ms":10,"t_ms":11}));
    b.navigate(&s.url());
    assert!(b.wait_true("document.body.getAttribute('data-last-id') === '1'", Duration::from_secs(30)).is_some());
    // the stream drops: the page says so, and the browser reconnects on its own
    s.cut_streams();
    assert!(b
        .wait_true("document.getElementById('conn').getAttribute('data-state') !== 'live'", Duration::from_secs(10))
        .is_some());
    s.send(&json!({"event":"phase","phase":"kv_cache","from":"weights","at_ms":900,"t_ms":901}));
    // EventSource retries after its reconnection delay (about 3 s in chromium)
    let ok = "document.body.getAttribute('data-last-id') === '2' && document.getElementById('conn').getAttribute('data-state') === 'live' \
        && document.querySelector('#timeline .lane').getAttribute('data-phases') === 'launch weights kv_cache' && document.body.getAttribute('data-events') === '3'";
    assert!(b.wait_true(ok, Duration::from_secs(20)).is_some(), "{}", b.eval("document.body.innerText"));
    let reqs = check_requests(&mut b, &s.url(), PATHS);
    assert!(reqs.iter().filter(|u| u.ends_with("/events")).count() >= 2, "no second /events request: {reqs:?}");
}

/// A llama-server command line for `vigil up` (the real server, the tiny model).
fn tiny_cmd(e: &Env, port: u16) -> Vec<String> {
    let m = e.models.join("tiny.gguf").display().to_string();
    let p = port.to_string();
    let s = e.server.display().to_string();
    [s.as_str(), "-m", &m, "--host", "127.0.0.1", "--port", &p, "-c", "256", "-t", "1"].map(String::from).to_vec()
}

/// The same checks against the real `vigil up --listen` watching the real llama-server: the page's phase and
/// verdict within 1 s of vigil printing them with `--json` (the same events as `/events`). The listener is bound
/// before the first `--json` line (the launch), on a port the test chose.
#[test]
fn e2e_page_against_vigil_up_listen() {
    let Some(e) = env() else { return };
    let d = TempDir::new("page");
    let port = free_port();
    let lport = free_port();
    let mut c = vigil();
    c.env("VIGIL_STATE_DIR", &d.0);
    let listen = format!("127.0.0.1:{lport}");
    c.args(["up", "--name", "page", "--json", "--listen", &listen, "--"]).args(tiny_cmd(&e, port));
    c.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::null()).stdin(std::process::Stdio::null());
    let mut child = Guard(c.spawn().expect("spawn vigil"));
    // the run ends with the test, pass or fail: `vigil down` stops the server its keeper holds
    struct Down(std::path::PathBuf);
    impl Drop for Down {
        fn drop(&mut self) {
            let mut dn = vigil();
            dn.env("VIGIL_STATE_DIR", &self.0).args(["down", "page"]);
            let _ = run_bounded(dn, Duration::from_secs(60));
        }
    }
    let _down = Down(d.0.clone());
    let out = BufReader::new(child.0.stdout.take().unwrap());
    // each line timestamped as it arrives (a reader of its own: the checks must not delay the stamps)
    let (tx, rx) = std::sync::mpsc::channel::<(Instant, Value)>();
    std::thread::spawn(move || {
        for l in out.lines() {
            let Ok(l) = l else { break };
            let v: Value = serde_json::from_str(&l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"));
            if tx.send((Instant::now(), v)).is_err() {
                break;
            }
        }
    });
    let t = Duration::from_secs(90);
    let first = rx.recv_timeout(t).expect("no --json line from vigil up --listen");
    let addr = listen.clone();
    let before = vec![first];
    let mut before = before.into_iter();
    let mut done = false;
    let mut next = || {
        if done {
            return None;
        }
        let x = before.next().or_else(|| rx.recv_timeout(t).ok())?;
        done = x.1["event"] == "verdict";
        Some(x)
    };
    let Some((mut b, seen)) =
        page_check(&format!("http://{addr}/"), Expectations { next: &mut next, within: WITHIN, paths: PATHS })
    else {
        return;
    };
    assert!(seen.gaps.iter().any(|g| g.0.starts_with("verdict \"ready\"")), "{:?}", seen.gaps);
    assert!(seen.gaps.iter().any(|g| g.0.contains("phase \"weights\"")), "{:?}", seen.gaps);
    assert_eq!(b.eval("document.getElementById('server').textContent"), "llama-cpp");
}
