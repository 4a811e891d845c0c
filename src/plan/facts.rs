//! What a model file is, read from its metadata and tensor index alone (nothing paged in): the facts the
//! desktop app shows for a dropped file and `/strata/model` reports.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::gguf::GgufFile;
use crate::model::{ModelConfig, ModelError};
use crate::sample::defaults::SamplingDefaults;

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
pub struct ModelFacts {
    pub path: String,
    /// `general.name`, else the file's name without `.gguf`.
    pub name: String,
    pub architecture: String,
    /// What the family does beyond a llama (`model::family`), and its sliding window when it has one.
    #[serde(default)]
    pub features: String,
    /// The tensor type holding most of the bytes (e.g. Q4_1).
    pub quantization: String,
    #[cfg_attr(feature = "ts", ts(type = "number"))]
    pub parameters: u64,
    pub layers: usize,
    pub trained_context: usize,
    pub vocab: usize,
    #[cfg_attr(feature = "ts", ts(type = "number"))]
    pub file_bytes: u64,
    /// What a request that sends no sampling fields gets, each value with its source.
    pub sampling: SamplingDefaults,
}

impl ModelFacts {
    /// The facts of an open file; a model Strata cannot run is the configuration's error.
    pub fn of(file: &GgufFile, path: &Path) -> Result<ModelFacts, ModelError> {
        let cfg = ModelConfig::from_gguf(file)?;
        let mut by_type: BTreeMap<&str, u64> = BTreeMap::new();
        for t in &file.tensors {
            *by_type.entry(t.ty.name()).or_default() += t.n_bytes;
        }
        let quantization = by_type.iter().max_by_key(|(_, b)| **b).map_or("?".to_owned(), |(t, _)| t.to_uppercase());
        let name = file
            .get("general.name")
            .and_then(|v| v.as_str())
            .filter(|n| !n.trim().is_empty())
            .map(str::to_owned)
            .unwrap_or_else(|| {
                let stem = path.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
                stem.strip_suffix(".gguf").unwrap_or(&stem).to_owned()
            });
        Ok(ModelFacts {
            path: path.display().to_string(),
            name,
            architecture: cfg.arch_name.clone(),
            features: features(&cfg),
            quantization,
            parameters: file.tensors.iter().map(|t| t.n_elements()).sum(),
            layers: cfg.n_layer,
            trained_context: cfg.n_ctx_train,
            vocab: cfg.n_vocab,
            file_bytes: file.file_bytes(),
            sampling: SamplingDefaults::of(file),
        })
    }
}

/// The family's features, with its heads and sliding window: "sliding window (5 of 6 layers), ...; grouped-query
/// attention (4 heads, 1 KV); window 512 on 15 of 18 layers".
fn features(cfg: &ModelConfig) -> String {
    let mut out = cfg.family.features.to_owned();
    // A family whose FFN is experts only when the file counts them (llama: Mixtral's layout) says so only then.
    if let Some(m) = cfg.moe.as_ref().filter(|_| !out.contains("mixture of experts")) {
        out.push_str(&format!(", mixture of experts ({} experts, {} used per token)", m.n_expert, m.n_used));
    }
    if cfg.n_head_kv < cfg.n_head {
        out.push_str(&format!("; grouped-query attention ({} heads, {} KV)", cfg.n_head, cfg.n_head_kv));
    }
    if let Some(w) = cfg.swa_window {
        let swa = cfg.swa_layers.iter().filter(|&&s| s).count();
        out.push_str(&format!("; window {w} on {swa} of {} layers", cfg.n_layer));
    }
    out
}
