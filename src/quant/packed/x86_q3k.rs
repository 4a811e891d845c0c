//! The q3_K layout's kernels for x86_64: AVX-512 (16 rows per register), AVX2 with VNNI's 256-bit
//! `vpdpbusd`, and AVX2 with `maddubs`, on two 8-row halves; the sums of four values against q8_K are
//! q6_K's (`x86_q6k`). Each computes `q3k`'s exact integers and then its float steps lane by lane, so all
//! give the portable kernel's bits.
//!
//! Sub-blocks `k, k + 4, k + 8, k + 12` share their four low-bit vectors (at bits 0, 2, 4, 6) and the
//! even or odd ones their four high-bit vectors, so a super-block is four loads of each, shifted in
//! registers. A shift of 16-bit lanes carries bits across the bytes, but never into the bits kept.
//!
//! Safety: call only on the SIMD level's detected features, with a group of `nb` super-blocks and
//! columns of `nb` q8_K blocks (checked by `PackedMatrix::tile_on`).

use std::arch::x86_64::*;

use super::q3k::{D_AT, HI_AT, SB_BYTES, SC_AT, Y_BLOCK};
use super::x86::{chunk_blocks, store_halves};
use super::x86_q4k::{pass_tile, Y_BSUMS, Y_QS};
use super::x86_q6k::{prefetch_lines, sum4_512, sum4_maddubs, sum4_vnni};
use super::{ActRow, SimdLevel, PACK_ROWS, VECTOR_BYTES};

pass_tile!(tile_512, tile_256_vnni, tile_256);

/// `-4 * bsums[k]` of the q8_K block at `y`: the correction for the codes' offset.
#[inline(always)]
unsafe fn offset_sum(y: *const u8, k: usize) -> i32 {
    -4 * (y.add(Y_BSUMS + 2 * k) as *const i16).read_unaligned() as i32
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn tile_512<const C: usize>(nb: usize, group: *const u8, q: [*const u8; C], out: &mut [f32]) {
    let m3 = _mm512_set1_epi8(0x03);
    let m4 = _mm512_set1_epi8(0x04);
    let mut acc = [_mm512_setzero_ps(); C];
    // Sub-block `k`'s value-vectors: the low bits at `2 (k / 4)` of `lo`, the high bit at `k / 2` of `hi`.
    let values = |lo: &[__m512i; 4], hi: &[__m512i; 4], k: usize| -> [__m512i; 4] {
        let (sl, sh) = (_mm_cvtsi32_si128(2 * (k / 4) as i32), _mm_cvtsi32_si128((k / 2) as i32));
        std::array::from_fn(|g| {
            let low = _mm512_and_si512(_mm512_srl_epi16(lo[g], sl), m3);
            let high = _mm512_and_si512(_mm512_slli_epi16::<2>(_mm512_srl_epi16(hi[g], sh)), m4);
            _mm512_or_si512(low, high)
        })
    };
    for b in 0..nb {
        let sb = group.add(b * SB_BYTES);
        prefetch_lines(sb, SB_BYTES);
        let mut isum = [_mm512_setzero_si512(); C];
        for k0 in 0..4 {
            let lo: [__m512i; 4] =
                std::array::from_fn(|g| _mm512_load_si512(sb.add((4 * k0 + g) * VECTOR_BYTES) as *const __m512i));
            let hi: [__m512i; 4] = std::array::from_fn(|g| {
                _mm512_load_si512(sb.add(HI_AT + (4 * (k0 % 2) + g) * VECTOR_BYTES) as *const __m512i)
            });
            for k in (k0..16).step_by(4) {
                let w = values(&lo, &hi, k);
                let sc = _mm512_cvtepi8_epi32(_mm_load_si128(sb.add(SC_AT + k * PACK_ROWS) as *const __m128i));
                for c in 0..C {
                    let y = q[c].add(b * Y_BLOCK);
                    let s = sum4_512(&w, y.add(Y_QS + 16 * k));
                    let s = _mm512_add_epi32(s, _mm512_set1_epi32(offset_sum(y, k)));
                    isum[c] = _mm512_add_epi32(isum[c], _mm512_mullo_epi32(s, sc));
                }
            }
        }
        let d = _mm512_cvtph_ps(_mm256_load_si256(sb.add(D_AT) as *const __m256i));
        for c in 0..C {
            let dy = _mm512_set1_ps((q[c].add(b * Y_BLOCK) as *const f32).read_unaligned());
            acc[c] = _mm512_fmadd_ps(_mm512_mul_ps(d, dy), _mm512_cvtepi32_ps(isum[c]), acc[c]);
        }
    }
    for (c, a) in acc.iter().enumerate() {
        _mm512_storeu_ps(out.as_mut_ptr().add(c * PACK_ROWS), *a);
    }
}

/// The 256-bit kernel, defined once per instruction set: each 8-row half `h` of the group as `tile_512`
/// does the whole.
macro_rules! tile_256_kernel {
    ($name:ident, $features:literal, $sum4:ident) => {
        #[target_feature(enable = $features)]
        unsafe fn $name<const C: usize>(nb: usize, group: *const u8, q: [*const u8; C], out: &mut [f32]) {
            let m3 = _mm256_set1_epi8(0x03);
            let m4 = _mm256_set1_epi8(0x04);
            let values = |lo: &[__m256i; 4], hi: &[__m256i; 4], k: usize| -> [__m256i; 4] {
                let (sl, sh) = (_mm_cvtsi32_si128(2 * (k / 4) as i32), _mm_cvtsi32_si128((k / 2) as i32));
                std::array::from_fn(|g| {
                    let low = _mm256_and_si256(_mm256_srl_epi16(lo[g], sl), m3);
                    let high = _mm256_and_si256(_mm256_slli_epi16::<2>(_mm256_srl_epi16(hi[g], sh)), m4);
                    _mm256_or_si256(low, high)
                })
            };
            let mut accs = [[_mm256_setzero_ps(); C]; 2];
            let chunk = chunk_blocks(SB_BYTES, C);
            for b0 in (0..nb).step_by(chunk) {
                for (h, acc_h) in accs.iter_mut().enumerate() {
                    let mut acc = *acc_h;
                    for b in b0..(b0 + chunk).min(nb) {
                        let sb = group.add(b * SB_BYTES);
                        if h == 0 {
                            prefetch_lines(sb, SB_BYTES);
                        }
                        let mut isum = [_mm256_setzero_si256(); C];
                        for k0 in 0..4 {
                            let lo: [__m256i; 4] = std::array::from_fn(|g| {
                                _mm256_load_si256(sb.add((4 * k0 + g) * VECTOR_BYTES + 32 * h) as *const __m256i)
                            });
                            let hi: [__m256i; 4] = std::array::from_fn(|g| {
                                let at = HI_AT + (4 * (k0 % 2) + g) * VECTOR_BYTES + 32 * h;
                                _mm256_load_si256(sb.add(at) as *const __m256i)
                            });
                            for k in (k0..16).step_by(4) {
                                let w = values(&lo, &hi, k);
                                let sc_at = sb.add(SC_AT + k * PACK_ROWS + 8 * h) as *const __m128i;
                                let sc = _mm256_cvtepi8_epi32(_mm_loadl_epi64(sc_at));
                                for c in 0..C {
                                    let y = q[c].add(b * Y_BLOCK);
                                    let s = $sum4(&w, y.add(Y_QS + 16 * k));
                                    let s = _mm256_add_epi32(s, _mm256_set1_epi32(offset_sum(y, k)));
                                    isum[c] = _mm256_add_epi32(isum[c], _mm256_mullo_epi32(s, sc));
                                }
                            }
                        }
                        let d = _mm256_cvtph_ps(_mm_load_si128(sb.add(D_AT + 16 * h) as *const __m128i));
                        for c in 0..C {
                            let dy = _mm256_set1_ps((q[c].add(b * Y_BLOCK) as *const f32).read_unaligned());
                            acc[c] = _mm256_fmadd_ps(_mm256_mul_ps(d, dy), _mm256_cvtepi32_ps(isum[c]), acc[c]);
                        }
                    }
                    *acc_h = acc;
                }
            }
            store_halves(&accs, out);
        }
    };
}

tile_256_kernel!(tile_256_vnni, "avx2,fma,f16c,avx512vnni,avx512vl", sum4_vnni);
tile_256_kernel!(tile_256, "avx2,fma,f16c", sum4_maddubs);
