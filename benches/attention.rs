//! Micro-benchmark of CPU attention on SmolLM2-135M's shape (9 query heads, 3 KV heads, head_dim 64):
//! a prompt's causal attention (512 tokens over themselves, in the batch path) and one decoding step
//! over a short and a long context, with an f16 cache. A test's name as the argument runs only it.
//!
//! Run with `cargo bench --bench attention` (`STRATA_SIMD=avx2` for the AVX2 instance; `ATTN_BENCH_THREADS`,
//! default 1). Prints ms per call and ns per query-key pair.

use std::time::Instant;
use strata::device::Device;
use strata::model::attn::{attention, AttnOpts};
use strata::model::ops::AttnShape;
use strata::model::{KvCache, KvType};
use strata::threadpool::ThreadPool;

const SHAPE: AttnShape = AttnShape { n_head: 9, n_head_kv: 3, head_dim: 64 };

fn main() {
    let threads = std::env::var("ATTN_BENCH_THREADS").ok().and_then(|v| v.parse().ok()).unwrap_or(1);
    let pool = ThreadPool::new(threads);
    println!("simd path: {:?}, {threads} thread(s)", strata::quant::simd_level());
    let kv_dim = SHAPE.n_head_kv * SHAPE.head_dim;
    let q_dim = SHAPE.n_head * SHAPE.head_dim;
    let opts = AttnOpts { scale: 0.125, softcap: None, window: None, sinks: None };
    let value = |i: usize| ((i * 7919) % 2001) as f32 / 1000.0 - 1.0;
    let only = std::env::args().nth(1).filter(|a| !a.starts_with('-'));
    for (name, n, t) in [("pp512", 512usize, 512usize), ("tg@64", 64, 1), ("tg@4096", 4096, 1)] {
        if only.as_deref().is_some_and(|o| o != name) {
            continue;
        }
        let mut kv = KvCache::new(KvType::F16, kv_dim, n, vec![Device::cpu(0)], Device::cpu(0), None);
        kv.reserve(n).expect("host memory");
        for pos in 0..n {
            let k: Vec<f32> = (0..kv_dim).map(|i| value(pos * kv_dim + i)).collect();
            let v: Vec<f32> = (0..kv_dim).map(|i| value(pos * kv_dim + i + 17)).collect();
            kv.write(0, pos, &k, &v);
        }
        kv.set_len(n);
        let q: Vec<f32> = (0..t * q_dim).map(|i| value(i + 3)).collect();
        let mut out = vec![0f32; q.len()];
        let pairs = (n - t..n).map(|p| p + 1).sum::<usize>() * SHAPE.n_head;
        let reps = (200_000_000 / pairs).max(3);
        attention(&pool, &kv, 0, &SHAPE, &opts, &q, n - t, &mut out);
        let mut best = f64::INFINITY;
        for _ in 0..5 {
            let start = Instant::now();
            for _ in 0..reps {
                attention(&pool, &kv, 0, &SHAPE, &opts, &q, n - t, &mut out);
            }
            best = best.min(start.elapsed().as_secs_f64() / reps as f64);
        }
        println!("{name:>8}: {:.3} ms per call, {:.3} ns per query-key pair", best * 1e3, best * 1e9 / pairs as f64);
    }
}
