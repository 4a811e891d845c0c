//! A llama-shaped model (llama, mistral, qwen2): its configuration, its weights, and the forward pass.
//!
//! The model owns the mapped file and never changes after load; all per-sequence state lives in a
//! [`KvCache`], so one model serves many sequences.

pub mod acts;
pub mod config;
mod forward;
pub mod kv;
pub mod ops;
pub mod synthetic;
pub mod weights;

use std::path::Path;
use std::sync::Arc;

use crate::gguf::{GgufError, GgufFile};
use crate::quant::GgmlType;

pub use config::{Arch, ModelConfig, RopeKind};
pub use forward::Logits;
pub use kv::{KvCache, KvType};
pub use weights::Weights;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("unsupported model architecture {0:?} (supported: llama, mistral, qwen2)")]
    UnsupportedArch(String),
    #[error("model metadata lacks {0}")]
    MissingKey(String),
    #[error("model metadata {key} has an invalid value {value}")]
    BadValue { key: String, value: String },
    #[error("model hyper-parameters are inconsistent: {0}")]
    Inconsistent(String),
    #[error("model lacks tensor {0}")]
    MissingTensor(String),
    #[error("tensor {name} has shape {found:?}, expected {expected:?}")]
    TensorShape { name: String, expected: Vec<u64>, found: Vec<u64> },
    #[error("tensor {name} has type {ty}, which cannot be used as a weight")]
    TensorType { name: String, ty: GgmlType },
    #[error("the prompt needs {needed} positions but the context holds {max} (--max-context / -c)")]
    ContextOverflow { needed: usize, max: usize },
    #[error("token id {id} is outside the vocabulary of {n_vocab}")]
    BadToken { id: u32, n_vocab: usize },
    #[error("--kv int8 needs heads whose size is a multiple of 32 (this model's is {0})")]
    KvLayout(usize),
}

pub struct Model {
    pub cfg: ModelConfig,
    pub weights: Weights,
    pub file: Arc<GgufFile>,
}

impl Model {
    /// Opens the GGUF file at `path` and maps its weights.
    pub fn load(path: &Path) -> Result<Model, ModelError> {
        let file = Arc::new(GgufFile::open(path)?);
        Self::from_file(file)
    }

    pub fn from_file(file: Arc<GgufFile>) -> Result<Model, ModelError> {
        let cfg = ModelConfig::from_gguf(&file)?;
        let weights = Weights::load(&file, &cfg)?;
        Ok(Model { cfg, weights, file })
    }

    /// A new empty KV cache for this model holding up to `max_tokens` positions.
    pub fn new_kv(&self, ty: KvType, max_tokens: usize) -> Result<KvCache, ModelError> {
        if ty == KvType::Int8 && self.cfg.head_dim % 32 != 0 {
            return Err(ModelError::KvLayout(self.cfg.head_dim));
        }
        Ok(KvCache::new(ty, self.cfg.n_layer, self.cfg.kv_dim(), max_tokens))
    }

    /// Bytes of weights (the mapped tensor data).
    pub fn weight_bytes(&self) -> u64 {
        self.file.tensors.iter().map(|t| t.n_bytes).sum()
    }

    /// Bytes of KV cache per position for `ty`, over all layers, K and V.
    pub fn kv_bytes_per_token(&self, ty: KvType) -> usize {
        ty.row_bytes(self.cfg.kv_dim()) * 2 * self.cfg.n_layer
    }
}
