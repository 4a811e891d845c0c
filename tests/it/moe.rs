//! Mixtures of experts on quantized weights (`strata synth`'s Mixtral layout, small): every format's
//! experts give each position the same bits whether the prompt is read at once, in chunks or token by token
//! (the decode path runs the picked experts' gate and up in one product call, a batch runs expert by
//! expert), on one thread or two. (The math against llama.cpp and a float64 pass: the f32 fixtures in
//! tests/it/families.rs.)

use std::sync::Arc;

use strata::gguf::GgufFile;
use strata::model::synthetic::SyntheticSpec;
use strata::model::{KvType, Model};
use strata::quant::GgmlType;
use strata::threadpool::ThreadPool;

use crate::common;

fn spec(ty: GgmlType) -> SyntheticSpec {
    SyntheticSpec { n_embd: 256, n_ff: 256, experts: Some((8, 2)), matrix_types: vec![ty], ..SyntheticSpec::default() }
}

fn build(spec: &SyntheticSpec) -> Model {
    let file = GgufFile::from_bytes(spec.to_gguf()).expect("synthetic GGUF parses");
    Model::from_file(Arc::new(file)).expect("synthetic mixture of experts loads")
}

#[test]
fn quantized_experts_are_bit_identical_across_batches_and_threads() {
    let (pool, pool1) = (ThreadPool::new(2), ThreadPool::new(1));
    for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::Q4K, GgmlType::Q6K, GgmlType::F16] {
        let model = build(&spec(ty));
        let m = model.cfg.moe.expect("experts");
        assert_eq!((m.n_expert, m.n_used, m.n_ff_exp), (8, 2, 256));
        let toks = common::tokens(40, model.cfg.n_vocab, 11);
        let bits = |pool: &ThreadPool, batch: usize| -> Vec<u32> {
            common::logits_in_batches(&model, pool, KvType::F16, &toks, batch).iter().map(|x| x.to_bits()).collect()
        };
        let whole = bits(&pool, 40);
        for batch in [1, 3, 16] {
            assert!(bits(&pool, batch) == whole, "{ty}: batches of {batch}");
        }
        assert!(bits(&pool1, 1) == whole, "{ty}: one thread, token by token");
    }
}
