//! The architecture hyper-parameters of a model, read from GGUF metadata and checked for consistency.

use crate::gguf::{GgufFile, GgufValue};

use super::family::{self, Family, Gating, SwaLayers};
use super::ModelError;

pub use super::family::Arch;

/// How RoPE pairs dimensions: `Norm` rotates (2i, 2i+1) (llama, mistral); `Neox` rotates (i, i + d/2)
/// (qwen2, qwen3, gemma, phi3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeKind {
    Norm,
    Neox,
}

/// How positions become rotation angles in one layer: angle `i` of position `p` is
/// `freq_scale * (p * base^(-2i/rope_dims) / factor_i)`, its cosine and sine scaled by `mscale`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeParams {
    pub base: f32,
    /// Linear position scaling: `1 / rope.scaling.factor` (1 when unscaled).
    pub freq_scale: f32,
    /// Multiplies the cosines and sines (LongRoPE's attention factor; 1 otherwise).
    pub mscale: f32,
    /// YaRN's blend of interpolated and extrapolated angles, when `rope.scaling.type` is yarn.
    pub yarn: Option<Yarn>,
}

/// YaRN (gpt-oss's RoPE scaling), as ggml computes it with `ext_factor` 1: pair `i` turns by
/// `interp * (1 - r) + extrap * r` where `extrap` is the unscaled angle, `interp = freq_scale * extrap`, and
/// the ramp `r = 1 - clamp((i - low) / max(0.001, high - low), 0, 1)` keeps the fast pairs unscaled; the
/// cosines and sines are also multiplied by `1 + 0.1 ln(1 / freq_scale)`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Yarn {
    /// The correction dimensions (ggml's `corr_dims`): pairs below `low` keep their angle, past `high` are
    /// interpolated.
    pub low: f32,
    pub high: f32,
}

/// YaRN's defaults for the fast and slow rotation counts (llama.cpp reads no key for them).
const YARN_BETA_FAST: f32 = 32.0;
const YARN_BETA_SLOW: f32 = 1.0;

impl Yarn {
    /// The correction dimensions of a RoPE with `rope_dims` rotated dimensions and base `base`, trained at
    /// `orig_ctx` positions before the extension (ggml's `ggml_rope_yarn_corr_dims`).
    pub fn new(rope_dims: usize, orig_ctx: usize, base: f32) -> Yarn {
        let dim = |n_rot: f32| {
            rope_dims as f32 * (orig_ctx as f32 / (n_rot * 2.0 * std::f32::consts::PI)).ln() / (2.0 * base.ln())
        };
        let low = dim(YARN_BETA_FAST).floor().max(0.0);
        let high = dim(YARN_BETA_SLOW).ceil().min(rope_dims as f32 - 1.0);
        Yarn { low, high }
    }
}

#[derive(Clone, Debug)]
pub struct ModelConfig {
    pub arch: Arch,
    /// What this architecture differs in (`family::FAMILIES`).
    pub family: &'static Family,
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
    /// RoPE of the global layers, and of the sliding-window ones.
    pub rope: RopeParams,
    pub rope_swa: RopeParams,
    /// The context RoPE was trained at before any extension (`rope.scaling.original_context_length`):
    /// LongRoPE takes its long factors for a context beyond it.
    pub rope_orig_ctx: usize,
    /// Keys a sliding-window layer attends: its query's position and the `window - 1` before it.
    pub swa_window: Option<usize>,
    /// (n_layer): whether layer `l` attends through the sliding window.
    pub swa_layers: Vec<bool>,
    /// The scores' scale (`1/sqrt(head_dim)` for most).
    pub attn_scale: f32,
    /// Scores become `c * tanh(score / c)` (gemma2).
    pub attn_softcap: Option<f32>,
    /// Logits become `c * tanh(logit / c)` (gemma2).
    pub final_softcap: Option<f32>,
    /// How an embedding is made of a sequence's hidden states (`{arch}.pooling_type`; mean when absent).
    pub pooling: Pooling,
    /// A mixture of experts in place of every layer's FFN (qwen3moe; llama files with `expert_count`, as
    /// Mixtral's are); None for a dense FFN.
    pub moe: Option<MoeConfig>,
}

/// Largest expert count read from a file (the largest models ship 512): past it, a corrupt count.
pub const MAX_EXPERTS: usize = 4096;

/// How a layer's mixture of experts routes: a router matrix scores the `n_expert` experts per token, a
/// softmax turns the scores into probabilities, the `n_used` most probable experts (ties: the lower index
/// first) run on the token, and their outputs are summed weighted by their probabilities, renormalized
/// over the picked ones when `norm_weights`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MoeConfig {
    pub n_expert: usize,
    pub n_used: usize,
    /// Rows of each expert's gate and up matrices (`expert_feed_forward_length`; llama's experts:
    /// `feed_forward_length`).
    pub n_ff_exp: usize,
    /// The picked experts' probabilities are divided by their sum (qwen3moe and Mixtral do).
    pub norm_weights: bool,
    /// Multiplies the weights after the normalization (`expert_weights_scale`; 1 when absent or 0).
    pub weights_scale: f32,
    /// How the scores become the picked experts' weights (the family's).
    pub gating: Gating,
}

/// How one embedding vector is made of a sequence's output-normed hidden states, as the file's
/// `{arch}.pooling_type` says (llama.cpp's numbering: 0 none, 1 mean, 2 cls, 3 last, 4 rank).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pooling {
    /// The mean of every position's state (also for "none" in a file and an absent key: one vector per input).
    Mean,
    /// Every position's state as it is, not normalized: one vector per token (only when asked for, with
    /// `strata serve --pooling none`; a file's "none" reads as mean).
    None,
    /// The first position's (the BOS or CLS token).
    Cls,
    /// The last position's (decoder embedding models such as Qwen3-Embedding).
    Last,
    /// A reranker's score head, or a number Strata does not know: no embedding is made.
    Unsupported(u64),
}

impl Pooling {
    /// A pooling named on the command line (`none`, `mean`, `cls`, `last`), as llama.cpp's `--pooling` names them.
    pub fn of_name(name: &str) -> Option<Pooling> {
        match name {
            "none" => Some(Pooling::None),
            "mean" => Some(Pooling::Mean),
            "cls" => Some(Pooling::Cls),
            "last" => Some(Pooling::Last),
            _ => None,
        }
    }

    pub fn of_key(value: Option<u64>) -> Pooling {
        match value {
            None | Some(0) | Some(1) => Pooling::Mean,
            Some(2) => Pooling::Cls,
            Some(3) => Pooling::Last,
            Some(n) => Pooling::Unsupported(n),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Pooling::Mean => "mean",
            Pooling::None => "none",
            Pooling::Cls => "cls",
            Pooling::Last => "last",
            Pooling::Unsupported(4) => "rank",
            Pooling::Unsupported(_) => "unknown",
        }
    }
}

impl ModelConfig {
    /// Reads the hyper-parameters and checks them against each other and against the tensors the file
    /// holds, before anything is allocated by them: a corrupt count names the key, never reserves memory.
    pub fn from_gguf(file: &GgufFile) -> Result<ModelConfig, ModelError> {
        let (family, arch_name) = read_arch(file)?;
        let arch = family.arch;
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
        let rope_kind = family.rope_kind;
        let (freq_scale, yarn) = keys.rope_freq_scale()?;
        // LongRoPE's attention factor scales the cosines and sines (llama.cpp applies the key to any family).
        let mut mscale = keys.opt_f("rope.scaling.attn_factor", 1.0)?;
        if yarn {
            // llama.cpp's YaRN attention factor, divided by the `1 + 0.1 ln(factor)` the rope kernel then
            // multiplies back in (`rope_table`): for a factor above 1 the product is that term.
            let factor = 1.0 / freq_scale;
            let get_mscale = if factor <= 1.0 { 1.0 } else { 0.1 * factor.ln() + 1.0 };
            mscale *= get_mscale * (1.0 / (1.0 + 0.1 * factor.ln()));
        }
        let n_ctx_orig = keys.opt_u("rope.scaling.original_context_length")?.unwrap_or(n_ctx_train);
        let yarn_of = |base: f32| yarn.then(|| Yarn::new(rope_dims, n_ctx_orig, base));
        let rope = RopeParams { base: rope_base, freq_scale, mscale, yarn: yarn_of(rope_base) };
        let rope_swa_base = match family.swa_rope_base {
            Some(b) => keys.opt_f("rope.freq_base_swa", b)?,
            None => keys.opt_f("rope.freq_base_swa", rope_base)?,
        };
        // llama.cpp's sliding-window layers keep an unscaled RoPE unless the family says otherwise
        // (gemma2 takes the global one's scale).
        let swa_scale = if family.swa_rope_base.is_none() { freq_scale } else { 1.0 };
        let rope_swa = RopeParams { base: rope_swa_base, freq_scale: swa_scale, mscale, yarn: yarn_of(rope_swa_base) };
        let rope_orig_ctx = n_ctx_orig;
        let (swa_window, swa_layers) = keys.sliding_window(family, n_layer)?;
        let attn_scale = match family.scale_by_embd_at_layers {
            Some(n) if n == n_layer => 1.0 / ((n_embd / n_head) as f32).sqrt(),
            _ => 1.0 / (head_dim as f32).sqrt(),
        };
        let attn_softcap = keys.softcap("attn_logit_softcapping", family.attn_softcap)?;
        let final_softcap = keys.softcap("final_logit_softcapping", family.final_softcap)?;
        let pooling = Pooling::of_key(file.get(&keys.key("pooling_type")).and_then(GgufValue::as_u64));
        let moe = keys.experts(family, n_ff)?;
        let cfg = ModelConfig {
            arch,
            family,
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
            rope,
            rope_swa,
            rope_orig_ctx,
            swa_window,
            swa_layers,
            attn_scale,
            attn_softcap,
            final_softcap,
            pooling,
            moe,
        };
        cfg.check_heads()?;
        check_blocks(file, n_layer, &cfg.key("block_count"))?;
        cfg.check_first_block(file)?;
        cfg.check_embedding(file, n_tokens.is_some())?;
        Ok(cfg)
    }

    /// Rows of the widest gate/up product a layer runs: the dense FFN's, or an expert's.
    pub fn ffn_rows(&self) -> usize {
        self.moe.map_or(self.n_ff, |m| m.n_ff_exp.max(self.n_ff))
    }

    /// Width of the K (and V) rows of one layer: `n_head_kv * head_dim`.
    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }

    /// Width of the query rows: `n_head * head_dim`.
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// The window of layer `l`'s attention (None: global).
    pub fn window(&self, l: usize) -> Option<usize> {
        self.swa_window.filter(|_| self.swa_layers[l])
    }

    /// The RoPE of layer `l`.
    pub fn rope_of(&self, l: usize) -> &RopeParams {
        if self.swa_layers[l] {
            &self.rope_swa
        } else {
            &self.rope
        }
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
        // phi3's up matrix holds the gate's rows too.
        let up_rows = if self.family.fused_gate_up { 2 * n_ff } else { n_ff };
        let qkv = format!("{heads} and {kv_heads} (q, k and v fused)");
        let qkv_rows = (n_head + 2 * n_head_kv).saturating_mul(head_dim);
        if let Some(m) = self.moe {
            let exp = format!("{} experts of {} rows", m.n_expert, m.n_ff_exp);
            for (name, dims) in [
                ("blk.0.ffn_gate_inp.weight", vec![n_embd as u64, m.n_expert as u64]),
                ("blk.0.ffn_up_exps.weight", vec![n_embd as u64, m.n_ff_exp as u64, m.n_expert as u64]),
                ("blk.0.ffn_down_exps.weight", vec![m.n_ff_exp as u64, n_embd as u64, m.n_expert as u64]),
            ] {
                let Some(t) = file.tensor(name) else { continue };
                if t.dims != dims {
                    return Err(ModelError::Inconsistent(format!(
                        "{name} has shape {:?}, but the hyper-parameters ({exp}) make it {dims:?}",
                        t.dims
                    )));
                }
            }
        }
        for (name, cols, rows, what) in [
            ("blk.0.attn_q.weight", n_embd, n_head.saturating_mul(head_dim), &heads),
            ("blk.0.attn_k.weight", n_embd, n_head_kv.saturating_mul(head_dim), &kv_heads),
            ("blk.0.attn_qkv.weight", n_embd, qkv_rows, &qkv),
            ("blk.0.ffn_up.weight", n_embd, up_rows, &ffn),
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
fn read_arch(file: &GgufFile) -> Result<(&'static Family, String), ModelError> {
    let arch_key = "general.architecture";
    let arch_name = match file.get(arch_key) {
        None => return Err(ModelError::MissingKey(arch_key.into())),
        Some(v) => v.as_str().ok_or_else(|| wrong_type(arch_key, v, "a string"))?.to_owned(),
    };
    let family = family::by_name(&arch_name).ok_or_else(|| ModelError::UnsupportedArch(arch_name.clone()))?;
    Ok((family, arch_name))
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

    /// The mixture of experts the file describes: `expert_count` experts (absent or 0: a dense FFN; a family
    /// without experts refuses a count), `expert_used_count` of them per token, each with
    /// `expert_feed_forward_length` rows (llama: `feed_forward_length`; qwen3moe without the key:
    /// `feed_forward_length / expert_used_count`, as llama.cpp reads it).
    fn experts(&self, family: &Family, n_ff: usize) -> Result<Option<MoeConfig>, ModelError> {
        let count_key = self.key("expert_count");
        let n_expert = match self.file.get(&count_key) {
            None => 0,
            Some(v) if !v.is_integer() => return Err(wrong_type(&count_key, v, "an unsigned integer")),
            Some(v) => v
                .as_u64()
                .and_then(|x| usize::try_from(x).ok())
                .filter(|&x| x <= MAX_EXPERTS)
                .ok_or_else(|| ModelError::BadValue { key: count_key.clone(), value: v.display_short() })?,
        };
        if n_expert == 0 {
            if family.experts == family::Experts::Always {
                return Err(ModelError::MissingKey(count_key));
            }
            return Ok(None);
        }
        if family.experts == family::Experts::Never {
            return Err(ModelError::Inconsistent(format!(
                "{count_key} is {n_expert}: Strata runs mixtures of experts for {} only, not {}",
                family::names_with_experts(),
                family.name
            )));
        }
        let n_used = self.req_u("expert_used_count")?;
        if n_used > n_expert {
            return Err(ModelError::Inconsistent(format!(
                "{} is {n_used}, more than the {n_expert} experts ({count_key})",
                self.key("expert_used_count")
            )));
        }
        let n_ff_exp = match self.opt_u("expert_feed_forward_length")? {
            Some(n) => n,
            None if family.experts == family::Experts::Always => n_ff / n_used,
            None => n_ff,
        };
        if n_ff_exp == 0 {
            return Err(ModelError::Inconsistent(format!(
                "an expert of {n_ff} / {n_used} rows is empty: the file needs {}",
                self.key("expert_feed_forward_length")
            )));
        }
        let scale = self.opt_f0("expert_weights_scale")?;
        let weights_scale = if scale == 0.0 { 1.0 } else { scale };
        // gpt-oss's softmax over the picked scores already sums to one; llama.cpp does not renormalize it.
        let norm_weights = family.gating == Gating::Softmax;
        Ok(Some(MoeConfig { n_expert, n_used, n_ff_exp, norm_weights, weights_scale, gating: family.gating }))
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

    /// An optional non-negative number (0 and absence both read as "none" when `default` is none).
    fn softcap(&self, k: &str, default: Option<f32>) -> Result<Option<f32>, ModelError> {
        let full = self.key(k);
        let Some(v) = self.file.get(&full) else { return Ok(default) };
        match v.as_f64().filter(|x| x.is_finite() && *x >= 0.0) {
            Some(0.0) => Ok(None),
            Some(x) => Ok(Some(x as f32)),
            None => Err(ModelError::BadValue { key: full, value: v.display_short() }),
        }
    }

    /// The position scale, `1 / rope.scaling.factor` (or the older `rope.scale_linear`), and whether it is
    /// YaRN's (`rope.scaling.type` yarn); RoPE scalings Strata does not compute are refused by name.
    fn rope_freq_scale(&self) -> Result<(f32, bool), ModelError> {
        let key = self.key("rope.scaling.type");
        let mut yarn = false;
        if let Some(v) = self.file.get(&key) {
            let ty = v.as_str().ok_or_else(|| wrong_type(&key, v, "a string"))?;
            if !matches!(ty, "none" | "linear" | "longrope" | "yarn") {
                return Err(ModelError::BadValue {
                    key,
                    value: format!("{ty:?} (supported: none, linear, longrope, yarn)"),
                });
            }
            if ty == "none" {
                // llama.cpp never scales positions when the type says none.
                return Ok((1.0, false));
            }
            yarn = ty == "yarn";
        }
        let factor = match self.file.get(&self.key("rope.scaling.factor")) {
            Some(_) => self.opt_f0("rope.scaling.factor")?,
            None => self.opt_f0("rope.scale_linear")?,
        };
        Ok((if factor == 0.0 { 1.0 } else { 1.0 / factor }, yarn))
    }

    /// An optional finite number >= 0; 0 when absent.
    fn opt_f0(&self, k: &str) -> Result<f32, ModelError> {
        let full = self.key(k);
        match self.file.get(&full) {
            None => Ok(0.0),
            Some(v) => v
                .as_f64()
                .map(|x| x as f32)
                .filter(|x| x.is_finite() && *x >= 0.0)
                .ok_or_else(|| ModelError::BadValue { key: full, value: v.display_short() }),
        }
    }

    /// The sliding window and which layers use it: `attention.sliding_window` (absent or 0: none), the
    /// layers by the family's pattern, which `attention.sliding_window_pattern` overrides with a period or
    /// a per-layer array of booleans.
    fn sliding_window(&self, family: &Family, n_layer: usize) -> Result<(Option<usize>, Vec<bool>), ModelError> {
        let SwaLayers::Pattern(default_period) = family.swa else { return Ok((None, vec![false; n_layer])) };
        let window = match self.file.get(&self.key("attention.sliding_window")) {
            None => None,
            Some(v) if v.as_u64() == Some(0) => None,
            Some(_) => self.opt_u("attention.sliding_window")?,
        };
        let Some(window) = window else { return Ok((None, vec![false; n_layer])) };
        let key = self.key("attention.sliding_window_pattern");
        let layers = match self.file.get(&key) {
            Some(GgufValue::Array(items)) => {
                if items.len() != n_layer {
                    return Err(ModelError::Inconsistent(format!(
                        "{key} has {} entries for {n_layer} layers",
                        items.len()
                    )));
                }
                items
                    .iter()
                    .map(|x| match x {
                        GgufValue::Bool(b) => Ok(b),
                        x if x.is_integer() => Ok(x.as_u64() != Some(0)),
                        x => Err(wrong_type(&key, &x, "an array of booleans")),
                    })
                    .collect::<Result<Vec<bool>, _>>()?
            }
            _ => {
                let period = self.opt_u("attention.sliding_window_pattern")?.unwrap_or(default_period);
                (0..n_layer).map(|l| l % period < period - 1).collect()
            }
        };
        Ok((Some(window), layers))
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
