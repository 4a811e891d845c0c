//! The layer split over devices, on the default model: the same tokens on `cpu` and on 2- and 3-way `sim`
//! splits, KV residency with host spill, the plan against the ledger, pressure and allocation failures in
//! the middle of a request.

use crate::common;

use std::sync::Arc;

use strata::device::{DeviceKind, DeviceSet, Fault, Purpose};
use strata::engine::{generate, prefill, EngineError, GenerateParams, Quiet, Request, Sequence};
use strata::gguf::GgufFile;
use strata::model::{KvType, LoadOptions, Model, ModelError};
use strata::sample::SamplerConfig;
use strata::threadpool::ThreadPool;
use strata::tokenizer::Tokenizer;

const MIB: u64 = 1 << 20;

fn file() -> Arc<GgufFile> {
    Arc::new(GgufFile::open(&common::model_path()).expect("model opens"))
}

fn sims(mibs: &[u64], reserve_mib: u64) -> DeviceSet {
    let kinds: Vec<DeviceKind> = mibs.iter().map(|m| DeviceKind::Sim { capacity_bytes: m * MIB }).collect();
    DeviceSet::from_kinds(&kinds, reserve_mib * MIB).expect("sim devices")
}

fn load(file: &Arc<GgufFile>, devices: DeviceSet, split: Option<Vec<usize>>, kv_type: KvType) -> Model {
    let opts = LoadOptions { devices, split, kv_type, ..Default::default() };
    Model::from_file_with(file.clone(), &opts).expect("model loads")
}

fn greedy(n: usize) -> GenerateParams {
    GenerateParams {
        max_tokens: n,
        sampler: SamplerConfig::greedy(),
        ignore_eos: true,
        top_logprobs: 5,
        ..Default::default()
    }
}

/// Tokens of the GPL text (a long, ordinary English prompt).
fn long_prompt(tok: &Tokenizer, n: usize) -> Vec<u32> {
    let text = std::fs::read_to_string(common::reference_path("perplexity_GPL-3.txt")).expect("text");
    let ids = tok.encode(&text, false);
    assert!(ids.len() >= n, "the text has only {} tokens", ids.len());
    ids[..n].to_vec()
}

/// (tokens, bits of the top-5 log-probabilities at every step)
fn run(
    model: &Model,
    tok: &Tokenizer,
    pool: &ThreadPool,
    kv: KvType,
    prompt: &[u32],
    n: usize,
) -> (Vec<u32>, Vec<u32>) {
    let mut seq = Sequence::new(model, kv, 4096).expect("sequence");
    let g = generate(model, tok, pool, &mut seq, Request::new(prompt, &greedy(n)), &mut Quiet).expect("generate");
    let bits = g.top_logprobs.iter().flatten().flat_map(|&(id, lp)| [id, lp.to_bits()]).collect();
    (g.tokens, bits)
}

#[test]
fn the_same_greedy_tokens_on_cpu_and_on_two_and_three_way_splits() {
    let file = file();
    let tok = Tokenizer::from_gguf(&file).expect("tokenizer");
    let pool = ThreadPool::new(2);
    let prompts = common::greedy_prompts();
    for kv in [KvType::F16, KvType::Int8] {
        let cpu = load(&file, DeviceSet::cpu(), None, kv);
        let two = load(&file, sims(&[200, 400], 0), Some(vec![15]), kv);
        let three = load(&file, sims(&[100, 100, 100], 0), Some(vec![10, 20]), kv);
        assert_eq!(
            three.placement.stages.iter().map(|s| s.layers.clone()).collect::<Vec<_>>(),
            [0..10, 10..20, 20..30]
        );
        for prompt in &prompts {
            let want = run(&cpu, &tok, &pool, kv, prompt, 64);
            assert_eq!(want.0.len(), 64);
            assert_eq!(run(&two, &tok, &pool, kv, prompt, 64), want, "2-way split, {kv:?}, prompt {prompt:?}");
            assert_eq!(run(&three, &tok, &pool, kv, prompt, 64), want, "3-way split, {kv:?}, prompt {prompt:?}");
        }
        // The hidden state really crossed: one counted copy per forward pass into each later stage.
        let u = three.placement.devices.devices[2].usage();
        assert_eq!(u.copies_in, three.placement.devices.devices[1].usage().copies_in);
        assert!(u.copies_in >= 3 * 64, "copies into stage 2: {}", u.copies_in);
    }
}

#[test]
fn kv_resident_64_matches_unlimited_residency_on_a_long_prompt() {
    let file = file();
    let tok = Tokenizer::from_gguf(&file).expect("tokenizer");
    let pool = ThreadPool::new(2);
    // 600 prompt and 32 generated positions: ten pages per layer, all but the newest two or so on the host.
    let prompt = long_prompt(&tok, 600);
    let full = load(&file, DeviceSet::cpu(), None, KvType::F16);
    let opts = LoadOptions {
        devices: sims(&[200, 400], 0),
        split: Some(vec![15]),
        kv_resident: Some(64),
        ..Default::default()
    };
    let windowed = Model::from_file_with(file.clone(), &opts).expect("loads");

    let logits_and_tokens = |model: &Model| {
        let mut seq = Sequence::new(model, KvType::F16, 2048).expect("sequence");
        let (logits, _) = prefill(model, &pool, &mut seq, &prompt, 512).expect("prefill");
        let g =
            generate(model, &tok, &pool, &mut seq, Request::new(&prompt, &greedy(32)), &mut Quiet).expect("generate");
        (logits, g.tokens, seq)
    };
    let (want_logits, want_tokens, _) = logits_and_tokens(&full);
    let (logits, tokens, seq) = logits_and_tokens(&windowed);
    let max_diff = want_logits.iter().zip(&logits).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    println!("kv-resident 64 vs unlimited: max |logit difference| = {max_diff:e}");
    assert!(max_diff < 1e-3, "max abs logit difference {max_diff}");
    assert_eq!(tokens, want_tokens);

    // Each device holds only the newest pages of its 15 layers; the rest went to the host.
    let page_bytes = seq.kv.page_bytes();
    for d in &windowed.placement.devices.devices {
        let kv = d.usage().bytes(Purpose::Kv);
        assert!(kv <= 15 * 2 * page_bytes, "{}: {kv} bytes of KV resident", d.name());
        assert!(kv > 0);
    }
    // Every page of each of the 30 layers but the newest few: the whole pages less three (the window's two
    // and one for rounding).
    let old_pages = (prompt.len() as u64 + 32) / 64 - 3;
    assert!(seq.kv.spilled_bytes() >= 30 * old_pages * page_bytes, "spilled {}", seq.kv.spilled_bytes());
    assert_eq!(windowed.placement.devices.host.usage().bytes(Purpose::Kv), seq.kv.spilled_bytes());
}

#[test]
fn plan_predicts_the_ledger_after_a_2000_token_prompt() {
    let file = file();
    let tok = Tokenizer::from_gguf(&file).expect("tokenizer");
    let pool = ThreadPool::new(2);
    let opts = LoadOptions {
        devices: sims(&[200, 400], 0),
        split: Some(vec![15]),
        kv_type: KvType::Int8,
        max_context: Some(8192),
        ..Default::default()
    };
    let (_, plan) = Model::plan(&file, &opts).expect("plan");
    let model = Model::from_file_with(file.clone(), &opts).expect("loads");
    let mut seq = Sequence::new(&model, KvType::Int8, 8192).expect("sequence");
    // 2,000 positions in four batches: 32 pages per layer, over 10 MiB of KV per stage. The KV is also
    // compared on its own, so that its share of the total does not hide an error in it.
    let n = 2000;
    prefill(&model, &pool, &mut seq, &long_prompt(&tok, n), 512).expect("prefill");
    for (stage, device) in plan.iter().zip(&model.placement.devices.devices) {
        let predicted = stage.load_bytes() + stage.kv_device_bytes(n, None);
        let actual = device.usage().total_bytes;
        let err = (predicted as f64 - actual as f64).abs() / actual as f64;
        println!("{}: plan {predicted} bytes, ledger {actual} bytes ({:.3}% apart)", device.name(), err * 100.0);
        assert!(err < 0.05, "{}: plan {predicted} vs ledger {actual}", device.name());
        assert!(stage.kv_device_bytes(n, None) > 10 * MIB, "KV is counted");
        let (kv_predicted, kv_actual) = (stage.kv_device_bytes(n, None), device.usage().bytes(Purpose::Kv));
        let kv_err = (kv_predicted as f64 - kv_actual as f64).abs() / kv_actual as f64;
        assert!(kv_err < 0.05, "{}: plan KV {kv_predicted} vs ledger KV {kv_actual}", device.name());
    }
}

/// `strata plan --parallel 3` counts three live sequences: its KV figure per device is what the ledger
/// holds once three sequences have read 1,000 tokens each, and three times the one-sequence figure.
#[test]
fn the_plan_for_three_sequences_predicts_the_ledger_with_three_live() {
    let file = file();
    let tok = Tokenizer::from_gguf(&file).expect("tokenizer");
    let pool = ThreadPool::new(2);
    let opts = LoadOptions {
        devices: sims(&[200, 400], 0),
        split: Some(vec![15]),
        kv_type: KvType::Int8,
        max_context: Some(4096),
        ..Default::default()
    };
    let n = 1000;
    let one = strata::plan::plan_with_draft(&file, &opts, Some(n), 1, None).expect("plan");
    let three = strata::plan::plan_with_draft(&file, &opts, Some(n), 3, None).expect("plan");
    let model = Model::from_file_with(file.clone(), &opts).expect("loads");
    let prompt = long_prompt(&tok, n);
    let mut seqs: Vec<Sequence> =
        (0..3).map(|_| Sequence::new(&model, KvType::Int8, 4096).expect("sequence")).collect();
    for seq in &mut seqs {
        prefill(&model, &pool, seq, &prompt, 512).expect("prefill");
    }
    for ((r1, r3), device) in one.rows.iter().zip(&three.rows).zip(&model.placement.devices.devices) {
        assert_eq!(r3.kv_device_bytes, 3 * r1.kv_device_bytes, "{}", device.name());
        let kv_actual = device.usage().bytes(Purpose::Kv);
        let err = (r3.kv_device_bytes as f64 - kv_actual as f64).abs() / kv_actual as f64;
        println!("{}: plan KV {} bytes for 3 sequences, ledger {kv_actual}", device.name(), r3.kv_device_bytes);
        assert!(err < 0.05, "{}: plan KV {} vs ledger KV {kv_actual}", device.name(), r3.kv_device_bytes);
    }
}

#[test]
fn pressure_mid_prefill_spills_to_the_host_and_changes_no_bit() {
    let file = file();
    let tok = Tokenizer::from_gguf(&file).expect("tokenizer");
    let pool = ThreadPool::new(2);
    // Two batches of 512 (the second one short).
    let prompt = long_prompt(&tok, 1000);
    let cpu = load(&file, DeviceSet::cpu(), None, KvType::F16);
    let want = run(&cpu, &tok, &pool, KvType::F16, &prompt, 8);

    let reserve = 16 * MIB;
    let model = load(&file, sims(&[200, 400], 16), Some(vec![15]), KvType::F16);
    let dev1 = model.placement.devices.devices[1].clone();
    // Another process takes all but the reserve on device 1 when the prompt is half read.
    dev1.schedule(512, Fault::LeaveFreeBytes(reserve)).expect("schedule");
    let mut seq = Sequence::new(&model, KvType::F16, 4096).expect("sequence");
    let g = generate(&model, &tok, &pool, &mut seq, Request::new(&prompt, &greedy(8)), &mut Quiet)
        .expect("the request continues");
    let bits: Vec<u32> = g.top_logprobs.iter().flatten().flat_map(|&(id, lp)| [id, lp.to_bits()]).collect();
    assert_eq!((g.tokens, bits), want, "spilled KV gives the same bits");
    assert!(seq.kv.spilled_bytes() > 0, "device 1's KV went to the host");
    assert_eq!(dev1.sim_true_free().unwrap(), reserve, "device 1 sits at its reserve, not below");
    assert_eq!(dev1.usage().refused_allocations, seq.kv.spilled_pages());

    // The next request works, and still gives the same tokens.
    let mut next = Sequence::new(&model, KvType::F16, 4096).expect("sequence");
    let again = generate(&model, &tok, &pool, &mut next, Request::new(&prompt[..300], &greedy(8)), &mut Quiet)
        .expect("next request");
    assert_eq!(again.tokens, run(&cpu, &tok, &pool, KvType::F16, &prompt[..300], 8).0);
    assert!(dev1.sim_true_free().unwrap() >= reserve);
}

#[test]
fn an_allocation_failure_aborts_the_request_and_releases_its_memory() {
    let file = file();
    let tok = Tokenizer::from_gguf(&file).expect("tokenizer");
    let pool = ThreadPool::new(2);
    // Batches of 256: the failure comes with the third, the first that needs a new page past 512.
    let prompt = long_prompt(&tok, 600);
    let model = load(&file, sims(&[200, 400], 0), Some(vec![15]), KvType::F16);
    let dev1 = model.placement.devices.devices[1].clone();
    dev1.schedule(512, Fault::FailAllocs(1)).expect("schedule");
    let mut seq = Sequence::new(&model, KvType::F16, 4096).expect("sequence");
    let mut params = greedy(4);
    params.batch = 256;
    let err = generate(&model, &tok, &pool, &mut seq, Request::new(&prompt, &params), &mut Quiet)
        .expect_err("the request fails");
    let msg = err.to_string();
    assert!(matches!(err, EngineError::Model(ModelError::Device(_))), "{msg}");
    assert!(msg.contains("1 (sim:400)") && msg.contains("KV allocation"), "{msg}");
    // Everything the request held is back.
    assert_eq!(seq.tokens.len(), 0);
    assert_eq!(seq.kv.allocated_bytes(), 0);
    for d in model.placement.devices.all() {
        assert_eq!(d.usage().bytes(Purpose::Kv), 0, "{} still holds KV", d.name());
    }
    // The engine stays usable: the same request now succeeds.
    let g = generate(&model, &tok, &pool, &mut seq, Request::new(&prompt, &params), &mut Quiet).expect("next request");
    let cpu = load(&file, DeviceSet::cpu(), None, KvType::F16);
    assert_eq!(g.tokens, run(&cpu, &tok, &pool, KvType::F16, &prompt, 4).0);

    // In decode: the prompt fills 100 positions, the failure comes with the page at position 128.
    drop(seq);
    let mut seq = Sequence::new(&model, KvType::F16, 4096).expect("sequence");
    dev1.schedule(110, Fault::FailAllocs(1)).expect("schedule");
    let err = generate(&model, &tok, &pool, &mut seq, Request::new(&prompt[..100], &greedy(40)), &mut Quiet)
        .expect_err("decode fails");
    assert!(err.to_string().contains("injected fault"), "{err}");
    assert_eq!((seq.tokens.len(), seq.kv.allocated_bytes()), (0, 0), "the failed request released its KV");
    assert_eq!(dev1.usage().bytes(Purpose::Kv), 0);
    let g = generate(&model, &tok, &pool, &mut seq, Request::new(&prompt[..100], &greedy(40)), &mut Quiet)
        .expect("next request");
    assert_eq!(g.tokens, run(&cpu, &tok, &pool, KvType::F16, &prompt[..100], 40).0);
}

#[test]
fn a_model_that_does_not_fit_is_refused_before_allocating_and_unloading_returns_every_byte() {
    let file = file();
    let devices = sims(&[30, 400], 0);
    let opts = LoadOptions { devices: devices.clone(), split: Some(vec![15]), ..Default::default() };
    let err = Model::from_file_with(file.clone(), &opts).err().expect("device 0 is too small").to_string();
    assert!(err.contains("device 0 (sim:30)") && err.contains("short by"), "{err}");
    assert!(devices.all().iter().all(|d| d.usage().total_bytes == 0));

    let devices = sims(&[200, 400], 0);
    let model = load(&file, devices.clone(), Some(vec![15]), KvType::F16);
    let mut seq = Sequence::new(&model, KvType::F16, 512).expect("sequence");
    prefill(&model, &ThreadPool::new(2), &mut seq, &[1, 2, 3, 4, 5], 512).expect("prefill");
    assert!(devices.devices.iter().all(|d| d.usage().bytes(Purpose::Weights) > 0 && d.usage().bytes(Purpose::Kv) > 0));
    drop(seq);
    drop(model);
    for d in devices.all() {
        assert_eq!(d.usage().total_bytes, 0, "{} after unload", d.name());
    }
}
