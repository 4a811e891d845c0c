//! AVX-512 kernels (F, BW, VL, VNNI) for the legacy formats' matrix products: two weight rows share each
//! 512-bit register, row 0 in the low 256 bits and row 1 in the high, against a few activation columns.
//!
//! Each 256-bit half runs, lane for lane, the operations of `avx2`'s VNNI kernel on its own row: the same
//! integer sums (`vpdpbusd` of four neighbouring products), the same scale product `dw * dy` rounded once,
//! the same fma into an eight-lane accumulator, ggml's `hsum_float_8` at the end, and the same scalar fma
//! chain for q4_1 / q5_1's `m * s` terms (here two rows per register, one lane each). So every (row, column)
//! result has the bits `avx2::dot_blocks` gives for that row and column alone: batch invariance and the
//! decode path's results are untouched, and only the instruction count falls (one unpack, scale product,
//! integer sum, conversion and fma per block for two rows instead of one).
//!
//! Signed formats (q4_0, q5_0, q8_0) use `|w|` as the unsigned operand and `y` negated where `w < 0`, the
//! integers `_mm256_sign_epi8` gives (AVX-512 has no byte `sign`; where `w == 0` the product is 0 either way).
//!
//! Safety: call only after `super::avx512_detected()` (and the AVX2/FMA/F16C checks), with pointers valid for
//! the stated number of blocks.

use std::arch::x86_64::*;

use super::avx2::{hsum_float_8, layout, Cols, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0};

/// Two rows' 16 bytes of q4 nibbles at `p0` and `p1` as 32 bytes each (the 16 low nibbles, then the 16
/// high), row 0 in the low 256 bits.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn nibbles_pair(p0: *const u8, p1: *const u8) -> __m512i {
    let r0 = _mm256_broadcastsi128_si256(_mm_loadu_si128(p0 as *const __m128i));
    let r1 = _mm256_broadcastsi128_si256(_mm_loadu_si128(p1 as *const __m128i));
    let both = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(r0), r1);
    // The second 128 bits of each row take the high nibbles: shift the 16-bit words of lanes 1 and 3.
    let shifted = _mm512_mask_srli_epi16::<4>(both, 0xFF00_FF00, both);
    _mm512_and_si512(shifted, _mm512_set1_epi8(0x0F))
}

/// Two rows' 32 high bits of a q5 block as a byte mask: bit j of row 0's is byte j, of row 1's byte 32 + j.
#[inline(always)]
unsafe fn high_bits_pair(p0: *const u8, p1: *const u8) -> u64 {
    let b0 = (p0 as *const u32).read_unaligned() as u64;
    let b1 = (p1 as *const u32).read_unaligned() as u64;
    b0 | (b1 << 32)
}

/// The 32 weight bytes of one block of each of two rows, as the kernel multiplies them: row 0's in the low
/// 256 bits, row 1's in the high, each in `avx2`'s byte order. Signed formats come back signed (q4_0:
/// nibble - 8; q5_0: the 5-bit value - 16; q8_0 as stored).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn weight_bytes<const K: u8>(p0: *const u8, p1: *const u8) -> __m512i {
    match K {
        Q4_0 => _mm512_sub_epi8(nibbles_pair(p0.add(2), p1.add(2)), _mm512_set1_epi8(8)),
        Q4_1 => nibbles_pair(p0.add(4), p1.add(4)),
        // ggml: the nibble OR 0xF0 where the high bit is clear, read as a signed byte (value - 16).
        Q5_0 => {
            let hi = _mm512_maskz_mov_epi8(!high_bits_pair(p0.add(2), p1.add(2)), _mm512_set1_epi8(0xF0u8 as i8));
            _mm512_or_si512(nibbles_pair(p0.add(6), p1.add(6)), hi)
        }
        Q5_1 => {
            let hi = _mm512_maskz_mov_epi8(high_bits_pair(p0.add(4), p1.add(4)), _mm512_set1_epi8(0x10));
            _mm512_or_si512(nibbles_pair(p0.add(8), p1.add(8)), hi)
        }
        _ => {
            let r0 = _mm256_loadu_si256(p0.add(2) as *const __m256i);
            let r1 = _mm256_loadu_si256(p1.add(2) as *const __m256i);
            _mm512_inserti64x4::<1>(_mm512_castsi256_si512(r0), r1)
        }
    }
}

/// Dot of `nb` legacy weight blocks of format `K` of two rows, at `w0` and `w1`, against `C` activation
/// columns: `out0[c]` and `out1[c]` get the bits of `avx2::dot_blocks::<K, 1>` on (row 0, column c) and
/// (row 1, column c). The activations' scales come from `xs.ds` where it holds pointers (see `Cols`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn dot_pair<const K: u8, const C: usize>(
    nb: usize,
    w0: *const u8,
    w1: *const u8,
    xs: Cols<C>,
    out0: &mut [f32],
    out1: &mut [f32],
) {
    if xs.ds[0].is_null() {
        legacy_dot_pair::<K, C, false>(nb, w0, w1, xs, out0, out1)
    } else {
        legacy_dot_pair::<K, C, true>(nb, w0, w1, xs, out0, out1)
    }
}

/// `dot_pair` with the scales' source fixed: with `PRE` they come from `xs.ds`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn legacy_dot_pair<const K: u8, const C: usize, const PRE: bool>(
    nb: usize,
    w0: *const u8,
    w1: *const u8,
    xs: Cols<C>,
    out0: &mut [f32],
    out1: &mut [f32],
) {
    let (wb, xb, xq) = layout(K);
    let signed = matches!(K, Q4_0 | Q5_0 | Q8_0);
    let has_min = matches!(K, Q4_1 | Q5_1);
    // Lanes 0..8 of `dw` take row 0's block scale, lanes 8..16 row 1's.
    let d_lanes = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2);
    let mut acc = [_mm512_setzero_ps(); C];
    // Per column: lane 0 row 0's `m * s` sum, lane 1 row 1's (lanes 2 and 3 repeat them).
    let mut summs = [_mm_setzero_ps(); C];
    for i in 0..nb {
        let (p0, p1) = (w0.add(i * wb), w1.add(i * wb));
        // Both rows' first four bytes, (d, m) for q4_1 / q5_1, as f32: [d0, m0, d1, m1] (for the formats
        // without m, lanes 1 and 3 hold quant bytes read as f16 and are never used).
        let dm = _mm_insert_epi32::<1>(
            _mm_cvtsi32_si128((p0 as *const i32).read_unaligned()),
            (p1 as *const i32).read_unaligned(),
        );
        let dm = _mm_cvtph_ps(dm);
        let dw = _mm512_permutexvar_ps(d_lanes, _mm512_castps128_ps512(dm));
        let mw = _mm_shuffle_ps::<0b11_01_11_01>(dm, dm);
        let qx = weight_bytes::<K>(p0, p1);
        let ax = if signed { _mm512_abs_epi8(qx) } else { qx };
        let negative = if signed { _mm512_movepi8_mask(qx) } else { 0 };
        for c in 0..C {
            let yp = xs.q[c].add(i * xb);
            let dy = if PRE {
                _mm512_set1_ps(*xs.ds[c].add(2 * i))
            } else {
                _mm512_cvtph_ps(_mm256_set1_epi16((yp as *const i16).read_unaligned()))
            };
            let d = _mm512_mul_ps(dw, dy);
            let qy = _mm512_broadcast_i64x4(_mm256_loadu_si256(yp.add(xq) as *const __m256i));
            let sy = if signed { _mm512_mask_sub_epi8(qy, negative, _mm512_setzero_si512(), qy) } else { qy };
            let q = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), ax, sy));
            acc[c] = _mm512_fmadd_ps(d, q, acc[c]);
            if has_min {
                let s = if PRE {
                    _mm_broadcast_ss(&*xs.ds[c].add(2 * i + 1))
                } else {
                    _mm_cvtph_ps(_mm_set1_epi16((yp.add(2) as *const i16).read_unaligned()))
                };
                summs[c] = _mm_fmadd_ps(mw, s, summs[c]);
            }
        }
    }
    for c in 0..C {
        let lo = _mm512_castps512_ps256(acc[c]);
        let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(acc[c])));
        out0[c] = hsum_float_8(lo) + _mm_cvtss_f32(summs[c]);
        out1[c] = hsum_float_8(hi) + _mm_cvtss_f32(_mm_movehdup_ps(summs[c]));
    }
}
