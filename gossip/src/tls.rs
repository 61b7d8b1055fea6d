//! Mutual TLS for the mesh: identities, rustls configs (ring provider only), peer identity.
//!
//! Invariants: every config is built with `builder_with_provider(ring)` and TLS 1.3 only, so
//! no process-wide default provider is needed or consulted; a peer is accepted only if its
//! certificate chains to the cluster CA; a node's identity is the single DNS SAN of its
//! certificate, which must equal its node id. Outbound connections to a known member name
//! that member as the TLS server name, so rustls itself checks who answered; connections to
//! a seed whose id is not yet known use [`SEED_SERVER_NAME`], for which the chain is still
//! verified and the identity is read from the certificate afterwards.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};

/// ALPN protocol id of the mesh.
pub const ALPN: &[u8] = b"headroom-mesh/1";
/// TLS server name used when dialling a seed whose node id is not known yet.
pub const SEED_SERVER_NAME: &str = "unknown-peer.headroom.invalid";

/// Certificate and identity errors.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{0}: {1}")]
    Io(PathBuf, #[source] std::io::Error),
    #[error("cannot parse {0}: {1}")]
    Parse(PathBuf, String),
    #[error("certificate generation failed: {0}")]
    Generate(String),
    #[error("{0} has only one of ca.pem / ca.key; both or neither are needed")]
    Incomplete(PathBuf),
    #[error("invalid node id {0:?}: {1}")]
    BadNodeId(String, &'static str),
    #[error("certificate names {found:?}, expected node id {expected:?}")]
    IdentityMismatch { expected: String, found: String },
    #[error("certificate does not chain to the cluster CA: {0}")]
    Chain(String),
    #[error("TLS configuration: {0}")]
    Config(String),
}

/// Checks that `id` can be a node id: a lowercase DNS name of 1–63 bytes made of
/// `a-z 0-9 - .`, not starting or ending with `-` or `.`.
pub fn validate_node_id(id: &str) -> Result<(), TlsError> {
    let bad = |why| Err(TlsError::BadNodeId(id.to_string(), why));
    if id.is_empty() || id.len() > 63 {
        return bad("must be 1-63 bytes");
    }
    if !id
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
    {
        return bad("only lowercase letters, digits, '-' and '.' are allowed");
    }
    if id.starts_with(['-', '.']) || id.ends_with(['-', '.']) || id.contains("..") {
        return bad("must not start or end with '-' or '.', nor contain '..'");
    }
    if id == SEED_SERVER_NAME {
        return bad("reserved name");
    }
    Ok(())
}

/// A node's TLS identity: the cluster CA, its certificate chain and private key.
pub struct TlsIdentity {
    node_id: String,
    roots: Vec<CertificateDer<'static>>,
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
}

impl Clone for TlsIdentity {
    fn clone(&self) -> Self {
        Self {
            node_id: self.node_id.clone(),
            roots: self.roots.clone(),
            chain: self.chain.clone(),
            key: self.key.clone_key(),
        }
    }
}

impl fmt::Debug for TlsIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsIdentity")
            .field("node_id", &self.node_id)
            .field("roots", &self.roots.len())
            .field("chain", &self.chain.len())
            .finish_non_exhaustive()
    }
}

impl TlsIdentity {
    /// Loads `dir/ca.pem`, `dir/<node_id>.pem` and `dir/<node_id>.key` (as written by
    /// [`crate::write_dev_certs`]) and checks that the certificate names `node_id` and
    /// chains to the CA.
    pub fn load(dir: &Path, node_id: &str) -> Result<Self, TlsError> {
        validate_node_id(node_id)?;
        let (cert_path, key_path) = crate::certs::node_paths(dir, node_id);
        let read = |p: &Path| std::fs::read(p).map_err(|e| TlsError::Io(p.to_path_buf(), e));
        Self::from_pem(
            &read(&dir.join("ca.pem"))?,
            &read(&cert_path)?,
            &read(&key_path)?,
            node_id,
        )
    }

    /// Builds an identity from PEM bytes (CA bundle, certificate chain, private key).
    pub fn from_pem(
        ca_pem: &[u8],
        cert_pem: &[u8],
        key_pem: &[u8],
        node_id: &str,
    ) -> Result<Self, TlsError> {
        let parse = |what: &str, e: String| TlsError::Parse(PathBuf::from(what), e);
        let roots: Vec<_> = CertificateDer::pem_slice_iter(ca_pem)
            .collect::<Result<_, _>>()
            .map_err(|e| parse("CA bundle", e.to_string()))?;
        let chain: Vec<_> = CertificateDer::pem_slice_iter(cert_pem)
            .collect::<Result<_, _>>()
            .map_err(|e| parse("certificate", e.to_string()))?;
        let key = PrivateKeyDer::from_pem_slice(key_pem)
            .map_err(|e| parse("private key", e.to_string()))?;
        if roots.is_empty() {
            return Err(parse("CA bundle", "no certificate".into()));
        }
        let Some(leaf) = chain.first() else {
            return Err(parse("certificate", "no certificate".into()));
        };
        let found = cert_node_id(leaf).ok_or_else(|| parse("certificate", "no DNS name".into()))?;
        if found != node_id {
            return Err(TlsError::IdentityMismatch {
                expected: node_id.to_string(),
                found,
            });
        }
        let id = Self {
            node_id: node_id.to_string(),
            roots,
            chain,
            key,
        };
        id.verify_own_chain()?;
        Ok(id)
    }

    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    fn root_store(&self) -> Result<Arc<RootCertStore>, TlsError> {
        let mut store = RootCertStore::empty();
        for r in &self.roots {
            store
                .add(r.clone())
                .map_err(|e| TlsError::Config(format!("bad CA certificate: {e}")))?;
        }
        Ok(Arc::new(store))
    }

    fn verify_own_chain(&self) -> Result<(), TlsError> {
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            self.root_store()?,
            provider(),
        )
        .build()
        .map_err(|e| TlsError::Config(e.to_string()))?;
        let name = ServerName::try_from(self.node_id.clone())
            .map_err(|e| TlsError::Config(e.to_string()))?;
        verifier
            .verify_server_cert(
                &self.chain[0],
                &self.chain[1..],
                &name,
                &[],
                UnixTime::now(),
            )
            .map(|_| ())
            .map_err(|e| TlsError::Chain(e.to_string()))
    }

    /// quinn server config requiring a client certificate from the cluster CA.
    /// A secret derived from the private key (SHA-256 under a fixed label): stable
    /// across restarts of the same node, unguessable without its key.
    pub(crate) fn reset_secret(&self) -> [u8; 32] {
        let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
        ctx.update(b"headroom-gossip stateless reset v1\0");
        ctx.update(self.key.secret_der());
        let mut out = [0u8; 32];
        out.copy_from_slice(ctx.finish().as_ref());
        out
    }

    pub(crate) fn server_config(
        &self,
        transport: Arc<quinn::TransportConfig>,
    ) -> Result<quinn::ServerConfig, TlsError> {
        let p = provider();
        let verifier = WebPkiClientVerifier::builder_with_provider(self.root_store()?, p.clone())
            .build()
            .map_err(|e| TlsError::Config(e.to_string()))?;
        let mut cfg = rustls::ServerConfig::builder_with_provider(p)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| TlsError::Config(e.to_string()))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(self.chain.clone(), self.key.clone_key())
            .map_err(|e| TlsError::Config(e.to_string()))?;
        cfg.alpn_protocols = vec![ALPN.to_vec()];
        let quic = quinn::crypto::rustls::QuicServerConfig::try_from(cfg)
            .map_err(|e| TlsError::Config(e.to_string()))?;
        let mut server = quinn::ServerConfig::with_crypto(Arc::new(quic));
        server.transport_config(transport);
        Ok(server)
    }

    /// quinn client config presenting this node's certificate and verifying the peer's.
    pub(crate) fn client_config(
        &self,
        transport: Arc<quinn::TransportConfig>,
    ) -> Result<quinn::ClientConfig, TlsError> {
        let p = provider();
        let inner = rustls::client::WebPkiServerVerifier::builder_with_provider(
            self.root_store()?,
            p.clone(),
        )
        .build()
        .map_err(|e| TlsError::Config(e.to_string()))?;
        let mut cfg = rustls::ClientConfig::builder_with_provider(p)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| TlsError::Config(e.to_string()))?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(MeshServerVerifier { inner }))
            .with_client_auth_cert(self.chain.clone(), self.key.clone_key())
            .map_err(|e| TlsError::Config(e.to_string()))?;
        cfg.alpn_protocols = vec![ALPN.to_vec()];
        let quic = quinn::crypto::rustls::QuicClientConfig::try_from(cfg)
            .map_err(|e| TlsError::Config(e.to_string()))?;
        let mut client = quinn::ClientConfig::new(Arc::new(quic));
        client.transport_config(transport);
        Ok(client)
    }
}

/// The ring provider; the only one this crate links.
pub(crate) fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The node id a certificate names: its first DNS SAN.
pub fn cert_node_id(cert: &CertificateDer<'_>) -> Option<String> {
    let ee = webpki::EndEntityCert::try_from(cert).ok()?;
    ee.valid_dns_names().next().map(str::to_string)
}

/// The authenticated node id of a connected peer.
pub(crate) fn peer_node_id(conn: &quinn::Connection) -> Option<String> {
    let any = conn.peer_identity()?;
    let certs = any.downcast::<Vec<CertificateDer<'static>>>().ok()?;
    certs.first().and_then(cert_node_id)
}

/// Checks that `leaf_pem` chains to `ca_pem` and names `node_id`.
pub(crate) fn check_chain(ca_pem: &str, leaf_pem: &str, node_id: &str) -> Result<(), TlsError> {
    let mut store = RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        let c = c.map_err(|e| TlsError::Parse(PathBuf::from("ca.pem"), e.to_string()))?;
        store.add(c).map_err(|e| TlsError::Chain(e.to_string()))?;
    }
    let leaf = CertificateDer::from_pem_slice(leaf_pem.as_bytes())
        .map_err(|e| TlsError::Parse(PathBuf::from("leaf"), e.to_string()))?;
    let verifier =
        rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(store), provider())
            .build()
            .map_err(|e| TlsError::Config(e.to_string()))?;
    let name =
        ServerName::try_from(node_id.to_string()).map_err(|e| TlsError::Config(e.to_string()))?;
    verifier
        .verify_server_cert(&leaf, &[], &name, &[], UnixTime::now())
        .map(|_| ())
        .map_err(|e| TlsError::Chain(format!("{e} (was ca.pem made by another tool?)")))
}

/// Verifies server certificates against the cluster CA. For [`SEED_SERVER_NAME`] the name
/// check is made against the certificate's own DNS name (the chain is still verified);
/// for any other name rustls' normal name check applies.
#[derive(Debug)]
struct MeshServerVerifier {
    inner: Arc<rustls::client::WebPkiServerVerifier>,
}

impl ServerCertVerifier for MeshServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let seed = matches!(server_name, ServerName::DnsName(n) if n.as_ref() == SEED_SERVER_NAME);
        if seed {
            let own = cert_node_id(end_entity)
                .and_then(|n| ServerName::try_from(n).ok())
                .ok_or(rustls::Error::InvalidCertificate(
                    rustls::CertificateError::BadEncoding,
                ))?;
            self.inner
                .verify_server_cert(end_entity, intermediates, &own, ocsp, now)
        } else {
            self.inner
                .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// QUIC transport settings shared by both roles.
pub(crate) fn transport_config(
    idle: Duration,
    keep_alive: Duration,
    initial_rtt: Duration,
) -> Arc<quinn::TransportConfig> {
    let mut t = quinn::TransportConfig::default();
    // RTT assumed before the first sample: sets the handshake's retransmission timer.
    t.initial_rtt(initial_rtt);
    // Gossip talks to a given peer only every few rounds: keep the connection warm.
    t.keep_alive_interval(Some(keep_alive));
    if let Ok(idle) = quinn::IdleTimeout::try_from(idle) {
        t.max_idle_timeout(Some(idle));
    }
    Arc::new(t)
}
