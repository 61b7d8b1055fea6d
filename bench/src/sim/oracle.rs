//! The oracle: an upper bound on routing, not a router. It knows each request's true
//! output length and the engine model, and for every candidate forks that replica's
//! engine, runs it forward with the request added (no future arrivals), and reads off
//! the TTFT and TPOT the request would get. It then picks the fastest placement that
//! meets both objectives (or the least-bad one). Nothing a real router can see.

use headroom_engine::{Engine, EngineRequest, Event};

/// Decode tokens measured after the first to estimate TPOT.
const TPOT_TOKENS: u32 = 16;
/// Safety cap on forward steps per fork.
const MAX_STEPS: usize = 20_000;

/// TTFT (from `now_s`) and TPOT the request would see on `engine`, in seconds.
pub fn forecast(engine: &Engine, req: EngineRequest, now_s: f64) -> Option<(f64, f64)> {
    let id = req.id;
    let want = TPOT_TOKENS.min(
        req.eos_after
            .unwrap_or(req.max_output_tokens)
            .saturating_sub(1),
    );
    let mut e = engine.clone();
    e.submit_at(req, now_s).ok()?;
    let (mut first, mut last, mut n) = (None, 0.0, 0u32);
    for _ in 0..MAX_STEPS {
        let info = e.step();
        if info.idle {
            break;
        }
        let t = e.now_s();
        for ev in e.events() {
            match *ev {
                Event::FirstToken { id: i, .. } if i == id => {
                    first = Some(t);
                    last = t;
                }
                Event::Token { id: i, .. } if i == id => {
                    last = t;
                    n += 1;
                }
                Event::Finished { id: i, .. } if i == id => n = n.max(want),
                _ => {}
            }
        }
        if first.is_some() && n >= want {
            break;
        }
    }
    let f = first?;
    let tpot = if n > 0 { (last - f) / n as f64 } else { 0.0 };
    Some((f - now_s, tpot))
}

/// Picks among candidate forecasts `(ttft_s, tpot_s)`: the fastest that meets both
/// objectives, else the one that misses by the smallest factor. Returns the order.
pub fn choose(forecasts: &[Option<(f64, f64)>], slo_ttft_s: f64, slo_tpot_s: f64) -> Vec<usize> {
    let key = |f: &Option<(f64, f64)>| match f {
        Some((ttft, tpot)) => {
            let worst = (ttft / slo_ttft_s).max(tpot / slo_tpot_s);
            let cost = ttft / slo_ttft_s + tpot / slo_tpot_s;
            if worst <= 1.0 {
                (0u8, cost)
            } else {
                (1u8, worst)
            }
        }
        None => (2u8, f64::INFINITY),
    };
    let mut order: Vec<usize> = (0..forecasts.len()).collect();
    order.sort_by(|&a, &b| {
        let (ka, kb) = (key(&forecasts[a]), key(&forecasts[b]));
        ka.0.cmp(&kb.0).then(ka.1.total_cmp(&kb.1)).then(a.cmp(&b))
    });
    order
}

#[cfg(test)]
mod tests {
    use super::*;
    use headroom_engine::Profile;

    #[test]
    fn idle_fast_replica_beats_busy_one() {
        let p = Profile::by_name("h100-llama3-8b").unwrap();
        let idle = Engine::new(&p, 1).unwrap();
        let mut busy = Engine::new(&p, 2).unwrap();
        for i in 0..40 {
            busy.submit(EngineRequest::new(100 + i, 6000, vec![], 200))
                .unwrap();
        }
        busy.step();
        let req = || EngineRequest::new(1, 2000, vec![], 50);
        let a = forecast(&idle, req(), 0.0).unwrap();
        let b = forecast(&busy, req(), busy.now_s()).unwrap();
        assert!(a.0 < b.0, "{a:?} vs {b:?}");
        assert!(a.1 > 0.0 && b.1 > a.1);
        assert_eq!(choose(&[Some(b), Some(a)], 1.0, 0.1)[0], 1);
        // Nothing fits: least-bad.
        assert_eq!(
            choose(&[Some((9.0, 0.1)), Some((3.0, 0.1))], 1.0, 0.05)[0],
            1
        );
    }
}
