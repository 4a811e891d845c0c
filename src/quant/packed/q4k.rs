//! The q4_K and q5_K row-interleaved layouts: 256-value super-blocks of 16 rows, against q8_K activations.
//!
//! A super-block of a group (`SB_BYTES`, 37 cache lines; q5_K: `SB5_BYTES`, 45):
//!
//! | at | what | bytes |
//! |----|------|-------|
//! | 0 | quants: vector `8 j + g` = for each row `r`, bytes `32 j + 4 g ..+4` of its `qs` at `4 r` | 2048 |
//! | 2048 | sub-block scales `sc[k]` (6 bits, unpacked), `[k][r]` | 128 |
//! | 2176 | sub-block mins `m[k]`, `[k][r]` | 128 |
//! | 2304 | `d` of each row, f16 | 32 |
//! | 2336 | `dmin` of each row, f16 | 32 |
//! | 2368 | q5_K: fifth bits, vector `g` (0..8): bit `k` of a byte = the fifth bit of sub-block `k`'s value-vector `g` | 512 |
//!
//! The low nibbles of vector `8 j + g` are values `64 j + 4 g..` (sub-block `2 j`), the high nibbles values
//! `64 j + 32 + 4 g..` (sub-block `2 j + 1`): each meets the activation bytes at its own value index. So
//! value-vector `g` of sub-block `k` (values `32 k + 4 g..`) takes its fifth bits from bit `k` of vector `g`
//! of the last region: shifted by `4 - k` and masked with 0x10, they OR into the nibbles (codes 0..31).
//!
//! Arithmetic, the same on every path: per sub-block `k` the exact sum `s_k = sum(q * y)`; per super-block
//! `isum = sum_k sc_k * s_k` and `msum = sum_k m_k * (bsums[2k] + bsums[2k+1])` in i32, then
//! `acc = fma(dw * dy, isum as f32, acc)` and `acc = fma(-(dmin * dy), msum as f32, acc)`, super-blocks in
//! order. (`isum` can pass 2^24; its conversion rounds to nearest on every path alike.)

use super::super::blocks::{self, scale_min_k4, Q4K_QS, Q4K_SCALES, Q5K_QH, Q5K_QS, Q8K_BSUMS};
use super::{ActRow, PACK_ROWS, VECTOR_BYTES};

/// Bytes of one super-block of a group: q4_K, and q5_K with its fifth bits at `HB_AT`.
pub(super) const SB_BYTES: usize = 2368;
pub(super) const SB5_BYTES: usize = 2880;
pub(super) const HB_AT: usize = 2368;
pub(super) const SC_AT: usize = 2048;
pub(super) const M_AT: usize = 2176;
pub(super) const D_AT: usize = 2304;
pub(super) const DMIN_AT: usize = 2336;
/// Bytes of a q4_K / q5_K block in the file, and of a q8_K activation block.
pub(super) const FILE_BLOCK: usize = 144;
pub(super) const FILE_BLOCK5: usize = 176;
pub(super) const Y_BLOCK: usize = 292;

/// Writes row `rr`'s file block `block` (q5_K when `five`) into the group's super-block `sb`.
pub(super) fn pack_block(block: &[u8], rr: usize, five: bool, sb: &mut [u8]) {
    let qs_at = if five { Q5K_QS } else { Q4K_QS };
    let qs = &block[qs_at..qs_at + 128];
    for v in 0..32 {
        let at = v * VECTOR_BYTES + 4 * rr;
        sb[at..at + 4].copy_from_slice(&qs[4 * v..4 * v + 4]);
    }
    for k in 0..8 {
        let (sc, m) = scale_min_k4(k, &block[Q4K_SCALES..Q4K_SCALES + 12]);
        sb[SC_AT + k * PACK_ROWS + rr] = sc;
        sb[M_AT + k * PACK_ROWS + rr] = m;
    }
    sb[D_AT + 2 * rr..D_AT + 2 * rr + 2].copy_from_slice(&block[0..2]);
    sb[DMIN_AT + 2 * rr..DMIN_AT + 2 * rr + 2].copy_from_slice(&block[2..4]);
    if five {
        // The file's fifth bit of value `j` is bit `j / 32` of qh[j % 32].
        let qh = &block[Q5K_QH..Q5K_QH + 32];
        for g in 0..8 {
            for k in 0..4 {
                sb[HB_AT + g * VECTOR_BYTES + 4 * rr + k] = qh[4 * g + k];
            }
        }
    }
}

/// The fifth bit (0 or 16) of value `j` of row `rr` in a q5_K super-block `sb`.
fn fifth_bit(sb: &[u8], rr: usize, j: usize) -> u8 {
    let (k, l) = (j / 32, j % 32);
    ((sb[HB_AT + (l / 4) * VECTOR_BYTES + 4 * rr + l % 4] >> k) & 1) << 4
}

/// Value `j` (0..256) of row `rr` in super-block `sb`, as ggml's `dequantize_row_q4_K` (q5_K when `five`)
/// gives it.
pub(super) fn value(sb: &[u8], rr: usize, five: bool, j: usize) -> f32 {
    let (chunk, l) = (j / 64, j % 64);
    let (high, l) = (l >= 32, l % 32);
    let byte = sb[(8 * chunk + l / 4) * VECTOR_BYTES + 4 * rr + l % 4];
    let mut q = if high { byte >> 4 } else { byte & 0x0F };
    if five {
        q += fifth_bit(sb, rr, j);
    }
    let k = 2 * chunk + high as usize;
    let (d, dmin) = (blocks::f16_at(sb, D_AT + 2 * rr), blocks::f16_at(sb, DMIN_AT + 2 * rr));
    let (sc, m) = (sb[SC_AT + k * PACK_ROWS + rr], sb[M_AT + k * PACK_ROWS + rr]);
    (d * sc as f32) * q as f32 - dmin * m as f32
}

/// The portable kernel over `nb` super-blocks of a group (q5_K when `five`; see the module comment).
pub(super) fn tile_portable(nb: usize, five: bool, group: &[u8], xs: &[ActRow], out: &mut [f32]) {
    let sbb = if five { SB5_BYTES } else { SB_BYTES };
    for (x, out) in xs.iter().zip(out.chunks_exact_mut(PACK_ROWS)) {
        for (rr, o) in out.iter_mut().enumerate() {
            let mut acc = 0f32;
            for b in 0..nb {
                let sb = &group[b * sbb..(b + 1) * sbb];
                let y = &x.q[b * Y_BLOCK..(b + 1) * Y_BLOCK];
                let (mut isum, mut msum) = (0i32, 0i32);
                for k in 0..8 {
                    let (chunk, high) = (k / 2, k % 2 == 1);
                    let mut s = 0i32;
                    for l in 0..32 {
                        let byte = sb[(8 * chunk + l / 4) * VECTOR_BYTES + 4 * rr + l % 4];
                        let mut q = if high { byte >> 4 } else { byte & 0x0F };
                        if five {
                            q += fifth_bit(sb, rr, 32 * k + l);
                        }
                        s += q as i32 * y[4 + 32 * k + l] as i8 as i32;
                    }
                    isum += sb[SC_AT + k * PACK_ROWS + rr] as i32 * s;
                    let bsum =
                        blocks::i16_at(y, Q8K_BSUMS + 4 * k) as i32 + blocks::i16_at(y, Q8K_BSUMS + 4 * k + 2) as i32;
                    msum += sb[M_AT + k * PACK_ROWS + rr] as i32 * bsum;
                }
                let dy = blocks::f32_at(y, 0);
                let (d, dmin) = (blocks::f16_at(sb, D_AT + 2 * rr), blocks::f16_at(sb, DMIN_AT + 2 * rr));
                acc = (d * dy).mul_add(isum as f32, acc);
                acc = (-(dmin * dy)).mul_add(msum as f32, acc);
            }
            *o = acc;
        }
    }
}
