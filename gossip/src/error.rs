//! Errors of the mesh API.

use crate::tls::TlsError;
use crate::wire::EncodeError;

#[derive(Debug, thiserror::Error)]
pub enum MeshError {
    #[error("invalid mesh configuration: {0}")]
    Config(String),
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("cannot bind the QUIC endpoint on {addr}: {source}")]
    Bind {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid key {0:?}: {1}")]
    BadKey(String, &'static str),
    #[error(transparent)]
    Encode(#[from] EncodeError),
    #[error("values of kind {0} cannot be published cross-region (its policy keeps it regional)")]
    NotGlobal(u8),
    #[error("the cross-region cluster is disabled in this node's configuration")]
    CrossRegionDisabled,
    #[error("datagram of {size} bytes exceeds the {max}-byte limit")]
    DatagramTooLarge { size: usize, max: usize },
    #[error("gossip failed to start: {0}")]
    Start(String),
}
