//! Issue 12's live must-show: disaggregated prefill/decode through a real `headroom
//! serve` against emulated vLLM NixlConnector replicas — 2 prefill + 2 decode
//! `headroom-replica --role ...` processes on loopback.
//!
//! Phase 1: 48 requests (streaming and not, completions and chat, 1,500-token
//! prompts, 24 output tokens) four at a time: every one completes whole, each
//! response names its decode (`x-headroom-replica`) and prefill
//! (`x-headroom-prefill-replica`) replicas, and a short prompt runs unified on a
//! decode replica. The forecast error of TTFT and TPOT on the P/D placements of the
//! second half (models warm) is printed.
//! Phase 2: 40 more while one prefill and one decode replica are killed mid-run:
//! still every request completes with all its tokens.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::sync::Semaphore;

use common::{Guard, free_port, router_bin, start_replica, wait_http_ok};

const MODEL: &str = "llama-3-8b";
const OUTPUT: u64 = 24;

fn config(port: u16, reps: &[(&str, &str, std::net::SocketAddr)]) -> String {
    let mut c = format!(
        "listen = \"127.0.0.1:{port}\"\npolicy = \"slo\"\n\n\
         [health]\nprobe_interval_ms = 50\nprobe_timeout_ms = 200\nbackoff_initial_ms = 300\n\n\
         [scrape]\ninterval_ms = 100\n\n\
         [proxy]\nfirst_byte_timeout_ms = 5000\nidle_timeout_ms = 3000\n\n\
         [pd]\nmin_prompt_tokens = 256\n\n"
    );
    for (name, role, a) in reps {
        c += &format!(
            "[[replicas]]\nurl = \"http://{a}\"\nname = \"{name}\"\nclass = \"h100-{role}\"\nrole = \"{role}\"\n\n"
        );
    }
    c += &format!("[[models]]\nname = \"{MODEL}\"\ntokenizer = \"cl100k\"\n");
    c
}

fn prompt(i: usize, words: usize) -> String {
    let mut s = format!("request {i}:");
    for w in 0..words {
        s.push_str(&format!(" w{}", (w * 7 + i) % 997));
    }
    s
}

fn body(i: usize, words: usize, stream: bool, chat: bool) -> Value {
    let mut b = if chat {
        json!({"model": MODEL, "messages": [{"role": "user", "content": prompt(i, words)}]})
    } else {
        json!({"model": MODEL, "prompt": prompt(i, words)})
    };
    b["max_tokens"] = json!(OUTPUT);
    b["ignore_eos"] = json!(true);
    b["stream"] = json!(stream);
    if stream {
        b["stream_options"] = json!({"include_usage": true});
    }
    b
}

/// One answered request, as the client saw it.
#[derive(Debug)]
struct Done {
    decode: Option<String>,
    prefill: Option<String>,
    stream: bool,
    ttft_ms: Option<f64>,
    tpot_ms: Option<f64>,
    predicted_ttft_ms: Option<f64>,
    predicted_tpot_ms: Option<f64>,
}

fn header(r: &reqwest::Response, k: &str) -> Option<String> {
    r.headers()
        .get(k)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// Sends one request; `Err` says how it was lost (status, broken or short stream).
async fn send(c: &reqwest::Client, url: &str, i: usize, words: usize) -> Result<Done, String> {
    let (stream, chat) = (i.is_multiple_of(2), i % 4 < 2);
    let path = if chat {
        "/v1/chat/completions"
    } else {
        "/v1/completions"
    };
    let sent = Instant::now();
    let mut r = c
        .post(format!("{url}{path}"))
        .json(&body(i, words, stream, chat))
        .send()
        .await
        .map_err(|e| format!("transport: {e}"))?;
    let status = r.status();
    let f = |k: &str, r: &reqwest::Response| header(r, k).and_then(|v| v.parse::<f64>().ok());
    let mut done = Done {
        decode: header(&r, "x-headroom-replica"),
        prefill: header(&r, "x-headroom-prefill-replica"),
        stream,
        ttft_ms: None,
        tpot_ms: None,
        predicted_ttft_ms: f("x-headroom-predicted-ttft-ms", &r),
        predicted_tpot_ms: f("x-headroom-predicted-tpot-ms", &r),
    };
    if !status.is_success() {
        let text = r.text().await.unwrap_or_default();
        return Err(format!("HTTP {status}: {text}"));
    }
    let tokens = if stream {
        let (mut buf, mut first, mut last, mut usage, mut finished) =
            (Vec::new(), None, None, None, false);
        let mut content = 0u32;
        while let Some(chunk) = r.chunk().await.map_err(|e| format!("stream broke: {e}"))? {
            buf.extend_from_slice(&chunk);
            while let Some(end) = buf.windows(2).position(|w| w == b"\n\n") {
                let ev: Vec<u8> = buf.drain(..end + 2).collect();
                let line = String::from_utf8_lossy(&ev);
                let Some(data) = line.trim().strip_prefix("data: ") else {
                    continue;
                };
                if data == "[DONE]" {
                    finished = true;
                    continue;
                }
                let v: Value = serde_json::from_str(data).map_err(|e| format!("bad event: {e}"))?;
                if v.get("error").is_some() {
                    return Err(format!("error event: {data}"));
                }
                let c0 = &v["choices"][0];
                let text = c0["text"]
                    .as_str()
                    .or_else(|| c0["delta"]["content"].as_str())
                    .unwrap_or("");
                if !text.is_empty() {
                    let now = Instant::now();
                    first.get_or_insert(now);
                    last = Some(now);
                    content += 1;
                }
                if let Some(n) = v["usage"]["completion_tokens"].as_u64() {
                    usage = Some(n);
                }
            }
        }
        if !finished {
            return Err("stream ended without [DONE]".into());
        }
        if let (Some(a), Some(b)) = (first, last) {
            done.ttft_ms = Some((a - sent).as_secs_f64() * 1e3);
            if content > 1 {
                done.tpot_ms = Some((b - a).as_secs_f64() * 1e3 / f64::from(content - 1));
            }
        }
        usage.ok_or("no usage chunk")?
    } else {
        let v: Value = r.json().await.map_err(|e| format!("bad JSON: {e}"))?;
        if v.get("kv_transfer_params").is_some_and(|p| !p.is_null()) && done.prefill.is_none() {
            return Err("a unified answer carries kv_transfer_params".into());
        }
        v["usage"]["completion_tokens"].as_u64().ok_or("no usage")?
    };
    if tokens != OUTPUT {
        return Err(format!("{tokens} of {OUTPUT} tokens"));
    }
    Ok(done)
}

/// Runs `n` requests from `first`, four at a time; `after(k)` runs once `k` finished.
async fn run(
    url: &str,
    first: usize,
    n: usize,
    mut at: Option<(usize, Box<dyn FnOnce() + Send>)>,
) -> Vec<Result<Done, String>> {
    let c = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client");
    let slots = Arc::new(Semaphore::new(4));
    let finished = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in first..first + n {
        let permit = slots.clone().acquire_owned().await.expect("semaphore");
        if let Some((k, _)) = &at
            && finished.load(SeqCst) >= *k
            && let Some((_, f)) = at.take()
        {
            f();
        }
        let (c, url, finished) = (c.clone(), url.to_string(), finished.clone());
        tasks.push(tokio::spawn(async move {
            let out = send(&c, &url, i, 1500).await;
            finished.fetch_add(1, SeqCst);
            drop(permit);
            out
        }));
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.expect("request task"));
    }
    out
}

/// Median absolute percentage error of `(predicted, measured)` pairs.
fn mape(pairs: &[(f64, f64)]) -> f64 {
    let mut e: Vec<f64> = pairs
        .iter()
        .map(|(p, m)| (p - m).abs() / m.max(1e-9))
        .collect();
    e.sort_by(f64::total_cmp);
    e.get(e.len() / 2).copied().unwrap_or(f64::NAN) * 100.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pd_through_the_router_loses_nothing_when_a_prefill_and_a_decode_die() {
    let mut procs: HashMap<&str, Guard> = HashMap::new();
    let mut reps = Vec::new();
    for (name, role) in [
        ("p0", "prefill"),
        ("p1", "prefill"),
        ("d0", "decode"),
        ("d1", "decode"),
    ] {
        let (g, a) = start_replica("h100-llama3-8b", &["--role", role]);
        procs.insert(name, g);
        reps.push((name, role, a));
    }
    let port = free_port();
    let dir = std::env::temp_dir().join(format!("headroom-pd-{port}"));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("router.toml");
    std::fs::write(&path, config(port, &reps)).expect("write config");
    let router = Guard(
        std::process::Command::new(router_bin())
            .args(["--log", "warn", "serve", "--config"])
            .arg(&path)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawn headroom serve"),
    );
    let url = format!("http://127.0.0.1:{port}");
    wait_http_ok(&format!("{url}/health")).await;
    // Ready once every replica's models are known (a first request might 503 before).
    tokio::time::sleep(Duration::from_millis(800)).await;

    // A short prompt is not worth a transfer: unified, on a decode replica.
    let c = reqwest::Client::new();
    let short = send(&c, &url, 1, 20).await.expect("short prompt");
    assert_eq!(short.prefill, None, "a 20-word prompt runs unified");
    assert!(short.decode.as_deref().is_some_and(|d| d.starts_with('d')));

    let phase1 = run(&url, 100, 48, None).await;
    let lost: Vec<_> = phase1.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(lost.is_empty(), "phase 1 lost {}: {lost:?}", lost.len());
    let ok: Vec<&Done> = phase1.iter().filter_map(|r| r.as_ref().ok()).collect();
    for d in &ok {
        assert!(
            d.prefill.as_deref().is_some_and(|p| p.starts_with('p')),
            "{d:?}"
        );
        assert!(
            d.decode.as_deref().is_some_and(|p| p.starts_with('d')),
            "{d:?}"
        );
    }
    let per = |f: fn(&Done) -> Option<String>| {
        let mut m: HashMap<String, usize> = HashMap::new();
        for d in &ok {
            *m.entry(f(d).unwrap_or_default()).or_default() += 1;
        }
        m
    };
    println!(
        "phase 1 prefill placements {:?}",
        per(|d| d.prefill.clone())
    );
    println!("phase 1 decode placements {:?}", per(|d| d.decode.clone()));
    // Forecast error on the warm half's streamed P/D placements.
    let warm = &ok[ok.len() / 2..];
    let ttft: Vec<(f64, f64)> = warm
        .iter()
        .filter(|d| d.stream)
        .filter_map(|d| Some((d.predicted_ttft_ms?, d.ttft_ms?)))
        .collect();
    let tpot: Vec<(f64, f64)> = warm
        .iter()
        .filter(|d| d.stream)
        .filter_map(|d| Some((d.predicted_tpot_ms?, d.tpot_ms?)))
        .collect();
    println!(
        "P/D forecast error (median APE, warm half, {} / {} streams): TTFT {:.1}%, TPOT {:.1}%",
        ttft.len(),
        tpot.len(),
        mape(&ttft),
        mape(&tpot)
    );
    assert!(
        !ttft.is_empty() && !tpot.is_empty(),
        "no forecasts to score"
    );

    // Kill one prefill and one decode replica once 8 of the next 40 finished.
    let p0 = procs.remove("p0").expect("p0");
    let d0 = procs.remove("d0").expect("d0");
    let kill: Box<dyn FnOnce() + Send> = Box::new(move || {
        drop(p0);
        drop(d0);
    });
    let phase2 = run(&url, 200, 40, Some((8, kill))).await;
    let lost: Vec<_> = phase2.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(lost.is_empty(), "phase 2 lost {}: {lost:?}", lost.len());
    let late: Vec<&Done> = phase2[30..]
        .iter()
        .filter_map(|r| r.as_ref().ok())
        .collect();
    for d in &late {
        assert_eq!(d.prefill.as_deref(), Some("p1"), "{d:?}");
        assert_eq!(d.decode.as_deref(), Some("d1"), "{d:?}");
    }
    println!("phase 2: 40 of 40 complete with p0 and d0 killed after 8");
    drop(router);
    let _ = std::fs::remove_dir_all(&dir);
}
