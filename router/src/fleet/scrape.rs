//! Reading a replica's `/metrics`: vLLM and SGLang names into one `Scraped` view.
//!
//! The text parser is our own because vLLM's names contain colons
//! (`vllm:num_requests_running`), which the published Rust parsers reject. It reads the
//! Prometheus text exposition format line by line, never panics on any input, and
//! skips lines it cannot read. Values that make no sense (NaN, negative gauges, KV
//! usage outside 0..1) are dropped and counted, so garbage never reaches a policy.

use std::borrow::Cow;

pub use headroom_core::scraped::{EngineKind, Scraped};

/// One sample line.
#[derive(Debug, PartialEq)]
pub struct Sample<'a> {
    pub name: &'a str,
    pub labels: Vec<(&'a str, Cow<'a, str>)>,
    pub value: f64,
}

impl Sample<'_> {
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v.as_ref())
    }
}

fn is_name_start(c: u8) -> bool {
    c.is_ascii_alphabetic() || c == b'_' || c == b':'
}
fn is_name_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b':'
}

fn parse_value(s: &str) -> Option<f64> {
    match s {
        "NaN" | "nan" => Some(f64::NAN),
        "+Inf" | "Inf" | "inf" | "+inf" => Some(f64::INFINITY),
        "-Inf" | "-inf" => Some(f64::NEG_INFINITY),
        _ => s.parse().ok(),
    }
}

/// Parses the label block after `{`; returns labels and the rest after `}`.
type Labels<'a> = Vec<(&'a str, Cow<'a, str>)>;

fn parse_labels(mut s: &str) -> Option<(Labels<'_>, &str)> {
    let mut out = Vec::new();
    loop {
        s = s.trim_start_matches([' ', ',']);
        if let Some(rest) = s.strip_prefix('}') {
            return Some((out, rest));
        }
        let eq = s.find('=')?;
        let key = s[..eq].trim();
        if key.is_empty() || !key.bytes().all(is_name_char) {
            return None;
        }
        s = s[eq + 1..].trim_start().strip_prefix('"')?;
        // Scan to the closing quote, honouring escapes.
        let bytes = s.as_bytes();
        let mut i = 0;
        let mut escaped = false;
        while i < bytes.len() {
            match bytes[i] {
                b'\\' => {
                    escaped = true;
                    i += 2;
                    continue;
                }
                b'"' => break,
                _ => i += 1,
            }
        }
        if i >= bytes.len() {
            return None;
        }
        let raw = &s[..i];
        let val = if escaped {
            Cow::Owned(
                raw.replace("\\\\", "\u{0}")
                    .replace("\\\"", "\"")
                    .replace("\\n", "\n")
                    .replace('\u{0}', "\\"),
            )
        } else {
            Cow::Borrowed(raw)
        };
        out.push((key, val));
        s = &s[i + 1..];
    }
}

/// Parses one line; `None` for comments, blanks and unreadable lines.
pub fn parse_line(line: &str) -> Option<Sample<'_>> {
    let line = line.trim();
    let b = line.as_bytes();
    if b.is_empty() || b[0] == b'#' || !is_name_start(b[0]) {
        return None;
    }
    let end = b.iter().position(|c| !is_name_char(*c)).unwrap_or(b.len());
    let name = &line[..end];
    let mut rest = &line[end..];
    let labels = if let Some(r) = rest.strip_prefix('{') {
        let (labels, r) = parse_labels(r)?;
        rest = r;
        labels
    } else {
        Vec::new()
    };
    let value = parse_value(rest.split_whitespace().next()?)?;
    Some(Sample {
        name,
        labels,
        value,
    })
}

/// Iterates over every readable sample in an exposition text.
pub fn samples(text: &str) -> impl Iterator<Item = Sample<'_>> {
    text.lines().filter_map(parse_line)
}

/// Largest value a scraped count or counter may take.
const MAX_SANE_VALUE: f64 = 1e15;

#[derive(Default)]
struct Acc {
    running: Option<f64>,
    waiting: Option<f64>,
    kv: Option<(f64, u32)>,
    blocks: Option<u32>,
    block_size: Option<u32>,
    queries: f64,
    hits: f64,
    preemptions: f64,
    rejected: u32,
    engine: Option<EngineKind>,
}

fn add(slot: &mut Option<f64>, v: f64) {
    *slot = Some(slot.unwrap_or(0.0) + v);
}

/// Builds a `Scraped` from exposition text. Data-parallel engines (several `engine`
/// label values) are summed; KV usage is averaged. `prev` gives the preemption rate.
pub fn parse_metrics(text: &str, prev: Option<&Scraped>, now_s: f64) -> Result<Scraped, String> {
    let mut a = Acc::default();
    for s in samples(text) {
        let v = s.value;
        // Above 1e15 no engine count is real, and summing such values overflowed to
        // inf (found by fuzzing: two `1e308` queue lengths).
        let sane = v.is_finite() && (0.0..=MAX_SANE_VALUE).contains(&v);
        let (engine, field) = match s.name {
            "vllm:num_requests_running" => (EngineKind::Vllm, "running"),
            "vllm:num_requests_waiting" => (EngineKind::Vllm, "waiting"),
            "vllm:kv_cache_usage_perc" | "vllm:gpu_cache_usage_perc" => (EngineKind::Vllm, "kv"),
            "vllm:prefix_cache_queries_total" | "vllm:gpu_prefix_cache_queries_total" => {
                (EngineKind::Vllm, "queries")
            }
            "vllm:prefix_cache_hits_total" | "vllm:gpu_prefix_cache_hits_total" => {
                (EngineKind::Vllm, "hits")
            }
            "vllm:num_preemptions_total" => (EngineKind::Vllm, "preemptions"),
            "vllm:cache_config_info" => (EngineKind::Vllm, "cache_config"),
            "sglang:num_running_reqs" => (EngineKind::Sglang, "running"),
            "sglang:num_queue_reqs" => (EngineKind::Sglang, "waiting"),
            "sglang:token_usage" => (EngineKind::Sglang, "kv"),
            "sglang:cache_config_info" => (EngineKind::Sglang, "cache_config"),
            "sglang:num_preemptions_total" | "sglang:num_retracted_reqs" => {
                (EngineKind::Sglang, "preemptions")
            }
            _ => continue,
        };
        a.engine.get_or_insert(engine);
        if !sane {
            a.rejected += 1;
            continue;
        }
        match field {
            "running" => add(&mut a.running, v),
            "waiting" => add(&mut a.waiting, v),
            "kv" if v <= 1.0 => {
                let (sum, n) = a.kv.unwrap_or((0.0, 0));
                a.kv = Some((sum + v, n + 1));
            }
            "kv" => a.rejected += 1,
            "queries" => a.queries += v,
            "hits" => a.hits += v,
            "preemptions" => a.preemptions += v,
            "cache_config" => {
                let num = |k: &str| s.label(k).and_then(|x| x.parse::<u32>().ok());
                a.block_size = num("block_size").or(num("page_size")).or(a.block_size);
                a.blocks = num("num_gpu_blocks").or(num("num_pages")).or(a.blocks);
            }
            _ => {}
        }
    }
    let engine = a
        .engine
        .ok_or_else(|| "no vLLM or SGLang metrics found".to_string())?;
    let preemption_rate = match prev {
        Some(p) if now_s > p.at_s && a.preemptions >= p.preemptions => {
            (a.preemptions - p.preemptions) / (now_s - p.at_s)
        }
        _ => 0.0,
    };
    Ok(Scraped {
        at_s: now_s,
        engine,
        running: a.running.unwrap_or(0.0),
        waiting: a.waiting.unwrap_or(0.0),
        kv_usage: a.kv.map(|(s, n)| s / n as f64),
        num_gpu_blocks: a.blocks,
        block_size: a.block_size,
        prefix_queries: a.queries,
        prefix_hits: a.hits,
        preemptions: a.preemptions,
        preemption_rate,
        rejected_values: a.rejected,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const VLLM: &str = r#"
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny-llama"} 3.0
vllm:num_requests_waiting{engine="0",model_name="tiny-llama"} 5.0
vllm:kv_cache_usage_perc{engine="0",model_name="tiny-llama"} 0.75
vllm:prefix_cache_queries_total{engine="0",model_name="tiny-llama"} 4096.0
vllm:prefix_cache_hits_total{engine="0",model_name="tiny-llama"} 2048.0
vllm:num_preemptions_total{engine="0",model_name="tiny-llama"} 7.0
vllm:cache_config_info{block_size="32",cache_dtype="auto",enable_prefix_caching="True",engine="0",num_gpu_blocks="256",prefix_caching_hash_algo="sha256"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="tiny-llama"} 0.0
"#;

    #[test]
    fn reads_vllm() {
        let s = parse_metrics(VLLM, None, 1.0).unwrap();
        assert_eq!(s.engine, EngineKind::Vllm);
        assert_eq!((s.running, s.waiting), (3.0, 5.0));
        assert_eq!(s.kv_usage, Some(0.75));
        assert_eq!((s.prefix_queries, s.prefix_hits), (4096.0, 2048.0));
        assert_eq!((s.block_size, s.num_gpu_blocks), (Some(32), Some(256)));
        let later = VLLM.replace("} 7.0", "} 11.0");
        let s2 = parse_metrics(&later, Some(&s), 3.0).unwrap();
        assert_eq!(s2.preemption_rate, 2.0);
    }

    #[test]
    fn reads_sglang() {
        let text = "sglang:num_running_reqs{model_name=\"m\"} 2\nsglang:num_queue_reqs{model_name=\"m\"} 1\nsglang:token_usage{model_name=\"m\"} 0.5\n";
        let s = parse_metrics(text, None, 0.0).unwrap();
        assert_eq!(s.engine, EngineKind::Sglang);
        assert_eq!((s.running, s.waiting, s.kv_usage), (2.0, 1.0, Some(0.5)));
    }

    #[test]
    fn garbage_is_rejected_not_used() {
        let text = "vllm:num_requests_running NaN\nvllm:num_requests_waiting -4\nvllm:kv_cache_usage_perc 7\nvllm:num_requests_running{a=\"b\" 3\n";
        let s = parse_metrics(text, None, 0.0).unwrap();
        assert_eq!(s.running, 0.0);
        assert_eq!(s.waiting, 0.0);
        assert_eq!(s.kv_usage, None);
        assert_eq!(s.rejected_values, 3);
        assert!(parse_metrics("<html>not metrics</html>", None, 0.0).is_err());
    }

    #[test]
    fn escaped_label_values() {
        let s = parse_line(r#"x{a="q\"uo,te",b="c"} 1 123"#).unwrap();
        assert_eq!(s.label("a"), Some("q\"uo,te"));
        assert_eq!(s.label("b"), Some("c"));
        assert_eq!(s.value, 1.0);
    }

    #[test]
    fn sums_data_parallel_engines() {
        let text = "vllm:num_requests_running{engine=\"0\"} 2\nvllm:num_requests_running{engine=\"1\"} 3\nvllm:kv_cache_usage_perc{engine=\"0\"} 0.2\nvllm:kv_cache_usage_perc{engine=\"1\"} 0.4\n";
        let s = parse_metrics(text, None, 0.0).unwrap();
        assert_eq!(s.running, 5.0);
        assert!((s.kv_usage.unwrap() - 0.3).abs() < 1e-12);
    }

    proptest! {
        #[test]
        fn never_panics(text in "\\PC{0,400}") {
            let _ = parse_metrics(&text, None, 0.0);
        }
        #[test]
        fn never_panics_on_metric_like_lines(name in "[a-z:_]{1,20}", lbl in "[a-z=\",\\\\{} ]{0,30}", v in "[-+0-9.eNaInf]{0,8}") {
            let _ = parse_line(&format!("{name}{{{lbl} {v}"));
            let _ = parse_line(&format!("{name}{{{lbl}}} {v}"));
        }
    }
}
