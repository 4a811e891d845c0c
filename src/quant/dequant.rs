//! Dequantization of whole rows to f32, with exactly ggml's float operations (`dequantize_row_*`).
//!
//! There is one implementation per type and no SIMD variant: dequantization only serves row lookups
//! (token embeddings) and tests, never the matrix products, so bit-exactness with ggml matters more here
//! than speed. Callers pass whole blocks; lengths are checked by `quant::dequantize_row`.

use super::blocks::*;
use super::types::{GgmlType, QK, QK_K};

/// Dequantizes `dst.len()` values of type `ty` from `src`. Lengths must already match.
pub fn dequantize(ty: GgmlType, src: &[u8], dst: &mut [f32]) {
    let bb = ty.block_bytes();
    match ty {
        GgmlType::F32 => {
            for (y, b) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *y = f32_at(b, 0);
            }
        }
        GgmlType::F16 => {
            for (y, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *y = f16_at(b, 0);
            }
        }
        GgmlType::BF16 => {
            for (y, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *y = f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16);
            }
        }
        GgmlType::Q4_0 => each_block(src, dst, bb, QK, q4_0),
        GgmlType::Q4_1 => each_block(src, dst, bb, QK, q4_1),
        GgmlType::Q5_0 => each_block(src, dst, bb, QK, q5_0),
        GgmlType::Q5_1 => each_block(src, dst, bb, QK, q5_1),
        GgmlType::Q8_0 => each_block(src, dst, bb, QK, q8_0),
        GgmlType::Q8_1 => each_block(src, dst, bb, QK, q8_1),
        GgmlType::Q4K => each_block(src, dst, bb, QK_K, q4_k),
        GgmlType::Q5K => each_block(src, dst, bb, QK_K, q5_k),
        GgmlType::Q6K => each_block(src, dst, bb, QK_K, q6_k),
        GgmlType::Q8K => each_block(src, dst, bb, QK_K, q8_k),
        GgmlType::Q2K => each_block(src, dst, bb, QK_K, q2_k),
        GgmlType::Q3K => each_block(src, dst, bb, QK_K, q3_k),
        GgmlType::IQ4NL => each_block(src, dst, bb, QK, iq4_nl),
        GgmlType::IQ4XS => each_block(src, dst, bb, QK_K, iq4_xs),
        GgmlType::MXFP4 => each_block(src, dst, bb, QK, mxfp4),
    }
}

fn each_block(src: &[u8], dst: &mut [f32], bb: usize, bl: usize, f: fn(&[u8], &mut [f32])) {
    for (b, y) in src.chunks_exact(bb).zip(dst.chunks_exact_mut(bl)) {
        f(b, y);
    }
}

fn q4_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    for j in 0..QK / 2 {
        let q = b[2 + j];
        y[j] = ((q & 0xF) as i32 - 8) as f32 * d;
        y[j + QK / 2] = ((q >> 4) as i32 - 8) as f32 * d;
    }
}

// ggml writes `x0*d + m`. Rust never fuses it into an fma; a C build with `-ffp-contract=fast` and FMA
// enabled may, which would differ from this in the last bit for some values.
fn q4_1(b: &[u8], y: &mut [f32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    for j in 0..QK / 2 {
        let q = b[4 + j];
        y[j] = (q & 0xF) as f32 * d + m;
        y[j + QK / 2] = (q >> 4) as f32 * d + m;
    }
}

fn q5_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let qh = u32_at(b, 2);
    for j in 0..QK / 2 {
        let q = b[6 + j] as u32;
        let h0 = ((qh >> j) << 4) & 0x10;
        let h1 = (qh >> (j + 12)) & 0x10;
        y[j] = (((q & 0xF) | h0) as i32 - 16) as f32 * d;
        y[j + QK / 2] = (((q >> 4) | h1) as i32 - 16) as f32 * d;
    }
}

fn q5_1(b: &[u8], y: &mut [f32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    let qh = u32_at(b, 4);
    for j in 0..QK / 2 {
        let q = b[8 + j] as u32;
        let h0 = ((qh >> j) << 4) & 0x10;
        let h1 = (qh >> (j + 12)) & 0x10;
        y[j] = ((q & 0xF) | h0) as f32 * d + m;
        y[j + QK / 2] = ((q >> 4) | h1) as f32 * d + m;
    }
}

fn q8_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    for j in 0..QK {
        y[j] = b[2 + j] as i8 as f32 * d;
    }
}

fn q8_1(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    for j in 0..QK {
        y[j] = b[4 + j] as i8 as f32 * d;
    }
}

fn q4_k(b: &[u8], y: &mut [f32]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let sc = &b[Q4K_SCALES..Q4K_SCALES + 12];
    for g in 0..QK_K / 64 {
        let (s1, m1) = scale_min_k4(2 * g, sc);
        let (s2, m2) = scale_min_k4(2 * g + 1, sc);
        let (d1, m1) = (d * s1 as f32, dmin * m1 as f32);
        let (d2, m2) = (d * s2 as f32, dmin * m2 as f32);
        let q = &b[Q4K_QS + 32 * g..Q4K_QS + 32 * g + 32];
        let y = &mut y[64 * g..64 * g + 64];
        for l in 0..32 {
            y[l] = d1 * (q[l] & 0xF) as f32 - m1;
            y[l + 32] = d2 * (q[l] >> 4) as f32 - m2;
        }
    }
}

fn q5_k(b: &[u8], y: &mut [f32]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let sc = &b[Q5K_SCALES..Q5K_SCALES + 12];
    let qh = &b[Q5K_QH..Q5K_QH + 32];
    for g in 0..QK_K / 64 {
        let (s1, m1) = scale_min_k4(2 * g, sc);
        let (s2, m2) = scale_min_k4(2 * g + 1, sc);
        let (d1, m1) = (d * s1 as f32, dmin * m1 as f32);
        let (d2, m2) = (d * s2 as f32, dmin * m2 as f32);
        let (u1, u2) = (1u8 << (2 * g), 2u8 << (2 * g));
        let ql = &b[Q5K_QS + 32 * g..Q5K_QS + 32 * g + 32];
        let y = &mut y[64 * g..64 * g + 64];
        for l in 0..32 {
            let h1 = if qh[l] & u1 != 0 { 16 } else { 0 };
            let h2 = if qh[l] & u2 != 0 { 16 } else { 0 };
            y[l] = d1 * ((ql[l] & 0xF) + h1) as f32 - m1;
            y[l + 32] = d2 * ((ql[l] >> 4) + h2) as f32 - m2;
        }
    }
}

fn q6_k(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, Q6K_D);
    for half in 0..QK_K / 128 {
        let ql = &b[Q6K_QL + 64 * half..Q6K_QL + 64 * half + 64];
        let qh = &b[Q6K_QH + 32 * half..Q6K_QH + 32 * half + 32];
        let sc = &b[Q6K_SCALES + 8 * half..Q6K_SCALES + 8 * half + 8];
        let y = &mut y[128 * half..128 * half + 128];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            y[l] = d * sc[is] as i8 as f32 * q1 as f32;
            y[l + 32] = d * sc[is + 2] as i8 as f32 * q2 as f32;
            y[l + 64] = d * sc[is + 4] as i8 as f32 * q3 as f32;
            y[l + 96] = d * sc[is + 6] as i8 as f32 * q4 as f32;
        }
    }
}

// q2_K and q3_K: value `128 * h + 32 * j + l` is the 2-bit field `j` of `qs[32 * h + l]`, with the scale of
// its 16-value sub-block `8 * h + 2 * j + l / 16`.
fn q2_k(b: &[u8], y: &mut [f32]) {
    let (d, dmin) = (f16_at(b, Q2K_D), f16_at(b, Q2K_DMIN));
    for h in 0..QK_K / 128 {
        for j in 0..4 {
            for half in 0..2 {
                let sc = b[Q2K_SCALES + 8 * h + 2 * j + half];
                let (dl, ml) = (d * (sc & 0xF) as f32, dmin * (sc >> 4) as f32);
                for l in 16 * half..16 * half + 16 {
                    let q = (b[Q2K_QS + 32 * h + l] >> (2 * j)) & 3;
                    y[128 * h + 32 * j + l] = dl * q as f32 - ml;
                }
            }
        }
    }
}

fn q3_k(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, Q3K_D);
    let sc = &b[Q3K_SCALES..Q3K_SCALES + 12];
    for h in 0..QK_K / 128 {
        for j in 0..4 {
            let bit = 1u8 << (4 * h + j);
            for half in 0..2 {
                let dl = d * q3k_scale(8 * h + 2 * j + half, sc) as f32;
                for l in 16 * half..16 * half + 16 {
                    let low = ((b[Q3K_QS + 32 * h + l] >> (2 * j)) & 3) as i32;
                    let q = low - if b[Q3K_HMASK + l] & bit != 0 { 0 } else { 4 };
                    y[128 * h + 32 * j + l] = dl * q as f32;
                }
            }
        }
    }
}

fn iq4_nl(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    for j in 0..QK / 2 {
        y[j] = d * KVALUES_IQ4NL[(b[2 + j] & 0xF) as usize] as f32;
        y[j + QK / 2] = d * KVALUES_IQ4NL[(b[2 + j] >> 4) as usize] as f32;
    }
}

fn iq4_xs(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    for ib in 0..QK_K / 32 {
        let dl = d * iq4xs_scale(ib, b) as f32;
        let qs = &b[IQ4XS_QS + 16 * ib..IQ4XS_QS + 16 * ib + 16];
        for j in 0..16 {
            y[32 * ib + j] = dl * KVALUES_IQ4NL[(qs[j] & 0xF) as usize] as f32;
            y[32 * ib + j + 16] = dl * KVALUES_IQ4NL[(qs[j] >> 4) as usize] as f32;
        }
    }
}

fn mxfp4(b: &[u8], y: &mut [f32]) {
    let d = e8m0_to_f32_half(b[0]);
    for j in 0..QK / 2 {
        y[j] = KVALUES_MXFP4[(b[1 + j] & 0xF) as usize] as f32 * d;
        y[j + QK / 2] = KVALUES_MXFP4[(b[1 + j] >> 4) as usize] as f32 * d;
    }
}

fn q8_k(b: &[u8], y: &mut [f32]) {
    let d = f32_at(b, 0);
    for j in 0..QK_K {
        y[j] = d * b[Q8K_QS + j] as i8 as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Hand-built blocks with values worked out on paper from ggml's definitions.

    #[test]
    fn q4_0_known_block() {
        let mut b = [0u8; 18];
        b[..2].copy_from_slice(&[0x00, 0x40]); // d = 2.0
        b[2] = 0x9F; // value 0: 15 - 8 = 7, value 16: 9 - 8 = 1
        b[3] = 0x08; // value 1: 0, value 17: -8
        let mut y = [0f32; 32];
        dequantize(GgmlType::Q4_0, &b, &mut y);
        assert_eq!((y[0], y[16], y[1], y[17], y[2]), (14.0, 2.0, 0.0, -16.0, -16.0));
    }

    #[test]
    fn q4_1_known_block() {
        let mut b = [0u8; 20];
        b[..2].copy_from_slice(&[0x00, 0x38]); // d = 0.5
        b[2..4].copy_from_slice(&[0x00, 0xBC]); // m = -1.0
        b[4] = 0xF3;
        let mut y = [0f32; 32];
        dequantize(GgmlType::Q4_1, &b, &mut y);
        assert_eq!((y[0], y[16], y[1]), (0.5, 6.5, -1.0));
    }

    #[test]
    fn q5_0_and_q5_1_known_blocks() {
        let mut b = [0u8; 22];
        b[..2].copy_from_slice(&[0x00, 0x3C]); // d = 1.0
        b[2..6].copy_from_slice(&(1u32 | (1 << 16) | (1 << 31)).to_le_bytes());
        b[6] = 0x21; // value 0: 1 | 16 -> 17 - 16 = 1; value 16: 2 | 16 -> 2
        let mut y = [0f32; 32];
        dequantize(GgmlType::Q5_0, &b, &mut y);
        assert_eq!((y[0], y[16], y[1], y[31]), (1.0, 2.0, -16.0, 0.0));

        let mut b = [0u8; 24];
        b[..2].copy_from_slice(&[0x00, 0x3C]); // d = 1.0
        b[2..4].copy_from_slice(&[0x00, 0x3C]); // m = 1.0
        b[4..8].copy_from_slice(&(1u32 << 17).to_le_bytes());
        b[9] = 0x70; // value 1: 0; value 17: 7 | 16 = 23
        dequantize(GgmlType::Q5_1, &b, &mut y);
        assert_eq!((y[1], y[17], y[0]), (1.0, 24.0, 1.0));
    }

    #[test]
    fn q8_0_known_block() {
        let mut b = [0u8; 34];
        b[..2].copy_from_slice(&[0x00, 0x34]); // d = 0.25
        b[2] = 4;
        b[3] = (-128i8) as u8;
        let mut y = [0f32; 32];
        dequantize(GgmlType::Q8_0, &b, &mut y);
        assert_eq!((y[0], y[1], y[2]), (1.0, -32.0, 0.0));
    }

    #[test]
    fn k_quants_known_blocks() {
        // q4_K: d = 1, dmin = 0.5, sub-block 0 scale 2 min 4, sub-block 5 scale 33 min 17.
        let mut b = vec![0u8; 144];
        b[..2].copy_from_slice(&[0x00, 0x3C]);
        b[2..4].copy_from_slice(&[0x00, 0x38]);
        let (mut sc, mut mn) = ([0u8; 8], [0u8; 8]);
        (sc[0], mn[0], sc[5], mn[5]) = (2, 4, 33, 17);
        pack_scales_mins_k4(&sc, &mn, &mut b[4..16]);
        b[16] = 0x53; // value 0: 3, value 32: 5
        b[16 + 64] = 0x70; // value 128 (sub-block 4): 0, value 160 (sub-block 5): 7
        let mut y = vec![0f32; 256];
        dequantize(GgmlType::Q4K, &b, &mut y);
        assert_eq!((y[0], y[32], y[160], y[161]), (2.0 * 3.0 - 2.0, 0.0, 33.0 * 7.0 - 8.5, -8.5));

        // q5_K: the high bit of value 64 + 32 = 96 lives in bit 3 of qh[0].
        let mut b = vec![0u8; 176];
        b[..2].copy_from_slice(&[0x00, 0x3C]);
        let sc = [1u8; 8];
        pack_scales_mins_k4(&sc, &[0; 8], &mut b[4..16]);
        b[16] = 0b1000;
        b[48 + 32] = 0x20; // value 64: 0, value 96: 2 + 16
        dequantize(GgmlType::Q5K, &b, &mut y);
        assert_eq!((y[64], y[96], y[0]), (0.0, 18.0, 0.0));

        // q6_K: d = 0.5, scales[0] = -2; value 0 = (ql 5 | qh 2 << 4) - 32 = 5.
        let mut b = vec![0u8; 210];
        b[208..210].copy_from_slice(&[0x00, 0x38]);
        b[192] = (-2i8) as u8;
        b[0] = 5;
        b[128] = 2;
        dequantize(GgmlType::Q6K, &b, &mut y);
        assert_eq!(y[0], 0.5 * -2.0 * 5.0);
        assert_eq!(y[1], 0.5 * -2.0 * -32.0);
    }

    #[test]
    fn new_formats_known_blocks() {
        // iq4_nl: d = 0.5; value 0 index 0 (-127), value 16 index 15 (113).
        let mut b = [0u8; 18];
        b[..2].copy_from_slice(&[0x00, 0x38]);
        b[2] = 0xF0;
        b[3] = 0x88;
        let mut y = [0f32; 32];
        dequantize(GgmlType::IQ4NL, &b, &mut y);
        assert_eq!((y[0], y[16], y[1], y[17]), (-63.5, 56.5, 0.5, 0.5));

        // mxfp4: e = 128 gives d = 1 (the table is doubled e2m1): index 7 -> 12, index 9 -> -1.
        let mut b = [0u8; 17];
        b[0] = 128;
        b[1] = 0x97;
        let mut y = [0f32; 32];
        dequantize(GgmlType::MXFP4, &b, &mut y);
        assert_eq!((y[0], y[16], y[1]), (12.0, -1.0, 0.0));

        // q2_K: d = 1, dmin = 0.5; sub-block 0 scale 3 min 2; value 0 = 3 * 2 - 1; value 32 (field 1 of
        // qs[0], sub-block 2: scale 0, min 0) = 0.
        let mut b = vec![0u8; 84];
        b[80..82].copy_from_slice(&[0x00, 0x3C]);
        b[82..84].copy_from_slice(&[0x00, 0x38]);
        b[0] = 0x23;
        b[16] = 0b0110;
        let mut y = vec![0f32; 256];
        dequantize(GgmlType::Q2K, &b, &mut y);
        assert_eq!((y[0], y[32], y[1]), (5.0, 0.0, -1.0));

        // q3_K: d = 2, every scale code 0 (-32) but scale 0 = 33 (1); value 0: low 3, high bit set -> 3.
        let mut b = vec![0u8; 110];
        b[108..110].copy_from_slice(&[0x00, 0x40]);
        b[96] = 1; // scale 0 low nibble 1
        b[104] = 2; // scale 0 high bits 2 -> code 33
        b[32] = 3;
        b[0] = 1;
        dequantize(GgmlType::Q3K, &b, &mut y);
        assert_eq!((y[0], y[1], y[16]), (6.0, -8.0, 2.0 * -32.0 * -4.0));

        // iq4_xs: d = 1, sub-block 1 scale code 1 | (3 << 4) = 49 -> 17; sub-block 0 code 0 -> -32.
        let mut b = vec![0u8; 136];
        b[..2].copy_from_slice(&[0x00, 0x3C]);
        b[2..4].copy_from_slice(&(3u16 << 2).to_le_bytes());
        b[4] = 0x10;
        b[8 + 16] = 0x08; // value 32: index 8 (1); value 48: index 0 (-127)
        dequantize(GgmlType::IQ4XS, &b, &mut y);
        assert_eq!((y[32], y[48], y[0]), (17.0, -17.0 * 127.0, 32.0 * 127.0));
    }

    #[test]
    fn float_types_known_values() {
        let mut y = [0f32; 2];
        dequantize(GgmlType::F16, &[0x00, 0x3C, 0x00, 0xC0], &mut y);
        assert_eq!(y, [1.0, -2.0]);
        dequantize(GgmlType::BF16, &[0x80, 0x3F, 0x40, 0xC0], &mut y);
        assert_eq!(y, [1.0, -3.0]);
        let mut y = [0f32; 1];
        dequantize(GgmlType::F32, &1.5f32.to_le_bytes(), &mut y);
        assert_eq!(y, [1.5]);
    }
}

/// Value `i` of the row `row` of type `ty`, without dequantizing its whole block where the layout allows
/// (the legacy quants, iq4_nl, mxfp4 and the float types); the K-quants and iq4_xs dequantize the one super-block. Same values as
/// `dequantize`.
pub fn dequantize_value(ty: GgmlType, row: &[u8], i: usize) -> f32 {
    let (bl, bb) = (ty.block_len(), ty.block_bytes());
    let b = &row[i / bl * bb..(i / bl + 1) * bb];
    let j = i % bl;
    let nibble = |at: usize| if j < QK / 2 { b[at + j] & 0xF } else { b[at + j - QK / 2] >> 4 };
    let high_bit = |qh: u32| ((qh >> j) & 1) as u8;
    match ty {
        GgmlType::F32 => f32_at(b, 0),
        GgmlType::F16 => f16_at(b, 0),
        GgmlType::BF16 => f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16),
        GgmlType::Q4_0 => (nibble(2) as i32 - 8) as f32 * f16_at(b, 0),
        GgmlType::Q4_1 => nibble(4) as f32 * f16_at(b, 0) + f16_at(b, 2),
        GgmlType::Q5_0 => (((nibble(6) | high_bit(u32_at(b, 2)) << 4) as i32) - 16) as f32 * f16_at(b, 0),
        GgmlType::Q5_1 => (nibble(8) | high_bit(u32_at(b, 4)) << 4) as f32 * f16_at(b, 0) + f16_at(b, 2),
        GgmlType::Q8_0 => (b[2 + j] as i8) as f32 * f16_at(b, 0),
        GgmlType::IQ4NL => f16_at(b, 0) * KVALUES_IQ4NL[nibble(2) as usize] as f32,
        GgmlType::MXFP4 => KVALUES_MXFP4[nibble(1) as usize] as f32 * e8m0_to_f32_half(b[0]),
        _ => {
            let mut y = [0f32; QK_K];
            dequantize(ty, b, &mut y[..bl]);
            y[j]
        }
    }
}

#[cfg(test)]
mod value_tests {
    use super::*;

    #[test]
    fn single_values_equal_whole_row_dequantization_for_every_type() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        for ty in GgmlType::WEIGHT_TYPES {
            let n = 512;
            let x: Vec<f32> = (0..n).map(|_| rng.gen_range(-2.0f32..2.0)).collect();
            let mut q = vec![0u8; ty.row_bytes(n as u64).unwrap() as usize];
            crate::quant::quantize_row(ty, &x, &mut q);
            let mut all = vec![0f32; n];
            dequantize(ty, &q, &mut all);
            for (i, v) in all.iter().enumerate() {
                assert_eq!(dequantize_value(ty, &q, i).to_bits(), v.to_bits(), "{ty} value {i}");
            }
        }
    }
}
