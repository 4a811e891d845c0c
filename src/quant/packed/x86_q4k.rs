//! The q4_K and q5_K layouts' kernels for x86_64 (`FIVE`: q5_K): AVX-512 (16 rows per register), AVX2
//! with VNNI's 256-bit `vpdpbusd`, and AVX2 with `maddubs` (codes of at most 31: `x86::sum8_maddubs`), on
//! two 8-row halves. Each computes `q4k`'s exact integers and then its float steps lane by lane, so all
//! give the portable kernel's bits.
//!
//! Safety: call only on the SIMD level's detected features, with a group of `nb` super-blocks and
//! columns of `nb` q8_K blocks (checked by `PackedMatrix::tile_on`).

use std::arch::x86_64::*;

use super::q4k::{DMIN_AT, D_AT, HB_AT, M_AT, SB5_BYTES, SB_BYTES, SC_AT, Y_BLOCK};
use super::x86::{chunk_blocks, store_halves, sum8_512, sum8_maddubs, sum8_vnni, PREFETCH_BYTES};
use super::{ActRow, SimdLevel, PACK_ROWS, VECTOR_BYTES};

/// Where a q8_K block's quants and 16 bsums (i16) sit.
pub(super) const Y_QS: usize = 4;
pub(super) const Y_BSUMS: usize = 260;

/// Columns one pass takes.
pub(super) const PASS_COLS: usize = 4;

/// Defines a K-quant layout's `tile`: `xs` in passes of up to `PASS_COLS` columns, each to the level's
/// kernel (`$k512`, `$vnni`, `$avx2`, each `unsafe fn<const C: usize>(nb, group, q, out)`).
macro_rules! pass_tile {
    ($k512:ident, $vnni:ident, $avx2:ident) => {
        /// Dispatches `xs` in passes of up to `PASS_COLS` columns to the level's kernel.
        ///
        /// # Safety
        /// See the module comment.
        pub(super) unsafe fn tile(level: SimdLevel, nb: usize, group: &[u8], xs: &[ActRow], out: &mut [f32]) {
            use super::x86_q4k::PASS_COLS;
            for (xs, out) in xs.chunks(PASS_COLS).zip(out.chunks_mut(PASS_COLS * PACK_ROWS)) {
                macro_rules! pass {
                    ($c:literal) => {{
                        let q: [*const u8; $c] = std::array::from_fn(|i| xs[i].q.as_ptr());
                        match level {
                            SimdLevel::Avx512 => $k512::<$c>(nb, group.as_ptr(), q, out),
                            SimdLevel::Avx2Vnni => $vnni::<$c>(nb, group.as_ptr(), q, out),
                            _ => $avx2::<$c>(nb, group.as_ptr(), q, out),
                        }
                    }};
                }
                match xs.len() {
                    1 => pass!(1),
                    2 => pass!(2),
                    3 => pass!(3),
                    _ => pass!(4),
                }
            }
        }
    };
}
pub(super) use pass_tile;

/// Dispatches `xs` in passes of up to `PASS_COLS` columns to the level's kernel.
///
/// # Safety
/// See the module comment.
pub(super) unsafe fn tile(level: SimdLevel, five: bool, nb: usize, group: &[u8], xs: &[ActRow], out: &mut [f32]) {
    for (xs, out) in xs.chunks(PASS_COLS).zip(out.chunks_mut(PASS_COLS * PACK_ROWS)) {
        macro_rules! pass {
            ($c:literal) => {{
                let q: [*const u8; $c] = std::array::from_fn(|i| xs[i].q.as_ptr());
                match (level, five) {
                    (SimdLevel::Avx512, false) => tile_512::<false, $c>(nb, group.as_ptr(), q, out),
                    (SimdLevel::Avx512, true) => tile_512::<true, $c>(nb, group.as_ptr(), q, out),
                    (SimdLevel::Avx2Vnni, false) => tile_256_vnni::<false, $c>(nb, group.as_ptr(), q, out),
                    (SimdLevel::Avx2Vnni, true) => tile_256_vnni::<true, $c>(nb, group.as_ptr(), q, out),
                    (_, false) => tile_256::<false, $c>(nb, group.as_ptr(), q, out),
                    (_, true) => tile_256::<true, $c>(nb, group.as_ptr(), q, out),
                }
            }};
        }
        match xs.len() {
            1 => pass!(1),
            2 => pass!(2),
            3 => pass!(3),
            _ => pass!(4),
        }
    }
}

/// The sums of the eight 32-value sub-blocks of a q8_K block at `y` (pairs of its 16 bsums), as i32.
#[inline(always)]
pub(super) unsafe fn sub_block_sums(y: *const u8) -> [i32; 8] {
    let mut s = [0i32; 8];
    for (k, s) in s.iter_mut().enumerate() {
        let p = y.add(Y_BSUMS + 4 * k) as *const i16;
        *s = p.read_unaligned() as i32 + p.add(1).read_unaligned() as i32;
    }
    s
}

/// Bytes of a super-block: q4_K, or q5_K when `FIVE`.
const fn sb_bytes<const FIVE: bool>() -> usize {
    if FIVE {
        SB5_BYTES
    } else {
        SB_BYTES
    }
}

/// The shift that brings bit `k` of a fifth-bit vector to bit 4, as (left, right) counts.
#[inline(always)]
unsafe fn fifth_shift(k: usize) -> (__m128i, __m128i) {
    (_mm_cvtsi32_si128(4i32.saturating_sub(k as i32).max(0)), _mm_cvtsi32_si128((k as i32 - 4).max(0)))
}

/// Prefetches super-block `sb`'s lines `PREFETCH_BYTES` ahead.
#[inline(always)]
unsafe fn prefetch<const FIVE: bool>(sb: *const u8) {
    for l in 0..sb_bytes::<FIVE>() / 64 {
        _mm_prefetch::<_MM_HINT_T1>(sb.wrapping_add(PREFETCH_BYTES + 64 * l) as *const i8);
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn tile_512<const FIVE: bool, const C: usize>(nb: usize, group: *const u8, q: [*const u8; C], out: &mut [f32]) {
    let nib = _mm512_set1_epi8(0x0F);
    let bit4 = _mm512_set1_epi8(0x10);
    let mut acc = [_mm512_setzero_ps(); C];
    for b in 0..nb {
        let sb = group.add(b * sb_bytes::<FIVE>());
        prefetch::<FIVE>(sb);
        let mut isum = [_mm512_setzero_si512(); C];
        for j in 0..4 {
            let mut v = [_mm512_setzero_si512(); 8];
            for (g, v) in v.iter_mut().enumerate() {
                *v = _mm512_load_si512(sb.add((8 * j + g) * VECTOR_BYTES) as *const __m512i);
            }
            for half in 0..2 {
                let k = 2 * j + half;
                let mut w: [__m512i; 8] = std::array::from_fn(|g| {
                    if half == 0 {
                        _mm512_and_si512(v[g], nib)
                    } else {
                        _mm512_and_si512(_mm512_srli_epi16::<4>(v[g]), nib)
                    }
                });
                if FIVE {
                    let (l, r) = fifth_shift(k);
                    for (g, w) in w.iter_mut().enumerate() {
                        let hb = _mm512_load_si512(sb.add(HB_AT + g * VECTOR_BYTES) as *const __m512i);
                        let hb = _mm512_srl_epi16(_mm512_sll_epi16(hb, l), r);
                        *w = _mm512_or_si512(*w, _mm512_and_si512(hb, bit4));
                    }
                }
                let sc = _mm512_cvtepu8_epi32(_mm_load_si128(sb.add(SC_AT + k * PACK_ROWS) as *const __m128i));
                for c in 0..C {
                    let s = sum8_512(&w, q[c].add(b * Y_BLOCK + Y_QS + 32 * k));
                    isum[c] = _mm512_add_epi32(isum[c], _mm512_mullo_epi32(s, sc));
                }
            }
        }
        let d = _mm512_cvtph_ps(_mm256_load_si256(sb.add(D_AT) as *const __m256i));
        let dmin = _mm512_cvtph_ps(_mm256_load_si256(sb.add(DMIN_AT) as *const __m256i));
        for c in 0..C {
            let y = q[c].add(b * Y_BLOCK);
            let sums = sub_block_sums(y);
            let mut msum = _mm512_setzero_si512();
            for (k, &s) in sums.iter().enumerate() {
                let m = _mm512_cvtepu8_epi32(_mm_load_si128(sb.add(M_AT + k * PACK_ROWS) as *const __m128i));
                msum = _mm512_add_epi32(msum, _mm512_mullo_epi32(m, _mm512_set1_epi32(s)));
            }
            let dy = _mm512_set1_ps((y as *const f32).read_unaligned());
            acc[c] = _mm512_fmadd_ps(_mm512_mul_ps(d, dy), _mm512_cvtepi32_ps(isum[c]), acc[c]);
            acc[c] = _mm512_fnmadd_ps(_mm512_mul_ps(dmin, dy), _mm512_cvtepi32_ps(msum), acc[c]);
        }
    }
    for (c, a) in acc.iter().enumerate() {
        _mm512_storeu_ps(out.as_mut_ptr().add(c * PACK_ROWS), *a);
    }
}

/// The 256-bit kernel, defined once per instruction set: `$sum8` is `x86`'s sum of a sub-block's eight
/// value-vectors against its activations.
macro_rules! tile_256_kernel {
    ($name:ident, $features:literal, $sum8:ident) => {
        #[target_feature(enable = $features)]
        unsafe fn $name<const FIVE: bool, const C: usize>(
            nb: usize,
            group: *const u8,
            q: [*const u8; C],
            out: &mut [f32],
        ) {
            let nib = _mm256_set1_epi8(0x0F);
            let bit4 = _mm256_set1_epi8(0x10);
            let mut accs = [[_mm256_setzero_ps(); C]; 2];
            let chunk = chunk_blocks(sb_bytes::<FIVE>(), C);
            for b0 in (0..nb).step_by(chunk) {
                for (h, acc_h) in accs.iter_mut().enumerate() {
                    let mut acc = *acc_h;
                    for b in b0..(b0 + chunk).min(nb) {
                        let sb = group.add(b * sb_bytes::<FIVE>());
                        if h == 0 {
                            prefetch::<FIVE>(sb);
                        }
                        let mut isum = [_mm256_setzero_si256(); C];
                        for j in 0..4 {
                            let v: [__m256i; 8] = std::array::from_fn(|g| {
                                _mm256_load_si256(sb.add((8 * j + g) * VECTOR_BYTES + 32 * h) as *const __m256i)
                            });
                            for half in 0..2 {
                                let k = 2 * j + half;
                                let mut w: [__m256i; 8] = std::array::from_fn(|g| {
                                    if half == 0 {
                                        _mm256_and_si256(v[g], nib)
                                    } else {
                                        _mm256_and_si256(_mm256_srli_epi16::<4>(v[g]), nib)
                                    }
                                });
                                if FIVE {
                                    let (l, r) = fifth_shift(k);
                                    for (g, w) in w.iter_mut().enumerate() {
                                        let at = sb.add(HB_AT + g * VECTOR_BYTES + 32 * h) as *const __m256i;
                                        let hb = _mm256_srl_epi16(_mm256_sll_epi16(_mm256_load_si256(at), l), r);
                                        *w = _mm256_or_si256(*w, _mm256_and_si256(hb, bit4));
                                    }
                                }
                                let sc_at = sb.add(SC_AT + k * PACK_ROWS + 8 * h) as *const __m128i;
                                let sc = _mm256_cvtepu8_epi32(_mm_loadl_epi64(sc_at));
                                for c in 0..C {
                                    let s = $sum8(&w, q[c].add(b * Y_BLOCK + Y_QS + 32 * k), FIVE);
                                    let s = _mm256_mullo_epi32(s, sc);
                                    isum[c] = _mm256_add_epi32(isum[c], s);
                                }
                            }
                        }
                        let d = _mm256_cvtph_ps(_mm_load_si128(sb.add(D_AT + 16 * h) as *const __m128i));
                        let dmin = _mm256_cvtph_ps(_mm_load_si128(sb.add(DMIN_AT + 16 * h) as *const __m128i));
                        for c in 0..C {
                            let y = q[c].add(b * Y_BLOCK);
                            let sums = sub_block_sums(y);
                            let mut msum = _mm256_setzero_si256();
                            for (k, &s) in sums.iter().enumerate() {
                                let m_at = sb.add(M_AT + k * PACK_ROWS + 8 * h) as *const __m128i;
                                let m = _mm256_cvtepu8_epi32(_mm_loadl_epi64(m_at));
                                msum = _mm256_add_epi32(msum, _mm256_mullo_epi32(m, _mm256_set1_epi32(s)));
                            }
                            let dy = _mm256_set1_ps((y as *const f32).read_unaligned());
                            acc[c] = _mm256_fmadd_ps(_mm256_mul_ps(d, dy), _mm256_cvtepi32_ps(isum[c]), acc[c]);
                            acc[c] = _mm256_fnmadd_ps(_mm256_mul_ps(dmin, dy), _mm256_cvtepi32_ps(msum), acc[c]);
                        }
                    }
                    *acc_h = acc;
                }
            }
            store_halves(&accs, out);
        }
    };
}

tile_256_kernel!(tile_256_vnni, "avx2,fma,f16c,avx512vnni,avx512vl", sum8_vnni);
tile_256_kernel!(tile_256, "avx2,fma,f16c", sum8_maddubs);
