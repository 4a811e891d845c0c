//! The CPU arithmetic of the forward pass beside attention (`attn`): RMSNorm, RoPE, SwiGLU
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
use super::config::RopeKind;
use super::weights::QTensor;

/// `out = x / rms(x) * w`, with the mean of squares summed in f64 as ggml does.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let sum: f64 = x.iter().map(|&v| (v * v) as f64).sum();
    let mean = (sum / x.len() as f64) as f32;
    let scale = 1.0 / (mean + eps).sqrt();
    for ((o, &v), &g) in out.iter_mut().zip(x).zip(w) {
        *o = (v * scale) * g;
    }
}

/// Cos/sin of every rotated pair at one position: `(cos, sin)` for `rope_dims / 2` pairs.
pub fn rope_table(pos: usize, rope_dims: usize, base: f32) -> Vec<(f32, f32)> {
    // ggml advances theta by repeated multiplication; doing the same keeps us close to llama.cpp.
    let theta_scale = base.powf(-2.0 / rope_dims as f32);
    let mut theta = pos as f32;
    (0..rope_dims / 2)
        .map(|_| {
            let cs = (theta.cos(), theta.sin());
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

/// `g = silu(g) * u`, element-wise.
pub fn swiglu(g: &mut [f32], u: &[f32]) {
    for (a, &b) in g.iter_mut().zip(u) {
        let v = *a;
        *a = v / (1.0 + (-v).exp()) * b;
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
/// Batches of at least this many tokens build (and cache) dequantized weight columns for their outliers.
const COLUMN_MIN_TOKENS: usize = 8;
/// Tokens dotted against a tile of weight rows at once by `vec_dot_tile`.
const TOKEN_TILE: usize = 8;

/// Runs several matrix products that share one batch of quantized activations, splitting their
/// concatenated rows over the pool's threads. Every job's weights must have the type `acts` was
/// quantized for.
pub fn matmul(pool: &ThreadPool, jobs: &[MatJob], qa: &QuantActs) {
    let total_rows: usize = jobs.iter().map(|j| j.w.rows).sum();
    let t_count = qa.t_count();
    let acts: Vec<quant::ActRow> = (0..t_count).map(|t| qa.act_row(t)).collect();
    // Dequantized weight columns at the batch's outlier channels, per job (see `acts`).
    let channels = qa.outlier_channels();
    // A column costs one value per row to build: worth it for a batch, not for a single token (which
    // reads the few values it needs from the weights directly).
    let build = t_count >= COLUMN_MIN_TOKENS;
    let columns: Vec<Vec<Option<Arc<[f32]>>>> =
        jobs.iter().map(|j| channels.iter().map(|&c| j.w.column(c, build)).collect()).collect();
    // Each token's outliers as (channel, index into `channels`, value), in channel order.
    let outliers: Vec<Vec<(usize, usize, f32)>> = qa
        .outliers
        .iter()
        .map(|o| o.iter().map(|&(c, v)| (c, channels.binary_search(&c).unwrap_or(0), v)).collect())
        .collect();
    // Split in units of ROW_TILE rows so tiles stay whole.
    let n_tiles = total_rows.div_ceil(ROW_TILE);
    let n_chunks = pool.chunks_for(n_tiles);
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
                    let dots = &mut dots[..n * nt];
                    match w.packed() {
                        Some(p) => {
                            // The whole group's rows, then the tile's of them.
                            let group = &mut group_dots[..nt * ROW_TILE];
                            p.tile(r0 / ROW_TILE, &acts[t0..t1], group);
                            let skip = r0 % ROW_TILE;
                            for (d, g) in dots.chunks_exact_mut(n).zip(group.chunks_exact(ROW_TILE)) {
                                d.copy_from_slice(&g[skip..skip + n]);
                            }
                        }
                        None => quant::vec_dot_tile(w.ty, w.cols, &wdata[r0 * rb..r1 * rb], rb, &acts[t0..t1], dots),
                    }
                    for t in t0..t1 {
                        // The token's exact outliers against each row of the tile, summed in channel
                        // order: from the cached column where there is one, else from the weights.
                        let mut corr = [0f32; ROW_TILE];
                        for &(ch, slot, v) in &outliers[t] {
                            let wv = match &columns[slot] {
                                Some(col) => &col[r0..r1],
                                None => {
                                    let tw = &mut tile_w[slot * ROW_TILE..slot * ROW_TILE + n];
                                    if tile_w_for[slot] != (ji, r0) {
                                        for (i, x) in tw.iter_mut().enumerate() {
                                            *x = w.value(r0 + i, ch);
                                        }
                                        tile_w_for[slot] = (ji, r0);
                                    }
                                    &*tw
                                }
                            };
                            for (c, &x) in corr.iter_mut().zip(wv) {
                                *c += x * v;
                            }
                        }
                        // SAFETY: rows r0..r1 of this job are owned by this thread, for every token.
                        let out = unsafe { job.out.slice(t * rows + r0, n) };
                        let dots = &dots[(t - t0) * n..(t - t0 + 1) * n];
                        match job.bias {
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
                    }
                }
            }
        }
    });
}

/// Shapes of an attention call.
pub struct AttnShape {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
}
