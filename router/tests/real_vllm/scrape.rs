//! Test 2: the router's scraped view of each server (`/debug/replicas`) equals what
//! that server's own `/metrics` says: gauges under load, counters and the cache
//! config when quiet. Also: dropping client streams makes the servers abort them.

use std::time::{Duration, Instant};

use futures_util::future::join_all;
use serde_json::Value;

use super::{
    harness::{BLOCK_SIZE, EngineView, Env, GPU_BLOCKS, RouterProc, engine, post, stream},
    prompts,
    requests::{body, streaming},
};

/// Long requests per server: 2,000-token prompts in an 8,192-token KV cache. Four are
/// admitted, one is soon preempted as they grow, then three run and five wait for
/// seconds (1,500-token outputs), which gives steady gauges to compare. (With six, a
/// loaded 2-core machine sometimes read a server's `/metrics` too late to see a queue.)
const PER_SERVER: usize = 8;

async fn engines(env: &Env) -> Vec<EngineView> {
    join_all(env.urls.iter().map(|u| engine(u))).await
}

fn entry(view: &[Value], i: usize) -> &Value {
    view.iter()
        .find(|v| v["name"] == format!("vllm-{i}"))
        .unwrap_or_else(|| panic!("vllm-{i} missing from /debug/replicas"))
}

fn between(x: f64, a: f64, b: f64) -> bool {
    x >= a.min(b) && x <= a.max(b)
}

/// vLLM computes KV usage two ways that differ in the last bit (251/255 prints as
/// 0.984313725490196 and 0.9843137254901961): compare to within that.
const KV_ULP: f64 = 1e-12;

/// How the router's view compared with the server's reads `a` (≥ `GAP` before), `b`
/// (just before) and `c` (just after).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Compared {
    /// The server held still from `a` to `c` (same requests running and waiting, no
    /// preemption, so KV usage only grew): gauges compared exactly, KV within [a, c].
    Exact,
    /// The server's state moved (admissions, preemptions, completions): gauges are not
    /// monotonic then, so only the counters were compared.
    Moved,
    /// The router's scrape may predate `a`. Its age counts from when the scrape was
    /// sent (the server's answer is no older), so an age under `GAP` proves it did not.
    TooOld,
}

/// Time between the first server read and the router read.
const GAP: Duration = Duration::from_millis(500);

fn compare_loaded(i: usize, e: &Value, a: &EngineView, b: &EngineView, c: &EngineView) -> Compared {
    let s = &e["scraped"];
    let got = |k: &str| s[k].as_f64().unwrap_or(f64::NAN);
    let age = e["scraped_age_s"].as_f64().unwrap_or(f64::INFINITY);
    // A busy CPU server answers `/metrics` from the engine's own event loop: seconds.
    assert!(age < 10.0, "vllm-{i}: scrape {age:.2} s old");
    if age > GAP.as_secs_f64() * 0.8 {
        return Compared::TooOld;
    }
    // Counters only grow: the router read them between `a` and `c`.
    for (k, lo, hi) in [
        ("prefix_queries", a.prefix_queries, c.prefix_queries),
        ("prefix_hits", a.prefix_hits, c.prefix_hits),
        ("preemptions", a.preemptions, c.preemptions),
    ] {
        assert!(
            between(got(k), lo, hi),
            "vllm-{i} {k}: router {} not in server's [{lo}, {hi}]",
            got(k)
        );
    }
    // No admission either (the prefix-query counter moves at each): vLLM reports a
    // preemption only with the victim's next output, so a request re-admitted, part-
    // prefilled and preempted again inside the window leaves running, waiting and the
    // preemption counter as they were while the router saw one more running (CI, once).
    let still = [b, c].iter().all(|x| {
        x.running == a.running
            && x.waiting == a.waiting
            && x.preemptions == a.preemptions
            && x.prefix_queries == a.prefix_queries
    }) && a.kv_usage <= b.kv_usage + KV_ULP
        && b.kv_usage <= c.kv_usage + KV_ULP;
    if !still {
        return Compared::Moved;
    }
    assert_eq!(got("running"), c.running, "vllm-{i} running");
    assert_eq!(got("waiting"), c.waiting, "vllm-{i} waiting");
    assert!(
        between(got("kv_usage"), a.kv_usage - KV_ULP, c.kv_usage + KV_ULP),
        "vllm-{i} kv_usage: router {} vs server {} .. {}",
        got("kv_usage"),
        a.kv_usage,
        c.kv_usage
    );
    Compared::Exact
}

pub async fn run(env: &Env) {
    let r = RouterProc::start(env, "round-robin", "").await;
    let n_srv = env.urls.len();
    // A prefix hit on each server, so the hit counters are not trivially zero.
    for (i, u) in env.urls.iter().enumerate() {
        let b = body(false, &prompts::text("t2-hit", 100 + i as u64, 300), 2);
        for _ in 0..2 {
            assert_eq!(
                post(&format!("{u}/v1/completions"), &b, &[]).await.status,
                200
            );
        }
    }
    // Round-robin splits the load evenly.
    let mut tasks = Vec::new();
    for k in 0..PER_SERVER * n_srv {
        let url = r.url("/v1/completions");
        let b = streaming(
            body(false, &prompts::text("t2-load", 200 + k as u64, 2000), 1500),
            false,
        );
        tasks.push(tokio::spawn(async move { stream(&url, &b, &[]).await }));
    }
    let t0 = Instant::now();
    // The router's peak view counts from the first loaded moment: a server whose
    // requests end early (random EOS) may already be idle when the comparisons start.
    let mut peak = vec![(0.0f64, 0.0f64, 0.0f64); n_srv];
    let mut loaded = vec![false; n_srv];
    let see_peak = |peak: &mut Vec<(f64, f64, f64)>, view: &[Value]| {
        for (i, p) in peak.iter_mut().enumerate() {
            let s = &entry(view, i)["scraped"];
            let g = |k: &str| s[k].as_f64().unwrap_or(0.0);
            *p = (
                p.0.max(g("running")),
                p.1.max(g("waiting")),
                p.2.max(g("kv_usage")),
            );
        }
    };
    // Busy with a queue: what makes the comparison worth doing. Each server is watched
    // by its own poller and latched once seen so: a busy server's `/metrics` can take
    // seconds to answer, and the fast server of the pair may drain its share meanwhile.
    let latched: Vec<_> = env
        .urls
        .iter()
        .map(|u| {
            let u = u.clone();
            tokio::spawn(async move {
                let until = Instant::now() + Duration::from_secs(45);
                loop {
                    let v = engine(&u).await;
                    if v.running >= 2.0 && v.waiting >= 1.0 {
                        return true;
                    }
                    if Instant::now() > until {
                        return false;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            })
        })
        .collect();
    let mut watch = tokio::spawn(async move {
        let mut out = Vec::new();
        for l in latched {
            out.push(l.await.unwrap_or(false));
        }
        out
    });
    loop {
        see_peak(&mut peak, &r.debug_replicas().await);
        tokio::select! {
            got = &mut watch => {
                loaded = got.expect("pollers");
                break;
            }
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
    }
    // A server whose `/metrics` stayed too slow to see its queue is compared anyway (the
    // comparisons below hold loaded or not); seen twice in ~6 runs on the uneven pair.
    if !loaded.iter().all(|l| *l) {
        println!(
            "  note: load not seen on every server within 45 s ({loaded:?}, after {:.1} s)",
            t0.elapsed().as_secs_f64()
        );
    }
    assert!(
        loaded.iter().any(|l| *l),
        "load never arrived on any server"
    );
    let mut counts = vec![[0u32; 3]; n_srv];
    for _ in 0..12 {
        let a = engines(env).await;
        tokio::time::sleep(GAP).await;
        let b = engines(env).await;
        let view = r.debug_replicas().await;
        let c = engines(env).await;
        for i in 0..n_srv {
            let e = entry(&view, i);
            counts[i][compare_loaded(i, e, &a[i], &b[i], &c[i]) as usize] += 1;
        }
        see_peak(&mut peak, &view);
        if counts.iter().all(|c| c[Compared::Exact as usize] >= 2) {
            break;
        }
    }
    println!(
        "under load, per server [exact, moved (counters only), scrape too old]: {counts:?}; peak (running, waiting, kv) seen by the router {peak:?}"
    );
    for i in 0..n_srv {
        assert!(
            counts[i][0] >= 1,
            "vllm-{i}: never held still long enough to compare exactly: {counts:?}"
        );
        let (run, wait, kv) = peak[i];
        assert!(
            // Visible, not full: how far KV fills before the loop stops depends on the
            // machine's speed (the slow server peaked at 0.498 on a slower CI host).
            run >= 1.0 && wait >= 1.0 && kv > 0.25,
            "vllm-{i}: load not visible to the router: {:?}",
            peak[i]
        );
    }
    // Drop the client streams: the router closes upstream and vLLM aborts them.
    let mut finished = 0;
    for t in &tasks {
        if t.is_finished() {
            finished += 1;
        }
        t.abort();
    }
    for t in tasks {
        // A request that finished on its own must have finished well.
        if let Ok(s) = t.await {
            assert!(s.ok(), "a load request failed: {s:?}");
        }
    }
    let t0 = Instant::now();
    loop {
        let (m1, view, m2) = {
            let m1 = engines(env).await;
            tokio::time::sleep(Duration::from_millis(400)).await;
            let v = r.debug_replicas().await;
            (m1, v, engines(env).await)
        };
        let idle = m2.iter().all(|m| m.running == 0.0 && m.waiting == 0.0);
        if m1 != m2 || !idle {
            assert!(
                t0.elapsed() < Duration::from_secs(15),
                "servers still busy 15 s after every client left (cancellation not passed on?): {m2:?}"
            );
            continue;
        }
        // The router scrapes on its own pacing (slower when the engines answer
        // slowly): its view must reach the quiet engines' within the same 15 s.
        if let Err(why) = matches_quiet(&view, &m2) {
            assert!(
                t0.elapsed() < Duration::from_secs(15),
                "the router's view never matched the quiet servers: {why}"
            );
            continue;
        }
        println!(
            "servers idle {:.1} s after the clients dropped {} streams ({finished} had finished)",
            t0.elapsed().as_secs_f64(),
            PER_SERVER * n_srv - finished
        );
        for (i, m) in m2.iter().enumerate() {
            assert!(
                m.prefix_hits > 0.0 && m.prefix_queries > m.prefix_hits,
                "vllm-{i}: {m:?}"
            );
            println!(
                "quiet vllm-{i}: router == server: queries {} hits {} preemptions {} cache {}x{}",
                m.prefix_queries, m.prefix_hits, m.preemptions, m.num_gpu_blocks, m.block_size
            );
        }
        break;
    }
}

/// Whether the router's scraped view of every server equals the server's own quiet
/// metrics; the first difference otherwise.
fn matches_quiet(view: &[Value], engines: &[EngineView]) -> Result<(), String> {
    for (i, m) in engines.iter().enumerate() {
        let s = &entry(view, i)["scraped"];
        if s["engine"] != "vllm" {
            return Err(format!("vllm-{i} engine {}", s["engine"]));
        }
        if (m.block_size, m.num_gpu_blocks) != (BLOCK_SIZE, GPU_BLOCKS) {
            return Err(format!("vllm-{i} cache config {m:?}"));
        }
        if s["block_size"] != m.block_size || s["num_gpu_blocks"] != m.num_gpu_blocks {
            return Err(format!("vllm-{i} block size / blocks: {s}"));
        }
        let kv = s["kv_usage"].as_f64().unwrap_or(f64::NAN);
        if (kv - m.kv_usage).abs() > KV_ULP {
            return Err(format!("vllm-{i} kv_usage {kv} vs {}", m.kv_usage));
        }
        for (k, v) in [
            ("running", m.running),
            ("waiting", m.waiting),
            ("prefix_queries", m.prefix_queries),
            ("prefix_hits", m.prefix_hits),
            ("preemptions", m.preemptions),
        ] {
            if s[k].as_f64() != Some(v) {
                return Err(format!("vllm-{i} {k}: {} vs {v}", s[k]));
            }
        }
    }
    Ok(())
}
