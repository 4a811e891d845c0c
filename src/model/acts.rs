//! Activations quantized for a matrix product, the way llama.cpp's CPU backend does it (8-bit blocks in
//! the weight type's `vec_dot_type`), with one refinement: outliers are kept exact.
//!
//! Why: small llama models carry "massive activations" (a few channels hundreds of times larger than the
//! rest). In an 8-bit block that holds such a value, the other 31 values round to a few levels or to zero,
//! and that error flips greedy choices chaotically (SmolLM2-135M's first-token log-probabilities move by
//! 0.3 nat against an exact float64 pass). Every value larger than `OUTLIER_RATIO` times its row's RMS is
//! taken out of the row before quantizing (so its block is quantized at the scale of its neighbours) and
//! added back exactly: the matmul adds `W[r][c] * x[c]` from a dequantized copy of column `c`, which the
//! weight matrix caches (the channels are few and the same for every token). The correction depends only on
//! the token's own activations and is summed in channel order, so batch invariance holds.

use crate::quant::{self, GgmlType};
use crate::threadpool::{split_range, SharedMut, ThreadPool};

/// A value whose magnitude exceeds this multiple of its row's RMS is kept exact (see above).
pub const OUTLIER_RATIO: f32 = 8.0;

/// A batch of activation rows quantized for products with weights of one type.
#[derive(Default)]
pub struct QuantActs {
    /// Bytes per quantized row.
    pub row_bytes: usize,
    pub data: Vec<u8>, // (t_count, row_bytes)
    /// f32 copies per row that the SIMD kernels read instead of converting f16 in every weight row
    /// (`quant::act_aux_len`: block scales for q8_0 / q8_1, the values for f16).
    pub aux_len: usize,
    pub aux: Vec<f32>, // (t_count, aux_len)
    /// Per row: the outliers taken out before quantizing, as (channel, value), ascending channel.
    pub outliers: Vec<Vec<(usize, f32)>>,
}

impl QuantActs {
    pub fn t_count(&self) -> usize {
        self.outliers.len()
    }

    pub fn row(&self, t: usize) -> &[u8] {
        &self.data[t * self.row_bytes..(t + 1) * self.row_bytes]
    }

    /// Row `t` with its f32 copies, as the products take it.
    pub fn act_row(&self, t: usize) -> quant::ActRow<'_> {
        quant::ActRow { q: self.row(t), aux: &self.aux[t * self.aux_len..(t + 1) * self.aux_len] }
    }

    /// The channels that carry an outlier in any row of the batch, ascending.
    pub fn outlier_channels(&self) -> Vec<usize> {
        let mut c: Vec<usize> = self.outliers.iter().flatten().map(|&(i, _)| i).collect();
        c.sort_unstable();
        c.dedup();
        c
    }

    /// Quantizes the rows of `x` (each `n` wide) for products with weights of type `w_ty`.
    pub fn quantize(&mut self, pool: &ThreadPool, w_ty: GgmlType, x: &[f32], n: usize) {
        let act_ty = quant::vec_dot_type(w_ty);
        let row_bytes = quant::row_len_bytes(act_ty, n).unwrap_or(0);
        let t_count = x.len() / n;
        let aux_len = quant::act_aux_len(act_ty, n);
        self.row_bytes = row_bytes;
        self.data.resize(t_count * row_bytes, 0);
        self.aux_len = aux_len;
        self.aux.resize(t_count * aux_len, 0.0);
        self.outliers.clear();
        self.outliers.resize_with(t_count, Vec::new);
        let refine = matches!(act_ty, GgmlType::Q8_0 | GgmlType::Q8_1 | GgmlType::Q8K);
        let data = SharedMut::new(&mut self.data);
        let aux = SharedMut::new(&mut self.aux);
        let outliers = SharedMut::new(&mut self.outliers);
        let run = |rows: std::ops::Range<usize>| {
            let mut scratch = Vec::new();
            for t in rows {
                let xr = &x[t * n..(t + 1) * n];
                // SAFETY: each row's bytes and outlier list are written by one thread only.
                let dst = unsafe { data.slice(t * row_bytes, row_bytes) };
                let found = unsafe { &mut outliers.slice(t, 1)[0] };
                if refine && find_outliers(xr, found) {
                    scratch.clear();
                    scratch.extend_from_slice(xr);
                    for &(i, _) in found.iter() {
                        scratch[i] = 0.0;
                    }
                    quant::quantize_row_act(act_ty, &scratch, dst);
                } else {
                    quant::quantize_row_act(act_ty, xr, dst);
                }
                // SAFETY: as above, row t's copies are this thread's.
                let aux = unsafe { aux.slice(t * aux_len, aux_len) };
                quant::fill_act_aux(act_ty, n, dst, aux);
            }
        };
        if t_count < 4 {
            run(0..t_count);
        } else {
            let n_chunks = pool.chunks_for(t_count);
            pool.run(n_chunks, |c| run(split_range(c, n_chunks, t_count)));
        }
    }
}

/// Collects the values of `x` beyond `OUTLIER_RATIO` times its RMS into `out`; true if there are any.
///
/// The squares are summed in 16 lanes (value `i` in lane `i % 16`, in order) and the lanes in a fixed tree,
/// so the sum has one value on every target whatever vectors the compiler makes of the lanes; the largest
/// magnitude, found beside it, skips the scan for the row without outliers. Where AVX2 was detected the same
/// body runs compiled for it (two 8-lane vectors where the baseline takes four 4-lane ones: the same bits).
fn find_outliers(x: &[f32], out: &mut Vec<(usize, f32)>) -> bool {
    #[cfg(target_arch = "x86_64")]
    if quant::simd_level().avx2() {
        // SAFETY: AVX2 was detected; the body is plain Rust.
        return unsafe { find_outliers_avx2(x, out) };
    }
    find_outliers_body(x, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn find_outliers_avx2(x: &[f32], out: &mut Vec<(usize, f32)>) -> bool {
    find_outliers_body(x, out)
}

#[inline(always)]
fn find_outliers_body(x: &[f32], out: &mut Vec<(usize, f32)>) -> bool {
    let mut sq = [0f32; 16];
    let mut big = [0f32; 16];
    let chunks = x.chunks_exact(16);
    let rest = chunks.remainder();
    for c in chunks {
        for j in 0..16 {
            sq[j] += c[j] * c[j];
            big[j] = big[j].max(c[j].abs());
        }
    }
    for (j, &v) in rest.iter().enumerate() {
        sq[j] += v * v;
        big[j] = big[j].max(v.abs());
    }
    let mut width = 16;
    while width > 1 {
        width /= 2;
        for j in 0..width {
            sq[j] += sq[j + width];
            big[j] = big[j].max(big[j + width]);
        }
    }
    let limit = OUTLIER_RATIO * (sq[0] / x.len() as f32).sqrt();
    if big[0] <= limit || limit.is_nan() {
        return false;
    }
    // Most of a row lies within the limit: a chunk is looked at value by value only when one is beyond it.
    for (c, chunk) in x.chunks(16).enumerate() {
        if chunk.iter().fold(false, |any, v| any | (v.abs() > limit)) {
            let at = c * 16;
            out.extend(chunk.iter().enumerate().filter(|(_, v)| v.abs() > limit).map(|(i, &v)| (at + i, v)));
        }
    }
    !out.is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outliers_are_the_values_beyond_the_ratio_of_the_rms_in_channel_order_on_every_path() {
        // Rows of 576 and 1000 values (a tail shorter than a chunk), with spikes at chunk edges and inside.
        for n in [576, 1000] {
            let mut x: Vec<f32> = (0..n).map(|i| ((i * 13 % 29) as f32 - 14.0) * 0.01).collect();
            for (i, v) in [(0, 9.0), (15, -7.5), (16, 8.0), (47, 0.02), (n - 1, -12.0)] {
                x[i] = v;
            }
            let sq: f64 = x.iter().map(|&v| (v as f64) * (v as f64)).sum();
            let limit = OUTLIER_RATIO as f64 * (sq / n as f64).sqrt();
            let want: Vec<(usize, f32)> =
                x.iter().enumerate().filter(|(_, v)| (v.abs() as f64) > limit).map(|(i, &v)| (i, v)).collect();
            assert_eq!(want.len(), 4, "the spikes beyond {limit}");
            let mut found = Vec::new();
            assert!(find_outliers(&x, &mut found));
            assert_eq!(found, want);
            let mut portable = Vec::new();
            assert!(find_outliers_body(&x, &mut portable));
            assert_eq!(portable, want);
            // A row without spikes has none.
            let flat: Vec<f32> = (0..n).map(|i| (i % 7) as f32 * 0.1).collect();
            assert!(!find_outliers(&flat, &mut Vec::new()));
        }
    }
}
