//! Development certificates: a cluster CA and one leaf per node, written as PEM files.
//!
//! Layout of `dir`: `ca.pem`, `ca.key` (kept so more nodes can be added later), and
//! `<node>.pem` / `<node>.key` per node. Invariants: a node's certificate names the node
//! id as its only DNS SAN and its common name, carries both `serverAuth` and `clientAuth`
//! (every node is client and server), and chains to `ca.pem`. Existing node files are never
//! overwritten. Keys are written with mode 0600.

use std::fs;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};

use crate::tls::{TlsError, validate_node_id};

/// Subject common name of the dev CA. Reused to re-create the issuer from `ca.key`.
const DEV_CA_NAME: &str = "Headroom mesh dev CA";

/// What [`write_dev_certs`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DevCertReport {
    /// Whether a new CA was created (false: the existing `ca.pem`/`ca.key` were reused).
    pub created_ca: bool,
    /// Node ids that got new certificates.
    pub issued: Vec<String>,
    /// Node ids that already had certificates and were left alone.
    pub kept: Vec<String>,
}

fn ca_params() -> CertificateParams {
    let mut p = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, DEV_CA_NAME);
    p.distinguished_name = dn;
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    p
}

fn leaf_params(node_id: &str) -> Result<CertificateParams, TlsError> {
    let mut p = CertificateParams::new(vec![node_id.to_string()])
        .map_err(|e| TlsError::Generate(e.to_string()))?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, node_id);
    p.distinguished_name = dn;
    p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    p.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    p.use_authority_key_identifier_extension = true;
    Ok(p)
}

fn write_file(path: &Path, contents: &str, secret: bool) -> Result<(), TlsError> {
    let io = |e| TlsError::Io(path.to_path_buf(), e);
    fs::write(path, contents).map_err(io)?;
    #[cfg(unix)]
    if secret {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(path, fs::Permissions::from_mode(0o600)).map_err(io)?;
    }
    #[cfg(not(unix))]
    let _ = secret;
    Ok(())
}

/// Writes (or extends) a dev PKI in `dir` for `nodes`.
///
/// If `dir/ca.pem` and `dir/ca.key` exist they are reused, so nodes can be added later
/// with the same CA; otherwise a new CA is created. Node ids must be DNS labels
/// (see [`validate_node_id`]).
pub fn write_dev_certs(dir: &Path, nodes: &[&str]) -> Result<DevCertReport, TlsError> {
    for n in nodes {
        validate_node_id(n)?;
    }
    fs::create_dir_all(dir).map_err(|e| TlsError::Io(dir.to_path_buf(), e))?;
    let ca_pem_path = dir.join("ca.pem");
    let ca_key_path = dir.join("ca.key");
    let mut report = DevCertReport::default();

    let (ca_key, ca_cert_pem) = if ca_pem_path.exists() && ca_key_path.exists() {
        let key_pem = read(&ca_key_path)?;
        let key = KeyPair::from_pem(&key_pem)
            .map_err(|e| TlsError::Parse(ca_key_path.clone(), e.to_string()))?;
        (key, read(&ca_pem_path)?)
    } else if ca_pem_path.exists() || ca_key_path.exists() {
        return Err(TlsError::Incomplete(dir.to_path_buf()));
    } else {
        let key = KeyPair::generate().map_err(|e| TlsError::Generate(e.to_string()))?;
        let cert = ca_params()
            .self_signed(&key)
            .map_err(|e| TlsError::Generate(e.to_string()))?;
        write_file(&ca_key_path, &key.serialize_pem(), true)?;
        write_file(&ca_pem_path, &cert.pem(), false)?;
        report.created_ca = true;
        (key, cert.pem())
    };
    let issuer = Issuer::new(ca_params(), ca_key);

    for node in nodes {
        let (cert_path, key_path) = node_paths(dir, node);
        if cert_path.exists() && key_path.exists() {
            report.kept.push(node.to_string());
            continue;
        }
        let key = KeyPair::generate().map_err(|e| TlsError::Generate(e.to_string()))?;
        let cert = leaf_params(node)?
            .signed_by(&key, &issuer)
            .map_err(|e| TlsError::Generate(e.to_string()))?;
        // A reused CA must really be the issuer we rebuilt from its key, or the leaf is
        // useless: check the chain before writing anything.
        crate::tls::check_chain(&ca_cert_pem, &cert.pem(), node)?;
        write_file(&key_path, &key.serialize_pem(), true)?;
        write_file(&cert_path, &cert.pem(), false)?;
        report.issued.push(node.to_string());
    }
    Ok(report)
}

/// `<dir>/<node>.pem` and `<dir>/<node>.key`.
pub fn node_paths(dir: &Path, node_id: &str) -> (PathBuf, PathBuf) {
    (
        dir.join(format!("{node_id}.pem")),
        dir.join(format!("{node_id}.key")),
    )
}

fn read(path: &Path) -> Result<String, TlsError> {
    fs::read_to_string(path).map_err(|e| TlsError::Io(path.to_path_buf(), e))
}
