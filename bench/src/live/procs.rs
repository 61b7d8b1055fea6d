//! Child processes of a live run: started on loopback, watched, stopped.
//!
//! Invariants: every child is spawned with `kill_on_drop`, so any exit path (error,
//! panic, cancellation) kills it; [`ChildProc::stop`] asks politely first (SIGTERM,
//! then SIGKILL after a grace period) and reaps it. Children's stdout is drained by a
//! task that ends at EOF (when the child exits), so a chatty child never blocks on a
//! full pipe; stderr goes to a log file or nowhere.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use http::Uri;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::task::JoinHandle;

use super::LiveError;
use super::usage::{ProcUsage, usage_of};

/// A running child process.
#[derive(Debug)]
pub struct ChildProc {
    pub label: String,
    child: Child,
    pid: u32,
    drain: Option<JoinHandle<()>>,
}

impl ChildProc {
    /// Starts `bin args…`; stderr to `log` (or discarded); stdout piped for
    /// [`ChildProc::wait_for_line`].
    pub fn spawn(
        label: &str,
        bin: &Path,
        args: &[String],
        log: Option<&Path>,
        envs: &[(&str, &str)],
    ) -> Result<ChildProc, LiveError> {
        let stderr = match log {
            Some(p) => std::fs::File::create(p)
                .map(Stdio::from)
                .map_err(|e| LiveError::io(format!("log file {}", p.display()), e))?,
            None => Stdio::null(),
        };
        let mut cmd = Command::new(bin);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .kill_on_drop(true);
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let child = cmd.spawn().map_err(|e| LiveError::Spawn {
            what: label.to_string(),
            path: bin.to_path_buf(),
            source: e,
        })?;
        let pid = child.id().ok_or_else(|| LiveError::Startup {
            what: label.to_string(),
            why: "exited at once".into(),
        })?;
        Ok(ChildProc {
            label: label.to_string(),
            child,
            pid,
            drain: None,
        })
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Reads stdout until a line for which `pick` returns a value (or `timeout`,
    /// EOF); the rest of stdout is drained in the background.
    pub async fn wait_for_line<T>(
        &mut self,
        timeout: Duration,
        mut pick: impl FnMut(&str) -> Option<T>,
    ) -> Result<T, LiveError> {
        let fail = |why: String| LiveError::Startup {
            what: self.label.clone(),
            why,
        };
        let Some(out) = self.child.stdout.take() else {
            return Err(fail("stdout already taken".into()));
        };
        let mut lines = BufReader::new(out).lines();
        let found = tokio::time::timeout(timeout, async {
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(v) = pick(&line) {
                    return Some(v);
                }
            }
            None
        })
        .await;
        self.drain = Some(tokio::spawn(async move {
            while let Ok(Some(_)) = lines.next_line().await {}
        }));
        match found {
            Ok(Some(v)) => Ok(v),
            Ok(None) => Err(fail("exited before announcing its address".into())),
            Err(_) => Err(fail(format!("no address line within {timeout:?}"))),
        }
    }

    /// Drains stdout in the background (for children whose stdout is not read).
    pub fn drain_stdout(&mut self) {
        if let Some(out) = self.child.stdout.take() {
            let mut lines = BufReader::new(out).lines();
            self.drain = Some(tokio::spawn(async move {
                while let Ok(Some(_)) = lines.next_line().await {}
            }));
        }
    }

    /// Exit status if the child has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// CPU and peak RSS so far.
    pub fn usage(&self) -> Option<ProcUsage> {
        usage_of(self.pid)
    }

    /// SIGTERM, wait up to `grace`, then SIGKILL; reaps the child.
    pub async fn stop(&mut self, grace: Duration) {
        if self.exited().is_none() {
            // The `kill` utility keeps this crate free of libc.
            let _ = std::process::Command::new("kill")
                .arg("-TERM")
                .arg(self.pid.to_string())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
            if tokio::time::timeout(grace, self.child.wait())
                .await
                .is_err()
            {
                tracing::warn!("{} did not stop within {grace:?}; killing it", self.label);
                let _ = self.child.kill().await;
            }
        }
        let _ = self.child.wait().await;
        if let Some(d) = self.drain.take() {
            let _ = tokio::time::timeout(Duration::from_secs(1), d).await;
        }
    }
}

/// Stops every child (in reverse start order: routers before replicas).
pub async fn stop_all(children: &mut [ChildProc], grace: Duration) {
    for c in children.iter_mut().rev() {
        c.stop(grace).await;
    }
}

/// A free loopback TCP port (bound and released; a small race with other binders is
/// possible, so callers retry on a failed start).
pub fn free_port() -> Result<u16, LiveError> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| LiveError::io("reserving a loopback port", e))
}

/// Starts a server that takes its listen address on the command line: reserves a
/// port, runs `bin` with `args(addr)`, waits for `GET {ready_path}` to answer 200,
/// and retries on a new port (twice) if the child dies or never gets ready. On
/// failure every attempt's child has been stopped.
pub async fn start_on_free_port(
    label: &str,
    bin: &Path,
    args: impl Fn(SocketAddr) -> Vec<String>,
    log: Option<&Path>,
    ready_path: &str,
    timeout: Duration,
) -> Result<(ChildProc, SocketAddr), LiveError> {
    let mut last = None;
    for _ in 0..3 {
        let addr: SocketAddr = ([127, 0, 0, 1], free_port()?).into();
        let mut child = ChildProc::spawn(label, bin, &args(addr), log, &[])?;
        child.drain_stdout();
        match wait_ready(addr, ready_path, timeout, Some(&mut child)).await {
            Ok(()) => return Ok((child, addr)),
            Err(e) => {
                child.stop(Duration::from_secs(2)).await;
                last = Some(e);
            }
        }
    }
    Err(last.unwrap_or_else(|| LiveError::Startup {
        what: label.to_string(),
        why: "no attempt made".into(),
    }))
}

/// Polls `GET http://addr{path}` until 200 or `timeout`; fails early if `child` exits.
pub async fn wait_ready(
    addr: SocketAddr,
    path: &str,
    timeout: Duration,
    mut child: Option<&mut ChildProc>,
) -> Result<(), LiveError> {
    let client: Client<HttpConnector, Empty<bytes::Bytes>> =
        Client::builder(TokioExecutor::new()).build(HttpConnector::new());
    let uri: Uri = format!("http://{addr}{path}")
        .parse()
        .map_err(|_| LiveError::Options(format!("bad address {addr}")))?;
    let deadline = tokio::time::Instant::now() + timeout;
    let label = child
        .as_ref()
        .map_or_else(|| addr.to_string(), |c| c.label.clone());
    loop {
        let probe = tokio::time::timeout(Duration::from_millis(500), client.get(uri.clone()));
        if let Ok(Ok(resp)) = probe.await {
            let ok = resp.status().is_success();
            let _ = resp.into_body().collect().await;
            if ok {
                return Ok(());
            }
        }
        if let Some(c) = child.as_deref_mut()
            && let Some(status) = c.exited()
        {
            return Err(LiveError::Startup {
                what: label,
                why: format!("exited ({status})"),
            });
        }
        if tokio::time::Instant::now() > deadline {
            return Err(LiveError::Startup {
                what: label,
                why: format!("{path} not ready within {timeout:?}"),
            });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Finds binary `name`: in `dir` if given, else next to (or one level above) the
/// running executable, as cargo lays out `target/<profile>/`.
pub fn find_binary(name: &str, dir: Option<&Path>) -> Result<PathBuf, LiveError> {
    let mut places: Vec<PathBuf> = Vec::new();
    if let Some(d) = dir {
        places.push(d.join(name));
    } else if let Some(me) = std::env::current_exe().ok()
        && let Some(d) = me.parent()
    {
        places.push(d.join(name));
        places.push(d.join("..").join(name));
    }
    places.into_iter().find(|p| p.is_file()).ok_or_else(|| {
        LiveError::MissingBinary(format!(
            "`{name}` not found{}; build it with `cargo build --release -p headroom -p headroom-replica -p headroom-bench`",
            dir.map(|d| format!(" in {}", d.display())).unwrap_or_default()
        ))
    })
}
