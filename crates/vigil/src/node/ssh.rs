//! A node over SSH: one connection (the system ssh client, a tethered master) per node; every operation
//! is a small script sent on stdin whose answer is parsed here. The node's keeper does what the local
//! one does (records, stop with grace, proof that nothing is left).

use super::{LogTail, Node, ProcRow, RunRow};
use crate::error::CliError;
use crate::follow::SourceMsg;
use crate::remote::{self, Conn, RemoteWatch, SshOpts};
use crate::report::Reporter;
use crate::run::Redactor;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc::UnboundedSender;
use vigil_core::judge::fmt_ms;
use vigil_core::Profiles;

pub struct SshNode {
    pub conn: Arc<Conn>,
}

impl SshNode {
    pub async fn open(ssh: &SshOpts, host: &str) -> Result<SshNode, CliError> {
        Ok(SshNode { conn: crate::hosts::open(ssh, host).await? })
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
        let now = crate::run::now_ms() / 1000;
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
            let state = crate::up::run_state(alive, None, report.verdict, x.code, x.signal);
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
        crate::hosts::stop(&self.conn, run, grace, rep).await
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
        Ok(LogTail { lines: rest.lines().map(String::from).collect(), offset: size.trim().parse().unwrap_or(0) })
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
        Redactor::for_run(name, Some(&self.conn.dest))
    }
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
            cmd: crate::run::redact_cmdline(cmd),
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
