//! Router configuration: one source of defaults.
//!
//! Every knob has its default in the `Default` impl right next to its field, and the
//! TOML file, the CLI and `headroom up` all start from `RouterConfig::default()`. The
//! module imports no other router module but `policy` (the core's settings): the
//! sections of other modules (`edge`, `mesh`), the URL checks and the validation live
//! here, and those modules read them from here.

pub mod edge;
pub mod mesh;
pub mod url;
pub mod validate;

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    time::Duration,
};

use headroom_predictor::PredictorConfig;

use serde::{Deserialize, Serialize};

use headroom_core::region::RegionsConfig;

use crate::policy::{
    PolicyName, PolicySettings, baselines::PrefixAffinity, peers::LlmdPredictedConfig,
    slo::SloConfig,
};
use mesh::MeshSettings;

/// Everything a router node needs to run.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RouterConfig {
    /// This node's name in the mesh and in `/debug/cluster`.
    pub node_id: Option<String>,
    /// HTTP listen address.
    pub listen: SocketAddr,
    /// Routing policy (`slo` by default).
    pub policy: PolicyName,
    /// Static replicas.
    pub replicas: Vec<ReplicaConfig>,
    /// Optional DNS discovery: every address the name resolves to is a replica.
    pub discovery: Option<DnsDiscovery>,
    pub scrape: ScrapeConfig,
    pub health: HealthConfig,
    pub proxy: ProxyConfig,
    pub prefix: PrefixConfig,
    /// Following the engines' KV-cache events (replicas with `kv_events`).
    pub kv_events: KvEventsConfig,
    /// Per-model settings (tokenizer); unknown models use the estimator.
    pub models: Vec<ModelConfig>,
    /// Tenants and their SLO classes; the first tenant named `default` (or a built-in
    /// one) serves requests without a known API key.
    pub tenants: Vec<TenantConfig>,
    /// Seed for the node's random choices (ties, sampling); 0 = from entropy. Mixed
    /// with the node id, so nodes sharing a config still draw apart.
    pub seed: u64,
    /// Attach the prediction and decision to response headers (`x-headroom-*`).
    pub prediction_headers: bool,
    /// The `slo` policy's knobs.
    pub slo: SloConfig,
    /// Prefill/decode disaggregation (replicas with `role = "prefill"` / `"decode"`).
    pub pd: headroom_core::pd::PdConfig,
    /// The `prefix-affinity` baseline's knobs.
    pub prefix_affinity: PrefixAffinity,
    /// The `llmd-predicted` reference policy's knobs (llm-d's chart defaults).
    pub llmd_predicted: LlmdPredictedConfig,
    /// The latency predictor's knobs.
    pub predictor: PredictorConfig,
    /// Warm-start the predictor from this file and save it there on shutdown.
    pub predictor_state: Option<PathBuf>,
    /// Append every input the learner receives to this file, one JSON line each
    /// (`headroom_predictor::JournalEntry`), for replaying real labels offline.
    pub predictor_journal: Option<PathBuf>,
    /// How often the trainer publishes a new predictor snapshot (ms).
    pub predictor_publish_ms: u64,
    /// How many recent decision records to keep for `/debug/decisions` (each response
    /// names its record in `x-headroom-decision-id`); 0 turns records off.
    pub decision_records: usize,
    /// Append one JSON line per finished request (arrival, prompt and output tokens,
    /// prefix blocks, tenant, objectives, what was measured) to this file: the
    /// workload `headroom-bench sim` and `headroom-bench plan` replay. Needs
    /// `decision_records` > 0.
    pub request_log: Option<PathBuf>,
    /// The mesh (off unless `mesh.listen` is set).
    pub mesh: MeshSettings,
    /// The client-facing edge: timeouts, connection cap, TLS, admin surface, identity.
    pub edge: edge::EdgeConfig,
    /// Admission before routing: capacity, the gate's queue and waits.
    pub admission: AdmissionConfig,
    /// OpenTelemetry traces of each request's life (off unless `otlp_endpoint` is set).
    pub tracing: TracingConfig,
    /// Round trips between regions and regions' summaries (`headroom_core::region`).
    pub regions: RegionsConfig,
}

impl Default for RouterConfig {
    fn default() -> Self {
        Self {
            node_id: None,
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            policy: PolicyName::Slo,
            replicas: Vec::new(),
            discovery: None,
            scrape: ScrapeConfig::default(),
            health: HealthConfig::default(),
            proxy: ProxyConfig::default(),
            prefix: PrefixConfig::default(),
            kv_events: KvEventsConfig::default(),
            models: Vec::new(),
            tenants: Vec::new(),
            seed: 0,
            prediction_headers: true,
            pd: headroom_core::pd::PdConfig::default(),
            slo: SloConfig::default(),
            prefix_affinity: PrefixAffinity::default(),
            llmd_predicted: LlmdPredictedConfig::default(),
            predictor: PredictorConfig::default(),
            predictor_state: None,
            predictor_journal: None,
            predictor_publish_ms: 100,
            decision_records: 4096,
            request_log: None,
            mesh: MeshSettings::default(),
            edge: edge::EdgeConfig::default(),
            admission: AdmissionConfig::default(),
            regions: RegionsConfig::default(),
            tracing: TracingConfig::default(),
        }
    }
}

/// OpenTelemetry traces (`router/src/otel`): one trace per request (admit, decide,
/// upstream, first token) exported over OTLP/HTTP protobuf. Off by default; off costs
/// one branch per request.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct TracingConfig {
    /// The collector's OTLP/HTTP endpoint, `http://HOST:PORT` (`/v1/traces` is
    /// appended when no path is given) or the full traces URL. Plain HTTP only.
    pub otlp_endpoint: Option<String>,
    /// `service.name` of the router's spans.
    pub service_name: String,
    /// Share of requests traced when the client sent no sampled `traceparent`
    /// (a client's sampling decision is followed).
    pub sample_ratio: f64,
    /// Most finished spans held for export; beyond it spans are dropped.
    pub max_queued_spans: usize,
    /// How often queued spans are sent (ms).
    pub export_interval_ms: u64,
    /// Longest one export may take (ms).
    pub export_timeout_ms: u64,
}

impl Default for TracingConfig {
    fn default() -> Self {
        Self {
            otlp_endpoint: None,
            service_name: "headroom".into(),
            sample_ratio: 1.0,
            max_queued_spans: 2048,
            export_interval_ms: 5000,
            export_timeout_ms: 10_000,
        }
    }
}

/// The node's admission gate (`headroom_core::admission`): tenants are held to their
/// weighted shares once `per_replica_in_flight` × replicas requests run.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct AdmissionConfig {
    /// Requests per replica this node lets run before tenants are held to their fair
    /// shares (0 = no cap: only the tenants' own rate and concurrency limits apply).
    pub per_replica_in_flight: u32,
    /// Most requests waiting at the gate on this node; beyond it, 429 or 503.
    pub max_queued: usize,
    /// Longest any request waits for admission or placement (ms), whatever its
    /// objective: the deadline is `min(slo.defer_budget × TTFT objective, this)`.
    pub max_wait_ms: u64,
    /// How often a waiting request looks again (ms).
    pub poll_ms: u64,
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        Self {
            per_replica_in_flight: 0,
            max_queued: 1024,
            max_wait_ms: 5_000,
            poll_ms: 5,
        }
    }
}

impl AdmissionConfig {
    /// The core's settings.
    pub fn gate(&self) -> headroom_core::admission::GateConfig {
        headroom_core::admission::GateConfig {
            per_replica: self.per_replica_in_flight,
            max_queued: self.max_queued,
            max_wait_s: self.max_wait_ms as f64 / 1e3,
            poll_s: self.poll_ms as f64 / 1e3,
        }
    }
}

/// One replica given statically.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ReplicaConfig {
    /// Base URL, e.g. `http://127.0.0.1:8001`.
    pub url: String,
    /// Display name; defaults to the URL's authority.
    #[serde(default)]
    pub name: Option<String>,
    /// Hardware/model class (replicas of one class share a latency model).
    #[serde(default)]
    pub class: Option<String>,
    /// Region the replica lives in; none: the node's (`mesh.region`).
    #[serde(default)]
    pub region: Option<String>,
    /// `prefill`, `decode` or `both` (default): its part in a disaggregated fleet.
    #[serde(default)]
    pub role: headroom_core::view::Role,
    /// The engine's `max_num_batched_tokens`, if known (vLLM does not export it).
    #[serde(default)]
    pub max_batched_tokens: Option<u32>,
    /// The engine's KV-event publisher to follow: `tcp://HOST:PORT`, or `discover`
    /// to read it from the engine's `GET /kv_event_sources` (vLLM).
    #[serde(default)]
    pub kv_events: Option<String>,
    /// The publisher's replay endpoint (`tcp://HOST:PORT`); discovered with
    /// `kv_events = "discover"`.
    #[serde(default)]
    pub kv_replay: Option<String>,
    /// The publisher's topic (vLLM's `topic`); `""` (all) when unset.
    #[serde(default)]
    pub kv_topic: Option<String>,
    /// The engine's KV block size in tokens; read from its `/metrics`
    /// (`cache_config_info`) when unset.
    #[serde(default)]
    pub kv_block_size: Option<u32>,
    /// Whether the engine schedules by request priority, lowest first, so the router
    /// sets each request's `priority` to its TTFT deadline; unset: `[proxy]
    /// deadline_priority`. See [`ProxyConfig::deadline_priority`].
    #[serde(default)]
    pub deadline_priority: Option<bool>,
}

impl ReplicaConfig {
    /// Parses the `--replica` flag form: `URL[,key=value...]`, keys `name`, `class`,
    /// `region`, `role` (`prefill`, `decode`, `both`), `max_batched_tokens`, `kv-events`, `kv-replay`, `kv-topic`,
    /// `kv-block-size`, `deadline-priority` (`-` and `_` alike).
    pub fn parse_flag(s: &str) -> Result<Self, String> {
        let mut parts = s.split(',');
        let url = parts.next().unwrap_or_default().trim().to_string();
        if url.is_empty() {
            return Err("empty replica URL".into());
        }
        let mut rc = ReplicaConfig {
            url,
            ..ReplicaConfig::default()
        };
        for kv in parts {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| format!("replica option `{kv}` is not key=value"))?;
            let v = v.trim().to_string();
            match k.trim().replace('-', "_").as_str() {
                "name" => rc.name = Some(v),
                "kv_events" => rc.kv_events = Some(v),
                "kv_replay" => rc.kv_replay = Some(v),
                "kv_topic" => rc.kv_topic = Some(v),
                "kv_block_size" => {
                    rc.kv_block_size = Some(
                        v.parse()
                            .map_err(|_| format!("kv-block-size `{v}` is not a number"))?,
                    )
                }
                "class" => rc.class = Some(v),
                "region" => rc.region = Some(v),
                "deadline_priority" => {
                    rc.deadline_priority = Some(
                        v.parse()
                            .map_err(|_| format!("deadline_priority `{v}` is not true or false"))?,
                    )
                }
                "role" => rc.role = v.parse()?,
                "max_batched_tokens" => {
                    rc.max_batched_tokens = Some(
                        v.parse()
                            .map_err(|_| format!("max_batched_tokens `{v}` is not a number"))?,
                    )
                }
                other => return Err(format!("unknown replica option `{other}`")),
            }
        }
        Ok(rc)
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DnsDiscovery {
    /// `host:port`; each resolved address becomes `http://addr`.
    pub name: String,
    #[serde(default = "default_dns_interval_ms")]
    pub interval_ms: u64,
    #[serde(default)]
    pub class: Option<String>,
    /// Region of the replicas the name resolves to; none: the node's.
    #[serde(default)]
    pub region: Option<String>,
    /// Role of every replica the name resolves to (`both` by default).
    #[serde(default)]
    pub role: headroom_core::view::Role,
}

fn default_dns_interval_ms() -> u64 {
    5_000
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ScrapeConfig {
    /// How often each replica's `/metrics` is read, at most: the shortest period.
    pub interval_ms: u64,
    /// Longest share of a replica's time spent answering this node's scrapes, judged
    /// by each scrape's wall time; costly scrapes are spaced out up to
    /// `stale_after_ms / 2` (`fleet::pacing`). 0 scrapes every `interval_ms`.
    pub max_duty: f64,
    pub timeout_ms: u64,
    /// Scraped values older than this are treated as unknown by the policies.
    pub stale_after_ms: u64,
    /// How often `/v1/models` is re-read.
    pub models_interval_ms: u64,
}

impl Default for ScrapeConfig {
    fn default() -> Self {
        Self {
            interval_ms: 100,
            max_duty: 0.01,
            timeout_ms: 500,
            stale_after_ms: 2_000,
            models_interval_ms: 5_000,
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HealthConfig {
    /// Active probe (`GET /health`) period.
    pub probe_interval_ms: u64,
    pub probe_timeout_ms: u64,
    /// Consecutive failures (probes, connect errors, 5xx) before ejection.
    pub eject_after_failures: u32,
    /// First ejection lasts this long; each repeat doubles it up to the max.
    pub backoff_initial_ms: u64,
    pub backoff_max_ms: u64,
}

impl Default for HealthConfig {
    fn default() -> Self {
        Self {
            probe_interval_ms: 500,
            probe_timeout_ms: 1_000,
            eject_after_failures: 3,
            backoff_initial_ms: 1_000,
            backoff_max_ms: 30_000,
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProxyConfig {
    /// Largest accepted request body.
    pub max_body_bytes: usize,
    /// Extra attempts on other replicas before the first byte reaches the client.
    pub retries: u32,
    /// Connect timeout to a replica.
    pub connect_timeout_ms: u64,
    /// How long to wait for the first response byte before trying elsewhere.
    pub first_byte_timeout_ms: u64,
    /// Gap between two body chunks after which a stream is declared dead.
    pub idle_timeout_ms: u64,
    /// Base of the jittered pause between retries.
    pub retry_backoff_ms: u64,
    /// Ask engines for per-chunk usage on streams (`continuous_usage_stats`, stripped
    /// again unless the client asked): the token count of each chunk, without which
    /// TPOT can only be measured when every chunk holds one token.
    pub chunk_usage: bool,
    /// Continuations one stream may get when a replica breaks it after its first byte
    /// (`proxy/failover.rs`); 0 turns mid-stream failover off for every tenant.
    pub failover_attempts: u32,
    /// The replicas schedule by request priority, lowest value first (vLLM
    /// `--scheduling-policy priority`; SGLang `--enable-priority-scheduling
    /// --schedule-low-priority-values-first`): the router sets each request's
    /// `priority` to its TTFT deadline in Unix milliseconds (arrival + objective), so
    /// an engine serves its queue earliest deadline first and, short of KV, preempts
    /// the latest deadline. A client's own `priority` is left as it is. Off by default:
    /// vLLM documents that an engine scheduling first come, first served may refuse any
    /// priority but 0 (0.32 ignores it), so it is set only where configured.
    /// Per replica: `deadline_priority` in `[[replicas]]`.
    pub deadline_priority: bool,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        Self {
            max_body_bytes: 8 << 20,
            retries: 2,
            connect_timeout_ms: 1_000,
            first_byte_timeout_ms: 60_000,
            idle_timeout_ms: 60_000,
            retry_backoff_ms: 10,
            chunk_usage: true,
            failover_attempts: 2,
            deadline_priority: false,
        }
    }
}

impl ProxyConfig {
    pub fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.connect_timeout_ms)
    }
    pub fn first_byte_timeout(&self) -> Duration {
        Duration::from_millis(self.first_byte_timeout_ms)
    }
    pub fn idle_timeout(&self) -> Duration {
        Duration::from_millis(self.idle_timeout_ms)
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PrefixConfig {
    /// Tokens per prefix block in the router's approximate index.
    pub block_tokens: u32,
    /// Upper bound on remembered (block, replica) entries across the fleet.
    pub max_entries: usize,
    /// Blocks hashed per request at most (longer prompts match on their head).
    pub max_blocks_per_request: usize,
}

impl Default for PrefixConfig {
    fn default() -> Self {
        Self {
            block_tokens: 16,
            max_entries: 1 << 21,
            max_blocks_per_request: 8_192,
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KvEventsConfig {
    /// Blocks the precise index holds across every followed replica (≈ 86 B each with
    /// the per-replica maps, `kv-events/README.md`); past it the coldest are evicted.
    pub max_blocks: usize,
    /// No event this long after a request that must have stored blocks marks the
    /// replica `approximate`.
    pub silence_timeout_ms: u64,
    /// Wait for each reply of a replay before the replay counts as failed.
    pub replay_timeout_ms: u64,
    /// How often ownership, discovery and the feeds' states are re-checked.
    pub check_interval_ms: u64,
}

impl Default for KvEventsConfig {
    fn default() -> Self {
        Self {
            max_blocks: 1 << 22,
            silence_timeout_ms: 5_000,
            replay_timeout_ms: 2_000,
            check_interval_ms: 250,
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    pub name: String,
    /// How prompts are counted: `cl100k`, `o200k`, `estimate` (the default), or
    /// `hf:/path/to/tokenizer.json`, the served model's own Hugging Face tokenizer,
    /// which makes prompt tokens and prefix blocks exact (checked at startup: a
    /// missing or unreadable file stops the node with its path).
    #[serde(default)]
    pub tokenizer: Option<String>,
    /// The chat template (a Jinja file) for an `hf:` tokenizer. Default: the
    /// `chat_template.jinja` beside `tokenizer.json`, else the `chat_template` field
    /// of the `tokenizer_config.json` beside it (which also gives `bos_token` etc.).
    /// Without any, chat prompts count the messages' text plus 4 tokens a message.
    #[serde(default)]
    pub chat_template: Option<PathBuf>,
}

pub use headroom_core::policy::Fallback;

/// A tenant: who may ask for what.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    pub name: String,
    /// Bearer tokens that identify this tenant.
    #[serde(default)]
    pub api_keys: Vec<String>,
    /// Default objectives.
    #[serde(default = "default_ttft_ms")]
    pub slo_ttft_ms: f64,
    #[serde(default = "default_tpot_ms")]
    pub slo_tpot_ms: f64,
    /// Tightest objectives this tenant may request through headers.
    #[serde(default = "default_min_ttft_ms")]
    pub min_ttft_ms: f64,
    #[serde(default = "default_min_tpot_ms")]
    pub min_tpot_ms: f64,
    /// Higher is more important: the admission band (a higher band's waiters start
    /// first) and the defer queue order.
    #[serde(default)]
    pub priority: i32,
    #[serde(default)]
    pub fallback: Fallback,
    /// Relative share of capacity under overload (equal by default).
    #[serde(default = "default_weight")]
    pub weight: f64,
    /// Requests per minute (0 = unlimited); over it, 429 with `Retry-After`.
    #[serde(default)]
    pub rpm: f64,
    /// Tokens per minute, prompt + expected output (0 = unlimited).
    #[serde(default)]
    pub tpm: f64,
    /// Requests running at once (0 = unlimited); beyond it they wait, then 429.
    #[serde(default)]
    pub max_concurrency: u32,
    /// Continue this tenant's streams on another replica when one breaks them
    /// mid-stream (where the continuation is well defined: `proxy/failover.rs`).
    #[serde(default = "default_failover")]
    pub failover: bool,
}

fn default_weight() -> f64 {
    1.0
}

fn default_failover() -> bool {
    true
}

fn default_ttft_ms() -> f64 {
    2_000.0
}
fn default_tpot_ms() -> f64 {
    100.0
}
fn default_min_ttft_ms() -> f64 {
    50.0
}
fn default_min_tpot_ms() -> f64 {
    5.0
}

impl TenantConfig {
    pub fn default_tenant() -> Self {
        Self {
            name: "default".into(),
            api_keys: Vec::new(),
            slo_ttft_ms: default_ttft_ms(),
            slo_tpot_ms: default_tpot_ms(),
            min_ttft_ms: default_min_ttft_ms(),
            min_tpot_ms: default_min_tpot_ms(),
            priority: 0,
            fallback: Fallback::LeastBad,
            weight: default_weight(),
            rpm: 0.0,
            tpm: 0.0,
            max_concurrency: 0,
            failover: default_failover(),
        }
    }

    /// What the admission gate enforces for this tenant.
    pub fn limits(&self) -> headroom_core::admission::TenantLimits {
        headroom_core::admission::TenantLimits {
            weight: self.weight,
            priority: self.priority,
            rpm: self.rpm,
            tpm: self.tpm,
            max_concurrency: self.max_concurrency,
        }
    }
}

/// Errors loading or validating configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("invalid config {path}: {source}")]
    Parse {
        path: String,
        source: toml::de::Error,
    },
    #[error("invalid config: {0}")]
    Invalid(String),
}

impl RouterConfig {
    /// The configured node id, or one derived from the listen address.
    pub fn node_id(&self) -> String {
        self.node_id
            .clone()
            .unwrap_or_else(|| format!("node-{}", self.listen.port()))
    }

    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        let cfg: RouterConfig = toml::from_str(&text).map_err(|source| ConfigError::Parse {
            path: path.display().to_string(),
            source,
        })?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// The knobs of every policy, for the policy registry.
    pub fn policy_settings(&self) -> PolicySettings {
        PolicySettings {
            slo: self.slo.clone(),
            prefix_affinity: self.prefix_affinity.clone(),
            llmd_predicted: self.llmd_predicted.clone(),
        }
    }

    /// Checks cross-field rules; called by every constructor path.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for r in &self.replicas {
            url::parse_base_url(&r.url).map_err(|e| {
                ConfigError::Invalid(format!("replica `{}`: {e}", url::redact_url(&r.url)))
            })?;
        }
        if self.scrape.interval_ms == 0 || self.health.probe_interval_ms == 0 {
            return Err(ConfigError::Invalid("intervals must be > 0".into()));
        }
        if self.prefix.block_tokens == 0 {
            return Err(ConfigError::Invalid(
                "prefix.block_tokens must be > 0".into(),
            ));
        }
        self.predictor
            .validate()
            .map_err(|e| ConfigError::Invalid(format!("predictor: {e}")))?;
        if self.predictor_publish_ms == 0 {
            return Err(ConfigError::Invalid(
                "predictor_publish_ms must be > 0".into(),
            ));
        }
        for t in &self.tenants {
            let ok = |x: f64| x.is_finite() && x > 0.0;
            if !(ok(t.slo_ttft_ms) && ok(t.slo_tpot_ms) && ok(t.min_ttft_ms) && ok(t.min_tpot_ms)) {
                return Err(ConfigError::Invalid(format!(
                    "tenant `{}`: objectives must be positive and finite",
                    t.name
                )));
            }
        }
        validate::check(self).map_err(ConfigError::Invalid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replica_flag_parses_options() {
        let r = ReplicaConfig::parse_flag("http://127.0.0.1:9,class=h100,max_batched_tokens=8192")
            .unwrap();
        assert_eq!(r.url, "http://127.0.0.1:9");
        assert_eq!(r.class.as_deref(), Some("h100"));
        assert_eq!(r.max_batched_tokens, Some(8192));
        assert!(ReplicaConfig::parse_flag("http://x,bogus=1").is_err());
        let pd = ReplicaConfig::parse_flag("http://x,role=prefill,region=eu-1").unwrap();
        assert_eq!(pd.role, headroom_core::view::Role::Prefill);
        assert_eq!(pd.region.as_deref(), Some("eu-1"));
        let e = ReplicaConfig::parse_flag("http://x,role=decoder").unwrap_err();
        assert!(e.contains("prefill, decode, both"), "{e}");
        assert!(ReplicaConfig::parse_flag("http://x,max_batched_tokens=lots").is_err());
        let prio = ReplicaConfig::parse_flag("http://x,deadline-priority=true").unwrap();
        assert_eq!(prio.deadline_priority, Some(true));
        let e = ReplicaConfig::parse_flag("http://x,deadline_priority=yes").unwrap_err();
        assert!(e.contains("not true or false"), "{e}");
        let k = ReplicaConfig::parse_flag(
            "http://x,kv-events=tcp://10.0.0.5:5557,kv_replay=tcp://10.0.0.5:5558,kv-topic=kv,kv-block-size=32",
        )
        .unwrap();
        assert_eq!(k.kv_events.as_deref(), Some("tcp://10.0.0.5:5557"));
        assert_eq!(k.kv_replay.as_deref(), Some("tcp://10.0.0.5:5558"));
        assert_eq!(k.kv_topic.as_deref(), Some("kv"));
        assert_eq!(k.kv_block_size, Some(32));
        assert!(ReplicaConfig::parse_flag("http://x,kv-block-size=big").is_err());
    }

    #[test]
    fn toml_round_trip_and_unknown_fields_rejected() {
        let text = r#"
            listen = "127.0.0.1:9000"
            policy = "least-request"
            [[replicas]]
            url = "http://127.0.0.1:8001"
            class = "a100"
            [[tenants]]
            name = "chat"
            api_keys = ["k1"]
            slo_ttft_ms = 500
            fallback = "reject"
        "#;
        let cfg: RouterConfig = toml::from_str(text).unwrap();
        cfg.validate().unwrap();
        assert_eq!(cfg.policy, PolicyName::LeastRequest);
        assert_eq!(cfg.tenants[0].fallback, Fallback::Reject);
        assert_eq!(cfg.scrape.interval_ms, 100);
        assert!(toml::from_str::<RouterConfig>("nonsense = 1").is_err());
    }

    /// `[pd] connector`: NIXL by default, the shared-storage flow by name, anything
    /// else refused when the file is read.
    #[test]
    fn the_kv_connector_is_named_or_refused() {
        use headroom_core::pd::KvConnector;
        let cfg: RouterConfig = toml::from_str("").unwrap();
        assert_eq!(cfg.pd.connector, KvConnector::Nixl);
        let cfg: RouterConfig = toml::from_str("[pd]\nconnector = \"shared-storage\"").unwrap();
        assert_eq!(cfg.pd.connector, KvConnector::SharedStorage);
        let e = toml::from_str::<RouterConfig>("[pd]\nconnector = \"lmcache\"").unwrap_err();
        assert!(e.to_string().contains("nixl"), "{e}");
    }
}
