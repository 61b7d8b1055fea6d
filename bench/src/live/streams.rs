//! `headroom-bench streams`: many slow streams held open through one router node, and
//! what holding them costs the router.
//!
//! Setup (per stream count, all fresh): one slow upstream process
//! (`headroom-bench slow-upstream`, [`super::slow_upstream`]) listening on one or two
//! loopback ports, i.e. one or two "replicas" whose streams send a token every
//! `interval`; in front of them one `headroom serve` started as `proxy-overhead`
//! starts it ([`super::overhead::serve_args`]), with `edge.max_connections` raised to
//! fit the client connections (its default cap, 4096, is a deliberate limit).
//!
//! Load: `streams` streaming completions opened at an even pace over `ramp`, each on its
//! own HTTP/1.1 connection (`http1`) or multiplexed, `streams_per_conn` to an HTTP/2
//! connection (`h2`); all are held until their upstream finishes. Every stream must
//! answer 200 and deliver all its token events, the usage chunk and `data: [DONE]`,
//! else it counts as an error (by kind). The client runs on one thread of this process,
//! so its CPU stays apart from the router's, which is what is measured.
//!
//! Measured (a sampler thread reads `/proc` every `sample_every`): the router's VmRSS,
//! VmHWM, CPU (utime + stime), threads and open descriptors over time; its idle CPU
//! rate and RSS just before the load; per stream, the client-observed time to first
//! byte (from starting the connection or request to the first body byte) and lifetime.
//! "All open" figures come from the samples at which every stream was open at once.
//!
//! Descriptors: on HTTP/1.1 the router holds two sockets per stream (client and
//! upstream), so `streams` needs an open-files limit of about 2 × streams + 64 in the
//! router; the run warns when the limit the router inherited is lower.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde::{Deserialize, Serialize};
use tokio::net::TcpStream;
use tokio::task::JoinSet;

use super::LiveError;
use super::overhead::{request_body, serve_args};
use super::procs::{ChildProc, find_binary, start_on_free_port, stop_all, wait_ready};
use super::sse::{SseScanner, StreamTally};
use super::table::{Table, num};
use super::usage::{ProcSnapshot, open_files_limit, snapshot};
use crate::report::quantile::{nearest_rank, sorted};

/// How the client reaches the router.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ClientProtocol {
    /// One HTTP/1.1 connection per stream (what most OpenAI clients do).
    Http1,
    /// HTTP/2 with prior knowledge, `streams_per_conn` streams per connection.
    H2,
}

impl std::str::FromStr for ClientProtocol {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "http1" => Ok(Self::Http1),
            "h2" => Ok(Self::H2),
            o => Err(format!("unknown protocol `{o}` (http1, h2)")),
        }
    }
}

impl ClientProtocol {
    pub fn name(self) -> &'static str {
        match self {
            Self::Http1 => "http1",
            Self::H2 => "h2",
        }
    }
}

#[derive(Clone, Debug)]
pub struct StreamsOptions {
    /// Streams held at once.
    pub streams: usize,
    /// Token events per stream.
    pub tokens: u32,
    /// Time between two token events of a stream.
    pub interval: Duration,
    /// Streams are opened at an even pace over this.
    pub ramp: Duration,
    /// Upstream ports (replicas), 1 or 2.
    pub upstreams: usize,
    pub protocol: ClientProtocol,
    /// HTTP/2 streams per client connection (the router allows 256).
    pub streams_per_conn: usize,
    pub policy: String,
    pub model: String,
    pub tokenizer: String,
    /// Approximate request body size in bytes.
    pub request_bytes: usize,
    /// Extra arguments for `headroom serve`.
    pub serve_args: Vec<String>,
    /// Where `headroom` and `headroom-bench` are (default: next to this binary).
    pub bin_dir: Option<PathBuf>,
    /// Loads run one after another on the same router (memory a later round does not
    /// grow was kept by the allocator, not leaked). "All open" figures are round 1's.
    pub rounds: usize,
    pub sample_every: Duration,
    /// Idle time measured before the load (the router's background CPU).
    pub idle_probe: Duration,
    pub startup_timeout: Duration,
    /// Router and upstream stderr go here (none: discarded).
    pub log_dir: Option<PathBuf>,
}

impl Default for StreamsOptions {
    fn default() -> Self {
        StreamsOptions {
            streams: 10_000,
            tokens: 60,
            interval: Duration::from_millis(500),
            ramp: Duration::from_secs(5),
            upstreams: 2,
            protocol: ClientProtocol::Http1,
            streams_per_conn: 100,
            policy: "round-robin".into(),
            model: "llama-3-8b".into(),
            tokenizer: "cl100k".into(),
            request_bytes: 1024,
            serve_args: Vec::new(),
            bin_dir: None,
            rounds: 1,
            sample_every: Duration::from_secs(1),
            idle_probe: Duration::from_secs(2),
            startup_timeout: Duration::from_secs(30),
            log_dir: None,
        }
    }
}

impl StreamsOptions {
    /// Client connections the load opens.
    pub fn client_conns(&self) -> usize {
        match self.protocol {
            ClientProtocol::Http1 => self.streams,
            ClientProtocol::H2 => self.streams.div_ceil(self.streams_per_conn.max(1)),
        }
    }

    /// Descriptors the router needs: a client and an upstream socket per stream (the
    /// upstream side is HTTP/1.1 either way), plus what an idle router holds.
    pub fn router_fds_needed(&self) -> u64 {
        (self.client_conns() + self.streams + 64) as u64
    }

    /// Longest a stream may take: its own length, the ramp, and a minute of slack for
    /// a loaded machine; past it the stream is an error (`timeout`).
    fn stream_limit(&self) -> Duration {
        self.interval * self.tokens + self.ramp + Duration::from_secs(60)
    }
}

/// One `/proc` reading during a run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// Seconds since the load started.
    pub t_s: f64,
    /// Load round (0-based).
    #[serde(default)]
    pub round: u64,
    pub started: u64,
    /// Streams that have their response head and have not ended.
    pub open: u64,
    pub completed: u64,
    pub errors: u64,
    pub router: ProcSnapshot,
    pub upstream_cpu_s: f64,
    pub client_cpu_s: f64,
}

/// The outcome of one stream count.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StreamsRun {
    pub streams: usize,
    pub protocol: String,
    pub client_conns: usize,
    pub tokens: u32,
    pub interval_ms: f64,
    pub ramp_s: f64,
    pub policy: String,
    pub rounds: usize,
    /// Streams that delivered every token, the usage chunk and `[DONE]`.
    pub completed: u64,
    pub errors: u64,
    /// Errors by kind (`connect`, `status 502`, `incomplete`, `timeout`, …).
    pub error_kinds: BTreeMap<String, u64>,
    /// The first few errors in full.
    pub first_errors: Vec<String>,
    /// Most streams open at once (response head received, not ended).
    pub peak_open: u64,
    /// Wall seconds from the first stream's start to the last one's end.
    pub load_wall_s: f64,
    /// Sum of the streams' lifetimes (seconds).
    pub stream_seconds: f64,
    /// Router RSS just before the load (MiB).
    pub router_idle_rss_mib: f64,
    /// Highest sampled router VmRSS (MiB).
    pub router_peak_rss_mib: f64,
    /// Router VmHWM at the end (MiB): the true peak between samples.
    pub router_hwm_mib: f64,
    /// Router VmRSS after every stream ended (MiB).
    pub router_after_rss_mib: f64,
    /// Router VmRSS after each round's streams ended (MiB).
    pub router_rss_after_round_mib: Vec<f64>,
    /// (VmHWM − idle RSS) / streams (KiB).
    pub router_rss_per_stream_kib: f64,
    /// Router CPU per wall second while idle before the load (ms/s).
    pub router_idle_cpu_ms_per_s: f64,
    /// Router CPU per wall second while every stream was open (ms/s).
    pub router_all_open_cpu_ms_per_s: Option<f64>,
    /// The same per open stream: CPU µs per stream-second.
    pub router_cpu_us_per_stream_s: Option<f64>,
    /// The same per token event relayed (µs).
    pub router_cpu_us_per_event: Option<f64>,
    /// Router CPU over the whole load (ramp and drain included), seconds.
    pub router_load_cpu_s: f64,
    pub router_idle_fds: u64,
    pub router_peak_fds: u64,
    pub router_peak_threads: u64,
    /// The router's soft open-files limit and what the run needs.
    pub router_fd_limit: Option<u64>,
    pub router_fds_needed: u64,
    /// CPU of the upstream and of this process (the load generator) over the load.
    pub upstream_load_cpu_s: f64,
    pub client_load_cpu_s: f64,
    /// Client-observed time to first byte (ms) over streams that got one.
    pub ttfb_p50_ms: Option<f64>,
    pub ttfb_p99_ms: Option<f64>,
    pub ttfb_max_ms: Option<f64>,
    /// Lifetime of completed streams (s).
    pub lifetime_p50_s: Option<f64>,
    pub lifetime_max_s: Option<f64>,
    pub samples: Vec<Sample>,
    /// PIDs of every process the run started (all stopped when it returns).
    pub started_pids: Vec<u32>,
}

/// Live counts shared by the stream tasks and the sampler.
#[derive(Debug, Default)]
struct Counters {
    round: AtomicU64,
    started: AtomicU64,
    open: AtomicU64,
    peak_open: AtomicU64,
    completed: AtomicU64,
    errors: AtomicU64,
}

/// Counts a stream as open while it lives.
struct Open<'a>(&'a Counters);

impl<'a> Open<'a> {
    fn new(c: &'a Counters) -> Self {
        let now = c.open.fetch_add(1, Ordering::Relaxed) + 1;
        c.peak_open.fetch_max(now, Ordering::Relaxed);
        Open(c)
    }
}

impl Drop for Open<'_> {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Why a stream failed: a kind for counting and the detail.
#[derive(Debug)]
struct Failure {
    kind: String,
    detail: String,
}

fn fail(kind: impl Into<String>, detail: impl std::fmt::Display) -> Failure {
    Failure {
        kind: kind.into(),
        detail: detail.to_string(),
    }
}

/// One stream as the client saw it.
#[derive(Debug)]
struct StreamResult {
    ttfb: Option<Duration>,
    lifetime: Duration,
    failure: Option<Failure>,
}

/// What every stream sends and expects.
struct Ask {
    body: Bytes,
    /// `Host` for HTTP/1.1 (origin-form URI) and the absolute URI for HTTP/2.
    host: String,
    uri: String,
    tokens: u32,
    limit: Duration,
}

impl Ask {
    fn request(&self, absolute: bool) -> Result<Request<Full<Bytes>>, Failure> {
        let uri = if absolute {
            self.uri.as_str()
        } else {
            "/v1/completions"
        };
        Request::post(uri)
            .header(header::HOST, self.host.as_str())
            .header(header::CONTENT_TYPE, "application/json")
            .body(Full::new(self.body.clone()))
            .map_err(|e| fail("request", e))
    }
}

/// Reads one streamed answer to the end and checks it is whole.
async fn read_stream(
    resp: Response<Incoming>,
    t0: Instant,
    ask: &Ask,
    c: &Counters,
) -> Result<Option<Duration>, Failure> {
    let status = resp.status();
    if !status.is_success() {
        let body = Limited::new(resp.into_body(), 4096)
            .collect()
            .await
            .map(|b| String::from_utf8_lossy(&b.to_bytes()).into_owned())
            .unwrap_or_default();
        return Err(fail(format!("status {}", status.as_u16()), body));
    }
    let _open = Open::new(c);
    let mut body = resp.into_body();
    let mut scan = SseScanner::default();
    let mut tally = StreamTally::default();
    let mut ttfb = None;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| fail("body", e))?;
        if let Ok(d) = frame.into_data() {
            let now = Instant::now();
            if ttfb.is_none() && !d.is_empty() {
                ttfb = Some(now - t0);
            }
            scan.feed(&d, |e| tally.event(e, now));
        }
    }
    let now = Instant::now();
    scan.finish(|e| tally.event(e, now));
    if let Some(e) = tally.error {
        return Err(fail("in-stream error", e));
    }
    let usage_tokens = tally.usage.map(|u| u.completion_tokens);
    if tally.content_events != ask.tokens || usage_tokens != Some(ask.tokens) || !tally.done {
        return Err(fail(
            "incomplete",
            format!(
                "{} of {} token events, usage {:?}, [DONE] {}, {} malformed",
                tally.content_events, ask.tokens, usage_tokens, tally.done, tally.malformed
            ),
        ));
    }
    if tally.malformed > 0 {
        return Err(fail("malformed", format!("{} events", tally.malformed)));
    }
    Ok(ttfb)
}

/// One stream on its own HTTP/1.1 connection, driven in this task (no extra task per
/// connection); the connection closes when the stream has ended.
async fn h1_stream(addr: SocketAddr, ask: Arc<Ask>, c: Arc<Counters>) -> StreamResult {
    let t0 = Instant::now();
    c.started.fetch_add(1, Ordering::Relaxed);
    let run = async {
        let tcp = TcpStream::connect(addr)
            .await
            .map_err(|e| fail("connect", e))?;
        let _ = tcp.set_nodelay(true);
        let (mut send, conn) = http1::handshake::<_, Full<Bytes>>(TokioIo::new(tcp))
            .await
            .map_err(|e| fail("handshake", e))?;
        let req = ask.request(false)?;
        let work = async {
            let resp = send.send_request(req).await.map_err(|e| fail("send", e))?;
            read_stream(resp, t0, &ask, &c).await
        };
        let mut work = pin!(work);
        let mut conn = pin!(conn);
        tokio::select! {
            biased;
            r = &mut work => r,
            // The connection ended first: the request fails with it (promptly).
            _ = &mut conn => work.await,
        }
    };
    finish(t0, tokio::time::timeout(ask.limit, run).await, &c)
}

/// One stream on a shared HTTP/2 connection.
async fn h2_stream(
    send: Option<http2::SendRequest<Full<Bytes>>>,
    ask: Arc<Ask>,
    c: Arc<Counters>,
) -> StreamResult {
    let t0 = Instant::now();
    c.started.fetch_add(1, Ordering::Relaxed);
    let run = async {
        let Some(mut send) = send else {
            return Err(fail("connect", "its HTTP/2 connection could not be opened"));
        };
        send.ready().await.map_err(|e| fail("send", e))?;
        let resp = send
            .send_request(ask.request(true)?)
            .await
            .map_err(|e| fail("send", e))?;
        read_stream(resp, t0, &ask, &c).await
    };
    finish(t0, tokio::time::timeout(ask.limit, run).await, &c)
}

fn finish(
    t0: Instant,
    r: Result<Result<Option<Duration>, Failure>, tokio::time::error::Elapsed>,
    c: &Counters,
) -> StreamResult {
    let lifetime = t0.elapsed();
    let (ttfb, failure) = match r {
        Ok(Ok(ttfb)) => (ttfb, None),
        Ok(Err(f)) => (None, Some(f)),
        Err(_) => (None, Some(fail("timeout", format!("after {lifetime:?}")))),
    };
    let n = if failure.is_none() {
        &c.completed
    } else {
        &c.errors
    };
    n.fetch_add(1, Ordering::Relaxed);
    StreamResult {
        ttfb,
        lifetime,
        failure,
    }
}

/// Opens an HTTP/2 connection to `addr`; its driver runs in `drivers`.
async fn h2_connect(
    addr: SocketAddr,
    drivers: &mut JoinSet<()>,
) -> Result<http2::SendRequest<Full<Bytes>>, String> {
    let tcp = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let _ = tcp.set_nodelay(true);
    let (send, conn) = http2::Builder::new(TokioExecutor::new())
        .handshake::<_, Full<Bytes>>(TokioIo::new(tcp))
        .await
        .map_err(|e| format!("h2 handshake: {e}"))?;
    drivers.spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!("h2 connection ended: {e}");
        }
    });
    Ok(send)
}

/// Opens every stream on schedule and waits for all of them.
async fn drive(addr: SocketAddr, opts: &StreamsOptions, c: Arc<Counters>) -> Vec<StreamResult> {
    let ask = Arc::new(Ask {
        body: request_body(&opts.model, opts.tokens, opts.request_bytes),
        host: addr.to_string(),
        uri: format!("http://{addr}/v1/completions"),
        tokens: opts.tokens,
        limit: opts.stream_limit(),
    });
    let mut set = JoinSet::new();
    let mut drivers = JoinSet::new();
    let mut h2: Option<http2::SendRequest<Full<Bytes>>> = None;
    let per_conn = opts.streams_per_conn.max(1);
    let t0 = tokio::time::Instant::now();
    for i in 0..opts.streams {
        let at = t0 + opts.ramp.mul_f64(i as f64 / opts.streams as f64);
        tokio::time::sleep_until(at).await;
        match opts.protocol {
            ClientProtocol::Http1 => {
                set.spawn(h1_stream(addr, ask.clone(), c.clone()));
            }
            ClientProtocol::H2 => {
                if i % per_conn == 0 {
                    h2 = match h2_connect(addr, &mut drivers).await {
                        Ok(s) => Some(s),
                        Err(e) => {
                            tracing::warn!("stream {i}: {e}");
                            None
                        }
                    };
                }
                set.spawn(h2_stream(h2.clone(), ask.clone(), c.clone()));
            }
        }
    }
    drop(h2);
    let mut out = Vec::with_capacity(opts.streams);
    while let Some(r) = set.join_next().await {
        out.push(r.unwrap_or_else(|e| StreamResult {
            ttfb: None,
            lifetime: Duration::ZERO,
            failure: Some(fail("task", e)),
        }));
    }
    drivers.abort_all();
    out
}

/// Reads the router, upstream and this process every `every` on its own thread, so
/// slow `/proc` reads (tens of thousands of descriptors) never stall the client.
struct Sampler {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Vec<Sample>>,
}

impl Sampler {
    fn start(
        router: u32,
        upstream: u32,
        every: Duration,
        c: Arc<Counters>,
    ) -> Result<Sampler, LiveError> {
        let stop = Arc::new(AtomicBool::new(false));
        let halt = stop.clone();
        let me = std::process::id();
        let t0 = Instant::now();
        let thread = std::thread::Builder::new()
            .name("streams-sampler".into())
            .spawn(move || {
                let mut out = Vec::new();
                let mut next = t0;
                loop {
                    let last = halt.load(Ordering::Relaxed);
                    out.push(Sample {
                        t_s: t0.elapsed().as_secs_f64(),
                        round: c.round.load(Ordering::Relaxed),
                        started: c.started.load(Ordering::Relaxed),
                        open: c.open.load(Ordering::Relaxed),
                        completed: c.completed.load(Ordering::Relaxed),
                        errors: c.errors.load(Ordering::Relaxed),
                        router: snapshot(router).unwrap_or_default(),
                        upstream_cpu_s: snapshot(upstream).map_or(0.0, |s| s.cpu_s),
                        client_cpu_s: snapshot(me).map_or(0.0, |s| s.cpu_s),
                    });
                    if last {
                        return out;
                    }
                    next += every;
                    // Short naps so a stop is seen promptly.
                    while Instant::now() < next && !halt.load(Ordering::Relaxed) {
                        std::thread::sleep(Duration::from_millis(20).min(every));
                    }
                }
            })
            .map_err(|e| LiveError::io("starting the sampler thread", e))?;
        Ok(Sampler { stop, thread })
    }

    /// Takes a last sample and returns them all.
    fn finish(self) -> Vec<Sample> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or_default()
    }
}

/// Runs one stream count and stops everything it started before returning.
pub async fn run_streams(opts: &StreamsOptions) -> Result<StreamsRun, LiveError> {
    if opts.streams == 0 || opts.tokens == 0 || opts.rounds == 0 {
        return Err(LiveError::Options(
            "need at least one stream, one token and one round".into(),
        ));
    }
    if !(1..=2).contains(&opts.upstreams) {
        return Err(LiveError::Options("--upstreams must be 1 or 2".into()));
    }
    if !(1..=256).contains(&opts.streams_per_conn) {
        return Err(LiveError::Options(
            "--streams-per-conn must be in 1..=256 (the router's HTTP/2 stream cap)".into(),
        ));
    }
    if opts.interval.is_zero() || opts.sample_every.is_zero() {
        return Err(LiveError::Options(
            "the token interval and the sample period must be > 0".into(),
        ));
    }
    let mut children = Vec::new();
    let out = run_inner(opts, &mut children).await;
    let started_pids = children.iter().map(ChildProc::pid).collect();
    stop_all(&mut children, Duration::from_secs(5)).await;
    let mut run = out?;
    run.started_pids = started_pids;
    Ok(run)
}

async fn run_inner(
    opts: &StreamsOptions,
    children: &mut Vec<ChildProc>,
) -> Result<StreamsRun, LiveError> {
    let router_bin = find_binary("headroom", opts.bin_dir.as_deref())?;
    let bench_bin = find_binary("headroom-bench", opts.bin_dir.as_deref())?;
    if let Some(d) = &opts.log_dir {
        std::fs::create_dir_all(d)
            .map_err(|e| LiveError::io(format!("log dir {}", d.display()), e))?;
    }
    let log = |name: &str| opts.log_dir.as_ref().map(|d| d.join(name));

    let mut up_args = vec!["slow-upstream".to_string()];
    for _ in 0..opts.upstreams {
        up_args.extend(["--listen".into(), "127.0.0.1:0".into()]);
    }
    up_args.extend([
        "--tokens".into(),
        opts.tokens.to_string(),
        "--interval-ms".into(),
        (opts.interval.as_secs_f64() * 1e3).to_string(),
        "--model".into(),
        opts.model.clone(),
    ]);
    let upstream = ChildProc::spawn(
        "slow upstream",
        &bench_bin,
        &up_args,
        log(&format!("upstream-{}.log", opts.streams)).as_deref(),
        &[("HEADROOM_LOG", "warn")],
    )?;
    children.push(upstream);
    let up = children
        .last_mut()
        .ok_or_else(|| LiveError::Measure("no upstream child".into()))?;
    let ups: Vec<SocketAddr> = up
        .wait_for_line(opts.startup_timeout, |l| {
            let rest = l.strip_prefix("slow-upstream listening on ")?;
            rest.split_whitespace()
                .map(|a| a.strip_prefix("http://")?.parse().ok())
                .collect()
        })
        .await?;
    for a in &ups {
        wait_ready(*a, "/health", opts.startup_timeout, Some(&mut *up)).await?;
    }
    let upstream_pid = up.pid();

    // The router's connection cap must fit the client connections (and a few probes).
    let dir = tempfile::tempdir().map_err(|e| LiveError::io("a temporary directory", e))?;
    let cfg = dir.path().join("streams.toml");
    let max_connections = (opts.client_conns() + 256).max(4096);
    std::fs::write(
        &cfg,
        format!("[edge]\nmax_connections = {max_connections}\n"),
    )
    .map_err(|e| LiveError::io(format!("writing {}", cfg.display()), e))?;
    let cfg_arg = cfg.display().to_string();
    let args = |addr: SocketAddr| {
        let mut a = serve_args(addr, &opts.policy, &opts.model, &opts.tokenizer, &ups);
        a.extend(["--config".into(), cfg_arg.clone()]);
        a.extend(opts.serve_args.iter().cloned());
        a
    };
    let (router, addr) = start_on_free_port(
        "router",
        &router_bin,
        args,
        log(&format!("router-{}.log", opts.streams)).as_deref(),
        "/ready",
        opts.startup_timeout,
    )
    .await?;
    let router_pid = router.pid();
    children.push(router);

    let fd_limit = open_files_limit(router_pid);
    let needed = opts.router_fds_needed();
    if fd_limit.is_some_and(|l| l < needed) {
        tracing::warn!(
            "the router's open-files limit ({}) is below the ~{needed} descriptors {} {} \
             streams need: expect failed accepts or upstream connects",
            fd_limit.unwrap_or(0),
            opts.streams,
            opts.protocol.name()
        );
    }

    // Background cost first: the router scrapes and probes its replicas while idle.
    let idle0 = snapshot(router_pid)
        .ok_or_else(|| LiveError::Measure("router /proc entry unreadable".into()))?;
    let t_idle = Instant::now();
    tokio::time::sleep(opts.idle_probe).await;
    let idle1 = snapshot(router_pid)
        .ok_or_else(|| LiveError::Measure("router exited while idle".into()))?;
    let idle_cpu_ms_per_s =
        (idle1.cpu_s - idle0.cpu_s).max(0.0) * 1e3 / t_idle.elapsed().as_secs_f64();

    let counters = Arc::new(Counters::default());
    let sampler = Sampler::start(
        router_pid,
        upstream_pid,
        opts.sample_every,
        counters.clone(),
    )?;
    let t_load = Instant::now();
    let mut results = Vec::new();
    let mut after_round = Vec::new();
    for r in 0..opts.rounds {
        counters.round.store(r as u64, Ordering::Relaxed);
        results.extend(drive(addr, opts, counters.clone()).await);
        after_round.push(snapshot(router_pid).map_or(0.0, |s| s.rss_kib as f64 / MIB));
    }
    let load_wall_s = t_load.elapsed().as_secs_f64();
    let samples = sampler.finish();
    let end = snapshot(router_pid).unwrap_or_default();
    Ok(summarize(
        opts,
        &results,
        samples,
        Summary {
            idle: idle1,
            idle_cpu_ms_per_s,
            end,
            load_wall_s,
            peak_open: counters.peak_open.load(Ordering::Relaxed),
            fd_limit,
            after_round,
        },
    ))
}

/// Readings around the load that are not samples.
struct Summary {
    idle: ProcSnapshot,
    idle_cpu_ms_per_s: f64,
    end: ProcSnapshot,
    load_wall_s: f64,
    peak_open: u64,
    fd_limit: Option<u64>,
    after_round: Vec<f64>,
}

const MIB: f64 = 1024.0;

fn summarize(
    opts: &StreamsOptions,
    results: &[StreamResult],
    samples: Vec<Sample>,
    s: Summary,
) -> StreamsRun {
    let mut error_kinds = BTreeMap::new();
    let mut first_errors = Vec::new();
    for f in results.iter().filter_map(|r| r.failure.as_ref()) {
        *error_kinds.entry(f.kind.clone()).or_insert(0u64) += 1;
        if first_errors.len() < 10 {
            first_errors.push(format!("{}: {}", f.kind, f.detail));
        }
    }
    let ok: Vec<&StreamResult> = results.iter().filter(|r| r.failure.is_none()).collect();
    let ttfb = sorted(
        results
            .iter()
            .filter_map(|r| r.ttfb)
            .map(|d| d.as_secs_f64() * 1e3)
            .collect(),
    );
    let life = sorted(ok.iter().map(|r| r.lifetime.as_secs_f64()).collect());
    let stream_seconds: f64 = results.iter().map(|r| r.lifetime.as_secs_f64()).sum();
    let n = opts.streams as u64;
    // Every stream open at once (first round): the steady state whose rate is per
    // stream-second.
    let all_open: Vec<&Sample> = samples
        .iter()
        .filter(|x| x.open == n && x.round == 0)
        .collect();
    let all_open_rate = match (all_open.first(), all_open.last()) {
        (Some(a), Some(b)) if b.t_s - a.t_s >= 0.5 => {
            Some((b.router.cpu_s - a.router.cpu_s).max(0.0) * 1e3 / (b.t_s - a.t_s))
        }
        _ => None,
    };
    let first = samples.first().cloned().unwrap_or_default();
    let last = samples.last().cloned().unwrap_or_default();
    let peak_rss = samples
        .iter()
        .map(|x| x.router.rss_kib)
        .max()
        .unwrap_or(0)
        .max(s.end.rss_kib);
    let hwm = s.end.hwm_kib.max(peak_rss);
    let events_per_s = opts.streams as f64 / opts.interval.as_secs_f64();
    StreamsRun {
        streams: opts.streams,
        protocol: opts.protocol.name().into(),
        client_conns: opts.client_conns(),
        tokens: opts.tokens,
        interval_ms: opts.interval.as_secs_f64() * 1e3,
        ramp_s: opts.ramp.as_secs_f64(),
        policy: opts.policy.clone(),
        rounds: opts.rounds,
        completed: ok.len() as u64,
        errors: (results.len() - ok.len()) as u64,
        error_kinds,
        first_errors,
        peak_open: s.peak_open,
        load_wall_s: s.load_wall_s,
        stream_seconds,
        router_idle_rss_mib: s.idle.rss_kib as f64 / MIB,
        router_peak_rss_mib: peak_rss as f64 / MIB,
        router_hwm_mib: hwm as f64 / MIB,
        router_after_rss_mib: s.end.rss_kib as f64 / MIB,
        router_rss_after_round_mib: s.after_round,
        router_rss_per_stream_kib: hwm.saturating_sub(s.idle.rss_kib) as f64 / n.max(1) as f64,
        router_idle_cpu_ms_per_s: s.idle_cpu_ms_per_s,
        router_all_open_cpu_ms_per_s: all_open_rate,
        router_cpu_us_per_stream_s: all_open_rate.map(|r| r * 1e3 / opts.streams as f64),
        router_cpu_us_per_event: all_open_rate.map(|r| r * 1e3 / events_per_s),
        router_load_cpu_s: (last.router.cpu_s - first.router.cpu_s).max(0.0),
        router_idle_fds: s.idle.fds,
        router_peak_fds: samples.iter().map(|x| x.router.fds).max().unwrap_or(0),
        router_peak_threads: samples.iter().map(|x| x.router.threads).max().unwrap_or(0),
        router_fd_limit: s.fd_limit,
        router_fds_needed: opts.router_fds_needed(),
        upstream_load_cpu_s: (last.upstream_cpu_s - first.upstream_cpu_s).max(0.0),
        client_load_cpu_s: (last.client_cpu_s - first.client_cpu_s).max(0.0),
        ttfb_p50_ms: nearest_rank(&ttfb, 50.0),
        ttfb_p99_ms: nearest_rank(&ttfb, 99.0),
        ttfb_max_ms: ttfb.last().copied(),
        lifetime_p50_s: nearest_rank(&life, 50.0),
        lifetime_max_s: life.last().copied(),
        samples,
        started_pids: Vec::new(),
    }
}

/// One row per run.
pub fn table(runs: &[StreamsRun]) -> Table {
    let mut t = Table::new(&[
        "streams",
        "client",
        "conns",
        "completed",
        "errors",
        "peak open",
        "idle RSS MiB",
        "peak RSS MiB",
        "KiB/stream",
        "idle CPU ms/s",
        "all-open CPU ms/s",
        "CPU µs/stream-s",
        "CPU µs/event",
        "idle fds",
        "peak fds",
        "TTFB p50 ms",
        "TTFB p99 ms",
        "TTFB max ms",
    ]);
    for r in runs {
        t.push(vec![
            r.streams.to_string(),
            r.protocol.clone(),
            r.client_conns.to_string(),
            r.completed.to_string(),
            r.errors.to_string(),
            r.peak_open.to_string(),
            num(Some(r.router_idle_rss_mib), 1),
            num(Some(r.router_hwm_mib), 1),
            num(Some(r.router_rss_per_stream_kib), 1),
            num(Some(r.router_idle_cpu_ms_per_s), 1),
            num(r.router_all_open_cpu_ms_per_s, 0),
            num(r.router_cpu_us_per_stream_s, 1),
            num(r.router_cpu_us_per_event, 1),
            r.router_idle_fds.to_string(),
            r.router_peak_fds.to_string(),
            num(r.ttfb_p50_ms, 1),
            num(r.ttfb_p99_ms, 1),
            num(r.ttfb_max_ms, 1),
        ]);
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(ttfb_ms: Option<u64>, life_s: u64, kind: Option<&str>) -> StreamResult {
        StreamResult {
            ttfb: ttfb_ms.map(Duration::from_millis),
            lifetime: Duration::from_secs(life_s),
            failure: kind.map(|k| fail(k, "x")),
        }
    }

    fn sample(t_s: f64, open: u64, cpu_s: f64, rss_kib: u64, fds: u64) -> Sample {
        Sample {
            t_s,
            open,
            router: ProcSnapshot {
                cpu_s,
                rss_kib,
                hwm_kib: rss_kib,
                threads: 3,
                fds,
            },
            ..Sample::default()
        }
    }

    #[test]
    fn summary_reads_the_all_open_window_and_counts_errors() {
        let opts = StreamsOptions {
            streams: 4,
            interval: Duration::from_millis(500),
            ..StreamsOptions::default()
        };
        let results = vec![
            res(Some(10), 30, None),
            res(Some(20), 30, None),
            res(Some(30), 31, None),
            res(None, 1, Some("status 502")),
        ];
        let samples = vec![
            sample(0.0, 0, 1.0, 10 * 1024, 20),
            sample(1.0, 4, 1.1, 12 * 1024, 28),
            sample(3.0, 4, 1.3, 14 * 1024, 28),
            sample(4.0, 0, 1.5, 13 * 1024, 20),
        ];
        let idle = ProcSnapshot {
            rss_kib: 10 * 1024,
            fds: 20,
            ..ProcSnapshot::default()
        };
        let r = summarize(
            &opts,
            &results,
            samples,
            Summary {
                idle,
                idle_cpu_ms_per_s: 2.0,
                end: ProcSnapshot {
                    rss_kib: 13 * 1024,
                    hwm_kib: 15 * 1024,
                    ..ProcSnapshot::default()
                },
                load_wall_s: 4.0,
                peak_open: 4,
                fd_limit: Some(100),
                after_round: vec![13.0],
            },
        );
        assert_eq!((r.completed, r.errors), (3, 1));
        assert_eq!(r.error_kinds.get("status 502"), Some(&1));
        // 0.2 CPU s over the 2 s every stream was open: 100 ms/s, 25 ms/s per stream.
        let rate = r.router_all_open_cpu_ms_per_s.expect("window");
        assert!((rate - 100.0).abs() < 1e-9, "{rate}");
        let per = r.router_cpu_us_per_stream_s.expect("per stream");
        assert!((per - 25_000.0).abs() < 1e-6, "{per}");
        // 4 streams / 0.5 s = 8 events/s.
        let ev = r.router_cpu_us_per_event.expect("per event");
        assert!((ev - 12_500.0).abs() < 1e-6, "{ev}");
        assert_eq!(r.router_peak_rss_mib, 14.0);
        assert_eq!(r.router_hwm_mib, 15.0);
        assert_eq!(r.router_rss_per_stream_kib, 5.0 * 1024.0 / 4.0);
        assert!((r.router_load_cpu_s - 0.5).abs() < 1e-9);
        assert_eq!(r.router_peak_fds, 28);
        assert_eq!(r.ttfb_p50_ms, Some(20.0));
        assert_eq!(r.ttfb_max_ms, Some(30.0));
        assert_eq!(r.lifetime_max_s, Some(31.0));
        let md = table(&[r]).to_markdown();
        assert!(md.contains("| 4 | http1 | 4 | 3 | 1 | 4 |"), "{md}");
    }

    #[test]
    fn descriptors_needed_follow_the_protocol() {
        let mut o = StreamsOptions {
            streams: 10_000,
            ..StreamsOptions::default()
        };
        assert_eq!(o.router_fds_needed(), 20_064);
        o.protocol = ClientProtocol::H2;
        o.streams_per_conn = 100;
        assert_eq!(o.client_conns(), 100);
        assert_eq!(o.router_fds_needed(), 10_164);
        assert_eq!("h2".parse::<ClientProtocol>(), Ok(ClientProtocol::H2));
        assert!("spdy".parse::<ClientProtocol>().is_err());
    }
}
