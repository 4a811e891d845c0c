//! The model families Strata runs and what differs between them, in one table (`FAMILIES`): which RoPE
//! pairing, which norms, which FFN activation, which tensors are fused, which layers attend through a
//! sliding window. The forward pass, the loader, the memory plan and `strata info` read these fields;
//! none of them branches on a family's name.
//!
//! Numbers that a file's metadata gives (window sizes, RoPE bases, soft-caps) are read in `config`; this
//! table holds the defaults llama.cpp uses when a key is absent, so both tools read a file the same way.

use super::config::RopeKind;

/// The architectures whose forward pass Strata implements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    Llama,
    Mistral,
    Qwen2,
    Qwen3,
    Qwen3Moe,
    Gemma2,
    Gemma3,
    Phi3,
    GptOss,
}

/// The FFN's gate activation: `act(gate(x)) * up(x)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FfnAct {
    /// `silu(g) = g * sigmoid(g)` (SwiGLU).
    Silu,
    /// GELU with the tanh approximation (GeGLU), as Gemma's `gelu_pytorch_tanh`.
    GeluTanh,
    /// gpt-oss's clamped SwiGLU: `g' = min(g, 7)`, `u' = clamp(u, -7, 7)`, `g' * sigmoid(1.702 g') * (u' + 1)`
    /// (llama.cpp's `swiglu_oai`).
    SwigluOai,
}

/// How a mixture's router turns scores into the picked experts' weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gating {
    /// A softmax over every expert, the `n_used` most probable picked with their probabilities
    /// (renormalized over the picked ones: qwen3moe, Mixtral).
    Softmax,
    /// The `n_used` highest scores picked, their weights a softmax over those scores alone (gpt-oss).
    SoftmaxOfPicked,
}

/// Whether a family's FFN may be a mixture of experts (`config::MoeConfig`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Experts {
    /// Dense only: a file with `expert_count` is refused.
    Never,
    /// Dense, or experts when the file has `expert_count` (llama: Mixtral).
    WhenCounted,
    /// Always experts (qwen3moe).
    Always,
}

/// Which layers attend through a sliding window, when the file sets a window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SwaLayers {
    /// Every layer attends to the whole context.
    None,
    /// Of every `n` layers, the first `n - 1` slide and the last is global (gemma3: 6; gemma2: 2, so the
    /// even layers slide). `attention.sliding_window_pattern` in the file overrides `n`.
    Pattern(usize),
}

/// What one family differs in. The hyper-parameters common to all (sizes, heads, RoPE base) are read
/// the same way for every family (`config`).
#[derive(Debug)]
pub struct Family {
    pub arch: Arch,
    /// The `general.architecture` string.
    pub name: &'static str,
    pub rope_kind: RopeKind,
    /// An RMS norm over each head of q and k before RoPE (`attn_q_norm`, `attn_k_norm`, [head_dim]).
    pub qk_norm: bool,
    /// RMS norms on the attention's and the FFN's outputs before they join the residual stream
    /// (`post_attention_norm`, `post_ffw_norm`).
    pub post_norms: bool,
    pub ffn_act: FfnAct,
    /// The embeddings are scaled by `sqrt(n_embd)` on the way in.
    pub embed_scale: bool,
    /// q, k and v are one matrix (`attn_qkv`, rows q then k then v).
    pub fused_qkv: bool,
    /// gate and up are one matrix (`ffn_up` with `2 * n_ff` rows, gate first).
    pub fused_gate_up: bool,
    pub swa: SwaLayers,
    pub experts: Experts,
    /// How the router weighs the picked experts (a mixture of experts only).
    pub gating: Gating,
    /// Each head's learned sink (`attn_sinks`, [n_head]): a score that joins every query's softmax with a
    /// value of zero, so a head can attend to nothing (gpt-oss).
    pub attn_sinks: bool,
    /// The tensor of the norm before the FFN: `ffn_norm`, or gpt-oss's `post_attention_norm`.
    pub ffn_norm: &'static str,
    /// Default attention soft-cap (`attn_logit_softcapping`): scores become `c * tanh(s / c)`.
    pub attn_softcap: Option<f32>,
    /// Default final soft-cap (`final_logit_softcapping`) on the logits.
    pub final_softcap: Option<f32>,
    /// The sliding-window layers' default RoPE base when the file has no `rope.freq_base_swa`: `None`
    /// takes the global base (gemma2), else this (gemma3's local layers: 10000).
    pub swa_rope_base: Option<f32>,
    /// The layer count of the one size whose attention scale is `1/sqrt(n_embd / n_head)` instead of
    /// `1/sqrt(head_dim)` (Gemma's 27B; llama.cpp keys it on the layer count, as Gemma's reference does).
    pub scale_by_embd_at_layers: Option<usize>,
    /// What `strata info` lists as this family's features.
    pub features: &'static str,
}

/// Every family, by `general.architecture`.
pub static FAMILIES: &[Family] = &[
    Family { experts: Experts::WhenCounted, features: "SwiGLU, RoPE", ..LLAMA },
    Family { arch: Arch::Mistral, name: "mistral", features: "SwiGLU, RoPE", ..LLAMA },
    Family {
        arch: Arch::Qwen2,
        name: "qwen2",
        rope_kind: RopeKind::Neox,
        features: "SwiGLU, NeoX RoPE, qkv biases",
        ..LLAMA
    },
    Family {
        arch: Arch::Qwen3,
        name: "qwen3",
        rope_kind: RopeKind::Neox,
        qk_norm: true,
        features: "SwiGLU, NeoX RoPE, q/k head norms, thinking template",
        ..LLAMA
    },
    Family {
        arch: Arch::Qwen3Moe,
        name: "qwen3moe",
        rope_kind: RopeKind::Neox,
        qk_norm: true,
        experts: Experts::Always,
        features: "mixture of experts (softmax router, top-k renormalized), NeoX RoPE, q/k head norms",
        ..LLAMA
    },
    Family {
        arch: Arch::Gemma2,
        name: "gemma2",
        rope_kind: RopeKind::Neox,
        post_norms: true,
        ffn_act: FfnAct::GeluTanh,
        embed_scale: true,
        swa: SwaLayers::Pattern(2),
        attn_softcap: Some(50.0),
        final_softcap: Some(30.0),
        scale_by_embd_at_layers: Some(46),
        features: "sliding window (every other layer), logit soft-caps, post-norms, GeGLU",
        ..LLAMA
    },
    Family {
        arch: Arch::Gemma3,
        name: "gemma3",
        rope_kind: RopeKind::Neox,
        qk_norm: true,
        post_norms: true,
        ffn_act: FfnAct::GeluTanh,
        embed_scale: true,
        swa: SwaLayers::Pattern(6),
        swa_rope_base: Some(10_000.0),
        scale_by_embd_at_layers: Some(62),
        features: "sliding window (5 of 6 layers), q/k head norms, post-norms, GeGLU",
        ..LLAMA
    },
    Family {
        arch: Arch::Phi3,
        name: "phi3",
        rope_kind: RopeKind::Neox,
        fused_qkv: true,
        fused_gate_up: true,
        features: "fused qkv and gate/up, NeoX RoPE, LongRoPE",
        ..LLAMA
    },
    Family {
        arch: Arch::GptOss,
        name: "gpt-oss",
        rope_kind: RopeKind::Neox,
        ffn_act: FfnAct::SwigluOai,
        swa: SwaLayers::Pattern(2),
        experts: Experts::Always,
        gating: Gating::SoftmaxOfPicked,
        attn_sinks: true,
        ffn_norm: "post_attention_norm",
        features: "mixture of experts (top-k, softmax of the picked, biases, clamped SwiGLU), attention sinks, \
                   sliding window (every other layer), YaRN RoPE",
        ..LLAMA
    },
];

/// The llama family, which the others differ from.
const LLAMA: Family = Family {
    arch: Arch::Llama,
    name: "llama",
    rope_kind: RopeKind::Norm,
    qk_norm: false,
    post_norms: false,
    ffn_act: FfnAct::Silu,
    embed_scale: false,
    fused_qkv: false,
    fused_gate_up: false,
    swa: SwaLayers::None,
    experts: Experts::Never,
    gating: Gating::Softmax,
    attn_sinks: false,
    ffn_norm: "ffn_norm",
    attn_softcap: None,
    final_softcap: None,
    swa_rope_base: None,
    scale_by_embd_at_layers: None,
    features: "",
};

/// The family of `general.architecture` = `name`.
pub fn by_name(name: &str) -> Option<&'static Family> {
    FAMILIES.iter().find(|f| f.name == name)
}

/// The architectures whose FFN may be a mixture of experts, for error messages.
pub fn names_with_experts() -> String {
    FAMILIES.iter().filter(|f| f.experts != Experts::Never).map(|f| f.name).collect::<Vec<_>>().join(", ")
}

/// The architectures Strata runs, for error messages: "llama, mistral, ...".
pub fn supported_names() -> String {
    FAMILIES.iter().map(|f| f.name).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_is_found_by_its_name_and_names_are_unique() {
        for f in FAMILIES {
            assert!(std::ptr::eq(by_name(f.name).unwrap(), f), "{}", f.name);
            assert!(!f.features.is_empty(), "{} lists its features", f.name);
        }
        assert!(by_name("gpt2").is_none());
        assert_eq!(supported_names().split(", ").count(), FAMILIES.len());
    }
}
