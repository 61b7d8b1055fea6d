//! The fault scenarios, by name. Each module holds one scenario: its plan (what to
//! start, what load), its fault script (`inject`, run beside the load) and its own
//! checks; the checks every scenario shares are in [`crate::check`].

mod client_abort;
mod clock_skew;
mod common;
mod garbage_metrics;
mod midstream_errors;
mod midstream_failover;
mod net_faults;
mod net_partition;
mod overload;
mod replica_errors;
mod replica_kill;
mod replica_restart;
mod replica_slow;
mod replica_stall;
mod router_kill;
mod router_pause;
mod router_rolling;

use crate::check::Check;
use crate::scenario::{Ctx, FaultLog, Finished, Plan, RunOptions};

pub use common::{FAULTY, REQUEST_DEADLINE, balanced_before};

/// Every scenario.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    ReplicaKill,
    ReplicaRestart,
    ReplicaStall,
    ReplicaSlow,
    ReplicaErrors,
    MidstreamErrors,
    MidstreamFailover,
    RouterKill,
    RouterPause,
    GarbageMetrics,
    ClientAbort,
    NetPartition,
    NetFaults,
    RouterRolling,
    Overload,
    ClockSkew,
}

impl Scenario {
    pub const ALL: [Scenario; 16] = [
        Scenario::ReplicaKill,
        Scenario::ReplicaRestart,
        Scenario::ReplicaStall,
        Scenario::ReplicaSlow,
        Scenario::ReplicaErrors,
        Scenario::MidstreamErrors,
        Scenario::MidstreamFailover,
        Scenario::RouterKill,
        Scenario::RouterPause,
        Scenario::GarbageMetrics,
        Scenario::ClientAbort,
        Scenario::NetPartition,
        Scenario::NetFaults,
        Scenario::RouterRolling,
        Scenario::Overload,
        Scenario::ClockSkew,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Scenario::ReplicaKill => "replica-kill",
            Scenario::ReplicaRestart => "replica-restart",
            Scenario::ReplicaStall => "replica-stall",
            Scenario::ReplicaSlow => "replica-slow",
            Scenario::ReplicaErrors => "replica-errors",
            Scenario::MidstreamErrors => "midstream-errors",
            Scenario::MidstreamFailover => "midstream-failover",
            Scenario::RouterKill => "router-kill",
            Scenario::RouterPause => "router-pause",
            Scenario::GarbageMetrics => "garbage-metrics",
            Scenario::ClientAbort => "client-abort",
            Scenario::NetPartition => "net-partition",
            Scenario::NetFaults => "net-faults",
            Scenario::RouterRolling => "router-rolling",
            Scenario::Overload => "overload",
            Scenario::ClockSkew => "clock-skew",
        }
    }

    pub fn about(self) -> &'static str {
        match self {
            Scenario::ReplicaKill => replica_kill::ABOUT,
            Scenario::ReplicaRestart => replica_restart::ABOUT,
            Scenario::ReplicaStall => replica_stall::ABOUT,
            Scenario::ReplicaSlow => replica_slow::ABOUT,
            Scenario::ReplicaErrors => replica_errors::ABOUT,
            Scenario::MidstreamErrors => midstream_errors::ABOUT,
            Scenario::MidstreamFailover => midstream_failover::ABOUT,
            Scenario::RouterKill => router_kill::ABOUT,
            Scenario::RouterPause => router_pause::ABOUT,
            Scenario::GarbageMetrics => garbage_metrics::ABOUT,
            Scenario::ClientAbort => client_abort::ABOUT,
            Scenario::NetPartition => net_partition::ABOUT,
            Scenario::NetFaults => net_faults::ABOUT,
            Scenario::RouterRolling => router_rolling::ABOUT,
            Scenario::Overload => overload::ABOUT,
            Scenario::ClockSkew => clock_skew::ABOUT,
        }
    }

    /// Looks a scenario up by name.
    pub fn by_name(name: &str) -> Option<Scenario> {
        Scenario::ALL.into_iter().find(|s| s.name() == name)
    }

    pub fn plan(self, o: &RunOptions) -> Plan {
        match self {
            Scenario::ReplicaKill => replica_kill::plan(o),
            Scenario::ReplicaRestart => replica_restart::plan(o),
            Scenario::ReplicaStall => replica_stall::plan(o),
            Scenario::ReplicaSlow => replica_slow::plan(o),
            Scenario::ReplicaErrors => replica_errors::plan(o),
            Scenario::MidstreamErrors => midstream_errors::plan(o),
            Scenario::MidstreamFailover => midstream_failover::plan(o),
            Scenario::RouterKill => router_kill::plan(o),
            Scenario::RouterPause => router_pause::plan(o),
            Scenario::GarbageMetrics => garbage_metrics::plan(o),
            Scenario::ClientAbort => client_abort::plan(o),
            Scenario::NetPartition => net_partition::plan(o),
            Scenario::NetFaults => net_faults::plan(o),
            Scenario::RouterRolling => router_rolling::plan(o),
            Scenario::Overload => overload::plan(o),
            Scenario::ClockSkew => clock_skew::plan(o),
        }
    }

    pub async fn inject(self, ctx: &mut Ctx<'_>) {
        match self {
            Scenario::ReplicaKill => replica_kill::inject(ctx).await,
            Scenario::ReplicaRestart => replica_restart::inject(ctx).await,
            Scenario::ReplicaStall => replica_stall::inject(ctx).await,
            Scenario::ReplicaSlow => replica_slow::inject(ctx).await,
            Scenario::ReplicaErrors => replica_errors::inject(ctx).await,
            Scenario::MidstreamErrors => midstream_errors::inject(ctx).await,
            Scenario::MidstreamFailover => midstream_failover::inject(ctx).await,
            Scenario::RouterKill => router_kill::inject(ctx).await,
            Scenario::RouterPause => router_pause::inject(ctx).await,
            Scenario::GarbageMetrics => garbage_metrics::inject(ctx).await,
            Scenario::ClientAbort => client_abort::inject(ctx).await,
            Scenario::NetPartition => net_partition::inject(ctx).await,
            Scenario::NetFaults => net_faults::inject(ctx).await,
            Scenario::RouterRolling => router_rolling::inject(ctx).await,
            Scenario::Overload => overload::inject(ctx).await,
            Scenario::ClockSkew => clock_skew::inject(ctx).await,
        }
    }

    pub fn checks(self, f: &Finished<'_>) -> Vec<Check> {
        match self {
            Scenario::ReplicaKill => replica_kill::checks(f),
            Scenario::ReplicaRestart => replica_restart::checks(f),
            Scenario::ReplicaStall => replica_stall::checks(f),
            Scenario::ReplicaSlow => replica_slow::checks(f),
            Scenario::ReplicaErrors => replica_errors::checks(f),
            Scenario::MidstreamErrors => midstream_errors::checks(f),
            Scenario::MidstreamFailover => midstream_failover::checks(f),
            Scenario::RouterKill => router_kill::checks(f),
            Scenario::RouterPause => router_pause::checks(f),
            Scenario::GarbageMetrics => garbage_metrics::checks(f),
            Scenario::ClientAbort => client_abort::checks(f),
            Scenario::NetPartition => net_partition::checks(f),
            Scenario::NetFaults => net_faults::checks(f),
            Scenario::RouterRolling => router_rolling::checks(f),
            Scenario::Overload => overload::checks(f),
            Scenario::ClockSkew => clock_skew::checks(f),
        }
    }

    /// Runs once the load has ended, before the ledgers are drained.
    pub async fn after_load(self, ctx: &mut Ctx<'_>) {
        if self == Scenario::ClientAbort {
            client_abort::after_load(ctx).await;
        }
    }

    /// The router node this scenario killed and when (its cut streams are excused).
    pub fn killed_node(self, log: &FaultLog) -> Option<(usize, f64)> {
        match self {
            Scenario::RouterKill => log.fault_s.map(|t| (router_kill::VICTIM, t)),
            _ => None,
        }
    }
}
