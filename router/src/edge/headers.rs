//! The client headers a replica may see.
//!
//! Hop-by-hop headers (RFC 9110 §7.6.1: `Connection` and every header it names,
//! `Keep-Alive`, `Proxy-*`, `TE`, `Trailer`, `Transfer-Encoding`, `Upgrade`) describe
//! the client's connection, not the request, and are dropped. `Host`,
//! `Content-Length` and `Content-Type` are dropped too: the proxy sets its own (the
//! body may have been spliced), so each goes upstream exactly once.
//! `X-Forwarded-For` gets the client's address appended (one header, comma-joined).

use std::net::IpAddr;

use http::{HeaderMap, HeaderName, HeaderValue, header};

const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "http2-settings",
];

/// Headers the proxy always writes itself.
const REWRITTEN: [HeaderName; 3] = [header::HOST, header::CONTENT_LENGTH, header::CONTENT_TYPE];

static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// `client` headers cleaned for the upstream request, with `peer` appended to
/// `X-Forwarded-For` when known.
pub fn upstream_headers(client: &HeaderMap, peer: Option<IpAddr>) -> HeaderMap {
    // Names listed in `Connection` are hop-by-hop for this message.
    let named: Vec<String> = client
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| t.trim().to_ascii_lowercase())
        .filter(|t| !t.is_empty())
        .collect();
    let mut out = HeaderMap::with_capacity(client.len() + 1);
    let mut forwarded: Vec<&str> = Vec::new();
    for (k, v) in client {
        let name = k.as_str();
        if HOP_BY_HOP.contains(&name)
            || name.starts_with("proxy-")
            || REWRITTEN.contains(k)
            || named.iter().any(|n| n == name)
        {
            continue;
        }
        if *k == X_FORWARDED_FOR {
            if let Ok(s) = v.to_str() {
                forwarded.push(s.trim());
            }
            continue;
        }
        out.append(k.clone(), v.clone());
    }
    let peer = peer.map(|p| match p {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(p, IpAddr::V4),
        v4 => v4,
    });
    // Written into one buffer: this runs on every request.
    let mut chain = String::new();
    for s in forwarded.into_iter().filter(|s| !s.is_empty()) {
        if !chain.is_empty() {
            chain.push_str(", ");
        }
        chain.push_str(s);
    }
    if let Some(p) = peer {
        use std::fmt::Write;
        if !chain.is_empty() {
            chain.push_str(", ");
        }
        // Writing to a String cannot fail.
        let _ = write!(chain, "{p}");
    }
    if !chain.is_empty()
        && let Ok(v) = HeaderValue::try_from(chain)
    {
        out.insert(X_FORWARDED_FOR.clone(), v);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_and_rewritten_headers_are_dropped() {
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("connection", "keep-alive, x-secret-hop"),
            ("keep-alive", "timeout=5"),
            ("proxy-authorization", "Basic Zm9v"),
            ("te", "trailers"),
            ("trailer", "x-foo"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "h2c"),
            ("x-secret-hop", "1"),
            ("content-type", "application/json"),
            ("content-length", "12"),
            ("host", "router"),
            ("authorization", "Bearer k"),
            ("x-request-id", "r1"),
            ("x-forwarded-for", "10.1.1.1"),
        ] {
            h.append(k, v.parse().unwrap());
        }
        h.append("x-forwarded-for", "10.2.2.2".parse().unwrap());
        let out = upstream_headers(&h, Some("127.0.0.9".parse().unwrap()));
        let names: Vec<&str> = out.keys().map(|k| k.as_str()).collect();
        assert_eq!(
            names,
            ["authorization", "x-request-id", "x-forwarded-for"],
            "{out:?}"
        );
        assert_eq!(out["x-forwarded-for"], "10.1.1.1, 10.2.2.2, 127.0.0.9");
        // A v4-mapped v6 peer is written as v4; no prior header → just the peer.
        let out = upstream_headers(&HeaderMap::new(), Some("::ffff:10.0.0.7".parse().unwrap()));
        assert_eq!(out["x-forwarded-for"], "10.0.0.7");
    }
}
