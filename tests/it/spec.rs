//! Speculative decoding: greedy outputs identical with and without drafts (n-gram lookup, the default model
//! drafting for itself, the Q4_1 model drafting for its f16 copy), through the conversation cache's restores
//! and a fallback; with temperature, the token distribution of the target (chi-square on a tiny synthetic
//! model); a draft that cannot allocate falls back to plain decoding for that request.

use crate::common;

use std::sync::{Arc, Mutex};

use strata::cache::RestoreKind;
use strata::device::{Device, DeviceKind, DeviceSet, Fault};
use strata::engine::session::{Fallback, Session, SessionConfig};
use strata::engine::spec::{check_vocab, Drafter, SpecConfig, VocabMismatch};
use strata::engine::{generate, GenerateParams, Generation, Quiet, Request, Sequence};
use strata::gguf::GgufFile;
use strata::model::synthetic::SyntheticSpec;
use strata::model::{KvType, LoadOptions, Model};
use strata::sample::SamplerConfig;
use strata::threadpool::ThreadPool;
use strata::tokenizer::Tokenizer;

const MIB: u64 = 1 << 20;

fn greedy(n: usize) -> GenerateParams {
    GenerateParams { max_tokens: n, sampler: SamplerConfig::greedy(), ignore_eos: true, ..Default::default() }
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array().expect("ids").iter().map(|x| x.as_u64().expect("id") as u32).collect()
}

/// The three prompts of greedy.json, as tokens.
fn reference_prompts() -> Vec<(String, Vec<u32>)> {
    let r = common::reference_json("greedy.json");
    let results = r["results"].as_array().expect("results");
    assert_eq!(results.len(), 3);
    results.iter().map(|x| (x["name"].as_str().unwrap_or("?").to_owned(), ids(&x["prompt_tokens"]))).collect()
}

fn run(
    model: &Model,
    tok: &Tokenizer,
    pool: &ThreadPool,
    prompt: &[u32],
    params: &GenerateParams,
    drafter: Option<&mut Drafter>,
) -> Generation {
    let mut seq = Sequence::new(model, KvType::F16, 2048).expect("sequence");
    generate(model, tok, pool, &mut seq, Request::new(prompt, params).drafting(drafter), &mut Quiet).expect("generate")
}

#[test]
fn greedy_tokens_are_identical_with_ngram_and_self_drafting() {
    let path = common::model_path();
    let model = Model::load(&path).expect("model");
    let draft = Model::load(&path).expect("draft");
    let tok = Tokenizer::from_gguf(&model.file).expect("tokenizer");
    let pool = ThreadPool::new(2);
    let (mut ngram_kept, mut self_proposed) = (0, 0);
    for (name, prompt) in reference_prompts() {
        // Stop strings and end-of-generation tokens inside an accepted run of drafts end the reply there,
        // as without drafts: greedy.json's "greedy" (EOS allowed) and "greedy_ignore_eos".
        for params in [GenerateParams { ignore_eos: false, ..greedy(40) }, greedy(40)] {
            let plain = run(&model, &tok, &pool, &prompt, &params, None);
            let mut ngram = Drafter::ngram(SpecConfig::default());
            let with_ngram = run(&model, &tok, &pool, &prompt, &params, Some(&mut ngram));
            assert_eq!(with_ngram.tokens, plain.tokens, "{name}: --spec ngram");
            assert_eq!(with_ngram.text, plain.text, "{name}: --spec ngram text");
            assert_eq!(with_ngram.stop_reason, plain.stop_reason, "{name}");
            ngram_kept += with_ngram.drafts_accepted;

            let mut own =
                Drafter::model(SpecConfig::default(), &draft, KvType::F16, 2048, model.cfg.n_vocab).expect("drafter");
            let with_self = run(&model, &tok, &pool, &prompt, &params, Some(&mut own));
            assert_eq!(with_self.tokens, plain.tokens, "{name}: the model drafting for itself");
            // The same weights give the same argmax in a batch of 1 and in the verification batch (the
            // forward pass is batch-invariant): every draft is kept.
            assert_eq!(with_self.drafts_accepted, with_self.drafts_proposed, "{name}: self-drafts all kept");
            self_proposed += with_self.drafts_proposed;
        }
    }
    // A repetitive task (copy a code block with one change), where lookup finds what the reply copies: the
    // kept-draft path runs whatever the three prompts above happen to continue with.
    let rewrite = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/benches/prompts/rewrite-code.txt"))
        .expect("benches/prompts/rewrite-code.txt");
    let prompt = tok.encode(&rewrite, true);
    let params = greedy(60);
    let plain = run(&model, &tok, &pool, &prompt, &params, None);
    let mut ngram = Drafter::ngram(SpecConfig::default());
    let with_ngram = run(&model, &tok, &pool, &prompt, &params, Some(&mut ngram));
    assert_eq!(with_ngram.tokens, plain.tokens, "rewrite: --spec ngram");
    ngram_kept += with_ngram.drafts_accepted;
    assert!(ngram_kept > 0, "n-gram lookup kept no draft on any prompt: the path was not exercised");
    assert!(self_proposed > 40, "the draft model proposed only {self_proposed} drafts");
}

#[test]
fn q4_1_drafting_for_its_f16_copy_gives_the_f16_tokens() {
    let path = common::model_path();
    let dir = tempfile::tempdir().expect("tempdir");
    let f16 = dir.path().join("f16.gguf");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["quantize"])
        .arg(&path)
        .arg(&f16)
        .args(["--type", "f16"])
        .output()
        .expect("strata quantize runs");
    assert!(out.status.success(), "quantize: {}", String::from_utf8_lossy(&out.stderr));
    let target = Model::load(&f16).expect("the f16 copy loads");
    let draft = Model::load(&path).expect("draft");
    let tok = Tokenizer::from_gguf(&target.file).expect("tokenizer");
    check_vocab(&tok, &Tokenizer::from_gguf(&draft.file).expect("draft tokenizer")).expect("the same vocabulary");
    let pool = ThreadPool::new(2);
    let mut kept = 0;
    for (name, prompt) in reference_prompts() {
        let plain = run(&target, &tok, &pool, &prompt, &greedy(24), None);
        let mut d =
            Drafter::model(SpecConfig::default(), &draft, KvType::F16, 2048, target.cfg.n_vocab).expect("drafter");
        let spec = run(&target, &tok, &pool, &prompt, &greedy(24), Some(&mut d));
        assert_eq!(spec.tokens, plain.tokens, "{name}: Q4_1 drafting for f16");
        assert!(spec.drafts_accepted <= spec.drafts_proposed);
        kept += spec.drafts_accepted;
    }
    assert!(kept > 0, "the Q4_1 draft had no draft accepted by its f16 copy");
}

#[test]
fn a_different_vocabulary_is_refused_naming_the_first_differing_token() {
    let a = GgufFile::from_bytes(SyntheticSpec::default().to_gguf()).expect("a");
    let spm = SyntheticSpec { vocab: strata::model::synthetic::SyntheticVocab::Spm, ..Default::default() };
    let b = GgufFile::from_bytes(spm.to_gguf()).expect("b");
    let (ta, tb) = (Tokenizer::from_gguf(&a).expect("a"), Tokenizer::from_gguf(&b).expect("b"));
    check_vocab(&ta, &ta).expect("a vocabulary matches itself");
    let err = check_vocab(&ta, &tb).expect_err("BPE and SentencePiece vocabularies differ");
    let text = err.to_string();
    match err {
        VocabMismatch::Token { id, .. } => assert!(text.contains(&format!("token {id}")), "{text}"),
        VocabMismatch::Size { .. } | VocabMismatch::Special { .. } => assert!(text.contains("differ"), "{text}"),
    }
}

/// Four turns over two conversations on a 2-way sim split: a parks b, a live restore, then memory pressure
/// on device 0 (where the draft lives) making the gate refuse b's restore (a reread).
fn replay_turns(session: &mut Session, tok: &Tokenizer, device0: &Arc<Device>) -> Vec<strata::engine::session::Served> {
    let text = std::fs::read_to_string(common::reference_path("perplexity_GPL-3.txt")).expect("text");
    let long = tok.encode(&text, false);
    let a1: Vec<u32> = long[..160].to_vec();
    let b1: Vec<u32> = long[400..520].to_vec();
    let params = greedy(24);
    let mut served = Vec::new();
    let s = session.serve(&a1, &params, &mut Quiet).expect("a1");
    let mut a2 = a1.clone();
    a2.extend(&s.generation.tokens);
    a2.extend(&long[160..200]);
    served.push(s);
    let s = session.serve(&b1, &params, &mut Quiet).expect("b1");
    let mut b2 = b1.clone();
    b2.extend(&s.generation.tokens);
    b2.extend(&long[520..560]);
    served.push(s);
    served.push(session.serve(&a2, &params, &mut Quiet).expect("a2: restored"));
    device0.inject(Fault::LeaveFreeBytes(MIB)).expect("pressure");
    served.push(session.serve(&b2, &params, &mut Quiet).expect("b2: reread"));
    device0.inject(Fault::PressureBytes(0)).expect("pressure ends");
    served
}

fn sim_split() -> LoadOptions {
    let kinds = [DeviceKind::Sim { capacity_bytes: 300 * MIB }, DeviceKind::Sim { capacity_bytes: 400 * MIB }];
    let devices = DeviceSet::from_kinds(&kinds, 16 * MIB).expect("sims");
    LoadOptions { devices, split: Some(vec![15]), ..Default::default() }
}

#[test]
fn drafts_change_no_token_through_cache_restores_and_a_fallback() {
    let file = Arc::new(GgufFile::open(&common::model_path()).expect("model"));
    let tok = Tokenizer::from_gguf(&file).expect("tokenizer");
    let pool = ThreadPool::new(2);
    let cfg = SessionConfig { kv_type: KvType::F16, max_context: 2048, cache_slots: 4, cache_budget_bytes: 512 * MIB };

    let plain_opts = sim_split();
    let plain_model = Model::from_file_with(file.clone(), &plain_opts).expect("model");
    let mut plain = Session::new(&plain_model, &tok, &pool, &cfg).expect("session");
    let want = replay_turns(&mut plain, &tok, &plain_opts.devices.devices[0]);

    for spec in ["ngram", "draft"] {
        let opts = sim_split();
        let model = Model::from_file_with(file.clone(), &opts).expect("model");
        // The draft model on the target's first device (the default of --draft-devices), same ledgers.
        let draft_devices =
            DeviceSet { devices: vec![opts.devices.devices[0].clone()], host: opts.devices.host.clone() };
        let draft = Model::from_file_with(file.clone(), &LoadOptions { devices: draft_devices, ..Default::default() })
            .expect("draft model");
        let drafter = match spec {
            "ngram" => Drafter::ngram(SpecConfig::default()),
            _ => Drafter::model(SpecConfig::default(), &draft, KvType::F16, cfg.max_context, model.cfg.n_vocab)
                .expect("drafter"),
        };
        let mut session = Session::new(&model, &tok, &pool, &cfg).expect("session").with_drafter(drafter);
        let got = replay_turns(&mut session, &tok, &opts.devices.devices[0]);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.generation.tokens, w.generation.tokens, "{spec}: turn {i}");
            assert_eq!((g.reused, g.read), (w.reused, w.read), "{spec}: turn {i} reused/read");
        }
        assert!(matches!(got[2].restored, Some((RestoreKind::Live, _))), "{spec}: a2 restored: {:?}", got[2].restored);
        let (
            Some(Fallback::Gate { device: 0, need_bytes, tokens, .. }),
            Some(Fallback::Gate { need_bytes: plain_need, .. }),
        ) = (&got[3].fallback, &want[3].fallback)
        else {
            panic!("{spec}: b2 falls back at device 0's gate: {:?} / {:?}", got[3].fallback, want[3].fallback);
        };
        let proposed: usize = got.iter().map(|s| s.generation.drafts_proposed).sum();
        assert!(proposed > 0, "{spec}: no draft proposed");
        if spec == "draft" {
            // The gate counts the draft's KV with the target's: its pages on device 0 for the snapshot's tokens.
            let draft_kv = draft.new_kv(KvType::F16, cfg.max_context).expect("kv");
            let draft_need: u64 =
                draft_kv.device_need_bytes(*tokens).iter().filter(|(d, _)| d.index == 0).map(|(_, b)| b).sum();
            assert!(draft_need > 0);
            assert_eq!(
                *need_bytes,
                plain_need + draft_need,
                "the gate's need on device 0 is the target's plus the draft's"
            );
            // The restore brought the draft's KV back with the target's: the draft read about what the target
            // read (its sequence may lag the target's by the last step's tokens), not the whole prompt.
            let (read, draft_read) = (got[2].read, got[2].draft_read.expect("the draft read the prompt"));
            assert!(draft_read >= read && draft_read <= read + 17, "draft read {draft_read}, target read {read}");
        } else {
            assert_eq!(need_bytes, plain_need, "n-gram lookup adds nothing to the gate");
        }
    }
}

#[test]
fn a_draft_that_cannot_allocate_falls_back_to_plain_decoding_for_that_request() {
    let path = common::model_path();
    let model = Model::load(&path).expect("target on the cpu");
    let file = model.file.clone();
    let tok = Tokenizer::from_gguf(&file).expect("tokenizer");
    let pool = ThreadPool::new(2);
    let sim = Device::sim(1, 400 * MIB, 0);
    let draft_devices = DeviceSet { devices: vec![sim.clone()], host: model.placement.devices.host.clone() };
    let draft =
        Model::from_file_with(file, &LoadOptions { devices: draft_devices, ..Default::default() }).expect("draft");
    let prompt = reference_prompts().remove(0).1;
    let plain = run(&model, &tok, &pool, &prompt, &greedy(24), None);

    let mut d = Drafter::model(SpecConfig::default(), &draft, KvType::F16, 2048, model.cfg.n_vocab).expect("drafter");
    let mut seq = Sequence::new(&model, KvType::F16, 2048).expect("sequence");
    sim.inject(Fault::FailAllocs(1)).expect("fault");
    let logs = Arc::new(Mutex::new(Vec::<u8>::new()));
    let writer = {
        let logs = logs.clone();
        move || LogWriter(logs.clone())
    };
    let subscriber = tracing_subscriber::fmt().with_writer(writer).with_ansi(false).finish();
    let failed = tracing::subscriber::with_default(subscriber, || {
        generate(&model, &tok, &pool, &mut seq, Request::new(&prompt, &greedy(24)).drafting(Some(&mut d)), &mut Quiet)
    })
    .expect("the request goes on without drafts");
    let logs = String::from_utf8(logs.lock().unwrap().clone()).unwrap();
    assert_eq!(failed.tokens, plain.tokens, "the same tokens as plain decoding");
    assert_eq!(failed.drafts_proposed, 0, "no drafts after the draft failed");
    assert!(
        logs.contains("speculative decoding: the draft failed, plain decoding for the rest of this request"),
        "{logs}"
    );
    assert!(logs.contains("out of memory") || logs.contains("fail"), "the log line says why: {logs}");
    assert_eq!(d.draft_seq().map(|s| s.kv.allocated_bytes()), Some(0), "the draft's pages were released");

    // The next request drafts again.
    let mut seq = Sequence::new(&model, KvType::F16, 2048).expect("sequence");
    let next =
        generate(&model, &tok, &pool, &mut seq, Request::new(&prompt, &greedy(24)).drafting(Some(&mut d)), &mut Quiet)
            .expect("next request");
    assert_eq!(next.tokens, plain.tokens);
    assert!(next.drafts_proposed > 0, "drafting resumed on the next request");
}

struct LogWriter(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Counts of each (t1, t2, t3) continuation over `n` seeds.
fn joint_counts(
    model: &Model,
    tok: &Tokenizer,
    pool: &ThreadPool,
    prompt: &[u32],
    n: u64,
    mut drafter: Option<&mut Drafter>,
) -> std::collections::BTreeMap<Vec<u32>, u64> {
    let mut counts = std::collections::BTreeMap::new();
    let mut seq = Sequence::new(model, KvType::F16, 256).expect("sequence");
    for seed in 0..n {
        let sampler =
            SamplerConfig { temperature: 1.0, top_k: 3, top_p: 1.0, min_p: 0.0, seed, ..SamplerConfig::greedy() };
        let params = GenerateParams { max_tokens: 3, sampler, ignore_eos: true, ..Default::default() };
        let g = generate(
            model,
            tok,
            pool,
            &mut seq,
            Request::new(prompt, &params).drafting(drafter.as_deref_mut()),
            &mut Quiet,
        )
        .expect("generate");
        *counts.entry(g.tokens).or_insert(0) += 1;
    }
    counts
}

/// Pearson's chi-square statistic of two samples' homogeneity, and its degrees of freedom.
fn chi_square(
    a: &std::collections::BTreeMap<Vec<u32>, u64>,
    b: &std::collections::BTreeMap<Vec<u32>, u64>,
) -> (f64, usize) {
    let (na, nb) = (a.values().sum::<u64>() as f64, b.values().sum::<u64>() as f64);
    let keys: std::collections::BTreeSet<&Vec<u32>> = a.keys().chain(b.keys()).collect();
    let mut stat = 0.0;
    for k in &keys {
        let (x, y) = (*a.get(*k).unwrap_or(&0) as f64, *b.get(*k).unwrap_or(&0) as f64);
        let total = x + y;
        let (ea, eb) = (total * na / (na + nb), total * nb / (na + nb));
        stat += (x - ea).powi(2) / ea + (y - eb).powi(2) / eb;
    }
    (stat, keys.len() - 1)
}

/// The chi-square value a statistic with `df` degrees of freedom exceeds with probability 0.001
/// (Wilson-Hilferty).
fn critical_0_001(df: usize) -> f64 {
    let k = df as f64;
    let z = 3.090_2;
    k * (1.0 - 2.0 / (9.0 * k) + z * (2.0 / (9.0 * k)).sqrt()).powi(3)
}

#[test]
fn with_temperature_drafts_keep_the_target_distribution() {
    let spec = SyntheticSpec { n_layer: 2, n_embd: 64, n_head: 2, n_head_kv: 1, n_ff: 128, ..Default::default() };
    let target_file = Arc::new(GgufFile::from_bytes(spec.to_gguf()).expect("target"));
    let draft_file = Arc::new(GgufFile::from_bytes(SyntheticSpec { seed: 7, ..spec }.to_gguf()).expect("draft"));
    let target = Model::from_file(target_file.clone()).expect("target");
    let draft = Model::from_file(draft_file.clone()).expect("draft");
    let tok = Tokenizer::from_gguf(&target_file).expect("tokenizer");
    check_vocab(&tok, &Tokenizer::from_gguf(&draft_file).expect("draft tokenizer")).expect("same vocabulary");
    let pool = ThreadPool::new(1);
    // A repetitive prompt, so that n-gram lookup drafts too.
    let prompt = tok.encode("the sea is calm. the sea is calm. the sea is", false);
    const N: u64 = 3000;
    let plain = joint_counts(&target, &tok, &pool, &prompt, N, None);
    // p_min 0: the draft always drafts, so that rejections and residual draws happen often.
    let cfg = SpecConfig { draft_max: 2, draft_min: 1, p_min: 0.0 };
    let mut d = Drafter::model(cfg.clone(), &draft, KvType::F16, 256, target.cfg.n_vocab).expect("drafter");
    let drafted = joint_counts(&target, &tok, &pool, &prompt, N, Some(&mut d));
    let mut ng = Drafter::ngram(cfg);
    let looked_up = joint_counts(&target, &tok, &pool, &prompt, N, Some(&mut ng));
    // The draft model alone: a different distribution the test must tell apart (its power).
    let own = joint_counts(&draft, &tok, &pool, &prompt, N, None);

    let (stat, df) = chi_square(&plain, &drafted);
    assert!(stat < critical_0_001(df), "draft model: chi-square {stat:.1} with {df} df >= {:.1}", critical_0_001(df));
    let (stat, df) = chi_square(&plain, &looked_up);
    assert!(stat < critical_0_001(df), "ngram: chi-square {stat:.1} with {df} df >= {:.1}", critical_0_001(df));
    let (stat, df) = chi_square(&plain, &own);
    assert!(
        stat > critical_0_001(df),
        "the test cannot tell the draft's distribution from the target's ({stat:.1}, {df} df)"
    );
}
