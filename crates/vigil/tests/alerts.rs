//! The Prometheus alerting rules of docs/examples/vigil-alerts.rules.yml: valid for Debian's `promtool check rules`,
//! and firing (and only firing) on the series vigil's /metrics shows for a crashed, a slow and an unhealthy
//! start (`promtool test rules` with crates/vigil/tests/fixtures/vigil-alerts.test.yml).

mod common;
use common::*;
use std::process::Command;
use std::time::Duration;

const RULES: &str = include_str!("../../../docs/examples/vigil-alerts.rules.yml");
const TESTS: &str = include_str!("fixtures/vigil-alerts.test.yml");

#[test]
fn alert_rules_pass_promtool_and_fire_on_vigils_series() {
    let Some(promtool) = tool("/usr/bin/promtool", "prometheus") else { return };
    let d = TempDir::new("alerts");
    std::fs::write(d.path("vigil-alerts.rules.yml"), RULES).unwrap();
    std::fs::write(d.path("vigil-alerts.test.yml"), TESTS).unwrap();
    let mut c = Command::new(&promtool);
    c.args(["check", "rules"]).arg(d.path("vigil-alerts.rules.yml"));
    let o = run_bounded(c, Duration::from_secs(60));
    let out = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "promtool check rules: {out}");
    assert!(out.contains("SUCCESS: 3 rules found"), "{out}");
    let mut c = Command::new(&promtool);
    c.current_dir(&d.0).args(["test", "rules", "vigil-alerts.test.yml"]);
    let o = run_bounded(c, Duration::from_secs(60));
    let out = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "promtool test rules: {out}");
    assert!(out.contains("SUCCESS"), "{out}");
}

/// The unit tests can fail: a rule that fired on every start (here: on `starting`) is caught.
#[test]
fn alert_rule_tests_catch_a_wrong_rule() {
    let Some(promtool) = tool("/usr/bin/promtool", "prometheus") else { return };
    let d = TempDir::new("alerts-bad");
    let bad = RULES.replace(r#"verdict=~"crashed|stalled|timeout""#, r#"verdict=~"crashed|stalled|timeout|starting""#);
    assert_ne!(bad, RULES);
    std::fs::write(d.path("vigil-alerts.rules.yml"), bad).unwrap();
    std::fs::write(d.path("vigil-alerts.test.yml"), TESTS).unwrap();
    let mut c = Command::new(&promtool);
    c.current_dir(&d.0).args(["test", "rules", "vigil-alerts.test.yml"]);
    let o = run_bounded(c, Duration::from_secs(60));
    assert!(!o.status.success(), "a rule that fires while starting passed: {}", String::from_utf8_lossy(&o.stdout));
}
