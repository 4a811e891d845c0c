//! Block formats of ggml tensors: layout, dequantization, quantization and dot products.
//!
//! `types` holds the layout table, `blocks` the byte layout of each block. The arithmetic follows
//! llama.cpp's CPU backend: a matrix product quantizes the activations to the weight type's
//! `vec_dot_type` (q8_0, q8_1, q8_K, or f16 / bf16 / f32) and then takes integer-friendly dot products
//! of each weight row with them. `reference` is the scalar implementation of every dot product, used on
//! targets without SIMD and as the oracle in tests; `avx2` is the x86_64 path, chosen once at run time
//! (`avx2_lowbit` for q2_K, q3_K, iq4_nl, iq4_xs and mxfp4, one column at a time).
//!
//! What this module promises:
//! - Dequantization gives exactly ggml's values (same float operations), on every target.
//! - Activation quantization gives the same bytes on every path (ggml-cpu's x86 semantics).
//! - A dot product is deterministic for a given machine, and the multi-column kernels give, for every
//!   column, the same bits as `vec_dot` on that column alone (batch invariance). SIMD and scalar paths
//!   may differ from each other by float rounding only.
//!
//! Lengths: the functions on the hot path (`vec_dot*`, `quantize_row_act`, the attention helpers) take
//! buffers the engine sized itself; they check lengths with `assert!` (a few compares per row, needed
//! because the SIMD kernels read through raw pointers) and panic on a mismatch, which is a bug in the
//! caller. Data from a file goes through `try_dequantize_row`, which returns an error instead.

mod attn;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx2_lowbit;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod blocks;
mod dequant;
mod kquantize;
mod nlquantize;
pub mod packed;
mod quantize;
pub mod reference;
pub mod types;

#[cfg(test)]
mod fixtures;
#[cfg(test)]
mod tests;

use std::sync::OnceLock;

pub use attn::{axpy_f16, axpy_q8_0, dot_f16_f32, dot_q8_0_f32, quantize_q8_0_row, vec_dot_f32};
pub use types::{GgmlType, QK, QK_K};

/// A row length or buffer size that does not fit the type's blocks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum QuantError {
    #[error("{ty}: {n_values} values is not a whole number of {block_len}-value blocks")]
    PartialBlock { ty: GgmlType, n_values: usize, block_len: usize },
    #[error("{ty}: {n_values} values take {need_bytes} bytes, the buffer has {got_bytes}")]
    WrongByteLen { ty: GgmlType, n_values: usize, need_bytes: usize, got_bytes: usize },
    #[error("{ty} has no row-interleaved layout")]
    NotPackable { ty: GgmlType },
}

/// The SIMD path this process uses, detected once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SimdLevel {
    /// The portable scalar code (`reference`).
    Scalar,
    /// x86_64 with AVX2, FMA and F16C.
    Avx2,
    /// The AVX2 path with AVX-512 VNNI's `vpdpbusd` for the integer sums of the legacy formats (on
    /// 256-bit registers, AVX512VL): fewer instructions, the same bits as `Avx2`.
    Avx2Vnni,
    /// `Avx2Vnni`, and the legacy formats' matrix products on 512-bit registers, two weight rows per
    /// register (`avx512`, AVX-512 F and BW): fewer instructions again, the same bits.
    Avx512,
}

impl SimdLevel {
    /// Whether the AVX2 kernels run (also under `Avx2Vnni` and `Avx512`).
    pub fn avx2(self) -> bool {
        matches!(self, SimdLevel::Avx2 | SimdLevel::Avx2Vnni | SimdLevel::Avx512)
    }

    /// Whether the integer sums use AVX-512 VNNI's `vpdpbusd`.
    pub fn vnni(self) -> bool {
        matches!(self, SimdLevel::Avx2Vnni | SimdLevel::Avx512)
    }
}

/// The SIMD path in use: the best this CPU has. `STRATA_SIMD` in the environment caps it, to compare
/// results and speed across paths: `scalar` (the portable code), `avx2` (AVX2 without VNNI) or `avx2vnni`
/// (no 512-bit registers).
pub fn simd_level() -> SimdLevel {
    static LEVEL: OnceLock<SimdLevel> = OnceLock::new();
    *LEVEL.get_or_init(|| {
        let forced = std::env::var("STRATA_SIMD").unwrap_or_default();
        if forced == "scalar" {
            return SimdLevel::Scalar;
        }
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c") {
            if forced == "avx2" || !vnni_detected() {
                return SimdLevel::Avx2;
            }
            if forced == "avx2vnni" || !avx512_detected() {
                return SimdLevel::Avx2Vnni;
            }
            return SimdLevel::Avx512;
        }
        SimdLevel::Scalar
    })
}

/// Whether this CPU has what the `avx512` kernels need: AVX-512 F, BW, VL and VNNI.
#[cfg(target_arch = "x86_64")]
pub fn avx512_detected() -> bool {
    vnni_detected() && is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw")
}

/// Whether this CPU has AVX-512 VNNI with 256-bit forms (AVX512VL).
#[cfg(target_arch = "x86_64")]
pub fn vnni_detected() -> bool {
    is_x86_feature_detected!("avx512vnni") && is_x86_feature_detected!("avx512vl")
}

/// Quantized activations as the products read them: the row's bytes (in the weight type's
/// `vec_dot_type`) and, optionally, `aux` (see `act_aux_len`), f32 copies the SIMD kernels read instead
/// of converting f16 in every weight row. Empty `aux` means none; the result has the same bits either way.
#[derive(Clone, Copy, Debug)]
pub struct ActRow<'a> {
    pub q: &'a [u8],
    pub aux: &'a [f32],
}

impl<'a> ActRow<'a> {
    /// A row without f32 copies.
    pub fn bytes(q: &'a [u8]) -> ActRow<'a> {
        ActRow { q, aux: &[] }
    }
}

/// Length of the f32 copies (`ActRow::aux`) for `n` activations of type `ty_act`: each block's `(d, s)`
/// for q8_0 (s: the sum of the block's quants, exact, which the packed kernels need) and q8_1 (s as
/// stored), the values themselves for f16; none for the other types.
pub fn act_aux_len(ty_act: GgmlType, n: usize) -> usize {
    match ty_act {
        GgmlType::Q8_0 | GgmlType::Q8_1 => 2 * (n / QK),
        GgmlType::F16 => n,
        _ => 0,
    }
}

/// Fills `aux` (of `act_aux_len(ty_act, n)` values) from the quantized row `x_act` of `n` values.
///
/// # Panics
/// When the lengths do not match.
pub fn fill_act_aux(ty_act: GgmlType, n: usize, x_act: &[u8], aux: &mut [f32]) {
    assert_eq!(aux.len(), act_aux_len(ty_act, n), "fill_act_aux: wrong length");
    check_len(ty_act, n, x_act.len()).unwrap_or_else(|e| panic!("fill_act_aux: {e}"));
    match ty_act {
        GgmlType::Q8_0 | GgmlType::Q8_1 => {
            let bb = ty_act.block_bytes();
            for (b, ds) in x_act.chunks_exact(bb).zip(aux.chunks_exact_mut(2)) {
                ds[0] = blocks::f16_at(b, 0);
                ds[1] = if ty_act == GgmlType::Q8_1 {
                    blocks::f16_at(b, 2)
                } else {
                    b[2..].iter().map(|&q| q as i8 as i32).sum::<i32>() as f32
                };
            }
        }
        GgmlType::F16 => dequant::dequantize(GgmlType::F16, x_act, aux),
        _ => {}
    }
}

/// The format activations are quantized to before a dot product with weights of type `ty`.
pub fn vec_dot_type(ty: GgmlType) -> GgmlType {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 | GgmlType::IQ4NL | GgmlType::MXFP4 => GgmlType::Q8_0,
        GgmlType::Q4_1 | GgmlType::Q5_1 => GgmlType::Q8_1,
        GgmlType::Q2K | GgmlType::Q3K | GgmlType::Q4K | GgmlType::Q5K | GgmlType::Q6K | GgmlType::IQ4XS => {
            GgmlType::Q8K
        }
        GgmlType::F16 => GgmlType::F16,
        GgmlType::BF16 => GgmlType::BF16,
        GgmlType::F32 => GgmlType::F32,
        // Activation formats have no dot product of their own; they pair with themselves for checks.
        GgmlType::Q8_1 => GgmlType::Q8_1,
        GgmlType::Q8K => GgmlType::Q8K,
    }
}

/// Bytes of `n_values` values of type `ty`, checked.
pub fn row_len_bytes(ty: GgmlType, n_values: usize) -> Result<usize, QuantError> {
    let block_len = ty.block_len();
    if !n_values.is_multiple_of(block_len) {
        return Err(QuantError::PartialBlock { ty, n_values, block_len });
    }
    Ok(n_values / block_len * ty.block_bytes())
}

fn check_len(ty: GgmlType, n_values: usize, got_bytes: usize) -> Result<(), QuantError> {
    let need_bytes = row_len_bytes(ty, n_values)?;
    if need_bytes != got_bytes {
        return Err(QuantError::WrongByteLen { ty, n_values, need_bytes, got_bytes });
    }
    Ok(())
}

/// Dequantizes `dst.len()` values of type `ty` from `src`, which must hold exactly that many.
pub fn try_dequantize_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    check_len(ty, dst.len(), src.len())?;
    dequant::dequantize(ty, src, dst);
    Ok(())
}

/// Value `i` of a row of type `ty`, as `dequantize_row` would give it.
///
/// # Panics
/// When `i` lies beyond the row.
pub fn dequantize_value(ty: GgmlType, row: &[u8], i: usize) -> f32 {
    assert!(
        (i / ty.block_len() + 1) * ty.block_bytes() <= row.len(),
        "dequantize_value: {ty} value {i} is beyond the row"
    );
    dequant::dequantize_value(ty, row, i)
}

/// Dequantizes `dst.len()` values of type `ty` from `src`, exactly as ggml's `dequantize_row_*`.
///
/// # Panics
/// When `src` does not hold exactly `dst.len()` values (use `try_dequantize_row` for untrusted sizes).
pub fn dequantize_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) {
    if let Err(e) = try_dequantize_row(ty, src, dst) {
        panic!("dequantize_row: {e}");
    }
}

/// Quantizes `x` to weights of type `ty`, with the bytes of ggml's reference quantizers (what
/// llama-quantize writes without an importance matrix). For tests and tools that write models, not for
/// the hot path.
///
/// # Panics
/// When `x.len()` is not a whole number of blocks or `dst` is not exactly its size in bytes.
pub fn quantize_row(ty: GgmlType, x: &[f32], dst: &mut [u8]) {
    if let Err(e) = check_len(ty, x.len(), dst.len()) {
        panic!("quantize_row: {e}");
    }
    quantize::quantize_weights(ty, x, dst);
}

/// Quantizes activations `x` to `ty_act` (a `vec_dot_type`: q8_0, q8_1, q8_K, f16, bf16 or f32), as
/// ggml-cpu does before a matrix product. Every path writes the same bytes.
///
/// # Panics
/// When `x.len()` is not a whole number of blocks or `dst` is not exactly its size in bytes.
pub fn quantize_row_act(ty_act: GgmlType, x: &[f32], dst: &mut [u8]) {
    if let Err(e) = check_len(ty_act, x.len(), dst.len()) {
        panic!("quantize_row_act: {e}");
    }
    match ty_act {
        GgmlType::Q8_0 | GgmlType::Q8_1 => {
            let bb = ty_act.block_bytes();
            let qs_at = if ty_act == GgmlType::Q8_0 { 2 } else { 4 };
            for (xb, b) in x.chunks_exact(QK).zip(dst.chunks_exact_mut(bb)) {
                let (d, sum) = quantize_q8_block(xb, &mut b[qs_at..]);
                blocks::put_f16(b, 0, d);
                if ty_act == GgmlType::Q8_1 {
                    blocks::put_f16(b, 2, d * sum as f32);
                }
            }
        }
        _ => quantize::quantize_weights(ty_act, x, dst),
    }
}

/// One q8 activation block on the fastest path: (d, sum of quants).
#[inline]
fn quantize_q8_block(x: &[f32], qs: &mut [u8]) -> (f32, i32) {
    #[cfg(target_arch = "x86_64")]
    if simd_level().avx2() {
        assert!(x.len() >= QK && qs.len() >= QK);
        // SAFETY: AVX2/FMA/F16C were detected; both buffers hold a whole block.
        return unsafe { avx2::quantize_q8_block(x.as_ptr(), qs.as_mut_ptr()) };
    }
    quantize::q8_act_core(x, &mut qs[..QK])
}

fn check_dot(ty: GgmlType, n: usize, w_len: usize, x_len: usize) {
    let ok = row_len_bytes(ty, n).is_ok_and(|need| w_len >= need)
        && row_len_bytes(vec_dot_type(ty), n).is_ok_and(|need| x_len >= need);
    assert!(ok, "vec_dot {ty}: {n} values do not fit a {w_len}-byte row and {x_len}-byte activations");
}

/// Dot product of `n` values: a weight row of type `ty` with activations already quantized to
/// `vec_dot_type(ty)`, as ggml's `ggml_vec_dot_*`.
///
/// # Panics
/// When `n` is not a whole number of blocks or either buffer is shorter than `n` values.
pub fn vec_dot(ty: GgmlType, n: usize, w_row: &[u8], x_act: &[u8]) -> f32 {
    check_dot(ty, n, w_row.len(), x_act.len());
    let mut out = [0f32];
    if !simd_dot(ty, n, w_row, &[ActRow::bytes(x_act)], &mut out) {
        out[0] = reference::vec_dot(ty, n, w_row, x_act);
    }
    out[0]
}

fn check_act(ty: GgmlType, n: usize, w_len: usize, x: &ActRow) {
    check_dot(ty, n, w_len, x.q.len());
    let aux = act_aux_len(vec_dot_type(ty), n);
    assert!(x.aux.is_empty() || x.aux.len() >= aux, "vec_dot {ty}: {} f32 copies, {aux} needed", x.aux.len());
}

/// Dot products of consecutive weight rows with one activation column: `out[r] = vec_dot(ty, n,
/// w_rows[r * row_bytes..], x.q)`, bit for bit, with the checks and the dispatch done once (the decode
/// path's inner loop).
///
/// # Panics
/// When `w_rows` does not hold `out.len()` rows of `row_bytes`, or as `vec_dot`.
pub fn vec_dot_rows(ty: GgmlType, n: usize, w_rows: &[u8], row_bytes: usize, x: ActRow, out: &mut [f32]) {
    vec_dot_tile(ty, n, w_rows, row_bytes, &[x], out);
}

/// Dot products of one weight row with several activation columns: `out[c] = vec_dot(ty, n, w_row,
/// xs[c].q)`, bit for bit, but each weight block is unpacked once for up to four columns.
///
/// # Panics
/// As `vec_dot`, for any column; and when `out.len() != xs.len()`.
pub fn vec_dot_multi(ty: GgmlType, n: usize, w_row: &[u8], xs: &[ActRow], out: &mut [f32]) {
    assert_eq!(xs.len(), out.len(), "vec_dot_multi: one output per column");
    for x in xs {
        check_act(ty, n, w_row.len(), x);
    }
    for (xs, out) in xs.chunks(4).zip(out.chunks_mut(4)) {
        if !simd_dot(ty, n, w_row, xs, out) {
            for (x, o) in xs.iter().zip(out.iter_mut()) {
                *o = reference::vec_dot(ty, n, w_row, x.q);
            }
        }
    }
}

/// Dot products of `n_rows` consecutive weight rows with a few activation columns, column-major: `out[c *
/// n_rows + r] = vec_dot(ty, n, w_rows[r * row_bytes..], xs[c].q)`, bit for bit, with the checks and the
/// dispatch done once for the tile (the matrix product's inner loop; a column's results are contiguous,
/// as the product's output is per token).
///
/// # Panics
/// When `w_rows` does not hold `n_rows` rows of `row_bytes`, `out` is not `n_rows * xs.len()` long, or
/// as `vec_dot` for any column.
pub fn vec_dot_tile(ty: GgmlType, n: usize, w_rows: &[u8], row_bytes: usize, xs: &[ActRow], out: &mut [f32]) {
    let n_cols = xs.len();
    assert!(n_cols > 0 && out.len().is_multiple_of(n_cols), "vec_dot_tile: {} outputs for {n_cols} columns", out.len());
    let n_rows = out.len() / n_cols;
    assert!(w_rows.len() >= n_rows * row_bytes, "vec_dot_tile: {n_rows} rows do not fit {} bytes", w_rows.len());
    for x in xs {
        check_act(ty, n, row_bytes, x);
    }
    #[cfg(target_arch = "x86_64")]
    if simd_level().avx2() && has_block_kernel(ty) {
        let vnni = simd_level().vnni();
        let nb = n / ty.block_len();
        let all = 0..n_rows;
        // SAFETY: features detected (VNNI only when `vnni`); every row and column holds `nb` blocks and
        // each column's `aux` is empty or complete (checked above).
        unsafe {
            if simd_level() == SimdLevel::Avx512 {
                match ty {
                    GgmlType::Q4_0 => return tile_pairs::<{ avx2::Q4_0 }>(nb, w_rows, row_bytes, xs, out),
                    GgmlType::Q4_1 => return tile_pairs::<{ avx2::Q4_1 }>(nb, w_rows, row_bytes, xs, out),
                    GgmlType::Q5_0 => return tile_pairs::<{ avx2::Q5_0 }>(nb, w_rows, row_bytes, xs, out),
                    GgmlType::Q5_1 => return tile_pairs::<{ avx2::Q5_1 }>(nb, w_rows, row_bytes, xs, out),
                    GgmlType::Q8_0 => return tile_pairs::<{ avx2::Q8_0 }>(nb, w_rows, row_bytes, xs, out),
                    _ => {}
                }
            }
            match ty {
                GgmlType::Q4_0 => tile_cols::<{ avx2::Q4_0 }>(nb, w_rows, row_bytes, xs, vnni, all, out),
                GgmlType::Q4_1 => tile_cols::<{ avx2::Q4_1 }>(nb, w_rows, row_bytes, xs, vnni, all, out),
                GgmlType::Q5_0 => tile_cols::<{ avx2::Q5_0 }>(nb, w_rows, row_bytes, xs, vnni, all, out),
                GgmlType::Q5_1 => tile_cols::<{ avx2::Q5_1 }>(nb, w_rows, row_bytes, xs, vnni, all, out),
                GgmlType::Q8_0 => tile_cols::<{ avx2::Q8_0 }>(nb, w_rows, row_bytes, xs, vnni, all, out),
                GgmlType::Q4K => tile_cols::<{ avx2::Q4_K }>(nb, w_rows, row_bytes, xs, vnni, all, out),
                GgmlType::Q5K => tile_cols::<{ avx2::Q5_K }>(nb, w_rows, row_bytes, xs, vnni, all, out),
                GgmlType::Q6K => tile_cols::<{ avx2::Q6_K }>(nb, w_rows, row_bytes, xs, vnni, all, out),
                _ => unreachable!("has_block_kernel lists the types above"),
            }
        }
        return;
    }
    let mut dots = [0f32; 4];
    for r in 0..n_rows {
        let row = &w_rows[r * row_bytes..(r + 1) * row_bytes];
        for (g, xs) in xs.chunks(4).enumerate() {
            let dots = &mut dots[..xs.len()];
            if !simd_dot(ty, n, row, xs, dots) {
                for (x, o) in xs.iter().zip(dots.iter_mut()) {
                    *o = reference::vec_dot(ty, n, row, x.q);
                }
            }
            for (c, &d) in dots.iter().enumerate() {
                out[(4 * g + c) * n_rows + r] = d;
            }
        }
    }
}

/// Whether `ty` has an AVX2 block kernel (`avx2::dot_blocks`); the other types (the float types, and
/// q2_K, q3_K, iq4_nl, iq4_xs and mxfp4, whose `avx2_lowbit` kernels take one column at a time) take the
/// per-row path.
#[cfg(target_arch = "x86_64")]
fn has_block_kernel(ty: GgmlType) -> bool {
    matches!(
        ty,
        GgmlType::Q4_0
            | GgmlType::Q4_1
            | GgmlType::Q5_0
            | GgmlType::Q5_1
            | GgmlType::Q8_0
            | GgmlType::Q4K
            | GgmlType::Q5K
            | GgmlType::Q6K
    )
}

/// The tile of `vec_dot_tile` for a block format, over its rows `rows`: columns in groups of up to four,
/// each group's pointers set up once for all rows; `out` is the whole tile's, column-major.
///
/// # Safety
/// AVX2/FMA/F16C present (and VNNI when `vnni`); every row and column holds `nb` blocks.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile_cols<const K: u8>(
    nb: usize,
    w: &[u8],
    rb: usize,
    xs: &[ActRow],
    vnni: bool,
    rows: std::ops::Range<usize>,
    out: &mut [f32],
) {
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn group<const K: u8, const C: usize>(
        nb: usize,
        w: &[u8],
        rb: usize,
        xs: &[ActRow],
        c0: usize,
        vnni: bool,
        rows: std::ops::Range<usize>,
        out: &mut [f32],
    ) {
        let n_rows = out.len() / xs.len();
        let (q, ds) = group_pointers::<C>(&xs[c0..c0 + C]);
        let cols = avx2::Cols { q: &q, ds: &ds };
        let mut dots = [0f32; C];
        for r in rows {
            avx2::dot_blocks::<K, C>(nb, w.as_ptr().add(r * rb), cols, vnni, &mut dots);
            for (c, &d) in dots.iter().enumerate() {
                out[(c0 + c) * n_rows + r] = d;
            }
        }
    }
    let mut c0 = 0;
    while c0 < xs.len() {
        let r = rows.clone();
        match xs.len() - c0 {
            1 => group::<K, 1>(nb, w, rb, xs, c0, vnni, r, out),
            2 => group::<K, 2>(nb, w, rb, xs, c0, vnni, r, out),
            3 => group::<K, 3>(nb, w, rb, xs, c0, vnni, r, out),
            _ => group::<K, 4>(nb, w, rb, xs, c0, vnni, r, out),
        }
        c0 += 4;
    }
}

/// The quant pointers of a group of `C` columns and their f32 scales' pointers: all of them where every
/// column has its scales, else all null (the kernels then read the scales from the blocks).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn group_pointers<const C: usize>(xs: &[ActRow]) -> ([*const u8; C], [*const f32; C]) {
    let pre = xs.iter().all(|x| !x.aux.is_empty());
    let q = std::array::from_fn(|c| xs[c].q.as_ptr());
    let ds = std::array::from_fn(|c| if pre { xs[c].aux.as_ptr() } else { std::ptr::null() });
    (q, ds)
}

/// Activation columns one call of the `avx512` kernel takes: 8 accumulators of 512 bits and their `m * s`
/// sums stay in registers.
#[cfg(target_arch = "x86_64")]
const PAIR_COLS: usize = 8;

/// The tile of `vec_dot_tile` for a legacy format on the `avx512` path: rows in pairs (an odd last row
/// takes `tile_cols`), columns in groups of up to `PAIR_COLS`, each result with `tile_cols`'s bits;
/// `out` column-major.
///
/// # Safety
/// The `avx512` kernels' features present (`avx512_detected`); every row and column holds `nb` blocks.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn tile_pairs<const K: u8>(nb: usize, w: &[u8], rb: usize, xs: &[ActRow], out: &mut [f32]) {
    #[inline(always)]
    unsafe fn group<const K: u8, const C: usize>(
        nb: usize,
        w: &[u8],
        rb: usize,
        xs: &[ActRow],
        c0: usize,
        out: &mut [f32],
    ) {
        let n_rows = out.len() / xs.len();
        let (q, ds) = group_pointers::<C>(&xs[c0..c0 + C]);
        let cols = avx2::Cols { q: &q, ds: &ds };
        let (mut d0, mut d1) = ([0f32; C], [0f32; C]);
        for r in (0..n_rows / 2 * 2).step_by(2) {
            let (p0, p1) = (w.as_ptr().add(r * rb), w.as_ptr().add((r + 1) * rb));
            avx512::dot_pair::<K, C>(nb, p0, p1, cols, &mut d0, &mut d1);
            for c in 0..C {
                out[(c0 + c) * n_rows + r] = d0[c];
                out[(c0 + c) * n_rows + r + 1] = d1[c];
            }
        }
    }
    let n_cols = xs.len();
    let n_rows = out.len() / n_cols;
    let mut c0 = 0;
    while c0 < n_cols {
        let c = (n_cols - c0).min(PAIR_COLS);
        match c {
            1 => group::<K, 1>(nb, w, rb, xs, c0, out),
            2 => group::<K, 2>(nb, w, rb, xs, c0, out),
            3 => group::<K, 3>(nb, w, rb, xs, c0, out),
            4 => group::<K, 4>(nb, w, rb, xs, c0, out),
            5 => group::<K, 5>(nb, w, rb, xs, c0, out),
            6 => group::<K, 6>(nb, w, rb, xs, c0, out),
            7 => group::<K, 7>(nb, w, rb, xs, c0, out),
            _ => group::<K, 8>(nb, w, rb, xs, c0, out),
        }
        c0 += c;
    }
    if n_rows % 2 == 1 {
        tile_cols::<K>(nb, w, rb, xs, true, n_rows - 1..n_rows, out);
    }
}

/// Runs the SIMD kernel for up to four columns when there is one; false when the caller must fall back.
/// Lengths are checked by the caller.
#[inline]
#[allow(unused_variables)]
fn simd_dot(ty: GgmlType, n: usize, w: &[u8], xs: &[ActRow], out: &mut [f32]) -> bool {
    #[cfg(target_arch = "x86_64")]
    if simd_level().avx2() {
        use avx2::*;
        let nb = n / ty.block_len();
        let vnni = simd_level().vnni();
        // SAFETY: features detected (VNNI only when `vnni`); `check_dot` guaranteed `nb` blocks in `w`
        // and in every column, and each column's `aux` is empty or complete.
        unsafe {
            match ty {
                GgmlType::Q4_0 => block_cols::<Q4_0>(nb, w, xs, vnni, out),
                GgmlType::Q4_1 => block_cols::<Q4_1>(nb, w, xs, vnni, out),
                GgmlType::Q5_0 => block_cols::<Q5_0>(nb, w, xs, vnni, out),
                GgmlType::Q5_1 => block_cols::<Q5_1>(nb, w, xs, vnni, out),
                GgmlType::Q8_0 => block_cols::<Q8_0>(nb, w, xs, vnni, out),
                GgmlType::Q4K => block_cols::<Q4_K>(nb, w, xs, vnni, out),
                GgmlType::Q5K => block_cols::<Q5_K>(nb, w, xs, vnni, out),
                GgmlType::Q6K => block_cols::<Q6_K>(nb, w, xs, vnni, out),
                GgmlType::F32 => {
                    for (x, o) in xs.iter().zip(out.iter_mut()) {
                        *o = dot_f32(n, w.as_ptr() as *const f32, x.q.as_ptr() as *const f32);
                    }
                }
                GgmlType::F16 => f16_cols(n, w, xs, out),
                GgmlType::IQ4NL | GgmlType::MXFP4 => {
                    let table =
                        if ty == GgmlType::IQ4NL { avx2_lowbit::Table::Iq4Nl } else { avx2_lowbit::Table::Mxfp4 };
                    for (x, o) in xs.iter().zip(out.iter_mut()) {
                        *o = avx2_lowbit::dot(table, nb, w.as_ptr(), x.q.as_ptr());
                    }
                }
                GgmlType::IQ4XS | GgmlType::Q2K | GgmlType::Q3K => {
                    let dot = match ty {
                        GgmlType::IQ4XS => avx2_lowbit::dot_iq4_xs,
                        GgmlType::Q2K => avx2_lowbit::dot_q2_k,
                        _ => avx2_lowbit::dot_q3_k,
                    };
                    for (x, o) in xs.iter().zip(out.iter_mut()) {
                        *o = dot(nb, w.as_ptr(), x.q.as_ptr());
                    }
                }
                _ => return false,
            }
        }
        return true;
    }
    false
}

/// f16 weights against up to four columns: two at a time from their f32 copies where every column has
/// them, else one at a time from the f16 bytes.
///
/// # Safety
/// AVX2/FMA/F16C present; `w` and every column hold `n` values.
#[cfg(target_arch = "x86_64")]
#[inline]
unsafe fn f16_cols(n: usize, w: &[u8], xs: &[ActRow], out: &mut [f32]) {
    let a = w.as_ptr() as *const u16;
    if xs.iter().all(|x| !x.aux.is_empty()) {
        for (xs, out) in xs.chunks(2).zip(out.chunks_mut(2)) {
            if let [x0, x1] = xs {
                avx2::dot_f16_cols::<2>(n, a, &[x0.aux.as_ptr(), x1.aux.as_ptr()], out);
            } else {
                avx2::dot_f16_cols::<1>(n, a, &[xs[0].aux.as_ptr()], out);
            }
        }
        return;
    }
    for (x, o) in xs.iter().zip(out.iter_mut()) {
        *o = avx2::dot_f16(n, a, x.q.as_ptr() as *const u16, std::ptr::null());
    }
}

/// Dispatches 1..=4 columns to the const-generic kernel, with their f32 scales where every column has
/// them.
///
/// # Safety
/// AVX2/FMA/F16C present (and VNNI when `vnni`); `w` and every column hold `nb` blocks.
#[cfg(target_arch = "x86_64")]
#[inline]
unsafe fn block_cols<const K: u8>(nb: usize, w: &[u8], xs: &[ActRow], vnni: bool, out: &mut [f32]) {
    let w = w.as_ptr();
    let pre = xs.iter().all(|x| !x.aux.is_empty());
    let ds = |i: usize| if pre { xs[i].aux.as_ptr() } else { std::ptr::null() };
    let q = |i: usize| xs[i].q.as_ptr();
    match xs.len() {
        1 => avx2::dot_blocks::<K, 1>(nb, w, avx2::Cols { q: &[q(0)], ds: &[ds(0)] }, vnni, out),
        2 => avx2::dot_blocks::<K, 2>(nb, w, avx2::Cols { q: &[q(0), q(1)], ds: &[ds(0), ds(1)] }, vnni, out),
        3 => {
            let cols = avx2::Cols { q: &[q(0), q(1), q(2)], ds: &[ds(0), ds(1), ds(2)] };
            avx2::dot_blocks::<K, 3>(nb, w, cols, vnni, out)
        }
        _ => {
            let cols = avx2::Cols { q: &[q(0), q(1), q(2), q(3)], ds: &[ds(0), ds(1), ds(2), ds(3)] };
            avx2::dot_blocks::<K, 4>(nb, w, cols, vnni, out)
        }
    }
}
