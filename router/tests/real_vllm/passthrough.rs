//! Test 1: completions and chat, whole and streamed, pass through the router intact,
//! and the router counts tokens (not chunks) when vLLM packs several into one chunk.

use serde_json::{Value, json};

use super::{
    harness::{Env, RouterProc, metric, metrics_when, post, stream},
    prompts,
    requests::{body, chunk_shapes, path, replica_url, shape, streaming},
};

/// Output tokens of the streamed checks, and how many vLLM packs into each chunk
/// after the first: 9 chunks for 97 tokens. A stream that long (0.3-1 s here) keeps
/// scheduling jitter of the router and the client (tens of ms on a busy machine) small
/// against the 12x error that counting chunks instead of tokens would make.
const N: u32 = 97;
const STREAM_INTERVAL: u32 = 12;

/// Router-measured TPOT of the one request just finished on `replica` (histogram sum
/// and count before and after), in seconds.
async fn router_tpot_of_one(r: &RouterProc, replica: &str, before: &str) -> f64 {
    let want = [("replica", replica)];
    let sum0 = metric(before, "headroom_tpot_seconds_sum", &want).unwrap_or(0.0);
    let n0 = metric(before, "headroom_tpot_seconds_count", &want).unwrap_or(0.0);
    let after = metrics_when(r, |m| {
        metric(m, "headroom_tpot_seconds_count", &want).unwrap_or(0.0) >= n0 + 1.0
    })
    .await;
    let n1 = metric(&after, "headroom_tpot_seconds_count", &want).unwrap_or(0.0);
    assert_eq!(n1, n0 + 1.0, "the router recorded one TPOT for the stream");
    metric(&after, "headroom_tpot_seconds_sum", &want).unwrap_or(0.0) - sum0
}

/// The same streamed request through the router and directly to the server it chose.
pub async fn stream_pair(
    env: &Env,
    r: &RouterProc,
    chat: bool,
    usage: bool,
) -> (super::harness::Streamed, super::harness::Streamed, String) {
    let mut b = streaming(body(chat, &prompts::text("t1-stream", 3, 60), N), usage);
    // vLLM's per-request `stream_interval`.
    b["stream_interval"] = json!(STREAM_INTERVAL);
    let via = stream(&r.url(path(chat)), &b, &[]).await;
    assert!(via.ok(), "via router: {via:?}");
    let name = via.replica.clone().expect("x-headroom-replica");
    let direct = stream(
        &format!("{}{}", replica_url(env, &name), path(chat)),
        &b,
        &[],
    )
    .await;
    assert!(direct.ok(), "direct: {direct:?}");
    (via, direct, name)
}

/// Client-side spread below which a stream counts as delivered in one burst (the
/// busy machine made the server flush it at once): timing says nothing then.
const MIN_SPREAD_S: f64 = 0.15;

async fn check_stream(env: &Env, r: &RouterProc, chat: bool, usage: bool) {
    let what = format!(
        "{} stream, usage {}",
        if chat { "chat" } else { "completion" },
        if usage { "asked" } else { "not asked" }
    );
    let mut attempt = 0;
    let (before, via, direct, name) = loop {
        let before = r.metrics().await;
        let (via, direct, name) = stream_pair(env, r, chat, usage).await;
        let spread = via.last_content_s.unwrap_or(0.0) - via.first_content_s.unwrap_or(0.0);
        attempt += 1;
        if spread >= MIN_SPREAD_S || attempt == 10 {
            break (before, via, direct, name);
        }
        println!(
            "{what}: stream arrived in a burst ({:.1} ms), again",
            spread * 1e3
        );
    };
    assert!(via.content_type.starts_with("text/event-stream"), "{what}");
    assert_eq!(
        chunk_shapes(&via, false),
        chunk_shapes(&direct, false),
        "{what}: chunk structure differs from direct"
    );
    assert_eq!(
        via.data.last().map(String::as_str),
        Some("[DONE]"),
        "{what}"
    );
    assert!(
        via.content_events < N,
        "{what}: expected multi-token chunks, got {} chunks for {N} tokens",
        via.content_events
    );
    if usage {
        assert_eq!(via.usage_events, 1, "{what}: one usage chunk");
        assert_eq!(direct.usage_events, 1, "{what}: direct usage chunk");
        let u = via.usage.as_ref().expect("usage");
        assert_eq!(u["completion_tokens"], N, "{what}: usage");
        assert_eq!(
            u["prompt_tokens"],
            direct.usage.as_ref().expect("usage")["prompt_tokens"],
            "{what}: prompt tokens"
        );
        let last: Value = serde_json::from_str(&via.data[via.data.len() - 2]).expect("json");
        assert_eq!(last["choices"], json!([]), "{what}: usage chunk is last");
    } else {
        assert_eq!(
            via.usage_events, 0,
            "{what}: usage chunk leaked to the client"
        );
        assert!(!via.raw.contains("\"usage\""), "{what}: usage field leaked");
        assert_eq!(direct.usage_events, 0, "{what}: direct");
    }
    // The router counted N tokens: its TPOT over the stream equals the client's.
    let spread = via.last_content_s.unwrap_or(0.0) - via.first_content_s.unwrap_or(0.0);
    assert!(
        spread >= MIN_SPREAD_S,
        "{what}: every attempt arrived in one burst"
    );
    let client_tpot = spread / (N - 1) as f64;
    let router_tpot = router_tpot_of_one(r, &name, &before).await;
    let ratio = router_tpot / client_tpot;
    println!(
        "{what}: {} chunks for {N} tokens on {name}; TPOT router {:.2} ms vs client {:.2} ms (ratio {ratio:.2}); text same as direct: {}",
        via.content_events,
        router_tpot * 1e3,
        client_tpot * 1e3,
        via.text() == direct.text(),
    );
    // Counting chunks instead of tokens would make the ratio (N-1)/(chunks-1) ≈ 12.
    assert!(
        (0.6..1.6).contains(&ratio),
        "{what}: the router's TPOT ({router_tpot:.4} s) disagrees with the client's ({client_tpot:.4} s)"
    );
}

/// A whole (non-streamed) request through the router and directly; returns the
/// replica name.
pub async fn whole_pair(env: &Env, r: &RouterProc, chat: bool) -> String {
    let kind = if chat { "chat" } else { "completion" };
    let b = body(chat, &prompts::text("t1-whole", 1, 80), 24);
    let via = post(&r.url(path(chat)), &b, &[]).await;
    assert_eq!(via.status, 200, "{kind}: {:?}", via.body);
    let name = via.replica.clone().expect("x-headroom-replica");
    let direct = post(
        &format!("{}{}", replica_url(env, &name), path(chat)),
        &b,
        &[],
    )
    .await;
    assert_eq!(direct.status, 200, "{kind}: direct {:?}", direct.body);
    assert_eq!(via.content_type, direct.content_type, "{kind}");
    assert_eq!(
        shape(&via.body),
        shape(&direct.body),
        "{kind}: body structure"
    );
    assert_eq!(via.body["object"], direct.body["object"], "{kind}");
    assert_eq!(via.body["choices"][0]["finish_reason"], "length", "{kind}");
    assert_eq!(via.body["usage"]["completion_tokens"], 24, "{kind}");
    assert_eq!(
        via.body["usage"]["prompt_tokens"], direct.body["usage"]["prompt_tokens"],
        "{kind}"
    );
    if env.tokenizer.is_some() {
        // The router counted with the servers' own tokenizer and template.
        assert_eq!(
            via.prompt_tokens,
            via.body["usage"]["prompt_tokens"].as_u64(),
            "{kind}: the router's prompt count"
        );
    }
    println!(
        "{kind} (whole) on {name}: structure equal to direct; prompt {} tokens; text same as direct: {}",
        via.body["usage"]["prompt_tokens"],
        via.body["choices"][0] == direct.body["choices"][0]
    );
    name
}

pub async fn run(env: &Env) {
    let r = RouterProc::start(env, "round-robin", "").await;
    for chat in [false, true] {
        let name = whole_pair(env, &r, chat).await;
        // Recorded (its status is checked by `t1c_whole_response_is_recorded_ok`).
        let m = metrics_when(&r, |m| {
            metric(m, "headroom_requests_total", &[("replica", &name)]).is_some()
        })
        .await;
        assert!(
            metric(&m, "headroom_requests_total", &[("replica", &name)]).is_some_and(|n| n >= 1.0),
            "the router recorded the whole response"
        );
        for usage in [false, true] {
            check_stream(env, &r, chat, usage).await;
        }
    }
    let m = r.metrics().await;
    for bad in ["upstream_failed", "timed_out"] {
        assert_eq!(
            metric(&m, "headroom_requests_total", &[("status", bad)]),
            None,
            "no request failed: {m}"
        );
    }
}

/// A whole response with `content-length` is recorded `ok` (hyper drops the body once
/// its length is written, before polling it to its end: the last byte ends it).
pub async fn whole_recorded_ok(env: &Env) {
    let r = RouterProc::start(env, "round-robin", "").await;
    let name = whole_pair(env, &r, false).await;
    let m = metrics_when(&r, |m| {
        metric(m, "headroom_requests_total", &[("replica", &name)]).is_some()
    })
    .await;
    let ok = metric(
        &m,
        "headroom_requests_total",
        &[("replica", &name), ("status", "ok")],
    );
    assert_eq!(
        ok,
        Some(1.0),
        "a completed whole response counts as ok: {m}"
    );
}

/// Known issue: when the router injects `include_usage` and strips the usage chunk,
/// the client loses `system_fingerprint` (vLLM moves it to the usage chunk).
pub async fn injected_usage_keeps_structure(env: &Env) {
    let r = RouterProc::start(env, "round-robin", "").await;
    for chat in [false, true] {
        let (via, direct, _) = stream_pair(env, &r, chat, false).await;
        assert_eq!(
            chunk_shapes(&via, true),
            chunk_shapes(&direct, true),
            "chat {chat}: the client's stream differs from the server's"
        );
    }
}

/// Test 1b: with the servers' tokenizer configured (`HEADROOM_VLLM_TOKENIZER`), the
/// router's prompt count (`x-headroom-prompt-tokens`) equals vLLM's
/// `usage.prompt_tokens` exactly: completions and chat (system, multi-turn, text
/// parts), whole and streamed, usage asked or injected by the router.
pub async fn prompt_tokens_exact(env: &Env) {
    if env.tokenizer.is_none() {
        println!("t1b: not run (HEADROOM_VLLM_TOKENIZER unset; scripts/vllm/test-real.sh sets it)");
        return;
    }
    let r = RouterProc::start(env, "round-robin", "").await;
    let text = prompts::text("t1b", 2, 50);
    let chat = json!([
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": text},
        {"role": "assistant", "content": "Noted."},
        {"role": "user", "content": [{"type": "text", "text": "And then?"}, {"type": "text", "text": text}]},
    ]);
    let mut cases = vec![("completion", body(false, &text, 4))];
    let mut c = body(true, "", 4);
    c["messages"] = chat;
    cases.push(("chat", c));
    for (kind, b) in cases {
        let chat = kind == "chat";
        let via = post(&r.url(path(chat)), &b, &[]).await;
        assert_eq!(via.status, 200, "{kind}: {:?}", via.body);
        let engine = via.body["usage"]["prompt_tokens"].as_u64().expect("usage");
        assert_eq!(
            via.prompt_tokens,
            Some(engine),
            "{kind} (whole): router vs vLLM"
        );
        let asked = stream(&r.url(path(chat)), &streaming(b.clone(), true), &[]).await;
        assert!(asked.ok(), "{kind}: {asked:?}");
        let streamed = asked.usage.as_ref().expect("usage")["prompt_tokens"].as_u64();
        assert_eq!(
            streamed,
            Some(engine),
            "{kind}: vLLM counts the stream alike"
        );
        assert_eq!(
            asked.prompt_tokens,
            Some(engine),
            "{kind} (stream, usage asked)"
        );
        // Usage injected by the router: the body vLLM sees is re-encoded; the count
        // must not move.
        let injected = stream(&r.url(path(chat)), &streaming(b.clone(), false), &[]).await;
        assert!(injected.ok(), "{kind}: {injected:?}");
        assert_eq!(
            injected.prompt_tokens,
            Some(engine),
            "{kind} (stream, usage injected)"
        );
        println!(
            "{kind}: router and vLLM both count {engine} prompt tokens (whole, streamed, injected usage)"
        );
    }
}
