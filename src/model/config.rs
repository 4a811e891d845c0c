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
        let (arch, arch_name) = read_arch(file)?;
        let keys = Keys { file, arch_name: &arch_name };
        let n_layer = keys.req_u("block_count")?;
        let n_embd = keys.req_u("embedding_length")?;
        let n_ff = keys.req_u("feed_forward_length")?;
        let n_head = keys.req_u("attention.head_count")?;
        let n_head_kv = keys.opt_u("attention.head_count_kv")?.unwrap_or(n_head);
        let head_dim = keys.head_dim(n_embd, n_head)?;
        let rope_dims = keys.opt_u("rope.dimension_count")?.unwrap_or(head_dim);
        let n_ctx_train = keys.opt_u("context_length")?.unwrap_or(4096);
        let rope_base = keys.opt_f("rope.freq_base", 10_000.0)?;
        let rms_eps = keys.opt_f("attention.layer_norm_rms_epsilon", 1e-5)?;
        let n_tokens = tokenizer_len(file)?;
        let n_vocab = keys.n_vocab(n_tokens)?;
        let rope_kind = match arch {
            Arch::Llama | Arch::Mistral => RopeKind::Norm,
            Arch::Qwen2 => RopeKind::Neox,
        };
        let cfg = ModelConfig {
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
        };
        cfg.check_heads()?;
        check_blocks(file, n_layer, &cfg.key("block_count"))?;
        cfg.check_first_block(file)?;
        cfg.check_embedding(file, n_tokens.is_some())?;
        Ok(cfg)
    }

    /// Width of the K (and V) rows of one layer: `n_head_kv * head_dim`.
    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }

    /// Width of the query rows: `n_head * head_dim`.
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// The metadata key of hyper-parameter `name` for this architecture: `{arch}.{name}`.
    fn key(&self, name: &str) -> String {
        format!("{}.{name}", self.arch_name)
    }

    /// Refuses head and RoPE sizes that do not fit together: empty, KV heads not dividing the heads, odd.
    fn check_heads(&self) -> Result<(), ModelError> {
        let (head_dim, n_vocab, rope_dims) = (self.head_dim, self.n_vocab, self.rope_dims);
        let (n_head, n_head_kv) = (self.n_head, self.n_head_kv);
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
        Ok(())
    }

    /// Checks the widths of the first block's matrices against the heads and the FFN (the loader checks
    /// every block; this is so that nothing sized by the hyper-parameters, here or in `info` and `plan`,
    /// exceeds what the file holds).
    fn check_first_block(&self, file: &GgufFile) -> Result<(), ModelError> {
        let (n_embd, n_head, n_head_kv, head_dim, n_ff) =
            (self.n_embd, self.n_head, self.n_head_kv, self.head_dim, self.n_ff);
        let heads = format!("{n_head} heads of {head_dim}");
        let kv_heads = format!("{n_head_kv} KV heads of {head_dim}");
        let ffn = format!("{} {n_ff}", self.key("feed_forward_length"));
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
        Ok(())
    }

    /// Checks the embedding's rows (the vocabulary) and row length (the embedding width), before any layer
    /// is read, with the keys the numbers come from: the tokenizer's when the file has one (`from_tokenizer`).
    fn check_embedding(&self, file: &GgufFile, from_tokenizer: bool) -> Result<(), ModelError> {
        let Some(t) = file.tensor("token_embd.weight") else { return Ok(()) };
        let (n_embd, n_vocab) = (self.n_embd, self.n_vocab);
        if t.dims.len() == 2 && t.dims[0] != n_embd as u64 {
            return Err(ModelError::Inconsistent(format!(
                "{} is {n_embd} but token_embd.weight has rows of {} values",
                self.key("embedding_length"),
                t.dims[0]
            )));
        }
        if t.dims.len() == 2 && t.dims[1] != n_vocab as u64 {
            let source = if from_tokenizer {
                format!("the tokenizer ({TOKENS_KEY}) has {n_vocab} tokens")
            } else {
                format!("{} is {n_vocab}", self.key("vocab_size"))
            };
            return Err(ModelError::Inconsistent(format!(
                "{source} but token_embd.weight has {} rows (one per token): the vocabulary and the embedding do \
                 not match",
                t.dims[1]
            )));
        }
        Ok(())
    }
}

/// The key of the tokenizer's token texts, whose count is the vocabulary when `vocab_size` is absent.
const TOKENS_KEY: &str = "tokenizer.ggml.tokens";

/// The error of a metadata value of the wrong type.
fn wrong_type(key: &str, v: &GgufValue, expected: &'static str) -> ModelError {
    ModelError::WrongType { key: key.to_owned(), found: v.type_description(), expected }
}

/// The architecture (`general.architecture`), refused unless Strata implements it, and its name.
fn read_arch(file: &GgufFile) -> Result<(Arch, String), ModelError> {
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
    Ok((arch, arch_name))
}

/// The number of tokens of the tokenizer in the file, if it has one.
fn tokenizer_len(file: &GgufFile) -> Result<Option<usize>, ModelError> {
    match file.get(TOKENS_KEY) {
        None => Ok(None),
        Some(v) => Ok(Some(v.as_array().ok_or_else(|| wrong_type(TOKENS_KEY, v, "an array of strings"))?.len())),
    }
}

/// The hyper-parameters of one architecture in a file's metadata, read with their checks.
struct Keys<'a> {
    file: &'a GgufFile,
    /// The `general.architecture` string, which prefixes the keys.
    arch_name: &'a str,
}

impl Keys<'_> {
    /// The full key of hyper-parameter `name`: `{arch}.{name}`.
    fn key(&self, name: &str) -> String {
        format!("{}.{name}", self.arch_name)
    }

    /// A required count: a positive integer below 2^24.
    fn req_u(&self, k: &str) -> Result<usize, ModelError> {
        let full = self.key(k);
        let v = self.file.get(&full).ok_or_else(|| ModelError::MissingKey(full.clone()))?;
        if !v.is_integer() {
            return Err(wrong_type(&full, v, "an unsigned integer"));
        }
        v.as_u64()
            .and_then(|x| usize::try_from(x).ok())
            .filter(|&x| x > 0 && x < (1 << 24))
            .ok_or_else(|| ModelError::BadValue { key: full, value: v.display_short() })
    }

    /// An optional count, checked as [`Keys::req_u`] when present.
    fn opt_u(&self, k: &str) -> Result<Option<usize>, ModelError> {
        if self.file.get(&self.key(k)).is_some() {
            self.req_u(k).map(Some)
        } else {
            Ok(None)
        }
    }

    /// An optional positive, finite number; `default` when absent.
    fn opt_f(&self, k: &str, default: f32) -> Result<f32, ModelError> {
        let full = self.key(k);
        match self.file.get(&full) {
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
    }

    /// The head size: `attention.key_length`, else the embedding width over the heads when they divide it.
    fn head_dim(&self, n_embd: usize, n_head: usize) -> Result<usize, ModelError> {
        match self.opt_u("attention.key_length")? {
            Some(d) => Ok(d),
            None if !n_embd.is_multiple_of(n_head) => Err(ModelError::Inconsistent(format!(
                "{} {n_embd} is not a multiple of {} {n_head} (and {} is absent), so heads have no whole size",
                self.key("embedding_length"),
                self.key("attention.head_count"),
                self.key("attention.key_length")
            ))),
            None => Ok(n_embd / n_head),
        }
    }

    /// The vocabulary size: `vocab_size`, else the tokenizer's `n_tokens`; refused when the two differ.
    fn n_vocab(&self, n_tokens: Option<usize>) -> Result<usize, ModelError> {
        match (self.opt_u("vocab_size")?, n_tokens) {
            (Some(n), Some(t)) if n != t => Err(ModelError::Inconsistent(format!(
                "{} is {n} but the tokenizer ({TOKENS_KEY}) has {t} tokens",
                self.key("vocab_size")
            ))),
            (Some(n), _) => Ok(n),
            (None, Some(t)) => Ok(t),
            (None, None) => Err(ModelError::MissingKey(self.key("vocab_size"))),
        }
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
