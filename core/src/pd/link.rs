//! The KV transfer between a prefill and a decode replica: a configured model per
//! link, corrected by what each link was measured to take.
//!
//! Model: `t(bytes) = latency + bytes / bandwidth` (s), with `bytes` = the prompt
//! tokens the decode replica does not already hold × the model's KV bytes per token
//! (K and V, every layer: `2 · layers · kv_heads · head_dim · dtype bytes`; 131,072
//! for Llama-3-8B in bf16). A 4,000-token prompt over 10 GB/s is 52 ms plus latency.
//!
//! Learning: per (prefill, decode) link an exponentially weighted mean of
//! `ln(measured / modelled)` (a multiplicative correction, so one number serves
//! latency- and bandwidth-bound transfers) and of the absolute error (s), which
//! widens the bound. Invariant: the table holds at most [`MAX_LINKS`] links; past
//! that a new link keeps the configured model (the table is never a memory leak).

use std::{collections::HashMap, sync::Mutex};

use headroom_predictor::ReplicaKey;

/// Most links learned at once.
pub const MAX_LINKS: usize = 4096;

/// A correction is never taken beyond this factor either way.
const MAX_RATIO: f64 = 50.0;

/// The configured transfer model of every link.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinkModel {
    pub kv_bytes_per_token: f64,
    pub bandwidth_bytes_per_s: f64,
    pub latency_s: f64,
    /// Weight of each new measurement (0..1].
    pub learning_rate: f64,
}

/// One estimate: the expected transfer time and an upper bound (s).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TransferEstimate {
    pub bytes: f64,
    pub seconds: f64,
    pub upper_s: f64,
    /// How many transfers on this link the estimate has learned from.
    pub measured: u32,
}

#[derive(Clone, Copy, Debug, Default)]
struct LinkState {
    log_ratio: f64,
    abs_err_s: f64,
    n: u32,
}

/// The learned links of one node.
#[derive(Debug)]
pub struct Links {
    model: LinkModel,
    table: Mutex<HashMap<(u64, u64), LinkState>>,
}

fn link_key(p: ReplicaKey, d: ReplicaKey) -> (u64, u64) {
    (p.replica, d.replica)
}

impl Links {
    pub fn new(model: LinkModel) -> Self {
        Self {
            model,
            table: Mutex::new(HashMap::new()),
        }
    }

    pub fn model(&self) -> LinkModel {
        self.model
    }

    /// Bytes moved for `tokens` transferred tokens.
    pub fn bytes(&self, tokens: u32) -> f64 {
        f64::from(tokens) * self.model.kv_bytes_per_token
    }

    fn modelled_s(&self, bytes: f64) -> f64 {
        self.model.latency_s + bytes / self.model.bandwidth_bytes_per_s.max(1.0)
    }

    /// Expected time to move `tokens` tokens' KV from `p` to `d`.
    pub fn estimate(&self, p: ReplicaKey, d: ReplicaKey, tokens: u32) -> TransferEstimate {
        let bytes = self.bytes(tokens);
        let base = self.modelled_s(bytes);
        let st = self
            .table
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&link_key(p, d))
            .copied()
            .unwrap_or_default();
        let seconds = base * st.log_ratio.exp();
        TransferEstimate {
            bytes,
            seconds,
            // Unmeasured: the model is trusted within half again its own time.
            upper_s: if st.n == 0 {
                seconds * 1.5
            } else {
                seconds + 2.0 * st.abs_err_s
            },
            measured: st.n,
        }
    }

    /// Learns one measured transfer of `tokens` tokens from `p` to `d`, `seconds`
    /// long. Non-finite or negative measurements are ignored.
    pub fn observe(&self, p: ReplicaKey, d: ReplicaKey, tokens: u32, seconds: f64) {
        if !seconds.is_finite() || seconds < 0.0 {
            return;
        }
        let base = self.modelled_s(self.bytes(tokens));
        if base <= 0.0 {
            return;
        }
        let ratio = (seconds / base).clamp(1.0 / MAX_RATIO, MAX_RATIO);
        let a = self.model.learning_rate.clamp(1e-3, 1.0);
        let mut table = self.table.lock().unwrap_or_else(|e| e.into_inner());
        let len = table.len();
        let key = link_key(p, d);
        if len >= MAX_LINKS && !table.contains_key(&key) {
            return;
        }
        let st = table.entry(key).or_default();
        let before = base * st.log_ratio.exp();
        // The first measurement replaces the prior; later ones move it by `a`.
        let w = if st.n == 0 { 1.0 } else { a };
        st.log_ratio += w * (ratio.ln() - st.log_ratio);
        st.abs_err_s += w * ((seconds - before).abs() - st.abs_err_s);
        st.n = st.n.saturating_add(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model() -> LinkModel {
        LinkModel {
            kv_bytes_per_token: 131_072.0,
            bandwidth_bytes_per_s: 10e9,
            latency_s: 0.001,
            learning_rate: 0.3,
        }
    }

    #[test]
    fn the_model_is_latency_plus_bytes_over_bandwidth() {
        let links = Links::new(model());
        let (p, d) = (ReplicaKey::new(1, 1), ReplicaKey::new(2, 2));
        let e = links.estimate(p, d, 4000);
        // 4000 × 128 KiB = 524 MB over 10 GB/s = 52.4 ms, + 1 ms.
        assert!((e.seconds - 0.053_428_8).abs() < 1e-6, "{e:?}");
        assert_eq!(e.measured, 0);
        assert!(e.upper_s > e.seconds);
    }

    #[test]
    fn a_slow_link_is_learned_and_others_keep_the_model() {
        let links = Links::new(model());
        let (p, d, d2) = (
            ReplicaKey::new(1, 1),
            ReplicaKey::new(2, 2),
            ReplicaKey::new(3, 2),
        );
        // This link runs at a quarter of the configured bandwidth.
        for _ in 0..20 {
            links.observe(p, d, 4000, 4.0 * 0.052_428_8 + 0.001);
        }
        let slow = links.estimate(p, d, 4000).seconds;
        assert!((slow - 0.210_7).abs() < 0.01, "{slow}");
        // It scales with the bytes: half the prompt, about half the time.
        let half = links.estimate(p, d, 2000).seconds;
        assert!(half < 0.6 * slow, "{half} vs {slow}");
        assert!((links.estimate(p, d2, 4000).seconds - 0.053_4).abs() < 1e-3);
        // Garbage is ignored.
        links.observe(p, d2, 4000, f64::NAN);
        links.observe(p, d2, 4000, -1.0);
        assert_eq!(links.estimate(p, d2, 4000).measured, 0);
    }
}
