//! The fleet view: replicas, what was scraped from them, their health.
//!
//! The request path reads one `ArcSwap` snapshot of the replica list and per-replica
//! `ArcSwap`/atomic cells; background tasks (scrape, probe, models, DNS) write them.

pub mod cells;
pub mod health;
pub mod kv_feed;
pub mod models;
pub mod pacing;
pub mod replica;
pub mod scrape;
pub mod tasks;
pub mod view;

pub use health::{Health, HealthState, Signal};
pub use replica::{ModelEntry, PeerLoad, Replica, ServedModels, key_of};
pub use scrape::{EngineKind, Scraped, parse_metrics};
pub use view::Fleet;

pub use crate::config::url::{parse_base_url, redact_url};

/// `uri` without its userinfo.
pub fn strip_userinfo(uri: &http::Uri) -> http::Uri {
    let Some(auth) = uri.authority() else {
        return uri.clone();
    };
    let Some((_, host)) = auth.as_str().rsplit_once('@') else {
        return uri.clone();
    };
    let mut parts = uri.clone().into_parts();
    match host.parse() {
        Ok(a) => {
            parts.authority = Some(a);
            http::Uri::from_parts(parts).unwrap_or_else(|_| uri.clone())
        }
        Err(_) => uri.clone(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn credentials_are_redacted() {
        assert_eq!(
            super::redact_url("http://user:pa%40ss@10.0.0.1:8000/"),
            "http://10.0.0.1:8000/"
        );
        assert_eq!(super::redact_url("http://h:1"), "http://h:1");
        assert_eq!(super::redact_url("u:p@h:1/x@y"), "h:1/x@y");
        let u: http::Uri = "http://u:p@h:1".parse().unwrap();
        assert_eq!(super::strip_userinfo(&u).to_string(), "http://h:1/");
    }

    #[test]
    fn base_urls() {
        assert!(super::parse_base_url("http://127.0.0.1:8000").is_ok());
        assert!(super::parse_base_url("http://127.0.0.1:8000/").is_ok());
        assert!(super::parse_base_url("127.0.0.1:8000").is_err());
        assert!(super::parse_base_url("ftp://x").is_err());
        assert!(super::parse_base_url("http://x/v1").is_err());
    }
}
