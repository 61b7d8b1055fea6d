//! Process-level faults and checks: signals by pid and whether a pid still runs.
//!
//! Signals go through the `kill` utility (as `headroom-bench` does), which keeps this
//! crate free of libc. A pid counts as running while `/proc/<pid>` exists and is not
//! a zombie; callers reap their children before asking.

use std::process::{Command, Stdio};

/// Signals the scenarios send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    Kill,
    Stop,
    Cont,
    Term,
}

impl Signal {
    fn name(self) -> &'static str {
        match self {
            Signal::Kill => "KILL",
            Signal::Stop => "STOP",
            Signal::Cont => "CONT",
            Signal::Term => "TERM",
        }
    }
}

/// Sends `sig` to `pid`; an error names what failed.
pub fn signal(pid: u32, sig: Signal) -> Result<(), String> {
    let status = Command::new("kill")
        .arg("-s")
        .arg(sig.name())
        .arg(pid.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_err(|e| format!("cannot run `kill`: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("kill -s {} {pid} failed ({status})", sig.name()))
    }
}

/// The process's start time (clock ticks since boot), to tell a pid from a reused one.
pub fn start_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name: state is field 3, starttime field 22.
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Whether the process started as (`pid`, `ticks`) still runs (a reused pid does not
/// count).
pub fn still_running(pid: u32, ticks: Option<u64>) -> bool {
    running(pid) && (ticks.is_none() || start_ticks(pid) == ticks)
}

/// Whether `pid` is a live (non-zombie) process.
pub fn running(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state is the first field after the parenthesised command name.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// Resident set size of `pid` now (KiB), from `/proc/<pid>/status`.
pub fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// CPU seconds (user + system) `pid` has used, from `/proc/<pid>/stat` at 100 ticks/s
/// (Linux's `USER_HZ` on every mainstream architecture).
pub fn cpu_s(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let (u, s): (u64, u64) = (f.get(11)?.parse().ok()?, f.get(12)?.parse().ok()?);
    Some((u + s) as f64 / 100.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_rss_and_cpu_are_read() {
        let me = std::process::id();
        assert!(rss_kib(me).is_some_and(|k| k > 0));
        assert!(cpu_s(me).is_some_and(|c| c >= 0.0));
    }

    #[test]
    fn own_process_runs_and_a_reaped_child_does_not() {
        let me = std::process::id();
        assert!(running(me));
        assert!(start_ticks(me).is_some());
        assert!(still_running(me, start_ticks(me)));
        assert!(!still_running(me, start_ticks(me).map(|t| t + 1)));
        let mut child = Command::new("true").spawn().expect("spawn true");
        let pid = child.id();
        child.wait().expect("reap");
        assert!(!running(pid));
    }
}
