//! A real headless browser for the live page's tests: Debian's chromium, driven through the Chrome DevTools
//! Protocol (one WebSocket to the browser, a flat session on one tab). `page_check` opens vigil's page,
//! follows an event stream (the events as they were sent, or as vigil printed them with `--json`), and checks
//! that each event shows on the page within the allowed time, that no request leaves the page's origin, and
//! that the page threw no error. It knows nothing of who serves the page: the test gives the base URL.
#![allow(dead_code)]

use serde_json::{json, Value};
use std::collections::VecDeque;
use std::io::ErrorKind;
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tungstenite::{Message, WebSocket};

/// How long chromium may take to start and to answer one DevTools call (2 busy cores: seconds).
const START: Duration = Duration::from_secs(60);
const CALL: Duration = Duration::from_secs(20);

pub struct Browser {
    ws: WebSocket<TcpStream>,
    session: String,
    next_id: u64,
    /// DevTools events read while waiting for answers, in order.
    events: VecDeque<Value>,
    stderr: PathBuf,
    /// Last: the process group ends after the WebSocket is closed.
    proc: Chromium,
}

/// The chromium process group and its profile directory, ended and removed on drop, from the moment it is
/// spawned (a start that fails half-way leaves nothing behind).
struct Chromium {
    child: Child,
    dir: PathBuf,
}

impl Drop for Chromium {
    fn drop(&mut self) {
        // SAFETY: signalling the process group this test started (chromium leads it).
        unsafe {
            libc::kill(-(self.child.id() as i32), libc::SIGKILL);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

impl Browser {
    /// Starts headless chromium with a fresh profile and opens one blank tab with the Network, Runtime, Log and
    /// Page domains enabled. None when chromium is missing outside CI (a skip); under CI=true that fails.
    pub fn start() -> Option<Browser> {
        let exe = std::env::var("VIGIL_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
        if !std::path::Path::new(&exe).is_file() {
            if std::env::var("CI").as_deref() == Ok("true") {
                panic!("{exe} missing: install Debian's chromium (scripts/test.sh does)");
            }
            eprintln!("SKIP: {exe} missing (apt-get install chromium)");
            return None;
        }
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let dir = std::env::temp_dir().join(format!("vigil-chromium-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("profile")).unwrap();
        let stderr = dir.join("chromium.err");
        let mut c = Command::new(&exe);
        c.args([
            "--headless=new",
            "--remote-debugging-port=0",
            "--no-first-run",
            "--no-default-browser-check",
            // nothing of chromium's own (updates, safe browsing, sync) goes out during the test
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-extensions",
            "--disable-gpu",
            "--mute-audio",
        ]);
        c.arg(format!("--user-data-dir={}", dir.join("profile").display()));
        if is_root() {
            // chromium refuses to run its sandbox as root; users run the page as themselves
            c.arg("--no-sandbox");
        }
        c.arg("about:blank");
        // its own process group: the renderer, GPU and zygote processes end with it
        c.process_group(0).stdin(Stdio::null()).stdout(Stdio::null());
        c.stderr(std::fs::File::create(&stderr).unwrap());
        let mut proc = Chromium { child: c.spawn().unwrap_or_else(|e| panic!("start {exe}: {e}")), dir };
        // chromium writes the port and the browser's WebSocket path here once it listens
        let port_file = proc.dir.join("profile/DevToolsActivePort");
        let t0 = Instant::now();
        let (port, path) = loop {
            if let Ok(s) = std::fs::read_to_string(&port_file) {
                let mut l = s.lines();
                if let (Some(p), Some(w)) = (l.next(), l.next()) {
                    if let Ok(p) = p.trim().parse::<u16>() {
                        break (p, w.trim().to_string());
                    }
                }
            }
            if let Ok(Some(st)) = proc.child.try_wait() {
                panic!(
                    "chromium exited ({st}) before listening: {}",
                    std::fs::read_to_string(&stderr).unwrap_or_default()
                );
            }
            if t0.elapsed() > START {
                panic!("chromium did not write {} within {START:?}", port_file.display());
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let tcp =
            TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), CALL).expect("connect to chromium's DevTools");
        tcp.set_read_timeout(Some(CALL)).unwrap();
        tcp.set_write_timeout(Some(CALL)).unwrap();
        let (ws, _) = tungstenite::client(format!("ws://127.0.0.1:{port}{path}"), tcp)
            .unwrap_or_else(|e| panic!("DevTools WebSocket handshake: {e}"));
        // then short reads: a call waits for its answer in a loop with its own deadline
        ws.get_ref().set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        let mut b = Browser { ws, session: String::new(), next_id: 0, events: VecDeque::new(), stderr, proc };
        let t = b.call_on(None, "Target.createTarget", json!({"url": "about:blank"}));
        let target = t["targetId"].as_str().expect("targetId").to_string();
        let s = b.call_on(None, "Target.attachToTarget", json!({"targetId": target, "flatten": true}));
        b.session = s["sessionId"].as_str().expect("sessionId").to_string();
        for domain in ["Network", "Runtime", "Log", "Page"] {
            b.call(&format!("{domain}.enable"), json!({}));
        }
        Some(b)
    }

    fn call_on(&mut self, session: Option<&str>, method: &str, params: Value) -> Value {
        self.try_call_on(session, method, params).unwrap_or_else(|e| panic!("DevTools {method}: {e}"))
    }

    /// A DevTools command and its result, or the error DevTools answered (e.g. no page context during a
    /// navigation).
    fn try_call_on(&mut self, session: Option<&str>, method: &str, params: Value) -> Result<Value, String> {
        self.next_id += 1;
        let id = self.next_id;
        let mut m = json!({"id": id, "method": method, "params": params});
        if let Some(s) = session {
            m["sessionId"] = s.into();
        }
        self.ws.send(Message::text(m.to_string())).unwrap_or_else(|e| panic!("DevTools {method}: {e}"));
        let t0 = Instant::now();
        loop {
            assert!(t0.elapsed() < CALL, "DevTools {method}: no answer within {CALL:?}");
            let Some(v) = self.read() else { continue };
            if v["id"] == id {
                if let Some(e) = v.get("error") {
                    return Err(e.to_string());
                }
                return Ok(v["result"].clone());
            }
            if v.get("method").is_some() {
                self.events.push_back(v);
            }
        }
    }

    /// One DevTools message, or None after a short read timeout.
    fn read(&mut self) -> Option<Value> {
        match self.ws.read() {
            Ok(Message::Text(t)) => Some(serde_json::from_str(t.as_str()).expect("DevTools sent JSON")),
            Ok(_) => None,
            Err(tungstenite::Error::Io(e)) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => None,
            Err(e) => panic!("DevTools connection: {e}; chromium's stderr: {}", self.stderr_tail()),
        }
    }

    fn stderr_tail(&self) -> String {
        let s = std::fs::read_to_string(&self.stderr).unwrap_or_default();
        s.lines().rev().filter(|l| !l.contains("dbus")).take(20).collect::<Vec<_>>().join("\n")
    }

    /// A DevTools command on the tab.
    pub fn call(&mut self, method: &str, params: Value) -> Value {
        let s = self.session.clone();
        self.call_on(Some(&s), method, params)
    }

    /// Evaluates a JavaScript expression in the page and returns its value (JSON).
    pub fn eval(&mut self, expr: &str) -> Value {
        let r = self.call("Runtime.evaluate", json!({"expression": expr, "returnByValue": true}));
        if let Some(e) = r.get("exceptionDetails") {
            panic!("the page threw evaluating {expr}: {e}");
        }
        r["result"]["value"].clone()
    }

    /// Polls `expr` until it is `true`; the time it took, or None past the deadline. The page's state is the
    /// event here: nothing announces a DOM change to the test. While a navigation replaces the page, an
    /// evaluation may find no context or throw (the page's script not run yet): not yet true.
    pub fn wait_true(&mut self, expr: &str, deadline: Duration) -> Option<Duration> {
        let t0 = Instant::now();
        loop {
            let s = self.session.clone();
            let r = self.try_call_on(Some(&s), "Runtime.evaluate", json!({"expression": expr, "returnByValue": true}));
            if r.is_ok_and(|r| r.get("exceptionDetails").is_none() && r["result"]["value"] == Value::Bool(true)) {
                return Some(t0.elapsed());
            }
            if t0.elapsed() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    pub fn navigate(&mut self, url: &str) {
        let r = self.call("Page.navigate", json!({"url": url}));
        assert!(r.get("errorText").is_none(), "navigate to {url}: {r}");
    }

    /// The DevTools events of the tab read so far (after draining what is waiting).
    pub fn drain(&mut self) -> Vec<Value> {
        while let Some(v) = self.read() {
            if v.get("method").is_some() {
                self.events.push_back(v);
            }
        }
        self.events.drain(..).collect()
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.ws.close(None);
    }
}

/// What `page_check` follows and allows.
pub struct Expectations<'a> {
    /// The next event and when it left the server (the scripted stand-in: when it was written; vigil: when its
    /// `--json` line was read). None: no more.
    pub next: &'a mut dyn FnMut() -> Option<(Instant, Value)>,
    /// From an event sent (or from the page's connection, for an event sent before it) to the page showing it.
    pub within: Duration,
    /// The paths the page may request on its own origin (every other origin is refused).
    pub paths: &'a [&'a str],
}

/// What `page_check` saw: per checked event, what and how long it took to show.
pub struct Seen {
    pub gaps: Vec<(String, Duration)>,
    pub requests: Vec<String>,
}

/// The check for one event: what to call it and a JavaScript expression true once the page shows it.
/// `decider`: for a `multi_node_verdict` that names the rank that decided it, that rank's `verdict` event
/// when the stream carried it (its cause is the group's). Values go in as JSON literals (the event's text is
/// never spliced into code or selectors).
pub fn expectation(ev: &Value, decider: Option<&Value>) -> Option<(String, String)> {
    let lit = |v: &Value| serde_json::to_string(v).unwrap();
    // the lane of an event: by rank, else by host, else the one lane of a single-rank start
    let lane = |rank: &Value, host: &Value| {
        format!(
            "Array.from(document.querySelectorAll('#timeline .lane')).find(function (l) {{ var r = {}, h = {}; \
             return r !== null ? l.getAttribute('data-rank') === String(r) : h !== null ? l.getAttribute('data-host') === h \
             : l.getAttribute('data-lane') === 'server'; }})",
            lit(rank),
            lit(host)
        )
    };
    let has_phase = |l: String, p: &Value| {
        format!("(function (l) {{ return !!l && (l.getAttribute('data-phases') || '').split(' ').indexOf({}) >= 0; }})({l})", lit(p))
    };
    let r = |k: &str| ev.get(k).cloned().unwrap_or(Value::Null);
    match ev["event"].as_str()? {
        "phase" => {
            Some((format!("{} phase {}", who(ev), ev["phase"]), has_phase(lane(&r("rank"), &r("host")), &ev["phase"])))
        }
        "multi_node_phase" => Some((
            format!("least advanced rank {} in {}", ev["slowest_rank"], ev["phase"]),
            has_phase(lane(&r("slowest_rank"), &r("slowest_host")), &ev["phase"]),
        )),
        "verdict" if ev.get("rank").is_some_and(|x| !x.is_null()) => Some((
            format!("{} verdict {}", who(ev), ev["verdict"]),
            format!(
                "(function (l) {{ return !!l && l.getAttribute('data-verdict') === {}; }})({})",
                lit(&ev["verdict"]),
                lane(&r("rank"), &r("host"))
            ),
        )),
        "verdict" => {
            let evidence = ev["evidence"].as_array().cloned().unwrap_or_default();
            Some((
                format!("verdict {} cause {}", ev["verdict"], ev["cause"]),
                format!(
                    "(function (v, c, h, e) {{ var b = document.getElementById('verdict'); \
                     var li = Array.from(document.querySelectorAll('#evidence li')).map(function (x) {{ return x.textContent; }}); \
                     return !b.hidden && b.getAttribute('data-verdict') === v && b.getAttribute('data-cause') === (c || '') \
                     && document.getElementById('cause').textContent === (c || '') && document.getElementById('hint').textContent === (h || '') \
                     && JSON.stringify(li) === JSON.stringify(e); }})({}, {}, {}, {})",
                    lit(&ev["verdict"]),
                    lit(&r("cause")),
                    lit(&r("hint")),
                    lit(&Value::Array(evidence))
                ),
            ))
        }
        "multi_node_verdict" => {
            let cause = decider.map_or(Value::Null, |d| d.get("cause").cloned().unwrap_or(Value::Null));
            Some((
                format!("multi-node verdict {} cause {cause}", ev["verdict"]),
                format!(
                    "(function (v, n, c) {{ var b = document.getElementById('verdict'); return !b.hidden && b.getAttribute('data-verdict') === v \
                     && document.querySelectorAll('#hosts [data-host-rank]').length === n && b.getAttribute('data-cause') === (c || '') \
                     && document.getElementById('cause').textContent === (c || ''); }})({}, {}, {})",
                    lit(&ev["verdict"]),
                    ev["hosts"].as_array().map_or(0, |h| h.len()),
                    lit(&cause)
                ),
            ))
        }
        _ => None,
    }
}

fn who(ev: &Value) -> String {
    match (ev.get("rank"), ev.get("host")) {
        (Some(r), _) if !r.is_null() => format!("rank {r}"),
        (_, Some(h)) if !h.is_null() => format!("host {h}"),
        _ => "the server".into(),
    }
}

/// `scheme://host:port` of a URL (the page's requests are compared by it).
pub fn origin(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let host = rest.split(['/', '?', '#']).next().unwrap_or("");
    format!("{scheme}://{host}")
}

pub fn path_of(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |x| x.1);
    let p = rest.find('/').map_or("/", |i| &rest[i..]);
    p.split(['?', '#']).next().unwrap_or("/").to_string()
}

/// Opens `base_url` in a fresh headless chromium, waits until the page's event stream is live, then follows
/// the events: each phase (per rank), the least advanced rank and the verdict must show within
/// `exp.within` of being sent. Then every request the page made must have gone to `base_url`'s origin, to
/// one of `exp.paths`, and the page must have thrown nothing and broken no Content-Security-Policy. Returns
/// the browser (for further checks on the same page) and what was seen; None when chromium is missing
/// outside CI (skip).
pub fn page_check(base_url: &str, exp: Expectations) -> Option<(Browser, Seen)> {
    let mut b = Browser::start()?;
    b.navigate(base_url);
    let live = b.wait_true(
        "document.getElementById('conn') && document.getElementById('conn').getAttribute('data-state') === 'live'",
        START,
    );
    assert!(
        live.is_some(),
        "the page's event stream did not open: {:?}",
        b.eval("document.documentElement.outerHTML.slice(0, 2000)")
    );
    let opened = Instant::now();
    let mut gaps = Vec::new();
    // each rank's latest verdict: a group verdict's cause is its deciding rank's
    let mut verdicts = std::collections::HashMap::new();
    while let Some((sent, ev)) = (exp.next)() {
        if ev["event"] == "verdict" {
            verdicts.insert(ev["rank"].to_string(), ev.clone());
        }
        let decider = verdicts.get(&ev["decided_by"]["rank"].to_string()).filter(|_| ev["decided_by"].is_object());
        let Some((what, js)) = expectation(&ev, decider) else { continue };
        let from = sent.max(opened);
        // poll past the limit so a failure says how late the page was, not only that it was
        let shown = b.wait_true(&js, exp.within * 5 + Duration::from_secs(2)).map(|_| from.elapsed());
        let Some(gap) = shown else {
            panic!(
                "{what}: not on the page {:?} after it was sent ({ev}); the page: {}",
                from.elapsed(),
                b.eval("document.body.innerText")
            );
        };
        assert!(gap < exp.within, "{what}: shown {gap:?} after it was sent, more than {:?}", exp.within);
        gaps.push((what, gap));
    }
    let requests = check_requests(&mut b, base_url, exp.paths);
    assert!(requests.iter().any(|u| path_of(u) == "/events"), "the page never asked /events: {requests:?}");
    Some((b, Seen { gaps, requests }))
}

/// Fails on a request that leaves the page's origin or asks a path not allowed, a WebSocket, an uncaught
/// exception, a console error, or a Content-Security-Policy violation. Returns the URLs requested.
pub fn check_requests(b: &mut Browser, base_url: &str, paths: &[&str]) -> Vec<String> {
    let own = origin(base_url);
    let mut urls = Vec::new();
    for e in b.drain() {
        let p = &e["params"];
        match e["method"].as_str().unwrap_or("") {
            "Network.requestWillBeSent" => {
                let u = p["request"]["url"].as_str().unwrap_or("").to_string();
                assert_eq!(origin(&u), own, "the page asked another origin: {u}");
                assert!(paths.contains(&path_of(&u).as_str()), "the page asked {u}, not one of {paths:?}");
                urls.push(u);
            }
            "Network.webSocketCreated" => panic!("the page opened a WebSocket: {p}"),
            "Runtime.exceptionThrown" => panic!("the page threw: {}", p["exceptionDetails"]),
            "Runtime.consoleAPICalled" if p["type"] == "error" => panic!("the page logged an error: {}", p["args"]),
            "Log.entryAdded" => {
                let text = p["entry"]["text"].as_str().unwrap_or("");
                assert!(!text.contains("Content Security Policy"), "CSP violation: {text}");
            }
            _ => {}
        }
    }
    urls
}
