//! `headroom-bench proxy-overhead`: what a proxy costs per request, side by side.
//!
//! Setup (one run): one fixed-response upstream ([`super::fixed_upstream`], on its own
//! thread of this process) listening on two ports, i.e. two "replicas" whose answer costs almost nothing;
//! in front of both, each proxy under test round-robins: nginx (if requested) and
//! `headroom serve` with each requested policy. A `direct` target spreads connections
//! over the two upstream ports itself: the baseline the others add to.
//!
//! Load: closed loop — `c` connections, each one HTTP/1.1 keep-alive connection
//! sending a small streaming completion (`stream`, `include_usage`, a ≈2 KB JSON
//! body) and reading the whole SSE answer before the next. Per run: a warm-up, then a
//! measured window; completions inside the window give req/s and the latency
//! percentiles (send → last byte). Every answer must equal the upstream's body byte
//! for byte (any difference counts as an error).
//!
//! Interleaving: each repeat runs every (concurrency, target) pair once, rotating the
//! target order per repeat so no target always runs first or last; the table shows
//! per-pair medians over repeats. Added latency is target minus `direct` from the same
//! repeat and concurrency. Proxy CPU is `/proc` utime+stime of the proxy processes
//! (nginx master + workers) over the measured window, per completed request.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, header};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use serde::{Deserialize, Serialize};
use tokio::net::TcpStream;
use tokio::task::JoinSet;

use super::LiveError;
use super::fixed_upstream::{FixedBodies, FixedServer};
use super::nginx::{Nginx, find_nginx, start_nginx};
use super::procs::{ChildProc, find_binary, start_on_free_port, stop_all};
use super::table::{Table, num};
use super::usage::{ProcUsage, tree_of, usage_of_all};
use crate::report::quantile::{nearest_rank, sorted};

/// A system measured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OverheadTarget {
    Direct,
    Nginx,
    /// `headroom serve --policy NAME`.
    Headroom(String),
    /// The same with decision records off (`--decision-records 0`): what they cost.
    HeadroomNoRecords(String),
    /// The same on this many async worker threads (`--worker-threads N`): how it scales.
    HeadroomThreads(String, u16),
}

impl OverheadTarget {
    pub fn name(&self) -> String {
        match self {
            OverheadTarget::Direct => "direct".into(),
            OverheadTarget::Nginx => "nginx".into(),
            OverheadTarget::Headroom(p) => format!("headroom ({p})"),
            OverheadTarget::HeadroomNoRecords(p) => format!("headroom ({p}, no records)"),
            OverheadTarget::HeadroomThreads(p, 1) => format!("headroom ({p}, 1 thread)"),
            OverheadTarget::HeadroomThreads(p, n) => format!("headroom ({p}, {n} threads)"),
        }
    }

    /// `direct`, `nginx`, `headroom` (round-robin), `headroom:POLICY`,
    /// `headroom:POLICY:no-records` or `headroom:POLICY:threads=N`.
    pub fn parse(s: &str) -> Result<Self, LiveError> {
        let unknown = |t: &str| {
            LiveError::Options(format!(
                "unknown target `{t}` (direct, nginx, headroom, headroom:POLICY, \
                 headroom:POLICY:no-records, headroom:POLICY:threads=N)"
            ))
        };
        if let Some((p, n)) = s
            .trim()
            .strip_prefix("headroom:")
            .and_then(|p| p.split_once(":threads="))
        {
            return match n.parse::<u16>() {
                Ok(n) if n > 0 && !p.is_empty() && !p.contains(':') => {
                    Ok(OverheadTarget::HeadroomThreads(p.to_string(), n))
                }
                _ => Err(unknown(s.trim())),
            };
        }
        match s.trim() {
            "direct" => Ok(OverheadTarget::Direct),
            "nginx" => Ok(OverheadTarget::Nginx),
            "headroom" => Ok(OverheadTarget::Headroom("round-robin".into())),
            t => match t.strip_prefix("headroom:") {
                Some(p) if !p.is_empty() && !p.contains(':') => {
                    Ok(OverheadTarget::Headroom(p.to_string()))
                }
                Some(p) => match p.strip_suffix(":no-records") {
                    Some(p) if !p.is_empty() && !p.contains(':') => {
                        Ok(OverheadTarget::HeadroomNoRecords(p.to_string()))
                    }
                    _ => Err(unknown(t)),
                },
                None => Err(unknown(t)),
            },
        }
    }
}

#[derive(Clone, Debug)]
pub struct OverheadOptions {
    pub targets: Vec<OverheadTarget>,
    pub concurrencies: Vec<usize>,
    pub warmup: Duration,
    pub duration: Duration,
    pub repeats: usize,
    /// Where `headroom` is (default: next to this binary).
    pub bin_dir: Option<PathBuf>,
    /// nginx binary (default: PATH, /usr/sbin).
    pub nginx: Option<PathBuf>,
    pub model: String,
    /// Token events per answer.
    pub tokens: u32,
    /// Approximate request body size in bytes.
    pub request_bytes: usize,
    /// Extra arguments for `headroom serve`.
    pub serve_args: Vec<String>,
    /// `headroom`'s tokenizer for the model (`cl100k`, `o200k`, `estimate`, `hf:...`).
    pub tokenizer: String,
    /// Whether and where each request's prompt differs from the others'.
    pub vary: PromptVariation,
    pub startup_timeout: Duration,
}

/// How prompts differ between requests. The router reuses the ids of prompt segments
/// it has tokenized before, so a bench sending one prompt over and over measures only
/// its cache; `suffix` is a shared system prompt with a new question each time,
/// `prefix` a prompt unlike every earlier one (nothing to reuse).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PromptVariation {
    Same,
    Suffix,
    Prefix,
}

impl std::str::FromStr for PromptVariation {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "same" => Ok(Self::Same),
            "suffix" => Ok(Self::Suffix),
            "prefix" => Ok(Self::Prefix),
            o => Err(format!(
                "unknown prompt variation `{o}` (same, suffix, prefix)"
            )),
        }
    }
}

impl Default for OverheadOptions {
    fn default() -> Self {
        OverheadOptions {
            targets: vec![
                OverheadTarget::Direct,
                OverheadTarget::Nginx,
                OverheadTarget::Headroom("round-robin".into()),
                OverheadTarget::Headroom("slo".into()),
            ],
            concurrencies: vec![8, 64],
            warmup: Duration::from_secs(1),
            duration: Duration::from_secs(10),
            repeats: 3,
            bin_dir: None,
            nginx: None,
            model: "llama-3-8b".into(),
            tokens: 20,
            request_bytes: 2048,
            serve_args: Vec::new(),
            tokenizer: "cl100k".into(),
            vary: PromptVariation::Same,
            startup_timeout: Duration::from_secs(30),
        }
    }
}

/// One (repeat, concurrency, target) run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Measurement {
    pub target: String,
    pub concurrency: usize,
    pub repeat: usize,
    /// Completed, correct answers in the measured window.
    pub requests: u64,
    /// Failed or wrong answers in the window.
    pub errors: u64,
    pub window_s: f64,
    pub rps: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// Proxy CPU over the window (None for `direct`).
    pub proxy_cpu_s: Option<f64>,
}

/// The benchmark's outcome.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct OverheadReport {
    pub table: Table,
    pub measurements: Vec<Measurement>,
    /// Peak RSS of each proxy (MiB) at the end.
    pub proxy_peak_rss_mib: BTreeMap<String, f64>,
    /// `/proc/loadavg` before and after.
    pub loadavg_before: String,
    pub loadavg_after: String,
    pub settings: BTreeMap<String, String>,
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

/// A JSON completion body of about `bytes` bytes (a text prompt of filler words).
pub fn request_body(model: &str, tokens: u32, bytes: usize) -> Bytes {
    Bodies::new(model, tokens, bytes, PromptVariation::Same).make(0, 0)
}

/// Request bodies: one fixed body, or one whose prompt carries a unique word per
/// request at its start or end (ASCII, so spliced into the JSON without escaping).
#[derive(Clone)]
struct Bodies {
    fixed: Bytes,
    /// The JSON before and after the prompt's text, and the text.
    head: String,
    prompt: String,
    tail: String,
    vary: PromptVariation,
}

impl Bodies {
    fn new(model: &str, tokens: u32, bytes: usize, vary: PromptVariation) -> Self {
        let words = ["alpha ", "beta ", "gamma ", "delta ", "epsilon ", "zeta "];
        let mut prompt = String::new();
        let mut i = 0;
        while prompt.len() + 130 < bytes {
            prompt.push_str(words[i % words.len()]);
            i += 1;
        }
        let prompt = prompt.trim_end().to_string();
        const MARK: &str = "@@PROMPT@@";
        let v = serde_json::json!({
            "model": model, "prompt": MARK, "max_tokens": tokens,
            "stream": true, "stream_options": {"include_usage": true},
        })
        .to_string();
        let (head, tail) = v.split_once(MARK).unwrap_or((&v, ""));
        Self {
            fixed: Bytes::from(format!("{head}{prompt}{tail}")),
            head: head.to_string(),
            prompt,
            tail: tail.to_string(),
            vary,
        }
    }

    /// The body of worker `w`'s `n`th request.
    fn make(&self, w: usize, n: u64) -> Bytes {
        let (h, p, t) = (&self.head, &self.prompt, &self.tail);
        match self.vary {
            PromptVariation::Same => self.fixed.clone(),
            PromptVariation::Suffix => Bytes::from(format!("{h}{p} question w{w}n{n}{t}")),
            PromptVariation::Prefix => Bytes::from(format!("{h}request w{w}n{n} {p}{t}")),
        }
    }
}

/// One proxy (or none) under test.
struct Running {
    target: OverheadTarget,
    /// Worker `i` connects to `addrs[i % len]`.
    addrs: Vec<SocketAddr>,
    /// Processes whose CPU is the proxy's (empty for direct).
    pids: Vec<u32>,
}

/// What one closed-loop run measured.
#[derive(Debug, Default)]
struct LoopStats {
    requests: u64,
    errors: u64,
    lat_us: Vec<f64>,
}

/// One worker: a keep-alive connection, requests back to back until `stop`.
async fn worker(
    addr: SocketAddr,
    w: usize,
    bodies: Bodies,
    expect: Bytes,
    measure_from: Instant,
    stop: Arc<AtomicBool>,
) -> LoopStats {
    let mut st = LoopStats::default();
    let host = addr.to_string();
    let mut n = 0u64;
    'conn: while !stop.load(Ordering::Relaxed) {
        let Ok(tcp) = TcpStream::connect(addr).await else {
            st.errors += 1;
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let Ok((mut send, conn)) = http1::handshake::<_, Full<Bytes>>(TokioIo::new(tcp)).await
        else {
            st.errors += 1;
            continue;
        };
        // Ends when `send` is dropped and the connection closes.
        let driver = tokio::spawn(conn);
        while !stop.load(Ordering::Relaxed) {
            if send.ready().await.is_err() {
                st.errors += 1;
                driver.abort();
                continue 'conn;
            }
            let req = Request::post("/v1/completions")
                .header(header::HOST, host.as_str())
                .header(header::CONTENT_TYPE, "application/json")
                .body(Full::new(bodies.make(w, n)));
            n += 1;
            let Ok(req) = req else {
                st.errors += 1;
                break 'conn;
            };
            let t = Instant::now();
            let good = match send.send_request(req).await {
                Ok(resp) => {
                    let ok_status = resp.status().is_success();
                    match resp.into_body().collect().await {
                        Ok(b) => ok_status && b.to_bytes() == expect,
                        Err(_) => false,
                    }
                }
                Err(_) => false,
            };
            let done = Instant::now();
            if t >= measure_from && !stop.load(Ordering::Relaxed) {
                if good {
                    st.requests += 1;
                    st.lat_us.push(done.duration_since(t).as_secs_f64() * 1e6);
                } else {
                    st.errors += 1;
                }
            }
            if !good {
                driver.abort();
                continue 'conn;
            }
        }
        drop(send);
        let _ = driver.await;
    }
    st
}

/// Runs `conns` workers against `r`; measures the window after `warmup`.
async fn closed_loop(
    r: &Running,
    conns: usize,
    bodies: &Bodies,
    expect: &Bytes,
    warmup: Duration,
    window: Duration,
) -> (LoopStats, Option<f64>, f64) {
    let stop = Arc::new(AtomicBool::new(false));
    let measure_from = Instant::now() + warmup;
    let mut set = JoinSet::new();
    for i in 0..conns {
        set.spawn(worker(
            r.addrs[i % r.addrs.len()],
            i,
            bodies.clone(),
            expect.clone(),
            measure_from,
            stop.clone(),
        ));
    }
    tokio::time::sleep(warmup).await;
    let cpu0: Option<ProcUsage> = (!r.pids.is_empty()).then(|| usage_of_all(&r.pids));
    let t0 = Instant::now();
    tokio::time::sleep(window).await;
    stop.store(true, Ordering::Relaxed);
    let elapsed = t0.elapsed().as_secs_f64();
    let cpu = cpu0.map(|c0| usage_of_all(&r.pids).cpu_since(&c0));
    let mut all = LoopStats::default();
    while let Some(res) = set.join_next().await {
        if let Ok(s) = res {
            all.requests += s.requests;
            all.errors += s.errors;
            all.lat_us.extend(s.lat_us);
        } else {
            all.errors += 1;
        }
    }
    (all, cpu, elapsed)
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    v.retain(|x| x.is_finite());
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => None,
        n if n % 2 == 1 => Some(v[n / 2]),
        n => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

/// Starts the upstream, the proxies, runs every repeat, stops everything.
pub async fn proxy_overhead(opts: OverheadOptions) -> Result<OverheadReport, LiveError> {
    if opts.targets.is_empty() || opts.concurrencies.is_empty() || opts.repeats == 0 {
        return Err(LiveError::Options(
            "need at least one target, one concurrency and one repeat".into(),
        ));
    }
    if opts.concurrencies.contains(&0) {
        return Err(LiveError::Options("concurrency must be at least 1".into()));
    }
    let mut children: Vec<ChildProc> = Vec::new();
    let mut nginx: Option<Nginx> = None;
    let mut upstream: Option<FixedServer> = None;
    let out = run_all(&opts, &mut children, &mut nginx, &mut upstream).await;
    if let Some(n) = nginx.as_mut() {
        n.stop().await;
    }
    stop_all(&mut children, Duration::from_secs(5)).await;
    drop(upstream);
    out
}

async fn run_all(
    opts: &OverheadOptions,
    children: &mut Vec<ChildProc>,
    nginx: &mut Option<Nginx>,
    upstream: &mut Option<FixedServer>,
) -> Result<OverheadReport, LiveError> {
    let loadavg_before = loadavg();
    let prompt_tokens = (opts.request_bytes / 6) as u32;
    let fixed = FixedBodies::new(&opts.model, opts.tokens, prompt_tokens);
    let bodies = Bodies::new(&opts.model, opts.tokens, opts.request_bytes, opts.vary);
    let body = bodies.fixed.clone();
    let any: SocketAddr = ([127, 0, 0, 1], 0).into();
    let server = FixedServer::start(&[any, any], fixed.clone())
        .map_err(|e| LiveError::io("starting the fixed upstream", e))?;
    let ups = server.addrs.clone();
    *upstream = Some(server);
    let mut running: Vec<Running> = Vec::new();
    for t in &opts.targets {
        let r = match t {
            OverheadTarget::Direct => Running {
                target: t.clone(),
                addrs: ups.clone(),
                pids: Vec::new(),
            },
            OverheadTarget::Nginx => {
                let bin = match opts.nginx.clone().or_else(find_nginx) {
                    Some(b) => b,
                    None => {
                        return Err(LiveError::MissingBinary(
                            "nginx not found: run scripts/install-nginx.sh or drop the nginx target"
                                .into(),
                        ));
                    }
                };
                let n = start_nginx(&bin, &ups, opts.startup_timeout).await?;
                let (addr, pid) = (n.addr, n.proc.pid());
                *nginx = Some(n);
                Running {
                    target: t.clone(),
                    addrs: vec![addr],
                    pids: tree_of(pid),
                }
            }
            OverheadTarget::Headroom(policy)
            | OverheadTarget::HeadroomNoRecords(policy)
            | OverheadTarget::HeadroomThreads(policy, _) => {
                let records_off = matches!(t, OverheadTarget::HeadroomNoRecords(_));
                let threads = match t {
                    OverheadTarget::HeadroomThreads(_, n) => Some(*n),
                    _ => None,
                };
                let bin = find_binary("headroom", opts.bin_dir.as_deref())?;
                let args = |addr: SocketAddr| {
                    let mut a = serve_args(addr, policy, &opts.model, &opts.tokenizer, &ups);
                    if records_off {
                        a.extend(["--decision-records".into(), "0".into()]);
                    }
                    if let Some(n) = threads {
                        a.extend(["--worker-threads".into(), n.to_string()]);
                    }
                    a.extend(opts.serve_args.iter().cloned());
                    a
                };
                let (child, addr) =
                    start_on_free_port(&t.name(), &bin, args, None, "/ready", opts.startup_timeout)
                        .await?;
                let pid = child.pid();
                children.push(child);
                Running {
                    target: t.clone(),
                    addrs: vec![addr],
                    pids: vec![pid],
                }
            }
        };
        running.push(r);
    }
    let mut measurements = Vec::new();
    for rep in 0..opts.repeats {
        for &c in &opts.concurrencies {
            for k in 0..running.len() {
                let r = &running[(k + rep) % running.len()];
                let (st, cpu, window) =
                    closed_loop(r, c, &bodies, &fixed.stream, opts.warmup, opts.duration).await;
                let lat = sorted(st.lat_us);
                let ms = |p| nearest_rank(&lat, p).map_or(f64::NAN, |v| v / 1e3);
                let m = Measurement {
                    target: r.target.name(),
                    concurrency: c,
                    repeat: rep,
                    requests: st.requests,
                    errors: st.errors,
                    window_s: window,
                    rps: st.requests as f64 / window,
                    p50_ms: ms(50.0),
                    p99_ms: ms(99.0),
                    proxy_cpu_s: cpu,
                };
                tracing::info!(
                    "rep {rep} c={c} {}: {:.0} req/s p50 {:.3} ms p99 {:.3} ms errors {}",
                    m.target,
                    m.rps,
                    m.p50_ms,
                    m.p99_ms,
                    m.errors
                );
                measurements.push(m);
            }
        }
    }
    let mut rss = BTreeMap::new();
    for r in running.iter().filter(|r| !r.pids.is_empty()) {
        let pids: Vec<u32> = r.pids.iter().flat_map(|&p| tree_of(p)).collect();
        let mut pids = pids;
        pids.sort_unstable();
        pids.dedup();
        rss.insert(
            r.target.name(),
            usage_of_all(&pids).peak_rss_kib as f64 / 1024.0,
        );
    }
    let mut settings = BTreeMap::new();
    settings.insert("upstream".into(), format!(
        "fixed-response server (own thread) on 2 ports, {} token events + usage + [DONE] ({} bytes) in one write",
        opts.tokens, fixed.stream.len()
    ));
    settings.insert(
        "request".into(),
        format!(
            "POST /v1/completions, {} bytes JSON, stream + include_usage, prompts: {:?}; headroom tokenizer {}",
            body.len(),
            opts.vary,
            opts.tokenizer
        ),
    );
    settings.insert(
        "window".into(),
        format!(
            "{:?} warm-up + {:?} measured, {} interleaved repeats",
            opts.warmup, opts.duration, opts.repeats
        ),
    );
    let order: Vec<String> = opts.targets.iter().map(OverheadTarget::name).collect();
    Ok(OverheadReport {
        table: summarize(&measurements, &order, &opts.concurrencies),
        measurements,
        proxy_peak_rss_mib: rss,
        loadavg_before,
        loadavg_after: loadavg(),
        settings,
    })
}

/// `headroom serve` as the proxy benchmarks start it: warn-level logs, `policy`, the
/// model's tokenizer, and one `--replica` of class `fixed` per upstream address.
pub(crate) fn serve_args(
    addr: SocketAddr,
    policy: &str,
    model: &str,
    tokenizer: &str,
    upstreams: &[SocketAddr],
) -> Vec<String> {
    let mut a = vec![
        "--log".to_string(),
        "warn".into(),
        "serve".into(),
        "--listen".into(),
        addr.to_string(),
        "--policy".into(),
        policy.to_string(),
        "--tokenizer".into(),
        format!("{model}={tokenizer}"),
    ];
    for (i, u) in upstreams.iter().enumerate() {
        a.extend([
            "--replica".into(),
            format!("http://{u},name=u{i},class=fixed"),
        ]);
    }
    a
}

/// Per (concurrency, target) medians over repeats, with added latency against
/// `direct` and ratios against `nginx` from the same repeats.
pub fn summarize(ms: &[Measurement], order: &[String], concs: &[usize]) -> Table {
    let mut t = Table::new(&[
        "target",
        "conns",
        "req/s",
        "p50 ms",
        "p99 ms",
        "added p50 ms",
        "added p99 ms",
        "proxy CPU ms/req",
        "errors",
        "req/s vs nginx",
        "added p50 vs nginx",
        "CPU/req vs nginx",
    ]);
    let pick = |target: &str, c: usize, rep: usize| {
        ms.iter()
            .find(|m| m.target == target && m.concurrency == c && m.repeat == rep)
    };
    let reps: Vec<usize> = {
        let mut r: Vec<usize> = ms.iter().map(|m| m.repeat).collect();
        r.sort_unstable();
        r.dedup();
        r
    };
    let cpu_per_req = |m: &Measurement| {
        m.proxy_cpu_s
            .filter(|_| m.requests > 0)
            .map(|c| c * 1e3 / m.requests as f64)
    };
    for &c in concs {
        for name in order {
            let mine: Vec<&Measurement> = reps.iter().filter_map(|&r| pick(name, c, r)).collect();
            if mine.is_empty() {
                continue;
            }
            let added = |f: fn(&Measurement) -> f64, base: &str| {
                median(
                    mine.iter()
                        .filter_map(|m| pick(base, c, m.repeat).map(|b| f(m) - f(b)))
                        .collect(),
                )
            };
            let ratio = |f: &dyn Fn(&Measurement, &Measurement) -> Option<f64>| {
                median(
                    mine.iter()
                        .filter_map(|m| pick("nginx", c, m.repeat).and_then(|n| f(m, n)))
                        .collect(),
                )
            };
            let is_direct = name == "direct";
            let is_nginx = name == "nginx";
            t.push(vec![
                name.clone(),
                c.to_string(),
                num(median(mine.iter().map(|m| m.rps).collect()), 0),
                num(median(mine.iter().map(|m| m.p50_ms).collect()), 3),
                num(median(mine.iter().map(|m| m.p99_ms).collect()), 3),
                if is_direct {
                    "–".into()
                } else {
                    num(added(|m| m.p50_ms, "direct"), 3)
                },
                if is_direct {
                    "–".into()
                } else {
                    num(added(|m| m.p99_ms, "direct"), 3)
                },
                num(
                    median(mine.iter().filter_map(|m| cpu_per_req(m)).collect()),
                    3,
                ),
                mine.iter().map(|m| m.errors).sum::<u64>().to_string(),
                if is_direct || is_nginx {
                    "–".into()
                } else {
                    num(ratio(&|m, n| Some(m.rps / n.rps)), 2)
                },
                if is_direct || is_nginx {
                    "–".into()
                } else {
                    num(
                        ratio(&|m, n| {
                            let d = pick("direct", c, m.repeat)?;
                            Some((m.p50_ms - d.p50_ms) / (n.p50_ms - d.p50_ms))
                        }),
                        2,
                    )
                },
                if is_direct || is_nginx {
                    "–".into()
                } else {
                    num(ratio(&|m, n| Some(cpu_per_req(m)? / cpu_per_req(n)?)), 2)
                },
            ]);
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(target: &str, c: usize, rep: usize, rps: f64, p50: f64, cpu: Option<f64>) -> Measurement {
        Measurement {
            target: target.into(),
            concurrency: c,
            repeat: rep,
            requests: (rps * 10.0) as u64,
            errors: 0,
            window_s: 10.0,
            rps,
            p50_ms: p50,
            p99_ms: p50 * 2.0,
            proxy_cpu_s: cpu,
        }
    }

    #[test]
    fn summary_takes_medians_and_same_repeat_differences() {
        let ms = vec![
            m("direct", 8, 0, 1000.0, 1.0, None),
            m("direct", 8, 1, 1000.0, 2.0, None),
            m("nginx", 8, 0, 500.0, 2.0, Some(1.0)),
            m("nginx", 8, 1, 500.0, 3.0, Some(1.0)),
            m("headroom (rr)", 8, 0, 250.0, 3.0, Some(4.0)),
            m("headroom (rr)", 8, 1, 250.0, 4.0, Some(4.0)),
        ];
        let order = ["direct".to_string(), "nginx".into(), "headroom (rr)".into()];
        let t = summarize(&ms, &order, &[8]);
        assert_eq!(t.rows.len(), 3);
        let h = &t.rows[2];
        assert_eq!(h[2], "250");
        assert_eq!(h[5], "2.000"); // p50 − direct p50 in the same repeat: 2 and 2
        assert_eq!(h[7], "1.600"); // 4 s CPU / 2500 requests
        assert_eq!(h[9], "0.50");
        assert_eq!(h[10], "2.00"); // added 2 ms vs nginx's added 1 ms
        assert_eq!(h[11], "8.00"); // 1.6 ms/req vs nginx 1 s / 5000 = 0.2 ms/req
        assert_eq!(t.rows[0][5], "–");
    }

    #[test]
    fn targets_parse() {
        assert_eq!(
            OverheadTarget::parse("headroom").expect("ok"),
            OverheadTarget::Headroom("round-robin".into())
        );
        assert_eq!(
            OverheadTarget::parse("headroom:slo").expect("ok").name(),
            "headroom (slo)"
        );
        assert!(OverheadTarget::parse("envoy").is_err());
        assert_eq!(
            OverheadTarget::parse("headroom:slo:no-records").expect("ok"),
            OverheadTarget::HeadroomNoRecords("slo".into())
        );
        assert!(OverheadTarget::parse("headroom:slo:records").is_err());
        assert_eq!(
            OverheadTarget::parse("headroom:slo:threads=2").expect("ok"),
            OverheadTarget::HeadroomThreads("slo".into(), 2)
        );
        assert_eq!(
            OverheadTarget::parse("headroom:slo:threads=1")
                .expect("ok")
                .name(),
            "headroom (slo, 1 thread)"
        );
        assert!(OverheadTarget::parse("headroom:slo:threads=0").is_err());
        assert!(OverheadTarget::parse("headroom::threads=2").is_err());
        assert!(OverheadTarget::parse("headroom::no-records").is_err());
        let b = request_body("m", 20, 2048);
        assert!((1900..2100).contains(&b.len()), "{}", b.len());
        // Varied bodies stay valid JSON and differ where they say.
        for vary in [PromptVariation::Suffix, PromptVariation::Prefix] {
            let bs = Bodies::new("m", 20, 2048, vary);
            let (a, c) = (bs.make(0, 1), bs.make(3, 1));
            let pa: serde_json::Value = serde_json::from_slice(&a).expect("json");
            let pc: serde_json::Value = serde_json::from_slice(&c).expect("json");
            let (ta, tc) = (
                pa["prompt"].as_str().expect("s"),
                pc["prompt"].as_str().expect("s"),
            );
            assert_ne!(ta, tc);
            let common = ta
                .bytes()
                .zip(tc.bytes())
                .take_while(|(x, y)| x == y)
                .count();
            match vary {
                PromptVariation::Suffix => assert!(common > 1800, "{common}"),
                _ => assert!(common < 20, "{common}"),
            }
        }
    }
}
