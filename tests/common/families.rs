//! The model-family fixtures (tests/data/families: tiny f32-weight models made by scripts/family-fixtures,
//! with llama.cpp's and a float64 pass's outputs beside them), shared by tests/it/families.rs and the GPU
//! tests.

use std::path::PathBuf;

use serde_json::Value;

/// (file stem, reference stem, the context the sequence is sized for): phi3 at a context within its
/// original training length (256) takes LongRoPE's short factors.
pub const FIXTURES: [(&str, &str, usize); 10] = [
    ("llama3", "llama3", 512),
    ("qwen2", "qwen2", 512),
    ("qwen3", "qwen3", 512),
    ("gemma2", "gemma2", 512),
    ("gemma3", "gemma3", 512),
    ("phi3", "phi3", 512),
    ("phi3", "phi3-short", 256),
    ("qwen3moe", "qwen3moe", 512),
    ("mixtral", "mixtral", 512),
    ("gpt-oss", "gpt-oss", 512),
];

/// The stems of every fixture model (each once).
pub const MODELS: [&str; 9] =
    ["llama3", "qwen2", "qwen3", "gemma2", "gemma3", "phi3", "qwen3moe", "mixtral", "gpt-oss"];

/// A file of tests/data/families, under `STRATA_ROOT` when set (scripts/gpu-check runs the GPU tests
/// elsewhere than they were built; the fixtures travel with the working tree).
pub fn file(name: &str) -> PathBuf {
    let root = std::env::var_os("STRATA_ROOT").map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from);
    root.join("tests/data/families").join(name)
}

/// The reference outputs `{stem}.json`.
pub fn reference(stem: &str) -> Value {
    let path = file(&format!("{stem}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("json")
}

pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array().expect("ids").iter().map(|x| x.as_u64().expect("id") as u32).collect()
}

pub fn floats(v: &Value) -> Vec<f64> {
    v.as_array().expect("floats").iter().map(|x| x.as_f64().expect("float")).collect()
}

/// A row of logits as log-probabilities, in f64.
pub fn log_softmax(row: &[f32]) -> Vec<f64> {
    let max = row.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b as f64));
    let sum: f64 = row.iter().map(|&x| (x as f64 - max).exp()).sum();
    row.iter().map(|&x| x as f64 - max - sum.ln()).collect()
}
