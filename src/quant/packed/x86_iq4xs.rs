//! The iq4_xs layout's kernels for x86_64: AVX-512 (16 rows per register) and AVX2 with VNNI's 256-bit
//! `vpdpbusd` on the codes `value + 128` (looked up from the nibbles by `vpshufb`), and AVX2 alone on the
//! signed values with ggml's sign trick (`|w|` against `y` negated where `w < 0`: pairs of at most
//! 2 * 127 * 127, widened by `madd` per vector). Each computes `iq4xs`'s exact integers and then its float
//! step lane by lane, so all give the portable kernel's bits.
//!
//! Safety: call only on the SIMD level's detected features, with a group of `nb` super-blocks and
//! columns of `nb` q8_K blocks (checked by `PackedMatrix::tile_on`).

use std::arch::x86_64::*;

use super::super::blocks::KVALUES_IQ4NL;
use super::iq4xs::{D_AT, SB_BYTES, SC_AT};
use super::q4k::Y_BLOCK;
use super::x86::{bcast4, chunk_blocks, store_halves, sum8_512, sum8_vnni, PREFETCH_BYTES};
use super::x86_q4k::{pass_tile, sub_block_sums, Y_QS};
use super::{ActRow, SimdLevel, PACK_ROWS, VECTOR_BYTES};

pass_tile!(tile_512, tile_256_vnni, tile_256_sign);

/// The table for `pshufb` in each 128-bit lane: `value + offset` (128: the unsigned codes; 0: the values).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn table_256(offset: i32) -> __m256i {
    let t = KVALUES_IQ4NL.map(|v| (v as i32 + offset) as u8);
    _mm256_broadcastsi128_si256(_mm_loadu_si128(t.as_ptr() as *const __m128i))
}

/// Prefetches super-block `sb`'s lines `PREFETCH_BYTES` ahead.
#[inline(always)]
unsafe fn prefetch(sb: *const u8) {
    for l in 0..SB_BYTES / 64 {
        _mm_prefetch::<_MM_HINT_T1>(sb.wrapping_add(PREFETCH_BYTES + 64 * l) as *const i8);
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn tile_512<const C: usize>(nb: usize, group: *const u8, q: [*const u8; C], out: &mut [f32]) {
    let nib = _mm512_set1_epi8(0x0F);
    let codes = _mm512_broadcast_i64x4(table_256(128));
    let mut acc = [_mm512_setzero_ps(); C];
    for b in 0..nb {
        let sb = group.add(b * SB_BYTES);
        prefetch(sb);
        let mut isum = [_mm512_setzero_si512(); C];
        for j in 0..4 {
            let v: [__m512i; 8] =
                std::array::from_fn(|g| _mm512_load_si512(sb.add((8 * j + g) * VECTOR_BYTES) as *const __m512i));
            for half in 0..2 {
                let k = 2 * j + half;
                let w: [__m512i; 8] = std::array::from_fn(|g| {
                    let n = if half == 0 { v[g] } else { _mm512_srli_epi16::<4>(v[g]) };
                    _mm512_shuffle_epi8(codes, _mm512_and_si512(n, nib))
                });
                let sc = _mm512_cvtepi8_epi32(_mm_load_si128(sb.add(SC_AT + k * PACK_ROWS) as *const __m128i));
                for c in 0..C {
                    let s = sum8_512(&w, q[c].add(b * Y_BLOCK + Y_QS + 32 * k));
                    isum[c] = _mm512_add_epi32(isum[c], _mm512_mullo_epi32(s, sc));
                }
            }
        }
        let d = _mm512_cvtph_ps(_mm256_load_si256(sb.add(D_AT) as *const __m256i));
        for c in 0..C {
            let y = q[c].add(b * Y_BLOCK);
            // The codes' 128 * sum_k sc_k * bsum_k, taken off: the sum of the values.
            let mut msum = _mm512_setzero_si512();
            for (k, &s) in sub_block_sums(y).iter().enumerate() {
                let sc = _mm512_cvtepi8_epi32(_mm_load_si128(sb.add(SC_AT + k * PACK_ROWS) as *const __m128i));
                msum = _mm512_add_epi32(msum, _mm512_mullo_epi32(sc, _mm512_set1_epi32(s)));
            }
            let isum = _mm512_sub_epi32(isum[c], _mm512_slli_epi32::<7>(msum));
            let dy = _mm512_set1_ps((y as *const f32).read_unaligned());
            acc[c] = _mm512_fmadd_ps(_mm512_mul_ps(d, dy), _mm512_cvtepi32_ps(isum), acc[c]);
        }
    }
    for (c, a) in acc.iter().enumerate() {
        _mm512_storeu_ps(out.as_mut_ptr().add(c * PACK_ROWS), *a);
    }
}

/// `x86::sum8_vnni`'s sum for signed values on AVX2 alone, by the sign trick: the exact `sum(w * y)`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn sum8_sign(w: &[__m256i; 8], y: *const u8, _wide: bool) -> __m256i {
    let ones = _mm256_set1_epi16(1);
    let mut s0 = _mm256_setzero_si256();
    let mut s1 = _mm256_setzero_si256();
    for g in (0..8).step_by(2) {
        let p = |g: usize| {
            let yc = _mm256_sign_epi8(_mm256_set1_epi32(bcast4(y.add(4 * g))), w[g]);
            _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(w[g]), yc), ones)
        };
        s0 = _mm256_add_epi32(s0, p(g));
        s1 = _mm256_add_epi32(s1, p(g + 1));
    }
    _mm256_add_epi32(s0, s1)
}

/// The 256-bit kernel on two 8-row halves, defined once per instruction set: `$sum8` is the sum of a
/// sub-block's eight value-vectors against its activations, on the table `value + $offset` (128 with
/// `vpdpbusd`'s unsigned codes, whose `128 * sum(sc * bsum)` is taken back off; 0 with the sign trick).
macro_rules! tile_256_kernel {
    ($name:ident, $features:literal, $sum8:ident, $offset:literal) => {
        #[target_feature(enable = $features)]
        unsafe fn $name<const C: usize>(nb: usize, group: *const u8, q: [*const u8; C], out: &mut [f32]) {
            let nib = _mm256_set1_epi8(0x0F);
            let table = table_256($offset);
            let mut accs = [[_mm256_setzero_ps(); C]; 2];
            let chunk = chunk_blocks(SB_BYTES, C);
            for b0 in (0..nb).step_by(chunk) {
                for (h, acc_h) in accs.iter_mut().enumerate() {
                    let mut acc = *acc_h;
                    for b in b0..(b0 + chunk).min(nb) {
                        let sb = group.add(b * SB_BYTES);
                        if h == 0 {
                            prefetch(sb);
                        }
                        let mut isum = [_mm256_setzero_si256(); C];
                        for j in 0..4 {
                            let v: [__m256i; 8] = std::array::from_fn(|g| {
                                _mm256_load_si256(sb.add((8 * j + g) * VECTOR_BYTES + 32 * h) as *const __m256i)
                            });
                            for half in 0..2 {
                                let k = 2 * j + half;
                                let w: [__m256i; 8] = std::array::from_fn(|g| {
                                    let n = if half == 0 { v[g] } else { _mm256_srli_epi16::<4>(v[g]) };
                                    _mm256_shuffle_epi8(table, _mm256_and_si256(n, nib))
                                });
                                let sc_at = sb.add(SC_AT + k * PACK_ROWS + 8 * h) as *const __m128i;
                                let sc = _mm256_cvtepi8_epi32(_mm_loadl_epi64(sc_at));
                                for c in 0..C {
                                    let s = $sum8(&w, q[c].add(b * Y_BLOCK + Y_QS + 32 * k), true);
                                    isum[c] = _mm256_add_epi32(isum[c], _mm256_mullo_epi32(s, sc));
                                }
                            }
                        }
                        let d = _mm256_cvtph_ps(_mm_load_si128(sb.add(D_AT + 16 * h) as *const __m128i));
                        for c in 0..C {
                            let y = q[c].add(b * Y_BLOCK);
                            let mut isum = isum[c];
                            if $offset != 0 {
                                let mut msum = _mm256_setzero_si256();
                                for (k, &s) in sub_block_sums(y).iter().enumerate() {
                                    let sc_at = sb.add(SC_AT + k * PACK_ROWS + 8 * h) as *const __m128i;
                                    let sc = _mm256_cvtepi8_epi32(_mm_loadl_epi64(sc_at));
                                    msum = _mm256_add_epi32(msum, _mm256_mullo_epi32(sc, _mm256_set1_epi32(s)));
                                }
                                isum = _mm256_sub_epi32(isum, _mm256_mullo_epi32(msum, _mm256_set1_epi32($offset)));
                            }
                            let dy = _mm256_set1_ps((y as *const f32).read_unaligned());
                            acc[c] = _mm256_fmadd_ps(_mm256_mul_ps(d, dy), _mm256_cvtepi32_ps(isum), acc[c]);
                        }
                    }
                    *acc_h = acc;
                }
            }
            store_halves(&accs, out);
        }
    };
}

tile_256_kernel!(tile_256_vnni, "avx2,fma,f16c,avx512vnni,avx512vl", sum8_vnni, 128);
tile_256_kernel!(tile_256_sign, "avx2,fma,f16c", sum8_sign, 0);
