//! Bringing a tile of `KEY_TILE` keys from the layer's pages into the scratch, as the kernels read it: f16
//! rows converted to f32 and f32 rows copied as they are (in the AVX-512 instance, K as key pairs
//! interleaved in 8-value chunks), int8 KV's keys kept as quants with their block scales apart, values
//! always as f32, and the keys past the last one zeroed. Conversions are exact (f16 to f32; q8_0 as
//! `q as f32 * d`), so the AVX2 loaders give the portable ones' values. A tile never straddles a page, and only host pages are read: a GPU layer's
//! pages are never touched here.

use std::ops::Range;

use half::slice::HalfFloatSliceExt;

use crate::model::kv::{KvRows, KV_PAGE_TOKENS};
use crate::quant::{self, GgmlType, QK};

use super::{Layer, KEY_TILE, Q8_BLOCK};

/// Converts keys `start..start + n_keys` of the KV heads `heads` into `k` and their values into `v`
/// (rows of the heads' values, one after the other), zeroing the keys past `n_keys`. `AVX2`: converted
/// with F16C and AVX2 in line (the same values: f16 to f32 is exact, f32 is copied, and q8_0 is
/// `q as f32 * d` either way). `WIDE`: `k` holds key pairs, each pair's rows interleaved in 8-value chunks (chunk `c` of key
/// `2p + s` at `2p * stride + 16c + 8s`), which `scores_avx512` reads.
#[inline(always)]
pub(super) fn load_tile<const AVX2: bool, const WIDE: bool>(
    ctx: &Layer,
    heads: Range<usize>,
    start: usize,
    n_keys: usize,
    k: &mut [f32],
    v: &mut [f32],
) {
    let stride = heads.len() * ctx.head_dim;
    let page = &ctx.pages[start / KV_PAGE_TOKENS];
    let r0 = start % KV_PAGE_TOKENS;
    #[cfg(target_arch = "x86_64")]
    if AVX2 && ctx.head_dim.is_multiple_of(32) {
        prefetch_next_tile(ctx, heads.clone(), start);
        if WIDE {
            for i in 0..KEY_TILE {
                let pair = &mut k[i / 2 * 2 * stride..(i / 2 + 1) * 2 * stride];
                if i < n_keys {
                    // SAFETY: as below; the pair's rows hold `2 * stride` values.
                    unsafe { heads_row_avx2(ctx, &page.k, r0 + i, heads.clone(), &mut pair[8 * (i % 2)..], 16) };
                } else {
                    for chunk in pair.chunks_exact_mut(16) {
                        chunk[8 * (i % 2)..8 * (i % 2) + 8].fill(0.0);
                    }
                }
            }
        }
        for i in 0..n_keys {
            // SAFETY: AVX2 and F16C detected (the caller's `AVX2`); rows of `stride`, a multiple of 32.
            unsafe {
                if !WIDE {
                    heads_row_avx2(ctx, &page.k, r0 + i, heads.clone(), &mut k[i * stride..(i + 1) * stride], 8);
                }
                heads_row_avx2(ctx, &page.v, r0 + i, heads.clone(), &mut v[i * stride..(i + 1) * stride], 8);
            }
        }
        if !WIDE {
            k[n_keys * stride..].fill(0.0);
        }
        return;
    }
    for i in 0..n_keys {
        heads_row(ctx, &page.k, r0 + i, heads.clone(), &mut k[i * stride..(i + 1) * stride]);
        heads_row(ctx, &page.v, r0 + i, heads.clone(), &mut v[i * stride..(i + 1) * stride]);
    }
    k[n_keys * stride..].fill(0.0);
}

/// `load_tile` for int8 KV: the keys' quants into `kq` (rows of `stride`) and their block scales into `kd`
/// (block `b` of key `i` at `b * KEY_TILE + i`, scale 0 for the keys past `n_keys`), the values into `v`
/// as f32, as `load_tile` converts them.
#[inline(always)]
pub(super) fn load_tile_q8<const AVX2: bool>(
    ctx: &Layer,
    heads: Range<usize>,
    start: usize,
    n_keys: usize,
    kq: &mut [i8],
    kd: &mut [f32],
    v: &mut [f32],
) {
    let stride = heads.len() * ctx.head_dim;
    let nb = stride / QK;
    let page = &ctx.pages[start / KV_PAGE_TOKENS];
    let r0 = start % KV_PAGE_TOKENS;
    let KvRows::Int8(keys) = &page.k else { unreachable!("int8 KV holds q8_0 rows") };
    #[cfg(target_arch = "x86_64")]
    if AVX2 {
        prefetch_next_tile(ctx, heads.clone(), start);
    }
    for i in 0..n_keys {
        let at = (r0 + i) * ctx.row_bytes + heads.start * ctx.head_bytes;
        for (b, block) in keys[at..at + nb * Q8_BLOCK].chunks_exact(Q8_BLOCK).enumerate() {
            kd[b * KEY_TILE + i] = half::f16::from_le_bytes([block[0], block[1]]).to_f32();
            for (d, &x) in kq[i * stride + b * QK..i * stride + (b + 1) * QK].iter_mut().zip(&block[2..]) {
                *d = x as i8;
            }
        }
        let vr = &mut v[i * stride..(i + 1) * stride];
        #[cfg(target_arch = "x86_64")]
        if AVX2 {
            // SAFETY: AVX2 and F16C detected (the caller's `AVX2`); int8 rows are whole blocks of 32.
            unsafe { heads_row_avx2(ctx, &page.v, r0 + i, heads.clone(), vr, 8) };
            continue;
        }
        heads_row(ctx, &page.v, r0 + i, heads.clone(), vr);
    }
    for b in 0..nb {
        kd[b * KEY_TILE + n_keys..(b + 1) * KEY_TILE].fill(0.0);
    }
}

/// One head's rows are strided (a row holds every KV head) and a tile spans pages of memory, where the
/// hardware's prefetcher stops: asks for the next tile's rows of the heads `heads` while this one is used.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch_next_tile(ctx: &Layer, heads: Range<usize>, start: usize) {
    if heads.len() * ctx.head_dim >= ctx.kv_dim {
        return;
    }
    if let Some(next) = ctx.pages.get((start + KEY_TILE) / KV_PAGE_TOKENS) {
        let r1 = (start + KEY_TILE) % KV_PAGE_TOKENS;
        for i in 0..KEY_TILE {
            prefetch_heads(ctx, &next.k, r1 + i, heads.clone());
            prefetch_heads(ctx, &next.v, r1 + i, heads.clone());
        }
    }
}

/// Row `r` of a page's K or V for the KV heads `heads`, as f32.
#[inline(always)]
pub(super) fn heads_row(ctx: &Layer, rows: &KvRows, r: usize, heads: Range<usize>, dst: &mut [f32]) {
    match rows {
        KvRows::F16(k) => {
            let at = r * ctx.kv_dim + heads.start * ctx.head_dim;
            k[at..at + heads.len() * ctx.head_dim].convert_to_f32_slice(dst);
        }
        KvRows::F32(k) => {
            let at = r * ctx.kv_dim + heads.start * ctx.head_dim;
            dst.copy_from_slice(&k[at..at + heads.len() * ctx.head_dim]);
        }
        KvRows::Int8(k) => {
            let at = r * ctx.row_bytes + heads.start * ctx.head_bytes;
            quant::dequantize_row(GgmlType::Q8_0, &k[at..at + heads.len() * ctx.head_bytes], dst);
        }
        KvRows::Gpu => unreachable!("GPU layers attend with a kernel"),
    }
}

/// Asks for row `r` of a page's K or V for the KV heads `heads` to be brought into the cache (every 64
/// bytes of it, and its last byte).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch_heads(ctx: &Layer, rows: &KvRows, r: usize, heads: Range<usize>) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    let (base, at, len) = match rows {
        KvRows::F16(k) => {
            (k.as_ptr() as *const i8, 2 * (r * ctx.kv_dim + heads.start * ctx.head_dim), 2 * heads.len() * ctx.head_dim)
        }
        KvRows::F32(k) => {
            (k.as_ptr() as *const i8, 4 * (r * ctx.kv_dim + heads.start * ctx.head_dim), 4 * heads.len() * ctx.head_dim)
        }
        KvRows::Int8(k) => {
            (k.as_ptr() as *const i8, r * ctx.row_bytes + heads.start * ctx.head_bytes, heads.len() * ctx.head_bytes)
        }
        KvRows::Gpu => return,
    };
    // SAFETY: a prefetch reads nothing and cannot fault; the addresses are computed without wrapping.
    unsafe {
        for off in (0..len).step_by(64) {
            _mm_prefetch::<_MM_HINT_T0>(base.wrapping_add(at + off));
        }
        _mm_prefetch::<_MM_HINT_T0>(base.wrapping_add(at + len - 1));
    }
}

/// `heads_row` with F16C and AVX2, in line (`head_dim` a multiple of 32), the row's 8-value chunk `c` written
/// at `dst[step * c..]` (`step` 8: a plain row; 16: one of a key pair's interleaved rows). f32 rows are
/// copied with plain loads and stores.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn heads_row_avx2(ctx: &Layer, rows: &KvRows, r: usize, heads: Range<usize>, dst: &mut [f32], step: usize) {
    use std::arch::x86_64::*;
    let n = heads.len() * ctx.head_dim;
    assert!((step == 8 || step == 16) && dst.len() >= n / 8 * step - (step - 8) && n.is_multiple_of(32));
    match rows {
        KvRows::F16(k) => {
            let at = r * ctx.kv_dim + heads.start * ctx.head_dim;
            let src = &k[at..at + n];
            for c in 0..n / 8 {
                let h = _mm_loadu_si128(src.as_ptr().add(8 * c) as *const __m128i);
                _mm256_storeu_ps(dst.as_mut_ptr().add(step * c), _mm256_cvtph_ps(h));
            }
        }
        KvRows::F32(k) => {
            let at = r * ctx.kv_dim + heads.start * ctx.head_dim;
            let src = &k[at..at + n];
            for c in 0..n / 8 {
                _mm256_storeu_ps(dst.as_mut_ptr().add(step * c), _mm256_loadu_ps(src.as_ptr().add(8 * c)));
            }
        }
        KvRows::Int8(k) => {
            // q8_0 blocks: an f16 scale, then 32 signed bytes.
            let at = r * ctx.row_bytes + heads.start * ctx.head_bytes;
            let src = &k[at..at + heads.len() * ctx.head_bytes];
            for (b, block) in src.chunks_exact(Q8_BLOCK).enumerate() {
                let d = _mm256_set1_ps(half::f16::from_le_bytes([block[0], block[1]]).to_f32());
                for c in 0..4 {
                    let q = _mm_loadl_epi64(block.as_ptr().add(2 + 8 * c) as *const __m128i);
                    let x = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
                    _mm256_storeu_ps(dst.as_mut_ptr().add(step * (4 * b + c)), _mm256_mul_ps(x, d));
                }
            }
        }
        KvRows::Gpu => unreachable!("GPU layers attend with a kernel"),
    }
}
