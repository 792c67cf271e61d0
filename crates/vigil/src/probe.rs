//! A small HTTP/1.1 prober: one GET with a deadline, a bounded read of the status line and headers.
//! No HTTP client crate: what a readiness probe needs is little, and every read here is bounded so
//! a hostile or broken peer (never answering, trickling, garbage) cannot hold or grow vigil.

use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use vigil_core::ProbeOutcome;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub host: String,
    pub port: u16,
    pub path: String,
}

impl Target {
    pub fn parse(url: &str) -> Result<Target, String> {
        let rest = url.strip_prefix("http://").ok_or_else(|| format!("--url must start with http:// (got '{url}')"))?;
        let (hostport, path) = match rest.find('/') {
            Some(i) => (&rest[..i], rest[i..].to_string()),
            None => (rest, "/".to_string()),
        };
        let (host, port) = if let Some(h) = hostport.strip_prefix('[') {
            let (h, p) = h.split_once(']').ok_or_else(|| format!("bad IPv6 host in --url '{url}'"))?;
            (h.to_string(), p.strip_prefix(':').unwrap_or("80").to_string())
        } else {
            match hostport.rsplit_once(':') {
                Some((h, p)) => (h.to_string(), p.to_string()),
                None => (hostport.to_string(), "80".to_string()),
            }
        };
        if host.is_empty() {
            return Err(format!("no host in --url '{url}'"));
        }
        let port: u16 = port.parse().map_err(|_| format!("bad port in --url '{url}'"))?;
        if path.contains(['\r', '\n', ' ']) {
            return Err(format!("bad path in --url '{url}'"));
        }
        Ok(Target { host, port, path })
    }

    pub fn url(&self) -> String {
        if self.host.contains(':') {
            format!("http://[{}]:{}{}", self.host, self.port, self.path)
        } else {
            format!("http://{}:{}{}", self.host, self.port, self.path)
        }
    }
}

#[derive(Debug, Clone)]
pub struct ProbeResult {
    pub outcome: ProbeOutcome,
    pub status: Option<u16>,
    pub latency: Duration,
    pub note: String,
}

const MAX_HEAD: usize = 16 * 1024;

pub async fn probe(t: &Target, timeout: Duration, bearer: Option<&str>) -> ProbeResult {
    let t0 = Instant::now();
    let r = tokio::time::timeout(timeout, attempt(t, bearer)).await;
    let latency = t0.elapsed();
    match r {
        Err(_) => ProbeResult {
            outcome: ProbeOutcome::Timeout,
            status: None,
            latency,
            note: format!("no answer within {:.1}s", timeout.as_secs_f64()),
        },
        Ok(Err((o, note))) => ProbeResult { outcome: o, status: None, latency, note },
        Ok(Ok(code)) => {
            let outcome = if (200..300).contains(&code) { ProbeOutcome::Ok } else { ProbeOutcome::NotReady };
            ProbeResult { outcome, status: Some(code), latency, note: format!("HTTP {code}") }
        }
    }
}

async fn attempt(t: &Target, bearer: Option<&str>) -> Result<u16, (ProbeOutcome, String)> {
    let addrs: Vec<std::net::SocketAddr> = match tokio::net::lookup_host((t.host.as_str(), t.port)).await {
        Ok(a) => a.collect(),
        Err(e) => return Err((ProbeOutcome::Error, format!("resolve {}: {e}", t.host))),
    };
    let mut s = match connect_any(&addrs).await {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            return Err((ProbeOutcome::Refused, "connection refused".into()))
        }
        Err(e) => return Err((ProbeOutcome::Error, format!("connect: {e}"))),
    };
    let host = if t.host.contains(':') { format!("[{}]", t.host) } else { t.host.clone() };
    let mut req = format!(
        "GET {} HTTP/1.1\r\nHost: {}:{}\r\nUser-Agent: vigil\r\nAccept: */*\r\nConnection: close\r\n",
        t.path, host, t.port
    );
    if let Some(b) = bearer {
        req.push_str(&format!("Authorization: Bearer {b}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).await.map_err(|e| (ProbeOutcome::Error, format!("send: {e}")))?;
    let mut head = Vec::with_capacity(256);
    let mut buf = [0u8; 1024];
    loop {
        let n = s.read(&mut buf).await.map_err(|e| (ProbeOutcome::Error, format!("read: {e}")))?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
        if head.windows(2).any(|w| w == b"\r\n") || head.len() >= MAX_HEAD {
            break;
        }
    }
    let line_end = head.windows(2).position(|w| w == b"\r\n").unwrap_or(head.len());
    let status_line = String::from_utf8_lossy(&head[..line_end]);
    let mut parts = status_line.split_whitespace();
    match (parts.next(), parts.next()) {
        (Some(v), Some(code)) if v.starts_with("HTTP/1.") => code
            .parse::<u16>()
            .ok()
            .filter(|c| (100..600).contains(c))
            .ok_or((ProbeOutcome::Error, "bad status line".into())),
        _ if head.is_empty() => Err((ProbeOutcome::Error, "connection closed without an answer".into())),
        _ => Err((ProbeOutcome::Error, "not an HTTP answer".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_urls() {
        let t = Target::parse("http://127.0.0.1:8080/health").unwrap();
        assert_eq!((t.host.as_str(), t.port, t.path.as_str()), ("127.0.0.1", 8080, "/health"));
        let t = Target::parse("http://[::1]:9/x").unwrap();
        assert_eq!((t.host.as_str(), t.port), ("::1", 9));
        assert_eq!(Target::parse("http://h").unwrap().port, 80);
        assert!(Target::parse("https://x").is_err());
        assert!(Target::parse("http://:80/").is_err());
        assert!(Target::parse("http://h:99999/").is_err());
    }
}

/// Connects to the first address that accepts, in resolver order: `localhost` resolving to `::1`
/// first while the server listens on 127.0.0.1 only still reaches it.
pub async fn connect_any(addrs: &[std::net::SocketAddr]) -> std::io::Result<TcpStream> {
    let mut last = std::io::Error::new(std::io::ErrorKind::NotFound, "no address");
    for a in addrs {
        match TcpStream::connect(a).await {
            Ok(s) => return Ok(s),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// The largest response body vigil reads (a generation answer is small; a hostile one is cut).
pub const MAX_BODY: usize = 1 << 20;

/// One HTTP/1.1 request with a JSON body (or none), a deadline and a bounded read. Returns the
/// status and the body (chunked encoding decoded).
pub async fn request(
    t: &Target,
    method: &str,
    path: &str,
    body: Option<&str>,
    timeout: Duration,
    bearer: Option<&str>,
) -> Result<(u16, Vec<u8>), String> {
    let fut = async {
        let addrs: Vec<std::net::SocketAddr> =
            tokio::net::lookup_host((t.host.as_str(), t.port)).await.map_err(|e| format!("resolve: {e}"))?.collect();
        let mut s = connect_any(&addrs).await.map_err(|e| format!("connect: {e}"))?;
        let host = if t.host.contains(':') { format!("[{}]", t.host) } else { t.host.clone() };
        let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {host}:{}\r\nUser-Agent: vigil\r\nAccept: application/json\r\nConnection: close\r\n", t.port);
        if let Some(b) = bearer {
            req.push_str(&format!("Authorization: Bearer {b}\r\n"));
        }
        if let Some(b) = body {
            req.push_str(&format!("Content-Type: application/json\r\nContent-Length: {}\r\n", b.len()));
        }
        req.push_str("\r\n");
        if let Some(b) = body {
            req.push_str(b);
        }
        s.write_all(req.as_bytes()).await.map_err(|e| format!("send: {e}"))?;
        let mut data = Vec::new();
        let mut buf = [0u8; 16 * 1024];
        loop {
            let n = s.read(&mut buf).await.map_err(|e| format!("read: {e}"))?;
            if n == 0 {
                break;
            }
            data.extend_from_slice(&buf[..n]);
            if data.len() > MAX_BODY + MAX_HEAD {
                return Err(format!("answer larger than {} bytes", MAX_BODY));
            }
        }
        parse_response(&data)
    };
    tokio::time::timeout(timeout, fut).await.map_err(|_| format!("no answer within {:.1}s", timeout.as_secs_f64()))?
}

fn parse_response(data: &[u8]) -> Result<(u16, Vec<u8>), String> {
    let end = data.windows(4).position(|w| w == b"\r\n\r\n").ok_or("no complete HTTP header")?;
    let head = String::from_utf8_lossy(&data[..end]);
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or("");
    let mut parts = status_line.split_whitespace();
    let code = match (parts.next(), parts.next()) {
        (Some(v), Some(c)) if v.starts_with("HTTP/1.") => c.parse::<u16>().map_err(|_| "bad status line")?,
        _ => return Err("not an HTTP answer".into()),
    };
    let chunked = lines.any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    let mut body = data[end + 4..].to_vec();
    if chunked {
        let mut out = Vec::new();
        let mut rest = &body[..];
        while let Some(i) = rest.windows(2).position(|w| w == b"\r\n") {
            let size =
                usize::from_str_radix(String::from_utf8_lossy(&rest[..i]).split(';').next().unwrap_or("").trim(), 16)
                    .map_err(|_| "bad chunk size")?;
            rest = &rest[i + 2..];
            if size == 0 || rest.len() < size {
                out.extend_from_slice(&rest[..size.min(rest.len())]);
                break;
            }
            out.extend_from_slice(&rest[..size]);
            rest = &rest[(size + 2).min(rest.len())..];
        }
        body = out;
    }
    Ok((code, body))
}

#[cfg(test)]
mod http_tests {
    use super::*;

    #[test]
    fn ipv6_first_falls_back_to_ipv4() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        // what `localhost` gives where ::1 comes first: the server listens on 127.0.0.1 only
        let addrs: Vec<std::net::SocketAddr> =
            vec![format!("[::1]:{port}").parse().unwrap(), format!("127.0.0.1:{port}").parse().unwrap()];
        let s = rt.block_on(connect_any(&addrs)).expect("fell back to 127.0.0.1");
        assert_eq!(s.peer_addr().unwrap().ip().to_string(), "127.0.0.1");
    }

    #[test]
    fn parses_plain_and_chunked() {
        let (c, b) = parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi").unwrap();
        assert_eq!((c, b.as_slice()), (200, &b"hi"[..]));
        let (c, b) =
            parse_response(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")
                .unwrap();
        assert_eq!((c, b.as_slice()), (200, &b"abcde"[..]));
        assert!(parse_response(b"garbage").is_err());
        assert!(parse_response(b"SSH-2.0-x\r\n\r\n").is_err());
    }
}
