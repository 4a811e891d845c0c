//! Attention on the CPU over the paged KV cache, in the flash-attention scheme: keys in tiles of
//! `KEY_TILE` positions with an online softmax (a running max, sum and output per query, rescaled tile by
//! tile), so no score row as long as the context is kept and each K and V tile is converted to f32 once
//! for every query that reads it: all the heads of a GQA group, and in a batch up to `QUERY_TOKENS`
//! tokens.
//!
//! What it keeps of the engine's promises:
//! - Batch invariance: a query's result is computed by the same operations in the same order whatever
//!   other queries share its pass. Tiles start at multiples of `KEY_TILE` (absolute positions), a query
//!   reads only its keys (the other lanes of its last tile are masked to a weight of exactly 0), and every
//!   reduction (over head dimensions, over a tile's keys, over tiles) has a fixed order. So logits are
//!   bit-identical across batch sizes, chunkings and thread counts, and a restored cache gives what a
//!   reread one does.
//! - Page location: on the CPU every page is host memory and is read the same way; a tile never straddles
//!   a page (`KV_PAGE_TOKENS` is a multiple of `KEY_TILE`).
//! - The arithmetic is plain f32 (no fused multiply-adds, which Rust never contracts), with `exp` from a
//!   polynomial (`exp_nonpos`), so the AVX2 instance (the same code compiled with AVX2 enabled, for 8-lane
//!   vectors) and the portable one give the same bits.
//!
//! Hot path: a key's score is eight lanes of products summed in a fixed tree, eight keys per step; the
//! weighted sum of V runs along the head dimension with the output in registers. Scratch lives per thread (`SCRATCH`): decoding
//! allocates nothing per token.

use std::cell::RefCell;

use half::slice::HalfFloatSliceExt;

use crate::quant::{self, GgmlType};
use crate::threadpool::{split_range, ThreadPool};

use super::kv::{KvCache, KvPage, KvRows, KV_PAGE_TOKENS};
use super::ops::{AttnShape, SharedMut};

/// Keys per tile.
pub const KEY_TILE: usize = 32;
/// Tokens of a batch whose queries share one pass over the keys.
const QUERY_TOKENS: usize = 8;

const _: () = assert!(KV_PAGE_TOKENS.is_multiple_of(KEY_TILE), "a tile must not straddle a page");

/// One query of a pass: its vector, its last key position (causal: keys `0..=pos`) and where its output
/// goes (an offset into the output, `head_dim` values).
#[derive(Clone, Copy)]
struct Query {
    q_at: usize,
    pos: usize,
    out_at: usize,
}

/// Per-thread buffers of a pass.
#[derive(Default)]
struct Scratch {
    k: Vec<f32>,   // (KEY_TILE, head_dim)
    v: Vec<f32>,   // (KEY_TILE, head_dim)
    m: Vec<f32>,   // (queries): running max of the scores
    l: Vec<f32>,   // (queries): running sum of the weights
    acc: Vec<f32>, // (queries, head_dim): running weighted sum of V
    queries: Vec<Query>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// What a pass needs to find a head's rows in the layer's pages.
struct Layer<'a> {
    pages: &'a [KvPage],
    kv_dim: usize,
    head_dim: usize,
    row_bytes: usize,
    head_bytes: usize,
    scale: f32,
}

/// Causal attention of the `t_count` queries in `q` at positions `pos0..pos0 + t_count` over layer `layer`
/// of `kv` (already holding those positions). `q`: (t_count, n_head * head_dim); `out`: same shape.
pub fn attention(
    pool: &ThreadPool,
    kv: &KvCache,
    layer: usize,
    shape: &AttnShape,
    q: &[f32],
    pos0: usize,
    out: &mut [f32],
) {
    let AttnShape { n_head, n_head_kv, head_dim } = *shape;
    let q_dim = n_head * head_dim;
    let t_count = q.len() / q_dim;
    let group = n_head / n_head_kv;
    let ctx = Layer {
        pages: &kv.layers[layer].pages,
        kv_dim: n_head_kv * head_dim,
        head_dim,
        row_bytes: kv.ty.row_bytes(n_head_kv * head_dim),
        head_bytes: kv.ty.row_bytes(head_dim),
        scale: 1.0 / (head_dim as f32).sqrt(),
    };
    // Work items: one query head each when decoding (enough items for the threads), else a block of
    // tokens with all the heads of one KV head. Which queries share a pass changes no bit.
    let (n_blocks, heads_per_item) = if t_count == 1 { (1, 1) } else { (t_count.div_ceil(QUERY_TOKENS), group) };
    let items_per_block = n_head / heads_per_item;
    let items = n_blocks * items_per_block;
    let shared_out = SharedMut::new(out);
    let n_chunks = pool.chunks_for(items);
    pool.run(n_chunks, |chunk| {
        SCRATCH.with_borrow_mut(|s| {
            for item in split_range(chunk, n_chunks, items) {
                let (block, hi) = (item / items_per_block, item % items_per_block);
                let (h0, h1) = (hi * heads_per_item, (hi + 1) * heads_per_item);
                let kvh = h0 / group;
                let tokens = block * QUERY_TOKENS..((block + 1) * QUERY_TOKENS).min(t_count);
                s.queries.clear();
                for t in tokens {
                    for h in h0..h1 {
                        let at = t * q_dim + h * head_dim;
                        s.queries.push(Query { q_at: at, pos: pos0 + t, out_at: at });
                    }
                }
                pass(&ctx, kvh, q, shared_out, s);
            }
        })
    });
}

/// One pass over the keys of KV head `kvh` for the queries in `s.queries`.
/// Each query's output slice belongs to its item alone, run by one thread.
fn pass(ctx: &Layer, kvh: usize, q: &[f32], out: SharedMut<f32>, s: &mut Scratch) {
    #[cfg(target_arch = "x86_64")]
    if quant::simd_level().avx2() {
        // SAFETY: AVX2 and FMA were detected; the body is plain Rust.
        return unsafe { pass_avx2(ctx, kvh, q, out, s) };
    }
    pass_body::<false>(ctx, kvh, q, out, s)
}

/// `pass_body` compiled with AVX2, so its loops run on 8-lane vectors (same operations, same bits).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pass_avx2(ctx: &Layer, kvh: usize, q: &[f32], out: SharedMut<f32>, s: &mut Scratch) {
    pass_body::<true>(ctx, kvh, q, out, s)
}

/// The pass; `AVX2` (only where it was detected) computes the scores with explicit 8-lane vectors, the
/// same multiplies and adds in the same order as the portable loop.
#[inline(always)]
fn pass_body<const AVX2: bool>(ctx: &Layer, kvh: usize, q: &[f32], out: SharedMut<f32>, s: &mut Scratch) {
    let hd = ctx.head_dim;
    let nq = s.queries.len();
    let Some(last) = s.queries.iter().map(|x| x.pos).max() else { return };
    s.k.resize(KEY_TILE * hd, 0.0);
    s.v.resize(KEY_TILE * hd, 0.0);
    s.m.clear();
    s.m.resize(nq, f32::NEG_INFINITY);
    s.l.clear();
    s.l.resize(nq, 0.0);
    s.acc.clear();
    s.acc.resize(nq * hd, 0.0);
    let Scratch { k, v, m, l, acc, queries } = s;
    for start in (0..=last).step_by(KEY_TILE) {
        let n_keys = KEY_TILE.min(last + 1 - start);
        load_tile(ctx, kvh, start, n_keys, k, v);
        for (qi, query) in queries.iter().enumerate() {
            if query.pos < start {
                continue;
            }
            let valid = n_keys.min(query.pos + 1 - start);
            let qv = &q[query.q_at..query.q_at + hd];
            let mut sc = [0f32; KEY_TILE];
            #[cfg(target_arch = "x86_64")]
            if AVX2 {
                // SAFETY: AVX2 detected (see `pass`); `k` holds KEY_TILE rows of head_dim.
                unsafe { scores_avx2(qv, k, &mut sc) };
            } else {
                scores(qv, k, &mut sc);
            }
            #[cfg(not(target_arch = "x86_64"))]
            scores(qv, k, &mut sc);
            for (i, a) in sc.iter_mut().enumerate() {
                *a = if i < valid { *a * ctx.scale } else { f32::NEG_INFINITY };
            }
            let tile_max = sc.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
            let m_new = m[qi].max(tile_max);
            let alpha = if m[qi] == f32::NEG_INFINITY { 0.0 } else { exp_nonpos(m[qi] - m_new) };
            let mut p = [0f32; KEY_TILE];
            for (i, (w, &a)) in p.iter_mut().zip(&sc).enumerate() {
                *w = if i < valid { exp_nonpos(a - m_new) } else { 0.0 };
            }
            l[qi] = l[qi] * alpha + sum_tile(&p);
            m[qi] = m_new;
            let o = &mut acc[qi * hd..(qi + 1) * hd];
            #[cfg(target_arch = "x86_64")]
            if AVX2 && hd.is_multiple_of(64) {
                // SAFETY: AVX2 detected (see `pass`); `v` holds `valid` rows of `hd`.
                unsafe { weigh_values_avx2(o, alpha, &p[..valid], v) };
                continue;
            }
            weigh_values(o, alpha, &p[..valid], v);
        }
    }
    for (qi, query) in queries.iter().enumerate() {
        let inv = 1.0 / l[qi];
        // SAFETY: this query's output is written by this pass only (see `pass`).
        let o = unsafe { out.slice(query.out_at, hd) };
        for (y, &x) in o.iter_mut().zip(&acc[qi * hd..(qi + 1) * hd]) {
            *y = x * inv;
        }
    }
}

/// `o = o * alpha + sum over i of p[i] * v[i]`, the keys in order, for each of `o`'s dimensions.
#[inline(always)]
fn weigh_values(o: &mut [f32], alpha: f32, p: &[f32], v: &[f32]) {
    let hd = o.len();
    for x in o.iter_mut() {
        *x *= alpha;
    }
    for (i, &w) in p.iter().enumerate() {
        for (x, &y) in o.iter_mut().zip(&v[i * hd..(i + 1) * hd]) {
            *x += w * y;
        }
    }
}

/// `weigh_values` with the output held in registers, 64 dimensions at a time (`o.len()` a multiple of 64).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn weigh_values_avx2(o: &mut [f32], alpha: f32, p: &[f32], v: &[f32]) {
    use std::arch::x86_64::*;
    let hd = o.len();
    assert!(hd.is_multiple_of(64) && v.len() >= p.len() * hd);
    let a = _mm256_set1_ps(alpha);
    for d0 in (0..hd).step_by(64) {
        let mut acc = [_mm256_setzero_ps(); 8];
        for (j, x) in acc.iter_mut().enumerate() {
            *x = _mm256_mul_ps(_mm256_loadu_ps(o.as_ptr().add(d0 + 8 * j)), a);
        }
        for (i, &w) in p.iter().enumerate() {
            let b = _mm256_set1_ps(w);
            let vr = v.as_ptr().add(i * hd + d0);
            for (j, x) in acc.iter_mut().enumerate() {
                *x = _mm256_add_ps(*x, _mm256_mul_ps(b, _mm256_loadu_ps(vr.add(8 * j))));
            }
        }
        for (j, x) in acc.iter().enumerate() {
            _mm256_storeu_ps(o.as_mut_ptr().add(d0 + 8 * j), *x);
        }
    }
}

/// `sc[i] = q . k[i]` for the tile's keys: eight lanes, lane `j` summing the products of dimensions
/// `j, j + 8, ..` in order, then the lanes in pairs (`((0+1)+(2+3))+((4+5)+(6+7))`).
#[inline(always)]
fn scores(qv: &[f32], k: &[f32], sc: &mut [f32; KEY_TILE]) {
    let hd = qv.len();
    for (i, a) in sc.iter_mut().enumerate() {
        let kr = &k[i * hd..(i + 1) * hd];
        let mut l = [0f32; 8];
        for (qc, kc) in qv.chunks_exact(8).zip(kr.chunks_exact(8)) {
            for j in 0..8 {
                l[j] += qc[j] * kc[j];
            }
        }
        *a = ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
    }
}

/// `scores` eight keys at a time: a vector of lanes per key, and the eight lane sums by `hadd`, which adds
/// in the same pairs.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scores_avx2(qv: &[f32], k: &[f32], sc: &mut [f32; KEY_TILE]) {
    use std::arch::x86_64::*;
    let hd = qv.len();
    assert!(hd.is_multiple_of(8) && k.len() >= KEY_TILE * hd);
    for i0 in (0..KEY_TILE).step_by(8) {
        let mut a = [_mm256_setzero_ps(); 8];
        for (c, qc) in qv.chunks_exact(8).enumerate() {
            let q = _mm256_loadu_ps(qc.as_ptr());
            for (j, x) in a.iter_mut().enumerate() {
                let kp = k.as_ptr().add((i0 + j) * hd + 8 * c);
                *x = _mm256_add_ps(*x, _mm256_mul_ps(q, _mm256_loadu_ps(kp)));
            }
        }
        // hadd(x, y) = [x0+x1, x2+x3, y0+y1, y2+y3 | x4+x5, x6+x7, y4+y5, y6+y7].
        let h01 = _mm256_hadd_ps(a[0], a[1]);
        let h23 = _mm256_hadd_ps(a[2], a[3]);
        let h45 = _mm256_hadd_ps(a[4], a[5]);
        let h67 = _mm256_hadd_ps(a[6], a[7]);
        // Keys 0..4: (0+1)+(2+3) in the low half, (4+5)+(6+7) in the high half; keys 4..8 likewise.
        let k03 = _mm256_hadd_ps(h01, h23);
        let k47 = _mm256_hadd_ps(h45, h67);
        let lo = _mm256_permute2f128_ps::<0x20>(k03, k47);
        let hi = _mm256_permute2f128_ps::<0x31>(k03, k47);
        _mm256_storeu_ps(sc.as_mut_ptr().add(i0), _mm256_add_ps(lo, hi));
    }
}

/// Converts keys `start..start + n_keys` of KV head `kvh` into `k` and their values into `v` (rows of
/// head_dim), zeroing the rows past `n_keys`.
#[inline(always)]
fn load_tile(ctx: &Layer, kvh: usize, start: usize, n_keys: usize, k: &mut [f32], v: &mut [f32]) {
    let hd = ctx.head_dim;
    let page = &ctx.pages[start / KV_PAGE_TOKENS];
    let r0 = start % KV_PAGE_TOKENS;
    for i in 0..n_keys {
        head_row(ctx, &page.k, r0 + i, kvh, &mut k[i * hd..(i + 1) * hd]);
        head_row(ctx, &page.v, r0 + i, kvh, &mut v[i * hd..(i + 1) * hd]);
    }
    k[n_keys * hd..].fill(0.0);
}

/// Row `r` of a page's K or V for head `kvh`, as f32.
#[inline(always)]
fn head_row(ctx: &Layer, rows: &KvRows, r: usize, kvh: usize, dst: &mut [f32]) {
    match rows {
        KvRows::F16(k) => {
            let at = r * ctx.kv_dim + kvh * ctx.head_dim;
            k[at..at + ctx.head_dim].convert_to_f32_slice(dst);
        }
        KvRows::Int8(k) => {
            let at = r * ctx.row_bytes + kvh * ctx.head_bytes;
            quant::dequantize_row(GgmlType::Q8_0, &k[at..at + ctx.head_bytes], dst);
        }
        KvRows::Gpu => unreachable!("GPU layers attend with a kernel"),
    }
}

/// The sum of a tile's weights in a fixed order: eight lanes, then pairs.
#[inline(always)]
fn sum_tile(p: &[f32; KEY_TILE]) -> f32 {
    let mut lanes = [0f32; 8];
    for c in p.chunks_exact(8) {
        for (a, &b) in lanes.iter_mut().zip(c) {
            *a += b;
        }
    }
    ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]))
}

/// `e^x` for `x <= 0` to about 2 ulp (Cephes' `expf` polynomial after a Cody-Waite reduction), in plain
/// f32 operations that vectorize; values below -87.3 (where `e^x` leaves the normal range) give e^-87.3.
#[inline(always)]
pub fn exp_nonpos(x: f32) -> f32 {
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    const ROUND: f32 = 12_582_912.0; // 1.5 * 2^23: adding and subtracting it rounds to an integer
    let x = x.max(-87.336_55);
    let n = (x * std::f32::consts::LOG2_E + ROUND) - ROUND;
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let mut p = 1.987_569_1e-4f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 5e-1;
    let e = (p * r) * r + r + 1.0;
    e * f32::from_bits((((n as i32) + 127) << 23) as u32)
}

#[cfg(test)]
mod tests {
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

    /// Attention in f64 over the values the cache holds (as f32), one query at position `pos`.
    fn attend_f64(kv: &KvCache, h: usize, q: &[f32], pos: usize) -> Vec<f64> {
        let hd = SHAPE.head_dim;
        let ctx = Layer {
            pages: &kv.layers[0].pages,
            kv_dim: SHAPE.n_head_kv * hd,
            head_dim: hd,
            row_bytes: kv.ty.row_bytes(SHAPE.n_head_kv * hd),
            head_bytes: kv.ty.row_bytes(hd),
            scale: 1.0 / (hd as f32).sqrt(),
        };
        let kvh = h / (SHAPE.n_head / SHAPE.n_head_kv);
        let (mut k, mut v) = (vec![0f32; hd], vec![0f32; hd]);
        let mut scores = Vec::with_capacity(pos + 1);
        let mut rows = Vec::with_capacity(pos + 1);
        for j in 0..=pos {
            let page = &ctx.pages[j / KV_PAGE_TOKENS];
            head_row(&ctx, &page.k, j % KV_PAGE_TOKENS, kvh, &mut k);
            head_row(&ctx, &page.v, j % KV_PAGE_TOKENS, kvh, &mut v);
            let dot: f64 = q.iter().zip(&k).map(|(&a, &b)| a as f64 * b as f64).sum();
            scores.push(dot / (hd as f64).sqrt());
            rows.push(v.clone());
        }
        let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let w: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
        let sum: f64 = w.iter().sum();
        (0..hd).map(|d| w.iter().zip(&rows).map(|(w, r)| w * r[d] as f64).sum::<f64>() / sum).collect()
    }

    /// The attention of the last `t` positions of an `n`-position cache, batched.
    fn attend(pool: &ThreadPool, kv: &KvCache, q: &[f32], n: usize, t: usize) -> Vec<f32> {
        let mut out = vec![0f32; q.len()];
        attention(pool, kv, 0, &SHAPE, q, n - t, &mut out);
        out
    }

    #[test]
    fn attention_follows_float64_for_f16_and_int8_kv_at_every_length() {
        let pool = ThreadPool::new(2);
        let q_dim = SHAPE.n_head * SHAPE.head_dim;
        let mut rng = StdRng::seed_from_u64(5);
        for ty in [KvType::F16, KvType::Int8] {
            for n in [1, 2, 31, 32, 33, 64, 65, 255, 1000, 2049, 5000] {
                let kv = filled(ty, n, &mut rng);
                if n > 1064 {
                    let on_host = kv.layers[0].pages.iter().filter(|p| p.on_host()).count();
                    assert!(on_host > 0 && on_host < kv.layers[0].pages.len(), "{n}: pages on both sides");
                }
                let t = n.min(3);
                let q: Vec<f32> = (0..t * q_dim).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
                let got = attend(&pool, &kv, &q, n, t);
                let mut worst = 0f64;
                for ti in 0..t {
                    for h in 0..SHAPE.n_head {
                        let at = ti * q_dim + h * SHAPE.head_dim;
                        let want = attend_f64(&kv, h, &q[at..at + SHAPE.head_dim], n - t + ti);
                        let scale = want.iter().fold(0f64, |a, b| a.max(b.abs()));
                        for (g, w) in got[at..at + SHAPE.head_dim].iter().zip(&want) {
                            worst = worst.max((*g as f64 - w).abs() / scale);
                        }
                    }
                }
                assert!(worst < 1e-5, "{ty:?}, {n} positions: relative error {worst:e}");
                // Alone, each query gives the bits it gave in the batch.
                for ti in 0..t {
                    let pos = n - t + ti;
                    let qi = &q[ti * q_dim..(ti + 1) * q_dim];
                    let mut one = vec![0f32; q_dim];
                    attention(&pool, &kv, 0, &SHAPE, qi, pos, &mut one);
                    let batched = &got[ti * q_dim..(ti + 1) * q_dim];
                    assert!(
                        one.iter().zip(batched).all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{ty:?}, {n}: query {ti}"
                    );
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
}
