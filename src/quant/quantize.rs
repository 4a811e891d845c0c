//! Quantization from f32: reference quantizers for weights, and the scalar activation quantizers.
//!
//! Weights: q4_0 .. q8_0 follow ggml's `quantize_row_*_ref` exactly, here; the K-quants, iq4_nl, iq4_xs
//! and mxfp4 follow ggml's reference searches exactly, in `kquantize` and `nlquantize`. All are checked
//! byte for byte against ggml's own output (`tests/data/quant`, the `fixtures` tests).
//!
//! Activations: q8_0 and q8_1 follow ggml-cpu's x86 `quantize_row_q8_0/1` (scale 127 / amax, round half
//! to even) rather than the `_ref` versions (1 / d, round half away from zero). llama.cpp on an AVX
//! machine runs the former, and Strata's SIMD path produces the same bytes, so every path agrees.
//! q8_K follows `quantize_row_q8_K_ref`, which is what ggml-cpu uses on every target.

use super::blocks::*;
use super::types::{GgmlType, QK, QK_K};
use super::{kquantize, nlquantize};

/// Quantizes a row of weights. `x.len()` is a whole number of blocks and `dst` has its row size.
pub fn quantize_weights(ty: GgmlType, x: &[f32], dst: &mut [u8]) {
    let bb = ty.block_bytes();
    match ty {
        GgmlType::F32 => {
            for (v, b) in x.iter().zip(dst.chunks_exact_mut(4)) {
                b.copy_from_slice(&v.to_le_bytes());
            }
        }
        GgmlType::F16 => {
            for (v, b) in x.iter().zip(dst.chunks_exact_mut(2)) {
                put_f16(b, 0, *v);
            }
        }
        GgmlType::BF16 => {
            for (v, b) in x.iter().zip(dst.chunks_exact_mut(2)) {
                b.copy_from_slice(&half::bf16::from_f32(*v).to_bits().to_le_bytes());
            }
        }
        GgmlType::Q4_0 => each_block(x, dst, bb, QK, q4_0),
        GgmlType::Q4_1 => each_block(x, dst, bb, QK, q4_1),
        GgmlType::Q5_0 => each_block(x, dst, bb, QK, q5_0),
        GgmlType::Q5_1 => each_block(x, dst, bb, QK, q5_1),
        GgmlType::Q8_0 => each_block(x, dst, bb, QK, q8_0_ref),
        GgmlType::Q8_1 => each_block(x, dst, bb, QK, q8_1_act),
        GgmlType::Q2K => each_block(x, dst, bb, QK_K, kquantize::q2_k),
        GgmlType::Q3K => each_block(x, dst, bb, QK_K, kquantize::q3_k),
        GgmlType::Q4K => each_block(x, dst, bb, QK_K, kquantize::q4_k),
        GgmlType::Q5K => each_block(x, dst, bb, QK_K, kquantize::q5_k),
        GgmlType::Q6K => each_block(x, dst, bb, QK_K, kquantize::q6_k),
        GgmlType::Q8K => each_block(x, dst, bb, QK_K, q8_k_act),
        GgmlType::IQ4NL => each_block(x, dst, bb, QK, nlquantize::iq4_nl),
        GgmlType::IQ4XS => each_block(x, dst, bb, QK_K, nlquantize::iq4_xs),
        GgmlType::MXFP4 => each_block(x, dst, bb, QK, nlquantize::mxfp4),
    }
}

fn each_block(x: &[f32], dst: &mut [u8], bb: usize, bl: usize, f: fn(&[f32], &mut [u8])) {
    for (x, b) in x.chunks_exact(bl).zip(dst.chunks_exact_mut(bb)) {
        f(x, b);
    }
}

/// The value of largest magnitude (the first one on ties), as ggml's quantizers pick it.
fn signed_amax(x: &[f32]) -> f32 {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

fn min_max(x: &[f32]) -> (f32, f32) {
    x.iter().fold((f32::MAX, -f32::MAX), |(lo, hi), &v| (lo.min(v), hi.max(v)))
}

fn q4_0(x: &[f32], b: &mut [u8]) {
    let d = signed_amax(x) / -8.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    put_f16(b, 0, d);
    for j in 0..QK / 2 {
        // `(int8_t)(v + 8.5f)` truncates toward zero; then clamp to 15.
        let x0 = ((x[j] * id + 8.5) as i8).min(15) as u8;
        let x1 = ((x[j + 16] * id + 8.5) as i8).min(15) as u8;
        b[2 + j] = x0 | (x1 << 4);
    }
}

fn q4_1(x: &[f32], b: &mut [u8]) {
    let (min, max) = min_max(x);
    let d = (max - min) / 15.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    put_f16(b, 0, d);
    put_f16(b, 2, min);
    for j in 0..QK / 2 {
        let x0 = (((x[j] - min) * id + 0.5) as i8).min(15) as u8;
        let x1 = (((x[j + 16] - min) * id + 0.5) as i8).min(15) as u8;
        b[4 + j] = x0 | (x1 << 4);
    }
}

fn q5_0(x: &[f32], b: &mut [u8]) {
    let d = signed_amax(x) / -16.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    put_f16(b, 0, d);
    let mut qh = 0u32;
    for j in 0..QK / 2 {
        let x0 = ((x[j] * id + 16.5) as i8).min(31) as u8;
        let x1 = ((x[j + 16] * id + 16.5) as i8).min(31) as u8;
        b[6 + j] = (x0 & 0xF) | ((x1 & 0xF) << 4);
        qh |= (((x0 & 0x10) >> 4) as u32) << j;
        qh |= (((x1 & 0x10) >> 4) as u32) << (j + 16);
    }
    b[2..6].copy_from_slice(&qh.to_le_bytes());
}

fn q5_1(x: &[f32], b: &mut [u8]) {
    let (min, max) = min_max(x);
    let d = (max - min) / 31.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    put_f16(b, 0, d);
    put_f16(b, 2, min);
    let mut qh = 0u32;
    for j in 0..QK / 2 {
        let x0 = ((x[j] - min) * id + 0.5) as u8;
        let x1 = ((x[j + 16] - min) * id + 0.5) as u8;
        b[8 + j] = (x0 & 0xF) | ((x1 & 0xF) << 4);
        qh |= (((x0 & 0x10) >> 4) as u32) << j;
        qh |= (((x1 & 0x10) >> 4) as u32) << (j + 16);
    }
    b[4..8].copy_from_slice(&qh.to_le_bytes());
}

/// ggml's `quantize_row_q8_0_ref`, for q8_0 weights.
fn q8_0_ref(x: &[f32], b: &mut [u8]) {
    let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    put_f16(b, 0, d);
    for j in 0..QK {
        b[2 + j] = (x[j] * id).round() as i8 as u8; // `roundf`: half away from zero
    }
}

/// Shared core of the x86 q8_0 / q8_1 activation quantizers: writes the 32 quants, returns (d, sum).
#[inline(always)]
pub fn q8_act_core(x: &[f32], qs: &mut [u8]) -> (f32, i32) {
    let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    let mut sum = 0i32;
    for (q, v) in qs.iter_mut().zip(x) {
        // cvtps_epi32 of a rounded value, then the saturating packs down to i8.
        let i = (v * id).round_ties_even() as i32;
        sum += i;
        *q = i.clamp(-128, 127) as i8 as u8;
    }
    (d, sum)
}

/// One q8_0 activation block (x86 `quantize_row_q8_0`); the dispatching path is `quant::quantize_row_act`.
#[cfg(test)]
pub fn q8_0_act(x: &[f32], b: &mut [u8]) {
    let (d, _) = q8_act_core(x, &mut b[2..2 + QK]);
    put_f16(b, 0, d);
}

/// One q8_1 activation block (x86 `quantize_row_q8_1`): `s = d * sum(qs)` with d before f16 rounding.
pub fn q8_1_act(x: &[f32], b: &mut [u8]) {
    let (d, sum) = q8_act_core(x, &mut b[4..4 + QK]);
    put_f16(b, 0, d);
    put_f16(b, 2, d * sum as f32);
}

/// ggml's `nearest_int`: round half to even through the 1.5 * 2^23 trick (valid for |v| < 2^22).
#[inline(always)]
pub(super) fn nearest_int(v: f32) -> i32 {
    let bits = (v + 12582912.0f32).to_bits() as i32;
    (bits & 0x007f_ffff) - 0x0040_0000
}

/// One q8_K activation block (`quantize_row_q8_K_ref`).
pub fn q8_k_act(x: &[f32], b: &mut [u8]) {
    let max = signed_amax(x);
    if max == 0.0 {
        b.fill(0);
        return;
    }
    let iscale = -127.0 / max;
    for j in 0..QK_K {
        b[Q8K_QS + j] = nearest_int(iscale * x[j]).min(127) as i8 as u8;
    }
    for g in 0..QK_K / 16 {
        let sum: i32 = (0..16).map(|i| b[Q8K_QS + 16 * g + i] as i8 as i32).sum();
        b[Q8K_BSUMS + 2 * g..Q8K_BSUMS + 2 * g + 2].copy_from_slice(&(sum as i16).to_le_bytes());
    }
    b[..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q8_0_activation_rounds_half_to_even() {
        // amax 127 gives id = 1, so 2.5 -> 2, 3.5 -> 4, -0.5 -> 0.
        let mut x = [0f32; 32];
        x[..4].copy_from_slice(&[127.0, 2.5, 3.5, -0.5]);
        let mut b = [0u8; 34];
        q8_0_act(&x, &mut b);
        assert_eq!(f16_at(&b, 0), 1.0);
        assert_eq!(&b[2..6], &[127, 2, 4, 0]);
    }

    #[test]
    fn q8_1_activation_stores_d_times_sum() {
        let mut x = [0f32; 32];
        x[..3].copy_from_slice(&[-127.0, 10.0, 20.0]);
        let mut b = [0u8; 36];
        q8_1_act(&x, &mut b);
        assert_eq!(f16_at(&b, 0), 1.0);
        assert_eq!(f16_at(&b, 2), -97.0);
    }

    #[test]
    fn q8_k_activation_known_block() {
        let mut x = [0f32; 256];
        x[0] = -2.0;
        x[17] = 1.0;
        let mut b = [0u8; 292];
        q8_k_act(&x, &mut b);
        assert_eq!(f32_at(&b, 0), 1.0 / 63.5);
        // iscale = 63.5: -2 -> -127, 1 -> 63.5 -> 64 (ties to even).
        assert_eq!(b[4] as i8, -127);
        assert_eq!(b[4 + 17] as i8, 64);
        assert_eq!(i16_at(&b, Q8K_BSUMS), -127);
        assert_eq!(i16_at(&b, Q8K_BSUMS + 2), 64);
        q8_k_act(&[0.0; 256], &mut b);
        assert!(b.iter().all(|&v| v == 0));
    }

    #[test]
    fn q4_0_ref_known_block() {
        // amax -8 gives d = 1: x = -8 -> 0, 7 -> 15, 0 -> 8.
        let mut x = [0f32; 32];
        x[0] = -8.0;
        x[16] = 7.0;
        let mut b = [0u8; 18];
        q4_0(&x, &mut b);
        assert_eq!(f16_at(&b, 0), 1.0);
        assert_eq!(b[2], 0xF0);
        assert_eq!(b[3], 0x88);
    }
}
