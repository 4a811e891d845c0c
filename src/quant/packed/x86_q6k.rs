//! The q6_K layout's kernels for x86_64: AVX-512 (16 rows per register), AVX2 with VNNI's 256-bit
//! `vpdpbusd`, and AVX2 with `maddubs`, on two 8-row halves. Each computes `q6k`'s exact integers and then
//! its float steps lane by lane, so all give the portable kernel's bits.
//!
//! Sub-blocks `k` and `k + 8` share their low-nibble vectors (low and high nibbles), so they are taken
//! together.
//!
//! Safety: call only on the SIMD level's detected features, with a group of `nb` super-blocks and
//! columns of `nb` q8_K blocks (checked by `PackedMatrix::tile_on`).

use std::arch::x86_64::*;

use super::q6k::{D_AT, HI_AT, SB_BYTES, SC_AT, Y_BLOCK};
use super::x86::{bcast4, chunk_blocks, store_halves, up_to_8_columns, PREFETCH_BYTES};
use super::x86_q4k::{Y_BSUMS, Y_QS};
use super::{ActRow, SimdLevel, PACK_ROWS, VECTOR_BYTES};

/// Columns one pass of AVX2's q6_K kernel (without VNNI) takes: a sub-block's codes cost about as many
/// instructions to unpack as one column's products with them, so eight columns share each unpacking where
/// the other K-quant kernels take `PASS_COLS` (4).
const AVX2_PASS_COLS: usize = 8;

/// Dispatches `xs` in passes of up to `PASS_COLS` columns (`AVX2_PASS_COLS` on AVX2 without VNNI) to the
/// level's kernel.
///
/// # Safety
/// See the module comment.
pub(super) unsafe fn tile(level: SimdLevel, nb: usize, group: &[u8], xs: &[ActRow], out: &mut [f32]) {
    use super::x86_q4k::PASS_COLS;
    let cols = if matches!(level, SimdLevel::Avx512 | SimdLevel::Avx2Vnni) { PASS_COLS } else { AVX2_PASS_COLS };
    for (xs, out) in xs.chunks(cols).zip(out.chunks_mut(cols * PACK_ROWS)) {
        macro_rules! pass {
            ($c:literal) => {{
                let q: [*const u8; $c] = std::array::from_fn(|i| xs[i].q.as_ptr());
                match level {
                    SimdLevel::Avx512 => tile_512::<$c>(nb, group.as_ptr(), q, out),
                    SimdLevel::Avx2Vnni => tile_256_vnni::<$c>(nb, group.as_ptr(), q, out),
                    _ => tile_256::<$c>(nb, group.as_ptr(), q, out),
                }
            }};
        }
        up_to_8_columns!(xs.len(), pass);
    }
}

/// `-32 * bsums[k]` of the q8_K block at `y`: the correction for the codes' offset.
#[inline(always)]
unsafe fn offset_sum(y: *const u8, k: usize) -> i32 {
    -32 * (y.add(Y_BSUMS + 2 * k) as *const i16).read_unaligned() as i32
}

/// Prefetches super-block `sb`'s lines `PREFETCH_BYTES` ahead.
#[inline(always)]
unsafe fn prefetch(sb: *const u8) {
    prefetch_lines(sb, SB_BYTES)
}

/// Prefetches the `bytes` (a multiple of 64) of the super-block at `sb`, `PREFETCH_BYTES` ahead.
#[inline(always)]
pub(super) unsafe fn prefetch_lines(sb: *const u8, bytes: usize) {
    for l in 0..bytes / 64 {
        _mm_prefetch::<_MM_HINT_T1>(sb.wrapping_add(PREFETCH_BYTES + 64 * l) as *const i8);
    }
}

/// Lane by lane, the i32 sums of four value-vectors against the 16 activation bytes at `y`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn sum4_512(w: &[__m512i; 4], y: *const u8) -> __m512i {
    let s0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[0], _mm512_set1_epi32(bcast4(y)));
    let s1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[1], _mm512_set1_epi32(bcast4(y.add(4))));
    let s0 = _mm512_dpbusd_epi32(s0, w[2], _mm512_set1_epi32(bcast4(y.add(8))));
    let s1 = _mm512_dpbusd_epi32(s1, w[3], _mm512_set1_epi32(bcast4(y.add(12))));
    _mm512_add_epi32(s0, s1)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn tile_512<const C: usize>(nb: usize, group: *const u8, q: [*const u8; C], out: &mut [f32]) {
    let nib = _mm512_set1_epi8(0x0F);
    let m30 = _mm512_set1_epi8(0x30);
    let mut acc = [_mm512_setzero_ps(); C];
    // The value-vectors of sub-block `k`, from its low nibbles `lo` and its high-bit vector.
    let values = |lo: [__m512i; 4], hv: __m512i| -> [__m512i; 4] {
        let hs = [_mm512_slli_epi16::<4>(hv), _mm512_slli_epi16::<2>(hv), hv, _mm512_srli_epi16::<2>(hv)];
        std::array::from_fn(|g| _mm512_or_si512(lo[g], _mm512_and_si512(hs[g], m30)))
    };
    for b in 0..nb {
        let sb = group.add(b * SB_BYTES);
        prefetch(sb);
        let mut isum = [_mm512_setzero_si512(); C];
        for k in 0..8 {
            let v: [__m512i; 4] =
                std::array::from_fn(|g| _mm512_load_si512(sb.add((4 * k + g) * VECTOR_BYTES) as *const __m512i));
            for (kk, lo) in [
                (k, v.map(|v| _mm512_and_si512(v, nib))),
                (k + 8, v.map(|v| _mm512_and_si512(_mm512_srli_epi16::<4>(v), nib))),
            ] {
                let hv = _mm512_load_si512(sb.add(HI_AT + kk * VECTOR_BYTES) as *const __m512i);
                let w = values(lo, hv);
                let sc = _mm512_cvtepi8_epi32(_mm_load_si128(sb.add(SC_AT + kk * PACK_ROWS) as *const __m128i));
                for c in 0..C {
                    let y = q[c].add(b * Y_BLOCK);
                    let s = sum4_512(&w, y.add(Y_QS + 16 * kk));
                    let s = _mm512_add_epi32(s, _mm512_set1_epi32(offset_sum(y, kk)));
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

/// `sum4_512` on 256 bits (VNNI with AVX512VL).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
pub(super) unsafe fn sum4_vnni(w: &[__m256i; 4], y: *const u8) -> __m256i {
    let s0 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), w[0], _mm256_set1_epi32(bcast4(y)));
    let s1 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), w[1], _mm256_set1_epi32(bcast4(y.add(4))));
    let s0 = _mm256_dpbusd_epi32(s0, w[2], _mm256_set1_epi32(bcast4(y.add(8))));
    let s1 = _mm256_dpbusd_epi32(s1, w[3], _mm256_set1_epi32(bcast4(y.add(12))));
    _mm256_add_epi32(s0, s1)
}

/// `sum4_vnni` on AVX2 alone (q2_K, and q3_K's codes of at most 7): codes of at most 63 make `maddubs`
/// pairs of at most 2 * 63 * 128 = 16,128 in magnitude, so two vectors add in i16 (32,256 < 32,767)
/// before `madd` widens them.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn sum4_maddubs(w: &[__m256i; 4], y: *const u8) -> __m256i {
    let ones = _mm256_set1_epi16(1);
    let (s0, s1) = pairs4_maddubs(w, y);
    _mm256_add_epi32(_mm256_madd_epi16(s0, ones), _mm256_madd_epi16(s1, ones))
}

/// The i16 pair sums of four value-vectors against the 16 activation bytes at `y` (codes of at most 63),
/// vectors 0 and 2 added in one, 1 and 3 in the other (each at most 32,256 in magnitude, see
/// `sum4_maddubs`).
#[inline(always)]
unsafe fn pairs4_maddubs(w: &[__m256i; 4], y: *const u8) -> (__m256i, __m256i) {
    let p = |g: usize| _mm256_maddubs_epi16(w[g], _mm256_set1_epi32(bcast4(y.add(4 * g))));
    (_mm256_add_epi16(p(0), p(2)), _mm256_add_epi16(p(1), p(3)))
}

/// A sub-block's four value-vectors (codes 0..63) on 256 bits: the low nibbles `lo` with the two high
/// bits of each from the high-bit vector `hv` (bits `2 g..2 g + 2` for vector `g`).
#[inline(always)]
unsafe fn values_256(lo: [__m256i; 4], hv: __m256i) -> [__m256i; 4] {
    let m30 = _mm256_set1_epi8(0x30);
    let hs = [_mm256_slli_epi16::<4>(hv), _mm256_slli_epi16::<2>(hv), hv, _mm256_srli_epi16::<2>(hv)];
    std::array::from_fn(|g| _mm256_or_si256(lo[g], _mm256_and_si256(hs[g], m30)))
}

/// The 256-bit kernel, defined once per instruction set: each 8-row half `h` of the group as `tile_512`
/// does the whole.
macro_rules! tile_256_kernel {
    ($name:ident, $features:literal, $sum4:ident) => {
        #[target_feature(enable = $features)]
        unsafe fn $name<const C: usize>(nb: usize, group: *const u8, q: [*const u8; C], out: &mut [f32]) {
            let nib = _mm256_set1_epi8(0x0F);
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
                        for k in 0..8 {
                            let v: [__m256i; 4] = std::array::from_fn(|g| {
                                _mm256_load_si256(sb.add((4 * k + g) * VECTOR_BYTES + 32 * h) as *const __m256i)
                            });
                            for (kk, lo) in [
                                (k, v.map(|v| _mm256_and_si256(v, nib))),
                                (k + 8, v.map(|v| _mm256_and_si256(_mm256_srli_epi16::<4>(v), nib))),
                            ] {
                                let hv =
                                    _mm256_load_si256(sb.add(HI_AT + kk * VECTOR_BYTES + 32 * h) as *const __m256i);
                                let w = values_256(lo, hv);
                                let sc_at = sb.add(SC_AT + kk * PACK_ROWS + 8 * h) as *const __m128i;
                                let sc = _mm256_cvtepi8_epi32(_mm_loadl_epi64(sc_at));
                                for c in 0..C {
                                    let y = q[c].add(b * Y_BLOCK);
                                    let s = $sum4(&w, y.add(Y_QS + 16 * kk));
                                    let s = _mm256_add_epi32(s, _mm256_set1_epi32(offset_sum(y, kk)));
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

/// The 256-bit kernel on AVX2 without VNNI, the same integers by fewer instructions: each sub-block's
/// scale multiplies its i16 pair sums in the `madd` that widens them (in place of a `madd` by ones and a
/// `mullo`), and the codes' offset is taken once per super-block, `-32 * sum_k sc_k * bsums[k]` by `madd`
/// on scale pairs (in place of a broadcast per sub-block). All exact in i32, so the same `isum`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile_256<const C: usize>(nb: usize, group: *const u8, q: [*const u8; C], out: &mut [f32]) {
    let nib = _mm256_set1_epi8(0x0F);
    // From a half's eight scale bytes (in both 128-bit lanes), row `r`'s i32 lane as two i16 `sc_r << 8`
    // (`-1` indexes give 0), then shifted back with its sign: `sc_r` in both i16 halves.
    let spread = _mm256_setr_epi8(
        -1, 0, -1, 0, -1, 1, -1, 1, -1, 2, -1, 2, -1, 3, -1, 3, -1, 4, -1, 4, -1, 5, -1, 5, -1, 6, -1, 6, -1, 7, -1, 7,
    );
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
                let y: [*const u8; C] = std::array::from_fn(|c| q[c].add(b * Y_BLOCK));
                // The offset: per row, sum over sub-block pairs j of sc_2j * bsums[2j] + sc_2j+1 * bsums[2j+1].
                let mut corr = [_mm256_setzero_si256(); C];
                for j in 0..8 {
                    let sc_at = |k: usize| _mm_loadl_epi64(sb.add(SC_AT + k * PACK_ROWS + 8 * h) as *const __m128i);
                    let pairs = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(sc_at(2 * j), sc_at(2 * j + 1)));
                    for c in 0..C {
                        let bs = _mm256_set1_epi32(bcast4(y[c].add(Y_BSUMS + 4 * j)));
                        corr[c] = _mm256_add_epi32(corr[c], _mm256_madd_epi16(pairs, bs));
                    }
                }
                let mut isum: [__m256i; C] =
                    std::array::from_fn(|c| _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32::<5>(corr[c])));
                for k in 0..8 {
                    let v: [__m256i; 4] = std::array::from_fn(|g| {
                        _mm256_load_si256(sb.add((4 * k + g) * VECTOR_BYTES + 32 * h) as *const __m256i)
                    });
                    for (kk, lo) in [
                        (k, v.map(|v| _mm256_and_si256(v, nib))),
                        (k + 8, v.map(|v| _mm256_and_si256(_mm256_srli_epi16::<4>(v), nib))),
                    ] {
                        let hv = _mm256_load_si256(sb.add(HI_AT + kk * VECTOR_BYTES + 32 * h) as *const __m256i);
                        let w = values_256(lo, hv);
                        let sc8 = _mm256_set1_epi64x((sb.add(SC_AT + kk * PACK_ROWS + 8 * h) as *const i64).read());
                        let sc = _mm256_srai_epi16::<8>(_mm256_shuffle_epi8(sc8, spread));
                        for c in 0..C {
                            let (s0, s1) = pairs4_maddubs(&w, y[c].add(Y_QS + 16 * kk));
                            let s = _mm256_add_epi32(_mm256_madd_epi16(s0, sc), _mm256_madd_epi16(s1, sc));
                            isum[c] = _mm256_add_epi32(isum[c], s);
                        }
                    }
                }
                let d = _mm256_cvtph_ps(_mm_load_si128(sb.add(D_AT + 16 * h) as *const __m128i));
                for c in 0..C {
                    let dy = _mm256_set1_ps((y[c] as *const f32).read_unaligned());
                    acc[c] = _mm256_fmadd_ps(_mm256_mul_ps(d, dy), _mm256_cvtepi32_ps(isum[c]), acc[c]);
                }
            }
            *acc_h = acc;
        }
    }
    store_halves(&accs, out);
}
