//! ggml's quantizers of the table formats: iq4_nl and iq4_xs (16 non-uniform levels, `KVALUES_IQ4NL`) and
//! mxfp4 (e2m1 levels under a power-of-two scale).
//!
//! iq4_nl and iq4_xs follow `quantize_iq4_nl` / `quantize_iq4_xs` without importance weights (what
//! llama-quantize calls; ggml's `quantize_row_iq4_nl_ref` searches less and is not used by it), mxfp4
//! follows `quantize_row_mxfp4_ref`, float operation for float operation as `kquantize` does for the
//! K-quants; `tests/data/quant` holds ggml's bytes. Nothing here allocates.

use super::blocks::*;
use super::kquantize::{signed_max, GROUP_MAX_EPS};
use super::quantize::nearest_int;
use super::types::{QK, QK_K};

/// ggml's `best_index_int8`: the index of the table entry nearest `x` (the upper one on ties), by
/// bisection over the ascending `table`.
fn best_index(table: &[i8; 16], x: f32) -> u8 {
    if x <= table[0] as f32 {
        return 0;
    }
    if x >= table[15] as f32 {
        return 15;
    }
    let (mut ml, mut mu) = (0usize, 15usize);
    while mu - ml > 1 {
        let mav = (ml + mu) / 2;
        if x < table[mav] as f32 {
            mu = mav;
        } else {
            ml = mav;
        }
    }
    if x - (table[mu - 1] as f32) < table[mu] as f32 - x {
        (mu - 1) as u8
    } else {
        mu as u8
    }
}

/// Trials on each side of the first scale guess (ggml's `ntry` for iq4_nl / iq4_xs in llama-quantize).
const IQ4_NTRY: i32 = 7;

/// The best scale of one 32-value sub-block on the `KVALUES_IQ4NL` grid, x²-weighted, and its indices
/// (`quantize_row_iq4_nl_impl`'s per-block search without importance weights). Zero for an all-zero block
/// (whose indices are then left as they were).
fn iq4_block_scale(xb: &[f32], l: &mut [u8]) -> f32 {
    let (max, amax) = signed_max(xb);
    if amax < GROUP_MAX_EPS {
        return 0.0;
    }
    let table = &KVALUES_IQ4NL;
    let mut d = -max / table[0] as f32;
    let mut id = 1.0 / d;
    let (mut sumqx, mut sumq2) = (0f32, 0f32);
    for (j, &v) in xb.iter().enumerate() {
        let k = best_index(table, id * v);
        l[j] = k;
        let (q, w) = (table[k as usize] as f32, v * v);
        sumqx += w * q * v;
        sumq2 += w * q * q;
    }
    d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
    let mut best = d * sumqx;
    for itry in -IQ4_NTRY..=IQ4_NTRY {
        id = (itry + table[0] as i32) as f32 / max;
        let (mut sumqx, mut sumq2) = (0f32, 0f32);
        for &v in xb {
            let q = table[best_index(table, id * v) as usize] as f32;
            let w = v * v;
            sumqx += w * q * v;
            sumq2 += w * q * q;
        }
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    d
}

/// Packs 32 indices as q4_0 packs its nibbles: value j low, value j + 16 high.
fn pack_nibbles(l: &[u8], qs: &mut [u8]) {
    for j in 0..QK / 2 {
        qs[j] = l[j] | (l[j + QK / 2] << 4);
    }
}

/// `quantize_iq4_nl` without importance weights, one block.
pub fn iq4_nl(x: &[f32], b: &mut [u8]) {
    // Without the search's first pass (all-zero block) the indices are those of a zero scale.
    let mut l = [0u8; QK];
    let d = iq4_block_scale(x, &mut l);
    put_f16(b, 0, d);
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    for (k, &v) in l.iter_mut().zip(x) {
        *k = best_index(&KVALUES_IQ4NL, id * v);
    }
    pack_nibbles(&l, &mut b[2..2 + QK / 2]);
}

/// `quantize_iq4_xs` without importance weights, one super-block: the eight sub-block scales quantized to
/// 6 bits against the largest, every index chosen again against its stored scale.
pub fn iq4_xs(x: &[f32], b: &mut [u8]) {
    let mut l = [0u8; QK_K];
    let mut scales = [0f32; 8];
    let (mut max_scale, mut amax_scale) = (0f32, 0f32);
    for ib in 0..QK_K / 32 {
        scales[ib] = iq4_block_scale(&x[32 * ib..32 * ib + 32], &mut l[32 * ib..32 * ib + 32]);
        if scales[ib].abs() > amax_scale {
            amax_scale = scales[ib].abs();
            max_scale = scales[ib];
        }
    }
    let d = -max_scale / 32.0;
    put_f16(b, 0, d);
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut scales_h = 0u16;
    b[IQ4XS_SCALES_L..IQ4XS_SCALES_L + 4].fill(0);
    for ib in 0..QK_K / 32 {
        let ls = nearest_int(id * scales[ib]).clamp(-32, 31);
        let dl = d * ls as f32;
        let idl = if dl != 0.0 { 1.0 / dl } else { 0.0 };
        for j in 32 * ib..32 * ib + 32 {
            l[j] = best_index(&KVALUES_IQ4NL, idl * x[j]);
        }
        let code = (ls + 32) as u8;
        b[IQ4XS_SCALES_L + ib / 2] |= (code & 0xF) << (4 * (ib % 2));
        scales_h |= ((code >> 4) as u16) << (2 * ib);
    }
    b[IQ4XS_SCALES_H..IQ4XS_SCALES_H + 2].copy_from_slice(&scales_h.to_le_bytes());
    for ib in 0..QK_K / 32 {
        pack_nibbles(&l[32 * ib..32 * ib + 32], &mut b[IQ4XS_QS + 16 * ib..IQ4XS_QS + 16 * ib + 16]);
    }
}

/// The index of the mxfp4 level nearest `x` at scale `e` (the first on ties), as `best_index_mxfp4`.
fn best_index_mxfp4(x: f32, e: f32) -> u8 {
    let mut best = 0u8;
    let mut best_err = (KVALUES_MXFP4[0] as f32 * e - x).abs();
    for (i, &k) in KVALUES_MXFP4.iter().enumerate().skip(1) {
        let err = (k as f32 * e - x).abs();
        if err < best_err {
            best = i as u8;
            best_err = err;
        }
    }
    best
}

/// `quantize_row_mxfp4_ref`: the shared exponent puts the largest magnitude in the top binade of the
/// e2m1 range, then each value takes its nearest level.
pub fn mxfp4(x: &[f32], b: &mut [u8]) {
    let mut amax = 0f32;
    for v in x {
        if amax < v.abs() {
            amax = v.abs();
        }
    }
    // ggml converts the float to uint8_t; `as` saturates where C would be undefined (|x| < 2^-125).
    let e = if amax > 0.0 { (amax.log2().floor() - 2.0 + 127.0) as u8 } else { 0 };
    let d = e8m0_to_f32_half(e);
    b[0] = e;
    for j in 0..QK / 2 {
        b[1 + j] = best_index_mxfp4(x[j], d) | (best_index_mxfp4(x[j + QK / 2], d) << 4);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_index_picks_the_nearest_level_and_the_upper_one_on_ties() {
        let t = &KVALUES_IQ4NL;
        assert_eq!(best_index(t, -500.0), 0);
        assert_eq!(best_index(t, 500.0), 15);
        assert_eq!(best_index(t, 1.0), 8);
        assert_eq!(best_index(t, -4.5), 8); // 5.5 from both -10 and 1: the upper
        assert_eq!(best_index(t, -5.0), 7); // 5 from -10, 6 from 1
        assert_eq!(best_index(t, 7.0), 9); // 6 from both 1 and 13: the upper
    }

    #[test]
    fn mxfp4_known_block() {
        // amax 6: floor(log2 6) = 2, so e = 127 and d = 2^-1: levels are 0, 0.5, 1, 1.5, 2, 3, 4, 6.
        let mut x = [0f32; 32];
        x[0] = 6.0;
        x[1] = -1.2;
        x[16] = 0.7;
        let mut b = [0u8; 17];
        mxfp4(&x, &mut b);
        assert_eq!(b[0], 127);
        assert_eq!(b[1], 7 | (1 << 4)); // 6 -> index 7; 0.7 -> 0.5, index 1
        assert_eq!(b[2], 10); // -1.2 -> -1.0, index 10
    }
}
