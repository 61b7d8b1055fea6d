//! The emulator's part in disaggregated serving, in vLLM's NixlConnector shapes.
//!
//! A prefill request carries `kv_transfer_params: {"do_remote_decode": true, ...}`
//! (with `max_tokens: 1`, `stream: false`); its response carries what the decode
//! side needs to pull the KV: `do_remote_prefill: true`, `remote_engine_id`,
//! `remote_request_id`, `remote_block_ids`, `remote_host`, `remote_port`,
//! `tp_size`, `remote_num_tokens` (vLLM's `NixlConnectorScheduler.request_finished`).
//! A decode request carries those params back; the emulated decode engine then
//! receives the prompt's full blocks into its prefix cache (skipping their prefill)
//! after waiting the transfer time of the blocks it did not already hold:
//!
//! `t = latency + blocks_pulled × block_size × kv_bytes_per_token / bandwidth`
//! (modelled seconds, scaled by the replica's time scale like every other duration).
//!
//! A role refuses the params it does not serve with 400 (`decode` takes no
//! `do_remote_decode`, `prefill` no `do_remote_prefill`), so a router that mixes up
//! the stages is caught; both roles serve plain requests whole.

use headroom_core::view::Role;
use serde_json::{Value, json};

use super::api_error::ApiError;

/// vLLM's default NIXL side-channel port (`VLLM_NIXL_SIDE_CHANNEL_PORT`).
pub const SIDE_CHANNEL_PORT: u16 = 5600;

/// How this replica takes part in P/D serving, and its transfer model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PdEmulation {
    pub role: Role,
    /// KV bytes per token of the served model (K and V, all layers).
    pub kv_bytes_per_token: f64,
    /// P→D link bandwidth (GB/s).
    pub transfer_gbytes_per_s: f64,
    /// P→D link latency (ms).
    pub transfer_latency_ms: f64,
}

impl Default for PdEmulation {
    fn default() -> Self {
        Self {
            role: Role::Both,
            kv_bytes_per_token: 131_072.0,
            transfer_gbytes_per_s: 10.0,
            transfer_latency_ms: 1.0,
        }
    }
}

impl PdEmulation {
    pub fn validate(&self) -> Result<(), String> {
        let ok = |v: f64| v.is_finite() && v >= 0.0;
        if !(ok(self.kv_bytes_per_token) && self.kv_bytes_per_token > 0.0) {
            return Err("kv bytes per token must be > 0".into());
        }
        if !(ok(self.transfer_gbytes_per_s) && self.transfer_gbytes_per_s > 0.0) {
            return Err("transfer bandwidth must be > 0 GB/s".into());
        }
        if !ok(self.transfer_latency_ms) {
            return Err("transfer latency must be >= 0 ms".into());
        }
        Ok(())
    }

    /// Modelled seconds to pull `tokens` tokens' KV.
    pub fn transfer_s(&self, tokens: u32) -> f64 {
        self.transfer_latency_ms / 1e3
            + f64::from(tokens) * self.kv_bytes_per_token / (self.transfer_gbytes_per_s * 1e9)
    }
}

/// What a request's `kv_transfer_params` asks of this replica.
#[derive(Clone, Debug, PartialEq)]
pub enum KvTransfer {
    /// Prefill here and keep the KV for a remote decode.
    Prefill,
    /// Decode here from a remote prefill of `remote_num_tokens` tokens.
    Decode { remote_num_tokens: Option<u32> },
}

/// Reads `kv_transfer_params` (absent or null: a plain request).
pub fn parse(body: &Value) -> Result<Option<KvTransfer>, ApiError> {
    let bad = |m: &str| ApiError::bad_param("kv_transfer_params", m);
    let p = match body.get("kv_transfer_params") {
        None | Some(Value::Null) => return Ok(None),
        Some(p @ Value::Object(_)) => p,
        Some(_) => return Err(bad("`kv_transfer_params` must be an object")),
    };
    let flag = |k: &str| p.get(k).and_then(Value::as_bool).unwrap_or(false);
    match (flag("do_remote_decode"), flag("do_remote_prefill")) {
        (true, true) => Err(bad(
            "do_remote_decode and do_remote_prefill cannot both be true",
        )),
        (true, false) => Ok(Some(KvTransfer::Prefill)),
        (false, true) => {
            for k in [
                "remote_engine_id",
                "remote_request_id",
                "remote_host",
                "remote_port",
            ] {
                if p.get(k).is_none_or(Value::is_null) {
                    return Err(bad(&format!(
                        "do_remote_prefill needs `{k}` (the prefill response's kv_transfer_params)"
                    )));
                }
            }
            let remote_num_tokens = p
                .get("remote_num_tokens")
                .and_then(Value::as_u64)
                .map(|n| u32::try_from(n).unwrap_or(u32::MAX));
            Ok(Some(KvTransfer::Decode { remote_num_tokens }))
        }
        (false, false) => Ok(None),
    }
}

/// 400 when this role does not serve the stage asked for.
pub fn check_role(role: Role, t: &KvTransfer) -> Result<(), ApiError> {
    let refused = match t {
        KvTransfer::Prefill => role == Role::Decode,
        KvTransfer::Decode { .. } => role == Role::Prefill,
    };
    if refused {
        return Err(ApiError::bad_param(
            "kv_transfer_params",
            format!(
                "this replica's role is {}: it does not serve {}",
                role.as_str(),
                match t {
                    KvTransfer::Prefill => "do_remote_decode (prefill for a remote decode)",
                    KvTransfer::Decode { .. } => "do_remote_prefill (decode from a remote prefill)",
                }
            ),
        ));
    }
    Ok(())
}

/// The params a prefill response returns for its decode.
pub fn prefill_response_params(
    engine_id: &str,
    request_id: &str,
    blocks: usize,
    prompt_tokens: u32,
) -> Value {
    json!({
        "do_remote_prefill": true,
        "do_remote_decode": false,
        "remote_block_ids": (0..blocks as u64).collect::<Vec<_>>(),
        "remote_engine_id": engine_id,
        "remote_request_id": request_id,
        "remote_host": "127.0.0.1",
        "remote_port": SIDE_CHANNEL_PORT,
        "tp_size": 1,
        "remote_num_tokens": prompt_tokens,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_both_stages_and_refuses_the_wrong_role() {
        let p = parse(&json!({"kv_transfer_params": {"do_remote_decode": true}})).unwrap();
        assert_eq!(p, Some(KvTransfer::Prefill));
        assert!(check_role(Role::Decode, &KvTransfer::Prefill).is_err());
        assert!(check_role(Role::Both, &KvTransfer::Prefill).is_ok());
        let back = prefill_response_params("e", "r", 3, 50);
        let d = parse(&json!({ "kv_transfer_params": back })).unwrap();
        assert_eq!(
            d,
            Some(KvTransfer::Decode {
                remote_num_tokens: Some(50)
            })
        );
        assert!(check_role(Role::Prefill, d.as_ref().unwrap()).is_err());
        assert_eq!(parse(&json!({})).unwrap(), None);
        // A decode without the prefill's answer is the router's mistake: 400.
        let e = parse(&json!({"kv_transfer_params": {"do_remote_prefill": true}})).unwrap_err();
        assert_eq!(e.status.as_u16(), 400);
        assert!(parse(&json!({"kv_transfer_params": 3})).is_err());
    }

    #[test]
    fn transfer_time_is_latency_plus_bytes_over_bandwidth() {
        let m = PdEmulation::default();
        // 4096 tokens × 128 KiB over 10 GB/s = 53.7 ms, + 1 ms.
        assert!((m.transfer_s(4096) - 0.054_687).abs() < 1e-5);
        assert!(
            PdEmulation {
                transfer_gbytes_per_s: 0.0,
                ..m
            }
            .validate()
            .is_err()
        );
    }
}
