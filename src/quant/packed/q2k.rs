//! The q2_K row-interleaved layout: 256-value super-blocks of 16 rows, against q8_K activations, in the
//! file's own size.
//!
//! Value-vector `i` (0..64) of a super-block holds values `4 i..4 i + 4` of each row (`4` bytes at `4 r`), as
//! their 2-bit codes `q` (0..3). A super-block of a group (`SB_BYTES`, 21 cache lines):
//!
//! | at | what | bytes |
//! |----|------|-------|
//! | 0 | codes: vector `v` (0..16), bits `2 m..2 m + 2` of a byte = value-vector `v + 16 m`'s (m 0..4) | 1024 |
//! | 1024 | sub-block `k`'s scale (low nibble) and min (high nibble), the file's byte, `[k][r]` for 16 sub-blocks | 256 |
//! | 1280 | `d` of each row, f16 | 32 |
//! | 1312 | `dmin` of each row, f16 | 32 |
//!
//! Sub-block `k` is value-vectors `4 k..4 k + 4`, in vectors `4 (k % 4)..` at bit `2 (k / 4)` (as q3_K's low
//! bits, `q3k`).
//!
//! Arithmetic, the same on every path, q4_K's (`q4k`): per sub-block `k` the exact `s_k = sum(q * y)`; per
//! super-block `isum = sum_k sc_k * s_k` and `msum = sum_k m_k * bsums[k]` in i32, then
//! `acc = fma(d * dy, isum as f32, acc)` and `acc = fma(-(dmin * dy), msum as f32, acc)`, super-blocks in
//! order.

use super::super::blocks::{self, Q2K_D, Q2K_DMIN, Q2K_QS, Q2K_SCALES, Q8K_BSUMS};
use super::{ActRow, PACK_ROWS, VECTOR_BYTES};

/// Bytes of one super-block of a group.
pub(super) const SB_BYTES: usize = 1344;
pub(super) const SC_AT: usize = 1024;
pub(super) const D_AT: usize = 1280;
pub(super) const DMIN_AT: usize = 1312;
/// Bytes of a q2_K block in the file, and of a q8_K activation block.
pub(super) const FILE_BLOCK: usize = 84;
pub(super) const Y_BLOCK: usize = 292;

/// The code (0..3) of value `j` in a q2_K file block.
fn file_code(block: &[u8], j: usize) -> u8 {
    // ggml's order: halves `h` of 128; in each, quarter `m` of 32 values reads bits 2 m of qs[32 h + l].
    let (h, m, l) = (j / 128, (j % 128) / 32, j % 32);
    (block[Q2K_QS + 32 * h + l] >> (2 * m)) & 3
}

/// Writes row `rr`'s file block `block` into the group's super-block `sb`.
pub(super) fn pack_block(block: &[u8], rr: usize, sb: &mut [u8]) {
    for i in 0..64 {
        for k in 0..4 {
            sb[(i % 16) * VECTOR_BYTES + 4 * rr + k] |= file_code(block, 4 * i + k) << (2 * (i / 16));
        }
    }
    for k in 0..16 {
        sb[SC_AT + k * PACK_ROWS + rr] = block[Q2K_SCALES + k];
    }
    sb[D_AT + 2 * rr..D_AT + 2 * rr + 2].copy_from_slice(&block[Q2K_D..Q2K_D + 2]);
    sb[DMIN_AT + 2 * rr..DMIN_AT + 2 * rr + 2].copy_from_slice(&block[Q2K_DMIN..Q2K_DMIN + 2]);
}

/// The code of value `j` (0..256) of row `rr` in super-block `sb`.
fn code(sb: &[u8], rr: usize, j: usize) -> i32 {
    let (i, k) = (j / 4, j % 4);
    ((sb[(i % 16) * VECTOR_BYTES + 4 * rr + k] >> (2 * (i / 16))) & 3) as i32
}

/// Value `j` (0..256) of row `rr` in super-block `sb`, as ggml's `dequantize_row_q2_K` gives it.
pub(super) fn value(sb: &[u8], rr: usize, j: usize) -> f32 {
    let sm = sb[SC_AT + (j / 16) * PACK_ROWS + rr];
    let dl = blocks::f16_at(sb, D_AT + 2 * rr) * (sm & 0xF) as f32;
    let ml = blocks::f16_at(sb, DMIN_AT + 2 * rr) * (sm >> 4) as f32;
    dl * code(sb, rr, j) as f32 - ml
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
                for k in 0..16 {
                    let mut s = 0i32;
                    for j in 16 * k..16 * k + 16 {
                        s += code(sb, rr, j) * y[4 + j] as i8 as i32;
                    }
                    let sm = sb[SC_AT + k * PACK_ROWS + rr];
                    isum += (sm & 0xF) as i32 * s;
                    msum += (sm >> 4) as i32 * blocks::i16_at(y, Q8K_BSUMS + 2 * k) as i32;
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
