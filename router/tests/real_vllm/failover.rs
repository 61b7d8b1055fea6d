//! Test 5: a server SIGKILLed mid-run is ejected and later requests keep succeeding
//! on the other. It leaves that server dead, so it runs last.

use std::{
    collections::BTreeMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering::Relaxed},
    },
    time::{Duration, Instant},
};

use super::{
    harness::{self, Env, RouterProc, Streamed, metric, stream},
    prompts,
    requests::{body, streaming},
};

/// Concurrent request streams kept running across the kill.
const WORKERS: u64 = 3;

pub async fn run(env: &Env) {
    let run_dir = env
        .run_dir
        .clone()
        .expect("needs HEADROOM_VLLM_RUN_DIR (the start.sh run dir) to kill a server");
    // Round-robin keeps sending the victim its share until it is ejected, so the
    // retry before the first byte is exercised too.
    let r = RouterProc::start(env, "round-robin", "").await;
    let victim = 1usize;
    let victim_name = format!("vllm-{victim}");
    let pid = harness::server_pid(&run_dir, harness::server_index(&run_dir, &env.urls[victim]));
    let t0 = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    // (start s, end s, what the client saw)
    let log: Arc<Mutex<Vec<(f64, f64, Streamed)>>> = Arc::new(Mutex::new(Vec::new()));
    let mut workers = Vec::new();
    for w in 0..WORKERS {
        let (stop, log, url) = (stop.clone(), log.clone(), r.url("/v1/completions"));
        workers.push(tokio::spawn(async move {
            let mut k = 0u64;
            while !stop.load(Relaxed) {
                let b = streaming(
                    body(false, &prompts::text("t5", w * 1000 + k, 200), 64),
                    false,
                );
                let start = t0.elapsed().as_secs_f64();
                let s = stream(&url, &b, &[]).await;
                log.lock()
                    .expect("lock")
                    .push((start, t0.elapsed().as_secs_f64(), s));
                k += 1;
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let killed_at = t0.elapsed().as_secs_f64();
    // The API server leads its process group (start.sh uses setsid): engine and
    // worker processes die with it.
    let st = std::process::Command::new("kill")
        .args(["-KILL", "--", &format!("-{pid}")])
        .status()
        .expect("run kill");
    assert!(st.success(), "kill -KILL -{pid} failed");
    println!("  SIGKILLed {victim_name} (process group {pid}) at {killed_at:.2} s");
    let ejected_at = loop {
        let view = r.debug_replicas().await;
        let v = view
            .iter()
            .find(|v| v["name"] == victim_name.as_str())
            .expect("victim listed");
        if v["health"] == "ejected" {
            break t0.elapsed().as_secs_f64();
        }
        assert!(
            t0.elapsed().as_secs_f64() - killed_at < 15.0,
            "not ejected 15 s after the kill: {v}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    tokio::time::sleep(Duration::from_secs(4)).await;
    stop.store(true, Relaxed);
    for w in workers {
        w.await.expect("worker");
    }
    let log = std::mem::take(&mut *log.lock().expect("lock"));
    let mut before = BTreeMap::<String, usize>::new();
    let mut around = BTreeMap::<String, usize>::new();
    let (mut after, mut cut) = (0, 0);
    for (start, end, s) in log.iter() {
        let name = s.replica.clone().unwrap_or_else(|| "none".into());
        if *end < killed_at {
            assert!(s.ok(), "before the kill: {s:?}");
            *before.entry(name).or_default() += 1;
        } else if *start > ejected_at {
            assert!(s.ok(), "after the ejection a request failed: {s:?}");
            assert_eq!(
                name, "vllm-0",
                "after the ejection a request went to the dead server"
            );
            after += 1;
        } else if s.ok() {
            *around.entry(name).or_default() += 1;
        } else {
            cut += 1;
            // A stream cut by the kill ends cleanly: an error event then [DONE].
            assert!(
                s.transport_error.is_none() && s.status == 200 && s.error_event && s.done,
                "a request in flight at the kill did not end cleanly: {s:?}"
            );
        }
    }
    let m = r.metrics().await;
    println!(
        "  before the kill per replica {before:?}; ejected {:.2} s after the kill; between kill and ejection: ok per replica {around:?}, {cut} cut cleanly; after the ejection {after} ok, all on vllm-0; {:?}",
        ejected_at - killed_at,
        m.lines()
            .filter(|l| l.starts_with("headroom_retries_total")
                || l.starts_with("headroom_upstream_errors_total"))
            .collect::<Vec<_>>(),
    );
    assert!(
        before.contains_key(&victim_name) || cut > 0,
        "{victim_name} served nothing before the kill: {before:?}"
    );
    assert!(
        after >= 5,
        "too few requests after the ejection to judge: {after}"
    );
    assert!(
        metric(&m, "headroom_ejections_total", &[("replica", &victim_name)]).unwrap_or(0.0) >= 1.0
    );
    let ready = harness::get_text(&r.url("/ready")).await;
    assert!(ready.contains("1 healthy"), "{ready}");
}
