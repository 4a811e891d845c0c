//! Synthetic llama-shaped models with random weights, written as GGUF images: the fast fixtures of the
//! test suite (every weight type, both tokenizer kinds) and the seed of tools that write larger models.
//! With `arch` "gpt-oss" the model has gpt-oss's layout instead (attention sinks, biases, YaRN, a sliding
//! window on the even layers, experts whose type is `expert_type`) and, with [`SyntheticVocab::Harmony`],
//! its harmony chat format.
//!
//! Everything is derived from a seed, so the same spec always gives the same bytes. The weights are random
//! but scaled so activations stay in a realistic range (logits of a few units).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::gguf::{GgufValue, GgufWriter};
use crate::quant::{self, GgmlType};
use crate::tokenizer::unicode::ByteMap;

/// Which tokenizer the synthetic model carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyntheticVocab {
    /// gpt2 byte-level BPE (256 byte tokens, merges learnt from a sample text, ChatML specials).
    Bpe,
    /// llama SentencePiece (byte fallback tokens, scored pieces).
    Spm,
    /// The `Bpe` vocabulary with gpt-oss's harmony special tokens and o200k's pre-tokenizer (`gpt-4o`), and a
    /// harmony chat template ([`HARMONY_TEMPLATE`]).
    Harmony,
}

#[derive(Clone, Debug)]
pub struct SyntheticSpec {
    pub arch: &'static str,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub n_ff: usize,
    pub n_ctx_train: usize,
    /// Types of the seven matrices of each layer, cycled over layers and matrices.
    pub matrix_types: Vec<GgmlType>,
    /// Type of the token embedding (and of the head when tied).
    pub embd_type: GgmlType,
    /// `Some(type)` writes a separate `output.weight`; `None` ties it to the embedding.
    pub output_type: Option<GgmlType>,
    /// qwen2-style q/k/v biases.
    pub qkv_bias: bool,
    /// A mixture of experts in place of each layer's FFN, laid out as Mixtral's (`expert_count` on the
    /// llama architecture, each expert `n_ff` rows): (experts, used per token).
    pub experts: Option<(usize, usize)>,
    /// The experts' matrices' type, when not the cycled `matrix_types` (gpt-oss ships MXFP4 experts).
    pub expert_type: Option<GgmlType>,
    pub vocab: SyntheticVocab,
    pub seed: u64,
}

impl Default for SyntheticSpec {
    /// A tiny llama (2 layers, n_embd 256, 8 heads of 32, 4 KV heads, FFN 512), Q4_1 matrices, Q8_0 tied
    /// embedding, BPE vocabulary: the default model's shape, shrunk.
    fn default() -> Self {
        SyntheticSpec {
            arch: "llama",
            n_layer: 2,
            n_embd: 256,
            n_head: 8,
            n_head_kv: 4,
            n_ff: 512,
            n_ctx_train: 2048,
            matrix_types: vec![GgmlType::Q4_1],
            embd_type: GgmlType::Q8_0,
            output_type: None,
            qkv_bias: false,
            experts: None,
            expert_type: None,
            vocab: SyntheticVocab::Bpe,
            seed: 1,
        }
    }
}

const SAMPLE_TEXT: &str = "the quick brown fox jumps over the lazy dog. hello world, the weather is nice \
    today and the sea is calm. then there were three. 1234567890 these are the things that matter.";

/// A harmony chat template (gpt-oss's format, written for the synthetic model): a system message with the
/// reasoning effort, the system prompt and offered functions in a developer message, each turn as a harmony
/// message, earlier calls as commentary messages to `functions.NAME`, results as messages from it, and a
/// generation prompt of `<|start|>assistant`.
pub const HARMONY_TEMPLATE: &str = "<|start|>system<|message|>Reasoning: \
{{ reasoning_effort if reasoning_effort is defined else 'medium' }}
# Valid channels: analysis, commentary, final.<|end|>
{%- set sys = messages | selectattr('role', 'equalto', 'system') | list %}
{%- set offered = tools is defined and tools %}
{%- if sys or offered %}<|start|>developer<|message|>
{%- if sys %}# Instructions

{{ sys[0].content }}{% endif %}
{%- if offered %}

# Tools

namespace functions {
{%- for t in tools %}
// {{ t.function.description }}
type {{ t.function.name }} = (_: {{ t.function.parameters | tojson }}) => any;
{%- endfor %}
} // namespace functions{% endif %}<|end|>{% endif %}
{%- for m in messages %}
{%- if m.role == 'user' %}<|start|>user<|message|>{{ m.content }}<|end|>
{%- elif m.role == 'assistant' and m.tool_calls is defined and m.tool_calls %}
{%- for c in m.tool_calls %}<|start|>assistant to=functions.{{ c.function.name }}<|channel|>commentary json\
<|message|>{{ c.function.arguments | tojson }}<|call|>{% endfor %}
{%- elif m.role == 'assistant' %}<|start|>assistant<|channel|>final<|message|>{{ m.content }}<|end|>
{%- elif m.role == 'tool' %}<|start|>functions.{{ m.name }} to=assistant<|channel|>commentary<|message|>\
{{ m.content }}<|end|>
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|start|>assistant{% endif %}";

/// gpt-oss's special tokens (o200k_harmony's), control tokens of the harmony vocabulary: BOS, then EOS.
const HARMONY_SPECIALS: [&str; 9] = [
    "<|startoftext|>",
    "<|return|>",
    "<|endoftext|>",
    "<|constrain|>",
    "<|channel|>",
    "<|start|>",
    "<|end|>",
    "<|message|>",
    "<|call|>",
];

const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

impl SyntheticSpec {
    /// The GGUF image (version 3) of this model.
    pub fn to_gguf(&self) -> Vec<u8> {
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        let mut w = GgufWriter::new();
        let a = self.arch;
        let head_dim = self.n_embd / self.n_head;
        w.set("general.architecture", GgufValue::str(a));
        w.set("general.name", GgufValue::str("strata-synthetic"));
        w.set("general.alignment", GgufValue::U32(32));
        w.set(&format!("{a}.block_count"), GgufValue::U32(self.n_layer as u32));
        w.set(&format!("{a}.embedding_length"), GgufValue::U32(self.n_embd as u32));
        w.set(&format!("{a}.feed_forward_length"), GgufValue::U32(self.n_ff as u32));
        w.set(&format!("{a}.attention.head_count"), GgufValue::U32(self.n_head as u32));
        w.set(&format!("{a}.attention.head_count_kv"), GgufValue::U32(self.n_head_kv as u32));
        w.set(&format!("{a}.context_length"), GgufValue::U32(self.n_ctx_train as u32));
        w.set(&format!("{a}.rope.freq_base"), GgufValue::F32(10000.0));
        w.set(&format!("{a}.rope.dimension_count"), GgufValue::U32(head_dim as u32));
        w.set(&format!("{a}.attention.layer_norm_rms_epsilon"), GgufValue::F32(1e-5));
        if let Some((n_expert, n_used)) = self.experts {
            w.set(&format!("{a}.expert_count"), GgufValue::U32(n_expert as u32));
            w.set(&format!("{a}.expert_used_count"), GgufValue::U32(n_used as u32));
        }
        let oss = a == "gpt-oss";
        if oss {
            // gpt-oss-20b's RoPE and window: YaRN 32x over 4096 positions, 128 keys on the even layers.
            w.set(&format!("{a}.rope.freq_base"), GgufValue::F32(150000.0));
            w.set(&format!("{a}.rope.scaling.type"), GgufValue::str("yarn"));
            w.set(&format!("{a}.rope.scaling.factor"), GgufValue::F32(32.0));
            w.set(&format!("{a}.rope.scaling.original_context_length"), GgufValue::U32(4096));
            w.set(&format!("{a}.attention.sliding_window"), GgufValue::U32(128));
            w.set(&format!("{a}.expert_feed_forward_length"), GgufValue::U32(self.n_ff as u32));
        }
        let n_vocab = self.write_vocab(&mut w);

        // A matrix of `rows` x `cols` (a vector when `rows` is 1), or with `stack` a 3-d stack of `stack` such
        // matrices (experts outermost).
        let mut tensor =
            |w: &mut GgufWriter, name: &str, stack: usize, rows: usize, cols: usize, ty: GgmlType, scale: f32| {
                let x: Vec<f32> = (0..stack * rows * cols).map(|_| rng.gen_range(-1.0f32..1.0) * scale).collect();
                let dims: Vec<u64> = match (stack, rows) {
                    (1, 1) => vec![cols as u64],
                    (1, _) => vec![cols as u64, rows as u64],
                    _ => vec![cols as u64, rows as u64, stack as u64],
                };
                let rows = stack * rows;
                let row_bytes = ty.row_bytes(cols as u64).expect("synthetic shapes are whole blocks") as usize;
                let mut data = vec![0u8; rows * row_bytes];
                for (xr, dr) in x.chunks(cols).zip(data.chunks_mut(row_bytes)) {
                    quant::quantize_row(ty, xr, dr);
                }
                w.add_tensor(name, &dims, ty, data);
            };
        let (d, ff) = (self.n_embd, self.n_ff);
        let (q, kv) = (self.n_head * head_dim, self.n_head_kv * head_dim);
        let s_in = 1.0 / (d as f32).sqrt() * 1.7;
        let s_ff = 1.0 / (ff as f32).sqrt() * 1.7;
        tensor(&mut w, "token_embd.weight", 1, n_vocab, d, self.embd_type, 1.0);
        let mut types = self.matrix_types.iter().copied().cycle();
        for l in 0..self.n_layer {
            let n = |s: &str| format!("blk.{l}.{s}");
            let norm = |w: &mut GgufWriter, name: &str, rng: &mut ChaCha8Rng| {
                let x: Vec<f32> = (0..d).map(|_| rng.gen_range(0.8f32..1.2)).collect();
                w.add_tensor(name, &[d as u64], GgmlType::F32, x.iter().flat_map(|v| v.to_le_bytes()).collect());
            };
            // Norms are drawn from their own stream so adding a tensor type does not shift the others.
            let mut nrng = ChaCha8Rng::seed_from_u64(self.seed ^ ((l as u64 + 1) * 0x9E37));
            norm(&mut w, &n("attn_norm.weight"), &mut nrng);
            norm(&mut w, &n(if oss { "post_attention_norm.weight" } else { "ffn_norm.weight" }), &mut nrng);
            tensor(&mut w, &n("attn_q.weight"), 1, q, d, types.next().unwrap_or(GgmlType::F32), s_in);
            tensor(&mut w, &n("attn_k.weight"), 1, kv, d, types.next().unwrap_or(GgmlType::F32), s_in);
            tensor(&mut w, &n("attn_v.weight"), 1, kv, d, types.next().unwrap_or(GgmlType::F32), s_in);
            if self.qkv_bias || oss {
                tensor(&mut w, &n("attn_q.bias"), 1, 1, q, GgmlType::F32, 0.1);
                tensor(&mut w, &n("attn_k.bias"), 1, 1, kv, GgmlType::F32, 0.1);
                tensor(&mut w, &n("attn_v.bias"), 1, 1, kv, GgmlType::F32, 0.1);
            }
            tensor(&mut w, &n("attn_output.weight"), 1, d, q, types.next().unwrap_or(GgmlType::F32), s_in);
            if oss {
                tensor(&mut w, &n("attn_output.bias"), 1, 1, d, GgmlType::F32, 0.1);
                tensor(&mut w, &n("attn_sinks.weight"), 1, 1, self.n_head, GgmlType::F32, 1.0);
            }
            if let Some((n_expert, _)) = self.experts {
                // The router stays f32, as llama.cpp's quantizer leaves it; its scale makes picks clear.
                tensor(&mut w, &n("ffn_gate_inp.weight"), 1, n_expert, d, GgmlType::F32, s_in * 4.0);
                let (g, u, dn) = (types.next(), types.next(), types.next());
                let ty = |t: Option<GgmlType>| self.expert_type.or(t).unwrap_or(GgmlType::F32);
                let (g, u, dn) = (ty(g), ty(u), ty(dn));
                tensor(&mut w, &n("ffn_gate_exps.weight"), n_expert, ff, d, g, s_in);
                tensor(&mut w, &n("ffn_up_exps.weight"), n_expert, ff, d, u, s_in);
                tensor(&mut w, &n("ffn_down_exps.weight"), n_expert, d, ff, dn, s_ff);
                if oss {
                    tensor(&mut w, &n("ffn_gate_inp.bias"), 1, 1, n_expert, GgmlType::F32, 0.5);
                    tensor(&mut w, &n("ffn_gate_exps.bias"), 1, n_expert, ff, GgmlType::F32, 0.1);
                    tensor(&mut w, &n("ffn_up_exps.bias"), 1, n_expert, ff, GgmlType::F32, 0.1);
                    tensor(&mut w, &n("ffn_down_exps.bias"), 1, n_expert, d, GgmlType::F32, 0.05);
                }
            } else {
                tensor(&mut w, &n("ffn_gate.weight"), 1, ff, d, types.next().unwrap_or(GgmlType::F32), s_in);
                tensor(&mut w, &n("ffn_up.weight"), 1, ff, d, types.next().unwrap_or(GgmlType::F32), s_in);
                tensor(&mut w, &n("ffn_down.weight"), 1, d, ff, types.next().unwrap_or(GgmlType::F32), s_ff);
            }
        }
        let x: Vec<f32> = vec![1.0; d];
        w.add_tensor(
            "output_norm.weight",
            &[d as u64],
            GgmlType::F32,
            x.iter().flat_map(|v| v.to_le_bytes()).collect(),
        );
        if let Some(ty) = self.output_type {
            tensor(&mut w, "output.weight", 1, n_vocab, d, ty, s_in * 4.0);
        }
        w.to_bytes(3)
    }

    /// Writes the tokenizer metadata; returns the vocabulary size.
    fn write_vocab(&self, w: &mut GgufWriter) -> usize {
        match self.vocab {
            SyntheticVocab::Bpe | SyntheticVocab::Harmony => {
                let harmony = self.vocab == SyntheticVocab::Harmony;
                let map = ByteMap::get();
                let specials: &[&str] =
                    if harmony { &HARMONY_SPECIALS } else { &["<|endoftext|>", "<|im_start|>", "<|im_end|>"] };
                let mut tokens: Vec<String> = specials.iter().map(|s| (*s).to_owned()).collect();
                let mut types = vec![3i32; specials.len()];
                for b in 0..=255u8 {
                    tokens.push(map.byte_to_char(b).to_string());
                    types.push(1);
                }
                // Learn merges from the sample text: repeatedly join the most frequent adjacent pair.
                let mut words: Vec<Vec<String>> = SAMPLE_TEXT
                    .split(' ')
                    .map(|wd| {
                        // Words as the pre-tokenizer sees them: with their leading space.
                        let mut s = String::new();
                        map.encode_into(&format!(" {wd}"), &mut s);
                        s.chars().map(|c| c.to_string()).collect()
                    })
                    .collect();
                let mut merges = Vec::new();
                for _ in 0..48 {
                    let mut counts: std::collections::BTreeMap<(String, String), usize> = Default::default();
                    for wd in &words {
                        for p in wd.windows(2) {
                            *counts.entry((p[0].clone(), p[1].clone())).or_default() += 1;
                        }
                    }
                    let Some(((a, b), _)) = counts.into_iter().max_by_key(|(k, c)| (*c, std::cmp::Reverse(k.clone())))
                    else {
                        break;
                    };
                    let joined = format!("{a}{b}");
                    for wd in &mut words {
                        let mut i = 0;
                        while i + 1 < wd.len() {
                            if wd[i] == a && wd[i + 1] == b {
                                wd[i] = joined.clone();
                                wd.remove(i + 1);
                            }
                            i += 1;
                        }
                    }
                    merges.push(format!("{a} {b}"));
                    tokens.push(joined);
                    types.push(1);
                }
                w.set("tokenizer.ggml.model", GgufValue::str("gpt2"));
                w.set("tokenizer.ggml.pre", GgufValue::str(if harmony { "gpt-4o" } else { "smollm" }));
                w.set("tokenizer.ggml.tokens", GgufValue::strs(&tokens));
                w.set("tokenizer.ggml.token_type", GgufValue::i32s(&types));
                w.set("tokenizer.ggml.merges", GgufValue::strs(&merges));
                w.set("tokenizer.ggml.bos_token_id", GgufValue::U32(0));
                w.set("tokenizer.ggml.eos_token_id", GgufValue::U32(if harmony { 1 } else { 2 }));
                w.set("tokenizer.ggml.add_bos_token", GgufValue::Bool(false));
                w.set("tokenizer.chat_template", GgufValue::str(if harmony { HARMONY_TEMPLATE } else { CHATML }));
                tokens.len()
            }
            SyntheticVocab::Spm => {
                let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
                let mut types = vec![2i32, 3, 3];
                let mut scores = vec![0f32; 3];
                for b in 0..=255u8 {
                    tokens.push(format!("<0x{b:02X}>"));
                    types.push(6);
                    scores.push(0.0);
                }
                let pieces = [
                    "▁", "e", "t", "a", "o", "h", "r", "s", "n", "i", "l", "d", "w", "c", "u", "q", "k", "b", "f", "x",
                    "j", "m", "p", "v", "y", "z", "g", ".", ",", "th", "he", "▁t", "▁the", "▁a", "er", "in", "▁w",
                    "or", "▁h", "ll", "▁hello", "▁world", "▁quick", "▁fox", "▁dog", "an", "re", "on",
                ];
                for (i, p) in pieces.iter().enumerate() {
                    tokens.push((*p).to_owned());
                    types.push(1);
                    scores.push(-(i as f32) - 1.0);
                }
                w.set("tokenizer.ggml.model", GgufValue::str("llama"));
                w.set("tokenizer.ggml.tokens", GgufValue::strs(&tokens));
                w.set("tokenizer.ggml.token_type", GgufValue::i32s(&types));
                w.set("tokenizer.ggml.scores", GgufValue::f32s(&scores));
                w.set("tokenizer.ggml.bos_token_id", GgufValue::U32(1));
                w.set("tokenizer.ggml.eos_token_id", GgufValue::U32(2));
                w.set("tokenizer.ggml.unknown_token_id", GgufValue::U32(0));
                w.set("tokenizer.ggml.add_bos_token", GgufValue::Bool(true));
                tokens.len()
            }
        }
    }
}
