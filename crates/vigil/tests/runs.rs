//! Never losing track of a server (issue #36): one run per name under concurrent `up`s, a run found from
//! its keeper (never from a pid a file names), corrupted state files, the keeper's death, `down` on a full
//! disk or a read-only state folder, a state folder no one else controls, file modes, and `kill -9` of any
//! vigil process at a random moment of a start. Real processes throughout, the real llama-server where a
//! server is needed; run as root and again as the unprivileged CI user (scripts/test.sh).

mod common;
use common::*;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(60);

/// A plain long-running process that says it is ready the way llama-server does (where the kind of
/// server does not matter: locks, identities, stops).
fn plain(tag: &str) -> Vec<String> {
    vec![
        "sh".into(),
        "-c".into(),
        format!("echo '0.00.095.288 I srv  llama_server: model loaded'; exec sleep 300 # {tag}"),
    ]
}

const PLAIN: &[&str] = &["--no-check", "--no-probe", "--server", "llama-cpp"];

/// `vigil up --name NAME ARGS -- CMD`, the server marked by the test itself (`VIGIL_TEST_MARK`, the run's
/// folder) so that the test finds the run's processes whatever vigil records or marks.
fn up(state: &Path, name: &str, args: &[&str], cmd: &[String]) -> Command {
    let mut c = vigil();
    let mark = format!("{MARK}={}", state.join("runs").join(name).display());
    c.env("VIGIL_STATE_DIR", state).args(["up", "--name", name, "--env", &mark]).args(args).arg("--").args(cmd);
    c
}

const MARK: &str = "VIGIL_TEST_MARK";

fn vigil_in(state: &Path, args: &[&str]) -> Command {
    let mut c = vigil();
    c.env("VIGIL_STATE_DIR", state).args(args);
    c
}

fn tiny(e: &Env, port: u16) -> Vec<String> {
    vec![
        e.server.display().to_string(),
        "-m".into(),
        e.models.join("tiny.gguf").display().to_string(),
        "--host".into(),
        "127.0.0.1".into(),
        "--port".into(),
        port.to_string(),
        "-c".into(),
        "256".into(),
        "-t".into(),
        "1".into(),
    ]
}

fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !matches!(s.rsplit_once(')').and_then(|(_, r)| r.split_whitespace().next()), Some("Z") | Some("X")))
        .unwrap_or(false)
}

fn all_pids() -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|p| alive(*p))
        .collect()
}

/// The processes of a run as the kernel shows them: those carrying the test's mark in their environment.
fn marked(run_dir: &Path) -> Vec<i32> {
    let want = format!("{MARK}={}", run_dir.display());
    all_pids()
        .into_iter()
        .filter(|p| {
            std::fs::read(format!("/proc/{p}/environ"))
                .is_ok_and(|b| b.split(|c| *c == 0).any(|kv| kv == want.as_bytes()))
        })
        .collect()
}

/// The keepers of a run (`vigil __keeper RUN_DIR`, ours).
fn keepers(run_dir: &Path) -> Vec<i32> {
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    all_pids()
        .into_iter()
        .filter(|p| std::fs::metadata(format!("/proc/{p}")).is_ok_and(|m| m.uid() == me))
        .filter(|p| {
            std::fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|b| {
                let a: Vec<&[u8]> = b.split(|c| *c == 0).collect();
                a.len() >= 3 && a[1] == b"__keeper" && a[2] == run_dir.as_os_str().as_encoded_bytes()
            })
        })
        .collect()
}

/// Kills whatever of the runs is left when a test ends, pass or fail (the test's own processes only: those
/// carrying its mark, and the runs' keepers).
struct Cleanup(Vec<PathBuf>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for d in &self.0 {
            for p in marked(d).into_iter().chain(keepers(d)) {
                signal(p, libc::SIGKILL);
            }
        }
    }
}

/// Nothing of the run is left (bounded wait: a SIGKILLed process is reaped a moment later).
fn nothing_left(run_dir: &Path) -> bool {
    poll_until(Duration::from_secs(15), Duration::from_millis(10), || {
        marked(run_dir).is_empty() && keepers(run_dir).is_empty()
    })
}

fn status(state: &Path) -> (Option<i32>, Vec<serde_json::Value>, String) {
    let o = run_bounded(vigil_in(state, &["status", "--json"]), T);
    let rows: Vec<serde_json::Value> =
        serde_json::from_slice(String::from_utf8_lossy(&o.stdout).trim().as_bytes()).unwrap_or_default();
    (o.status.code(), rows, String::from_utf8_lossy(&o.stderr).into_owned())
}

fn row<'a>(rows: &'a [serde_json::Value], name: &str) -> &'a serde_json::Value {
    rows.iter().find(|r| r["name"] == name).unwrap_or_else(|| panic!("no row for {name}: {rows:?}"))
}

fn down(state: &Path, name: &str) -> Output2 {
    let o = run_bounded(vigil_in(state, &["down", name, "--grace", "2s"]), T);
    Output2 {
        code: o.status.code(),
        out: format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)),
    }
}

struct Output2 {
    code: Option<i32>,
    out: String,
}

fn state_json(run_dir: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(run_dir.join("state.json")).unwrap()).unwrap()
}

fn start_ticks(pid: i32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    s.rsplit_once(')').unwrap().1.split_whitespace().nth(19).unwrap().parse().unwrap()
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// A child process killed when the test ends.
fn sleeper() -> Guard {
    Guard(Command::new("sleep").arg("300").stdin(Stdio::null()).spawn().unwrap())
}

/// 24 `vigil up --name same` at once (a retry loop, two terminals, an orchestrator that double-starts),
/// with the real llama-server: exactly one server runs, it is the one `status` names, the 23 others exit 8
/// naming the first, and `down` stops it with nothing left.
#[test]
fn e2e_concurrent_ups_of_one_name_start_exactly_one_server() {
    let Some(e) = env() else { return };
    let d = TempDir::new("race");
    let run_dir = d.0.join("runs").join("same");
    let _c = Cleanup(vec![run_dir.clone()]);
    let port = free_port();
    let kids: Vec<_> = (0..24)
        .map(|_| {
            let mut c = up(&d.0, "same", &["--detach", "--no-check"], &tiny(&e, port));
            c.stdout(Stdio::null()).stderr(Stdio::piped()).stdin(Stdio::null());
            c.spawn().unwrap()
        })
        .collect();
    let mut codes = Vec::new();
    for mut k in kids {
        let st = wait_bounded(&mut k, Duration::from_secs(120));
        let mut err = String::new();
        use std::io::Read;
        k.stderr.take().unwrap().read_to_string(&mut err).unwrap();
        if st.code() == Some(8) {
            assert!(err.contains("run 'same' is already running ("), "{err}");
        }
        codes.push(st.code());
    }
    let ok = codes.iter().filter(|c| **c == Some(0)).count();
    let refused = codes.iter().filter(|c| **c == Some(8)).count();
    assert_eq!((ok, refused), (1, 23), "{codes:?}");
    let servers: Vec<i32> = marked(&run_dir);
    assert_eq!(servers.len(), 1, "one server process carries the run's mark: {servers:?}");
    assert_eq!(keepers(&run_dir).len(), 1);
    let (code, rows, _) = status(&d.0);
    assert_eq!(code, Some(0));
    assert_eq!(row(&rows, "same")["pid"].as_i64(), Some(servers[0] as i64), "{rows:?}");
    assert_eq!(row(&rows, "same")["state"], "ready", "{rows:?}");
    let o = down(&d.0, "same");
    assert_eq!(o.code, Some(0), "{}", o.out);
    assert!(o.out.contains("none left"), "{}", o.out);
    assert!(nothing_left(&run_dir));
    assert!(poll_until(Duration::from_secs(10), Duration::from_millis(20), || std::net::TcpListener::bind((
        "127.0.0.1",
        port
    ))
    .is_ok()));
}

/// A corrupted `state.json` on a live run: named in one line, the run is still "ready" in `status`, a
/// second `up` is refused (8). A corrupted `run.json`: plain `status` still shows every other run and names
/// the bad file. `down --all` stops both (it needs no record).
#[test]
fn e2e_corrupted_state_files_are_named_and_the_run_still_stops() {
    let Some(e) = env() else { return };
    let d = TempDir::new("corrupt");
    let (a_dir, b_dir) = (d.0.join("runs/a"), d.0.join("runs/b"));
    let _c = Cleanup(vec![a_dir.clone(), b_dir.clone()]);
    let o = run_bounded(up(&d.0, "a", &["--detach", "--no-check"], &tiny(&e, free_port())), T);
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    let o = run_bounded(up(&d.0, "b", &["--detach"], &plain("b")), T);
    assert_eq!(o.status.code(), Some(0));
    let server_a = state_json(&a_dir)["server_pid"].as_i64().unwrap() as i32;
    std::fs::write(a_dir.join("state.json"), "{\"keeper_pid\": 1, \"server_pi").unwrap();
    let (code, rows, err) = status(&d.0);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("state.json of run a is unreadable: "), "{err}");
    assert_eq!(row(&rows, "a")["state"], "ready", "{rows:?}");
    assert_eq!(row(&rows, "a")["pid"].as_i64(), Some(server_a as i64));
    let o = run_bounded(up(&d.0, "a", &["--detach", "--no-check"], &tiny(&e, free_port())), T);
    assert_eq!(o.status.code(), Some(8), "a second server was started: {}", String::from_utf8_lossy(&o.stderr));
    // run.json of b corrupted: status still lists a and b, names the file
    std::fs::write(b_dir.join("run.json"), [0xffu8, 0, 1]).unwrap();
    let (code, rows, err) = status(&d.0);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("run.json of run b is unreadable: "), "{err}");
    assert_eq!(err.lines().filter(|l| l.contains("unreadable")).count(), 2, "{err}");
    assert_eq!(row(&rows, "b")["state"], "ready", "{rows:?}");
    // `down --all` left the run with the corrupted state.json running: it stops both
    let o = run_bounded(vigil_in(&d.0, &["down", "--all", "--grace", "2s"]), T);
    let out = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(!alive(server_a), "{out}");
    assert!(nothing_left(&a_dir) && nothing_left(&b_dir), "{out}");
}

/// `state.json` rewritten to name an unrelated process (a `sleep` of ours, with its true start time): `status`
/// never shows it as the server and `down` never signals it; it stops the real server. Then the keeper killed
/// and the file pointing at the `sleep` again (a reused pid): still never signalled, the server still stopped.
#[test]
fn e2e_a_pid_that_is_not_the_keeper_is_never_signalled() {
    let d = TempDir::new("reuse");
    let run_dir = d.0.join("runs/r");
    let _c = Cleanup(vec![run_dir.clone()]);
    let bystander = sleeper();
    let b = bystander.pid();
    let point_at = |pid: i32| {
        let mut st = state_json(&run_dir);
        st["keeper_pid"] = pid.into();
        st["server_pid"] = pid.into();
        st["keeper"]["pid"] = pid.into();
        st["keeper"]["start_ticks"] = start_ticks(pid).into();
        std::fs::write(run_dir.join("state.json"), st.to_string()).unwrap();
    };
    for keeper_dies in [false, true] {
        let o = run_bounded(up(&d.0, "r", &[&["--detach"], PLAIN].concat(), &plain("r")), T);
        assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
        let server = marked(&run_dir);
        assert_eq!(server.len(), 1);
        if keeper_dies {
            let k = keepers(&run_dir);
            signal(k[0], libc::SIGKILL);
            assert!(poll_until(T, Duration::from_millis(5), || !alive(k[0])));
        }
        point_at(b);
        let (_, rows, err) = status(&d.0);
        assert_eq!(row(&rows, "r")["pid"].as_i64(), Some(server[0] as i64), "{rows:?} {err}");
        if keeper_dies {
            assert_eq!(row(&rows, "r")["state"], "keeper died", "{rows:?}");
        }
        let o = down(&d.0, "r");
        assert_eq!(o.code, Some(0), "{}", o.out);
        assert!(!o.out.contains(&format!("{b}")), "the bystander was named: {}", o.out);
        assert!(alive(b), "down signalled the process state.json named");
        assert!(nothing_left(&run_dir), "the real server was not stopped");
        if !keeper_dies {
            // the grace reached the keeper with its signal (down writes stop.json only after)
            let events = std::fs::read_to_string(run_dir.join("events.jsonl")).unwrap();
            assert!(events.contains("\"event\":\"stop_requested\",\"grace_ms\":2000"), "{events}");
        }
    }
}

/// The keeper killed (the server lives on, its output lost): `watch` and `wait` end with 13 saying so,
/// `status` says so (not "ready"), a new `up` of the name is refused, `down` stops the server with proof.
#[test]
fn e2e_keeper_killed_is_said_and_the_server_still_stops() {
    let Some(e) = env() else { return };
    let d = TempDir::new("keeper");
    let run_dir = d.0.join("runs/k");
    let _c = Cleanup(vec![run_dir.clone()]);
    let port = free_port();
    let o = run_bounded(up(&d.0, "k", &["--detach", "--no-check"], &tiny(&e, port)), T);
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    let server = state_json(&run_dir)["server_pid"].as_i64().unwrap() as i32;
    let k = keepers(&run_dir);
    assert_eq!(k.len(), 1);
    // `vigil watch` of the run (the watch of `wait` after ready), when the keeper dies
    let (mut waiter, mut events) = spawn_json(vigil_in(&d.0, &["watch", "k", "--json"]));
    while events.next().expect("watch ended early")["verdict"] != "ready" {}
    signal(k[0], libc::SIGKILL);
    assert!(poll_until(T, Duration::from_millis(5), || !alive(k[0])));
    assert!(alive(server));
    let told: Vec<serde_json::Value> = events.collect();
    assert_eq!(wait_bounded(&mut waiter, T).code(), Some(13), "{told:?}");
    assert!(told.iter().any(|v| v.to_string().contains("the keeper of run k died at ")), "{told:?}");
    let (code, rows, err) = status(&d.0);
    assert_eq!(code, Some(0));
    assert_eq!(row(&rows, "k")["state"], "keeper died", "{rows:?}");
    assert_eq!(row(&rows, "k")["pid"].as_i64(), Some(server as i64));
    assert!(
        err.contains("the keeper of run k died at ") && err.contains("the server lives on but its output"),
        "{err}"
    );
    // `wait` of the run begun after the keeper died: 13 and the line too, never "ready"
    let o = run_bounded(vigil_in(&d.0, &["wait", "k", "--timeout", "30s"]), T);
    let out = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert_eq!(o.status.code(), Some(13), "{out}");
    assert!(out.contains("the keeper of run k died at "), "{out}");
    // still a run's server: not among the servers vigil did not start
    let o = run_bounded(vigil_in(&d.0, &["ps", "--json"]), T);
    let ps: Vec<serde_json::Value> = serde_json::from_slice(&o.stdout).unwrap();
    assert!(!ps.iter().any(|r| r["pid"].as_i64() == Some(server as i64)), "{ps:?}");
    let o = run_bounded(up(&d.0, "k", &["--detach", "--no-check"], &tiny(&e, free_port())), T);
    assert_eq!(o.status.code(), Some(8), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stderr).contains("still alive without its keeper"));
    let o = down(&d.0, "k");
    assert_eq!(o.code, Some(0), "{}", o.out);
    assert!(!alive(server) && nothing_left(&run_dir));
    assert!(poll_until(Duration::from_secs(10), Duration::from_millis(20), || std::net::TcpListener::bind((
        "127.0.0.1",
        port
    ))
    .is_ok()));
}

/// `down` signals first and records after: with the state folder full (a 1 MiB tmpfs mounted for the
/// test, as root) or read-only (mode 0500, as a user), the server is stopped with proof.
#[test]
fn e2e_down_stops_on_a_full_disk_or_a_read_only_state_folder() {
    let d = TempDir::new("full");
    let state = d.path("state");
    std::fs::create_dir(&state).unwrap();
    let mounted = is_root() && {
        let o = Command::new("mount").args(["-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs"]).arg(&state).output();
        o.is_ok_and(|o| o.status.success())
    };
    struct Unmount(PathBuf, bool);
    impl Drop for Unmount {
        fn drop(&mut self) {
            if self.1 {
                let _ = Command::new("umount").arg("-l").arg(&self.0).status();
            }
        }
    }
    let _u = Unmount(state.clone(), mounted);
    if is_root() && !mounted {
        panic!("as root, the test mounts a tmpfs: mount failed");
    }
    let run_dir = state.join("runs/f");
    let _c = Cleanup(vec![run_dir.clone()]);
    let o = run_bounded(up(&state, "f", &[&["--detach"], PLAIN].concat(), &plain("f")), T);
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    let server = state_json(&run_dir)["server_pid"].as_i64().unwrap() as i32;
    if mounted {
        // fill it: the next write anywhere in the state folder fails with ENOSPC
        let mut f = std::fs::File::create(state.join("filler")).unwrap();
        use std::io::Write;
        while f.write_all(&[0u8; 4096]).is_ok() {}
        assert!(std::fs::write(run_dir.join("probe"), b"x").is_err(), "the disk is not full");
    } else {
        std::fs::set_permissions(&run_dir, std::fs::Permissions::from_mode(0o500)).unwrap();
        assert!(std::fs::write(run_dir.join("probe"), b"x").is_err(), "the folder is not read-only");
    }
    // and a user profile that does not parse: down reads none
    let conf = d.path("conf");
    std::fs::create_dir_all(conf.join("vigil/profiles")).unwrap();
    std::fs::write(conf.join("vigil/profiles/broken.toml"), "name = [unclosed").unwrap();
    let mut c = vigil_in(&state, &["down", "f", "--grace", "2s"]);
    c.env("XDG_CONFIG_HOME", &conf);
    let o = run_bounded(c, T);
    let out = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(!alive(server), "the server was not stopped");
    assert!(nothing_left(&run_dir));
    let _ = std::fs::set_permissions(&run_dir, std::fs::Permissions::from_mode(0o700));
}

/// A state folder no one else controls (as ssh's ~/.ssh): a symlink planted at runs/NAME, a `runs` that is
/// a symlink, a state folder writable by its group or by others, or (as root) owned by another user: each
/// refused in one line, nothing written through it, nothing started.
#[test]
fn e2e_a_state_folder_others_control_is_refused() {
    let d = TempDir::new("hostile-state");
    let marker = d.path("started");
    let cmd = vec!["sh".to_string(), "-c".into(), format!("touch {}; exec sleep 60", marker.display())];
    let refused = |state: &Path, name: &str, why: &str| {
        let o = run_bounded(up(state, name, &["--detach", "--no-check", "--no-probe"], &cmd), T);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains("refusing the state folder") && err.contains(why), "{err}");
        assert!(!marker.exists(), "the server was started");
    };
    // a symlink planted at runs/NAME, pointing at a folder of "the other user"
    let s1 = d.path("s1");
    std::fs::create_dir_all(s1.join("runs")).unwrap();
    let target = d.path("target");
    std::fs::create_dir(&target).unwrap();
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::symlink(&target, s1.join("runs/x")).unwrap();
    refused(&s1, "x", "symbolic link");
    assert_eq!(std::fs::metadata(&target).unwrap().mode() & 0o777, 0o755, "the target was chmod'ed");
    assert_eq!(std::fs::read_dir(&target).unwrap().count(), 0, "files were written into the target");
    let o = run_bounded(vigil_in(&s1, &["down", "x"]), T);
    assert_eq!(o.status.code(), Some(2));
    // beside it a real run: `down --all` stops it and names the refused one
    let ok_dir = s1.join("runs/ok");
    let _c = Cleanup(vec![ok_dir.clone()]);
    let o = run_bounded(up(&s1, "ok", &[&["--detach"], PLAIN].concat(), &plain("ok")), T);
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    let o = run_bounded(vigil_in(&s1, &["down", "--all"]), T);
    let out = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert_eq!(o.status.code(), Some(2), "{out}");
    assert!(out.contains("'x': refusing the state folder") && out.contains("none left"), "{out}");
    assert!(nothing_left(&ok_dir));
    // `runs` a symlink
    let s2 = d.path("s2");
    std::fs::create_dir(&s2).unwrap();
    std::os::unix::fs::symlink(&target, s2.join("runs")).unwrap();
    refused(&s2, "x", "symbolic link");
    assert_eq!(std::fs::read_dir(&target).unwrap().count(), 0);
    // writable by the group, by others
    for (mode, who) in [(0o770, "its group"), (0o777, "others")] {
        let s = d.path(&format!("s{mode:o}"));
        std::fs::create_dir(&s).unwrap();
        std::fs::set_permissions(&s, std::fs::Permissions::from_mode(mode)).unwrap();
        refused(&s, "x", &format!("writable by {who}"));
        let o = run_bounded(vigil_in(&s, &["status"]), T);
        assert_eq!(o.status.code(), Some(2), "status used it");
    }
    // owned by another user (root can make one)
    if is_root() {
        let s = d.path("s-other");
        std::fs::create_dir(&s).unwrap();
        std::os::unix::fs::chown(&s, Some(65534), Some(65534)).unwrap();
        std::fs::set_permissions(&s, std::fs::Permissions::from_mode(0o700)).unwrap();
        refused(&s, "x", "owned by uid 65534");
    }
}

/// Nothing in the state folder is readable by another user: folders 0700, every file 0600 (run records,
/// state, events, logs, the lock, history.db, evidence); and secret values (`HF_TOKEN`, `*_API_KEY`,
/// `--api-key`) are in no file of it but `secrets/NAME.json`.
#[test]
fn e2e_every_state_file_is_private() {
    let d = TempDir::new("modes");
    let state = d.path("state");
    let _c = Cleanup(vec![state.join("runs/m2")]);
    let o = run_bounded(
        up(
            &state,
            "m2",
            &[&["--detach", "--env", "HF_TOKEN=hf_secret123", "--env", "MY_API_KEY=sk-private-77"], PLAIN].concat(),
            &[plain("m2"), vec!["--api-key".into(), "sk-flag-secret-88".into()]].concat(),
        ),
        T,
    );
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    let o = run_bounded(vigil_in(&state, &["dump", "m2"]), T);
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    let o = down(&state, "m2");
    assert_eq!(o.code, Some(0), "{}", o.out);
    let mut files = Vec::new();
    let mut stack = vec![state.clone()];
    while let Some(p) = stack.pop() {
        let m = std::fs::symlink_metadata(&p).unwrap();
        if m.is_dir() {
            assert_eq!(m.mode() & 0o777, 0o700, "{}", p.display());
            stack.extend(std::fs::read_dir(&p).unwrap().flatten().map(|e| e.path()));
        } else {
            assert_eq!(m.mode() & 0o777, 0o600, "{}", p.display());
            files.push(p.strip_prefix(&state).unwrap().display().to_string());
        }
    }
    for want in [
        "history.db",
        "runs/m2/run.json",
        "runs/m2/state.json",
        "runs/m2/keeper.lock",
        "runs/m2/server.log",
        "secrets/m2.json",
    ] {
        assert!(files.iter().any(|f| f == want), "{want} missing from {files:?}");
    }
    assert!(files.iter().any(|f| f.starts_with("runs/m2/evidence-")), "no evidence file: {files:?}");
    // the README's promise: secret values (HF_TOKEN, *_API_KEY, --api-key) are in no file but the secrets one
    for f in &files {
        let text = std::fs::read(state.join(f)).unwrap();
        for secret in ["hf_secret123", "sk-private-77", "sk-flag-secret-88"] {
            let has = text.windows(secret.len()).any(|w| w == secret.as_bytes());
            assert!(!has || f == "secrets/m2.json", "{f} holds {secret}");
        }
    }
}

/// A small deterministic generator (the seed is printed: a failure can be replayed).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

/// `kill -9` of a vigil process (the keeper, `up`, `wait`, `down`) at a random moment of a start of the real
/// llama-server (tiny model), 50 times: whatever was left, `status` names the server and `down` stops it with
/// proof ("none left"; nothing of the run left in /proc, the port free). The moments are delays drawn from a
/// seeded generator, spread over a whole start (about a second here: profiles, the keeper, the launch, the
/// model's load, the ready line, the probe, the generation proof); the seed is printed and
/// `VIGIL_KILL_SEED=N` replays it. A killed `up` is a foreground one half of the time (no --detach).
#[test]
fn e2e_kill_9_of_any_vigil_process_at_any_moment_of_a_start() {
    let Some(e) = env() else { return };
    let seed = std::env::var("VIGIL_KILL_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
    });
    eprintln!("seed {seed} (VIGIL_KILL_SEED={seed} replays it)");
    let mut rng = Rng(seed);
    let d = TempDir::new("kill9");
    let run_dir = d.0.join("runs/k");
    let _c = Cleanup(vec![run_dir.clone()]);
    let t0 = Instant::now();
    let (mut killed, mut outcomes) = ([0u32; 4], [0u32; 3]);
    for i in 0..50 {
        let victim = rng.below(4) as usize;
        let port = free_port();
        let foreground = victim == 1 && rng.below(2) == 0;
        let mut up_child = {
            let mode: &[&str] = if foreground { &["--no-check"] } else { &["--detach", "--no-check"] };
            let mut c = up(&d.0, "k", mode, &tiny(&e, port));
            c.stdout(Stdio::null()).stderr(Stdio::null()).stdin(Stdio::null());
            c.spawn().unwrap()
        };
        let mut other = None;
        let ctx = |what: &str| format!("iteration {i} (victim {victim}, seed {seed}): {what}");
        match victim {
            0 => {
                // the keeper, at a random moment after it appears (it may not, when the start was refused)
                let _ = poll_until(Duration::from_secs(10), Duration::from_millis(1), || !keepers(&run_dir).is_empty());
                std::thread::sleep(Duration::from_micros(rng.below(1_200_000)));
                for k in keepers(&run_dir) {
                    signal(k, libc::SIGKILL);
                    killed[0] += 1;
                }
            }
            1 => {
                std::thread::sleep(Duration::from_micros(rng.below(1_500_000)));
                signal(up_child.id() as i32, libc::SIGKILL);
                killed[1] += 1;
            }
            _ => {
                std::thread::sleep(Duration::from_micros(rng.below(1_000_000)));
                let args: &[&str] = if victim == 2 { &["wait", "k", "--timeout", "30s"] } else { &["down", "k"] };
                let mut c = vigil_in(&d.0, args);
                c.stdout(Stdio::null()).stderr(Stdio::null()).stdin(Stdio::null());
                let c = other.insert(c.spawn().unwrap());
                std::thread::sleep(Duration::from_micros(rng.below(500_000)));
                signal(c.id() as i32, libc::SIGKILL);
                killed[victim] += 1;
            }
        }
        // a detached up ends at ready (or at its refusal); a foreground one only when killed
        let _ = wait_bounded(&mut up_child, T);
        if let Some(mut c) = other {
            let _ = wait_bounded(&mut c, T);
        }
        // Whatever was left: a live process of the run is named by status, and down stops it.
        let left = marked(&run_dir);
        if !left.is_empty() {
            let (code, rows, err) = status(&d.0);
            assert_eq!(code, Some(0), "{}", ctx(&err));
            let r = row(&rows, "k");
            let pid = r["pid"].as_i64().unwrap_or(0) as i32;
            // the one allowed miss: the process it would name ended meanwhile (a server whose keeper died
            // mid-start may die of its closed output)
            assert!(
                left.contains(&pid) || left.iter().any(|p| !alive(*p)),
                "{}",
                ctx(&format!("status names pid {pid}, the run's processes are {left:?}: {r}"))
            );
        }
        let o = down(&d.0, "k");
        let outcome = if o.code == Some(0) && o.out.contains("none left") {
            0
        } else if o.code == Some(0) && o.out.contains("nothing running") {
            1
        } else if o.code == Some(2) && o.out.contains("no run named") {
            2
        } else {
            panic!("{}", ctx(&format!("down: {:?} {}", o.code, o.out)))
        };
        outcomes[outcome] += 1;
        // "nothing running" only when nothing of the run lives on; no run folder only when up was killed
        // before it made one (so nothing was started)
        assert!(outcome == 0 || left.iter().all(|p| !alive(*p)), "{}", ctx(&format!("{left:?} alive: {}", o.out)));
        assert!(outcome != 2 || left.is_empty(), "{}", ctx(&o.out));
        assert!(nothing_left(&run_dir), "{}", ctx("a process of the run was left"));
        assert!(
            poll_until(Duration::from_secs(10), Duration::from_millis(20), || std::net::TcpListener::bind((
                "127.0.0.1",
                port
            ))
            .is_ok()),
            "{}",
            ctx("the port is still taken")
        );
    }
    eprintln!(
        "50 starts in {:?}; kills: keeper {}, up {}, wait {}, down {}; down said: none left {}, nothing running {}, no run {}",
        t0.elapsed(),
        killed[0],
        killed[1],
        killed[2],
        killed[3],
        outcomes[0],
        outcomes[1],
        outcomes[2]
    );
}

/// A foreground `up` serving after ready when its keeper is killed: it says so and exits 13 (not 0, not a
/// crash: the server lives on); `down` stops the server.
#[test]
fn e2e_foreground_up_says_its_keeper_died() {
    let d = TempDir::new("fg-keeper");
    let run_dir = d.0.join("runs/fg");
    let _c = Cleanup(vec![run_dir.clone()]);
    let (mut child, mut events) = spawn_json(up(&d.0, "fg", &[&["--json"], PLAIN].concat(), &plain("fg")));
    while events.next().expect("up ended early")["verdict"] != "ready" {}
    let server = marked(&run_dir);
    assert_eq!(server.len(), 1);
    let k = keepers(&run_dir);
    assert_eq!(k.len(), 1);
    signal(k[0], libc::SIGKILL);
    let told: Vec<serde_json::Value> = events.collect();
    assert_eq!(wait_bounded(&mut child, T).code(), Some(13), "{told:?}");
    assert!(told.iter().any(|v| v.to_string().contains("the keeper of run fg died at ")), "{told:?}");
    assert!(alive(server[0]));
    let o = down(&d.0, "fg");
    assert_eq!(o.code, Some(0), "{}", o.out);
    assert!(nothing_left(&run_dir));
}

/// Another user's processes are never taken for a run's, whatever they claim: one carrying the run's mark
/// (`VIGIL_RUN_DIR`) and one whose command line says it is the run's keeper. As root (who can start a
/// process as another user); as a user there is no other user to be.
#[test]
fn e2e_another_users_process_is_never_taken_for_a_run() {
    if !is_root() {
        eprintln!("SKIP: needs root to start a process as another user");
        return;
    }
    use std::os::unix::process::CommandExt;
    let d = TempDir::new("other-user");
    let run_dir = d.0.join("runs/o");
    let _c = Cleanup(vec![run_dir.clone()]);
    let as_nobody = |prog: &str, args: &[&std::ffi::OsStr]| {
        Guard(
            Command::new(prog)
                .args(args)
                .env("VIGIL_RUN_DIR", &run_dir)
                .uid(65534)
                .gid(65534)
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .spawn()
                .unwrap(),
        )
    };
    // started first (lower pids: a scan meets them first): a "server" carrying the run's mark, and a
    // "keeper" whose command line is `xargs __keeper RUN_DIR` (xargs waits on its stdin, held open here)
    let fake_server = as_nobody("sleep", &["300".as_ref()]);
    let fake_keeper = as_nobody("xargs", &["__keeper".as_ref(), run_dir.as_os_str()]);
    let o = run_bounded(up(&d.0, "o", &[&["--detach"], PLAIN].concat(), &plain("o")), T);
    assert_eq!(
        o.status.code(),
        Some(0),
        "refused because of another user's process: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let server = marked(&run_dir);
    assert_eq!(server.len(), 1);
    // the record unreadable: the keeper is looked for among the processes
    std::fs::write(run_dir.join("state.json"), "{").unwrap();
    let (_, rows, _) = status(&d.0);
    assert_eq!(row(&rows, "o")["pid"].as_i64(), Some(server[0] as i64), "{rows:?}");
    assert_eq!(row(&rows, "o")["state"], "ready", "{rows:?}");
    let o = down(&d.0, "o");
    assert_eq!(o.code, Some(0), "{}", o.out);
    assert!(alive(fake_server.pid()) && alive(fake_keeper.pid()), "down signalled another user's process");
    assert!(nothing_left(&run_dir));
    // the keeper gone, the folder holds no record of a live run: still only our processes count
    let o = down(&d.0, "o");
    assert_eq!(o.code, Some(0), "{}", o.out);
    assert!(o.out.contains("nothing running"), "{}", o.out);
    assert!(alive(fake_server.pid()));
}
