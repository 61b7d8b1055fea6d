//! CPU time and peak memory of processes, read from `/proc` (Linux only).
//!
//! CPU is `utime + stime` of `/proc/PID/stat` (all threads of the process), in clock
//! ticks converted with `getconf CLK_TCK` (100 when that cannot be asked). Peak RSS is
//! `VmHWM` of `/proc/PID/status`. A process tree is a process and its direct children
//! (nginx's master and workers).

use std::sync::OnceLock;

/// Resource use of one process (or a summed tree) at one instant.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ProcUsage {
    /// User + system CPU seconds since the process started.
    pub cpu_s: f64,
    /// Peak resident set size (KiB); summed over a tree.
    pub peak_rss_kib: u64,
}

impl ProcUsage {
    /// CPU spent between `earlier` and `self`.
    pub fn cpu_since(&self, earlier: &ProcUsage) -> f64 {
        (self.cpu_s - earlier.cpu_s).max(0.0)
    }
}

fn clock_ticks() -> f64 {
    static TICKS: OnceLock<f64> = OnceLock::new();
    *TICKS.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse::<f64>().ok())
            .filter(|t| *t > 0.0)
            .unwrap_or(100.0)
    })
}

/// Fields of `/proc/PID/stat` after the `(comm)` field (field 3 is index 0).
fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &text[text.rfind(')')? + 1..];
    Some(after.split_whitespace().map(str::to_string).collect())
}

/// CPU and peak RSS of `pid`; None when the process is gone or `/proc` is absent.
pub fn usage_of(pid: u32) -> Option<ProcUsage> {
    let f = stat_fields(pid)?;
    let utime: f64 = f.get(11)?.parse().ok()?;
    let stime: f64 = f.get(12)?.parse().ok()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    Some(ProcUsage {
        cpu_s: (utime + stime) / clock_ticks(),
        peak_rss_kib: status_kib(&status, "VmHWM:").unwrap_or(0),
    })
}

/// One process's resident memory, CPU, threads and descriptors at one instant (what
/// `headroom-bench streams` samples over time).
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ProcSnapshot {
    /// User + system CPU seconds since the process started.
    pub cpu_s: f64,
    /// `VmRSS` now (KiB).
    pub rss_kib: u64,
    /// `VmHWM`: peak RSS so far (KiB).
    pub hwm_kib: u64,
    pub threads: u64,
    /// Entries of `/proc/PID/fd` (0 when not readable).
    pub fds: u64,
}

fn status_kib(status: &str, field: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// A [`ProcSnapshot`] of `pid`; None when the process is gone or `/proc` is absent.
pub fn snapshot(pid: u32) -> Option<ProcSnapshot> {
    let f = stat_fields(pid)?;
    let utime: f64 = f.get(11)?.parse().ok()?;
    let stime: f64 = f.get(12)?.parse().ok()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count() as u64);
    Some(ProcSnapshot {
        cpu_s: (utime + stime) / clock_ticks(),
        rss_kib: status_kib(&status, "VmRSS:").unwrap_or(0),
        hwm_kib: status_kib(&status, "VmHWM:").unwrap_or(0),
        threads: status_kib(&status, "Threads:").unwrap_or(0),
        fds,
    })
}

/// The soft open-files limit (`Max open files` of `/proc/PID/limits`); None when
/// unreadable, `u64::MAX` when unlimited.
pub fn open_files_limit(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/limits")).ok()?;
    let soft = text
        .lines()
        .find(|l| l.starts_with("Max open files"))?
        .split_whitespace()
        .nth(3)?;
    if soft == "unlimited" {
        Some(u64::MAX)
    } else {
        soft.parse().ok()
    }
}

/// `pid` and its direct children.
pub fn tree_of(pid: u32) -> Vec<u32> {
    let mut out = vec![pid];
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            let Some(child) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            let parent =
                stat_fields(child).and_then(|f| f.get(1).and_then(|p| p.parse::<u32>().ok()));
            if parent == Some(pid) {
                out.push(child);
            }
        }
    }
    out
}

/// Summed usage of `pids` (those still alive).
pub fn usage_of_all(pids: &[u32]) -> ProcUsage {
    pids.iter()
        .filter_map(|&p| usage_of(p))
        .fold(ProcUsage::default(), |a, u| ProcUsage {
            cpu_s: a.cpu_s + u.cpu_s,
            peak_rss_kib: a.peak_rss_kib + u.peak_rss_kib,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_usage_and_grows_with_work() {
        let me = std::process::id();
        let a = usage_of(me).expect("own /proc entry");
        assert!(a.peak_rss_kib > 0);
        let mut x = 0u64;
        let t = std::time::Instant::now();
        while t.elapsed() < std::time::Duration::from_millis(300) {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        let b = usage_of(me).expect("own /proc entry");
        assert!(b.cpu_since(&a) > 0.05, "cpu grew by {}", b.cpu_since(&a));
        assert!(usage_of(u32::MAX).is_none());
        assert!(tree_of(me).contains(&me));
        let s = snapshot(me).expect("own /proc entry");
        assert!(s.rss_kib > 0 && s.hwm_kib >= s.rss_kib && s.threads >= 1 && s.fds >= 3);
        assert!(open_files_limit(me).is_some_and(|n| n > 0));
        assert!(snapshot(u32::MAX).is_none());
    }
}
