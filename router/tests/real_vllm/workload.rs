//! A mixed streamed workload through the router, used to warm the predictor up and
//! to measure its forecasts.

use std::sync::{Arc, Mutex};

use super::{
    harness::{RouterProc, stream},
    prompts,
    requests::{body, streaming},
};

/// One request's client-measured TTFT and the router's forecast for it (ms).
#[derive(Clone, Copy, Debug)]
pub struct Forecasted {
    pub actual_ms: f64,
    pub predicted_ms: f64,
}

/// Sends `n` requests, `concurrency` at a time: prompts of 50 to `max_prompt` tokens
/// (every third repeats an earlier prompt, so some prefills hit the prefix cache),
/// 8 to 48 output tokens. Every request must succeed.
pub async fn mixed(
    r: &RouterProc,
    tag: &str,
    n: usize,
    concurrency: usize,
    max_prompt: usize,
) -> Vec<Forecasted> {
    let next = Arc::new(Mutex::new(0usize));
    let out = Arc::new(Mutex::new(Vec::new()));
    let mut workers = Vec::new();
    for _ in 0..concurrency {
        let (next, out, url, tag) = (
            next.clone(),
            out.clone(),
            r.url("/v1/completions"),
            tag.to_string(),
        );
        workers.push(tokio::spawn(async move {
            loop {
                let k = {
                    let mut g = next.lock().expect("lock");
                    if *g >= n {
                        return;
                    }
                    *g += 1;
                    *g - 1
                };
                let seed = if k % 3 == 2 { k as u64 - 2 } else { k as u64 };
                let len = 50 + (seed as usize * 397) % max_prompt.saturating_sub(50).max(1);
                let outn = 8 + (k as u32 * 13) % 41;
                let b = streaming(body(false, &prompts::text(&tag, seed, len), outn), false);
                let s = stream(&url, &b, &[]).await;
                assert!(s.ok(), "workload request failed: {s:?}");
                if let (Some(y), Some(p)) = (s.first_content_s, s.predicted_ttft_ms) {
                    out.lock().expect("lock").push(Forecasted {
                        actual_ms: y * 1e3,
                        predicted_ms: p,
                    });
                }
            }
        }));
    }
    for w in workers {
        w.await.expect("workload worker");
    }
    out.lock().expect("lock").clone()
}

/// Mean absolute percentage error of the forecasts.
pub fn mape(xs: &[Forecasted]) -> f64 {
    xs.iter()
        .map(|f| (f.predicted_ms - f.actual_ms).abs() / f.actual_ms)
        .sum::<f64>()
        / xs.len().max(1) as f64
}
