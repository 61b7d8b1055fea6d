//! Live reload of tenants and API keys on `SIGHUP`.
//!
//! The config file is read and validated again; when it is valid, the tenant table
//! (`[[tenants]]` and `edge.anonymous_tenant`) is swapped whole. Requests already
//! admitted keep the tenant they resolved, so streams are never dropped. Other
//! settings need a restart; a file that fails validation changes nothing and is
//! logged with every problem.

use std::path::PathBuf;

use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio_util::sync::CancellationToken;

use crate::config::RouterConfig;

/// Takes `SIGHUP` over from its default (which ends the process) before the node is
/// built: one that arrives meanwhile is acted on once [`spawn_sighup`] runs.
pub fn watch_sighup() -> Option<Signal> {
    match signal(SignalKind::hangup()) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::error!("cannot watch SIGHUP, tenants will not reload: {e}");
            None
        }
    }
}

/// On each `SIGHUP` (from [`watch_sighup`]) until `cancel`, re-reads the config file at
/// `path` and, when it is valid, hands it to `reload` (the tenant table's swap, which
/// returns the number of API keys now known); without a config file there is nothing
/// to re-read.
pub fn spawn_sighup(
    hup: Option<Signal>,
    path: Option<PathBuf>,
    cancel: CancellationToken,
    reload: impl Fn(&RouterConfig) -> usize + Send + 'static,
) {
    let Some(mut hup) = hup else { return };
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                got = hup.recv() => if got.is_none() { return },
            }
            let Some(p) = &path else {
                tracing::warn!("SIGHUP: no --config file to reload tenants from");
                continue;
            };
            match RouterConfig::from_file(p).map(|cfg| reload(&cfg)) {
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
