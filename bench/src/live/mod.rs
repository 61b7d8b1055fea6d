//! Live measurement: real processes on loopback, real HTTP, the client's clock.
//!
//! - [`replay`]: the load generator — replays a [`crate::workload::Workload`] against
//!   any OpenAI-compatible base URL (our router, a peer router, a replica) and yields
//!   the same [`crate::sim::result::RunResult`] records the simulator does.
//! - [`orchestrate`]: `headroom-bench live` — starts emulators and router nodes,
//!   replays through them, measures router CPU and memory, stops everything.
//! - [`overhead`]: `headroom-bench proxy-overhead` — requests/s and added latency of
//!   `headroom serve` against a direct connection and nginx, on a fixed-response
//!   upstream ([`fixed_upstream`]).
//! - [`streams`]: `headroom-bench streams` — thousands of slow streams held open
//!   through one `headroom serve`, on a slow upstream ([`slow_upstream`]): router
//!   RSS, CPU and descriptors over time, errors, time to first byte.
//!
//! Time: emulators run at `--time-scale F` (wall seconds per model second) and the
//! replay compresses arrivals by the same F, so emulated GPU time and arrivals stay
//! consistent; measured latencies are divided by F back into model time. What does not
//! scale — network, proxy and router CPU time, the router's own scrape and probe
//! periods — is therefore magnified by 1/F in model time: keep F ≥ 0.1 when router
//! overhead matters.
//!
//! Known difference from the simulator: the emulator has no request field that fixes
//! the output length without announcing it, so requests carry `max_tokens = output`
//! with `ignore_eos: true` and a router sees the true output length (the simulator
//! shows it `max(2 × output, 256)` and stops the engine at the true length).

pub mod body;
pub mod cli;
pub mod client;
mod error;
pub mod fixed_upstream;
pub mod nginx;
pub mod orchestrate;
pub mod overhead;
pub mod procs;
pub mod replay;
pub mod slow_upstream;
pub mod sse;
pub mod streams;
pub mod table;
pub mod usage;

pub use error::LiveError;
pub use orchestrate::{LiveMode, LiveOptions, LiveRun, RouterUsage, SpawnOptions, run_live};
pub use overhead::{OverheadOptions, proxy_overhead};
pub use replay::{Replay, ReplayOptions, replay};
pub use streams::{ClientProtocol, StreamsOptions, StreamsRun, run_streams};
pub use table::Table;
