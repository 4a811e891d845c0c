//! AVX2 + FMA + F16C kernels for x86_64: legacy-quant and K-quant dot products (one or several
//! activation columns), activation quantization, and the f32 / f16 dot products.
//!
//! Every kernel mirrors the lane structure of ggml-cpu's AVX2 code (`arch/x86/quants.c`, `vec.h`): eight
//! f32 lanes, each holding the integer sum of four neighbouring products, scaled per block with one fma
//! into a single accumulator, then ggml's `hsum_float_8`. Same operations in the same order means the
//! same bits as llama.cpp on an AVX2 machine (given the same activations).
//!
//! The multi-column kernels are the one-column kernel with the column loop inside the block loop: the
//! weight block is unpacked once, and each column then runs exactly the instructions it would run alone,
//! so every column's result is bit-identical to `vec_dot` on that column (batch invariance). Two
//! variants change instructions but not bits: activation scales read as f32 made once per row instead of
//! converted from f16 in every block, and, where AVX-512 VNNI is present, `vpdpbusd` for the integer sums.
//!
//! Safety: every function here must only be called after `is_x86_feature_detected!` confirmed avx2, fma
//! and f16c (see `quant::simd`), with pointers valid for the stated number of blocks.

use std::arch::x86_64::*;

/// Legacy weight formats handled here, as const-generic tags.
pub const Q4_0: u8 = 0;
pub const Q4_1: u8 = 1;
pub const Q5_0: u8 = 2;
pub const Q5_1: u8 = 3;
pub const Q8_0: u8 = 4;
/// K-quant weight formats (256-value blocks against q8_K activations), same tag space.
pub const Q4_K: u8 = 5;
pub const Q5_K: u8 = 6;
pub const Q6_K: u8 = 7;

/// The f16 at `p` (integer conversion; see `blocks::f16_to_f32` for why not F16C here).
#[inline(always)]
unsafe fn f16_at(p: *const u8) -> f32 {
    super::blocks::f16_to_f32((p as *const u16).read_unaligned())
}

/// The f16 at `p` in all eight lanes. Broadcasting before converting writes whole registers, so no
/// lane is left to merge with a stale one (a scalar `vcvtph2ps` would chain to the accumulators).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn bcast_f16(p: *const u8) -> __m256 {
    _mm256_cvtph_ps(_mm_set1_epi16((p as *const i16).read_unaligned()))
}

/// The f16 at `p` in all four lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn bcast_f16x4(p: *const u8) -> __m128 {
    _mm_cvtph_ps(_mm_set1_epi16((p as *const i16).read_unaligned()))
}

/// ggml's `hsum_float_8`: (hi + lo) halves, then pairs, then the last two lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn hsum_float_8(x: __m256) -> f32 {
    let mut r = _mm256_extractf128_ps(x, 1);
    r = _mm_add_ps(r, _mm256_castps256_ps128(x));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    _mm_cvtss_f32(r)
}

/// 32 nibbles to 32 bytes: low nibbles of the 16 bytes first, then the high nibbles.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn bytes_from_nibbles_32(p: *const u8) -> __m256i {
    let tmp = _mm_loadu_si128(p as *const __m128i);
    let bytes = _mm256_set_m128i(_mm_srli_epi16(tmp, 4), tmp);
    _mm256_and_si256(_mm256_set1_epi8(0xF), bytes)
}

/// 32 bits to 32 bytes of 0x00 / 0xFF (bit j -> byte j).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn bytes_from_bits_32(p: *const u8) -> __m256i {
    let x32 = (p as *const u32).read_unaligned();
    let shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(x32 as i32), shuf);
    let bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1))
}

/// Unsigned bytes `ax` times signed bytes `sy`, summed in fours, as 8 floats (exact integers).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn mul_sum_us8_pairs_float(ax: __m256i, sy: __m256i) -> __m256 {
    let dot = _mm256_maddubs_epi16(ax, sy);
    _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_set1_epi16(1), dot))
}

/// Bytes per weight block, bytes per activation block, offset of the activation quants.
pub(super) const fn layout(k: u8) -> (usize, usize, usize) {
    match k {
        Q4_0 => (18, 34, 2),
        Q4_1 => (20, 36, 4),
        Q5_0 => (22, 34, 2),
        Q5_1 => (24, 36, 4),
        _ => (34, 34, 2),
    }
}

/// Unsigned bytes `ax` times signed bytes `sy`, summed in fours by AVX-512 VNNI's `vpdpbusd`: one
/// instruction for `mul_sum_us8_pairs_float`'s two, and the same integers (the pairs `maddubs` adds never
/// saturate here: weights are at most 8 bits unsigned and activations within +-127).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
unsafe fn mul_sum_us8_vnni(ax: __m256i, sy: __m256i) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(_mm256_setzero_si256(), ax, sy))
}

/// Where a kernel finds an activation block's scale d (and q8_1's sum s): in the block as f16, or in a
/// row of f32 pairs `(d, s)` per block made once per activation row (`super::act_aux`), which saves the
/// conversion in every (weight row, block). Both give the same bits: the f16 to f32 conversion is exact.
#[derive(Clone, Copy)]
pub struct Cols<'a, const C: usize> {
    pub q: &'a [*const u8; C],
    /// Null pointers when the scales are read from the blocks.
    pub ds: &'a [*const f32; C],
}

/// Dot of `nb` weight blocks of format `K` at `w` (32-value blocks for the legacy tags, 256-value blocks
/// for the K-quant tags) against `C` activation rows `xs`, into `out[..C]`. `vnni` picks the `vpdpbusd`
/// integer sums (same bits; only where `avx512vnni` and `avx512vl` were detected).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_blocks<const K: u8, const C: usize>(
    nb: usize,
    w: *const u8,
    xs: Cols<C>,
    vnni: bool,
    out: &mut [f32],
) {
    match K {
        Q4_K | Q5_K => k4_dot::<K, C>(nb, w, xs.q, out),
        Q6_K => q6_k_dot::<C>(nb, w, xs.q, out),
        _ if vnni => {
            if xs.ds[0].is_null() {
                legacy_dot_vnni::<K, C, false>(nb, w, xs, out)
            } else {
                legacy_dot_vnni::<K, C, true>(nb, w, xs, out)
            }
        }
        _ => {
            if xs.ds[0].is_null() {
                legacy_dot::<K, C, false>(nb, w, xs, out)
            } else {
                legacy_dot::<K, C, true>(nb, w, xs, out)
            }
        }
    }
}

/// The legacy-format kernel, defined once per instruction set: `$isum` is the integer sum of a block
/// against one column (`mul_sum_us8_pairs_float`, or `mul_sum_us8_vnni`).
macro_rules! legacy_kernel {
    ($name:ident, $features:literal, $isum:ident) => {
        /// Dot of `nb` legacy weight blocks of format `K` at `w` against `C` activation rows, into
        /// `out[..C]`; with `PRE` the activations' scales come from `xs.ds` (see `Cols`).
        #[target_feature(enable = $features)]
        unsafe fn $name<const K: u8, const C: usize, const PRE: bool>(
            nb: usize,
            w: *const u8,
            xs: Cols<C>,
            out: &mut [f32],
        ) {
            let (wb, xb, xq) = layout(K);
            let signed = matches!(K, Q4_0 | Q5_0 | Q8_0);
            let has_min = matches!(K, Q4_1 | Q5_1);
            let mut acc = [_mm256_setzero_ps(); C];
            // Every lane of `summs` carries the same scalar sum; lane 0 is the result.
            let mut summs = [_mm_setzero_ps(); C];
            for i in 0..nb {
                let wp = w.add(i * wb);
                let dw = bcast_f16(wp);
                let qx = match K {
                    Q4_0 => _mm256_sub_epi8(bytes_from_nibbles_32(wp.add(2)), _mm256_set1_epi8(8)),
                    Q4_1 => bytes_from_nibbles_32(wp.add(4)),
                    Q5_0 => {
                        let hi = _mm256_andnot_si256(bytes_from_bits_32(wp.add(2)), _mm256_set1_epi8(0xF0u8 as i8));
                        _mm256_or_si256(bytes_from_nibbles_32(wp.add(6)), hi)
                    }
                    Q5_1 => {
                        let hi = _mm256_and_si256(bytes_from_bits_32(wp.add(4)), _mm256_set1_epi8(0x10));
                        _mm256_or_si256(bytes_from_nibbles_32(wp.add(8)), hi)
                    }
                    _ => _mm256_loadu_si256(wp.add(2) as *const __m256i),
                };
                // Signed weights: |w| times y with w's sign, so the unsigned operand is the weight's.
                let ax = if signed { _mm256_sign_epi8(qx, qx) } else { qx };
                let mw = if has_min { bcast_f16x4(wp.add(2)) } else { _mm_setzero_ps() };
                for c in 0..C {
                    let yp = xs.q[c].add(i * xb);
                    // set1(dw) * set1(dy) is set1(dw * dy): the same single rounding as ggml's scalar product.
                    let dy = if PRE { _mm256_broadcast_ss(&*xs.ds[c].add(2 * i)) } else { bcast_f16(yp) };
                    let d = _mm256_mul_ps(dw, dy);
                    let qy = _mm256_loadu_si256(yp.add(xq) as *const __m256i);
                    let sy = if signed { _mm256_sign_epi8(qy, qx) } else { qy };
                    let q = $isum(ax, sy);
                    acc[c] = _mm256_fmadd_ps(d, q, acc[c]);
                    if has_min {
                        // ggml writes `summs += m * s`; compilers contract that to an fma when FMA is enabled.
                        let sy = if PRE { _mm_broadcast_ss(&*xs.ds[c].add(2 * i + 1)) } else { bcast_f16x4(yp.add(2)) };
                        summs[c] = _mm_fmadd_ps(mw, sy, summs[c]);
                    }
                }
            }
            for c in 0..C {
                out[c] = hsum_float_8(acc[c]) + _mm_cvtss_f32(summs[c]);
            }
        }
    };
}

legacy_kernel!(legacy_dot, "avx2,fma,f16c", mul_sum_us8_pairs_float);
legacy_kernel!(legacy_dot_vnni, "avx2,fma,f16c,avx512vnni,avx512vl", mul_sum_us8_vnni);

/// Bytes of a q8_K activation block; its d (f32) sits at 0, the quants at 4, the 16 bsums (i16) at 260.
const Q8K_BYTES: usize = 292;

/// The i16 in lane `k` of a 128-bit half, in every lane of both halves (ggml's `get_scale_shuffle_k4`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn bcast_i16_lane(v: __m256i, k: usize) -> __m256i {
    let lo = 2 * k as i16;
    _mm256_shuffle_epi8(v, _mm256_set1_epi16(((lo + 1) << 8) | lo))
}

/// The eight 6-bit sub-block scales and mins of a q4_K / q5_K block (12 packed bytes at `p`) as i16:
/// the scales in both 128-bit halves of the first value (for `bcast_i16_lane`), the mins in the second.
/// ggml's `utmp` shuffle: the same bits as `blocks::scale_min_k4`, four bytes at a time.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn k4_scales_mins(p: *const u8) -> (__m256i, __m128i) {
    const LOW6: u32 = 0x3f3f3f3f;
    const LOW4: u32 = 0x0f0f0f0f;
    const LOW2: u32 = 0x03030303;
    let q = p as *const u32;
    let (a0, a1, a2) = (q.read_unaligned(), q.add(1).read_unaligned(), q.add(2).read_unaligned());
    let sc = [a0 & LOW6, (a2 & LOW4) | (((a0 >> 6) & LOW2) << 4)];
    let mn = [a1 & LOW6, ((a2 >> 4) & LOW4) | (((a1 >> 6) & LOW2) << 4)];
    let both = _mm256_cvtepu8_epi16(_mm_set_epi32(mn[1] as i32, mn[0] as i32, sc[1] as i32, sc[0] as i32));
    let sc16 = _mm256_castsi256_si128(both);
    (_mm256_set_m128i(sc16, sc16), _mm256_extracti128_si256::<1>(both))
}

/// q4_K (`K == Q4_K`) or q5_K against q8_K, as ggml's AVX2 `ggml_vec_dot_q4_K_q8_K` / `_q5_K_q8_K`.
/// Per block and column: maddubs of the unsigned 4- or 5-bit weights with the activations, times the
/// sub-block scale (i16 madd), summed into eight i32 lanes and added to the accumulator with one fma by
/// d. The mins meet the activations' bsums apart: four f32 lanes by fma for q4_K, a scalar fma for
/// q5_K, exactly as ggml does each.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn k4_dot<const K: u8, const C: usize>(nb: usize, w: *const u8, xs: &[*const u8; C], out: &mut [f32]) {
    let (wb, qs_at) = if K == Q4_K { (144, 16) } else { (176, 48) };
    let m4 = _mm256_set1_epi8(0xF);
    let m16 = _mm256_set1_epi8(0x10);
    let mut acc = [_mm256_setzero_ps(); C];
    let mut acc_m = [_mm_setzero_ps(); C]; // q4_K's min terms
    let mut summs = [0f32; C]; // q5_K's min terms
    for i in 0..nb {
        let wp = w.add(i * wb);
        let (dw, dmin_w) = (f16_at(wp), f16_at(wp.add(2)));
        let (scales, mins) = k4_scales_mins(wp.add(4));
        // q5_K: bits 2j and 2j + 1 of qh byte l are the fifth bits of values 64j + l and 64j + 32 + l;
        // `qh` is shifted right by two per step so that they are always bits 0 and 1.
        let mut qh = if K == Q5_K { _mm256_loadu_si256(wp.add(16) as *const __m256i) } else { _mm256_setzero_si256() };
        let mut sumi = [_mm256_setzero_si256(); C];
        for j in 0..4 {
            let bits = _mm256_loadu_si256(wp.add(qs_at + 32 * j) as *const __m256i);
            let mut lo = _mm256_and_si256(bits, m4);
            let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(bits), m4);
            if K == Q5_K {
                lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16::<4>(qh), m16));
                hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16::<3>(qh), m16));
                qh = _mm256_srli_epi16::<2>(qh);
            }
            let (sc_lo, sc_hi) = (bcast_i16_lane(scales, 2 * j), bcast_i16_lane(scales, 2 * j + 1));
            for c in 0..C {
                let yq = xs[c].add(i * Q8K_BYTES + 4 + 64 * j);
                let y_lo = _mm256_loadu_si256(yq as *const __m256i);
                let y_hi = _mm256_loadu_si256(yq.add(32) as *const __m256i);
                let p_lo = _mm256_madd_epi16(sc_lo, _mm256_maddubs_epi16(lo, y_lo));
                let p_hi = _mm256_madd_epi16(sc_hi, _mm256_maddubs_epi16(hi, y_hi));
                sumi[c] = _mm256_add_epi32(sumi[c], _mm256_add_epi32(p_lo, p_hi));
            }
        }
        for c in 0..C {
            let yp = xs[c].add(i * Q8K_BYTES);
            let yd = (yp as *const f32).read_unaligned();
            let (d, dmin) = (yd * dw, -yd * dmin_w);
            // Pairs of bsums are the sums of the 32-value sub-blocks, one per min.
            let bsums = yp.add(260) as *const __m128i;
            let q8s = _mm_hadd_epi16(_mm_loadu_si128(bsums), _mm_loadu_si128(bsums.add(1)));
            let prod = _mm_madd_epi16(mins, q8s);
            if K == Q4_K {
                acc_m[c] = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(prod), acc_m[c]);
            } else {
                let s2 = _mm_add_epi32(prod, _mm_unpackhi_epi64(prod, prod));
                let s = _mm_cvtsi128_si32(_mm_add_epi32(s2, _mm_shuffle_epi32::<0b01>(s2)));
                // ggml writes `summs += dmin * s`; compilers contract that to an fma when FMA is enabled.
                summs[c] = dmin.mul_add(s as f32, summs[c]);
            }
            acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi[c]), acc[c]);
        }
    }
    for c in 0..C {
        out[c] = if K == Q4_K {
            let m = _mm_add_ps(acc_m[c], _mm_movehl_ps(acc_m[c], acc_m[c]));
            hsum_float_8(acc[c]) + _mm_cvtss_f32(_mm_add_ss(m, _mm_movehdup_ps(m)))
        } else {
            hsum_float_8(acc[c]) + summs[c]
        };
    }
}

/// The i8 scales `s` and `s + 1` of a q6_K block (16 at `scales`) as i16: `s` in the eight lanes of the
/// low half, `s + 1` in the high half (ggml's `get_scale_shuffle`, then a sign extension).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6_k_scale_pair(scales: __m128i, s: usize) -> __m256i {
    let bytes = 0x0101_0101_0101_0101i64;
    _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales, _mm_set_epi64x(bytes * (s as i64 + 1), bytes * s as i64)))
}

/// Bits 0 and 1 of each byte of `h` moved to bits 4 and 5: the high part of a q6_K level.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6_k_high(h: __m256i, m3: __m256i) -> __m256i {
    _mm256_slli_epi16::<4>(_mm256_and_si256(h, m3))
}

/// q6_K against q8_K, as ggml's AVX2 `ggml_vec_dot_q6_K_q8_K`: the unsigned 6-bit levels times the
/// activations by maddubs, minus 32 times the activations (the same maddubs with 32), times the 16-value
/// sub-block scales (i16 madd), summed into eight i32 lanes; one fma by d per block.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6_k_dot<const C: usize>(nb: usize, w: *const u8, xs: &[*const u8; C], out: &mut [f32]) {
    let m4 = _mm256_set1_epi8(0xF);
    let m3 = _mm256_set1_epi8(3);
    let m32 = _mm256_set1_epi8(32);
    let mut acc = [_mm256_setzero_ps(); C];
    for i in 0..nb {
        let wp = w.add(i * 210);
        let dw = f16_at(wp.add(208));
        let scales = _mm_loadu_si128(wp.add(192) as *const __m128i);
        let mut sumi = [_mm256_setzero_si256(); C];
        // Each half of the block: 128 values from 64 bytes of low nibbles and 32 bytes of 2-bit highs.
        for j in 0..2 {
            let ql0 = _mm256_loadu_si256(wp.add(64 * j) as *const __m256i);
            let ql1 = _mm256_loadu_si256(wp.add(64 * j + 32) as *const __m256i);
            let qh = _mm256_loadu_si256(wp.add(128 + 32 * j) as *const __m256i);
            let q = [
                _mm256_or_si256(_mm256_and_si256(ql0, m4), q6_k_high(qh, m3)),
                _mm256_or_si256(_mm256_and_si256(ql1, m4), q6_k_high(_mm256_srli_epi16::<2>(qh), m3)),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), m4),
                    q6_k_high(_mm256_srli_epi16::<4>(qh), m3),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), m4),
                    q6_k_high(_mm256_srli_epi16::<6>(qh), m3),
                ),
            ];
            let sc = [
                q6_k_scale_pair(scales, 8 * j),
                q6_k_scale_pair(scales, 8 * j + 2),
                q6_k_scale_pair(scales, 8 * j + 4),
                q6_k_scale_pair(scales, 8 * j + 6),
            ];
            for c in 0..C {
                let yq = xs[c].add(i * Q8K_BYTES + 4 + 128 * j);
                let mut p = [_mm256_setzero_si256(); 4];
                for k in 0..4 {
                    let y = _mm256_loadu_si256(yq.add(32 * k) as *const __m256i);
                    let d16 = _mm256_sub_epi16(_mm256_maddubs_epi16(q[k], y), _mm256_maddubs_epi16(m32, y));
                    p[k] = _mm256_madd_epi16(sc[k], d16);
                }
                sumi[c] = _mm256_add_epi32(sumi[c], _mm256_add_epi32(p[0], p[1]));
                sumi[c] = _mm256_add_epi32(sumi[c], _mm256_add_epi32(p[2], p[3]));
            }
        }
        for c in 0..C {
            let yd = (xs[c].add(i * Q8K_BYTES) as *const f32).read_unaligned();
            acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(yd * dw), _mm256_cvtepi32_ps(sumi[c]), acc[c]);
        }
    }
    for c in 0..C {
        out[c] = hsum_float_8(acc[c]);
    }
}

/// `round_half_even(v * id)` as i32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scale_round(v: __m256, id: __m256) -> __m256i {
    _mm256_cvtps_epi32(_mm256_round_ps::<_MM_FROUND_TO_NEAREST_INT>(_mm256_mul_ps(v, id)))
}

/// Quantizes one 32-value block as ggml-cpu's x86 `quantize_row_q8_0/1`: writes the 32 quants to `qs`
/// and returns (d, sum of the quants) for the caller to store as q8_0 or q8_1.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn quantize_q8_block(x: *const f32, qs: *mut u8) -> (f32, i32) {
    let v = [_mm256_loadu_ps(x), _mm256_loadu_ps(x.add(8)), _mm256_loadu_ps(x.add(16)), _mm256_loadu_ps(x.add(24))];
    let sign = _mm256_set1_ps(-0.0);
    let mut max_abs = _mm256_andnot_ps(sign, v[0]);
    for vi in &v[1..] {
        max_abs = _mm256_max_ps(max_abs, _mm256_andnot_ps(sign, *vi));
    }
    let mut m4 = _mm_max_ps(_mm256_extractf128_ps(max_abs, 1), _mm256_castps256_ps128(max_abs));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    let amax = _mm_cvtss_f32(m4);
    let d = amax / 127.0;
    let id = _mm256_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
    let (i0, i1, i2, i3) = (scale_round(v[0], id), scale_round(v[1], id), scale_round(v[2], id), scale_round(v[3], id));
    let s = _mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3));
    let s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    let s2 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
    let sum = _mm_cvtsi128_si32(_mm_add_epi32(s2, _mm_shuffle_epi32::<0b10_11_00_01>(s2)));
    // Saturating packs interleave 128-bit halves; the permute restores value order.
    let p01 = _mm256_packs_epi32(i0, i1);
    let p23 = _mm256_packs_epi32(i2, i3);
    let p = _mm256_packs_epi16(p01, p23);
    let p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(qs as *mut __m256i, p);
    (d, sum)
}

/// ggml's `GGML_F32x8_REDUCE` of four accumulators.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn reduce4(s: [__m256; 4]) -> f32 {
    let a = _mm256_add_ps(s[0], s[2]);
    let b = _mm256_add_ps(s[1], s[3]);
    let x = _mm256_add_ps(a, b);
    let t0 = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    let t1 = _mm_hadd_ps(t0, t0);
    _mm_cvtss_f32(_mm_hadd_ps(t1, t1))
}

/// `ggml_vec_dot_f32`: four 8-lane fma accumulators over 32-value steps, then the tail in f32.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_f32(n: usize, a: *const f32, b: *const f32) -> f32 {
    let np = n & !31;
    let mut s = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i < np {
        for (j, s) in s.iter_mut().enumerate() {
            let (x, y) = (_mm256_loadu_ps(a.add(i + 8 * j)), _mm256_loadu_ps(b.add(i + 8 * j)));
            *s = _mm256_fmadd_ps(x, y, *s);
        }
        i += 32;
    }
    let mut sum = reduce4(s);
    for i in np..n {
        sum = (*a.add(i)).mul_add(*b.add(i), sum);
    }
    sum
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load_f16x8(p: *const u16) -> __m256 {
    _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
}

/// `ggml_vec_dot_f16` with the second operand either f16 (`b16`) or f32 (`b32`): the same four
/// accumulators, the tail summed in f64 as ggml does.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_f16(n: usize, a: *const u16, b16: *const u16, b32: *const f32) -> f32 {
    let np = n & !31;
    let mut s = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i < np {
        for (j, s) in s.iter_mut().enumerate() {
            let x = load_f16x8(a.add(i + 8 * j));
            let y = if b32.is_null() { load_f16x8(b16.add(i + 8 * j)) } else { _mm256_loadu_ps(b32.add(i + 8 * j)) };
            *s = _mm256_fmadd_ps(x, y, *s);
        }
        i += 32;
    }
    let mut sum = reduce4(s) as f64;
    for i in np..n {
        let x = half::f16::from_bits(*a.add(i)).to_f32();
        let y = if b32.is_null() { half::f16::from_bits(*b16.add(i)).to_f32() } else { *b32.add(i) };
        sum += (x * y) as f64;
    }
    sum as f32
}

/// `dot_f16(n, a, null, bs[c])` for `C` f32 columns at once: each 8 weights are converted once and meet
/// every column with one fma, in the same four accumulators per column, so each column's result has the
/// bits of `dot_f16` on it alone.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_f16_cols<const C: usize>(n: usize, a: *const u16, bs: &[*const f32; C], out: &mut [f32]) {
    let np = n & !31;
    let mut s = [[_mm256_setzero_ps(); 4]; C];
    let mut i = 0;
    while i < np {
        for j in 0..4 {
            let x = load_f16x8(a.add(i + 8 * j));
            for (sc, b) in s.iter_mut().zip(bs) {
                sc[j] = _mm256_fmadd_ps(x, _mm256_loadu_ps(b.add(i + 8 * j)), sc[j]);
            }
        }
        i += 32;
    }
    for c in 0..C {
        let mut sum = reduce4(s[c]) as f64;
        for i in np..n {
            sum += (half::f16::from_bits(*a.add(i)).to_f32() * *bs[c].add(i)) as f64;
        }
        out[c] = sum as f32;
    }
}

/// `dst[i] = fma(a, v[i], dst[i])` for f16 `v`; the tail uses the same scalar fma, so an element's
/// result never depends on its position or on `n`.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn axpy_f16(n: usize, dst: *mut f32, a: f32, v: *const u16) {
    let va = _mm256_set1_ps(a);
    let mut i = 0;
    while i + 8 <= n {
        let d = _mm256_fmadd_ps(va, load_f16x8(v.add(i)), _mm256_loadu_ps(dst.add(i)));
        _mm256_storeu_ps(dst.add(i), d);
        i += 8;
    }
    while i < n {
        *dst.add(i) = a.mul_add(half::f16::from_bits(*v.add(i)).to_f32(), *dst.add(i));
        i += 1;
    }
}

/// Eight i8 at `p` as eight f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load_i8x8(p: *const u8) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(p as *const __m128i)))
}

/// Dot of `nb` q8_0 blocks with f32 `q`: per block an 8-lane fma chain over the four groups of eight,
/// scaled into one accumulator by the block's d; one final `hsum_float_8`.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_q8_0_f32(nb: usize, k: *const u8, q: *const f32) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for i in 0..nb {
        let b = k.add(34 * i);
        let qp = q.add(32 * i);
        let mut s = _mm256_mul_ps(load_i8x8(b.add(2)), _mm256_loadu_ps(qp));
        for g in 1..4 {
            s = _mm256_fmadd_ps(load_i8x8(b.add(2 + 8 * g)), _mm256_loadu_ps(qp.add(8 * g)), s);
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(f16_at(b)), s, acc);
    }
    hsum_float_8(acc)
}

/// `dst[j] = fma(a * d, v[j], dst[j])` over `nb` q8_0 blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn axpy_q8_0(nb: usize, dst: *mut f32, a: f32, v: *const u8) {
    for i in 0..nb {
        let b = v.add(34 * i);
        let ad = _mm256_set1_ps(a * f16_at(b));
        for g in 0..4 {
            let p = dst.add(32 * i + 8 * g);
            _mm256_storeu_ps(p, _mm256_fmadd_ps(ad, load_i8x8(b.add(2 + 8 * g)), _mm256_loadu_ps(p)));
        }
    }
}
