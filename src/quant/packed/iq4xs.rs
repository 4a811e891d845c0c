//! The iq4_xs row-interleaved layout: 256-value super-blocks of 16 rows against q8_K activations, in
//! q4_K's arrangement of quants (so the kernels meet the activations the same way) with its table values.
//!
//! A super-block of a group (`SB_BYTES`, 35 cache lines):
//!
//! | at | what | bytes |
//! |----|------|-------|
//! | 0 | quants: vector `8 j + g` = for each row `r`, 4 bytes at `4 r`: the nibbles of values `64 j + 4 g..` (low) and `64 j + 32 + 4 g..` (high) | 2048 |
//! | 2048 | sub-block scales `sc[k] = ls - 32` (i8), `[k][r]` | 128 |
//! | 2176 | `d` of each row, f16 | 32 |
//! | 2208 | padding to a cache line | 32 |
//!
//! The file keeps a sub-block's 32 nibbles as its own 16 bytes (low nibbles values `0..16`, high `16..32`);
//! packing moves them into q4_K's order above, so value-vector `g` of sub-block `k` meets activation bytes
//! `32 k + 4 g..`. A nibble indexes `KVALUES_IQ4NL`.
//!
//! Arithmetic, the same on every path: per sub-block `k` the exact sum `s_k = sum(value * y)`; per
//! super-block `isum = sum_k sc_k * s_k` in i32 (at most 8 * 32 * 32 * 127 * 127 in magnitude), then
//! `acc = fma(d * dy, isum as f32, acc)`, super-blocks in order. The VNNI kernels take `value + 128` as an
//! unsigned code and take `128 * sum_k sc_k * bsum_k` back off: the same integer.

use super::super::blocks::{self, iq4xs_scale, IQ4XS_QS, KVALUES_IQ4NL};
use super::q4k::Y_BLOCK;
use super::{ActRow, PACK_ROWS, VECTOR_BYTES};

/// Bytes of one super-block of a group, and where its regions start.
pub(super) const SB_BYTES: usize = 2240;
pub(super) const SC_AT: usize = 2048;
pub(super) const D_AT: usize = 2176;
/// Bytes of an iq4_xs block in the file.
pub(super) const FILE_BLOCK: usize = 136;

/// The nibble of value `j` (0..256) in a file block's quants `qs` (128 bytes).
fn file_nibble(qs: &[u8], j: usize) -> u8 {
    let (ib, l) = (j / 32, j % 32);
    let byte = qs[16 * ib + l % 16];
    if l < 16 {
        byte & 0x0F
    } else {
        byte >> 4
    }
}

/// Writes row `rr`'s file block `block` into the group's super-block `sb`.
pub(super) fn pack_block(block: &[u8], rr: usize, sb: &mut [u8]) {
    let qs = &block[IQ4XS_QS..IQ4XS_QS + 128];
    for j in 0..4 {
        for l in 0..32 {
            let (lo, hi) = (file_nibble(qs, 64 * j + l), file_nibble(qs, 64 * j + 32 + l));
            sb[(8 * j + l / 4) * VECTOR_BYTES + 4 * rr + l % 4] = lo | (hi << 4);
        }
    }
    for k in 0..8 {
        sb[SC_AT + k * PACK_ROWS + rr] = iq4xs_scale(k, block) as i8 as u8;
    }
    sb[D_AT + 2 * rr..D_AT + 2 * rr + 2].copy_from_slice(&block[0..2]);
}

/// The table value of value `j` (0..256) of row `rr` in super-block `sb`.
fn table_value(sb: &[u8], rr: usize, j: usize) -> i32 {
    let (chunk, l) = (j / 64, j % 64);
    let (high, l) = (l >= 32, l % 32);
    let byte = sb[(8 * chunk + l / 4) * VECTOR_BYTES + 4 * rr + l % 4];
    KVALUES_IQ4NL[(if high { byte >> 4 } else { byte & 0x0F }) as usize] as i32
}

/// Value `j` (0..256) of row `rr` in super-block `sb`, as ggml's `dequantize_row_iq4_xs` gives it.
pub(super) fn value(sb: &[u8], rr: usize, j: usize) -> f32 {
    let sc = sb[SC_AT + (j / 32) * PACK_ROWS + rr] as i8;
    (blocks::f16_at(sb, D_AT + 2 * rr) * sc as f32) * table_value(sb, rr, j) as f32
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
                for k in 0..8 {
                    let s: i32 =
                        (0..32).map(|l| table_value(sb, rr, 32 * k + l) * y[4 + 32 * k + l] as i8 as i32).sum();
                    isum += sb[SC_AT + k * PACK_ROWS + rr] as i8 as i32 * s;
                }
                let dy = blocks::f32_at(y, 0);
                acc = (blocks::f16_at(sb, D_AT + 2 * rr) * dy).mul_add(isum as f32, acc);
            }
            *o = acc;
        }
    }
}
