//! `/dashboard` in headless Chromium: the page loads, its script fills the fleet in
//! (replica names in the DOM), it polls on its own, it shows traffic sent after it
//! loaded (a tenant's row), and a screenshot is kept at
//! `$CARGO_TARGET_DIR/dashboard.png` (default `target/dashboard.png`).
//!
//! Skips, saying so, only when no Chromium is installed (`scripts/install-chromium.sh`
//! installs Debian's; CI runs it before the tests). `HEADROOM_CHROMIUM` names another.

// Test code may unwrap: a panic is its failure report (the workspace denies it elsewhere).
#![allow(clippy::unwrap_used)]

mod common;

use std::{path::PathBuf, process::Command, time::Duration};

use common::{client, mock, router};
use headroom::policy::PolicyName;
use serde_json::json;

fn chromium() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("HEADROOM_CHROMIUM") {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH")?;
    ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .flat_map(|name| std::env::split_paths(&path).map(move |d| d.join(name)))
        .find(|p| p.is_file())
}

/// Where test output goes: the cargo target directory.
fn out_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"))
}

/// Runs headless Chromium on `url` with `extra` flags, bounded in time; its stdout.
fn run_chromium(bin: &PathBuf, profile: &std::path::Path, url: &str, extra: &[&str]) -> String {
    let mut cmd = Command::new(bin);
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--window-size=1400,900",
    ])
    .arg(format!("--user-data-dir={}", profile.display()))
    .args(extra)
    .arg(url)
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::null());
    let child = common::Proc(cmd.spawn().expect("start chromium"));
    let out = wait_output(child, Duration::from_secs(20));
    String::from_utf8_lossy(&out).into_owned()
}

/// The child's stdout once it exits; killed (by `Proc`'s drop) past `limit`.
fn wait_output(mut child: common::Proc, limit: Duration) -> Vec<u8> {
    use std::io::Read;
    let mut stdout = child.0.stdout.take().expect("piped");
    let reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        stdout.read_to_end(&mut buf).ok();
        buf
    });
    let deadline = std::time::Instant::now() + limit;
    while std::time::Instant::now() < deadline {
        if child.0.try_wait().ok().flatten().is_some() {
            return reader.join().unwrap_or_default();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(child);
    panic!("chromium did not finish within {limit:?}");
}

/// The number in `<b id="polls" data-polls="N">`.
fn polls(dom: &str) -> u32 {
    let at = dom.find("data-polls=\"").expect("poll counter in the page") + 12;
    dom[at..].split('"').next().unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_loads_shows_the_fleet_updates_and_is_screenshotted() {
    let Some(bin) = chromium() else {
        eprintln!(
            "SKIPPED dashboard test: no chromium on PATH (run scripts/install-chromium.sh, or set HEADROOM_CHROMIUM)"
        );
        return;
    };
    let (a, b) = (mock("m").await, mock("m").await);
    let r = router(&[a.url(), b.url()], PolicyName::Slo, |_| {}).await;
    let url = r.url("/dashboard");
    let page = client().get(&url).send().await.unwrap();
    assert_eq!(page.status(), 200);
    assert!(
        page.text()
            .await
            .unwrap()
            .contains("<title>Headroom</title>")
    );
    let profile = tempfile::tempdir().unwrap();

    // Before traffic: the script ran and filled the fleet in, and no tenant yet.
    let (bin2, dir, u) = (bin.clone(), profile.path().to_owned(), url.clone());
    let dom = tokio::task::spawn_blocking(move || {
        run_chromium(
            &bin2,
            &dir,
            &u,
            &["--virtual-time-budget=3500", "--dump-dom"],
        )
    })
    .await
    .unwrap();
    for m in [&a, &b] {
        let name = m.addr.to_string();
        assert!(
            dom.contains(&format!("<td class=\"replica-name\">{name}</td>")),
            "replica {name} in the rendered page: {dom}"
        );
    }
    assert!(dom.contains("<b id=\"policy\">slo</b>"), "{dom}");
    assert!(
        polls(&dom) >= 2,
        "the page polls on its own: {}",
        polls(&dom)
    );
    assert!(
        !dom.contains("<td class=\"tenant-name\">"),
        "no tenant before any request"
    );
    assert!(
        dom.contains(">no finished requests yet<"),
        "empty charts say so"
    );

    // Traffic after the first load shows up in the next one.
    for _ in 0..6 {
        let resp = client()
            .post(r.url("/v1/chat/completions"))
            .json(&json!({"model":"m","stream":true,"max_tokens":8,"messages":[{"role":"user","content":"hi"}]}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        resp.text().await.unwrap();
    }
    let (bin2, dir, u) = (bin.clone(), profile.path().to_owned(), url.clone());
    let dom = tokio::task::spawn_blocking(move || {
        run_chromium(
            &bin2,
            &dir,
            &u,
            &["--virtual-time-budget=2500", "--dump-dom"],
        )
    })
    .await
    .unwrap();
    let tenant_row = dom
        .split("<td class=\"tenant-name\">")
        .nth(1)
        .expect("a tenant row after traffic");
    assert!(
        tenant_row.contains(">100.0%<"),
        "six requests served in time: {tenant_row}"
    );
    assert!(dom.contains("<circle"), "measured points in the charts");
    assert!(!dom.contains(">no finished requests yet<"), "{dom}");

    // The screenshot, kept with the test output.
    let shot = out_dir().join("dashboard.png");
    let _ = std::fs::remove_file(&shot);
    let (dir, s) = (profile.path().to_owned(), shot.clone());
    tokio::task::spawn_blocking(move || {
        run_chromium(
            &bin,
            &dir,
            &url,
            &[
                "--virtual-time-budget=2500",
                &format!("--screenshot={}", s.display()),
            ],
        )
    })
    .await
    .unwrap();
    let png = std::fs::read(&shot).expect("screenshot written");
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 10_000,
        "a real screenshot"
    );
    eprintln!("dashboard screenshot: {}", shot.display());
}
