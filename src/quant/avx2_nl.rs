//! AVX2 dot products of the 4-bit table formats, iq4_nl and mxfp4, against q8_0 activations.
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
use super::blocks::{e8m0_to_f32_half, f16_to_f32, KVALUES_IQ4NL, KVALUES_MXFP4};

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
    let m4 = _mm_set1_epi8(0xF);
    let ones = _mm256_set1_epi16(1);
    let mut acc = _mm256_setzero_ps();
    for i in 0..nb {
        let (wp, yp) = (w.add(i * w_bytes), y.add(i * 34));
        let bits = _mm_loadu_si128(wp.add(qs_at) as *const __m128i);
        let lo = _mm_shuffle_epi8(values, _mm_and_si128(bits, m4));
        let hi = _mm_shuffle_epi8(values, _mm_and_si128(_mm_srli_epi16(bits, 4), m4));
        let qx = _mm256_set_m128i(hi, lo);
        let qy = _mm256_loadu_si256(yp.add(2) as *const __m256i);
        // |w| <= 127 and |y| <= 127 (q8_0 activations): the pair sums fit i16 without saturating.
        let p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(qx, qx), _mm256_sign_epi8(qy, qx));
        let p = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, ones));
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
