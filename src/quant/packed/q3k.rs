//! The q3_K row-interleaved layout: 256-value super-blocks of 16 rows, against q8_K activations.
//!
//! Value-vector `i` (0..64) of a super-block holds values `4 i..4 i + 4` of each row (`4` bytes at `4 r`), as
//! unsigned codes `u = q + 4` (0..7): two low bits and a high bit, stored apart as the file does. A
//! super-block of a group (`SB_BYTES`, 29 cache lines):
//!
//! | at | what | bytes |
//! |----|------|-------|
//! | 0 | low bits: vector `v` (0..16), bits `2 m..2 m + 2` of a byte = value-vector `v + 16 m`'s (m 0..4) | 1024 |
//! | 1024 | high bits: vector `v` (0..8), bit `m` of a byte = value-vector `v + 8 m`'s (m 0..8) | 512 |
//! | 1536 | sub-block scales (i8, the file's 6-bit scale less 32), `[k][r]` for the 16 sub-blocks of 16 values | 256 |
//! | 1792 | `d` of each row, f16 | 32 |
//! | 1824 | padding to a cache line | 32 |
//!
//! Sub-block `k` is value-vectors `4 k..4 k + 4`: its low bits are in vectors `4 (k % 4)..` at bit `2 (k / 4)`,
//! its high bits in vectors `4 (k % 2)..` at bit `k / 2`, so the kernels take sub-blocks `k, k + 4, k + 8,
//! k + 12` from one load of four low-bit vectors.
//!
//! Arithmetic, the same on every path: per sub-block the exact `s_k = sum(u * y) - 4 * bsums[k]` (q8_K keeps
//! the sum of every 16 activations); per super-block `isum = sum_k sc_k * s_k` in i32 (exact: ggml's integer
//! with signed codes), then `acc = fma(d * dy, isum as f32, acc)`, super-blocks in order.

use super::super::blocks::{self, Q3K_D, Q3K_HMASK, Q3K_QS, Q3K_SCALES, Q8K_BSUMS};
use super::{ActRow, PACK_ROWS, VECTOR_BYTES};

/// Bytes of one super-block of a group.
pub(super) const SB_BYTES: usize = 1856;
pub(super) const HI_AT: usize = 1024;
pub(super) const SC_AT: usize = 1536;
pub(super) const D_AT: usize = 1792;
/// Bytes of a q3_K block in the file, and of a q8_K activation block.
pub(super) const FILE_BLOCK: usize = 110;
pub(super) const Y_BLOCK: usize = 292;

/// The unsigned code (0..7) of value `j` in a q3_K file block.
fn file_code(block: &[u8], j: usize) -> u8 {
    // ggml's order: halves `h` of 128; in each, quarter `m` of 32 values reads bits 2 m of qs[32 h + l] and
    // bit 4 h + m of hmask[l] (set: the value is the low bits; clear: they less 4).
    let (h, m, l) = (j / 128, (j % 128) / 32, j % 32);
    let low = (block[Q3K_QS + 32 * h + l] >> (2 * m)) & 3;
    let high = (block[Q3K_HMASK + l] >> (4 * h + m)) & 1;
    low | (high << 2)
}

/// Writes row `rr`'s file block `block` into the group's super-block `sb`.
pub(super) fn pack_block(block: &[u8], rr: usize, sb: &mut [u8]) {
    for i in 0..64 {
        for k in 0..4 {
            let u = file_code(block, 4 * i + k);
            sb[(i % 16) * VECTOR_BYTES + 4 * rr + k] |= (u & 3) << (2 * (i / 16));
            sb[HI_AT + (i % 8) * VECTOR_BYTES + 4 * rr + k] |= (u >> 2) << (i / 8);
        }
    }
    for k in 0..16 {
        sb[SC_AT + k * PACK_ROWS + rr] = blocks::q3k_scale(k, &block[Q3K_SCALES..Q3K_SCALES + 12]) as i8 as u8;
    }
    sb[D_AT + 2 * rr..D_AT + 2 * rr + 2].copy_from_slice(&block[Q3K_D..Q3K_D + 2]);
}

/// The unsigned code of value `j` (0..256) of row `rr` in super-block `sb`.
fn code(sb: &[u8], rr: usize, j: usize) -> i32 {
    let (i, k) = (j / 4, j % 4);
    let low = (sb[(i % 16) * VECTOR_BYTES + 4 * rr + k] >> (2 * (i / 16))) & 3;
    let high = (sb[HI_AT + (i % 8) * VECTOR_BYTES + 4 * rr + k] >> (i / 8)) & 1;
    (low | (high << 2)) as i32
}

/// Value `j` (0..256) of row `rr` in super-block `sb`, as ggml's `dequantize_row_q3_K` gives it.
pub(super) fn value(sb: &[u8], rr: usize, j: usize) -> f32 {
    let d = blocks::f16_at(sb, D_AT + 2 * rr);
    let sc = sb[SC_AT + (j / 16) * PACK_ROWS + rr] as i8;
    d * sc as f32 * (code(sb, rr, j) - 4) as f32
}

/// The portable kernel over `nb` super-blocks of a group (see the module comment).
pub(super) fn tile_portable(nb: usize, group: &[u8], xs: &[ActRow], out: &mut [f32]) {
    for (x, out) in xs.iter().zip(out.chunks_exact_mut(PACK_ROWS)) {
        for (rr, o) in out.iter_mut().enumerate() {
            let mut acc = 0f32;
            for b in 0..nb {
                let sb = &group[b * SB_BYTES..(b + 1) * SB_BYTES];
                let y = &x.q[b * Y_BLOCK..(b + 1) * Y_BLOCK];
                let mut isum = 0i32;
                for k in 0..16 {
                    let mut s = 0i32;
                    for j in 16 * k..16 * k + 16 {
                        s += code(sb, rr, j) * y[4 + j] as i8 as i32;
                    }
                    s -= 4 * blocks::i16_at(y, Q8K_BSUMS + 2 * k) as i32;
                    isum += sb[SC_AT + k * PACK_ROWS + rr] as i8 as i32 * s;
                }
                let dy = blocks::f32_at(y, 0);
                let d = blocks::f16_at(sb, D_AT + 2 * rr);
                acc = (d * dy).mul_add(isum as f32, acc);
            }
            *o = acc;
        }
    }
}
