//! AVX2 dot products of the formats without a tuned kernel in `avx2`: the 4-bit table formats (iq4_nl
//! and mxfp4 against q8_0 activations, iq4_xs against q8_K) and the 2- and 3-bit K-quants (q2_K, q3_K
//! against q8_K).
//!
//! Table formats: each weight nibble indexes a 16-entry i8 table (`KVALUES_IQ4NL`, `KVALUES_MXFP4`); `pshufb` looks up 16
//! at a time, then the signed byte products run as q4_0's do (ggml's `mul_add_epi8`: |w| times y with
//! w's sign, summed in pairs and fours). The integer sums are exact, so this differs from the scalar
//! `reference` only in the order the per-block float terms are added. q2_K and q3_K: each block's integer
//! sum is exact (2-bit fields shifted out of 32 bytes, `maddubs` against the activations, `madd` by the
//! 16-value sub-blocks' scales), then scaled as the scalar code scales it: q2_K gives the scalar bits
//! exactly, q3_K (whose scalar code sums eight lanes in f32) to rounding. One column per call: the
//! multi-column paths call it per column, so each column has the bits of `vec_dot` on it alone.
//!
//! Safety: call only after AVX2, FMA and F16C were detected, with pointers valid for `nb` blocks.

use std::arch::x86_64::*;

use super::avx2::hsum_float_8;
use super::blocks::{e8m0_to_f32_half, f16_to_f32, iq4xs_scale, q3k_scale, KVALUES_IQ4NL, KVALUES_MXFP4};
use super::blocks::{f16_at, f32_at, i16_at, IQ4XS_QS, Q8K_BSUMS, Q8K_QS};
use super::blocks::{Q2K_D, Q2K_DMIN, Q2K_QS, Q2K_SCALES, Q3K_D, Q3K_HMASK, Q3K_QS, Q3K_SCALES};

/// The 32 table values of 16 bytes of nibbles at `p`: low nibbles first, then high (q4_0's order).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn lookup_32(values: __m128i, p: *const u8) -> __m256i {
    let m4 = _mm_set1_epi8(0xF);
    let bits = _mm_loadu_si128(p as *const __m128i);
    let lo = _mm_shuffle_epi8(values, _mm_and_si128(bits, m4));
    let hi = _mm_shuffle_epi8(values, _mm_and_si128(_mm_srli_epi16(bits, 4), m4));
    _mm256_set_m128i(hi, lo)
}

/// Signed bytes `qx` times signed bytes `qy`, summed in eights, as 8 floats (exact integers). Both within
/// +-127 (table values and q8 activations), so `maddubs`' pair sums never saturate.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn isum_32(qx: __m256i, qy: __m256i) -> __m256 {
    let p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(qx, qx), _mm256_sign_epi8(qy, qx));
    _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)))
}

/// Which table format the weights are in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Table {
    /// iq4_nl: 18-byte blocks, f16 scale at 0, nibbles at 2.
    Iq4Nl,
    /// mxfp4: 17-byte blocks, e8m0 exponent at 0, nibbles at 1.
    Mxfp4,
}

/// Dot of `nb` weight blocks of `table`'s format at `w` with `nb` q8_0 blocks at `y`.
///
/// # Safety
/// AVX2/FMA/F16C present; `w` and `y` valid for `nb` blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot(table: Table, nb: usize, w: *const u8, y: *const u8) -> f32 {
    let (kvalues, w_bytes, qs_at) = match table {
        Table::Iq4Nl => (&KVALUES_IQ4NL, 18, 2),
        Table::Mxfp4 => (&KVALUES_MXFP4, 17, 1),
    };
    let values = _mm_loadu_si128(kvalues.as_ptr() as *const __m128i);
    let mut acc = _mm256_setzero_ps();
    for i in 0..nb {
        let (wp, yp) = (w.add(i * w_bytes), y.add(i * 34));
        let qx = lookup_32(values, wp.add(qs_at));
        let p = isum_32(qx, _mm256_loadu_si256(yp.add(2) as *const __m256i));
        let dw = match table {
            Table::Iq4Nl => f16_to_f32((wp as *const u16).read_unaligned()),
            Table::Mxfp4 => e8m0_to_f32_half(*wp),
        };
        // The same single product as the scalar code's `d_y * d_w`.
        let d = f16_to_f32((yp as *const u16).read_unaligned()) * dw;
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), p, acc);
    }
    hsum_float_8(acc)
}

/// Dot of `nb` iq4_xs blocks at `w` with `nb` q8_K blocks at `y`: one fma per 32-value sub-block, scaled
/// by `d * d_y * (its 6-bit scale - 32)` as ggml's scalar code scales it.
///
/// # Safety
/// AVX2/FMA/F16C present; `w` and `y` valid for `nb` blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_iq4_xs(nb: usize, w: *const u8, y: *const u8) -> f32 {
    let values = _mm_loadu_si128(KVALUES_IQ4NL.as_ptr() as *const __m128i);
    let mut acc = _mm256_setzero_ps();
    for i in 0..nb {
        let (wp, yp) = (w.add(i * 136), y.add(i * 292));
        let block = std::slice::from_raw_parts(wp, 136);
        let d4d8 = f16_to_f32((wp as *const u16).read_unaligned()) * (yp as *const f32).read_unaligned();
        for ib in 0..8 {
            let dl = d4d8 * iq4xs_scale(ib, block) as f32;
            let qx = lookup_32(values, wp.add(IQ4XS_QS + 16 * ib));
            let p = isum_32(qx, _mm256_loadu_si256(yp.add(Q8K_QS + 32 * ib) as *const __m256i));
            acc = _mm256_fmadd_ps(_mm256_set1_ps(dl), p, acc);
        }
    }
    hsum_float_8(acc)
}

/// The sum of eight i32 lanes (exact).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn hsum_i32_8(x: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
    _mm_cvtsi128_si32(s)
}

/// Field `j` (0..4) of the 2-bit values packed in 32 bytes `q`, as bytes 0..=3.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn field_2bit(q: __m256i, j: usize) -> __m256i {
    _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(2 * j as i32)), _mm256_set1_epi8(3))
}

/// Two i16 scales: `lo` for the low 16 bytes' products, `hi` for the high 16.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scales_16x2(lo: i32, hi: i32) -> __m256i {
    _mm256_set_m128i(_mm_set1_epi16(hi as i16), _mm_set1_epi16(lo as i16))
}

/// Dot of `nb` q2_K blocks at `w` with `nb` q8_K blocks at `y`; the bits of `reference`'s q2_K dot.
///
/// # Safety
/// AVX2/FMA/F16C present; `w` and `y` valid for `nb` blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_q2_k(nb: usize, w: *const u8, y: *const u8) -> f32 {
    let mut sumf = 0f32;
    for i in 0..nb {
        let (b, yb) = (std::slice::from_raw_parts(w.add(i * 84), 84), std::slice::from_raw_parts(y.add(i * 292), 292));
        let sc = &b[Q2K_SCALES..Q2K_SCALES + 16];
        let mut summs = 0i32;
        for (j, &s) in sc.iter().enumerate() {
            summs += i16_at(yb, Q8K_BSUMS + 2 * j) as i32 * (s >> 4) as i32;
        }
        let mut acc = _mm256_setzero_si256();
        for h in 0..2 {
            let q = _mm256_loadu_si256(b.as_ptr().add(Q2K_QS + 32 * h) as *const __m256i);
            for j in 0..4 {
                let qy = _mm256_loadu_si256(yb.as_ptr().add(Q8K_QS + 128 * h + 32 * j) as *const __m256i);
                let p16 = _mm256_maddubs_epi16(field_2bit(q, j), qy);
                let is = 8 * h + 2 * j;
                let s = scales_16x2((sc[is] & 0xF) as i32, (sc[is + 1] & 0xF) as i32);
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p16, s));
            }
        }
        let dall = f32_at(yb, 0) * f16_at(b, Q2K_D);
        let dmin = f32_at(yb, 0) * f16_at(b, Q2K_DMIN);
        sumf += dall * hsum_i32_8(acc) as f32 - dmin * summs as f32;
    }
    sumf
}

/// Dot of `nb` q3_K blocks at `w` with `nb` q8_K blocks at `y`.
///
/// # Safety
/// AVX2/FMA/F16C present; `w` and `y` valid for `nb` blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_q3_k(nb: usize, w: *const u8, y: *const u8) -> f32 {
    let mut sumf = 0f32;
    for i in 0..nb {
        let (b, yb) =
            (std::slice::from_raw_parts(w.add(i * 110), 110), std::slice::from_raw_parts(y.add(i * 292), 292));
        let sc = &b[Q3K_SCALES..Q3K_SCALES + 12];
        let hmask = _mm256_loadu_si256(b.as_ptr().add(Q3K_HMASK) as *const __m256i);
        let mut acc = _mm256_setzero_si256();
        for h in 0..2 {
            let q = _mm256_loadu_si256(b.as_ptr().add(Q3K_QS + 32 * h) as *const __m256i);
            for j in 0..4 {
                let bit = _mm256_set1_epi8((1u8 << (4 * h + j)) as i8);
                let high = _mm256_cmpeq_epi8(_mm256_and_si256(hmask, bit), bit);
                // Level - 4 where the high bit is clear: -4..=3.
                let a = _mm256_sub_epi8(field_2bit(q, j), _mm256_andnot_si256(high, _mm256_set1_epi8(4)));
                let qy = _mm256_loadu_si256(yb.as_ptr().add(Q8K_QS + 128 * h + 32 * j) as *const __m256i);
                let p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(a, a), _mm256_sign_epi8(qy, a));
                let is = 8 * h + 2 * j;
                acc = _mm256_add_epi32(
                    acc,
                    _mm256_madd_epi16(p16, scales_16x2(q3k_scale(is, sc), q3k_scale(is + 1, sc))),
                );
            }
        }
        let d = f16_at(b, Q3K_D) * f32_at(yb, 0);
        sumf += d * hsum_i32_8(acc) as f32;
    }
    sumf
}
