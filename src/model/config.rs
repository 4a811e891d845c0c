//! The architecture hyper-parameters of a model, read from GGUF metadata and checked for consistency.

use crate::gguf::GgufFile;

use super::ModelError;

/// The architectures whose forward pass Strata implements (all llama-shaped).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    Llama,
    Mistral,
    Qwen2,
}

/// How RoPE pairs dimensions: `Norm` rotates (2i, 2i+1) (llama, mistral); `Neox` rotates (i, i + d/2) (qwen2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeKind {
    Norm,
    Neox,
}

#[derive(Clone, Debug)]
pub struct ModelConfig {
    pub arch: Arch,
    /// The `general.architecture` string, which prefixes the hyper-parameter keys.
    pub arch_name: String,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_ff: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_vocab: usize,
    /// The context length the model was trained for.
    pub n_ctx_train: usize,
    pub rope_kind: RopeKind,
    pub rope_base: f32,
    /// Dimensions of each head that RoPE rotates.
    pub rope_dims: usize,
    pub rms_eps: f32,
}

impl ModelConfig {
    pub fn from_gguf(file: &GgufFile) -> Result<ModelConfig, ModelError> {
        let arch_name = file
            .get("general.architecture")
            .and_then(|v| v.as_str())
            .ok_or(ModelError::MissingKey("general.architecture".into()))?
            .to_owned();
        let arch = match arch_name.as_str() {
            "llama" => Arch::Llama,
            "mistral" => Arch::Mistral,
            "qwen2" => Arch::Qwen2,
            other => return Err(ModelError::UnsupportedArch(other.to_owned())),
        };
        let key = |k: &str| format!("{arch_name}.{k}");
        let req_u = |k: &str| -> Result<usize, ModelError> {
            let full = key(k);
            let v = file.get(&full).ok_or_else(|| ModelError::MissingKey(full.clone()))?;
            v.as_u64()
                .and_then(|x| usize::try_from(x).ok())
                .filter(|&x| x > 0 && x < (1 << 24))
                .ok_or_else(|| ModelError::BadValue { key: full, value: v.display_short() })
        };
        let opt_u = |k: &str| -> Result<Option<usize>, ModelError> {
            if file.get(&key(k)).is_some() {
                req_u(k).map(Some)
            } else {
                Ok(None)
            }
        };
        let opt_f = |k: &str, default: f32| -> Result<f32, ModelError> {
            let full = key(k);
            match file.get(&full) {
                None => Ok(default),
                Some(v) => v
                    .as_f64()
                    .map(|x| x as f32)
                    .filter(|x| x.is_finite() && *x > 0.0)
                    .ok_or_else(|| ModelError::BadValue { key: full, value: v.display_short() }),
            }
        };

        let n_layer = req_u("block_count")?;
        let n_embd = req_u("embedding_length")?;
        let n_ff = req_u("feed_forward_length")?;
        let n_head = req_u("attention.head_count")?;
        let n_head_kv = opt_u("attention.head_count_kv")?.unwrap_or(n_head);
        let head_dim = opt_u("attention.key_length")?.unwrap_or(n_embd / n_head);
        let rope_dims = opt_u("rope.dimension_count")?.unwrap_or(head_dim);
        let n_ctx_train = opt_u("context_length")?.unwrap_or(4096);
        let rope_base = opt_f("rope.freq_base", 10_000.0)?;
        let rms_eps = opt_f("attention.layer_norm_rms_epsilon", 1e-5)?;
        let n_vocab = match opt_u("vocab_size")? {
            Some(n) => n,
            None => file
                .get("tokenizer.ggml.tokens")
                .and_then(|v| v.as_array())
                .map(|a| a.len())
                .ok_or_else(|| ModelError::MissingKey(key("vocab_size")))?,
        };

        let bad = |what: &str| ModelError::Inconsistent(what.to_owned());
        if head_dim == 0 || n_vocab == 0 {
            return Err(bad(&format!("head dim {head_dim} and vocabulary size {n_vocab} must be positive")));
        }
        if n_head % n_head_kv != 0 {
            return Err(bad(&format!("head_count {n_head} is not a multiple of head_count_kv {n_head_kv}")));
        }
        if head_dim % 2 != 0 || rope_dims > head_dim || rope_dims % 2 != 0 {
            return Err(bad(&format!("head dim {head_dim} / rope dims {rope_dims} must be even, rope <= head")));
        }
        let rope_kind = match arch {
            Arch::Llama | Arch::Mistral => RopeKind::Norm,
            Arch::Qwen2 => RopeKind::Neox,
        };
        Ok(ModelConfig {
            arch,
            arch_name,
            n_layer,
            n_embd,
            n_ff,
            n_head,
            n_head_kv,
            head_dim,
            n_vocab,
            n_ctx_train,
            rope_kind,
            rope_base,
            rope_dims,
            rms_eps,
        })
    }

    /// Width of the K (and V) rows of one layer: `n_head_kv * head_dim`.
    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }

    /// Width of the query rows: `n_head * head_dim`.
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }
}
