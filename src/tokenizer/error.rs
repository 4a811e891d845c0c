//! The tokenizer's error type: one enum whose variants carry the values a caller may branch on.
//!
//! Everything that can go wrong while reading a vocabulary from GGUF metadata or rendering a chat template
//! becomes a [`TokenizerError`]. Encoding and decoding themselves never fail: unknown text falls back to
//! byte tokens or the unknown token, and undecodable bytes become U+FFFD.

/// What went wrong while building a tokenizer or rendering a chat template.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokenizerError {
    /// A metadata key the tokenizer cannot work without is absent.
    #[error("GGUF metadata key `{key}` is missing")]
    MissingKey { key: &'static str },

    /// A metadata key is present but holds a value of the wrong type.
    #[error("GGUF metadata key `{key}` has the wrong type: expected {expected}")]
    WrongType { key: &'static str, expected: &'static str },

    /// `tokenizer.ggml.model` names a tokenizer kind Strata does not implement.
    #[error(
        "unsupported tokenizer model `{model}`: Strata supports `gpt2` (byte-level BPE) and `llama` (SentencePiece)"
    )]
    UnsupportedModel { model: String },

    /// `tokenizer.ggml.pre` names a BPE pre-tokenizer Strata does not implement.
    #[error("unsupported BPE pre-tokenizer `{pre}` (tokenizer.ggml.pre)")]
    UnsupportedPreTokenizer { pre: String },

    /// A per-token array is shorter than the token list.
    #[error("`{key}` has {len} entries but the vocabulary has {n_vocab} tokens")]
    ShortArray { key: &'static str, len: usize, n_vocab: usize },

    /// The token list is empty.
    #[error("the vocabulary (tokenizer.ggml.tokens) is empty")]
    EmptyVocab,

    /// Two tokens have the same text, so text-to-id lookup would be ambiguous.
    #[error("duplicate token in vocabulary: {text:?} has ids {first} and {second}")]
    DuplicateToken { text: String, first: u32, second: u32 },

    /// `add_bos_token` / `add_eos_token` asks for a token the vocabulary does not define.
    #[error("`{flag}` is true but `{id_key}` is not set")]
    MissingSpecialToken { flag: &'static str, id_key: &'static str },

    /// A pre-tokenizer regex failed to compile (a bug in the pattern table, reported rather than panicking).
    #[error("pre-tokenizer regex {pattern:?} does not compile: {message}")]
    BadRegex { pattern: String, message: String },

    /// The chat template does not parse, or failed while rendering.
    #[error("chat template error: {source}")]
    Template {
        #[from]
        source: minijinja::Error,
    },

    /// The chat template called `raise_exception(message)`, the way HF templates reject a conversation.
    #[error("chat template raised an exception: {message}")]
    TemplateRaised { message: String },
}
