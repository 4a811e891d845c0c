//! Strata against ggml itself: the fixtures in `tests/data/quant`, written by `scripts/ggml-reference-blocks`
//! from llama.cpp's libggml-base (b11312), hold ggml's dequantized values of random blocks and ggml's
//! quantized bytes of seeded rows (`ggml_quantize_chunk` without an importance matrix, as llama-quantize
//! runs it), and ggml-cpu's activation bytes and dot products for the new types. These tests read only
//! the committed files; they never need llama.cpp.

use super::*;
use std::path::PathBuf;

/// The types with fixtures.
const TYPES: [GgmlType; 13] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2K,
    GgmlType::Q3K,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
    GgmlType::IQ4NL,
    GgmlType::IQ4XS,
    GgmlType::MXFP4,
];

/// Values per row of `rows.f32` (the script's `ROW_LEN`).
const ROW_LEN: usize = 512;

fn read(name: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/quant").join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e} (scripts/ggml-reference-blocks writes it)", path.display()))
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

/// The fixture rows and ggml's quantization of them, for `ty`.
fn quant_fixture(ty: GgmlType) -> (Vec<f32>, Vec<u8>) {
    let x = f32s(&read("rows.f32"));
    let q = read(&format!("{}.quant.bin", ty.name()));
    assert_eq!(q.len(), x.len() / ROW_LEN * row_len_bytes(ty, ROW_LEN).unwrap(), "{ty}: fixture size");
    (x, q)
}

#[test]
fn dequantization_is_bit_identical_to_ggml() {
    for ty in TYPES {
        let data = read(&format!("{}.dequant.bin", ty.name()));
        // N blocks, then their N * block_len values as f32.
        let per_block = ty.block_bytes() + 4 * ty.block_len();
        assert_eq!(data.len() % per_block, 0, "{ty}: fixture size");
        let n_blocks = data.len() / per_block;
        let (blocks, want) = data.split_at(n_blocks * ty.block_bytes());
        let want = f32s(want);
        let mut got = vec![0f32; want.len()];
        dequantize_row(ty, blocks, &mut got);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.to_bits(), w.to_bits(), "{ty}: value {i} (block {}): {g} vs ggml {w}", i / ty.block_len());
            assert_eq!(dequantize_value(ty, blocks, i).to_bits(), w.to_bits(), "{ty}: single value {i}");
        }
        assert!(n_blocks >= 8, "{ty}: {n_blocks} blocks");
    }
}

#[test]
fn quantization_is_byte_identical_to_ggml() {
    for ty in TYPES {
        let (x, want) = quant_fixture(ty);
        let row_bytes = row_len_bytes(ty, ROW_LEN).unwrap();
        let mut got = vec![0u8; row_bytes];
        let mut bad_blocks = Vec::new();
        for (r, (xr, wr)) in x.chunks_exact(ROW_LEN).zip(want.chunks_exact(row_bytes)).enumerate() {
            quantize_row(ty, xr, &mut got);
            for (b, (g, w)) in got.chunks_exact(ty.block_bytes()).zip(wr.chunks_exact(ty.block_bytes())).enumerate() {
                if g != w {
                    bad_blocks.push((r, b));
                }
            }
        }
        assert!(bad_blocks.is_empty(), "{ty}: blocks (row, block) differ from ggml's: {bad_blocks:?}");
    }
}

#[test]
fn dots_of_the_new_types_match_the_dot_of_dequantized_values() {
    // ggml's quantized rows as weights, against activations quantized to the vec_dot_type: the integer
    // dot and its scales must give the f64 dot of what both sides dequantize to, to f32 rounding.
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(26);
    for ty in [GgmlType::Q2K, GgmlType::Q3K, GgmlType::IQ4NL, GgmlType::IQ4XS, GgmlType::MXFP4] {
        let (_, w_rows) = quant_fixture(ty);
        let row_bytes = row_len_bytes(ty, ROW_LEN).unwrap();
        let ta = vec_dot_type(ty);
        for (r, w) in w_rows.chunks_exact(row_bytes).enumerate() {
            let xf: Vec<f32> = (0..ROW_LEN).map(|_| rng.gen_range(-2.0f32..2.0)).collect();
            let mut x = vec![0u8; row_len_bytes(ta, ROW_LEN).unwrap()];
            quantize_row_act(ta, &xf, &mut x);
            let (mut wd, mut xd) = (vec![0f32; ROW_LEN], vec![0f32; ROW_LEN]);
            dequantize_row(ty, w, &mut wd);
            dequantize_row(ta, &x, &mut xd);
            let want: f64 = wd.iter().zip(&xd).map(|(a, b)| *a as f64 * *b as f64).sum();
            let mag: f64 = wd.iter().zip(&xd).map(|(a, b)| (*a as f64 * *b as f64).abs()).sum();
            for got in [vec_dot(ty, ROW_LEN, w, &x), reference::vec_dot(ty, ROW_LEN, w, &x)] {
                let err = (got as f64 - want).abs();
                assert!(err <= 1e-5 * mag + 1e-30, "{ty} row {r}: {got} vs {want} (magnitude {mag})");
            }
        }
    }
}

#[test]
fn activations_and_dots_agree_with_ggml_cpu() {
    // ggml-cpu's activation bytes for a fixture row must be ours, and its dot (AVX2 kernels on the machine
    // that wrote the fixtures) ours to f32 rounding: the same integer sums, added in another order.
    let x = f32s(&read("rows.f32"));
    let n_rows = x.len() / ROW_LEN;
    for ty in [GgmlType::Q2K, GgmlType::Q3K, GgmlType::IQ4NL, GgmlType::IQ4XS, GgmlType::MXFP4] {
        let (_, w_rows) = quant_fixture(ty);
        let row_bytes = row_len_bytes(ty, ROW_LEN).unwrap();
        let ta = vec_dot_type(ty);
        let act_bytes = row_len_bytes(ta, ROW_LEN).unwrap();
        let data = read(&format!("{}.dot.bin", ty.name()));
        assert_eq!(data.len() % (act_bytes + 4), 0, "{ty}: fixture size");
        for (r, rec) in data.chunks_exact(act_bytes + 4).enumerate() {
            let (act, want) = rec.split_at(act_bytes);
            let want = f32s(want)[0];
            let xr = &x[(r + 7) % n_rows * ROW_LEN..][..ROW_LEN];
            let mut ours = vec![0u8; act_bytes];
            quantize_row_act(ta, xr, &mut ours);
            assert_eq!(ours, act, "{ty} row {r}: {ta} activations differ from ggml-cpu's");
            let w = &w_rows[r * row_bytes..(r + 1) * row_bytes];
            let (mut wd, mut xd) = (vec![0f32; ROW_LEN], vec![0f32; ROW_LEN]);
            dequantize_row(ty, w, &mut wd);
            dequantize_row(ta, act, &mut xd);
            let mag: f64 = wd.iter().zip(&xd).map(|(a, b)| (*a as f64 * *b as f64).abs()).sum();
            for got in [vec_dot(ty, ROW_LEN, w, act), reference::vec_dot(ty, ROW_LEN, w, act)] {
                let err = (got as f64 - want as f64).abs();
                assert!(err <= 1e-5 * mag, "{ty} row {r}: {got} vs ggml-cpu {want} (magnitude {mag})");
            }
        }
    }
}
