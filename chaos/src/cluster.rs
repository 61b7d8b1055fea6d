//! The processes of one scenario: emulated replicas (`headroom-replica`), router nodes
//! (`headroom serve`, optionally a 3-node QUIC mesh with `headroom certs`), and an
//! optional in-process bad upstream.
//!
//! Invariants: every child runs under `headroom-bench`'s kill-on-drop guard and is
//! recorded in [`Cluster::started`] the moment it is spawned, so the leftover check
//! sees every pid this scenario ever created; [`Cluster::teardown`] resumes paused
//! nodes and stops (and reaps) everything, routers first. Ports are ephemeral: the
//! emulators bind port 0 and announce it, router HTTP and gossip ports are reserved
//! just before start and a failed start is retried on fresh ports. With
//! `ClusterSpec::relay` the nodes' gossip runs through the harness's UDP relay: each
//! node advertises (and is seeded to the others as) the relay's front for it.

use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use headroom_bench::live::client::{HttpClient, http_client};
use headroom_bench::live::procs::{ChildProc, free_port, wait_ready};
use serde::Serialize;

use crate::bad_metrics::BadUpstream;
use crate::bins::Binaries;
use crate::http::get_json;
use crate::os::{Signal, signal};
use crate::relay::Relay;
use crate::router_config::RouterTimings;
use crate::{ChaosError, os};

/// What to start.
#[derive(Clone, Debug, Serialize)]
pub struct ClusterSpec {
    /// Emulator profile of each replica.
    pub replica_profiles: Vec<String>,
    /// Index of the replica whose `/metrics` the router reaches through a bad upstream.
    pub bad_metrics: Option<usize>,
    /// Router nodes; more than one forms a mesh.
    pub routers: usize,
    /// Route the mesh's UDP through the harness's fault-injecting relay
    /// ([`crate::relay`]): each node advertises the relay's front for it.
    pub relay: bool,
    /// `HEADROOM_CLOCK_OFFSET_MS` of each router node (by index; missing = 0): a node
    /// whose wall clock runs ahead or behind.
    pub clock_offsets_ms: Vec<i64>,
    pub policy: String,
    pub timings: RouterTimings,
    /// Emulators' `--time-scale`.
    pub time_scale: f64,
    pub seed: u64,
    pub model: String,
}

/// A started emulator.
#[derive(Debug)]
pub struct ReplicaProc {
    pub name: String,
    /// The emulator's own address.
    pub addr: SocketAddr,
    /// What the routers are given (the bad upstream's address when it fronts this one).
    pub url: String,
    pub profile: String,
    pub proc: Option<ChildProc>,
}

/// A started router node.
#[derive(Debug)]
pub struct RouterProc {
    pub id: String,
    pub http: SocketAddr,
    pub gossip: Option<SocketAddr>,
    pub proc: Option<ChildProc>,
    /// Set while SIGSTOPped, so teardown resumes it first.
    pub paused: bool,
}

impl RouterProc {
    pub fn url(&self) -> String {
        format!("http://{}", self.http)
    }
}

/// A pid this scenario started.
#[derive(Clone, Debug, Serialize)]
pub struct StartedPid {
    pub label: String,
    pub pid: u32,
    /// Start time in clock ticks (tells this process from a later one with its pid).
    #[serde(skip)]
    pub ticks: Option<u64>,
}

impl StartedPid {
    fn new(label: &str, pid: u32) -> StartedPid {
        StartedPid {
            label: label.into(),
            pid,
            ticks: os::start_ticks(pid),
        }
    }
}

/// Everything one scenario runs against.
pub struct Cluster {
    pub replicas: Vec<ReplicaProc>,
    pub routers: Vec<RouterProc>,
    pub bad: Option<BadUpstream>,
    /// The fault-injecting UDP relay between nodes (when the spec asks for one).
    pub relay: Option<Relay>,
    pub started: Vec<StartedPid>,
    pub spec: ClusterSpec,
    /// Logs, config and certificates.
    pub dir: PathBuf,
    pub client: HttpClient,
    /// Seconds from the last router being ready until every node routed to every
    /// replica and saw every member.
    pub converge_s: f64,
    bins: Binaries,
    config_path: PathBuf,
    certs: Option<PathBuf>,
}

/// Longest wait for one process to become ready.
const STARTUP: Duration = Duration::from_secs(30);

fn free_udp() -> Result<SocketAddr, ChaosError> {
    hold_udp()?
        .local_addr()
        .map_err(|e| ChaosError::io("reserving a UDP port", e))
}

fn hold_udp() -> Result<UdpSocket, ChaosError> {
    UdpSocket::bind("127.0.0.1:0").map_err(|e| ChaosError::io("reserving a UDP port", e))
}

impl Cluster {
    /// Starts the whole cluster and waits until every node routes to every replica
    /// (and, for a mesh, every node sees every member). On failure everything started
    /// so far is stopped before the error is returned.
    pub async fn start(
        spec: ClusterSpec,
        bins: Binaries,
        dir: &Path,
    ) -> Result<Cluster, ChaosError> {
        std::fs::create_dir_all(dir)
            .map_err(|e| ChaosError::io(format!("creating {}", dir.display()), e))?;
        let config_path = dir.join("router.toml");
        std::fs::write(&config_path, spec.timings.toml())
            .map_err(|e| ChaosError::io(format!("writing {}", config_path.display()), e))?;
        let mut c = Cluster {
            replicas: Vec::new(),
            routers: Vec::new(),
            bad: None,
            relay: None,
            started: Vec::new(),
            spec,
            dir: dir.to_path_buf(),
            client: http_client(),
            converge_s: 0.0,
            bins,
            config_path,
            certs: None,
        };
        match c.boot().await {
            Ok(()) => Ok(c),
            Err(e) => {
                c.teardown().await;
                Err(e)
            }
        }
    }

    async fn boot(&mut self) -> Result<(), ChaosError> {
        for i in 0..self.spec.replica_profiles.len() {
            let profile = self.spec.replica_profiles[i].clone();
            let (proc, addr) = self.spawn_replica(i, &profile, "127.0.0.1:0").await?;
            let url = format!("http://{addr}");
            self.replicas.push(ReplicaProc {
                name: format!("r{i}"),
                addr,
                url,
                profile,
                proc: Some(proc),
            });
        }
        if let Some(i) = self.spec.bad_metrics {
            let r = self
                .replicas
                .get_mut(i)
                .ok_or_else(|| ChaosError::Options(format!("no replica {i} to front")))?;
            let bad = BadUpstream::start(r.addr).await?;
            r.url = format!("http://{}", bad.addr);
            self.bad = Some(bad);
        }
        let n = self.spec.routers;
        let ids: Vec<String> = (0..n).map(|i| format!("n{i}")).collect();
        if n > 1 {
            self.certs = Some(self.write_certs(&ids).await?);
        }
        // Each gossip port stays bound here until its router is about to take it: the
        // relay's and other processes' ephemeral binds cannot take it in between.
        let mut held: Vec<Option<UdpSocket>> = (0..n)
            .map(|_| {
                if n > 1 {
                    hold_udp().map(Some)
                } else {
                    Ok(None)
                }
            })
            .collect::<Result<_, _>>()?;
        let gossip: Vec<Option<SocketAddr>> = held
            .iter()
            .map(|s| s.as_ref().and_then(|s| s.local_addr().ok()))
            .collect();
        if n > 1 && self.spec.relay {
            let real: Vec<SocketAddr> = gossip.iter().flatten().copied().collect();
            self.relay = Some(Relay::start(&real, self.spec.seed).await?);
        }
        for (i, id) in ids.iter().enumerate() {
            let seeds: Vec<SocketAddr> = (0..n)
                .filter(|j| *j != i)
                .filter_map(|j| self.reach(j, gossip[j]))
                .collect();
            drop(held[i].take());
            let node = self.spawn_router(id, i, gossip[i], &seeds, None).await?;
            self.routers.push(node);
        }
        let t = Instant::now();
        self.wait_converged().await?;
        self.converge_s = t.elapsed().as_secs_f64();
        Ok(())
    }

    /// The address peers use to reach node `i` whose real gossip address is `real`:
    /// the relay's front for it, or `real` itself without a relay.
    fn reach(&self, i: usize, real: Option<SocketAddr>) -> Option<SocketAddr> {
        match &self.relay {
            Some(r) => r.front(i),
            None => real,
        }
    }

    async fn write_certs(&mut self, ids: &[String]) -> Result<PathBuf, ChaosError> {
        let dir = self.dir.join("certs");
        let mut args = vec![
            "certs".to_string(),
            "--dir".into(),
            dir.display().to_string(),
        ];
        for id in ids {
            args.push("--node".into());
            args.push(id.clone());
        }
        let mut child = tokio::process::Command::new(&self.bins.headroom)
            .args(&args)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| ChaosError::io("running `headroom certs`", e))?;
        if let Some(pid) = child.id() {
            self.started.push(StartedPid::new("headroom certs", pid));
        }
        let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
            .await
            .map_err(|_| ChaosError::Setup("`headroom certs` did not finish in 30 s".into()))?
            .map_err(|e| ChaosError::io("waiting for `headroom certs`", e))?;
        if !status.success() {
            return Err(ChaosError::Setup(format!(
                "`headroom certs` failed ({status})"
            )));
        }
        Ok(dir)
    }

    /// Spawns emulator `i` listening on `listen`; returns it and its bound address.
    async fn spawn_replica(
        &mut self,
        i: usize,
        profile: &str,
        listen: &str,
    ) -> Result<(ChildProc, SocketAddr), ChaosError> {
        let args: Vec<String> = vec![
            "--listen".into(),
            listen.into(),
            "--model".into(),
            self.spec.model.clone(),
            "--profile".into(),
            profile.into(),
            "--time-scale".into(),
            self.spec.time_scale.to_string(),
            "--seed".into(),
            (self.spec.seed.wrapping_add(i as u64)).to_string(),
        ];
        let label = format!("replica r{i}");
        let log = self.dir.join(format!("r{i}.log"));
        let mut child = ChildProc::spawn(&label, &self.bins.replica, &args, Some(&log), &[])?;
        self.started.push(StartedPid::new(&label, child.pid()));
        let addr = child
            .wait_for_line(STARTUP, |line| {
                line.strip_prefix("headroom-replica listening on http://")
                    .and_then(|a| a.trim().parse::<SocketAddr>().ok())
            })
            .await;
        match addr {
            Ok(a) => Ok((child, a)),
            Err(e) => {
                child.stop(Duration::from_secs(2)).await;
                Err(e.into())
            }
        }
    }

    /// Starts router `id`; on fresh ports unless `fixed` gives its old HTTP address (a
    /// restart), in which case gossip keeps its old address too and a failed start is
    /// not retried elsewhere.
    async fn spawn_router(
        &mut self,
        id: &str,
        index: usize,
        gossip: Option<SocketAddr>,
        seeds: &[SocketAddr],
        fixed: Option<SocketAddr>,
    ) -> Result<RouterProc, ChaosError> {
        let mut last = String::new();
        let mut gossip = gossip;
        // Behind the relay the gossip address is wired into it: never moved.
        let attempts = if fixed.is_some() || self.relay.is_some() {
            1
        } else {
            3
        };
        for attempt in 0..attempts {
            let http: SocketAddr = match fixed {
                Some(a) => a,
                None => ([127, 0, 0, 1], free_port()?).into(),
            };
            if attempt > 0 && gossip.is_some() {
                gossip = Some(free_udp()?);
            }
            let mut args: Vec<String> = vec![
                "serve".into(),
                "--config".into(),
                self.config_path.display().to_string(),
                "--listen".into(),
                http.to_string(),
                "--node-id".into(),
                id.into(),
                "--policy".into(),
                self.spec.policy.clone(),
                "--seed".into(),
                self.spec.seed.wrapping_add(1000).to_string(),
            ];
            for r in &self.replicas {
                args.push("--replica".into());
                // The hardware class, as an operator would declare it: replicas of one
                // profile share a latency model, each keeping its own correction.
                args.push(format!("{},name={},class={}", r.url, r.name, r.profile));
            }
            if let (Some(g), Some(certs)) = (gossip, &self.certs) {
                args.extend([
                    "--gossip-listen".into(),
                    g.to_string(),
                    "--gossip-tls-dir".into(),
                    certs.display().to_string(),
                ]);
                for s in seeds {
                    args.push("--peer".into());
                    args.push(s.to_string());
                }
                if let Some(front) = self.relay.as_ref().and_then(|r| r.front(index)) {
                    args.push("--gossip-advertise".into());
                    args.push(front.to_string());
                }
            }
            let label = format!("router {id}");
            let log = self.dir.join(format!("{id}.log"));
            let offset = self
                .spec
                .clock_offsets_ms
                .get(index)
                .copied()
                .unwrap_or(0)
                .to_string();
            let mut child = ChildProc::spawn(
                &label,
                &self.bins.headroom,
                &args,
                Some(&log),
                &[
                    ("HEADROOM_LOG", "warn"),
                    (headroom_gossip::clock::OFFSET_ENV, &offset),
                ],
            )?;
            self.started.push(StartedPid::new(&label, child.pid()));
            child.drain_stdout();
            match wait_ready(http, "/ready", STARTUP, Some(&mut child)).await {
                Ok(()) => {
                    return Ok(RouterProc {
                        id: id.into(),
                        http,
                        gossip,
                        proc: Some(child),
                        paused: false,
                    });
                }
                Err(e) => {
                    child.stop(Duration::from_secs(2)).await;
                    last = e.to_string();
                }
            }
        }
        Err(ChaosError::Setup(format!("router {id}: {last}")))
    }

    /// Waits until every node sees every replica routable and every mesh member live.
    async fn wait_converged(&self) -> Result<(), ChaosError> {
        let deadline = Instant::now() + STARTUP;
        let want_members = self.routers.len();
        loop {
            let mut ok = true;
            for r in &self.routers {
                ok &= self.routable_count(r).await == Some(self.replicas.len());
                if want_members > 1 {
                    ok &= self.live_members(r).await.map(|m| m.len()) == Some(want_members);
                }
            }
            if ok {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(ChaosError::Setup(format!(
                    "cluster did not converge within {STARTUP:?} (routers see replicas and \
                     each other); logs in {}",
                    self.dir.display()
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn routable_count(&self, r: &RouterProc) -> Option<usize> {
        let v = get_json(
            &self.client,
            &format!("{}/debug/replicas", r.url()),
            Duration::from_secs(1),
        )
        .await
        .ok()?;
        Some(
            v["replicas"]
                .as_array()?
                .iter()
                .filter(|x| x["routable"] == true)
                .count(),
        )
    }

    /// Node ids `r` reports as live members of its region (sorted).
    pub async fn live_members(&self, r: &RouterProc) -> Option<Vec<String>> {
        let v = get_json(
            &self.client,
            &format!("{}/debug/cluster", r.url()),
            Duration::from_secs(1),
        )
        .await
        .ok()?;
        let mut out: Vec<String> = v["members"]
            .as_array()?
            .iter()
            .filter(|m| m["live"] == true && m["scope"] == "region")
            .filter_map(|m| m["node_id"].as_str().map(str::to_string))
            .collect();
        out.sort();
        Some(out)
    }

    /// Router base URLs in node order.
    pub fn router_urls(&self) -> Vec<String> {
        self.routers.iter().map(RouterProc::url).collect()
    }

    pub fn replica_pid(&self, i: usize) -> Option<u32> {
        self.replicas.get(i)?.proc.as_ref().map(ChildProc::pid)
    }

    pub fn router_pid(&self, i: usize) -> Option<u32> {
        self.routers.get(i)?.proc.as_ref().map(ChildProc::pid)
    }

    /// SIGKILLs replica `i` and reaps it.
    pub async fn kill_replica(&mut self, i: usize) -> Result<(), String> {
        let r = self.replicas.get_mut(i).ok_or("no such replica")?;
        let mut p = r.proc.take().ok_or("replica not running")?;
        signal(p.pid(), Signal::Kill)?;
        p.stop(Duration::from_secs(2)).await;
        Ok(())
    }

    /// Starts replica `i` again on its old address (the routers keep its URL).
    pub async fn restart_replica(&mut self, i: usize) -> Result<(), String> {
        let (addr, profile) = {
            let r = self.replicas.get(i).ok_or("no such replica")?;
            if r.proc.is_some() {
                return Err("replica still running".into());
            }
            (r.addr, r.profile.clone())
        };
        let (proc, bound) = self
            .spawn_replica(i, &profile, &addr.to_string())
            .await
            .map_err(|e| format!("restart on {addr}: {e}"))?;
        if let Some(r) = self.replicas.get_mut(i) {
            r.proc = Some(proc);
            r.addr = bound;
        }
        Ok(())
    }

    /// SIGKILLs router node `i` and reaps it.
    pub async fn kill_router(&mut self, i: usize) -> Result<(), String> {
        let r = self.routers.get_mut(i).ok_or("no such router")?;
        let mut p = r.proc.take().ok_or("router not running")?;
        signal(p.pid(), Signal::Kill)?;
        p.stop(Duration::from_secs(2)).await;
        Ok(())
    }

    /// SIGTERMs router node `i` — it stops accepting, finishes what it holds and exits
    /// — waits up to `grace`, SIGKILLs it past that, and reaps it. Returns how long it
    /// took and whether it exited on its own with status 0.
    pub async fn drain_router(&mut self, i: usize, grace: Duration) -> Result<(f64, bool), String> {
        let r = self.routers.get_mut(i).ok_or("no such router")?;
        let mut p = r.proc.take().ok_or("router not running")?;
        let t = Instant::now();
        p.stop(grace).await;
        let took = t.elapsed();
        let clean = took < grace && p.exited().is_some_and(|s| s.success());
        Ok((took.as_secs_f64(), clean))
    }

    /// Starts killed router node `i` again with its old id and addresses.
    pub async fn restart_router(&mut self, i: usize) -> Result<(), String> {
        let (id, http, gossip) = {
            let r = self.routers.get(i).ok_or("no such router")?;
            if r.proc.is_some() {
                return Err("router still running".into());
            }
            (r.id.clone(), r.http, r.gossip)
        };
        let seeds: Vec<SocketAddr> = self
            .routers
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .filter_map(|(j, r)| self.reach(j, r.gossip))
            .collect();
        let node = self
            .spawn_router(&id, i, gossip, &seeds, Some(http))
            .await
            .map_err(|e| format!("restart on {http}: {e}"))?;
        self.routers[i] = node;
        Ok(())
    }

    /// SIGSTOP (`pause = true`) or SIGCONT router node `i`.
    pub fn pause_router(&mut self, i: usize, pause: bool) -> Result<(), String> {
        let r = self.routers.get_mut(i).ok_or("no such router")?;
        let pid = r.proc.as_ref().ok_or("router not running")?.pid();
        signal(pid, if pause { Signal::Stop } else { Signal::Cont })?;
        r.paused = pause;
        Ok(())
    }

    /// Processes that exited on their own (not killed by the scenario): crashes.
    pub fn crashed(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        for r in &mut self.routers {
            if let Some(p) = r.proc.as_mut()
                && let Some(st) = p.exited()
            {
                out.push(format!("router {} exited ({st})", r.id));
            }
        }
        for r in &mut self.replicas {
            if let Some(p) = r.proc.as_mut()
                && let Some(st) = p.exited()
            {
                out.push(format!("replica {} exited ({st})", r.name));
            }
        }
        out
    }

    /// Resumes paused nodes and stops everything (routers, bad upstream, replicas).
    pub async fn teardown(&mut self) {
        for r in &mut self.routers {
            if r.paused
                && let Some(p) = &r.proc
            {
                let _ = signal(p.pid(), Signal::Cont);
                r.paused = false;
            }
        }
        for r in self.routers.iter_mut().rev() {
            if let Some(mut p) = r.proc.take() {
                p.stop(Duration::from_secs(3)).await;
            }
        }
        if let Some(mut b) = self.bad.take() {
            b.stop().await;
        }
        if let Some(r) = &self.relay {
            r.stop().await;
        }
        for r in self.replicas.iter_mut().rev() {
            if let Some(mut p) = r.proc.take() {
                p.stop(Duration::from_secs(3)).await;
            }
        }
    }

    /// Pids this scenario started that still run.
    pub fn leftovers(&self) -> Vec<StartedPid> {
        self.started
            .iter()
            .filter(|s| os::still_running(s.pid, s.ticks))
            .cloned()
            .collect()
    }
}
