//! Seed discovery: `host:port` strings, hostnames re-resolved periodically so that N
//! routers behind one DNS name find each other as the name's address set changes.
//!
//! IP-literal seeds go to chitchat as-is. Hostname seeds are resolved at start (the result
//! seeds chitchat) and then every `dns_refresh_interval`; each resolved address that is not
//! a live member is sent a gossip round directly, which introduces the two nodes.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tracing::warn;

/// Resolves a `host:port` seed to addresses.
#[async_trait]
pub trait SeedResolver: Send + Sync + 'static {
    async fn resolve(&self, host_port: &str) -> std::io::Result<Vec<SocketAddr>>;
}

/// The system resolver (`tokio::net::lookup_host`).
#[derive(Debug, Default, Clone, Copy)]
pub struct DnsResolver;

#[async_trait]
impl SeedResolver for DnsResolver {
    async fn resolve(&self, host_port: &str) -> std::io::Result<Vec<SocketAddr>> {
        Ok(tokio::net::lookup_host(host_port).await?.collect())
    }
}

/// Seeds split into literal addresses and names to resolve.
#[derive(Debug, Clone, Default)]
pub(crate) struct Seeds {
    pub literal: Vec<SocketAddr>,
    pub names: Vec<String>,
}

impl Seeds {
    pub fn parse(seeds: &[String]) -> Self {
        let mut s = Self::default();
        for seed in seeds {
            match seed.parse::<SocketAddr>() {
                Ok(a) => s.literal.push(a),
                Err(_) => s.names.push(seed.clone()),
            }
        }
        s
    }

    /// Resolves every name once; failures are logged and skipped.
    pub async fn resolve(
        &self,
        resolver: &Arc<dyn SeedResolver>,
        timeout: Duration,
    ) -> HashSet<SocketAddr> {
        let mut out: HashSet<SocketAddr> = self.literal.iter().copied().collect();
        for name in &self.names {
            match tokio::time::timeout(timeout, resolver.resolve(name)).await {
                Ok(Ok(addrs)) => out.extend(addrs),
                Ok(Err(e)) => warn!(seed = %name, error = %e, "seed lookup failed"),
                Err(_) => warn!(seed = %name, "seed lookup timed out"),
            }
        }
        out
    }
}
