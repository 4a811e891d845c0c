//! Cross-path tests of the public quant API: SIMD against the scalar reference, batch invariance of the
//! multi-column kernels, round trips, and length handling. Per-format known-value tests live beside the
//! code (`dequant`, `quantize`, `blocks`).

use super::*;
use half::f16;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn randn(rng: &mut StdRng, n: usize) -> Vec<f32> {
    // Roughly normal values with a few outliers, as activations look.
    (0..n)
        .map(|_| {
            let v: f32 = (0..4).map(|_| rng.gen_range(-1.0f32..1.0)).sum();
            if rng.gen_ratio(1, 50) {
                v * 8.0
            } else {
                v
            }
        })
        .collect()
}

fn quantized(ty: GgmlType, x: &[f32]) -> Vec<u8> {
    let mut b = vec![0u8; row_len_bytes(ty, x.len()).unwrap()];
    quantize_row(ty, x, &mut b);
    b
}

fn act(ty: GgmlType, x: &[f32]) -> Vec<u8> {
    let ta = vec_dot_type(ty);
    let mut b = vec![0u8; row_len_bytes(ta, x.len()).unwrap()];
    quantize_row_act(ta, x, &mut b);
    b
}

/// The f32 copies `QuantActs` keeps beside the activations `x` of `n` values for weights of type `ty`.
fn aux(ty: GgmlType, n: usize, x: &[u8]) -> Vec<f32> {
    let ta = vec_dot_type(ty);
    let mut a = vec![0f32; act_aux_len(ta, n)];
    fill_act_aux(ta, n, x, &mut a);
    a
}

fn lengths(ty: GgmlType) -> &'static [usize] {
    if ty.block_len() == QK_K {
        &[256, 512, 1536]
    } else {
        &[32, 64, 576, 1536, 35 * 32]
    }
}

/// `sum(|w_i * x_i|)` over the dequantized operands: the scale of a dot product's rounding error.
fn abs_dot(ty: GgmlType, n: usize, w: &[u8], x: &[u8]) -> f32 {
    let mut wd = vec![0f32; n];
    let mut xd = vec![0f32; n];
    dequantize_row(ty, w, &mut wd);
    dequantize_row(vec_dot_type(ty), x, &mut xd);
    wd.iter().zip(&xd).map(|(a, b)| (a * b).abs()).sum()
}

fn close(a: f32, b: f32, scale: f32, rel: f32) -> bool {
    (a - b).abs() <= rel * (scale + b.abs())
}

#[test]
fn vec_dot_matches_reference_for_every_type() {
    let mut rng = StdRng::seed_from_u64(1);
    for ty in GgmlType::WEIGHT_TYPES {
        for &n in lengths(ty) {
            for _ in 0..20 {
                let w = quantized(ty, &randn(&mut rng, n));
                let x = act(ty, &randn(&mut rng, n));
                let got = vec_dot(ty, n, &w, &x);
                let want = reference::vec_dot(ty, n, &w, &x);
                let mag = abs_dot(ty, n, &w, &x);
                assert!((got - want).abs() <= 1e-5 * mag, "{ty} n={n}: simd {got} vs reference {want}");
            }
        }
    }
}

#[test]
fn vec_dot_approximates_the_float_dot() {
    // The dot of quantized operands is close to the dot of their dequantized values, which checks the
    // min / sum terms (q4_1's m * s, the K-quants' bsums) as well as the scales.
    let mut rng = StdRng::seed_from_u64(2);
    for ty in GgmlType::WEIGHT_TYPES {
        let n = 512;
        let w = quantized(ty, &randn(&mut rng, n));
        let xf = randn(&mut rng, n);
        let x = act(ty, &xf);
        let mut wd = vec![0f32; n];
        let mut xd = vec![0f32; n];
        dequantize_row(ty, &w, &mut wd);
        dequantize_row(vec_dot_type(ty), &x, &mut xd);
        let want: f64 = wd.iter().zip(&xd).map(|(a, b)| (a * b) as f64).sum();
        let mag: f64 = wd.iter().zip(&xd).map(|(a, b)| (a * b).abs() as f64).sum();
        for got in [vec_dot(ty, n, &w, &x), reference::vec_dot(ty, n, &w, &x)] {
            let err = (got as f64 - want).abs();
            assert!(err <= 5e-3 * mag, "{ty}: {got} vs {want}");
        }
    }
}

#[test]
fn k_quant_dots_match_reference_on_arbitrary_block_bytes() {
    // The quantizer writes only some bit patterns (non-negative q6_K scales, for one); random bytes
    // reach every scale, min and high-bit code the SIMD unpacking has to get right.
    let mut rng = StdRng::seed_from_u64(8);
    for ty in [GgmlType::Q4K, GgmlType::Q5K, GgmlType::Q6K] {
        let n = 1024;
        for _ in 0..20 {
            let mut w: Vec<u8> = (0..row_len_bytes(ty, n).unwrap()).map(|_| rng.gen()).collect();
            for b in w.chunks_exact_mut(ty.block_bytes()) {
                // Sane block scales: random f16 bits are often inf or NaN.
                let at: &[usize] = if ty == GgmlType::Q6K { &[208] } else { &[0, 2] };
                for &a in at {
                    b[a..a + 2].copy_from_slice(&f16::from_f32(rng.gen_range(1e-3f32..0.1)).to_bits().to_le_bytes());
                }
            }
            let x = act(ty, &randn(&mut rng, n));
            let got = vec_dot(ty, n, &w, &x);
            let want = reference::vec_dot(ty, n, &w, &x);
            let mag = abs_dot(ty, n, &w, &x);
            assert!((got - want).abs() <= 1e-5 * mag, "{ty}: simd {got} vs reference {want}");
            let mut multi = [0f32; 3];
            vec_dot_multi(ty, n, &w, &[ActRow::bytes(&x); 3], &mut multi);
            assert!(multi.iter().all(|m| m.to_bits() == got.to_bits()), "{ty}: {multi:?} vs {got}");
        }
    }
}

#[test]
fn low_bit_dots_match_reference_on_arbitrary_block_bytes() {
    // Random bytes reach every table index (the quantizer rarely writes some), and the extreme
    // activation column every +-127 product.
    let mut rng = StdRng::seed_from_u64(14);
    for ty in [GgmlType::IQ4NL, GgmlType::MXFP4, GgmlType::Q2K, GgmlType::Q3K, GgmlType::IQ4XS] {
        for n in [256, 1536] {
            let mut w: Vec<u8> = (0..row_len_bytes(ty, n).unwrap()).map(|_| rng.gen()).collect();
            for b in w.chunks_exact_mut(ty.block_bytes()) {
                let f16_at: &[usize] = match ty {
                    GgmlType::MXFP4 => &[],
                    GgmlType::Q2K => &[80, 82],
                    GgmlType::Q3K => &[108],
                    _ => &[0],
                };
                for &a in f16_at {
                    b[a..a + 2].copy_from_slice(&f16::from_f32(rng.gen_range(-0.1f32..0.1)).to_bits().to_le_bytes());
                }
                if ty == GgmlType::MXFP4 {
                    b[0] = rng.gen_range(110..135);
                }
            }
            let extremes: Vec<f32> = (0..n).map(|i| if i % 3 == 0 { -1.0 } else { 1.0 }).collect();
            for x in [act(ty, &randn(&mut rng, n)), act(ty, &extremes)] {
                let got = vec_dot(ty, n, &w, &x);
                let want = reference::vec_dot(ty, n, &w, &x);
                let mag = abs_dot(ty, n, &w, &x);
                assert!((got - want).abs() <= 1e-5 * mag, "{ty} n={n}: simd {got} vs reference {want}");
                if ty == GgmlType::Q2K {
                    // One exact integer sum per block, scaled as the scalar code does: the same bits.
                    assert_eq!(got.to_bits(), want.to_bits(), "{ty} n={n}");
                }
                let mut multi = [0f32; 3];
                vec_dot_multi(ty, n, &w, &[ActRow::bytes(&x); 3], &mut multi);
                assert!(multi.iter().all(|m| m.to_bits() == got.to_bits()), "{ty}: {multi:?} vs {got}");
            }
        }
    }
}

#[test]
fn multi_column_results_are_bit_identical_to_single_column() {
    let mut rng = StdRng::seed_from_u64(3);
    for ty in GgmlType::WEIGHT_TYPES {
        let n = lengths(ty)[1];
        let w = quantized(ty, &randn(&mut rng, n));
        for n_cols in 1..=9 {
            let cols: Vec<Vec<u8>> = (0..n_cols).map(|_| act(ty, &randn(&mut rng, n))).collect();
            let auxes: Vec<Vec<f32>> = cols.iter().map(|c| aux(ty, n, c)).collect();
            let plain: Vec<ActRow> = cols.iter().map(|c| ActRow::bytes(c)).collect();
            let with_aux: Vec<ActRow> = cols.iter().zip(&auxes).map(|(q, aux)| ActRow { q, aux }).collect();
            for xs in [plain, with_aux] {
                let mut out = vec![0f32; n_cols];
                vec_dot_multi(ty, n, &w, &xs, &mut out);
                for (c, x) in xs.iter().enumerate() {
                    let single = vec_dot(ty, n, &w, x.q);
                    let aux = !x.aux.is_empty();
                    assert_eq!(out[c].to_bits(), single.to_bits(), "{ty}: column {c} of {n_cols} (f32 copies: {aux})");
                }
            }
        }
    }
}

#[test]
fn row_batch_results_are_bit_identical_to_single_rows() {
    let mut rng = StdRng::seed_from_u64(9);
    for ty in GgmlType::WEIGHT_TYPES {
        let n = lengths(ty)[1];
        let rows: Vec<Vec<u8>> = (0..5).map(|_| quantized(ty, &randn(&mut rng, n))).collect();
        let rb = rows[0].len();
        let all: Vec<u8> = rows.concat();
        let x = act(ty, &randn(&mut rng, n));
        let x_aux = aux(ty, n, &x);
        for row in [ActRow::bytes(&x), ActRow { q: &x, aux: &x_aux }] {
            let mut out = vec![0f32; rows.len()];
            vec_dot_rows(ty, n, &all, rb, row, &mut out);
            for (r, w) in rows.iter().enumerate() {
                assert_eq!(out[r].to_bits(), vec_dot(ty, n, w, &x).to_bits(), "{ty}: row {r}");
            }
        }
    }
}

#[test]
fn dequantize_of_quantize_is_close_for_every_type() {
    let mut rng = StdRng::seed_from_u64(4);
    let max_rel_rms = |ty| match ty {
        GgmlType::F32 => 0.0,
        GgmlType::F16 => 1e-3,
        GgmlType::BF16 => 5e-3,
        GgmlType::Q8_0 => 0.01,
        GgmlType::Q6K => 0.04,
        GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q5K => 0.08,
        GgmlType::Q2K => 0.3,
        GgmlType::Q3K => 0.2,
        _ => 0.15,
    };
    for ty in GgmlType::WEIGHT_TYPES {
        let n = 1024;
        // Weights without outliers: one outlier makes a whole 4-bit block coarse, by design.
        let x: Vec<f32> = (0..n).map(|_| rng.gen_range(-1.0f32..1.0) + rng.gen_range(-1.0f32..1.0)).collect();
        let mut y = vec![0f32; n];
        dequantize_row(ty, &quantized(ty, &x), &mut y);
        let rms = |v: &mut dyn Iterator<Item = f32>| (v.map(|e| e * e).sum::<f32>() / n as f32).sqrt();
        let err = rms(&mut x.iter().zip(&y).map(|(a, b)| a - b));
        let scale = rms(&mut x.iter().copied());
        assert!(err <= max_rel_rms(ty) * scale, "{ty}: rms error {err} for rms {scale}");
    }
}

#[test]
fn activation_quantization_is_the_same_on_every_path() {
    let mut rng = StdRng::seed_from_u64(5);
    for _ in 0..50 {
        let mut x = randn(&mut rng, 96);
        x[7] = 0.0;
        x[40..72].fill(0.0); // an all-zero block
        for ty in [GgmlType::Q8_0, GgmlType::Q8_1] {
            let mut fast = vec![0u8; row_len_bytes(ty, 96).unwrap()];
            quantize_row_act(ty, &x, &mut fast);
            let bb = ty.block_bytes();
            let mut slow = vec![0u8; fast.len()];
            for (xb, b) in x.chunks_exact(QK).zip(slow.chunks_exact_mut(bb)) {
                match ty {
                    GgmlType::Q8_0 => quantize::q8_0_act(xb, b),
                    _ => quantize::q8_1_act(xb, b),
                }
            }
            assert_eq!(fast, slow, "{ty}");
        }
    }
}

#[test]
fn attention_helpers_match_scalar_sums() {
    let mut rng = StdRng::seed_from_u64(6);
    for n in [1, 7, 32, 64, 100, 128] {
        let a = randn(&mut rng, n);
        let b = randn(&mut rng, n);
        let exact: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
        let mag: f64 = a.iter().zip(&b).map(|(x, y)| (*x as f64 * *y as f64).abs()).sum();
        assert!((vec_dot_f32(&a, &b) as f64 - exact).abs() <= 1e-5 * mag + 1e-6, "vec_dot_f32 n={n}");

        let k: Vec<f16> = a.iter().map(|&v| f16::from_f32(v)).collect();
        let exact: f64 = k.iter().zip(&b).map(|(x, y)| x.to_f32() as f64 * *y as f64).sum();
        assert!((dot_f16_f32(&k, &b) as f64 - exact).abs() <= 1e-5 * mag + 1e-6, "dot_f16_f32 n={n}");

        let mut dst = b.clone();
        axpy_f16(&mut dst, 0.5, &k);
        for i in 0..n {
            assert!(close(dst[i], b[i] + 0.5 * k[i].to_f32(), 1e-6, 1e-6), "axpy_f16 n={n} i={i}");
        }
    }
    for n in [32, 64, 128, 256] {
        let x = randn(&mut rng, n);
        let q = randn(&mut rng, n);
        let mut kb = vec![0u8; n / 32 * 34];
        quantize_q8_0_row(&x, &mut kb);
        let mut kd = vec![0f32; n];
        dequantize_row(GgmlType::Q8_0, &kb, &mut kd);
        let exact: f64 = kd.iter().zip(&q).map(|(x, y)| *x as f64 * *y as f64).sum();
        let mag: f64 = kd.iter().zip(&q).map(|(x, y)| (*x as f64 * *y as f64).abs()).sum();
        assert!((dot_q8_0_f32(&kb, &q) as f64 - exact).abs() <= 1e-5 * mag, "dot_q8_0_f32 n={n}");
        let mut dst = q.clone();
        axpy_q8_0(&mut dst, -2.0, &kb);
        for i in 0..n {
            assert!(close(dst[i], q[i] - 2.0 * kd[i], 1e-5, 1e-5), "axpy_q8_0 n={n} i={i}");
        }
    }
}

#[test]
fn axpy_result_of_an_element_does_not_depend_on_the_slice_around_it() {
    let mut rng = StdRng::seed_from_u64(7);
    let v: Vec<f16> = randn(&mut rng, 37).iter().map(|&x| f16::from_f32(x)).collect();
    let base = randn(&mut rng, 37);
    let mut whole = base.clone();
    axpy_f16(&mut whole, 0.3, &v);
    let mut parts = base.clone();
    for (d, s) in parts.chunks_mut(5).zip(v.chunks(5)) {
        axpy_f16(d, 0.3, s);
    }
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&whole), bits(&parts));
}

#[test]
fn bad_lengths_are_errors_for_file_data() {
    let mut dst = [0f32; 32];
    assert_eq!(
        try_dequantize_row(GgmlType::Q4_0, &[0u8; 17], &mut dst),
        Err(QuantError::WrongByteLen { ty: GgmlType::Q4_0, n_values: 32, need_bytes: 18, got_bytes: 17 })
    );
    let mut dst = [0f32; 33];
    assert!(matches!(try_dequantize_row(GgmlType::Q4_0, &[0u8; 18], &mut dst), Err(QuantError::PartialBlock { .. })));
    assert!(try_dequantize_row(GgmlType::Q4_0, &[0u8; 36], &mut [0f32; 64]).is_ok());
}

#[test]
#[should_panic(expected = "vec_dot q4_1")]
fn vec_dot_panics_on_short_activations() {
    vec_dot(GgmlType::Q4_1, 64, &[0u8; 40], &[0u8; 36]);
}

#[test]
#[should_panic(expected = "not a whole number")]
fn quantize_row_act_panics_on_partial_block() {
    let mut dst = [0u8; 34];
    quantize_row_act(GgmlType::Q8_0, &[0.0; 31], &mut dst);
}

/// The integer sums by AVX-512 VNNI (`vpdpbusd`) give the bits of the AVX2 sums (`maddubs` + `madd`), for
/// every legacy format, with and without the f32 scales, one to four columns, and activations at the ends
/// of their range (+-127, where `maddubs` would saturate if it could).
#[cfg(target_arch = "x86_64")]
#[test]
fn vnni_kernels_give_the_avx2_bits() {
    if !simd_level().avx2() {
        println!("skipped: this CPU has no AVX2");
        return;
    }
    if !vnni_detected() {
        println!("skipped: this CPU has no AVX-512 VNNI (the AVX2 path runs)");
        return;
    }
    let mut rng = StdRng::seed_from_u64(11);
    for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0] {
        let n = 576;
        let nb = n / QK;
        // Random weight bytes with sane scales reach every level, -128 included for q8_0.
        let mut w: Vec<u8> = (0..row_len_bytes(ty, n).unwrap()).map(|_| rng.gen()).collect();
        for b in w.chunks_exact_mut(ty.block_bytes()) {
            let at: &[usize] = if matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1) { &[0, 2] } else { &[0] };
            for &a in at {
                b[a..a + 2].copy_from_slice(&f16::from_f32(rng.gen_range(1e-3f32..0.1)).to_bits().to_le_bytes());
            }
        }
        let mut cols: Vec<Vec<u8>> = (0..4).map(|_| act(ty, &randn(&mut rng, n))).collect();
        // One column of extremes: every value +-127 times its scale.
        let extremes: Vec<f32> = (0..n).map(|i| if i % 3 == 0 { -1.0 } else { 1.0 }).collect();
        cols[3] = act(ty, &extremes);
        let auxes: Vec<Vec<f32>> = cols.iter().map(|c| aux(ty, n, c)).collect();
        let q: Vec<*const u8> = cols.iter().map(|c| c.as_ptr()).collect();
        let ds: Vec<*const f32> = auxes.iter().map(|a| a.as_ptr()).collect();
        let none = [std::ptr::null::<f32>(); 4];
        let run = |vnni: bool, pre: bool| {
            let mut out = [0f32; 4];
            let ds4 = if pre { [ds[0], ds[1], ds[2], ds[3]] } else { none };
            let cols = avx2::Cols::<4> { q: &[q[0], q[1], q[2], q[3]], ds: &ds4 };
            // SAFETY: AVX2 and VNNI detected above; the row and every column hold `nb` blocks.
            unsafe {
                match ty {
                    GgmlType::Q4_0 => avx2::dot_blocks::<{ avx2::Q4_0 }, 4>(nb, w.as_ptr(), cols, vnni, &mut out),
                    GgmlType::Q4_1 => avx2::dot_blocks::<{ avx2::Q4_1 }, 4>(nb, w.as_ptr(), cols, vnni, &mut out),
                    GgmlType::Q5_0 => avx2::dot_blocks::<{ avx2::Q5_0 }, 4>(nb, w.as_ptr(), cols, vnni, &mut out),
                    GgmlType::Q5_1 => avx2::dot_blocks::<{ avx2::Q5_1 }, 4>(nb, w.as_ptr(), cols, vnni, &mut out),
                    _ => avx2::dot_blocks::<{ avx2::Q8_0 }, 4>(nb, w.as_ptr(), cols, vnni, &mut out),
                }
            }
            out
        };
        let want = run(false, false);
        for (vnni, pre) in [(true, false), (false, true), (true, true)] {
            let got = run(vnni, pre);
            for c in 0..4 {
                assert_eq!(got[c].to_bits(), want[c].to_bits(), "{ty}: column {c}, vnni {vnni}, f32 scales {pre}");
            }
        }
        // And against the scalar reference, to within rounding.
        for (c, x) in cols.iter().enumerate() {
            let r = reference::vec_dot(ty, n, &w, x);
            assert!((want[c] - r).abs() <= 1e-5 * abs_dot(ty, n, &w, x), "{ty}: column {c}: {} vs {r}", want[c]);
        }
    }
}

#[test]
fn tile_results_are_bit_identical_to_single_dots() {
    let mut rng = StdRng::seed_from_u64(12);
    for ty in GgmlType::WEIGHT_TYPES {
        let n = lengths(ty)[1];
        let rows: Vec<Vec<u8>> = (0..5).map(|_| quantized(ty, &randn(&mut rng, n))).collect();
        let rb = rows[0].len();
        let all: Vec<u8> = rows.concat();
        for n_cols in 1..=6 {
            let cols: Vec<Vec<u8>> = (0..n_cols).map(|_| act(ty, &randn(&mut rng, n))).collect();
            let auxes: Vec<Vec<f32>> = cols.iter().map(|c| aux(ty, n, c)).collect();
            let plain: Vec<ActRow> = cols.iter().map(|c| ActRow::bytes(c)).collect();
            let with_aux: Vec<ActRow> = cols.iter().zip(&auxes).map(|(q, aux)| ActRow { q, aux }).collect();
            for xs in [plain, with_aux] {
                for n_rows in [1, 5] {
                    let mut out = vec![0f32; n_rows * n_cols];
                    vec_dot_tile(ty, n, &all, rb, &xs, &mut out);
                    for r in 0..n_rows {
                        for (c, x) in xs.iter().enumerate() {
                            let single = vec_dot(ty, n, &rows[r], x.q);
                            assert_eq!(
                                out[c * n_rows + r].to_bits(),
                                single.to_bits(),
                                "{ty}: row {r}, column {c} of {n_cols}"
                            );
                        }
                    }
                }
            }
        }
    }
}

/// The `avx512` kernel (two weight rows per 512-bit register) gives, for each row and column, the bits of
/// the AVX2 kernel on that row and column alone: every legacy format, one to four columns, with and
/// without the f32 scales, random weight bytes (every level, q8_0's -128 included) and a column of
/// activations at the ends of their range.
#[cfg(target_arch = "x86_64")]
#[test]
fn avx512_row_pairs_give_the_avx2_bits() {
    if !simd_level().avx2() || !avx512_detected() {
        println!("skipped: this CPU lacks AVX-512 F/BW/VL/VNNI (the AVX2 paths run)");
        return;
    }
    let mut rng = StdRng::seed_from_u64(13);
    for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0] {
        for n in [32, 576, 1536] {
            let nb = n / QK;
            let rows: Vec<Vec<u8>> = (0..2)
                .map(|_| {
                    let mut w: Vec<u8> = (0..row_len_bytes(ty, n).unwrap()).map(|_| rng.gen()).collect();
                    for b in w.chunks_exact_mut(ty.block_bytes()) {
                        let at: &[usize] = if matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1) { &[0, 2] } else { &[0] };
                        for &a in at {
                            let v = f16::from_f32(rng.gen_range(-0.1f32..0.1)).to_bits().to_le_bytes();
                            b[a..a + 2].copy_from_slice(&v);
                        }
                    }
                    w
                })
                .collect();
            let mut cols: Vec<Vec<u8>> = (0..4).map(|_| act(ty, &randn(&mut rng, n))).collect();
            let extremes: Vec<f32> = (0..n).map(|i| if i % 3 == 0 { -1.0 } else { 1.0 }).collect();
            cols[3] = act(ty, &extremes);
            let auxes: Vec<Vec<f32>> = cols.iter().map(|c| aux(ty, n, c)).collect();
            let q: [*const u8; 4] = std::array::from_fn(|c| cols[c].as_ptr());
            let ds: [*const f32; 4] = std::array::from_fn(|c| auxes[c].as_ptr());
            let none = [std::ptr::null::<f32>(); 4];
            for pre in [false, true] {
                let ds = if pre { ds } else { none };
                let (mut got0, mut got1, mut want) = ([0f32; 4], [0f32; 4], [[0f32; 1]; 2]);
                macro_rules! check {
                    ($k:expr, $c:literal) => {{
                        let cols =
                            avx2::Cols::<$c> { q: q[..$c].try_into().unwrap(), ds: ds[..$c].try_into().unwrap() };
                        // SAFETY: the features were detected above; both rows and every column hold `nb` blocks.
                        unsafe {
                            avx512::dot_pair::<{ $k }, $c>(
                                nb,
                                rows[0].as_ptr(),
                                rows[1].as_ptr(),
                                cols,
                                &mut got0,
                                &mut got1,
                            )
                        };
                        for c in 0..$c {
                            for r in 0..2 {
                                let one = avx2::Cols::<1> { q: &[q[c]], ds: &[none[0]] };
                                // SAFETY: as above (AVX2 without VNNI is implied by the AVX-512 features).
                                unsafe {
                                    avx2::dot_blocks::<{ $k }, 1>(nb, rows[r].as_ptr(), one, false, &mut want[r])
                                };
                            }
                            assert_eq!(
                                got0[c].to_bits(),
                                want[0][0].to_bits(),
                                "{}: n {n}, row 0, column {c} of {}, f32 scales {pre}",
                                ty,
                                $c
                            );
                            assert_eq!(
                                got1[c].to_bits(),
                                want[1][0].to_bits(),
                                "{}: n {n}, row 1, column {c} of {}, f32 scales {pre}",
                                ty,
                                $c
                            );
                        }
                    }};
                }
                macro_rules! all_widths {
                    ($k:expr) => {{
                        check!($k, 1);
                        check!($k, 2);
                        check!($k, 3);
                        check!($k, 4);
                    }};
                }
                match ty {
                    GgmlType::Q4_0 => all_widths!(avx2::Q4_0),
                    GgmlType::Q4_1 => all_widths!(avx2::Q4_1),
                    GgmlType::Q5_0 => all_widths!(avx2::Q5_0),
                    GgmlType::Q5_1 => all_widths!(avx2::Q5_1),
                    _ => all_widths!(avx2::Q8_0),
                }
            }
        }
    }
}
