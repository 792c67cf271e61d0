//! `vigil diagnose` through the binary: the corpus contract (body only, neutral file names, the
//! last JSON line is the verdict object) and hostile inputs (bounded, never a panic).

mod common;
use common::*;
use std::path::PathBuf;
use std::time::Duration;

const T: Duration = Duration::from_secs(120);

fn corpus() -> Vec<(String, Vec<u8>, String)> {
    let dir = std::env::var_os("VIGIL_CORPUS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/corpus"));
    if !dir.is_dir() {
        assert!(std::env::var("CI").as_deref() != Ok("true"), "corpus missing at {}", dir.display());
        eprintln!("SKIP: no corpus");
        return vec![];
    }
    let subs = std::fs::read_dir(&dir).unwrap().map(|s| s.unwrap().path()).filter(|s| s.is_dir()).collect();
    logs_in(subs)
}

/// The whole logs of the real vLLM and SGLang captured on the GPU machine (corpus/captured, issue #23).
fn captured() -> Vec<(String, Vec<u8>, String)> {
    logs_in(vec![PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../corpus/captured")])
}

fn logs_in(subs: Vec<PathBuf>) -> Vec<(String, Vec<u8>, String)> {
    let mut out = Vec::new();
    for sub in subs {
        for f in std::fs::read_dir(&sub).unwrap() {
            let f = f.unwrap().path();
            if f.extension().is_none_or(|e| e != "log") {
                continue;
            }
            let bytes = std::fs::read(&f).unwrap();
            let marker = b"\n# ---\n";
            let i = bytes.windows(marker.len()).position(|w| w == marker).unwrap();
            let header = String::from_utf8_lossy(&bytes[..i]).to_string();
            let expect = header.lines().find_map(|l| l.strip_prefix("# EXPECT:")).unwrap().trim().to_string();
            out.push((
                f.file_name().unwrap().to_string_lossy().to_string(),
                bytes[i + marker.len()..].to_vec(),
                expect,
            ));
        }
    }
    out.sort();
    out
}

#[test]
fn corpus_contract_through_the_binary() {
    check_through_the_binary(corpus());
}

/// The captured real-server logs through `vigil diagnose`, as CI replays what the GPU run saw.
#[test]
fn captured_real_server_logs_through_the_binary() {
    let cases = captured();
    assert!(cases.len() >= 40, "corpus/captured holds {} logs", cases.len());
    check_through_the_binary(cases);
}

fn check_through_the_binary(cases: Vec<(String, Vec<u8>, String)>) {
    let d = TempDir::new("corpus");
    let exceptions =
        std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/corpus-exceptions.txt"))
            .unwrap_or_default();
    let mut bad = Vec::new();
    for (i, (name, body, expect)) in cases.iter().enumerate() {
        // a neutral name: neither the folder nor the file name reaches vigil
        let p = d.path(&format!("case-{i:02}.log"));
        std::fs::write(&p, body).unwrap();
        let mut c = vigil();
        c.args(["diagnose", "--json"]).arg(&p);
        let o = run_bounded(c, T);
        let v = json_lines(&o);
        let r = verdict(&v);
        for key in ["verdict", "phase", "cause", "server"] {
            assert!(r.get(key).is_some(), "{name}: verdict object lacks {key}");
        }
        let field = |k: &str| -> Vec<String> {
            expect
                .split_whitespace()
                .find_map(|kv| kv.strip_prefix(&format!("{k}=")))
                .unwrap()
                .split('|')
                .map(|s| if s == "-" { "null".into() } else { s.to_string() })
                .collect()
        };
        let got = |k: &str| r[k].as_str().map(String::from).unwrap_or_else(|| "null".into());
        let ok = field("verdict").contains(&got("verdict"))
            && field("phase").contains(&got("phase"))
            && field("cause").contains(&got("cause"));
        if !ok && !exceptions.contains(name.as_str()) {
            bad.push(format!("{name}: got {} {} {}, want {expect}", got("verdict"), got("phase"), got("cause")));
        }
        // exit code follows the verdict
        let want_code = match got("verdict").as_str() {
            "ready" => 0,
            "crashed" => 3,
            "unhealthy" => 6,
            "starting" => 7,
            _ => 99,
        };
        assert_eq!(o.status.code(), Some(want_code), "{name}");
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn hostile_inputs_are_bounded_and_never_panic() {
    let d = TempDir::new("hostile");
    // invalid UTF-8, ANSI colour, \r-only progress, binary garbage, a 10 MB line without a newline
    let mut body = Vec::new();
    body.extend_from_slice(b"\x1b[32m[2025-01-01 00:00:00 TP0]\x1b[0m Load weight begin. avail mem=70 GB\n");
    body.extend_from_slice(b"\xff\xfe\xfd invalid utf8 \xc3\x28\n");
    for k in 0..=8 {
        body.extend_from_slice(
            format!("Loading safetensors checkpoint shards: {}% Completed | {k}/8 [00:01<00:02]\r", k * 12).as_bytes(),
        );
    }
    body.extend_from_slice(&(0..=255u8).cycle().take(4096).collect::<Vec<u8>>());
    body.push(b'\n');
    body.extend(std::iter::repeat_n(b'x', 10 * 1024 * 1024));
    body.extend_from_slice(b"\n[2025-01-01 00:00:09 TP0] Capture cuda graph begin. avail mem=9 GB\n");
    let p = d.path("hostile.log");
    std::fs::write(&p, &body).unwrap();
    let mut c = vigil();
    c.args(["diagnose", "--json"]).arg(&p);
    let o = run_bounded(c, T);
    assert!(String::from_utf8_lossy(&o.stderr).is_empty(), "{}", String::from_utf8_lossy(&o.stderr));
    let v = json_lines(&o);
    let r = verdict(&v);
    assert_eq!((r["verdict"].as_str(), r["phase"].as_str()), (Some("starting"), Some("cuda_graphs")), "{r}");
    assert_eq!(o.status.code(), Some(7));
    // the 10 MB line is bounded in what is kept
    assert!(o.stdout.len() < 1024 * 1024, "output grew with the input: {} bytes", o.stdout.len());
}

#[test]
fn bad_input_is_one_clear_line() {
    let d = TempDir::new("bad");
    std::fs::write(d.path("notpem.txt"), "not a certificate\n").unwrap();
    for (args, needle) in [
        (vec!["diagnose", "/nonexistent/file.log"], "cannot read /nonexistent/file.log"),
        (vec!["diagnose", "/tmp"], "is a directory"),
        (vec!["diagnose", "--server", "nosuch", "/tmp"], "unknown server kind"),
        (vec!["wait"], "nothing to watch"),
        (vec!["wait", "--url", "ftp://x"], "must start with http:// or https://"),
        (vec!["wait", "--url", "http://127.0.0.1:1/", "--stall", "warp=1s"], "unknown phase"),
        (vec!["wait", "--url", "http://127.0.0.1:1/", "--timeout", "soon"], "bad duration"),
        (vec!["wait", "--url", "http://127.0.0.1:1/", "--api-key-env", "VIGIL_UNSET_VAR_X"], "is not set"),
        (
            vec!["wait", "--url", "https://127.0.0.1:1/", "--ca-cert", "/nonexistent/ca.pem"],
            "--ca-cert /nonexistent/ca.pem: cannot read it",
        ),
        (vec!["probe", "--url", "https://127.0.0.1:1/", "--ca-cert", "/nonexistent/ca.pem"], "cannot read it"),
        (vec!["wait", "--url", "https://127.0.0.1:1/", "--ca-cert", "notpem.txt"], "no certificate in it"),
        (vec!["wait", "--url", "http://127.0.0.1:1/", "--insecure"], "apply to an https:// --url only"),
        (vec!["probe", "--url", "http://127.0.0.1:1/", "--ca-cert", "notpem.txt"], "apply to an https:// --url only"),
        (vec!["wait", "--url", "https://127.0.0.1:1/", "--ca-cert", "x.pem", "--insecure"], "cannot be used with"),
    ] {
        let mut c = vigil();
        c.args(&args).current_dir(&d.0);
        let o = run_bounded(c, T);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

#[test]
fn explain_names_profile_rule_and_line() {
    let d = TempDir::new("explain");
    let p = d.path("a.log");
    std::fs::write(
        &p,
        "0.00.003.985 I srv    load_model: loading model 'm.gguf'\n0.00.095.288 I srv  llama_server: model loaded\n",
    )
    .unwrap();
    let mut c = vigil();
    c.args(["diagnose", "--explain"]).arg(&p);
    let o = run_bounded(c, T);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("L1: llama-cpp/weights"), "{out}");
    assert!(out.contains("L2: llama-cpp/ready"), "{out}");
    assert_eq!(o.status.code(), Some(0));
}

/// An error the server went on from (issue #24, a `retried` event): `diagnose` says it in text and JSON, and the
/// verdict is the start's, not a crash. llama-server's own lines: a failed load (corpus
/// llama-cpp-captured-not-a-gguf) and the load starting again and finishing (llamacpp-captured-ready-then-sigint).
#[test]
fn a_retried_error_is_said_and_is_not_a_crash() {
    let d = TempDir::new("retried");
    let p = d.path("server.log");
    std::fs::write(
        &p,
        "0.00.008.333 I srv    load_model: loading model 'tiny.gguf'\n\
         0.00.006.059 E srv    load_model: failed to load model, 'tiny.gguf'\n\
         0.00.008.400 I srv    load_model: loading model 'tiny.gguf'\n\
         0.00.095.288 I srv  llama_server: model loaded\n",
    )
    .unwrap();
    let mut c = vigil();
    c.arg("diagnose").arg(&p);
    let o = run_bounded(c, T);
    let text = String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
    assert!(text.contains("retried in weights"), "{text}");
    assert!(text.contains("READY"), "{text}");
    let mut c = vigil();
    c.args(["diagnose", "--json"]).arg(&p);
    let o = run_bounded(c, T);
    let v = json_lines(&o);
    let r = v.iter().find(|e| e["event"] == "retried").unwrap_or_else(|| panic!("{v:?}"));
    assert_eq!(r["phase"], "weights");
    assert_eq!(verdict(&v)["verdict"], "ready");
}
