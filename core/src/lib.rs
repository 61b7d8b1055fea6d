//! Headroom's routing core: synchronous and I/O-free, so the `headroom` binary and
//! the fleet simulator run the very same code, one in wall-clock time, the other in
//! virtual time.
//!
//! Module map: [`admission`] (tenants' rates, shares and queues, before routing) →
//! [`view`] (what the core reads of a replica, filled by the host) →
//! [`policy`] (candidates, the policies, the registry) → [`decide`] (one decision;
//! [`explain`] what it knew, for the operator's record)
//! → [`lifecycle`] (admit, dispatch, finish); [`ledger`] (this node's in-flight work
//! per replica), [`prefix`] (which replica holds which prompt blocks), [`blocks`]
//! (prompt block hashes), [`pd`] (the prefill/decode pair and whether to disaggregate), [`output`] (output-length estimate), [`scraped`] (engine
//! state), [`region`] (where a replica is, what the distance costs, regions' summaries). No async runtime, no HTTP: time comes in as `now_s`, randomness as an rng.

pub mod admission;
pub mod blocks;
pub mod decide;
pub mod explain;
pub mod ledger;
pub mod lifecycle;
pub mod output;
pub mod pd;
pub mod policy;
pub mod prefix;
pub mod region;
pub mod scraped;
pub mod view;

pub use decide::{Learn, RouteInputs, Routed, RoutedTarget, Verdict, route, route_explained};
pub use lifecycle::{Admission, Admit, DeferLimits, Deferrals, Finished, Reported};
pub use policy::{Fallback, PolicyName, PolicySettings, RequestProfile, Slo};
pub use view::{PlainReplica, ReplicaView, Serving};
