//! The q4_K row-interleaved layout: 256-value super-blocks of 16 rows, against q8_K activations.
//!
//! A super-block of a group (`SB_BYTES`, 37 cache lines):
//!
//! | at | what | bytes |
//! |----|------|-------|
//! | 0 | quants: vector `8 j + g` = for each row `r`, bytes `32 j + 4 g ..+4` of its `qs` at `4 r` | 2048 |
//! | 2048 | sub-block scales `sc[k]` (6 bits, unpacked), `[k][r]` | 128 |
//! | 2176 | sub-block mins `m[k]`, `[k][r]` | 128 |
//! | 2304 | `d` of each row, f16 | 32 |
//! | 2336 | `dmin` of each row, f16 | 32 |
//!
//! The low nibbles of vector `8 j + g` are values `64 j + 4 g..` (sub-block `2 j`), the high nibbles values
//! `64 j + 32 + 4 g..` (sub-block `2 j + 1`): each meets the activation bytes at its own value index.
//!
//! Arithmetic, the same on every path: per sub-block `k` the exact sum `s_k = sum(q * y)`; per super-block
//! `isum = sum_k sc_k * s_k` and `msum = sum_k m_k * (bsums[2k] + bsums[2k+1])` in i32, then
//! `acc = fma(dw * dy, isum as f32, acc)` and `acc = fma(-(dmin * dy), msum as f32, acc)`, super-blocks in
//! order. (`isum` can pass 2^24; its conversion rounds to nearest on every path alike.)

use super::super::blocks::{self, scale_min_k4, Q4K_QS, Q4K_SCALES, Q8K_BSUMS};
use super::{ActRow, PACK_ROWS, VECTOR_BYTES};

/// Bytes of one super-block of a group.
pub(super) const SB_BYTES: usize = 2368;
pub(super) const SC_AT: usize = 2048;
pub(super) const M_AT: usize = 2176;
pub(super) const D_AT: usize = 2304;
pub(super) const DMIN_AT: usize = 2336;
/// Bytes of a q4_K block in the file, and of a q8_K activation block.
pub(super) const FILE_BLOCK: usize = 144;
pub(super) const Y_BLOCK: usize = 292;

/// Writes row `rr`'s file block `block` into the group's super-block `sb`.
pub(super) fn pack_block(block: &[u8], rr: usize, sb: &mut [u8]) {
    let qs = &block[Q4K_QS..Q4K_QS + 128];
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
}

/// Value `j` (0..256) of row `rr` in super-block `sb`, as ggml's `dequantize_row_q4_K` gives it.
pub(super) fn value(sb: &[u8], rr: usize, j: usize) -> f32 {
    let (chunk, l) = (j / 64, j % 64);
    let (high, l) = (l >= 32, l % 32);
    let byte = sb[(8 * chunk + l / 4) * VECTOR_BYTES + 4 * rr + l % 4];
    let q = if high { byte >> 4 } else { byte & 0x0F };
    let k = 2 * chunk + high as usize;
    let (d, dmin) = (blocks::f16_at(sb, D_AT + 2 * rr), blocks::f16_at(sb, DMIN_AT + 2 * rr));
    let (sc, m) = (sb[SC_AT + k * PACK_ROWS + rr], sb[M_AT + k * PACK_ROWS + rr]);
    (d * sc as f32) * q as f32 - dmin * m as f32
}

/// The portable kernel over `nb` super-blocks of a group (see the module comment).
pub(super) fn tile_portable(nb: usize, group: &[u8], xs: &[ActRow], out: &mut [f32]) {
    for (x, out) in xs.iter().zip(out.chunks_exact_mut(PACK_ROWS)) {
        for (rr, o) in out.iter_mut().enumerate() {
            let mut acc = 0f32;
            for b in 0..nb {
                let sb = &group[b * SB_BYTES..(b + 1) * SB_BYTES];
                let y = &x.q[b * Y_BLOCK..(b + 1) * Y_BLOCK];
                let (mut isum, mut msum) = (0i32, 0i32);
                for k in 0..8 {
                    let (chunk, high) = (k / 2, k % 2 == 1);
                    let mut s = 0i32;
                    for l in 0..32 {
                        let byte = sb[(8 * chunk + l / 4) * VECTOR_BYTES + 4 * rr + l % 4];
                        let q = if high { byte >> 4 } else { byte & 0x0F };
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
