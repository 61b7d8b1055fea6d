//! The per-token cost of observing a stream: a vLLM completions stream of 128 one-token
//! events, each with the per-chunk usage the router asks for and cuts out again
//! (`continuous_usage_stats`), read one event per read as vLLM sends them at its default
//! stream interval, with the failover transcript on. Reported per stream.

use std::time::Instant;

use bytes::Bytes;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use headroom::{proxy::sse::SseScanner, request::InjectedUsage};

const TOKENS: u32 = 128;

fn events() -> Vec<Bytes> {
    let mut out = Vec::new();
    for i in 0..TOKENS {
        let finish = if i + 1 == TOKENS {
            "\"length\""
        } else {
            "null"
        };
        out.push(Bytes::from(format!(
            "data: {{\"id\":\"cmpl-b51445a2f520454b\",\"object\":\"text_completion\",\"created\":1796020034,\"model\":\"tiny-llama\",\"choices\":[{{\"index\":0,\"text\":\" word{i}\",\"logprobs\":null,\"finish_reason\":{finish},\"stop_reason\":null,\"prompt_token_ids\":null,\"token_ids\":null}}],\"usage\":{{\"prompt_tokens\":812,\"total_tokens\":{},\"completion_tokens\":{}}}}}\n\n",
            813 + i,
            i + 1
        )));
    }
    out.push(Bytes::from_static(
        b"data: {\"id\":\"cmpl-b51445a2f520454b\",\"object\":\"text_completion\",\"created\":1796020034,\"model\":\"tiny-llama\",\"choices\":[],\"usage\":{\"prompt_tokens\":812,\"total_tokens\":940,\"completion_tokens\":128}}\n\ndata: [DONE]\n\n",
    ));
    out
}

fn bench(c: &mut Criterion) {
    let events = events();
    let mut g = c.benchmark_group("sse");
    g.throughput(Throughput::Elements(u64::from(TOKENS)));
    g.bench_function("vllm_stream_128_tokens", |b| {
        b.iter(|| {
            let mut s = SseScanner::new(InjectedUsage {
                final_chunk: true,
                per_chunk: true,
            });
            s.transcript = Some(Box::default());
            let now = Instant::now();
            let mut n = 0;
            for e in &events {
                n += s.feed(e, now).len();
            }
            std::hint::black_box((n, s));
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
