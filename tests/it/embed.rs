//! Embeddings (`Model::embed`, `Session::embed`): the pooled, normalized output-normed hidden state, checked
//! against the float64 reference pass on the default model for each pooling; the same bits however the
//! input is chunked; the pooling read from the file's `pooling_type`; refusals named.

use std::sync::Arc;

use strata::device::{DeviceKind, DeviceSet};
use strata::engine::session::{Session, SessionConfig};
use strata::gguf::{GgufFile, GgufValue, GgufWriter};
use strata::model::synthetic::SyntheticSpec;
use strata::model::{KvType, LoadOptions, Model, ModelError, Pooling};
use strata::threadpool::ThreadPool;
use strata::tokenizer::Tokenizer;

use crate::common;

/// The reference embedding: the float64 output-normed states pooled as `pooling` says, then normalized.
fn reference(model: &Model, tokens: &[u32], pooling: Pooling) -> Vec<f64> {
    let rows = common::reference_hidden(model, tokens);
    let picked: Vec<&Vec<f64>> = match pooling {
        Pooling::Mean => rows.iter().collect(),
        Pooling::Cls => vec![&rows[0]],
        Pooling::Last => vec![rows.last().expect("tokens")],
        Pooling::None | Pooling::Unsupported(_) => unreachable!("no single vector"),
    };
    let mut v = vec![0f64; model.cfg.n_embd];
    for r in &picked {
        v.iter_mut().zip(r.iter()).for_each(|(a, b)| *a += b / picked.len() as f64);
    }
    let norm = v.iter().map(|x| x * x).sum::<f64>().sqrt();
    v.iter().map(|x| x / norm).collect()
}

fn cosine(a: &[f32], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * y).sum();
    let na = a.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    let nb = b.iter().map(|x| x * x).sum::<f64>().sqrt();
    dot / (na * nb)
}

fn default_model(batch: usize) -> Model {
    Model::load_with(&common::model_path(), &LoadOptions { batch, ..LoadOptions::default() }).expect("model")
}

#[test]
fn each_pooling_matches_the_reference_pass_and_gives_a_unit_vector() {
    let mut model = default_model(512);
    let tok = Tokenizer::from_gguf(&model.file).expect("tokenizer");
    let pool = ThreadPool::new(2);
    let tokens = tok.encode_with_bos("The quick brown fox jumps over the lazy dog near the river bank.", false);
    assert!(tokens.len() >= 10, "{tokens:?}");
    assert_eq!(model.cfg.pooling, Pooling::Mean, "the default model names no pooling: mean");
    let mut seen = Vec::new();
    for pooling in [Pooling::Mean, Pooling::Cls, Pooling::Last] {
        model.cfg.pooling = pooling;
        let mut kv = model.new_kv(KvType::F16, 256).expect("kv");
        let v = model.embed(&pool, &mut kv, &tokens).expect("embeds");
        assert_eq!(v.len(), model.cfg.n_embd);
        assert!(kv.is_empty() && kv.allocated_bytes() == 0, "the cache is left empty, its pages freed");
        let norm = v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "{pooling:?}: norm {norm}");
        let c = cosine(&v, &reference(&model, &tokens, pooling));
        eprintln!("{pooling:?}: cosine to the float64 reference {c:.6}");
        assert!(c > 0.999, "{pooling:?}: cosine to the reference {c}");
        seen.push(v);
    }
    // The three poolings are three different vectors (a pooling that ignored its kind would repeat one).
    assert!(seen[0] != seen[1] && seen[1] != seen[2] && seen[0] != seen[2]);
    // None: every token's state as it is, each close to its float64 reference row, not normalized.
    model.cfg.pooling = Pooling::None;
    let mut kv = model.new_kv(KvType::F16, 256).expect("kv");
    let rows = model.embed(&pool, &mut kv, &tokens).expect("embeds");
    let d = model.cfg.n_embd;
    assert_eq!(rows.len(), tokens.len() * d, "one vector per token");
    let want = common::reference_hidden(&model, &tokens);
    // Per token the int8 activations' error is not averaged away as in the mean: a looser bound than above.
    let mut worst = 1f64;
    for (i, (row, r)) in rows.chunks_exact(d).zip(&want).enumerate() {
        let c = cosine(row, r);
        worst = worst.min(c);
        assert!(c > 0.995, "token {i}: cosine to the reference {c}");
        let norm = row.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
        let want_norm = r.iter().map(|x| x * x).sum::<f64>().sqrt();
        assert!((norm / want_norm - 1.0).abs() < 1e-2, "token {i}: norm {norm}, the reference's {want_norm}");
    }
    eprintln!("None: the worst token's cosine to the float64 reference {worst:.6}");
}

#[test]
fn an_embedding_has_the_same_bits_whatever_the_batch_and_beside_live_sequences() {
    let tokens: Vec<u32> = common::tokens(300, 49152, 7);
    let pool = ThreadPool::new(2);
    let whole = {
        let model = default_model(512);
        let mut kv = model.new_kv(KvType::F16, 512).expect("kv");
        model.embed(&pool, &mut kv, &tokens).expect("embeds")
    };
    let model = default_model(64);
    let mut kv = model.new_kv(KvType::F16, 512).expect("kv");
    let chunked = model.embed(&pool, &mut kv, &tokens).expect("embeds");
    assert_eq!(common::bits(&whole), common::bits(&chunked), "batch 512 vs chunks of 64");
    // Through a session holding a conversation: its live sequence is untouched, the vectors the same.
    let tok = Tokenizer::from_gguf(&model.file).expect("tokenizer");
    let cfg = SessionConfig { kv_type: KvType::F16, max_context: 512, cache_slots: 2, cache_budget_bytes: 64 << 20 };
    let mut session = Session::new(&model, &tok, &pool, &cfg).expect("session");
    let params = strata::engine::GenerateParams { max_tokens: 4, ..Default::default() };
    session.serve(&tokens[..20], &params, &mut strata::engine::Quiet).expect("serves");
    let live = session.live_tokens().to_vec();
    let out = session.embed(&[tokens.clone(), tokens[..5].to_vec()], || false).expect("embeds");
    assert_eq!(common::bits(&out[0]), common::bits(&whole));
    assert_eq!(out[1].len(), model.cfg.n_embd);
    assert_eq!(session.live_tokens(), &live[..], "the live sequence keeps its tokens");
    // A client gone: the work stops before the next input.
    let mut asked = 0;
    let stopped = session.embed(&[tokens[..5].to_vec(), tokens[..6].to_vec()], || {
        asked += 1;
        asked > 1
    });
    assert!(matches!(stopped, Err(strata::engine::EngineError::Cancelled)), "{stopped:?}");
}

#[test]
fn the_pooling_comes_from_the_file_and_refusals_name_why() {
    let base = GgufFile::from_bytes(SyntheticSpec::default().to_gguf()).expect("parses");
    let with = |n: Option<u32>| {
        let mut w = GgufWriter::from_file(&base);
        if let Some(n) = n {
            w.set("llama.pooling_type", GgufValue::U32(n));
        }
        Model::from_file(Arc::new(GgufFile::from_bytes(w.to_bytes(3)).expect("parses"))).expect("loads")
    };
    let cases = [(None, Pooling::Mean), (Some(0), Pooling::Mean), (Some(1), Pooling::Mean)];
    let cases = cases.into_iter().chain([
        (Some(2), Pooling::Cls),
        (Some(3), Pooling::Last),
        (Some(4), Pooling::Unsupported(4)),
    ]);
    let pool = ThreadPool::new(1);
    for (key, pooling) in cases {
        let model = with(key);
        assert_eq!(model.cfg.pooling, pooling, "pooling_type {key:?}");
        let mut kv = model.new_kv(KvType::F16, 64).expect("kv");
        let got = model.embed(&pool, &mut kv, &[1, 2, 3]);
        match pooling {
            Pooling::Unsupported(_) => {
                let e = got.expect_err("a reranker makes no embedding").to_string();
                assert!(e.contains("pooling_type is 4 (rank)"), "{e}");
            }
            _ => assert_eq!(got.expect("embeds").len(), model.cfg.n_embd),
        }
    }
    // Split over two sim devices: the same bits as on the CPU alone.
    let file = Arc::new(GgufFile::from_bytes(SyntheticSpec::default().to_gguf()).expect("parses"));
    let kinds = [DeviceKind::Sim { capacity_bytes: 256 << 20 }, DeviceKind::Sim { capacity_bytes: 256 << 20 }];
    let devices = DeviceSet::from_kinds(&kinds, 0).expect("sims");
    let split =
        Model::from_file_with(file.clone(), &LoadOptions { devices, split: Some(vec![1]), ..Default::default() })
            .expect("split model");
    let alone = Model::from_file(file).expect("model");
    let tokens = common::tokens(40, alone.cfg.n_vocab, 3);
    let on = |m: &Model| m.embed(&pool, &mut m.new_kv(KvType::F16, 64).expect("kv"), &tokens).expect("embeds");
    assert_eq!(common::bits(&on(&split)), common::bits(&on(&alone)), "split over sims vs the CPU");

    let model = with(None);
    let mut kv = model.new_kv(KvType::F16, 4).expect("kv");
    assert!(matches!(model.embed(&pool, &mut kv, &[]), Err(ModelError::NoEmbedding(_))));
    let long = model.embed(&pool, &mut kv, &[1; 5]);
    assert!(matches!(long, Err(ModelError::ContextOverflow { needed: 5, max: 4 })), "{long:?}");
    assert!(kv.is_empty() && kv.allocated_bytes() == 0, "a refused input leaves nothing behind");
}
