//! The `headroom-chaos` command line: listing, argument errors (exit 2), and one short
//! real run (the replica error-rate scenario) that writes both reports and exits 0.

use std::process::Command;

fn chaos() -> Command {
    Command::new(env!("CARGO_BIN_EXE_headroom-chaos"))
}

#[test]
fn list_names_every_scenario() {
    let out = chaos().arg("list").output().expect("run list");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for s in headroom_chaos::Scenario::ALL {
        assert!(
            text.contains(s.name()),
            "{} missing from:\n{text}",
            s.name()
        );
    }
}

#[test]
fn bad_arguments_exit_2_with_a_message() {
    for (args, says) in [
        (vec!["run", "--scenario", "no-such"], "unknown scenario"),
        (vec!["run", "--duration", "0.5"], "--duration"),
        (vec!["run", "--time-scale", "0"], "--time-scale"),
    ] {
        let out = chaos().args(&args).output().expect("run");
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

#[test]
fn a_short_run_writes_reports_and_exits_0() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = chaos()
        .args([
            "run",
            "--scenario",
            "replica-errors",
            "--duration",
            "4",
            "--seed",
            "3",
        ])
        .arg("--out")
        .arg(dir.path())
        .output()
        .expect("run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let md = std::fs::read_to_string(dir.path().join("report.md")).expect("report.md");
    assert!(md.contains("## replica-errors — PASS"), "{md}");
    let json: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("report.json")).expect("report.json"),
    )
    .expect("report.json is JSON");
    assert_eq!(json["pass"], true);
    let checks = json["scenarios"][0]["checks"].as_array().expect("checks");
    assert!(checks.len() >= 8, "{checks:?}");
    assert!(
        dir.path()
            .join("logs/replica-errors/records.jsonl")
            .is_file()
    );
}
