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
    #[error("GGUF metadata key `{key}` is {found}, expected {expected}")]
    WrongType { key: String, found: String, expected: &'static str },

    /// The BOS or EOS id names no token: every prompt would start (or every reply end) with a wrong one.
    #[error("`{key}` is {id}, outside the vocabulary of {n_vocab} tokens (ids 0 to {})", n_vocab - 1)]
    SpecialIdOutOfRange { key: &'static str, id: String, n_vocab: usize },

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

    /// [`TokenizerError::Template`] with where the template comes from.
    #[error("{origin}: {source}")]
    TemplateIn {
        origin: String,
        #[source]
        source: minijinja::Error,
    },

    /// The chat template went past its budget of steps or output (a runaway or hostile template).
    #[error("{origin} {what}: rendering stopped")]
    TemplateBudget { origin: String, what: String },

    /// The chat template rendered nothing for a conversation.
    #[error("{origin} rendered nothing for a conversation of {messages} message(s): there is no prompt to read")]
    TemplateEmpty { origin: String, messages: usize },

    /// The chat template called `raise_exception(message)`, the way HF templates reject a conversation.
    #[error("chat template raised an exception: {message}")]
    TemplateRaised { message: String },
}

impl TokenizerError {
    /// A template error naming the template (`origin`); other errors are kept as they are.
    pub(crate) fn in_template(self, origin: &str) -> TokenizerError {
        match self {
            TokenizerError::Template { source } => TokenizerError::TemplateIn { origin: origin.to_owned(), source },
            other => other,
        }
    }

    /// A key holding a value of another type than `expected`, naming the type found.
    pub(crate) fn wrong_type(key: &str, found: &crate::gguf::GgufValue, expected: &'static str) -> TokenizerError {
        TokenizerError::WrongType { key: key.to_owned(), found: found.type_description(), expected }
    }
}
