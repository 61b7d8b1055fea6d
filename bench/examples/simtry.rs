//! Scratch driver for exploring the simulator: prints attainment, latency, forecast
//! error and prefix-cache figures per policy. Not a test; `headroom-bench sim` is the
//! real tool. Usage: simtry WORKLOAD LIMIT RATE POLICIES [FLEET]
use headroom_bench::{
    sim::{SimConfig, parse_fleet, simulate},
    workload::{SloRule, Workload},
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
        .unwrap_or("token-load,prefix-affinity,slo".into());
    let fleet = args
        .get(5)
        .cloned()
        .unwrap_or(headroom_bench::sim::config::DEFAULT_FLEET.into());
    let mut wl = Workload::from_spec(&path)?;
    wl.requests.truncate(n);
    let wl = wl.clone().with_slo(&SloRule::for_trace(&wl.name));
    for p in policies.split(',') {
        let mut cfg = SimConfig {
            policy: p.into(),
            rate_scale: scale,
            fleet: parse_fleet(&fleet).map_err(anyhow::Error::msg)?,
            ..SimConfig::default()
        };
        // SEED=n reseeds step noise and the policies' random choices.
        if let Some(seed) = std::env::var("SEED").ok().and_then(|s| s.parse().ok()) {
            cfg.seed = seed;
        }
        // Policy experiments: SLO_CFG='{"cache_weight":2.0}' overrides the slo knobs.
        if let Ok(j) = std::env::var("SLO_CFG") {
            cfg.slo = serde_json::from_str(&j)?;
        }
        // PRED_CFG='{"tpot_correction":"always"}' overrides predictor knobs.
        if let Ok(j) = std::env::var("PRED_CFG") {
            cfg.predictor = serde_json::from_str(&j)?;
        }
        let r = simulate(&wl, cfg)?;
        // DUMP=path writes every record as JSON lines, for offline error analysis.
        if let Ok(path) = std::env::var("DUMP") {
            let mut out = String::new();
            for x in &r.records {
                out.push_str(&serde_json::to_string(x)?);
                out.push('\n');
            }
            std::fs::write(format!("{path}.{p}.jsonl"), out)?;
        }
        let n = r.records.len() as f64;
        let met = r.records.iter().filter(|x| x.met_both()).count() as f64 / n;
        let input: f64 = r.records.iter().map(|x| x.input_tokens as f64).sum();
        let hit: f64 = r
            .records
            .iter()
            .map(|x| x.cached_tokens as f64)
            .sum::<f64>()
            / input;
        let est: f64 = r
            .records
            .iter()
            .filter_map(|x| x.est_cached_tokens)
            .map(f64::from)
            .sum::<f64>()
            / input;
        let est_any = r
            .records
            .iter()
            .filter(|x| x.est_cached_tokens.unwrap_or(0) > 0)
            .count() as f64
            / n;
        let hit_any = r.records.iter().filter(|x| x.cached_tokens > 0).count() as f64 / n;
        let fb: std::collections::BTreeMap<String, usize> = r
            .records
            .iter()
            .filter_map(|x| x.fallback.clone())
            .fold(Default::default(), |mut m, f| {
                *m.entry(f).or_default() += 1;
                m
            });
        println!(
            "{p:16} att {met:.3} | cache hit share {hit:.3} (router est {est:.3}); reqs with hit {hit_any:.2} est {est_any:.2} | fallbacks {fb:?}"
        );
        // Decision time over the whole run and over its second half (warm heap/caches).
        let pct = |xs: &[u32], q: f64| {
            let mut v = xs.to_vec();
            v.sort_unstable();
            v.get(((v.len() as f64 - 1.0) * q) as usize)
                .copied()
                .unwrap_or(0) as f64
                / 1e3
        };
        let d = &r.decision_ns;
        let h = &d[d.len() / 2..];
        println!(
            "   decision µs: all p50 {:.1} p99 {:.1} max {:.1} | 2nd half p50 {:.1} p99 {:.1} (n {})",
            pct(d, 0.5),
            pct(d, 0.99),
            pct(d, 1.0),
            pct(h, 0.5),
            pct(h, 0.99),
            d.len()
        );
        // What the sim_forecast test judges: the run after a 25% warm-up.
        let sum = headroom_bench::report::RunSummary::with_warmup(&r, 0.25);
        for (name, f) in [("ttft", &sum.ttft_forecast), ("tpot", &sum.tpot_forecast)] {
            if let Some(f) = f {
                println!(
                    "   after warm-up {name}: MAPE {:.1}% coverage {:.3}",
                    f.mape_pct,
                    f.coverage.unwrap_or(f64::NAN)
                );
            }
        }
        // Forecast error by tenant and replica, after the first 10% of arrivals.
        let skip = r.records.len() / 10;
        let mut groups: std::collections::BTreeMap<String, (f64, f64, usize)> = Default::default();
        for x in r.records.iter().skip(skip) {
            let key = format!(
                "{}@r{}",
                x.tenant.as_deref().unwrap_or("-"),
                x.replica.unwrap_or(99)
            );
            let e = groups.entry(key).or_default();
            if let (Some(a), Some(pr)) = (x.ttft_s, x.predicted_ttft_ms) {
                e.0 += (pr - a * 1e3).abs() / (a * 1e3);
                e.2 += 1;
            }
            if let (Some(a), Some(pr)) = (x.tpot_s, x.predicted_tpot_ms) {
                e.1 += (pr - a * 1e3).abs() / (a * 1e3);
            }
        }
        for (k, (t, p2, c)) in groups {
            println!(
                "   {k:14} n {c:5} ttft MAPE {:.1}% tpot MAPE {:.1}%",
                100.0 * t / c.max(1) as f64,
                100.0 * p2 / c.max(1) as f64
            );
        }
    }
    Ok(())
}
