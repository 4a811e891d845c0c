//! The request loop: a live sequence reused across requests gives exactly what a fresh read gives.

use std::sync::Arc;

use strata::engine::{generate, GenerateParams, Quiet, Request, Sequence, StopReason, TextOnly};
use strata::gguf::GgufFile;
use strata::model::synthetic::SyntheticSpec;
use strata::model::{KvType, Model};
use strata::sample::SamplerConfig;
use strata::threadpool::ThreadPool;
use strata::tokenizer::Tokenizer;

fn setup() -> (Model, Tokenizer) {
    let file = Arc::new(GgufFile::from_bytes(SyntheticSpec::default().to_gguf()).expect("parses"));
    let tok = Tokenizer::from_gguf(&file).expect("tokenizer");
    (Model::from_file(file).expect("model"), tok)
}

fn greedy(n: usize, batch: usize) -> GenerateParams {
    GenerateParams { max_tokens: n, sampler: SamplerConfig::greedy(), ignore_eos: true, batch, ..Default::default() }
}

#[test]
fn a_reused_prefix_gives_the_same_tokens_as_a_fresh_read() {
    let (model, tok) = setup();
    let pool = ThreadPool::new(2);
    let first: Vec<u32> = tok.encode("the quick brown fox jumps over the lazy dog", true);
    let mut live = Sequence::new(&model, KvType::F16, 512).expect("seq");
    let g1 =
        generate(&model, &tok, &pool, &mut live, Request::new(&first, &greedy(8, 5)), &mut Quiet).expect("generate");
    assert_eq!(g1.reused_tokens, 0);
    assert_eq!(g1.tokens.len(), 8);

    // The next request extends the conversation: the live sequence holds its prefix.
    let mut second = first.clone();
    second.extend_from_slice(&g1.tokens);
    second.extend(tok.encode(" hello world", true));
    let reused =
        generate(&model, &tok, &pool, &mut live, Request::new(&second, &greedy(8, 3)), &mut Quiet).expect("generate");
    // All of the first prompt and the generated tokens that were fed back (the last one never was).
    assert_eq!(reused.reused_tokens, first.len() + g1.tokens.len() - 1);

    let mut fresh = Sequence::new(&model, KvType::F16, 512).expect("seq");
    let cold = generate(&model, &tok, &pool, &mut fresh, Request::new(&second, &greedy(8, 512)), &mut Quiet)
        .expect("generate");
    assert_eq!(cold.reused_tokens, 0);
    assert_eq!(reused.tokens, cold.tokens, "reuse and batch size must not change the output");

    // A request that diverges early keeps only the common prefix.
    let other: Vec<u32> = tok.encode("the quick red fox", true);
    let common = other.iter().zip(&live.tokens).take_while(|(a, b)| a == b).count();
    let g3 =
        generate(&model, &tok, &pool, &mut live, Request::new(&other, &greedy(4, 512)), &mut Quiet).expect("generate");
    assert_eq!(g3.reused_tokens, common.min(other.len() - 1));
}

#[test]
fn generation_stops_at_the_context_end_and_the_sequence_stays_usable() {
    let (model, tok) = setup();
    let pool = ThreadPool::new(2);
    let prompt: Vec<u32> = tok.encode("the quick brown fox", true);
    let mut seq = Sequence::new(&model, KvType::F16, prompt.len() + 3).expect("seq");
    let g =
        generate(&model, &tok, &pool, &mut seq, Request::new(&prompt, &greedy(50, 512)), &mut Quiet).expect("generate");
    assert_eq!(g.stop_reason, StopReason::Context);
    assert_eq!(g.tokens.len(), 4, "3 positions left + the token sampled from the last one");
    let again =
        generate(&model, &tok, &pool, &mut seq, Request::new(&prompt, &greedy(2, 512)), &mut Quiet).expect("usable");
    assert_eq!(again.tokens.len(), 2);
}

#[test]
fn streamed_text_equals_the_final_text() {
    let (model, tok) = setup();
    let pool = ThreadPool::new(2);
    let prompt: Vec<u32> = tok.encode("hello world", true);
    let mut seq = Sequence::new(&model, KvType::F16, 256).expect("seq");
    let mut streamed = String::new();
    let g = generate(
        &model,
        &tok,
        &pool,
        &mut seq,
        Request::new(&prompt, &greedy(20, 512)),
        &mut TextOnly(|t: &str| streamed.push_str(t)),
    )
    .expect("ok");
    assert_eq!(streamed, g.text);
    assert_eq!(g.text, tok.decode(&g.tokens));
}
