//! The q6_K row-interleaved layout: 256-value super-blocks of 16 rows, against q8_K activations.
//!
//! Value-vector `i` (0..64) of a super-block holds values `4 i..4 i + 4` of each row (`4` bytes at `4 r`), as
//! unsigned codes `u = q + 32` (0..63). They are stored split, as the file does, into a low nibble and two
//! high bits. A super-block of a group (`SB_BYTES`, 53 cache lines):
//!
//! | at | what | bytes |
//! |----|------|-------|
//! | 0 | low nibbles: vector `v` (0..32) = value-vector `v` in the low nibbles, `v + 32` in the high ones | 2048 |
//! | 2048 | high bits: vector `k` (0..16) = bits `2 g..2 g + 2` of a byte are those of value-vector `4 k + g`'s byte | 1024 |
//! | 3072 | sub-block scales (i8), `[k][r]` for the 16 sub-blocks of 16 values | 256 |
//! | 3328 | `d` of each row, f16 | 32 |
//! | 3360 | padding to a cache line | 32 |
//!
//! Sub-block `k` is value-vectors `4 k..4 k + 4`, and its scale is the file's `scales[k]` (ggml's index of
//! value `j`'s scale is `j / 16`).
//!
//! Arithmetic, the same on every path: per sub-block the exact `s_k = sum(u * y) - 32 * bsums[k]` (q8_K keeps
//! the sum of every 16 activations); per super-block `isum = sum_k sc_k * s_k` in i32 (exact: ggml's integer
//! with signed codes), then `acc = fma(d * dy, isum as f32, acc)`, super-blocks in order.

use super::super::blocks::{self, Q6K_D, Q6K_QH, Q6K_QL, Q6K_SCALES, Q8K_BSUMS};
use super::{ActRow, PACK_ROWS, VECTOR_BYTES};

/// Bytes of one super-block of a group.
pub(super) const SB_BYTES: usize = 3392;
pub(super) const HI_AT: usize = 2048;
pub(super) const SC_AT: usize = 3072;
pub(super) const D_AT: usize = 3328;
/// Bytes of a q6_K block in the file, and of a q8_K activation block.
pub(super) const FILE_BLOCK: usize = 210;
pub(super) const Y_BLOCK: usize = 292;

/// The unsigned code (0..63) of value `j` in a q6_K file block.
fn file_code(block: &[u8], j: usize) -> u8 {
    // ggml's order: halves of 128; in each, quarter `m` of 32 values reads ql[l] / ql[l + 32] (low, then
    // high nibbles) and bits 2 m of qh[l].
    let (half, m, l) = (j / 128, (j % 128) / 32, j % 32);
    let ql = block[Q6K_QL + 64 * half + l + 32 * (m % 2)];
    let nibble = if m < 2 { ql & 0x0F } else { ql >> 4 };
    let high = (block[Q6K_QH + 32 * half + l] >> (2 * m)) & 3;
    nibble | (high << 4)
}

/// Writes row `rr`'s file block `block` into the group's super-block `sb`.
pub(super) fn pack_block(block: &[u8], rr: usize, sb: &mut [u8]) {
    for i in 0..64 {
        for k in 0..4 {
            let u = file_code(block, 4 * i + k);
            let lo = (i % 32) * VECTOR_BYTES + 4 * rr + k;
            sb[lo] |= if i < 32 { u & 0x0F } else { (u & 0x0F) << 4 };
            let hi = HI_AT + (i / 4) * VECTOR_BYTES + 4 * rr + k;
            sb[hi] |= (u >> 4) << (2 * (i % 4));
        }
    }
    for k in 0..16 {
        sb[SC_AT + k * PACK_ROWS + rr] = block[Q6K_SCALES + k];
    }
    sb[D_AT + 2 * rr..D_AT + 2 * rr + 2].copy_from_slice(&block[Q6K_D..Q6K_D + 2]);
}

/// The unsigned code of value `j` (0..256) of row `rr` in super-block `sb`.
fn code(sb: &[u8], rr: usize, j: usize) -> i32 {
    let (i, k) = (j / 4, j % 4);
    let lo = sb[(i % 32) * VECTOR_BYTES + 4 * rr + k];
    let nibble = if i < 32 { lo & 0x0F } else { lo >> 4 };
    let high = (sb[HI_AT + (i / 4) * VECTOR_BYTES + 4 * rr + k] >> (2 * (i % 4))) & 3;
    (nibble | (high << 4)) as i32
}

/// Value `j` (0..256) of row `rr` in super-block `sb`, as ggml's `dequantize_row_q6_K` gives it.
pub(super) fn value(sb: &[u8], rr: usize, j: usize) -> f32 {
    let d = blocks::f16_at(sb, D_AT + 2 * rr);
    let sc = sb[SC_AT + (j / 16) * PACK_ROWS + rr] as i8;
    d * sc as f32 * (code(sb, rr, j) - 32) as f32
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
                    s -= 32 * blocks::i16_at(y, Q8K_BSUMS + 2 * k) as i32;
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
