//! TLS for `https://` health probes and the generation proof: rustls with the `ring` provider (the
//! glibc-2.28 release is cross-built with cargo-zigbuild, where aws-lc-rs's cmake/NASM build does not
//! fit), trusting the system's root certificates, a private CA (`--ca-cert`) instead, or nothing at
//! all (`--insecure`, said once on stderr). The handshake runs inside the probe's deadline (probe.rs).
//!
//! `--ca-cert FILE` names CAs, or the server's own certificate: a self-signed certificate made with
//! `openssl req -x509` (what internal clusters use) is CA and server at once, which webpki refuses as an end
//! entity (`CaUsedAsEndEntity`) while curl accepts it. A server certificate that is one of the file's, byte for
//! byte, is accepted as pinned: its name (SAN) and validity period are still checked, and the handshake must be
//! signed by its key, as always.

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{verify_server_name, WebPkiServerVerifier};
use rustls::crypto::{self, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::ParsedCertificate;
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use std::path::PathBuf;
use std::sync::{Arc, Once};
use std::time::Duration;

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
    } else if let Some(p) = &o.ca_cert {
        let v = CaOrPinned::from_file(p)?;
        builder.dangerous().with_custom_certificate_verifier(Arc::new(v)).with_no_client_auth()
    } else {
        builder.with_root_certificates(system_roots()?).with_no_client_auth()
    };
    // The probe speaks HTTP/1.1 only; say so, or an HTTP/2-first endpoint could pick h2.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Tls { config: Arc::new(config), name })
}

/// The trust anchors of the system store.
fn system_roots() -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
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

/// `--ca-cert FILE`: the file's certificates as CAs (webpki, as for the system store), and each of them as a
/// pinned server certificate (see the module's documentation).
#[derive(Debug)]
struct CaOrPinned {
    ca: Arc<WebPkiServerVerifier>,
    pinned: Vec<CertificateDer<'static>>,
}

impl CaOrPinned {
    fn from_file(p: &std::path::Path) -> Result<CaOrPinned, String> {
        let f = p.display();
        let bytes = std::fs::read(p).map_err(|e| format!("--ca-cert {f}: cannot read it: {e}"))?;
        let certs = CertificateDer::pem_slice_iter(&bytes)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("--ca-cert {f}: not a valid PEM file: {e}"))?;
        if certs.is_empty() {
            return Err(format!("--ca-cert {f}: no certificate in it (expected PEM: -----BEGIN CERTIFICATE-----)"));
        }
        let mut roots = RootCertStore::empty();
        for c in &certs {
            roots.add(c.clone()).map_err(|e| format!("--ca-cert {f}: not a usable CA certificate: {e}"))?;
        }
        let ca = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider())
            .build()
            .map_err(|e| format!("--ca-cert {f}: {e}"))?;
        Ok(CaOrPinned { ca, pinned: certs })
    }
}

impl ServerCertVerifier for CaOrPinned {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if !self.pinned.iter().any(|p| p.as_ref() == end_entity.as_ref()) {
            return self.ca.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now);
        }
        // Pinned: the file vouches for this very certificate, not for what it might sign. Its name and its
        // validity period are what is left to check.
        verify_server_name(&ParsedCertificate::try_from(end_entity)?, server_name)?;
        let bad = || rustls::Error::InvalidCertificate(CertificateError::BadEncoding);
        let (not_before, not_after) = validity(end_entity.as_ref()).ok_or_else(bad)?;
        let at = |s: u64| UnixTime::since_unix_epoch(Duration::from_secs(s));
        if now.as_secs() < not_before {
            let e = CertificateError::NotValidYetContext { time: now, not_before: at(not_before) };
            return Err(rustls::Error::InvalidCertificate(e));
        }
        if now.as_secs() > not_after {
            let e = CertificateError::ExpiredContext { time: now, not_after: at(not_after) };
            return Err(rustls::Error::InvalidCertificate(e));
        }
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.ca.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.ca.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.ca.supported_verify_schemes()
    }
}

/// A certificate's validity period, `(notBefore, notAfter)` in Unix seconds, from its DER:
/// `Certificate ::= SEQUENCE { tbsCertificate SEQUENCE { [0] version OPTIONAL, serialNumber INTEGER,
/// signature SEQUENCE, issuer SEQUENCE, validity SEQUENCE { Time, Time }, … }, … }` (RFC 5280 4.1).
/// None for anything else; only reached for a certificate that is byte for byte one of `--ca-cert`'s.
fn validity(der: &[u8]) -> Option<(u64, u64)> {
    let (cert, _) = tlv(der, 0x30)?;
    let (tbs, _) = tlv(cert, 0x30)?;
    let mut rest = tbs;
    if rest.first() == Some(&0xA0) {
        rest = tlv(rest, 0xA0)?.1;
    }
    for tag in [0x02, 0x30, 0x30] {
        rest = tlv(rest, tag)?.1; // serial number, signature algorithm, issuer
    }
    let (validity, _) = tlv(rest, 0x30)?;
    let (not_before, rest) = der_time(validity)?;
    let (not_after, _) = der_time(rest)?;
    Some((not_before, not_after))
}

/// One DER element with tag `tag` at the start of `b`: its contents and what follows it.
fn tlv(b: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    let (&t, b) = b.split_first()?;
    let (&l, b) = b.split_first()?;
    if t != tag {
        return None;
    }
    let (len, b) = if l < 0x80 {
        (usize::from(l), b)
    } else {
        let n = usize::from(l & 0x7f);
        if n == 0 || n > 4 {
            return None;
        }
        let (len, b) = (b.get(..n)?, b.get(n..)?);
        (len.iter().fold(0usize, |a, x| (a << 8) | usize::from(*x)), b)
    };
    Some((b.get(..len)?, b.get(len..)?))
}

/// A `Time` (UTCTime `YYMMDDHHMMSSZ`, years 1950–2049, or GeneralizedTime `YYYYMMDDHHMMSSZ`) in Unix seconds.
fn der_time(b: &[u8]) -> Option<(u64, &[u8])> {
    let utc = b.first() == Some(&0x17);
    let (body, rest) = tlv(b, if utc { 0x17 } else { 0x18 })?;
    let s = std::str::from_utf8(body).ok()?.strip_suffix('Z')?;
    if !s.bytes().all(|c| c.is_ascii_digit()) || s.len() != if utc { 12 } else { 14 } {
        return None;
    }
    let num = |r: std::ops::Range<usize>| s[r].parse::<i64>().ok();
    let (year, s_at) = if utc {
        let yy = num(0..2)?;
        (if yy >= 50 { 1900 + yy } else { 2000 + yy }, 2)
    } else {
        (num(0..4)?, 4)
    };
    let f = |i: usize| num(s_at + 2 * i..s_at + 2 * i + 2);
    let (month, day, hour, min, sec) = (f(0)?, f(1)?, f(2)?, f(3)?, f(4)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || min > 59 || sec > 60 {
        return None;
    }
    // days from the civil date (H. Hinnant's algorithm), March-based years
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * ((month + 9) % 12) + 2) / 5 + day - 1;
    let days = era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468;
    let t = days * 86_400 + hour * 3_600 + min * 60 + sec;
    Some((u64::try_from(t).unwrap_or(0), rest))
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
            "TLS certificate rejected ({r}): give --ca-cert FILE (the CA that signed it, or the server's own certificate), or --insecure to skip verification"
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

    /// Self-signed (CA:TRUE, as `openssl req -x509` makes them) for localhost and 127.0.0.1, valid from
    /// 2020-01-01 00:00:00 (UTCTime) to 2051-06-15 12:34:56 (GeneralizedTime), made with `openssl ca -selfsign`.
    const SELF_SIGNED: &str = "\
-----BEGIN CERTIFICATE-----
MIIBZzCCAQ2gAwIBAgIBATAKBggqhkjOPQQDAjAUMRIwEAYDVQQDDAlsb2NhbGhv
c3QwIBcNMjAwMTAxMDAwMDAwWhgPMjA1MTA2MTUxMjM0NTZaMBQxEjAQBgNVBAMM
CWxvY2FsaG9zdDBZMBMGByqGSM49AgEGCCqGSM49AwEHA0IABDcJVO+IEEYUhFs5
/2XwCmeTgjgzLdZnvQkJivWQeq6o2VdovjuPkOpMKJZv3bExEV3THLitHtgJU9lX
aKvFJdOjTjBMMBoGA1UdEQQTMBGCCWxvY2FsaG9zdIcEfwAAATAPBgNVHRMBAf8E
BTADAQH/MB0GA1UdDgQWBBRStrpGw+SOm3DS35NefYLlJqJwMTAKBggqhkjOPQQD
AgNIADBFAiEA77zyK0/Q257yzPAT7AjRTPxh9w5mQx0CNP06Uu+QqO8CICW9uoBq
xN+aXpX+64sYfhXqj+l9HGiUhQATuisG0CGj
-----END CERTIFICATE-----\n";

    #[test]
    fn validity_is_read_from_both_time_forms() {
        let der = CertificateDer::from_pem_slice(SELF_SIGNED.as_bytes()).unwrap();
        assert_eq!(validity(der.as_ref()), Some((1_577_836_800, 2_570_445_296)));
        for cut in [0, 1, 10, 40, 60, 80] {
            assert_eq!(validity(&der.as_ref()[..cut]), None, "cut at {cut}");
        }
        assert_eq!(validity(b"\x30\x84\xff\xff\xff\xff"), None);
        assert_eq!(der_time(b"\x17\x0d201301000000Z"), None, "month 13");
    }

    /// Issue #25 step 8: a self-signed server certificate that `--ca-cert` names is accepted (webpki alone says
    /// `CaUsedAsEndEntity`), for its own names and within its validity period only.
    #[test]
    fn a_pinned_self_signed_certificate_is_checked_for_name_and_time() {
        let d = std::env::temp_dir().join(format!("vigil-tls-pin-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let p = d.join("self.pem");
        std::fs::write(&p, SELF_SIGNED).unwrap();
        let v = CaOrPinned::from_file(&p).unwrap();
        let der = CertificateDer::from_pem_slice(SELF_SIGNED.as_bytes()).unwrap();
        let at = |s: u64| UnixTime::since_unix_epoch(Duration::from_secs(s));
        let name = |n: &str| ServerName::try_from(n.to_string()).unwrap();
        let check = |n: &str, t: u64| v.verify_server_cert(&der, &[], &name(n), &[], at(t)).map(|_| ());
        assert!(check("localhost", 1_900_000_000).is_ok());
        assert!(check("127.0.0.1", 1_900_000_000).is_ok());
        let e = |r: Result<(), rustls::Error>| match r {
            Err(rustls::Error::InvalidCertificate(c)) => c,
            other => panic!("{other:?}"),
        };
        assert!(matches!(e(check("node7.example", 1_900_000_000)), CertificateError::NotValidForNameContext { .. }));
        assert!(matches!(e(check("localhost", 1_500_000_000)), CertificateError::NotValidYetContext { .. }));
        assert!(matches!(e(check("localhost", 2_600_000_000)), CertificateError::ExpiredContext { .. }));
        // what webpki alone says of the same certificate, trusted as a CA: the defect this fixes
        let r = v.ca.verify_server_cert(&der, &[], &name("localhost"), &[], at(1_900_000_000)).map(|_| ());
        assert!(format!("{:?}", e(r)).contains("CaUsedAsEndEntity"));
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
