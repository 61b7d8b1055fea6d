//! The URLs a configuration names, checked when it is read: replica base URLs (and
//! their redacted form for messages) and the OTLP traces endpoint.

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

/// `url` without credentials (`http://user:pass@host` → `http://host`): what logs,
/// headers, metrics and debug views may show. Works on strings that are not URLs too.
pub fn redact_url(url: &str) -> String {
    let (scheme, rest) = match url.find("://") {
        Some(i) => (&url[..i + 3], &url[i + 3..]),
        None => ("", url),
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    match rest[..end].rfind('@') {
        Some(at) => format!("{scheme}{}", &rest[at + 1..]),
        None => url.to_string(),
    }
}

/// The OTLP/HTTP traces URL for `endpoint`: `/v1/traces` appended when it has no path.
/// Plain `http` only (the exporter's hyper client has no TLS: run a local collector).
pub fn traces_url(endpoint: &str) -> Result<http::Uri, String> {
    let uri: http::Uri = endpoint
        .trim()
        .parse()
        .map_err(|e| format!("`{endpoint}` is not a URL: {e}"))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some(s) => {
            return Err(format!(
                "`{endpoint}`: scheme `{s}` is not supported (plain http to a collector, e.g. http://127.0.0.1:4318)"
            ));
        }
        None => return Err(format!("`{endpoint}` needs http://HOST:PORT")),
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(format!("`{endpoint}` has no host"));
    }
    if matches!(uri.path(), "" | "/") {
        let base = endpoint.trim().trim_end_matches('/');
        return format!("{base}/v1/traces")
            .parse()
            .map_err(|e| format!("`{endpoint}`: {e}"));
    }
    Ok(uri)
}
