//! vLLM's `GET /kv_event_sources`: the publisher config per data-parallel rank,
//! `{"0": {"endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558",
//! "topic": "kv-events", ...}}`. A wildcard host means the engine bound every
//! interface, so a subscriber connects to the host it reached the API server on.

/// One rank's publisher, with addresses a subscriber can connect to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventSource {
    pub rank: u32,
    pub endpoint: String,
    pub replay_endpoint: Option<String>,
    pub topic: String,
}

/// Why a `/kv_event_sources` body was not understood.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum DiscoveryError {
    #[error("not JSON: {0}")]
    Json(String),
    #[error("bad source: {0}")]
    Shape(String),
}

/// `tcp://*:P` / `tcp://0.0.0.0:P` / `tcp://[::]:P` → `tcp://HOST:P`; others as is.
pub fn connectable(endpoint: &str, host: &str) -> String {
    for wild in ["tcp://*:", "tcp://0.0.0.0:", "tcp://[::]:", "tcp://:::"] {
        if let Some(port) = endpoint.strip_prefix(wild) {
            let host = if host.contains(':') && !host.starts_with('[') {
                format!("[{host}]")
            } else {
                host.to_string()
            };
            return format!("tcp://{host}:{port}");
        }
    }
    endpoint.to_string()
}

/// Parses the body; `host` replaces wildcard hosts. Disabled publishers
/// (`enable_kv_cache_events: false` or publisher not `zmq`) are left out.
pub fn parse_sources(body: &str, host: &str) -> Result<Vec<EventSource>, DiscoveryError> {
    let v: serde_json::Value =
        serde_json::from_str(body).map_err(|e| DiscoveryError::Json(e.to_string()))?;
    let obj = v
        .as_object()
        .ok_or_else(|| DiscoveryError::Shape("not an object".into()))?;
    let mut out = Vec::new();
    for (rank, cfg) in obj {
        let rank: u32 = rank
            .parse()
            .map_err(|_| DiscoveryError::Shape(format!("rank {rank:?}")))?;
        let enabled = cfg
            .get("enable_kv_cache_events")
            .and_then(|b| b.as_bool())
            .unwrap_or(true);
        if !enabled || cfg.get("publisher").and_then(|p| p.as_str()) != Some("zmq") {
            continue;
        }
        let endpoint = cfg
            .get("endpoint")
            .and_then(|e| e.as_str())
            .ok_or_else(|| DiscoveryError::Shape(format!("rank {rank}: no endpoint")))?;
        out.push(EventSource {
            rank,
            endpoint: connectable(endpoint, host),
            replay_endpoint: cfg
                .get("replay_endpoint")
                .and_then(|e| e.as_str())
                .map(|e| connectable(e, host)),
            topic: cfg
                .get("topic")
                .and_then(|t| t.as_str())
                .unwrap_or("")
                .to_string(),
        });
    }
    out.sort_by_key(|s| s.rank);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_vllm_sources_and_resolves_wildcards() {
        let body = r#"{"0": {"enable_kv_cache_events": true, "publisher": "zmq",
            "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558",
            "buffer_steps": 10000, "hwm": 100000, "max_queue_size": 100000,
            "topic": "kv-events"}}"#;
        let s = parse_sources(body, "10.1.2.3").expect("parses");
        assert_eq!(
            s,
            vec![EventSource {
                rank: 0,
                endpoint: "tcp://10.1.2.3:5557".into(),
                replay_endpoint: Some("tcp://10.1.2.3:5558".into()),
                topic: "kv-events".into(),
            }]
        );
        assert_eq!(parse_sources("{}", "h"), Ok(vec![]));
        assert!(parse_sources("[1]", "h").is_err());
        assert!(parse_sources("{\"x\": {}}", "h").is_err());
        assert_eq!(connectable("tcp://*:1", "::1"), "tcp://[::1]:1");
        assert_eq!(connectable("tcp://h:1", "x"), "tcp://h:1");
    }
}
