//! The packed layout's kernels for x86_64: AVX-512 (F, BW, VL, VNNI) on whole 16-row vectors, and AVX2 on
//! two 8-row halves, with VNNI's 256-bit `vpdpbusd` where present and `maddubs` / `madd` where not.
//!
//! Every path computes the same exact integer sum per (row, column, block) and then, lane by lane, the
//! portable kernel's float steps: `d = dw * dy`, `acc = fma(d, isum as f32, acc)`; so they give its bits.
//!
//! Safety: call only on the SIMD level's detected features, with a group of `nb` blocks and columns of
//! `nb` q8_0 blocks with `2 * nb` aux values (checked by `PackedMatrix::tile_on`).

use std::arch::x86_64::*;

use super::super::blocks::KVALUES_MXFP4;
use super::{ActRow, Format, SimdLevel, PACK_ROWS, VECTOR_BYTES};

/// Bytes of a q8_0 activation block (q8_1 when `MIN`), and where its quants start.
const fn y_block<const MIN: bool>() -> usize {
    if MIN {
        36
    } else {
        34
    }
}
const fn y_qs<const MIN: bool>() -> usize {
    if MIN {
        4
    } else {
        2
    }
}

/// How far ahead of the block in use the K-quant kernels prefetch the weights, into L2 (`_MM_HINT_T1`).
/// Decoding reads each weight once, from DRAM: without it one thread streamed 10-12 GB/s of q4_0 where a
/// plain sum reads 26 GB/s; 8 KiB ahead into L2 gave 15-20 GB/s and tg64 +24% (q4_0) / +30% (q8_0) on
/// SmolLM2-135M (AMD EPYC, 2 threads). For q4_K and q6_K, 8 and 16 KiB are as good; q6_K loses 15% at 24.
pub(super) const PREFETCH_BYTES: usize = 8192;

/// The same for the legacy formats (q4_0, q4_1, q5_0, q5_1, q8_0), whose kernels read fewer bytes per
/// instruction: one thread streaming a 64 MiB q4_0 matrix (`cargo bench --bench quant`, the distances
/// interleaved in one process, 12 rounds, median GB/s) read 8.8 with no prefetch, 11.6 at 8 KiB, 14.4 at
/// 16, 14.3 at 24 and 14.5 at 32 (q4_1 alike); q8_0 15.0 / 14.9 / 16.2 / 17.0 from 8 KiB. In the model
/// (SmolLM2 q4_0, tg128, `STRATA_PREFETCH_KIB` alternating, 5-6 rounds, mean tok/s): 1 thread 154 / 160 /
/// 154 / 147 at 8 / 16 / 24 / 32 KiB; 2 threads 215 / 218 / - / 195 (two threads' distances share the
/// caches). 16 KiB it is.
const LEGACY_PREFETCH_BYTES: usize = 16384;

/// How far ahead the legacy kernels also prefetch into L1 (`_MM_HINT_T0`) when they decode (one or two
/// columns), beside the L2 prefetch `LEGACY_FAR_BYTES_DECODE` ahead. With one column a block's products are
/// few, and each waits in the scheduler for its line: while a line comes from L2 the scheduler fills with
/// such waiters and stops taking the loads behind them, so one thread streamed q8_0 at about 17 GB/s where
/// a plain read loop takes 30. With the lines already in L1 the loads do not wait. The moe preset's q8_0
/// model (`strata synth --preset moe`, tg128 at 1 thread, AVX-512, 5 rounds alternating, mean tok/s): L2 at
/// 16 KiB alone 234.5; with L1 at 2 KiB 246.9; L2 at 24 KiB and L1 at 2 KiB 256.2, at 4 KiB 278.5; L2 at
/// 32 KiB and L1 at 4 KiB 267.5. SmolLM2 at 1 thread (5 rounds): q4_0 195.3 -> 211.2, q4_1 181.4 -> 190.9
/// on AVX-512. The 256-bit kernels of the 4-bit formats do more work per byte (nibbles, two 8-row halves)
/// and lost to the extra instructions (AVX2, q4_0 175.4 -> 160.3, q4_1 173.2 -> 166.3): there only q8_0 takes
/// it (its moe model on AVX2 232.0 -> 274.4; SmolLM2 q8_0 about even).
const LEGACY_NEAR_BYTES: usize = 4096;

/// `LEGACY_PREFETCH_BYTES` with L1 prefetching beside it (`LEGACY_NEAR_BYTES`), for the decoding passes.
const LEGACY_FAR_BYTES_DECODE: usize = 24576;

/// A size in KiB from the environment variable `name` (read once by the caller), else `default` bytes.
fn env_kib(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Err(_) => default,
        Ok(v) => v.trim().parse::<usize>().map(|k| k.saturating_mul(1024)).unwrap_or_else(|_| {
            tracing::warn!("{name}={v:?} is not a number of KiB; using the default {} KiB", default / 1024);
            default
        }),
    }
}

/// The legacy kernels' prefetch distance: `LEGACY_PREFETCH_BYTES`, or `STRATA_PREFETCH_KIB` from the
/// environment (read once; `0` turns the prefetch off), for measuring other distances on other machines.
pub(super) fn legacy_prefetch_bytes() -> usize {
    static BYTES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *BYTES.get_or_init(|| env_kib("STRATA_PREFETCH_KIB", LEGACY_PREFETCH_BYTES))
}

/// The decoding passes' distances `(L2, L1)`: `LEGACY_FAR_BYTES_DECODE` and `LEGACY_NEAR_BYTES`, or
/// `STRATA_DECODE_PREFETCH_KIB` and `STRATA_DECODE_NEAR_KIB` from the environment (read once; a near
/// distance of `0` prefetches into L2 alone).
pub(super) fn legacy_decode_prefetch_bytes() -> (usize, usize) {
    static BYTES: std::sync::OnceLock<(usize, usize)> = std::sync::OnceLock::new();
    *BYTES.get_or_init(|| {
        (
            env_kib("STRATA_DECODE_PREFETCH_KIB", LEGACY_FAR_BYTES_DECODE),
            env_kib("STRATA_DECODE_NEAR_KIB", LEGACY_NEAR_BYTES),
        )
    })
}

/// The offset of mxfp4's codes on AVX2 without VNNI: its values lie in -12..=12, so `value + 12` is a code
/// of at most 24 that `sum8_maddubs` takes as wide (q5_0's) codes. The sums are the same integers.
const MXFP4_OFFSET: i32 = 12;

/// Columns one pass takes: their accumulators stay in registers beside the block's weights.
const PASS_COLS: usize = 4;

/// The prefetch distances `(L2, L1)` of a legacy kernel on `level` for `f` over `cols` columns: L1
/// prefetching where it pays (see `LEGACY_NEAR_BYTES`), in decoding passes (one or two columns) of the
/// 512-bit kernels and of q8_0 on 256 bits; else L2 alone at `legacy_prefetch_bytes`.
pub(super) fn legacy_distances(level: SimdLevel, f: Format, cols: usize) -> (usize, usize) {
    if cols <= 2 && (level == SimdLevel::Avx512 || f.vectors == 8) {
        legacy_decode_prefetch_bytes()
    } else {
        (legacy_prefetch_bytes(), 0)
    }
}

/// Dispatches `xs` in passes of up to `PASS_COLS` columns to the level's kernel.
///
/// # Safety
/// See the module comment.
pub(super) unsafe fn tile(
    level: SimdLevel,
    f: Format,
    nb: usize,
    group: &[u8],
    ahead: usize,
    xs: &[ActRow],
    out: &mut [f32],
) {
    let (distance, near) = legacy_distances(level, f, xs.len());
    let lim = Lim { offset: f.offset, ahead, distance, near, table: f.table };
    let vnni = matches!(level, SimdLevel::Avx512 | SimdLevel::Avx2Vnni);
    let narrow_table = f.table.is_some_and(|t| *t == KVALUES_MXFP4);
    if !vnni && (f.vectors == 8 || (f.table.is_some() && !narrow_table)) {
        return tile_q8_avx2(lim, nb, group, xs, out);
    }
    // mxfp4 on AVX2: codes `value + 12` (0..24) take `maddubs` directly, as q5_0's do (no sign trick).
    let lim = if !vnni && narrow_table { Lim { offset: MXFP4_OFFSET, ..lim } } else { lim };
    for (xs, out) in xs.chunks(PASS_COLS).zip(out.chunks_mut(PASS_COLS * PACK_ROWS)) {
        macro_rules! pass {
            ($c:literal) => {{
                let q: [*const u8; $c] = std::array::from_fn(|i| xs[i].q.as_ptr());
                let a: [*const f32; $c] = std::array::from_fn(|i| xs[i].aux.as_ptr());
                let (o, g) = (lim, group.as_ptr());
                match (level, f.vectors, f.min, f.table.is_some()) {
                    (SimdLevel::Avx512, 4, false, true) => tile_512::<4, false, true, $c>(o, nb, g, q, a, out),
                    (SimdLevel::Avx512, 4, false, _) => tile_512::<4, false, false, $c>(o, nb, g, q, a, out),
                    (SimdLevel::Avx512, 5, false, _) => tile_512::<5, false, false, $c>(o, nb, g, q, a, out),
                    (SimdLevel::Avx512, 4, true, _) => tile_512::<4, true, false, $c>(o, nb, g, q, a, out),
                    (SimdLevel::Avx512, 5, true, _) => tile_512::<5, true, false, $c>(o, nb, g, q, a, out),
                    (SimdLevel::Avx512, _, _, _) => tile_512::<8, false, false, $c>(o, nb, g, q, a, out),
                    (SimdLevel::Avx2Vnni, 4, false, true) => tile_256_vnni::<4, false, true, $c>(o, nb, g, q, a, out),
                    (SimdLevel::Avx2Vnni, 4, false, _) => tile_256_vnni::<4, false, false, $c>(o, nb, g, q, a, out),
                    (SimdLevel::Avx2Vnni, 5, false, _) => tile_256_vnni::<5, false, false, $c>(o, nb, g, q, a, out),
                    (SimdLevel::Avx2Vnni, 4, true, _) => tile_256_vnni::<4, true, false, $c>(o, nb, g, q, a, out),
                    (SimdLevel::Avx2Vnni, 5, true, _) => tile_256_vnni::<5, true, false, $c>(o, nb, g, q, a, out),
                    (SimdLevel::Avx2Vnni, _, _, _) => tile_256_vnni::<8, false, false, $c>(o, nb, g, q, a, out),
                    (_, 4, false, true) => tile_256_q4::<4, false, true, $c>(o, nb, g, q, a, out),
                    (_, 4, false, _) => tile_256_q4::<4, false, false, $c>(o, nb, g, q, a, out),
                    (_, 5, false, _) => tile_256_q4::<5, false, false, $c>(o, nb, g, q, a, out),
                    (_, 4, true, _) => tile_256_q4::<4, true, false, $c>(o, nb, g, q, a, out),
                    _ => tile_256_q4::<5, true, false, $c>(o, nb, g, q, a, out),
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

/// `$pass!(n)` for a pass of `$len` columns, `n` the literal from 1 to 8 that a kernel takes as its column
/// count (more than 8 take 8): the dispatch of the kernels that run up to eight columns at once.
macro_rules! up_to_8_columns {
    ($len:expr, $pass:ident) => {
        match $len {
            1 => $pass!(1),
            2 => $pass!(2),
            3 => $pass!(3),
            4 => $pass!(4),
            5 => $pass!(5),
            6 => $pass!(6),
            7 => $pass!(7),
            _ => $pass!(8),
        }
    };
}
pub(super) use up_to_8_columns;

/// Columns one pass of AVX2's q8_0 kernel takes: its sums are one register per column beside `w`, `|w|`
/// and two constants, so eight fit AVX2's sixteen registers, and the block's weights are read and their
/// absolute values taken once for all eight (one `TOKEN_TILE`); `PASS_COLS` (4) left the kernel 2-3%
/// slower (SmolLM2 q8_0 pp512, 2 threads).
const Q8_PASS_COLS: usize = 8;

/// `tile`'s dispatch for q8_0 and the table formats (iq4_nl, mxfp4) on AVX2 without VNNI, in passes of up
/// to `Q8_PASS_COLS` columns.
///
/// # Safety
/// See the module comment.
unsafe fn tile_q8_avx2(lim: Lim, nb: usize, group: &[u8], xs: &[ActRow], out: &mut [f32]) {
    for (xs, out) in xs.chunks(Q8_PASS_COLS).zip(out.chunks_mut(Q8_PASS_COLS * PACK_ROWS)) {
        macro_rules! pass {
            ($c:literal) => {{
                let q: [*const u8; $c] = std::array::from_fn(|i| xs[i].q.as_ptr());
                let a: [*const f32; $c] = std::array::from_fn(|i| xs[i].aux.as_ptr());
                if lim.table.is_some() {
                    tile_256_q8::<true, $c>(lim, nb, group.as_ptr(), q, a, out)
                } else {
                    tile_256_q8::<false, $c>(lim, nb, group.as_ptr(), q, a, out)
                }
            }};
        }
        up_to_8_columns!(xs.len(), pass);
    }
}

/// The four activation bytes at `p`, as one i32 to broadcast to every lane.
#[inline(always)]
pub(super) unsafe fn bcast4(p: *const u8) -> i32 {
    (p as *const i32).read_unaligned()
}

/// Lane by lane, the i32 sums of the eight value-vectors `w` against the 32 activation bytes at `y` (vector
/// `g` meets bytes `4 g..4 g + 4`, broadcast), by `vpdpbusd` in two chains of four (so one column is not
/// bound by its latency).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn sum8_512(w: &[__m512i; 8], y: *const u8) -> __m512i {
    let mut s0 = _mm512_setzero_si512();
    let mut s1 = _mm512_setzero_si512();
    for g in (0..8).step_by(2) {
        s0 = _mm512_dpbusd_epi32(s0, w[g], _mm512_set1_epi32(bcast4(y.add(4 * g))));
        s1 = _mm512_dpbusd_epi32(s1, w[g + 1], _mm512_set1_epi32(bcast4(y.add(4 * g + 4))));
    }
    _mm512_add_epi32(s0, s1)
}

/// `sum8_512` on 256 bits (VNNI with AVX512VL). `_wide` is `sum8_maddubs`'s, unused here.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
pub(super) unsafe fn sum8_vnni(w: &[__m256i; 8], y: *const u8, _wide: bool) -> __m256i {
    let mut s0 = _mm256_setzero_si256();
    let mut s1 = _mm256_setzero_si256();
    for g in (0..8).step_by(2) {
        s0 = _mm256_dpbusd_epi32(s0, w[g], _mm256_set1_epi32(bcast4(y.add(4 * g))));
        s1 = _mm256_dpbusd_epi32(s1, w[g + 1], _mm256_set1_epi32(bcast4(y.add(4 * g + 4))));
    }
    _mm256_add_epi32(s0, s1)
}

/// `sum8_vnni` on AVX2 alone, for codes of at most 15 (or 31 when `wide`): `maddubs` gives i16 pairs of at
/// most 2 * 15 * 127 = 3,810 (7,874) in magnitude, so each chain of four vectors adds in i16 (31,496 <
/// 32,767 at worst); narrow codes' two chains add in i16 too (30,480) before one `madd` widens them, wide
/// codes' are widened apart: the exact integer sums either way. (q8_0's codes reach 255: `tile_256_q8`.)
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn sum8_maddubs(w: &[__m256i; 8], y: *const u8, wide: bool) -> __m256i {
    let ones = _mm256_set1_epi16(1);
    let mut s0 = _mm256_setzero_si256();
    let mut s1 = _mm256_setzero_si256();
    for g in (0..8).step_by(2) {
        s0 = _mm256_add_epi16(s0, _mm256_maddubs_epi16(w[g], _mm256_set1_epi32(bcast4(y.add(4 * g)))));
        s1 = _mm256_add_epi16(s1, _mm256_maddubs_epi16(w[g + 1], _mm256_set1_epi32(bcast4(y.add(4 * g + 4)))));
    }
    if wide {
        _mm256_add_epi32(_mm256_madd_epi16(s0, ones), _mm256_madd_epi16(s1, ones))
    } else {
        _mm256_madd_epi16(_mm256_add_epi16(s0, s1), ones)
    }
}

/// Where block `b`'s scales (`d` of each row, then with `MIN` its `m`) start in a group of `nb` blocks of
/// `V` vectors.
#[inline(always)]
unsafe fn scales_at<const V: usize, const MIN: bool>(group: *const u8, nb: usize, b: usize) -> *const u8 {
    group.add(nb * V * VECTOR_BYTES + b * 2 * PACK_ROWS * (1 + MIN as usize))
}

/// What a legacy kernel takes beside its group: the format's `offset` (`w = u - offset`), and how many
/// bytes from the group's start it may prefetch (the end of the calling thread's run of groups).
#[derive(Clone, Copy)]
struct Lim {
    offset: i32,
    ahead: usize,
    /// The prefetch distance into L2 (`legacy_prefetch_bytes`, or `legacy_decode_prefetch_bytes`'s first).
    distance: usize,
    /// The prefetch distance into L1 (0: none; `legacy_decode_prefetch_bytes`'s second).
    near: usize,
    /// The format's table (iq4_nl, mxfp4): nibble `i` is the value `table[i]`.
    table: Option<&'static [i8; 16]>,
}

/// A table format's nibble-to-code lookup for `pshufb`: byte `i` is `table[i] + lim.offset` (the code `u`
/// with `w = u - offset`: 128 for every table on the VNNI paths, as q8_0's flipped bytes; 12 for mxfp4's
/// values of at most 12 on AVX2's `maddubs`), in each 128-bit lane.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn code_table_256(lim: Lim) -> __m256i {
    let t = lim.table.map_or([0u8; 16], |t| t.map(|v| (v as i32 + lim.offset) as u8));
    _mm256_broadcastsi128_si256(_mm_loadu_si128(t.as_ptr() as *const __m128i))
}

/// Prefetches into L2, `lim.distance` ahead (but not `lim.ahead` bytes past the group's start or further),
/// the share of a legacy group's bytes that block `b` stands for: its vectors and its scales (`V * 64 +
/// scale bytes`). A group is its quants and then its scales, so stepping by the quants alone would leave a
/// gap of the scales' size per group that no prefetch covers (it did: q4_0 tg +10-18% once closed);
/// stepping by the whole block's bytes covers the stream, groups lying back to back, each line once.
#[inline(always)]
unsafe fn prefetch_block<const V: usize, const MIN: bool>(group: *const u8, b: usize, lim: Lim) {
    let step = V * VECTOR_BYTES + 2 * PACK_ROWS * (1 + MIN as usize);
    let pf = lim.distance;
    if pf == 0 {
        return;
    }
    prefetch_span::<_MM_HINT_T1>(group, pf + b * step, step, lim.ahead);
    if lim.near > 0 {
        prefetch_span::<_MM_HINT_T0>(group, lim.near + b * step, step, lim.ahead);
    }
}

/// Prefetches (with `HINT`) the lines of `group`'s bytes `from..from + len`, not reaching `ahead`.
#[inline(always)]
unsafe fn prefetch_span<const HINT: i32>(group: *const u8, from: usize, len: usize, ahead: usize) {
    for at in (from.next_multiple_of(64)..(from + len).min(ahead)).step_by(64) {
        // Wrapping: with no bound (`tile_on`) the address may lie past the matrix; a prefetch cannot fault.
        _mm_prefetch::<HINT>(group.wrapping_add(at) as *const i8);
    }
}

/// AVX-512: the 16 rows in one register. `V` is the format's vectors per block (4: q4_0's nibbles, whose
/// high halves make vectors 4..8; 5: with q5_0's fifth bits; 8: q8_0's bytes); `MIN`: q4_1 / q5_1;
/// `LUT`: the nibbles index `lim.table` (iq4_nl, mxfp4; `V` 4), looked up to codes by `vpshufb`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn tile_512<const V: usize, const MIN: bool, const LUT: bool, const C: usize>(
    lim: Lim,
    nb: usize,
    group: *const u8,
    q: [*const u8; C],
    a: [*const f32; C],
    out: &mut [f32],
) {
    let nib = _mm512_set1_epi8(0x0F);
    let off = _mm512_set1_ps(lim.offset as f32);
    let codes = _mm512_broadcast_i64x4(code_table_256(lim));
    let mut acc = [_mm512_setzero_ps(); C];
    for b in 0..nb {
        let wp = group.add(b * V * VECTOR_BYTES);
        prefetch_block::<V, MIN>(group, b, lim);
        let mut w = [_mm512_setzero_si512(); 8];
        if V == 4 || V == 5 {
            for g in 0..4 {
                let v = _mm512_load_si512(wp.add(g * VECTOR_BYTES) as *const __m512i);
                w[g] = _mm512_and_si512(v, nib);
                w[4 + g] = _mm512_and_si512(_mm512_srli_epi16::<4>(v), nib);
                if LUT {
                    w[g] = _mm512_shuffle_epi8(codes, w[g]);
                    w[4 + g] = _mm512_shuffle_epi8(codes, w[4 + g]);
                }
            }
            if V == 5 {
                let hv = _mm512_load_si512(wp.add(4 * VECTOR_BYTES) as *const __m512i);
                let bit4 = _mm512_set1_epi8(0x10);
                let shifted = [
                    _mm512_slli_epi16::<4>(hv),
                    _mm512_slli_epi16::<3>(hv),
                    _mm512_slli_epi16::<2>(hv),
                    _mm512_slli_epi16::<1>(hv),
                    hv,
                    _mm512_srli_epi16::<1>(hv),
                    _mm512_srli_epi16::<2>(hv),
                    _mm512_srli_epi16::<3>(hv),
                ];
                for (w, h) in w.iter_mut().zip(shifted) {
                    *w = _mm512_or_si512(*w, _mm512_and_si512(h, bit4));
                }
            }
        } else {
            for (g, w) in w.iter_mut().enumerate() {
                *w = _mm512_load_si512(wp.add(g * VECTOR_BYTES) as *const __m512i);
            }
        }
        let scales = scales_at::<V, MIN>(group, nb, b);
        let dw = _mm512_cvtph_ps(_mm256_load_si256(scales as *const __m256i));
        for c in 0..C {
            let sum = sum8_512(&w, q[c].add(b * y_block::<MIN>() + y_qs::<MIN>()));
            let (dy, ysum) = (*a[c].add(2 * b), *a[c].add(2 * b + 1));
            let d = _mm512_mul_ps(dw, _mm512_set1_ps(dy));
            if MIN {
                // d dy sum(u * y) + m s_y, the block's two terms (which largely cancel) rounded once.
                let mw = _mm512_cvtph_ps(_mm256_load_si256(scales.add(2 * PACK_ROWS) as *const __m256i));
                let t = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sum), _mm512_mul_ps(mw, _mm512_set1_ps(ysum)));
                acc[c] = _mm512_add_ps(acc[c], t);
            } else {
                // sum(u * y) - offset * sum(y), in f32: every term is an integer below 2^24, so exact.
                let isum = _mm512_fnmadd_ps(off, _mm512_set1_ps(ysum), _mm512_cvtepi32_ps(sum));
                acc[c] = _mm512_fmadd_ps(d, isum, acc[c]);
            }
        }
    }
    for (c, a) in acc.iter().enumerate() {
        _mm512_storeu_ps(out.as_mut_ptr().add(c * PACK_ROWS), *a);
    }
}

/// Bytes of a group that the AVX2 kernels take per chunk: they pass over a group's blocks once per 8-row
/// half, so the second pass finds a chunk's lines still in L1 (a whole group of a 4,096-wide q4_0 row is
/// 36 KiB, and of a q8_0 one 68 KiB: more than L1 holds, so the second half was read again from L2).
const CHUNK_BYTES: usize = 8192;

/// Blocks of `block_bytes` per chunk (at least one) for a pass of `cols` columns. Decoding's one or two
/// columns go block by block (both halves of a block, then the next), so the weights stream in order and
/// each block's prefetch goes out at an even pace: SmolLM2 q4_0 tg128 at 1 thread on AVX2 +7% (6 rounds
/// alternating, 131.0 -> 139.6 tok/s); with more columns a block's compute hides the stream anyway.
#[inline(always)]
pub(super) fn chunk_blocks(block_bytes: usize, cols: usize) -> usize {
    if cols <= 2 {
        return 1;
    }
    (CHUNK_BYTES / block_bytes).max(1)
}

/// Writes the two 8-row halves' sums of each column to `out` (column `c` at `c * PACK_ROWS`).
#[inline]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn store_halves<const C: usize>(accs: &[[__m256; C]; 2], out: &mut [f32]) {
    for (h, acc) in accs.iter().enumerate() {
        for (c, a) in acc.iter().enumerate() {
            _mm256_storeu_ps(out.as_mut_ptr().add(c * PACK_ROWS + 8 * h), *a);
        }
    }
}

/// The 8-row half `h` of a group's vector `g` of block `wp`, as 256 bits.
#[inline(always)]
unsafe fn half_at(wp: *const u8, g: usize, h: usize) -> __m256i {
    _mm256_load_si256(wp.add(g * VECTOR_BYTES + 32 * h) as *const __m256i)
}

/// q5_0: ORs the fifth bits of vector 4 (`hv`, see the module comment of `packed`) into the eight
/// value-vectors' nibbles.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn or_high_bits_256(w: &mut [__m256i; 8], hv: __m256i) {
    let bit4 = _mm256_set1_epi8(0x10);
    let shifted = [
        _mm256_slli_epi16::<4>(hv),
        _mm256_slli_epi16::<3>(hv),
        _mm256_slli_epi16::<2>(hv),
        _mm256_slli_epi16::<1>(hv),
        hv,
        _mm256_srli_epi16::<1>(hv),
        _mm256_srli_epi16::<2>(hv),
        _mm256_srli_epi16::<3>(hv),
    ];
    for (w, h) in w.iter_mut().zip(shifted) {
        *w = _mm256_or_si256(*w, _mm256_and_si256(h, bit4));
    }
}

/// Block `b`'s scales `d` of half `h` as f32 (with `m`, its mins).
#[inline(always)]
unsafe fn half_scales<const V: usize, const MIN: bool>(
    group: *const u8,
    nb: usize,
    b: usize,
    h: usize,
    m: bool,
) -> __m256 {
    let at = scales_at::<V, MIN>(group, nb, b).add(16 * h + 2 * PACK_ROWS * m as usize);
    _mm256_cvtph_ps(_mm_load_si128(at as *const __m128i))
}

/// The 256-bit kernel for codes that `$sum8` can take (q4_0, q5_0; with VNNI q8_0 and the table formats
/// too), defined once per instruction set: each 8-row half of the group as `tile_512` does the whole.
macro_rules! tile_256_kernel {
    ($name:ident, $features:literal, $sum8:ident) => {
        #[target_feature(enable = $features)]
        unsafe fn $name<const V: usize, const MIN: bool, const LUT: bool, const C: usize>(
            lim: Lim,
            nb: usize,
            group: *const u8,
            q: [*const u8; C],
            a: [*const f32; C],
            out: &mut [f32],
        ) {
            let nib = _mm256_set1_epi8(0x0F);
            let off = _mm256_set1_ps(lim.offset as f32);
            let codes = code_table_256(lim);
            let mut accs = [[_mm256_setzero_ps(); C]; 2];
            let chunk = chunk_blocks(V * VECTOR_BYTES + 2 * PACK_ROWS * (1 + MIN as usize), C);
            for b0 in (0..nb).step_by(chunk) {
                for (h, acc_h) in accs.iter_mut().enumerate() {
                    let mut acc = *acc_h;
                    for b in b0..(b0 + chunk).min(nb) {
                        let wp = group.add(b * V * VECTOR_BYTES);
                        if h == 0 {
                            prefetch_block::<V, MIN>(group, b, lim);
                        }
                        let mut w = [_mm256_setzero_si256(); 8];
                        if V == 4 || V == 5 {
                            for g in 0..4 {
                                let v = half_at(wp, g, h);
                                w[g] = _mm256_and_si256(v, nib);
                                w[4 + g] = _mm256_and_si256(_mm256_srli_epi16::<4>(v), nib);
                                if LUT {
                                    w[g] = _mm256_shuffle_epi8(codes, w[g]);
                                    w[4 + g] = _mm256_shuffle_epi8(codes, w[4 + g]);
                                }
                            }
                            if V == 5 {
                                or_high_bits_256(&mut w, half_at(wp, 4, h));
                            }
                        } else {
                            for (g, w) in w.iter_mut().enumerate() {
                                *w = half_at(wp, g, h);
                            }
                        }
                        let dw = half_scales::<V, MIN>(group, nb, b, h, false);
                        for c in 0..C {
                            let sum = $sum8(&w, q[c].add(b * y_block::<MIN>() + y_qs::<MIN>()), V == 5 || LUT);
                            let (dy, ysum) = (*a[c].add(2 * b), *a[c].add(2 * b + 1));
                            let d = _mm256_mul_ps(dw, _mm256_set1_ps(dy));
                            if MIN {
                                let mw = half_scales::<V, MIN>(group, nb, b, h, true);
                                let my = _mm256_mul_ps(mw, _mm256_set1_ps(ysum));
                                acc[c] = _mm256_add_ps(acc[c], _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sum), my));
                            } else {
                                let isum = _mm256_fnmadd_ps(off, _mm256_set1_ps(ysum), _mm256_cvtepi32_ps(sum));
                                acc[c] = _mm256_fmadd_ps(d, isum, acc[c]);
                            }
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
tile_256_kernel!(tile_256_q4, "avx2,fma,f16c", sum8_maddubs);

/// Keeps the sums of one vector step apart from the next: an empty `asm!` (not `pure`, so the compiler
/// keeps such blocks in their order) that takes and gives back each sum in a register. Without it LLVM
/// interleaves all eight vectors of a block column by column, holding `w` and `|w|` of each (sixteen
/// registers) and spilling them to the stack: one load more per product step.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn in_order<const C: usize>(sums: &mut [__m256i; C]) {
    for s in sums.iter_mut() {
        std::arch::asm!("/* {0} */", inout(ymm_reg) * s, options(nomem, nostack, preserves_flags));
    }
}

/// AVX2 for q8_0: the stored codes `q ^ 0x80` flipped back to signed `q`, then ggml's sign trick
/// (`|q|` unsigned against `y` negated where `q < 0`): pairs of at most 2 * 128 * 127 = 32,512, widened by
/// `madd` per vector. The sum is `sum(q * y)` directly, so no offset correction. Vector by vector, every
/// column's sum takes it while it is in a register (`w` and `|w|`, two registers, beside one sum per
/// column): holding the block's eight vectors and their absolute values across the columns would need
/// all sixteen of AVX2's registers and spill.
/// With `LUT` (iq4_nl, mxfp4), the signed values come from the nibbles by `vpshufb` on `lim.table` (value
/// vector `g` being the low nibbles of stored vector `g`, or the high ones of `g - 4`), the rest alike.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile_256_q8<const LUT: bool, const C: usize>(
    lim: Lim,
    nb: usize,
    group: *const u8,
    q: [*const u8; C],
    a: [*const f32; C],
    out: &mut [f32],
) {
    let flip = _mm256_set1_epi8(0x80u8 as i8);
    let ones = _mm256_set1_epi16(1);
    let nib = _mm256_set1_epi8(0x0F);
    let values =
        _mm256_broadcastsi128_si256(_mm_loadu_si128(lim.table.map_or([0; 16], |t| *t).as_ptr() as *const __m128i));
    let v_count = if LUT { 4 } else { 8 };
    let mut accs = [[_mm256_setzero_ps(); C]; 2];
    let chunk = chunk_blocks(v_count * VECTOR_BYTES + 2 * PACK_ROWS, C);
    for b0 in (0..nb).step_by(chunk) {
        for (h, acc_h) in accs.iter_mut().enumerate() {
            let mut acc = *acc_h;
            for b in b0..(b0 + chunk).min(nb) {
                let wp = group.add(b * v_count * VECTOR_BYTES);
                if h == 0 {
                    if LUT {
                        prefetch_block::<4, false>(group, b, lim);
                    } else {
                        prefetch_block::<8, false>(group, b, lim);
                    }
                }
                let y: [*const u8; C] = std::array::from_fn(|c| q[c].add(b * y_block::<false>() + y_qs::<false>()));
                let mut isum = [_mm256_setzero_si256(); C];
                for g in 0..8 {
                    let w = if LUT {
                        let v = half_at(wp, g % 4, h);
                        let n = if g < 4 { v } else { _mm256_srli_epi16::<4>(v) };
                        _mm256_shuffle_epi8(values, _mm256_and_si256(n, nib))
                    } else {
                        _mm256_xor_si256(half_at(wp, g, h), flip)
                    };
                    let aw = _mm256_abs_epi8(w);
                    for c in 0..C {
                        let yc = _mm256_sign_epi8(_mm256_set1_epi32(bcast4(y[c].add(4 * g))), w);
                        isum[c] = _mm256_add_epi32(isum[c], _mm256_madd_epi16(_mm256_maddubs_epi16(aw, yc), ones));
                    }
                    in_order(&mut isum);
                }
                let dw = if LUT {
                    half_scales::<4, false>(group, nb, b, h, false)
                } else {
                    half_scales::<8, false>(group, nb, b, h, false)
                };
                for c in 0..C {
                    let d = _mm256_mul_ps(dw, _mm256_set1_ps(*a[c].add(2 * b)));
                    acc[c] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(isum[c]), acc[c]);
                }
            }
            *acc_h = acc;
        }
    }
    store_halves(&accs, out);
}
