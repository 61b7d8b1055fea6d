//! Scratch driver for exploring the simulator (not a test).
use headroom_bench::{
    sim::{SimConfig, parse_fleet, simulate},
    workload::Workload,
};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let path = args.get(1).cloned().unwrap_or(
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/traces/conversation_trace.jsonl"
        )
        .into(),
    );
    let n: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(2000);
    let scale: f64 = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(1.0);
    let policies = args
        .get(4)
        .cloned()
        .unwrap_or("round-robin,least-request,token-load,prefix-affinity,slo".into());
    let fleet = args
        .get(5)
        .cloned()
        .unwrap_or(headroom_bench::sim::config::DEFAULT_FLEET.into());
    let mut wl = Workload::load(std::path::Path::new(&path))?;
    wl.requests.truncate(n);
    for p in policies.split(',') {
        let cfg = SimConfig {
            policy: p.into(),
            rate_scale: scale,
            fleet: parse_fleet(&fleet).map_err(anyhow::Error::msg)?,
            ..SimConfig::default()
        };
        let t = std::time::Instant::now();
        let r = simulate(&wl, cfg)?;
        let met = r.records.iter().filter(|x| x.met_both()).count() as f64 / r.records.len() as f64;
        let mut ttft: Vec<f64> = r.records.iter().filter_map(|x| x.ttft_s).collect();
        ttft.sort_by(f64::total_cmp);
        let mut tpot: Vec<f64> = r.records.iter().filter_map(|x| x.tpot_s).collect();
        tpot.sort_by(f64::total_cmp);
        let q = |v: &[f64], p: f64| {
            v.get(((v.len() as f64 - 1.0) * p) as usize)
                .copied()
                .unwrap_or(f64::NAN)
        };
        let ape = |a: Option<f64>, p: Option<f64>| match (a, p) {
            (Some(a), Some(p)) if a > 0.0 => Some((p - a).abs() / a),
            _ => None,
        };
        let tt: Vec<f64> = r
            .records
            .iter()
            .skip(r.records.len() / 5)
            .filter_map(|x| ape(x.ttft_s.map(|s| s * 1e3), x.predicted_ttft_ms))
            .collect();
        let tp: Vec<f64> = r
            .records
            .iter()
            .skip(r.records.len() / 5)
            .filter_map(|x| ape(x.tpot_s.map(|s| s * 1e3), x.predicted_tpot_ms))
            .collect();
        let cov: f64 = r
            .records
            .iter()
            .skip(r.records.len() / 5)
            .filter(|x| {
                x.ttft_s
                    .zip(x.predicted_ttft_upper_ms)
                    .is_some_and(|(a, u)| a * 1e3 <= u)
            })
            .count() as f64
            / (r.records.len() * 4 / 5) as f64;
        let fb = r.records.iter().filter(|x| x.fallback.is_some()).count();
        println!(
            "{p:16} att {met:.3} ttft p50 {:.0} p95 {:.0} ms tpot p50 {:.1} p95 {:.1} ms | mape ttft {:.2} tpot {:.2} cov {:.2} | fallback {fb} | {:.1}s wall, {:.0}s sim",
            q(&ttft, 0.5) * 1e3,
            q(&ttft, 0.95) * 1e3,
            q(&tpot, 0.5) * 1e3,
            q(&tpot, 0.95) * 1e3,
            tt.iter().sum::<f64>() / tt.len().max(1) as f64,
            tp.iter().sum::<f64>() / tp.len().max(1) as f64,
            cov,
            t.elapsed().as_secs_f64(),
            r.sim_duration_s
        );
    }
    Ok(())
}
