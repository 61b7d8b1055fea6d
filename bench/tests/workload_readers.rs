//! Trace readers and writers: inline files, malformed input, and the real traces in
//! `bench/traces` (copies of `shared/traces`) (figures as stated in its README).

use std::path::{Path, PathBuf};

use headroom_bench::workload::{SloClass, SloRule, Workload, WorkloadError};

fn traces() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("traces")
}

/// A scratch directory removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("headroom-wl-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create scratch dir");
        Scratch(dir)
    }
    fn file(&self, name: &str, text: &str) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, text).expect("write scratch file");
        p
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn jsonl_rows_are_sorted_relative_and_carry_optional_fields() {
    let s = Scratch::new("jsonl");
    let p = s.file(
        "t.jsonl",
        concat!(
            r#"{"timestamp": 2000, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}"#, "\n",
            "\n",
            r#"{"timestamp": 1000, "input_length": 10, "output_length": 7, "hash_ids": [1], "tenant": "chat", "slo_ttft_ms": 250, "slo_tpot_ms": 40}"#, "\n",
            r#"{"timestamp": 2000, "input_length": 32, "output_length": 1, "hash_ids": [9, 8], "block_size": 16, "extra": "ignored"}"#, "\n",
        ),
    );
    let w = Workload::load(&p).expect("valid file");
    assert_eq!(w.name, "t");
    assert_eq!(w.requests.len(), 3);
    let arrivals: Vec<f64> = w.requests.iter().map(|r| r.arrival_s).collect();
    assert_eq!(arrivals, vec![0.0, 1.0, 1.0]);
    assert_eq!(
        w.requests.iter().map(|r| r.id).collect::<Vec<_>>(),
        vec![0, 1, 2]
    );
    let first = &w.requests[0];
    assert_eq!(first.tenant.as_deref(), Some("chat"));
    assert_eq!(
        (first.slo_ttft_ms, first.slo_tpot_ms),
        (Some(250.0), Some(40.0))
    );
    // Ties keep file order (stable sort).
    assert_eq!(w.requests[1].input_tokens, 600);
    assert_eq!(w.requests[1].block_tokens, 512);
    assert_eq!(w.requests[2].block_tokens, 16);
    assert_eq!(w.requests[2].hash_ids, vec![9, 8]);
}

fn load_err(name: &str, text: &str) -> String {
    let s = Scratch::new(&format!("bad-{}", name.replace('.', "-")));
    let p = s.file(name, text);
    match Workload::load(&p) {
        Ok(w) => panic!("{name} loaded {} requests from bad input", w.requests.len()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn malformed_jsonl_names_the_line() {
    let ok = r#"{"timestamp": 0, "input_length": 10, "output_length": 1}"#;
    let cases = [
        (format!("{ok}\n{{not json\n"), ":2:"),
        (
            format!("{ok}\n{ok}\n{{\"timestamp\": 1, \"output_length\": 3}}\n"),
            "input_length",
        ),
        (
            format!("{ok}\n{{\"timestamp\": 1, \"input_length\": 0, \"output_length\": 3}}\n"),
            ":2: input_length must be at least 1",
        ),
        (
            "{\"timestamp\": 1, \"input_length\": 1025, \"output_length\": 3, \"hash_ids\": [1, 2]}\n".to_string(),
            ":1: 2 hash_ids of 512 tokens cover 1024",
        ),
        (
            "{\"timestamp\": 1, \"input_length\": 5, \"output_length\": 3, \"slo_ttft_ms\": -1}\n".to_string(),
            "slo_ttft_ms must be a positive",
        ),
        (
            "{\"timestamp\": \"soon\", \"input_length\": 5, \"output_length\": 3}\n".to_string(),
            ":1:",
        ),
        (
            "{\"timestamp\": 1, \"input_length\": -5, \"output_length\": 3}\n".to_string(),
            ":1:",
        ),
    ];
    for (text, want) in cases {
        let e = load_err("bad.jsonl", &text);
        assert!(e.contains(want), "error `{e}` lacks `{want}`");
    }
    assert!(load_err("empty.jsonl", "\n\n").contains("no requests"));
    assert!(load_err("x.parquet", ok).contains("unknown workload file extension"));
    let missing = Workload::load("/nonexistent/dir/t.jsonl");
    assert!(matches!(missing, Err(WorkloadError::Io { .. })));
}

#[test]
fn azure_csv_is_parsed_exactly() {
    let s = Scratch::new("azure");
    let p = s.file(
        "a.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n\
         2023-11-16 18:15:46.6805900,374,44\n\
         2023-11-16 18:15:50.9951690,396,109\n\
         2023-11-17 00:00:00,5,1\n",
    );
    let w = Workload::load(&p).expect("valid csv");
    assert_eq!(w.requests.len(), 3);
    assert_eq!(w.requests[0].arrival_s, 0.0);
    assert_eq!(w.requests[1].arrival_s, 4.314579);
    // Across midnight: 5 h 44 min 13.31941 s after the first row.
    assert!((w.requests[2].arrival_s - 20_653.319_41).abs() < 1e-9);
    assert_eq!(
        (w.requests[1].input_tokens, w.requests[1].output_tokens),
        (396, 109)
    );
    assert!(
        w.requests
            .iter()
            .all(|r| r.hash_ids.is_empty() && r.tenant.is_none())
    );
    // Unique ids of their own make the rows runnable on the engine model, sharing nothing.
    let filled = w.clone().with_unique_hash_ids();
    let ids: Vec<Vec<u64>> = filled.requests.iter().map(|r| r.hash_ids.clone()).collect();
    assert_eq!(ids, vec![vec![0], vec![1], vec![2]]);
    assert_eq!(filled.summary().prefix_reuse, 0.0);
    let long = Workload::from_spec("poisson:rate=1,duration=30,input=const(1100)").expect("spec");
    let mut mixed = long.clone();
    mixed.requests[0].hash_ids.clear();
    let refilled = mixed.with_unique_hash_ids();
    let max_before = long
        .requests
        .iter()
        .flat_map(|r| r.hash_ids.iter())
        .max()
        .copied()
        .unwrap_or(0);
    assert_eq!(
        refilled.requests[0].hash_ids,
        vec![max_before + 1, max_before + 2, max_before + 3]
    );
    assert_eq!(refilled.requests[1..], long.requests[1..]);

    for (text, want) in [
        ("TIME,In,Out\n", ":1: expected header"),
        (
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,3\n",
            ":2: expected 3",
        ),
        (
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,3,4\n2023-11-16 18:61:00,3,4\n",
            ":3: timestamp",
        ),
        (
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,x,4\n",
            ":2: ContextTokens",
        ),
        (
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,3,0\n",
            ":2: GeneratedTokens must be at least 1",
        ),
    ] {
        let e = load_err("bad.csv", text);
        assert!(e.contains(want), "error `{e}` lacks `{want}`");
    }
}

#[test]
fn jsonl_round_trips() {
    let s = Scratch::new("roundtrip");
    let src = s.file(
        "src.jsonl",
        concat!(
            r#"{"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59]}"#, "\n",
            r#"{"timestamp": 27482.5, "input_length": 20, "output_length": 3, "hash_ids": [1, 2], "block_size": 16, "tenant": "batch", "slo_ttft_ms": 10000.0, "slo_tpot_ms": 200.0}"#, "\n",
        ),
    );
    let a = Workload::load(&src).expect("valid");
    let out = s.0.join("out.jsonl");
    a.write_jsonl(&out).expect("write");
    let b = Workload::load(&out).expect("re-read");
    assert_eq!(a.requests, b.requests);
    let text = std::fs::read_to_string(&out).expect("read back");
    assert!(
        text.starts_with(r#"{"timestamp":0,"input_length":6955"#),
        "{text}"
    );

    // A generated workload (arbitrary float arrivals) round-trips to within a nanosecond.
    let g = Workload::from_spec("mixed:rate=5,duration=20,seed=3").expect("spec");
    let out = s.0.join("gen.jsonl");
    g.write_jsonl(&out).expect("write");
    let h = Workload::load(&out).expect("re-read");
    assert_eq!(g.requests.len(), h.requests.len());
    let t0 = g.requests[0].arrival_s;
    for (x, y) in g.requests.iter().zip(&h.requests) {
        assert!((x.arrival_s - t0 - y.arrival_s).abs() < 1e-9);
        assert_eq!(
            (&x.hash_ids, x.input_tokens, &x.tenant),
            (&y.hash_ids, y.input_tokens, &y.tenant)
        );
        assert_eq!(
            (x.slo_ttft_ms, x.slo_tpot_ms),
            (y.slo_ttft_ms, y.slo_tpot_ms)
        );
    }
}

#[test]
fn head_window_and_slo_rule() {
    let w = Workload::from_spec("poisson:rate=10,duration=60,seed=1").expect("spec");
    let h = w.head(5);
    assert_eq!(h.requests, w.requests[..5].to_vec());
    let win = w.window(10.0, 20.0);
    let inside = w
        .requests
        .iter()
        .filter(|r| (10.0..20.0).contains(&r.arrival_s))
        .count();
    assert_eq!(win.requests.len(), inside);
    assert!(
        win.requests
            .iter()
            .all(|r| (0.0..10.0).contains(&r.arrival_s))
    );
    assert_eq!(win.requests.last().map(|r| r.id), Some(inside as u64 - 1));

    let rule = SloRule::uniform(SloClass::new(100.0, 0.5, 30.0))
        .with_tenant("vip", SloClass::new(50.0, 0.0, 20.0));
    let mut w = w.head(3);
    w.requests[1].tenant = Some("vip".into());
    w.requests[2].slo_ttft_ms = Some(7.0);
    let w = w.with_slo(&rule);
    let r = &w.requests;
    assert_eq!(
        r[0].slo_ttft_ms,
        Some(100.0 + 0.5 * f64::from(r[0].input_tokens))
    );
    assert_eq!(r[0].slo_tpot_ms, Some(30.0));
    assert_eq!(
        (r[1].slo_ttft_ms, r[1].slo_tpot_ms),
        (Some(50.0), Some(20.0))
    );
    assert_eq!(r[2].slo_ttft_ms, Some(7.0), "present objectives are kept");

    let parsed =
        SloRule::parse("ttft=300+0.2/tok,tpot=50;batch=ttft=10000,tpot=200").expect("rule");
    assert_eq!(parsed.default, SloClass::new(300.0, 0.2, 50.0));
    assert_eq!(parsed.tenants["batch"], SloClass::new(10_000.0, 0.0, 200.0));
    assert_eq!(
        SloRule::parse("mooncake").expect("preset").default,
        SloClass::MOONCAKE
    );
    assert!(SloRule::parse("ttft=fast").is_err());
    assert!(SloRule::parse("ttft=100,tpot=0").is_err());
    assert_eq!(
        SloRule::for_trace("AzureLLMInferenceTrace_code").default,
        SloClass::AZURE_CODE
    );
    assert_eq!(
        SloRule::for_trace("AzureLLMInferenceTrace_conv").default,
        SloClass::AZURE_CONV
    );
    assert_eq!(
        SloRule::for_trace("conversation_trace").default,
        SloClass::MOONCAKE
    );
}

#[test]
fn summary_counts_prefix_reuse_with_an_infinite_cache() {
    let s = Scratch::new("reuse");
    // Blocks of 4 tokens. r1 hits [1,2] fully (8 tokens); r2 hits only block 1 (the
    // chain breaks at 3), then 2 is not a hit though it was seen (after a miss);
    // r3's partial last block [1,2,5] counts its 2 real tokens.
    let p = s.file(
        "r.jsonl",
        concat!(
            r#"{"timestamp": 0, "input_length": 12, "output_length": 1, "hash_ids": [1, 2, 5], "block_size": 4}"#, "\n",
            r#"{"timestamp": 1, "input_length": 8, "output_length": 3, "hash_ids": [1, 2], "block_size": 4}"#, "\n",
            r#"{"timestamp": 2, "input_length": 12, "output_length": 5, "hash_ids": [1, 3, 2], "block_size": 4}"#, "\n",
            r#"{"timestamp": 3, "input_length": 10, "output_length": 7, "hash_ids": [1, 2, 5], "block_size": 4}"#, "\n",
        ),
    );
    let sum = Workload::load(&p).expect("valid").summary();
    assert_eq!(sum.requests, 4);
    assert!((sum.duration_s - 0.003).abs() < 1e-12);
    let hits = 8.0 + 4.0 + 10.0;
    assert!(
        (sum.prefix_reuse - hits / 42.0).abs() < 1e-12,
        "{}",
        sum.prefix_reuse
    );
    assert_eq!(sum.input.mean, 10.5);
    assert_eq!(sum.output.p50, 3.0);
    assert_eq!(sum.output.p99, 7.0);
    assert_eq!(sum.tenants["-"], 4);
}

#[test]
fn mooncake_conversation_trace_matches_its_readme() {
    let w = Workload::load(traces().join("conversation_trace.jsonl")).expect("shared trace");
    let s = w.summary();
    assert_eq!(s.requests, 12_031);
    assert!((s.duration_s - 3_537.0).abs() < 1.0, "{}", s.duration_s);
    assert!((s.rate_rps - 3.40).abs() < 0.005, "{}", s.rate_rps);
    assert!((s.input.mean - 12_035.0).abs() < 1.0, "{}", s.input.mean);
    assert!((s.input.p50 - 6_909.0).abs() <= 1.0, "{}", s.input.p50);
    assert_eq!(s.input.max, 126_195.0);
    assert!((s.output.mean - 343.0).abs() < 1.0, "{}", s.output.mean);
    assert!(
        (s.prefix_reuse - 0.374).abs() < 0.0005,
        "{}",
        s.prefix_reuse
    );
    assert!(w.requests.iter().all(
        |r| r.block_tokens == 512 && r.hash_ids.len() == r.input_tokens.div_ceil(512) as usize
    ));
}

#[test]
fn azure_traces_match_their_readme() {
    let conv = Workload::load(traces().join("AzureLLMInferenceTrace_conv.csv")).expect("conv");
    let s = conv.summary();
    assert_eq!(s.requests, 19_366);
    assert!((s.duration_s - 3_502.0).abs() < 1.0, "{}", s.duration_s);
    assert!((s.rate_rps - 5.53).abs() < 0.005, "{}", s.rate_rps);
    assert!((s.input.mean - 1_155.0).abs() < 1.0, "{}", s.input.mean);
    assert_eq!(s.input.max, 14_050.0);
    assert!((s.output.mean - 211.0).abs() < 1.0, "{}", s.output.mean);
    assert_eq!(s.prefix_reuse, 0.0);

    let code = Workload::load(traces().join("AzureLLMInferenceTrace_code.csv")).expect("code");
    let s = code.summary();
    assert_eq!(s.requests, 8_819);
    assert!((s.duration_s - 3_436.0).abs() < 1.0, "{}", s.duration_s);
    assert!((s.rate_rps - 2.57).abs() < 0.005, "{}", s.rate_rps);
    assert!((s.input.mean - 2_048.0).abs() < 1.0, "{}", s.input.mean);
    assert_eq!(s.input.max, 7_437.0);
    assert!((s.output.mean - 28.0).abs() < 1.0, "{}", s.output.mean);
}
