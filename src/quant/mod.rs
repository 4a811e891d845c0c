//! Block formats of ggml tensors: layout, dequantization, quantization and dot products.
//!
//! `types` holds the layout table, `blocks` the byte layout of each block. The arithmetic follows
//! llama.cpp's CPU backend: a matrix product quantizes the activations to the weight type's
//! `vec_dot_type` (q8_0, q8_1, q8_K, or f16 / bf16 / f32) and then takes integer-friendly dot products
//! of each weight row with them. `reference` is the scalar implementation of every dot product, used on
//! targets without SIMD and as the oracle in tests; `avx2` is the x86_64 path, chosen once at run time.
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
mod blocks;
mod dequant;
mod quantize;
pub mod reference;
pub mod types;

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
}

/// The SIMD path this process uses, detected once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SimdLevel {
    /// The portable scalar code (`reference`).
    Scalar,
    /// x86_64 with AVX2, FMA and F16C.
    Avx2,
}

/// The SIMD path in use. Setting `STRATA_SIMD=scalar` in the environment forces the scalar path, which
/// helps to compare results across paths.
pub fn simd_level() -> SimdLevel {
    static LEVEL: OnceLock<SimdLevel> = OnceLock::new();
    *LEVEL.get_or_init(|| {
        if std::env::var("STRATA_SIMD").is_ok_and(|v| v == "scalar") {
            return SimdLevel::Scalar;
        }
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c") {
            return SimdLevel::Avx2;
        }
        SimdLevel::Scalar
    })
}

/// The format activations are quantized to before a dot product with weights of type `ty`.
pub fn vec_dot_type(ty: GgmlType) -> GgmlType {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => GgmlType::Q8_0,
        GgmlType::Q4_1 | GgmlType::Q5_1 => GgmlType::Q8_1,
        GgmlType::Q4K | GgmlType::Q5K | GgmlType::Q6K => GgmlType::Q8K,
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
    if n_values % block_len != 0 {
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

/// Quantizes `x` to weights of type `ty` (ggml's `_ref` quantizers for q4_0 .. q8_0, a simple min/max
/// scheme for the K-quants). For tests and tools that write models, not for the hot path.
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
    if simd_level() == SimdLevel::Avx2 {
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
    if !simd_dot(ty, n, w_row, &[x_act], &mut out) {
        out[0] = reference::vec_dot(ty, n, w_row, x_act);
    }
    out[0]
}

/// Dot products of consecutive weight rows with one activation column: `out[r] = vec_dot(ty, n,
/// w_rows[r * row_bytes..], x_act)`, bit for bit, with the checks and the dispatch done once (the decode
/// path's inner loop).
///
/// # Panics
/// When `w_rows` does not hold `out.len()` rows of `row_bytes`, or as `vec_dot`.
pub fn vec_dot_rows(ty: GgmlType, n: usize, w_rows: &[u8], row_bytes: usize, x_act: &[u8], out: &mut [f32]) {
    assert!(
        w_rows.len() >= out.len() * row_bytes,
        "vec_dot_rows: {} rows do not fit {} bytes",
        out.len(),
        w_rows.len()
    );
    check_dot(ty, n, row_bytes, x_act.len());
    #[cfg(target_arch = "x86_64")]
    if simd_level() == SimdLevel::Avx2 {
        // SAFETY: features detected; every row holds `nb` blocks (checked above), as does `x_act`.
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn rows<const K: u8>(nb: usize, w: &[u8], rb: usize, x: &[u8], out: &mut [f32]) {
            for (r, o) in out.iter_mut().enumerate() {
                avx2::dot_blocks::<K, 1>(nb, w.as_ptr().add(r * rb), &[x.as_ptr()], std::slice::from_mut(o));
            }
        }
        let nb = n / ty.block_len();
        unsafe {
            match ty {
                GgmlType::Q4_0 => return rows::<{ avx2::Q4_0 }>(nb, w_rows, row_bytes, x_act, out),
                GgmlType::Q4_1 => return rows::<{ avx2::Q4_1 }>(nb, w_rows, row_bytes, x_act, out),
                GgmlType::Q5_0 => return rows::<{ avx2::Q5_0 }>(nb, w_rows, row_bytes, x_act, out),
                GgmlType::Q5_1 => return rows::<{ avx2::Q5_1 }>(nb, w_rows, row_bytes, x_act, out),
                GgmlType::Q8_0 => return rows::<{ avx2::Q8_0 }>(nb, w_rows, row_bytes, x_act, out),
                GgmlType::Q4K => return rows::<{ avx2::Q4_K }>(nb, w_rows, row_bytes, x_act, out),
                GgmlType::Q5K => return rows::<{ avx2::Q5_K }>(nb, w_rows, row_bytes, x_act, out),
                GgmlType::Q6K => return rows::<{ avx2::Q6_K }>(nb, w_rows, row_bytes, x_act, out),
                _ => {}
            }
        }
    }
    for (r, o) in out.iter_mut().enumerate() {
        *o = vec_dot(ty, n, &w_rows[r * row_bytes..(r + 1) * row_bytes], x_act);
    }
}

/// Dot products of one weight row with several activation columns: `out[c] = vec_dot(ty, n, w_row,
/// xs[c])`, bit for bit, but each weight block is unpacked once for up to four columns.
///
/// # Panics
/// As `vec_dot`, for any column; and when `out.len() != xs.len()`.
pub fn vec_dot_multi(ty: GgmlType, n: usize, w_row: &[u8], xs: &[&[u8]], out: &mut [f32]) {
    assert_eq!(xs.len(), out.len(), "vec_dot_multi: one output per column");
    for x in xs {
        check_dot(ty, n, w_row.len(), x.len());
    }
    for (xs, out) in xs.chunks(4).zip(out.chunks_mut(4)) {
        if !simd_dot(ty, n, w_row, xs, out) {
            for (x, o) in xs.iter().zip(out.iter_mut()) {
                *o = reference::vec_dot(ty, n, w_row, x);
            }
        }
    }
}

/// Runs the SIMD kernel for up to four columns when there is one; false when the caller must fall back.
/// Lengths are checked by the caller.
#[inline]
#[allow(unused_variables)]
fn simd_dot(ty: GgmlType, n: usize, w: &[u8], xs: &[&[u8]], out: &mut [f32]) -> bool {
    #[cfg(target_arch = "x86_64")]
    if simd_level() == SimdLevel::Avx2 {
        use avx2::*;
        let nb = n / ty.block_len();
        // SAFETY: features detected; `check_dot` guaranteed `nb` blocks in `w` and in every column.
        unsafe {
            match ty {
                GgmlType::Q4_0 => block_cols::<Q4_0>(nb, w, xs, out),
                GgmlType::Q4_1 => block_cols::<Q4_1>(nb, w, xs, out),
                GgmlType::Q5_0 => block_cols::<Q5_0>(nb, w, xs, out),
                GgmlType::Q5_1 => block_cols::<Q5_1>(nb, w, xs, out),
                GgmlType::Q8_0 => block_cols::<Q8_0>(nb, w, xs, out),
                GgmlType::Q4K => block_cols::<Q4_K>(nb, w, xs, out),
                GgmlType::Q5K => block_cols::<Q5_K>(nb, w, xs, out),
                GgmlType::Q6K => block_cols::<Q6_K>(nb, w, xs, out),
                GgmlType::F32 => {
                    for (x, o) in xs.iter().zip(out.iter_mut()) {
                        *o = dot_f32(n, w.as_ptr() as *const f32, x.as_ptr() as *const f32);
                    }
                }
                GgmlType::F16 => {
                    for (x, o) in xs.iter().zip(out.iter_mut()) {
                        let (a, b) = (w.as_ptr() as *const u16, x.as_ptr() as *const u16);
                        *o = dot_f16(n, a, b, std::ptr::null());
                    }
                }
                _ => return false,
            }
        }
        return true;
    }
    false
}

/// Dispatches 1..=4 columns to the const-generic kernel.
///
/// # Safety
/// AVX2/FMA/F16C present; `w` and every column hold `nb` blocks.
#[cfg(target_arch = "x86_64")]
#[inline]
unsafe fn block_cols<const K: u8>(nb: usize, w: &[u8], xs: &[&[u8]], out: &mut [f32]) {
    let w = w.as_ptr();
    match xs.len() {
        1 => avx2::dot_blocks::<K, 1>(nb, w, &[xs[0].as_ptr()], out),
        2 => avx2::dot_blocks::<K, 2>(nb, w, &[xs[0].as_ptr(), xs[1].as_ptr()], out),
        3 => {
            let p = [xs[0].as_ptr(), xs[1].as_ptr(), xs[2].as_ptr()];
            avx2::dot_blocks::<K, 3>(nb, w, &p, out)
        }
        _ => {
            let p = [xs[0].as_ptr(), xs[1].as_ptr(), xs[2].as_ptr(), xs[3].as_ptr()];
            avx2::dot_blocks::<K, 4>(nb, w, &p, out)
        }
    }
}
