//! The cached-prefix what-if (`Snapshot::predict_with_cached`) says exactly what two
//! separate forecasts say: the policy prices a prefix miss with it, and a cheaper
//! answer that differed would move placements.

mod support;

use headroom_predictor::{Learner, PredictorConfig, ReplicaKey};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use support::synth::{self, Engine, Load};

/// A tight cache, so that many situations are capacity-bound (admission wait and KV
/// deficit non-zero), beside the moderate load.
fn loads() -> [Load; 2] {
    let mut tight = Load::moderate();
    // At most 3 × 6,000 tokens decoding: usage stays under 1 (a clean observation)
    // while the queue and the prompt overrun the cache.
    tight.max_decoding = 3;
    tight.kv_capacity = 20_000.0;
    [Load::moderate(), tight]
}

#[test]
fn the_forecast_with_a_prefix_held_is_the_forecast_of_that_observation() {
    let mut l = Learner::new(PredictorConfig::default());
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let eng = Engine::h100();
    let key = ReplicaKey::new(3, 1);
    // Warm, with a measured step time and non-trivial coefficients.
    for i in 0..400 {
        l.observe(&synth::sample(
            &mut rng,
            &eng,
            &Load::moderate(),
            key,
            i as f64 * 0.1,
        ));
    }
    let snap = l.snapshot(40.0);
    let mut waits = 0;
    for (n, load) in loads().iter().cycle().take(4000).enumerate() {
        let mut obs = synth::situation(&mut rng, &eng, load).obs;
        if n % 97 == 0 {
            // Garbage on the input path takes the sanitising path, same answer.
            obs.queued_prefill_tokens = f64::NAN;
        }
        let cached = match n % 5 {
            0 => obs.prompt_tokens,
            1 => obs.prompt_tokens + 64.0, // more than the prompt: sanitised, same answer
            _ => (obs.prompt_tokens * rng.random::<f64>()).floor(),
        };
        let mut held = obs;
        held.cached_tokens = cached;
        let (p, held_ms) = snap.predict_with_cached(key, &obs, cached);
        assert_eq!(p, snap.predict(key, &obs), "situation {n}");
        assert_eq!(
            held_ms.to_bits(),
            snap.predict_ttft_ms(key, &held).to_bits(),
            "situation {n}: {held_ms}"
        );
        waits += (p.ttft_wait_ms > 0.0) as usize;
    }
    assert!(waits > 100, "only {waits} capacity-bound situations");
}
