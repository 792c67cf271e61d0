//! A node over SSH: one connection (the system ssh client, a tethered master) per node; every operation
//! is a small script sent on stdin whose answer is parsed here. The node's keeper does what the local
//! one does (records, stop with grace, proof that nothing is left).

use super::{Launch, Launched, LogTail, Node, ProcRow, RunRow, ServerEnd};
use crate::error::CliError;
use crate::exit::Exit;
use crate::node::remote::{self, Conn, RemoteWatch, SshOpts};
use crate::node::RunHandle;
use crate::sinks::events::Typed;
use crate::sinks::events::WatchEvent;
use crate::sinks::records::CheckReport;
use crate::sinks::redact::Redactor;
use crate::sinks::report::Reporter;
use crate::sources::follow::SourceMsg;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedSender;
use vigil_core::evidence::Evidence;
use vigil_core::judge::{fmt_ms, ExitInfo};
use vigil_core::{Profiles, Report};

pub struct SshNode {
    pub conn: Arc<Conn>,
}

impl SshNode {
    pub async fn open(ssh: &SshOpts, host: &str) -> Result<SshNode, CliError> {
        Ok(SshNode { conn: open(ssh, host).await? })
    }
}

impl Node for SshNode {
    fn host(&self) -> Option<&str> {
        Some(&self.conn.dest)
    }

    async fn runs(&self) -> Result<Vec<String>, CliError> {
        let c = &self.conn;
        let (_, out, _) = c.exec(&remote::status_script(c), Duration::from_secs(60)).await?;
        Ok(String::from_utf8_lossy(&out).lines().filter_map(|l| l.split('\t').next().map(String::from)).collect())
    }

    async fn status(&self, profiles: &Profiles) -> Result<Vec<RunRow>, CliError> {
        let c = &self.conn;
        let (_, out, _) = c.exec(&remote::status_script(c), Duration::from_secs(60)).await?;
        let now = crate::state::now_ms() / 1000;
        let mut rows = Vec::new();
        for l in String::from_utf8_lossy(&out).lines() {
            let f: Vec<&str> = l.split('\t').collect();
            if f.len() < 8 {
                continue;
            }
            let (name, alive, x, started) = (f[0], f[3] == "1", f[4], f[5].parse::<u64>().unwrap_or(0));
            let (_, log, _) = c.exec(&remote::log_script(c, name), Duration::from_secs(60)).await?;
            let report = vigil_core::diagnose_text(profiles, None, &String::from_utf8_lossy(&log));
            let x = remote::exit_info(x.parse().ok());
            let state = crate::node::up::run_state(alive, None, report.verdict, x.code, x.signal);
            rows.push(RunRow {
                host: Some(c.dest.clone()),
                name: name.to_string(),
                server: report.server.clone(),
                state,
                phase: report.phase.to_string(),
                in_state: (alive && started > 0).then(|| fmt_ms(now.saturating_sub(started) * 1000)),
                port: None,
                pid: Some(f[1].parse().unwrap_or(0)),
                keeper_pid: f[2].parse().unwrap_or(0),
                last_log_line_age_s: f[6].parse().ok(),
            });
        }
        Ok(rows)
    }

    async fn stop(&self, run: &str, grace: Duration, rep: &mut Reporter) -> Result<bool, CliError> {
        stop(&self.conn, run, grace, rep).await
    }

    async fn log_tail(&self, name: &str, lines: usize) -> Result<LogTail, CliError> {
        let c = &self.conn;
        // the last N lines of the first S bytes, and S: following resumes exactly there
        let mut s = c.prelude(name);
        s.extend_from_slice(
            format!(
                "[ -f \"$D/server.log\" ] || exit 3\ns=$(wc -c < \"$D/server.log\")\necho \"$s\"\nhead -c \"$s\" \"$D/server.log\" | tail -n {lines}\n"
            )
            .as_bytes(),
        );
        let (code, out, _) = c.exec(&s, Duration::from_secs(120)).await?;
        if code == 3 {
            return Err(CliError::usage(format!("no run named '{name}' on {}", c.dest)));
        }
        let text = String::from_utf8_lossy(&out).into_owned();
        let (size, rest) = text.split_once('\n').unwrap_or((text.as_str(), ""));
        let lines = rest.lines().map(|l| crate::sources::lines::final_state(l).to_string()).collect();
        Ok(LogTail { lines, offset: size.trim().parse().unwrap_or(0) })
    }

    async fn follow_log(&self, name: &str, from: u64, tx: UnboundedSender<SourceMsg>) {
        // the same follower as a watch (reconnects with backoff, no line lost or repeated)
        let w = RemoteWatch::new(self.conn.clone(), name);
        w.bytes.store(from, std::sync::atomic::Ordering::SeqCst);
        remote::follow_log(w, tx).await
    }

    async fn ps(&self, profiles: &Profiles) -> Result<Vec<ProcRow>, CliError> {
        let c = &self.conn;
        let (_, out, _) = c.exec(&remote::ps_script(), Duration::from_secs(60)).await?;
        let text = String::from_utf8_lossy(&out).into_owned();
        Ok(parse_ps(&text, profiles).into_iter().map(|r| ProcRow { host: Some(c.dest.clone()), ..r }).collect())
    }

    fn redactor(&self, name: &str) -> Redactor {
        crate::node::run::redactor_for(name, Some(&self.conn.dest))
    }

    async fn launch(&self, l: &Launch<'_>, rep: &mut Reporter) -> Result<Launched, CliError> {
        let conn = &self.conn;
        let Launch { name, argv, a, profiles, rank, n, .. } = *l;
        let kind = l.kind.clone();
        let argv_s: Vec<String> = argv.iter().map(|x| String::from_utf8_lossy(x).into_owned()).collect();
        // the node's own environment, plus --env-file/--env (the local environment is not copied)
        let mut env: Vec<(String, String)> = Vec::new();
        crate::node::up::apply_env_flags(&mut env, a)?;
        if let Some(r) = rank {
            env.push(("VIGIL_NODE_RANK".into(), r.to_string()));
            env.push(("VIGIL_NNODES".into(), n.to_string()));
        }
        let (argv_red, _, secrets) = crate::sinks::redact::redact(&argv_s, &env);
        let secret_vals = crate::sinks::redact::secret_values(&secrets);
        // kept on this machine (0600), so that later `logs --host` / `wait --host` hide them too
        let sp = crate::node::run::remote_secrets_path(&conn.dest, name)?;
        if secret_vals.is_empty() {
            let _ = std::fs::remove_file(&sp);
        } else {
            if let Some(d) = sp.parent() {
                crate::state::mkdir_private(d)?;
            }
            crate::node::run::write_json(&sp, &secrets)?;
        }
        for s in &secret_vals {
            rep.add_secret(s);
        }
        let shown = String::from_utf8_lossy(&remote::words(argv_red.iter().map(|x| x.as_bytes()))).into_owned();
        let profile = kind.as_ref().and_then(|k| profiles.get(k)).cloned();
        let port = crate::sources::follow::arg_value(&argv_s, "--port")
            .and_then(|p| p.parse::<u16>().ok())
            .or(profile.as_ref().map(|p| p.port))
            .filter(|_| !a.no_probe);
        if a.replace {
            let _ = stop(conn, name, a.grace, rep).await?;
        }
        if !a.no_check {
            let r = check_report(conn, &argv_s, kind.clone(), &env, profiles).await?;
            if let Some(why) = crate::check::gate(&r, a.json, &format!(" on {}", conn.dest)) {
                return Ok(Err((Exit::CheckFailed, why)));
            }
        }
        let script = remote::launch_script(conn, name, argv, &env, &shown, port, kind.as_deref());
        let (code, out, err) = conn.exec(&script, Duration::from_secs(30)).await?;
        let out = String::from_utf8_lossy(&out).into_owned();
        let mut it = out.split_whitespace();
        match (code, it.next()) {
            (0, Some("pid")) => {}
            (91, _) => {
                return Ok(Err((
                    Exit::Usage,
                    format!(
                        "run '{name}' is still alive on {} (pid {}): `vigil down --host {} {name}`, or pass --replace",
                        conn.dest,
                        it.next().unwrap_or("?"),
                        conn.dest
                    ),
                )))
            }
            (93, _) => {
                return Ok(Err((
                    Exit::Refused,
                    format!("refused: port {} is taken on {}; not launching", port.unwrap_or(0), conn.dest),
                )))
            }
            _ => {
                return Ok(Err((
                    Exit::Internal,
                    format!("launch on {} failed (status {code}): {} {}", conn.dest, out.trim(), err.trim()),
                )))
            }
        }
        let sp: i64 = it.next().and_then(|x| x.parse().ok()).unwrap_or(0);
        let kp: i64 = it.next().and_then(|x| x.parse().ok()).unwrap_or(0);
        let mut w = RunHandle {
            remote: Some(RemoteWatch::new(conn.clone(), name)),
            server: kind,
            argv: argv_s,
            secrets: secret_vals,
            ..RunHandle::default()
        };
        if let (Some(p), true) = (port, rank.unwrap_or(0) == 0) {
            let lp = conn.forward(p)?;
            let path = profile.as_ref().map(|p| p.health_path.clone()).unwrap_or_else(|| "/health".into());
            w.url = Some(format!("http://127.0.0.1:{lp}{path}"));
        } else if rank.unwrap_or(0) > 0 {
            w.no_generate = true;
        }
        let launched =
            WatchEvent::Launched { name, pid: sp, keeper_pid: kp, run_dir: None, on: Some(&conn.dest), log: None };
        rep.emit(Some(0), &launched);
        Ok(Ok(w))
    }

    async fn attach(
        &self,
        name: &str,
        server: Option<&str>,
        probe: bool,
        profiles: &Profiles,
    ) -> Result<RunHandle, CliError> {
        let conn = &self.conn;
        let mut w = RunHandle { server: server.map(String::from), ..RunHandle::default() };
        // the run's secrets stored at launch: hidden as in every other output
        w.secrets
            .extend(crate::sinks::redact::secret_values(&crate::node::run::stored_secrets(name, Some(&conn.dest))));
        let mut s = conn.prelude(name);
        s.extend_from_slice(b"[ -f \"$D/pid\" ] || { echo none; exit 0; }\ncat \"$D/meta\" 2>/dev/null\n");
        let (_, out, _) = conn.exec(&s, Duration::from_secs(30)).await?;
        let out = String::from_utf8_lossy(&out).into_owned();
        if out.trim() == "none" {
            return Err(CliError::usage(format!("no run named '{name}' on {}", conn.dest)));
        }
        let mut port = None;
        for l in out.lines() {
            match l.split_once('=') {
                Some(("port", v)) => port = v.trim().parse::<u16>().ok(),
                Some(("server", v)) if w.server.is_none() && !v.trim().is_empty() => {
                    w.server = Some(v.trim().to_string())
                }
                _ => {}
            }
        }
        w.remote = Some(RemoteWatch::new(conn.clone(), name));
        if let (Some(p), true) = (port, probe) {
            let lp = conn.forward(p)?;
            let path = w
                .server
                .as_ref()
                .and_then(|k| profiles.get(k))
                .map(|p| p.health_path.clone())
                .unwrap_or_else(|| "/health".into());
            w.url = Some(format!("http://127.0.0.1:{lp}{path}"));
        }
        Ok(w)
    }

    async fn wait_exit(&self, name: &str) -> ServerEnd {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(remote::wait_exit(RemoteWatch::new(self.conn.clone(), name), tx));
        // no answer at all (the connection was lost for good): how it ended is unknown
        let unknown = || ServerEnd { exit: ExitInfo { code: None, signal: None, ours: false }, requested: false };
        rx.recv().await.map_or_else(unknown, |(end, _)| end)
    }

    fn record_startup(&self, _run: &str, _r: &Report) {}

    async fn evidence(&self, name: &str) -> Result<(Evidence, Vec<String>), CliError> {
        let secrets =
            crate::sinks::redact::secret_values(&crate::node::run::stored_secrets(name, Some(&self.conn.dest)));
        let ev = crate::node::remote_evidence::capture(&self.conn, name, &secrets).await.map_err(CliError::usage)?;
        Ok((ev, secrets))
    }

    async fn check(&self, argv: &[String], kind: Option<String>, profiles: &Profiles) -> Result<CheckReport, CliError> {
        check_report(&self.conn, argv, kind, &[], profiles).await
    }
}

/// Connects to a host off the async thread (the master's start blocks up to the connect timeout).
pub async fn open(ssh: &SshOpts, host: &str) -> Result<Arc<Conn>, CliError> {
    let (ssh, dest) = (ssh.clone(), host.to_string());
    tokio::task::spawn_blocking(move || Conn::open(&dest, &ssh))
        .await
        .unwrap_or_else(|e| Err(CliError::Internal(e.to_string())))
}

/// Stops a remote run; true when nothing is left (and GPU memory, when seen, is released).
pub async fn stop(conn: &Arc<Conn>, name: &str, grace: Duration, rep: &mut Reporter) -> Result<bool, CliError> {
    Ok(stopped(conn, name, grace, rep).await?.ok)
}

/// What a remote stop proved: nothing left (and GPU memory released where seen), else the node's pids
/// still alive.
pub struct Stopped {
    pub ok: bool,
    pub survivors: Vec<i32>,
    pub gpu_released: Option<bool>,
}

/// Stops a remote run and tells what is left.
pub async fn stopped(conn: &Arc<Conn>, name: &str, grace: Duration, rep: &mut Reporter) -> Result<Stopped, CliError> {
    let mut res = Stopped { ok: true, survivors: vec![], gpu_released: None };
    let t0 = Instant::now();
    let (_, out, _) = conn.exec(&remote::stop_script(conn, name, grace), grace + Duration::from_secs(60)).await?;
    let out = String::from_utf8_lossy(&out).into_owned();
    // each line carries its time on the node since the script began
    let at = t0.elapsed().as_millis() as u64;
    let at = at.saturating_sub(out.lines().last().and_then(|l| l.split(' ').next()?.parse::<u64>().ok()).unwrap_or(0));
    for l in out.lines() {
        let (ms, l) = l.split_once(' ').unwrap_or(("0", l));
        let t = at + ms.parse::<u64>().unwrap_or(0);
        let (k, rest) = l.split_once(' ').unwrap_or((l, ""));
        match k {
            "none" => rep.note(t, &format!("'{name}' on {}: nothing running", conn.dest)),
            "signal" => {
                let (sig, pids) = rest.split_once(' ').unwrap_or((rest, ""));
                let list: Vec<i32> = pids.split_whitespace().filter_map(|p| p.parse().ok()).collect();
                let what = Typed::StopStep { signal: sig.to_string(), pids: list };
                rep.typed(t, &format!("sent {sig} to pids {}", pids.trim()), &what)
            }
            "gone" => rep.note(
                t,
                &format!(
                    "stopped '{name}' on {} in {}; none left",
                    conn.dest,
                    fmt_ms(rest.trim().parse().unwrap_or(0))
                ),
            ),
            "left" => {
                res.ok = false;
                let pid = rest.split_whitespace().next().and_then(|p| p.parse().ok());
                if let Some(p) = pid {
                    res.survivors.push(p);
                }
                rep.typed(
                    t,
                    &format!("still alive on {}: pid {}", conn.dest, crate::sinks::redact::redact_cmdline(rest)),
                    &Typed::StopSurvivor { pid: pid.unwrap_or(0) },
                );
            }
            "gpu-free" => {
                res.gpu_released = Some(true);
                let msg = format!("GPU memory released: {} MiB no longer held (nvidia-smi)", rest.trim());
                rep.typed(t, &msg, &Typed::GpuRelease { released: Some(true) })
            }
            "gpu-held" => {
                res.ok = false;
                res.gpu_released = Some(false);
                // a GPU holder is a survivor of the stop, as on this machine
                if let Some(p) = rest.split_whitespace().next().and_then(|p| p.parse().ok()) {
                    if !res.survivors.contains(&p) {
                        res.survivors.push(p);
                    }
                }
                let msg = format!("GPU memory NOT released on {}: pid/MiB {rest}", conn.dest);
                rep.typed(t, &msg, &Typed::GpuRelease { released: Some(false) });
            }
            _ => {}
        }
    }
    Ok(res)
}

/// The preflight check of a command for a node: its model configs (fetched through the connection
/// into a private local mirror) under the same rules as a local check, then the node's port and
/// GPU count.
pub async fn check_report(
    c: &Arc<Conn>,
    argv: &[String],
    kind: Option<String>,
    env: &[(String, String)],
    profiles: &Profiles,
) -> Result<crate::sinks::records::CheckReport, CliError> {
    use crate::check;
    use crate::sinks::records::Severity;
    let l = check::parse_launch(argv, kind.as_deref())?;
    let mirror = std::env::temp_dir().join(format!("vigil-check-{}-{}", std::process::id(), crate::state::now_ms()));
    crate::state::mkdir_private(&mirror)?;
    let mut argv2 = argv.to_vec();
    let mut back: Vec<(String, String)> = Vec::new(); // mirror dir -> HOST:remote dir
    let mut missing: Vec<String> = Vec::new();
    let mut notes: Vec<(Severity, String, String, Option<&'static str>)> = Vec::new();
    let hf = kind.as_deref().and_then(|k| profiles.get(k)).is_some_and(|p| p.cmd.hf_config);
    for (i, m) in [l.model.clone(), l.draft.clone()].into_iter().enumerate() {
        let Some(m) = m else { continue };
        if !hf {
            notes.push((
                Severity::Info,
                "model".into(),
                format!("{m}: GGUF files are checked on the node only (run `vigil check` there)"),
                None,
            ));
            continue;
        }
        // a directory on the node, else the node's Hugging Face cache (newest snapshot)
        let mut s = b"m=".to_vec();
        s.extend(remote::quote(m.as_bytes()));
        s.extend_from_slice(
            b"\nd=$m\nif [ ! -d \"$d\" ]; then h=${HF_HUB_CACHE:-${HF_HOME:-$HOME/.cache/huggingface}/hub}; r=\"$h/models--$(printf '%s' \"$m\" | sed 's#/#--#g')\"; c=$(head -c 256 \"$r/refs/main\" 2>/dev/null | tr -d ' \\n'); d=; case $c in ''|*/*) ;; *) [ -d \"$r/snapshots/$c\" ] && d=\"$r/snapshots/$c\" ;; esac; [ -n \"$d\" ] || d=$(ls -td \"$r\"/snapshots/*/ 2>/dev/null | head -n 1); fi\n[ -n \"$d\" ] && [ -f \"$d/config.json\" ] || exit 4\nd=${d%/}\nprintf '%s\\n' \"$d\"\nhead -c 4194304 \"$d/config.json\"\n",
        );
        let (code, out, _) = c.exec(&s, Duration::from_secs(30)).await?;
        if code != 0 {
            missing.push(m.clone());
            // as locally: a path is an error every server confirms; a name that may be a Hugging Face id
            // is downloaded by the server on the node
            notes.push(if check::path_like(&m) {
                (
                    Severity::Error,
                    "model".into(),
                    format!("{m}: no config.json on {} (not a model directory)", c.dest),
                    Some(check::evidence::MISSING_LOCAL_PATH),
                )
            } else {
                (
                    Severity::Warning,
                    "model".into(),
                    format!("{m}: not a directory on {} and not in its Hugging Face cache: the server will download it (config checks skipped)", c.dest),
                    None,
                )
            });
            continue;
        }
        let nl = out.iter().position(|b| *b == b'\n').unwrap_or(out.len());
        let remote_dir = String::from_utf8_lossy(&out[..nl]).into_owned();
        let dir = mirror.join(format!("m{i}"));
        crate::state::mkdir_private(&dir)?;
        std::fs::write(dir.join("config.json"), out.get(nl + 1..).unwrap_or_default())
            .map_err(|e| CliError::Internal(e.to_string()))?;
        for a in argv2.iter_mut() {
            if *a == m {
                *a = dir.display().to_string();
            }
        }
        back.push((dir.display().to_string(), format!("{}:{remote_dir}", c.dest)));
    }
    let mut rep = check::check(
        &check::Inputs {
            argv: &argv2,
            server: kind.clone(),
            env,
            cwd: &mirror,
            local_machine: false,
            version: None,
            state_root: None,
        },
        profiles,
    )?;
    let _ = std::fs::remove_dir_all(&mirror);
    // a model that is not on the node was reported above; what the local rules said of that same
    // path describes this machine, not the node
    rep.findings.retain(|f| !(f.rule == "model" && missing.iter().any(|m| f.message.contains(m.as_str()))));
    for f in rep.findings.iter_mut() {
        for (local, remote) in &back {
            f.message = f.message.replace(local.as_str(), remote);
        }
    }
    for (sev, rule, m, confirmed) in notes {
        match confirmed {
            Some(by) => rep.add_confirmed(&rule, m, None, by),
            None => rep.add(sev, &rule, m, None),
        }
    }
    // the node: its port and its GPUs
    let port = l.port.or_else(|| kind.as_deref().and_then(|k| profiles.get(k)).map(|p| p.port));
    let mut s = Vec::new();
    if let Some(p) = port {
        s.extend_from_slice(
            format!("grep -qE ':{p:04X} [0-9A-F:]+ 0A ' /proc/net/tcp /proc/net/tcp6 2>/dev/null && echo port-taken\n")
                .as_bytes(),
        );
    }
    s.extend_from_slice(b"command -v nvidia-smi >/dev/null 2>&1 && echo \"gpus $(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | wc -l)\"\n");
    let (_, out, _) = c.exec(&s, Duration::from_secs(30)).await?;
    let out = String::from_utf8_lossy(&out);
    if out.lines().any(|x| x == "port-taken") {
        let p = port.unwrap_or(0);
        rep.add(
            Severity::Error,
            "port",
            format!("port {p} is taken on {}", c.dest),
            Some(format!("vigil ps --host {}; or choose another --port", c.dest)),
        );
    }
    // per node: with --nnodes N each node holds world/N (SGLang's attention DP adds none)
    let need = l.gpus_per_node(kind.as_deref());
    let how = l.gpus_how(kind.as_deref());
    match out.lines().find_map(|x| x.strip_prefix("gpus ")).and_then(|n| n.trim().parse::<u64>().ok()) {
        Some(n) if n < need => rep.add(
            Severity::Error,
            "gpus",
            format!("{need} GPUs needed on this node ({how}), {} has {n}", c.dest),
            None,
        ),
        Some(n) => rep.add(Severity::Info, "gpus", format!("{} has {n} GPU(s); {need} needed", c.dest), None),
        None => rep.add(Severity::Info, "gpus", format!("no nvidia-smi on {}: GPU count not checked", c.dest), None),
    }
    Ok(rep)
}

/// Parses the output of `ps_script`: processes, their socket inodes, then /proc/net/tcp{,6}.
fn parse_ps(text: &str, profiles: &Profiles) -> Vec<ProcRow> {
    let mut procs: Vec<(i32, i32, Option<u64>, String)> = Vec::new();
    let mut socks: Vec<(i32, String)> = Vec::new();
    let mut listen: std::collections::HashMap<String, u16> = Default::default();
    let mut in_tcp = false;
    for l in text.lines() {
        if l == "tcp" {
            in_tcp = true;
            continue;
        }
        if in_tcp {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() > 9 && f[3] == "0A" {
                if let Some(port) = f[1].rsplit(':').next().and_then(|p| u16::from_str_radix(p, 16).ok()) {
                    listen.insert(f[9].to_string(), port);
                }
            }
        } else if let Some(rest) = l.strip_prefix("sock ") {
            if let Some((p, ino)) = rest.split_once(' ') {
                if let Ok(p) = p.parse() {
                    socks.push((p, ino.trim_matches(|c| c == '[' || c == ']').to_string()));
                }
            }
        } else {
            let f: Vec<&str> = l.splitn(4, '\t').collect();
            if f.len() == 4 {
                if let (Ok(pid), Ok(ppid)) = (f[0].parse(), f[1].parse()) {
                    procs.push((pid, ppid, f[2].parse().ok(), f[3].trim().to_string()));
                }
            }
        }
    }
    let pids: std::collections::BTreeSet<i32> = procs.iter().map(|p| p.0).collect();
    let mut rows = Vec::new();
    for (pid, ppid, age, cmd) in &procs {
        if pids.contains(ppid) || cmd.contains("vigil-keeper") {
            continue;
        }
        let Some(kind) = profiles.ps_kind(cmd) else { continue };
        let mut ports: Vec<u16> =
            socks.iter().filter(|(p, _)| p == pid).filter_map(|(_, i)| listen.get(i).copied()).collect();
        ports.sort();
        ports.dedup();
        rows.push(ProcRow {
            host: None,
            pid: *pid,
            server: kind.to_string(),
            age_s: *age,
            ports,
            gpu_mib: None,
            cmd: crate::sinks::redact::redact_cmdline(cmd),
        });
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_ps_output_is_parsed() {
        let text = "41\t1\t120\t/opt/llama-server -m m.gguf --port 8080 --api-key sk-secret-1234 \nsock 41 [777]\nsock 41 [778]\n42\t41\t119\t/opt/llama-server child\n50\t1\t5\tvim llama-server.txt\ntcp\n  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 777 1\n";
        let rows = parse_ps(text, &Profiles::builtin());
        assert_eq!(rows.len(), 1, "the child is shown with its parent; vim is not a server");
        assert_eq!(rows[0].pid, 41);
        assert_eq!(rows[0].ports, vec![8080]);
        assert!(!rows[0].cmd.contains("sk-secret"), "{}", rows[0].cmd);
    }
}
