//! Deadline priority: the request's TTFT deadline handed to an engine that schedules
//! by priority, so that its queue is served earliest deadline first.
//!
//! Why: vLLM and SGLang serve their waiting queues first come, first served. A request
//! with seconds of slack that arrived just before a tight one is prefilled first, and
//! under a backlog every tight request waits behind every loose one. The router knows
//! each request's objective; an engine started with priority scheduling (vLLM
//! `--scheduling-policy priority`, SGLang `--enable-priority-scheduling
//! --schedule-low-priority-values-first`) orders its waiting queue by `priority`, lowest
//! first, and when short of KV preempts the running request with the highest. Setting
//! `priority` to the deadline makes that earliest deadline first, a request's place
//! fixed at arrival, so a loose request still runs once its deadline is the earliest.
//!
//! The deadline is `arrival + TTFT objective` in Unix milliseconds: one axis for every
//! router node in front of the engine (their clocks' skew shifts their requests' order
//! by as much). A client's own `priority` is never replaced. Costs one copy of the body
//! per attempt on such a replica (the member is inserted first, the rest byte for byte).

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use bytes::{BufMut, Bytes, BytesMut};

use crate::{config::ProxyConfig, fleet::Replica};

/// The request's TTFT deadline in Unix milliseconds: `arrived` on the wall clock plus
/// the objective. `None` for a client that set its own `priority`.
pub fn deadline_ms(arrived: Instant, ttft_objective_ms: f64, client_priority: bool) -> Option<i64> {
    if client_priority {
        return None;
    }
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .ok()?
        .as_millis() as i64;
    let since = arrived.elapsed().as_millis() as i64;
    let objective = if ttft_objective_ms.is_finite() {
        ttft_objective_ms.clamp(0.0, 1e12) as i64
    } else {
        0
    };
    Some(now - since + objective)
}

/// Whether `r`'s engine takes a deadline priority: its own setting, else the node's.
pub fn enabled(r: &Replica, cfg: &ProxyConfig) -> bool {
    r.deadline_priority.unwrap_or(cfg.deadline_priority)
}

/// The body to send `r`: with `"priority":deadline` as its first member where `r`
/// takes one and the request has a deadline; else `body` itself (no copy).
pub fn body_for(r: &Replica, cfg: &ProxyConfig, body: &Bytes, deadline: Option<i64>) -> Bytes {
    match deadline {
        Some(d) if enabled(r, cfg) => with_priority(body, d),
        _ => body.clone(),
    }
}

/// `body` (a JSON object, validated by the parser) with `"priority":p` inserted as its
/// first member. JSON parsers take the last of duplicate keys, but the parser reported
/// no `priority` for such requests, so there is no other.
pub fn with_priority(body: &Bytes, p: i64) -> Bytes {
    let Some(open) = body.iter().position(|&b| b == b'{') else {
        return body.clone();
    };
    let member = format!("\"priority\":{p}");
    let empty = body[open + 1..]
        .iter()
        .find(|b| !b.is_ascii_whitespace())
        .is_none_or(|&b| b == b'}');
    let mut out = BytesMut::with_capacity(body.len() + member.len() + 1);
    out.put_slice(&body[..=open]);
    out.put_slice(member.as_bytes());
    if !empty {
        out.put_u8(b',');
    }
    out.put_slice(&body[open + 1..]);
    out.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    #[test]
    fn the_priority_is_added_and_the_rest_kept_byte_for_byte() {
        let body = Bytes::from_static(br#" {"model":"m","prompt":"a\u00e9 {","stream":true}"#);
        let out = with_priority(&body, 1_733_000_000_123);
        assert_eq!(
            &out[..],
            br#" {"priority":1733000000123,"model":"m","prompt":"a\u00e9 {","stream":true}"#
        );
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["priority"], 1_733_000_000_123_i64);
    }

    #[test]
    fn an_empty_object_gets_no_stray_comma() {
        let out = with_priority(&Bytes::from_static(b"{ }"), -5);
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["priority"], -5);
    }

    #[test]
    fn the_deadline_is_arrival_plus_the_objective_on_the_wall_clock() {
        let arrived = Instant::now() - std::time::Duration::from_millis(300);
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        let d = deadline_ms(arrived, 500.0, false).unwrap();
        // Arrived 300 ms ago with 500 ms to its first token: due in about 200 ms.
        assert!((d - (now + 200)).abs() <= 50, "deadline {d}, now {now}");
        assert_eq!(deadline_ms(arrived, 500.0, true), None);
        // An absurd objective cannot overflow.
        assert!(deadline_ms(arrived, f64::INFINITY, false).is_some());
    }
}
