//! Property-based fuzzing of every parser that reads bytes from outside (issue 15):
//! the request body parser, the SSE observer, the Prometheus parser, the gossip value
//! decoder and the config loader. None may panic on any input, and each keeps its
//! contract on well-formed input (bodies forwarded byte for byte, SSE output the same
//! however the stream is cut, sane scraped values, codec round trips, validated
//! configs that never panic the request path).
//!
//! Short by default (part of `cargo test`); `HEADROOM_FUZZ_CASES=100000 cargo test -p
//! headroom --test fuzz --release` runs long. Inputs under `tests/fuzz_corpus/` (the
//! checked-in corpus: past crashes and interesting shapes) run every time.

// Test code may unwrap: a panic is its failure report (the workspace denies it elsewhere).
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use bytes::Bytes;
use headroom::mesh::schema::{self, InflightVector, NodeInfo, ReplicaLoad, WireValue};
use headroom::{
    config::RouterConfig,
    fleet::parse_metrics,
    proxy::sse::SseScanner,
    request::{self, Endpoint, InjectedUsage},
};
use headroom_gossip::wire;
use proptest::prelude::*;
use serde_json::{Value, json};

fn cases() -> u32 {
    std::env::var("HEADROOM_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: cases(),
        // Shrinking a failure is worth more than its time cost; keep it bounded.
        max_shrink_iters: 2_048,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

fn corpus(kind: &str) -> Vec<Vec<u8>> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fuzz_corpus")
        .join(kind);
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(&dir) {
        let mut paths: Vec<_> = rd.filter_map(|e| e.ok().map(|e| e.path())).collect();
        paths.sort();
        for p in paths {
            out.push(std::fs::read(&p).unwrap());
        }
    }
    assert!(!out.is_empty(), "no corpus in {}", dir.display());
    out
}

// ---------- request bodies ----------

/// JSON values of bounded depth with awkward numbers and strings.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<u64>().prop_map(|n| json!(n)),
        (-1e300f64..1e300).prop_map(|f| json!(f)),
        ".{0,24}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[a-z_]{1,8}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Request bodies: a plausible request with random extra members and random types
/// for the members the router reads.
fn request_body() -> impl Strategy<Value = Vec<u8>> {
    (
        prop_oneof![Just(json!("m")), json_value()],
        prop_oneof![Just(json!("hello")), json_value()],
        prop_oneof![Just(Value::Null), json_value(), Just(json!(true))],
        prop_oneof![
            Just(Value::Null),
            json_value(),
            (0u64..100_000).prop_map(|n| json!(n))
        ],
        prop_oneof![Just(Value::Null), json_value()],
        prop::collection::btree_map("[a-z_]{1,10}", json_value(), 0..4),
        any::<bool>(),
    )
        .prop_map(|(model, prompt, stream, max_tokens, opts, extra, chat)| {
            let mut m = serde_json::Map::new();
            m.insert("model".into(), model);
            if chat {
                m.insert(
                    "messages".into(),
                    json!([{"role": "user", "content": prompt}]),
                );
            } else {
                m.insert("prompt".into(), prompt);
            }
            for (k, v) in [
                ("stream", stream),
                ("max_tokens", max_tokens),
                ("stream_options", opts),
            ] {
                if !v.is_null() {
                    m.insert(k.into(), v);
                }
            }
            for (k, v) in extra {
                m.entry(k).or_insert(v);
            }
            serde_json::to_vec(&Value::Object(m)).unwrap()
        })
}

fn check_request(body: &[u8]) {
    for endpoint in [Endpoint::Completions, Endpoint::ChatCompletions] {
        for chunk_usage in [false, true] {
            let b = Bytes::copy_from_slice(body);
            let Ok(p) = request::parse(endpoint, &b, chunk_usage) else {
                continue;
            };
            if !p.injected.any() {
                assert_eq!(p.upstream_body, b, "a body the router did not edit changed");
            } else {
                // Spliced: still JSON, and every member the client sent is unchanged.
                let Ok(sent) = serde_json::from_slice::<Value>(body) else {
                    // Valid JSON that `Value` refuses (a number past f64, e.g. -1e309,
                    // which Python's json reads as -inf) passes through untouched: the
                    // spliced body still reads as the same request.
                    let again = request::parse(endpoint, &p.upstream_body, chunk_usage)
                        .expect("the spliced body is the same request");
                    assert_eq!(
                        (&again.model, again.max_tokens, again.stream, again.messages),
                        (&p.model, p.max_tokens, p.stream, p.messages)
                    );
                    continue;
                };
                let up: Value =
                    serde_json::from_slice(&p.upstream_body).expect("the spliced body is not JSON");
                for (k, v) in sent.as_object().unwrap() {
                    if k != "stream_options" {
                        assert_eq!(&up[k], v, "member `{k}` changed");
                    }
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn request_parser_never_panics_on_bytes(body in prop::collection::vec(any::<u8>(), 0..512)) {
        check_request(&body);
    }

    #[test]
    fn request_parser_keeps_its_contract(body in request_body()) {
        check_request(&body);
    }

    #[test]
    fn request_parser_survives_mutations(body in request_body(), at in any::<prop::sample::Index>(), b in any::<u8>()) {
        let mut body = body;
        let i = at.index(body.len().max(1)).min(body.len().saturating_sub(1));
        if !body.is_empty() {
            body[i] = b;
        }
        check_request(&body);
    }
}

#[test]
fn request_corpus() {
    for body in corpus("request") {
        check_request(&body);
    }
}

// ---------- SSE ----------

fn sse_stream() -> impl Strategy<Value = Vec<u8>> {
    let event = prop_oneof![
        (0u32..5, any::<bool>()).prop_map(|(n, null_usage)| {
            let usage = if null_usage { ",\"usage\":null" } else { "" };
            format!("data: {{\"id\":\"x\",\"choices\":[{{\"index\":0,\"text\":\"t{n} \\\"usage\\\":null\"}}]{usage}}}\n\n")
        }),
        (0u32..50, 0u32..50).prop_map(|(p, c)| format!(
            "data: {{\"id\":\"x\",\"choices\":[{{\"index\":0,\"text\":\"a\"}}],\"usage\":{{\"prompt_tokens\":{p},\"completion_tokens\":{c}}}}}\n\n"
        )),
        (0u32..50).prop_map(|c| format!(
            "data: {{\"id\":\"x\",\"choices\":[],\"usage\":{{\"prompt_tokens\":3,\"completion_tokens\":{c}}}}}\n\n"
        )),
        Just(": keep-alive\n\n".to_string()),
        Just("data: {\"error\":{\"message\":\"boom\"}}\n\n".to_string()),
        Just("data: [DONE]\n\n".to_string()),
        Just("data: {\"id\":\"x\",\"choices\":[{\"delta\":{\"content\":\"\\u00e9\"}}]}\r\n\r\n".to_string()),
        ".{0,40}".prop_map(|s| format!("data: {s}\n\n")),
    ];
    prop::collection::vec(event, 0..12).prop_map(|v| v.concat().into_bytes())
}

/// Feeds `stream` cut at `cuts`; returns everything passed on.
fn scan(stream: &[u8], cuts: &[usize], strip: InjectedUsage) -> (Vec<u8>, u32) {
    let mut s = SseScanner::new(strip);
    let mut out = Vec::new();
    let mut at = 0;
    let t0 = Instant::now();
    let mut points: Vec<usize> = cuts.iter().map(|c| c % (stream.len() + 1)).collect();
    points.sort_unstable();
    points.push(stream.len());
    for (i, p) in points.into_iter().enumerate() {
        if p < at {
            continue;
        }
        let chunk = Bytes::copy_from_slice(&stream[at..p]);
        out.extend_from_slice(&s.feed(&chunk, t0 + Duration::from_millis(i as u64)));
        at = p;
    }
    out.extend_from_slice(&s.leftover());
    let _ = (s.client_tpot_s(), s.tpot_label_s());
    (out, s.tokens)
}

const STRIPS: [InjectedUsage; 4] = [
    InjectedUsage {
        final_chunk: false,
        per_chunk: false,
    },
    InjectedUsage {
        final_chunk: true,
        per_chunk: false,
    },
    InjectedUsage {
        final_chunk: false,
        per_chunk: true,
    },
    InjectedUsage {
        final_chunk: true,
        per_chunk: true,
    },
];

proptest! {
    #![proptest_config(config())]

    #[test]
    fn sse_output_does_not_depend_on_how_the_stream_is_cut(
        stream in sse_stream(),
        cuts in prop::collection::vec(any::<usize>(), 0..8),
    ) {
        for strip in STRIPS {
            let (whole, tokens) = scan(&stream, &[], strip);
            let (cut, cut_tokens) = scan(&stream, &cuts, strip);
            prop_assert_eq!(&whole, &cut);
            prop_assert_eq!(tokens, cut_tokens);
            if !strip.any() {
                prop_assert_eq!(&whole, &stream, "an unedited stream changed");
            }
        }
    }

    #[test]
    fn sse_observer_never_panics_on_bytes(
        stream in prop::collection::vec(any::<u8>(), 0..512),
        cuts in prop::collection::vec(any::<usize>(), 0..8),
    ) {
        for strip in STRIPS {
            let (out, _) = scan(&stream, &cuts, strip);
            if !strip.any() {
                prop_assert_eq!(&out, &stream);
            }
        }
    }
}

#[test]
fn sse_corpus() {
    for stream in corpus("sse") {
        for strip in STRIPS {
            let (whole, _) = scan(&stream, &[], strip);
            let cuts: Vec<usize> = (0..stream.len()).step_by(7).collect();
            assert_eq!(whole, scan(&stream, &cuts, strip).0);
        }
    }
}

// ---------- Prometheus ----------

fn metrics_text() -> impl Strategy<Value = String> {
    let name = prop_oneof![
        Just("vllm:num_requests_running"),
        Just("vllm:num_requests_waiting"),
        Just("vllm:kv_cache_usage_perc"),
        Just("vllm:gpu_cache_usage_perc"),
        Just("vllm:cache_config_info"),
        Just("vllm:prefix_cache_hits_total"),
        Just("vllm:prefix_cache_queries_total"),
        Just("vllm:num_preemptions_total"),
        Just("sglang:num_running_reqs"),
        Just("sglang:num_queue_reqs"),
        Just("sglang:token_usage"),
        Just("other_metric"),
    ];
    let value = prop_oneof![
        Just("NaN".to_string()),
        Just("+Inf".to_string()),
        Just("-Inf".to_string()),
        Just("-1".to_string()),
        Just("1e308".to_string()),
        Just("abc".to_string()),
        any::<f64>().prop_map(|f| f.to_string()),
        (0u32..1000).prop_map(|n| n.to_string()),
    ];
    let labels = prop_oneof![
        Just(String::new()),
        Just("{engine=\"0\"}".to_string()),
        Just("{block_size=\"16\",num_gpu_blocks=\"1000\"}".to_string()),
        Just("{block_size=\"x\",num_gpu_blocks=\"-5\"}".to_string()),
        Just("{a=\"\\\"}\"}".to_string()),
        Just("{unterminated=\"".to_string()),
        "\\{.{0,20}".prop_map(|s| s),
    ];
    let line = prop_oneof![
        (name, labels, value, prop::option::of(any::<i64>())).prop_map(|(n, l, v, ts)| match ts {
            Some(t) => format!("{n}{l} {v} {t}"),
            None => format!("{n}{l} {v}"),
        }),
        Just("# HELP vllm:num_requests_running Number".to_string()),
        Just("# TYPE vllm:num_requests_running gauge".to_string()),
        ".{0,40}",
    ];
    prop::collection::vec(line, 0..16).prop_map(|v| v.join("\n"))
}

fn check_metrics(text: &str) {
    let prev = parse_metrics("vllm:num_preemptions_total 5\n", None, 0.0).ok();
    for p in [None, prev.as_ref()] {
        if let Ok(s) = parse_metrics(text, p, 1.0) {
            for v in [
                s.running,
                s.waiting,
                s.prefix_hits,
                s.prefix_queries,
                s.preemptions,
            ] {
                assert!(v.is_finite() && v >= 0.0, "scraped value {v} from {text:?}");
            }
            assert!(s.preemption_rate.is_finite() && s.preemption_rate >= 0.0);
            if let Some(k) = s.kv_usage {
                assert!((0.0..=1.0).contains(&k), "kv_usage {k}");
            }
            let _ = s.kv_capacity_tokens();
        }
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn prometheus_parser_yields_only_sane_values(text in metrics_text()) {
        check_metrics(&text);
    }

    #[test]
    fn prometheus_parser_never_panics_on_bytes(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        check_metrics(&String::from_utf8_lossy(&bytes));
    }
}

#[test]
fn prometheus_corpus() {
    for text in corpus("prometheus") {
        check_metrics(&String::from_utf8_lossy(&text));
    }
}

// ---------- gossip values ----------

fn wire_value() -> impl Strategy<Value = WireValue> {
    let load = (any::<u64>(), any::<u32>(), any::<u32>(), 0f32..1e6).prop_map(|(k, r, q, t)| {
        ReplicaLoad {
            replica: k,
            requests: r,
            queued_prefill_tokens: q,
            decoding_requests: r / 2,
            decode_context_tokens: q / 2,
            prefill_inflow_tps: t,
            queued_requests: r / 3,
            queued_attention_pairs: t,
            decode_remaining_tokens: q / 3,
            min_tpot_slo_ms: 0.0,
        }
    });
    prop_oneof![
        ("[a-z]{1,12}", "[0-9.:]{1,21}", any::<u64>(), "[0-9.]{1,8}").prop_map(|(r, h, s, v)| {
            WireValue::NodeInfo(NodeInfo {
                region: r,
                http_addr: h,
                started_at_ms: s,
                version: v,
            })
        }),
        (
            any::<u64>(),
            any::<u64>(),
            prop::collection::vec(load, 0..24)
        )
            .prop_map(|(seq, at, loads)| {
                WireValue::Inflight(InflightVector {
                    seq,
                    at_ms: at,
                    loads,
                })
            }),
    ]
}

const CAP: usize = 32 * 1024;

/// A received chitchat value or datagram as the router reads it: the frame, then the
/// schema.
fn receive(bytes: &[u8]) {
    if let Ok(d) = wire::decode(bytes::Bytes::copy_from_slice(bytes), CAP) {
        let _ = schema::decode(&d.value);
    }
    if let Ok(d) = wire::decode_text(&String::from_utf8_lossy(bytes), CAP) {
        let _ = schema::decode(&d.value);
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn gossip_decoder_never_panics_on_bytes(bytes in prop::collection::vec(any::<u8>(), 0..1024)) {
        receive(&bytes);
    }

    #[test]
    fn gossip_values_round_trip_and_survive_bit_flips(
        v in wire_value(),
        at in any::<u64>(),
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
    ) {
        let Ok(m) = schema::encode(&v) else { return Ok(()); };
        let Ok(bytes) = wire::encode(&m, at, CAP) else { return Ok(()); };
        // Values that validate come back equal.
        if v.validate().is_ok() {
            let d = wire::decode(bytes::Bytes::from(bytes.clone()), CAP).unwrap();
            prop_assert_eq!(d.published_at_ms, at);
            prop_assert_eq!(&schema::decode(&d.value).unwrap(), &v);
        }
        let mut bad = bytes.clone();
        for (i, b) in flips {
            let i = i.index(bad.len());
            bad[i] ^= b;
        }
        receive(&bad);
        receive(&bad[..bad.len() / 2]);
    }
}

#[test]
fn gossip_corpus() {
    for bytes in corpus("gossip") {
        receive(&bytes);
    }
}

// ---------- config ----------

/// The numbers a config file may hold, as TOML text.
fn toml_number() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("nan".to_string()),
        Just("inf".to_string()),
        Just("-inf".to_string()),
        Just("0".to_string()),
        Just("-1".to_string()),
        Just("18446744073709551615".to_string()),
        Just("9223372036854775807".to_string()),
        (-10.0f64..10.0).prop_map(|f| format!("{f:?}")),
        (0u64..100_000).prop_map(|n| n.to_string()),
    ]
}

const NUMERIC_FIELDS: &[(&str, &str)] = &[
    ("slo", "near_equal"),
    ("slo", "cost_tolerance"),
    ("slo", "hysteresis"),
    ("slo", "cache_weight"),
    ("slo", "explore"),
    ("slo", "min_warm_fraction"),
    ("slo", "defer_poll_ms"),
    ("slo", "defer_budget"),
    ("slo", "max_deferred"),
    ("slo", "probe_idle_s"),
    ("slo", "hold"),
    ("slo", "pack_share"),
    ("slo", "pack_ratio"),
    ("proxy", "max_body_bytes"),
    ("proxy", "retries"),
    ("proxy", "connect_timeout_ms"),
    ("proxy", "first_byte_timeout_ms"),
    ("proxy", "idle_timeout_ms"),
    ("proxy", "retry_backoff_ms"),
    ("scrape", "interval_ms"),
    ("scrape", "max_duty"),
    ("scrape", "timeout_ms"),
    ("scrape", "stale_after_ms"),
    ("health", "probe_interval_ms"),
    ("health", "eject_after_failures"),
    ("health", "backoff_initial_ms"),
    ("health", "backoff_max_ms"),
    ("prefix", "block_tokens"),
    ("prefix", "max_entries"),
    ("prefix_affinity", "peak_prefill_tps"),
    ("prefix_affinity", "affinity_threshold"),
    ("edge", "header_read_timeout_ms"),
    ("edge", "body_read_timeout_ms"),
    ("edge", "max_connections"),
    ("edge", "max_header_bytes"),
    ("mesh", "heartbeat_ms"),
    ("mesh", "scrape_owners"),
    ("mesh", "scrape_publish_ms"),
];

/// What the request path computes from a config: none of it may panic once the
/// config validated.
fn exercise(cfg: &RouterConfig) {
    for ttft_ms in [1.0, 2_000.0, 3_600_000.0] {
        let _ = Duration::from_secs_f64(ttft_ms * cfg.slo.defer_budget / 1e3);
    }
    let base = cfg.proxy.retry_backoff_ms.max(1);
    let _ = base..=base * 3;
    let now = Instant::now();
    for d in [
        cfg.proxy.first_byte_timeout(),
        cfg.proxy.idle_timeout(),
        cfg.proxy.connect_timeout(),
        cfg.edge.header_read_timeout(),
        cfg.edge.body_read_timeout(),
        Duration::from_millis(cfg.slo.defer_poll_ms),
        Duration::from_millis(cfg.health.backoff_max_ms),
    ] {
        assert!(now.checked_add(d).is_some());
    }
    let _ = Duration::from_secs_f64(cfg.slo.probe_idle_s);
    let mut pacer = headroom::fleet::pacing::ScrapePacer::new(&cfg.scrape);
    for wall in [
        Duration::ZERO,
        Duration::from_millis(6),
        Duration::from_secs(3_600),
    ] {
        pacer.observe(wall);
        assert!(now.checked_add(pacer.next_wait()).is_some());
    }
    assert!(cfg.slo.explore.is_finite() && (0.0..=1.0).contains(&cfg.slo.explore));
}

fn check_config(text: &str) {
    if let Ok(cfg) = toml::from_str::<RouterConfig>(text)
        && cfg.validate().is_ok()
    {
        exercise(&cfg);
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn config_loader_accepts_only_usable_numbers(
        edits in prop::collection::vec((prop::sample::select(NUMERIC_FIELDS), toml_number()), 1..6),
    ) {
        let mut by_table: std::collections::BTreeMap<&str, std::collections::BTreeMap<&str, String>> = Default::default();
        for ((table, field), v) in edits {
            by_table.entry(table).or_default().insert(field, v);
        }
        let mut text = String::from("listen = \"127.0.0.1:0\"\n");
        for (table, fields) in by_table {
            text.push_str(&format!("[{table}]\n"));
            for (f, v) in fields {
                text.push_str(&format!("{f} = {v}\n"));
            }
        }
        check_config(&text);
    }

    #[test]
    fn config_loader_never_panics_on_text(text in ".{0,300}") {
        check_config(&text);
    }
}

#[test]
fn config_corpus() {
    for text in corpus("config") {
        check_config(&String::from_utf8_lossy(&text));
    }
}
