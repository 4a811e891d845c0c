//! Micro-benchmark of the quantized dot products on the shapes of SmolLM2-135M (n_embd 576, ffn 1536) and of a
//! 1B-class model's 4,096-wide rows (whose 16-row groups outgrow L1).
//!
//! Run with `cargo bench --bench quant`. Prints ns per row dot and GB/s of weight bytes read, for one
//! column (token generation) and four columns at once (prompt processing). Rows cycle through a matrix
//! larger than L2 so the figures include memory traffic, as in a real matrix product.

use std::hint::black_box;
use std::time::Instant;
use strata::quant::{self, GgmlType};

fn main() {
    println!("simd path: {:?}", quant::simd_level());
    for ty in [
        GgmlType::Q4_1,
        GgmlType::Q8_0,
        GgmlType::F16,
        GgmlType::Q4_0,
        GgmlType::Q4K,
        GgmlType::Q5K,
        GgmlType::Q6K,
        GgmlType::Q3K,
        GgmlType::Q2K,
    ] {
        // `QUANT_BENCH_TYPES=q4_0,q8_0` measures only those.
        if let Ok(only) = std::env::var("QUANT_BENCH_TYPES") {
            if !only.split(',').any(|t| t == ty.name()) {
                continue;
            }
        }
        for n in [576usize, 1536, 4096] {
            if n % ty.block_len() != 0 {
                continue;
            }
            bench(ty, n);
            if quant::packed::packable(ty) {
                bench_packed(ty, n);
            }
        }
    }
}

/// The same matrix repacked (`quant::packed`): one, four and eight columns per group of 16 rows.
fn bench_packed(ty: GgmlType, n: usize) {
    use quant::packed::{PackedMatrix, PACK_ROWS};
    let row_bytes = quant::row_len_bytes(ty, n).expect("whole blocks");
    let kib: usize = std::env::var("QUANT_BENCH_KIB").ok().and_then(|v| v.parse().ok()).unwrap_or(16 << 10);
    let n_rows = (kib << 10) / row_bytes / PACK_ROWS * PACK_ROWS;
    let x: Vec<f32> = (0..n).map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0).collect();
    let mut row = vec![0u8; row_bytes];
    quant::quantize_row(ty, &x, &mut row);
    let w: Vec<u8> = (0..n_rows).flat_map(|_| row.iter().copied()).collect();
    let p = PackedMatrix::pack(ty, n_rows, n, &w).expect("packable");
    // The activation type the packed products take (q8_0, q8_1 for q4_1 / q5_1, q8_K for K-quants).
    let ta = quant::vec_dot_type(ty);
    let mut xa = vec![0u8; quant::row_len_bytes(ta, n).unwrap()];
    quant::quantize_row_act(ta, &x, &mut xa);
    let mut aux = vec![0f32; quant::act_aux_len(ta, n)];
    quant::fill_act_aux(ta, n, &xa, &mut aux);
    let xs: Vec<quant::ActRow> = (0..8).map(|_| quant::ActRow { q: &xa, aux: &aux }).collect();
    let reps = (320 << 20) / (n_rows * row_bytes).max(1);
    let mut out = [0f32; 8 * PACK_ROWS];
    let mut line = format!("{:>5} n={n:>5} packed:", ty.name());
    for cols in [1usize, 4, 8] {
        let t = Instant::now();
        for _ in 0..reps {
            for g in 0..p.groups() {
                p.tile(g, black_box(&xs[..cols]), &mut out[..cols * PACK_ROWS]);
            }
        }
        let ns = t.elapsed().as_nanos() as f64 / (reps * n_rows) as f64;
        line += &format!(" | {cols} col {ns:6.1} ns/row {:6.1} GB/s", row_bytes as f64 / ns);
    }
    black_box(out);
    println!("{line}");
}

fn bench(ty: GgmlType, n: usize) {
    let row_bytes = quant::row_len_bytes(ty, n).expect("whole blocks");
    // ~16 MiB of weights by default: more than the caches hold. `QUANT_BENCH_KIB=256` measures in cache.
    let kib: usize = std::env::var("QUANT_BENCH_KIB").ok().and_then(|v| v.parse().ok()).unwrap_or(16 << 10);
    let n_rows = (kib << 10) / row_bytes;
    let x: Vec<f32> = (0..n).map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0).collect();
    let mut w = vec![0u8; row_bytes * n_rows];
    let mut row = vec![0u8; row_bytes];
    quant::quantize_row(ty, &x, &mut row);
    for r in w.chunks_exact_mut(row_bytes) {
        r.copy_from_slice(&row);
    }
    let ta = quant::vec_dot_type(ty);
    let mut xa = vec![0u8; quant::row_len_bytes(ta, n).unwrap()];
    quant::quantize_row_act(ta, &x, &mut xa);
    let mut aux = vec![0f32; quant::act_aux_len(ta, n)];
    quant::fill_act_aux(ta, n, &xa, &mut aux);
    let cols: Vec<Vec<u8>> = (0..4).map(|_| xa.clone()).collect();
    // As the engine's products take them: with the f32 scales (`QuantActs`).
    let xs: Vec<quant::ActRow> = cols.iter().map(|c| quant::ActRow { q: c, aux: &aux }).collect();

    let reps = (320 << 20) / (n_rows * row_bytes).max(1);
    let mut sink = 0f32;
    let t = Instant::now();
    for _ in 0..reps {
        for r in w.chunks_exact(row_bytes) {
            sink += quant::vec_dot(ty, n, black_box(r), black_box(&xa));
        }
    }
    let ns_single = t.elapsed().as_nanos() as f64 / (reps * n_rows) as f64;

    let mut out = [0f32; 4];
    let t = Instant::now();
    for _ in 0..reps {
        for r in w.chunks_exact(row_bytes) {
            quant::vec_dot_multi(ty, n, black_box(r), black_box(&xs), &mut out);
            sink += out[0];
        }
    }
    let ns_multi = t.elapsed().as_nanos() as f64 / (reps * n_rows) as f64;
    black_box(sink);

    let gbps = |ns: f64| row_bytes as f64 / ns;
    println!(
        "{:>5} n={n:>5}: 1 col {ns_single:7.1} ns/row {:6.1} GB/s | 4 cols {ns_multi:7.1} ns/row ({:6.1} ns/col-row) {:6.1} GB/s",
        ty.name(),
        gbps(ns_single),
        ns_multi / 4.0,
        gbps(ns_multi),
    );
}
