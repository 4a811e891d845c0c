//! Building a [`Tokenizer`] from GGUF metadata, following llama.cpp's `llama_vocab::impl::load`.
//!
//! It owns the reading and validation of `tokenizer.ggml.*`: tokens, scores, token types, merges, the
//! special-token ids with llama.cpp's per-kind defaults, the add-BOS/EOS/space-prefix flags, the detection
//! of end-of-turn and fill-in-the-middle tokens by their text, and the end-of-generation set. Every problem
//! in the metadata becomes a [`TokenizerError`]; nothing here panics on file data.
//!
//! Known difference: llama.cpp finds EOT/EOM/FIM tokens by walking a hash map, so when several texts
//! match, which one wins is unspecified there; here the lowest id wins. Both end up in the EOG set either
//! way. Per-model LSTRIP/RSTRIP attributes (phi-3, jina, modern-bert) are not applied.

use std::collections::{BTreeSet, HashMap};

use super::bpe::Merges;
use super::pretokenize::PreTokenizer;
use super::special::attr;
use super::{Algorithm, Tokenizer, TokenizerError};
use crate::gguf::GgufFile;

const KEY_MODEL: &str = "tokenizer.ggml.model";
const KEY_PRE: &str = "tokenizer.ggml.pre";
const KEY_TOKENS: &str = "tokenizer.ggml.tokens";
const KEY_SCORES: &str = "tokenizer.ggml.scores";
const KEY_TOKEN_TYPE: &str = "tokenizer.ggml.token_type";
const KEY_MERGES: &str = "tokenizer.ggml.merges";
const KEY_ADD_BOS: &str = "tokenizer.ggml.add_bos_token";
const KEY_ADD_EOS: &str = "tokenizer.ggml.add_eos_token";
const KEY_ADD_SPACE_PREFIX: &str = "tokenizer.ggml.add_space_prefix";
const KEY_BOS: &str = "tokenizer.ggml.bos_token_id";
const KEY_EOS: &str = "tokenizer.ggml.eos_token_id";

/// Token texts llama.cpp takes as end-of-turn when `eot_token_id` is absent.
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
const EOM_TEXTS: &[&str] = &["<|eom_id|>"];
/// Fill-in-the-middle prefix, suffix and middle texts: found tokens are only marked as control.
const FIM_PRE_TEXTS: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
];
const FIM_SUF_TEXTS: &[&str] = &[
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
];
const FIM_MID_TEXTS: &[&str] = &[
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
    "<|middle|>",
];
const FIM_PAD_TEXTS: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_TEXTS: &[&str] = &["<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"];
const FIM_SEP_TEXTS: &[&str] = &["<|file_sep|>"];
/// Token texts that end generation wherever they are in the vocabulary.
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

fn get_str<'a>(file: &'a GgufFile, key: &'static str) -> Result<Option<&'a str>, TokenizerError> {
    match file.get(key) {
        None => Ok(None),
        Some(v) => v.as_str().map(Some).ok_or_else(|| TokenizerError::wrong_type(key, v, "a string")),
    }
}

fn get_bool(file: &GgufFile, key: &'static str) -> Result<Option<bool>, TokenizerError> {
    match file.get(key) {
        None => Ok(None),
        Some(v) => v.as_bool().map(Some).ok_or_else(|| TokenizerError::wrong_type(key, v, "a bool")),
    }
}

fn get_strings<'a>(file: &'a GgufFile, key: &'static str) -> Result<Option<Vec<&'a str>>, TokenizerError> {
    match file.get(key) {
        None => Ok(None),
        Some(v) => v
            .as_array()
            .and_then(|a| a.strings())
            .map(Some)
            .ok_or_else(|| TokenizerError::wrong_type(key, v, "an array of strings")),
    }
}

/// A special-token id from metadata: `Some(id)` when present and in range, `None` when absent. A value that
/// is not an integer is an error; one outside the vocabulary is a warning and ignored, as llama.cpp does
/// (some files carry a padding id past the end), except for BOS and EOS, which [`required_id`] refuses.
fn get_id(file: &GgufFile, key: &str, n_vocab: usize) -> Result<Option<u32>, TokenizerError> {
    let Some(v) = file.get(key) else { return Ok(None) };
    if !v.is_integer() {
        return Err(TokenizerError::wrong_type(key, v, "a token id"));
    }
    // (A negative id, -1 in some files, means none.)
    match v.as_u64() {
        Some(id) if id < n_vocab as u64 => Ok(Some(id as u32)),
        _ => {
            tracing::warn!("ignoring {key} {}: outside the vocabulary of {n_vocab} tokens", v.display_short());
            Ok(None)
        }
    }
}

/// The BOS or EOS id from metadata: an id outside the vocabulary is refused, never replaced by a default
/// (which would put a wrong token at the start of every prompt or end no reply).
fn required_id(file: &GgufFile, key: &'static str, n_vocab: usize) -> Result<Option<u32>, TokenizerError> {
    if let Some(v) = file.get(key).filter(|v| v.is_integer()) {
        if v.as_u64().is_none_or(|id| id >= n_vocab as u64) {
            return Err(TokenizerError::SpecialIdOutOfRange { key, id: v.display_short(), n_vocab });
        }
    }
    get_id(file, key, n_vocab)
}

impl Tokenizer {
    /// Reads the tokenizer from a GGUF file's metadata.
    pub fn from_gguf(file: &GgufFile) -> Result<Tokenizer, TokenizerError> {
        let model = get_str(file, KEY_MODEL)?.ok_or(TokenizerError::MissingKey { key: KEY_MODEL })?.to_owned();
        let pre_name = get_str(file, KEY_PRE)?.unwrap_or("").to_owned();

        let tokens = get_strings(file, KEY_TOKENS)?.ok_or(TokenizerError::MissingKey { key: KEY_TOKENS })?;
        let n_vocab = tokens.len();
        if n_vocab == 0 {
            return Err(TokenizerError::EmptyVocab);
        }

        // Kind-specific defaults, before metadata overrides them.
        let (algorithm, mut bos, mut eos, mut unk, mut add_bos, mut add_space_prefix, clean_spaces) =
            match model.as_str() {
                "llama" => (Algorithm::Spm, Some(1), Some(2), Some(0), true, true, false),
                "gpt2" => {
                    let lines = get_strings(file, KEY_MERGES)?.ok_or(TokenizerError::MissingKey { key: KEY_MERGES })?;
                    let merges = Merges::new(lines);
                    let pre = PreTokenizer::for_name(&pre_name)?;
                    let (add_bos, clean, no_bos) = (pre.add_bos_default, pre.clean_spaces, pre.no_bos);
                    let bos = if no_bos { None } else { Some(11) };
                    (Algorithm::Bpe { merges, pre }, bos, Some(11), None, add_bos, false, clean)
                }
                other => return Err(TokenizerError::UnsupportedModel { model: other.to_owned() }),
            };
        // Defaults outside the vocabulary are disabled.
        for id in [&mut bos, &mut eos, &mut unk] {
            if id.is_some_and(|i| i as usize >= n_vocab) {
                *id = None;
            }
        }
        if let Some(v) = get_bool(file, KEY_ADD_SPACE_PREFIX)? {
            add_space_prefix = v;
        }

        let mut scores = match file.get(KEY_SCORES) {
            None => vec![0.0; n_vocab],
            Some(v) => {
                let s = v
                    .as_array()
                    .and_then(|a| a.f32s())
                    .ok_or_else(|| TokenizerError::wrong_type(KEY_SCORES, v, "an array of numbers"))?;
                if s.len() < n_vocab {
                    return Err(TokenizerError::ShortArray { key: KEY_SCORES, len: s.len(), n_vocab });
                }
                s
            }
        };
        let mut attrs = match file.get(KEY_TOKEN_TYPE) {
            None => vec![attr::NORMAL; n_vocab],
            Some(v) => {
                let t = v
                    .as_array()
                    .and_then(|a| a.i64s())
                    .ok_or_else(|| TokenizerError::wrong_type(KEY_TOKEN_TYPE, v, "an array of integers"))?;
                if t.len() < n_vocab {
                    return Err(TokenizerError::ShortArray { key: KEY_TOKEN_TYPE, len: t.len(), n_vocab });
                }
                t[..n_vocab].iter().map(|&ty| attr::from_token_type(ty)).collect()
            }
        };

        let mut texts = Vec::with_capacity(n_vocab);
        let mut ids = HashMap::with_capacity(n_vocab);
        for (i, &text) in tokens.iter().enumerate() {
            let text = if text.is_empty() { format!("[EMPTY_{i}]") } else { text.to_owned() };
            if let Some(&first) = ids.get(&text) {
                return Err(TokenizerError::DuplicateToken { text, first, second: i as u32 });
            }
            ids.insert(text.clone(), i as u32);
            texts.push(text);
        }

        // Special ids from metadata, in range, override the defaults.
        let key = |name: &str| format!("tokenizer.ggml.{name}_token_id");
        bos = required_id(file, KEY_BOS, n_vocab)?.or(bos);
        eos = required_id(file, KEY_EOS, n_vocab)?.or(eos);
        let id = |name: &str| get_id(file, &key(name), n_vocab);
        unk = id("unknown")?.or(unk);
        let pad = id("padding")?;
        let mut eot = id("eot")?;
        let mut eom = id("eom")?;
        let mut fim_pre = id("fim_pre")?.or(id("prefix")?);
        let mut fim_suf = id("fim_suf")?.or(id("suffix")?);
        let mut fim_mid = id("fim_mid")?.or(id("middle")?);
        let mut fim_pad = id("fim_pad")?;
        let mut fim_rep = id("fim_rep")?;
        let mut fim_sep = id("fim_sep")?;

        if let Some(v) = get_bool(file, KEY_ADD_BOS)? {
            add_bos = v;
        }
        let add_eos = get_bool(file, KEY_ADD_EOS)?.unwrap_or(false);
        if add_bos && bos.is_none() {
            return Err(TokenizerError::MissingSpecialToken { flag: KEY_ADD_BOS, id_key: KEY_BOS });
        }
        if add_eos && eos.is_none() {
            return Err(TokenizerError::MissingSpecialToken { flag: KEY_ADD_EOS, id_key: KEY_EOS });
        }

        // Find unset end-of-turn and fill-in-the-middle tokens by their text; each token found this way
        // is a control token whatever its declared type.
        let detect = |slot: &mut Option<u32>, names: &[&str], attrs: &mut [u8]| {
            if slot.is_some() {
                return;
            }
            if let Some(id) = names.iter().filter_map(|n| ids.get(*n).copied()).min() {
                attrs[id as usize] |= attr::CONTROL;
                *slot = Some(id);
            }
        };
        detect(&mut eot, EOT_TEXTS, &mut attrs);
        detect(&mut eom, EOM_TEXTS, &mut attrs);
        detect(&mut fim_pre, FIM_PRE_TEXTS, &mut attrs);
        detect(&mut fim_suf, FIM_SUF_TEXTS, &mut attrs);
        detect(&mut fim_mid, FIM_MID_TEXTS, &mut attrs);
        detect(&mut fim_pad, FIM_PAD_TEXTS, &mut attrs);
        detect(&mut fim_rep, FIM_REP_TEXTS, &mut attrs);
        detect(&mut fim_sep, FIM_SEP_TEXTS, &mut attrs);

        let mut eog: BTreeSet<u32> = [fim_pad, fim_rep, fim_sep].into_iter().flatten().collect();
        for name in EOG_TEXTS {
            if let Some(&id) = ids.get(*name) {
                eog.insert(id);
                attrs[id as usize] |= attr::CONTROL;
            }
        }
        // gpt-oss: these structural tokens are always rendered and matched, as user-defined tokens.
        for name in ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"] {
            if let Some(&id) = ids.get(name) {
                attrs[id as usize] = attr::USER_DEFINED;
            }
        }
        eog.extend([eos, eot, eom].into_iter().flatten());
        let has = |eog: &BTreeSet<u32>, t: &str| ids.get(t).is_some_and(|id| eog.contains(id));
        // o200k_harmony / solar-open: `<|end|>` ends a message, not the generation.
        if (has(&eog, "<|return|>") && has(&eog, "<|call|>")) || (has(&eog, "<|calls|>") && has(&eog, "<|flush|>")) {
            if let Some(&end) = ids.get("<|end|>").filter(|id| eog.contains(id)) {
                eog.remove(&end);
                attrs[end as usize] = attr::USER_DEFINED;
            }
        }
        // gemma4 / paddleocr: `</s>` is not end-of-generation there.
        if has(&eog, "<|tool_response>") {
            if let Some(&s) = ids.get("</s>").filter(|id| eog.contains(id)) {
                eog.remove(&s);
                attrs[s as usize] = attr::NORMAL;
            }
        }

        let mut special_order: Vec<u32> = (0..n_vocab as u32)
            .filter(|&id| attrs[id as usize] & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0)
            .collect();
        special_order.sort_by_key(|&id| std::cmp::Reverse(texts[id as usize].len()));

        Ok(Tokenizer {
            algorithm,
            model,
            pre: pre_name,
            texts,
            scores: {
                scores.truncate(n_vocab);
                scores
            },
            attrs,
            ids,
            special_order,
            bos,
            eos,
            eot,
            eom,
            unk,
            pad,
            eog: eog.into_iter().collect(),
            add_bos,
            add_eos,
            add_space_prefix,
            clean_spaces,
        })
    }
}
