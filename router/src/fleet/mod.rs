//! The fleet view: replicas, what was scraped from them, their health.
//!
//! The request path reads one `ArcSwap` snapshot of the replica list and per-replica
//! `ArcSwap`/atomic cells; background tasks (scrape, probe, models, DNS) write them.

pub mod health;
pub mod replica;
pub mod scrape;
pub mod tasks;
pub mod view;

pub use health::{Health, HealthState, Signal};
pub use replica::{ModelEntry, PeerLoad, Replica, ServedModels, key_of};
pub use scrape::{EngineKind, Scraped, parse_metrics};
pub use view::Fleet;

/// Validates a replica base URL (`http://host:port`, no path beyond `/`).
pub fn parse_base_url(url: &str) -> Result<http::Uri, String> {
    let uri: http::Uri = url.parse().map_err(|e| format!("not a URL: {e}"))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some(s) => return Err(format!("unsupported scheme `{s}` (http only)")),
        None => return Err("missing scheme (expected http://host:port)".into()),
    }
    if uri.authority().is_none() {
        return Err("missing host".into());
    }
    if !matches!(uri.path(), "" | "/") {
        return Err("replica URL must not have a path".into());
    }
    Ok(uri)
}

#[cfg(test)]
mod tests {
    #[test]
    fn base_urls() {
        assert!(super::parse_base_url("http://127.0.0.1:8000").is_ok());
        assert!(super::parse_base_url("http://127.0.0.1:8000/").is_ok());
        assert!(super::parse_base_url("127.0.0.1:8000").is_err());
        assert!(super::parse_base_url("ftp://x").is_err());
        assert!(super::parse_base_url("http://x/v1").is_err());
    }
}
