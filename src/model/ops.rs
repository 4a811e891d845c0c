//! The CPU arithmetic of the forward pass beside attention (`attn`): RMSNorm, RoPE, the gated activations
//! and the threaded matrix products over quantized weights.
//!
//! Batch invariance is this module's promise: every value for a token is computed by the same operations in
//! the same order whatever the batch it came in, so logits are bit-identical whether a prompt is read in one
//! batch, in chunks, or token by token. Threads split rows or (token, head) pairs, never a reduction.

use std::sync::Arc;

use crate::quant;
pub use crate::threadpool::SharedMut;
use crate::threadpool::{split_range, ThreadPool};

use super::acts::QuantActs;
use super::config::{RopeKind, RopeParams};
use super::family::FfnAct;
use super::weights::QTensor;

/// `out = x / rms(x) * w`, with the mean of squares summed in f64 as ggml does.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let [sum] = sums_of_squares([x]);
    scale_row(x, rms_scale(sum, x.len(), eps), w, out);
}

/// `x = x / rms(x) * w` in place (`rms_norm`'s operations).
pub fn rms_norm_in_place(x: &mut [f32], w: &[f32], eps: f32) {
    let [sum] = sums_of_squares([&*x]);
    scale_row_in_place(x, rms_scale(sum, x.len(), eps), w);
}

/// Rows a norm sums side by side (`sums_of_squares`).
const NORM_ROWS: usize = 4;

/// Each row's sum of `(v * v) as f64`, in value order from 0: one dependent chain of f64 adds per row, so
/// `R` rows summed side by side overlap their adds' latency where one row alone waits on each (SmolLM2's
/// 576-value rows: about 4 cycles a value). Every row's sum is the one it gets alone.
#[inline(always)]
fn sums_of_squares<const R: usize>(rows: [&[f32]; R]) -> [f64; R] {
    let n = rows[0].len();
    assert!(rows.iter().all(|r| r.len() == n), "rows of one length");
    let mut sums = [0f64; R];
    for i in 0..n {
        for (s, r) in sums.iter_mut().zip(&rows) {
            let v = r[i];
            *s += (v * v) as f64;
        }
    }
    sums
}

/// `1 / sqrt(mean + eps)`, the mean of squares of `n` values from their f64 sum.
#[inline(always)]
fn rms_scale(sum: f64, n: usize, eps: f32) -> f32 {
    let mean = (sum / n as f64) as f32;
    1.0 / (mean + eps).sqrt()
}

#[inline(always)]
fn scale_row(x: &[f32], scale: f32, w: &[f32], out: &mut [f32]) {
    for ((o, &v), &g) in out.iter_mut().zip(x).zip(w) {
        *o = (v * scale) * g;
    }
}

#[inline(always)]
fn scale_row_in_place(x: &mut [f32], scale: f32, w: &[f32]) {
    for (v, &g) in x.iter_mut().zip(w) {
        *v = (*v * scale) * g;
    }
}

/// Cos/sin of every rotated pair at one position: `(cos, sin)` for `rope_dims / 2` pairs, pair `i` at
/// angle `freq_scale * (pos * base^(-2i/rope_dims) / factors[i])`, both scaled by `mscale`; with YaRN the
/// angle blends the scaled and unscaled ones and the scale grows (`config::Yarn`), as ggml's `rope_yarn`.
pub fn rope_table(pos: usize, rope_dims: usize, rope: &RopeParams, factors: Option<&[f32]>) -> Vec<(f32, f32)> {
    // ggml advances theta by repeated multiplication; doing the same keeps us close to llama.cpp.
    let theta_scale = rope.base.powf(-2.0 / rope_dims as f32);
    let mut theta = pos as f32;
    (0..rope_dims / 2)
        .map(|i| {
            let ff = factors.map_or(1.0, |f| f[i]);
            let extrap = theta / ff;
            let interp = rope.freq_scale * extrap;
            let (t, mscale) = match rope.yarn {
                None => (interp, rope.mscale),
                Some(y) => {
                    let ramp = 1.0 - ((i as f32 - y.low) / (y.high - y.low).max(0.001)).clamp(0.0, 1.0);
                    let t = interp * (1.0 - ramp) + extrap * ramp;
                    (t, rope.mscale * (1.0 + 0.1 * (1.0 / rope.freq_scale).ln()))
                }
            };
            let cs = (t.cos() * mscale, t.sin() * mscale);
            theta *= theta_scale;
            cs
        })
        .collect()
}

/// Rotates one head's vector in place.
pub fn rope_apply(x: &mut [f32], table: &[(f32, f32)], kind: RopeKind) {
    let n = table.len();
    for (i, &(c, s)) in table.iter().enumerate() {
        let (a, b) = match kind {
            RopeKind::Norm => (2 * i, 2 * i + 1),
            RopeKind::Neox => (i, i + n),
        };
        let (x0, x1) = (x[a], x[b]);
        x[a] = x0 * c - x1 * s;
        x[b] = x0 * s + x1 * c;
    }
}

/// `g = act(g) * u`, element-wise (a gated FFN's activation). `silu(v) = v * sigmoid(v)`; GELU's tanh form
/// is `0.5 v (1 + tanh(c v (1 + a v^2)))` = `v * sigmoid(2 c v (1 + a v^2))`, the same sigmoid. The
/// sigmoid comes from `e = e^-|v|` (the attention's polynomial `exp_nonpos`, about 2 ulp) as `1 / (1 + e)`
/// or `e / (1 + e)`. Branch-free plain f32 steps, so the compiler's vectors give the scalar loop's bits; on
/// x86-64 it runs on AVX2 or AVX-512.
///
/// gpt-oss's clamped form (`FfnAct::SwigluOai`) takes the same sigmoid at `1.702 g'`.
pub fn glu(g: &mut [f32], u: &[f32], act: FfnAct) {
    #[cfg(target_arch = "x86_64")]
    {
        let level = quant::simd_level();
        if level == quant::SimdLevel::Avx512 {
            // SAFETY: AVX-512 F was detected; the body is plain Rust.
            return unsafe { glu_avx512(g, u, act) };
        }
        if level.avx2() {
            // SAFETY: AVX2 was detected; the body is plain Rust.
            return unsafe { glu_avx2(g, u, act) };
        }
    }
    glu_body(g, u, act)
}

/// `silu(g) * u` (`glu` with SiLU).
pub fn swiglu(g: &mut [f32], u: &[f32]) {
    glu(g, u, FfnAct::Silu)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
unsafe fn glu_avx512(g: &mut [f32], u: &[f32], act: FfnAct) {
    glu_body(g, u, act)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn glu_avx2(g: &mut [f32], u: &[f32], act: FfnAct) {
    glu_body(g, u, act)
}

/// `2 * sqrt(2 / pi)` and the cubic term's coefficient of GELU's tanh form.
const GELU_2C: f32 = 1.595_769;
const GELU_A: f32 = 0.044_715;

/// gpt-oss's clamped SwiGLU: the sigmoid's slope and the clamp of both inputs (llama.cpp's constants).
const OAI_ALPHA: f32 = 1.702;
const OAI_LIMIT: f32 = 7.0;

#[inline(always)]
fn glu_body(g: &mut [f32], u: &[f32], act: FfnAct) {
    match act {
        FfnAct::GeluTanh => {
            for (a, &b) in g.iter_mut().zip(u) {
                let v = *a;
                *a = v * sigmoid(GELU_2C * v * (1.0 + GELU_A * v * v)) * b;
            }
        }
        FfnAct::Silu => {
            for (a, &b) in g.iter_mut().zip(u) {
                let v = *a;
                *a = v * sigmoid(v) * b;
            }
        }
        FfnAct::SwigluOai => {
            for (a, &b) in g.iter_mut().zip(u) {
                // `min` as C's `std::min(g, limit)`: a NaN stays NaN.
                let v = if *a > OAI_LIMIT { OAI_LIMIT } else { *a };
                let y = b.clamp(-OAI_LIMIT, OAI_LIMIT);
                *a = v * sigmoid(OAI_ALPHA * v) * (y + 1.0);
            }
        }
    }
}

#[inline(always)]
fn sigmoid(v: f32) -> f32 {
    let e = super::attn::exp_nonpos(-v.abs());
    // One division for both signs: `1 / (1 + e)` or `e / (1 + e)`.
    let num = if v >= 0.0 { 1.0 } else { e };
    num / (1.0 + e)
}

/// `x = c * tanh(x / c)` for each value (Gemma 2's soft-capping of scores and logits).
pub fn softcap(x: &mut [f32], c: f32) {
    for v in x {
        *v = c * (*v / c).tanh();
    }
}

/// Element-wise work below this many values per thread runs on the caller's thread: a region costs about a
/// microsecond, as much as a few hundred `exp`s.
const PAR_MIN_VALUES: usize = 1024;

/// Runs `f(range)` over `0..n` items of `item_values` values each, split over the pool's threads where each
/// gets at least `PAR_MIN_VALUES` values, else on this thread. For element-wise steps and per-token rows:
/// an item's result never depends on the split.
pub fn par_items(pool: &ThreadPool, n: usize, item_values: usize, f: impl Fn(std::ops::Range<usize>) + Sync) {
    let parts = (n * item_values / PAR_MIN_VALUES).clamp(1, pool.n_threads()).min(n);
    if parts <= 1 {
        return f(0..n);
    }
    pool.run(parts, |c| f(split_range(c, parts, n)));
}

/// `glu` split over the pool's threads (same bits: each value on its own).
pub fn glu_par(pool: &ThreadPool, g: &mut [f32], u: &[f32], act: FfnAct) {
    let shared = SharedMut::new(g);
    par_items(pool, u.len(), 1, |r| {
        // SAFETY: the ranges are disjoint.
        glu(unsafe { shared.slice(r.start, r.len()) }, &u[r], act);
    });
}

/// A gated FFN over the rows of `x` ((t_count, d)): `out = down(act(gate(x)) * up(x))`, `g` and `u`
/// ((t_count, gate.rows)) its buffers, `qa` quantizing each product's input. The dense layer's FFN and each
/// expert of a mixture run this; `down`'s first rows are prefetched while the activation runs.
#[allow(clippy::too_many_arguments)] // the three matrices, the input and its buffers
pub fn gated_ffn(
    pool: &ThreadPool,
    (gate, up, down): (&QTensor, &QTensor, &QTensor),
    [gate_b, up_b, down_b]: [Option<&[f32]>; 3],
    act: FfnAct,
    x: &[f32],
    d: usize,
    qa: &mut QuantActs,
    (g, u): (&mut [f32], &mut [f32]),
    out: &mut [f32],
) {
    qa.quantize(pool, gate.ty, x, d);
    if up.ty == gate.ty {
        let jobs = [
            MatJob { w: gate, bias: gate_b, out: SharedMut::new(g) },
            MatJob { w: up, bias: up_b, out: SharedMut::new(u) },
        ];
        matmul(pool, &jobs, qa);
    } else {
        matmul(pool, &[MatJob { w: gate, bias: gate_b, out: SharedMut::new(g) }], qa);
        qa.quantize(pool, up.ty, x, d);
        matmul(pool, &[MatJob { w: up, bias: up_b, out: SharedMut::new(u) }], qa);
    }
    prefetch_products(pool, &[down], x.len() / d);
    glu_par(pool, g, u, act);
    qa.quantize(pool, down.ty, g, gate.rows);
    matmul(pool, &[MatJob { w: down, bias: down_b, out: SharedMut::new(out) }], qa);
}

/// `x += y` split over the pool's threads.
pub fn add_par(pool: &ThreadPool, x: &mut [f32], y: &[f32]) {
    let shared = SharedMut::new(x);
    par_items(pool, y.len(), 1, |r| {
        // SAFETY: the ranges are disjoint.
        for (a, b) in unsafe { shared.slice(r.start, r.len()) }.iter_mut().zip(&y[r]) {
            *a += b;
        }
    });
}

/// `rms_norm_in_place` of each of the rows of `d` values of `x`, rows split over the pool's threads (their
/// sums `NORM_ROWS` at a time, each row's bits as alone).
pub fn rms_norm_rows_in_place(pool: &ThreadPool, x: &mut [f32], w: &[f32], eps: f32, d: usize) {
    let n = x.len() / d;
    let shared = SharedMut::new(x);
    par_items(pool, n, d, |rows| {
        // SAFETY: each row is written by one thread.
        let x = unsafe { shared.slice(rows.start * d, rows.len() * d) };
        let mut groups = x.chunks_exact_mut(NORM_ROWS * d);
        for g in &mut groups {
            let sums = sums_of_squares::<NORM_ROWS>(std::array::from_fn(|r| &g[r * d..(r + 1) * d]));
            for (row, sum) in g.chunks_exact_mut(d).zip(sums) {
                scale_row_in_place(row, rms_scale(sum, d, eps), w);
            }
        }
        for row in groups.into_remainder().chunks_exact_mut(d) {
            rms_norm_in_place(row, w, eps);
        }
    });
}

/// `rms_norm` of each of the rows of `d` values of `x` into `out`, rows split over the pool's threads (their
/// sums `NORM_ROWS` at a time, each row's bits as alone).
pub fn rms_norm_rows(pool: &ThreadPool, x: &[f32], w: &[f32], eps: f32, d: usize, out: &mut [f32]) {
    let shared = SharedMut::new(out);
    par_items(pool, x.len() / d, d, |rows| {
        let x = &x[rows.start * d..rows.end * d];
        // SAFETY: each row is written by one thread.
        let out = unsafe { shared.slice(rows.start * d, rows.len() * d) };
        let mut groups = x.chunks_exact(NORM_ROWS * d);
        let mut outs = out.chunks_exact_mut(NORM_ROWS * d);
        for (g, o) in (&mut groups).zip(&mut outs) {
            let sums = sums_of_squares::<NORM_ROWS>(std::array::from_fn(|r| &g[r * d..(r + 1) * d]));
            for ((row, o), sum) in g.chunks_exact(d).zip(o.chunks_exact_mut(d)).zip(sums) {
                scale_row(row, rms_scale(sum, d, eps), w, o);
            }
        }
        for (row, o) in groups.remainder().chunks_exact(d).zip(outs.into_remainder().chunks_exact_mut(d)) {
            rms_norm(row, w, eps, o);
        }
    });
}

/// Starts loading the first bytes of each thread's run of rows of the products `ws` (concatenated and split
/// as `matmul` splits them, `product_chunks`) when `t_count` tokens will take them in runs (`STREAM_MAX_TOKENS`): called while
/// the work before those products runs (attention, norms), so a thread does not begin its run waiting on
/// DRAM. Only a hint (packed matrices; nothing elsewhere).
pub fn prefetch_products(pool: &ThreadPool, ws: &[&QTensor], t_count: usize) {
    if t_count > STREAM_MAX_TOKENS {
        return;
    }
    let total_rows: usize = ws.iter().map(|w| w.rows).sum();
    let n_tiles = total_rows.div_ceil(ROW_TILE);
    let n_chunks = product_chunks(pool, n_tiles, t_count);
    for chunk in 0..n_chunks {
        let start = split_range(chunk, n_chunks, n_tiles).start * ROW_TILE;
        let mut base = 0;
        for w in ws {
            if start < base + w.rows {
                if let Some(p) = w.packed() {
                    p.prefetch_start((start - base) / ROW_TILE, w.rows.div_ceil(ROW_TILE));
                }
                break;
            }
            base += w.rows;
        }
    }
}

/// The chunks `matmul` splits `n_tiles` row tiles into for `t_count` tokens. A few tokens stream the weights
/// from memory once: one contiguous run of rows per thread keeps each thread's stream (and its prefetch)
/// unbroken. SmolLM2-135M q4_0, 2 threads, tg128 alternating in one session: 289 tok/s at one chunk per
/// thread, 234 at eight (llama.cpp 239 beside them).
fn product_chunks(pool: &ThreadPool, n_tiles: usize, t_count: usize) -> usize {
    if t_count <= STREAM_MAX_TOKENS {
        n_tiles.min(pool.n_threads())
    } else {
        pool.chunks_for(n_tiles)
    }
}

/// One product of a batched matmul: `out[t][r] = w[r] . act[t] (+ bias[r])` for `t` in the batch.
pub struct MatJob<'a> {
    pub w: &'a QTensor,
    pub bias: Option<&'a [f32]>,
    /// (t_count, w.rows)
    pub out: SharedMut<'a, f32>,
}

/// Rows of weights processed together per tile: their bytes stay in L1 while a tile of tokens passes. A
/// packed matrix's group (`quant::packed::PACK_ROWS`).
const ROW_TILE: usize = quant::packed::PACK_ROWS;
/// Products of at most this many tokens split their rows in one run per thread (see `matmul`): decoding,
/// and the batched decode of up to 8 sequences (`strata serve --parallel`), whose weights also come from
/// memory once per step. SmolLM2-135M q4_1, `strata bench -p 0 -n 64 --streams 8`, 2 threads (AMD EPYC,
/// AVX-512), five alternating pairs: 641 tok/s on average at 4 (runs of rows taken from a shared list),
/// 758 at 8 (better in four of the five pairs).
const STREAM_MAX_TOKENS: usize = 8;
/// Tokens dotted against a tile of weight rows at once by `vec_dot_tile`.
const TOKEN_TILE: usize = 8;

/// Runs several matrix products that share one batch of quantized activations, splitting their
/// concatenated rows over the pool's threads. Every job's weights must have the type `acts` was
/// quantized for.
pub fn matmul(pool: &ThreadPool, jobs: &[MatJob], qa: &QuantActs) {
    let total_rows: usize = jobs.iter().map(|j| j.w.rows).sum();
    let t_count = qa.t_count();
    let acts: Vec<quant::ActRow> = (0..t_count).map(|t| qa.act_row(t)).collect();
    // Dequantized weight columns at the batch's outlier channels, per job (see `acts`): the cached ones. A
    // channel past the cache is read from the weights tile by tile inside the threads (`finish_tile`), once
    // per row tile whatever the batch: building its whole column here instead ran on this thread alone
    // while the others waited (8 sequences decoding together, SmolLM2: 375 -> 554 tok/s without it).
    let channels = qa.outlier_channels();
    let columns: Vec<Vec<Option<Arc<[f32]>>>> =
        jobs.iter().map(|j| channels.iter().map(|&c| j.w.column(c)).collect()).collect();
    // Each token's outliers as (channel, index into `channels`, value), in channel order.
    let outliers: Vec<Vec<(usize, usize, f32)>> = qa
        .outliers
        .iter()
        .map(|o| o.iter().map(|&(c, v)| (c, channels.binary_search(&c).unwrap_or(0), v)).collect())
        .collect();
    // Split in units of ROW_TILE rows so tiles stay whole.
    let n_tiles = total_rows.div_ceil(ROW_TILE);
    let n_chunks = product_chunks(pool, n_tiles, t_count);
    pool.run(n_chunks, |chunk| {
        let tiles = split_range(chunk, n_chunks, n_tiles);
        let (start, end) = (tiles.start * ROW_TILE, (tiles.end * ROW_TILE).min(total_rows));
        let mut dots = [0f32; ROW_TILE * TOKEN_TILE];
        let mut group_dots = [0f32; ROW_TILE * TOKEN_TILE];
        // The tile's weights at outlier channels that have no cached column: (channel slot, ROW_TILE),
        // read once per tile for all its tokens; `tile_w_for[slot]` names the (job, r0) they hold.
        let mut tile_w = vec![0f32; channels.len() * ROW_TILE];
        let mut tile_w_for = vec![(usize::MAX, 0); channels.len()];
        let mut base = 0;
        for (ji, (job, columns)) in jobs.iter().zip(&columns).enumerate() {
            let rows = job.w.rows;
            let (lo, hi) = (start.max(base), end.min(base + rows));
            base += rows;
            if lo >= hi {
                continue;
            }
            let (lo, hi) = (lo - (base - rows), hi - (base - rows));
            let w = job.w;
            if let Some(p) = w.packed() {
                p.prefetch_start(lo / ROW_TILE, hi.div_ceil(ROW_TILE));
            }
            let (wdata, rb) = (w.data(), w.row_bytes);
            // Tiles end at multiples of ROW_TILE within the job (a packed matrix's groups).
            let next_tile = |r: &usize| Some((r / ROW_TILE + 1) * ROW_TILE);
            for r0 in std::iter::successors(Some(lo), next_tile).take_while(|&r| r < hi) {
                let r1 = ((r0 / ROW_TILE + 1) * ROW_TILE).min(hi);
                let n = r1 - r0;
                for t0 in (0..t_count).step_by(TOKEN_TILE) {
                    let t1 = (t0 + TOKEN_TILE).min(t_count);
                    let nt = t1 - t0;
                    // dots: (nt, n), the tile's products in one call.
                    let dots: &[f32] = match w.packed() {
                        Some(p) => {
                            // The whole group's rows; a partial tile takes its rows out of them.
                            let group = &mut group_dots[..nt * ROW_TILE];
                            p.tile_within(r0 / ROW_TILE, hi.div_ceil(ROW_TILE), &acts[t0..t1], group);
                            if n == ROW_TILE {
                                group
                            } else {
                                let (skip, dots) = (r0 % ROW_TILE, &mut dots[..n * nt]);
                                for (d, g) in dots.chunks_exact_mut(n).zip(group.chunks_exact(ROW_TILE)) {
                                    d.copy_from_slice(&g[skip..skip + n]);
                                }
                                dots
                            }
                        }
                        None => {
                            let dots = &mut dots[..n * nt];
                            quant::vec_dot_tile(w.ty, w.cols, &wdata[r0 * rb..r1 * rb], rb, &acts[t0..t1], dots);
                            dots
                        }
                    };
                    let tile = Tile { w, ji, r0, r1, t0, rows, bias: job.bias, out: &job.out };
                    finish_tile(&tile, dots, &outliers[t0..t1], columns, &mut tile_w, &mut tile_w_for);
                }
            }
        }
    });
}

/// One (job, row tile, token tile) of `matmul` whose products are done.
struct Tile<'a, 'b> {
    w: &'a QTensor,
    /// The job's index, and the tile's rows `r0..r1` of its `rows`.
    ji: usize,
    r0: usize,
    r1: usize,
    /// The first token of the tile.
    t0: usize,
    rows: usize,
    bias: Option<&'a [f32]>,
    out: &'b SharedMut<'a, f32>,
}

/// Adds each token's exact outliers to the tile's products `dots` (tokens, rows) and writes the results
/// (plus bias) to the job's output: on the widest vectors this CPU has (the same operations, row by row, so
/// the same bits on every path).
fn finish_tile(
    tile: &Tile,
    dots: &[f32],
    outliers: &[Vec<(usize, usize, f32)>],
    columns: &[Option<Arc<[f32]>>],
    tile_w: &mut [f32],
    tile_w_for: &mut [(usize, usize)],
) {
    #[cfg(target_arch = "x86_64")]
    {
        let level = quant::simd_level();
        if level == quant::SimdLevel::Avx512 {
            // SAFETY: AVX-512 F/BW/VL were detected; the body is plain Rust.
            return unsafe { finish_tile_avx512(tile, dots, outliers, columns, tile_w, tile_w_for) };
        }
        if level.avx2() {
            // SAFETY: AVX2 was detected; the body is plain Rust.
            return unsafe { finish_tile_avx2(tile, dots, outliers, columns, tile_w, tile_w_for) };
        }
    }
    finish_tile_body(tile, dots, outliers, columns, tile_w, tile_w_for)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
unsafe fn finish_tile_avx512(
    tile: &Tile,
    dots: &[f32],
    outliers: &[Vec<(usize, usize, f32)>],
    columns: &[Option<Arc<[f32]>>],
    tile_w: &mut [f32],
    tile_w_for: &mut [(usize, usize)],
) {
    finish_tile_body(tile, dots, outliers, columns, tile_w, tile_w_for)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn finish_tile_avx2(
    tile: &Tile,
    dots: &[f32],
    outliers: &[Vec<(usize, usize, f32)>],
    columns: &[Option<Arc<[f32]>>],
    tile_w: &mut [f32],
    tile_w_for: &mut [(usize, usize)],
) {
    finish_tile_body(tile, dots, outliers, columns, tile_w, tile_w_for)
}

#[inline(always)]
fn finish_tile_body(
    tile: &Tile,
    dots: &[f32],
    outliers: &[Vec<(usize, usize, f32)>],
    columns: &[Option<Arc<[f32]>>],
    tile_w: &mut [f32],
    tile_w_for: &mut [(usize, usize)],
) {
    let Tile { w, ji, r0, r1, t0, rows, bias, out } = *tile;
    let n = r1 - r0;
    for (i, (outliers, dots)) in outliers.iter().zip(dots.chunks_exact(n)).enumerate() {
        let t = t0 + i;
        // The token's exact outliers against each row of the tile, summed in channel order: from the cached
        // column where there is one, else from the weights (read once per tile into `tile_w`).
        for &(ch, slot, _) in outliers {
            if columns[slot].is_none() && tile_w_for[slot] != (ji, r0) {
                w.values_at(r0, ch, &mut tile_w[slot * ROW_TILE..slot * ROW_TILE + n]);
                tile_w_for[slot] = (ji, r0);
            }
        }
        let weights = |slot: usize| match &columns[slot] {
            Some(col) => &col[r0..r1],
            None => &tile_w[slot * ROW_TILE..slot * ROW_TILE + n],
        };
        let mut corr = [0f32; ROW_TILE];
        if n == ROW_TILE {
            // A whole tile: the sixteen sums stay in a register.
            for &(_, slot, v) in outliers {
                let wv = &weights(slot)[..ROW_TILE];
                for j in 0..ROW_TILE {
                    corr[j] += wv[j] * v;
                }
            }
        } else {
            for &(_, slot, v) in outliers {
                for (c, &x) in corr.iter_mut().zip(weights(slot)) {
                    *c += x * v;
                }
            }
        }
        // SAFETY: rows r0..r1 of this job are owned by this thread, for every token.
        let out = unsafe { out.slice(t * rows + r0, n) };
        match bias {
            Some(b) => {
                for (((o, &d), &c), &b) in out.iter_mut().zip(dots).zip(&corr).zip(&b[r0..r1]) {
                    *o = d + c + b;
                }
            }
            None => {
                for ((o, &d), &c) in out.iter_mut().zip(dots).zip(&corr) {
                    *o = d + c + 0.0;
                }
            }
        }
        prefetch_next_tile(out);
    }
}

/// Starts fetching, for writing, where this token's sums of the next row tile go (the `ROW_TILE` values
/// after `out`), which the thread writes one pass over the batch later. A batch's output rows lie far
/// apart (a token's row is the matrix's `rows` values), so no hardware prefetcher follows them: without
/// this, every tile's stores waited on their lines (SmolLM2 q8_0 pp512: half of `finish_tile`'s samples on
/// the store). Only a hint: the address may lie past the output.
#[inline(always)]
fn prefetch_next_tile(out: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_ET0};
        let next = out.as_ptr().wrapping_add(ROW_TILE);
        // SAFETY: a prefetch reads nothing and cannot fault.
        unsafe {
            _mm_prefetch::<_MM_HINT_ET0>(next as *const i8);
            _mm_prefetch::<_MM_HINT_ET0>(next.wrapping_add(ROW_TILE - 1) as *const i8);
        }
    }
}

/// Shapes of an attention call.
pub struct AttnShape {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values from -100 to 100 (both signs, tiny, huge, zero) and a NaN.
    fn inputs() -> Vec<f32> {
        let mut v: Vec<f32> = (-2000..=2000).map(|i| i as f32 * 0.05).collect();
        v.extend([0.0, -0.0, 1e-30, -1e-30, 88.0, -88.0, 100.0, -100.0, f32::NAN]);
        v
    }

    #[test]
    fn glu_is_the_activation_times_up_to_a_few_ulp_and_the_same_bits_on_every_path() {
        let g = inputs();
        let u: Vec<f32> = (0..g.len()).map(|i| 0.5 + (i % 7) as f32 * 0.25).collect();
        for act in [FfnAct::Silu, FfnAct::GeluTanh, FfnAct::SwigluOai] {
            let gelu = act == FfnAct::GeluTanh;
            let mut fast = g.clone();
            glu(&mut fast, &u, act);
            let mut portable = g.clone();
            glu_body(&mut portable, &u, act);
            for (i, ((&a, &b), &v)) in fast.iter().zip(&portable).zip(&g).enumerate() {
                assert_eq!(a.to_bits(), b.to_bits(), "{act:?} value {i} ({v}): {a} vs portable {b}");
                if v.is_nan() {
                    assert!(a.is_nan());
                    continue;
                }
                let x = v as f64;
                let (want, rel) = match act {
                    FfnAct::GeluTanh => {
                        let inner = (2.0 / std::f64::consts::PI).sqrt() * x * (1.0 + 0.044715 * x * x);
                        // The sigmoid's argument carries the f32 rounding of the cubic: up to about 1e-5
                        // relative far in the negative tail, where GELU is below 1e-5.
                        (0.5 * x * (1.0 + inner.tanh()) * u[i] as f64, 1e-5)
                    }
                    FfnAct::Silu => (x / (1.0 + (-x).exp()) * u[i] as f64, 4.0 * f32::EPSILON as f64),
                    FfnAct::SwigluOai => {
                        // Clamped at 7 (u here is 0.5..2, inside the clamp); the sigmoid's argument 1.702 x
                        // is rounded to f32, up to about 1e-5 relative in the far negative tail.
                        let x = x.min(7.0);
                        let alpha = OAI_ALPHA as f64;
                        (x / (1.0 + (-alpha * x).exp()) * (u[i] as f64 + 1.0), 1e-5)
                    }
                };
                let err = (a as f64 - want).abs();
                // Below -87.3 the exponential stops at e^-87.3 (`exp_nonpos`): an absolute error under 1e-35.
                assert!(err <= rel * want.abs() + 1e-35 + if gelu { 1e-7 } else { 0.0 }, "{act:?} {v}: {a} vs {want}");
            }
            // Split over threads: the same bits.
            let pool = ThreadPool::new(2);
            let mut split = g.clone();
            glu_par(&pool, &mut split, &u, act);
            assert!(split.iter().zip(&fast).all(|(a, b)| a.to_bits() == b.to_bits()));
        }
    }

    #[test]
    fn norms_of_many_rows_give_each_row_its_bits_alone_and_the_f64_norm() {
        // 11 rows: two groups of `NORM_ROWS` and a remainder, and rows of very different sizes.
        let d = 96;
        let x: Vec<f32> = (0..11 * d).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.01 * (1 + i / d) as f32).collect();
        let w: Vec<f32> = (0..d).map(|i| 0.5 + (i % 5) as f32 * 0.1).collect();
        let eps = 1e-5;
        for threads in [1, 2] {
            let pool = ThreadPool::new(threads);
            let mut rows = vec![0f32; x.len()];
            rms_norm_rows(&pool, &x, &w, eps, d, &mut rows);
            let mut in_place = x.clone();
            rms_norm_rows_in_place(&pool, &mut in_place, &w, eps, d);
            for (t, xr) in x.chunks_exact(d).enumerate() {
                let mut alone = vec![0f32; d];
                rms_norm(xr, &w, eps, &mut alone);
                let r = t * d..(t + 1) * d;
                assert!(rows[r.clone()].iter().zip(&alone).all(|(a, b)| a.to_bits() == b.to_bits()), "row {t}");
                assert!(in_place[r].iter().zip(&alone).all(|(a, b)| a.to_bits() == b.to_bits()), "row {t} in place");
                let ms = xr.iter().map(|&v| (v as f64) * (v as f64)).sum::<f64>() / d as f64;
                let scale = 1.0 / (ms + eps as f64).sqrt();
                for ((&a, &v), &g) in alone.iter().zip(xr).zip(&w) {
                    let want = v as f64 * scale * g as f64;
                    assert!((a as f64 - want).abs() <= 1e-6 * want.abs().max(1e-3), "row {t}: {a} vs {want}");
                }
            }
        }
    }
}
