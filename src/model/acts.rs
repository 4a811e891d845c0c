//! Activations quantized for a matrix product, the way llama.cpp's CPU backend does it (8-bit blocks in
//! the weight type's `vec_dot_type`), plus one refinement: outlier blocks get a residual block.
//!
//! Why the refinement: small llama models carry "massive activations" (one channel thousands of times
//! larger than the rest). In an 8-bit block that holds such a value, the other 31 values round to a few
//! levels or to zero, and the error flips greedy choices chaotically (SmolLM2-135M's first-token
//! log-probabilities move by 0.3 nat). For every block whose largest magnitude exceeds
//! `OUTLIER_RATIO` times the row's RMS, the residual `x - dequant(q)` is quantized again in the same
//! format; the matmul adds the weight block's dot product with it. That brings the logits of the default
//! model to within a few hundredths of a nat of an exact float64 pass, at the cost of one extra block dot
//! per outlier block (typically one or two per row). It depends only on the token's own activations, so
//! batch invariance holds.

use crate::quant::{self, GgmlType};
use crate::threadpool::{split_range, ThreadPool};

use super::ops::SharedMut;

/// A block whose largest |value| exceeds this multiple of the row's RMS gets a residual block.
pub const OUTLIER_RATIO: f32 = 8.0;

/// A batch of activation rows quantized for products with weights of one type.
#[derive(Default)]
pub struct QuantActs {
    /// Values per row.
    pub n: usize,
    /// Bytes per quantized row.
    pub row_bytes: usize,
    /// The format rows are quantized to (`quant::vec_dot_type` of the weights).
    pub act_ty: Option<GgmlType>,
    pub data: Vec<u8>, // (t_count, row_bytes)
    /// Per row: (block index, residual block bytes in `act_ty`).
    pub corrections: Vec<Vec<(usize, Vec<u8>)>>,
}

impl QuantActs {
    pub fn t_count(&self) -> usize {
        self.corrections.len()
    }

    pub fn row(&self, t: usize) -> &[u8] {
        &self.data[t * self.row_bytes..(t + 1) * self.row_bytes]
    }

    /// Quantizes the rows of `x` (each `n` wide) for products with weights of type `w_ty`.
    pub fn quantize(&mut self, pool: &ThreadPool, w_ty: GgmlType, x: &[f32], n: usize) {
        let act_ty = quant::vec_dot_type(w_ty);
        let row_bytes = quant::row_len_bytes(act_ty, n).unwrap_or(0);
        let t_count = x.len() / n;
        self.n = n;
        self.row_bytes = row_bytes;
        self.act_ty = Some(act_ty);
        self.data.resize(t_count * row_bytes, 0);
        self.corrections.clear();
        self.corrections.resize_with(t_count, Vec::new);
        let refine = matches!(act_ty, GgmlType::Q8_0 | GgmlType::Q8_1 | GgmlType::Q8K);
        let data = SharedMut::new(&mut self.data);
        let corrections = SharedMut::new(&mut self.corrections);
        let run = |rows: std::ops::Range<usize>| {
            for t in rows {
                let xr = &x[t * n..(t + 1) * n];
                // SAFETY: each row's bytes and correction list are written by one thread only.
                let dst = unsafe { data.slice(t * row_bytes, row_bytes) };
                quant::quantize_row_act(act_ty, xr, dst);
                if refine {
                    let corr = unsafe { &mut corrections.slice(t, 1)[0] };
                    residual_blocks(act_ty, xr, dst, corr);
                }
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

/// Appends a residual block for every outlier block of the row `x` quantized as `q`.
fn residual_blocks(act_ty: GgmlType, x: &[f32], q: &[u8], out: &mut Vec<(usize, Vec<u8>)>) {
    let mean_sq = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let limit = OUTLIER_RATIO * mean_sq.sqrt();
    let len = act_ty.block_len();
    let bb = act_ty.block_bytes();
    let mut deq = vec![0f32; len];
    for (b, xb) in x.chunks_exact(len).enumerate() {
        let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
        if amax <= limit {
            continue;
        }
        dequantize_act_block(act_ty, &q[b * bb..(b + 1) * bb], &mut deq);
        let resid: Vec<f32> = xb.iter().zip(&deq).map(|(a, d)| a - d).collect();
        let mut bytes = vec![0u8; bb];
        quant::quantize_row_act(act_ty, &resid, &mut bytes);
        out.push((b, bytes));
    }
}

/// The values an activation block stands for.
fn dequantize_act_block(act_ty: GgmlType, b: &[u8], out: &mut [f32]) {
    let f16 = |i: usize| half::f16::from_le_bytes([b[i], b[i + 1]]).to_f32();
    match act_ty {
        GgmlType::Q8_0 | GgmlType::Q8_1 => {
            let (d, qs) = if act_ty == GgmlType::Q8_0 { (f16(0), &b[2..]) } else { (f16(0), &b[4..]) };
            for (o, &q) in out.iter_mut().zip(qs) {
                *o = d * (q as i8) as f32;
            }
        }
        GgmlType::Q8K => {
            let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            for (o, &q) in out.iter_mut().zip(&b[4..]) {
                *o = d * (q as i8) as f32;
            }
        }
        _ => out.fill(0.0),
    }
}

/// The correction of one weight row against row `t`'s residual blocks (0 when there are none).
#[inline]
pub fn correction(w_ty: GgmlType, w_row: &[u8], acts: &QuantActs, t: usize) -> f32 {
    let mut c = 0f32;
    if let Some(act_ty) = acts.act_ty {
        let len = act_ty.block_len();
        let wbb = w_ty.block_bytes();
        for (b, bytes) in &acts.corrections[t] {
            c += quant::vec_dot(w_ty, len, &w_row[b * wbb..(b + 1) * wbb], bytes);
        }
    }
    c
}
