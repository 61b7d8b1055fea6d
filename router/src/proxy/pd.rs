//! The disaggregated (prefill/decode) flow, in vLLM's NixlConnector shapes.
//!
//! 1. Prefill on P: the client's body with `kv_transfer_params: {"do_remote_decode":
//!    true, ...}`, `max_tokens` (and `max_completion_tokens`) 1, `stream: false`, no
//!    `stream_options`. P answers JSON whose `kv_transfer_params` say where the KV is
//!    (`remote_engine_id`, `remote_block_ids`, `remote_host`, `remote_port`, ...).
//! 2. Decode on D: the client's body as sent, plus those `kv_transfer_params`; D pulls
//!    the KV and streams (or returns) the answer to the client.
//!
//! Both requests carry one `X-Request-Id` (the client's, else one made here). The
//! response names D in `x-headroom-replica` and P in `x-headroom-prefill-replica`;
//! its prediction headers are the pair's (TTFT end to end, TPOT on D).
//!
//! Failures lose nothing: nothing reaches the client before D's first byte. P fails
//! (connect, 5xx/429, timeout, no `kv_transfer_params`) → the next P. D fails before
//! its first byte → the next D, with the same params when D was never reached
//! (`connect`: the KV still waits on P), else after prefilling again (D may have
//! pulled the blocks, and P freed them). After D's first byte a broken stream fails
//! over as any stream does (`failover.rs`: a unified continuation). When every P or
//! every D failed, the client gets one clear error.
//!
//! Learning: P's response time is its TTFT label (its model, one output token); D
//! learns TPOT only; the link learns `D's first byte − D's first-step forecast` as
//! the transfer time of the planned pair (streams only: a whole response's first byte
//! is its last).

use std::{collections::HashSet, sync::Arc, time::Instant};

use axum::body::Body as AxumBody;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use rand::Rng;
use serde_json::{Value, json};

use headroom_core::{
    pd::{self, KvConnector, PdInputs, PdPlan},
    policy::Fallback,
    view::Role,
};

use super::{Replicas, Send, Sent, Target, all_failed, send, upstream_request};
use crate::{
    PREFILL_REPLICA_HEADER, clock,
    decide::RoutedTarget,
    error::ApiError,
    fleet::Signal,
    lifecycle::{self, Reported},
    node::RequestPath,
    otel::RequestTrace,
    policy::RequestProfile,
    request::ParsedRequest,
};

/// Largest prefill response read (it holds one token and the params).
const MAX_PREFILL_RESPONSE_BYTES: usize = 1 << 20;

/// The P/D decision for `profile`, when the fleet has prefill replicas and the
/// request is better disaggregated; `None`: route it unified.
pub fn choose(
    path: &RequestPath,
    profile: &RequestProfile,
) -> Result<Option<(PdPlan, Replicas)>, ApiError> {
    let replicas = path.fleet.replicas();
    if !replicas.iter().any(|r| r.role == Role::Prefill) {
        return Ok(None);
    }
    let inputs = super::route_inputs(path, &replicas);
    let mut rng = path.decision_rng();
    let pd_inputs = PdInputs {
        cfg: &path.cfg.pd,
        slo: &path.cfg.slo,
        links: &path.pd_links,
    };
    let Some(plan) = pd::plan(&inputs, &pd_inputs, profile, clock::now_s(), &mut rng)? else {
        return Ok(None);
    };
    if let Some(kind) = plan.fallback {
        path.metrics.fallbacks.with_label_values(&[kind]).inc();
    }
    if plan.eval.tier > 0
        && profile.fallback == Fallback::Reject
        && plan.eval.p_violate >= path.cfg.slo.reject_above
    {
        path.metrics.rejected.with_label_values(&["no_fit"]).inc();
        let no = pd::no_fit(&plan, profile);
        return Err(ApiError::no_fit(&no));
    }
    Ok(Some((plan, replicas)))
}

/// The prefill stage's body: one token, not streamed, asking P to keep the KV (with
/// the NixlConnector; a shared-storage P stores it unasked).
pub fn prefill_body(client: &Value, connector: KvConnector) -> Value {
    let mut v = client.clone();
    if let Some(o) = v.as_object_mut() {
        if connector == KvConnector::Nixl {
            o.insert(
                "kv_transfer_params".into(),
                json!({
                    "do_remote_decode": true,
                    "do_remote_prefill": false,
                    "remote_engine_id": null,
                    "remote_block_ids": null,
                    "remote_host": null,
                    "remote_port": null,
                }),
            );
        }
        o.insert("stream".into(), Value::Bool(false));
        o.remove("stream_options");
        o.remove("min_tokens");
        o.insert("max_tokens".into(), json!(1));
        if o.contains_key("max_completion_tokens") {
            o.insert("max_completion_tokens".into(), json!(1));
        }
    }
    v
}

/// The decode stage's body: the client's, with P's `kv_transfer_params` (none with a
/// shared-storage connector: `params` is null).
pub fn decode_body(client: &Value, params: &Value) -> Value {
    let mut v = client.clone();
    if let Some(o) = v.as_object_mut()
        && !params.is_null()
    {
        o.insert("kv_transfer_params".into(), params.clone());
    }
    v
}

fn to_bytes(v: &Value) -> Bytes {
    Bytes::from(serde_json::to_vec(v).unwrap_or_default())
}

fn targets(replicas: &Replicas, ts: &[RoutedTarget]) -> Vec<Target> {
    ts.iter()
        .filter_map(|t| {
            replicas.get(t.index).map(|r| Target {
                replica: r.clone(),
                routed: t.clone(),
            })
        })
        .collect()
}

/// Why no prefill produced params.
enum PrefillEnd {
    /// The client's mistake (4xx): passed through as P said it.
    Client(Response<AxumBody>),
    /// Every prefill replica failed.
    Failed(&'static str),
}

/// Runs the prefill on the first of `prefills` that answers (skipping those in
/// `failed`): its index and the `kv_transfer_params` it returned.
async fn prefill(
    path: &Arc<RequestPath>,
    parsed: &ParsedRequest,
    profile: &RequestProfile,
    prefills: &[Target],
    failed: &mut HashSet<usize>,
    (body, headers, deadline): (&Bytes, &HeaderMap, Option<i64>),
    record: Option<u64>,
) -> Result<(usize, Value), PrefillEnd> {
    let mut last = "no prefill replica";
    let connector = path.cfg.pd.connector;
    for (i, t) in prefills.iter().enumerate() {
        if failed.contains(&i) {
            continue;
        }
        let r = &t.replica;
        let mut booking = lifecycle::book(r.as_ref(), profile, &t.routed, clock::now_s());
        let body = super::priority::body_for(r, &path.cfg.proxy, body, deadline);
        let req = upstream_request(r, parsed.endpoint, &body, headers)
            .map_err(|_| PrefillEnd::Failed("request"))?;
        let dispatched = Instant::now();
        let answer = tokio::time::timeout(path.cfg.proxy.first_byte_timeout(), async {
            let resp = path
                .fleet
                .client
                .request(req)
                .await
                .map_err(|e| crate::upstream::connect_failure(&e))?;
            let status = resp.status();
            let (parts, body) = resp.into_parts();
            let bytes = Limited::new(body, MAX_PREFILL_RESPONSE_BYTES)
                .collect()
                .await
                .map_err(|_| "reset_before_first_byte")?
                .to_bytes();
            Ok::<_, &'static str>((status, parts.headers, bytes))
        })
        .await
        .unwrap_or(Err("first_byte_timeout"));
        let why = match answer {
            Err(why) => why,
            Ok((status, _, _)) if status == StatusCode::TOO_MANY_REQUESTS => "429",
            Ok((status, _, _)) if status.is_server_error() => "5xx",
            Ok((status, h, bytes)) if !status.is_success() => {
                // The client's mistake: the decode replica would say the same.
                let mut out = Response::new(AxumBody::from(bytes));
                *out.status_mut() = status;
                if let Some(ct) = h.get(http::header::CONTENT_TYPE) {
                    out.headers_mut()
                        .insert(http::header::CONTENT_TYPE, ct.clone());
                }
                out.headers_mut()
                    .insert(PREFILL_REPLICA_HEADER, super::replica_header(r));
                return Err(PrefillEnd::Client(out));
            }
            Ok((_, _, bytes)) => {
                let v: Option<Value> = serde_json::from_slice(&bytes).ok();
                // With a shared-storage connector D finds the KV by the prompt's hash:
                // any JSON answer is a done prefill, and D gets no params.
                let params = match connector {
                    KvConnector::Nixl => v
                        .as_ref()
                        .and_then(|v| v.get("kv_transfer_params"))
                        .filter(|p| p.is_object())
                        .cloned(),
                    KvConnector::SharedStorage => v.as_ref().map(|_| Value::Null),
                };
                match params {
                    None => "no_kv_transfer_params",
                    Some(params) => {
                        let now_s = clock::now_s();
                        booking.first_token(now_s);
                        booking.complete();
                        let usage = v.as_ref().and_then(|v| v.get("usage"));
                        let n = |p: &[&str]| {
                            let mut x = usage?;
                            for k in p {
                                x = x.get(k)?;
                            }
                            x.as_u64().and_then(|n| u32::try_from(n).ok())
                        };
                        path.outcomes.learn_first_token(
                            &t.routed.learn,
                            dispatched.elapsed().as_secs_f64(),
                            Reported {
                                prompt_tokens: n(&["prompt_tokens"]),
                                cached_tokens: n(&["prompt_tokens_details", "cached_tokens"]),
                            },
                        );
                        path.remember_prefix(r, profile, &t.routed);
                        r.health
                            .on_success(Signal::Request, clock::now_ms(), &path.cfg.health);
                        return Ok((i, params));
                    }
                }
            }
        };
        // This prefill replica failed: the next one, never the client's problem.
        failed.insert(i);
        last = why;
        path.records()
            .update(record, |d| d.retries.push((r.name.clone(), why)));
        super::attempt_failed(path, r, why);
    }
    Err(PrefillEnd::Failed(last))
}

/// Serves one disaggregated request: prefill on P, decode on D (see the module docs).
pub async fn forward(
    path: Arc<RequestPath>,
    (parsed, profile, mut headers): (ParsedRequest, RequestProfile, HeaderMap),
    (arrived, failover, record): (Instant, bool, Option<u64>),
    plan: PdPlan,
    replicas: Replicas,
    trace: &mut Option<Box<RequestTrace>>,
) -> Result<Response<AxumBody>, ApiError> {
    // The router's wait before the pair was planned: the client's clock ran meanwhile.
    let waited_ms = arrived.elapsed().as_secs_f64() * 1e3;
    let request_id = headers
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty())
        .map(str::to_string)
        .unwrap_or_else(|| format!("headroom-pd-{:032x}", rand::rng().random::<u128>()));
    if let Ok(v) = HeaderValue::from_str(&request_id) {
        headers.insert("x-request-id", v);
    }
    let client: Value = serde_json::from_slice(&parsed.upstream_body)
        .map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))?;
    let pre_body = to_bytes(&prefill_body(&client, path.cfg.pd.connector));
    let pre_profile = pd::prefill_profile(&profile);
    let prefills = targets(&replicas, &plan.prefill);
    let decodes = targets(&replicas, &plan.decode);
    let mut failed_p = HashSet::new();
    // Params from a prefill whose KV no decode has taken yet.
    let mut held: Option<(usize, Value)> = None;
    let mut last_reason = "no decode replica";
    let mut last_error = None;
    let deadline =
        super::priority::deadline_ms(arrived, profile.slo.ttft_ms, parsed.client_priority);
    for (k, d) in decodes.iter().enumerate() {
        let (pi, params) = match held.take() {
            Some(h) => h,
            None => match prefill(
                &path,
                &parsed,
                &pre_profile,
                &prefills,
                &mut failed_p,
                (&pre_body, &headers, deadline),
                record,
            )
            .await
            {
                Ok(x) => x,
                Err(PrefillEnd::Client(resp)) => return Ok(resp),
                Err(PrefillEnd::Failed(why)) => {
                    path.records()
                        .note_end(record, format!("every prefill replica failed ({why})"));
                    let mut e =
                        ApiError::upstream(format!("every prefill replica tried failed ({why})"));
                    e.replica = prefills.last().map(|t| t.replica.name.to_string());
                    return Err(e);
                }
            },
        };
        let body = to_bytes(&decode_body(&client, &params));
        let how = Send {
            body: &body,
            headers: &headers,
            arrived,
            failover,
            record,
            fallback: plan.fallback,
            ttft_learned: true,
            deadline,
        };
        let started = Instant::now();
        // The decode stage carries the trace (P/D's prefill stage has no span of its own).
        match send(
            &path,
            &parsed,
            &profile,
            std::slice::from_ref(d),
            &how,
            trace,
        )
        .await?
        {
            Sent::Response(mut out) => {
                // D holds the whole prompt now (the transfer filled its cache): the
                // index learns every block, not only those past its estimate.
                if out.status().is_success() {
                    let whole = RoutedTarget {
                        cached_tokens: 0,
                        ..d.routed.clone()
                    };
                    path.remember_prefix(&d.replica, &profile, &whole);
                }
                let planned = k == 0 && pi == 0;
                if planned && parsed.stream && out.status().is_success() {
                    let d_pred = &d.routed.learn.prediction;
                    let step_s = if d_pred.tpot_state == headroom_predictor::ModelState::Warm {
                        d_pred.tpot_ms / 1e3
                    } else {
                        0.0
                    };
                    path.pd_links.observe(
                        prefills[pi].routed.learn.key,
                        d.routed.learn.key,
                        plan.transfer_tokens,
                        (started.elapsed().as_secs_f64() - step_s).max(0.0),
                    );
                }
                let h = out.headers_mut();
                h.insert(
                    PREFILL_REPLICA_HEADER,
                    super::replica_header(&prefills[pi].replica),
                );
                if path.cfg.prediction_headers {
                    pair_headers(h, &plan, planned, waited_ms);
                }
                return Ok(out);
            }
            Sent::Failed {
                reason,
                last_error: e,
            } => {
                last_reason = reason;
                last_error = e;
                // Never reached: the KV still waits on P for the next decode replica.
                if reason == "connect" || reason == crate::upstream::LOCAL_EXHAUSTED {
                    held = Some((pi, params));
                }
            }
        }
    }
    all_failed(&path, record, last_reason, last_error, decodes.last())
}

/// The pair's forecast in the prediction headers (the planned pair's, plus the router's
/// wait before it was planned; a retried pair keeps D's TPOT and drops the TTFT it was
/// not planned with).
fn pair_headers(h: &mut HeaderMap, plan: &PdPlan, planned: bool, waited_ms: f64) {
    let put = |h: &mut HeaderMap, k: &'static str, v: f64| {
        if let Ok(v) = HeaderValue::from_str(&format!("{v:.1}")) {
            h.insert(k, v);
        }
    };
    if planned {
        put(
            h,
            "x-headroom-predicted-ttft-ms",
            waited_ms + plan.prediction.ttft_ms,
        );
        put(
            h,
            "x-headroom-predicted-ttft-upper-ms",
            waited_ms + plan.prediction.ttft_upper_ms,
        );
        put(
            h,
            "x-headroom-predicted-transfer-ms",
            plan.transfer.seconds * 1e3,
        );
    } else {
        h.remove("x-headroom-predicted-ttft-ms");
        h.remove("x-headroom-predicted-ttft-upper-ms");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_two_stage_bodies_have_vllms_shapes() {
        let client = json!({
            "model": "m", "messages": [{"role": "user", "content": "hi"}],
            "max_completion_tokens": 64, "max_tokens": 64, "min_tokens": 8,
            "stream": true, "stream_options": {"include_usage": true},
        });
        let p = prefill_body(&client, KvConnector::Nixl);
        assert_eq!(p["kv_transfer_params"]["do_remote_decode"], true);
        assert_eq!(p["kv_transfer_params"]["do_remote_prefill"], false);
        assert!(p["kv_transfer_params"]["remote_engine_id"].is_null());
        assert_eq!(
            (p["max_tokens"].clone(), p["max_completion_tokens"].clone()),
            (json!(1), json!(1))
        );
        assert_eq!(p["stream"], false);
        assert!(p.get("stream_options").is_none() && p.get("min_tokens").is_none());
        assert_eq!(p["messages"], client["messages"]);
        // The decode gets the client's request untouched, plus P's params.
        let params =
            json!({"do_remote_prefill": true, "remote_engine_id": "e", "remote_block_ids": [1, 2]});
        let d = decode_body(&client, &params);
        assert_eq!(d["kv_transfer_params"], params);
        let mut back = d.clone();
        back.as_object_mut().unwrap().remove("kv_transfer_params");
        assert_eq!(back, client);
        // Shared storage: one token and not streamed, but no params either way (D finds
        // the KV by the prompt's hash).
        let p = prefill_body(&client, KvConnector::SharedStorage);
        assert!(p.get("kv_transfer_params").is_none());
        assert_eq!(
            (p["max_tokens"].clone(), p["stream"].clone()),
            (json!(1), json!(false))
        );
        assert_eq!(decode_body(&client, &Value::Null), client);
    }
}
