//! `headroom up`: a whole local deployment on loopback — emulated replicas and
//! router nodes as child processes, as a real deployment would run them.
//!
//! Children are started with `kill_on_drop`, so every exit path (Ctrl-C, a child
//! failing to start, an error) stops them all.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use anyhow::{Context, bail};
use tokio::process::{Child, Command};

/// One emulated replica of the local fleet.
#[derive(Clone, Debug)]
pub struct LocalReplica {
    pub profile: String,
    pub max_batched_tokens: u32,
}

/// The default fleet: two fast, one medium, one slow replica.
pub fn default_fleet() -> Vec<LocalReplica> {
    let r = |p: &str, b| LocalReplica {
        profile: p.into(),
        max_batched_tokens: b,
    };
    vec![
        r("h100-llama3-8b", 8192),
        r("h100-llama3-8b", 8192),
        r("a100-llama3-8b", 2048),
        r("l4-llama3-8b", 2048),
    ]
}

#[derive(Clone, Debug)]
pub struct UpOptions {
    pub model: String,
    pub fleet: Vec<LocalReplica>,
    pub router_port: u16,
    pub replica_base_port: u16,
    pub time_scale: f64,
    pub policy: String,
    /// Router nodes (ports `router_port`, `router_port + 1`, …); more than one forms a
    /// mesh with development certificates.
    pub nodes: u16,
    /// First gossip (UDP) port for the mesh.
    pub gossip_base_port: u16,
    /// Extra arguments for every `headroom serve`.
    pub serve_args: Vec<String>,
}

/// Finds a sibling binary of the running executable.
pub fn sibling_binary(name: &str) -> anyhow::Result<PathBuf> {
    let me = std::env::current_exe().context("cannot locate the headroom binary")?;
    let dir = me.parent().context("headroom binary has no directory")?;
    let candidates = [dir.join(name), dir.join("..").join(name)];
    candidates
        .into_iter()
        .find(|p| p.is_file())
        .with_context(|| {
            format!(
                "`{name}` not found next to {}; build it with `cargo build --release -p headroom-replica`",
                me.display()
            )
        })
}

/// Polls `GET http://addr/health` until it answers 200 or `timeout` passes.
pub async fn wait_healthy(addr: SocketAddr, timeout: Duration) -> anyhow::Result<()> {
    let client = crate::upstream::client(Duration::from_millis(200));
    let base: http::Uri = format!("http://{addr}").parse()?;
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let got =
            crate::upstream::get(&client, &base, "/health", Duration::from_millis(500), 1024).await;
        if got.is_ok_and(|(s, _)| s.is_success()) {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            bail!("{addr} did not become healthy within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn spawn(bin: &Path, args: &[String], label: &str) -> anyhow::Result<Child> {
    Command::new(bin)
        .args(args)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("failed to start {label} ({})", bin.display()))
}

/// Starts the deployment and runs until Ctrl-C / SIGTERM.
pub async fn run(opts: UpOptions) -> anyhow::Result<()> {
    let replica_bin = sibling_binary("headroom-replica")?;
    let me = std::env::current_exe()?;
    let mut children: Vec<(String, Child)> = Vec::new();
    let mut replica_flags = Vec::new();
    for (i, r) in opts.fleet.iter().enumerate() {
        let port = opts.replica_base_port + i as u16;
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let args = vec![
            "--listen".into(),
            addr.to_string(),
            "--model".into(),
            opts.model.clone(),
            "--profile".into(),
            r.profile.clone(),
            "--time-scale".into(),
            opts.time_scale.to_string(),
            "--seed".into(),
            (i as u64 + 1).to_string(),
        ];
        children.push((
            format!("replica {addr} ({})", r.profile),
            spawn(&replica_bin, &args, "headroom-replica")?,
        ));
        replica_flags.push(format!(
            "http://{addr},name=r{i}-{},class={},max_batched_tokens={}",
            r.profile, r.profile, r.max_batched_tokens
        ));
    }
    for (i, r) in opts.fleet.iter().enumerate() {
        let addr = ([127, 0, 0, 1], opts.replica_base_port + i as u16).into();
        wait_healthy(addr, Duration::from_secs(30))
            .await
            .with_context(|| format!("replica {} ({})", addr, r.profile))?;
    }
    let nodes = opts.nodes.max(1);
    let cert_dir = std::env::temp_dir().join(format!("headroom-up-{}", std::process::id()));
    if nodes > 1 {
        let ids: Vec<String> = (0..nodes).map(|i| format!("node-{i}")).collect();
        let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
        headroom_gossip::write_dev_certs(&cert_dir, &refs)
            .context("writing development certificates")?;
    }
    let mut routers = Vec::new();
    for i in 0..nodes {
        let addr: SocketAddr = ([127, 0, 0, 1], opts.router_port + i).into();
        let mut args: Vec<String> = vec![
            "serve".into(),
            "--listen".into(),
            addr.to_string(),
            "--policy".into(),
            opts.policy.clone(),
            "--tokenizer".into(),
            format!("{}=cl100k", opts.model),
            "--node-id".into(),
            format!("node-{i}"),
        ];
        for f in &replica_flags {
            args.push("--replica".into());
            args.push(f.clone());
        }
        if nodes > 1 {
            let gossip: SocketAddr = ([127, 0, 0, 1], opts.gossip_base_port + i).into();
            args.extend([
                "--gossip-listen".into(),
                gossip.to_string(),
                "--gossip-tls-dir".into(),
                cert_dir.display().to_string(),
            ]);
            for j in (0..nodes).filter(|&j| j != i) {
                args.extend([
                    "--peer".into(),
                    format!("127.0.0.1:{}", opts.gossip_base_port + j),
                ]);
            }
        }
        args.extend(opts.serve_args.iter().cloned());
        children.push((
            format!("router {addr}"),
            spawn(&me, &args, "headroom serve")?,
        ));
        routers.push(addr);
    }
    for a in &routers {
        wait_healthy(*a, Duration::from_secs(30)).await?;
    }
    let router_addr = routers[0];

    println!(
        "\nHeadroom is up: {} replicas of `{}` behind a router (policy {}).",
        opts.fleet.len(),
        opts.model,
        opts.policy
    );
    for a in &routers {
        println!("  OpenAI endpoint: http://{a}/v1");
    }
    if nodes > 1 {
        println!(
            "  Mesh:            http://{router_addr}/debug/cluster (certificates in {})",
            cert_dir.display()
        );
    }
    println!("  Metrics:         http://{router_addr}/metrics");
    println!("  Replicas:        http://{router_addr}/debug/replicas");
    println!(
        "\nTry:\n  curl -sN http://{router_addr}/v1/chat/completions -H 'content-type: application/json' \\\n    -H 'x-slo-ttft-ms: 500' -H 'x-slo-tpot-ms: 50' \\\n    -d '{{\"model\":\"{}\",\"stream\":true,\"max_tokens\":32,\"messages\":[{{\"role\":\"user\",\"content\":\"Hello!\"}}]}}'\n",
        opts.model
    );
    println!("Ctrl-C stops everything.");

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let exited = async {
        loop {
            for (label, c) in children.iter_mut() {
                if let Ok(Some(status)) = c.try_wait() {
                    return format!("{label} exited ({status})");
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    let why = tokio::select! {
        _ = tokio::signal::ctrl_c() => "interrupted".to_string(),
        _ = term.recv() => "terminated".to_string(),
        w = exited => w,
    };
    println!("\nStopping ({why}) …");
    stop_all(&mut children).await;
    if nodes > 1 {
        let _ = std::fs::remove_dir_all(&cert_dir);
    }
    Ok(())
}

/// SIGTERM every child, wait briefly, then kill what is left.
pub async fn stop_all(children: &mut [(String, Child)]) {
    for (_, c) in children.iter() {
        if let Some(pid) = c.id() {
            // SAFETY-free: sending a signal via the `kill` utility keeps us off libc.
            let _ = std::process::Command::new("kill")
                .arg("-TERM")
                .arg(pid.to_string())
                .status();
        }
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    for (label, c) in children.iter_mut() {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if tokio::time::timeout(left, c.wait()).await.is_err() {
            tracing::warn!("{label} did not stop; killing it");
            let _ = c.kill().await;
        }
    }
}
