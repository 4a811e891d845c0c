//! Tokenizer tests on tiny synthetic vocabularies written with `GgufWriter`, so they run without a model.

use super::*;
use crate::gguf::{GgufFile, GgufValue, GgufWriter};

/// GGUF token types.
const NORMAL: i32 = 1;
const UNKNOWN: i32 = 2;
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;
const BYTE: i32 = 6;

fn gguf(build: impl FnOnce(&mut GgufWriter)) -> GgufFile {
    let mut w = GgufWriter::new();
    build(&mut w);
    GgufFile::from_bytes(w.to_bytes(3)).expect("synthetic GGUF parses")
}

/// A byte-level BPE vocabulary: three ChatML controls, a user-defined `<tool>`, the 256 byte characters,
/// and a few merged tokens.
fn bpe_tokenizer(pre: &str) -> Tokenizer {
    let map = unicode::ByteMap::get();
    let mut tokens: Vec<String> = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool>"].map(String::from).to_vec();
    let mut types = vec![CONTROL, CONTROL, CONTROL, USER_DEFINED];
    for b in 0..=255u8 {
        tokens.push(map.byte_to_char(b).to_string());
        types.push(NORMAL);
    }
    let merges = ["h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "l d"];
    for m in merges {
        tokens.push(m.replace(' ', ""));
        types.push(NORMAL);
    }
    gguf_tokenizer(|w| {
        w.set("tokenizer.ggml.model", GgufValue::str("gpt2"))
            .set("tokenizer.ggml.pre", GgufValue::str(pre))
            .set("tokenizer.ggml.tokens", GgufValue::strs(&tokens))
            .set("tokenizer.ggml.token_type", GgufValue::i32s(&types))
            .set("tokenizer.ggml.merges", GgufValue::strs(&merges))
            .set("tokenizer.ggml.bos_token_id", GgufValue::U32(1))
            .set("tokenizer.ggml.eos_token_id", GgufValue::U32(2))
            .set("tokenizer.ggml.add_bos_token", GgufValue::Bool(false));
    })
}

fn gguf_tokenizer(build: impl FnOnce(&mut GgufWriter)) -> Tokenizer {
    Tokenizer::from_gguf(&gguf(build)).expect("synthetic vocabulary loads")
}

/// A SentencePiece vocabulary: `<unk>`, `<s>`, `</s>`, 256 byte tokens, then scored pieces.
fn spm_tokenizer() -> Tokenizer {
    let mut tokens: Vec<String> = ["<unk>", "<s>", "</s>"].map(String::from).to_vec();
    let mut types = vec![UNKNOWN, CONTROL, CONTROL];
    let mut scores = vec![0.0f32; 3];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(BYTE);
        scores.push(0.0);
    }
    let pieces: [(&str, f32); 11] = [
        ("▁", -1.0),
        ("h", -2.0),
        ("i", -2.0),
        ("l", -2.0),
        ("o", -2.0),
        ("ll", -3.0),
        ("lo", -2.5),
        ("▁h", -1.5),
        ("▁hi", -0.5),
        ("▁l", -4.0),
        ("a", -2.0),
    ];
    for (p, s) in pieces {
        tokens.push(p.to_owned());
        types.push(NORMAL);
        scores.push(s);
    }
    gguf_tokenizer(|w| {
        w.set("tokenizer.ggml.model", GgufValue::str("llama"))
            .set("tokenizer.ggml.tokens", GgufValue::strs(&tokens))
            .set("tokenizer.ggml.scores", GgufValue::f32s(&scores))
            .set("tokenizer.ggml.token_type", GgufValue::i32s(&types));
    })
}

/// Token texts of an id sequence, for readable assertions.
fn texts(t: &Tokenizer, ids: &[u32]) -> Vec<String> {
    ids.iter().map(|&id| t.token_text(id).unwrap_or("?").to_owned()).collect()
}

#[test]
fn bpe_applies_merges_by_rank_within_words() {
    let t = bpe_tokenizer("gpt-2");
    let ids = t.encode("hello world", false);
    assert_eq!(texts(&t, &ids), ["hello", "Ġwor", "ld"]);
    assert_eq!(t.decode(&ids), "hello world");
}

#[test]
fn bpe_splits_special_tokens_only_when_asked() {
    let t = bpe_tokenizer("smollm");
    let ids = t.encode("<|im_start|>hello<|im_end|>", true);
    assert_eq!(texts(&t, &ids), ["<|im_start|>", "hello", "<|im_end|>"]);
    let plain = t.encode("<|im_start|>", false);
    assert!(plain.len() > 1 && !plain.contains(&1), "control text is tokenized as text: {plain:?}");
    // User-defined tokens are recognised either way.
    assert_eq!(texts(&t, &t.encode("<tool>", false)), ["<tool>"]);
    assert_eq!(t.decode(&ids), "<|im_start|>hello<|im_end|>");
}

#[test]
fn bpe_special_ids_flags_and_eog() {
    let t = bpe_tokenizer("smollm");
    assert_eq!(t.n_vocab(), 4 + 256 + 8);
    assert_eq!((t.bos_id(), t.eos_id()), (Some(1), Some(2)));
    assert!(!t.add_bos_token());
    assert!(t.is_control(1) && t.is_special(3) && !t.is_control(3) && !t.is_special(4));
    // eos, plus <|endoftext|> and <|im_end|> by their text.
    assert_eq!(t.eog_ids(), &[0, 2]);
    assert!(t.is_eog(0) && !t.is_eog(1));
    assert_eq!(t.encode_with_bos("he", false), t.encode("he", false));
}

#[test]
fn bpe_encode_with_bos_follows_the_model_flag() {
    let tokens: Vec<String> = ["<s>", "a"].map(String::from).to_vec();
    let t = gguf_tokenizer(|w| {
        w.set("tokenizer.ggml.model", GgufValue::str("gpt2"))
            .set("tokenizer.ggml.pre", GgufValue::str("llama-bpe"))
            .set("tokenizer.ggml.tokens", GgufValue::strs(&tokens))
            .set("tokenizer.ggml.merges", GgufValue::strs::<&str>(&[]))
            .set("tokenizer.ggml.bos_token_id", GgufValue::U32(0));
    });
    // llama-bpe defaults add_bos to true.
    assert!(t.add_bos_token());
    assert_eq!(t.encode_with_bos("a", false), [0, 1]);
}

#[test]
fn spm_merges_by_score_and_adds_space_prefix() {
    let t = spm_tokenizer();
    // "▁hi": "▁h" (-1.5) merges before anything else, then "▁hi" (-0.5).
    assert_eq!(texts(&t, &t.encode("hi", false)), ["▁hi"]);
    // "▁llo": "lo" (-2.5) outranks "ll" (-3.0), then "▁l" (-4.0) is the only merge left.
    assert_eq!(texts(&t, &t.encode("llo", false)), ["▁l", "lo"]);
}

#[test]
fn spm_byte_fallback_and_decode() {
    let t = spm_tokenizer();
    let ids = t.encode("hi é", false);
    assert_eq!(texts(&t, &ids), ["▁hi", "▁", "<0xC3>", "<0xA9>"]);
    assert_eq!(t.decode(&ids), "hi é");
    assert_eq!(t.token_to_piece(t.token_id("<0xC3>").expect("byte token")), [0xC3]);
}

#[test]
fn spm_special_tokens_restart_the_space_prefix() {
    let t = spm_tokenizer();
    let ids = t.encode("<s>hi", true);
    assert_eq!(texts(&t, &ids), ["<s>", "▁hi"]);
    assert_eq!(texts(&t, &t.encode("a<s>", true)), ["▁", "a", "<s>"]);
    assert_eq!(t.unk_id(), Some(0));
    assert!(t.add_bos_token());
    assert_eq!(t.encode_with_bos("hi", false), [1, t.token_id("▁hi").expect("piece")]);
}

#[test]
fn stream_decoder_holds_split_characters() {
    let t = bpe_tokenizer("gpt-2");
    let text = "a🍕你";
    let ids = t.encode(text, false);
    // No merges cover these bytes: one token per byte, so the emoji and the CJK char split.
    assert_eq!(ids.len(), 1 + 4 + 3);
    let mut d = StreamDecoder::new();
    let outs: Vec<String> = ids.iter().map(|&id| d.push(&t, id)).collect();
    assert_eq!(outs, ["a", "", "", "", "🍕", "", "", "你"]);
    assert!(!d.has_pending());
    assert_eq!(d.finish(), "");
}

#[test]
fn stream_decoder_finish_flushes_lossy_and_skips_invalid_bytes() {
    let mut d = StreamDecoder::new();
    assert_eq!(d.push_bytes(&[b'x', 0xF0, 0x9F]), "x");
    assert!(d.has_pending());
    assert_eq!(d.finish(), "\u{FFFD}");
    assert_eq!(d.push_bytes(&[0xFF, b'y']), "\u{FFFD}y");
}

#[test]
fn unsupported_model_is_named() {
    let err = Tokenizer::from_gguf(&gguf(|w| {
        w.set("tokenizer.ggml.model", GgufValue::str("t5")).set("tokenizer.ggml.tokens", GgufValue::strs(&["a"]));
    }))
    .err()
    .map(|e| e.to_string())
    .unwrap_or_default();
    assert!(err.contains("`t5`"), "{err}");
}

#[test]
fn missing_and_malformed_metadata_are_errors() {
    let missing = Tokenizer::from_gguf(&gguf(|w| {
        w.set("tokenizer.ggml.model", GgufValue::str("gpt2"));
    }));
    assert!(matches!(missing, Err(TokenizerError::MissingKey { key: "tokenizer.ggml.tokens" })));
    let dup = Tokenizer::from_gguf(&gguf(|w| {
        w.set("tokenizer.ggml.model", GgufValue::str("llama"))
            .set("tokenizer.ggml.tokens", GgufValue::strs(&["a", "a"]));
    }));
    assert!(matches!(dup, Err(TokenizerError::DuplicateToken { first: 0, second: 1, .. })));
    let short = Tokenizer::from_gguf(&gguf(|w| {
        w.set("tokenizer.ggml.model", GgufValue::str("llama"))
            .set("tokenizer.ggml.tokens", GgufValue::strs(&["a", "b"]))
            .set("tokenizer.ggml.scores", GgufValue::f32s(&[0.0]));
    }));
    assert!(matches!(short, Err(TokenizerError::ShortArray { len: 1, n_vocab: 2, .. })));
}

#[test]
fn spm_without_byte_tokens_falls_back_to_unknown() {
    let tokens: Vec<String> = ["<unk>", "<s>", "</s>", "▁", "a"].map(String::from).to_vec();
    let t = gguf_tokenizer(|w| {
        w.set("tokenizer.ggml.model", GgufValue::str("llama"))
            .set("tokenizer.ggml.tokens", GgufValue::strs(&tokens))
            .set("tokenizer.ggml.token_type", GgufValue::i32s(&[UNKNOWN, CONTROL, CONTROL, NORMAL, NORMAL]));
    });
    // "é" has neither a piece nor byte tokens: each of its two bytes becomes <unk>.
    assert_eq!(t.encode("aé", false), [3, 4, 0, 0]);
    // Defaults for a `llama` vocabulary without id keys.
    assert_eq!((t.bos_id(), t.eos_id(), t.unk_id()), (Some(1), Some(2), Some(0)));
    assert_eq!(t.eog_ids(), &[2]);
}

#[test]
fn tokenizer_and_template_can_be_shared_across_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Tokenizer>();
    assert_send_sync::<ChatTemplate>();
    assert_send_sync::<StreamDecoder>();
}
