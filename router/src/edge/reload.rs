//! Live reload of tenants and API keys on `SIGHUP`.
//!
//! The config file is read and validated again; when it is valid, the tenant table
//! (`[[tenants]]` and `edge.anonymous_tenant`) is swapped whole. Requests already
//! admitted keep the tenant they resolved, so streams are never dropped. Other
//! settings need a restart; a file that fails validation changes nothing and is
//! logged with every problem.

use std::{path::PathBuf, sync::Arc};

use tokio_util::sync::CancellationToken;

use crate::{config::RouterConfig, node::Node};

/// Re-reads `path` and swaps the tenant table; returns the number of API keys now known.
pub fn reload_tenants(node: &Node, path: &std::path::Path) -> Result<usize, String> {
    let cfg = RouterConfig::from_file(path).map_err(|e| e.to_string())?;
    node.tenants
        .reload(&cfg.tenants, cfg.edge.anonymous_tenant.as_deref());
    Ok(node.tenants.key_count())
}

/// Watches `SIGHUP` until `cancel`; without a config file there is nothing to re-read.
pub fn spawn_sighup(node: Arc<Node>, path: Option<PathBuf>, cancel: CancellationToken) {
    tokio::spawn(async move {
        let mut hup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
            Ok(s) => s,
            Err(e) => {
                tracing::error!("cannot watch SIGHUP, tenants will not reload: {e}");
                return;
            }
        };
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                got = hup.recv() => if got.is_none() { return },
            }
            let Some(p) = &path else {
                tracing::warn!("SIGHUP: no --config file to reload tenants from");
                continue;
            };
            match reload_tenants(&node, p) {
                Ok(keys) => tracing::info!(
                    file = %p.display(),
                    keys,
                    "SIGHUP: tenants and API keys reloaded (other settings need a restart)"
                ),
                Err(e) => tracing::error!("SIGHUP: reload refused, nothing changed: {e}"),
            }
        }
    });
}
