//! Tests of the row-interleaved layout: it holds the file's values, every SIMD path gives the portable
//! kernel's bits, a column's results do not depend on the columns beside it, and the products are the
//! dot products of the dequantized operands to within rounding.

use super::*;
use crate::quant::{dequantize_row, dequantize_value, fill_act_aux, quantize_row_act, row_len_bytes};
use half::f16;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const TYPES: [GgmlType; 13] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
    GgmlType::Q3K,
    GgmlType::Q2K,
    GgmlType::IQ4NL,
    GgmlType::MXFP4,
    GgmlType::IQ4XS,
];

/// Random block bytes with sane scales: every code, -128 included for q8_0.
fn random_matrix(rng: &mut StdRng, ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let mut w: Vec<u8> = (0..rows * row_len_bytes(ty, cols).unwrap()).map(|_| rng.gen()).collect();
    for b in w.chunks_exact_mut(ty.block_bytes()) {
        if ty == GgmlType::MXFP4 {
            // An e8m0 exponent whose scale 2^(e - 128) an f16 holds (the packed layout's limit).
            b[0] = rng.gen_range(104..=143);
            continue;
        }
        // Where the f16 scales sit: q4_K's d and dmin (both used with either sign), q2_K's after its quants,
        // q6_K's and q3_K's d at the end.
        let at: &[usize] = match ty {
            GgmlType::Q4K | GgmlType::Q5K | GgmlType::Q4_1 | GgmlType::Q5_1 => &[0, 2],
            GgmlType::Q2K => &[crate::quant::blocks::Q2K_D, crate::quant::blocks::Q2K_DMIN],
            GgmlType::Q6K => &[crate::quant::blocks::Q6K_D],
            GgmlType::Q3K => &[crate::quant::blocks::Q3K_D],
            _ => &[0],
        };
        for &at in at {
            let d = rng.gen_range(-0.1f32..0.1);
            b[at..at + 2].copy_from_slice(&f16::from_f32(d).to_bits().to_le_bytes());
        }
    }
    w
}

/// An activation column of `n` values for weights of type `ty` as `QuantActs` keeps it: the bytes in the
/// type's `vec_dot_type` and their aux.
fn column(rng: &mut StdRng, ty: GgmlType, n: usize, extreme: bool) -> (Vec<u8>, Vec<f32>) {
    let x: Vec<f32> = (0..n)
        .map(|i| match (extreme, i % 3) {
            (true, 0) => -1.0,
            (true, _) => 1.0,
            _ => rng.gen_range(-1.0f32..1.0),
        })
        .collect();
    let ta = crate::quant::vec_dot_type(ty);
    let mut q = vec![0u8; row_len_bytes(ta, n).unwrap()];
    quantize_row_act(ta, &x, &mut q);
    let mut aux = vec![0f32; crate::quant::act_aux_len(ta, n)];
    fill_act_aux(ta, n, &q, &mut aux);
    (q, aux)
}

/// Column counts that fit the type's blocks: the legacy count, or the next multiple of 256 for K-quants.
fn cols_for(ty: GgmlType, legacy: usize) -> usize {
    if ty.block_len() == crate::quant::QK_K {
        legacy.div_ceil(256) * 256
    } else {
        legacy
    }
}

fn levels() -> Vec<SimdLevel> {
    let mut l = vec![SimdLevel::Scalar];
    #[cfg(target_arch = "x86_64")]
    {
        let best = crate::quant::simd_level();
        if best.avx2() {
            l.push(SimdLevel::Avx2);
        }
        if best.vnni() {
            l.push(SimdLevel::Avx2Vnni);
        }
        if best == SimdLevel::Avx512 {
            l.push(SimdLevel::Avx512);
        }
        if l.len() < 4 {
            println!(
                "note: this CPU runs {} of the 4 paths (best: {best:?}); the others are not checked here",
                l.len()
            );
        }
    }
    l
}

#[test]
fn packed_values_are_the_file_values() {
    let mut rng = StdRng::seed_from_u64(21);
    for ty in TYPES {
        for (rows, cols) in [(37, 64), (16, 576), (5, 32)] {
            let cols = cols_for(ty, cols);
            let w = random_matrix(&mut rng, ty, rows, cols);
            let p = PackedMatrix::pack(ty, rows, cols, &w).unwrap();
            assert_eq!(p.groups(), rows.div_ceil(PACK_ROWS));
            assert_eq!(p.bytes() % 64, 0);
            let rb = row_len_bytes(ty, cols).unwrap();
            let mut row = vec![0f32; cols];
            for r in 0..rows {
                dequantize_row(ty, &w[r * rb..(r + 1) * rb], &mut row);
                for (c, &want) in row.iter().enumerate() {
                    let got = p.value(r, c);
                    assert_eq!(got.to_bits(), want.to_bits(), "{ty} ({r}, {c}): {got} vs {want}");
                    assert_eq!(dequantize_value(ty, &w[r * rb..], c).to_bits(), want.to_bits());
                }
            }
            // A column of a group at once, from every row to the group's end (or the matrix's).
            for c in [0, 1, 5, cols / 2 + 3, cols - 1] {
                for r0 in [0, 3, 15, 16, 20].into_iter().filter(|&r| r < rows) {
                    let end = ((r0 / PACK_ROWS + 1) * PACK_ROWS).min(rows);
                    let mut got = vec![0f32; end - r0];
                    p.values_in_group(r0, c, &mut got);
                    for (i, g) in got.iter().enumerate() {
                        assert_eq!(g.to_bits(), p.value(r0 + i, c).to_bits(), "{ty} rows from {r0}, column {c}");
                    }
                }
            }
        }
    }
}

#[test]
fn every_path_gives_the_portable_bits_and_columns_are_independent() {
    let mut rng = StdRng::seed_from_u64(22);
    // 2,304 columns: wider than one chunk of the AVX2 kernels' blocks (`x86::chunk_blocks`) in every format.
    for (ty, (rows, width)) in TYPES.into_iter().flat_map(|t| [(t, (40, 576)), (t, (16, 2304))]) {
        let cols = cols_for(ty, width);
        let w = random_matrix(&mut rng, ty, rows, cols);
        let p = PackedMatrix::pack(ty, rows, cols, &w).unwrap();
        let data: Vec<(Vec<u8>, Vec<f32>)> = (0..8).map(|i| column(&mut rng, ty, cols, i == 5)).collect();
        let xs: Vec<ActRow> = data.iter().map(|(q, aux)| ActRow { q, aux }).collect();
        for g in 0..p.groups() {
            let mut want = vec![0f32; 8 * PACK_ROWS];
            p.tile_on(SimdLevel::Scalar, g, &xs, &mut want);
            for level in levels() {
                // All eight columns at once, and each column alone.
                let mut all = vec![0f32; 8 * PACK_ROWS];
                p.tile_on(level, g, &xs, &mut all);
                for (c, x) in xs.iter().enumerate() {
                    let mut one = vec![0f32; PACK_ROWS];
                    p.tile_on(level, g, std::slice::from_ref(x), &mut one);
                    for r in 0..PACK_ROWS {
                        let (a, o, s) = (all[c * PACK_ROWS + r], one[r], want[c * PACK_ROWS + r]);
                        assert_eq!(a.to_bits(), s.to_bits(), "{ty} {level:?} group {g} column {c} row {r}: {a} vs {s}");
                        assert_eq!(o.to_bits(), s.to_bits(), "{ty} {level:?} group {g} column {c} row {r} alone");
                    }
                }
                // Every pass width a kernel has (1..=8 columns: AVX2's q8_0 and q6_K take up to 8 at once).
                for n in 2..8 {
                    let mut some = vec![0f32; n * PACK_ROWS];
                    p.tile_on(level, g, &xs[..n], &mut some);
                    for (i, (a, s)) in some.iter().zip(&want).enumerate() {
                        assert_eq!(a.to_bits(), s.to_bits(), "{ty} {level:?} group {g}, {n} columns, value {i}");
                    }
                }
            }
            // Padding rows (40 rows: the third group's last 8) give 0.
            for r in 0..PACK_ROWS {
                if g * PACK_ROWS + r >= rows {
                    assert!((0..8).all(|c| want[c * PACK_ROWS + r] == 0.0));
                }
            }
        }
    }
}

#[test]
fn products_are_the_dot_products_of_the_values() {
    let mut rng = StdRng::seed_from_u64(23);
    for ty in TYPES {
        let (rows, cols) = (16, 1536);
        let w = random_matrix(&mut rng, ty, rows, cols);
        let p = PackedMatrix::pack(ty, rows, cols, &w).unwrap();
        let (q, aux) = column(&mut rng, ty, cols, false);
        let mut yd = vec![0f32; cols];
        dequantize_row(crate::quant::vec_dot_type(ty), &q, &mut yd);
        let mut out = vec![0f32; PACK_ROWS];
        p.tile(0, &[ActRow { q: &q, aux: &aux }], &mut out);
        for (r, &got) in out.iter().enumerate() {
            let (want, mag) = (0..cols).fold((0f64, 0f64), |(s, m), c| {
                let t = p.value(r, c) as f64 * yd[c] as f64;
                (s + t, m + t.abs())
            });
            assert!((got as f64 - want).abs() <= 1e-5 * mag, "{ty} row {r}: {got} vs {want}");
            // And the file's own dot product (ggml's lane order) within rounding of it.
            let v = crate::quant::vec_dot(ty, cols, &w[r * row_len_bytes(ty, cols).unwrap()..], &q);
            assert!((got - v).abs() as f64 <= 1e-5 * mag, "{ty} row {r}: {got} vs vec_dot {v}");
        }
    }
}

#[test]
fn bad_input_is_an_error() {
    let w = vec![0u8; 18 * 2];
    assert!(matches!(PackedMatrix::pack(GgmlType::F16, 1, 32, &w), Err(QuantError::NotPackable { .. })));
    assert!(matches!(PackedMatrix::pack(GgmlType::Q4_0, 3, 32, &w), Err(QuantError::WrongByteLen { .. })));
    assert!(matches!(PackedMatrix::pack(GgmlType::Q4_0, 1, 40, &w), Err(QuantError::PartialBlock { .. })));
    // An mxfp4 scale an f16 cannot hold (2^(200 - 128)) keeps the matrix in the file's layout; 2^15 packs.
    let mut m = vec![0u8; 17];
    for (e, packs) in [(200u8, false), (143, true), (103, false), (104, true)] {
        m[0] = e;
        assert_eq!(PackedMatrix::pack(GgmlType::MXFP4, 1, 32, &m).is_ok(), packs, "e = {e}");
    }
}
