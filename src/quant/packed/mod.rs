//! Weight matrices repacked at load for the CPU's matrix products ("row-interleaved" layout).
//!
//! In a file, a matrix is stored row after row, each row block after block. A dot product of one row
//! with an activation block then ends in a horizontal sum per (row, column, block), and the float work
//! (convert, scale, accumulate) is done on eight lanes that all hold pieces of one number. Here rows come
//! in groups of `PACK_ROWS` (16), and inside a group each block's weights are interleaved four bytes at a
//! time: one 64-byte vector holds four neighbouring weights of each of the 16 rows, so lane `r` of an
//! integer accumulator is row `r`'s own sum. Four activation bytes broadcast to every lane meet those
//! four weights of all 16 rows in one `vpdpbusd`; a block ends with one conversion, one scale product and
//! one fma for 16 rows at once, with no horizontal sum at all.
//!
//! Layout of a group (`group_bytes`, a multiple of 64, rows past the matrix's end are zero):
//!
//! | region | what | bytes |
//! |--------|------|-------|
//! | quants | per block `b`: `vectors` 64-byte vectors, vector `g` = for each row `r`, 4 bytes at `4 r` | `nb * 64 * vectors` |
//! | scales | per block `b`: the 16 rows' f16 scales `d`, row `r` at `2 r` | `nb * 32` |
//!
//! Weights are stored as unsigned codes `u` with `w = u - offset`: q4_0 keeps its nibbles (`offset` 8;
//! vector `g < 4` holds bytes `4g..4g + 4` of each row's `qs`, whose low nibbles are values `4g..` and high
//! nibbles values `16 + 4g..`, so the low nibbles of vector `g` and the high nibbles, as vector `4 + g`, meet
//! activation bytes `4g..` and `16 + 4g..`, i.e. always `4 * (vector index)`); q5_0 is q4_0's four
//! vectors plus a fifth of its high bits (`offset` 16): byte `k` of a row's four holds, in bit `i`, the fifth
//! bit of value `4 i + k`, so value-vector `i`'s bits are that vector shifted by `4 - i` and masked with
//! 0x10 (the same size as the file's blocks); q8_0 stores `q ^ 0x80`
//! (`offset` 128), vector `g` meeting activation bytes `4g..`. The table formats (iq4_nl, mxfp4) keep
//! their nibbles as q4_0 does; a nibble indexes the format's 16 values (`table`) and the code is that value
//! plus 128, as q8_0's, looked up by `pshufb` in the kernels (AVX2 without VNNI takes mxfp4's values, at
//! most 12, plus 12 instead: one code of any offset gives the same integer sum). mxfp4's e8m0 scale is
//! stored as the f16 it equals; a matrix with a scale outside f16's range keeps the file's layout. The integer sum `sum(u * y) - offset *
//! sum(y)` is exact, and `sum(y)` of each activation block is made once per activation row (the q8_0
//! activations' `aux`, see `quant::fill_act_aux`).
//!
//! Arithmetic, the same on every path (the portable code, AVX2, AVX2 with VNNI, AVX-512): per row and
//! column, `acc = fma(dw * dy, isum as f32, acc)` over the blocks in order, starting from 0. So a row's
//! result depends only on its row and its column: batch invariance holds, and so does bit-identity across
//! SIMD paths (tested). The results differ from `vec_dot` (which sums eight lanes per block as ggml does)
//! by float rounding only.

mod iq4xs;
mod lines;
mod q2k;
mod q3k;
mod q4k;
mod q6k;
#[cfg(target_arch = "x86_64")]
mod x86;
#[cfg(target_arch = "x86_64")]
mod x86_iq4xs;
#[cfg(target_arch = "x86_64")]
mod x86_q2k;
#[cfg(target_arch = "x86_64")]
mod x86_q3k;
#[cfg(target_arch = "x86_64")]
mod x86_q4k;
#[cfg(target_arch = "x86_64")]
mod x86_q6k;

#[cfg(test)]
mod tests;

use super::{blocks, ActRow, GgmlType, QuantError, SimdLevel, QK, QK_K};
use lines::Lines;

/// Rows interleaved in one group.
pub const PACK_ROWS: usize = 16;

/// Bytes of one interleaved vector: four bytes of each of the group's rows.
const VECTOR_BYTES: usize = 4 * PACK_ROWS;

/// The families of packed layouts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// 32-value blocks against q8_0 or q8_1 (q4_0, q4_1, q5_0, q5_1, q8_0, iq4_nl, mxfp4): this module.
    Legacy,
    /// q4_K super-blocks: `q4k`.
    Q4K,
    /// q5_K super-blocks: `q4k`'s with fifth bits.
    Q5K,
    /// q6_K super-blocks: `q6k`.
    Q6K,
    /// q3_K super-blocks: `q3k`.
    Q3K,
    /// q2_K super-blocks: `q2k`.
    Q2K,
    /// iq4_xs super-blocks: `iq4xs`.
    IQ4XS,
}

/// What differs between the packed formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Format {
    kind: Kind,
    /// Interleaved vectors per block.
    vectors: usize,
    /// `w = u - offset`.
    offset: i32,
    /// q4_1 / q5_1: `w = d u + m`, against q8_1 (`offset` 0; the scales region holds `m` beside `d`).
    min: bool,
    /// Bytes of a block in the file, and where its quants start.
    file_block_bytes: usize,
    qs_at: usize,
    /// iq4_nl / mxfp4: each nibble indexes this table of i8 values; the code `u` is the value plus
    /// `offset` (128), so the kernels take it as q8_0's flipped bytes once looked up.
    table: Option<&'static [i8; 16]>,
}

const Q4_0_FORMAT: Format =
    Format { kind: Kind::Legacy, vectors: 4, offset: 8, min: false, file_block_bytes: 18, qs_at: 2, table: None };
const Q5_0_FORMAT: Format =
    Format { kind: Kind::Legacy, vectors: 5, offset: 16, min: false, file_block_bytes: 22, qs_at: 6, table: None };
const Q8_0_FORMAT: Format =
    Format { kind: Kind::Legacy, vectors: 8, offset: 128, min: false, file_block_bytes: 34, qs_at: 2, table: None };
const Q4_1_FORMAT: Format =
    Format { kind: Kind::Legacy, vectors: 4, offset: 0, min: true, file_block_bytes: 20, qs_at: 4, table: None };
const Q5_1_FORMAT: Format =
    Format { kind: Kind::Legacy, vectors: 5, offset: 0, min: true, file_block_bytes: 24, qs_at: 8, table: None };
const Q4_K_FORMAT: Format = Format {
    kind: Kind::Q4K,
    vectors: 32,
    offset: 0,
    min: false,
    file_block_bytes: q4k::FILE_BLOCK,
    qs_at: 0,
    table: None,
};
const Q5_K_FORMAT: Format = Format {
    kind: Kind::Q5K,
    vectors: 40,
    offset: 0,
    min: false,
    file_block_bytes: q4k::FILE_BLOCK5,
    qs_at: 0,
    table: None,
};
const Q6_K_FORMAT: Format = Format {
    kind: Kind::Q6K,
    vectors: 48,
    offset: 32,
    min: false,
    file_block_bytes: q6k::FILE_BLOCK,
    qs_at: 0,
    table: None,
};

const Q3_K_FORMAT: Format = Format {
    kind: Kind::Q3K,
    vectors: 24,
    offset: 4,
    min: false,
    file_block_bytes: q3k::FILE_BLOCK,
    qs_at: 0,
    table: None,
};

const Q2_K_FORMAT: Format = Format {
    kind: Kind::Q2K,
    vectors: 16,
    offset: 0,
    min: false,
    file_block_bytes: q2k::FILE_BLOCK,
    qs_at: 0,
    table: None,
};

const IQ4_NL_FORMAT: Format = Format {
    kind: Kind::Legacy,
    vectors: 4,
    offset: 128,
    min: false,
    file_block_bytes: 18,
    qs_at: 2,
    table: Some(&blocks::KVALUES_IQ4NL),
};
/// The block's e8m0 scale is stored as the f16 it equals (`pack` refuses a matrix where one does not fit).
const MXFP4_FORMAT: Format = Format {
    kind: Kind::Legacy,
    vectors: 4,
    offset: 128,
    min: false,
    file_block_bytes: 17,
    qs_at: 1,
    table: Some(&blocks::KVALUES_MXFP4),
};

const IQ4_XS_FORMAT: Format = Format {
    kind: Kind::IQ4XS,
    vectors: 32,
    offset: 0,
    min: false,
    file_block_bytes: iq4xs::FILE_BLOCK,
    qs_at: 0,
    table: None,
};

impl Format {
    /// Values per block.
    fn block_len(self) -> usize {
        match self.kind {
            Kind::Legacy => QK,
            Kind::Q2K | Kind::Q3K | Kind::Q4K | Kind::Q5K | Kind::Q6K | Kind::IQ4XS => QK_K,
        }
    }

    /// Bytes of one super-block of a group (the K-quants).
    fn super_block_bytes(self) -> usize {
        match self.kind {
            Kind::Q4K => q4k::SB_BYTES,
            Kind::Q5K => q4k::SB5_BYTES,
            Kind::Q6K => q6k::SB_BYTES,
            Kind::Q3K => q3k::SB_BYTES,
            Kind::Q2K => q2k::SB_BYTES,
            Kind::IQ4XS => iq4xs::SB_BYTES,
            Kind::Legacy => 0,
        }
    }

    /// Bytes of a group of `nb` blocks: the legacy formats' quants and then their scales, padded to a
    /// cache line; the K-quants' super-blocks (each a whole number of lines).
    fn group_bytes(self, nb: usize) -> usize {
        match self.kind {
            Kind::Legacy => (nb * VECTOR_BYTES * self.vectors + nb * self.scale_bytes()).div_ceil(64) * 64,
            Kind::Q2K | Kind::Q3K | Kind::Q4K | Kind::Q5K | Kind::Q6K | Kind::IQ4XS => nb * self.super_block_bytes(),
        }
    }

    /// Bytes of a legacy block's scales in a group: `d` of each row (f16), and `m` after them.
    fn scale_bytes(self) -> usize {
        2 * PACK_ROWS * (1 + self.min as usize)
    }

    /// The activation type the products take.
    fn act_type(self) -> GgmlType {
        match self.kind {
            Kind::Legacy if self.min => GgmlType::Q8_1,
            Kind::Legacy => GgmlType::Q8_0,
            Kind::Q2K | Kind::Q3K | Kind::Q4K | Kind::Q5K | Kind::Q6K | Kind::IQ4XS => GgmlType::Q8K,
        }
    }
}

/// The packed format of `ty`, if it has one.
fn format(ty: GgmlType) -> Option<Format> {
    match ty {
        GgmlType::Q4_0 => Some(Q4_0_FORMAT),
        GgmlType::Q4_1 => Some(Q4_1_FORMAT),
        GgmlType::Q5_0 => Some(Q5_0_FORMAT),
        GgmlType::Q5_1 => Some(Q5_1_FORMAT),
        GgmlType::Q8_0 => Some(Q8_0_FORMAT),
        GgmlType::IQ4NL => Some(IQ4_NL_FORMAT),
        GgmlType::MXFP4 => Some(MXFP4_FORMAT),
        GgmlType::Q4K => Some(Q4_K_FORMAT),
        GgmlType::Q5K => Some(Q5_K_FORMAT),
        GgmlType::Q6K => Some(Q6_K_FORMAT),
        GgmlType::Q3K => Some(Q3_K_FORMAT),
        GgmlType::Q2K => Some(Q2_K_FORMAT),
        GgmlType::IQ4XS => Some(IQ4_XS_FORMAT),
        _ => None,
    }
}

/// Whether weights of type `ty` are repacked at load.
pub fn packable(ty: GgmlType) -> bool {
    format(ty).is_some()
}

/// A matrix of `rows` rows of `cols` values in the row-interleaved layout (see the module comment).
pub struct PackedMatrix {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    format: Format,
    /// Blocks per row.
    nb: usize,
    group_bytes: usize,
    /// Bytes of an activation column the products take (`cols` values of the format's activation type).
    act_bytes: usize,
    data: Lines, // (groups, group_bytes / 64)
}

impl PackedMatrix {
    /// Packs `rows` rows of `cols` values of type `ty` from their file bytes `src` (row-major).
    pub fn pack(ty: GgmlType, rows: usize, cols: usize, src: &[u8]) -> Result<PackedMatrix, QuantError> {
        let format = format(ty).ok_or(QuantError::NotPackable { ty })?;
        let row_bytes = super::row_len_bytes(ty, cols)?;
        super::check_len(ty, rows * cols, src.len())?;
        let nb = cols / format.block_len();
        let quant_bytes = nb * VECTOR_BYTES * format.vectors;
        let group_bytes = format.group_bytes(nb);
        let total = Self::bytes_for(ty, rows, cols).ok_or(QuantError::NotPackable { ty })?;
        let mut data = Lines::zeroed(total / 64).ok_or(QuantError::NotPackable { ty })?;
        let bytes = data.bytes_mut();
        let flip = if ty == GgmlType::Q8_0 { 0x80 } else { 0 };
        for (r, row) in src.chunks_exact(row_bytes).enumerate() {
            let (g, rr) = (r / PACK_ROWS, r % PACK_ROWS);
            let group = &mut bytes[g * group_bytes..(g + 1) * group_bytes];
            let sbb = format.super_block_bytes();
            for (b, block) in row.chunks_exact(format.file_block_bytes).enumerate() {
                match format.kind {
                    Kind::Q4K | Kind::Q5K => {
                        q4k::pack_block(block, rr, format.kind == Kind::Q5K, &mut group[b * sbb..(b + 1) * sbb])
                    }
                    Kind::Q6K => q6k::pack_block(block, rr, &mut group[b * sbb..(b + 1) * sbb]),
                    Kind::Q3K => q3k::pack_block(block, rr, &mut group[b * sbb..(b + 1) * sbb]),
                    Kind::Q2K => q2k::pack_block(block, rr, &mut group[b * sbb..(b + 1) * sbb]),
                    Kind::IQ4XS => iq4xs::pack_block(block, rr, &mut group[b * sbb..(b + 1) * sbb]),
                    Kind::Legacy => {}
                }
            }
            if format.kind != Kind::Legacy {
                continue;
            }
            for (b, block) in row.chunks_exact(format.file_block_bytes).enumerate() {
                let qs = &block[format.qs_at..];
                for v in 0..format.vectors.min(8) {
                    let at = (b * format.vectors + v) * VECTOR_BYTES + 4 * rr;
                    if format.vectors == 5 && v == 4 {
                        // q5_0's fifth bits: byte k, bit i = the bit of value 4 i + k (see the module comment).
                        let qh = blocks::u32_at(block, format.qs_at - 4);
                        for (k, dst) in group[at..at + 4].iter_mut().enumerate() {
                            *dst = (0..8).map(|i| (((qh >> (4 * i + k)) & 1) as u8) << i).sum();
                        }
                        continue;
                    }
                    for (dst, &q) in group[at..at + 4].iter_mut().zip(&qs[4 * v..4 * v + 4]) {
                        *dst = q ^ flip;
                    }
                }
                let at = quant_bytes + b * format.scale_bytes() + 2 * rr;
                if ty == GgmlType::MXFP4 {
                    // ggml's scale 2^(e - 128) as an f16, which holds 2^-24..2^15 exactly.
                    let d = blocks::e8m0_to_f32_half(block[0]);
                    let h = half::f16::from_f32(d);
                    if h.to_f32() != d {
                        return Err(QuantError::NotPackable { ty });
                    }
                    group[at..at + 2].copy_from_slice(&h.to_bits().to_le_bytes());
                    continue;
                }
                group[at..at + 2].copy_from_slice(&block[..2]);
                if format.min {
                    group[at + 2 * PACK_ROWS..at + 2 * PACK_ROWS + 2].copy_from_slice(&block[2..4]);
                }
            }
        }
        let act_bytes = super::row_len_bytes(format.act_type(), cols)?;
        Ok(PackedMatrix { ty, rows, cols, format, nb, group_bytes, act_bytes, data })
    }

    /// Bytes a packed matrix of `rows` rows of `cols` values of type `ty` holds, or `None` when the type
    /// has no packed layout or the shape is not whole blocks.
    pub fn bytes_for(ty: GgmlType, rows: usize, cols: usize) -> Option<usize> {
        let f = format(ty)?;
        if cols == 0 || !cols.is_multiple_of(f.block_len()) {
            return None;
        }
        Some(rows.div_ceil(PACK_ROWS) * f.group_bytes(cols / f.block_len()))
    }

    /// Bytes this matrix holds in memory.
    pub fn bytes(&self) -> usize {
        self.data.len() * 64
    }

    /// Groups of `PACK_ROWS` rows (the last one may be partly padding).
    pub fn groups(&self) -> usize {
        self.rows.div_ceil(PACK_ROWS)
    }

    fn group(&self, g: usize) -> &[u8] {
        // SAFETY: as in `pack`; the group lies inside `data`.
        let all = unsafe { std::slice::from_raw_parts(self.data.as_ptr() as *const u8, self.data.len() * 64) };
        &all[g * self.group_bytes..(g + 1) * self.group_bytes]
    }

    /// Row `r`'s scale, min (0 without) and unsigned code at column `c`.
    fn code(&self, r: usize, c: usize) -> (f32, f32, i32) {
        let group = self.group(r / PACK_ROWS);
        let (rr, b, j) = (r % PACK_ROWS, c / QK, c % QK);
        let (d, m) = legacy_scales(self.format, self.nb, group, b, rr);
        let block = &group[b * self.format.vectors * VECTOR_BYTES..];
        (d, m, legacy_code(block, self.format, rr, j))
    }

    /// Value `(r, c)`, exactly as `dequantize_value` gives it from the file's row.
    ///
    /// # Panics
    /// When `(r, c)` lies outside the matrix.
    pub fn value(&self, r: usize, c: usize) -> f32 {
        assert!(
            r < self.rows && c < self.cols,
            "PackedMatrix::value: ({r}, {c}) is outside {}x{}",
            self.rows,
            self.cols
        );
        if self.format.kind != Kind::Legacy {
            let (b, j, sbb) = (c / QK_K, c % QK_K, self.format.super_block_bytes());
            let sb = &self.group(r / PACK_ROWS)[b * sbb..(b + 1) * sbb];
            return match self.format.kind {
                Kind::Q4K => q4k::value(sb, r % PACK_ROWS, false, j),
                Kind::Q5K => q4k::value(sb, r % PACK_ROWS, true, j),
                Kind::IQ4XS => iq4xs::value(sb, r % PACK_ROWS, j),
                Kind::Q3K => q3k::value(sb, r % PACK_ROWS, j),
                Kind::Q2K => q2k::value(sb, r % PACK_ROWS, j),
                _ => q6k::value(sb, r % PACK_ROWS, j),
            };
        }
        let (d, m, u) = self.code(r, c);
        legacy_value(self.format, u, d, m)
    }

    /// Starts loading (into L2) the first bytes of groups `g0..g1`, as far as the kernels prefetch ahead:
    /// a thread that begins a run of groups elsewhere in the matrix would otherwise wait on DRAM for that
    /// distance, where the kernels' own prefetch has not reached yet. Only a hint; no effect elsewhere.
    pub fn prefetch_start(&self, g0: usize, g1: usize) {
        #[cfg(target_arch = "x86_64")]
        {
            let (from, to) = (g0 * self.group_bytes, (g1.min(self.groups()) * self.group_bytes));
            let ahead = match self.format.kind {
                // Called for the passes of a few tokens, which stream the weights: a decoding pass's distance.
                Kind::Legacy => x86::legacy_distances(super::simd_level(), self.format, 1).0,
                Kind::Q2K | Kind::Q3K | Kind::Q4K | Kind::Q5K | Kind::Q6K | Kind::IQ4XS => x86::PREFETCH_BYTES,
            };
            let to = to.min(from + ahead);
            let base = self.data.as_ptr() as *const u8;
            for at in (from..to).step_by(64) {
                // SAFETY: `at` is inside `data` (at most `groups * group_bytes`); a prefetch reads nothing.
                unsafe {
                    std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(base.add(at) as *const i8)
                };
            }
        }
        let _ = (g0, g1);
    }

    /// Values `(r, c)` for rows `r0..r0 + out.len()` (all in one group), as `value` gives each: the outlier
    /// corrections read a column of a tile this way, sixteen rows from one vector and one scales line.
    ///
    /// # Panics
    /// When the rows leave their group or the matrix, or `c` is outside it.
    pub fn values_in_group(&self, r0: usize, c: usize, out: &mut [f32]) {
        let (g, rr0) = (r0 / PACK_ROWS, r0 % PACK_ROWS);
        assert!(
            rr0 + out.len() <= PACK_ROWS && r0 + out.len() <= self.rows && c < self.cols,
            "PackedMatrix::values_in_group: rows {r0}..{} at column {c} of {}x{}",
            r0 + out.len(),
            self.rows,
            self.cols
        );
        if self.format.kind != Kind::Legacy {
            for (i, o) in out.iter_mut().enumerate() {
                *o = self.value(r0 + i, c);
            }
            return;
        }
        use half::slice::HalfFloatSliceExt;
        let f = self.format;
        let group = self.group(g);
        let (b, j) = (c / QK, c % QK);
        let block = &group[b * f.vectors * VECTOR_BYTES..];
        // The block's scales of all sixteen rows (and their mins), converted at once.
        let at = legacy_scales_at(f, self.nb, b);
        let mut dm = [0f32; 2 * PACK_ROWS];
        let halves: &[half::f16] = bytemuck::cast_slice(&group[at..at + f.scale_bytes()]);
        halves.convert_to_f32_slice(&mut dm[..halves.len()]);
        for (i, o) in out.iter_mut().enumerate() {
            let rr = rr0 + i;
            let u = legacy_code(block, f, rr, j);
            *o = legacy_value(f, u, dm[rr], if f.min { dm[PACK_ROWS + rr] } else { 0.0 });
        }
    }

    /// Dot products of group `g`'s rows with activation columns `xs` (q8_0 each with its `aux`; q8_K for
    /// q4_K):
    /// `out[c * PACK_ROWS + r]` for row `g * PACK_ROWS + r` (padding rows give 0).
    ///
    /// # Panics
    /// When a column is not `cols` values of q8_0 with complete `aux`, or `out` is not `PACK_ROWS` per column.
    pub fn tile(&self, g: usize, xs: &[ActRow], out: &mut [f32]) {
        self.tile_on(super::simd_level(), g, xs, out)
    }

    /// `tile` for a thread that goes on to groups `g + 1..g_end` and no further: the kernels prefetch
    /// ahead only within them (bytes past a thread's run would be read from DRAM for nothing, or for the
    /// thread that runs them).
    pub fn tile_within(&self, g: usize, g_end: usize, xs: &[ActRow], out: &mut [f32]) {
        let ahead = g_end.saturating_sub(g).max(1) * self.group_bytes;
        self.tile_at(super::simd_level(), g, ahead, xs, out)
    }

    /// `tile` on the given SIMD path (which must be available on this CPU).
    pub(crate) fn tile_on(&self, level: SimdLevel, g: usize, xs: &[ActRow], out: &mut [f32]) {
        self.tile_at(level, g, usize::MAX, xs, out)
    }

    /// `tile_on` prefetching only the first `ahead` bytes from group `g`'s start.
    fn tile_at(&self, level: SimdLevel, g: usize, ahead: usize, xs: &[ActRow], out: &mut [f32]) {
        assert_eq!(
            out.len(),
            xs.len() * PACK_ROWS,
            "PackedMatrix::tile: {} outputs for {} columns",
            out.len(),
            xs.len()
        );
        assert!(g < self.groups(), "PackedMatrix::tile: group {g} of {}", self.groups());
        let legacy = self.format.kind == Kind::Legacy;
        for x in xs {
            // One compare per column on this hot path; the message names the mismatch when it fails.
            if x.q.len() != self.act_bytes || (legacy && x.aux.len() != 2 * self.nb) {
                panic!(
                    "PackedMatrix::tile: a column of {} bytes and {} aux values for {} values of {} ({} bytes{})",
                    x.q.len(),
                    x.aux.len(),
                    self.cols,
                    self.format.act_type(),
                    self.act_bytes,
                    if legacy { format!(", {} aux values", 2 * self.nb) } else { String::new() }
                );
            }
        }
        let group = self.group(g);
        match self.format.kind {
            Kind::Q4K | Kind::Q5K => {
                let five = self.format.kind == Kind::Q5K;
                #[cfg(target_arch = "x86_64")]
                if level.avx2() {
                    // SAFETY: as below, for q4_K / q5_K super-blocks and q8_K columns.
                    unsafe { x86_q4k::tile(level, five, self.nb, group, xs, out) };
                    return;
                }
                return q4k::tile_portable(self.nb, five, group, xs, out);
            }
            Kind::IQ4XS => {
                #[cfg(target_arch = "x86_64")]
                if level.avx2() {
                    // SAFETY: as below, for iq4_xs super-blocks and q8_K columns.
                    unsafe { x86_iq4xs::tile(level, self.nb, group, xs, out) };
                    return;
                }
                return iq4xs::tile_portable(self.nb, group, xs, out);
            }
            Kind::Q2K => {
                #[cfg(target_arch = "x86_64")]
                if level.avx2() {
                    // SAFETY: as below, for q2_K super-blocks and q8_K columns.
                    unsafe { x86_q2k::tile(level, self.nb, group, xs, out) };
                    return;
                }
                return q2k::tile_portable(self.nb, group, xs, out);
            }
            Kind::Q3K => {
                #[cfg(target_arch = "x86_64")]
                if level.avx2() {
                    // SAFETY: as below, for q3_K super-blocks and q8_K columns.
                    unsafe { x86_q3k::tile(level, self.nb, group, xs, out) };
                    return;
                }
                return q3k::tile_portable(self.nb, group, xs, out);
            }
            Kind::Q6K => {
                #[cfg(target_arch = "x86_64")]
                if level.avx2() {
                    // SAFETY: as below, for q6_K super-blocks and q8_K columns.
                    unsafe { x86_q6k::tile(level, self.nb, group, xs, out) };
                    return;
                }
                return q6k::tile_portable(self.nb, group, xs, out);
            }
            Kind::Legacy => {}
        }
        #[cfg(target_arch = "x86_64")]
        if level.avx2() {
            // SAFETY: the level's features are present (the caller's promise, `simd_level` or a test that
            // checked); the group holds `nb` blocks and every column `nb` blocks and `2 * nb` aux values.
            unsafe { x86::tile(level, self.format, self.nb, group, ahead, xs, out) };
            return;
        }
        let _ = level;
        tile_portable(self.format, self.nb, group, xs, out);
    }
}

/// Where block `b`'s scales (the 16 rows' `d`, then with a min their `m`) start in a legacy group of `nb`
/// blocks: after all the blocks' quants.
fn legacy_scales_at(f: Format, nb: usize, b: usize) -> usize {
    nb * VECTOR_BYTES * f.vectors + b * f.scale_bytes()
}

/// A legacy weight from its unsigned code `u` and its row's `d` and `m` (0 without): ggml's `q * d + m` for
/// q4_1 / q5_1, `(u - offset) * d` for the others.
fn legacy_value(f: Format, u: i32, d: f32, m: f32) -> f32 {
    if f.min {
        u as f32 * d + m
    } else {
        (u - f.offset) as f32 * d
    }
}

/// Row `rr`'s `d` and `m` (0 without) of block `b` in a legacy group of `nb` blocks.
fn legacy_scales(f: Format, nb: usize, group: &[u8], b: usize, rr: usize) -> (f32, f32) {
    let at = legacy_scales_at(f, nb, b) + 2 * rr;
    let m = if f.min { blocks::f16_at(group, at + 2 * PACK_ROWS) } else { 0.0 };
    (blocks::f16_at(group, at), m)
}

/// The portable kernel: the arithmetic every path follows (see the module comment).
fn tile_portable(f: Format, nb: usize, group: &[u8], xs: &[ActRow], out: &mut [f32]) {
    let (y_block, y_qs) = if f.min { (36, 4) } else { (34, 2) };
    for (x, out) in xs.iter().zip(out.chunks_exact_mut(PACK_ROWS)) {
        for (r, o) in out.iter_mut().enumerate() {
            let mut acc = 0f32;
            for b in 0..nb {
                let block = &group[b * f.vectors * VECTOR_BYTES..];
                let y = &x.q[b * y_block + y_qs..(b + 1) * y_block];
                let mut isum = 0i32;
                for (j, &y) in y.iter().enumerate() {
                    isum += legacy_code(block, f, r, j) * y as i8 as i32;
                }
                let (dw, mw) = legacy_scales(f, nb, group, b, r);
                if f.min {
                    // The block's two terms largely cancel (m is about -8 d): summed first, rounded once.
                    acc += (dw * x.aux[2 * b]).mul_add(isum as f32, mw * x.aux[2 * b + 1]);
                } else {
                    isum -= f.offset * x.aux[2 * b + 1] as i32;
                    acc = (dw * x.aux[2 * b]).mul_add(isum as f32, acc);
                }
            }
            *o = acc;
        }
    }
}

/// The unsigned code of value `j` (0..32) of row `rr` in a packed legacy block of `f.vectors` vectors:
/// value `4 i + k` sits in byte `k` of value-vector `i`, which is vector `i` (q8_0), or the low nibbles of
/// vector `i` / high nibbles of vector `i - 4` (q4_0, q5_0, and the table formats, whose nibble indexes
/// `f.table`), with q5_0's fifth bit as bit `i` of vector 4's byte.
fn legacy_code(block: &[u8], f: Format, rr: usize, j: usize) -> i32 {
    let (vectors, (i, k)) = (f.vectors, (j / 4, j % 4));
    let at = |v: usize| block[v * VECTOR_BYTES + 4 * rr + k];
    if vectors == 8 {
        return at(i) as i32;
    }
    let nibble = if i < 4 { at(i) & 0x0F } else { at(i - 4) >> 4 };
    if let Some(table) = f.table {
        return table[nibble as usize] as i32 + f.offset;
    }
    let high = if vectors == 5 { ((at(4) >> i) & 1) << 4 } else { 0 };
    (nibble | high) as i32
}
