//! Helpers shared by the integration tests: where the default model and the reference data are.
#![allow(dead_code)]

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

/// A file of llama.cpp's reference data (copied from shared/reference into tests/data/reference).
pub fn reference_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/reference").join(name)
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
