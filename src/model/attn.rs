//! Attention on the CPU over the paged KV cache, in the flash-attention scheme: keys in tiles of
//! `KEY_TILE` positions with an online softmax (a running max, sum and output per query, rescaled tile by
//! tile) inside chunks of `CHUNK_KEYS` keys, whose states are then merged in order. No score row as long
//! as the context is kept. A batch runs a query's chunks one after the other, converting each K and V tile
//! to f32 once for all the heads of a GQA group and up to `QUERY_TOKENS` tokens; decoding (one block of
//! tokens) runs the chunks on the threads, each over whole KV rows (every head, contiguous memory).
//!
//! What it keeps of the engine's promises:
//! - Batch invariance: a query's result is computed by the same operations in the same order whatever
//!   other queries share its pass and whichever thread runs a chunk. Tiles and chunks start at multiples of
//!   `KEY_TILE` and `CHUNK_KEYS` (absolute positions), a query reads only its keys (the other lanes of its
//!   last tile are masked to a weight of exactly 0), and every reduction (over head dimensions, over a
//!   tile's keys, over tiles, over chunks) has a fixed order. So logits are bit-identical across batch
//!   sizes, chunkings and thread counts, and a restored cache gives what a reread one does.
//! - Page location: on the CPU every page is host memory and is read the same way; a tile never straddles
//!   a page (`KV_PAGE_TOKENS` is a multiple of `KEY_TILE`).
//! - The arithmetic is plain f32 (no fused multiply-adds, which Rust never contracts), with `exp` from a
//!   polynomial (`exp_nonpos`), so the AVX2 instance (the same code compiled with AVX2 enabled, for 8-lane
//!   vectors) and the portable one give the same bits.
//!
//! Hot path: a key's score is eight lanes of products summed in a fixed tree, eight keys per step; the
//! weighted sum of V runs along the head dimension with the output in registers. Scratch lives per thread
//! (`SCRATCH`) and the chunk states in the caller's `PARTIALS`: decoding allocates nothing per token.
//!
//! With int8 KV (q8_0 rows) the scores are integer dot products, as llama.cpp's quantized-KV path: each
//! query is quantized to q8_0 once per call (`quantize_queries`, the activations' quantizer), the K tile
//! keeps its 8-bit values, and a key's score is, block by block in order, `(d_k * d_q) * isum` added up in
//! f32, where `isum` is the block's exact integer sum. Integer sums have one value in any order, so every
//! instance gives the same bits here too. The values stay f32 (converted once per tile).

use std::cell::RefCell;
use std::ops::Range;

use half::slice::HalfFloatSliceExt;

use crate::quant::{self, GgmlType, QK};
use crate::threadpool::{split_range, SharedMut, ThreadPool};

use super::kv::{KvCache, KvPage, KvRows, KV_PAGE_TOKENS};
use super::ops::AttnShape;

/// Keys per tile.
pub const KEY_TILE: usize = 32;
/// Bytes of a q8_0 block (int8 KV rows and the quantized queries): an f16 scale, then `QK` signed bytes.
const Q8_BLOCK: usize = 2 + QK;
/// Keys per chunk: a query attends its keys chunk by chunk (tiles with an online softmax inside a chunk,
/// from a fresh state), and the chunks' states are merged in order. Decoding runs a query's chunks on
/// different threads; a batch runs them one after the other. Same operations either way.
pub const CHUNK_KEYS: usize = 256;
/// Tokens of a batch whose queries share one pass over the keys.
const QUERY_TOKENS: usize = 8;

const _: () = assert!(KV_PAGE_TOKENS.is_multiple_of(KEY_TILE), "a tile must not straddle a page");
const _: () = assert!(CHUNK_KEYS.is_multiple_of(KEY_TILE), "a tile must not straddle a chunk");

/// One query of a pass: its vector, its last key position (causal: keys `0..=pos`) and where its output
/// goes (an offset into the output, `head_dim` values).
#[derive(Clone, Copy)]
struct Query {
    q_at: usize,
    pos: usize,
    out_at: usize,
    kvh: usize,
}

/// Per-thread buffers of a pass.
#[derive(Default)]
struct Scratch {
    k: Vec<f32>,     // (KEY_TILE, heads of the tile, head_dim); with int8 KV unused
    kq: Vec<i8>,     // (KEY_TILE, heads of the tile, head_dim): int8 KV's key quants
    kd: Vec<f32>,    // (heads of the tile * head_dim / 32, KEY_TILE): int8 KV's key block scales, by block
    v: Vec<f32>,     // (KEY_TILE, heads of the tile, head_dim)
    m: Vec<f32>,     // (queries): a chunk's running max of the scores
    l: Vec<f32>,     // (queries): a chunk's running sum of the weights
    acc: Vec<f32>,   // (queries, head_dim): a chunk's running weighted sum of V
    total: Vec<f32>, // (queries, 2 + head_dim): the merged chunks' (m, l, acc)
    queries: Vec<Query>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
    /// The caller's buffer of chunk states when a query's chunks run on different threads:
    /// (items, queries per item, 2 + head_dim).
    static PARTIALS: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// The caller's queries quantized to q8_0 for int8 KV: (t_count, n_head * head_dim / 32) blocks.
    static QUERY_BLOCKS: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// The queries of a call: `f` (t_count, n_head * head_dim) in f32, and with int8 KV `blocks`, the same
/// values as q8_0 blocks (34 bytes per 32 values: an f16 scale, then 32 signed bytes) for the scores.
#[derive(Clone, Copy)]
struct Queries<'a> {
    f: &'a [f32],
    blocks: &'a [u8],
}

/// Quantizes `q` to q8_0 blocks in `blocks` (the activations' quantizer, llama.cpp's for a quantized-KV
/// product). Every 32 values are one block, so a head's blocks are its own (`head_dim` is a multiple of 32
/// for int8 KV).
fn quantize_queries(q: &[f32], blocks: &mut Vec<u8>) {
    blocks.resize(q.len() / QK * Q8_BLOCK, 0);
    quant::quantize_row_act(GgmlType::Q8_0, q, blocks);
}

/// What a pass needs to find a head's rows in the layer's pages.
struct Layer<'a> {
    pages: &'a [KvPage],
    kv_dim: usize,
    head_dim: usize,
    row_bytes: usize,
    head_bytes: usize,
    scale: f32,
    /// K and V are q8_0 rows: the scores are integer dot products against the quantized queries.
    int8: bool,
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
    let AttnShape { n_head_kv, head_dim, .. } = *shape;
    let ctx = Layer {
        pages: &kv.layers[layer].pages,
        kv_dim: n_head_kv * head_dim,
        head_dim,
        row_bytes: kv.ty.row_bytes(n_head_kv * head_dim),
        head_bytes: kv.ty.row_bytes(head_dim),
        scale: 1.0 / (head_dim as f32).sqrt(),
        int8: kv.ty == super::KvType::Int8,
    };
    QUERY_BLOCKS.with_borrow_mut(|blocks| {
        if ctx.int8 {
            quantize_queries(q, blocks);
        }
        let q = Queries { f: q, blocks };
        attend_all(pool, &ctx, shape, q, pos0, out);
    });
}

/// `attention` with the layer found and the queries ready.
fn attend_all(pool: &ThreadPool, ctx: &Layer, shape: &AttnShape, q: Queries, pos0: usize, out: &mut [f32]) {
    let AttnShape { n_head, n_head_kv, head_dim } = *shape;
    let q_dim = n_head * head_dim;
    let t_count = q.f.len() / q_dim;
    let group = n_head / n_head_kv;
    // A work item is a block of tokens with all the heads of one KV head (each K/V tile converted once for
    // them all). With one block (decoding, small batches) that is too few items for the threads, so there
    // an item is a chunk of the keys for every head, read as whole rows (contiguous memory), and the
    // chunks' states are merged after. Which queries share a pass, and on which thread a chunk runs,
    // changes no bit.
    let n_blocks = t_count.div_ceil(QUERY_TOKENS);
    let queries_of = |block: usize, kv_heads: Range<usize>, list: &mut Vec<Query>| {
        list.clear();
        for t in block * QUERY_TOKENS..((block + 1) * QUERY_TOKENS).min(t_count) {
            for h in kv_heads.start * group..kv_heads.end * group {
                let at = t * q_dim + h * head_dim;
                list.push(Query { q_at: at, pos: pos0 + t, out_at: at, kvh: h / group });
            }
        }
    };
    let shared_out = SharedMut::new(out);
    let n_key_chunks = (pos0 + t_count).div_ceil(CHUNK_KEYS);
    if n_blocks == 1 && n_key_chunks > 1 {
        let per_item = t_count * n_head * (2 + head_dim);
        let items = n_key_chunks;
        PARTIALS.with_borrow_mut(|partials| {
            partials.resize(items * per_item, 0.0);
            let shared = SharedMut::new(partials);
            let n_chunks = pool.chunks_for(items);
            pool.run(n_chunks, |chunk| {
                SCRATCH.with_borrow_mut(|s| {
                    for c in split_range(chunk, n_chunks, items) {
                        queries_of(0, 0..n_head_kv, &mut s.queries);
                        chunk_pass(ctx, 0..n_head_kv, q, c * CHUNK_KEYS, s);
                        // SAFETY: each item writes its own slot.
                        save_chunk(s, head_dim, unsafe { shared.slice(c * per_item, per_item) });
                    }
                })
            });
            SCRATCH.with_borrow_mut(|s| {
                queries_of(0, 0..n_head_kv, &mut s.queries);
                start_totals(s, head_dim);
                for c in 0..n_key_chunks {
                    merge_saved(s, head_dim, c * CHUNK_KEYS, &partials[c * per_item..(c + 1) * per_item]);
                }
                write_out(s, head_dim, shared_out);
            });
        });
        return;
    }
    let items = n_blocks * n_head_kv;
    let n_chunks = pool.chunks_for(items);
    pool.run(n_chunks, |chunk| {
        SCRATCH.with_borrow_mut(|s| {
            for item in split_range(chunk, n_chunks, items) {
                let kvh = item % n_head_kv;
                queries_of(item / n_head_kv, kvh..kvh + 1, &mut s.queries);
                let last = s.queries.iter().map(|x| x.pos).max().unwrap_or(0);
                start_totals(s, head_dim);
                for c0 in (0..=last).step_by(CHUNK_KEYS) {
                    chunk_pass(ctx, kvh..kvh + 1, q, c0, s);
                    merge_chunk(s, head_dim, c0);
                }
                write_out(s, head_dim, shared_out);
            }
        })
    });
}

/// One chunk's pass (keys `c0..c0 + CHUNK_KEYS`, up to the last query's position) over the KV heads
/// `heads` (the queries in `s.queries` read those), from a fresh state: leaves each query's (m, l, acc) in
/// `s`. A query before the chunk keeps the empty state.
fn chunk_pass(ctx: &Layer, heads: Range<usize>, q: Queries, c0: usize, s: &mut Scratch) {
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
unsafe fn chunk_avx2(ctx: &Layer, heads: Range<usize>, q: Queries, c0: usize, s: &mut Scratch) {
    chunk_body::<true, false>(ctx, heads, q, c0, s)
}

/// `chunk_body` compiled with AVX-512, its score and value products on 16-lane vectors: two keys' eight
/// lanes per register, and sixteen output dimensions per register (same operations, same bits).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn chunk_avx512(ctx: &Layer, heads: Range<usize>, q: Queries, c0: usize, s: &mut Scratch) {
    chunk_body::<true, true>(ctx, heads, q, c0, s)
}

/// Sets every query's merged state to the empty one: m = -inf, l = 0, acc = 0.
fn start_totals(s: &mut Scratch, hd: usize) {
    s.total.clear();
    s.total.resize(s.queries.len() * (2 + hd), 0.0);
    for t in s.total.chunks_exact_mut(2 + hd) {
        t[0] = f32::NEG_INFINITY;
    }
}

/// Copies the chunk's states into `slot`: (queries, 2 + hd) as (m, l, acc).
fn save_chunk(s: &Scratch, hd: usize, slot: &mut [f32]) {
    for (qi, o) in slot.chunks_exact_mut(2 + hd).take(s.queries.len()).enumerate() {
        o[0] = s.m[qi];
        o[1] = s.l[qi];
        o[2..].copy_from_slice(&s.acc[qi * hd..(qi + 1) * hd]);
    }
}

/// Merges the states of the chunk at `c0` that `save_chunk` wrote into the totals.
fn merge_saved(s: &mut Scratch, hd: usize, c0: usize, slot: &[f32]) {
    for ((query, t), st) in s.queries.iter().zip(s.total.chunks_exact_mut(2 + hd)).zip(slot.chunks_exact(2 + hd)) {
        if query.pos >= c0 {
            merge(t, st[0], st[1], &st[2..]);
        }
    }
}

/// Merges the chunk states `chunk_pass` left in `s` into the totals.
fn merge_chunk(s: &mut Scratch, hd: usize, c0: usize) {
    let Scratch { m, l, acc, total, queries, .. } = s;
    for (qi, (query, t)) in queries.iter().zip(total.chunks_exact_mut(2 + hd)).enumerate() {
        if query.pos >= c0 {
            merge(t, m[qi], l[qi], &acc[qi * hd..(qi + 1) * hd]);
        }
    }
}

/// Merges a chunk's state (`m`, `l`, `acc`) into a query's total `t` = (m, l, acc...). Into the empty total
/// it gives the chunk's state exactly (weights 0 and e^0 = 1).
#[inline(always)]
fn merge(t: &mut [f32], m: f32, l: f32, acc: &[f32]) {
    let m_new = t[0].max(m);
    let a = if t[0] == f32::NEG_INFINITY { 0.0 } else { exp_nonpos(t[0] - m_new) };
    let b = exp_nonpos(m - m_new);
    t[0] = m_new;
    t[1] = t[1] * a + l * b;
    for (x, &y) in t[2..].iter_mut().zip(acc) {
        *x = *x * a + y * b;
    }
}

/// Each query's output: its total weighted V over its total weight.
fn write_out(s: &Scratch, hd: usize, out: SharedMut<f32>) {
    for (query, t) in s.queries.iter().zip(s.total.chunks_exact(2 + hd)) {
        let inv = 1.0 / t[1];
        // SAFETY: a query's output is written by the one item that holds it.
        let o = unsafe { out.slice(query.out_at, hd) };
        for (y, &x) in o.iter_mut().zip(&t[2..]) {
            *y = x * inv;
        }
    }
}

/// The chunk's pass; `AVX2` (only where it was detected) computes the scores with explicit 8-lane
/// vectors, the same multiplies and adds in the same order as the portable loop; `WIDE` (with `AVX2`, only
/// where AVX-512 was detected, `head_dim` a multiple of 64) holds the K tile as key pairs (`load_tile`) and
/// runs the products on 16-lane vectors.
#[inline(always)]
fn chunk_body<const AVX2: bool, const WIDE: bool>(
    ctx: &Layer,
    heads: Range<usize>,
    q: Queries,
    c0: usize,
    s: &mut Scratch,
) {
    let hd = ctx.head_dim;
    let nq = s.queries.len();
    let Some(last) = s.queries.iter().map(|x| x.pos).max() else { return };
    let end = last.min(c0 + CHUNK_KEYS - 1);
    // A tile row holds the heads `heads`, one after the other.
    let stride = heads.len() * hd;
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
    s.acc.resize(nq * hd, 0.0);
    let Scratch { k, kq, kd, v, m, l, acc, queries, .. } = s;
    for start in (c0..=end).step_by(KEY_TILE) {
        let n_keys = KEY_TILE.min(end + 1 - start);
        if ctx.int8 {
            load_tile_q8::<AVX2>(ctx, heads.clone(), start, n_keys, kq, kd, v);
        } else {
            load_tile::<AVX2, WIDE>(ctx, heads.clone(), start, n_keys, k, v);
        }
        for (qi, query) in queries.iter().enumerate() {
            if query.pos < start {
                continue;
            }
            let valid = n_keys.min(query.pos + 1 - start);
            let qv = &q.f[query.q_at..query.q_at + hd];
            let off = (query.kvh - heads.start) * hd;
            let vh = &v[off..];
            let mut sc = [0f32; KEY_TILE];
            if ctx.int8 {
                let qb = &q.blocks[query.q_at / QK * Q8_BLOCK..(query.q_at + hd) / QK * Q8_BLOCK];
                let (kqh, kdh) = (&kq[off..], &kd[off / QK * KEY_TILE..]);
                #[cfg(target_arch = "x86_64")]
                if AVX2 {
                    // SAFETY: AVX2 detected (see `chunk_pass`); `kqh` holds KEY_TILE rows of `stride`,
                    // `kdh` the head's blocks of KEY_TILE scales.
                    unsafe { scores_q8_avx2(qb, kqh, kdh, stride, &mut sc) };
                } else {
                    scores_q8(qb, kqh, kdh, stride, &mut sc);
                }
                #[cfg(not(target_arch = "x86_64"))]
                scores_q8(qb, kqh, kdh, stride, &mut sc);
            } else {
                let kh = &k[off..];
                #[cfg(target_arch = "x86_64")]
                if WIDE {
                    // SAFETY: AVX-512 detected (see `chunk_pass`); `k` holds KEY_TILE / 2 key pairs of `stride`.
                    unsafe { scores_avx512(qv, &k[2 * off..], stride, &mut sc) };
                } else if AVX2 {
                    // SAFETY: AVX2 detected (see `chunk_pass`); `kh` holds KEY_TILE rows of `stride`.
                    unsafe { scores_avx2(qv, kh, stride, &mut sc) };
                } else {
                    scores(qv, kh, stride, &mut sc);
                }
                #[cfg(not(target_arch = "x86_64"))]
                scores(qv, kh, stride, &mut sc);
            }
            let mut p = [0f32; KEY_TILE];
            #[cfg(target_arch = "x86_64")]
            let m_new = if WIDE {
                // SAFETY: AVX-512 detected (see `chunk_pass`).
                unsafe { weights_avx512(&sc, valid, ctx.scale, m[qi], &mut p) }
            } else if AVX2 {
                // SAFETY: AVX2 detected (see `chunk_pass`).
                unsafe { weights_avx2(&sc, valid, ctx.scale, m[qi], &mut p) }
            } else {
                weights(&mut sc, valid, ctx.scale, m[qi], &mut p)
            };
            #[cfg(not(target_arch = "x86_64"))]
            let m_new = weights(&mut sc, valid, ctx.scale, m[qi], &mut p);
            let alpha = if m[qi] == f32::NEG_INFINITY { 0.0 } else { exp_nonpos(m[qi] - m_new) };
            l[qi] = l[qi] * alpha + sum_tile(&p);
            m[qi] = m_new;
            let o = &mut acc[qi * hd..(qi + 1) * hd];
            #[cfg(target_arch = "x86_64")]
            if WIDE {
                // SAFETY: AVX-512 detected (see `chunk_pass`); `vh` holds `valid` rows of `stride`, and
                // `hd` is a multiple of 64.
                unsafe { weigh_values_avx512(o, alpha, &p[..valid], vh, stride) };
                continue;
            }
            #[cfg(target_arch = "x86_64")]
            if AVX2 && hd.is_multiple_of(64) {
                // SAFETY: AVX2 detected (see `chunk_pass`); `vh` holds `valid` rows of `stride`.
                unsafe { weigh_values_avx2(o, alpha, &p[..valid], vh, stride) };
                continue;
            }
            weigh_values(o, alpha, &p[..valid], vh, stride);
        }
    }
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

/// `weights` on 16-lane vectors (the same operations per key; the max is exact in any order, and no
/// value here is NaN).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn weights_avx512(sc: &[f32; KEY_TILE], valid: usize, scale: f32, m_old: f32, p: &mut [f32; KEY_TILE]) -> f32 {
    use std::arch::x86_64::*;
    const _: () = assert!(KEY_TILE == 32, "two 16-lane vectors per tile");
    let valid_mask = |half: usize| -> __mmask16 {
        let n = valid.saturating_sub(16 * half).min(16);
        ((1u32 << n) - 1) as __mmask16
    };
    let neg_inf = _mm512_set1_ps(f32::NEG_INFINITY);
    let scale = _mm512_set1_ps(scale);
    let halves = [0, 1].map(|h| {
        let x = _mm512_mul_ps(_mm512_loadu_ps(sc.as_ptr().add(16 * h)), scale);
        _mm512_mask_blend_ps(valid_mask(h), neg_inf, x)
    });
    let tile_max = _mm512_reduce_max_ps(_mm512_max_ps(halves[0], halves[1]));
    let m_new = m_old.max(tile_max);
    let m = _mm512_set1_ps(m_new);
    for (h, x) in halves.into_iter().enumerate() {
        let w = exp_nonpos_avx512(_mm512_sub_ps(x, m));
        _mm512_storeu_ps(p.as_mut_ptr().add(16 * h), _mm512_maskz_mov_ps(valid_mask(h), w));
    }
    m_new
}

/// `weights` on 8-lane vectors (as `weights_avx512`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn weights_avx2(sc: &[f32; KEY_TILE], valid: usize, scale: f32, m_old: f32, p: &mut [f32; KEY_TILE]) -> f32 {
    use std::arch::x86_64::*;
    let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    let valid_v = _mm256_set1_epi32(valid as i32);
    let neg_inf = _mm256_set1_ps(f32::NEG_INFINITY);
    let scale = _mm256_set1_ps(scale);
    let mut x = [_mm256_setzero_ps(); KEY_TILE / 8];
    let mut keep = [_mm256_setzero_ps(); KEY_TILE / 8];
    let mut max = neg_inf;
    for (j, (x, keep)) in x.iter_mut().zip(keep.iter_mut()).enumerate() {
        let index = _mm256_add_epi32(lanes, _mm256_set1_epi32(8 * j as i32));
        *keep = _mm256_castsi256_ps(_mm256_cmpgt_epi32(valid_v, index));
        let scaled = _mm256_mul_ps(_mm256_loadu_ps(sc.as_ptr().add(8 * j)), scale);
        *x = _mm256_blendv_ps(neg_inf, scaled, *keep);
        max = _mm256_max_ps(max, *x);
    }
    let mut lanes_max = [0f32; 8];
    _mm256_storeu_ps(lanes_max.as_mut_ptr(), max);
    let tile_max = lanes_max.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    let m_new = m_old.max(tile_max);
    let m = _mm256_set1_ps(m_new);
    for (j, (x, keep)) in x.iter().zip(&keep).enumerate() {
        let w = exp_nonpos_avx2(_mm256_sub_ps(*x, m));
        _mm256_storeu_ps(p.as_mut_ptr().add(8 * j), _mm256_and_ps(w, *keep));
    }
    m_new
}

/// `exp_nonpos` on eight lanes, operation for operation (so the same bits in every lane).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn exp_nonpos_avx2(x: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    let c = _mm256_set1_ps;
    let x = _mm256_max_ps(x, c(EXP_MIN));
    let round = c(EXP_ROUND);
    let n = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(x, c(std::f32::consts::LOG2_E)), round), round);
    let r = _mm256_sub_ps(_mm256_sub_ps(x, _mm256_mul_ps(n, c(EXP_LN2_HI))), _mm256_mul_ps(n, c(EXP_LN2_LO)));
    let mut p = c(EXP_POLY[0]);
    for &k in &EXP_POLY[1..] {
        p = _mm256_add_ps(_mm256_mul_ps(p, r), c(k));
    }
    let e = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(_mm256_mul_ps(p, r), r), r), c(1.0));
    let bits = _mm256_slli_epi32::<23>(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)));
    _mm256_mul_ps(e, _mm256_castsi256_ps(bits))
}

/// `exp_nonpos` on sixteen lanes, operation for operation (so the same bits in every lane).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[inline]
unsafe fn exp_nonpos_avx512(x: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    let c = _mm512_set1_ps;
    let x = _mm512_max_ps(x, c(EXP_MIN));
    let round = c(EXP_ROUND);
    let n = _mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(x, c(std::f32::consts::LOG2_E)), round), round);
    let r = _mm512_sub_ps(_mm512_sub_ps(x, _mm512_mul_ps(n, c(EXP_LN2_HI))), _mm512_mul_ps(n, c(EXP_LN2_LO)));
    let mut p = c(EXP_POLY[0]);
    for &k in &EXP_POLY[1..] {
        p = _mm512_add_ps(_mm512_mul_ps(p, r), c(k));
    }
    let e = _mm512_add_ps(_mm512_add_ps(_mm512_mul_ps(_mm512_mul_ps(p, r), r), r), c(1.0));
    let bits = _mm512_slli_epi32::<23>(_mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127)));
    _mm512_mul_ps(e, _mm512_castsi512_ps(bits))
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

/// `weigh_values` with the output held in registers, 64 dimensions at a time (`o.len()` a multiple of 64).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn weigh_values_avx2(o: &mut [f32], alpha: f32, p: &[f32], v: &[f32], stride: usize) {
    use std::arch::x86_64::*;
    let hd = o.len();
    assert!(hd.is_multiple_of(64) && (p.is_empty() || v.len() >= (p.len() - 1) * stride + hd));
    let a = _mm256_set1_ps(alpha);
    for d0 in (0..hd).step_by(64) {
        let mut acc = [_mm256_setzero_ps(); 8];
        for (j, x) in acc.iter_mut().enumerate() {
            *x = _mm256_mul_ps(_mm256_loadu_ps(o.as_ptr().add(d0 + 8 * j)), a);
        }
        for (i, &w) in p.iter().enumerate() {
            let b = _mm256_set1_ps(w);
            let vr = v.as_ptr().add(i * stride + d0);
            for (j, x) in acc.iter_mut().enumerate() {
                *x = _mm256_add_ps(*x, _mm256_mul_ps(b, _mm256_loadu_ps(vr.add(8 * j))));
            }
        }
        for (j, x) in acc.iter().enumerate() {
            _mm256_storeu_ps(o.as_mut_ptr().add(d0 + 8 * j), *x);
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

/// `scores` eight keys at a time: a vector of lanes per key, and the eight lane sums by `hadd`, which adds
/// in the same pairs.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scores_avx2(qv: &[f32], k: &[f32], stride: usize, sc: &mut [f32; KEY_TILE]) {
    use std::arch::x86_64::*;
    let hd = qv.len();
    assert!(hd.is_multiple_of(8) && k.len() >= (KEY_TILE - 1) * stride + hd);
    for i0 in (0..KEY_TILE).step_by(8) {
        let mut a = [_mm256_setzero_ps(); 8];
        for (c, qc) in qv.chunks_exact(8).enumerate() {
            let q = _mm256_loadu_ps(qc.as_ptr());
            for (j, x) in a.iter_mut().enumerate() {
                let kp = k.as_ptr().add((i0 + j) * stride + 8 * c);
                *x = _mm256_add_ps(*x, _mm256_mul_ps(q, _mm256_loadu_ps(kp)));
            }
        }
        _mm256_storeu_ps(
            sc.as_mut_ptr().add(i0),
            sum_key_lanes([
                _mm256_hadd_ps(a[0], a[1]),
                _mm256_hadd_ps(a[2], a[3]),
                _mm256_hadd_ps(a[4], a[5]),
                _mm256_hadd_ps(a[6], a[7]),
            ]),
        );
    }
}

/// Eight keys' scores from their lanes, already added in neighbouring pairs: `h[j] = hadd(key 2j, key 2j + 1)`,
/// where `hadd(x, y) = [x0+x1, x2+x3, y0+y1, y2+y3 | x4+x5, x6+x7, y4+y5, y6+y7]`. Each key's sum is
/// `((0+1)+(2+3))+((4+5)+(6+7))`, as `scores` adds it.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn sum_key_lanes(h: [std::arch::x86_64::__m256; 4]) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    // Keys 0..4: (0+1)+(2+3) in the low half, (4+5)+(6+7) in the high half; keys 4..8 likewise.
    let k03 = _mm256_hadd_ps(h[0], h[1]);
    let k47 = _mm256_hadd_ps(h[2], h[3]);
    let lo = _mm256_permute2f128_ps::<0x20>(k03, k47);
    let hi = _mm256_permute2f128_ps::<0x31>(k03, k47);
    _mm256_add_ps(lo, hi)
}

/// `weigh_values_avx2` on 16-lane vectors: each output dimension gets the same multiplies and adds in
/// the same order (`o.len()` a multiple of 64).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn weigh_values_avx512(o: &mut [f32], alpha: f32, p: &[f32], v: &[f32], stride: usize) {
    use std::arch::x86_64::*;
    let hd = o.len();
    assert!(hd.is_multiple_of(64) && (p.is_empty() || v.len() >= (p.len() - 1) * stride + hd));
    let a = _mm512_set1_ps(alpha);
    for d0 in (0..hd).step_by(64) {
        let mut acc = [_mm512_setzero_ps(); 4];
        for (j, x) in acc.iter_mut().enumerate() {
            *x = _mm512_mul_ps(_mm512_loadu_ps(o.as_ptr().add(d0 + 16 * j)), a);
        }
        for (i, &w) in p.iter().enumerate() {
            let b = _mm512_set1_ps(w);
            let vr = v.as_ptr().add(i * stride + d0);
            for (j, x) in acc.iter_mut().enumerate() {
                *x = _mm512_add_ps(*x, _mm512_mul_ps(b, _mm512_loadu_ps(vr.add(16 * j))));
            }
        }
        for (j, x) in acc.iter().enumerate() {
            _mm512_storeu_ps(o.as_mut_ptr().add(d0 + 16 * j), *x);
        }
    }
}

/// `scores_avx2` over a K tile held as key pairs (see `load_tile`): the eight lanes of keys `2p` and `2p + 1`
/// in one 16-lane vector, so one multiply and one add serve two keys; the lane sums as `scores_avx2`'s.
/// `k` starts at the head's first chunk in the pair layout (twice its offset in a plain row).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn scores_avx512(qv: &[f32], k: &[f32], stride: usize, sc: &mut [f32; KEY_TILE]) {
    use std::arch::x86_64::*;
    let hd = qv.len();
    assert!(hd.is_multiple_of(8) && k.len() >= (KEY_TILE / 2 - 1) * 2 * stride + 2 * hd);
    for i0 in (0..KEY_TILE).step_by(8) {
        let mut a = [_mm512_setzero_ps(); 4];
        for (c, qc) in qv.chunks_exact(8).enumerate() {
            let q8 = _mm256_loadu_ps(qc.as_ptr());
            let q = _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(q8)));
            for (j, x) in a.iter_mut().enumerate() {
                let kp = k.as_ptr().add((i0 / 2 + j) * 2 * stride + 16 * c);
                *x = _mm512_add_ps(*x, _mm512_mul_ps(q, _mm512_loadu_ps(kp)));
            }
        }
        // Key 2j's lanes in the low half of a[j], key 2j + 1's in the high half.
        let h = a.map(|x| {
            let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(x)));
            _mm256_hadd_ps(_mm512_castps512_ps256(x), hi)
        });
        _mm256_storeu_ps(sc.as_mut_ptr().add(i0), sum_key_lanes(h));
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

/// `scores_q8` eight keys at a time: a block's products as `|q| * (k with q's sign)` in pairs of bytes
/// (`maddubs`, which cannot saturate: both q8_0 operands lie within +-127), widened and summed in fours, the
/// eight keys' lanes summed by `hadd` (integers: the same sums in any order), then the scale as in
/// `scores_q8`, lane by lane.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scores_q8_avx2(qb: &[u8], kq: &[i8], kd: &[f32], stride: usize, sc: &mut [f32; KEY_TILE]) {
    use std::arch::x86_64::*;
    let nb = qb.len() / Q8_BLOCK;
    assert!(nb > 0 && kq.len() >= (KEY_TILE - 1) * stride + nb * QK && kd.len() >= nb * KEY_TILE);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); KEY_TILE / 8];
    for b in 0..nb {
        let block = qb.as_ptr().add(Q8_BLOCK * b);
        let dq = _mm256_set1_ps(half::f16::from_le_bytes([*block, *block.add(1)]).to_f32());
        let q = _mm256_loadu_si256(block.add(2) as *const __m256i);
        let qa = _mm256_sign_epi8(q, q);
        for (g, a) in acc.iter_mut().enumerate() {
            let sums: [__m256i; 8] = std::array::from_fn(|j| {
                let k = _mm256_loadu_si256(kq.as_ptr().add((8 * g + j) * stride + b * QK) as *const __m256i);
                _mm256_madd_epi16(_mm256_maddubs_epi16(qa, _mm256_sign_epi8(k, q)), ones)
            });
            let isum = _mm256_cvtepi32_ps(sum_key_lanes_i32(sums));
            let t = _mm256_mul_ps(_mm256_loadu_ps(kd.as_ptr().add(b * KEY_TILE + 8 * g)), dq);
            *a = _mm256_add_ps(*a, _mm256_mul_ps(t, isum));
        }
    }
    for (g, a) in acc.iter().enumerate() {
        _mm256_storeu_ps(sc.as_mut_ptr().add(8 * g), *a);
    }
}

/// Eight keys' integer sums from their eight lanes each (`s[j]`: key `j`), in key order.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn sum_key_lanes_i32(s: [std::arch::x86_64::__m256i; 8]) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    let h = [
        _mm256_hadd_epi32(s[0], s[1]),
        _mm256_hadd_epi32(s[2], s[3]),
        _mm256_hadd_epi32(s[4], s[5]),
        _mm256_hadd_epi32(s[6], s[7]),
    ];
    // Keys 0..4: half their lanes in the low 128 bits, half in the high; keys 4..8 likewise.
    let k03 = _mm256_hadd_epi32(h[0], h[1]);
    let k47 = _mm256_hadd_epi32(h[2], h[3]);
    let lo = _mm256_permute2x128_si256::<0x20>(k03, k47);
    let hi = _mm256_permute2x128_si256::<0x31>(k03, k47);
    _mm256_add_epi32(lo, hi)
}

/// Converts keys `start..start + n_keys` of the KV heads `heads` into `k` and their values into `v`
/// (rows of the heads' values, one after the other), zeroing the keys past `n_keys`. `AVX2`: converted
/// with F16C and AVX2 in line (the same values: f16 to f32 is exact, and q8_0 is `q as f32 * d` either
/// way). `WIDE`: `k` holds key pairs, each pair's rows interleaved in 8-value chunks (chunk `c` of key
/// `2p + s` at `2p * stride + 16c + 8s`), which `scores_avx512` reads.
#[inline(always)]
fn load_tile<const AVX2: bool, const WIDE: bool>(
    ctx: &Layer,
    heads: Range<usize>,
    start: usize,
    n_keys: usize,
    k: &mut [f32],
    v: &mut [f32],
) {
    let stride = heads.len() * ctx.head_dim;
    let page = &ctx.pages[start / KV_PAGE_TOKENS];
    let r0 = start % KV_PAGE_TOKENS;
    #[cfg(target_arch = "x86_64")]
    if AVX2 && ctx.head_dim.is_multiple_of(32) {
        prefetch_next_tile(ctx, heads.clone(), start);
        if WIDE {
            for i in 0..KEY_TILE {
                let pair = &mut k[i / 2 * 2 * stride..(i / 2 + 1) * 2 * stride];
                if i < n_keys {
                    // SAFETY: as below; the pair's rows hold `2 * stride` values.
                    unsafe { heads_row_avx2(ctx, &page.k, r0 + i, heads.clone(), &mut pair[8 * (i % 2)..], 16) };
                } else {
                    for chunk in pair.chunks_exact_mut(16) {
                        chunk[8 * (i % 2)..8 * (i % 2) + 8].fill(0.0);
                    }
                }
            }
        }
        for i in 0..n_keys {
            // SAFETY: AVX2 and F16C detected (the caller's `AVX2`); rows of `stride`, a multiple of 32.
            unsafe {
                if !WIDE {
                    heads_row_avx2(ctx, &page.k, r0 + i, heads.clone(), &mut k[i * stride..(i + 1) * stride], 8);
                }
                heads_row_avx2(ctx, &page.v, r0 + i, heads.clone(), &mut v[i * stride..(i + 1) * stride], 8);
            }
        }
        if !WIDE {
            k[n_keys * stride..].fill(0.0);
        }
        return;
    }
    for i in 0..n_keys {
        heads_row(ctx, &page.k, r0 + i, heads.clone(), &mut k[i * stride..(i + 1) * stride]);
        heads_row(ctx, &page.v, r0 + i, heads.clone(), &mut v[i * stride..(i + 1) * stride]);
    }
    k[n_keys * stride..].fill(0.0);
}

/// `load_tile` for int8 KV: the keys' quants into `kq` (rows of `stride`) and their block scales into `kd`
/// (block `b` of key `i` at `b * KEY_TILE + i`, scale 0 for the keys past `n_keys`), the values into `v`
/// as f32, as `load_tile` converts them.
#[inline(always)]
fn load_tile_q8<const AVX2: bool>(
    ctx: &Layer,
    heads: Range<usize>,
    start: usize,
    n_keys: usize,
    kq: &mut [i8],
    kd: &mut [f32],
    v: &mut [f32],
) {
    let stride = heads.len() * ctx.head_dim;
    let nb = stride / QK;
    let page = &ctx.pages[start / KV_PAGE_TOKENS];
    let r0 = start % KV_PAGE_TOKENS;
    let KvRows::Int8(keys) = &page.k else { unreachable!("int8 KV holds q8_0 rows") };
    #[cfg(target_arch = "x86_64")]
    if AVX2 {
        prefetch_next_tile(ctx, heads.clone(), start);
    }
    for i in 0..n_keys {
        let at = (r0 + i) * ctx.row_bytes + heads.start * ctx.head_bytes;
        for (b, block) in keys[at..at + nb * Q8_BLOCK].chunks_exact(Q8_BLOCK).enumerate() {
            kd[b * KEY_TILE + i] = half::f16::from_le_bytes([block[0], block[1]]).to_f32();
            for (d, &x) in kq[i * stride + b * QK..i * stride + (b + 1) * QK].iter_mut().zip(&block[2..]) {
                *d = x as i8;
            }
        }
        let vr = &mut v[i * stride..(i + 1) * stride];
        #[cfg(target_arch = "x86_64")]
        if AVX2 {
            // SAFETY: AVX2 and F16C detected (the caller's `AVX2`); int8 rows are whole blocks of 32.
            unsafe { heads_row_avx2(ctx, &page.v, r0 + i, heads.clone(), vr, 8) };
            continue;
        }
        heads_row(ctx, &page.v, r0 + i, heads.clone(), vr);
    }
    for b in 0..nb {
        kd[b * KEY_TILE + n_keys..(b + 1) * KEY_TILE].fill(0.0);
    }
}

/// One head's rows are strided (a row holds every KV head) and a tile spans pages of memory, where the
/// hardware's prefetcher stops: asks for the next tile's rows of the heads `heads` while this one is used.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch_next_tile(ctx: &Layer, heads: Range<usize>, start: usize) {
    if heads.len() * ctx.head_dim >= ctx.kv_dim {
        return;
    }
    if let Some(next) = ctx.pages.get((start + KEY_TILE) / KV_PAGE_TOKENS) {
        let r1 = (start + KEY_TILE) % KV_PAGE_TOKENS;
        for i in 0..KEY_TILE {
            prefetch_heads(ctx, &next.k, r1 + i, heads.clone());
            prefetch_heads(ctx, &next.v, r1 + i, heads.clone());
        }
    }
}

/// Row `r` of a page's K or V for the KV heads `heads`, as f32.
#[inline(always)]
fn heads_row(ctx: &Layer, rows: &KvRows, r: usize, heads: Range<usize>, dst: &mut [f32]) {
    match rows {
        KvRows::F16(k) => {
            let at = r * ctx.kv_dim + heads.start * ctx.head_dim;
            k[at..at + heads.len() * ctx.head_dim].convert_to_f32_slice(dst);
        }
        KvRows::Int8(k) => {
            let at = r * ctx.row_bytes + heads.start * ctx.head_bytes;
            quant::dequantize_row(GgmlType::Q8_0, &k[at..at + heads.len() * ctx.head_bytes], dst);
        }
        KvRows::Gpu => unreachable!("GPU layers attend with a kernel"),
    }
}

/// Asks for row `r` of a page's K or V for the KV heads `heads` to be brought into the cache (every 64
/// bytes of it, and its last byte).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch_heads(ctx: &Layer, rows: &KvRows, r: usize, heads: Range<usize>) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    let (base, at, len) = match rows {
        KvRows::F16(k) => {
            (k.as_ptr() as *const i8, 2 * (r * ctx.kv_dim + heads.start * ctx.head_dim), 2 * heads.len() * ctx.head_dim)
        }
        KvRows::Int8(k) => {
            (k.as_ptr() as *const i8, r * ctx.row_bytes + heads.start * ctx.head_bytes, heads.len() * ctx.head_bytes)
        }
        KvRows::Gpu => return,
    };
    // SAFETY: a prefetch reads nothing and cannot fault; the addresses are computed without wrapping.
    unsafe {
        for off in (0..len).step_by(64) {
            _mm_prefetch::<_MM_HINT_T0>(base.wrapping_add(at + off));
        }
        _mm_prefetch::<_MM_HINT_T0>(base.wrapping_add(at + len - 1));
    }
}

/// `heads_row` with F16C and AVX2, in line (`head_dim` a multiple of 32), the row's 8-value chunk `c` written
/// at `dst[step * c..]` (`step` 8: a plain row; 16: one of a key pair's interleaved rows).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn heads_row_avx2(ctx: &Layer, rows: &KvRows, r: usize, heads: Range<usize>, dst: &mut [f32], step: usize) {
    use std::arch::x86_64::*;
    let n = heads.len() * ctx.head_dim;
    assert!((step == 8 || step == 16) && dst.len() >= n / 8 * step - (step - 8) && n.is_multiple_of(32));
    match rows {
        KvRows::F16(k) => {
            let at = r * ctx.kv_dim + heads.start * ctx.head_dim;
            let src = &k[at..at + n];
            for c in 0..n / 8 {
                let h = _mm_loadu_si128(src.as_ptr().add(8 * c) as *const __m128i);
                _mm256_storeu_ps(dst.as_mut_ptr().add(step * c), _mm256_cvtph_ps(h));
            }
        }
        KvRows::Int8(k) => {
            // q8_0 blocks: an f16 scale, then 32 signed bytes.
            let at = r * ctx.row_bytes + heads.start * ctx.head_bytes;
            let src = &k[at..at + heads.len() * ctx.head_bytes];
            for (b, block) in src.chunks_exact(Q8_BLOCK).enumerate() {
                let d = _mm256_set1_ps(half::f16::from_le_bytes([block[0], block[1]]).to_f32());
                for c in 0..4 {
                    let q = _mm_loadl_epi64(block.as_ptr().add(2 + 8 * c) as *const __m128i);
                    let x = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
                    _mm256_storeu_ps(dst.as_mut_ptr().add(step * (4 * b + c)), _mm256_mul_ps(x, d));
                }
            }
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
    let x = x.max(EXP_MIN);
    let n = (x * std::f32::consts::LOG2_E + EXP_ROUND) - EXP_ROUND;
    let r = (x - n * EXP_LN2_HI) - n * EXP_LN2_LO;
    let mut p = EXP_POLY[0];
    for &k in &EXP_POLY[1..] {
        p = p * r + k;
    }
    let e = (p * r) * r + r + 1.0;
    e * f32::from_bits((((n as i32) + 127) << 23) as u32)
}

/// `exp_nonpos`'s constants: the lowest argument, ln 2 in two parts, 1.5 * 2^23 (adding and subtracting
/// it rounds to an integer), and the polynomial's coefficients from the highest degree.
const EXP_MIN: f32 = -87.336_55;
const EXP_LN2_HI: f32 = 0.693_359_4;
const EXP_LN2_LO: f32 = -2.121_944_4e-4;
const EXP_ROUND: f32 = 12_582_912.0;
const EXP_POLY: [f32; 6] = [1.987_569_1e-4, 1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 1.666_666_5e-1, 5e-1];

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

    fn layer(kv: &KvCache) -> Layer<'_> {
        let hd = SHAPE.head_dim;
        Layer {
            pages: &kv.layers[0].pages,
            kv_dim: SHAPE.n_head_kv * hd,
            head_dim: hd,
            row_bytes: kv.ty.row_bytes(SHAPE.n_head_kv * hd),
            head_bytes: kv.ty.row_bytes(hd),
            scale: 1.0 / (hd as f32).sqrt(),
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

    /// Attention in f64 over the values the cache holds (as f32), one query at position `pos`.
    fn attend_f64(kv: &KvCache, h: usize, q: &[f32], pos: usize) -> Vec<f64> {
        let hd = SHAPE.head_dim;
        let ctx = layer(kv);
        let kvh = h / (SHAPE.n_head / SHAPE.n_head_kv);
        let (mut k, mut v) = (vec![0f32; hd], vec![0f32; hd]);
        let mut scores = Vec::with_capacity(pos + 1);
        let mut rows = Vec::with_capacity(pos + 1);
        for j in 0..=pos {
            let page = &ctx.pages[j / KV_PAGE_TOKENS];
            heads_row(&ctx, &page.k, j % KV_PAGE_TOKENS, kvh..kvh + 1, &mut k);
            heads_row(&ctx, &page.v, j % KV_PAGE_TOKENS, kvh..kvh + 1, &mut v);
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
        // With int8 KV the scores take the query quantized to q8_0 (as llama.cpp's quantized-KV path): the
        // float64 attention is given those operands, and separately the exact query, against which the error
        // is the quantization's.
        let mut worst_exact_q = 0f64;
        for ty in [KvType::F16, KvType::Int8] {
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
                let got = attend(&pool, &kv, &q, n, t);
                let operands = if ty == KvType::Int8 { as_q8(&q) } else { q.clone() };
                let mut worst = 0f64;
                for ti in 0..t {
                    for h in 0..SHAPE.n_head {
                        let at = ti * q_dim + h * SHAPE.head_dim;
                        let want = attend_f64(&kv, h, &operands[at..at + SHAPE.head_dim], n - t + ti);
                        let error = |want: &[f64]| {
                            let scale = want.iter().fold(0f64, |a, b| a.max(b.abs()));
                            let got = &got[at..at + SHAPE.head_dim];
                            got.iter().zip(want).map(|(g, w)| (*g as f64 - w).abs() / scale).fold(0f64, f64::max)
                        };
                        worst = worst.max(error(&want));
                        if ty == KvType::Int8 {
                            let exact_q = attend_f64(&kv, h, &q[at..at + SHAPE.head_dim], n - t + ti);
                            worst_exact_q = worst_exact_q.max(error(&exact_q));
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
        println!("int8 KV: relative error against the unquantized query {worst_exact_q:.2e}");
        assert!(worst_exact_q < 1e-2, "int8 KV: the quantized queries moved the output by {worst_exact_q:e}");
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
        for ty in [KvType::F16, KvType::Int8] {
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
                                Query { q_at: at, pos: positions[ti], out_at: at, kvh }
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
}
