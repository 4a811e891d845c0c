//! Tokenizer behaviour on the real default model (SmolLM2-135M-Instruct, gpt2 BPE, pre-tokenizer `smollm`),
//! checked against llama.cpp's own tokenization.
//!
//! The expected ids are llama.cpp's (release b11312) for the 14 strings of the reference set
//! `reference/tokenize.json`, with special tokens parsed and not. The model must be present: these tests
//! fail, not skip, without it (run `scripts/fetch-model`). The speed/count check reads the reference text
//! `perplexity_GPL-3.txt` from `tests/data/reference`.
//!
//! Module `gemma` does the same for Gemma 3 270M (SentencePiece, 262,144 tokens) against
//! `tests/data/tokenizer-gemma`, when that model file is present.

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Instant;

use strata::gguf::GgufFile;
use strata::tokenizer::{ChatMessage, ChatTemplate, StreamDecoder, Tokenizer};

struct Case {
    text: &'static str,
    /// llama.cpp's tokens with special tokens parsed.
    parsed: &'static [u32],
    /// llama.cpp's tokens with special tokens treated as text.
    unparsed: &'static [u32],
}

const CASES: &[Case] = &[
    Case { text: "Hello world", parsed: &[19556, 905], unparsed: &[19556, 905] },
    Case {
        text: "Hello, world! How are you today?",
        parsed: &[19556, 28, 905, 17, 1073, 359, 346, 1834, 47],
        unparsed: &[19556, 28, 905, 17, 1073, 359, 346, 1834, 47],
    },
    Case { text: " Hello world", parsed: &[38699, 905], unparsed: &[38699, 905] },
    Case {
        text: "   leading spaces and  double  spaces  ",
        parsed: &[256, 2899, 5600, 284, 216, 5561, 216, 5600, 256],
        unparsed: &[256, 2899, 5600, 284, 216, 5561, 216, 5600, 256],
    },
    Case {
        text: "12345 6.7",
        parsed: &[33, 34, 35, 36, 37, 216, 38, 30, 39],
        unparsed: &[33, 34, 35, 36, 37, 216, 38, 30, 39],
    },
    Case {
        text: "The year 2024 had 366 days; pi is about 3.14159, and 1,000,000 > 999999.",
        parsed: &[
            504, 713, 216, 34, 32, 34, 36, 761, 216, 35, 38, 38, 2009, 43, 16916, 314, 563, 216, 35, 30, 33, 36, 33,
            37, 41, 28, 284, 216, 33, 28, 32, 32, 32, 28, 32, 32, 32, 2986, 216, 41, 41, 41, 41, 41, 41, 30,
        ],
        unparsed: &[
            504, 713, 216, 34, 32, 34, 36, 761, 216, 35, 38, 38, 2009, 43, 16916, 314, 563, 216, 35, 30, 33, 36, 33,
            37, 41, 28, 284, 216, 33, 28, 32, 32, 32, 28, 32, 32, 32, 2986, 216, 41, 41, 41, 41, 41, 41, 30,
        ],
    },
    Case {
        text: "def foo(x):\n\treturn x * 2\n\nif __name__ == \"__main__\":\n    print(foo(21))\n",
        parsed: &[
            1604, 29856, 24, 104, 727, 198, 197, 5406, 1792, 1672, 216, 34, 198, 198, 342, 2758, 1245, 890, 1758,
            17892, 6157, 18953, 472, 1628, 24, 15236, 24, 34, 33, 1292, 198,
        ],
        unparsed: &[
            1604, 29856, 24, 104, 727, 198, 197, 5406, 1792, 1672, 216, 34, 198, 198, 342, 2758, 1245, 890, 1758,
            17892, 6157, 18953, 472, 1628, 24, 15236, 24, 34, 33, 1292, 198,
        ],
    },
    Case {
        text: "I love pizza 🍕🍕! 😀👍🏽",
        parsed: &[57, 2606, 18501, 15107, 231, 239, 10813, 231, 239, 17, 40303, 218, 10813, 235, 231, 10813, 233, 138],
        unparsed: &[
            57, 2606, 18501, 15107, 231, 239, 10813, 231, 239, 17, 40303, 218, 10813, 235, 231, 10813, 233, 138,
        ],
    },
    Case {
        text: "你好，世界！こんにちは世界 안녕하세요",
        parsed: &[
            18645, 250, 48392, 138, 12831, 7906, 240, 178, 239, 230, 8083, 219, 7365, 237, 10391, 237, 41152, 7365,
            111, 7365, 124, 7906, 240, 178, 239, 230, 18601, 239, 226, 182, 223, 239, 33085, 242, 183, 222, 133, 183,
            244, 238,
        ],
        unparsed: &[
            18645, 250, 48392, 138, 12831, 7906, 240, 178, 239, 230, 8083, 219, 7365, 237, 10391, 237, 41152, 7365,
            111, 7365, 124, 7906, 240, 178, 239, 230, 18601, 239, 226, 182, 223, 239, 33085, 242, 183, 222, 133, 183,
            244, 238,
        ],
    },
    Case {
        text: "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
        parsed: &[1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198],
        unparsed: &[
            44, 108, 306, 79, 3738, 108, 46, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 15137, 108, 306, 79, 486, 108,
            46, 198, 44, 108, 306, 79, 3738, 108, 46, 520, 9531, 198,
        ],
    },
    Case {
        text: "naïve café résumé — “quotes” ‘single’ …",
        parsed: &[3546, 46494, 37366, 412, 2756, 5422, 2756, 1841, 619, 385, 2346, 573, 1551, 18536, 417, 5548],
        unparsed: &[3546, 46494, 37366, 412, 2756, 5422, 2756, 1841, 619, 385, 2346, 573, 1551, 18536, 417, 5548],
    },
    Case {
        text: "Hello\n\n\nWorld\r\n\tTab   end  ",
        parsed: &[19556, 1116, 198, 11265, 2738, 197, 30064, 256, 1112, 256],
        unparsed: &[19556, 1116, 198, 11265, 2738, 197, 30064, 256, 1112, 256],
    },
    Case {
        text: "https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct?x=1&y=2#frag",
        parsed: &[
            4687, 1742, 88, 19712, 1803, 30, 1881, 31, 56, 19712, 28149, 29626, 31, 9207, 308, 34519, 34, 29, 33, 35,
            37, 61, 29, 6744, 961, 47, 104, 45, 33, 22, 105, 45, 34, 19, 28082,
        ],
        unparsed: &[
            4687, 1742, 88, 19712, 1803, 30, 1881, 31, 56, 19712, 28149, 29626, 31, 9207, 308, 34519, 34, 29, 33, 35,
            37, 61, 29, 6744, 961, 47, 104, 45, 33, 22, 105, 45, 34, 19, 28082,
        ],
    },
    Case {
        text: "<|endoftext|>The end.<|im_end|>",
        parsed: &[0, 504, 1112, 30, 2],
        unparsed: &[44, 108, 486, 1714, 2692, 108, 46, 504, 1112, 15602, 108, 306, 79, 486, 108, 46],
    },
];

fn model_path() -> PathBuf {
    match std::env::var_os("STRATA_MODEL") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/SmolLM2-135M-Instruct.Q4_1.gguf"),
    }
}

fn model_file() -> &'static GgufFile {
    static FILE: OnceLock<GgufFile> = OnceLock::new();
    FILE.get_or_init(|| {
        let path = model_path();
        assert!(
            path.exists(),
            "model file {} is missing: run scripts/fetch-model (or set STRATA_MODEL to a copy of \
             SmolLM2-135M-Instruct.Q4_1.gguf)",
            path.display()
        );
        GgufFile::open(&path).unwrap_or_else(|e| panic!("cannot open {}: {e}", path.display()))
    })
}

fn tokenizer() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| Tokenizer::from_gguf(model_file()).expect("SmolLM2's tokenizer loads"))
}

/// The reference folder: `STRATA_REFERENCE_DIR`, else the copy in `tests/data/reference`.
fn reference_file(name: &str) -> PathBuf {
    let dir = match std::env::var_os("STRATA_REFERENCE_DIR") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/reference"),
    };
    dir.join(name)
}

#[test]
fn smollm2_vocabulary_metadata() {
    let t = tokenizer();
    assert_eq!(t.model(), "gpt2");
    assert_eq!(t.pre(), "smollm");
    assert_eq!(t.n_vocab(), 49152);
    assert_eq!(t.token_text(0), Some("<|endoftext|>"));
    assert_eq!(t.token_text(1), Some("<|im_start|>"));
    assert_eq!(t.token_text(2), Some("<|im_end|>"));
    assert_eq!((t.bos_id(), t.eos_id(), t.unk_id(), t.pad_id()), (Some(1), Some(2), Some(0), Some(2)));
    assert!(!t.add_bos_token() && !t.add_eos_token());
    assert!(t.is_control(1) && t.is_special(2) && !t.is_special(19556));
}

#[test]
fn smollm2_end_of_generation_set() {
    assert_eq!(tokenizer().eog_ids(), &[0, 2, 4]);
}

#[test]
fn matches_llama_cpp_with_special_tokens_parsed() {
    let t = tokenizer();
    for case in CASES {
        assert_eq!(t.encode(case.text, true), case.parsed, "text {:?}", case.text);
    }
}

#[test]
fn matches_llama_cpp_with_special_tokens_as_text() {
    let t = tokenizer();
    for case in CASES {
        assert_eq!(t.encode(case.text, false), case.unparsed, "text {:?}", case.text);
    }
}

#[test]
fn decode_round_trips_the_reference_strings() {
    let t = tokenizer();
    for case in CASES {
        assert_eq!(t.decode(case.parsed), case.text, "parsed ids of {:?}", case.text);
        assert_eq!(t.decode(case.unparsed), case.text, "unparsed ids of {:?}", case.text);
    }
}

#[test]
fn stream_decoding_equals_whole_decoding() {
    let t = tokenizer();
    for case in CASES {
        let mut d = StreamDecoder::new();
        let mut text = String::new();
        for &id in case.parsed {
            let piece = d.push(t, id);
            // Every chunk handed out is whole characters: the emoji and CJK cases split across tokens.
            text.push_str(&piece);
        }
        text.push_str(&d.finish());
        assert_eq!(text, case.text);
    }
}

#[test]
fn emoji_bytes_split_across_tokens_are_held_back() {
    let t = tokenizer();
    let ids = t.encode("🍕", false);
    assert!(ids.len() > 1, "the emoji is expected to span several tokens: {ids:?}");
    let mut d = StreamDecoder::new();
    let outs: Vec<String> = ids.iter().map(|&id| d.push(t, id)).collect();
    assert!(outs[..outs.len() - 1].iter().all(String::is_empty), "{outs:?}");
    assert_eq!(outs.last().map(String::as_str), Some("🍕"));
}

#[test]
fn perplexity_text_token_count_and_speed() {
    let path = reference_file("perplexity_GPL-3.txt");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!("cannot read {} ({e}): set STRATA_REFERENCE_DIR to the shared reference folder", path.display())
    });
    let t = tokenizer();
    let start = Instant::now();
    let ids = t.encode(&text, false);
    let elapsed_ms = start.elapsed().as_secs_f64() * 1e3;
    // Reported, not asserted: timing belongs to benchmarks, and debug builds are slow.
    eprintln!("tokenized {} bytes into {} tokens in {elapsed_ms:.1} ms", text.len(), ids.len());
    assert_eq!(ids.len(), 7639);
    assert_eq!(t.decode(&ids), text);
}

#[test]
fn smollm2_chat_template_inserts_default_system_prompt() {
    let template = ChatTemplate::from_gguf(model_file()).expect("template compiles");
    let out = template.render(&[ChatMessage::new("user", "Hi")], true).expect("renders");
    assert_eq!(
        out,
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
         <|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
    let with_system = [ChatMessage::new("system", "Be terse."), ChatMessage::new("user", "Hi")];
    let out = template.render(&with_system, false).expect("renders");
    assert_eq!(out, "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
    // The rendered prompt tokenizes with its control tokens recognised.
    let ids = tokenizer().encode(&out, true);
    assert_eq!(ids.iter().filter(|&&id| id == 1).count(), 2);
}

/// A reply as a model could have generated it: pieces that retokenizing the text would merge.
fn generated_reply(tok: &Tokenizer) -> (String, Vec<u32>) {
    let pieces = ["The", " cap", "ital", " of", " Italy", " is", " Rome", "."];
    let ids: Vec<u32> = pieces.iter().flat_map(|p| tok.encode(p, false)).collect();
    let text = pieces.concat();
    assert_ne!(tok.encode(&text, false), ids, "the test needs a reply that retokenizes differently");
    (text, ids)
}

#[test]
fn an_earlier_reply_goes_into_the_prompt_as_its_generated_tokens() {
    use std::sync::Arc;
    use strata::tokenizer::turns::{encode_chat, tokens_of_text, ReplyTokens};
    let tok = tokenizer();
    let template = ChatTemplate::from_gguf(model_file()).unwrap();
    let (reply, ids) = generated_reply(tok);
    // What generation returns: the reply's tokens, then the end-of-turn token.
    let mut generated = ids.clone();
    generated.push(2);
    assert_eq!(tokens_of_text(tok, &generated, &reply), Some(&ids[..]));
    // A stop string that cut the text inside a token: no prefix decodes to it, nothing is remembered.
    assert_eq!(tokens_of_text(tok, &generated, &reply[..reply.len() - 2]), None);
    let mut replies = ReplyTokens::default();
    replies.remember(&reply, &ids);
    let first = vec![ChatMessage::new("user", "What is the capital of Italy?")];
    let mut conv = first.clone();
    conv.push(ChatMessage::new("assistant", reply.clone()));
    conv.push(ChatMessage::new("user", "And of France?"));
    let p = encode_chat(&template, tok, &conv, |t| replies.get(t)).unwrap();
    assert_eq!((p.kept_replies, p.kept_reply_tokens), (1, ids.len()));
    // The first turn's prompt, then the reply as generated, then the glue and the new message.
    let turn1 = tok.encode_templated(&template.render(&first, true).unwrap());
    assert_eq!(&p.tokens[..turn1.len()], &turn1[..]);
    assert_eq!(&p.tokens[turn1.len()..turn1.len() + ids.len()], &ids[..]);
    assert_eq!(p.tokens[turn1.len() + ids.len()], 2, "<|im_end|> follows the reply");
    // It spells the same text as the render.
    let text: String = p.tokens.iter().map(|&t| String::from_utf8_lossy(&tok.token_to_piece(t)).into_owned()).collect();
    assert_eq!(text, template.render(&conv, true).unwrap());
    // Unknown text, or a template that does not write the content unchanged: the whole render as text.
    let none = encode_chat(&template, tok, &conv, |_| None::<Arc<[u32]>>).unwrap();
    assert_eq!(none.tokens, tok.encode_templated(&template.render(&conv, true).unwrap()));
    assert_eq!(none.kept_reply_tokens, 0);
    let trimming = ChatTemplate::new(
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content | trim }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n",
        "",
        "",
    )
    .unwrap();
    let mut padded = conv.clone();
    padded[1].content = format!(" {reply} ");
    replies.remember(&padded[1].content, &ids);
    let t = encode_chat(&trimming, tok, &padded, |t| replies.get(t)).unwrap();
    assert_eq!(t.kept_reply_tokens, 0, "the template trims the content: its tokens are not the reply's");
    assert_eq!(t.tokens, tok.encode_templated(&trimming.render(&padded, true).unwrap()));
}

/// Gemma 3 270M (SentencePiece, 262,144 tokens, `add_space_prefix` false, user-defined tokens for runs of
/// spaces, tabs and newlines and for HTML tags), checked against llama.cpp's output for the same file in
/// `tests/data/tokenizer-gemma/llama-cpp.json` (see the README there). The file is optional: without
/// `models/gemma-3-270m-q4_k_m.gguf` (scripts/fetch-gemma, or `STRATA_GEMMA_MODEL`) these tests print that
/// they are skipped and pass, except that Gemma 3's chat template is still rendered and checked.
mod gemma {
    use std::path::PathBuf;
    use std::sync::OnceLock;
    use std::time::Instant;

    use serde_json::Value;
    use strata::gguf::GgufFile;
    use strata::tokenizer::{ChatMessage, ChatTemplate, StreamDecoder, Tokenizer, TokenizerError};

    const FILE_NAME: &str = "gemma-3-270m-q4_k_m.gguf";

    fn data_path(name: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/tokenizer-gemma").join(name)
    }

    fn reference() -> &'static Value {
        static DOC: OnceLock<Value> = OnceLock::new();
        DOC.get_or_init(|| {
            let path = data_path("llama-cpp.json");
            let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
        })
    }

    /// Where the Gemma file is looked for: `STRATA_GEMMA_MODEL`, else `models/gemma-3-270m-q4_k_m.gguf`.
    fn gemma_path() -> PathBuf {
        match std::env::var_os("STRATA_GEMMA_MODEL") {
            Some(p) => PathBuf::from(p),
            None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models").join(FILE_NAME),
        }
    }

    /// The Gemma file and its tokenizer, or `None` (with a message saying that `test` is skipped, or what
    /// part of it) when the file is absent.
    fn gemma(test: &str) -> Option<&'static (GgufFile, Tokenizer)> {
        static LOADED: OnceLock<Option<(GgufFile, Tokenizer)>> = OnceLock::new();
        let loaded = LOADED.get_or_init(|| {
            let path = gemma_path();
            if !path.is_file() {
                return None;
            }
            let file = GgufFile::open(&path).unwrap_or_else(|e| panic!("cannot open {}: {e}", path.display()));
            let start = Instant::now();
            let tok = Tokenizer::from_gguf(&file).expect("Gemma's tokenizer loads");
            // Reported, not asserted (timing belongs to benchmarks).
            let elapsed_ms = start.elapsed().as_secs_f64() * 1e3;
            eprintln!("Gemma tokenizer ({} tokens) loaded in {elapsed_ms:.1} ms", tok.n_vocab());
            Some((file, tok))
        });
        if loaded.is_none() {
            eprintln!(
                "{test}: skipped: {} is absent (run scripts/fetch-gemma or set STRATA_GEMMA_MODEL)",
                gemma_path().display()
            );
        }
        loaded.as_ref()
    }

    fn ids(v: &Value) -> Vec<u32> {
        v.as_array().expect("an array of ids").iter().map(|x| x.as_u64().expect("an id") as u32).collect()
    }

    fn cases() -> &'static [Value] {
        reference()["cases"].as_array().expect("cases")
    }

    #[test]
    fn gemma_special_ids_and_flags_match_llama_cpp() {
        let Some((_, t)) = gemma("gemma_special_ids_and_flags_match_llama_cpp") else { return };
        let v = &reference()["vocab"];
        assert_eq!((t.model(), t.n_vocab() as u64), ("llama", v["n_vocab"].as_u64().unwrap()));
        assert_eq!(t.bos_id().map(u64::from), v["bos"].as_u64());
        assert_eq!(t.eos_id().map(u64::from), v["eos"].as_u64());
        assert_eq!(t.eot_id().map(u64::from), v["eot"].as_u64(), "<end_of_turn> is found by its text");
        assert_eq!(t.pad_id().map(u64::from), v["pad"].as_u64());
        assert_eq!(t.add_bos_token(), v["add_bos"].as_bool().unwrap());
        assert_eq!(t.add_eos_token(), v["add_eos"].as_bool().unwrap());
        assert_eq!(t.token_text(106), Some("<end_of_turn>"));
    }

    #[test]
    fn gemma_end_of_generation_set_matches_llama_cpp() {
        let Some((_, t)) = gemma("gemma_end_of_generation_set_matches_llama_cpp") else { return };
        // <eos>, <end_of_turn> and (by its text, as llama.cpp does) the user-defined `</s>`.
        let expected = ids(&reference()["vocab"]["eog"]);
        assert_eq!(expected, [1, 106, 212]);
        assert_eq!(t.eog_ids(), &expected[..]);
        assert!(t.is_eog(106) && t.is_eog(1) && !t.is_eog(105) && !t.is_eog(2));
    }

    #[test]
    fn gemma_tokens_match_llama_cpp() {
        let Some((_, t)) = gemma("gemma_tokens_match_llama_cpp") else { return };
        for case in cases() {
            let text = case["text"].as_str().unwrap();
            assert_eq!(t.encode(text, true), ids(&case["ids"]), "parse_special, text {text:?}");
            assert_eq!(t.encode(text, false), ids(&case["ids_no_parse_special"]), "as text, text {text:?}");
            assert_eq!(t.encode_with_bos(text, true), ids(&case["ids_with_bos"]), "with BOS, text {text:?}");
        }
    }

    #[test]
    fn gemma_detokenization_matches_llama_cpp() {
        let Some((_, t)) = gemma("gemma_detokenization_matches_llama_cpp") else { return };
        for case in cases() {
            let text = case["text"].as_str().unwrap();
            for (ids_key, text_key) in
                [("ids", "detokenized"), ("ids_no_parse_special", "detokenized_no_parse_special")]
            {
                let ids = ids(&case[ids_key]);
                let expected = case[text_key].as_str().unwrap();
                assert_eq!(t.decode(&ids), expected, "{ids_key} of {text:?}");
                assert_eq!(expected, text, "llama.cpp round-trips {text:?}");
                let mut d = StreamDecoder::new();
                let mut streamed: String = ids.iter().map(|&id| d.push(t, id)).collect();
                streamed.push_str(&d.finish());
                assert_eq!(streamed, expected, "streamed {ids_key} of {text:?}");
            }
        }
    }

    #[test]
    fn gemma_token_pieces_match_llama_cpp() {
        let Some((_, t)) = gemma("gemma_token_pieces_match_llama_cpp") else { return };
        for p in reference()["pieces"].as_array().unwrap() {
            let id = p["id"].as_u64().unwrap() as u32;
            let bytes: Vec<u8> =
                p["bytes_special"].as_array().unwrap().iter().map(|b| b.as_u64().unwrap() as u8).collect();
            assert_eq!(t.token_to_piece(id), bytes, "token {id} ({:?})", t.token_text(id));
            // Control and unknown tokens are the ones llama.cpp hides without `special`.
            let hidden = p["bytes_plain"].as_array().unwrap().is_empty() && !bytes.is_empty();
            assert_eq!(t.is_control(id) || t.unk_id() == Some(id), hidden, "token {id}");
        }
    }

    #[test]
    fn gemma_long_text_count_and_checksum_match_llama_cpp() {
        let Some((_, t)) = gemma("gemma_long_text_count_and_checksum_match_llama_cpp") else { return };
        for l in reference()["long_texts"].as_array().unwrap() {
            let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(l["path"].as_str().unwrap());
            let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
            let start = Instant::now();
            let ids = t.encode(&text, false);
            let elapsed_ms = start.elapsed().as_secs_f64() * 1e3;
            eprintln!("Gemma: tokenized {} bytes into {} tokens in {elapsed_ms:.1} ms", text.len(), ids.len());
            assert_eq!(ids.len() as u64, l["n_tokens"].as_u64().unwrap());
            // The checksum llama_reference.cpp writes: h = h * 1000003 + id + 1 (mod 2^64).
            let sum = ids.iter().fold(0u64, |h, &id| h.wrapping_mul(1_000_003).wrapping_add(u64::from(id) + 1));
            assert_eq!(sum.to_string(), l["checksum"].as_str().unwrap());
            assert_eq!(t.decode(&ids), text);
        }
    }

    fn messages(chat: &Value) -> Vec<ChatMessage> {
        chat["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| ChatMessage::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
            .collect()
    }

    /// Checks one render against llama.cpp's: the same prompt (llama.cpp drops the template's leading BOS
    /// text, since tokenizing adds BOS) or the same raised error, and with a tokenizer the same tokens.
    fn check_render(t: Option<&Tokenizer>, template: &ChatTemplate, chat: &Value, expected: &Value) {
        let name = chat["name"].as_str().unwrap();
        let rendered = template.render(&messages(chat), chat["add_generation_prompt"].as_bool().unwrap());
        match (rendered, expected["error"].as_str()) {
            (Ok(text), None) => {
                let prompt = expected["prompt"].as_str().unwrap();
                assert_eq!(text.strip_prefix("<bos>").unwrap_or(&text), prompt, "chat {name:?}");
                if let Some(t) = t {
                    assert_eq!(t.encode_templated(&text), ids(&expected["ids"]), "chat {name:?}");
                }
            }
            (Err(TokenizerError::TemplateRaised { message }), Some(error)) => {
                assert!(error.contains(&message), "chat {name:?}: raised {message:?}, llama.cpp: {error:?}");
            }
            (got, want) => panic!("chat {name:?}: Strata gave {got:?}, llama.cpp's error: {want:?}"),
        }
    }

    #[test]
    fn gemma_file_template_is_chatml_as_in_llama_cpp() {
        let Some((file, t)) = gemma("gemma_file_template_is_chatml_as_in_llama_cpp") else { return };
        // The file (the base model) has no tokenizer.chat_template: both fall back to ChatML.
        assert!(file.get("tokenizer.chat_template").is_none());
        let template = ChatTemplate::from_gguf(file).expect("the fallback compiles");
        for chat in reference()["chats"].as_array().unwrap() {
            check_render(Some(t), &template, chat, &chat["file_template"]);
        }
    }

    #[test]
    fn gemma3_chat_template_renders_as_in_llama_cpp() {
        // The renders are checked without the file too; their tokens only with it.
        let t = gemma("gemma3_chat_template_renders_as_in_llama_cpp (its tokens)").map(|(_, t)| t);
        let source = std::fs::read_to_string(data_path("gemma3-chat-template.jinja")).expect("the template is there");
        let template = ChatTemplate::new(&source, "<bos>", "<eos>").expect("Gemma 3's template compiles");
        for chat in reference()["chats"].as_array().unwrap() {
            check_render(t, &template, chat, &chat["gemma3_template"]);
        }
    }

    #[test]
    fn gemma3_template_keeps_a_generated_reply_as_its_tokens() {
        use strata::tokenizer::turns::{encode_chat, tokens_of_text, ReplyTokens};
        let Some((_, t)) = gemma("gemma3_template_keeps_a_generated_reply_as_its_tokens") else { return };
        let source = std::fs::read_to_string(data_path("gemma3-chat-template.jinja")).expect("the template is there");
        let template = ChatTemplate::new(&source, "<bos>", "<eos>").unwrap();
        // Steps a model could have generated, which the text alone tokenizes differently.
        let pieces = ["The", " cap", "ital", " of", " Italy", " is", " Rome", "."];
        let ids: Vec<u32> = pieces.iter().flat_map(|p| t.encode(p, false)).collect();
        let reply = pieces.concat();
        assert_ne!(t.encode(&reply, false), ids, "the test needs a reply that retokenizes differently");
        // Generation ends with <end_of_turn>, an end-of-generation token left out of the reply.
        let generated: Vec<u32> = ids.iter().copied().chain([106]).collect();
        assert_eq!(tokens_of_text(t, &generated, &reply), Some(&ids[..]));
        let mut replies = ReplyTokens::default();
        replies.remember(&reply, &ids);
        let first = vec![ChatMessage::new("system", "Be terse."), ChatMessage::new("user", "Capital of Italy?")];
        let mut conv = first.clone();
        conv.push(ChatMessage::new("assistant", reply.clone()));
        conv.push(ChatMessage::new("user", "And of France?"));
        let p = encode_chat(&template, t, &conv, |text| replies.get(text)).unwrap();
        assert_eq!((p.kept_replies, p.kept_reply_tokens), (1, ids.len()));
        let turn1 = t.encode_templated(&template.render(&first, true).unwrap());
        assert_eq!(turn1[..2], [2, 105], "one BOS, then <start_of_turn>");
        assert_eq!(&p.tokens[..turn1.len()], &turn1[..]);
        assert_eq!(&p.tokens[turn1.len()..turn1.len() + ids.len()], &ids[..]);
        assert_eq!(p.tokens[turn1.len() + ids.len()..][..2], [106, 107], "<end_of_turn> and a newline follow");
        assert_eq!(t.decode(&p.tokens), template.render(&conv, true).unwrap());
    }
}
