//! `vigil probe`: one readiness check for Kubernetes exec probes (startup, readiness, liveness) and
//! scripts. Exit 0 when ready, 1 when not; one line saying which and why; bounded by `--timeout`.

use crate::cli::CliError;
use crate::probe::{self, Target};
use crate::report::out_line;
use crate::run as runs;
use crate::tls::TlsOpts;
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

pub async fn run(a: Args, profiles: &Profiles) -> Result<i32, CliError> {
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
            0
        } else {
            1
        }
    };
    if let Some(p) = pid {
        if !crate::follow::pid_alive(p) {
            return Ok(line(false, &format!("crashed: the server (pid {p}) is not running")));
        }
    }
    // What the log says (offline judge over the whole log).
    let mut log_verdict = None;
    if let Some(l) = &log {
        if let Ok(bytes) = std::fs::read(l) {
            let r = vigil_core::diagnose_text(profiles, server.as_deref(), &String::from_utf8_lossy(&bytes));
            if r.verdict == Verdict::Crashed {
                return Ok(line(
                    false,
                    &format!("crashed in {} (cause {})", r.phase, r.cause.map_or("unknown".into(), |c| c.to_string())),
                ));
            }
            if server.is_none() {
                server = r.server.clone();
            }
            log_verdict = Some(r);
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
        let g = crate::proof::generate(server.as_deref(), &t, left, None).await;
        if !g.ok {
            return Ok(line(false, &format!("health OK, generation fails: {}", g.note)));
        }
        return Ok(line(true, &format!("health OK, generation {}", g.note)));
    }
    Ok(line(true, &format!("health {} in {} ms", r.note, r.latency.as_millis())))
}
