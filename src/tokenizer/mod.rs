//! Text to tokens and back, with llama.cpp's rules, and chat-template rendering.
//!
//! It owns the vocabulary read from GGUF metadata (`load`), the two tokenizer algorithms Strata supports,
//! byte-level BPE (`gpt2`, in `pretokenize` + `bpe`) and SentencePiece (`llama`, in `spm`), special-token
//! handling (`special`), decoding including a UTF-8-safe stream decoder (`decode`), chat templates
//! (`chat`), a conversation's prompt with its earlier replies kept as generated (`turns`), and a reply's
//! `<think>` reasoning kept apart from its answer (`reasoning`). Results are
//! meant to equal llama.cpp's token for token; where they knowingly differ, the module that differs says so.
//!
//! It never adds BOS/EOS on its own: [`Tokenizer::encode`] returns the text's tokens only, and the caller
//! applies the model's rule through [`Tokenizer::encode_with_bos`] or [`Tokenizer::add_bos_token`] and
//! [`Tokenizer::bos_id`]. It never touches tensors or the model.

mod bpe;
mod chat;
mod decode;
mod error;
mod load;
mod pretokenize;
pub mod reasoning;
mod special;
mod spm;
pub mod turns;
pub mod unicode;

use std::collections::HashMap;

pub use chat::{ChatMessage, ChatTemplate, TemplateKwargs, CHATML_TEMPLATE, RESERVED_TEMPLATE_NAMES};
pub use decode::StreamDecoder;
pub use error::TokenizerError;

use special::{attr, Fragment};

/// The tokenizer algorithm and its data.
enum Algorithm {
    /// Byte-level BPE: words from the pre-tokenizer, byte-encoded, merged by rank.
    Bpe { merges: bpe::Merges, pre: pretokenize::PreTokenizer },
    /// SentencePiece BPE: spaces escaped to U+2581, merged by token score.
    Spm,
}

/// A vocabulary and the rules to tokenize with it, built from a GGUF file's `tokenizer.ggml.*` metadata.
pub struct Tokenizer {
    algorithm: Algorithm,
    /// `tokenizer.ggml.model` and `tokenizer.ggml.pre`, for messages.
    model: String,
    pre: String,
    /// Per token: text, score, attribute bits (`special::attr`).
    texts: Vec<String>,
    scores: Vec<f32>,
    attrs: Vec<u8>,
    /// Token text to id.
    ids: HashMap<String, u32>,
    /// Ids of CONTROL, USER_DEFINED and UNKNOWN tokens, longest text first: the partition order.
    special_order: Vec<u32>,
    bos: Option<u32>,
    eos: Option<u32>,
    eot: Option<u32>,
    eom: Option<u32>,
    unk: Option<u32>,
    pad: Option<u32>,
    /// End-of-generation ids, sorted.
    eog: Vec<u32>,
    add_bos: bool,
    add_eos: bool,
    /// SPM: prefix a space to text at the start and after each special token.
    add_space_prefix: bool,
    /// Detokenizing tidies spaces before punctuation (llama.cpp `clean_spaces`).
    clean_spaces: bool,
}

impl Tokenizer {
    /// The tokens of `text`, without BOS or EOS. With `parse_special`, the texts of control tokens (such as
    /// `<|im_start|>`) become those tokens; without it they are tokenized as plain text. User-defined tokens
    /// are recognised either way, as in llama.cpp.
    pub fn encode(&self, text: &str, parse_special: bool) -> Vec<u32> {
        self.encode_from(text, parse_special, true)
    }

    /// [`encode`](Self::encode) of text that continues tokens placed before it (a piece of a prompt after
    /// a reply spliced in as it was generated): SentencePiece's space prefix is not added at its start,
    /// only after the special tokens inside it. The same as `encode` for BPE.
    pub fn encode_continued(&self, text: &str, parse_special: bool) -> Vec<u32> {
        self.encode_from(text, parse_special, false)
    }

    fn encode_from(&self, text: &str, parse_special: bool, at_start: bool) -> Vec<u32> {
        let fragments = special::partition(text, &self.special_order, &self.texts, &self.attrs, parse_special);
        let mut out = Vec::with_capacity(text.len() / 3 + 1);
        match &self.algorithm {
            Algorithm::Bpe { merges, pre } => {
                let bytes = unicode::ByteMap::get();
                let mut word = String::new();
                for fragment in fragments {
                    match fragment {
                        Fragment::Token(id) => out.push(id),
                        Fragment::Text(text) => {
                            for piece in pre.split(text) {
                                word.clear();
                                bytes.encode_into(piece, &mut word);
                                bpe::encode_word(&word, merges, |t| self.token_id(t), pre.ignore_merges, &mut out);
                            }
                        }
                    }
                }
            }
            Algorithm::Spm => {
                // llama.cpp prefixes the space to the first fragment and to every fragment after a special
                // token.
                let mut after_special = at_start;
                let mut escaped = String::new();
                for fragment in fragments {
                    match fragment {
                        Fragment::Token(id) => {
                            out.push(id);
                            after_special = true;
                        }
                        Fragment::Text(text) => {
                            escaped.clear();
                            if self.add_space_prefix && after_special {
                                escaped.push('\u{2581}');
                            }
                            escaped.extend(text.chars().map(|c| if c == ' ' { '\u{2581}' } else { c }));
                            spm::encode_fragment(&escaped, self, &mut out);
                            after_special = false;
                        }
                    }
                }
            }
        }
        out
    }

    /// [`encode`](Self::encode), with the BOS token first when the model asks for it
    /// (`tokenizer.ggml.add_bos_token`). EOS is never appended here; see [`add_eos_token`](Self::add_eos_token).
    pub fn encode_with_bos(&self, text: &str, parse_special: bool) -> Vec<u32> {
        let mut out = Vec::new();
        if let (true, Some(bos)) = (self.add_bos, self.bos) {
            out.push(bos);
        }
        out.extend(self.encode(text, parse_special));
        out
    }

    /// Tokens of a chat template's output: special tokens parsed, BOS first when the model asks for it and
    /// the template did not already write it.
    pub fn encode_templated(&self, rendered: &str) -> Vec<u32> {
        let mut ids = self.encode(rendered, true);
        if let (true, Some(bos)) = (self.add_bos, self.bos) {
            if ids.first() != Some(&bos) {
                ids.insert(0, bos);
            }
        }
        ids
    }

    /// Number of tokens in the vocabulary.
    pub fn n_vocab(&self) -> usize {
        self.texts.len()
    }

    /// The vocabulary text of a token (byte-level or U+2581-escaped form, as stored), if the id exists.
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.texts.get(id as usize).map(String::as_str)
    }

    /// The id of the token whose vocabulary text is exactly `text`.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.ids.get(text).copied()
    }

    fn attr(&self, id: u32) -> u8 {
        self.attrs.get(id as usize).copied().unwrap_or(attr::UNDEFINED)
    }

    /// Whether the token is special: control, user-defined or unknown (the tokens that are matched as
    /// whole strings before BPE/SPM, and rendered verbatim when decoding).
    pub fn is_special(&self, id: u32) -> bool {
        self.attr(id) & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0
    }

    /// Whether the token is a control token (`<|im_start|>`, `<s>`, ...).
    pub fn is_control(&self, id: u32) -> bool {
        self.attr(id) & attr::CONTROL != 0
    }

    /// Whether generating this token ends generation.
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.binary_search(&id).is_ok()
    }

    /// The end-of-generation ids, sorted: EOS, EOT, EOM, FIM pad/repo/separator and every token whose
    /// text is one of llama.cpp's known end-of-turn texts.
    pub fn eog_ids(&self) -> &[u32] {
        &self.eog
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    pub fn eos_id(&self) -> Option<u32> {
        self.eos
    }

    /// End-of-turn token, from metadata or found by its text.
    pub fn eot_id(&self) -> Option<u32> {
        self.eot
    }

    /// End-of-message token (`<|eom_id|>`), from metadata or found by its text.
    pub fn eom_id(&self) -> Option<u32> {
        self.eom
    }

    pub fn unk_id(&self) -> Option<u32> {
        self.unk
    }

    pub fn pad_id(&self) -> Option<u32> {
        self.pad
    }

    /// Whether the model wants BOS in front of a prompt.
    pub fn add_bos_token(&self) -> bool {
        self.add_bos
    }

    /// Whether the model wants EOS after a prompt (embedding models, mostly).
    pub fn add_eos_token(&self) -> bool {
        self.add_eos
    }

    /// `tokenizer.ggml.model`: `gpt2` or `llama`.
    pub fn model(&self) -> &str {
        &self.model
    }

    /// `tokenizer.ggml.pre`, empty when absent.
    pub fn pre(&self) -> &str {
        &self.pre
    }
}

/// The SPM merge loop's view of the vocabulary.
impl spm::SpmVocab for Tokenizer {
    fn token_id(&self, text: &str) -> Option<u32> {
        self.ids.get(text).copied()
    }

    fn score(&self, id: u32) -> f32 {
        self.scores.get(id as usize).copied().unwrap_or(0.0)
    }

    fn byte_token(&self, byte: u8) -> Option<u32> {
        let hex = format!("<0x{byte:02X}>");
        if let Some(id) = self.token_id(&hex) {
            return Some(id);
        }
        // llama.cpp falls back to the one-byte text and throws if that is missing too; Strata uses the
        // unknown token instead of failing.
        let single = [byte];
        std::str::from_utf8(&single).ok().and_then(|s| self.token_id(s)).or(self.unk)
    }
}

#[cfg(test)]
mod tests;
