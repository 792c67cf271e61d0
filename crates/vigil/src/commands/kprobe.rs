//! `vigil probe`: one readiness check for Kubernetes exec probes (startup, readiness, liveness) and
//! scripts. Exit 0 when ready, 1 when not; one line saying which and why; bounded by `--timeout`.

use crate::error::CliError;
use crate::exit::Exit;
use crate::node::run as runs;
use crate::sinks::report::out_line;
use crate::sources::probe::{self, Target};
use crate::sources::tls::TlsOpts;
use std::time::{Duration, Instant};
use vigil_core::{ProbeOutcome, Profiles, Verdict};

/// What `vigil probe` was asked.
pub struct Args {
    pub name: Option<String>,
    pub url: Option<String>,
    pub log: Option<String>,
    pub generate: bool,
    pub timeout: Duration,
    pub server: Option<String>,
    pub tls: TlsOpts,
}

pub async fn run(a: Args, profiles: &Profiles) -> Result<Exit, CliError> {
    let t0 = Instant::now();
    let Args { name, url, log, generate, timeout, server, tls } = a;
    let (mut url, mut log, mut server, mut pid) = (url, log, server, None);
    if let Some(n) = &name {
        let (dir, rec) = runs::load(n)?;
        let st: runs::State = runs::read_json(&dir.join("state.json")).unwrap_or_default();
        pid = st.server_pid;
        log = log.or(Some(rec.log.clone()));
        server = server.or(rec.server.clone());
        if url.is_none() {
            if let (Some(p), Some(pr)) = (rec.port, rec.server.as_ref().and_then(|k| profiles.get(k))) {
                url = Some(format!("http://127.0.0.1:{p}{}", pr.health_path));
            }
        }
    }
    if url.is_none() && log.is_none() {
        return Err(CliError::usage("probe: give a run NAME, --url or --log"));
    }
    if tls.is_set() && !url.as_deref().is_some_and(|u| u.starts_with("https://")) {
        return Err(CliError::usage("--ca-cert and --insecure apply to an https:// --url only"));
    }
    let line = |ok: bool, what: &str| {
        out_line(&format!("{} {what}", if ok { "ready:" } else { "not ready:" }));
        if ok {
            Exit::Ready
        } else {
            Exit::NotReady
        }
    };
    if let Some(p) = pid {
        if !crate::sources::follow::pid_alive(p) {
            return Ok(line(false, &format!("crashed: the server (pid {p}) is not running")));
        }
    }
    // What the log says: the judge over the log's last LOG_TAIL bytes (a crash, or the phase, is at its
    // end), read from the end within half of --timeout; past that the probe goes on without it.
    let mut log_verdict = None;
    if let Some(l) = &log {
        let budget = timeout.saturating_sub(t0.elapsed()) / 2;
        match judge_tail(l.clone(), server.clone(), profiles.clone(), budget).await {
            Ok(r) => {
                if r.verdict == Verdict::Crashed {
                    return Ok(line(
                        false,
                        &format!(
                            "crashed in {} (cause {})",
                            r.phase,
                            r.cause.map_or("unknown".into(), |c| c.to_string())
                        ),
                    ));
                }
                if server.is_none() {
                    server = r.server.clone();
                }
                log_verdict = Some(r);
            }
            Err(why) => eprintln!("vigil: --log {l}: {why}"),
        }
    }
    let Some(u) = url else {
        return Ok(match log_verdict {
            Some(r) if r.verdict == Verdict::Ready => line(true, "the log shows the ready marker"),
            Some(r) => line(false, &format!("{} in {}", r.verdict, r.phase)),
            None => line(false, "log unreadable"),
        });
    };
    let t = Target::parse_with(&u, &tls).map_err(CliError::usage)?;
    let left = timeout.saturating_sub(t0.elapsed());
    let r = probe::probe(&t, left, None).await;
    if r.outcome != ProbeOutcome::Ok {
        let phase = log_verdict.map(|r| format!("starting in {}; ", r.phase)).unwrap_or_default();
        return Ok(line(false, &format!("{phase}health {}", r.note)));
    }
    if generate {
        let left = timeout.saturating_sub(t0.elapsed()).max(Duration::from_millis(100));
        let spec = profiles.proof_for(server.as_deref());
        let g = crate::sources::proof::generate_with(
            spec,
            &t,
            left,
            None,
            None,
            crate::sources::proof::proof_tokens(false),
            false,
        )
        .await;
        if !g.ok {
            return Ok(line(false, &format!("health OK, generation fails: {}", g.note)));
        }
        return Ok(line(true, &format!("health OK, generation {}", g.note)));
    }
    Ok(line(true, &format!("health {} in {} ms", r.note, r.latency.as_millis())))
}

/// The part of a log `probe --log` reads: its last 1 MiB (whole lines), whatever the log's size.
pub const LOG_TAIL: u64 = 1 << 20;

/// Reads the end of `path` (a regular file, opened without blocking), at most `max` bytes, starting
/// at a line boundary when it does not start at the file's beginning.
pub fn read_tail(path: &std::path::Path, max: u64) -> std::io::Result<Vec<u8>> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = crate::sources::procs::open_regular(path)?;
    let len = f.metadata()?.len();
    let start = len.saturating_sub(max);
    f.seek(SeekFrom::Start(start))?;
    let mut buf = Vec::with_capacity((len - start) as usize);
    f.take(max).read_to_end(&mut buf)?;
    if start > 0 {
        // the first line is cut: judge from the next whole one
        match buf.iter().position(|b| *b == b'\n') {
            Some(i) => drop(buf.drain(..=i)),
            None => buf.clear(),
        }
    }
    Ok(buf)
}

/// The offline judge over the log's tail, on its own thread, given at most `budget`.
async fn judge_tail(
    path: String,
    server: Option<String>,
    profiles: Profiles,
    budget: Duration,
) -> Result<vigil_core::Report, String> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    // a plain thread, not the runtime's blocking pool: one past its budget is left behind, not waited for
    std::thread::spawn(move || {
        let r = read_tail(std::path::Path::new(&path), LOG_TAIL)
            .map(|b| vigil_core::diagnose_text(&profiles, server.as_deref(), &String::from_utf8_lossy(&b)))
            .map_err(|e| e.to_string());
        let _ = tx.send(r);
    });
    match tokio::time::timeout(budget, rx).await {
        Ok(Ok(r)) => r,
        Ok(Err(_)) => Err("the log reader stopped".into()),
        Err(_) => Err(format!("not judged within {} ms: probing without it", budget.as_millis())),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn tail_starts_at_a_whole_line() {
        let p = std::env::temp_dir().join(format!("vigil-tail-{}", std::process::id()));
        std::fs::write(&p, b"first line\nsecond line\nthird\n").unwrap();
        assert_eq!(super::read_tail(&p, 1000).unwrap(), b"first line\nsecond line\nthird\n");
        assert_eq!(super::read_tail(&p, 15).unwrap(), b"third\n");
        let _ = std::fs::remove_file(&p);
        assert!(super::read_tail(std::path::Path::new("/dev/zero"), 10).is_err());
    }
}
