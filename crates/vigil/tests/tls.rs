//! `https://` probes and the generation proof through a real TLS endpoint: Debian's `stunnel4` on
//! loopback in front of the real llama-server, with a CA and a server certificate made here by the
//! `openssl` CLI. Test names start with `e2e_`. Missing stunnel or openssl: a failure under CI=true
//! (scripts/test.sh installs both), a skip otherwise.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

const T: Duration = Duration::from_secs(90);

/// Where Debian puts them; tests also run as an unprivileged user with PATH=/usr/bin:/bin.
fn tool(names: &[&str]) -> Option<PathBuf> {
    let found = names
        .iter()
        .flat_map(|n| ["/usr/bin", "/bin", "/usr/sbin"].map(|d| Path::new(d).join(n)))
        .find(|p| p.is_file());
    if found.is_none() {
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!("{} missing (scripts/test.sh installs it: apt-get install stunnel4 openssl)", names[0]);
        }
        eprintln!("SKIP: {} not installed", names[0]);
    }
    found
}

fn openssl(bin: &Path, dir: &Path, args: &[&str]) {
    let o = Command::new(bin).args(args).current_dir(dir).stdin(Stdio::null()).output().expect("run openssl");
    assert!(o.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&o.stderr));
}

/// A private CA and a server certificate it signed for 127.0.0.1 and localhost. Returns the CA's PEM.
fn make_certs(bin: &Path, d: &TempDir) -> PathBuf {
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
    let mut ca = vec!["req", "-x509"];
    ca.extend(ec);
    ca.extend(["-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=vigil test CA"]);
    ca.extend(["-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign"]);
    openssl(bin, &d.0, &ca);
    let mut csr = vec!["req", "-new"];
    csr.extend(ec);
    csr.extend(["-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1"]);
    openssl(bin, &d.0, &csr);
    std::fs::write(
        d.path("ext.cnf"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    openssl(
        bin,
        &d.0,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-set_serial",
            "2",
            "-days",
            "2",
            "-extfile",
            "ext.cnf",
            "-out",
            "server.pem",
        ],
    );
    d.path("ca.pem")
}

/// The real llama-server behind stunnel: TLS on the returned port, plain HTTP only on loopback behind it.
struct Endpoint {
    _d: TempDir,
    ca: PathBuf,
    port: u16,
    log: PathBuf,
    stunnel_log: PathBuf,
    _server: Guard,
    _stunnel: Guard,
}

fn endpoint(tag: &str, server_extra: &[&str]) -> Option<Endpoint> {
    let e = env()?;
    let stunnel = tool(&["stunnel4", "stunnel"])?;
    let ssl = tool(&["openssl"])?;
    let d = TempDir::new(tag);
    let ca = make_certs(&ssl, &d);
    let backend = free_port();
    let log = d.path("server.log");
    let server = start_server(&e, &e.models.join("tiny.gguf"), backend, &log, server_extra);
    let port = free_port();
    let stunnel_log = d.path("stunnel.log");
    let conf = d.path("stunnel.conf");
    std::fs::write(
        &conf,
        format!(
            "foreground = yes\npid =\nsyslog = no\ndebug = 7\noutput = {}\n[llama]\naccept = 127.0.0.1:{port}\nconnect = 127.0.0.1:{backend}\ncert = {}\nkey = {}\n",
            stunnel_log.display(),
            d.path("server.pem").display(),
            d.path("server.key").display()
        ),
    )
    .unwrap();
    let child = Command::new(&stunnel)
        .arg(&conf)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start stunnel");
    let st = Guard(child);
    // stunnel says when its listening socket is bound (debug 7).
    assert!(
        wait_for_text(&stunnel_log, &format!("bound to 127.0.0.1:{port}"), Duration::from_secs(20)),
        "stunnel did not bind: {}",
        std::fs::read_to_string(&stunnel_log).unwrap_or_default()
    );
    Some(Endpoint { _d: d, ca, port, log, stunnel_log, _server: server, _stunnel: st })
}

impl Endpoint {
    fn url(&self) -> String {
        format!("https://127.0.0.1:{}/health", self.port)
    }

    fn wait(&self, extra: &[&str]) -> Command {
        let mut c = vigil();
        c.args(["wait", "--json", "--server", "llama-cpp", "--interval", "100ms", "--url", &self.url(), "--log"]);
        c.arg(&self.log).args(extra);
        c
    }
}

#[test]
fn e2e_https_with_a_private_ca_reaches_ready_with_the_generation_proof() {
    let key = "vigil-tls-test-secret-7f3a";
    let Some(ep) = endpoint("tls-ca", &["--api-key", key]) else { return };
    let mut c = ep.wait(&["--ca-cert", ep.ca.to_str().unwrap(), "--timeout", "60s", "--api-key-env", "VIGIL_TLS_KEY"]);
    c.env("VIGIL_TLS_KEY", key);
    let o = run_bounded(c, T);
    let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert_eq!(o.status.code(), Some(0), "{out}\n{err}");
    let v = json_lines(&o);
    assert_eq!(v[0]["url"], ep.url(), "{:?}", v[0]);
    let g = v.iter().find(|x| x["event"] == "generation").expect("no generation proof");
    assert_eq!(g["ok"], true, "{g}");
    assert!(g["tokens"].as_u64().unwrap() > 0, "{g}");
    let r = verdict(&v);
    assert_eq!(r["verdict"], "ready");
    assert!(r["detail"].as_str().unwrap().contains("generation proof"), "{r}");
    assert!(!out.contains(key) && !err.contains(key), "the bearer token was printed");
    assert!(!err.contains("--insecure"), "{err}");
    // Health and the completion both came through the TLS endpoint (the backend is loopback-only).
    let st = std::fs::read_to_string(&ep.stunnel_log).unwrap();
    assert!(st.matches("accepted connection").count() >= 2, "{st}");
}

#[test]
fn e2e_https_without_the_ca_is_a_certificate_error_not_ready() {
    let Some(ep) = endpoint("tls-noca", &[]) else { return };
    let o = run_bounded(ep.wait(&["--timeout", "4s"]), T);
    let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    let v = json_lines(&o);
    assert_ne!(o.status.code(), Some(0), "{out}\n{err}");
    assert!(!v.iter().any(|x| x["verdict"] == "ready"), "{out}");
    // The system store does not hold the test's CA: a one-time note names the certificate problem and the fix.
    let notes: Vec<&str> = v
        .iter()
        .filter(|x| x["event"] == "note")
        .filter_map(|x| x["message"].as_str())
        .filter(|m| m.contains("TLS certificate rejected"))
        .collect();
    assert_eq!(notes.len(), 1, "{out}\n{err}");
    assert!(notes[0].contains("UnknownIssuer") && notes[0].contains("--ca-cert"), "{}", notes[0]);
    assert_eq!(verdict(&v)["verdict"], "timeout", "{out}");
    // `vigil probe`: not ready, one line saying why.
    let mut c = vigil();
    c.args(["probe", "--url", &ep.url(), "--timeout", "5s"]);
    let o = run_bounded(c, T);
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(out.starts_with("not ready:") && out.contains("certificate"), "{out}");
    // `vigil probe` (Kubernetes exec probes) with the CA: ready, with a completion.
    let mut c = vigil();
    c.args(["probe", "--url", &ep.url(), "--ca-cert", ep.ca.to_str().unwrap(), "--generate", "--server", "llama-cpp"]);
    c.args(["--timeout", "30s"]);
    let o = run_bounded(c, T);
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{out}{}", String::from_utf8_lossy(&o.stderr));
    assert!(out.starts_with("ready: health OK, generation"), "{out}");
}

#[test]
fn e2e_https_insecure_reaches_ready_and_says_so_once() {
    let Some(ep) = endpoint("tls-insecure", &[]) else { return };
    let o = run_bounded(ep.wait(&["--insecure", "--timeout", "60s"]), T);
    let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert_eq!(o.status.code(), Some(0), "{out}\n{err}");
    let v = json_lines(&o);
    assert!(v.iter().any(|x| x["event"] == "generation" && x["ok"] == true), "{out}");
    assert_eq!(verdict(&v)["verdict"], "ready");
    assert_eq!(err.matches("--insecure").count(), 1, "{err}");
    assert!(err.contains("not verified"), "{err}");
    assert!(!out.contains("--insecure"), "the warning belongs on stderr: {out}");
}
