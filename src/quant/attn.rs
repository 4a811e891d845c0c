//! Dense helpers for attention: f32 and f16 dot products, `axpy` into f32, and the same over q8_0 blocks
//! (the `--kv int8` cache stores keys and values as q8_0 rows: 32 i8 values and one f16 scale).
//!
//! Each function works on one row at a time and its result depends only on that row's values, never on
//! how many rows a caller processes together; elementwise ops (`axpy_*`) give each element the same
//! operation wherever it sits in the slice. The SIMD path (AVX2 + FMA + F16C) and the scalar path may
//! differ by float rounding only.
//!
//! Lengths are the engine's own (head sizes); mismatches panic with `assert!`.

use super::blocks::f16_at;
use super::QK;
use half::f16;

#[cfg(target_arch = "x86_64")]
use super::avx2;

#[cfg(target_arch = "x86_64")]
fn avx2() -> bool {
    super::simd_level().avx2()
}

/// `sum(a[i] * b[i])`, as ggml's `ggml_vec_dot_f32`.
///
/// # Panics
/// When the lengths differ.
pub fn vec_dot_f32(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "vec_dot_f32: lengths differ");
    #[cfg(target_arch = "x86_64")]
    if avx2() {
        // SAFETY: features detected; both slices hold `a.len()` values.
        return unsafe { avx2::dot_f32(a.len(), a.as_ptr(), b.as_ptr()) };
    }
    let mut sum = 0f64;
    for (x, y) in a.iter().zip(b) {
        sum += (x * y) as f64;
    }
    sum as f32
}

/// `sum(k[i] * q[i])` with f16 keys and f32 queries.
///
/// # Panics
/// When the lengths differ.
pub fn dot_f16_f32(k: &[f16], q: &[f32]) -> f32 {
    assert_eq!(k.len(), q.len(), "dot_f16_f32: lengths differ");
    #[cfg(target_arch = "x86_64")]
    if avx2() {
        let kp = k.as_ptr() as *const u16;
        // SAFETY: features detected; f16 is a transparent u16; both slices hold `k.len()` values.
        return unsafe { avx2::dot_f16(k.len(), kp, std::ptr::null(), q.as_ptr()) };
    }
    let mut sum = 0f64;
    for (x, y) in k.iter().zip(q) {
        sum += (x.to_f32() * y) as f64;
    }
    sum as f32
}

/// `dst[i] += a * v[i]` with f16 `v` (one fused multiply-add per element on the SIMD path).
///
/// # Panics
/// When the lengths differ.
pub fn axpy_f16(dst: &mut [f32], a: f32, v: &[f16]) {
    assert_eq!(dst.len(), v.len(), "axpy_f16: lengths differ");
    #[cfg(target_arch = "x86_64")]
    if avx2() {
        // SAFETY: features detected; both slices hold `dst.len()` values.
        unsafe { avx2::axpy_f16(dst.len(), dst.as_mut_ptr(), a, v.as_ptr() as *const u16) };
        return;
    }
    for (d, x) in dst.iter_mut().zip(v) {
        *d += a * x.to_f32();
    }
}

/// Quantizes `x` to q8_0 blocks (the activation quantizer: the same bytes as `quantize_row_act`).
///
/// # Panics
/// When `x.len()` is not a multiple of 32 or `dst.len() != x.len() / 32 * 34`.
pub fn quantize_q8_0_row(x: &[f32], dst: &mut [u8]) {
    super::quantize_row_act(super::GgmlType::Q8_0, x, dst);
}

fn check_q8_0(what: &str, n_values: usize, blocks_len: usize) -> usize {
    let nb = n_values / QK;
    assert!(
        n_values.is_multiple_of(QK) && blocks_len == nb * 34,
        "{what}: {n_values} values need {} bytes of q8_0 blocks, got {blocks_len}",
        n_values.div_ceil(QK) * 34
    );
    nb
}

/// `sum(k[i] * q[i])` with `k` in q8_0 blocks and `q` in f32: per block the f32 sum of `k_i * q_i`
/// times the block's scale.
///
/// # Panics
/// When `q.len()` is not a multiple of 32 or `k_blocks` does not hold exactly that many values.
pub fn dot_q8_0_f32(k_blocks: &[u8], q: &[f32]) -> f32 {
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
    let nb = check_q8_0("dot_q8_0_f32", q.len(), k_blocks.len());
    #[cfg(target_arch = "x86_64")]
    if avx2() {
        // SAFETY: features detected; `nb` blocks and `32 * nb` values are present.
        return unsafe { avx2::dot_q8_0_f32(nb, k_blocks.as_ptr(), q.as_ptr()) };
    }
    let mut sum = 0f32;
    for (b, q) in k_blocks.chunks_exact(34).zip(q.chunks_exact(QK)) {
        let mut s = 0f32;
        for (k, q) in b[2..].iter().zip(q) {
            s += *k as i8 as f32 * q;
        }
        sum += f16_at(b, 0) * s;
    }
    sum
}

/// `dst[i] += a * v[i]` with `v` in q8_0 blocks (per block, `a * d` first, then one multiply-add).
///
/// # Panics
/// When `dst.len()` is not a multiple of 32 or `v_blocks` does not hold exactly that many values.
pub fn axpy_q8_0(dst: &mut [f32], a: f32, v_blocks: &[u8]) {
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
    let nb = check_q8_0("axpy_q8_0", dst.len(), v_blocks.len());
    #[cfg(target_arch = "x86_64")]
    if avx2() {
        // SAFETY: features detected; `nb` blocks and `32 * nb` values are present.
        unsafe { avx2::axpy_q8_0(nb, dst.as_mut_ptr(), a, v_blocks.as_ptr()) };
        return;
    }
    for (b, d) in v_blocks.chunks_exact(34).zip(dst.chunks_exact_mut(QK)) {
        let ad = a * f16_at(b, 0);
        for (k, d) in b[2..].iter().zip(d) {
            *d += ad * *k as i8 as f32;
        }
    }
}
