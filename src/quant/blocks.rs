//! Byte layouts of ggml's quantized blocks, and the small decoding helpers every kernel shares.
//!
//! Blocks are plain little-endian bytes, exactly as ggml's `block_*` structs sit in a GGUF file, so a
//! tensor's data can be used straight from the memory map. This module owns only offsets and the bit
//! fiddling of packed scales; it never loops over a row and never allocates.
//!
//! Layouts (offsets in bytes; `f16` is IEEE half, `f32` IEEE single):
//!
//! | type | layout                                                                  | bytes |
//! |------|-------------------------------------------------------------------------|-------|
//! | q4_0 | d: f16 @0, qs: [u8; 16] @2 (value j in low nibble of qs[j], j+16 high)  | 18    |
//! | q4_1 | d: f16 @0, m: f16 @2, qs: [u8; 16] @4                                   | 20    |
//! | q5_0 | d: f16 @0, qh: u32 @2 (5th bit of value j in bit j), qs: [u8; 16] @6     | 22    |
//! | q5_1 | d: f16 @0, m: f16 @2, qh: u32 @4, qs: [u8; 16] @8                        | 24    |
//! | q8_0 | d: f16 @0, qs: [i8; 32] @2                                              | 34    |
//! | q8_1 | d: f16 @0, s: f16 @2 (= d * sum(qs)), qs: [i8; 32] @4                   | 36    |
//! | q4_K | d: f16 @0, dmin: f16 @2, scales: [u8; 12] @4, qs: [u8; 128] @16         | 144   |
//! | q5_K | d: f16 @0, dmin: f16 @2, scales: [u8; 12] @4, qh: [u8; 32] @16, qs: [u8; 128] @48 | 176 |
//! | q6_K | ql: [u8; 128] @0, qh: [u8; 64] @128, scales: [i8; 16] @192, d: f16 @208 | 210   |
//! | q8_K | d: f32 @0, qs: [i8; 256] @4, bsums: [i16; 16] @260                       | 292   |
//! | q2_K | scales: [u8; 16] @0 (scale low nibble, min high), qs: [u8; 64] @16, d: f16 @80, dmin: f16 @82 | 84 |
//! | q3_K | hmask: [u8; 32] @0, qs: [u8; 64] @32, scales: [u8; 12] @96 (16 x 6 bits), d: f16 @108 | 110 |
//! | iq4_nl | d: f16 @0, qs: [u8; 16] @2 (indices into `KVALUES_IQ4NL`, as q4_0's nibbles)   | 18    |
//! | iq4_xs | d: f16 @0, scales_h: u16 @2, scales_l: [u8; 4] @4, qs: [u8; 128] @8          | 136   |
//! | mxfp4 | e: u8 @0 (e8m0 exponent), qs: [u8; 16] @1 (indices into `KVALUES_MXFP4`)        | 17    |
//!
//! q2_K and q3_K store 2-bit quants four to a byte: value `128 * h + 32 * j + l` (h < 2, j < 4, l < 32) is
//! bits `2j..2j+2` of `qs[32 * h + l]`; q3_K's third bit is bit `128 * h + 32 * j` / 32 of `hmask[l]`.

/// Reads the little-endian f16 at `b[at..at + 2]` as f32 (exact: every f16 is an f32).
#[inline(always)]
pub fn f16_at(b: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

/// f16 bits to f32, exactly. Normal numbers (all real scales) take a few integer ops: rebias the
/// exponent by 127 - 15 and widen the mantissa. The rest (zero, subnormal, inf, NaN) go to `half`.
///
/// The SIMD kernels use this rather than F16C's `vcvtph2ps` on a scalar: LLVM lowers that to a
/// `vpinsrw` into whatever register is free, often the accumulator, which chains every block's scale
/// to the previous block's sum and halves the speed of the dot products.
#[inline(always)]
pub fn f16_to_f32(h: u16) -> f32 {
    let exp = h & 0x7c00;
    if exp != 0 && exp != 0x7c00 {
        let h = h as u32;
        f32::from_bits(((h & 0x8000) << 16) | (((h & 0x7fff) + ((127 - 15) << 10)) << 13))
    } else {
        half::f16::from_bits(h).to_f32()
    }
}

/// Writes `v` rounded to f16 (round to nearest even, as ggml's `GGML_FP32_TO_FP16`) at `b[at..at + 2]`.
#[inline(always)]
pub fn put_f16(b: &mut [u8], at: usize, v: f32) {
    b[at..at + 2].copy_from_slice(&half::f16::from_f32(v).to_bits().to_le_bytes());
}

/// Reads the little-endian f32 at `b[at..at + 4]`.
#[inline(always)]
pub fn f32_at(b: &[u8], at: usize) -> f32 {
    f32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Reads the little-endian u32 at `b[at..at + 4]`.
#[inline(always)]
pub fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Reads the little-endian i16 at `b[at..at + 2]`.
#[inline(always)]
pub fn i16_at(b: &[u8], at: usize) -> i16 {
    i16::from_le_bytes([b[at], b[at + 1]])
}

// Offsets inside the K-quant blocks.
pub const Q4K_SCALES: usize = 4;
pub const Q4K_QS: usize = 16;
pub const Q5K_SCALES: usize = 4;
pub const Q5K_QH: usize = 16;
pub const Q5K_QS: usize = 48;
pub const Q6K_QL: usize = 0;
pub const Q6K_QH: usize = 128;
pub const Q6K_SCALES: usize = 192;
pub const Q6K_D: usize = 208;
pub const Q8K_QS: usize = 4;
pub const Q8K_BSUMS: usize = 260;
pub const Q2K_SCALES: usize = 0;
pub const Q2K_QS: usize = 16;
pub const Q2K_D: usize = 80;
pub const Q2K_DMIN: usize = 82;
pub const Q3K_HMASK: usize = 0;
pub const Q3K_QS: usize = 32;
pub const Q3K_SCALES: usize = 96;
pub const Q3K_D: usize = 108;
pub const IQ4XS_SCALES_H: usize = 2;
pub const IQ4XS_SCALES_L: usize = 4;
pub const IQ4XS_QS: usize = 8;

/// The 16 levels of iq4_nl and iq4_xs (ggml's `kvalues_iq4nl`): a non-uniform grid, denser near zero.
pub const KVALUES_IQ4NL: [i8; 16] = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];

/// The 16 e2m1 (fp4) values of mxfp4, doubled to integers (ggml's `kvalues_mxfp4`); the block's scale is
/// halved to match (`e8m0_to_f32_half`).
pub const KVALUES_MXFP4: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// Half of the e8m0 scale `2^(e - 127)`, i.e. `2^(e - 128)`, built from its bits as ggml's
/// `ggml_e8m0_to_fp32_half` (e = 0 and 1 are subnormal; e = 255 is not treated as NaN).
#[inline(always)]
pub fn e8m0_to_f32_half(e: u8) -> f32 {
    let bits = if e < 2 { 0x0020_0000u32 << e } else { ((e - 1) as u32) << 23 };
    f32::from_bits(bits)
}

/// The 6-bit signed scale `j` (0..16) of a q3_K block from its 12 packed bytes, minus the bias 32: the low
/// nibble in `q[j]` (j < 8) or the high nibble of `q[j - 8]`, the two high bits in `q[8 + j % 4]` at bit
/// `2 * (j / 4)`.
#[inline(always)]
pub fn q3k_scale(j: usize, q: &[u8]) -> i32 {
    let low = if j < 8 { q[j] & 0xF } else { q[j - 8] >> 4 };
    let high = (q[8 + j % 4] >> (2 * (j / 4))) & 3;
    (low | (high << 4)) as i32 - 32
}

/// The 6-bit scale of sub-block `ib` (0..8) of an iq4_xs block, minus the bias 32.
#[inline(always)]
pub fn iq4xs_scale(ib: usize, b: &[u8]) -> i32 {
    let h = u16::from_le_bytes([b[IQ4XS_SCALES_H], b[IQ4XS_SCALES_H + 1]]);
    let low = (b[IQ4XS_SCALES_L + ib / 2] >> (4 * (ib % 2))) & 0xF;
    let high = ((h >> (2 * ib)) & 3) as u8;
    (low | (high << 4)) as i32 - 32
}

/// Scale and min of sub-block `j` (0..8) of a q4_K / q5_K block, from the 12 packed bytes: 6 bits each,
/// the first four stored plainly, the last four split into a low nibble and two high bits borrowed from
/// the first eight bytes (ggml's `get_scale_min_k4`).
#[inline(always)]
pub fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

/// All eight (scales, mins) of a q4_K / q5_K block.
#[inline(always)]
pub fn scales_mins_k4(q: &[u8]) -> ([u8; 8], [u8; 8]) {
    let mut sc = [0u8; 8];
    let mut mn = [0u8; 8];
    for j in 0..8 {
        (sc[j], mn[j]) = scale_min_k4(j, q);
    }
    (sc, mn)
}

/// Packs eight 6-bit scales and mins into the 12-byte q4_K / q5_K layout (inverse of `scale_min_k4`).
pub fn pack_scales_mins_k4(sc: &[u8; 8], mn: &[u8; 8], out: &mut [u8]) {
    out[..12].fill(0);
    for j in 0..8 {
        let (ls, lm) = (sc[j] & 63, mn[j] & 63);
        if j < 4 {
            out[j] = ls;
            out[j + 4] = lm;
        } else {
            out[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4);
            out[j - 4] |= (ls >> 4) << 6;
            out[j] |= (lm >> 4) << 6;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn k4_scales_round_trip_through_packing() {
        let sc = [1, 63, 17, 32, 45, 0, 62, 33];
        let mn = [63, 2, 40, 9, 31, 50, 1, 60];
        let mut packed = [0u8; 12];
        pack_scales_mins_k4(&sc, &mn, &mut packed);
        assert_eq!(scales_mins_k4(&packed), (sc, mn));
    }

    #[test]
    fn e8m0_half_is_two_to_the_e_minus_128() {
        for e in 0..=254u8 {
            assert_eq!(e8m0_to_f32_half(e) as f64, 2f64.powi(e as i32 - 128), "e = {e}");
        }
    }

    #[test]
    fn q3k_scales_unpack_every_position() {
        // Scale j set to a distinct 6-bit code, packed as ggml's quantizer does.
        let mut q = [0u8; 12];
        for j in 0..16 {
            let l = (j * 4 + 3) as u8 & 63;
            if j < 8 {
                q[j] = l & 0xF;
            } else {
                q[j - 8] |= (l & 0xF) << 4;
            }
            q[8 + j % 4] |= (l >> 4) << (2 * (j / 4));
        }
        for j in 0..16 {
            assert_eq!(q3k_scale(j, &q), ((j * 4 + 3) & 63) as i32 - 32, "scale {j}");
        }
    }

    #[test]
    fn f16_to_f32_is_exact_for_every_value() {
        for h in 0..=u16::MAX {
            let want = half::f16::from_bits(h).to_f32();
            let got = f16_to_f32(h);
            assert!(got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()), "{h:#x}");
        }
    }

    #[test]
    fn f16_round_trip_is_nearest_even() {
        let mut b = [0u8; 2];
        put_f16(&mut b, 0, 1.0 + 1.0 / 4096.0); // halfway between 1.0 and 1.0 + 2^-10: ties to even
        assert_eq!(f16_at(&b, 0), 1.0);
        put_f16(&mut b, 0, -2.5);
        assert_eq!(b, [0x00, 0xC1]);
    }
}
