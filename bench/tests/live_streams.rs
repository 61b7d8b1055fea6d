//! `headroom-bench streams` at a small scale: 300 slow streams held open at once
//! through one `headroom serve`, over HTTP/1.1 (a connection per stream) and HTTP/2
//! (multiplexed). Every stream must deliver all its tokens and `[DONE]`, all of them
//! must be open together, and every process the run started must be gone afterwards.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{bin_dir, router_bin};
use headroom_bench::live::{ClientProtocol, StreamsOptions, run_streams};

#[test]
fn three_hundred_slow_streams_complete_through_one_router() {
    router_bin();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    for protocol in [ClientProtocol::Http1, ClientProtocol::H2] {
        let opts = StreamsOptions {
            streams: 300,
            protocol,
            streams_per_conn: 100,
            // 20 tokens 100 ms apart: each stream lives ~1.9 s, all open from 0.5 s on.
            tokens: 20,
            interval: Duration::from_millis(100),
            ramp: Duration::from_millis(500),
            sample_every: Duration::from_millis(200),
            idle_probe: Duration::from_millis(300),
            bin_dir: Some(bin_dir()),
            // The byte estimator: a debug router loads cl100k's ranks slowly.
            tokenizer: "estimate".into(),
            ..StreamsOptions::default()
        };
        let t = Instant::now();
        let run = rt.block_on(run_streams(&opts)).expect("streams run");
        let name = protocol.name();
        assert_eq!(run.errors, 0, "{name}: {:?}", run.first_errors);
        assert_eq!(run.completed, 300, "{name}");
        assert_eq!(
            run.peak_open, 300,
            "{name}: not all streams were open at once"
        );
        assert!(
            run.router_all_open_cpu_ms_per_s.is_some(),
            "{name}: no sample saw every stream open"
        );
        // A client socket per connection and an upstream socket per stream.
        let min_fds = run.client_conns as u64 + 300;
        assert!(
            run.router_peak_fds >= min_fds,
            "{name}: router peak fds {} < {min_fds}",
            run.router_peak_fds
        );
        assert!(run.router_hwm_mib > run.router_idle_rss_mib, "{name}");
        assert!(run.ttfb_p99_ms.is_some(), "{name}");
        assert_eq!(run.started_pids.len(), 2, "{name}: upstream and router");
        for pid in &run.started_pids {
            assert!(
                !Path::new(&format!("/proc/{pid}")).exists(),
                "{name}: process {pid} still exists"
            );
        }
        // A bound, not a speed claim: each protocol's run takes ≈ 3 s here.
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "{name}: {:?}",
            t.elapsed()
        );
    }
}
