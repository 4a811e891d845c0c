//! Scalar reference dot products: one weight row against one activation row in its `vec_dot_type`.
//!
//! Each function follows ggml-cpu's `ggml_vec_dot_*_generic` operation for operation (integer sums per
//! block, then the same float multiplies and adds in the same order), so this is both the portable path
//! on non-x86 targets and the oracle the SIMD paths are tested against. Lengths are checked by the
//! caller (`quant::vec_dot`); here `n` is a whole number of blocks.

use super::blocks::*;
use super::types::{GgmlType, QK, QK_K};

/// Dot of `n` values: weights of type `ty` in `w`, activations of `vec_dot_type(ty)` in `x`.
pub fn vec_dot(ty: GgmlType, n: usize, w: &[u8], x: &[u8]) -> f32 {
    match ty {
        GgmlType::F32 => dot_f32(n, w, x),
        GgmlType::F16 => dot_half(n, w, x, |b| half::f16::from_bits(b).to_f32()),
        GgmlType::BF16 => dot_half(n, w, x, |b| f32::from_bits((b as u32) << 16)),
        GgmlType::Q4_0 => blocks(n / QK, w, 18, x, 34, q4_0),
        GgmlType::Q4_1 => blocks(n / QK, w, 20, x, 36, q4_1),
        GgmlType::Q5_0 => blocks(n / QK, w, 22, x, 34, q5_0),
        GgmlType::Q5_1 => blocks(n / QK, w, 24, x, 36, q5_1),
        GgmlType::Q8_0 => blocks(n / QK, w, 34, x, 34, q8_0),
        GgmlType::Q4K => k_quant(n / QK_K, w, 144, x, q4_k_unpack),
        GgmlType::Q5K => k_quant(n / QK_K, w, 176, x, q5_k_unpack),
        GgmlType::Q6K => q6_k(n / QK_K, w, x),
        GgmlType::Q2K => q2_k(n / QK_K, w, x),
        GgmlType::Q3K => q3_k(n / QK_K, w, x),
        GgmlType::IQ4NL => blocks(n / QK, w, 18, x, 34, iq4_nl),
        GgmlType::IQ4XS => iq4_xs(n / QK_K, w, x),
        GgmlType::MXFP4 => blocks(n / QK, w, 17, x, 34, mxfp4),
        GgmlType::Q8_1 | GgmlType::Q8K => unreachable!("{ty} is an activation type"),
    }
}

/// `ggml_vec_dot_f32` without SIMD: f32 products summed in f64.
pub fn dot_f32(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let mut sum = 0f64;
    for i in 0..n {
        sum += (f32_at(w, 4 * i) * f32_at(x, 4 * i)) as f64;
    }
    sum as f32
}

fn dot_half(n: usize, w: &[u8], x: &[u8], cvt: fn(u16) -> f32) -> f32 {
    let at = |b: &[u8], i: usize| cvt(u16::from_le_bytes([b[2 * i], b[2 * i + 1]]));
    let mut sum = 0f64;
    for i in 0..n {
        sum += (at(w, i) * at(x, i)) as f64;
    }
    sum as f32
}

/// Sums `f(weight block, activation block)` over the legacy 32-value blocks, in block order.
#[inline(always)]
fn blocks(nb: usize, w: &[u8], wb: usize, x: &[u8], xb: usize, f: fn(&[u8], &[u8]) -> f32) -> f32 {
    let mut sum = 0f32;
    for i in 0..nb {
        sum += f(&w[i * wb..(i + 1) * wb], &x[i * xb..(i + 1) * xb]);
    }
    sum
}

#[inline(always)]
fn y_at(y: &[u8], off: usize, j: usize) -> i32 {
    y[off + j] as i8 as i32
}

fn q4_0(w: &[u8], y: &[u8]) -> f32 {
    let (mut s0, mut s1) = (0i32, 0i32);
    for j in 0..QK / 2 {
        s0 += ((w[2 + j] & 0xF) as i32 - 8) * y_at(y, 2, j);
        s1 += ((w[2 + j] >> 4) as i32 - 8) * y_at(y, 2, j + 16);
    }
    (s0 + s1) as f32 * f16_at(w, 0) * f16_at(y, 0)
}

fn q4_1(w: &[u8], y: &[u8]) -> f32 {
    let (mut s0, mut s1) = (0i32, 0i32);
    for j in 0..QK / 2 {
        s0 += (w[4 + j] & 0xF) as i32 * y_at(y, 4, j);
        s1 += (w[4 + j] >> 4) as i32 * y_at(y, 4, j + 16);
    }
    (f16_at(w, 0) * f16_at(y, 0)) * (s0 + s1) as f32 + f16_at(w, 2) * f16_at(y, 2)
}

fn q5_0(w: &[u8], y: &[u8]) -> f32 {
    let qh = u32_at(w, 2);
    let (mut s0, mut s1) = (0i32, 0i32);
    for j in 0..QK / 2 {
        let h0 = (((qh >> j) << 4) & 0x10) as u8;
        let h1 = ((qh >> (j + 12)) & 0x10) as u8;
        s0 += (((w[6 + j] & 0xF) | h0) as i32 - 16) * y_at(y, 2, j);
        s1 += (((w[6 + j] >> 4) | h1) as i32 - 16) * y_at(y, 2, j + 16);
    }
    (f16_at(w, 0) * f16_at(y, 0)) * (s0 + s1) as f32
}

fn q5_1(w: &[u8], y: &[u8]) -> f32 {
    let qh = u32_at(w, 4);
    let (mut s0, mut s1) = (0i32, 0i32);
    for j in 0..QK / 2 {
        let h0 = (((qh >> j) << 4) & 0x10) as u8;
        let h1 = ((qh >> (j + 12)) & 0x10) as u8;
        s0 += ((w[8 + j] & 0xF) | h0) as i32 * y_at(y, 4, j);
        s1 += ((w[8 + j] >> 4) | h1) as i32 * y_at(y, 4, j + 16);
    }
    (f16_at(w, 0) * f16_at(y, 0)) * (s0 + s1) as f32 + f16_at(w, 2) * f16_at(y, 2)
}

fn q8_0(w: &[u8], y: &[u8]) -> f32 {
    let mut s = 0i32;
    for j in 0..QK {
        s += w[2 + j] as i8 as i32 * y_at(y, 2, j);
    }
    s as f32 * (f16_at(w, 0) * f16_at(y, 0))
}

/// The 256 weight levels of a q4_K block, in value order.
fn q4_k_unpack(b: &[u8], a: &mut [i8; QK_K]) {
    for g in 0..QK_K / 64 {
        for l in 0..32 {
            let q = b[Q4K_QS + 32 * g + l];
            a[64 * g + l] = (q & 0xF) as i8;
            a[64 * g + 32 + l] = (q >> 4) as i8;
        }
    }
}

/// The 256 weight levels of a q5_K block, in value order.
fn q5_k_unpack(b: &[u8], a: &mut [i8; QK_K]) {
    for g in 0..QK_K / 64 {
        let (m1, m2) = (1u8 << (2 * g), 2u8 << (2 * g));
        for l in 0..32 {
            let (q, h) = (b[Q5K_QS + 32 * g + l], b[Q5K_QH + l]);
            a[64 * g + l] = ((q & 0xF) + if h & m1 != 0 { 16 } else { 0 }) as i8;
            a[64 * g + 32 + l] = ((q >> 4) + if h & m2 != 0 { 16 } else { 0 }) as i8;
        }
    }
}

/// q4_K / q5_K against q8_K, as `ggml_vec_dot_q4_K_q8_K_generic`: eight i32 lanes per block, scaled
/// into eight f32 sums, the min correction subtracted per block, the lanes added at the end.
fn k_quant(nb: usize, w: &[u8], wb: usize, x: &[u8], unpack: fn(&[u8], &mut [i8; QK_K])) -> f32 {
    let mut a = [0i8; QK_K];
    let mut sums = [0f32; 8];
    let mut sumf = 0f32;
    for i in 0..nb {
        let (b, y) = (&w[i * wb..(i + 1) * wb], &x[i * 292..(i + 1) * 292]);
        unpack(b, &mut a);
        let (sc, mn) = scales_mins_k4(&b[4..16]);
        let mut sumi = 0i32;
        for j in 0..QK_K / 16 {
            sumi += i16_at(y, Q8K_BSUMS + 2 * j) as i32 * mn[j / 2] as i32;
        }
        let mut aux32 = [0i32; 8];
        for (j, &scale) in sc.iter().enumerate() {
            let scale = scale as i32;
            for k in 0..4 {
                let base = 32 * j + 8 * k;
                for l in 0..8 {
                    aux32[l] += scale * (y_at(y, Q8K_QS, base + l) * a[base + l] as i32);
                }
            }
        }
        let d = f16_at(b, 0) * f32_at(y, 0);
        for l in 0..8 {
            sums[l] += d * aux32[l] as f32;
        }
        let dmin = f16_at(b, 2) * f32_at(y, 0);
        sumf -= dmin * sumi as f32;
    }
    for s in sums {
        sumf += s;
    }
    sumf
}

fn q6_k(nb: usize, w: &[u8], x: &[u8]) -> f32 {
    let mut a = [0i8; QK_K];
    let mut sums = [0f32; 8];
    for i in 0..nb {
        let (b, y) = (&w[i * 210..(i + 1) * 210], &x[i * 292..(i + 1) * 292]);
        for h in 0..QK_K / 128 {
            let (ql, qh) = (&b[Q6K_QL + 64 * h..], &b[Q6K_QH + 32 * h..]);
            let a = &mut a[128 * h..128 * h + 128];
            for l in 0..32 {
                a[l] = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i8 - 32;
                a[l + 32] = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
                a[l + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
                a[l + 96] = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
            }
        }
        let mut aux32 = [0i32; 8];
        for j in 0..QK_K / 16 {
            let scale = b[Q6K_SCALES + j] as i8 as i32;
            for k in 0..2 {
                let base = 16 * j + 8 * k;
                for l in 0..8 {
                    aux32[l] += scale * (y_at(y, Q8K_QS, base + l) * a[base + l] as i32);
                }
            }
        }
        let d = f16_at(b, Q6K_D) * f32_at(y, 0);
        for l in 0..8 {
            sums[l] += d * aux32[l] as f32;
        }
    }
    let mut sumf = 0f32;
    for s in sums {
        sumf += s;
    }
    sumf
}

/// The 16-entry table lookups of iq4_nl and mxfp4 against a q8_0 block: the two halves' integer sums.
#[inline(always)]
fn table_sums(qs: &[u8], table: &[i8; 16], y: &[u8]) -> i32 {
    let (mut s0, mut s1) = (0i32, 0i32);
    for j in 0..QK / 2 {
        s0 += y_at(y, 2, j) * table[(qs[j] & 0xF) as usize] as i32;
        s1 += y_at(y, 2, j + 16) * table[(qs[j] >> 4) as usize] as i32;
    }
    s0 + s1
}

fn iq4_nl(w: &[u8], y: &[u8]) -> f32 {
    let d = f16_at(y, 0) * f16_at(w, 0);
    d * table_sums(&w[2..18], &KVALUES_IQ4NL, y) as f32
}

fn mxfp4(w: &[u8], y: &[u8]) -> f32 {
    let d = f16_at(y, 0) * e8m0_to_f32_half(w[0]);
    d * table_sums(&w[1..17], &KVALUES_MXFP4, y) as f32
}

/// q2_K against q8_K, as `ggml_vec_dot_q2_K_q8_K_generic`: one integer sum per block, the mins through the
/// activations' 16-value sums.
fn q2_k(nb: usize, w: &[u8], x: &[u8]) -> f32 {
    let mut sumf = 0f32;
    for i in 0..nb {
        let (b, y) = (&w[i * 84..(i + 1) * 84], &x[i * 292..(i + 1) * 292]);
        let sc = &b[Q2K_SCALES..Q2K_SCALES + 16];
        let mut summs = 0i32;
        for (j, &s) in sc.iter().enumerate() {
            summs += i16_at(y, Q8K_BSUMS + 2 * j) as i32 * (s >> 4) as i32;
        }
        let dall = f32_at(y, 0) * f16_at(b, Q2K_D);
        let dmin = f32_at(y, 0) * f16_at(b, Q2K_DMIN);
        let mut isum = 0i32;
        for h in 0..QK_K / 128 {
            for j in 0..4 {
                for half in 0..2 {
                    let d = (sc[8 * h + 2 * j + half] & 0xF) as i32;
                    let mut isuml = 0i32;
                    for l in 16 * half..16 * half + 16 {
                        let q = ((b[Q2K_QS + 32 * h + l] >> (2 * j)) & 3) as i32;
                        isuml += y_at(y, Q8K_QS, 128 * h + 32 * j + l) * q;
                    }
                    isum += d * isuml;
                }
            }
        }
        sumf += dall * isum as f32 - dmin * summs as f32;
    }
    sumf
}

/// q3_K against q8_K, as `ggml_vec_dot_q3_K_q8_K_generic`: eight i32 lanes, scaled per block into eight
/// f32 sums added at the end.
fn q3_k(nb: usize, w: &[u8], x: &[u8]) -> f32 {
    let mut a = [0i8; QK_K];
    let mut sums = [0f32; 8];
    for i in 0..nb {
        let (b, y) = (&w[i * 110..(i + 1) * 110], &x[i * 292..(i + 1) * 292]);
        for h in 0..QK_K / 128 {
            for j in 0..4 {
                let bit = 1u8 << (4 * h + j);
                for l in 0..32 {
                    let low = ((b[Q3K_QS + 32 * h + l] >> (2 * j)) & 3) as i8;
                    a[128 * h + 32 * j + l] = low - if b[Q3K_HMASK + l] & bit != 0 { 0 } else { 4 };
                }
            }
        }
        let sc = &b[Q3K_SCALES..Q3K_SCALES + 12];
        let mut aux32 = [0i32; 8];
        for j in 0..QK_K / 16 {
            let scale = q3k_scale(j, sc);
            for k in 0..2 {
                let base = 16 * j + 8 * k;
                for l in 0..8 {
                    aux32[l] += scale * (y_at(y, Q8K_QS, base + l) * a[base + l] as i32);
                }
            }
        }
        let d = f16_at(b, Q3K_D) * f32_at(y, 0);
        for l in 0..8 {
            sums[l] += d * aux32[l] as f32;
        }
    }
    let mut sumf = 0f32;
    for s in sums {
        sumf += s;
    }
    sumf
}

/// iq4_xs against q8_K, as `ggml_vec_dot_iq4_xs_q8_K_generic`: one f32 term per 32-value sub-block.
fn iq4_xs(nb: usize, w: &[u8], x: &[u8]) -> f32 {
    let mut sumf = 0f32;
    for i in 0..nb {
        let (b, y) = (&w[i * 136..(i + 1) * 136], &x[i * 292..(i + 1) * 292]);
        let d4d8 = f16_at(b, 0) * f32_at(y, 0);
        for ib in 0..QK_K / 32 {
            let dl = d4d8 * iq4xs_scale(ib, b) as f32;
            let qs = &b[IQ4XS_QS + 16 * ib..IQ4XS_QS + 16 * ib + 16];
            let (mut s0, mut s1) = (0i32, 0i32);
            for j in 0..16 {
                s0 += y_at(y, Q8K_QS, 32 * ib + j) * KVALUES_IQ4NL[(qs[j] & 0xF) as usize] as i32;
                s1 += y_at(y, Q8K_QS, 32 * ib + j + 16) * KVALUES_IQ4NL[(qs[j] >> 4) as usize] as i32;
            }
            sumf += dl * (s0 + s1) as f32;
        }
    }
    sumf
}
