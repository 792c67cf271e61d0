//! Remote nodes over ONE SSH connection per host: the system OpenSSH client (the user's
//! `~/.ssh/config`, ProxyJump, agent and keys all apply) runs a ControlMaster; every remote command,
//! the log stream and the probes' port forward are channels of that one connection.
//!
//! Agentless: the remote needs `sshd`, a POSIX `sh` and coreutils. The keeper's job is done by a small
//! `sh` wrapper (setsid, log file, exit-status file); the log is read with `tail -F`; process state
//! comes from `/proc`; GPU state from `nvidia-smi` when present.
//!
//! Every remote script is sent on the session's stdin to `sh -s` (so the login shell only ever parses
//! `exec sh -s`), and every value in a script passes through [`quote`]. Nothing is concatenated
//! unquoted.

use crate::error::CliError;
use crate::node::ServerEnd;
use crate::sources::follow::SourceMsg;
use crate::sources::lines::Splitter;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc::UnboundedSender;
use vigil_core::ExitInfo;

/// Quotes one argument for a POSIX shell: every byte (newlines, `$`, `;`, bytes that are not UTF-8)
/// stands for itself inside single quotes; a single quote becomes `'\''`.
pub fn quote(arg: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(arg.len() + 2);
    out.push(b'\'');
    for &b in arg {
        if b == b'\'' {
            out.extend_from_slice(b"'\\''");
        } else {
            out.push(b);
        }
    }
    out.push(b'\'');
    out
}

/// Several arguments, each quoted, separated by spaces.
pub fn words<'a>(args: impl IntoIterator<Item = &'a [u8]>) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, a) in args.into_iter().enumerate() {
        if i > 0 {
            out.push(b' ');
        }
        out.extend(quote(a));
    }
    out
}

/// How to reach hosts: an ssh config file (`-F`, tests use one; users rely on ~/.ssh/config), the
/// connect timeout, how long to keep trying after the connection drops, and the remote state dir.
#[derive(Clone, Debug)]
pub struct SshOpts {
    pub config: Option<PathBuf>,
    pub connect_timeout: Duration,
    pub reconnect_for: Duration,
    /// Where runs live on the remote (default `${XDG_STATE_HOME:-$HOME/.local/state}/vigil/remote`).
    pub remote_dir: Option<String>,
}

impl Default for SshOpts {
    fn default() -> SshOpts {
        SshOpts {
            config: None,
            connect_timeout: Duration::from_secs(10),
            reconnect_for: Duration::from_secs(120),
            remote_dir: None,
        }
    }
}

/// `[USER@]NODE` (or `ssh://[USER@]NODE[:PORT]`, or a `Host` alias of the ssh config).
pub fn valid_dest(d: &str) -> Result<(), CliError> {
    if d.is_empty() || d.starts_with('-') || d.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(CliError::usage(format!(
            "--host '{d}': expected [USER@]NODE, an ssh config Host, or ssh://[USER@]NODE[:PORT]"
        )));
    }
    Ok(())
}

struct Inner {
    /// The master under its tether (see `TETHER`); dropping the stdin pipe ends it.
    master: Option<(Child, std::process::ChildStdin)>,
    generation: u64,
    /// (local port, remote port) forwards to set up again after a reconnect.
    forwards: Vec<(u16, u16)>,
}

/// One control connection to one host, for the life of one vigil command.
pub struct Conn {
    pub dest: String,
    opts: SshOpts,
    dir: PathBuf,
    ctl: PathBuf,
    inner: Mutex<Inner>,
}

fn short_tmp() -> PathBuf {
    // unix socket paths hold at most 108 bytes: $TMPDIR may be long (macOS, CI), /tmp is not
    let t = std::env::temp_dir();
    if t.as_os_str().len() <= 60 {
        t
    } else {
        PathBuf::from("/tmp")
    }
}

fn mkdtemp(base: &Path) -> Result<PathBuf, CliError> {
    use std::os::unix::ffi::OsStrExt;
    let tmpl = base.join("vigil-ssh.XXXXXX");
    let mut b = tmpl.as_os_str().as_bytes().to_vec();
    b.push(0);
    // SAFETY: mkdtemp edits the NUL-terminated template we own in place.
    let p = unsafe { libc::mkdtemp(b.as_mut_ptr() as *mut libc::c_char) };
    if p.is_null() {
        return Err(CliError::Internal(format!(
            "cannot create a control directory under {}: {}",
            base.display(),
            std::io::Error::last_os_error()
        )));
    }
    b.pop();
    Ok(PathBuf::from(std::ffi::OsStr::from_bytes(&b)))
}

/// The program to run as ssh (`$VIGIL_SSH`, else `ssh` from PATH).
fn ssh_program() -> std::ffi::OsString {
    std::env::var_os("VIGIL_SSH").filter(|v| !v.is_empty()).unwrap_or_else(|| "ssh".into())
}

/// The last meaningful line ssh printed, turned into one clear sentence.
fn explain_ssh_error(dest: &str, stderr: &str, timeout: Duration) -> String {
    let last = stderr
        .lines()
        .map(str::trim)
        .rfind(|l| !l.is_empty() && !l.starts_with("Warning: Permanently added"))
        .unwrap_or("ssh exited without a message");
    let why = if stderr.contains("Host key verification failed") || stderr.contains("No ED25519 host key is known") {
        "its host key is not in known_hosts (or changed): check it, then add it with ssh-keyscan or one interactive `ssh`; vigil never prompts and never turns host-key checking off".to_string()
    } else if stderr.contains("banner exchange") || stderr.contains("timed out") {
        format!("no SSH answer within the connect timeout ({}s): {last}", timeout.as_secs())
    } else if stderr.contains("Permission denied") {
        format!("authentication failed ({last}); vigil runs ssh with BatchMode=yes: use a key or the agent")
    } else {
        last.to_string()
    };
    format!("cannot reach {dest} over SSH: {why}")
}

impl Conn {
    /// Connects (one ControlMaster) or says clearly why not, within the connect timeout.
    pub fn open(dest: &str, opts: &SshOpts) -> Result<Arc<Conn>, CliError> {
        valid_dest(dest)?;
        let dir = mkdtemp(&short_tmp())?;
        let ctl = dir.join("c");
        let c = Conn {
            dest: dest.to_string(),
            opts: opts.clone(),
            dir,
            ctl,
            inner: Mutex::new(Inner { master: None, generation: 0, forwards: vec![] }),
        };
        {
            let mut g = c.inner.lock().unwrap();
            c.start_master(&mut g)?;
        }
        Ok(Arc::new(c))
    }

    fn base(&self) -> Command {
        let mut c = Command::new(ssh_program());
        if let Some(f) = &self.opts.config {
            c.arg("-F").arg(f);
        }
        c.arg("-o").arg("BatchMode=yes");
        c.arg("-o").arg(format!("ConnectTimeout={}", self.opts.connect_timeout.as_secs().max(1)));
        c.arg("-o").arg("ServerAliveInterval=5").arg("-o").arg("ServerAliveCountMax=3");
        c.arg("-o").arg(format!("ControlPath={}", self.ctl.display()));
        c
    }

    fn start_master(&self, g: &mut Inner) -> Result<(), CliError> {
        let _ = std::fs::remove_file(&self.ctl);
        let err_path = self.dir.join("master.err");
        let err =
            std::fs::File::create(&err_path).map_err(|e| CliError::Internal(format!("{}: {e}", err_path.display())))?;
        let mut ssh = self.base();
        ssh.args(["-M", "-N", "-T", "-o", "ControlMaster=yes", "-o", "ControlPersist=no"]);
        ssh.arg("--").arg(&self.dest);
        let mut cmd = Command::new("sh");
        cmd.arg("-c").arg(TETHER).arg("vigil-ssh-master").arg(ssh.get_program()).args(ssh.get_args());
        cmd.stdin(Stdio::piped()).stdout(Stdio::null()).stderr(err);
        let mut child = cmd.spawn().map_err(|e| CliError::usage(format!("cannot run ssh: {e}")))?;
        let tether = child.stdin.take().unwrap();
        // The socket appears once the session is authenticated. Our own deadline backs ssh's.
        let deadline = Instant::now() + self.opts.connect_timeout + Duration::from_secs(5);
        loop {
            if self.ctl.exists() {
                g.master = Some((child, tether));
                return Ok(());
            }
            if let Ok(Some(_)) = child.try_wait() {
                let text = std::fs::read_to_string(&err_path).unwrap_or_default();
                return Err(CliError::Unreachable(explain_ssh_error(&self.dest, &text, self.opts.connect_timeout)));
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(CliError::Unreachable(format!(
                    "cannot reach {} over SSH: no session within {}s",
                    self.dest,
                    (self.opts.connect_timeout + Duration::from_secs(5)).as_secs()
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The connection's generation: bumped by each reconnect.
    pub fn generation(&self) -> u64 {
        self.inner.lock().unwrap().generation
    }

    fn master_alive(g: &mut Inner) -> bool {
        g.master.as_mut().is_some_and(|m| matches!(m.0.try_wait(), Ok(None)))
    }

    /// A session command on the control connection: `exec sh -s` reading `script` from stdin.
    /// Refuses when the master is gone (ssh would otherwise open a second connection on its own).
    pub fn session(&self) -> Result<tokio::process::Command, String> {
        {
            let mut g = self.inner.lock().unwrap();
            if !Self::master_alive(&mut g) {
                return Err(format!("the SSH connection to {} is down", self.dest));
            }
        }
        let mut c = self.base();
        // When the master dies between our check and the client's connect, ssh would quietly open a
        // second connection of its own; with ProxyCommand=false that fallback fails at once instead
        // (the mux path never uses ProxyCommand) and the drop is seen and handled as one.
        c.args(["-T", "-o", "ControlMaster=no", "-o", "ProxyCommand=false", "--"]).arg(&self.dest).arg("exec sh -s");
        c.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut c = tokio::process::Command::from(c);
        c.kill_on_drop(true);
        Ok(c)
    }

    /// Starts `script` remotely; its stdout is the child's stdout.
    pub async fn spawn(&self, script: &[u8]) -> Result<tokio::process::Child, String> {
        let mut child = self.session()?.spawn().map_err(|e| format!("ssh: {e}"))?;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(script).await.map_err(|e| format!("ssh stdin: {e}"))?;
        drop(stdin);
        Ok(child)
    }

    /// Runs `script` to its end (at most `timeout`): (exit status, stdout, stderr).
    pub async fn exec(&self, script: &[u8], timeout: Duration) -> Result<(i32, Vec<u8>, String), CliError> {
        let child = self.spawn(script).await.map_err(CliError::Unreachable)?;
        let out = tokio::time::timeout(timeout, child.wait_with_output())
            .await
            .map_err(|_| {
                CliError::Unreachable(format!(
                    "{}: a remote command gave no answer within {}s",
                    self.dest,
                    timeout.as_secs()
                ))
            })?
            .map_err(|e| CliError::Internal(format!("ssh: {e}")))?;
        let code = out.status.code().unwrap_or(255);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        if code == 255 {
            return Err(CliError::Unreachable(explain_ssh_error(&self.dest, &err, self.opts.connect_timeout)));
        }
        Ok((code, out.stdout, err))
    }

    /// Forwards a local loopback port to `127.0.0.1:remote_port` on the host, through the
    /// connection; returns the local port.
    pub fn forward(&self, remote_port: u16) -> Result<u16, CliError> {
        let lp = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| CliError::Internal(format!("no free local port: {e}")))?
            .port();
        let seen = self.generation();
        if self.add_forward(lp, remote_port).is_err() {
            // the connection dropped under us: connect again (backoff) and retry once
            self.recover_blocking(seen).map_err(CliError::Unreachable)?;
            self.add_forward(lp, remote_port)?;
        }
        self.inner.lock().unwrap().forwards.push((lp, remote_port));
        Ok(lp)
    }

    fn add_forward(&self, lp: u16, rp: u16) -> Result<(), CliError> {
        let out = self
            .base()
            .args(["-O", "forward", "-L"])
            .arg(format!("127.0.0.1:{lp}:127.0.0.1:{rp}"))
            .arg("--")
            .arg(&self.dest)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| CliError::Internal(format!("ssh: {e}")))?;
        if !out.status.success() {
            return Err(CliError::Unreachable(format!(
                "{}: cannot forward port {rp}: {}",
                self.dest,
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(())
    }

    /// After a session ended unexpectedly: when the connection seen at `seen` is down, connects
    /// again with backoff (0.25 s doubling to 5 s, for `reconnect_for` at most) and restores the
    /// forwards. Ok(true) when this call reconnected; Ok(false) when nothing was needed or another
    /// caller already did it.
    pub fn recover_blocking(&self, seen: u64) -> Result<bool, String> {
        let mut g = self.inner.lock().unwrap();
        if g.generation != seen || Self::master_alive(&mut g) {
            return Ok(false);
        }
        if let Some(m) = g.master.take() {
            end_master(m);
        }
        let deadline = Instant::now() + self.opts.reconnect_for;
        let mut delay = Duration::from_millis(250);
        loop {
            match self.start_master(&mut g) {
                Ok(()) => {
                    let fw = g.forwards.clone();
                    for (lp, rp) in fw {
                        self.add_forward(lp, rp).map_err(CliError::message)?;
                    }
                    g.generation += 1;
                    return Ok(true);
                }
                Err(e) if Instant::now() + delay > deadline => {
                    return Err(format!(
                        "lost the SSH connection and could not reconnect for {}s: {}",
                        self.opts.reconnect_for.as_secs(),
                        e.message()
                    ))
                }
                Err(_) => {
                    std::thread::sleep(delay);
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
            }
        }
    }

    pub async fn recover(self: &Arc<Self>, seen: u64) -> Result<bool, String> {
        let c = self.clone();
        tokio::task::spawn_blocking(move || c.recover_blocking(seen)).await.unwrap_or_else(|e| Err(e.to_string()))
    }

    /// The shell prelude naming a run's remote directory `$D` (and the runs root `$R`).
    pub fn prelude(&self, name: &str) -> Vec<u8> {
        let mut s = b"R=".to_vec();
        match &self.opts.remote_dir {
            Some(d) => s.extend(quote(d.as_bytes())),
            None => s.extend_from_slice(b"\"${XDG_STATE_HOME:-$HOME/.local/state}/vigil/remote\""),
        }
        s.extend_from_slice(b"\nD=\"$R\"/");
        s.extend(quote(name.as_bytes()));
        s.push(b'\n');
        s
    }
}

/// Runs the master (`"$@"`) so that it ends with vigil, even a vigil killed with SIGKILL: a watcher
/// holds the read end of a pipe whose write end only vigil holds; EOF (vigil closed it or died)
/// makes the watcher SIGTERM ssh. The wrapper exits with ssh's status when ssh ends on its own.
const TETHER: &str = "exec 3<&0
\"$@\" </dev/null &
p=$!
{ read _ <&3; kill $p 2>/dev/null; } &
w=$!
exec 3<&-
wait $p; s=$?
kill $w 2>/dev/null
exit $s";

/// Ends a master: closing the tether makes the wrapper SIGTERM ssh (it closes the connection and
/// removes its socket); the wrapper gets 2 s, then SIGKILL. A master that already died is reaped.
fn end_master((mut m, tether): (Child, std::process::ChildStdin)) {
    drop(tether);
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(2) {
        if let Ok(Some(_)) = m.try_wait() {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let _ = m.kill();
    let _ = m.wait();
}

impl Drop for Conn {
    fn drop(&mut self) {
        if let Some(m) = self.inner.lock().ok().and_then(|mut g| g.master.take()) {
            end_master(m);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

// ---------------------------------------------------------------------------------------------
// Scripts

/// The keeper, run by `sh -c` under setsid on the remote: `$1` is the run dir, the rest the command.
/// It records `SERVER_PID KEEPER_PID` in `pid` and the exit status in `exit` (both renamed into place).
const KEEPER: &[u8] = b"D=$1; shift
\"$@\" </dev/null >>\"$D/server.log\" 2>&1 &
c=$!
echo \"$c $$\" > \"$D/pid.tmp\" && mv \"$D/pid.tmp\" \"$D/pid\"
wait \"$c\"; s=$?
echo \"$s\" > \"$D/exit.tmp\" && mv \"$D/exit.tmp\" \"$D/exit\"
";

/// Launch `argv` (bytes, unchanged) with `env` under a keeper; prints `pid SERVER KEEPER`.
/// Exit 91: an earlier run of that name is alive; 92: the keeper never started; 93: port taken.
pub fn launch_script(
    conn: &Conn,
    name: &str,
    argv: &[Vec<u8>],
    env: &[(String, String)],
    shown: &str,
    port: Option<u16>,
    kind: Option<&str>,
) -> Vec<u8> {
    let mut s = conn.prelude(name);
    s.extend_from_slice(
        b"mkdir -p \"$D\" || exit 90
if [ -f \"$D/pid\" ] && [ ! -f \"$D/exit\" ]; then read sp kp < \"$D/pid\"; if kill -0 \"$sp\" 2>/dev/null; then echo \"alive $sp\"; exit 91; fi; fi
",
    );
    if let Some(p) = port {
        // a listening socket on the port (any address), from /proc/net/tcp{,6}: state 0A is LISTEN
        s.extend_from_slice(
            format!(
                "if grep -qE ':{:04X} [0-9A-F:]+ 0A ' /proc/net/tcp /proc/net/tcp6 2>/dev/null; then echo \"port {p}\"; exit 93; fi\n",
                p
            )
            .as_bytes(),
        );
    }
    s.extend_from_slice(
        b"rm -f \"$D/pid\" \"$D/exit\" \"$D/stop\" \"$D/pid.tmp\" \"$D/exit.tmp\" \"$D\"/server.log*
: > \"$D/server.log\" || exit 90
date +%s > \"$D/started\"
",
    );
    s.extend_from_slice(b"printf '%s\\n' ");
    s.extend(quote(shown.as_bytes()));
    s.extend_from_slice(b" > \"$D/cmd\"\nprintf '%s\\n' ");
    let meta = format!("port={}\nserver={}", port.map(|p| p.to_string()).unwrap_or_default(), kind.unwrap_or(""));
    s.extend(quote(meta.as_bytes()));
    s.extend_from_slice(b" > \"$D/meta\"\nK=");
    s.extend(quote(KEEPER));
    s.extend_from_slice(b"\nif command -v setsid >/dev/null 2>&1; then S=setsid; else S=; fi\n$S sh -c \"$K\" vigil-keeper \"$D\" env --");
    for (k, v) in env {
        s.push(b' ');
        s.extend(quote(format!("{k}={v}").as_bytes()));
    }
    for a in argv {
        s.push(b' ');
        s.extend(quote(a));
    }
    s.extend_from_slice(
        b" </dev/null >/dev/null 2>&1 &
i=0
while [ ! -s \"$D/pid\" ]; do i=$((i+1)); if [ $i -gt 400 ]; then echo nokeeper; exit 92; fi; sleep 0.025; done
read sp kp < \"$D/pid\"
echo \"pid $sp $kp\"
",
    );
    s
}

/// `tail -F` of the run's log from byte `offset` (0-based).
pub fn tail_script(conn: &Conn, name: &str, offset: u64) -> Vec<u8> {
    let mut s = conn.prelude(name);
    s.extend_from_slice(format!("exec tail -s 0.2 -c +{} -F \"$D/server.log\" 2>/dev/null\n", offset + 1).as_bytes());
    s
}

/// Waits for the run to end; prints `exit STATUS LOGSIZE STOP` (STATUS `?` when the keeper died
/// unrecorded; STOP `stop` when a stop was asked for, the marker [`stop_script`] leaves before it signals,
/// else `-`).
pub fn exit_wait_script(conn: &Conn, name: &str) -> Vec<u8> {
    let mut s = conn.prelude(name);
    s.extend_from_slice(
        b"[ -f \"$D/pid\" ] || { echo nopid; exit 0; }
read sp kp < \"$D/pid\"
asked() { if [ -f \"$D/stop\" ]; then echo stop; else echo -; fi; }
while [ ! -f \"$D/exit\" ]; do
  if ! kill -0 \"$kp\" 2>/dev/null; then sleep 0.3; [ -f \"$D/exit\" ] || { echo \"exit ? $(wc -c < \"$D/server.log\") $(asked)\"; exit 0; }; fi
  sleep 0.1
done
echo \"exit $(cat \"$D/exit\") $(wc -c < \"$D/server.log\") $(asked)\"
",
    );
    s
}

/// The shell function `members`: pids whose session or process group is the keeper's.
const MEMBERS: &[u8] = b"members() {
  for f in /proc/[0-9]*/stat; do
    read -r l < \"$f\" 2>/dev/null || continue
    r=${l##*) }
    set -- $r
    if [ \"$4\" = \"$kp\" ] || [ \"$3\" = \"$kp\" ]; then p=${f#/proc/}; echo \"${p%/stat}\"; fi
  done
}
gpus() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>/dev/null | tr -d ' '; }
";

/// Stops a run: SIGTERM to the server, the grace period, SIGKILL to what is left of its session,
/// then proves nothing is left and (with nvidia-smi) that its GPU memory is released.
/// Each line starts with the ms since the script began: `none`, `signal SIG PIDS…`, `gone MS`,
/// `left PID CMD`, `gpu-held PID MIB`, `gpu-free MIB`.
pub fn stop_script(conn: &Conn, name: &str, grace: Duration) -> Vec<u8> {
    let mut s = conn.prelude(name);
    s.extend_from_slice(MEMBERS);
    let ticks = (grace.as_millis() / 50).max(1);
    s.extend_from_slice(
        format!(
            "t0=$(date +%s%N)
say() {{ echo \"$(( ($(date +%s%N) - t0) / 1000000 )) $*\"; }}
[ -f \"$D/pid\" ] || {{ say none; exit 0; }}
read sp kp < \"$D/pid\"
m=$(members | tr '\\n' ' ')
[ -n \"$m\" ] || {{ say none; exit 0; }}
held=0
for x in $(gpus); do p=${{x%%,*}}; v=${{x#*,}}; case $v in ''|*[!0-9]*) continue;; esac; for q in $m; do [ \"$p\" = \"$q\" ] && held=$((held + v)); done; done
t1=$(date +%s%N)
date +%s > \"$D/stop\"
kill -TERM \"$sp\" 2>/dev/null && say signal SIGTERM \"$sp\"
i=0
while [ $i -lt {ticks} ]; do [ -z \"$(members)\" ] && break; sleep 0.05; i=$((i+1)); done
rest=$(members | grep -vx \"$kp\" | tr '\\n' ' ')
if [ -n \"$rest\" ]; then kill -KILL $rest 2>/dev/null; say signal SIGKILL $rest; fi
i=0
while [ $i -lt 40 ] && [ -n \"$(members)\" ]; do sleep 0.05; i=$((i+1)); done
if [ -n \"$(members)\" ] && [ -z \"$(members | grep -vx \"$kp\")\" ]; then kill -KILL \"$kp\" 2>/dev/null; sleep 0.1; [ -f \"$D/exit\" ] || echo 137 > \"$D/exit\"; fi
left=$(members)
for p in $left; do say left \"$p $(tr '\\0' ' ' < /proc/$p/cmdline 2>/dev/null)\"; done
[ -n \"$left\" ] || say gone \"$(( ($(date +%s%N) - t1) / 1000000 ))\"
if [ $held -gt 0 ]; then
  i=0
  while :; do
    h=''
    for x in $(gpus); do p=${{x%%,*}}; for q in $m; do [ \"$p\" = \"$q\" ] && h=\"$h $x\"; done; done
    [ -z \"$h\" ] && {{ say gpu-free \"$held\"; break; }}
    i=$((i+1)); [ $i -gt 300 ] && {{ for x in $h; do say gpu-held \"${{x%%,*}} ${{x#*,}}\"; done; break; }}
    sleep 0.1
  done
fi
"
        )
        .as_bytes(),
    );
    s
}

/// One line per remote run: NAME, server pid, keeper pid, alive 0/1, exit status or -, started
/// (unix s), log age (s), command shown.
pub fn status_script(conn: &Conn) -> Vec<u8> {
    let mut s = conn.prelude("-");
    s.extend_from_slice(
        b"[ -d \"$R\" ] || exit 0
now=$(date +%s)
for D in \"$R\"/*/; do
  D=${D%/}; [ -f \"$D/pid\" ] || continue
  read sp kp < \"$D/pid\"
  a=0; kill -0 \"$sp\" 2>/dev/null && a=1
  x=-; [ -f \"$D/exit\" ] && x=$(cat \"$D/exit\")
  st=$(cat \"$D/started\" 2>/dev/null || echo 0)
  age=$(( now - $(stat -c %Y \"$D/server.log\" 2>/dev/null || echo $now) ))
  printf '%s\\t%s\\t%s\\t%s\\t%s\\t%s\\t%s\\t%s\\n' \"${D##*/}\" \"$sp\" \"$kp\" \"$a\" \"$x\" \"$st\" \"$age\" \"$(head -c 400 \"$D/cmd\" 2>/dev/null | tr '\\t\\n' '  ')\"
done
",
    );
    s
}

/// The last 16 MiB of a run's log (exit 3: no such run).
pub fn log_script(conn: &Conn, name: &str) -> Vec<u8> {
    let mut s = conn.prelude(name);
    s.extend_from_slice(b"[ -f \"$D/server.log\" ] || exit 3\nexec tail -c 16777216 \"$D/server.log\"\n");
    s
}

/// Processes whose command line names an inference server: `PID\tPPID\tAGE_S\tCMD` (NULs as
/// spaces), plus `port PID PORT` for their listening TCP ports.
pub fn ps_script() -> Vec<u8> {
    b"now=$(cut -d. -f1 /proc/uptime)
hz=$(getconf CLK_TCK 2>/dev/null || echo 100)
for f in $(grep -l -a -E 'sglang|vllm|VLLM|llama-server|text-generation' /proc/[0-9]*/cmdline 2>/dev/null); do
  p=${f#/proc/}; p=${p%/cmdline}
  [ \"$p\" = \"$$\" ] && continue
  read -r l < /proc/$p/stat 2>/dev/null || continue
  r=${l##*) }
  set -- $r
  st=${20}
  printf '%s\\t%s\\t%s\\t%s\\n' \"$p\" \"$2\" \"$(( now - st / hz ))\" \"$(tr '\\0\\t\\n' '   ' < $f)\"
  for fd in /proc/$p/fd/*; do l=$(readlink \"$fd\" 2>/dev/null) || continue; case $l in socket:*) echo \"sock $p ${l#socket:}\";; esac; done
done
echo tcp; cat /proc/net/tcp /proc/net/tcp6 2>/dev/null
"
    .to_vec()
}

// ---------------------------------------------------------------------------------------------
// Sources for `wait`: the log stream and the exit status, both surviving reconnects.

/// What a remote watch knows: the connection, the run, and how many log bytes were read.
#[derive(Clone)]
pub struct RemoteWatch {
    pub conn: Arc<Conn>,
    pub name: String,
    pub bytes: Arc<AtomicU64>,
}

impl RemoteWatch {
    pub fn new(conn: Arc<Conn>, name: &str) -> RemoteWatch {
        RemoteWatch { conn, name: name.to_string(), bytes: Arc::new(AtomicU64::new(0)) }
    }
}

/// Follows the remote log; after a drop, reconnects and resumes at the byte where it stopped (the
/// partial line in the splitter is kept): no line lost, none repeated.
pub async fn follow_log(w: RemoteWatch, tx: UnboundedSender<SourceMsg>) {
    let mut split = Splitter::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut last_gen = w.conn.generation();
    let mut down_since: Option<Instant> = None;
    loop {
        // Whoever reconnected (this task or the exit waiter), the drop is reported once, here.
        let generation = w.conn.generation();
        if let Some(t) = down_since.take() {
            let _ = tx.send(if generation != last_gen {
                SourceMsg::Reconnected {
                    host: w.conn.dest.clone(),
                    down_ms: t.elapsed().as_millis() as u64,
                    offset: w.bytes.load(Ordering::SeqCst),
                }
            } else {
                SourceMsg::Resumed
            });
        }
        last_gen = generation;
        let off = w.bytes.load(Ordering::SeqCst);
        if let Ok(mut child) = w.conn.spawn(&tail_script(&w.conn, &w.name, off)).await {
            let mut out = child.stdout.take().unwrap();
            use crate::sources::follow::{read_live, Got};
            loop {
                match read_live(&mut out, &mut buf, &mut split).await {
                    Got::Data(n) => {
                        split.push(&buf[..n], &mut |l| {
                            let _ = tx.send(SourceMsg::Line(l));
                        });
                        w.bytes.fetch_add(n as u64, Ordering::SeqCst);
                    }
                    Got::Redraw(l) => {
                        let _ = tx.send(SourceMsg::Line(l));
                    }
                    Got::End => break,
                }
            }
            let _ = child.kill().await;
        }
        if tx.is_closed() {
            return;
        }
        // tail -F never ends by itself: the connection dropped (or the remote tail was killed)
        down_since = Some(Instant::now());
        let _ = tx.send(SourceMsg::Disconnected);
        if let Err(e) = w.conn.recover(generation).await {
            let _ = tx.send(SourceMsg::Lost(format!("{}: {e}", w.conn.dest)));
            return;
        }
        if w.conn.generation() == generation {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// Waits for the remote server's exit status and whether its stop was asked for (and the log size at that
/// moment).
pub async fn wait_exit(w: RemoteWatch, tx: UnboundedSender<(ServerEnd, Option<u64>)>) {
    loop {
        let generation = w.conn.generation();
        if let Ok(child) = w.conn.spawn(&exit_wait_script(&w.conn, &w.name)).await {
            if let Ok(out) = child.wait_with_output().await {
                let text = String::from_utf8_lossy(&out.stdout);
                let mut it = text.split_whitespace();
                if it.next() == Some("exit") {
                    let status = it.next().and_then(|s| s.parse::<i32>().ok());
                    let size = it.next().and_then(|s| s.parse::<u64>().ok());
                    let requested = it.next() == Some("stop");
                    let _ = tx.send((ServerEnd { exit: exit_info(status), requested }, size));
                    return;
                }
                if text.trim() == "nopid" {
                    let exit = ExitInfo { code: None, signal: None, ours: false };
                    let _ = tx.send((ServerEnd { exit, requested: false }, None));
                    return;
                }
            }
        }
        if tx.is_closed() {
            return;
        }
        // the log follower reports the drop and the reconnect; here we only wait for it
        if w.conn.recover(generation).await.is_err() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// GPU readings of the run's process group on the node, every `every`, from `nvidia-smi` (when the
/// node has it): `@members PIDS`, `@gpus` + the per-GPU CSV, `@apps` + the per-process CSV, `@seen PIDS`
/// (the app pids this node's /proc shows: others belong to another pid namespace), `@end`.
pub fn gpu_script(conn: &Conn, name: &str, every: Duration) -> Vec<u8> {
    let mut s = conn.prelude(name);
    s.extend_from_slice(MEMBERS);
    s.extend_from_slice(
        format!(
            "command -v nvidia-smi >/dev/null 2>&1 || {{ echo @nosmi; exit 0; }}
[ -f \"$D/pid\" ] || exit 0
read sp kp < \"$D/pid\"
while :; do
  echo \"@members $(members | tr '\\n' ' ')\"
  echo @gpus
  nvidia-smi --query-gpu=index,uuid,memory.used,memory.total,utilization.gpu --format=csv,noheader,nounits 2>/dev/null
  a=$(nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader,nounits 2>/dev/null)
  echo @apps
  [ -n \"$a\" ] && printf '%s\\n' \"$a\"
  seen=''
  for p in $(printf '%s\\n' \"$a\" | cut -d, -f1); do [ -d /proc/$p ] && seen=\"$seen $p\"; done
  echo \"@seen$seen\"
  echo @end
  sleep {:.3}
done
",
            every.as_secs_f64().max(0.1)
        )
        .as_bytes(),
    );
    s
}

/// Parses one `@members … @end` block of [`gpu_script`] into what the run's processes hold.
pub fn parse_gpu_block(block: &str) -> Option<crate::sources::gpu::Held> {
    let (mut members, mut seen) = (std::collections::BTreeSet::new(), std::collections::BTreeSet::new());
    let (mut gpus, mut apps) = (String::new(), String::new());
    let mut section = "";
    for l in block.lines() {
        if let Some(m) = l.strip_prefix("@members") {
            members = m.split_whitespace().filter_map(|p| p.parse::<i32>().ok()).collect();
        } else if let Some(m) = l.strip_prefix("@seen") {
            seen = m.split_whitespace().filter_map(|p| p.parse::<i32>().ok()).collect();
        } else if l == "@gpus" || l == "@apps" {
            section = l;
        } else if section == "@gpus" {
            gpus.push_str(l);
            gpus.push('\n');
        } else if section == "@apps" {
            apps.push_str(l);
            apps.push('\n');
        }
    }
    let snap = crate::sources::gpu::parse_smi(&gpus, &apps).ok()?;
    Some(crate::sources::gpu::held_by(&snap, &members, &|p| seen.contains(&p)))
}

/// Streams GPU readings of a remote run as `Held` samples; quiet when the node has no nvidia-smi.
/// Survives reconnects (the log follower reports them).
pub async fn gpu_stream(w: RemoteWatch, every: Duration, tx: UnboundedSender<crate::sources::gpu::Held>) {
    use tokio::io::AsyncBufReadExt;
    loop {
        let generation = w.conn.generation();
        if let Ok(mut child) = w.conn.spawn(&gpu_script(&w.conn, &w.name, every)).await {
            let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
            let mut block = String::new();
            while let Ok(Some(l)) = lines.next_line().await {
                if l == "@nosmi" {
                    return;
                }
                if l == "@end" {
                    if let Some(h) = parse_gpu_block(&block) {
                        if tx.send(h).is_err() {
                            return;
                        }
                    }
                    block.clear();
                } else {
                    block.push_str(&l);
                    block.push('\n');
                }
            }
            let _ = child.kill().await;
        }
        if tx.is_closed() || w.conn.recover(generation).await.is_err() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A shell exit status: above 128 is death by signal (status − 128).
pub fn exit_info(status: Option<i32>) -> ExitInfo {
    match status {
        Some(s) if s > 128 => ExitInfo { code: None, signal: Some(s - 128), ours: true },
        Some(s) => ExitInfo { code: Some(s), signal: None, ours: true },
        None => ExitInfo { code: None, signal: None, ours: false },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::ffi::OsStrExt;

    /// Each hard argument goes through `sh` and comes back byte for byte.
    #[test]
    fn quote_round_trips_through_sh() {
        let hard: Vec<&[u8]> = vec![
            b"plain",
            b"two words",
            b"it's",
            b"\"double\"",
            b"$(touch /tmp/vigil-pwned) `id` $HOME ${X:-y}",
            b"a; rm -rf /; b",
            b"line1\nline2",
            b"\xff\xfe not utf-8 \x80",
            b"back\\slash \\' mixed '\"'",
            b"",
            b"*?[a] ~ # & | < > !",
        ];
        let mut script = b"for a in ".to_vec();
        script.extend(words(hard.iter().copied()));
        script.extend_from_slice(b"; do printf '%s\\0' \"$a\"; done");
        let out = Command::new("sh").arg("-c").arg(std::ffi::OsStr::from_bytes(&script)).output().unwrap();
        assert!(out.status.success());
        let got: Vec<&[u8]> = out.stdout.split(|b| *b == 0).collect();
        assert_eq!(&got[..hard.len()], &hard[..]);
        assert!(!Path::new("/tmp/vigil-pwned").exists());
    }

    #[test]
    fn quote_shapes() {
        assert_eq!(quote(b"a b"), b"'a b'".to_vec());
        assert_eq!(quote(b"it's"), b"'it'\\''s'".to_vec());
        assert_eq!(quote(b""), b"''".to_vec());
    }

    #[test]
    fn bad_destinations_are_usage_errors() {
        for d in ["", "-oProxyCommand=x", "a b", "a\nb"] {
            assert!(matches!(valid_dest(d), Err(CliError::Usage(_))), "{d:?}");
        }
        for d in ["node1", "me@node1", "ssh://me@node1:2222"] {
            assert!(valid_dest(d).is_ok());
        }
    }

    /// A block as the node prints it, with the readings captured on the H200 (tests/gpu-captures):
    /// the zombie (pid 474) holds 22022 MiB on GPU 0.
    #[test]
    fn gpu_blocks_from_the_h200_capture() {
        let caps = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/gpu-captures/smi-captures.txt"))
            .unwrap();
        let sec = caps.split("## zombie-held").nth(1).unwrap().split("\n## ").next().unwrap();
        let data: Vec<&str> = sec.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()).collect();
        let (gpu_line, app_line) = (data[1], data[2]);
        let block = format!("@members 470 474\n@gpus\n{gpu_line}\n@apps\n{app_line}\n@seen 474\n");
        let h = parse_gpu_block(&block).unwrap();
        assert_eq!(h.total_mib, 22022);
        assert_eq!(h.per_gpu.get(&0), Some(&22022));
        assert!(!h.host_pids);
        // another run's process on the same GPU is not ours
        let other = format!("@members 9\n@gpus\n{gpu_line}\n@apps\n{app_line}\n@seen 474\n");
        assert_eq!(parse_gpu_block(&other).unwrap().total_mib, 0);
        // pids the node's /proc does not show: another pid namespace, per-GPU totals instead
        let ns = format!("@members 470\n@gpus\n{gpu_line}\n@apps\n{app_line}\n@seen\n");
        let h = parse_gpu_block(&ns).unwrap();
        assert!(h.host_pids && h.total_mib == 22031, "{h:?}");
    }

    #[test]
    fn shell_statuses() {
        assert_eq!(exit_info(Some(0)).code, Some(0));
        assert_eq!(exit_info(Some(137)).signal, Some(9));
        assert!(!exit_info(None).ours);
    }

    #[test]
    fn ssh_errors_read_as_sentences() {
        let e = explain_ssh_error("n1", "Host key verification failed.\r\n", Duration::from_secs(5));
        assert!(e.contains("host key") && e.contains("never prompts"), "{e}");
        let e = explain_ssh_error("n1", "Connection timed out during banner exchange\n", Duration::from_secs(3));
        assert!(e.contains("within the connect timeout (3s)"), "{e}");
        let e = explain_ssh_error(
            "n1",
            "ssh: connect to host 127.0.0.1 port 1: Connection refused\n",
            Duration::from_secs(3),
        );
        assert!(e.ends_with("Connection refused"), "{e}");
    }
}
