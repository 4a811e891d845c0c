//! AVX2 dot products of the 4-bit table formats: iq4_nl and mxfp4 against q8_0 activations, iq4_xs
//! against q8_K.
//!
//! Each weight nibble indexes a 16-entry i8 table (`KVALUES_IQ4NL`, `KVALUES_MXFP4`); `pshufb` looks up 16
//! at a time, then the signed byte products run as q4_0's do (ggml's `mul_add_epi8`: |w| times y with
//! w's sign, summed in pairs and fours). The integer sums are exact, so this differs from the scalar
//! `reference` only in the order the per-block float terms are added. One column per call: the
//! multi-column paths call it per column, so each column has the bits of `vec_dot` on it alone.
//!
//! Safety: call only after AVX2, FMA and F16C were detected, with pointers valid for `nb` blocks.

use std::arch::x86_64::*;

use super::avx2::hsum_float_8;
use super::blocks::{e8m0_to_f32_half, f16_to_f32, iq4xs_scale, KVALUES_IQ4NL, KVALUES_MXFP4};
use super::blocks::{IQ4XS_QS, Q8K_QS};

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
