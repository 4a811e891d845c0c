//! A chunk's pass: for the queries of a work item, the keys `c0..c0 + CHUNK_KEYS` tile by tile with an
//! online softmax, leaving each query's (m, l, acc) in the scratch for `plan.rs` to merge. One body
//! (`chunk_body`) with three instances: portable, AVX2 (the same body compiled with AVX2 and explicit 8-lane
//! scores) and AVX-512 (key-pair tiles, 16-lane products), chosen once per pass by `chunk_pass`. The
//! portable steps live here and their vector forms in `simd.rs`; every instance must give the portable
//! one's bits, so no step may reorder, fuse or skip an operation (`exp_nonpos` stands in for `exp` for
//! the same reason).

use std::ops::Range;

use crate::quant::{self, QK};

use super::exp::exp_nonpos;
#[cfg(target_arch = "x86_64")]
use super::simd::{
    scores_avx2, scores_avx2_group, scores_avx512, scores_avx512_group, scores_q8_avx2, weigh_values_avx2,
    weigh_values_avx2_group, weigh_values_avx512, weigh_values_avx512_group, weights_avx2, weights_avx512,
};
use super::tile::{load_tile, load_tile_q8};
use super::{Layer, Queries, Scratch, CHUNK_KEYS, KEY_TILE, Q8_BLOCK};

/// Queries of a work item that share a tile's loads (the same KV head and keys): at most this many at once
/// (`group_max` says how many each instance takes: as many as its registers hold).
const GROUP: usize = 3;

/// The most queries an instance takes in one pass over a tile, as many as its registers hold: AVX-512
/// three (the lane sums end in `vhaddps`, which reaches only the first 16 of its 32 registers, so LLVM
/// keeps a pass's sums there: four queries' 16 spill), AVX2 two (three spill), the portable loop one.
const fn group_max(avx2: bool, wide: bool) -> usize {
    if wide {
        3
    } else if avx2 {
        2
    } else {
        1
    }
}

/// One chunk's pass (keys `c0..c0 + CHUNK_KEYS`, up to the last query's position) over the KV heads
/// `heads` (the queries in `s.queries` read those), from a fresh state: leaves each query's (m, l, acc) in
/// `s`. A query before the chunk keeps the empty state.
pub(super) fn chunk_pass(ctx: &Layer, heads: Range<usize>, q: Queries, c0: usize, s: &mut Scratch) {
    #[cfg(target_arch = "x86_64")]
    if quant::simd_level() == quant::SimdLevel::Avx512 && ctx.head_dim.is_multiple_of(64) {
        // SAFETY: AVX-512 F/BW/VL and AVX2/FMA/F16C were detected; the body is plain Rust.
        return unsafe { chunk_avx512(ctx, heads, q, c0, s) };
    }
    #[cfg(target_arch = "x86_64")]
    if quant::simd_level().avx2() {
        // SAFETY: AVX2 and FMA were detected; the body is plain Rust.
        return unsafe { chunk_avx2(ctx, heads, q, c0, s) };
    }
    chunk_body::<false, false>(ctx, heads, q, c0, s)
}

/// `chunk_body` compiled with AVX2, so its loops run on 8-lane vectors (same operations, same bits).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn chunk_avx2(ctx: &Layer, heads: Range<usize>, q: Queries, c0: usize, s: &mut Scratch) {
    chunk_body::<true, false>(ctx, heads, q, c0, s)
}

/// `chunk_body` compiled with AVX-512, its score and value products on 16-lane vectors: two keys' eight
/// lanes per register, and sixteen output dimensions per register (same operations, same bits).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(super) unsafe fn chunk_avx512(ctx: &Layer, heads: Range<usize>, q: Queries, c0: usize, s: &mut Scratch) {
    chunk_body::<true, true>(ctx, heads, q, c0, s)
}

/// The chunk's pass; `AVX2` (only where it was detected) computes the scores with explicit 8-lane
/// vectors, the same multiplies and adds in the same order as the portable loop; `WIDE` (with `AVX2`, only
/// where AVX-512 was detected, `head_dim` a multiple of 64) holds the K tile as key pairs (`load_tile`) and
/// runs the products on 16-lane vectors.
///
/// Tile by tile, for each query that reaches the tile: its scores against the tile's keys, their weights
/// against the running max, then the online-softmax step (the running sum and output rescaled by `alpha`,
/// the tile's weights and weighted values added).
#[inline(always)]
pub(super) fn chunk_body<const AVX2: bool, const WIDE: bool>(
    ctx: &Layer,
    heads: Range<usize>,
    q: Queries,
    c0: usize,
    s: &mut Scratch,
) {
    let hd = ctx.head_dim;
    let Some(last) = s.queries.iter().map(|x| x.pos).max() else { return };
    let end = last.min(c0 + CHUNK_KEYS - 1);
    // A tile row holds the heads `heads`, one after the other.
    let stride = heads.len() * hd;
    start_chunk(ctx, stride, s);
    let Scratch { k, kq, kd, v, m, l, acc, queries, .. } = s;
    // In a sliding-window layer the tiles before every query's window are not read (their pages may be
    // gone).
    let lo = queries.iter().map(|x| x.lo).min().unwrap_or(0);
    let first = c0.max(lo / KEY_TILE * KEY_TILE);
    for start in (first..=end).step_by(KEY_TILE) {
        let n_keys = KEY_TILE.min(end + 1 - start);
        if ctx.int8 {
            load_tile_q8::<AVX2>(ctx, heads.clone(), start, n_keys, kq, kd, v);
        } else {
            load_tile::<AVX2, WIDE>(ctx, heads.clone(), start, n_keys, k, v);
        }
        let mut qi = 0;
        while qi < queries.len() {
            let query = queries[qi];
            if query.pos < start || start + n_keys <= query.lo {
                qi += 1;
                continue;
            }
            let valid = n_keys.min(query.pos + 1 - start);
            // The queries that follow with the same keys (KV head, and count of keys read in this tile) share
            // the tile's loads: up to `GROUP` at once.
            let n = 1 + queries[qi + 1..]
                .iter()
                .take(group_max(AVX2, WIDE) - 1)
                .take_while(|x| {
                    x.kvh == query.kvh && x.lo <= start && x.pos >= start && n_keys.min(x.pos + 1 - start) == valid
                })
                .count();
            let off = (query.kvh - heads.start) * hd;
            let mut sc = [[0f32; KEY_TILE]; GROUP];
            if ctx.int8 {
                for (j, x) in queries[qi..qi + n].iter().enumerate() {
                    let qb = &q.blocks[x.q_at / QK * Q8_BLOCK..(x.q_at + hd) / QK * Q8_BLOCK];
                    tile_scores_q8::<AVX2>(qb, &kq[off..], &kd[off / QK * KEY_TILE..], stride, &mut sc[j]);
                }
            } else {
                let qv = |j: usize| &q.f[queries[qi + j].q_at..queries[qi + j].q_at + hd];
                tile_scores_group::<AVX2, WIDE>(n, qv, k, off, stride, &mut sc);
            }
            let mut p = [[0f32; KEY_TILE]; GROUP];
            let mut alpha = [0f32; GROUP];
            for j in 0..n {
                let (x, sc, p) = (&queries[qi + j], &mut sc[j], &mut p[j]);
                let qi = qi + j;
                let mut scale = ctx.scale;
                if let Some(c) = ctx.softcap {
                    for a in &mut sc[..valid] {
                        *a = c * (*a * scale / c).tanh();
                    }
                    scale = 1.0;
                }
                // Keys before the query's window (the first lanes of its first tile) get a weight of exactly 0.
                let skip = x.lo.saturating_sub(start);
                sc[..skip].fill(f32::NEG_INFINITY);
                let m_new = tile_weights::<AVX2, WIDE>(sc, valid, scale, m[qi], p);
                p[..skip].fill(0.0);
                alpha[j] = if m[qi] == f32::NEG_INFINITY { 0.0 } else { exp_nonpos(m[qi] - m_new) };
                l[qi] = l[qi] * alpha[j] + sum_tile(p);
                m[qi] = m_new;
            }
            let o = &mut acc[qi * hd..(qi + n) * hd];
            weigh_group::<AVX2, WIDE>(n, o, &alpha, &p, valid, &v[off..], stride);
            qi += n;
        }
    }
}

/// `tile_scores` for the `n` (at most `GROUP`) queries `qv(0..n)` against the same head of the tile: on
/// AVX2, in one pass over the keys (`scores_avx2_group`, the same bits), else one query at a time.
#[inline(always)]
fn tile_scores_group<'q, const AVX2: bool, const WIDE: bool>(
    n: usize,
    qv: impl Fn(usize) -> &'q [f32],
    k: &[f32],
    off: usize,
    stride: usize,
    sc: &mut [[f32; KEY_TILE]; GROUP],
) {
    #[cfg(target_arch = "x86_64")]
    if WIDE && n > 1 {
        // SAFETY: AVX-512 detected (see `chunk_pass`); `k` holds KEY_TILE / 2 key pairs of `stride`.
        unsafe {
            let k = &k[2 * off..];
            match n {
                2 => scores_avx512_group::<2>([qv(0), qv(1)], k, stride, sc),
                _ => scores_avx512_group::<3>([qv(0), qv(1), qv(2)], k, stride, sc),
            }
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if AVX2 && n > 1 {
        // SAFETY: AVX2 detected (see `chunk_pass`); `k[off..]` holds KEY_TILE rows of `stride`.
        unsafe { scores_avx2_group::<2>([qv(0), qv(1)], &k[off..], stride, sc) }
        return;
    }
    for (j, sc) in sc.iter_mut().enumerate().take(n) {
        tile_scores::<AVX2, WIDE>(qv(j), k, off, stride, sc);
    }
}

/// `weigh_tile` for the `n` (at most `GROUP`) queries whose outputs are `o` (one after the other), each
/// with its `alpha` and the first `valid` of its weights `p`: on AVX2, in one pass over the value rows
/// (`weigh_values_avx2_group`, the same bits), else one query at a time.
#[inline(always)]
fn weigh_group<const AVX2: bool, const WIDE: bool>(
    n: usize,
    o: &mut [f32],
    alpha: &[f32; GROUP],
    p: &[[f32; KEY_TILE]; GROUP],
    valid: usize,
    v: &[f32],
    stride: usize,
) {
    let hd = o.len() / n;
    #[cfg(target_arch = "x86_64")]
    if WIDE && n > 1 {
        let p = |j: usize| &p[j][..valid];
        // SAFETY: AVX-512 detected (see `chunk_pass`, `hd` a multiple of 64); `v` holds `valid` rows of
        // `stride`.
        unsafe {
            match n {
                2 => weigh_values_avx512_group::<2>(o, [alpha[0], alpha[1]], [p(0), p(1)], v, stride),
                _ => weigh_values_avx512_group::<3>(o, *alpha, [p(0), p(1), p(2)], v, stride),
            }
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if AVX2 && n > 1 && hd.is_multiple_of(32) {
        // SAFETY: AVX2 detected (see `chunk_pass`); `v` holds `valid` rows of `stride`.
        unsafe { weigh_values_avx2_group::<2>(o, [alpha[0], alpha[1]], [&p[0][..valid], &p[1][..valid]], v, stride) }
        return;
    }
    for (j, o) in o.chunks_exact_mut(hd).enumerate() {
        weigh_tile::<AVX2, WIDE>(o, alpha[j], &p[j][..valid], v, stride);
    }
}

/// Sizes the tile buffers for rows of `stride` values and sets every query's chunk state to the empty one:
/// m = -inf, l = 0, acc = 0.
#[inline(always)]
fn start_chunk(ctx: &Layer, stride: usize, s: &mut Scratch) {
    let nq = s.queries.len();
    if ctx.int8 {
        s.kq.resize(KEY_TILE * stride, 0);
        s.kd.resize(KEY_TILE * stride / QK, 0.0);
    } else {
        s.k.resize(KEY_TILE * stride, 0.0);
    }
    s.v.resize(KEY_TILE * stride, 0.0);
    s.m.clear();
    s.m.resize(nq, f32::NEG_INFINITY);
    s.l.clear();
    s.l.resize(nq, 0.0);
    s.acc.clear();
    s.acc.resize(nq * ctx.head_dim, 0.0);
}

/// A query's scores against an f32 K tile (its head at `off` in rows of `stride`), by the instance's
/// `scores`: the key-pair form under `WIDE` (the tile holds pairs, the head at twice its offset), 8-lane
/// vectors under `AVX2`, else the portable loop.
#[inline(always)]
fn tile_scores<const AVX2: bool, const WIDE: bool>(
    qv: &[f32],
    k: &[f32],
    off: usize,
    stride: usize,
    sc: &mut [f32; KEY_TILE],
) {
    let kh = &k[off..];
    #[cfg(target_arch = "x86_64")]
    if WIDE {
        // SAFETY: AVX-512 detected (see `chunk_pass`); `k` holds KEY_TILE / 2 key pairs of `stride`.
        return unsafe { scores_avx512(qv, &k[2 * off..], stride, sc) };
    }
    #[cfg(target_arch = "x86_64")]
    if AVX2 {
        // SAFETY: AVX2 detected (see `chunk_pass`); `kh` holds KEY_TILE rows of `stride`.
        return unsafe { scores_avx2(qv, kh, stride, sc) };
    }
    scores(qv, kh, stride, sc)
}

/// A query's scores against an int8 K tile (`kq`, `kd`: the head's quants and block scales) by the
/// instance's `scores_q8`.
#[inline(always)]
fn tile_scores_q8<const AVX2: bool>(qb: &[u8], kq: &[i8], kd: &[f32], stride: usize, sc: &mut [f32; KEY_TILE]) {
    #[cfg(target_arch = "x86_64")]
    if AVX2 {
        // SAFETY: AVX2 detected (see `chunk_pass`); `kq` holds KEY_TILE rows of `stride`, `kd` the head's
        // blocks of KEY_TILE scales.
        return unsafe { scores_q8_avx2(qb, kq, kd, stride, sc) };
    }
    scores_q8(qb, kq, kd, stride, sc)
}

/// A tile's weights and the new running max by the instance's `weights`.
#[inline(always)]
fn tile_weights<const AVX2: bool, const WIDE: bool>(
    sc: &mut [f32; KEY_TILE],
    valid: usize,
    scale: f32,
    m_old: f32,
    p: &mut [f32; KEY_TILE],
) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if WIDE {
        // SAFETY: AVX-512 detected (see `chunk_pass`).
        return unsafe { weights_avx512(sc, valid, scale, m_old, p) };
    }
    #[cfg(target_arch = "x86_64")]
    if AVX2 {
        // SAFETY: AVX2 detected (see `chunk_pass`).
        return unsafe { weights_avx2(sc, valid, scale, m_old, p) };
    }
    weights(sc, valid, scale, m_old, p)
}

/// The output's online-softmax step by the instance's `weigh_values`: `o = o * alpha + sum of p[i] * v[i]`
/// (row `i` of `v` at `i * stride`), the AVX2 form only where `o.len()` is a multiple of 64.
#[inline(always)]
fn weigh_tile<const AVX2: bool, const WIDE: bool>(o: &mut [f32], alpha: f32, p: &[f32], v: &[f32], stride: usize) {
    #[cfg(target_arch = "x86_64")]
    if WIDE {
        // SAFETY: AVX-512 detected (see `chunk_pass`); `v` holds `p.len()` rows of `stride`, and `o.len()`
        // is a multiple of 64.
        return unsafe { weigh_values_avx512(o, alpha, p, v, stride) };
    }
    #[cfg(target_arch = "x86_64")]
    if AVX2 && o.len().is_multiple_of(64) {
        // SAFETY: AVX2 detected (see `chunk_pass`); `v` holds `p.len()` rows of `stride`.
        return unsafe { weigh_values_avx2(o, alpha, p, v, stride) };
    }
    weigh_values(o, alpha, p, v, stride)
}

/// A tile's softmax weights against the running max `m_old`: the scores `sc` of the first `valid` keys
/// scaled by `scale`, their max with `m_old` (returned: the new running max), and `p[i] = e^(score - max)`
/// for those keys, 0 for the rest.
#[inline(always)]
fn weights(sc: &mut [f32; KEY_TILE], valid: usize, scale: f32, m_old: f32, p: &mut [f32; KEY_TILE]) -> f32 {
    for (i, a) in sc.iter_mut().enumerate() {
        *a = if i < valid { *a * scale } else { f32::NEG_INFINITY };
    }
    let tile_max = sc.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    let m_new = m_old.max(tile_max);
    for (i, (w, &a)) in p.iter_mut().zip(sc.iter()).enumerate() {
        *w = if i < valid { exp_nonpos(a - m_new) } else { 0.0 };
    }
    m_new
}

/// `o = o * alpha + sum over i of p[i] * v[i]` (row `i` of `v` at `i * stride`), the keys in order, for
/// each of `o`'s dimensions.
#[inline(always)]
fn weigh_values(o: &mut [f32], alpha: f32, p: &[f32], v: &[f32], stride: usize) {
    let hd = o.len();
    for x in o.iter_mut() {
        *x *= alpha;
    }
    for (i, &w) in p.iter().enumerate() {
        for (x, &y) in o.iter_mut().zip(&v[i * stride..i * stride + hd]) {
            *x += w * y;
        }
    }
}

/// `sc[i] = q . k[i]` (row `i` of `k` at `i * stride`) for the tile's keys: eight lanes, lane `j` summing
/// the products of dimensions `j, j + 8, ..` in order, then the lanes in pairs
/// (`((0+1)+(2+3))+((4+5)+(6+7))`).
#[inline(always)]
fn scores(qv: &[f32], k: &[f32], stride: usize, sc: &mut [f32; KEY_TILE]) {
    let hd = qv.len();
    for (i, a) in sc.iter_mut().enumerate() {
        let kr = &k[i * stride..i * stride + hd];
        let mut l = [0f32; 8];
        for (qc, kc) in qv.chunks_exact(8).zip(kr.chunks_exact(8)) {
            for j in 0..8 {
                l[j] += qc[j] * kc[j];
            }
        }
        *a = ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
    }
}

/// `sc[i]`: key `i`'s score against the q8_0 query `qb` (its blocks, 34 bytes each): block by block in
/// order, `s += (d_k * d_q) * isum` from `s = 0`, with `isum` the block's exact integer sum of products.
/// Key `i`'s quants are row `i` of `kq` (at `i * stride`), its block `b`'s scale `kd[b * KEY_TILE + i]`.
#[inline(always)]
fn scores_q8(qb: &[u8], kq: &[i8], kd: &[f32], stride: usize, sc: &mut [f32; KEY_TILE]) {
    for (i, a) in sc.iter_mut().enumerate() {
        let mut s = 0f32;
        for (b, block) in qb.chunks_exact(Q8_BLOCK).enumerate() {
            let dq = half::f16::from_le_bytes([block[0], block[1]]).to_f32();
            let kr = &kq[i * stride + b * QK..i * stride + (b + 1) * QK];
            let isum: i32 = kr.iter().zip(&block[2..]).map(|(&k, &q)| k as i32 * q as i8 as i32).sum();
            s += (kd[b * KEY_TILE + i] * dq) * isum as f32;
        }
        *a = s;
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
