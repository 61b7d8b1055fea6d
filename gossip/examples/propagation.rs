//! Measures the mesh on loopback over the real QUIC + mTLS transport, all nodes in one
//! process: membership convergence, time for one published value to reach every node
//! (p50/p99 over many updates), the same for the datagram fast path, and bytes per node
//! per second.
//!
//! ```text
//! cargo run --release -p headroom-gossip --example propagation -- --nodes 4,16,64 \
//!     [--updates 30] [--interval-ms 100] [--replicas 256 --scrape-ms 1000] [--raw]
//! ```
//!
//! `--replicas R` adds the router's scraped state: from convergence on, every replica's
//! scrape is published every `--scrape-ms` by one node (its first owner, as
//! `mesh.scrape_publish_ms` has the router do), with values that change each time.
//! `--raw` sends gossip frames uncompressed (`MeshConfig::compress_frames` off).
//!
//! The mesh carries opaque values; the payloads here are rkyv archives of stand-ins with
//! the router's layouts (`router/src/mesh/schema.rs`), so sizes and compression match.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use hdrhistogram::Histogram;
use headroom_gossip::{Mesh, MeshConfig, MeshEvent, MeshStats, TlsIdentity, Value};
use rkyv::{Archive, Serialize};
use tokio::sync::mpsc;

struct Args {
    nodes: Vec<usize>,
    updates: usize,
    interval: Duration,
    replicas: usize,
    scrape_every: Duration,
    raw: bool,
}

fn parse_args() -> Result<Args> {
    let mut a = Args {
        nodes: vec![4, 16, 64],
        updates: 30,
        interval: MeshConfig::DEFAULT_GOSSIP_INTERVAL,
        replicas: 0,
        scrape_every: Duration::from_secs(1),
        raw: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--raw" {
            a.raw = true;
            continue;
        }
        let val = it.next().with_context(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--nodes" => {
                a.nodes = val
                    .split(',')
                    .map(|s| {
                        s.trim()
                            .parse::<usize>()
                            .context("--nodes takes e.g. 4,16,64")
                    })
                    .collect::<Result<_>>()?
            }
            "--updates" => a.updates = val.parse().context("--updates takes a count")?,
            "--interval-ms" => {
                a.interval = Duration::from_millis(val.parse().context("--interval-ms takes ms")?)
            }
            "--replicas" => a.replicas = val.parse().context("--replicas takes a count")?,
            "--scrape-ms" => {
                a.scrape_every = Duration::from_millis(
                    val.parse::<u64>().context("--scrape-ms takes ms")?.max(10),
                )
            }
            _ => bail!(
                "unknown flag {flag}; flags: --nodes 4,16,64 --updates N --interval-ms MS --replicas R --scrape-ms MS --raw"
            ),
        }
    }
    if a.nodes.iter().any(|n| *n < 2) {
        bail!("every --nodes entry must be at least 2");
    }
    Ok(a)
}

/// What one node's event reader saw: (node index, datagram?, seq, when).
type Arrival = (usize, bool, u64, Instant);

/// The router's `ReplicaLoad` layout.
#[derive(Archive, Serialize, rkyv::Deserialize)]
struct Load {
    replica: u64,
    requests: u32,
    queued_prefill_tokens: u32,
    decoding_requests: u32,
    decode_context_tokens: u32,
    prefill_inflow_tps: f32,
    queued_requests: u32,
    queued_attention_pairs: f32,
    decode_remaining_tokens: u32,
    min_tpot_slo_ms: f32,
}

/// The router's `InflightVector` layout.
#[derive(Archive, Serialize, rkyv::Deserialize)]
struct Vector {
    seq: u64,
    at_ms: u64,
    loads: Vec<Load>,
}

/// The router's `ReplicaScrape` layout.
#[derive(Archive, Serialize)]
struct Scrape {
    replica: u64,
    url: String,
    engine: u8,
    running: u32,
    waiting: u32,
    kv_usage: Option<f32>,
    num_gpu_blocks: Option<u32>,
    block_size: Option<u32>,
    prefix_hits: u64,
    prefix_queries: u64,
    preemptions: u64,
    scraped_at_ms: u64,
    healthy: bool,
}

fn archive<T>(v: &T) -> Vec<u8>
where
    T: for<'a> rkyv::Serialize<
            rkyv::api::high::HighSerializer<
                rkyv::util::AlignedVec,
                rkyv::ser::allocator::ArenaHandle<'a>,
                rkyv::rancor::Error,
            >,
        >,
{
    rkyv::to_bytes::<rkyv::rancor::Error>(v)
        .expect("archive")
        .to_vec()
}

fn vector(seq: u64, replicas: usize) -> Value {
    Value::new(
        2,
        0,
        archive(&Vector {
            seq,
            at_ms: seq,
            loads: (0..replicas as u64)
                .map(|r| Load {
                    replica: r,
                    requests: (seq % 7) as u32,
                    queued_prefill_tokens: 2048,
                    decoding_requests: 3,
                    decode_context_tokens: 9000,
                    prefill_inflow_tps: 1200.0,
                    queued_requests: 0,
                    queued_attention_pairs: 0.0,
                    decode_remaining_tokens: 0,
                    min_tpot_slo_ms: 0.0,
                })
                .collect(),
        }),
    )
}

/// The `seq` of a [`vector`] value.
fn vector_seq(v: &Value) -> Option<u64> {
    if v.kind != 2 {
        return None;
    }
    let mut a: rkyv::util::AlignedVec<16> = rkyv::util::AlignedVec::new();
    a.extend_from_slice(&v.payload);
    rkyv::from_bytes::<Vector, rkyv::rancor::Error>(&a)
        .ok()
        .map(|v| v.seq)
}

/// Process CPU time (user + system) from /proc/self/stat, in seconds (100 ticks/s).
fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return f64::NAN;
    };
    // Fields after the parenthesised command name; utime and stime are the 12th and 13th.
    let rest = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let tick = |i: usize| {
        f.get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(f64::NAN)
    };
    (tick(11) + tick(12)) / 100.0
}

fn total(stats: &[MeshStats]) -> (u64, u64) {
    stats.iter().fold((0, 0), |(u, g), s| {
        (
            u + s.udp_bytes_sent,
            g + s.bytes_sent + s.datagram_bytes_sent,
        )
    })
}

struct Row {
    n: usize,
    converge: Duration,
    gossip: Histogram<u64>,
    gossip_node: Histogram<u64>,
    dgram: Histogram<u64>,
    missed: usize,
    idle_udp: f64,
    idle_frames: f64,
    idle_cpu: f64,
    busy_udp: f64,
    dgram_lost: u64,
    dgram_sent: u64,
}

/// One replica's scrape as the router shares it, varied by `tick`.
fn scrape(replica: u64, tick: u64) -> Value {
    Value::new(
        3,
        1,
        archive(&Scrape {
            replica,
            url: format!("http://10.0.{}.{}:8000", replica / 250, replica % 250),
            running: ((replica + tick * 7) % 40) as u32,
            waiting: ((replica * 3 + tick) % 5) as u32,
            kv_usage: Some(((replica + tick * 13) % 100) as f32 / 100.0),
            engine: 0,
            num_gpu_blocks: Some(27_000),
            block_size: Some(16),
            prefix_hits: tick * 4_000 + replica,
            prefix_queries: tick * 9_000 + replica,
            preemptions: tick / 50,
            scraped_at_ms: 1_764_900_000_000 + tick * 1_000,
            healthy: true,
        }),
    )
}

/// Publishes every replica's scrape from its owner node every `every`, until stopped.
fn spawn_scrapes(
    nodes: std::sync::Arc<Vec<Mesh>>,
    replicas: usize,
    every: Duration,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let n = nodes.len();
        let mut tick = 0u64;
        let mut clock = tokio::time::interval(every);
        loop {
            clock.tick().await;
            tick += 1;
            for k in 0..replicas {
                let key = format!("scrape/{k:016x}");
                let _ = nodes[k % n].publish(&key, &scrape(k as u64, tick)).await;
            }
        }
    })
}

async fn run(
    n: usize,
    updates: usize,
    interval: Duration,
    replicas: usize,
    scrape_every: Duration,
    raw: bool,
) -> Result<Row> {
    let dir = tempfile::tempdir()?;
    let ids: Vec<String> = (0..n).map(|i| format!("n{i}")).collect();
    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    headroom_gossip::write_dev_certs(dir.path(), &refs)?;
    let mut nodes: Vec<Mesh> = Vec::with_capacity(n);
    let mut seeds: Vec<SocketAddr> = Vec::new();
    let t0 = Instant::now();
    for id in &ids {
        let mut cfg = MeshConfig::new(
            id.clone(),
            "bench",
            "127.0.0.1:0".parse()?,
            TlsIdentity::load(dir.path(), id)?,
        )
        .with_gossip_interval(interval);
        cfg.seeds = seeds.iter().map(|s| s.to_string()).collect();
        cfg.cross_region.enabled = false;
        cfg.compress_frames = !raw;
        let m = Mesh::start(cfg).await?;
        if seeds.len() < 2 {
            seeds.push(m.addr());
        }
        nodes.push(m);
    }
    // Every node carries some realistic state: its info and a 16-replica in-flight vector.
    for (i, m) in nodes.iter().enumerate() {
        m.publish(
            "info",
            &Value::new(1, 0, format!("bench 127.0.0.1:{} 0 bench", 8000 + i)),
        )
        .await?;
        m.publish("inflight", &vector(0, 16)).await?;
    }
    loop {
        let mut done = true;
        for m in &nodes {
            done &= m
                .members()
                .await
                .iter()
                .filter(|x| x.live && !x.is_self)
                .count()
                == n - 1;
        }
        if done {
            break;
        }
        if t0.elapsed() > Duration::from_secs(120) {
            let mut counts = Vec::new();
            for m in &nodes {
                counts.push(
                    m.members()
                        .await
                        .iter()
                        .filter(|x| x.live && !x.is_self)
                        .count(),
                );
            }
            let s = nodes[n / 2].stats();
            bail!(
                "{n} nodes did not converge in 120 s; live peers per node {counts:?}; a node's stats {s:?}"
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let converge = t0.elapsed();
    let nodes = std::sync::Arc::new(nodes);
    let scrapes = (replicas > 0).then(|| spawn_scrapes(nodes.clone(), replicas, scrape_every));

    // Idle bandwidth: state present, no updates.
    tokio::time::sleep(interval * 10).await;
    let s0: Vec<MeshStats> = nodes.iter().map(Mesh::stats).collect();
    let c0 = cpu_seconds();
    let idle_window = Duration::from_secs(3);
    tokio::time::sleep(idle_window).await;
    let s1: Vec<MeshStats> = nodes.iter().map(Mesh::stats).collect();
    let idle_cpu = (cpu_seconds() - c0) / idle_window.as_secs_f64() / n as f64;
    let per_node = |a: (u64, u64), b: (u64, u64), w: Duration| {
        let f = |x: u64, y: u64| (y - x) as f64 / n as f64 / w.as_secs_f64();
        (f(a.0, b.0), f(a.1, b.1))
    };
    let (idle_udp, idle_frames) = per_node(total(&s0), total(&s1), idle_window);

    let (tx, mut rx) = mpsc::channel::<Arrival>(1 << 16);
    let mut readers = Vec::new();
    for (i, m) in nodes.iter().enumerate() {
        let mut events = m.subscribe();
        let tx = tx.clone();
        readers.push(tokio::spawn(async move {
            while let Some(ev) = events.recv().await {
                let hit = match ev {
                    MeshEvent::Value { key, value, .. } if key == "probe" => {
                        vector_seq(&value).map(|s| (false, s))
                    }
                    MeshEvent::Datagram { value, .. } => vector_seq(&value).map(|s| (true, s)),
                    _ => None,
                };
                if let Some((dg, seq)) = hit
                    && tx.send((i, dg, seq, Instant::now())).await.is_err()
                {
                    break;
                }
            }
        }));
    }
    drop(tx);

    let mut gossip = Histogram::<u64>::new(3)?;
    let mut gossip_node = Histogram::<u64>::new(3)?;
    let mut dgram = Histogram::<u64>::new(3)?;
    let mut missed = 0;
    let b0: Vec<MeshStats> = nodes.iter().map(Mesh::stats).collect();
    let busy_start = Instant::now();
    let mut dgram_lost = 0u64;
    for u in 0..updates {
        let seq = 1 + u as u64;
        let src = u % n;
        // 16 replicas × 32 B fits one datagram; the gossip copy goes through chitchat.
        let v = vector(seq, 16);
        let sent = Instant::now();
        nodes[src].publish("probe", &v).await?;
        nodes[src].broadcast_datagram(&v)?;
        let mut seen_g: HashMap<usize, Instant> = HashMap::new();
        let mut seen_d: HashMap<usize, Instant> = HashMap::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while seen_g.len() < n - 1 {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some((i, dg, s, at))) if s == seq && i != src => {
                    if dg {
                        seen_d.entry(i).or_insert(at)
                    } else {
                        seen_g.entry(i).or_insert(at)
                    };
                }
                Ok(Some(_)) => {}
                _ => break,
            }
        }
        if seen_g.len() < n - 1 {
            missed += 1;
        } else {
            let last = seen_g.values().max().copied().unwrap_or(sent);
            gossip.record(last.duration_since(sent).as_micros() as u64)?;
            for at in seen_g.values() {
                gossip_node.record(at.duration_since(sent).as_micros() as u64)?;
            }
        }
        // Datagrams arrive long before gossip does; whatever is missing by now was lost.
        while let Ok((i, dg, s, at)) = rx.try_recv() {
            if dg && s == seq && i != src {
                seen_d.entry(i).or_insert(at);
            }
        }
        dgram_lost += (n - 1 - seen_d.len()) as u64;
        if std::env::var_os("PROPAGATION_DIAG").is_some() {
            let live = nodes[src]
                .members()
                .await
                .iter()
                .filter(|m| m.live && !m.is_self)
                .count();
            let st: Vec<MeshStats> = nodes.iter().map(Mesh::stats).collect();
            let sum = |f: fn(&MeshStats) -> u64| st.iter().map(f).sum::<u64>();
            eprintln!(
                "update {u}: gossip reached {}/{} datagram {}/{} publisher live {live} | dropped msgs {} connect fails {} rejected frames {} dropped events {} msgs sent {}",
                seen_g.len(),
                n - 1,
                seen_d.len(),
                n - 1,
                sum(|s| s.dropped_messages),
                sum(|s| s.connect_failures),
                sum(|s| s.rejected_frames),
                sum(|s| s.dropped_events),
                sum(|s| s.messages_sent),
            );
        }
        if seen_d.len() == n - 1 {
            let last = seen_d.values().max().copied().unwrap_or(sent);
            dgram.record(last.duration_since(sent).as_micros() as u64)?;
        }
        // Space updates out so each is measured on its own, at a random phase of the
        // publisher's gossip tick.
        let jitter = interval.mul_f64(rand::random::<f64>());
        tokio::time::sleep(interval * 2 + jitter).await;
    }
    let busy = busy_start.elapsed();
    let b1: Vec<MeshStats> = nodes.iter().map(Mesh::stats).collect();
    let (busy_udp, _) = per_node(total(&b0), total(&b1), busy);

    if let Some(t) = scrapes {
        t.abort();
        let _ = t.await;
    }
    let nodes = std::sync::Arc::try_unwrap(nodes)
        .map_err(|_| anyhow::anyhow!("a node handle outlived the run"))?;
    for m in nodes {
        m.shutdown().await;
    }
    for r in readers {
        r.abort();
        let _ = r.await;
    }
    Ok(Row {
        n,
        converge,
        gossip,
        gossip_node,
        dgram,
        missed,
        idle_udp,
        idle_frames,
        idle_cpu,
        busy_udp,
        dgram_lost,
        dgram_sent: (updates * (n - 1)) as u64,
    })
}

fn ms(h: &Histogram<u64>, q: f64) -> String {
    if h.is_empty() {
        "-".into()
    } else {
        format!("{:.1}", h.value_at_quantile(q) as f64 / 1000.0)
    }
}

fn main() -> Result<()> {
    let args = parse_args()?;
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    println!(
        "gossip interval {} ms, {} updates per size, {} replicas' scrapes every {} ms, frames {}, all nodes in one process (2 worker threads), loopback QUIC + mTLS\n",
        args.interval.as_millis(),
        args.updates,
        args.replicas,
        args.scrape_every.as_millis(),
        if args.raw { "raw" } else { "zstd" }
    );
    println!(
        "| nodes | converge (s) | gossip to all p50 / p99 (ms) | gossip per node p50 / p99 (ms) | missed | datagram to all p50 / p99 (ms) | datagrams lost | idle UDP B/s/node | idle gossip B/s/node | busy UDP B/s/node | idle CPU ms/s/node |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for n in &args.nodes {
        let r = rt.block_on(run(
            *n,
            args.updates,
            args.interval,
            args.replicas,
            args.scrape_every,
            args.raw,
        ))?;
        println!(
            "| {} | {:.2} | {} / {} | {} / {} | {} | {} / {} | {}/{} | {:.0} | {:.0} | {:.0} | {:.1} |",
            r.n,
            r.converge.as_secs_f64(),
            ms(&r.gossip, 0.5),
            ms(&r.gossip, 0.99),
            ms(&r.gossip_node, 0.5),
            ms(&r.gossip_node, 0.99),
            r.missed,
            ms(&r.dgram, 0.5),
            ms(&r.dgram, 0.99),
            r.dgram_lost,
            r.dgram_sent,
            r.idle_udp,
            r.idle_frames,
            r.busy_udp,
            r.idle_cpu * 1000.0,
        );
    }
    Ok(())
}
