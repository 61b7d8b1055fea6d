//! A router node, assembled in one place ([`Node::start`]) from two halves:
//! - [`RequestPath`]: what a request needs to be parsed, admitted, decided and
//!   dispatched (config, fleet, prefix index, policy, predictor snapshot, tenants,
//!   tokenizers, admission gate, deferrals, P/D links). Handlers hold an
//!   `Arc<RequestPath>`.
//! - [`Outcomes`]: what a finished request's outcome feeds (trainer, metrics, decision
//!   records, request log, traces, and the mesh for placements). A response body holds
//!   an `Arc<Outcomes>`; the request path holds one to hand on.
//!
//! Build order, so no handle is ever filled in later and nothing points back: fleet
//! (with the mesh's scrape ownership) → KV feeds, trainer, policy → the mesh (which
//! gets the fleet, the KV feeds and the trainer) → outcome sink (which gets the mesh)
//! → request path (which gets the sink). The mesh runtime holds neither half.

mod estimates;
pub mod outcomes;
mod path;

use std::{collections::HashMap, sync::Arc};

use tokio_util::sync::CancellationToken;

pub use estimates::{Estimates, next_text_ratio};
pub use outcomes::{Outcome, OutcomeStatus, Outcomes};
pub use path::{OFFLOAD_HF_TOKENIZE_BYTES, OFFLOAD_TOKENIZE_BYTES, RequestPath};

use crate::{
    config::RouterConfig,
    decisions::DecisionRing,
    fleet::{Fleet, kv_feed::KvFeeds, tasks::ScrapeShare, view::Origin},
    mesh::{self, MeshRuntime},
    metrics::Metrics,
    otel::Traces,
    policy,
    prefix::PrefixIndex,
    request_log::RequestLog,
    tenant::Tenants,
    tokens::Tokenizer,
    trainer::Trainer,
    upstream,
};

/// A started node: its two halves and its mesh, where it joined one.
pub struct Node {
    pub path: Arc<RequestPath>,
    pub outcomes: Arc<Outcomes>,
    pub mesh: Option<Arc<MeshRuntime>>,
}

impl Node {
    /// Builds the node, starts its fleet tasks and, with `mesh.listen` set, joins the
    /// mesh (must run inside a tokio runtime). The one place a node is assembled:
    /// `serve` and the tests go through it.
    pub async fn start(cfg: RouterConfig, cancel: CancellationToken) -> anyhow::Result<Node> {
        cfg.validate()?;
        let cfg = Arc::new(cfg);
        let metrics = Arc::new(Metrics::new());
        let prefix = Arc::new(PrefixIndex::new(cfg.prefix.max_entries));
        let client = upstream::client(cfg.proxy.connect_timeout());
        // The mesh's scrape ownership exists before the fleet, which asks it before
        // every scrape; until the mesh joins, this node owns every replica.
        let scrapes = cfg
            .mesh
            .listen
            .is_some()
            .then(|| mesh::ScrapeShares::new(&cfg.node_id(), cfg.mesh.scrape_owners));
        let share = scrapes
            .as_ref()
            .map(|(s, _)| s.clone() as Arc<dyn ScrapeShare>);
        let fleet = Fleet::new(
            cfg.clone(),
            client,
            metrics.clone(),
            prefix,
            share,
            cancel.child_token(),
        );
        for rc in &cfg.replicas {
            fleet.add(rc, Origin::Static).map_err(anyhow::Error::msg)?;
        }
        fleet.start_discovery();
        let kv = KvFeeds::new(&cfg.kv_events, &cfg.replicas, metrics.registry());
        kv.start(&fleet);
        let mut tokenizers = HashMap::new();
        for m in &cfg.models {
            if let Some(t) = &m.tokenizer {
                let tok = Tokenizer::from_config(t, m.chat_template.as_deref())
                    .map_err(|e| anyhow::anyhow!("model `{}`: {e}", m.name))?;
                tokenizers.insert(m.name.clone(), tok);
            }
        }
        let trainer = Trainer::start(
            cfg.predictor.clone(),
            &cfg.node_id(),
            std::time::Duration::from_millis(cfg.predictor_publish_ms),
            cfg.predictor_state.clone(),
            cfg.predictor_journal.clone(),
        )?;
        let policy = policy::build(cfg.policy, trainer.shared.clone(), &cfg.policy_settings());
        let request_log = match &cfg.request_log {
            Some(p) => Some(RequestLog::open(p, cfg.prefix.block_tokens)?),
            None => None,
        };
        let traces = Traces::start(&cfg.tracing)?;
        let mesh = match scrapes {
            Some(scrapes) => Some(
                MeshRuntime::start(
                    mesh::Local {
                        fleet: fleet.clone(),
                        kv: kv.clone(),
                        trainer: trainer.clone(),
                    },
                    scrapes,
                    cancel.child_token(),
                )
                .await?,
            ),
            None => None,
        };
        let estimates = Arc::new(Estimates::new(tokenizers.keys().cloned()));
        let outcomes = Arc::new(Outcomes {
            metrics,
            trainer: trainer.clone(),
            decision_records: DecisionRing::new(cfg.decision_records),
            request_log,
            traces,
            mesh: mesh.clone(),
            estimates: estimates.clone(),
            health: cfg.health.clone(),
        });
        let tenants = Arc::new(Tenants::from_config(&cfg));
        let path = Arc::new(RequestPath::new(path::Parts {
            cfg,
            fleet,
            kv,
            policy,
            predictor: trainer.shared.clone(),
            tenants,
            tokenizers,
            estimates,
            outcomes: outcomes.clone(),
        }));
        Ok(Node {
            path,
            outcomes,
            mesh,
        })
    }

    /// After the listeners drained: leaves the mesh, stops the fleet's tasks and the
    /// trainer, and sends the spans still queued.
    pub async fn shutdown(self) -> anyhow::Result<()> {
        if let Some(rt) = &self.mesh {
            rt.shutdown().await;
        }
        self.path.fleet.shutdown().await;
        self.outcomes.trainer.shutdown();
        // Blocks on exports that run on this runtime.
        let outcomes = self.outcomes.clone();
        tokio::task::spawn_blocking(move || {
            if let Some(t) = &outcomes.traces {
                t.shutdown();
            }
        })
        .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use rand::RngCore;

    #[tokio::test]
    async fn a_seeded_node_draws_the_same_decisions_again() {
        let start = async |seed| {
            let cfg = crate::config::RouterConfig {
                seed,
                ..Default::default()
            };
            super::Node::start(cfg, tokio_util::sync::CancellationToken::new())
                .await
                .unwrap()
        };
        let draw = |n: &super::Node| -> Vec<u64> {
            (0..4).map(|_| n.path.decision_rng().next_u64()).collect()
        };
        let (a, b) = (start(7).await, start(7).await);
        let first = draw(&a);
        assert_eq!(first, draw(&b), "same seed, same decisions");
        assert_ne!(first[0], first[1], "each decision its own stream");
        assert_ne!(
            draw(&start(0).await),
            draw(&start(0).await),
            "seed 0: from entropy"
        );
    }
}
