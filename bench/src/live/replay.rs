//! The load generator: replays a [`Workload`] against OpenAI-compatible endpoints.
//!
//! Invariants:
//! - Request `i` is sent at `start + (arrival_i − arrival_0) / rate_scale × time_scale`
//!   wall seconds from a bounded pool: at most `max_inflight` tokio tasks exist at once
//!   (a semaphore permit per task). When the pool is full the dispatcher waits, and the
//!   delay is reported as send lag rather than hidden.
//! - Every workload request yields exactly one [`RequestRecord`] (failed ones too).
//! - Times in records are model seconds: wall durations divided by `time_scale`, so a
//!   live run compares with the simulator at the same workload. The router lives in
//!   wall time, so the objectives sent as `x-slo-*-ms` headers are multiplied by
//!   `time_scale` and its `x-headroom-predicted-*` values are divided by it. TTFT is measured from
//!   the moment the request is sent to its first content event; TPOT is
//!   (last − first content) / (completion tokens − 1) with the server's token count.
//! - A request that does not complete (HTTP error, in-stream error, truncation,
//!   timeout) is recorded `rejected` with no latencies and its reason in `fallback`
//!   (`"error: …"`), so it counts as a miss in every attainment figure.
//! - Load samples are the client's own view: requests whose response headers named a
//!   replica and whose stream has not ended, per replica, every
//!   `load_sample_interval_s` model seconds. Without an `x-headroom-replica` header the
//!   target URL itself stands for the replica.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderValue, Uri};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::LiveError;
use super::body::{PromptForm, completion_body};
use super::client::{HttpClient, Outcome, http_client, send_streaming};
use crate::sim::result::{LoadSample, ReplicaInfo, RequestRecord};
use crate::workload::{Request, Workload};

/// How to replay.
#[derive(Clone, Debug)]
pub struct ReplayOptions {
    /// Base URLs (`http://host:port`); each request goes to one, chosen at random
    /// (seeded) like the simulator spreads arrivals over router nodes.
    pub targets: Vec<String>,
    /// `model` field of every request.
    pub model: String,
    /// Wall seconds per model second; must equal the emulators' `--time-scale`.
    pub time_scale: f64,
    /// Arrival-rate multiplier (2 = twice the workload's rate).
    pub rate_scale: f64,
    /// Largest number of requests in flight (tasks alive) at once.
    pub max_inflight: usize,
    /// Wall-clock limit for one request.
    pub request_timeout: Duration,
    /// Context window of the fleet, to keep `max_tokens` valid (None = unknown).
    pub max_model_len: Option<u32>,
    /// Fold prompt token ids below this (a real model's vocabulary size).
    pub vocab: Option<u32>,
    /// Token ids or text.
    pub prompt_form: PromptForm,
    /// Objectives for requests that carry none (sent as headers either way).
    pub default_slo_ttft_ms: f64,
    pub default_slo_tpot_ms: f64,
    pub seed: u64,
    /// Replicas known in advance (index order of records); more are added as
    /// responses name them.
    pub replicas: Vec<ReplicaInfo>,
    /// Model seconds between load samples (0 = no samples).
    pub load_sample_interval_s: f64,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        ReplayOptions {
            targets: Vec::new(),
            model: "llama-3-8b".into(),
            time_scale: 1.0,
            rate_scale: 1.0,
            max_inflight: 1024,
            request_timeout: Duration::from_secs(600),
            max_model_len: None,
            vocab: None,
            prompt_form: PromptForm::Ids,
            default_slo_ttft_ms: 2_000.0,
            default_slo_tpot_ms: 100.0,
            seed: 1,
            replicas: Vec::new(),
            load_sample_interval_s: 1.0,
        }
    }
}

impl ReplayOptions {
    fn validate(&self) -> Result<(), LiveError> {
        let bad = |m: String| Err(LiveError::Options(m));
        if self.targets.is_empty() {
            return bad("no target URL".into());
        }
        if !(self.time_scale.is_finite() && self.time_scale > 0.0) {
            return bad(format!("time scale must be > 0, got {}", self.time_scale));
        }
        if !(self.rate_scale.is_finite() && self.rate_scale > 0.0) {
            return bad(format!("rate scale must be > 0, got {}", self.rate_scale));
        }
        if self.max_inflight == 0 {
            return bad("max in-flight must be at least 1".into());
        }
        if !(self.load_sample_interval_s.is_finite() && self.load_sample_interval_s >= 0.0) {
            return bad("load sample interval must be >= 0".into());
        }
        Ok(())
    }
}

/// What a replay measured.
#[derive(Clone, Debug, Default)]
pub struct Replay {
    /// One per workload request, in workload order.
    pub records: Vec<RequestRecord>,
    pub load: Vec<LoadSample>,
    /// Known and discovered replicas, in record index order.
    pub replicas: Vec<ReplicaInfo>,
    /// Wall seconds from the first send to the last completion.
    pub wall_s: f64,
    /// Largest delay of a send behind its schedule (wall seconds).
    pub max_send_lag_s: f64,
    /// Requests that did not complete.
    pub failed: usize,
}

/// Replica names → indices, and the client-side in-flight count of each.
#[derive(Debug)]
struct ReplicaBook {
    inner: Mutex<(Vec<ReplicaInfo>, Vec<u32>)>,
}

impl ReplicaBook {
    fn new(known: &[ReplicaInfo]) -> Self {
        ReplicaBook {
            inner: Mutex::new((known.to_vec(), vec![0; known.len()])),
        }
    }

    /// Index of `name`, added (profile unknown) on first sight.
    fn index(&self, name: &str) -> u32 {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let (names, counts) = &mut *g;
        if let Some(i) = names.iter().position(|r| r.name == name) {
            return i as u32;
        }
        names.push(ReplicaInfo {
            name: name.to_string(),
            profile: String::new(),
        });
        counts.push(0);
        (names.len() - 1) as u32
    }

    fn add(&self, i: u32, delta: i32) {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = g.1.get_mut(i as usize) {
            *c = c.saturating_add_signed(delta);
        }
    }

    fn snapshot(&self) -> Vec<u32> {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .1
            .clone()
    }

    fn replicas(&self) -> Vec<ReplicaInfo> {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .0
            .clone()
    }
}

/// Per-request facts fixed at dispatch.
struct Dispatch {
    index: usize,
    node: u32,
    arrival_model_s: f64,
}

fn slo_of(r: &Request, o: &ReplayOptions) -> (f64, f64) {
    (
        r.slo_ttft_ms.unwrap_or(o.default_slo_ttft_ms),
        r.slo_tpot_ms.unwrap_or(o.default_slo_tpot_ms),
    )
}

/// An objective in model ms as the wall-clock ms header the router compares its own
/// (wall-clock) predictions with.
fn slo_header(model_ms: f64, time_scale: f64) -> HeaderValue {
    let wall = (model_ms * time_scale).max(0.001);
    HeaderValue::from_str(&format!("{wall:.3}")).unwrap_or(HeaderValue::from_static("1"))
}

/// Replays `wl` as `opts` say and measures every request.
pub async fn replay(wl: &Workload, opts: &ReplayOptions) -> Result<Replay, LiveError> {
    opts.validate()?;
    if wl.requests.is_empty() {
        return Err(LiveError::Options("the workload has no requests".into()));
    }
    let uris = opts
        .targets
        .iter()
        .map(|t| completions_uri(t))
        .collect::<Result<Vec<_>, _>>()?;
    let client = http_client();
    let book = Arc::new(ReplicaBook::new(&opts.replicas));
    let pool = Arc::new(Semaphore::new(opts.max_inflight));
    let opts_arc = Arc::new(opts.clone());
    let mut rng = ChaCha8Rng::seed_from_u64(opts.seed);
    let t0 = wl.requests[0].arrival_s;
    let start = tokio::time::Instant::now();
    let start_std = Instant::now();
    let stop_sampler = CancellationToken::new();
    let sampler = (opts.load_sample_interval_s > 0.0).then(|| {
        tokio::spawn(sample_load(
            book.clone(),
            Duration::from_secs_f64(opts.load_sample_interval_s * opts.time_scale),
            opts.time_scale,
            start_std,
            stop_sampler.clone(),
        ))
    });
    let mut tasks: JoinSet<(usize, RequestRecord)> = JoinSet::new();
    let mut records: Vec<Option<RequestRecord>> = vec![None; wl.requests.len()];
    let mut max_lag = 0.0f64;
    for (i, r) in wl.requests.iter().enumerate() {
        let arrival_model_s = (r.arrival_s - t0).max(0.0) / opts.rate_scale;
        let due = start + Duration::from_secs_f64(arrival_model_s * opts.time_scale);
        tokio::time::sleep_until(due).await;
        let permit = pool
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| LiveError::Measure("request pool closed".into()))?;
        max_lag = max_lag.max(
            tokio::time::Instant::now()
                .duration_since(due)
                .as_secs_f64(),
        );
        while let Some(done) = tasks.try_join_next() {
            store(&mut records, done)?;
        }
        let node = if uris.len() > 1 {
            rng.random_range(0..uris.len())
        } else {
            0
        };
        let d = Dispatch {
            index: i,
            node: node as u32,
            arrival_model_s,
        };
        let (client, uri, book, o, req) = (
            client.clone(),
            uris[node].clone(),
            book.clone(),
            opts_arc.clone(),
            r.clone(),
        );
        tasks.spawn(async move {
            let rec = one_request(&client, &uri, &book, &o, &req, &d).await;
            drop(permit);
            (d.index, rec)
        });
    }
    while let Some(done) = tasks.join_next().await {
        store(&mut records, done)?;
    }
    let wall_s = start_std.elapsed().as_secs_f64();
    stop_sampler.cancel();
    let mut load = match sampler {
        Some(h) => h.await.unwrap_or_default(),
        None => Vec::new(),
    };
    let replicas = book.replicas();
    for s in &mut load {
        s.inflight.resize(replicas.len(), 0);
    }
    let records: Vec<RequestRecord> = records.into_iter().flatten().collect();
    if records.len() != wl.requests.len() {
        return Err(LiveError::Measure(format!(
            "{} of {} requests produced no record",
            wl.requests.len() - records.len(),
            wl.requests.len()
        )));
    }
    let failed = records.iter().filter(|r| r.rejected).count();
    Ok(Replay {
        records,
        load,
        replicas,
        wall_s,
        max_send_lag_s: max_lag,
        failed,
    })
}

fn store(
    records: &mut [Option<RequestRecord>],
    done: Result<(usize, RequestRecord), tokio::task::JoinError>,
) -> Result<(), LiveError> {
    let (i, rec) = done.map_err(|e| LiveError::Measure(format!("request task failed: {e}")))?;
    if let Some(slot) = records.get_mut(i) {
        *slot = Some(rec);
    }
    Ok(())
}

/// `base` + `/v1/completions`, validated.
pub fn completions_uri(base: &str) -> Result<Uri, LiveError> {
    let bad = |why: &str| LiveError::Target {
        url: base.to_string(),
        why: why.to_string(),
    };
    let trimmed = base.trim_end_matches('/');
    let trimmed = trimmed.strip_suffix("/v1").unwrap_or(trimmed);
    let uri: Uri = format!("{trimmed}/v1/completions")
        .parse()
        .map_err(|_| bad("not a URL"))?;
    if uri.scheme_str() != Some("http") || uri.authority().is_none() {
        return Err(bad("want http://host:port (TLS is not supported)"));
    }
    Ok(uri)
}

async fn one_request(
    client: &HttpClient,
    uri: &Uri,
    book: &ReplicaBook,
    o: &ReplayOptions,
    r: &Request,
    d: &Dispatch,
) -> RequestRecord {
    let (slo_ttft_ms, slo_tpot_ms) = slo_of(r, o);
    let body = Bytes::from(completion_body(
        r,
        &o.model,
        o.max_model_len,
        o.vocab,
        o.prompt_form,
    ));
    let headers = [
        ("x-slo-ttft-ms", slo_header(slo_ttft_ms, o.time_scale)),
        ("x-slo-tpot-ms", slo_header(slo_tpot_ms, o.time_scale)),
    ];
    let fallback_name = uri
        .authority()
        .map_or_else(|| uri.to_string(), |a| format!("http://{a}"));
    let mut placed: Option<u32> = None;
    let out = send_streaming(client, uri, body, &headers, o.request_timeout, |name| {
        let i = book.index(name.unwrap_or(&fallback_name));
        book.add(i, 1);
        placed = Some(i);
    })
    .await;
    if let Some(i) = placed {
        book.add(i, -1);
    }
    let replica = placed.or_else(|| out.replica.as_deref().map(|n| book.index(n)));
    record_of(r, d, o, &out, replica, slo_ttft_ms, slo_tpot_ms)
}

fn record_of(
    r: &Request,
    d: &Dispatch,
    o: &ReplayOptions,
    out: &Outcome,
    replica: Option<u32>,
    slo_ttft_ms: f64,
    slo_tpot_ms: f64,
) -> RequestRecord {
    let f = o.time_scale;
    let model = |a: Instant, b: Instant| b.saturating_duration_since(a).as_secs_f64() / f;
    let mut rec = RequestRecord {
        id: r.id,
        tenant: r.tenant.clone(),
        arrival_s: d.arrival_model_s,
        replica,
        node: d.node,
        input_tokens: r.input_tokens,
        slo_ttft_ms,
        slo_tpot_ms,
        predicted_ttft_ms: out.predicted.ttft_ms.map(|v| v / f),
        predicted_ttft_upper_ms: out.predicted.ttft_upper_ms.map(|v| v / f),
        predicted_tpot_ms: out.predicted.tpot_ms.map(|v| v / f),
        predicted_tpot_upper_ms: out.predicted.tpot_upper_ms.map(|v| v / f),
        fallback: out.fallback.clone(),
        ..RequestRecord::default()
    };
    if let Some(e) = &out.error {
        rec.rejected = true;
        rec.fallback = Some(format!("error: {e}"));
        rec.output_tokens = out.tally.output_tokens();
        return rec;
    }
    let t = &out.tally;
    if let Some(u) = t.usage {
        rec.input_tokens = u.prompt_tokens;
        rec.cached_tokens = u.cached_tokens;
    }
    rec.output_tokens = t.output_tokens();
    rec.ttft_s = t.first_content.map(|first| model(out.sent, first));
    rec.tpot_s = match (t.first_content, t.last_content) {
        (Some(a), Some(b)) if rec.output_tokens >= 2 => {
            Some(model(a, b) / f64::from(rec.output_tokens - 1))
        }
        _ => None,
    };
    rec.e2e_s = Some(model(out.sent, out.end));
    rec
}

/// Samples the book until `stop`; times in model seconds since `start`.
async fn sample_load(
    book: Arc<ReplicaBook>,
    every: Duration,
    time_scale: f64,
    start: Instant,
    stop: CancellationToken,
) -> Vec<LoadSample> {
    let mut out = Vec::new();
    let mut tick = tokio::time::interval(every.max(Duration::from_millis(1)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return out,
            _ = tick.tick() => out.push(LoadSample {
                t_s: start.elapsed().as_secs_f64() / time_scale,
                inflight: book.snapshot(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objectives_are_sent_in_wall_time() {
        assert_eq!(slo_header(500.0, 0.1).to_str().ok(), Some("50.000"));
        assert_eq!(slo_header(50.0, 1.0).to_str().ok(), Some("50.000"));
        assert_eq!(slo_header(0.0, 1.0).to_str().ok(), Some("0.001"));
    }

    #[test]
    fn target_urls_are_checked() {
        assert_eq!(
            completions_uri("http://127.0.0.1:9/")
                .expect("ok")
                .to_string(),
            "http://127.0.0.1:9/v1/completions"
        );
        assert_eq!(
            completions_uri("http://127.0.0.1:9/v1")
                .expect("ok")
                .to_string(),
            "http://127.0.0.1:9/v1/completions"
        );
        assert!(completions_uri("https://x:1").is_err());
        assert!(completions_uri("not a url").is_err());
    }

    #[test]
    fn book_assigns_stable_indices_and_counts() {
        let b = ReplicaBook::new(&[ReplicaInfo {
            name: "a".into(),
            profile: "p".into(),
        }]);
        assert_eq!(b.index("a"), 0);
        assert_eq!(b.index("b"), 1);
        assert_eq!(b.index("b"), 1);
        b.add(1, 1);
        b.add(1, 1);
        b.add(0, -1);
        assert_eq!(b.snapshot(), vec![0, 2]);
    }
}
