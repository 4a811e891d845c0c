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
        let mut kind = KindDefaults::for_model(file, &model, &pre_name, n_vocab)?;
        if let Some(v) = get_bool(file, KEY_ADD_SPACE_PREFIX)? {
            kind.add_space_prefix = v;
        }
        let scores = read_scores(file, n_vocab)?;
        let mut attrs = read_attrs(file, n_vocab)?;
        let (texts, ids) = index_texts(&tokens)?;
        let mut special = SpecialIds::read(file, n_vocab, &kind)?;
        let (add_bos, add_eos) = read_add_flags(file, kind.add_bos, &special)?;
        special.detect_by_text(&ids, &mut attrs);
        let eog = end_of_generation(&special, &ids, &mut attrs);
        let special_order = special_order(&texts, &attrs);
        Ok(Tokenizer {
            algorithm: kind.algorithm,
            model,
            pre: pre_name,
            texts,
            scores,
            attrs,
            ids,
            special_order,
            bos: special.bos,
            eos: special.eos,
            eot: special.eot,
            eom: special.eom,
            unk: special.unk,
            pad: special.pad,
            eog,
            add_bos,
            add_eos,
            add_space_prefix: kind.add_space_prefix,
            clean_spaces: kind.clean_spaces,
        })
    }
}

/// What a tokenizer kind (`tokenizer.ggml.model`) sets before metadata overrides it, as llama.cpp does.
struct KindDefaults {
    algorithm: Algorithm,
    bos: Option<u32>,
    eos: Option<u32>,
    unk: Option<u32>,
    add_bos: bool,
    add_space_prefix: bool,
    clean_spaces: bool,
}

impl KindDefaults {
    /// The defaults of `model` (`llama` or `gpt2`, whose merges and pre-tokenizer `pre_name` are read here),
    /// with the default ids outside the vocabulary of `n_vocab` tokens disabled.
    fn for_model(file: &GgufFile, model: &str, pre_name: &str, n_vocab: usize) -> Result<Self, TokenizerError> {
        let mut kind = match model {
            "llama" => KindDefaults {
                algorithm: Algorithm::Spm,
                bos: Some(1),
                eos: Some(2),
                unk: Some(0),
                add_bos: true,
                add_space_prefix: true,
                clean_spaces: false,
            },
            "gpt2" => {
                let lines = get_strings(file, KEY_MERGES)?.ok_or(TokenizerError::MissingKey { key: KEY_MERGES })?;
                let merges = Merges::new(lines);
                let pre = PreTokenizer::for_name(pre_name)?;
                let (add_bos, clean_spaces, no_bos) = (pre.add_bos_default, pre.clean_spaces, pre.no_bos);
                let bos = if no_bos { None } else { Some(11) };
                let algorithm = Algorithm::Bpe { merges, pre };
                KindDefaults {
                    algorithm,
                    bos,
                    eos: Some(11),
                    unk: None,
                    add_bos,
                    add_space_prefix: false,
                    clean_spaces,
                }
            }
            other => return Err(TokenizerError::UnsupportedModel { model: other.to_owned() }),
        };
        for id in [&mut kind.bos, &mut kind.eos, &mut kind.unk] {
            if id.is_some_and(|i| i as usize >= n_vocab) {
                *id = None;
            }
        }
        Ok(kind)
    }
}

/// Each token's score (zero when the file has none), refused when fewer than `n_vocab`.
fn read_scores(file: &GgufFile, n_vocab: usize) -> Result<Vec<f32>, TokenizerError> {
    let Some(v) = file.get(KEY_SCORES) else { return Ok(vec![0.0; n_vocab]) };
    let mut scores = v
        .as_array()
        .and_then(|a| a.f32s())
        .ok_or_else(|| TokenizerError::wrong_type(KEY_SCORES, v, "an array of numbers"))?;
    if scores.len() < n_vocab {
        return Err(TokenizerError::ShortArray { key: KEY_SCORES, len: scores.len(), n_vocab });
    }
    scores.truncate(n_vocab);
    Ok(scores)
}

/// Each token's attributes from its declared type (normal when the file has none), refused when fewer than
/// `n_vocab`.
fn read_attrs(file: &GgufFile, n_vocab: usize) -> Result<Vec<u8>, TokenizerError> {
    let Some(v) = file.get(KEY_TOKEN_TYPE) else { return Ok(vec![attr::NORMAL; n_vocab]) };
    let types = v
        .as_array()
        .and_then(|a| a.i64s())
        .ok_or_else(|| TokenizerError::wrong_type(KEY_TOKEN_TYPE, v, "an array of integers"))?;
    if types.len() < n_vocab {
        return Err(TokenizerError::ShortArray { key: KEY_TOKEN_TYPE, len: types.len(), n_vocab });
    }
    Ok(types[..n_vocab].iter().map(|&ty| attr::from_token_type(ty)).collect())
}

/// Each token's text (`[EMPTY_i]` for an empty one) and the id of each text, refusing a text twice.
fn index_texts(tokens: &[&str]) -> Result<(Vec<String>, HashMap<String, u32>), TokenizerError> {
    let mut texts = Vec::with_capacity(tokens.len());
    let mut ids = HashMap::with_capacity(tokens.len());
    for (i, &text) in tokens.iter().enumerate() {
        let text = if text.is_empty() { format!("[EMPTY_{i}]") } else { text.to_owned() };
        if let Some(&first) = ids.get(&text) {
            return Err(TokenizerError::DuplicateToken { text, first, second: i as u32 });
        }
        ids.insert(text.clone(), i as u32);
        texts.push(text);
    }
    Ok((texts, ids))
}

/// The special-token ids: from metadata, else the kind's defaults, else (end-of-turn and fill-in-the-middle
/// ones) found by their text.
struct SpecialIds {
    bos: Option<u32>,
    eos: Option<u32>,
    unk: Option<u32>,
    pad: Option<u32>,
    eot: Option<u32>,
    eom: Option<u32>,
    fim_pre: Option<u32>,
    fim_suf: Option<u32>,
    fim_mid: Option<u32>,
    fim_pad: Option<u32>,
    fim_rep: Option<u32>,
    fim_sep: Option<u32>,
}

impl SpecialIds {
    /// The ids the metadata sets in range, overriding the defaults of `kind`.
    fn read(file: &GgufFile, n_vocab: usize, kind: &KindDefaults) -> Result<Self, TokenizerError> {
        let key = |name: &str| format!("tokenizer.ggml.{name}_token_id");
        let bos = required_id(file, KEY_BOS, n_vocab)?.or(kind.bos);
        let eos = required_id(file, KEY_EOS, n_vocab)?.or(kind.eos);
        let id = |name: &str| get_id(file, &key(name), n_vocab);
        Ok(SpecialIds {
            bos,
            eos,
            unk: id("unknown")?.or(kind.unk),
            pad: id("padding")?,
            eot: id("eot")?,
            eom: id("eom")?,
            fim_pre: id("fim_pre")?.or(id("prefix")?),
            fim_suf: id("fim_suf")?.or(id("suffix")?),
            fim_mid: id("fim_mid")?.or(id("middle")?),
            fim_pad: id("fim_pad")?,
            fim_rep: id("fim_rep")?,
            fim_sep: id("fim_sep")?,
        })
    }

    /// Finds unset end-of-turn and fill-in-the-middle tokens by their text; each token found this way is a
    /// control token whatever its declared type.
    fn detect_by_text(&mut self, ids: &HashMap<String, u32>, attrs: &mut [u8]) {
        let mut detect = |slot: &mut Option<u32>, names: &[&str]| {
            if slot.is_some() {
                return;
            }
            if let Some(id) = names.iter().filter_map(|n| ids.get(*n).copied()).min() {
                attrs[id as usize] |= attr::CONTROL;
                *slot = Some(id);
            }
        };
        detect(&mut self.eot, EOT_TEXTS);
        detect(&mut self.eom, EOM_TEXTS);
        detect(&mut self.fim_pre, FIM_PRE_TEXTS);
        detect(&mut self.fim_suf, FIM_SUF_TEXTS);
        detect(&mut self.fim_mid, FIM_MID_TEXTS);
        detect(&mut self.fim_pad, FIM_PAD_TEXTS);
        detect(&mut self.fim_rep, FIM_REP_TEXTS);
        detect(&mut self.fim_sep, FIM_SEP_TEXTS);
    }
}

/// The add-BOS flag (the kind's `add_bos` unless the metadata sets it) and the add-EOS flag, refused when the
/// token they add does not exist.
fn read_add_flags(file: &GgufFile, add_bos: bool, special: &SpecialIds) -> Result<(bool, bool), TokenizerError> {
    let add_bos = get_bool(file, KEY_ADD_BOS)?.unwrap_or(add_bos);
    let add_eos = get_bool(file, KEY_ADD_EOS)?.unwrap_or(false);
    if add_bos && special.bos.is_none() {
        return Err(TokenizerError::MissingSpecialToken { flag: KEY_ADD_BOS, id_key: KEY_BOS });
    }
    if add_eos && special.eos.is_none() {
        return Err(TokenizerError::MissingSpecialToken { flag: KEY_ADD_EOS, id_key: KEY_EOS });
    }
    Ok((add_bos, add_eos))
}

/// The end-of-generation set, ascending: the FIM pad/repo/separator tokens, the tokens of [`EOG_TEXTS`]
/// (marked control), EOS, EOT and EOM, less the per-model exceptions. Marks gpt-oss's structural tokens
/// user-defined.
fn end_of_generation(special: &SpecialIds, ids: &HashMap<String, u32>, attrs: &mut [u8]) -> Vec<u32> {
    let mut eog: BTreeSet<u32> = [special.fim_pad, special.fim_rep, special.fim_sep].into_iter().flatten().collect();
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
    eog.extend([special.eos, special.eot, special.eom].into_iter().flatten());
    remove_eog_exceptions(&mut eog, ids, attrs);
    eog.into_iter().collect()
}

/// Takes out of `eog` the tokens that end a message but not the generation in some vocabularies, with the
/// attributes they have there.
fn remove_eog_exceptions(eog: &mut BTreeSet<u32>, ids: &HashMap<String, u32>, attrs: &mut [u8]) {
    let has = |eog: &BTreeSet<u32>, t: &str| ids.get(t).is_some_and(|id| eog.contains(id));
    // o200k_harmony / solar-open: `<|end|>` ends a message, not the generation.
    if (has(eog, "<|return|>") && has(eog, "<|call|>")) || (has(eog, "<|calls|>") && has(eog, "<|flush|>")) {
        if let Some(&end) = ids.get("<|end|>").filter(|id| eog.contains(id)) {
            eog.remove(&end);
            attrs[end as usize] = attr::USER_DEFINED;
        }
    }
    // gemma4 / paddleocr: `</s>` is not end-of-generation there.
    if has(eog, "<|tool_response>") {
        if let Some(&s) = ids.get("</s>").filter(|id| eog.contains(id)) {
            eog.remove(&s);
            attrs[s as usize] = attr::NORMAL;
        }
    }
}

/// The control, user-defined and unknown tokens, longest text first: the order special tokens are matched in.
fn special_order(texts: &[String], attrs: &[u8]) -> Vec<u32> {
    let mut order: Vec<u32> = (0..texts.len() as u32)
        .filter(|&id| attrs[id as usize] & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0)
        .collect();
    order.sort_by_key(|&id| std::cmp::Reverse(texts[id as usize].len()));
    order
}
