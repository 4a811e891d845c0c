//! The architecture hyper-parameters of a model, read from GGUF metadata and checked for consistency.

use crate::gguf::{GgufFile, GgufValue};

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
    /// Reads the hyper-parameters and checks them against each other and against the tensors the file
    /// holds, before anything is allocated by them: a corrupt count names the key, never reserves memory.
    pub fn from_gguf(file: &GgufFile) -> Result<ModelConfig, ModelError> {
        let wrong_type = |key: &str, v: &GgufValue, expected: &'static str| ModelError::WrongType {
            key: key.to_owned(),
            found: v.type_description(),
            expected,
        };
        let arch_key = "general.architecture";
        let arch_name = match file.get(arch_key) {
            None => return Err(ModelError::MissingKey(arch_key.into())),
            Some(v) => v.as_str().ok_or_else(|| wrong_type(arch_key, v, "a string"))?.to_owned(),
        };
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
            if !v.is_integer() {
                return Err(wrong_type(&full, v, "an unsigned integer"));
            }
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
                Some(v) if !(v.is_integer() || matches!(v, GgufValue::F32(_) | GgufValue::F64(_))) => {
                    Err(wrong_type(&full, v, "a number"))
                }
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
        let head_dim = match opt_u("attention.key_length")? {
            Some(d) => d,
            None if n_embd % n_head != 0 => {
                return Err(ModelError::Inconsistent(format!(
                    "{} {n_embd} is not a multiple of {} {n_head} (and {} is absent), so heads have no whole size",
                    key("embedding_length"),
                    key("attention.head_count"),
                    key("attention.key_length")
                )))
            }
            None => n_embd / n_head,
        };
        let rope_dims = opt_u("rope.dimension_count")?.unwrap_or(head_dim);
        let n_ctx_train = opt_u("context_length")?.unwrap_or(4096);
        let rope_base = opt_f("rope.freq_base", 10_000.0)?;
        let rms_eps = opt_f("attention.layer_norm_rms_epsilon", 1e-5)?;
        let tokens_key = "tokenizer.ggml.tokens";
        let n_tokens = match file.get(tokens_key) {
            None => None,
            Some(v) => Some(v.as_array().ok_or_else(|| wrong_type(tokens_key, v, "an array of strings"))?.len()),
        };
        let n_vocab = match (opt_u("vocab_size")?, n_tokens) {
            (Some(n), Some(t)) if n != t => {
                return Err(ModelError::Inconsistent(format!(
                    "{} is {n} but the tokenizer ({tokens_key}) has {t} tokens",
                    key("vocab_size")
                )))
            }
            (Some(n), _) => n,
            (None, Some(t)) => t,
            (None, None) => return Err(ModelError::MissingKey(key("vocab_size"))),
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
        check_blocks(file, n_layer, &key("block_count"))?;
        // The widths of the first block's matrices against the heads and the FFN (the loader checks every
        // block; this is so that nothing sized by the hyper-parameters, here or in `info` and `plan`,
        // exceeds what the file holds).
        let heads = format!("{n_head} heads of {head_dim}");
        let kv_heads = format!("{n_head_kv} KV heads of {head_dim}");
        let ffn = format!("{} {n_ff}", key("feed_forward_length"));
        for (name, cols, rows, what) in [
            ("blk.0.attn_q.weight", n_embd, n_head.saturating_mul(head_dim), &heads),
            ("blk.0.attn_k.weight", n_embd, n_head_kv.saturating_mul(head_dim), &kv_heads),
            ("blk.0.ffn_up.weight", n_embd, n_ff, &ffn),
        ] {
            let Some(t) = file.tensor(name) else { continue };
            if t.dims.len() != 2 || t.dims[0] != cols as u64 || t.dims[1] != rows as u64 {
                return Err(ModelError::Inconsistent(format!(
                    "{name} has shape {:?}, but the hyper-parameters ({what}) make it [{cols}, {rows}]",
                    t.dims
                )));
            }
        }
        if let Some(t) = file.tensor("token_embd.weight") {
            // The embedding's rows are the vocabulary and its row length the embedding width; checked here,
            // before any layer is read, with the keys the numbers come from.
            if t.dims.len() == 2 && t.dims[0] != n_embd as u64 {
                return Err(ModelError::Inconsistent(format!(
                    "{} is {n_embd} but token_embd.weight has rows of {} values",
                    key("embedding_length"),
                    t.dims[0]
                )));
            }
            if t.dims.len() == 2 && t.dims[1] != n_vocab as u64 {
                let source = match n_tokens {
                    Some(_) => format!("the tokenizer ({tokens_key}) has {n_vocab} tokens"),
                    None => format!("{} is {n_vocab}", key("vocab_size")),
                };
                return Err(ModelError::Inconsistent(format!(
                    "{source} but token_embd.weight has {} rows (one per token): the vocabulary and the \
                     embedding do not match",
                    t.dims[1]
                )));
            }
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

/// Checks `block_count` against the `blk.N.*` tensors of the file: as many blocks as tensors say, no more
/// (llama.cpp refuses a tensor count that does not match the hyper-parameters too).
fn check_blocks(file: &GgufFile, n_layer: usize, key: &str) -> Result<(), ModelError> {
    let highest =
        file.tensors.iter().filter_map(|t| t.name.strip_prefix("blk.")?.split('.').next()?.parse::<u64>().ok()).max();
    let in_file = highest.map_or(0, |h| h.saturating_add(1));
    if in_file == n_layer as u64 {
        return Ok(());
    }
    let held = match highest {
        Some(h) if h >= 1 << 24 => format!("a tensor of block {h}, beyond any model's (a corrupt tensor name)"),
        Some(0) => "tensors for 1 block (blk.0)".to_owned(),
        Some(h) => format!("tensors for {in_file} blocks (blk.0 to blk.{h})"),
        None => "no block tensors (blk.N.*)".to_owned(),
    };
    Err(ModelError::Inconsistent(format!("{key} is {n_layer} but the file has {held}")))
}
