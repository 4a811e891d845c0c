//! The q2_K layout's kernels for x86_64: AVX-512 (16 rows per register), AVX2 with VNNI's 256-bit
//! `vpdpbusd`, and AVX2 with `maddubs`, on two 8-row halves; the sums of four values against q8_K are
//! q6_K's (`x86_q6k`). Each computes `q2k`'s exact integers and then its float steps lane by lane, so all
//! give the portable kernel's bits.
//!
//! Sub-blocks `k, k + 4, k + 8, k + 12` share their four code vectors (at bits 0, 2, 4, 6), so a
//! super-block is four loads of them, shifted in registers (a shift of 16-bit lanes carries bits across
//! the bytes, never into the two kept).
//!
//! Safety: call only on the SIMD level's detected features, with a group of `nb` super-blocks and
//! columns of `nb` q8_K blocks (checked by `PackedMatrix::tile_on`).

use std::arch::x86_64::*;

use super::q2k::{DMIN_AT, D_AT, SB_BYTES, SC_AT, Y_BLOCK};
use super::x86::{chunk_blocks, store_halves};
use super::x86_q4k::{pass_tile, Y_BSUMS, Y_QS};
use super::x86_q6k::{prefetch_lines, sum4_512, sum4_maddubs, sum4_vnni};
use super::{ActRow, SimdLevel, PACK_ROWS, VECTOR_BYTES};

pass_tile!(tile_512, tile_256_vnni, tile_256);

/// `bsums[k]` of the q8_K block at `y`.
#[inline(always)]
unsafe fn bsum(y: *const u8, k: usize) -> i32 {
    (y.add(Y_BSUMS + 2 * k) as *const i16).read_unaligned() as i32
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn tile_512<const C: usize>(nb: usize, group: *const u8, q: [*const u8; C], out: &mut [f32]) {
    let m3 = _mm512_set1_epi8(0x03);
    let m15 = _mm512_set1_epi32(0x0F);
    let mut acc = [_mm512_setzero_ps(); C];
    for b in 0..nb {
        let sb = group.add(b * SB_BYTES);
        prefetch_lines(sb, SB_BYTES);
        let mut isum = [_mm512_setzero_si512(); C];
        let mut msum = [_mm512_setzero_si512(); C];
        for k0 in 0..4 {
            let lo: [__m512i; 4] =
                std::array::from_fn(|g| _mm512_load_si512(sb.add((4 * k0 + g) * VECTOR_BYTES) as *const __m512i));
            for k in (k0..16).step_by(4) {
                let shift = _mm_cvtsi32_si128(2 * (k / 4) as i32);
                let w: [__m512i; 4] = std::array::from_fn(|g| _mm512_and_si512(_mm512_srl_epi16(lo[g], shift), m3));
                let sm = _mm512_cvtepu8_epi32(_mm_load_si128(sb.add(SC_AT + k * PACK_ROWS) as *const __m128i));
                let (sc, m) = (_mm512_and_si512(sm, m15), _mm512_srli_epi32::<4>(sm));
                for c in 0..C {
                    let y = q[c].add(b * Y_BLOCK);
                    let s = sum4_512(&w, y.add(Y_QS + 16 * k));
                    isum[c] = _mm512_add_epi32(isum[c], _mm512_mullo_epi32(s, sc));
                    msum[c] = _mm512_add_epi32(msum[c], _mm512_mullo_epi32(m, _mm512_set1_epi32(bsum(y, k))));
                }
            }
        }
        let d = _mm512_cvtph_ps(_mm256_load_si256(sb.add(D_AT) as *const __m256i));
        let dmin = _mm512_cvtph_ps(_mm256_load_si256(sb.add(DMIN_AT) as *const __m256i));
        for c in 0..C {
            let dy = _mm512_set1_ps((q[c].add(b * Y_BLOCK) as *const f32).read_unaligned());
            let a = _mm512_fmadd_ps(_mm512_mul_ps(d, dy), _mm512_cvtepi32_ps(isum[c]), acc[c]);
            acc[c] = _mm512_fnmadd_ps(_mm512_mul_ps(dmin, dy), _mm512_cvtepi32_ps(msum[c]), a);
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
            let m15 = _mm256_set1_epi32(0x0F);
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
                        let mut msum = [_mm256_setzero_si256(); C];
                        for k0 in 0..4 {
                            let lo: [__m256i; 4] = std::array::from_fn(|g| {
                                _mm256_load_si256(sb.add((4 * k0 + g) * VECTOR_BYTES + 32 * h) as *const __m256i)
                            });
                            for k in (k0..16).step_by(4) {
                                let shift = _mm_cvtsi32_si128(2 * (k / 4) as i32);
                                let w: [__m256i; 4] =
                                    std::array::from_fn(|g| _mm256_and_si256(_mm256_srl_epi16(lo[g], shift), m3));
                                let sm_at = sb.add(SC_AT + k * PACK_ROWS + 8 * h) as *const __m128i;
                                let sm = _mm256_cvtepu8_epi32(_mm_loadl_epi64(sm_at));
                                let (sc, m) = (_mm256_and_si256(sm, m15), _mm256_srli_epi32::<4>(sm));
                                for c in 0..C {
                                    let y = q[c].add(b * Y_BLOCK);
                                    let s = $sum4(&w, y.add(Y_QS + 16 * k));
                                    isum[c] = _mm256_add_epi32(isum[c], _mm256_mullo_epi32(s, sc));
                                    let bs = _mm256_set1_epi32(bsum(y, k));
                                    msum[c] = _mm256_add_epi32(msum[c], _mm256_mullo_epi32(m, bs));
                                }
                            }
                        }
                        let d = _mm256_cvtph_ps(_mm_load_si128(sb.add(D_AT + 16 * h) as *const __m128i));
                        let dmin = _mm256_cvtph_ps(_mm_load_si128(sb.add(DMIN_AT + 16 * h) as *const __m128i));
                        for c in 0..C {
                            let dy = _mm256_set1_ps((q[c].add(b * Y_BLOCK) as *const f32).read_unaligned());
                            let a = _mm256_fmadd_ps(_mm256_mul_ps(d, dy), _mm256_cvtepi32_ps(isum[c]), acc[c]);
                            acc[c] = _mm256_fnmadd_ps(_mm256_mul_ps(dmin, dy), _mm256_cvtepi32_ps(msum[c]), a);
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
