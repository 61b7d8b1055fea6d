//! `write_report` writes the markdown, the JSON with its required keys, and the plots.

use std::collections::BTreeMap;
use std::path::PathBuf;

use headroom_bench::report::{CapacitySearch, PolicyReport, Report, write_report};
use headroom_bench::sim::result::{LoadSample, ReplicaInfo, RequestRecord, RunResult};
use headroom_bench::workload::Workload;

struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("headroom-report-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // Set HEADROOM_KEEP_REPORT=1 to look at the files afterwards.
        if std::env::var_os("HEADROOM_KEEP_REPORT").is_some() {
            eprintln!("kept {}", self.0.display());
            return;
        }
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A fake run over a generated workload: TTFT grows with rate scale and prompt length,
/// `skill` scales it down; optional predictions off by a fixed 10 %.
fn fake_run(policy: &str, scale: f64, skill: f64, predicts: bool) -> RunResult {
    let w = Workload::from_spec("mixed:rate=5,duration=60,seed=11")
        .expect("spec")
        .scaled(scale);
    let records: Vec<RequestRecord> = w
        .requests
        .iter()
        .map(|r| {
            let ttft_ms = (50.0 + 0.05 * f64::from(r.input_tokens)) * scale * scale / skill;
            RequestRecord {
                id: r.id,
                tenant: r.tenant.clone(),
                arrival_s: r.arrival_s,
                replica: Some((r.id % 3) as u32),
                input_tokens: r.input_tokens,
                output_tokens: r.output_tokens,
                cached_tokens: r.input_tokens / 4,
                ttft_s: Some(ttft_ms / 1e3),
                tpot_s: Some(0.02 * scale),
                slo_ttft_ms: r.slo_ttft_ms.unwrap_or(500.0),
                slo_tpot_ms: r.slo_tpot_ms.unwrap_or(50.0),
                predicted_ttft_ms: predicts.then_some(ttft_ms * 1.1),
                predicted_ttft_upper_ms: predicts.then_some(ttft_ms * 1.3),
                predicted_tpot_ms: predicts.then_some(20.0 * scale * 0.9),
                predicted_tpot_upper_ms: predicts.then_some(20.0 * scale * 1.2),
                ..RequestRecord::default()
            }
        })
        .collect();
    let load = (0..60)
        .map(|t| LoadSample {
            t_s: f64::from(t),
            inflight: vec![t % 4, 2, (t / 10) % 3],
        })
        .collect();
    RunResult {
        policy: policy.into(),
        workload: w.name.clone(),
        rate_scale: scale,
        seed: 11,
        routers: 2,
        replicas: (0..3)
            .map(|i| ReplicaInfo {
                name: format!("r{i}"),
                profile: "a100".into(),
            })
            .collect(),
        records,
        load,
        decision_ns: vec![1500, 2500, 900],
        sim_duration_s: 60.0 / scale,
    }
}

#[test]
fn report_files_are_written_with_the_required_keys() {
    let search = CapacitySearch {
        max_runs: 8,
        ..CapacitySearch::default()
    };
    let slo = PolicyReport::new(
        fake_run("slo", 1.0, 2.0, true),
        Some(search.search(|s| fake_run("slo", s, 2.0, true))),
    );
    let rr = PolicyReport::new(
        fake_run("round-robin", 1.0, 1.0, false),
        Some(search.search(|s| fake_run("round-robin", s, 1.0, false))),
    );
    let bare = PolicyReport::new(fake_run("least-request", 1.0, 1.5, false), None);
    let slo_cap = slo.capacity.as_ref().map(|c| c.capacity).expect("searched");
    let rr_cap = rr.capacity.as_ref().map(|c| c.capacity).expect("searched");
    assert!(
        slo_cap > rr_cap,
        "the better policy sustains more load: {slo_cap} vs {rr_cap}"
    );

    let mut settings = BTreeMap::new();
    settings.insert(
        "workload".to_string(),
        "mixed:rate=5,duration=60,seed=11".to_string(),
    );
    let report = Report {
        title: "Test comparison".into(),
        settings,
        policies: vec![slo, rr, bare],
    };
    let dir = Scratch::new("files");
    let files = write_report(&dir.0, &report).expect("written");

    let names: Vec<String> = files
        .plots
        .iter()
        .map(|p| p.file_name().expect("file").to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        [
            "attainment_vs_rate.svg",
            "ttft_forecast_slo.svg",
            "load_slo.svg",
            "load_round-robin.svg",
            "load_least-request.svg"
        ]
    );
    for p in &files.plots {
        let svg = std::fs::read_to_string(p).expect("plot written");
        assert!(
            svg.contains("<svg") && svg.contains("</svg>"),
            "{}",
            p.display()
        );
        assert!(svg.len() > 2_000, "{} looks empty", p.display());
    }
    let cap_svg = std::fs::read_to_string(&files.plots[0]).expect("plot");
    assert!(cap_svg.contains("round-robin") && cap_svg.contains("slo (capacity"));

    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&files.json).expect("json"))
            .expect("valid json");
    for name in ["slo", "round-robin", "least-request"] {
        let p = &json["policies"][name];
        for key in [
            "slo_capacity",
            "attainment",
            "ttft_p95_ms",
            "tpot_p95_ms",
            "goodput_rps",
            "ttft_mape_pct",
            "ttft_coverage",
            "decision_p99_us",
            "load_cv_mean",
            "summary",
        ] {
            assert!(p.get(key).is_some(), "{name}.{key} missing");
        }
    }
    assert!(
        (json["policies"]["slo"]["slo_capacity"]
            .as_f64()
            .expect("number")
            - slo_cap)
            .abs()
            < 1e-12
    );
    assert!(json["policies"]["least-request"]["slo_capacity"].is_null());
    assert!(
        (json["policies"]["slo"]["ttft_mape_pct"]
            .as_f64()
            .expect("number")
            - 10.0)
            .abs()
            < 1e-6
    );
    assert!(
        (json["policies"]["slo"]["ttft_coverage"]
            .as_f64()
            .expect("number")
            - 1.0)
            .abs()
            < 1e-12
    );
    assert!(json["policies"]["round-robin"]["ttft_mape_pct"].is_null());
    assert!(
        json["policies"]["slo"]["capacity"]["probes"]
            .as_array()
            .is_some_and(|p| p.len() >= 3)
    );
    assert_eq!(
        json["settings"]["workload"],
        "mixed:rate=5,duration=60,seed=11"
    );

    let md = std::fs::read_to_string(&files.markdown).expect("markdown");
    for needle in [
        "# Test comparison",
        "| slo |",
        "| round-robin |",
        "| least-request |",
        "## Forecast quality",
        "## Per tenant",
        "| chat |",
        "## Capacity probes",
        "![load_slo.svg](load_slo.svg)",
        "| workload | mixed:rate=5,duration=60,seed=11 |",
    ] {
        assert!(md.contains(needle), "report.md lacks `{needle}`");
    }
}

#[test]
fn unwritable_directory_is_an_error_not_a_panic() {
    let dir = Scratch::new("blocked");
    std::fs::create_dir_all(&dir.0).expect("mkdir");
    let file = dir.0.join("not-a-dir");
    std::fs::write(&file, "x").expect("write");
    let report = Report {
        title: "t".into(),
        policies: vec![PolicyReport::new(fake_run("p", 1.0, 1.0, false), None)],
        ..Report::default()
    };
    assert!(write_report(file.join("sub"), &report).is_err());
}
