//! ggml's reference quantizers for the K-quants (q2_K .. q6_K): the searches llama-quantize runs when it
//! has no importance matrix. The table formats (iq4_nl, iq4_xs, mxfp4) are in `nlquantize`.
//!
//! Each function follows its ggml counterpart (`quantize_row_*_ref` in ggml-quants.c) float operation for
//! float operation: the same sums in the same order, the same f16 roundings,
//! the same tie-breaking comparisons. ggml's CPU build of these is plain scalar C without FMA contraction
//! (libggml-base is compiled without `-mfma`), so evaluating the same expressions in the same order in
//! Rust gives the same bytes; `tests/data/quant` holds ggml's output to prove it. This module never
//! allocates and never looks at more than one block at a time.

use super::blocks::*;
use super::quantize::nearest_int;
use super::types::QK_K;

/// ggml's `GROUP_MAX_EPS`: a sub-block whose largest magnitude is below this is all zeros.
pub(super) const GROUP_MAX_EPS: f32 = 1e-15;

/// The value of largest magnitude (the first on ties) and that magnitude.
pub(super) fn signed_max(x: &[f32]) -> (f32, f32) {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    (max, amax)
}

/// Affine levels `x ~ scale * L - min`, `L` in `0..=nmax`, by weighted least squares over a range of trial
/// scales (`make_qkx2_quants`). Returns `(scale, min)`; `min` is the positive offset stored in the block.
#[allow(clippy::too_many_arguments)]
fn make_qkx2_quants(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    l_out: &mut [u8],
    l_aux: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> (f32, f32) {
    let n = x.len();
    let (mut min, mut max) = (x[0], x[0]);
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        sum_w += weights[i];
        sum_x += weights[i] * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l_out[..n].fill(0);
        return (0.0, -min);
    }
    let err = |d: f32| if use_mad { d.abs() } else { d * d };
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0f32;
    for i in 0..n {
        let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        l_out[i] = l as u8;
        best_error += weights[i] * err(scale * l as f32 + min - x[i]);
    }
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0f32, 0f32, 0f32);
        for i in 0..n {
            let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            l_aux[i] = l as u8;
            let (w, l) = (weights[i], l as f32);
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * x[i];
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0f32;
            for i in 0..n {
                cur_error += weights[i] * err(this_scale * l_aux[i] as f32 + this_min - x[i]);
            }
            if cur_error < best_error {
                l_out[..n].copy_from_slice(&l_aux[..n]);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// Symmetric levels `x ~ scale * (L - nmax)`, `L` in `0..2 * nmax`, refined one value at a time to
/// maximize the x²-weighted fit (`make_q3_quants` with `do_rmse`). Returns the scale.
fn make_q3_quants(nmax: i32, x: &[f32], l_out: &mut [i8]) -> f32 {
    let n = x.len();
    let (max, amax) = signed_max(x);
    if amax < GROUP_MAX_EPS {
        l_out[..n].fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    let (mut sumlx, mut suml2) = (0f32, 0f32);
    for i in 0..n {
        let l = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1);
        l_out[i] = l as i8;
        let w = x[i] * x[i];
        sumlx += w * x[i] * l as f32;
        suml2 += w * l as f32 * l as f32;
    }
    for _ in 0..5 {
        let mut n_changed = 0;
        for i in 0..n {
            let w = x[i] * x[i];
            let li = l_out[i] as f32;
            let mut slx = sumlx - w * x[i] * li;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * li * li;
                let new_l = nearest_int(x[i] * sl2 / slx).clamp(-nmax, nmax - 1);
                if new_l != l_out[i] as i32 {
                    slx += w * x[i] * new_l as f32;
                    sl2 += w * new_l as f32 * new_l as f32;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        l_out[i] = new_l as i8;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed += 1;
                    }
                }
            }
        }
        if n_changed == 0 {
            break;
        }
    }
    for l in &mut l_out[..n] {
        *l += nmax as i8;
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// Symmetric levels as `make_q3_quants`, found instead by trying 19 scales around `nmax / max` with x²
/// weights (`make_qx_quants`, rmse_type 1, no importance weights). Returns the scale.
fn make_qx_quants(nmax: i32, x: &[f32], l_out: &mut [i8]) -> f32 {
    let n = x.len();
    let (max, amax) = signed_max(x);
    if amax < GROUP_MAX_EPS {
        l_out[..n].fill(0);
        return 0.0;
    }
    let sums = |iscale: f32, l_out: Option<&mut [i8]>| {
        let (mut sumlx, mut suml2) = (0f32, 0f32);
        let mut l_out = l_out;
        for i in 0..n {
            let l = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1);
            if let Some(o) = l_out.as_deref_mut() {
                o[i] = (l + nmax) as i8;
            }
            let w = x[i] * x[i];
            sumlx += w * x[i] * l as f32;
            suml2 += w * l as f32 * l as f32;
        }
        (sumlx, suml2)
    };
    let (sumlx, suml2) = sums(-(nmax as f32) / max, Some(&mut *l_out));
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        let iscale = -(nmax as f32 + 0.1f32 * is as f32) / max;
        let (sumlx, suml2) = sums(iscale, None);
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            sums(iscale, Some(&mut *l_out));
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// Packs 256 2-bit levels into q2_K / q3_K's `qs` (64 bytes): four values 32 apart per byte.
fn pack_2bit(l: &[u8; QK_K], qs: &mut [u8]) {
    for h in 0..QK_K / 128 {
        for i in 0..32 {
            let at = 128 * h + i;
            qs[32 * h + i] = l[at] | (l[at + 32] << 2) | (l[at + 64] << 4) | (l[at + 96] << 6);
        }
    }
}

/// `quantize_row_q2_K_ref`: 16 sub-blocks of 16 with 4-bit scales and mins.
pub fn q2_k(x: &[f32], b: &mut [u8]) {
    let mut l = [0u8; QK_K];
    let mut l_aux = [0u8; 16];
    let mut weights = [0f32; 16];
    let (mut scales, mut mins) = ([0f32; 16], [0f32; 16]);
    let (mut max_scale, mut max_min) = (0f32, 0f32);
    for j in 0..QK_K / 16 {
        let xs = &x[16 * j..16 * j + 16];
        for (w, v) in weights.iter_mut().zip(xs) {
            *w = v.abs();
        }
        (scales[j], mins[j]) =
            make_qkx2_quants(3, xs, &weights, &mut l[16 * j..16 * j + 16], &mut l_aux, -0.5, 0.1, 15, true);
        if scales[j] > max_scale {
            max_scale = scales[j];
        }
        if mins[j] > max_min {
            max_min = mins[j];
        }
    }
    let sc = &mut b[Q2K_SCALES..Q2K_SCALES + 16];
    if max_scale > 0.0 {
        let iscale = 15.0 / max_scale;
        for j in 0..16 {
            sc[j] = nearest_int(iscale * scales[j]) as u8;
        }
        put_f16(b, Q2K_D, max_scale / 15.0);
    } else {
        sc.fill(0);
        put_f16(b, Q2K_D, 0.0);
    }
    if max_min > 0.0 {
        let iscale = 15.0 / max_min;
        for j in 0..16 {
            b[Q2K_SCALES + j] |= (nearest_int(iscale * mins[j]) << 4) as u8;
        }
        put_f16(b, Q2K_DMIN, max_min / 15.0);
    } else {
        put_f16(b, Q2K_DMIN, 0.0);
    }
    let (d_all, dmin_all) = (f16_at(b, Q2K_D), f16_at(b, Q2K_DMIN));
    for j in 0..QK_K / 16 {
        let sc = b[Q2K_SCALES + j];
        let d = d_all * (sc & 0xF) as f32;
        if d == 0.0 {
            continue;
        }
        let dm = dmin_all * (sc >> 4) as f32;
        for i in 16 * j..16 * j + 16 {
            l[i] = nearest_int((x[i] + dm) / d).clamp(0, 3) as u8;
        }
    }
    pack_2bit(&l, &mut b[Q2K_QS..Q2K_QS + 64]);
}

/// `quantize_row_q3_K_ref`: 16 sub-blocks of 16 with signed 6-bit scales, levels -4..=3.
pub fn q3_k(x: &[f32], b: &mut [u8]) {
    let mut l = [0i8; QK_K];
    let mut scales = [0f32; 16];
    let (mut max_scale, mut amax) = (0f32, 0f32);
    for j in 0..QK_K / 16 {
        scales[j] = make_q3_quants(4, &x[16 * j..16 * j + 16], &mut l[16 * j..16 * j + 16]);
        if scales[j].abs() > amax {
            amax = scales[j].abs();
            max_scale = scales[j];
        }
    }
    b[Q3K_SCALES..Q3K_SCALES + 12].fill(0);
    if max_scale != 0.0 {
        let iscale = -32.0 / max_scale;
        let sc = &mut b[Q3K_SCALES..Q3K_SCALES + 12];
        for j in 0..16 {
            // ggml stores the rounded value in an int8_t before clamping.
            let v = (nearest_int(iscale * scales[j]) as i8 as i32).clamp(-32, 31) + 32;
            let low = (v & 0xF) as u8;
            if j < 8 {
                sc[j] = low;
            } else {
                sc[j - 8] |= low << 4;
            }
            sc[8 + j % 4] |= ((v >> 4) as u8) << (2 * (j / 4));
        }
        put_f16(b, Q3K_D, 1.0 / iscale);
    } else {
        put_f16(b, Q3K_D, 0.0);
    }
    let d_all = f16_at(b, Q3K_D);
    for j in 0..QK_K / 16 {
        let d = d_all * q3k_scale(j, &b[Q3K_SCALES..Q3K_SCALES + 12]) as f32;
        if d == 0.0 {
            continue;
        }
        for i in 16 * j..16 * j + 16 {
            l[i] = (nearest_int(x[i] / d).clamp(-4, 3) + 4) as i8;
        }
    }
    b[Q3K_HMASK..Q3K_HMASK + 32].fill(0);
    let mut levels = [0u8; QK_K];
    for (j, (&v, out)) in l.iter().zip(levels.iter_mut()).enumerate() {
        let mut v = v as u8;
        if v > 3 {
            b[Q3K_HMASK + j % 32] |= 1 << (j / 32);
            v -= 4;
        }
        *out = v;
    }
    pack_2bit(&levels, &mut b[Q3K_QS..Q3K_QS + 64]);
}

/// The (scales, mins) search shared by q4_K and q5_K (`quantize_row_q4_K_ref` / `q5_K_ref`): 8 sub-blocks
/// of 32 fitted by `make_qkx2_quants`, their scales and mins quantized to 6 bits, then every value
/// re-rounded against the stored scales. Returns the levels; writes d, dmin and the packed scales.
fn k_affine(x: &[f32], nmax: i32, rmin: f32, nstep: i32, b: &mut [u8]) -> [u8; QK_K] {
    let mut l = [0u8; QK_K];
    let mut l_aux = [0u8; 32];
    let mut weights = [0f32; 32];
    let (mut scales, mut mins) = ([0f32; 8], [0f32; 8]);
    let (mut max_scale, mut max_min) = (0f32, 0f32);
    for j in 0..QK_K / 32 {
        let xs = &x[32 * j..32 * j + 32];
        let mut sum_x2 = 0f32;
        for v in xs {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        for (w, v) in weights.iter_mut().zip(xs) {
            *w = av_x + v.abs();
        }
        (scales[j], mins[j]) =
            make_qkx2_quants(nmax, xs, &weights, &mut l[32 * j..32 * j + 32], &mut l_aux, rmin, 0.1, nstep, false);
        if scales[j] > max_scale {
            max_scale = scales[j];
        }
        if mins[j] > max_min {
            max_min = mins[j];
        }
    }
    let inv_scale = if max_scale > 0.0 { 63.0 / max_scale } else { 0.0 };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let (mut ls, mut lm) = ([0u8; 8], [0u8; 8]);
    for j in 0..8 {
        ls[j] = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        lm[j] = (nearest_int(inv_min * mins[j]) as u8).min(63);
    }
    pack_scales_mins_k4(&ls, &lm, &mut b[4..16]);
    put_f16(b, 0, max_scale / 63.0);
    put_f16(b, 2, max_min / 63.0);
    let (d_all, dmin_all) = (f16_at(b, 0), f16_at(b, 2));
    for j in 0..QK_K / 32 {
        let (sc, m) = scale_min_k4(j, &b[4..16]);
        let d = d_all * sc as f32;
        if d == 0.0 {
            continue;
        }
        let dm = dmin_all * m as f32;
        for i in 32 * j..32 * j + 32 {
            l[i] = nearest_int((x[i] + dm) / d).clamp(0, nmax) as u8;
        }
    }
    l
}

/// `quantize_row_q4_K_ref`.
pub fn q4_k(x: &[f32], b: &mut [u8]) {
    let l = k_affine(x, 15, -1.0, 20, b);
    for g in 0..QK_K / 64 {
        for i in 0..32 {
            b[Q4K_QS + 32 * g + i] = l[64 * g + i] | (l[64 * g + 32 + i] << 4);
        }
    }
}

/// `quantize_row_q5_K_ref`.
pub fn q5_k(x: &[f32], b: &mut [u8]) {
    let l = k_affine(x, 31, -0.5, 15, b);
    b[Q5K_QH..Q5K_QH + 32].fill(0);
    for g in 0..QK_K / 64 {
        let (m1, m2) = (1u8 << (2 * g), 2u8 << (2 * g));
        for i in 0..32 {
            let (l1, l2) = (l[64 * g + i], l[64 * g + 32 + i]);
            if l1 > 15 {
                b[Q5K_QH + i] |= m1;
            }
            if l2 > 15 {
                b[Q5K_QH + i] |= m2;
            }
            b[Q5K_QS + 32 * g + i] = (l1 & 0xF) | ((l2 & 0xF) << 4);
        }
    }
}

/// `quantize_row_q6_K_ref`: 16 sub-blocks of 16 with signed 8-bit scales, levels -32..=31.
pub fn q6_k(x: &[f32], b: &mut [u8]) {
    let mut l = [0i8; QK_K];
    let mut scales = [0f32; 16];
    let (mut max_scale, mut max_abs_scale) = (0f32, 0f32);
    for ib in 0..QK_K / 16 {
        scales[ib] = make_qx_quants(32, &x[16 * ib..16 * ib + 16], &mut l[16 * ib..16 * ib + 16]);
        if scales[ib].abs() > max_abs_scale {
            max_abs_scale = scales[ib].abs();
            max_scale = scales[ib];
        }
    }
    if max_abs_scale < GROUP_MAX_EPS {
        b[..QK_K / 2 + QK_K / 4 + QK_K / 16 + 2].fill(0);
        return;
    }
    let iscale = -128.0 / max_scale;
    put_f16(b, Q6K_D, 1.0 / iscale);
    for ib in 0..QK_K / 16 {
        b[Q6K_SCALES + ib] = nearest_int(iscale * scales[ib]).min(127) as i8 as u8;
    }
    let d_all = f16_at(b, Q6K_D);
    for j in 0..QK_K / 16 {
        let d = d_all * b[Q6K_SCALES + j] as i8 as f32;
        if d == 0.0 {
            continue;
        }
        for i in 16 * j..16 * j + 16 {
            l[i] = (nearest_int(x[i] / d).clamp(-32, 31) + 32) as i8;
        }
    }
    for h in 0..QK_K / 128 {
        let l = &l[128 * h..128 * h + 128];
        let q = |i: usize| l[i] as u8;
        for i in 0..32 {
            b[Q6K_QL + 64 * h + i] = (q(i) & 0xF) | ((q(i + 64) & 0xF) << 4);
            b[Q6K_QL + 64 * h + 32 + i] = (q(i + 32) & 0xF) | ((q(i + 96) & 0xF) << 4);
            b[Q6K_QH + 32 * h + i] =
                (q(i) >> 4) | ((q(i + 32) >> 4) << 2) | ((q(i + 64) >> 4) << 4) | ((q(i + 96) >> 4) << 6);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_zero_blocks_quantize_to_zeros() {
        let x = [0f32; QK_K];
        for (f, bytes) in [(q2_k as fn(&[f32], &mut [u8]), 84), (q3_k, 110), (q4_k, 144), (q5_k, 176), (q6_k, 210)] {
            let mut b = vec![0xAAu8; bytes];
            f(&x, &mut b);
            let mut y = vec![1f32; QK_K];
            let ty = match bytes {
                84 => crate::quant::GgmlType::Q2K,
                110 => crate::quant::GgmlType::Q3K,
                144 => crate::quant::GgmlType::Q4K,
                176 => crate::quant::GgmlType::Q5K,
                _ => crate::quant::GgmlType::Q6K,
            };
            crate::quant::dequantize_row(ty, &b, &mut y);
            assert!(y.iter().all(|&v| v == 0.0), "{ty}");
        }
    }
}
