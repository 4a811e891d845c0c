//! Every CUDA kernel against the CPU's arithmetic, run through the CPU emulator of a GPU (`emu`): the
//! products for each weight type (one token, a batch, row lookups), RMSNorm (also added into its output and
//! over rows of a head), RoPE (with frequency factors, linear scaling and an attention factor), SwiGLU and
//! GeGLU, scaling and soft-capping, the residual and bias adds, storing K/V rows into f16 and int8 pages,
//! and attention over pages that live partly in device memory and partly in pinned host memory (with a
//! sliding window, a soft-cap, and heads narrower than a warp). Also checks that the Rust side, the PTX and the emulator agree
//! on every kernel's parameters.

#[path = "common/mod.rs"]
mod common;

use std::sync::Arc;

use half::f16;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use strata::device::cuda::driver::CudaGpu;
use strata::device::cuda::emu::{self, EmuGpu};
use strata::device::cuda::gpu::{Arg, Buffer, Dims, Gpu, GpuError};
use strata::device::cuda::kernels::{self, KERNEL_FILES};
use strata::model::ops;
use strata::model::RopeKind;
use strata::quant::{self, GgmlType};

/// Launches a kernel on buffers a test made for it.
fn run(gpu: &dyn Gpu, kernel: &'static str, dims: Dims, args: &[Arg]) -> Result<(), GpuError> {
    // SAFETY: each test allocates its buffers right before the launch, sized for the kernel at these
    // dimensions (the sizes the forward pass uses), and keeps them until it has read the results.
    unsafe { strata::device::cuda::gpu::launch(gpu, kernel, dims, args) }
}

/// The emulated GPU, or with `STRATA_TEST_GPU=cuda:N` (scripts/gpu-check) that CUDA device.
fn gpu() -> Arc<dyn Gpu> {
    match std::env::var("STRATA_TEST_GPU") {
        Ok(spec) => {
            let ordinal: usize =
                spec.strip_prefix("cuda:").and_then(|n| n.parse().ok()).expect("STRATA_TEST_GPU=cuda:N");
            Arc::new(CudaGpu::open(ordinal).unwrap_or_else(|e| panic!("{spec}: {e}")))
        }
        Err(_) => Arc::new(EmuGpu::new(1 << 30)),
    }
}

fn randn(rng: &mut ChaCha8Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| (rng.gen::<f32>() * 2.0 - 1.0) * scale).collect()
}

fn upload(gpu: &Arc<dyn Gpu>, bytes: &[u8]) -> Buffer {
    let b = Buffer::device(gpu, bytes.len() as u64).unwrap();
    b.write_at(0, bytes).unwrap();
    b
}

fn upload_f32(gpu: &Arc<dyn Gpu>, v: &[f32]) -> Buffer {
    upload(gpu, bytemuck::cast_slice(v))
}

fn assert_close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= tol * (1.0 + w.abs()), "{what}[{i}]: got {g}, want {w}");
    }
}

fn kernel_name(prefix: &str, ty: GgmlType) -> &'static str {
    let name = format!("{prefix}_{}", ty.name());
    kernels::entry(&name).unwrap_or_else(|| panic!("no kernel {name}")).name
}

#[test]
fn products_and_row_lookups_match_the_cpu_for_every_weight_type() {
    let gpu = gpu();
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let (rows, cols, tokens) = (70, 512, 37); // rows and tokens not multiples of the tiles
    for ty in common::gpu_weight_types() {
        let w_f32 = randn(&mut rng, rows * cols, 1.0);
        let row_bytes = quant::row_len_bytes(ty, cols).unwrap();
        let mut w = vec![0u8; rows * row_bytes];
        for r in 0..rows {
            quant::quantize_row(ty, &w_f32[r * cols..(r + 1) * cols], &mut w[r * row_bytes..(r + 1) * row_bytes]);
        }
        // The reference: the CPU's dequantized weights times exact f32 activations, summed in f64.
        let mut deq = vec![0f32; rows * cols];
        for r in 0..rows {
            quant::dequantize_row(ty, &w[r * row_bytes..(r + 1) * row_bytes], &mut deq[r * cols..(r + 1) * cols]);
        }
        let x = randn(&mut rng, tokens * cols, 1.0);
        let want: Vec<f32> = (0..tokens * rows)
            .map(|i| {
                let (t, r) = (i / rows, i % rows);
                (0..cols).map(|c| deq[r * cols + c] as f64 * x[t * cols + c] as f64).sum::<f64>() as f32
            })
            .collect();
        let (wb, xb) = (upload(&gpu, &w), upload_f32(&gpu, &x));
        let y = Buffer::device(&gpu, (tokens * rows * 4) as u64).unwrap();

        let args = [
            Arg::Ptr(wb.ptr()),
            Arg::Ptr(xb.ptr()),
            Arg::Ptr(y.ptr()),
            Arg::I32(rows as i32),
            Arg::I32(cols as i32),
            Arg::I64(row_bytes as i64),
        ];
        let with = |extra: &[Arg]| -> Vec<Arg> { args.iter().chain(extra).copied().collect() };
        let matvec_dims = Dims::linear((rows as u32).div_ceil(4), 128);
        run(&*gpu, kernel_name("matvec", ty), matvec_dims, &with(&[Arg::I32(0)])).unwrap();
        assert_close(&format!("matvec {}", ty.name()), &y.read_f32(rows).unwrap(), &want[..rows], 1e-4);
        // Accumulating (y += W x): twice the product.
        run(&*gpu, kernel_name("matvec", ty), matvec_dims, &with(&[Arg::I32(1)])).unwrap();
        let twice: Vec<f32> = want[..rows].iter().map(|v| 2.0 * v).collect();
        assert_close(&format!("matvec {} accumulating", ty.name()), &y.read_f32(rows).unwrap(), &twice, 1e-4);

        let dims = Dims { grid: [(rows as u32).div_ceil(32), (tokens as u32).div_ceil(32), 1], block: [256, 1, 1] };
        run(&*gpu, kernel_name("gemm", ty), dims, &with(&[Arg::I32(tokens as i32), Arg::I32(0)])).unwrap();
        assert_close(&format!("gemm {}", ty.name()), &y.read_f32(tokens * rows).unwrap(), &want, 1e-4);
        run(&*gpu, kernel_name("gemm", ty), dims, &with(&[Arg::I32(tokens as i32), Arg::I32(1)])).unwrap();
        let twice: Vec<f32> = want.iter().map(|v| 2.0 * v).collect();
        assert_close(&format!("gemm {} accumulating", ty.name()), &y.read_f32(tokens * rows).unwrap(), &twice, 1e-4);

        let ids: Vec<i32> = vec![3, 0, 69, 3];
        let idb = upload(&gpu, bytemuck::cast_slice(&ids));
        let out = Buffer::device(&gpu, (ids.len() * cols * 4) as u64).unwrap();
        let args = [
            Arg::Ptr(wb.ptr()),
            Arg::Ptr(idb.ptr()),
            Arg::Ptr(out.ptr()),
            Arg::I32(cols as i32),
            Arg::I64(row_bytes as i64),
        ];
        run(&*gpu, kernel_name("rows", ty), Dims::linear(ids.len() as u32, 64), &args).unwrap();
        let got = out.read_f32(ids.len() * cols).unwrap();
        let want_rows: Vec<f32> =
            ids.iter().flat_map(|&r| deq[r as usize * cols..(r as usize + 1) * cols].to_vec()).collect();
        assert_eq!(got, want_rows, "rows {}: dequantization is bit-exact", ty.name());
    }
}

#[test]
fn norms_rope_glus_caps_and_adds_match_the_cpu() {
    let gpu = gpu();
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let (t, n) = (5, 576);
    let x = randn(&mut rng, t * n, 3.0);
    let w = randn(&mut rng, n, 1.0);
    let (xb, wb) = (upload_f32(&gpu, &x), upload_f32(&gpu, &w));
    let out = Buffer::device(&gpu, (t * n * 4) as u64).unwrap();
    let args = [Arg::Ptr(xb.ptr()), Arg::Ptr(wb.ptr()), Arg::Ptr(out.ptr()), Arg::I32(n as i32), Arg::F32(1e-5)];
    run(&*gpu, "rms_norm_f32", Dims::linear(t as u32, 256), &args).unwrap();
    let mut want = vec![0f32; t * n];
    for r in 0..t {
        ops::rms_norm(&x[r * n..(r + 1) * n], &w, 1e-5, &mut want[r * n..(r + 1) * n]);
    }
    assert_close("rms_norm", &out.read_f32(t * n).unwrap(), &want, 1e-5);
    // Added into its output (a post-norm joining the residual stream): out = previous out + norm.
    let previous = out.read_f32(t * n).unwrap();
    run(&*gpu, "rms_norm_add_f32", Dims::linear(t as u32, 256), &args).unwrap();
    let twice: Vec<f32> = previous.iter().zip(&want).map(|(a, b)| a + b).collect();
    assert_close("rms_norm_add", &out.read_f32(t * n).unwrap(), &twice, 1e-5);
    // In place over rows of a head (the q/k head norms): 36 rows of 16.
    let (rows, hd) = (t * n / 16, 16);
    let hw = randn(&mut rng, hd, 1.0);
    let hwb = upload_f32(&gpu, &hw);
    let args = [Arg::Ptr(xb.ptr()), Arg::Ptr(hwb.ptr()), Arg::Ptr(xb.ptr()), Arg::I32(hd as i32), Arg::F32(1e-6)];
    run(&*gpu, "rms_norm_f32", Dims::linear(rows as u32, 256), &args).unwrap();
    let mut want = x.clone();
    for r in 0..rows {
        ops::rms_norm_in_place(&mut want[r * hd..(r + 1) * hd], &hw, 1e-6);
    }
    assert_close("rms_norm in place over heads", &xb.read_f32(t * n).unwrap(), &want, 1e-5);
    let xb = upload_f32(&gpu, &x);

    // RoPE on query and key heads in one launch, both pair layouts, partial rotation (rope_dims <
    // head_dim), positions from 1000; plain, and with per-pair frequency factors, a linear scale and an
    // attention factor (LongRoPE, llama 3's rope_freqs).
    let (n_head, n_head_kv, head_dim, rope_dims, pos0, base) = (3, 2, 64, 32, 1000, 10000.0f32);
    let factors: Vec<f32> = (0..rope_dims / 2).map(|i| 1.0 + 0.37 * i as f32).collect();
    let fb = upload_f32(&gpu, &factors);
    let plain = strata::model::RopeParams { base, freq_scale: 1.0, mscale: 1.0, yarn: None };
    let scaled = strata::model::RopeParams { base: 500000.0, freq_scale: 0.25, mscale: 1.2247449, yarn: None };
    // gpt-oss's YaRN: 32x over 4096 positions (the ramp's correction dims fall inside rope_dims / 2).
    let yarn = Some(strata::model::Yarn::new(rope_dims, 4096, 150000.0));
    let yarned = strata::model::RopeParams { base: 150000.0, freq_scale: 1.0 / 32.0, mscale: 1.0, yarn };
    for (kind, neox) in [(RopeKind::Norm, 0), (RopeKind::Neox, 1)] {
        for (rope, with_factors) in [(plain, false), (scaled, true), (yarned, false)] {
            let q = randn(&mut rng, t * n_head * head_dim, 1.0);
            let k = randn(&mut rng, t * n_head_kv * head_dim, 1.0);
            let (qb, kb) = (upload_f32(&gpu, &q), upload_f32(&gpu, &k));
            let theta_scale = rope.base.powf(-2.0 / rope_dims as f32);
            let args = [
                Arg::Ptr(qb.ptr()),
                Arg::Ptr(kb.ptr()),
                Arg::Ptr(if with_factors { fb.ptr() } else { 0 }),
                Arg::I32(t as i32),
                Arg::I32(n_head as i32),
                Arg::I32(n_head_kv as i32),
                Arg::I32(head_dim as i32),
                Arg::I32(rope_dims as i32),
                Arg::I32(pos0 as i32),
                Arg::F32(theta_scale),
                Arg::F32(rope.freq_scale),
                Arg::F32(rope.mscale),
                Arg::I32(neox),
                Arg::I32(i32::from(rope.yarn.is_some())),
                Arg::F32(rope.yarn.map_or(0.0, |y| y.low)),
                Arg::F32(rope.yarn.map_or(0.0, |y| y.high)),
            ];
            run(&*gpu, "rope_f32", Dims::over(t * (n_head + n_head_kv) * rope_dims / 2, 128), &args).unwrap();
            for (name, x, xb, heads) in [("q", &q, &qb, n_head), ("k", &k, &kb, n_head_kv)] {
                let mut want = x.clone();
                for tt in 0..t {
                    let table = ops::rope_table(pos0 + tt, rope_dims, &rope, with_factors.then_some(&factors[..]));
                    for h in 0..heads {
                        let at = (tt * heads + h) * head_dim;
                        ops::rope_apply(&mut want[at..at + rope_dims], &table, kind);
                    }
                }
                let what = format!("rope {kind:?} {name} (factors {with_factors}, yarn {:?})", rope.yarn);
                assert_close(&what, &xb.read_f32(x.len()).unwrap(), &want, 1e-5);
            }
        }
    }

    let (g, u) = (randn(&mut rng, 1000, 4.0), randn(&mut rng, 1000, 1.0));
    let (gb, ub) = (upload_f32(&gpu, &g), upload_f32(&gpu, &u));
    run(&*gpu, "swiglu_f32", Dims::over(1000, 256), &[Arg::Ptr(gb.ptr()), Arg::Ptr(ub.ptr()), Arg::I32(1000)]).unwrap();
    let mut want = g.clone();
    ops::swiglu(&mut want, &u);
    let swiglu_out = gb.read_f32(1000).unwrap();
    assert_close("swiglu", &swiglu_out, &want, 1e-6);

    // GeGLU (Gemma's GELU, tanh form) over a range that reaches both tails of its sigmoid.
    let (g2, u2) = (randn(&mut rng, 1000, 12.0), randn(&mut rng, 1000, 1.0));
    let (g2b, u2b) = (upload_f32(&gpu, &g2), upload_f32(&gpu, &u2));
    run(&*gpu, "geglu_f32", Dims::over(1000, 256), &[Arg::Ptr(g2b.ptr()), Arg::Ptr(u2b.ptr()), Arg::I32(1000)])
        .unwrap();
    let mut want = g2.clone();
    ops::glu(&mut want, &u2, strata::model::FfnAct::GeluTanh);
    assert_close("geglu", &g2b.read_f32(1000).unwrap(), &want, 1e-6);

    // gpt-oss's clamped SwiGLU, over ranges past both clamps (g above 7, u outside [-7, 7]); a NaN in g or
    // in u stays NaN, as on the CPU.
    let (mut g3, mut u3) = (randn(&mut rng, 1000, 12.0), randn(&mut rng, 1000, 10.0));
    (g3[7], u3[5]) = (f32::NAN, f32::NAN);
    let (g3b, u3b) = (upload_f32(&gpu, &g3), upload_f32(&gpu, &u3));
    let args = [Arg::Ptr(g3b.ptr()), Arg::Ptr(u3b.ptr()), Arg::I32(1000)];
    run(&*gpu, "swiglu_oai_f32", Dims::over(1000, 256), &args).unwrap();
    let mut want = g3.clone();
    ops::glu(&mut want, &u3, strata::model::FfnAct::SwigluOai);
    let mut got = g3b.read_f32(1000).unwrap();
    for i in [5, 7] {
        assert!(got[i].is_nan() && want[i].is_nan(), "swiglu_oai[{i}]: got {}, the cpu {}", got[i], want[i]);
        (got[i], want[i]) = (0.0, 0.0);
    }
    assert_close("swiglu_oai", &got, &want, 1e-6);

    // Scaling (Gemma's embeddings) is exact; the soft-cap (Gemma 2's logits) within tanh's rounding.
    let sb = upload_f32(&gpu, &g2);
    run(&*gpu, "scale_f32", Dims::over(1000, 256), &[Arg::Ptr(sb.ptr()), Arg::F32(8.0), Arg::I32(1000)]).unwrap();
    let want: Vec<f32> = g2.iter().map(|v| v * 8.0).collect();
    assert_eq!(sb.read_f32(1000).unwrap(), want, "scale");
    run(&*gpu, "softcap_f32", Dims::over(1000, 256), &[Arg::Ptr(sb.ptr()), Arg::F32(30.0), Arg::I32(1000)]).unwrap();
    let mut want: Vec<f32> = g2.iter().map(|v| v * 8.0).collect();
    ops::softcap(&mut want, 30.0);
    assert_close("softcap", &sb.read_f32(1000).unwrap(), &want, 1e-6);

    let bias = randn(&mut rng, 100, 1.0);
    let bb = upload_f32(&gpu, &bias);
    run(
        &*gpu,
        "add_bias_f32",
        Dims::over(1000, 256),
        &[Arg::Ptr(gb.ptr()), Arg::Ptr(bb.ptr()), Arg::I32(100), Arg::I32(1000)],
    )
    .unwrap();
    // From the GPU's own SwiGLU output (its expf may round differently from the CPU's): an add is exact.
    let want: Vec<f32> = swiglu_out.iter().enumerate().map(|(i, a)| a + bias[i % 100]).collect();
    assert_eq!(gb.read_f32(1000).unwrap(), want, "add_bias");

    let idx: Vec<i32> = vec![4, 1];
    let ib = upload(&gpu, bytemuck::cast_slice(&idx));
    let picked = Buffer::device(&gpu, (2 * n * 4) as u64).unwrap();
    run(
        &*gpu,
        "gather_rows_f32",
        Dims::linear(2, 128),
        &[Arg::Ptr(xb.ptr()), Arg::Ptr(ib.ptr()), Arg::Ptr(picked.ptr()), Arg::I32(n as i32)],
    )
    .unwrap();
    let want: Vec<f32> = [4, 1].iter().flat_map(|&r| x[r * n..(r + 1) * n].to_vec()).collect();
    assert_eq!(picked.read_f32(2 * n).unwrap(), want, "gather_rows");
}

/// A mixture's steps between its products: an expert's outputs weighted and put by (token, rank), then each
/// token's sum over its ranks, best first. Both exact: one multiply per value, then the adds in the CPU's
/// order (`moe::forward`).
#[test]
fn expert_outputs_are_weighted_into_their_slots_and_summed_best_first() {
    let gpu = gpu();
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let (tokens, n_used, d) = (3usize, 2usize, 300usize);
    // Two "experts": the first took slots 5, 0 and 2, the second 1, 3 and 4 (token * n_used + rank).
    let groups: [&[i32]; 2] = [&[5, 0, 2], &[1, 3, 4]];
    let weights: Vec<f32> = randn(&mut rng, tokens * n_used, 1.0);
    let outs = Buffer::device(&gpu, (tokens * n_used * d * 4) as u64).unwrap();
    let mut want_outs = vec![0f32; tokens * n_used * d];
    let mut at = 0;
    for slots in groups {
        let src = randn(&mut rng, slots.len() * d, 2.0);
        let w = &weights[at..at + slots.len()];
        let (sb, slb, wb) = (upload_f32(&gpu, &src), upload(&gpu, bytemuck::cast_slice(slots)), upload_f32(&gpu, w));
        let args =
            [Arg::Ptr(sb.ptr()), Arg::Ptr(outs.ptr()), Arg::Ptr(slb.ptr()), Arg::Ptr(wb.ptr()), Arg::I32(d as i32)];
        run(&*gpu, "moe_scatter_f32", Dims::linear(slots.len() as u32, 128), &args).unwrap();
        for (i, &slot) in slots.iter().enumerate() {
            for j in 0..d {
                want_outs[slot as usize * d + j] = src[i * d + j] * w[i];
            }
        }
        at += slots.len();
    }
    assert_eq!(outs.read_f32(tokens * n_used * d).unwrap(), want_outs, "moe_scatter");

    let sum = Buffer::device(&gpu, (tokens * d * 4) as u64).unwrap();
    let args = [
        Arg::Ptr(outs.ptr()),
        Arg::Ptr(sum.ptr()),
        Arg::I32(n_used as i32),
        Arg::I32(d as i32),
        Arg::I32((tokens * d) as i32),
    ];
    run(&*gpu, "moe_sum_f32", Dims::over(tokens * d, 256), &args).unwrap();
    let want: Vec<f32> = (0..tokens * d)
        .map(|i| {
            let (t, j) = (i / d, i % d);
            let mut acc = want_outs[t * n_used * d + j];
            for r in 1..n_used {
                acc += want_outs[(t * n_used + r) * d + j];
            }
            acc
        })
        .collect();
    assert_eq!(sum.read_f32(tokens * d).unwrap(), want, "moe_sum");
}

/// Where two stores of rows of `row_bytes` differ: how many bytes, and the first few as (position, byte in
/// the row): got, want.
fn byte_diffs(got: &[u8], want: &[u8], row_bytes: usize) -> String {
    let diffs: Vec<usize> = (0..got.len()).filter(|&i| got[i] != want[i]).collect();
    let first: Vec<String> = diffs
        .iter()
        .take(12)
        .map(|&i| format!("({}, {}): {:#04x} want {:#04x}", i / row_bytes, i % row_bytes, got[i], want[i]))
        .collect();
    format!("{} of {} bytes; {}", diffs.len(), got.len(), first.join(", "))
}

/// K and V of `n` positions in pages of 64 rows; odd pages in pinned host memory.
struct Pages {
    pages: Vec<Buffer>,
    table: Buffer,
}

fn pages(gpu: &Arc<dyn Gpu>, n: usize, row_bytes: usize) -> Pages {
    let pages: Vec<Buffer> = (0..n.div_ceil(64))
        .map(|i| {
            let bytes = (64 * row_bytes) as u64;
            if i % 2 == 1 {
                Buffer::pinned_host(gpu, bytes).unwrap()
            } else {
                Buffer::device(gpu, bytes).unwrap()
            }
        })
        .collect();
    let addrs: Vec<u64> = pages.iter().map(Buffer::ptr).collect();
    let table = upload(gpu, bytemuck::cast_slice(&addrs));
    Pages { pages, table }
}

#[test]
fn kv_rows_are_stored_as_the_cpu_stores_them_and_attention_matches() {
    let gpu = gpu();
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    // Global attention; a sliding window with a soft-cap (Gemma 2); a window narrower than the kernel's
    // warps, so some warps see no position; sinks with a window and without (gpt-oss).
    let variants = [
        (None, None, false),
        (Some(40), Some(50.0), false),
        (Some(3), None, false),
        (Some(16), None, true),
        (None, None, true),
    ];
    for int8 in [false, true] {
        stores_and_attends(&gpu, &mut rng, (6, 2, 64), int8, &variants);
    }
    // Heads narrower than a warp (llama 3, qwen2 and phi3's small sizes): f16 pages only, as int8 KV needs
    // heads of whole q8_0 blocks.
    stores_and_attends(&gpu, &mut rng, (4, 2, 16), false, &variants);
}

/// Stores K and V rows of 155 positions (over 3 pages, odd pages in pinned host memory) into f16 or int8
/// pages for heads of `(n_head, n_head_kv, head_dim)`, checks the stored bytes against the CPU's and a
/// gather of them, then runs attention of the last 5 positions' queries for each (window, soft-cap, sinks)
/// of `variants` against an f64 reference (sinks: per-head scores from -2 to 6, one more key of value 0).
fn stores_and_attends(
    gpu: &Arc<dyn Gpu>,
    rng: &mut ChaCha8Rng,
    (n_head, n_head_kv, head_dim): (usize, usize, usize),
    int8: bool,
    variants: &[(Option<usize>, Option<f32>, bool)],
) {
    let kv_dim = n_head_kv * head_dim;
    let (pos0, tokens) = (150, 5); // 155 positions over 3 pages, the batch crossing no page boundary
    let n = pos0 + tokens;
    let row_bytes = if int8 { kv_dim / 32 * 34 } else { kv_dim * 2 };
    let (kp, vp) = (pages(gpu, n, row_bytes), pages(gpu, n, row_bytes));
    let k = randn(rng, n * kv_dim, 1.0);
    let v = randn(rng, n * kv_dim, 1.0);
    let store = if int8 { "kv_store_q8_0" } else { "kv_store_f16" };
    // Positions 0..pos0 in one batch, then the last `tokens` positions in another.
    for (from, count) in [(0, pos0), (pos0, tokens)] {
        let kb = upload_f32(gpu, &k[from * kv_dim..(from + count) * kv_dim]);
        let vb = upload_f32(gpu, &v[from * kv_dim..(from + count) * kv_dim]);
        let per_thread = if int8 { kv_dim / 32 } else { kv_dim };
        let args = [
            Arg::Ptr(kb.ptr()),
            Arg::Ptr(vb.ptr()),
            Arg::Ptr(kp.table.ptr()),
            Arg::Ptr(vp.table.ptr()),
            Arg::I32(count as i32),
            Arg::I32(from as i32),
            Arg::I32(kv_dim as i32),
        ];
        run(&**gpu, store, Dims::over(2 * count * per_thread, 128), &args).unwrap();
    }
    // Stored bytes equal the CPU cache's.
    let mut stored_k = vec![0u8; n * row_bytes];
    for (i, page) in kp.pages.iter().enumerate() {
        let rows = (n - i * 64).min(64);
        page.read_at(0, &mut stored_k[i * 64 * row_bytes..(i * 64 + rows) * row_bytes]).unwrap();
    }
    let mut want_k = vec![0u8; n * row_bytes];
    for p in 0..n {
        let (src, dst) = (&k[p * kv_dim..(p + 1) * kv_dim], &mut want_k[p * row_bytes..(p + 1) * row_bytes]);
        if int8 {
            quant::quantize_q8_0_row(src, dst);
        } else {
            for (j, x) in src.iter().enumerate() {
                dst[2 * j..2 * j + 2].copy_from_slice(&f16::from_f32(*x).to_le_bytes());
            }
        }
    }
    assert!(
        stored_k == want_k,
        "{store}: stored bytes differ from the CPU's: {}",
        byte_diffs(&stored_k, &want_k, row_bytes)
    );
    // Gathered through the page table into pinned host memory (how a conversation is parked): the same
    // rows in order, from row 3 on (a start inside a page).
    let gathered = Buffer::pinned_host(gpu, (n * row_bytes) as u64).unwrap();
    let args = [
        Arg::Ptr(kp.table.ptr()),
        Arg::Ptr(gathered.ptr()),
        Arg::I32(3),
        Arg::I32(n as i32 - 3),
        Arg::I32(row_bytes as i32),
    ];
    run(&**gpu, "kv_gather", Dims::over((n - 3) * row_bytes / 2, 256), &args).unwrap();
    let mut got = vec![0u8; (n - 3) * row_bytes];
    gathered.read_at(0, &mut got).unwrap();
    assert!(got == stored_k[3 * row_bytes..], "kv_gather: {}", byte_diffs(&got, &stored_k[3 * row_bytes..], row_bytes));

    // Attention of the batch's queries over everything stored, against an f64 reference over the stored
    // (rounded) K and V.
    let mut stored_v = vec![0u8; n * row_bytes];
    for (i, page) in vp.pages.iter().enumerate() {
        let rows = (n - i * 64).min(64);
        page.read_at(0, &mut stored_v[i * 64 * row_bytes..(i * 64 + rows) * row_bytes]).unwrap();
    }
    let deq = |bytes: &[u8]| -> Vec<f32> {
        let mut out = vec![0f32; n * kv_dim];
        let ty = if int8 { GgmlType::Q8_0 } else { GgmlType::F16 };
        for p in 0..n {
            quant::dequantize_row(
                ty,
                &bytes[p * row_bytes..(p + 1) * row_bytes],
                &mut out[p * kv_dim..(p + 1) * kv_dim],
            );
        }
        out
    };
    let (kd, vd) = (deq(&stored_k), deq(&stored_v));
    let q = randn(rng, tokens * n_head * head_dim, 1.0);
    let scale = 1.0 / (head_dim as f32).sqrt();
    let qb = upload_f32(gpu, &q);
    let out = Buffer::device(gpu, (q.len() * 4) as u64).unwrap();
    let kernel = if int8 { "attention_q8_0" } else { "attention_f16" };
    let sinks: Vec<f32> = (0..n_head).map(|h| -2.0 + 8.0 * h as f32 / n_head as f32).collect();
    let sb = upload_f32(gpu, &sinks);
    for &(window, softcap, with_sinks) in variants {
        let mut want = vec![0f32; q.len()];
        for t in 0..tokens {
            let pos = pos0 + t;
            let lo = window.map_or(0, |w| (pos + 1).saturating_sub(w));
            for h in 0..n_head {
                let kvh = h / (n_head / n_head_kv);
                let qv = &q[(t * n_head + h) * head_dim..][..head_dim];
                let scores: Vec<f64> = (lo..=pos)
                    .map(|p| {
                        let dot: f64 =
                            (0..head_dim).map(|d| qv[d] as f64 * kd[p * kv_dim + kvh * head_dim + d] as f64).sum();
                        let s = dot * scale as f64;
                        softcap.map_or(s, |c| c as f64 * (s / c as f64).tanh())
                    })
                    .collect();
                let sink = if with_sinks { sinks[h] as f64 } else { f64::NEG_INFINITY };
                let max = scores.iter().cloned().fold(sink, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let sum: f64 = e.iter().sum::<f64>() + (sink - max).exp();
                for d in 0..head_dim {
                    let o: f64 =
                        e.iter().enumerate().map(|(i, w)| w * vd[(lo + i) * kv_dim + kvh * head_dim + d] as f64).sum();
                    want[(t * n_head + h) * head_dim + d] = (o / sum) as f32;
                }
            }
        }
        let args = [
            Arg::Ptr(qb.ptr()),
            Arg::Ptr(out.ptr()),
            Arg::Ptr(kp.table.ptr()),
            Arg::Ptr(vp.table.ptr()),
            Arg::I32(pos0 as i32),
            Arg::I32(n_head as i32),
            Arg::I32(n_head_kv as i32),
            Arg::I32(head_dim as i32),
            Arg::F32(scale),
            Arg::I32(window.unwrap_or(0) as i32),
            Arg::F32(softcap.unwrap_or(0.0)),
            Arg::Ptr(if with_sinks { sb.ptr() } else { 0 }),
        ];
        run(&**gpu, kernel, Dims::linear((tokens * n_head) as u32, 128), &args).unwrap();
        let what = format!("{kernel} heads of {head_dim}, window {window:?}, soft-cap {softcap:?}, sinks {with_sinks}");
        assert_close(&what, &out.read_f32(q.len()).unwrap(), &want, 1e-5);
    }
}

#[test]
fn launches_with_wrong_arguments_are_refused_before_running() {
    let gpu = gpu();
    let e = run(&*gpu, "swiglu_f32", Dims::over(10, 32), &[Arg::Ptr(0), Arg::I32(1)]).unwrap_err();
    assert!(e.to_string().contains("do not match its parameters \"ppi\""), "{e}");
    let e = run(&*gpu, "no_such_kernel", Dims::over(10, 32), &[]).unwrap_err();
    assert!(e.to_string().contains("no such kernel"), "{e}");
    let e = run(&*gpu, "swiglu_f32", Dims::linear(1, 2048), &[Arg::Ptr(0), Arg::Ptr(0), Arg::I32(0)]).unwrap_err();
    assert!(e.to_string().contains("bad launch dimensions"), "{e}");
}

/// `.param .u64 name_param_0,` ... of `.entry name(` in PTX, as kinds: u64 -> p or l, u32 -> i, f32 -> f.
fn ptx_params(ptx: &str, name: &str) -> Option<String> {
    let start = ptx.find(&format!(".entry {name}("))?;
    let body = &ptx[start..ptx[start..].find(')')? + start];
    Some(
        body.lines()
            .filter_map(|l| l.trim().strip_prefix(".param ."))
            .map(|l| match &l[..3] {
                "u64" => 'P',
                "u32" => 'i',
                "f32" => 'f',
                other => panic!("{name}: parameter type {other}"),
            })
            .collect(),
    )
}

#[test]
fn the_ptx_the_emulator_and_the_launch_table_agree_on_every_kernel() {
    let emulated = emu::signatures();
    let listed: Vec<_> = kernels::entries().collect();
    assert_eq!(emulated.len(), listed.len(), "the emulator and kernels::entries list the same kernels");
    for e in &listed {
        let (_, sig) = emulated.iter().find(|(n, _)| n == e.name).unwrap_or_else(|| panic!("{} not emulated", e.name));
        assert_eq!(sig, e.params, "{}: emulator parameters", e.name);
        let file = KERNEL_FILES.iter().find(|f| f.name == e.file).unwrap();
        let ptx = ptx_params(file.ptx, e.name).unwrap_or_else(|| panic!("{} not in {}.ptx", e.name, e.file));
        // PTX does not tell a pointer from an i64: both are .u64.
        let want: String = e.params.chars().map(|c| if c == 'p' || c == 'l' { 'P' } else { c }).collect();
        assert_eq!(ptx, want, "{}: PTX parameters", e.name);
    }
}
