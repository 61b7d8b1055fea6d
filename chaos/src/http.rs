//! Small bounded HTTP helpers for the harness's own calls: debug views, metrics,
//! fault injection. Every call has a timeout and a body cap, and returns a message
//! instead of panicking.

use std::time::Duration;

use bytes::Bytes;
use headroom_bench::live::client::HttpClient;
use http::{Method, Request, Uri, header};
use http_body_util::{BodyExt, Full, Limited};
use serde_json::Value;

/// Largest body read by these helpers.
const MAX_BODY: usize = 8 << 20;

/// `method url` with an optional JSON body; returns status and body within `timeout`.
pub async fn call(
    client: &HttpClient,
    method: Method,
    url: &str,
    json: Option<&Value>,
    timeout: Duration,
) -> Result<(u16, Bytes), String> {
    call_with_headers(client, method, url, json, timeout)
        .await
        .map(|(status, _, body)| (status, body))
}

/// [`call`], also returning the response headers.
pub async fn call_with_headers(
    client: &HttpClient,
    method: Method,
    url: &str,
    json: Option<&Value>,
    timeout: Duration,
) -> Result<(u16, http::HeaderMap, Bytes), String> {
    let uri: Uri = url.parse().map_err(|_| format!("bad URL {url}"))?;
    let body = match json {
        Some(v) => Bytes::from(v.to_string()),
        None => Bytes::new(),
    };
    let mut req = Request::builder().method(method).uri(uri);
    if json.is_some() {
        req = req.header(header::CONTENT_TYPE, "application/json");
    }
    let req = req
        .body(Full::new(body))
        .map_err(|e| format!("cannot build request to {url}: {e}"))?;
    let run = async {
        let resp = client
            .request(req)
            .await
            .map_err(|e| format!("{url}: {e}"))?;
        let status = resp.status().as_u16();
        let (parts, body) = resp.into_parts();
        let body = Limited::new(body, MAX_BODY)
            .collect()
            .await
            .map_err(|e| format!("{url}: body: {e}"))?
            .to_bytes();
        Ok((status, parts.headers, body))
    };
    tokio::time::timeout(timeout, run)
        .await
        .map_err(|_| format!("{url}: no answer within {timeout:?}"))?
}

/// GET `url` and parse a 2xx JSON answer.
pub async fn get_json(client: &HttpClient, url: &str, timeout: Duration) -> Result<Value, String> {
    let (status, body) = call(client, Method::GET, url, None, timeout).await?;
    if !(200..300).contains(&status) {
        return Err(format!("{url}: HTTP {status}"));
    }
    serde_json::from_slice(&body).map_err(|e| format!("{url}: not JSON: {e}"))
}

/// GET `url` as text (2xx only).
pub async fn get_text(client: &HttpClient, url: &str, timeout: Duration) -> Result<String, String> {
    let (status, body) = call(client, Method::GET, url, None, timeout).await?;
    if !(200..300).contains(&status) {
        return Err(format!("{url}: HTTP {status}"));
    }
    Ok(String::from_utf8_lossy(&body).into_owned())
}

/// POST a JSON body; 2xx or an error naming the status and body.
pub async fn post_json(
    client: &HttpClient,
    url: &str,
    v: &Value,
    timeout: Duration,
) -> Result<Value, String> {
    let (status, body) = call(client, Method::POST, url, Some(v), timeout).await?;
    if !(200..300).contains(&status) {
        return Err(format!(
            "{url}: HTTP {status}: {}",
            String::from_utf8_lossy(&body[..body.len().min(300)])
        ));
    }
    serde_json::from_slice(&body).map_err(|e| format!("{url}: not JSON: {e}"))
}

/// Sum of every sample of counter `name` whose labels contain `label="value"` in a
/// Prometheus text page.
pub fn counter_sum(text: &str, name: &str, label: Option<(&str, &str)>) -> f64 {
    let want = label.map(|(k, v)| format!("{k}=\"{v}\""));
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?;
            if !(rest.starts_with('{') || rest.starts_with(' ')) {
                return None;
            }
            if let Some(w) = &want
                && !rest.contains(w.as_str())
            {
                return None;
            }
            l.rsplit(' ').next()?.parse::<f64>().ok()
        })
        .filter(|v| v.is_finite())
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counter_sum_matches_name_and_label_exactly() {
        let text = "# HELP x\nheadroom_scrape_rejected_values_total{replica=\"r0\"} 4\n\
                    headroom_scrape_rejected_values_total{replica=\"r1\"} 2\n\
                    headroom_scrape_rejected_values_total_other{replica=\"r0\"} 100\n";
        let n = "headroom_scrape_rejected_values_total";
        assert_eq!(counter_sum(text, n, Some(("replica", "r0"))), 4.0);
        assert_eq!(counter_sum(text, n, None), 6.0);
        assert_eq!(counter_sum(text, "missing", None), 0.0);
    }
}
