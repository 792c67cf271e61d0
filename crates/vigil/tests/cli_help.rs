//! Issue #16 item 3, a CLI that explains itself, through the binary: the shell completions and the
//! manual page come from the same definitions as `--help` and name the real flags.
//! (That every flag and subcommand has a help line is a unit test in src/help.rs.)

mod common;
use common::*;

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
