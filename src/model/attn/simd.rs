//! The x86-64 vector forms of a chunk's steps (scores, weights, weighted values, `exp_nonpos`), on 8 lanes
//! (AVX2) and 16 (AVX-512). Each does the portable step's multiplies and adds in the same order, lane by
//! lane, so it gives the same bits; the lane trees (`sum_key_lanes`, `sum_key_lanes_i32`) add in the pairs
//! `kernel::scores` uses. Only `kernel.rs` calls these, after detecting the features they enable.

use crate::quant::QK;

use super::exp::{EXP_LN2_HI, EXP_LN2_LO, EXP_MIN, EXP_POLY, EXP_ROUND};
use super::{KEY_TILE, Q8_BLOCK};

/// `weights` on 16-lane vectors (the same operations per key; the max is exact in any order, and no
/// value here is NaN).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(super) unsafe fn weights_avx512(
    sc: &[f32; KEY_TILE],
    valid: usize,
    scale: f32,
    m_old: f32,
    p: &mut [f32; KEY_TILE],
) -> f32 {
    use std::arch::x86_64::*;
    const _: () = assert!(KEY_TILE == 32, "two 16-lane vectors per tile");
    let valid_mask = |half: usize| -> __mmask16 {
        let n = valid.saturating_sub(16 * half).min(16);
        ((1u32 << n) - 1) as __mmask16
    };
    let neg_inf = _mm512_set1_ps(f32::NEG_INFINITY);
    let scale = _mm512_set1_ps(scale);
    let halves = [0, 1].map(|h| {
        let x = _mm512_mul_ps(_mm512_loadu_ps(sc.as_ptr().add(16 * h)), scale);
        _mm512_mask_blend_ps(valid_mask(h), neg_inf, x)
    });
    let tile_max = _mm512_reduce_max_ps(_mm512_max_ps(halves[0], halves[1]));
    let m_new = m_old.max(tile_max);
    let m = _mm512_set1_ps(m_new);
    for (h, x) in halves.into_iter().enumerate() {
        let w = exp_nonpos_avx512(_mm512_sub_ps(x, m));
        _mm512_storeu_ps(p.as_mut_ptr().add(16 * h), _mm512_maskz_mov_ps(valid_mask(h), w));
    }
    m_new
}

/// `weights` on 8-lane vectors (as `weights_avx512`).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn weights_avx2(
    sc: &[f32; KEY_TILE],
    valid: usize,
    scale: f32,
    m_old: f32,
    p: &mut [f32; KEY_TILE],
) -> f32 {
    use std::arch::x86_64::*;
    let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    let valid_v = _mm256_set1_epi32(valid as i32);
    let neg_inf = _mm256_set1_ps(f32::NEG_INFINITY);
    let scale = _mm256_set1_ps(scale);
    let mut x = [_mm256_setzero_ps(); KEY_TILE / 8];
    let mut keep = [_mm256_setzero_ps(); KEY_TILE / 8];
    let mut max = neg_inf;
    for (j, (x, keep)) in x.iter_mut().zip(keep.iter_mut()).enumerate() {
        let index = _mm256_add_epi32(lanes, _mm256_set1_epi32(8 * j as i32));
        *keep = _mm256_castsi256_ps(_mm256_cmpgt_epi32(valid_v, index));
        let scaled = _mm256_mul_ps(_mm256_loadu_ps(sc.as_ptr().add(8 * j)), scale);
        *x = _mm256_blendv_ps(neg_inf, scaled, *keep);
        max = _mm256_max_ps(max, *x);
    }
    let mut lanes_max = [0f32; 8];
    _mm256_storeu_ps(lanes_max.as_mut_ptr(), max);
    let tile_max = lanes_max.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    let m_new = m_old.max(tile_max);
    let m = _mm256_set1_ps(m_new);
    for (j, (x, keep)) in x.iter().zip(&keep).enumerate() {
        let w = exp_nonpos_avx2(_mm256_sub_ps(*x, m));
        _mm256_storeu_ps(p.as_mut_ptr().add(8 * j), _mm256_and_ps(w, *keep));
    }
    m_new
}

/// `exp_nonpos` on eight lanes, operation for operation (so the same bits in every lane).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn exp_nonpos_avx2(x: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    let c = _mm256_set1_ps;
    let x = _mm256_max_ps(x, c(EXP_MIN));
    let round = c(EXP_ROUND);
    let n = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(x, c(std::f32::consts::LOG2_E)), round), round);
    let r = _mm256_sub_ps(_mm256_sub_ps(x, _mm256_mul_ps(n, c(EXP_LN2_HI))), _mm256_mul_ps(n, c(EXP_LN2_LO)));
    let mut p = c(EXP_POLY[0]);
    for &k in &EXP_POLY[1..] {
        p = _mm256_add_ps(_mm256_mul_ps(p, r), c(k));
    }
    let e = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(_mm256_mul_ps(p, r), r), r), c(1.0));
    let bits = _mm256_slli_epi32::<23>(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)));
    _mm256_mul_ps(e, _mm256_castsi256_ps(bits))
}

/// `exp_nonpos` on sixteen lanes, operation for operation (so the same bits in every lane).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[inline]
unsafe fn exp_nonpos_avx512(x: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    let c = _mm512_set1_ps;
    let x = _mm512_max_ps(x, c(EXP_MIN));
    let round = c(EXP_ROUND);
    let n = _mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(x, c(std::f32::consts::LOG2_E)), round), round);
    let r = _mm512_sub_ps(_mm512_sub_ps(x, _mm512_mul_ps(n, c(EXP_LN2_HI))), _mm512_mul_ps(n, c(EXP_LN2_LO)));
    let mut p = c(EXP_POLY[0]);
    for &k in &EXP_POLY[1..] {
        p = _mm512_add_ps(_mm512_mul_ps(p, r), c(k));
    }
    let e = _mm512_add_ps(_mm512_add_ps(_mm512_mul_ps(_mm512_mul_ps(p, r), r), r), c(1.0));
    let bits = _mm512_slli_epi32::<23>(_mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127)));
    _mm512_mul_ps(e, _mm512_castsi512_ps(bits))
}

/// `weigh_values` with the output held in registers, 64 dimensions at a time (`o.len()` a multiple of 64).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn weigh_values_avx2(o: &mut [f32], alpha: f32, p: &[f32], v: &[f32], stride: usize) {
    use std::arch::x86_64::*;
    let hd = o.len();
    assert!(hd.is_multiple_of(64) && (p.is_empty() || v.len() >= (p.len() - 1) * stride + hd));
    let a = _mm256_set1_ps(alpha);
    for d0 in (0..hd).step_by(64) {
        let mut acc = [_mm256_setzero_ps(); 8];
        for (j, x) in acc.iter_mut().enumerate() {
            *x = _mm256_mul_ps(_mm256_loadu_ps(o.as_ptr().add(d0 + 8 * j)), a);
        }
        for (i, &w) in p.iter().enumerate() {
            let b = _mm256_set1_ps(w);
            let vr = v.as_ptr().add(i * stride + d0);
            for (j, x) in acc.iter_mut().enumerate() {
                *x = _mm256_add_ps(*x, _mm256_mul_ps(b, _mm256_loadu_ps(vr.add(8 * j))));
            }
        }
        for (j, x) in acc.iter().enumerate() {
            _mm256_storeu_ps(o.as_mut_ptr().add(d0 + 8 * j), *x);
        }
    }
}

/// `weigh_values_avx2` on 16-lane vectors: each output dimension gets the same multiplies and adds in
/// the same order (`o.len()` a multiple of 64).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(super) unsafe fn weigh_values_avx512(o: &mut [f32], alpha: f32, p: &[f32], v: &[f32], stride: usize) {
    use std::arch::x86_64::*;
    let hd = o.len();
    assert!(hd.is_multiple_of(64) && (p.is_empty() || v.len() >= (p.len() - 1) * stride + hd));
    let a = _mm512_set1_ps(alpha);
    for d0 in (0..hd).step_by(64) {
        let mut acc = [_mm512_setzero_ps(); 4];
        for (j, x) in acc.iter_mut().enumerate() {
            *x = _mm512_mul_ps(_mm512_loadu_ps(o.as_ptr().add(d0 + 16 * j)), a);
        }
        for (i, &w) in p.iter().enumerate() {
            let b = _mm512_set1_ps(w);
            let vr = v.as_ptr().add(i * stride + d0);
            for (j, x) in acc.iter_mut().enumerate() {
                *x = _mm512_add_ps(*x, _mm512_mul_ps(b, _mm512_loadu_ps(vr.add(16 * j))));
            }
        }
        for (j, x) in acc.iter().enumerate() {
            _mm512_storeu_ps(o.as_mut_ptr().add(d0 + 16 * j), *x);
        }
    }
}

/// `scores` eight keys at a time: a vector of lanes per key, and the eight lane sums by `hadd`, which adds
/// in the same pairs.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn scores_avx2(qv: &[f32], k: &[f32], stride: usize, sc: &mut [f32; KEY_TILE]) {
    use std::arch::x86_64::*;
    let hd = qv.len();
    assert!(hd.is_multiple_of(8) && k.len() >= (KEY_TILE - 1) * stride + hd);
    for i0 in (0..KEY_TILE).step_by(8) {
        let mut a = [_mm256_setzero_ps(); 8];
        for (c, qc) in qv.chunks_exact(8).enumerate() {
            let q = _mm256_loadu_ps(qc.as_ptr());
            for (j, x) in a.iter_mut().enumerate() {
                let kp = k.as_ptr().add((i0 + j) * stride + 8 * c);
                *x = _mm256_add_ps(*x, _mm256_mul_ps(q, _mm256_loadu_ps(kp)));
            }
        }
        _mm256_storeu_ps(
            sc.as_mut_ptr().add(i0),
            sum_key_lanes([
                _mm256_hadd_ps(a[0], a[1]),
                _mm256_hadd_ps(a[2], a[3]),
                _mm256_hadd_ps(a[4], a[5]),
                _mm256_hadd_ps(a[6], a[7]),
            ]),
        );
    }
}

/// Eight keys' scores from their lanes, already added in neighbouring pairs: `h[j] = hadd(key 2j, key 2j + 1)`,
/// where `hadd(x, y) = [x0+x1, x2+x3, y0+y1, y2+y3 | x4+x5, x6+x7, y4+y5, y6+y7]`. Each key's sum is
/// `((0+1)+(2+3))+((4+5)+(6+7))`, as `scores` adds it.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn sum_key_lanes(h: [std::arch::x86_64::__m256; 4]) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    // Keys 0..4: (0+1)+(2+3) in the low half, (4+5)+(6+7) in the high half; keys 4..8 likewise.
    let k03 = _mm256_hadd_ps(h[0], h[1]);
    let k47 = _mm256_hadd_ps(h[2], h[3]);
    let lo = _mm256_permute2f128_ps::<0x20>(k03, k47);
    let hi = _mm256_permute2f128_ps::<0x31>(k03, k47);
    _mm256_add_ps(lo, hi)
}

/// `scores_avx2` over a K tile held as key pairs (see `load_tile`): the eight lanes of keys `2p` and `2p + 1`
/// in one 16-lane vector, so one multiply and one add serve two keys; the lane sums as `scores_avx2`'s.
/// `k` starts at the head's first chunk in the pair layout (twice its offset in a plain row).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(super) unsafe fn scores_avx512(qv: &[f32], k: &[f32], stride: usize, sc: &mut [f32; KEY_TILE]) {
    use std::arch::x86_64::*;
    let hd = qv.len();
    assert!(hd.is_multiple_of(8) && k.len() >= (KEY_TILE / 2 - 1) * 2 * stride + 2 * hd);
    for i0 in (0..KEY_TILE).step_by(8) {
        let mut a = [_mm512_setzero_ps(); 4];
        for (c, qc) in qv.chunks_exact(8).enumerate() {
            let q8 = _mm256_loadu_ps(qc.as_ptr());
            let q = _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(q8)));
            for (j, x) in a.iter_mut().enumerate() {
                let kp = k.as_ptr().add((i0 / 2 + j) * 2 * stride + 16 * c);
                *x = _mm512_add_ps(*x, _mm512_mul_ps(q, _mm512_loadu_ps(kp)));
            }
        }
        // Key 2j's lanes in the low half of a[j], key 2j + 1's in the high half.
        let h = a.map(|x| {
            let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(x)));
            _mm256_hadd_ps(_mm512_castps512_ps256(x), hi)
        });
        _mm256_storeu_ps(sc.as_mut_ptr().add(i0), sum_key_lanes(h));
    }
}

/// `scores_q8` eight keys at a time: a block's products as `|q| * (k with q's sign)` in pairs of bytes
/// (`maddubs`, which cannot saturate: both q8_0 operands lie within +-127), widened and summed in fours, the
/// eight keys' lanes summed by `hadd` (integers: the same sums in any order), then the scale as in
/// `scores_q8`, lane by lane.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn scores_q8_avx2(qb: &[u8], kq: &[i8], kd: &[f32], stride: usize, sc: &mut [f32; KEY_TILE]) {
    use std::arch::x86_64::*;
    let nb = qb.len() / Q8_BLOCK;
    assert!(nb > 0 && kq.len() >= (KEY_TILE - 1) * stride + nb * QK && kd.len() >= nb * KEY_TILE);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); KEY_TILE / 8];
    for b in 0..nb {
        let block = qb.as_ptr().add(Q8_BLOCK * b);
        let dq = _mm256_set1_ps(half::f16::from_le_bytes([*block, *block.add(1)]).to_f32());
        let q = _mm256_loadu_si256(block.add(2) as *const __m256i);
        let qa = _mm256_sign_epi8(q, q);
        for (g, a) in acc.iter_mut().enumerate() {
            let sums: [__m256i; 8] = std::array::from_fn(|j| {
                let k = _mm256_loadu_si256(kq.as_ptr().add((8 * g + j) * stride + b * QK) as *const __m256i);
                _mm256_madd_epi16(_mm256_maddubs_epi16(qa, _mm256_sign_epi8(k, q)), ones)
            });
            let isum = _mm256_cvtepi32_ps(sum_key_lanes_i32(sums));
            let t = _mm256_mul_ps(_mm256_loadu_ps(kd.as_ptr().add(b * KEY_TILE + 8 * g)), dq);
            *a = _mm256_add_ps(*a, _mm256_mul_ps(t, isum));
        }
    }
    for (g, a) in acc.iter().enumerate() {
        _mm256_storeu_ps(sc.as_mut_ptr().add(8 * g), *a);
    }
}

/// Eight keys' integer sums from their eight lanes each (`s[j]`: key `j`), in key order.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn sum_key_lanes_i32(s: [std::arch::x86_64::__m256i; 8]) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    let h = [
        _mm256_hadd_epi32(s[0], s[1]),
        _mm256_hadd_epi32(s[2], s[3]),
        _mm256_hadd_epi32(s[4], s[5]),
        _mm256_hadd_epi32(s[6], s[7]),
    ];
    // Keys 0..4: half their lanes in the low 128 bits, half in the high; keys 4..8 likewise.
    let k03 = _mm256_hadd_epi32(h[0], h[1]);
    let k47 = _mm256_hadd_epi32(h[2], h[3]);
    let lo = _mm256_permute2x128_si256::<0x20>(k03, k47);
    let hi = _mm256_permute2x128_si256::<0x31>(k03, k47);
    _mm256_add_epi32(lo, hi)
}

/// `scores_avx2` for `N` queries against the same keys, four keys at a time: each K vector is loaded once
/// for all of them. Every query's lanes get the same products and adds in the same order as alone, and
/// `hadd` adds a key's lanes in `scores`' pairs, so each query's scores have the bits `scores_avx2` gives.
#[allow(clippy::needless_range_loop)] // `j` indexes the sums of every query of the group
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn scores_avx2_group<const N: usize>(
    qv: [&[f32]; N],
    k: &[f32],
    stride: usize,
    sc: &mut [[f32; KEY_TILE]],
) {
    use std::arch::x86_64::*;
    let hd = qv[0].len();
    assert!(
        sc.len() >= N
            && hd.is_multiple_of(8)
            && k.len() >= (KEY_TILE - 1) * stride + hd
            && qv.iter().all(|q| q.len() == hd)
    );
    for i0 in (0..KEY_TILE).step_by(4) {
        let mut a = [[_mm256_setzero_ps(); 4]; N];
        for c in 0..hd / 8 {
            let q: [__m256; N] = std::array::from_fn(|n| _mm256_loadu_ps(qv[n].as_ptr().add(8 * c)));
            for j in 0..4 {
                let kv = _mm256_loadu_ps(k.as_ptr().add((i0 + j) * stride + 8 * c));
                for n in 0..N {
                    a[n][j] = _mm256_add_ps(a[n][j], _mm256_mul_ps(q[n], kv));
                }
            }
        }
        for n in 0..N {
            // Low half: each key's (0+1)+(2+3); high half: (4+5)+(6+7).
            let h = _mm256_hadd_ps(_mm256_hadd_ps(a[n][0], a[n][1]), _mm256_hadd_ps(a[n][2], a[n][3]));
            let s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps::<1>(h));
            _mm_storeu_ps(sc[n].as_mut_ptr().add(i0), s);
        }
    }
}

/// `weigh_values_avx2` for `N` queries over the same value rows (`o`: their outputs one after the other,
/// `hd` each; `p[n]`: query `n`'s weights, all of one length), 32 dimensions at a time so each V vector
/// is loaded once for all of them. Each output dimension gets the same operations in the same order as
/// alone.
#[allow(clippy::needless_range_loop)] // `j` indexes the sums of every query of the group
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn weigh_values_avx2_group<const N: usize>(
    o: &mut [f32],
    alpha: [f32; N],
    p: [&[f32]; N],
    v: &[f32],
    stride: usize,
) {
    use std::arch::x86_64::*;
    let hd = o.len() / N;
    let keys = p[0].len();
    assert!(hd.is_multiple_of(32) && o.len() == N * hd && p.iter().all(|p| p.len() == keys));
    assert!(keys == 0 || v.len() >= (keys - 1) * stride + hd);
    for d0 in (0..hd).step_by(32) {
        let mut acc: [[__m256; 4]; N] = std::array::from_fn(|n| {
            let a = _mm256_set1_ps(alpha[n]);
            std::array::from_fn(|j| _mm256_mul_ps(_mm256_loadu_ps(o.as_ptr().add(n * hd + d0 + 8 * j)), a))
        });
        for i in 0..keys {
            let b: [__m256; N] = std::array::from_fn(|n| _mm256_set1_ps(*p[n].get_unchecked(i)));
            let vr = v.as_ptr().add(i * stride + d0);
            for j in 0..4 {
                let y = _mm256_loadu_ps(vr.add(8 * j));
                for n in 0..N {
                    acc[n][j] = _mm256_add_ps(acc[n][j], _mm256_mul_ps(b[n], y));
                }
            }
        }
        for (n, acc) in acc.iter().enumerate() {
            for (j, x) in acc.iter().enumerate() {
                _mm256_storeu_ps(o.as_mut_ptr().add(n * hd + d0 + 8 * j), *x);
            }
        }
    }
}

/// `scores_avx512` for `N` queries against the same key pairs: each K vector is loaded once for all of
/// them; every query's lanes get the operations they get alone (the same bits).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(super) unsafe fn scores_avx512_group<const N: usize>(
    qv: [&[f32]; N],
    k: &[f32],
    stride: usize,
    sc: &mut [[f32; KEY_TILE]],
) {
    use std::arch::x86_64::*;
    let hd = qv[0].len();
    assert!(sc.len() >= N && hd.is_multiple_of(8) && qv.iter().all(|q| q.len() == hd));
    assert!(k.len() >= (KEY_TILE / 2 - 1) * 2 * stride + 2 * hd);
    for i0 in (0..KEY_TILE).step_by(8) {
        let mut a = [[_mm512_setzero_ps(); 4]; N];
        for c in 0..hd / 8 {
            let kv: [__m512; 4] =
                std::array::from_fn(|j| _mm512_loadu_ps(k.as_ptr().add((i0 / 2 + j) * 2 * stride + 16 * c)));
            for (a, qv) in a.iter_mut().zip(qv) {
                let q8 = _mm256_loadu_ps(qv.as_ptr().add(8 * c));
                let q = _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(q8)));
                for (a, kv) in a.iter_mut().zip(kv) {
                    *a = _mm512_add_ps(*a, _mm512_mul_ps(q, kv));
                }
            }
        }
        for n in 0..N {
            // Key 2j's lanes in the low half of a[n][j], key 2j + 1's in the high half.
            let h = a[n].map(|x| {
                let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(x)));
                _mm256_hadd_ps(_mm512_castps512_ps256(x), hi)
            });
            _mm256_storeu_ps(sc[n].as_mut_ptr().add(i0), sum_key_lanes(h));
        }
    }
}

/// `weigh_values_avx512` for `N` queries over the same value rows (as `weigh_values_avx2_group`): each V
/// vector is loaded once for all of them, each output dimension gets the operations it gets alone.
#[allow(clippy::needless_range_loop)] // `j` indexes the sums of every query of the group
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(super) unsafe fn weigh_values_avx512_group<const N: usize>(
    o: &mut [f32],
    alpha: [f32; N],
    p: [&[f32]; N],
    v: &[f32],
    stride: usize,
) {
    use std::arch::x86_64::*;
    let hd = o.len() / N;
    let keys = p[0].len();
    assert!(hd.is_multiple_of(64) && o.len() == N * hd && p.iter().all(|p| p.len() == keys));
    assert!(keys == 0 || v.len() >= (keys - 1) * stride + hd);
    for d0 in (0..hd).step_by(64) {
        let mut acc: [[__m512; 4]; N] = std::array::from_fn(|n| {
            let a = _mm512_set1_ps(alpha[n]);
            std::array::from_fn(|j| _mm512_mul_ps(_mm512_loadu_ps(o.as_ptr().add(n * hd + d0 + 16 * j)), a))
        });
        for i in 0..keys {
            let b: [__m512; N] = std::array::from_fn(|n| _mm512_set1_ps(*p[n].get_unchecked(i)));
            let vr = v.as_ptr().add(i * stride + d0);
            for j in 0..4 {
                let y = _mm512_loadu_ps(vr.add(16 * j));
                for n in 0..N {
                    acc[n][j] = _mm512_add_ps(acc[n][j], _mm512_mul_ps(b[n], y));
                }
            }
        }
        for (n, acc) in acc.iter().enumerate() {
            for (j, x) in acc.iter().enumerate() {
                _mm512_storeu_ps(o.as_mut_ptr().add(n * hd + d0 + 16 * j), *x);
            }
        }
    }
}
