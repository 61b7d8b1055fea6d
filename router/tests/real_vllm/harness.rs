//! Support for the real-vLLM suite: where the servers are, a `headroom serve` child
//! process in front of them, HTTP and SSE helpers, and an independent reader of
//! Prometheus text (deliberately not the router's own parser, which is under test).
//!
//! Invariants: every process started here is killed and reaped on drop (also when a
//! test panics, in which case the router's log tail is printed); every network call
//! has a timeout and talks to loopback only.

#![allow(dead_code)]

use std::{
    collections::HashMap,
    fs,
    io::{Read, Seek, SeekFrom},
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use futures_util::StreamExt;
use serde_json::Value;

/// The model name `scripts/vllm/start.sh` serves.
pub const MODEL: &str = "tiny-llama";
/// The servers' `--block-size` and `--num-gpu-blocks-override`.
pub const BLOCK_SIZE: u32 = 32;
pub const GPU_BLOCKS: u32 = 256;

/// Where the real servers are (from `scripts/vllm/test-real.sh`).
#[derive(Clone, Debug)]
pub struct Env {
    /// Base URLs, server `i` at index `i` (named `vllm-i` in the router).
    pub urls: Vec<String>,
    /// The `start.sh` run dir (pid and port files), when given.
    pub run_dir: Option<PathBuf>,
    /// The servers' `tokenizer.json` (`HEADROOM_VLLM_TOKENIZER`): the router counts
    /// prompts with it (`hf:`), and the template beside it, when given.
    pub tokenizer: Option<PathBuf>,
}

/// The environment, or `None` (with a note) when the suite is not enabled.
pub fn env(test: &str) -> Option<Env> {
    if std::env::var("HEADROOM_REAL_VLLM").ok().as_deref() != Some("1") {
        println!(
            "{test}: not run (set HEADROOM_REAL_VLLM=1 and the servers' URLs; scripts/vllm/test-real.sh does both)"
        );
        return None;
    }
    let urls: Vec<String> = std::env::var("HEADROOM_VLLM_URLS")
        .expect("HEADROOM_REAL_VLLM=1 needs HEADROOM_VLLM_URLS=url,url (scripts/vllm/test-real.sh sets it)")
        .split(',')
        .map(|u| u.trim().trim_end_matches('/').to_string())
        .filter(|u| !u.is_empty())
        .collect();
    assert!(
        urls.len() >= 2,
        "the suite needs two vLLM servers in HEADROOM_VLLM_URLS, got {urls:?}"
    );
    for u in &urls {
        assert!(
            u.starts_with("http://127.") || u.starts_with("http://[::1]"),
            "tests talk to loopback only, not {u}"
        );
    }
    let run_dir = std::env::var_os("HEADROOM_VLLM_RUN_DIR").map(PathBuf::from);
    let tokenizer = std::env::var_os("HEADROOM_VLLM_TOKENIZER")
        .map(PathBuf::from)
        .filter(|p| !p.as_os_str().is_empty());
    if let Some(t) = &tokenizer {
        assert!(
            t.is_file(),
            "HEADROOM_VLLM_TOKENIZER={} is not a file",
            t.display()
        );
    }
    println!("{test}: against {urls:?}, tokenizer {tokenizer:?}");
    Some(Env {
        urls,
        run_dir,
        tokenizer,
    })
}

/// Runs `f` with a hard time limit; a test that hangs fails instead.
pub async fn bounded<F: std::future::Future<Output = ()>>(limit: Duration, f: F) {
    let t0 = Instant::now();
    tokio::time::timeout(limit, f)
        .await
        .unwrap_or_else(|_| panic!("test exceeded its {limit:?} limit"));
    println!("elapsed: {:.1} s", t0.elapsed().as_secs_f64());
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .connect_timeout(Duration::from_secs(5))
        .no_proxy()
        .build()
        .expect("reqwest client")
}

/// The router's config for the two servers: `policy` plus extra TOML (sections).
pub fn config_toml(env: &Env, listen_port: u16, policy: &str, extra: &str) -> String {
    let mut s = format!(
        "listen = \"127.0.0.1:{listen_port}\"\npolicy = \"{policy}\"\nseed = 11\n\n\
         [scrape]\ninterval_ms = 100\n\n\
         [health]\nprobe_interval_ms = 200\nprobe_timeout_ms = 1000\neject_after_failures = 3\n\n\
         [prefix]\nblock_tokens = {BLOCK_SIZE}\n\n"
    );
    // The learner's inputs, for replaying these labels offline
    // (`headroom_predictor::journal`): top-level, so before the sections.
    if let Ok(dir) = std::env::var("HEADROOM_ROUTER_JOURNAL_DIR") {
        let path = std::path::Path::new(&dir).join(format!("router-{listen_port}.jsonl"));
        s.insert_str(0, &format!("predictor_journal = '{}'\n", path.display()));
    }
    s.push_str(extra);
    s.push('\n');
    if let Some(t) = &env.tokenizer {
        // The servers' own tokenizer and chat template (tokenizer_config.json beside
        // it): the router's prompt counts and prefix blocks are the engine's. A TOML
        // literal string: the path is taken as is.
        s.push_str(&format!(
            "[[models]]\nname = \"{MODEL}\"\ntokenizer = 'hf:{}'\n\n",
            t.display()
        ));
    }
    for (i, u) in env.urls.iter().enumerate() {
        // A class per model: servers of one model on this machine share a latency model.
        let class = env.class_of(i);
        s.push_str(&format!(
            "[[replicas]]\nurl = \"{u}\"\nname = \"vllm-{i}\"\nclass = \"{class}\"\n\n"
        ));
    }
    s
}

impl Env {
    /// The model server `i` serves (the basename of its model dir, from the run dir's
    /// `server-I.model`; `tiny-llama` when unknown).
    pub fn model_of(&self, i: usize) -> String {
        self.run_dir
            .as_ref()
            .and_then(|d| {
                let k = server_index(d, &self.urls[i]);
                fs::read_to_string(d.join(format!("server-{k}.model"))).ok()
            })
            .and_then(|m| {
                Path::new(m.trim())
                    .file_name()
                    .map(|f| f.to_string_lossy().into_owned())
            })
            .unwrap_or_else(|| MODEL.to_string())
    }

    /// The router class of server `i`.
    pub fn class_of(&self, i: usize) -> String {
        format!("cpu-{}", self.model_of(i))
    }
}

/// A `headroom serve` child process; killed and reaped on drop.
pub struct RouterProc {
    child: Child,
    pub base: String,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    l.local_addr().expect("local addr").port()
}

impl RouterProc {
    /// Starts a router in front of `env`'s servers and waits until it has scraped and
    /// probed every one of them.
    pub async fn start(env: &Env, policy: &str, extra_toml: &str) -> RouterProc {
        let mut last_err = String::new();
        for _ in 0..3 {
            let dir = tempfile::tempdir().expect("temp dir");
            let port = free_port();
            let cfg = dir.path().join("router.toml");
            fs::write(&cfg, config_toml(env, port, policy, extra_toml)).expect("write config");
            let log = dir.path().join("router.log");
            let child = Command::new(env!("CARGO_BIN_EXE_headroom"))
                .args(["serve", "--config"])
                .arg(&cfg)
                .env("HEADROOM_LOG", "info")
                .env("NO_COLOR", "1")
                .stdin(Stdio::null())
                .stdout(Stdio::from(fs::File::create(&log).expect("log file")))
                .stderr(Stdio::from(
                    fs::OpenOptions::new()
                        .append(true)
                        .open(&log)
                        .expect("log file"),
                ))
                .spawn()
                .expect("spawn headroom serve");
            let mut r = RouterProc {
                child,
                base: format!("http://127.0.0.1:{port}"),
                log,
                _dir: dir,
            };
            match r.wait_ready(env.urls.len()).await {
                Ok(()) => {
                    println!("router ({policy}) at {}", r.base);
                    return r;
                }
                // The port was taken between picking and binding: try another.
                Err(e) => last_err = format!("{e}\n{}", r.log_tail(4000)),
            }
        }
        panic!("headroom serve did not become ready: {last_err}");
    }

    async fn wait_ready(&mut self, n: usize) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(30);
        let c = client();
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("router exited early: {status}"));
            }
            let view = match c.get(self.url("/debug/replicas")).send().await {
                Ok(resp) => resp.json::<Value>().await.ok(),
                Err(_) => None,
            };
            if let Some(v) = view {
                let reps = v["replicas"].as_array().cloned().unwrap_or_default();
                let ready = reps.len() == n
                    && reps.iter().all(|r| {
                        r["health"] == "healthy"
                            && !r["scraped"].is_null()
                            && r["models"].as_array().is_some_and(|m| !m.is_empty())
                    });
                if ready {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                return Err("router not ready within 30 s".into());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// The last `max` bytes of the router's log.
    pub fn log_tail(&self, max: u64) -> String {
        let Ok(mut f) = fs::File::open(&self.log) else {
            return String::new();
        };
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        let _ = f.seek(SeekFrom::Start(len.saturating_sub(max)));
        let mut s = String::new();
        let _ = f.read_to_string(&mut s);
        s
    }

    pub async fn debug_replicas(&self) -> Vec<Value> {
        get_json(&self.url("/debug/replicas")).await["replicas"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    pub async fn metrics(&self) -> String {
        get_text(&self.url("/metrics")).await
    }
}

impl Drop for RouterProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!(
                "---- router log tail ({}) ----\n{}",
                self.base,
                self.log_tail(6000)
            );
        }
    }
}

pub async fn get_text(url: &str) -> String {
    // A server pinned to one busy core can be slow to send even `/metrics` (its API
    // process shares the core with the engine): retry before calling it a failure.
    let mut last = String::new();
    for _ in 0..3 {
        let resp = match client()
            .get(url)
            .timeout(Duration::from_secs(20))
            .send()
            .await
        {
            Ok(r) => r,
            Err(e) => {
                last = e.to_string();
                continue;
            }
        };
        assert!(resp.status().is_success(), "GET {url}: {}", resp.status());
        match resp.text().await {
            Ok(t) => return t,
            Err(e) => last = e.to_string(),
        }
    }
    panic!("GET {url}: {last} (3 attempts)")
}

pub async fn get_json(url: &str) -> Value {
    serde_json::from_str(&get_text(url).await).unwrap_or_else(|e| panic!("GET {url}: {e}"))
}

/// A non-streaming answer.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub replica: Option<String>,
    /// The router's own prompt count (`x-headroom-prompt-tokens`).
    pub prompt_tokens: Option<u64>,
    pub content_type: String,
    pub body: Value,
}

pub async fn post(url: &str, body: &Value, headers: &[(&str, &str)]) -> Reply {
    let mut req = client().post(url).json(body);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req
        .send()
        .await
        .unwrap_or_else(|e| panic!("POST {url}: {e}"));
    let status = resp.status().as_u16();
    let replica = header(&resp, headroom::REPLICA_HEADER);
    let prompt_tokens = header(&resp, headroom::PROMPT_TOKENS_HEADER).and_then(|v| v.parse().ok());
    let content_type = header(&resp, "content-type").unwrap_or_default();
    let text = resp.text().await.unwrap_or_default();
    Reply {
        status,
        replica,
        prompt_tokens,
        content_type,
        body: serde_json::from_str(&text).unwrap_or(Value::String(text)),
    }
}

fn header(resp: &reqwest::Response, name: &str) -> Option<String> {
    resp.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// A streamed answer, as the client saw it.
#[derive(Debug, Default)]
pub struct Streamed {
    pub status: u16,
    pub replica: Option<String>,
    pub content_type: String,
    /// Raw body text.
    pub raw: String,
    /// Each event's `data:` payload, in order (`[DONE]` included).
    pub data: Vec<String>,
    /// Events with at least one choice.
    pub content_events: u32,
    /// Seconds from sending to the first and the last content event.
    pub first_content_s: Option<f64>,
    pub last_content_s: Option<f64>,
    pub usage: Option<Value>,
    /// Events whose `choices` is empty (the usage chunk).
    pub usage_events: u32,
    pub done: bool,
    pub error_event: bool,
    /// The transport failed before the end.
    pub transport_error: Option<String>,
    pub predicted_ttft_ms: Option<f64>,
    /// The router's own prompt count (`x-headroom-prompt-tokens`).
    pub prompt_tokens: Option<u64>,
    pub headers: HashMap<String, String>,
    /// The engine's per-request timings from the final usage chunk (vLLM
    /// `--enable-per-request-metrics`), when the client asked for usage.
    pub engine_ttft_ms: Option<f64>,
    pub engine_itl_ms: Option<f64>,
    /// Each read that carried content: seconds from sending, and the completion tokens
    /// so far by the chunks' own usage (when the client asked for per-chunk usage).
    pub reads: Vec<(f64, u32)>,
}

impl Streamed {
    /// A numeric response header.
    pub fn header_f64(&self, name: &str) -> Option<f64> {
        self.headers.get(name).and_then(|v| v.parse().ok())
    }
}

impl Streamed {
    /// Content events (JSON), in order.
    pub fn chunks(&self) -> Vec<Value> {
        self.data
            .iter()
            .filter(|d| d.as_str() != "[DONE]")
            .filter_map(|d| serde_json::from_str(d).ok())
            .collect()
    }

    /// Generated text (completions `text` or chat `delta.content`).
    pub fn text(&self) -> String {
        let mut s = String::new();
        for c in self.chunks() {
            for ch in c["choices"].as_array().into_iter().flatten() {
                if let Some(t) = ch["text"].as_str() {
                    s.push_str(t);
                }
                if let Some(t) = ch["delta"]["content"].as_str() {
                    s.push_str(t);
                }
            }
        }
        s
    }

    /// A complete, error-free 200 stream.
    pub fn ok(&self) -> bool {
        self.status == 200 && self.done && !self.error_event && self.transport_error.is_none()
    }
}

/// Sends a streaming request and reads it to the end, timing content events.
pub async fn stream(url: &str, body: &Value, headers: &[(&str, &str)]) -> Streamed {
    let t0 = Instant::now();
    let mut req = client().post(url).json(body);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let mut out = Streamed::default();
    let resp = match req.send().await {
        Ok(r) => r,
        Err(e) => {
            out.transport_error = Some(e.to_string());
            return out;
        }
    };
    out.status = resp.status().as_u16();
    out.replica = header(&resp, headroom::REPLICA_HEADER);
    out.content_type = header(&resp, "content-type").unwrap_or_default();
    out.predicted_ttft_ms =
        header(&resp, "x-headroom-predicted-ttft-ms").and_then(|v| v.parse().ok());
    out.prompt_tokens = header(&resp, headroom::PROMPT_TOKENS_HEADER).and_then(|v| v.parse().ok());
    for (k, v) in resp.headers() {
        if let Ok(v) = v.to_str() {
            out.headers.insert(k.as_str().to_string(), v.to_string());
        }
    }
    let mut body = resp.bytes_stream();
    let mut pending = String::new();
    loop {
        let chunk = match body.next().await {
            None => break,
            Some(Ok(c)) => c,
            Some(Err(e)) => {
                out.transport_error = Some(e.to_string());
                break;
            }
        };
        let now = t0.elapsed().as_secs_f64();
        let events_before = out.content_events;
        let mut tokens = out.reads.last().map_or(0, |r| r.1);
        let text = String::from_utf8_lossy(&chunk);
        out.raw.push_str(&text);
        pending.push_str(&text);
        while let Some(end) = pending.find("\n\n") {
            let ev: String = pending.drain(..end + 2).collect();
            let Some(data) = ev.trim().strip_prefix("data:") else {
                continue;
            };
            let data = data.trim().to_string();
            if data == "[DONE]" {
                out.done = true;
            } else if let Ok(v) = serde_json::from_str::<Value>(&data) {
                if v.get("error").is_some() {
                    out.error_event = true;
                }
                if v["usage"].is_object() {
                    out.usage = Some(v["usage"].clone());
                }
                if let Some(m) = v["metrics"].as_object() {
                    out.engine_ttft_ms = m.get("time_to_first_token_ms").and_then(Value::as_f64);
                    out.engine_itl_ms = m.get("mean_itl_ms").and_then(Value::as_f64);
                }
                match v["choices"].as_array() {
                    Some(c) if !c.is_empty() => {
                        if let Some(n) = v["usage"]["completion_tokens"].as_u64() {
                            tokens = tokens.max(n as u32);
                        }
                        out.content_events += 1;
                        out.first_content_s.get_or_insert(now);
                        out.last_content_s = Some(now);
                    }
                    Some(_) => out.usage_events += 1,
                    None => {}
                }
            }
            out.data.push(data);
        }
        if out.content_events > events_before {
            out.reads.push((now, tokens));
        }
    }
    out
}

/// Sums every sample of metric `name` whose labels include all of `want`.
pub fn metric(text: &str, name: &str, want: &[(&str, &str)]) -> Option<f64> {
    let mut total = None;
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        let (labels, value) = match rest.chars().next() {
            Some('{') => match rest.rfind('}') {
                Some(end) => (&rest[1..end], rest[end + 1..].trim()),
                None => continue,
            },
            Some(' ') => ("", rest.trim()),
            _ => continue,
        };
        if !want
            .iter()
            .all(|(k, v)| labels.contains(&format!("{k}=\"{v}\"")))
        {
            continue;
        }
        let Some(v) = value
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
        else {
            continue;
        };
        total = Some(total.unwrap_or(0.0) + v);
    }
    total
}

/// The value of label `label` on the first sample of `name`.
pub fn label(text: &str, name: &str, label: &str) -> Option<String> {
    let line = text
        .lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with('{'))?;
    let key = format!("{label}=\"");
    let start = line.find(&key)? + key.len();
    let end = line[start..].find('"')? + start;
    Some(line[start..end].to_string())
}

/// What one vLLM server's own `/metrics` says about the quantities the router scrapes.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineView {
    pub running: f64,
    pub waiting: f64,
    pub kv_usage: f64,
    pub prefix_queries: f64,
    pub prefix_hits: f64,
    pub preemptions: f64,
    pub block_size: u32,
    pub num_gpu_blocks: u32,
}

pub fn engine_view(text: &str) -> EngineView {
    let m = |n: &str| metric(text, n, &[]).unwrap_or_else(|| panic!("vLLM /metrics lacks {n}"));
    let l = |k: &str| {
        label(text, "vllm:cache_config_info", k)
            .and_then(|v| v.parse::<u32>().ok())
            .unwrap_or_else(|| panic!("vllm:cache_config_info lacks {k}"))
    };
    EngineView {
        running: m("vllm:num_requests_running"),
        waiting: m("vllm:num_requests_waiting"),
        kv_usage: m("vllm:kv_cache_usage_perc"),
        prefix_queries: m("vllm:prefix_cache_queries_total"),
        prefix_hits: m("vllm:prefix_cache_hits_total"),
        preemptions: m("vllm:num_preemptions_total"),
        block_size: l("block_size"),
        num_gpu_blocks: l("num_gpu_blocks"),
    }
}

pub async fn engine(url: &str) -> EngineView {
    engine_view(&get_text(&format!("{url}/metrics")).await)
}

/// The index of a router replica name (`vllm-I`).
pub fn index_of(name: &str) -> usize {
    name.strip_prefix("vllm-")
        .and_then(|i| i.parse().ok())
        .unwrap_or_else(|| panic!("unexpected replica name {name}"))
}

/// Mean of a router histogram (`_sum / _count`) and its count, over matching labels.
pub fn hist_mean(text: &str, name: &str, want: &[(&str, &str)]) -> Option<(f64, f64)> {
    let sum = metric(text, &format!("{name}_sum"), want)?;
    let count = metric(text, &format!("{name}_count"), want)?;
    (count > 0.0).then(|| (sum / count, count))
}

/// Polls the router's metrics until `pred` holds (the outcome of a request is recorded
/// as its body ends, which can be just after the client has read `[DONE]`).
pub async fn metrics_when(r: &RouterProc, pred: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let m = r.metrics().await;
        if pred(&m) || Instant::now() > deadline {
            return m;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The `start.sh` pid of server `i`, checked to still belong to the run (its cwd is
/// the run's scratch dir), so a recycled pid is never signalled.
pub fn server_pid(run_dir: &Path, i: usize) -> u32 {
    let pid: u32 = fs::read_to_string(run_dir.join(format!("server-{i}.pid")))
        .expect("server pid file")
        .trim()
        .parse()
        .expect("pid");
    let cwd = fs::read_link(format!("/proc/{pid}/cwd")).expect("server process is alive");
    assert!(
        cwd.starts_with(run_dir.join("scratch")),
        "pid {pid} is not this run's server (cwd {cwd:?})"
    );
    pid
}

/// The run-dir index of the server at `url` (by its port file).
pub fn server_index(run_dir: &Path, url: &str) -> usize {
    let port = url.rsplit(':').next().unwrap_or_default();
    (0..16)
        .find(|i| {
            fs::read_to_string(run_dir.join(format!("server-{i}.port")))
                .is_ok_and(|p| p.trim() == port)
        })
        .unwrap_or_else(|| panic!("no server with port {port} in {run_dir:?}"))
}
