//! Live runs against real processes on loopback: the load generator against one
//! emulator, `--target` mode against a router started here, and the orchestrator
//! starting and stopping a whole fleet. Tests run one at a time (a shared lock) so
//! their timing does not disturb each other, and each checks that every process it
//! started is gone afterwards.

mod common;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{Guard, bin_dir, free_port, router_bin, start_replica, wait_http_ok};

use headroom_bench::live::{
    LiveError, LiveMode, LiveOptions, ReplayOptions, SpawnOptions, replay, run_live,
};
use headroom_bench::sim::{SimConfig, parse_fleet, simulate};
use headroom_bench::workload::{Request, Workload};

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    SERIAL.lock().await
}

/// `n` requests `gap_s` apart, prompts of `input` ± a little; all share one
/// 512-token prefix block, the rest of each prompt is its own.
fn workload(n: u64, gap_s: f64, input: u32) -> Workload {
    let reqs = (0..n)
        .map(|i| {
            let input_tokens = input + 150 * (i as u32 % 4);
            let blocks = u64::from(input_tokens.div_ceil(512));
            Request {
                id: i,
                arrival_s: i as f64 * gap_s,
                input_tokens,
                output_tokens: 16 + 4 * (i as u32 % 5),
                hash_ids: std::iter::once(7)
                    .chain((1..blocks).map(|k| 1000 * (i + 1) + k))
                    .collect(),
                block_tokens: 512,
                tenant: Some(if i % 2 == 0 { "chat" } else { "batch" }.into()),
                slo_ttft_ms: Some(500.0),
                slo_tpot_ms: Some(50.0),
            }
        })
        .collect();
    Workload::from_requests("live-test", reqs)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit(')').next().map(|r| r.trim_start().chars().next()))
        .flatten()
        .is_some_and(|state| state != 'Z' && state != 'X')
}

/// Live children of this test process (other than zombies).
fn my_children() -> Vec<u32> {
    let me = std::process::id();
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&p| {
            std::fs::read_to_string(format!("/proc/{p}/stat"))
                .ok()
                .and_then(|s| {
                    let rest = s.rsplit(')').next()?.split_whitespace().collect::<Vec<_>>();
                    Some(rest.get(1)?.parse::<u32>().ok()? == me && rest[0] != "Z")
                })
                .unwrap_or(false)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_generator_measures_one_emulator_like_the_engine_model() {
    let _s = serial().await;
    let (_replica, addr) = start_replica("a100-llama3-8b", &["--time-scale", "1.0"]);
    let url = format!("http://{addr}");
    wait_http_ok(&format!("{url}/health")).await;
    // A100 prefill of ~3k tokens takes ~0.2 s: large against loopback HTTP noise.
    let wl = workload(10, 0.15, 3000);
    let opts = ReplayOptions {
        targets: vec![url.clone()],
        time_scale: 1.0,
        max_inflight: 16,
        request_timeout: Duration::from_secs(30),
        load_sample_interval_s: 0.05,
        ..ReplayOptions::default()
    };
    let rep = replay(&wl, &opts).await.expect("replay");
    assert_eq!(rep.records.len(), 10, "one record per request");
    assert_eq!(
        rep.failed,
        0,
        "{:?}",
        rep.records.iter().map(|r| &r.fallback).collect::<Vec<_>>()
    );
    assert_eq!(rep.replicas.len(), 1);
    assert_eq!(
        rep.replicas[0].name, url,
        "without a replica header the target is the replica"
    );

    // The same requests through the engine model (the simulator, one replica).
    let sim = simulate(
        &wl,
        SimConfig {
            fleet: parse_fleet("a100-llama3-8b:1").expect("fleet"),
            policy: "round-robin".into(),
            ..SimConfig::default()
        },
    )
    .expect("simulate");
    let mut ttft_ratio = Vec::new();
    let mut tpot_ratio = Vec::new();
    for (live, model) in rep.records.iter().zip(&sim.records) {
        let w = &wl.requests[live.id as usize];
        assert_eq!(live.id, model.id);
        assert_eq!(live.output_tokens, w.output_tokens, "exact output length");
        assert_eq!(live.input_tokens, w.input_tokens);
        assert_eq!(live.replica, Some(0));
        assert_eq!(live.tenant, w.tenant);
        assert_eq!((live.slo_ttft_ms, live.slo_tpot_ms), (500.0, 50.0));
        assert_eq!(
            live.cached_tokens, model.cached_tokens,
            "prefix hits as modelled (request {})",
            live.id
        );
        let (ttft, tpot, e2e) = (
            live.ttft_s.expect("ttft"),
            live.tpot_s.expect("tpot"),
            live.e2e_s.expect("e2e"),
        );
        assert!(ttft > 0.0 && tpot > 0.0 && e2e >= ttft + tpot, "{live:?}");
        ttft_ratio.push(ttft / model.ttft_s.expect("model ttft"));
        tpot_ratio.push(tpot / model.tpot_s.expect("model tpot"));
    }
    assert!(
        rep.records[1..].iter().all(|r| r.cached_tokens >= 512),
        "shared prefix block hit"
    );
    // Loopback HTTP and a busy shared machine add a little; the band is generous, the
    // medians must still sit near what the engine model says.
    let (mt, mp) = (median(ttft_ratio), median(tpot_ratio));
    assert!((0.75..1.5).contains(&mt), "median TTFT live/model = {mt}");
    assert!((0.75..1.5).contains(&mp), "median TPOT live/model = {mp}");
    eprintln!("median live/model: TTFT {mt:.3}, TPOT {mp:.3}");
    assert!(
        !rep.load.is_empty()
            && rep
                .load
                .iter()
                .any(|s| s.inflight == vec![1] || s.inflight[0] > 1)
    );

    // Every request failing is recorded, not lost.
    let faults = reqwest::Client::new()
        .post(format!("{url}/admin/faults"))
        .body(r#"{"error_rate": 1.0}"#)
        .send()
        .await
        .expect("faults");
    assert!(faults.status().is_success());
    let failed = replay(&wl.head(3), &opts)
        .await
        .expect("replay with faults");
    assert_eq!(failed.records.len(), 3);
    assert_eq!(failed.failed, 3);
    for r in &failed.records {
        assert!(r.rejected && r.ttft_s.is_none() && !r.met_both());
        assert!(
            r.fallback
                .as_deref()
                .is_some_and(|f| f.contains("HTTP 500")),
            "{:?}",
            r.fallback
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn target_mode_drives_a_router_started_elsewhere() {
    let _s = serial().await;
    let router = router_bin();
    let (_replica, addr) = start_replica("h100-llama3-8b", &["--time-scale", "0.5"]);
    wait_http_ok(&format!("http://{addr}/health")).await;
    let port = free_port();
    let child = Command::new(&router)
        .args(["--log", "warn", "serve", "--listen"])
        .arg(format!("127.0.0.1:{port}"))
        .args([
            "--policy",
            "slo",
            "--tokenizer",
            "llama-3-8b=cl100k",
            "--replica",
        ])
        .arg(format!("http://{addr},name=solo,class=h100-llama3-8b"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn headroom serve");
    let router_pid = child.id();
    let _router = Guard(child);
    let url = format!("http://127.0.0.1:{port}");
    wait_http_ok(&format!("{url}/ready")).await;
    let mut opts = LiveOptions::new(
        workload(8, 0.1, 600),
        LiveMode::Target {
            urls: vec![url.clone()],
            label: "headroom-slo".into(),
            pids: vec![router_pid],
        },
    );
    opts.time_scale = 0.5;
    opts.request_timeout = Duration::from_secs(30);
    let run = run_live(opts).await.expect("live run");
    let r = &run.result;
    assert_eq!(r.policy, "headroom-slo");
    assert_eq!(r.records.len(), 8);
    assert_eq!(
        run.failed,
        0,
        "{:?}",
        r.records.iter().map(|r| &r.fallback).collect::<Vec<_>>()
    );
    assert_eq!(r.replicas.len(), 1);
    assert_eq!(
        (r.replicas[0].name.as_str(), r.replicas[0].profile.as_str()),
        ("solo", "h100-llama3-8b")
    );
    for rec in &r.records {
        assert_eq!(rec.replica, Some(0));
        assert!(
            rec.predicted_ttft_ms.is_some() && rec.predicted_tpot_upper_ms.is_some(),
            "{rec:?}"
        );
        assert!(rec.ttft_s.is_some() && rec.tpot_s.is_some());
    }
    assert_eq!(run.routers.len(), 1);
    assert_eq!(run.routers[0].pid, router_pid);
    assert!(
        run.routers[0].cpu_s > 0.0 && run.routers[0].peak_rss_mib > 1.0,
        "{:?}",
        run.routers
    );
    assert!(run.started_pids.is_empty(), "target mode starts nothing");
    assert!(alive(router_pid), "target mode leaves the router running");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orchestrator_starts_a_fleet_and_routers_and_stops_them_all() {
    let _s = serial().await;
    router_bin();
    let mut opts = LiveOptions::new(
        workload(16, 0.05, 600),
        LiveMode::Spawn(SpawnOptions {
            fleet: parse_fleet("h100-llama3-8b:2").expect("fleet"),
            routers: 2,
            policy: "least-request".into(),
            bin_dir: Some(bin_dir()),
            serve_args: Vec::new(),
            step_noise: 0.0,
        }),
    );
    opts.time_scale = 0.5;
    opts.request_timeout = Duration::from_secs(30);
    let run = run_live(opts.clone()).await.expect("live run");
    let r = &run.result;
    assert_eq!(r.policy, "least-request");
    assert_eq!(r.routers, 2);
    assert_eq!(r.records.len(), 16);
    assert_eq!(
        run.failed,
        0,
        "{:?}",
        r.records.iter().map(|r| &r.fallback).collect::<Vec<_>>()
    );
    let names: Vec<&str> = r.replicas.iter().map(|x| x.name.as_str()).collect();
    assert_eq!(names, ["r0-h100-llama3-8b", "r1-h100-llama3-8b"]);
    for node in 0..2 {
        assert!(
            r.records.iter().any(|x| x.node == node),
            "node {node} took requests"
        );
    }
    for rep in 0..2 {
        assert!(
            r.records.iter().any(|x| x.replica == Some(rep)),
            "replica {rep} served"
        );
    }
    assert_eq!(run.routers.len(), 2);
    assert!(
        run.routers
            .iter()
            .all(|u| u.cpu_s > 0.0 && u.peak_rss_mib > 1.0)
    );
    assert_eq!(run.started_pids.len(), 4, "2 replicas + 2 routers");
    for pid in &run.started_pids {
        assert!(!alive(*pid), "process {pid} still running after the run");
    }
    assert!(
        my_children().is_empty(),
        "stray children: {:?}",
        my_children()
    );

    // A router that cannot start: the error names it and the replicas started before
    // it are stopped too.
    if let LiveMode::Spawn(s) = &mut opts.mode {
        s.policy = "no-such-policy".into();
    }
    opts.startup_timeout = Duration::from_secs(10);
    let err = run_live(opts.clone()).await.expect_err("bad policy");
    assert!(matches!(err, LiveError::Startup { .. }), "{err}");
    assert!(
        my_children().is_empty(),
        "stray children after a failed start: {:?}",
        my_children()
    );

    if let LiveMode::Spawn(s) = &mut opts.mode {
        s.bin_dir = Some(PathBuf::from("/nonexistent-dir"));
    }
    let err = run_live(opts).await.expect_err("no binaries");
    assert!(matches!(err, LiveError::MissingBinary(_)), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_overhead_passes_bodies_through_unchanged_on_every_target() {
    use headroom_bench::live::overhead::{OverheadOptions, OverheadTarget, proxy_overhead};
    let _s = serial().await;
    router_bin();
    let mut targets = vec![
        OverheadTarget::Direct,
        OverheadTarget::Headroom("round-robin".into()),
    ];
    // nginx joins when installed (scripts/install-nginx.sh); headroom always runs.
    if headroom_bench::live::nginx::find_nginx().is_some() {
        targets.push(OverheadTarget::Nginx);
    }
    let opts = OverheadOptions {
        targets: targets.clone(),
        concurrencies: vec![2],
        warmup: Duration::from_millis(200),
        duration: Duration::from_millis(700),
        repeats: 2,
        bin_dir: Some(bin_dir()),
        ..OverheadOptions::default()
    };
    let rep = proxy_overhead(opts).await.expect("proxy overhead");
    assert_eq!(rep.measurements.len(), targets.len() * 2);
    for m in &rep.measurements {
        assert_eq!(
            m.errors, 0,
            "{m:?}: every answer byte-identical to the upstream's"
        );
        assert!(
            m.requests > 0 && m.p50_ms > 0.0 && m.p99_ms >= m.p50_ms,
            "{m:?}"
        );
        assert_eq!(m.proxy_cpu_s.is_some(), m.target != "direct", "{m:?}");
    }
    assert_eq!(rep.table.rows.len(), targets.len());
    assert!(
        rep.proxy_peak_rss_mib
            .contains_key("headroom (round-robin)")
    );
    assert!(
        my_children().is_empty(),
        "stray children: {:?}",
        my_children()
    );
}
