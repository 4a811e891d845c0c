//! Helpers shared by the integration tests: where the default model and the reference data are.
#![allow(dead_code)]

pub mod families;
pub mod hub;
pub mod server;

use strata::sync::LockUnpoisoned;

/// Runs the `strata` binary with `args` (the default model as `STRATA_MODEL`) to its end.
pub fn strata(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(args)
        .env("STRATA_MODEL", model_path())
        .output()
        .expect("the strata binary runs")
}

/// A finished run's standard output, as text.
pub fn stdout(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A finished run's standard error, as text.
pub fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Runs that compute with the model one at a time (a server, a replay: each uses both cores), across every
/// topic of the test binary.
static MODEL_RUNS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Holds the model-run lock until the guard drops.
pub fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    MODEL_RUNS.lock_unpoisoned()
}

use std::path::PathBuf;

/// The default model: `STRATA_MODEL`, else `models/SmolLM2-135M-Instruct.Q4_1.gguf`. Panics (the test
/// fails, it never skips) when the file is missing.
pub fn model_path() -> PathBuf {
    let path = match std::env::var_os("STRATA_MODEL") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/SmolLM2-135M-Instruct.Q4_1.gguf"),
    };
    assert!(path.is_file(), "model file {} is missing: run scripts/fetch-model (or set STRATA_MODEL)", path.display());
    path
}

/// A file of llama.cpp's reference data (copied from shared/reference into tests/data/reference), under
/// `STRATA_ROOT` when set (test binaries run elsewhere than they were built: scripts/gpu-check).
pub fn reference_path(name: &str) -> PathBuf {
    let root = std::env::var_os("STRATA_ROOT").map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from);
    root.join("tests/data/reference").join(name)
}

pub fn reference_json(name: &str) -> serde_json::Value {
    let path = reference_path(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

/// The bits of a slice of floats, for bit-exact comparisons with readable failures.
pub fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

/// Logits of every position of `tokens`, read from an empty cache in batches of `batch`.
pub fn logits_in_batches(
    model: &strata::model::Model,
    pool: &strata::threadpool::ThreadPool,
    kv_type: strata::model::KvType,
    tokens: &[u32],
    batch: usize,
) -> Vec<f32> {
    let mut kv = model.new_kv(kv_type, tokens.len()).expect("kv");
    let mut out = Vec::new();
    for chunk in tokens.chunks(batch) {
        let want: Vec<usize> = (0..chunk.len()).collect();
        out.extend(model.forward(pool, &mut kv, chunk, &want).expect("forward").data);
    }
    out
}

#[allow(dead_code)]
/// A float64 forward pass over dequantized weights: the arithmetic of a llama-shaped model, spelled out.
pub fn reference_logits(model: &strata::model::Model, toks: &[u32]) -> Vec<Vec<f64>> {
    reference_logits_from(model, toks, 0)
}

/// [`reference_logits`] at the last position only (the head, 49,152 x 576 on the default model, is applied
/// once instead of at every position; the rest of the arithmetic is the same).
pub fn reference_last_logits(model: &strata::model::Model, toks: &[u32]) -> Vec<f64> {
    reference_logits_from(model, toks, toks.len() - 1).pop().expect("a non-empty prompt")
}

/// Tensor `name` of the model's file dequantized: (values, rows, cols).
fn dequantized(file: &strata::gguf::GgufFile, name: &str) -> (Vec<f64>, usize, usize) {
    let t = file.tensor(name).unwrap_or_else(|| panic!("{name}"));
    let cols = t.dims[0] as usize;
    let rows = t.n_rows() as usize;
    let mut f = vec![0f32; cols * rows];
    strata::quant::dequantize_row(t.ty, file.tensor_data(t), &mut f);
    (f.into_iter().map(f64::from).collect(), rows, cols)
}

fn matvec(m: &(Vec<f64>, usize, usize), x: &[f64]) -> Vec<f64> {
    (0..m.1).map(|r| (0..m.2).map(|i| m.0[r * m.2 + i] * x[i]).sum()).collect()
}

/// The float64 logits of positions `first..` of `toks` (every position is computed: attention needs them).
fn reference_logits_from(model: &strata::model::Model, toks: &[u32], first: usize) -> Vec<Vec<f64>> {
    let file = &model.file;
    let untied_head = file.tensor("output.weight").map(|_| dequantized(file, "output.weight"));
    let head = untied_head.unwrap_or_else(|| dequantized(file, "token_embd.weight"));
    reference_hidden(model, toks)[first..].iter().map(|h| matvec(&head, h)).collect()
}

#[allow(dead_code)]
/// The float64 hidden state of every position of `toks` after the output norm: (t_count, n_embd), what the
/// head reads and embeddings are pooled from.
pub fn reference_hidden(model: &strata::model::Model, toks: &[u32]) -> Vec<Vec<f64>> {
    let c = &model.cfg;
    let file = &model.file;
    let mat = |name: &str| dequantized(file, name);
    let vecf = |name: &str| mat(name).0;
    let rms = |x: &[f64], w: &[f64]| -> Vec<f64> {
        let s = (x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64 + c.rms_eps as f64).sqrt();
        x.iter().zip(w).map(|(a, b)| a / s * b).collect()
    };
    let rope = |v: &mut [f64], pos: usize| {
        let n = c.rope_dims / 2;
        for i in 0..n {
            let theta = pos as f64 * (c.rope_base as f64).powf(-2.0 * i as f64 / c.rope_dims as f64);
            let (a, b) = match c.rope_kind {
                strata::model::RopeKind::Norm => (2 * i, 2 * i + 1),
                strata::model::RopeKind::Neox => (i, i + n),
            };
            let (x0, x1) = (v[a], v[b]);
            v[a] = x0 * theta.cos() - x1 * theta.sin();
            v[b] = x0 * theta.sin() + x1 * theta.cos();
        }
    };
    let emb = mat("token_embd.weight");
    let hd = c.head_dim;
    let mut xs: Vec<Vec<f64>> =
        toks.iter().map(|&t| emb.0[t as usize * c.n_embd..(t as usize + 1) * c.n_embd].to_vec()).collect();
    for l in 0..c.n_layer {
        let p = |s: &str| format!("blk.{l}.{s}");
        let (wq, wk, wv, wo) = (
            mat(&p("attn_q.weight")),
            mat(&p("attn_k.weight")),
            mat(&p("attn_v.weight")),
            mat(&p("attn_output.weight")),
        );
        let bias = |s: &str| file.tensor(&p(s)).map(|_| vecf(&p(s)));
        let (bq, bk, bv) = (bias("attn_q.bias"), bias("attn_k.bias"), bias("attn_v.bias"));
        let add = |mut v: Vec<f64>, b: &Option<Vec<f64>>| {
            if let Some(b) = b {
                v.iter_mut().zip(b).for_each(|(a, b)| *a += b);
            }
            v
        };
        let an = vecf(&p("attn_norm.weight"));
        let mut qs = Vec::new();
        let mut ks = Vec::new();
        let mut vs = Vec::new();
        for (pos, x) in xs.iter().enumerate() {
            let h = rms(x, &an);
            let mut q = add(matvec(&wq, &h), &bq);
            let mut k = add(matvec(&wk, &h), &bk);
            for hh in 0..c.n_head {
                rope(&mut q[hh * hd..hh * hd + c.rope_dims], pos);
            }
            for hh in 0..c.n_head_kv {
                rope(&mut k[hh * hd..hh * hd + c.rope_dims], pos);
            }
            qs.push(q);
            ks.push(k);
            vs.push(add(matvec(&wv, &h), &bv));
        }
        let group = c.n_head / c.n_head_kv;
        // Dequantized once per layer (the same values at every position).
        let fn_w = vecf(&p("ffn_norm.weight"));
        // A mixture of experts (Mixtral's layout: a softmax router, the best `n_used` renormalized, SiLU
        // experts) or a dense FFN.
        let moe = file.tensor(&p("ffn_gate_inp.weight")).map(|_| {
            let m = c.moe.expect("a mixture's config");
            assert!(
                m.gating == strata::model::family::Gating::Softmax && m.norm_weights && m.weights_scale == 1.0,
                "the float64 reference runs Mixtral's routing only"
            );
            let exps = |s: &str| mat(&p(&format!("ffn_{s}_exps.weight")));
            (m, mat(&p("ffn_gate_inp.weight")), exps("gate"), exps("up"), exps("down"))
        });
        let silu_glu = |g: Vec<f64>, u: Vec<f64>| -> Vec<f64> {
            g.iter().zip(&u).map(|(g, u)| g / (1.0 + (-g).exp()) * u).collect()
        };
        // Rows `at..at + n` of a matrix, as a matrix.
        let rows_of =
            |m: &(Vec<f64>, usize, usize), at: usize, n: usize| (m.0[at * m.2..(at + n) * m.2].to_vec(), n, m.2);
        let moe_ffn = |h: &[f64]| -> Vec<f64> {
            let (m, router, gate, up, down) = moe.as_ref().expect("a mixture");
            let scores = matvec(router, h);
            let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = scores.iter().map(|v| (v - max).exp()).collect();
            let mut order: Vec<usize> = (0..e.len()).collect();
            order.sort_by(|&a, &b| e[b].total_cmp(&e[a]));
            let picked = &order[..m.n_used];
            let total: f64 = picked.iter().map(|&i| e[i]).sum();
            let mut out = vec![0f64; h.len()];
            for &ex in picked {
                let ff = m.n_ff_exp;
                let a = silu_glu(matvec(&rows_of(gate, ex * ff, ff), h), matvec(&rows_of(up, ex * ff, ff), h));
                let dn = matvec(&rows_of(down, ex * h.len(), h.len()), &a);
                out.iter_mut().zip(&dn).for_each(|(o, v)| *o += e[ex] / total * v);
            }
            out
        };
        let dense =
            moe.is_none().then(|| (mat(&p("ffn_gate.weight")), mat(&p("ffn_up.weight")), mat(&p("ffn_down.weight"))));
        for (t, x) in xs.iter_mut().enumerate() {
            let mut att = vec![0f64; c.q_dim()];
            for h in 0..c.n_head {
                let kh = h / group;
                let s: Vec<f64> = (0..=t)
                    .map(|j| (0..hd).map(|i| qs[t][h * hd + i] * ks[j][kh * hd + i]).sum::<f64>() / (hd as f64).sqrt())
                    .collect();
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = s.iter().map(|v| (v - m).exp()).collect();
                let z: f64 = e.iter().sum();
                for (j, w) in e.iter().enumerate() {
                    for i in 0..hd {
                        att[h * hd + i] += w / z * vs[j][kh * hd + i];
                    }
                }
            }
            let o = matvec(&wo, &att);
            x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
            let h = rms(x, &fn_w);
            let dn = match &dense {
                Some((wg, wu, wd)) => matvec(wd, &silu_glu(matvec(wg, &h), matvec(wu, &h))),
                None => moe_ffn(&h),
            };
            x.iter_mut().zip(&dn).for_each(|(a, b)| *a += b);
        }
    }
    let on = vecf("output_norm.weight");
    xs.iter().map(|x| rms(x, &on)).collect()
}

/// The prompt tokens of llama.cpp's greedy.json reference runs.
pub fn greedy_prompts() -> Vec<Vec<u32>> {
    let reference = reference_json("greedy.json");
    reference["results"]
        .as_array()
        .expect("results")
        .iter()
        .map(|r| r["prompt_tokens"].as_array().expect("tokens").iter().map(|t| t.as_u64().unwrap() as u32).collect())
        .collect()
}

/// `n` scattered token ids below `n_vocab` (deterministic for a seed).
pub fn tokens(n: usize, n_vocab: usize, seed: u32) -> Vec<u32> {
    (0..n as u32).map(|i| (i.wrapping_mul(2654435761).wrapping_add(seed * 97) >> 7) % n_vocab as u32).collect()
}

/// A synthetic model whose matrices, embedding and (untied) head all have type `ty`.
pub fn spec_for(ty: strata::quant::GgmlType) -> strata::model::synthetic::SyntheticSpec {
    strata::model::synthetic::SyntheticSpec {
        matrix_types: vec![ty],
        embd_type: ty,
        output_type: Some(ty),
        seed: ty.id() as u64 + 7,
        ..Default::default()
    }
}

/// Writes the tiny synthetic model with the binary (`strata synth --preset tiny`) into `dir`.
pub fn tiny_model_file(dir: &std::path::Path) -> PathBuf {
    let model = dir.join("tiny.gguf");
    let synth = std::process::Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["synth", "--preset", "tiny", "-o"])
        .arg(&model)
        .output()
        .expect("the strata binary runs");
    assert!(synth.status.success(), "{}", String::from_utf8_lossy(&synth.stderr));
    model
}

/// The weight types the GPU has kernels for; the others (checked here to be exactly the five that are
/// CPU-only) are refused at load, which `tests/it` checks.
pub fn gpu_weight_types() -> Vec<strata::quant::GgmlType> {
    use strata::device::cuda::kernels::has_weight_kernels;
    use strata::quant::GgmlType;
    let (with, without): (Vec<GgmlType>, Vec<GgmlType>) =
        GgmlType::WEIGHT_TYPES.iter().partition(|&&t| has_weight_kernels(t));
    assert_eq!(without, [GgmlType::Q2K, GgmlType::Q3K, GgmlType::IQ4XS], "the CPU-only weight types");
    println!("note: no GPU kernels (CPU only, refused on a GPU stage): {without:?}");
    with
}
