//! Constrained sampling (`strata::grammar`) on the default model's real vocabulary: whatever the logits,
//! the tokens the mask leaves spell text inside the grammar, and a JSON schema's output parses and
//! validates (checked by the `jsonschema` crate, not by the grammar engine itself).
//!
//! Most cases drive the mask with random logits (a seeded noise plus a pull towards closing characters, so
//! that structures end): that explores far more of the grammar than a model's few favourite replies. The
//! model-driven cases run the engine's own `generate` with the real model.

use std::sync::{Arc, OnceLock};

use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

use strata::engine::{generate, GenerateParams, Request, Sequence, StopReason, TextOnly};
use strata::gguf::GgufFile;
use strata::grammar::{Constraint, GrammarError, GrammarSpec, Grammars, MAX_FRACTION_DIGITS, MAX_INTEGRAL_DIGITS};
use strata::model::{KvType, Model};
use strata::sample::SamplerConfig;
use strata::threadpool::ThreadPool;
use strata::tokenizer::Tokenizer;

use crate::common;

fn tokenizer() -> Arc<Tokenizer> {
    static TOK: OnceLock<Arc<Tokenizer>> = OnceLock::new();
    TOK.get_or_init(|| {
        let file = GgufFile::open(&common::model_path()).expect("the default model opens");
        Arc::new(Tokenizer::from_gguf(&file).expect("its tokenizer loads"))
    })
    .clone()
}

fn grammars() -> &'static Grammars {
    static G: OnceLock<Grammars> = OnceLock::new();
    G.get_or_init(|| Grammars::new(tokenizer()))
}

/// Runs `c` with random logits until it finishes (or `max_tokens`): the tokens chosen, and whether the
/// grammar finished or an end-of-generation token was picked (both end a reply).
fn drive(c: Constraint, seed: u64, max_tokens: usize) -> (Vec<u32>, bool) {
    drive_pulled(c, seed, max_tokens, |_| 0.0)
}

/// [`drive`] with `extra(piece)` added to each token's pull.
fn drive_pulled(mut c: Constraint, seed: u64, max_tokens: usize, extra: impl Fn(&[u8]) -> f32) -> (Vec<u32>, bool) {
    let tok = tokenizer();
    let n = tok.n_vocab();
    // Tokens made only of closing characters get a pull, so that strings, arrays and objects end.
    let pull: Vec<f32> = (0..n as u32)
        .map(|id| {
            let p = tok.token_to_piece(id);
            extra(&p)
                + if !p.is_empty() && p.iter().all(|b| b"\"}],".contains(b)) {
                    3.0
                } else if tok.is_eog(id) {
                    6.0
                } else {
                    0.0
                }
        })
        .collect();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut out = Vec::new();
    let mut logits = vec![0f32; n];
    while out.len() < max_tokens && !c.finished() {
        for (l, p) in logits.iter_mut().zip(&pull) {
            *l = rng.gen::<f32>() * 4.0 + p;
        }
        c.mask(&mut logits).expect("a mask");
        let best = logits
            .iter()
            .enumerate()
            .filter(|(_, l)| !l.is_nan())
            .max_by(|a, b| a.1.total_cmp(b.1))
            .map(|(i, _)| i as u32)
            .expect("the mask leaves some token");
        if tok.is_eog(best) {
            return (out, true);
        }
        c.commit(best).expect("the grammar takes the token its mask allowed");
        out.push(best);
    }
    let done = c.finished();
    (out, done)
}

fn text_of(tokens: &[u32]) -> String {
    let tok = tokenizer();
    let bytes: Vec<u8> = tokens.iter().flat_map(|&t| tok.token_to_piece(t)).collect();
    String::from_utf8(bytes).expect("the grammar keeps the output UTF-8")
}

fn assert_valid(schema: &Value, text: &str) {
    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("output {text:?} is not JSON: {e}"));
    let validator = jsonschema::validator_for(schema).expect("the test schema is valid");
    let errors: Vec<String> = validator.iter_errors(&v).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "output {text} does not validate against {schema}: {errors:?}");
}

#[test]
fn gbnf_grammar_spells_exactly_its_language() {
    let g = grammars().compile(&GrammarSpec::Gbnf(r#"root ::= "a"{5,5}"#.into())).unwrap();
    for seed in 0..5 {
        let (tokens, done) = drive(g.clone(), seed, 50);
        assert!(done, "the grammar finishes");
        assert_eq!(text_of(&tokens), "aaaaa");
    }
    let g =
        grammars().compile(&GrammarSpec::Gbnf("root ::= (\"yes\" | \"no\") \" \" [0-9]{1,3} \"!\"\n".into())).unwrap();
    for seed in 0..20 {
        let text = text_of(&drive(g.clone(), seed, 50).0);
        let (word, rest) = text.split_once(' ').unwrap_or_else(|| panic!("{text:?}"));
        assert!(word == "yes" || word == "no", "{text:?}");
        let digits = rest.strip_suffix('!').unwrap_or_else(|| panic!("{text:?}"));
        assert!((1..=3).contains(&digits.len()) && digits.bytes().all(|b| b.is_ascii_digit()), "{text:?}");
    }
}

#[test]
fn llguidance_syntax_after_the_marker_and_bad_grammars_are_refused_by_name() {
    let g = grammars().compile(&GrammarSpec::Gbnf("%llguidance {}\nstart: \"x\" /[0-9]/".into())).unwrap();
    let text = text_of(&drive(g, 1, 10).0);
    assert!(text.len() == 2 && text.starts_with('x'), "{text:?}");
    let e = grammars().compile(&GrammarSpec::Gbnf("root ::= item".into())).unwrap_err();
    assert!(matches!(e, GrammarError::Gbnf(_)) && e.to_string().contains("never defined"), "{e}");
    for bad in [json!({"type": "hiccup"}), json!({"type": 123}), json!({"type": "string", "pattern": "(("})] {
        let e = grammars().compile(&GrammarSpec::JsonSchema(bad.clone())).unwrap_err();
        assert!(matches!(e, GrammarError::Invalid { .. }), "{bad}: {e}");
    }
}

#[test]
fn json_object_is_always_an_object() {
    let g = grammars().compile(&GrammarSpec::JsonObject).unwrap();
    for seed in 0..20 {
        let (tokens, done) = drive(g.clone(), seed, 600);
        let text = text_of(&tokens);
        assert!(done, "seed {seed}: unfinished {text:?}");
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        assert!(v.is_object(), "{text}");
    }
}

/// A model that keeps writing digits (small ones do: `8.3333…` until `max_tokens`) still gets a whole
/// number: as in llama.cpp's schema grammars, a number has at most [`MAX_INTEGRAL_DIGITS`] digits before its point and
/// [`MAX_FRACTION_DIGITS`] after it, so the grammar moves on to what follows.
#[test]
fn numbers_end_even_when_the_model_keeps_writing_digits() {
    let schema = json!({
        "type": "object",
        "properties": {"x": {"type": "number"}, "n": {"type": "integer"}, "y": {"type": ["number", "null"]},
                       "list": {"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 2}},
        "required": ["x", "n", "y", "list"]
    });
    let g = grammars().compile(&GrammarSpec::JsonSchema(schema.clone())).unwrap();
    let digits = |p: &[u8]| if !p.is_empty() && p.iter().all(|b| b.is_ascii_digit() || *b == b'.') { 8.0 } else { 0.0 };
    for seed in 0..10 {
        let (tokens, done) = drive_pulled(g.clone(), seed, 400, digits);
        let text = text_of(&tokens);
        assert!(done, "seed {seed}: unfinished after {} tokens: {text:?}", tokens.len());
        assert_valid(&schema, &text);
        // The schema has no strings but its keys, so every run of digits is part of a number.
        for number in text.split(|c: char| !(c.is_ascii_digit() || c == '.')).filter(|s| !s.is_empty()) {
            let (int, frac) = number.split_once('.').unwrap_or((number, ""));
            assert!(
                int.len() <= MAX_INTEGRAL_DIGITS as usize && frac.len() <= MAX_FRACTION_DIGITS,
                "seed {seed}: {number} in {text}"
            );
        }
    }
}

/// The digit bounds never make a schema's own values impossible: a minimum past them, a constant or an
/// enum of long numbers, bounds finer than nine decimals all still compile and give valid output.
#[test]
fn schemas_past_the_number_bounds_keep_their_own_values() {
    for schema in [
        json!({"type": "integer", "minimum": 1e16}),
        json!({"type": "integer", "maximum": -1e17}),
        json!({"const": 12345678901234567u64}),
        json!({"type": "number", "enum": [1.0000000000001, 2.5]}),
        json!({"type": "number", "minimum": 1e-12, "maximum": 2e-12}),
        json!({"type": "number", "minimum": 0, "maximum": 5}),
    ] {
        let g =
            grammars().compile(&GrammarSpec::JsonSchema(schema.clone())).unwrap_or_else(|e| panic!("{schema}: {e}"));
        for seed in 0..3 {
            let (tokens, done) = drive(g.clone(), seed, 400);
            let text = text_of(&tokens);
            assert!(done, "{schema}, seed {seed}: unfinished {text:?}");
            assert_valid(&schema, &text);
        }
    }
}

/// A JSON schema within the subset the grammar engine supports: scalars with bounds, enums, constants,
/// patterns, objects with required and optional properties, arrays with length bounds, anyOf.
fn schema() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        (0u32..3, 3u32..10).prop_map(|(min, max)| json!({"type": "string", "minLength": min, "maxLength": max})),
        (-1000i64..0, 0i64..1000).prop_map(|(min, max)| json!({"type": "integer", "minimum": min, "maximum": max})),
        Just(json!({"type": "integer"})),
        (-50i32..0, 1i32..50).prop_map(|(min, max)| json!({"type": "number", "minimum": min, "maximum": max})),
        Just(json!({"type": "boolean"})),
        Just(json!({"type": "null"})),
        prop::collection::vec("[a-z]{1,6}", 1..4).prop_map(|v| json!({"enum": v})),
        "[A-Za-z ]{0,8}".prop_map(|s| json!({"const": s})),
        Just(json!({"type": "string", "pattern": "^[a-z]{2,5}-[0-9]{1,3}$"})),
        Just(json!({"type": "string", "format": "date"})),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            (prop::collection::vec(("[a-z]{1,8}", inner.clone(), any::<bool>()), 1..5), any::<bool>()).prop_map(
                |(props, closed)| {
                    let mut properties = serde_json::Map::new();
                    let mut required = Vec::new();
                    for (name, s, req) in props {
                        if req && !properties.contains_key(&name) {
                            required.push(name.clone());
                        }
                        properties.insert(name, s);
                    }
                    let mut o = json!({"type": "object", "properties": properties, "required": required});
                    if closed {
                        o["additionalProperties"] = json!(false);
                    }
                    o
                }
            ),
            (inner.clone(), 0u32..2, 2u32..4).prop_map(
                |(items, min, max)| json!({"type": "array", "items": items, "minItems": min, "maxItems": max})
            ),
            (inner.clone(), inner).prop_map(|(a, b)| json!({"anyOf": [a, b]})),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, failure_persistence: None, ..ProptestConfig::default() })]

    /// The issue's fuzz: 200 random schemas, each driven by random logits to its end; the output parses and
    /// validates.
    #[test]
    fn random_schemas_give_valid_output(s in schema(), seed in any::<u64>()) {
        let g = grammars().compile(&GrammarSpec::JsonSchema(s.clone()))
            .unwrap_or_else(|e| panic!("{s}: {e}"));
        let (tokens, done) = drive(g, seed, 1500);
        let text = text_of(&tokens);
        prop_assert!(done, "{} unfinished after {} tokens: {:?}", s, tokens.len(), text);
        assert_valid(&s, &text);
    }
}

/// The default model, loaded once for the model-driven cases.
fn model() -> &'static (Model, ThreadPool) {
    static M: OnceLock<(Model, ThreadPool)> = OnceLock::new();
    M.get_or_init(|| {
        let file = Arc::new(GgufFile::open(&common::model_path()).expect("the default model opens"));
        (Model::from_file(file).expect("the default model loads"), ThreadPool::new(2))
    })
}

fn chat_prompt(question: &str) -> Vec<u32> {
    let text = format!("<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n");
    tokenizer().encode(&text, true)
}

#[test]
fn the_model_answers_inside_the_schema_greedy_and_sampled() {
    let _one = common::one_at_a_time();
    let (model, pool) = model();
    let tok = tokenizer();
    let schema = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "languages": {"type": "array", "items": {"enum": ["en", "fr", "de"]}, "minItems": 1, "maxItems": 3}
        },
        "required": ["name", "age", "languages"],
        "additionalProperties": false
    });
    let g = grammars().compile(&GrammarSpec::JsonSchema(schema.clone())).unwrap();
    let prompt = chat_prompt("Describe a person as JSON.");
    for (i, sampler) in
        [SamplerConfig::greedy(), SamplerConfig { seed: 7, ..SamplerConfig::default() }].into_iter().enumerate()
    {
        let params = GenerateParams { max_tokens: 200, sampler, grammar: Some(g.clone()), ..GenerateParams::default() };
        let mut seq = Sequence::new(model, KvType::F32, 1024).unwrap();
        let out = generate(model, &tok, pool, &mut seq, Request::new(&prompt, &params), &mut TextOnly(|_: &str| {}))
            .expect("generation runs");
        assert_eq!(out.stop_reason, StopReason::Eog, "case {i}: {:?}", out.text);
        assert_valid(&schema, &out.text);
    }
}
