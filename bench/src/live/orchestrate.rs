//! `headroom-bench live`: start a fleet of emulators and router nodes on loopback,
//! replay a workload through the routers, measure, stop everything.
//!
//! Emulators (`headroom-replica --listen 127.0.0.1:0`) announce their port on stdout;
//! router nodes (`headroom serve`) get a port reserved just before start (retried on a
//! failed start). Every child runs under a kill-on-drop guard and is stopped with
//! SIGTERM (then SIGKILL) on every exit path. In `Target` mode nothing is started and
//! the given endpoints (our router, a peer router, a replica) are driven as they are.
//!
//! Router resource use: CPU seconds spent during the replay (from `/proc`, the delta
//! over the replay window) and peak RSS of each router process — for started routers
//! always, for targets when their pids are given.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use headroom_engine::Profile;
use serde::{Deserialize, Serialize};

use super::LiveError;
use super::procs::{ChildProc, find_binary, start_on_free_port, stop_all, wait_ready};
use super::replay::{ReplayOptions, replay};
use super::usage::{ProcUsage, tree_of, usage_of_all};
use crate::sim::config::FleetGroup;
use crate::sim::result::{ReplicaInfo, RunResult};
use crate::workload::Workload;

/// Starting a fleet and router nodes.
#[derive(Clone, Debug)]
pub struct SpawnOptions {
    pub fleet: Vec<FleetGroup>,
    /// Router nodes (each request goes to one at random, seeded).
    pub routers: u32,
    /// `headroom serve --policy`.
    pub policy: String,
    /// Where `headroom` and `headroom-replica` are (default: next to this binary).
    pub bin_dir: Option<PathBuf>,
    /// Extra arguments for every `headroom serve`.
    pub serve_args: Vec<String>,
    /// Emulator step-time noise (log-sd; 0 = none).
    pub step_noise: f64,
}

/// What to drive.
#[derive(Clone, Debug)]
pub enum LiveMode {
    Spawn(SpawnOptions),
    /// Existing endpoints; `label` names the system in results (`RunResult::policy`);
    /// `pids` are measured as its router processes (with their direct children).
    Target {
        urls: Vec<String>,
        label: String,
        pids: Vec<u32>,
    },
}

/// A live run.
#[derive(Clone, Debug)]
pub struct LiveOptions {
    pub workload: Workload,
    pub mode: LiveMode,
    /// Served model name.
    pub model: String,
    /// Wall seconds per model second (passed to the emulators).
    pub time_scale: f64,
    pub rate_scale: f64,
    pub seed: u64,
    pub max_inflight: usize,
    pub request_timeout: Duration,
    pub default_slo_ttft_ms: f64,
    pub default_slo_tpot_ms: f64,
    pub load_sample_interval_s: f64,
    /// Children's stderr logs go here (one file each) when set.
    pub log_dir: Option<PathBuf>,
    /// Longest wait for a child to become ready.
    pub startup_timeout: Duration,
    /// Wall time spent measuring the routers' idle CPU before the replay (0 = skip).
    pub idle_probe: Duration,
    /// `--target` mode: the servers' context window (spawned fleets report their own).
    pub max_model_len: Option<u32>,
    /// Fold prompt token ids below this (a real model's vocabulary size).
    pub vocab: Option<u32>,
    /// Token ids or text.
    pub prompt_form: super::body::PromptForm,
}

impl LiveOptions {
    /// Defaults for everything but the workload and mode.
    pub fn new(workload: Workload, mode: LiveMode) -> Self {
        let d = ReplayOptions::default();
        LiveOptions {
            workload,
            mode,
            model: d.model,
            time_scale: 1.0,
            rate_scale: 1.0,
            seed: 1,
            max_inflight: d.max_inflight,
            request_timeout: d.request_timeout,
            default_slo_ttft_ms: d.default_slo_ttft_ms,
            default_slo_tpot_ms: d.default_slo_tpot_ms,
            load_sample_interval_s: d.load_sample_interval_s,
            log_dir: None,
            startup_timeout: Duration::from_secs(60),
            idle_probe: Duration::from_secs(1),
            max_model_len: None,
            vocab: None,
            prompt_form: super::body::PromptForm::Ids,
        }
    }
}

/// Resource use of one router process over a run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RouterUsage {
    pub url: String,
    pub pid: u32,
    /// CPU seconds spent during the replay.
    pub cpu_s: f64,
    /// Peak RSS over the process's life (MiB).
    pub peak_rss_mib: f64,
    /// CPU seconds per wall second while idle just before the replay (scraping,
    /// probes, timers): background cost that `cpu_s` includes.
    #[serde(default)]
    pub idle_cpu_per_s: f64,
}

/// Everything a live run produced: the shared [`RunResult`] and what only a live run
/// can measure.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LiveRun {
    pub result: RunResult,
    pub routers: Vec<RouterUsage>,
    pub time_scale: f64,
    /// Wall seconds of the replay.
    pub wall_s: f64,
    /// Largest delay of a send behind schedule (wall seconds); large values mean the
    /// client, not the system under test, limited the offered load.
    pub max_send_lag_s: f64,
    /// Requests that did not complete.
    pub failed: usize,
    /// PIDs of every process the run started (all stopped when it returns).
    pub started_pids: Vec<u32>,
    /// Requests arriving before this (model seconds) are a warm-up: sent and learned
    /// from, but not scored.
    #[serde(default)]
    pub warmup_s: f64,
}

impl LiveRun {
    /// The result without the warm-up's requests (what attainment and latencies judge).
    pub fn scored(&self) -> RunResult {
        let mut r = self.result.clone();
        r.records.retain(|x| x.arrival_s >= self.warmup_s);
        r
    }

    /// Router CPU milliseconds per request, summed over router processes.
    pub fn router_cpu_ms_per_request(&self) -> Option<f64> {
        let n = self.result.records.len();
        (!self.routers.is_empty() && n > 0)
            .then(|| self.routers.iter().map(|r| r.cpu_s).sum::<f64>() * 1e3 / n as f64)
    }

    /// As [`Self::router_cpu_ms_per_request`] less the idle rate over the replay: what
    /// the requests themselves cost.
    pub fn router_net_cpu_ms_per_request(&self) -> Option<f64> {
        let n = self.result.records.len();
        (!self.routers.is_empty() && n > 0).then(|| {
            let net: f64 = self
                .routers
                .iter()
                .map(|r| (r.cpu_s - r.idle_cpu_per_s * self.wall_s).max(0.0))
                .sum();
            net * 1e3 / n as f64
        })
    }
}

struct Started {
    children: Vec<ChildProc>,
    router_urls: Vec<String>,
    router_ix: Vec<usize>,
    replicas: Vec<ReplicaInfo>,
    max_model_len: u32,
}

/// Runs one live experiment and stops everything it started before returning.
pub async fn run_live(opts: LiveOptions) -> Result<LiveRun, LiveError> {
    if !(opts.time_scale.is_finite() && opts.time_scale > 0.0 && opts.time_scale <= 1000.0) {
        return Err(LiveError::Options(format!(
            "time scale must be in (0, 1000], got {}",
            opts.time_scale
        )));
    }
    match &opts.mode {
        LiveMode::Spawn(s) => {
            let mut started = Started {
                children: Vec::new(),
                router_urls: Vec::new(),
                router_ix: Vec::new(),
                replicas: Vec::new(),
                max_model_len: u32::MAX,
            };
            let outcome = match start(&opts, s, &mut started).await {
                Ok(()) => {
                    let pids: Vec<Vec<u32>> = started
                        .router_ix
                        .iter()
                        .map(|&i| vec![started.children[i].pid()])
                        .collect();
                    measure(
                        &opts,
                        &s.policy,
                        started.router_urls.clone(),
                        pids,
                        started.replicas.clone(),
                        Some(started.max_model_len),
                    )
                    .await
                }
                Err(e) => Err(e),
            };
            let started_pids = started.children.iter().map(ChildProc::pid).collect();
            stop_all(&mut started.children, Duration::from_secs(5)).await;
            let mut run = outcome?;
            run.started_pids = started_pids;
            Ok(run)
        }
        LiveMode::Target { urls, label, pids } => {
            let replicas = discover_replicas(urls).await;
            let trees = pids.iter().map(|&p| tree_of(p)).collect();
            measure(
                &opts,
                label,
                urls.clone(),
                trees,
                replicas,
                opts.max_model_len,
            )
            .await
        }
    }
}

async fn measure(
    opts: &LiveOptions,
    label: &str,
    urls: Vec<String>,
    router_pids: Vec<Vec<u32>>,
    replicas: Vec<ReplicaInfo>,
    max_model_len: Option<u32>,
) -> Result<LiveRun, LiveError> {
    let idle_rates = idle_cpu_rates(&router_pids, opts.idle_probe).await;
    let before: Vec<ProcUsage> = router_pids.iter().map(|t| usage_of_all(t)).collect();
    let ropts = ReplayOptions {
        targets: urls.clone(),
        model: opts.model.clone(),
        time_scale: opts.time_scale,
        rate_scale: opts.rate_scale,
        max_inflight: opts.max_inflight,
        request_timeout: opts.request_timeout,
        max_model_len,
        vocab: opts.vocab,
        prompt_form: opts.prompt_form,
        default_slo_ttft_ms: opts.default_slo_ttft_ms,
        default_slo_tpot_ms: opts.default_slo_tpot_ms,
        seed: opts.seed,
        replicas,
        load_sample_interval_s: opts.load_sample_interval_s,
    };
    let rep = replay(&opts.workload, &ropts).await?;
    let routers = router_pids
        .iter()
        .zip(&before)
        .enumerate()
        .map(|(i, (tree, b))| {
            let now = usage_of_all(tree);
            RouterUsage {
                url: urls.get(i).cloned().unwrap_or_default(),
                pid: tree.first().copied().unwrap_or(0),
                cpu_s: now.cpu_since(b),
                peak_rss_mib: now.peak_rss_kib as f64 / 1024.0,
                idle_cpu_per_s: idle_rates.get(i).copied().unwrap_or(0.0),
            }
        })
        .collect();
    Ok(LiveRun {
        result: RunResult {
            policy: label.to_string(),
            workload: opts.workload.name.clone(),
            rate_scale: opts.rate_scale,
            seed: opts.seed,
            routers: urls.len() as u32,
            replicas: rep.replicas,
            records: rep.records,
            load: rep.load,
            decision_ns: Vec::new(),
            sim_duration_s: rep.wall_s / opts.time_scale,
        },
        routers,
        time_scale: opts.time_scale,
        wall_s: rep.wall_s,
        max_send_lag_s: rep.max_send_lag_s,
        failed: rep.failed,
        started_pids: Vec::new(),
        warmup_s: 0.0,
    })
}

/// CPU seconds per wall second of each process tree over `probe` of idleness.
async fn idle_cpu_rates(trees: &[Vec<u32>], probe: Duration) -> Vec<f64> {
    if trees.is_empty() || probe.is_zero() {
        return vec![0.0; trees.len()];
    }
    let t0 = std::time::Instant::now();
    let a: Vec<ProcUsage> = trees.iter().map(|t| usage_of_all(t)).collect();
    tokio::time::sleep(probe).await;
    let secs = t0.elapsed().as_secs_f64();
    trees
        .iter()
        .zip(&a)
        .map(|(t, a)| usage_of_all(t).cpu_since(a) / secs)
        .collect()
}

fn log_path(opts: &LiveOptions, name: &str) -> Option<PathBuf> {
    opts.log_dir.as_ref().map(|d| d.join(format!("{name}.log")))
}

/// Starts replicas then routers, pushing each child as soon as it exists so the
/// caller stops it whatever happens next.
async fn start(opts: &LiveOptions, s: &SpawnOptions, st: &mut Started) -> Result<(), LiveError> {
    if s.routers == 0 {
        return Err(LiveError::Options("at least one router node".into()));
    }
    if let Some(d) = &opts.log_dir {
        std::fs::create_dir_all(d)
            .map_err(|e| LiveError::io(format!("log dir {}", d.display()), e))?;
    }
    let replica_bin = find_binary("headroom-replica", s.bin_dir.as_deref())?;
    let router_bin = find_binary("headroom", s.bin_dir.as_deref())?;
    let mut flags = Vec::new();
    let mut i = 0usize;
    for g in &s.fleet {
        let profile =
            Profile::by_name(&g.profile).map_err(|e| LiveError::Options(format!("fleet: {e}")))?;
        st.max_model_len = st.max_model_len.min(profile.max_model_len);
        for _ in 0..g.count {
            let name = format!("r{i}-{}", g.profile);
            let mut args = vec![
                "--listen".to_string(),
                "127.0.0.1:0".into(),
                "--model".into(),
                opts.model.clone(),
                "--profile".into(),
                g.profile.clone(),
                "--time-scale".into(),
                opts.time_scale.to_string(),
                "--seed".into(),
                opts.seed
                    .wrapping_mul(1000)
                    .wrapping_add(i as u64)
                    .to_string(),
            ];
            // Always passed: the emulator's own default is not 0.
            args.extend(["--step-noise".into(), s.step_noise.to_string()]);
            let child = ChildProc::spawn(
                &format!("replica {name}"),
                &replica_bin,
                &args,
                log_path(opts, &name).as_deref(),
                &[("RUST_LOG", "warn")],
            )?;
            st.children.push(child);
            let c = st
                .children
                .last_mut()
                .ok_or_else(|| LiveError::Measure("no child".into()))?;
            let addr = c
                .wait_for_line(opts.startup_timeout, |l| {
                    l.strip_prefix("headroom-replica listening on http://")
                        .and_then(|a| a.trim().parse::<SocketAddr>().ok())
                })
                .await?;
            wait_ready(addr, "/health", opts.startup_timeout, Some(c)).await?;
            flags.push(format!(
                "http://{addr},name={name},class={},max_batched_tokens={}",
                g.profile, profile.max_num_batched_tokens
            ));
            st.replicas.push(ReplicaInfo {
                name,
                profile: g.profile.clone(),
            });
            i += 1;
        }
    }
    if st.replicas.is_empty() {
        return Err(LiveError::Options("empty fleet".into()));
    }
    for n in 0..s.routers {
        let url = start_router(opts, s, st, &router_bin, &flags, n).await?;
        st.router_urls.push(url);
    }
    Ok(())
}

/// Starts router node `n` (a new port if the reserved one was taken).
async fn start_router(
    opts: &LiveOptions,
    s: &SpawnOptions,
    st: &mut Started,
    bin: &std::path::Path,
    replica_flags: &[String],
    n: u32,
) -> Result<String, LiveError> {
    let args = |addr: SocketAddr| {
        let mut args = vec![
            "--log".to_string(),
            "warn".into(),
            "serve".into(),
            "--listen".into(),
            addr.to_string(),
            "--policy".into(),
            s.policy.clone(),
            "--tokenizer".into(),
            format!("{}=cl100k", opts.model),
            "--node-id".into(),
            format!("node-{n}"),
            "--seed".into(),
            opts.seed.wrapping_add(u64::from(n) + 1).to_string(),
        ];
        for f in replica_flags {
            args.extend(["--replica".into(), f.clone()]);
        }
        args.extend(s.serve_args.iter().cloned());
        args
    };
    let (child, addr) = start_on_free_port(
        &format!("router node-{n}"),
        bin,
        args,
        log_path(opts, &format!("node-{n}")).as_deref(),
        "/ready",
        opts.startup_timeout,
    )
    .await?;
    st.children.push(child);
    st.router_ix.push(st.children.len() - 1);
    Ok(format!("http://{addr}"))
}

/// Replica names and classes from `/debug/replicas` of the first target that has it.
async fn discover_replicas(urls: &[String]) -> Vec<ReplicaInfo> {
    use http_body_util::{BodyExt, Empty};
    use hyper_util::client::legacy::{Client, connect::HttpConnector};
    let client: Client<HttpConnector, Empty<bytes::Bytes>> =
        Client::builder(hyper_util::rt::TokioExecutor::new()).build(HttpConnector::new());
    for u in urls {
        let Ok(uri) = format!("{}/debug/replicas", u.trim_end_matches('/')).parse::<http::Uri>()
        else {
            continue;
        };
        let Ok(Ok(resp)) = tokio::time::timeout(Duration::from_secs(2), client.get(uri)).await
        else {
            continue;
        };
        if !resp.status().is_success() {
            continue;
        }
        let Ok(Ok(body)) =
            tokio::time::timeout(Duration::from_secs(2), resp.into_body().collect()).await
        else {
            continue;
        };
        let Ok(v) = serde_json::from_slice::<serde_json::Value>(&body.to_bytes()) else {
            continue;
        };
        let list: Vec<ReplicaInfo> = v["replicas"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| {
                Some(ReplicaInfo {
                    name: r["name"].as_str()?.to_string(),
                    profile: r["class"].as_str().unwrap_or_default().to_string(),
                })
            })
            .collect();
        if !list.is_empty() {
            return list;
        }
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::result::RequestRecord;

    #[test]
    fn router_cpu_per_request_with_and_without_idle() {
        let run = LiveRun {
            result: RunResult {
                records: vec![RequestRecord::default(); 100],
                ..RunResult::default()
            },
            routers: vec![
                RouterUsage {
                    cpu_s: 1.0,
                    idle_cpu_per_s: 0.05,
                    ..RouterUsage::default()
                },
                RouterUsage {
                    cpu_s: 0.5,
                    idle_cpu_per_s: 0.0,
                    ..RouterUsage::default()
                },
            ],
            wall_s: 10.0,
            ..LiveRun::default()
        };
        assert_eq!(run.router_cpu_ms_per_request(), Some(15.0));
        assert_eq!(run.router_net_cpu_ms_per_request(), Some(10.0));
        assert_eq!(LiveRun::default().router_cpu_ms_per_request(), None);
    }
}
