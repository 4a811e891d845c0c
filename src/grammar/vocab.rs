//! The model's vocabulary as the grammar engine sees it: every token id with the bytes it stands for, in a
//! trie, and the model's own tokenizer for the texts a grammar names.
//!
//! Control tokens (`<|im_end|>`, `<s>`, ...) get llguidance's special-token marker byte (0xFF) in front of
//! their text, so that no grammar literal can be spelled with them; user-defined tokens (Qwen's
//! `<tool_call>`) are plain text and may. The end-of-generation ids are the trie's EOS set: a grammar
//! that is complete allows exactly them.

use std::sync::Arc;

use toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};

use crate::tokenizer::Tokenizer;

/// [`TokenizerEnv`] over a Strata tokenizer.
pub struct Vocab {
    tokenizer: Arc<Tokenizer>,
    trie: TokTrie,
}

impl Vocab {
    /// The trie of `tokenizer`'s vocabulary (one pass over it: some milliseconds for 150K tokens).
    pub fn new(tokenizer: Arc<Tokenizer>) -> Vocab {
        let n_vocab = tokenizer.n_vocab();
        let words: Vec<Vec<u8>> = (0..n_vocab as u32)
            .map(|id| {
                let piece = tokenizer.token_to_piece(id);
                if tokenizer.is_control(id) && !piece.is_empty() {
                    let mut w = Vec::with_capacity(piece.len() + 1);
                    w.push(TokTrie::SPECIAL_TOKEN_MARKER);
                    w.extend_from_slice(&piece);
                    w
                } else {
                    piece
                }
            })
            .collect();
        let eog = tokenizer.eog_ids();
        let eos = tokenizer.eos_id().or_else(|| eog.first().copied()).unwrap_or(0);
        let mut trie = TokTrie::from(&TokRxInfo::new(n_vocab as u32, eos), &words);
        if !eog.is_empty() {
            trie = trie.with_eos_tokens(eog);
        }
        Vocab { tokenizer, trie }
    }

    /// The environment llguidance's parser factory takes.
    pub fn env(self) -> TokEnv {
        Arc::new(self)
    }
}

impl TokenizerEnv for Vocab {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    /// The model's own tokens for `s` (never special tokens); bytes that are not UTF-8 go token by token
    /// through the trie.
    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        match std::str::from_utf8(s) {
            Ok(text) => self.tokenizer.encode(text, false),
            Err(_) => self.trie.greedy_tokenize(s),
        }
    }
}
