//! The `--listen` HTTP/1.1 server on hyper: routes, the bearer token, TLS, and the bounds that hold against
//! hostile clients.
//!
//! - A request head must arrive whole within `HEAD_TIMEOUT` (slowloris; idle keep-alive connections
//!   too: hyper arms the timer whenever it waits for a head) and fit in `MAX_HEAD` bytes (else 431).
//! - At most `MAX_CONNS` connections that are not event streams are open; a new one beyond that closes the
//!   oldest idle one (no request in progress), so thousands of idle sockets cannot lock the next client out;
//!   when none is idle it is answered 503 and closed. At most `MAX_SSE` event streams (beyond: 503).
//! - Every path not in the table is 404 (no file is ever read from disk); methods other than GET and
//!   HEAD are 405. With a token every request needs `Authorization: Bearer TOKEN` (401 without it).
//! - The server only reads the hub, on its own thread and runtime; the watch pushes into it and never waits
//!   for a client.

use super::state::Hub;
use super::Settings;
use hyper::body::{Body, Bytes, Frame, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

/// A request head must be complete within this (slowloris; idle keep-alive).
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest request head accepted (start line and headers); larger: 431.
pub const MAX_HEAD: usize = 16 * 1024;
/// Connections that are not event streams, open at once.
pub const MAX_CONNS: usize = 256;
/// Event-stream (SSE) clients at once.
pub const MAX_SSE: usize = 1024;
/// The listener thread's nice value (the watch's thread keeps the process's).
const LISTENER_NICE: libc::c_int = 10;
/// A TLS handshake must finish within this.
const TLS_TIMEOUT: Duration = Duration::from_secs(5);
/// An SSE client's queue (chunks); a slow reader waits, the log is shared.
const SSE_QUEUE: usize = 4;
/// Events per SSE chunk.
const SSE_BATCH: usize = 256;
/// After an event, a stream waits this long for the rest of its burst before it writes.
const SSE_COALESCE: Duration = Duration::from_millis(10);
/// A comment line this often keeps an idle stream open through proxies.
const SSE_KEEPALIVE: Duration = Duration::from_secs(15);

/// The page (`/`): one file, no external assets; served from the binary, never from disk.
const PAGE: &str = include_str!("../../../assets/page.html");

struct Conn {
    abort: tokio::task::AbortHandle,
    busy: Arc<AtomicBool>,
    sse: Arc<AtomicBool>,
    since: Instant,
}

/// The open connections: who may be closed to make room.
#[derive(Default)]
struct Registry {
    conns: HashMap<u64, Conn>,
    next: u64,
    sse: usize,
}

struct Server {
    hub: Arc<Hub>,
    token: Option<Vec<u8>>,
    reg: Mutex<Registry>,
    csp: String,
}

impl Server {
    fn reg(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.reg.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn listener_json(&self) -> Value {
        let r = self.reg();
        json!({"connections": r.conns.len(), "sse_clients": r.sse, "max_connections": MAX_CONNS, "max_sse": MAX_SSE})
    }
}

/// Serves on the bound listener until the process ends, on a thread and a runtime of its own: however busy
/// the listener is (a flood of connections, a thousand event streams), the watch's runtime never runs its
/// work; the two share only the hub's lock, held for one append or one read.
pub fn serve(s: &Settings, hub: Arc<Hub>) -> std::io::Result<()> {
    let l = s.listener.try_clone()?;
    l.set_nonblocking(true)?;
    let tls = s.tls.clone().map(tokio_rustls::TlsAcceptor::from);
    let srv = Arc::new(Server { hub, token: s.token.clone(), reg: Mutex::new(Registry::default()), csp: csp(PAGE) });
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let (ok_tx, ok_rx) = std::sync::mpsc::channel();
    std::thread::Builder::new().name("vigil-listen".into()).spawn(move || {
        // best effort below the watch: on a busy node (a server loading, a thousand event streams to feed) the
        // scheduler gives the watch's thread the CPU first, so the verdict's timing does not move
        // SAFETY: gettid takes no arguments; setpriority on this thread's own id.
        unsafe {
            let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
            libc::setpriority(libc::PRIO_PROCESS, tid, LISTENER_NICE);
        }
        rt.block_on(async move {
            let l = match tokio::net::TcpListener::from_std(l) {
                Ok(l) => l,
                Err(e) => {
                    let _ = ok_tx.send(Err(e));
                    return;
                }
            };
            let _ = ok_tx.send(Ok(()));
            let mut accepted = 0u32;
            loop {
                let (sock, _) = match l.accept().await {
                    Ok(x) => x,
                    // out of descriptors (EMFILE) or a reset before accept: wait a moment, the loop goes on
                    Err(_) => {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                };
                let _ = sock.set_nodelay(true);
                admit(&srv, sock, tls.clone());
                // the new connections' tasks run every few accepts (far fewer than the cap): a burst of clients that
                // send their requests at once is served as it comes, not taken for idle connections and closed
                accepted += 1;
                if accepted == 32 {
                    accepted = 0;
                    tokio::task::yield_now().await;
                }
            }
        })
    })?;
    ok_rx
        .recv_timeout(Duration::from_secs(10))
        .unwrap_or_else(|_| Err(std::io::Error::other("the listener did not start")))
}

/// A new connection: room is made (the oldest idle one closed) or it is answered 503 and closed.
fn admit(srv: &Arc<Server>, mut sock: tokio::net::TcpStream, tls: Option<tokio_rustls::TlsAcceptor>) {
    let mut reg = srv.reg();
    let plain = reg.conns.values().filter(|c| !c.sse.load(Ordering::Relaxed)).count();
    if plain >= MAX_CONNS {
        let oldest = reg
            .conns
            .iter()
            .filter(|(_, c)| !c.sse.load(Ordering::Relaxed) && !c.busy.load(Ordering::Relaxed))
            .min_by_key(|(_, c)| c.since)
            .map(|(k, _)| *k);
        match oldest {
            Some(k) => {
                if let Some(c) = reg.conns.remove(&k) {
                    c.abort.abort();
                }
            }
            None => {
                drop(reg);
                tokio::spawn(async move {
                    let msg = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
                    let _ = tokio::time::timeout(Duration::from_secs(1), sock.write_all(msg)).await;
                });
                return;
            }
        }
    }
    let id = reg.next;
    reg.next += 1;
    let (busy, sse) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
    let (srv2, b2, s2) = (srv.clone(), busy.clone(), sse.clone());
    let task = tokio::spawn(async move {
        let _gone = Gone { srv: srv2.clone(), id };
        // a connection that sends nothing costs this small task and its socket only: the TLS and HTTP state
        // (boxed, so not part of this future) is made when its first byte arrives, within the head timeout
        // (a peek, not `readable()`: tokio takes a new socket for ready until a read says otherwise)
        let mut first = [0u8; 1];
        if !matches!(tokio::time::timeout(HEAD_TIMEOUT, sock.peek(&mut first)).await, Ok(Ok(1..))) {
            return;
        }
        // a request is coming: not idle until it is answered (a head that stalls is cut by the head timeout)
        b2.store(true, Ordering::Relaxed);
        match tls {
            Some(acc) => {
                let hs = Box::pin(tokio::time::timeout(TLS_TIMEOUT, acc.accept(sock)));
                if let Ok(Ok(t)) = hs.await {
                    Box::pin(connection(srv2, TokioIo::new(t), b2, s2)).await;
                }
            }
            None => Box::pin(connection(srv2, TokioIo::new(sock), b2, s2)).await,
        }
    });
    reg.conns.insert(id, Conn { abort: task.abort_handle(), busy, sse, since: Instant::now() });
}

/// Removes a connection from the registry when its task ends (or is aborted).
struct Gone {
    srv: Arc<Server>,
    id: u64,
}

impl Drop for Gone {
    fn drop(&mut self) {
        self.srv.reg().conns.remove(&self.id);
    }
}

async fn connection<I>(srv: Arc<Server>, io: TokioIo<I>, busy: Arc<AtomicBool>, sse: Arc<AtomicBool>)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
        let (srv, busy, sse) = (srv.clone(), busy.clone(), sse.clone());
        async move {
            let r = route(&srv, &req, &sse);
            // answered: idle again until the next request's first byte (hyper waits for it under the head timeout)
            busy.store(false, Ordering::Relaxed);
            Ok::<_, std::convert::Infallible>(r)
        }
    });
    let mut b = hyper::server::conn::http1::Builder::new();
    b.timer(TokioTimer::new())
        .header_read_timeout(HEAD_TIMEOUT)
        .max_header_size(MAX_HEAD)
        .max_buf_size(MAX_HEAD.max(8192))
        .max_headers(64);
    let _ = b.serve_connection(io, svc).await;
}

/// A response body: a whole text, or an event stream.
pub enum Out {
    Full(Option<Bytes>),
    Sse(mpsc::Receiver<Bytes>),
}

impl Body for Out {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.get_mut() {
            Out::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            Out::Sse(rx) => rx.poll_recv(cx).map(|o| o.map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, Out::Full(None))
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        match self {
            Out::Full(Some(b)) => hyper::body::SizeHint::with_exact(b.len() as u64),
            Out::Full(None) => hyper::body::SizeHint::with_exact(0),
            Out::Sse(_) => hyper::body::SizeHint::default(),
        }
    }
}

fn reply(status: u16, ctype: &str, body: impl Into<Bytes>) -> Response<Out> {
    let mut r = Response::new(Out::Full(Some(body.into())));
    *r.status_mut() = hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
    let h = r.headers_mut();
    h.insert("content-type", hv(ctype));
    h.insert("cache-control", hv("no-store"));
    h.insert("x-content-type-options", hv("nosniff"));
    r
}

fn hv(s: &str) -> hyper::header::HeaderValue {
    hyper::header::HeaderValue::from_str(s).unwrap_or(hyper::header::HeaderValue::from_static(""))
}

fn json_reply(status: u16, v: &Value) -> Response<Out> {
    let mut s = serde_json::to_string_pretty(v).unwrap_or_default();
    s.push('\n');
    reply(status, "application/json", s)
}

const ROUTES: [&str; 7] = ["/", "/livez", "/startupz", "/readyz", "/status", "/events", "/metrics"];

/// One request → one response. Never reads a file; never changes the run.
fn route(srv: &Arc<Server>, req: &Request<Incoming>, sse: &AtomicBool) -> Response<Out> {
    if let Some(t) = &srv.token {
        let given = req
            .headers()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
            .map(str::trim);
        if !given.is_some_and(|g| same(g.as_bytes(), t)) {
            let mut r = reply(401, "text/plain; charset=utf-8", "unauthorized: send Authorization: Bearer TOKEN\n");
            r.headers_mut().insert("www-authenticate", hv("Bearer realm=\"vigil\""));
            return r;
        }
    }
    let path = req.uri().path();
    if !ROUTES.contains(&path) {
        return reply(404, "text/plain; charset=utf-8", format!("not found; endpoints: {}\n", ROUTES.join(" ")));
    }
    let m = req.method();
    if m != hyper::Method::GET && m != hyper::Method::HEAD {
        let mut r = reply(405, "text/plain; charset=utf-8", "read-only: GET or HEAD\n");
        r.headers_mut().insert("allow", hv("GET, HEAD"));
        return r;
    }
    let hub = &srv.hub;
    match path {
        "/livez" => {
            let a = hub.livez();
            json_reply(a.status, &a.body)
        }
        "/startupz" => {
            let a = hub.startupz();
            json_reply(a.status, &a.body)
        }
        "/readyz" => {
            let a = hub.readyz();
            json_reply(a.status, &a.body)
        }
        "/status" => json_reply(200, &hub.status(srv.listener_json())),
        "/metrics" => match super::metrics() {
            Some(mx) => {
                let accept = req.headers().get("accept").and_then(|v| v.to_str().ok());
                let f = crate::sinks::metrics::Format::from_accept(accept);
                reply(200, f.content_type(), mx.render(f))
            }
            None => reply(503, "text/plain; charset=utf-8", "no watch yet\n"),
        },
        "/events" => events(srv, req, sse),
        _ => {
            let mut r = reply(200, "text/html; charset=utf-8", PAGE);
            r.headers_mut().insert("content-security-policy", hv(&srv.csp));
            r.headers_mut().insert("referrer-policy", hv("no-referrer"));
            r
        }
    }
}

/// Constant-time comparison (the time does not depend on where the bytes differ).
fn same(a: &[u8], b: &[u8]) -> bool {
    let n = a.len().max(b.len());
    let mut d = (a.len() ^ b.len()) as u8 | u8::from(a.len() != b.len());
    for i in 0..n {
        d |= a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0);
    }
    std::hint::black_box(d) == 0
}

/// Where an SSE client starts: after `?since=ID`, else after `Last-Event-ID`, else from the first event.
fn cursor(req: &Request<Incoming>) -> u64 {
    let q = req
        .uri()
        .query()
        .unwrap_or("")
        .split('&')
        .find_map(|kv| kv.strip_prefix("since="))
        .and_then(|v| v.parse::<u64>().ok());
    let h = req.headers().get("last-event-id").and_then(|v| v.to_str().ok()).and_then(|v| v.trim().parse::<u64>().ok());
    q.or(h).unwrap_or(0)
}

/// Counts an SSE client while its stream lives.
struct SseSlot(Arc<Server>);

impl Drop for SseSlot {
    fn drop(&mut self) {
        let mut r = self.0.reg();
        r.sse = r.sse.saturating_sub(1);
    }
}

fn events(srv: &Arc<Server>, req: &Request<Incoming>, sse: &AtomicBool) -> Response<Out> {
    let sse_headers = |r: &mut Response<Out>| {
        let h = r.headers_mut();
        h.insert("content-type", hv("text/event-stream"));
        h.insert("x-accel-buffering", hv("no"));
    };
    if req.method() == hyper::Method::HEAD {
        let mut r = reply(200, "text/event-stream", Bytes::new());
        sse_headers(&mut r);
        return r;
    }
    let slot = {
        let mut r = srv.reg();
        if r.sse >= MAX_SSE {
            return reply(503, "text/plain; charset=utf-8", format!("too many event streams (at most {MAX_SSE})\n"));
        }
        r.sse += 1;
        sse.store(true, Ordering::Relaxed);
        SseSlot(srv.clone())
    };
    // a cursor beyond the last id was given by another vigil process (ids start at 1 in each): all of this one's
    let after = Some(cursor(req)).filter(|c| *c <= srv.hub.last_id()).unwrap_or(0);
    let (tx, rx) = mpsc::channel::<Bytes>(SSE_QUEUE);
    let hub = srv.hub.clone();
    tokio::spawn(async move {
        let _slot = slot;
        let mut changes = hub.subscribe();
        let mut at = after;
        if tx.send(Bytes::from_static(b"retry: 1000\n\n")).await.is_err() {
            return;
        }
        loop {
            let b = hub.since(at, SSE_BATCH);
            let mut chunk = String::new();
            if let Some((from, to)) = b.gap {
                chunk.push_str(&format!("data: {{\"event\":\"gap\",\"from\":{from},\"to\":{to}}}\n\n"));
            }
            for (id, e) in &b.events {
                chunk.push_str(&format!("id: {id}\ndata: {e}\n\n"));
                at = *id;
            }
            if !chunk.is_empty() {
                if tx.send(Bytes::from(chunk)).await.is_err() {
                    return;
                }
                continue;
            }
            // caught up: wait for the next event, a keep-alive, or the client going away
            tokio::select! {
                // events come in bursts (a phase, a probe, a note within a millisecond): one write for the burst
                r = changes.changed() => {
                    if r.is_err() { return }
                    tokio::time::sleep(SSE_COALESCE).await;
                }
                _ = tokio::time::sleep(SSE_KEEPALIVE) => {
                    if tx.send(Bytes::from_static(b": keep-alive\n\n")).await.is_err() { return }
                }
                _ = tx.closed() => return,
            }
        }
    });
    let mut r = Response::new(Out::Sse(rx));
    sse_headers(&mut r);
    r.headers_mut().insert("cache-control", hv("no-store"));
    r
}

/// The Content-Security-Policy of the page: its own origin only; its inline scripts by their SHA-256.
fn csp(page: &str) -> String {
    let mut hashes = String::new();
    let mut rest = page;
    while let Some(i) = rest.find("<script") {
        let after = &rest[i..];
        let Some(gt) = after.find('>') else { break };
        let open = &after[..gt];
        let body_start = &after[gt + 1..];
        let Some(end) = body_start.find("</script>") else { break };
        if !open.contains("src=") {
            let d = ring::digest::digest(&ring::digest::SHA256, &body_start.as_bytes()[..end]);
            hashes.push_str(&format!(" 'sha256-{}'", base64(d.as_ref())));
        }
        rest = &body_start[end..];
    }
    format!(
        "default-src 'self'; script-src 'self'{hashes}; style-src 'self' 'unsafe-inline'; img-src 'self' data:; \
         connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; \
         frame-ancestors 'none'"
    )
}

fn base64(b: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut o = String::with_capacity(b.len().div_ceil(3) * 4);
    for c in b.chunks(3) {
        let n =
            (u32::from(c[0]) << 16) | (u32::from(*c.get(1).unwrap_or(&0)) << 8) | u32::from(*c.get(2).unwrap_or(&0));
        for (k, sh) in [18, 12, 6, 0].iter().enumerate() {
            if k <= c.len() {
                o.push(A[((n >> sh) & 63) as usize] as char);
            } else {
                o.push('=');
            }
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_compare_whole() {
        assert!(same(b"abc", b"abc"));
        assert!(!same(b"abc", b"abd"));
        assert!(!same(b"abc", b"abcd"));
        assert!(!same(b"", b"a"));
        assert!(same(b"", b""));
    }

    #[test]
    fn base64_and_the_pages_policy() {
        assert_eq!(base64(b"hello"), "aGVsbG8=");
        assert_eq!(base64(b"hi"), "aGk=");
        assert_eq!(base64(b"abc"), "YWJj");
        let p = csp("<html><script>alert(1)</script><script src=\"x.js\"></script></html>");
        // sha256("alert(1)") in base64, as browsers compute it
        assert!(p.contains("'sha256-bhHHL3z2vDgxUt0W3dWQOrprscmda2Y5pLsLg4GF+pI='"), "{p}");
        assert!(p.contains("connect-src 'self'") && p.starts_with("default-src 'self'"));
        assert!(!p.contains("http"), "no external origin: {p}");
    }
}
