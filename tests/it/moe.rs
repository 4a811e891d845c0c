//! Mixtures of experts on quantized weights (`strata synth`'s Mixtral layout, small): every format's
//! experts give each position the same bits whether the prompt is read at once, in chunks or token by token
//! (the decode path runs the picked experts' gate and up in one product call, a batch runs expert by
//! expert), on one thread or two. (The math against llama.cpp and a float64 pass: the f32 fixtures in
//! tests/it/families.rs.)

use std::sync::Arc;

use strata::cache::RestoreKind;
use strata::device::{Device, DeviceSet, Fault};
use strata::engine::session::{Session, SessionConfig};
use strata::engine::{generate, GenerateParams, Quiet, Request, Sequence};
use strata::gguf::GgufFile;
use strata::model::kv::KV_PAGE_TOKENS;
use strata::model::synthetic::SyntheticSpec;
use strata::model::{ExpertsPlacement, KvType, LoadOptions, Model};
use strata::quant::GgmlType;
use strata::sample::SamplerConfig;
use strata::threadpool::ThreadPool;
use strata::tokenizer::Tokenizer;

use crate::common;

fn spec(ty: GgmlType) -> SyntheticSpec {
    SyntheticSpec { n_embd: 256, n_ff: 256, experts: Some((8, 2)), matrix_types: vec![ty], ..SyntheticSpec::default() }
}

fn build(spec: &SyntheticSpec) -> Model {
    let file = GgufFile::from_bytes(spec.to_gguf()).expect("synthetic GGUF parses");
    Model::from_file(Arc::new(file)).expect("synthetic mixture of experts loads")
}

#[test]
fn quantized_experts_are_bit_identical_across_batches_and_threads() {
    let (pool, pool1) = (ThreadPool::new(2), ThreadPool::new(1));
    for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::Q4K, GgmlType::Q6K, GgmlType::F16] {
        let model = build(&spec(ty));
        let m = model.cfg.moe.expect("experts");
        assert_eq!((m.n_expert, m.n_used, m.n_ff_exp), (8, 2, 256));
        let toks = common::tokens(40, model.cfg.n_vocab, 11);
        let bits = |pool: &ThreadPool, batch: usize| -> Vec<u32> {
            common::logits_in_batches(&model, pool, KvType::F16, &toks, batch).iter().map(|x| x.to_bits()).collect()
        };
        let whole = bits(&pool, 40);
        for batch in [1, 3, 16] {
            assert!(bits(&pool, batch) == whole, "{ty}: batches of {batch}");
        }
        assert!(bits(&pool1, 1) == whole, "{ty}: one thread, token by token");
    }
}

/// The restore gate on a split where device 1 holds no experts (`--experts cpu:2..4`): the same two
/// conversations and the same memory taken by another process on device 1, on the same two sim cards.
/// With device 1 holding its layers' experts the parked conversation cannot come back above the reserve,
/// so it is reread; with those experts in host memory the same restore fits and is admitted. Both runs
/// give the replies a fresh sequence gives (the experts compute on the CPU either way).
#[test]
fn the_restore_gate_counts_the_experts_device_1_does_not_hold() {
    let file =
        Arc::new(GgufFile::from_bytes(SyntheticSpec { n_layer: 4, ..spec(GgmlType::Q4_0) }.to_gguf()).expect("parses"));
    let tok = Tokenizer::from_gguf(&file).expect("tokenizer");
    let pool = ThreadPool::new(2);
    let mib = 1u64 << 20;
    let reserve = 4 * mib;
    let cfg = SessionConfig { kv_type: KvType::F16, max_context: 1024, cache_slots: 4, cache_budget_bytes: 64 * mib };
    let greedy = GenerateParams { max_tokens: 4, sampler: SamplerConfig::greedy(), ..GenerateParams::default() };
    let on_device = |experts: ExpertsPlacement| -> (Model, Arc<Device>) {
        let devices =
            DeviceSet::from_devices(vec![Device::sim(0, 256 * mib, reserve), Device::sim(1, 256 * mib, reserve)]);
        let d1 = devices.devices[1].clone();
        let opts = LoadOptions { devices, split: Some(vec![2]), experts, ..Default::default() };
        (Model::from_file_with(file.clone(), &opts).expect("loads"), d1)
    };
    let (with_experts, _) = on_device(ExpertsPlacement::Gpu);
    let experts_bytes: u64 = with_experts.placement.stages[1].experts_bytes;
    assert!(experts_bytes > mib, "device 1's experts: {experts_bytes} B");
    let n_vocab = with_experts.cfg.n_vocab;
    let a: Vec<u32> = common::tokens(200, n_vocab, 1);
    let b: Vec<u32> = common::tokens(40, n_vocab, 2);
    drop(with_experts);
    let mut pressure = None;
    for (experts, restores) in [(ExpertsPlacement::Gpu, false), (ExpertsPlacement::parse("cpu:2..4").unwrap(), true)] {
        let (model, d1) = on_device(experts.clone());
        let mut session = Session::new(&model, &tok, &pool, &cfg).expect("session");
        let reply = session.serve(&a, &greedy, &mut Quiet).expect("a").generation.tokens;
        session.serve(&b, &greedy, &mut Quiet).expect("b");
        // Another process takes device 1's memory down to what restoring a needs above the reserve, less
        // half of the experts (set on the run where device 1 holds them; the same bytes on the other run).
        let page = Sequence::new(&model, KvType::F16, 1024).expect("sequence").kv.page_bytes();
        let pages = |tokens: usize| tokens.div_ceil(KV_PAGE_TOKENS) as u64 * 2 * page;
        let need = pages(a.len() + reply.len());
        let free = d1.sample_free().expect("sample") + pages(b.len() + 4);
        let p = *pressure.get_or_insert(free - (need + reserve) + experts_bytes / 2);
        d1.inject(Fault::PressureBytes(p)).expect("pressure");
        let mut a2 = a.clone();
        a2.extend_from_slice(&reply);
        a2.extend(common::tokens(5, n_vocab, 3));
        let served = session.serve(&a2, &greedy, &mut Quiet).expect("a again");
        let case = format!("--experts {}", experts.spec());
        assert_eq!(served.restored.map(|r| r.0) == Some(RestoreKind::Live), restores, "{case}: {:?}", served.restored);
        let (_, events) = session.telemetry.since(0.0);
        assert_eq!(events.iter().any(|e| e.event == "restore_fallback"), !restores, "{case}");
        let mut fresh = Sequence::new(&model, KvType::F16, 1024).expect("sequence");
        let want = generate(&model, &tok, &pool, &mut fresh, Request::new(&a2, &greedy), &mut Quiet).expect("fresh");
        assert_eq!(served.generation.tokens, want.tokens, "{case}: the reply");
    }
}

#[test]
fn the_facts_say_mixture_of_experts_only_for_a_model_that_has_experts() {
    use strata::plan::facts::ModelFacts;
    let path = std::path::Path::new("x.gguf");
    let moe = GgufFile::from_bytes(spec(GgmlType::Q4_0).to_gguf()).unwrap();
    let f = ModelFacts::of(&moe, path).expect("facts").features;
    assert!(f.contains("mixture of experts (8 experts, 2 used per token)"), "{f}");
    let dense = GgufFile::open(&common::model_path()).expect("the default model");
    let f = ModelFacts::of(&dense, path).expect("facts").features;
    assert!(f.starts_with("SwiGLU, RoPE") && !f.contains("experts"), "{f}");
}
