//! CRIU's `--tls`, the page server's side: X.509 over TLS 1.2 or 1.3, as
//! CRIU's GnuTLS speaks it. The server shows its certificate and requires
//! the peer's, which must be signed by the authority given (CRIU's own
//! page server does the same: `GNUTLS_CERT_REQUIRE`). A peer so
//! authenticated may dump from anywhere: the check that a plain
//! connection comes from a socket of root or of the server's own user is
//! for connections without TLS.
//!
//! The files are CRIU's, in PEM: the authority's certificate
//! (`--tls-cacert`, by default `/etc/pki/CA/cacert.pem`), the server's
//! certificate (`--tls-cert`, `/etc/pki/criu/cert.pem`) and its private
//! key (`--tls-key`, `/etc/pki/criu/private/key.pem`).

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::Result;

/// What a page server needs to speak TLS: its certificate chain and key,
/// and the authority its peers' certificates must be signed by.
#[derive(Clone)]
pub struct Tls(pub(super) Arc<rustls::ServerConfig>);

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tls { .. }")
    }
}

fn bad(path: &Path, what: impl std::fmt::Display) -> crate::Error {
    pagewise_mech::Error::Corrupt {
        path: path.display().to_string(),
        what: what.to_string(),
    }
    .into()
}

impl Tls {
    /// Reads the authority's certificate `cacert`, the server's
    /// certificate (chain) `cert` and its key `key`, PEM files as CRIU's.
    ///
    /// # Errors
    /// A file missing, unreadable or not of its kind; a key that is not
    /// the certificate's.
    pub fn from_files(cacert: &Path, cert: &Path, key: &Path) -> Result<Tls> {
        let certs = |path: &Path| -> Result<Vec<CertificateDer<'static>>> {
            let all: std::result::Result<Vec<_>, _> = CertificateDer::pem_file_iter(path)
                .map_err(|e| bad(path, format!("reading its certificates: {e}")))?
                .collect();
            let all = all.map_err(|e| bad(path, format!("a certificate: {e}")))?;
            if all.is_empty() {
                return Err(bad(path, "no certificate in it"));
            }
            Ok(all)
        };
        let mut roots = rustls::RootCertStore::empty();
        for c in certs(cacert)? {
            roots
                .add(c)
                .map_err(|e| bad(cacert, format!("an authority's certificate: {e}")))?;
        }
        let chain = certs(cert)?;
        let key = PrivateKeyDer::from_pem_file(key)
            .map_err(|e| bad(key, format!("reading its private key: {e}")))?;
        // ring, as the agent's HTTPS client uses; deprecated for want of
        // post-quantum key exchange, which CRIU's GnuTLS does not offer.
        #[allow(deprecated)]
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            roots.into(),
            provider.clone(),
        )
        .build()
        .map_err(|e| bad(cacert, format!("verifying peers with it: {e}")))?;
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| bad(cert, format!("TLS versions: {e}")))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, key)
            .map_err(|e| bad(cert, format!("with its key: {e}")))?;
        // No session tickets: CRIU reads its first answer right after the
        // handshake, and GnuTLS, handed a TLS 1.3 ticket instead, says
        // "try again" (EAGAIN), which CRIU takes for a server that does
        // not answer. Each dump is one session; none is resumed.
        config.send_tls13_tickets = 0;
        config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
        Ok(Tls(Arc::new(config)))
    }
}
