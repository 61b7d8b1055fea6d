//! Process helpers shared by the live tests: kill-on-drop children, the emulator and
//! router binaries, free ports, readiness.
#![allow(dead_code)] // each test file uses its own subset

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

/// Kills and reaps the child on drop.
pub struct Guard(pub Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Where cargo put `headroom-bench`, and so `headroom` and `headroom-replica` too.
fn target_bin_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_headroom-bench"))
        .parent()
        .expect("binary dir")
        .to_path_buf()
}

/// The directory holding the `headroom` and `headroom-replica` binaries, both built.
pub fn bin_dir() -> PathBuf {
    built_binaries();
    target_bin_dir()
}

/// The `headroom` router binary next to ours, built once if missing or stale
/// (`cargo test --workspace` builds it anyway; `cargo test -p headroom-bench` not).
pub fn router_bin() -> PathBuf {
    built_binaries().0.clone()
}

/// The `headroom-replica` emulator binary (package `headroom-replica`), built as
/// [`router_bin`] is: another package's binary has no `CARGO_BIN_EXE_` here.
pub fn replica_bin() -> PathBuf {
    built_binaries().1.clone()
}

/// Builds `headroom` and `headroom-replica` once per test process, into this test's
/// target dir and profile, as `cargo test --workspace` builds them: a no-op within
/// that run. Not `cargo build -p …`: it resolves the dependencies' features without
/// the workspace's dev-dependencies, so it rebuilt the router. And without the
/// variables cargo sets for a running test ([`is_test_env`]): a build script that
/// watches one (ring's, `CARGO_MANIFEST_DIR`) saw it change, so this build rebuilt
/// ring and all above it (≈ 7 min of CI's 45), and the next build from a shell again.
fn built_binaries() -> &'static (PathBuf, PathBuf) {
    static BUILT: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    BUILT.get_or_init(|| {
        let dir = target_bin_dir();
        let target_dir = dir.parent().expect("target dir").to_path_buf();
        let profile = dir.file_name().and_then(|n| n.to_str()).unwrap_or("debug");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.args(["test", "-q", "--workspace", "--no-run", "--target-dir"])
            .arg(&target_dir)
            .current_dir(env!("CARGO_MANIFEST_DIR"));
        if profile == "release" {
            cmd.arg("--release");
        }
        for (name, _) in std::env::vars_os() {
            if name.to_str().is_some_and(is_test_env) {
                cmd.env_remove(name);
            }
        }
        let status = cmd
            .status()
            .expect("run cargo test --no-run for the binaries");
        assert!(
            status.success(),
            "building the headroom and headroom-replica binaries failed"
        );
        let bins = (dir.join("headroom"), dir.join("headroom-replica"));
        for bin in [&bins.0, &bins.1] {
            assert!(bin.is_file(), "{} missing after build", bin.display());
        }
        bins
    })
}

/// Whether `name` is one of the variables cargo sets for the test it runs (not for
/// cargo itself: `CARGO`, `CARGO_HOME`, `CARGO_TARGET_DIR`, … stay).
fn is_test_env(name: &str) -> bool {
    matches!(
        name,
        "CARGO_MANIFEST_DIR"
            | "CARGO_MANIFEST_PATH"
            | "CARGO_CRATE_NAME"
            | "CARGO_BIN_NAME"
            | "CARGO_PRIMARY_PACKAGE"
            | "CARGO_TARGET_TMPDIR"
            | "CARGO_RUSTC_CURRENT_DIR"
            | "OUT_DIR"
    ) || name.starts_with("CARGO_PKG_")
        || name.starts_with("CARGO_BIN_EXE_")
}

pub fn start_replica(profile: &str, extra: &[&str]) -> (Guard, SocketAddr) {
    let mut child = Command::new(replica_bin())
        .args([
            "--listen",
            "127.0.0.1:0",
            "--profile",
            profile,
            "--seed",
            "3",
        ])
        .args(extra)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn headroom-replica");
    let out = child.stdout.take().expect("stdout");
    let guard = Guard(child);
    let mut line = String::new();
    BufReader::new(out)
        .read_line(&mut line)
        .expect("read address line");
    let addr = line
        .trim()
        .strip_prefix("headroom-replica listening on http://")
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"));
    (guard, addr)
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

pub async fn wait_http_ok(url: &str) {
    let client = reqwest::Client::new();
    for _ in 0..400 {
        if let Ok(r) = client
            .get(url)
            .timeout(Duration::from_millis(500))
            .send()
            .await
            && r.status().is_success()
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{url} never answered 200");
}
