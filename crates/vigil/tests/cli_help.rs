//! Issue #16 item 3, a CLI that explains itself, through the binary: the shell completions and the
//! manual page come from the same definitions as `--help` and name the real flags; `--version`
//! names the commit; the build script that finds the commit never fails a build.
//! (That every flag and subcommand has a help line is a unit test in src/help.rs.)

mod common;
use common::*;
use std::path::Path;
use std::process::Command;

fn ok_stdout(args: &[&str]) -> String {
    let out = vigil().args(args).output().unwrap();
    assert!(out.status.success(), "vigil {args:?}: {:?}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn completions_name_the_flags_and_commands() {
    for shell in ["bash", "zsh", "fish"] {
        let s = ok_stdout(&["completions", shell]);
        assert!(s.len() > 1000, "{shell}: {} bytes", s.len());
        for word in ["--stall", "--host", "--env-file", "--generate-every", "diagnose", "completions"] {
            // fish names long flags `-l stall`
            let fish = word.strip_prefix("--").map(|w| format!("-l {w} "));
            assert!(s.contains(word) || fish.is_some_and(|f| s.contains(&f)), "{shell} completions lack {word}");
        }
        assert!(!s.contains("__keeper"), "{shell} completions offer the hidden keeper command");
    }
}

#[test]
fn completions_for_an_unknown_shell_is_a_usage_error() {
    let out = vigil().args(["completions", "tcsh"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid value 'tcsh'"));
}

#[test]
fn man_page_has_the_flags_commands_and_examples() {
    let s = ok_stdout(&["man"]);
    assert!(s.contains(".TH vigil 1"), "{s}");
    // roff escapes hyphens
    for want in ["\\-\\-host", "\\-\\-profiles", "vigil\\-up(1)", "vigil\\-man(1)", ".SH EXAMPLES", ".SH EXIT CODES"] {
        assert!(s.contains(want), "vigil man lacks {want}");
    }
    assert!(!s.contains("__keeper"));
}

#[test]
fn man_dir_writes_one_page_per_command() {
    let d = TempDir::new("man");
    let dir = d.path("man1");
    let listed = ok_stdout(&["man", "--dir", dir.to_str().unwrap()]);
    for page in ["vigil.1", "vigil-up.1", "vigil-wait.1", "vigil-diagnose.1", "vigil-completions.1"] {
        assert!(dir.join(page).is_file(), "{page} missing; printed:\n{listed}");
        assert!(listed.contains(page), "{page} not printed");
    }
    assert!(!dir.join("vigil-__keeper.1").exists() && !dir.join("vigil-help.1").exists());
    let up = std::fs::read_to_string(dir.join("vigil-up.1")).unwrap();
    for want in ["\\-\\-stall", "\\-\\-env\\-file", "PROOF AND WATCH", ".SH EXAMPLES", "sglang.launch_server"] {
        assert!(up.contains(want), "vigil-up.1 lacks {want}");
    }
}

#[test]
fn man_dir_that_cannot_be_made_is_one_line_error() {
    let d = TempDir::new("man-bad");
    let file = d.path("file");
    std::fs::write(&file, "x").unwrap();
    let out = vigil().args(["man", "--dir"]).arg(file.join("sub")).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("vigil: error: man --dir "), "{err}");
}

/// `vigil 0.1.0 (commit 3a288c3)`, `(commit 3a288c3-dirty)` or `(commit unknown)`.
fn commit_of(version_line: &str) -> Option<&str> {
    let rest = version_line.strip_prefix("vigil ")?;
    let (ver, rest) = rest.split_once(" (commit ")?;
    let commit = rest.strip_suffix(")\n")?;
    if !ver.split('.').all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit())) {
        return None;
    }
    let hex = commit.strip_suffix("-dirty").unwrap_or(commit);
    (commit == "unknown" || hex.len() >= 7 && hex.bytes().all(|b| b.is_ascii_hexdigit())).then_some(commit)
}

#[test]
fn version_names_the_commit() {
    assert_eq!(commit_of("vigil 0.1.0 (commit 3a288c3)\n"), Some("3a288c3"));
    assert_eq!(commit_of("vigil 0.1.0 (commit 3a288c3-dirty)\n"), Some("3a288c3-dirty"));
    assert_eq!(commit_of("vigil 0.1.0 (commit unknown)\n"), Some("unknown"));
    assert_eq!(commit_of("vigil 0.1.0\n"), None);
    for flag in ["--version", "-V"] {
        let s = ok_stdout(&[flag]);
        assert!(commit_of(&s).is_some(), "vigil {flag}: {s:?}");
        assert!(s.starts_with(&format!("vigil {} ", env!("CARGO_PKG_VERSION"))), "{s}");
    }
}

#[test]
fn every_command_help_has_examples() {
    for cmd in ["diagnose", "wait", "watch", "probe", "profiles", "check", "up", "down", "status", "logs"] {
        let s = ok_stdout(&[cmd, "--help"]);
        assert!(s.contains("Examples:\n"), "vigil {cmd} --help has no examples");
        assert!(s.contains("Remote (SSH):"), "vigil {cmd} --help");
    }
    let up = ok_stdout(&["up", "--help"]);
    for h in ["Launch:", "Supervision:", "Deadlines and stalls:", "Probing:", "Output:", "Proof and watch:"] {
        assert!(up.contains(h), "vigil up --help lacks the heading {h}");
    }
    // the short help stays short: no examples, a pointer to --help
    let short = ok_stdout(&["up", "-h"]);
    assert!(!short.contains("Examples:") && short.contains("--help"), "{short}");
}

/// Compiles the package's build script alone and runs it as cargo would, in `manifest_dir`.
fn run_build_script(bin: &Path, manifest_dir: &Path, commit_env: Option<&str>) -> String {
    let mut c = Command::new(bin);
    c.env("CARGO_MANIFEST_DIR", manifest_dir).env_remove("VIGIL_GIT_COMMIT");
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("GIT_") {
            c.env_remove(k);
        }
    }
    if let Some(v) = commit_env {
        c.env("VIGIL_GIT_COMMIT", v);
    }
    let out = c.output().unwrap();
    assert!(out.status.success(), "build script failed: {}", String::from_utf8_lossy(&out.stderr));
    let s = String::from_utf8(out.stdout).unwrap();
    for l in s.lines().filter_map(|l| l.strip_prefix("cargo:rerun-if-changed=")) {
        // a path that does not exist would rerun the script (and rebuild vigil) on every build
        assert!(Path::new(l).exists(), "rerun-if-changed on a missing path: {l}");
    }
    s.lines()
        .find_map(|l| l.strip_prefix("cargo:rustc-env=VIGIL_GIT_COMMIT="))
        .expect("no VIGIL_GIT_COMMIT")
        .to_string()
}

fn git(dir: &Path, args: &[&str]) {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"])
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn build_script_falls_back_to_unknown_and_marks_dirty_trees() {
    if Command::new("git").arg("--version").output().is_err() {
        eprintln!("SKIP: no git");
        return;
    }
    let d = TempDir::new("buildrs");
    let bin = d.path("build-script");
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("build.rs");
    let out = Command::new(rustc).args(["--edition", "2021", "-O", "-o"]).arg(&bin).arg(&src).output().unwrap();
    assert!(out.status.success(), "rustc build.rs: {}", String::from_utf8_lossy(&out.stderr));

    // A source tarball: no .git anywhere above the workspace.
    let ws = d.path("tarball/vigil-0.1.0");
    std::fs::create_dir_all(ws.join("crates/vigil/src")).unwrap();
    std::fs::write(ws.join("Cargo.toml"), "[workspace]\n").unwrap();
    assert_eq!(run_build_script(&bin, &ws.join("crates/vigil"), None), "unknown");
    // A packager names the commit.
    assert_eq!(run_build_script(&bin, &ws.join("crates/vigil"), Some("abc1234")), "abc1234");

    // The same tarball unpacked inside some other git checkout: not that checkout's commit.
    git(&d.path("tarball"), &["init", "-q"]);
    assert_eq!(run_build_script(&bin, &ws.join("crates/vigil"), None), "unknown");

    // The workspace's own repository: the short commit, then -dirty after an edit to a source.
    let repo = d.path("repo");
    std::fs::create_dir_all(repo.join("crates/vigil/src")).unwrap();
    std::fs::write(repo.join("Cargo.toml"), "[workspace]\n").unwrap();
    std::fs::write(repo.join("crates/vigil/src/main.rs"), "fn main() {}\n").unwrap();
    std::fs::write(repo.join("README.md"), "readme\n").unwrap();
    git(&repo, &["init", "-q"]);
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-q", "-m", "x"]);
    let clean = run_build_script(&bin, &repo.join("crates/vigil"), None);
    assert!(clean.len() >= 7 && clean.bytes().all(|b| b.is_ascii_hexdigit()), "{clean}");
    // a change outside the compiled sources does not make the binary dirty
    std::fs::write(repo.join("README.md"), "changed\n").unwrap();
    assert_eq!(run_build_script(&bin, &repo.join("crates/vigil"), None), clean);
    std::fs::write(repo.join("crates/vigil/src/main.rs"), "fn main() { }\n").unwrap();
    assert_eq!(run_build_script(&bin, &repo.join("crates/vigil"), None), format!("{clean}-dirty"));
}

/// Issue #23: an `up` that launches nothing says why in its exit code, and the help says which code is which:
/// 8 for a refusal a retry may pass (the port is taken, an earlier run is alive), 10 for preflight errors the
/// server is known to refuse (the code of `vigil check` itself; docs/systemd.md's `RestartPreventExitStatus=10`
/// relies on it: no restart can fix the command).
#[test]
fn a_refused_up_exits_as_its_help_says() {
    let t = std::time::Duration::from_secs(60);
    let d = TempDir::new("refused");
    // a local model path that does not exist: an error the servers themselves confirm, so nothing launches
    let missing = d.path("no/such/model").display().to_string();
    let port = free_port().to_string();
    let mut c = vigil();
    c.env("VIGIL_STATE_DIR", &d.0).args(["up", "--name", "pre", "--", "vllm", "serve", &missing, "--port", &port]);
    let o = run_bounded(c, t);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(10), "{err}");
    assert!(err.contains("not launching"), "{err}");
    assert!(!d.path("runs/pre/state.json").exists(), "launched despite the preflight");
    // the port taken: refused before anything runs (the preflight skipped, so only the port decides)
    let holder = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = holder.local_addr().unwrap().port().to_string();
    let mut c = vigil();
    c.env("VIGIL_STATE_DIR", &d.0).args(["up", "--name", "port", "--no-check", "--", "vllm", "serve", "m"]);
    c.args(["--port", &taken]);
    let o = run_bounded(c, t);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(8), "{err}");
    assert!(err.contains(&format!("port {taken} is taken")), "{err}");
    // and the help says so, in the exit codes of `vigil --help` and in `vigil up --help`
    let top = ok_stdout(&["--help"]);
    assert!(top.contains("8 up refused (port taken, earlier run alive)"), "{top}");
    assert!(top.contains("10 check failed (check, or up's preflight: nothing launched)"), "{top}");
    let up = ok_stdout(&["up", "--help"]);
    assert!(up.contains("exit 8 when the port is taken or an earlier run of the name is alive"), "{up}");
    assert!(up.contains("exit 10 when the preflight check finds errors"), "{up}");
}
