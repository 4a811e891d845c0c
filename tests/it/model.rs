//! The forward pass on tiny synthetic models (random weights, every weight type, both tokenizer kinds,
//! llama and qwen2 shapes): agreement with a plain float64 reference, batch invariance, KV types, errors.

use crate::common;

use std::sync::Arc;

use strata::gguf::GgufFile;
use strata::model::synthetic::{SyntheticSpec, SyntheticVocab};
use strata::model::{KvType, Model, ModelError};
use strata::quant::GgmlType;
use strata::threadpool::ThreadPool;
use strata::tokenizer::Tokenizer;

fn build(spec: &SyntheticSpec) -> Model {
    let file = GgufFile::from_bytes(spec.to_gguf()).expect("synthetic GGUF parses");
    Model::from_file(Arc::new(file)).expect("synthetic model loads")
}

/// Largest |ours - reference| relative to the largest |reference| logit.
fn rel_error(ours: &[f32], reference: &[Vec<f64>]) -> f64 {
    let n = reference[0].len();
    let mut max_ref = 0f64;
    let mut max_err = 0f64;
    for (t, row) in reference.iter().enumerate() {
        for (i, r) in row.iter().enumerate() {
            max_ref = max_ref.max(r.abs());
            max_err = max_err.max((ours[t * n + i] as f64 - r).abs());
        }
    }
    max_err / max_ref
}

#[test]
fn every_weight_type_agrees_with_the_float64_reference() {
    let pool = ThreadPool::new(2);
    for ty in GgmlType::WEIGHT_TYPES {
        let model = build(&common::spec_for(ty));
        let toks = common::tokens(12, model.cfg.n_vocab, 3);
        let ours = common::logits_in_batches(&model, &pool, KvType::F16, &toks, 12);
        assert!(ours.iter().all(|v| v.is_finite()), "{ty}: non-finite logits");
        let err = rel_error(&ours, &common::reference_logits(&model, &toks));
        // Activations are quantized to 8 bits for the block types (as llama.cpp does): about 1% error.
        let tol = match ty {
            // f32 weights see f32 activations; the f16 KV cache is the only rounding.
            GgmlType::F32 => 2e-3,
            GgmlType::F16 | GgmlType::BF16 => 2e-2,
            _ => 6e-2,
        };
        println!("{ty}: relative logit error {err:.2e} (tolerance {tol:.0e})");
        assert!(err < tol, "{ty}: relative logit error {err} exceeds {tol}");
    }
}

#[test]
fn mixed_types_qwen2_biases_and_neox_rope_agree_with_the_reference() {
    let pool = ThreadPool::new(2);
    let spec = SyntheticSpec {
        arch: "qwen2",
        qkv_bias: true,
        matrix_types: vec![
            GgmlType::Q4K,
            GgmlType::Q5_0,
            GgmlType::Q6K,
            GgmlType::Q8_0,
            GgmlType::Q5K,
            GgmlType::F16,
            GgmlType::Q4_0,
        ],
        output_type: Some(GgmlType::Q6K),
        ..Default::default()
    };
    let model = build(&spec);
    assert_eq!(model.cfg.rope_kind, strata::model::RopeKind::Neox);
    assert!(model.weights.layers[0].bq.is_some());
    let toks = common::tokens(10, model.cfg.n_vocab, 5);
    let ours = common::logits_in_batches(&model, &pool, KvType::F16, &toks, 10);
    let err = rel_error(&ours, &common::reference_logits(&model, &toks));
    assert!(err < 6e-2, "relative logit error {err}");
}

#[test]
fn logits_are_bit_identical_across_batch_sizes_for_every_type_and_kv() {
    let pool = ThreadPool::new(2);
    for ty in GgmlType::WEIGHT_TYPES {
        let model = build(&common::spec_for(ty));
        let toks = common::tokens(70, model.cfg.n_vocab, 11);
        for kv in [KvType::F16, KvType::Int8] {
            let whole = common::bits(&common::logits_in_batches(&model, &pool, kv, &toks, 70));
            for batch in [1, 7, 64] {
                let other = common::bits(&common::logits_in_batches(&model, &pool, kv, &toks, batch));
                assert!(whole == other, "{ty} {kv:?}: batch {batch} differs from one batch of 70");
            }
        }
    }
}

#[test]
fn results_do_not_depend_on_the_thread_count() {
    let model = build(&SyntheticSpec::default());
    let toks = common::tokens(40, model.cfg.n_vocab, 2);
    let one = common::bits(&common::logits_in_batches(&model, &ThreadPool::new(1), KvType::F16, &toks, 16));
    let three = common::bits(&common::logits_in_batches(&model, &ThreadPool::new(3), KvType::F16, &toks, 16));
    assert!(one == three);
}

#[test]
fn int8_kv_stays_close_to_f16_kv() {
    let pool = ThreadPool::new(2);
    let model = build(&SyntheticSpec::default());
    let toks = common::tokens(50, model.cfg.n_vocab, 4);
    let a = common::logits_in_batches(&model, &pool, KvType::F16, &toks, 50);
    let b = common::logits_in_batches(&model, &pool, KvType::Int8, &toks, 50);
    let max_abs = a.iter().map(|v| v.abs()).fold(0f32, f32::max);
    let max_diff = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
    assert!(a != b, "int8 KV must actually change the arithmetic");
    assert!(max_diff / max_abs < 0.05, "int8 KV moved logits by {max_diff} (max {max_abs})");
    // int8 rows are blocks of 32 values in 34 bytes: a bit over half of f16's 64 bytes.
    let dim = model.cfg.kv_dim();
    assert_eq!(KvType::Int8.row_bytes(dim), dim / 32 * 34);
    assert_eq!(KvType::F16.row_bytes(dim), dim * 2);
}

#[test]
fn f32_kv_removes_the_kv_rounding_and_keeps_batch_invariance() {
    // f32 weights see f32 activations: with f16 KV the cache is the one rounding left, with f32 KV none is.
    let pool = ThreadPool::new(2);
    let model = build(&common::spec_for(GgmlType::F32));
    let toks = common::tokens(70, model.cfg.n_vocab, 13);
    let reference = common::reference_logits(&model, &toks);
    let f16 = rel_error(&common::logits_in_batches(&model, &pool, KvType::F16, &toks, 70), &reference);
    let f32_logits = common::logits_in_batches(&model, &pool, KvType::F32, &toks, 70);
    let f32 = rel_error(&f32_logits, &reference);
    println!("relative logit error: f16 KV {f16:.2e}, f32 KV {f32:.2e}");
    assert!(f32 < f16 / 100.0, "f32 KV ({f32:e}) is not clearly closer to float64 than f16 KV ({f16:e})");
    let whole = common::bits(&f32_logits);
    for batch in [1, 7, 64] {
        let other = common::bits(&common::logits_in_batches(&model, &pool, KvType::F32, &toks, batch));
        assert!(whole == other, "f32 KV: batch {batch} differs from one batch of 70");
    }
    assert_eq!(model.kv_bytes_per_token(KvType::F32), 2 * model.kv_bytes_per_token(KvType::F16));
}

#[test]
fn tied_and_separate_output_heads_both_load() {
    let tied = build(&SyntheticSpec::default());
    assert!(tied.weights.tied_output);
    let separate = build(&SyntheticSpec { output_type: Some(GgmlType::Q8_0), ..Default::default() });
    assert!(!separate.weights.tied_output);
}

#[test]
fn both_tokenizer_kinds_load_from_synthetic_models() {
    for vocab in [SyntheticVocab::Bpe, SyntheticVocab::Spm] {
        let spec = SyntheticSpec { vocab, ..Default::default() };
        let file = GgufFile::from_bytes(spec.to_gguf()).expect("parses");
        let tok = Tokenizer::from_gguf(&file).expect("tokenizer loads");
        let ids = tok.encode("the quick brown fox", true);
        assert!(!ids.is_empty());
        assert_eq!(tok.decode(&ids).trim_start(), "the quick brown fox", "{vocab:?}");
        let model = Model::from_file(Arc::new(file)).expect("model loads");
        assert_eq!(model.cfg.n_vocab, tok.n_vocab());
    }
}

#[test]
fn the_context_limit_and_bad_tokens_are_errors_that_change_nothing() {
    let pool = ThreadPool::new(2);
    let model = build(&SyntheticSpec::default());
    let mut kv = model.new_kv(KvType::F16, 8).expect("kv");
    model.forward(&pool, &mut kv, &[1, 2, 3], &[2]).expect("fits");
    match model.forward(&pool, &mut kv, &[4; 6], &[5]) {
        Err(ModelError::ContextOverflow { needed: 9, max: 8 }) => {}
        other => panic!("expected a context overflow, got {:?}", other.map(|_| ())),
    }
    assert_eq!(kv.len(), 3, "a refused batch appends nothing");
    let bad = model.cfg.n_vocab as u32;
    assert!(matches!(model.forward(&pool, &mut kv, &[bad], &[0]), Err(ModelError::BadToken { .. })));
    assert_eq!(kv.len(), 3);
    model.forward(&pool, &mut kv, &[4], &[0]).expect("still usable");
}

#[test]
fn kv_storage_grows_in_pages_not_to_the_full_context() {
    let pool = ThreadPool::new(1);
    let model = build(&SyntheticSpec::default());
    let mut kv = model.new_kv(KvType::F16, 8192).expect("kv");
    model.forward(&pool, &mut kv, &[1, 2, 3], &[]).expect("forward");
    let page = strata::model::kv::KV_PAGE_TOKENS;
    assert_eq!(kv.allocated_bytes(), page * model.kv_bytes_per_token(KvType::F16));
}

#[test]
fn outliers_in_activations_are_kept_exact() {
    use strata::model::acts::{QuantActs, OUTLIER_RATIO};
    use strata::model::ops::{matmul, MatJob, SharedMut};
    let pool = ThreadPool::new(2);
    let model = build(&SyntheticSpec::default());
    let w = model.weights.layers[0].ffn.dense().expect("a dense FFN").0; // gate: Q4_1, (n_ff, n_embd)
    let n = w.cols;
    // A smooth row with one massive value, like the channels of small llamas' "massive activations".
    let mut x: Vec<f32> = (0..n).map(|i| ((i as f32) * 0.37).sin() * 0.5).collect();
    x[5] = 400.0;
    let mut qa = QuantActs::default();
    qa.quantize(&pool, w.ty, &x, n);
    assert_eq!(qa.outliers[0], vec![(5, 400.0)], "the value beyond {OUTLIER_RATIO}x RMS is taken out");
    let mut out = vec![0f32; w.rows];
    matmul(&pool, &[MatJob { w, bias: None, out: SharedMut::new(&mut out) }], &qa);
    let mut row = vec![0f32; n];
    let mut worst = 0f64;
    for (r, got) in out.iter().enumerate() {
        w.dequantize_row_into(r, &mut row);
        let exact: f64 = row.iter().zip(&x).map(|(a, b)| *a as f64 * *b as f64).sum();
        let rest: f64 = row
            .iter()
            .zip(&x)
            .enumerate()
            .filter(|(i, _)| *i != 5)
            .map(|(_, (a, b))| (*a as f64 * *b as f64).abs())
            .sum();
        worst = worst.max((*got as f64 - exact).abs() / rest.max(1e-9));
    }
    // Without the outlier taken out, the block holding it would quantize its neighbours in steps of
    // 400/127 (about 3, against values below 0.5): errors of the order of the rest of the dot product.
    assert!(worst < 0.02, "error relative to the non-outlier part: {worst}");
}
