//! What a simulation runs: the fleet, the router nodes and how they share state, the
//! policy, and the clocks of scraping, gossip and learning.

use headroom_core::{pd::PdConfig, policy::Fallback, view::Role};
use headroom_predictor::PredictorConfig;

/// One group of identical replicas.
#[derive(Clone, Debug, PartialEq)]
pub struct FleetGroup {
    pub profile: String,
    pub count: u32,
    /// The region its replicas are in (`profile:count@region`); `None`: [`LOCAL_REGION`].
    pub region: Option<String>,
    /// Prefill, decode or both (`profile:count:role`; default both).
    pub role: Role,
}

/// The region of replicas and nodes when the fleet names none.
pub const LOCAL_REGION: &str = "local";

/// The default fleet (documented in the README): a heterogeneous 16-replica fleet of
/// 6 H100-class, 6 A100-class and 4 L4-class Llama-3-8B replicas.
pub const DEFAULT_FLEET: &str = "h100-llama3-8b:6,a100-llama3-8b:6,l4-llama3-8b:4";

/// Parses `profile:count:role@region,profile:count` (a bare profile means one replica;
/// no `:role` means `both`, no `@region` [`LOCAL_REGION`]).
pub fn parse_fleet(spec: &str) -> Result<Vec<FleetGroup>, String> {
    let mut out = Vec::new();
    for entry in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (part, region) = match entry.split_once('@') {
            Some((p, r)) if !r.trim().is_empty() && !r.contains(['@', '/']) => {
                (p.trim(), Some(r.trim().to_string()))
            }
            Some(_) => {
                return Err(format!(
                    "fleet entry `{entry}`: expected profile:count@region"
                ));
            }
            None => (entry, None),
        };
        let mut fields = part.split(':').map(str::trim);
        let profile = fields.next().unwrap_or_default();
        let count = match fields.next() {
            Some(c) => c
                .parse::<u32>()
                .map_err(|_| format!("fleet entry `{part}`: count is not a number"))?,
            None => 1,
        };
        let role = match fields.next() {
            Some(r) => r
                .parse::<Role>()
                .map_err(|e| format!("fleet entry `{part}`: {e}"))?,
            None => Role::Both,
        };
        if fields.next().is_some() {
            return Err(format!("fleet entry `{part}`: expected profile:count:role"));
        }
        if count == 0 {
            return Err(format!("fleet entry `{part}`: count must be > 0"));
        }
        headroom_engine::Profile::by_name(profile).map_err(|e| e.to_string())?;
        out.push(FleetGroup {
            profile: profile.to_string(),
            count,
            region,
            role,
        });
    }
    if out.is_empty() {
        return Err("empty fleet".into());
    }
    Ok(out)
}

/// A region's replicas unreachable from `from_s` until `to_s` (simulated seconds):
/// every node's health checks see them down and no new request goes there; requests
/// already placed there finish (drain). The region's router nodes keep routing.
#[derive(Clone, Debug, PartialEq)]
pub struct Dark {
    pub region: String,
    pub from_s: f64,
    pub to_s: f64,
}

impl Dark {
    /// Parses `REGION:FROM_S:TO_S`.
    pub fn parse(spec: &str) -> Result<Self, String> {
        let bad = || format!("dark `{spec}`: expected REGION:FROM_S:TO_S with FROM_S < TO_S");
        let mut it = spec.split(':').map(str::trim);
        let (Some(region), Some(a), Some(b), None) = (it.next(), it.next(), it.next(), it.next())
        else {
            return Err(bad());
        };
        let (from_s, to_s) = (
            a.parse::<f64>().map_err(|_| bad())?,
            b.parse::<f64>().map_err(|_| bad())?,
        );
        if region.is_empty()
            || !(from_s.is_finite() && to_s.is_finite() && 0.0 <= from_s && from_s < to_s)
        {
            return Err(bad());
        }
        Ok(Self {
            region: region.to_string(),
            from_s,
            to_s,
        })
    }
}

/// A replica slowing down at a given time (drift experiments).
#[derive(Clone, Debug, PartialEq)]
pub struct Slowdown {
    pub replica: u32,
    pub at_s: f64,
    pub factor: f64,
}

#[derive(Clone, Debug)]
pub struct SimConfig {
    pub fleet: Vec<FleetGroup>,
    /// Model name the replicas serve.
    pub model: String,
    /// Policy name: a `headroom serve` policy, a peer baseline, or `oracle`.
    pub policy: String,
    /// Router nodes; arrivals are spread over them at random (seeded).
    pub routers: u32,
    /// Share in-flight placements between nodes (the mesh); off = independent nodes.
    pub mesh: bool,
    /// Send each tenant's requests to one node (clients pinned to a router by DNS or
    /// kept-alive connections) instead of spreading arrivals at random.
    pub pin_tenants: bool,
    /// How often each node publishes its in-flight vector, and how late peers see it.
    pub gossip_interval_s: f64,
    pub gossip_delay_s: f64,
    /// How often each node reads each replica's metrics.
    pub scrape_interval_s: f64,
    /// How often each node's trainer publishes a predictor snapshot.
    pub publish_interval_s: f64,
    /// How often nodes exchange predictor statistics (federation; 0 = never).
    pub federation_interval_s: f64,
    /// Sampling period of per-replica load.
    pub load_sample_interval_s: f64,
    pub predictor: PredictorConfig,
    pub slo: headroom_core::policy::slo::SloConfig,
    /// Router prefix-index block size (tokens).
    pub block_tokens: u32,
    /// Objectives for requests that carry none.
    pub default_slo_ttft_ms: f64,
    pub default_slo_tpot_ms: f64,
    pub fallback: Fallback,
    /// `max_tokens` the client sends: `output × factor`, at least `min` (the engine
    /// still stops at the true output length; the router does not know it).
    pub max_tokens_factor: f64,
    pub max_tokens_min: u32,
    /// Lognormal step-time noise of the engines (0 = none; default
    /// [`headroom_engine::DEFAULT_STEP_NOISE`]). A class's profile file may set its own.
    pub step_noise: f64,
    /// Mismatched engines: every replica's step-time constants are scaled by `1 ± this`
    /// (sign per constant and replica, drawn from the seed) away from its profile's,
    /// which the router's configuration still names. 0 = engines as documented.
    pub engine_mismatch: f64,
    /// Per-class engine profile files (class name, overrides): the true engines of that
    /// class run these constants; the router still sees the class name.
    pub engine_files: Vec<(String, headroom_engine::ProfileFile)>,
    pub slowdowns: Vec<Slowdown>,
    pub seed: u64,
    /// Arrival rate multiplier.
    pub rate_scale: f64,
    /// Each node's admission gate (`[admission]`; `per_replica` 0 = no capacity cap).
    pub admission: headroom_core::admission::GateConfig,
    /// Tenants' admission limits by name (weight, band, rates, concurrency); others
    /// get the defaults (weight 1, no limits).
    pub tenant_limits: Vec<(String, headroom_core::admission::TenantLimits)>,
    /// Round trips between the fleet's regions (`[regions]`); nodes are spread over
    /// the regions in the fleet's order, node `n` in region `n mod regions`.
    pub regions: headroom_core::region::RegionsConfig,
    /// Regions going dark for a while.
    pub dark: Vec<Dark>,
    /// Prefill/decode disaggregation as the router is configured (`[pd]`): when a
    /// request is disaggregated, and the link model it starts from.
    pub pd: PdConfig,
    /// The true P→D links the engines' KV moves over (the router learns them): GB/s
    /// and ms per transfer, `t = latency + tokens × pd.kv_bytes_per_token / bandwidth`.
    pub link_gbytes_per_s: f64,
    pub link_latency_ms: f64,
    /// Precise prefix state: each decision knows every engine's exact cached tokens
    /// for the prompt (what a `precise` KV-event feed gives the router, without the
    /// events' delivery delay); off = the router's approximate prefix index alone.
    pub precise_prefix: bool,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            fleet: parse_fleet(DEFAULT_FLEET).expect("the default fleet is valid"),
            model: "llama-3-8b".into(),
            policy: "slo".into(),
            routers: 1,
            mesh: true,
            pin_tenants: false,
            // The router sends in-flight vectors as QUIC datagrams when they change,
            // checked every 20 ms; loopback/LAN delivery takes about a millisecond
            // (gossip/README.md measured 0.3–5 ms to all nodes).
            gossip_interval_s: 0.02,
            gossip_delay_s: 0.002,
            scrape_interval_s: 0.1,
            publish_interval_s: 0.25,
            federation_interval_s: 1.0,
            load_sample_interval_s: 1.0,
            predictor: PredictorConfig::default(),
            slo: Default::default(),
            block_tokens: 16,
            default_slo_ttft_ms: 2_000.0,
            default_slo_tpot_ms: 100.0,
            fallback: Fallback::LeastBad,
            max_tokens_factor: 2.0,
            max_tokens_min: 256,
            step_noise: headroom_engine::DEFAULT_STEP_NOISE,
            engine_mismatch: 0.0,
            engine_files: Vec::new(),
            slowdowns: Vec::new(),
            seed: 1,
            rate_scale: 1.0,
            admission: Default::default(),
            tenant_limits: Vec::new(),
            precise_prefix: false,
            regions: Default::default(),
            dark: Vec::new(),
            pd: PdConfig::default(),
            link_gbytes_per_s: PdConfig::default().link_gbytes_per_s,
            link_latency_ms: PdConfig::default().link_latency_ms,
        }
    }
}

impl SimConfig {
    /// The fleet's regions, in order of first mention.
    pub fn region_names(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for g in &self.fleet {
            let r = g.region.as_deref().unwrap_or(LOCAL_REGION);
            if !out.iter().any(|o| o == r) {
                out.push(r.to_string());
            }
        }
        out
    }

    /// Each replica's region, in fleet order.
    pub fn replica_regions(&self) -> Vec<String> {
        self.fleet
            .iter()
            .flat_map(|g| {
                let r = g.region.as_deref().unwrap_or(LOCAL_REGION).to_string();
                std::iter::repeat_n(r, g.count as usize)
            })
            .collect()
    }

    /// Each replica's role, in fleet order.
    pub fn replica_roles(&self) -> Vec<Role> {
        self.fleet
            .iter()
            .flat_map(|g| std::iter::repeat_n(g.role, g.count as usize))
            .collect()
    }

    /// Whether any replica only prefills: the fleet is disaggregated.
    pub fn disaggregated(&self) -> bool {
        self.fleet.iter().any(|g| g.role == Role::Prefill)
    }

    /// Seconds the true link takes to move `tokens` tokens' KV.
    pub fn transfer_s(&self, tokens: u32) -> f64 {
        self.link_latency_ms / 1e3
            + f64::from(tokens) * self.pd.kv_bytes_per_token / (self.link_gbytes_per_s * 1e9)
    }

    /// Router node `n`'s region.
    pub fn node_region(&self, n: u32) -> String {
        let names = self.region_names();
        names
            .get(n as usize % names.len().max(1))
            .cloned()
            .unwrap_or_else(|| LOCAL_REGION.to_string())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn fleet_specs() {
        let f = super::parse_fleet("h100-llama3-8b:2, a100-llama3-8b").unwrap();
        assert_eq!(f.len(), 2);
        assert_eq!(f[0].count, 2);
        assert_eq!(f[1].count, 1);
        assert!(super::parse_fleet("nope:1").is_err());
        assert!(super::parse_fleet("h100-llama3-8b:x").is_err());
        assert!(super::parse_fleet("h100-llama3-8b:0").is_err());
        assert!(super::parse_fleet(super::DEFAULT_FLEET).is_ok());
        let f = super::parse_fleet("h100-llama3-8b:2@eu-1,a100-llama3-8b:1@us-1").unwrap();
        assert_eq!(f[0].region.as_deref(), Some("eu-1"));
        assert_eq!(f[1].region.as_deref(), Some("us-1"));
        assert!(super::parse_fleet("h100-llama3-8b:2@").is_err());
        let f =
            super::parse_fleet("h100-llama3-8b:2:prefill,h100-llama3-8b:3:decode@eu-1").unwrap();
        assert_eq!((f[0].role, f[0].count), (super::Role::Prefill, 2));
        assert_eq!(
            (f[1].role, f[1].region.as_deref()),
            (super::Role::Decode, Some("eu-1"))
        );
        assert_eq!(f[0].region, None);
        assert!(super::parse_fleet("h100-llama3-8b:2:fast").is_err());
        assert!(super::parse_fleet("h100-llama3-8b:2:both:x").is_err());
        assert!(super::parse_fleet("h100-llama3-8b:2@a@b").is_err());
    }

    #[test]
    fn regions_of_replicas_and_nodes() {
        let cfg = super::SimConfig {
            fleet: super::parse_fleet("h100-llama3-8b:2@eu-1,a100-llama3-8b:1@us-1").unwrap(),
            ..Default::default()
        };
        assert_eq!(cfg.region_names(), ["eu-1", "us-1"]);
        assert_eq!(cfg.replica_regions(), ["eu-1", "eu-1", "us-1"]);
        assert_eq!(
            (0..3).map(|n| cfg.node_region(n)).collect::<Vec<_>>(),
            ["eu-1", "us-1", "eu-1"]
        );
        let d = super::Dark::parse("us-1:100:200").unwrap();
        assert_eq!(
            (d.region.as_str(), d.from_s, d.to_s),
            ("us-1", 100.0, 200.0)
        );
        for bad in ["us-1:200:100", "us-1:1", ":1:2", "us-1:a:2", "us-1:1:2:3"] {
            assert!(super::Dark::parse(bad).is_err(), "{bad}");
        }
    }
}
