//! Issue 15's must-show, live: a noisy tenant sending at 10× its fair share cannot take
//! a quiet tenant's SLO attainment below 90% of what the quiet tenant gets alone, and
//! the noisy tenant is told so with 429s carrying `Retry-After`. Real processes on
//! loopback: two `headroom-replica` emulators and a `headroom serve` router whose
//! admission gate holds each tenant to half of `per_replica_in_flight` × 2 under
//! overload.
//!
//! Three phases of 8 s (`HEADROOM_FAIRNESS_LONG=1`: 30 s): quiet alone; quiet + noisy
//! through the gated router; quiet + noisy through a second router without the gate
//! (`per_replica_in_flight = 0`), which must hurt the quiet tenant — else the load
//! proves nothing. The same shape as `sim_fairness.rs`. Figures are printed.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use headroom_bench::live::body::{PromptForm, completion_body};
use headroom_bench::live::client::{Outcome, http_client, send_streaming};
use headroom_bench::workload::Request;
use http::HeaderValue;

use common::{Guard, free_port, router_bin, start_replica, wait_http_ok};

const SLO_TTFT_MS: f64 = 500.0;
const SLO_TPOT_MS: f64 = 50.0;
/// Requests each replica runs before tenants are held to their shares.
const PER_REPLICA: u32 = 8;
/// A request not finished by then has missed its objective anyway.
const TIMEOUT: Duration = Duration::from_secs(5);
const REPLICAS: u32 = 2;

fn request(id: u64) -> Request {
    Request {
        id,
        arrival_s: 0.0,
        input_tokens: 512,
        output_tokens: 64,
        hash_ids: vec![],
        block_tokens: 16,
        tenant: None,
        slo_ttft_ms: None,
        slo_tpot_ms: None,
    }
}

fn config(port: u16, replicas: &[std::net::SocketAddr], per_replica: u32) -> String {
    let mut c = format!(
        "listen = \"127.0.0.1:{port}\"\npolicy = \"least-request\"\n\n\
         [admission]\nper_replica_in_flight = {per_replica}\nmax_queued = 64\nmax_wait_ms = 1000\n\n"
    );
    for (i, a) in replicas.iter().enumerate() {
        c += &format!(
            "[[replicas]]\nurl = \"http://{a}\"\nname = \"r{i}\"\nclass = \"h100-llama3-8b\"\n\n"
        );
    }
    for (name, key) in [("quiet", "k-quiet"), ("noisy", "k-noisy")] {
        c += &format!(
            "[[tenants]]\nname = \"{name}\"\napi_keys = [\"{key}\"]\n\
             slo_ttft_ms = {SLO_TTFT_MS}\nslo_tpot_ms = {SLO_TPOT_MS}\n\n"
        );
    }
    c += "[[models]]\nname = \"llama-3-8b\"\ntokenizer = \"cl100k\"\n";
    c
}

fn start_router(
    dir: &std::path::Path,
    replicas: &[std::net::SocketAddr],
    per_replica: u32,
) -> (Guard, String) {
    let port = free_port();
    let path = dir.join(format!("router-{port}.toml"));
    std::fs::write(&path, config(port, replicas, per_replica)).expect("write config");
    let child = Command::new(router_bin())
        .args(["--log", "warn", "serve", "--config"])
        .arg(&path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn headroom serve");
    (Guard(child), format!("http://127.0.0.1:{port}"))
}

/// What one phase measured.
#[derive(Debug, Default)]
struct Phase {
    quiet_sent: usize,
    quiet_met: usize,
    /// Mean arrival → end of the quiet tenant's requests (s).
    quiet_hold_s: f64,
    noisy_sent: usize,
    noisy_ok: usize,
    noisy_429: usize,
    /// `Retry-After` values on the noisy tenant's 429s (s).
    retry_after: Vec<u64>,
    noisy_other: Vec<u16>,
}

impl Phase {
    fn attainment(&self) -> f64 {
        self.quiet_met as f64 / self.quiet_sent.max(1) as f64
    }
}

fn met(o: &Outcome) -> bool {
    let (Some(first), true) = (o.tally.first_content, o.ok()) else {
        return false;
    };
    let ttft_ms = (first - o.sent).as_secs_f64() * 1e3;
    let tpot_ok = match (o.tally.last_content, o.tally.content_events) {
        (Some(last), n) if n > 1 => {
            (last - first).as_secs_f64() * 1e3 / f64::from(n - 1) <= SLO_TPOT_MS
        }
        _ => true,
    };
    ttft_ms <= SLO_TTFT_MS && tpot_ok
}

/// Quiet at `quiet_rate` (streaming, timed) and noisy at `noisy_rate` (plain), both
/// open-loop at even spacing, for `secs`.
async fn phase(url: &str, secs: f64, quiet_rate: f64, noisy_rate: f64) -> Phase {
    let client = http_client();
    let uri: http::Uri = format!("{url}/v1/completions").parse().expect("uri");
    let noisy_client = reqwest::Client::new();
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(secs);
    let mut quiet = Vec::new();
    let mut noisy = Vec::new();
    let (mut next_q, mut next_n) = (start, start);
    let (dq, dn) = (
        Duration::from_secs_f64(1.0 / quiet_rate),
        (noisy_rate > 0.0).then(|| Duration::from_secs_f64(1.0 / noisy_rate)),
    );
    let mut id = 0;
    while Instant::now() < end {
        let now = Instant::now();
        if now >= next_q {
            next_q += dq;
            id += 1;
            let body = bytes::Bytes::from(completion_body(
                &request(id),
                "llama-3-8b",
                None,
                None,
                PromptForm::Ids,
            ));
            let (client, uri) = (client.clone(), uri.clone());
            quiet.push(tokio::spawn(async move {
                let auth = [("authorization", HeaderValue::from_static("Bearer k-quiet"))];
                send_streaming(&client, &uri, body, &auth, TIMEOUT, |_| {}).await
            }));
        }
        if let Some(dn) = dn
            && now >= next_n
        {
            next_n += dn;
            id += 1;
            let mut body: serde_json::Value = serde_json::from_slice(&completion_body(
                &request(id),
                "llama-3-8b",
                None,
                None,
                PromptForm::Ids,
            ))
            .expect("json");
            body["stream"] = false.into();
            body.as_object_mut().map(|o| o.remove("stream_options"));
            let (c, u) = (noisy_client.clone(), format!("{url}/v1/completions"));
            noisy.push(tokio::spawn(async move {
                let r = c
                    .post(u)
                    .bearer_auth("k-noisy")
                    .json(&body)
                    .timeout(TIMEOUT)
                    .send()
                    .await;
                match r {
                    Ok(r) => {
                        let retry = r
                            .headers()
                            .get("retry-after")
                            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
                        let status = r.status().as_u16();
                        let _ = r.bytes().await;
                        (status, retry)
                    }
                    Err(_) => (0, None),
                }
            }));
        }
        let wake = match dn {
            Some(_) => next_q.min(next_n),
            None => next_q,
        };
        tokio::time::sleep_until(wake.into()).await;
    }
    let mut p = Phase::default();
    let mut hold = 0.0;
    for h in quiet {
        let o = h.await.expect("quiet task");
        p.quiet_sent += 1;
        p.quiet_met += usize::from(met(&o));
        hold += (o.end - o.sent).as_secs_f64();
    }
    p.quiet_hold_s = hold / p.quiet_sent.max(1) as f64;
    for h in noisy {
        let (status, retry) = h.await.expect("noisy task");
        p.noisy_sent += 1;
        match status {
            200 => p.noisy_ok += 1,
            429 => {
                p.noisy_429 += 1;
                p.retry_after.extend(retry);
            }
            s => p.noisy_other.push(s),
        }
    }
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_noisy_tenant_at_ten_times_its_share_keeps_the_quiet_tenants_attainment() {
    let long = std::env::var_os("HEADROOM_FAIRNESS_LONG").is_some();
    let secs = if long { 30.0 } else { 8.0 };
    let dir = tempfile::tempdir().expect("tempdir");
    let mut guards = Vec::new();
    let mut addrs = Vec::new();
    for _ in 0..REPLICAS {
        let (g, a) = start_replica("h100-llama3-8b", &["--time-scale", "1.0"]);
        wait_http_ok(&format!("http://{a}/health")).await;
        guards.push(g);
        addrs.push(a);
    }
    let (_router, url) = start_router(dir.path(), &addrs, PER_REPLICA);
    let (_open, open_url) = start_router(dir.path(), &addrs, 0);
    wait_http_ok(&format!("{url}/ready")).await;
    wait_http_ok(&format!("{open_url}/ready")).await;
    let began = Instant::now();
    let capacity = f64::from(PER_REPLICA * REPLICAS);
    // The quiet tenant runs about a quarter of the capacity on its own.
    let warm = phase(&url, 2.0, 4.0, 0.0).await;
    let quiet_rate = capacity / 4.0 / warm.quiet_hold_s.max(0.05);
    let alone = phase(&url, secs, quiet_rate, 0.0).await;
    // The noisy tenant's share is half the capacity; it sends ten times what that
    // serves (Little: share / hold requests per second).
    let noisy_rate = (10.0 * capacity / 2.0 / alone.quiet_hold_s.max(0.05)).min(400.0);
    let shared = phase(&url, secs, quiet_rate, noisy_rate).await;
    let ungated = phase(&open_url, secs, quiet_rate, noisy_rate).await;
    eprintln!(
        "fairness: phases took {:.1} s",
        began.elapsed().as_secs_f64()
    );
    eprintln!(
        "fairness: hold {:.3} s, quiet {:.1}/s, noisy {:.1}/s; quiet attainment alone {:.3} ({}/{}), \
         with noisy {:.3} ({}/{}), without the gate {:.3} ({}/{}); noisy through the gate: {} sent, \
         {} ok, {} × 429 (Retry-After {:?}..{:?} s), other {:?}; without: {} ok",
        alone.quiet_hold_s,
        quiet_rate,
        noisy_rate,
        alone.attainment(),
        alone.quiet_met,
        alone.quiet_sent,
        shared.attainment(),
        shared.quiet_met,
        shared.quiet_sent,
        ungated.attainment(),
        ungated.quiet_met,
        ungated.quiet_sent,
        shared.noisy_sent,
        shared.noisy_ok,
        shared.noisy_429,
        shared.retry_after.iter().min(),
        shared.retry_after.iter().max(),
        shared.noisy_other,
        ungated.noisy_ok,
    );
    assert!(
        alone.attainment() >= 0.8,
        "the quiet tenant alone should mostly meet its SLO: {alone:?}"
    );
    assert!(
        shared.attainment() >= 0.9 * alone.attainment(),
        "noisy neighbour took quiet's attainment from {:.3} to {:.3}",
        alone.attainment(),
        shared.attainment()
    );
    assert!(
        ungated.attainment() < 0.9 * alone.attainment(),
        "without the gate the noisy load should hurt ({:.3} vs {:.3}): it proves nothing",
        ungated.attainment(),
        alone.attainment()
    );
    assert!(
        shared.noisy_429 > shared.noisy_sent / 2,
        "the noisy tenant should mostly be refused: {shared:?}"
    );
    assert_eq!(
        shared.retry_after.len(),
        shared.noisy_429,
        "every 429 carries Retry-After"
    );
    assert!(shared.retry_after.iter().all(|s| (1..=3600).contains(s)));
    assert!(shared.noisy_ok > 0, "the noisy tenant still gets its share");
    // The router counted it per tenant and reason.
    let metrics = reqwest::get(format!("{url}/metrics"))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("headroom_admission_total{")
                && l.contains("tenant=\"noisy\"")
                && l.contains("outcome=\"rejected\"")),
        "{metrics}"
    );
}
