//! `headroom-engine`: the engine model that both the simulator (`headroom-bench`) and the
//! emulator (`headroom-replica`) run. Invariants: no async, no threads, no wall clock; the
//! only I/O is reading a profile file; the same profile, seed and inputs give the same steps.
//!
//! A vLLM-v1-like engine model: pure, synchronous, deterministic for a seed, and
//! cheap enough to replay whole traces on many replicas in one process.
//!
//! The same [`Engine`] runs in virtual time (a simulator calls [`Engine::step`] and
//! advances its clock by `duration_s`) and in real time (the replica emulator's
//! driver sleeps `duration_s × time_scale` between steps).
//!
//! ```
//! use headroom_engine::{Engine, EngineRequest, Event, Profile};
//! let profile = Profile::by_name("h100-llama3-8b").unwrap();
//! let mut engine = Engine::new(&profile, 7).unwrap();
//! engine.submit(EngineRequest::new(1, 1000, vec![], 3)).unwrap();
//! let mut tokens = 0;
//! while !engine.is_idle() {
//!     let step = engine.step();
//!     assert!(step.duration_s > 0.0);
//!     tokens += engine.events().iter().filter(|e| !matches!(e, Event::Finished { .. })).count();
//! }
//! assert_eq!(tokens, 3);
//! ```

mod block_pool;
mod error;
pub mod frontend;
pub mod hashing;
mod profile;
mod request_state;
mod scheduler;
mod types;

pub use block_pool::KvLog;
pub use error::EngineError;
pub use frontend::{Chunk, Finish, Frontend, FrontendCost};
pub use hashing::{
    block_hashes_for_hash_ids, block_hashes_for_tokens, block_hashes_for_tokens_salted,
    salt_for_adapter, tokens_for_hash_ids,
};
pub use profile::{
    Admission, DEFAULT_FRONTEND, DEFAULT_STEP_NOISE, DEFAULT_STREAM_INTERVAL, Profile, ProfileFile,
    StepCost,
};
pub use scheduler::Engine;
pub use types::{EngineRequest, EngineStats, Event, FinishReason, StepInfo};
