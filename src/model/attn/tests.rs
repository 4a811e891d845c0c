//! The attention's own tests: against float64 attention for f16 and int8 KV at every length (and the same
//! bits for a query alone or in a batch), the same bits from every instance of a chunk's pass, and
//! `exp_nonpos` against `exp`.

use super::kernel::{chunk_avx2, chunk_avx512, chunk_body};
use super::tile::heads_row;
use super::*;
use crate::device::Device;
use crate::model::KvType;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const SHAPE: AttnShape = AttnShape { n_head: 9, n_head_kv: 3, head_dim: 64 };

/// A one-layer cache of `n` random positions on a simulated GPU that keeps the newest 1,000 on the
/// device: older pages live on the host.
fn filled(ty: KvType, n: usize, rng: &mut StdRng) -> KvCache {
    let kv_dim = SHAPE.n_head_kv * SHAPE.head_dim;
    let dev = Device::sim(0, 256 << 20, 0);
    let mut kv = KvCache::new(ty, kv_dim, 8192, vec![dev], Device::cpu(1), Some(1000));
    kv.reserve(n).unwrap();
    for pos in 0..n {
        let k: Vec<f32> = (0..kv_dim).map(|_| rng.gen_range(-1.5f32..1.5)).collect();
        let v: Vec<f32> = (0..kv_dim).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
        kv.write(0, pos, &k, &v);
    }
    kv.set_len(n);
    kv
}

fn layer(kv: &KvCache) -> Layer<'_> {
    let hd = SHAPE.head_dim;
    Layer {
        pages: &kv.layers[0].pages,
        kv_dim: SHAPE.n_head_kv * hd,
        head_dim: hd,
        row_bytes: kv.ty.row_bytes(SHAPE.n_head_kv * hd),
        head_bytes: kv.ty.row_bytes(hd),
        scale: 1.0 / (hd as f32).sqrt(),
        softcap: None,
        window: None,
        sinks: None,
        int8: kv.ty == KvType::Int8,
    }
}

/// `q` as the int8 path sees it: quantized to q8_0 and back (exact in f32: an 8-bit integer times an
/// f16 scale).
fn as_q8(q: &[f32]) -> Vec<f32> {
    let mut blocks = Vec::new();
    quantize_queries(q, &mut blocks);
    let mut back = vec![0f32; q.len()];
    quant::dequantize_row(GgmlType::Q8_0, &blocks, &mut back);
    back
}

/// The scale of `SHAPE`'s heads.
fn plain() -> AttnOpts<'static> {
    AttnOpts { scale: 1.0 / (SHAPE.head_dim as f32).sqrt(), softcap: None, window: None, sinks: None }
}

/// Per-head sink scores (gpt-oss's): below, near and above the scores' range, so that some heads' sinks
/// take most of the weight and others almost none.
static SINKS: [f32; 9] = [-3.0, 0.5, 2.0, -0.25, 6.0, 1.0, -8.0, 0.0, 3.5];

/// Plain causal attention, a sliding window (across chunk and tile edges), a window with a soft-cap, and
/// sinks with a window (gpt-oss's sliding layers).
fn variants() -> [AttnOpts<'static>; 4] {
    [
        plain(),
        AttnOpts { window: Some(300), ..plain() },
        AttnOpts { window: Some(45), softcap: Some(0.5), ..plain() },
        AttnOpts { window: Some(128), sinks: Some(&SINKS[..SHAPE.n_head]), ..plain() },
    ]
}

/// Attention in f64 over the values the cache holds (as f32), one query at position `pos`.
fn attend_f64(kv: &KvCache, h: usize, q: &[f32], pos: usize, opts: &AttnOpts) -> Vec<f64> {
    let hd = SHAPE.head_dim;
    let ctx = layer(kv);
    let kvh = h / (SHAPE.n_head / SHAPE.n_head_kv);
    let (mut k, mut v) = (vec![0f32; hd], vec![0f32; hd]);
    let mut scores = Vec::with_capacity(pos + 1);
    let mut rows = Vec::with_capacity(pos + 1);
    let lo = opts.window.map_or(0, |w| (pos + 1).saturating_sub(w));
    for j in lo..=pos {
        let page = &ctx.pages[j / KV_PAGE_TOKENS];
        heads_row(&ctx, &page.k, j % KV_PAGE_TOKENS, kvh..kvh + 1, &mut k);
        heads_row(&ctx, &page.v, j % KV_PAGE_TOKENS, kvh..kvh + 1, &mut v);
        let dot: f64 = q.iter().zip(&k).map(|(&a, &b)| a as f64 * b as f64).sum();
        let score = dot * opts.scale as f64;
        scores.push(opts.softcap.map_or(score, |c| c as f64 * (score / c as f64).tanh()));
        rows.push(v.clone());
    }
    // A sink joins the softmax as one more score whose value is zero.
    let sink = opts.sinks.map_or(f64::NEG_INFINITY, |s| s[h] as f64);
    let max = scores.iter().cloned().fold(sink, f64::max);
    let w: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
    let sum: f64 = w.iter().sum::<f64>() + (sink - max).exp();
    (0..hd).map(|d| w.iter().zip(&rows).map(|(w, r)| w * r[d] as f64).sum::<f64>() / sum).collect()
}

/// The attention of the last `t` positions of an `n`-position cache, batched.
fn attend(pool: &ThreadPool, kv: &KvCache, q: &[f32], n: usize, t: usize, opts: &AttnOpts) -> Vec<f32> {
    let mut out = vec![0f32; q.len()];
    attention(pool, kv, 0, &SHAPE, opts, q, n - t, &mut out);
    out
}

/// ... and through a sliding window and a soft-cap (gemma's layers), whose masked keys weigh exactly 0.
#[test]
fn attention_follows_float64_for_f16_and_int8_kv_at_every_length() {
    let pool = ThreadPool::new(2);
    let q_dim = SHAPE.n_head * SHAPE.head_dim;
    let mut rng = StdRng::seed_from_u64(5);
    // With int8 KV the scores take the query quantized to q8_0 (as llama.cpp's quantized-KV path): the
    // float64 attention is given those operands, and separately the exact query, against which the error
    // is the quantization's.
    let mut worst_exact_q = 0f64;
    for ty in [KvType::F16, KvType::F32, KvType::Int8] {
        for n in [1, 2, 31, 32, 33, 64, 65, 255, 1000, 2049, 5000] {
            let kv = filled(ty, n, &mut rng);
            if n > 1064 {
                let on_host = kv.layers[0].pages.iter().filter(|p| p.on_host()).count();
                assert!(on_host > 0 && on_host < kv.layers[0].pages.len(), "{n}: pages on both sides");
            }
            // Eleven tokens: two blocks, so the batch takes the one-thread-per-block path, and alone each
            // query takes the chunks-on-threads one.
            let t = n.min(11);
            let q: Vec<f32> = (0..t * q_dim).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
            for opts in variants() {
                let got = attend(&pool, &kv, &q, n, t, &opts);
                let operands = if ty == KvType::Int8 { as_q8(&q) } else { q.clone() };
                let mut worst = 0f64;
                for ti in 0..t {
                    for h in 0..SHAPE.n_head {
                        let at = ti * q_dim + h * SHAPE.head_dim;
                        let want = attend_f64(&kv, h, &operands[at..at + SHAPE.head_dim], n - t + ti, &opts);
                        let error = |want: &[f64]| {
                            let scale = want.iter().fold(0f64, |a, b| a.max(b.abs()));
                            let got = &got[at..at + SHAPE.head_dim];
                            got.iter().zip(want).map(|(g, w)| (*g as f64 - w).abs() / scale).fold(0f64, f64::max)
                        };
                        worst = worst.max(error(&want));
                        if ty == KvType::Int8 {
                            let exact_q = attend_f64(&kv, h, &q[at..at + SHAPE.head_dim], n - t + ti, &opts);
                            worst_exact_q = worst_exact_q.max(error(&exact_q));
                        }
                    }
                }
                assert!(worst < 1e-5, "{ty:?}, {n} positions, {opts:?}: relative error {worst:e}");
                // Alone, each query gives the bits it gave in the batch.
                for ti in 0..t {
                    let pos = n - t + ti;
                    let qi = &q[ti * q_dim..(ti + 1) * q_dim];
                    let mut one = vec![0f32; q_dim];
                    attention(&pool, &kv, 0, &SHAPE, &opts, qi, pos, &mut one);
                    let batched = &got[ti * q_dim..(ti + 1) * q_dim];
                    assert!(
                        one.iter().zip(batched).all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{ty:?}, {n}, {opts:?}: query {ti}"
                    );
                }
            }
        }
    }
    println!("int8 KV: relative error against the unquantized query {worst_exact_q:.2e}");
    assert!(worst_exact_q < 1e-2, "int8 KV: the quantized queries moved the output by {worst_exact_q:e}");
}

/// Several sequences in one call (decoding tokens over several key chunks, a lone chunk, blocks of a
/// prompt, one short of a block) give each row the bits it gets from its sequence alone, for every KV type
/// and with a sliding window.
#[test]
fn sequences_attended_together_give_each_the_bits_it_gets_alone() {
    let pool = ThreadPool::new(2);
    let q_dim = SHAPE.n_head * SHAPE.head_dim;
    let mut rng = StdRng::seed_from_u64(8);
    for ty in [KvType::F16, KvType::Int8] {
        // (cache length, tokens of the call): the tokens are the cache's last ones.
        let plan = [(700usize, 1usize), (40, 1), (300, 11), (1300, 3), (8, 8), (257, 1)];
        let caches: Vec<KvCache> = plan.iter().map(|&(n, _)| filled(ty, n, &mut rng)).collect();
        let total: usize = plan.iter().map(|p| p.1).sum();
        let q: Vec<f32> = (0..total * q_dim).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
        for opts in variants() {
            let mut seqs = Vec::new();
            let mut at = 0;
            for (kv, &(n, t)) in caches.iter().zip(&plan) {
                seqs.push(SeqRows { kv, rows: at..at + t, pos0: n - t });
                at += t;
            }
            let mut together = vec![0f32; q.len()];
            attention_many(&pool, &seqs, 0, &SHAPE, &opts, &q, &mut together);
            for seq in &seqs {
                let rows = seq.rows.start * q_dim..seq.rows.end * q_dim;
                let mut alone = vec![0f32; rows.len()];
                attention(&pool, seq.kv, 0, &SHAPE, &opts, &q[rows.clone()], seq.pos0, &mut alone);
                assert!(
                    alone.iter().zip(&together[rows]).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{ty:?}, {opts:?}: the sequence at {:?} changed beside the others",
                    seq.rows
                );
            }
        }
    }
}

/// The three instances of a chunk's pass (portable, AVX2, AVX-512 with its key-pair tiles) leave the same
/// bits in every query's state: f16 and int8 KV, one KV head or all of them (decoding's whole rows),
/// chunks that end inside a tile, queries whose keys end inside a tile, a chunk on host pages.
#[test]
fn chunk_pass_has_the_same_bits_on_every_instruction_set() {
    let level = quant::simd_level();
    if !level.avx2() {
        println!("skipped: this CPU has no AVX2 (only the portable instance runs)");
        return;
    }
    let wide = level == quant::SimdLevel::Avx512;
    if !wide {
        println!("no AVX-512 here: comparing the portable and AVX2 instances only");
    }
    let hd = SHAPE.head_dim;
    let q_dim = SHAPE.n_head * hd;
    let group = SHAPE.n_head / SHAPE.n_head_kv;
    let mut rng = StdRng::seed_from_u64(6);
    for ty in [KvType::F16, KvType::F32, KvType::Int8] {
        let n = 1300;
        let kv = filled(ty, n, &mut rng);
        let ctx = layer(&kv);
        let t = 5;
        let qf: Vec<f32> = (0..t * q_dim).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
        let mut blocks = Vec::new();
        quantize_queries(&qf, &mut blocks);
        let q = Queries { f: &qf, blocks: &blocks };
        for (heads, positions) in [(1..2, [3usize, 40, 300, 1299, 1000]), (0..3, [13, 250, 256, 257, 1290])] {
            let queries: Vec<Query> = (0..t)
                .flat_map(|ti| {
                    let heads = heads.clone();
                    heads.flat_map(move |kvh| {
                        (kvh * group..(kvh + 1) * group).map(move |h| {
                            let at = ti * q_dim + h * hd;
                            Query { q_at: at, pos: positions[ti], lo: 0, out_at: at, kvh, sink: f32::NEG_INFINITY }
                        })
                    })
                })
                .collect();
            for c0 in [0, 256, 1024] {
                let run = |which: u8| {
                    let mut s = Scratch { queries: queries.clone(), ..Scratch::default() };
                    // SAFETY: AVX2 detected above, AVX-512 only when `wide`.
                    unsafe {
                        match which {
                            0 => chunk_body::<false, false>(&ctx, heads.clone(), q, c0, &mut s),
                            1 => chunk_avx2(&ctx, heads.clone(), q, c0, &mut s),
                            _ => chunk_avx512(&ctx, heads.clone(), q, c0, &mut s),
                        }
                    }
                    let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<u32>>();
                    (bits(&s.m), bits(&s.l), bits(&s.acc))
                };
                let portable = run(0);
                assert!(portable.1.iter().any(|&l| f32::from_bits(l) > 0.0), "{ty:?}: chunk {c0} saw no keys");
                assert!(run(1) == portable, "{ty:?}, heads {heads:?}, chunk {c0}: AVX2 differs");
                if wide {
                    assert!(run(2) == portable, "{ty:?}, heads {heads:?}, chunk {c0}: AVX-512 differs");
                }
            }
        }
    }
}

#[test]
fn exp_nonpos_is_close_to_exp() {
    let mut worst = 0f64;
    for i in 0..=200_000 {
        let x = -(i as f32) * 87.0 / 200_000.0;
        let want = (x as f64).exp();
        let got = exp_nonpos(x) as f64;
        worst = worst.max(((got - want) / want).abs());
    }
    assert!(worst < 4e-7, "worst relative error {worst}");
    assert_eq!(exp_nonpos(0.0), 1.0);
    assert!(exp_nonpos(f32::NEG_INFINITY) < 1e-37);
}
