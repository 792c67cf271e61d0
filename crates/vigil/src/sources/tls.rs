//! TLS for `https://` health probes and the generation proof: rustls with the `ring` provider (the
//! glibc-2.28 release is cross-built with cargo-zigbuild, where aws-lc-rs's cmake/NASM build does not
//! fit), trusting the system's root certificates, a private CA (`--ca-cert`) instead, or nothing at
//! all (`--insecure`, said once on stderr). The handshake runs inside the probe's deadline (probe.rs).

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{self, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use std::path::PathBuf;
use std::sync::{Arc, Once};

/// What the command line says about trust for `https://` URLs.
#[derive(Debug, Clone, Default)]
pub struct TlsOpts {
    /// A PEM file of CA certificates trusted instead of the system store.
    pub ca_cert: Option<PathBuf>,
    /// Do not verify the server's certificate at all.
    pub insecure: bool,
}

impl TlsOpts {
    /// Was any TLS flag given (they only make sense with an `https://` URL)?
    pub fn is_set(&self) -> bool {
        self.ca_cert.is_some() || self.insecure
    }
}

/// A TLS client for one server: the configuration and the name its certificate must carry.
#[derive(Debug, Clone)]
pub struct Tls {
    pub config: Arc<ClientConfig>,
    pub name: ServerName<'static>,
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(crypto::ring::default_provider())
}

/// Builds the client for `host` (a DNS name or an IP address; the certificate must name it).
pub fn client(host: &str, o: &TlsOpts) -> Result<Tls, String> {
    let name = ServerName::try_from(host.to_string()).map_err(|e| format!("'{host}' is not a TLS server name: {e}"))?;
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS set-up: {e}"))?;
    let mut config = if o.insecure {
        static WARNED: Once = Once::new();
        WARNED.call_once(|| {
            eprintln!("vigil: warning: --insecure: the server's TLS certificate is not verified (anyone on the path can answer for it)");
        });
        builder.dangerous().with_custom_certificate_verifier(Arc::new(NoVerify(provider()))).with_no_client_auth()
    } else {
        builder.with_root_certificates(roots(o)?).with_no_client_auth()
    };
    // The probe speaks HTTP/1.1 only; say so, or an HTTP/2-first endpoint could pick h2.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Tls { config: Arc::new(config), name })
}

/// The trust anchors: the `--ca-cert` file's certificates, else the system store.
fn roots(o: &TlsOpts) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    if let Some(p) = &o.ca_cert {
        let f = p.display();
        let bytes = std::fs::read(p).map_err(|e| format!("--ca-cert {f}: cannot read it: {e}"))?;
        let certs = CertificateDer::pem_slice_iter(&bytes)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("--ca-cert {f}: not a valid PEM file: {e}"))?;
        if certs.is_empty() {
            return Err(format!("--ca-cert {f}: no certificate in it (expected PEM: -----BEGIN CERTIFICATE-----)"));
        }
        for c in certs {
            roots.add(c).map_err(|e| format!("--ca-cert {f}: not a usable CA certificate: {e}"))?;
        }
        return Ok(roots);
    }
    let found = rustls_native_certs::load_native_certs();
    let (added, _ignored) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        let why = found.errors.first().map(|e| format!(" ({e})")).unwrap_or_default();
        return Err(format!(
            "no system root certificates found{why}: give --ca-cert FILE (the CA of the server's certificate), or set SSL_CERT_FILE"
        ));
    }
    Ok(roots)
}

/// Is this handshake error about the server's certificate (not trusted, wrong name, expired)?
pub fn is_cert_error(e: &std::io::Error) -> bool {
    e.get_ref()
        .and_then(|i| i.downcast_ref::<rustls::Error>())
        .is_some_and(|e| matches!(e, rustls::Error::InvalidCertificate(_) | rustls::Error::NoCertificatesPresented))
}

/// One line for a failed handshake, with what to do about it.
pub fn describe(e: &std::io::Error) -> String {
    let Some(r) = e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) else {
        return format!("TLS handshake: {e}");
    };
    match r {
        rustls::Error::InvalidCertificate(_) | rustls::Error::NoCertificatesPresented => format!(
            "TLS certificate rejected ({r}): give --ca-cert FILE (the CA that signed it), or --insecure to skip verification"
        ),
        rustls::Error::InvalidMessage(_) => format!("TLS handshake: {r} (is this port plain http://?)"),
        _ => format!("TLS handshake: {r}"),
    }
}

/// `--insecure`: accepts any certificate, but still checks that the handshake is signed by the key of
/// the certificate presented (rustls's own signature checks), so only the identity goes unverified.
#[derive(Debug)]
struct NoVerify(Arc<CryptoProvider>);

impl ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(ca: &std::path::Path) -> TlsOpts {
        TlsOpts { ca_cert: Some(ca.to_path_buf()), insecure: false }
    }

    #[test]
    fn ca_cert_errors_are_one_line_and_name_the_file() {
        let d = std::env::temp_dir().join(format!("vigil-tls-unit-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let cases: [(&str, &str, &str); 4] = [
            ("missing.pem", "", "cannot read"),
            ("empty.pem", "not a certificate\n", "no certificate"),
            (
                "bad.pem",
                "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
                "not a usable CA certificate",
            ),
            ("torn.pem", "-----BEGIN CERTIFICATE-----\nAAAA\n", "not a valid PEM file"),
        ];
        for (name, text, want) in cases {
            let p = d.join(name);
            if !text.is_empty() {
                std::fs::write(&p, text).unwrap();
            }
            let e = client("127.0.0.1", &opts(&p)).unwrap_err();
            assert!(e.contains(name) && e.contains(want), "{name}: {e}");
            assert_eq!(e.lines().count(), 1, "{e}");
        }
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn names_and_addresses() {
        let o = TlsOpts { ca_cert: None, insecure: true };
        assert!(matches!(client("127.0.0.1", &o).unwrap().name, ServerName::IpAddress(_)));
        assert!(matches!(client("::1", &o).unwrap().name, ServerName::IpAddress(_)));
        assert!(matches!(client("node7.example", &o).unwrap().name, ServerName::DnsName(_)));
        assert!(client("bad name", &o).is_err());
    }
}
