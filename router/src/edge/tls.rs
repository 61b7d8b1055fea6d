//! TLS for the client listener: a rustls server config from PEM files (ring provider,
//! TLS 1.2 and 1.3, ALPN h2 and http/1.1), checked at start so a bad path or key stops
//! the node with the file's name.

use std::{path::Path, sync::Arc};

use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
use tokio_rustls::TlsAcceptor;

/// Why the listener's TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsSetupError {
    #[error("{0}: {1}")]
    Read(String, String),
    #[error("{0} holds no certificate")]
    NoCert(String),
    #[error("TLS configuration: {0}")]
    Config(String),
}

/// An acceptor serving `cert` (PEM chain, leaf first) with `key` (PEM, any format).
pub fn acceptor(cert: &Path, key: &Path) -> Result<TlsAcceptor, TlsSetupError> {
    let shown = |p: &Path| p.display().to_string();
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| TlsSetupError::Read(shown(cert), e.to_string()))?
        .collect::<Result<_, _>>()
        .map_err(|e| TlsSetupError::Read(shown(cert), e.to_string()))?;
    if chain.is_empty() {
        return Err(TlsSetupError::NoCert(shown(cert)));
    }
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| TlsSetupError::Read(shown(key), e.to_string()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsSetupError::Config(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| TlsSetupError::Config(e.to_string()))?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(cfg)))
}
