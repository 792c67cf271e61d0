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
    let (st, stunnel_log) = start_stunnel(&stunnel, &d, backend, &[(port, d.path("server.pem"), d.path("server.key"))]);
    Some(Endpoint { _d: d, ca, port, log, stunnel_log, _server: server, _stunnel: st })
}

/// stunnel in front of the backend on loopback: one TLS service per `(port, certificate, key)`. Returns it with
/// its log once every port is bound.
fn start_stunnel(stunnel: &Path, d: &TempDir, backend: u16, services: &[(u16, PathBuf, PathBuf)]) -> (Guard, PathBuf) {
    let stunnel_log = d.path("stunnel.log");
    let conf = d.path("stunnel.conf");
    let mut text = format!("foreground = yes\npid =\nsyslog = no\ndebug = 7\noutput = {}\n", stunnel_log.display());
    for (i, (port, cert, key)) in services.iter().enumerate() {
        text.push_str(&format!(
            "[s{i}]\naccept = 127.0.0.1:{port}\nconnect = 127.0.0.1:{backend}\ncert = {}\nkey = {}\n",
            cert.display(),
            key.display()
        ));
    }
    std::fs::write(&conf, text).unwrap();
    let child = Command::new(stunnel)
        .arg(&conf)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start stunnel");
    let st = Guard(child);
    // stunnel says when each listening socket is bound (debug 7).
    for (port, _, _) in services {
        assert!(
            wait_for_text(&stunnel_log, &format!("bound to 127.0.0.1:{port}"), Duration::from_secs(20)),
            "stunnel did not bind: {}",
            std::fs::read_to_string(&stunnel_log).unwrap_or_default()
        );
    }
    (st, stunnel_log)
}

/// A self-signed certificate and its key (`TAG.pem`, `TAG.key`) for `/CN=cn` with `san`, CA:TRUE as
/// `openssl req -x509` makes it. With `dates` (notBefore, notAfter: `YYYYMMDDHHMMSSZ`) it is signed by
/// `openssl ca -selfsign` instead, which takes a start and an end (OpenSSL 3.0's `req -x509` only `-days` ahead).
fn self_signed(
    bin: &Path,
    d: &TempDir,
    tag: &str,
    cn: &str,
    san: &str,
    dates: Option<(&str, &str)>,
) -> (PathBuf, PathBuf) {
    let (pem, key, subj) = (format!("{tag}.pem"), format!("{tag}.key"), format!("/CN={cn}"));
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-subj", &subj];
    let Some((start, end)) = dates else {
        let mut a = vec!["req", "-x509", "-out", &pem, "-keyout", &key, "-days", "2", "-addext", san];
        a.extend(ec);
        openssl(bin, &d.0, &a);
        return (d.path(&pem), d.path(&key));
    };
    let dir = d.path(tag);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("ca.cnf"),
        "[ca]\ndefault_ca = d\n[d]\ndatabase = index.txt\nnew_certs_dir = .\nserial = serial\ndefault_md = sha256\n\
         policy = p\ncopy_extensions = copy\nunique_subject = no\n[p]\ncommonName = supplied\n",
    )
    .unwrap();
    std::fs::write(dir.join("index.txt"), "").unwrap();
    std::fs::write(dir.join("serial"), "01\n").unwrap();
    let (pem, key) = (d.path(&pem), d.path(&key));
    let (pem_s, key_s) = (pem.to_str().unwrap(), key.to_str().unwrap());
    let mut a = vec!["req", "-new", "-out", "req.csr", "-keyout", key_s, "-addext", san];
    a.extend(["-addext", "basicConstraints=critical,CA:TRUE"]);
    a.extend(ec);
    openssl(bin, &dir, &a);
    let ca = ["ca", "-batch", "-config", "ca.cnf", "-selfsign", "-keyfile", key_s, "-in", "req.csr", "-notext"];
    let mut a = ca.to_vec();
    a.extend(["-out", pem_s, "-startdate", start, "-enddate", end]);
    openssl(bin, &dir, &a);
    (pem, key)
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

/// Issue #25 step 8: `--ca-cert` naming the server's own self-signed certificate (`openssl req -x509`: CA and
/// server at once, as internal clusters make them; webpki alone says `CaUsedAsEndEntity`) is accepted, as curl
/// accepts it, by name and by address, with the generation proof through it. The same trust does not stretch to
/// a self-signed certificate for another name, an expired one, or another self-signed certificate.
#[test]
fn e2e_https_self_signed_certificate_named_by_ca_cert() {
    let Some(e) = env() else { return };
    let Some(stunnel) = tool(&["stunnel4", "stunnel"]) else { return };
    let Some(ssl) = tool(&["openssl"]) else { return };
    let d = TempDir::new("tls-self");
    let san = "subjectAltName=DNS:localhost,IP:127.0.0.1";
    let good = self_signed(&ssl, &d, "good", "localhost", san, None);
    let wrong = self_signed(&ssl, &d, "wrong", "wrong.example", "subjectAltName=DNS:wrong.example", None);
    let expired = self_signed(&ssl, &d, "expired", "localhost", san, Some(("20200101000000Z", "20200102000000Z")));
    let other = self_signed(&ssl, &d, "other", "localhost", san, None);
    let backend = free_port();
    let _server = start_server(&e, &e.models.join("tiny.gguf"), backend, &d.path("server.log"), &[]);
    // `vigil probe` asks once: the backend must have loaded its model (its own /health says 200)
    let up = || http_get(backend, "/health", &[]).is_ok_and(|r| r.0 == 200);
    assert!(poll_until(T, Duration::from_millis(10), up), "llama-server never answered 200");
    let ports = [free_port(), free_port(), free_port()];
    let services = [
        (ports[0], good.0.clone(), good.1),
        (ports[1], wrong.0.clone(), wrong.1),
        (ports[2], expired.0.clone(), expired.1),
    ];
    let (_stunnel, _log) = start_stunnel(&stunnel, &d, backend, &services);
    let probe = |host: &str, port: u16, ca: &Path| {
        let mut c = vigil();
        c.args(["probe", "--url", &format!("https://{host}:{port}/health"), "--ca-cert", ca.to_str().unwrap()]);
        c.args(["--generate", "--server", "llama-cpp", "--timeout", "30s"]);
        let o = run_bounded(c, T);
        (o.status.code(), format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)))
    };
    for host in ["127.0.0.1", "localhost"] {
        let (code, out) = probe(host, ports[0], &good.0);
        assert_eq!(code, Some(0), "{host}: {out}");
        assert!(out.starts_with("ready: health OK, generation"), "{host}: {out}");
    }
    let refused = |port: u16, ca: &Path, why: &str| {
        let (code, out) = probe("127.0.0.1", port, ca);
        assert_eq!(code, Some(1), "{why}: {out}");
        assert!(out.starts_with("not ready:") && out.contains("certificate"), "{why}: {out}");
        out
    };
    let out = refused(ports[1], &wrong.0, "another name");
    assert!(out.contains("not valid for name"), "{out}");
    let out = refused(ports[2], &expired.0, "expired");
    assert!(out.contains("expired"), "{out}");
    refused(ports[0], &other.0, "another self-signed certificate");
}
