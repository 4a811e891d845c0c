//! Properties of the conversation cache and the restore gate over random workloads, on a tiny synthetic
//! model: random interleavings of turns over 1 to 5 conversations, pressure changes, failed samples and
//! failed allocations, on 1 to 3 sim devices, with random slots, budget and reserve:
//! - no panic; a turn either answers or fails with a device allocation error (or a full context);
//! - every answer is identical to a fresh, cache-less run of the same prompt on the cpu;
//! - parked bytes stay within the budget and parked snapshots within the slots;
//! - device allocations never exceed capacity;
//! - no snapshot is lost except by a counted eviction (parked = restored whole + evicted + still parked; a
//!   checkpoint restore leaves its snapshot in the cache);
//! - every byte is back once the session and the model are dropped.
//!
//! 2,000 cases per CI run. A longer soak: `STRATA_SOAK_CASES=50000 cargo test --release --test it -- cache_props::`.

use std::collections::HashMap;
use std::sync::Arc;

use proptest::prelude::*;

use strata::device::{Device, DeviceError, DeviceSet, Fault};
use strata::engine::session::{Session, SessionConfig};
use strata::engine::{generate, EngineError, GenerateParams, Quiet, Request, Sequence};
use strata::gguf::GgufFile;
use strata::model::kv::KV_PAGE_TOKENS;
use strata::model::synthetic::SyntheticSpec;
use strata::model::{KvType, LoadOptions, Model, ModelError};
use strata::sample::SamplerConfig;
use strata::telemetry::Entry;
use strata::threadpool::ThreadPool;
use strata::tokenizer::Tokenizer;

const N_LAYER: usize = 3;
const MAX_CONTEXT: usize = 384;

#[derive(Clone, Debug)]
enum Op {
    Turn { conv: usize, user: usize, max_tokens: usize },
    Pressure(usize, u64),
    LeaveFree(usize, u64),
    FailSamples(usize, u32),
    FailAllocs(usize, u32),
}

fn op(n_conv: usize) -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0..n_conv, 1usize..48, 1usize..5).prop_map(|(conv, user, max_tokens)| Op::Turn { conv, user, max_tokens }),
        1 => (0usize..3, 0u64..12).prop_map(|(d, p)| Op::Pressure(d, p)),
        1 => (0usize..3, 0u64..6).prop_map(|(d, p)| Op::LeaveFree(d, p)),
        1 => (0usize..3, 1u32..3).prop_map(|(d, k)| Op::FailSamples(d, k)),
        1 => (0usize..3, 1u32..3).prop_map(|(d, k)| Op::FailAllocs(d, k)),
    ]
}

#[derive(Clone, Debug)]
struct Config {
    n_dev: usize,
    kv_type: KvType,
    kv_resident: Option<usize>,
    slots: usize,
    budget_tokens: usize,
    reserve_pages: u64,
    extra_pages: Vec<u64>,
}

fn config() -> impl Strategy<Value = Config> {
    (
        1usize..=3,
        prop_oneof![Just(KvType::F16), Just(KvType::Int8)],
        prop_oneof![3 => Just(None), 1 => (16usize..200).prop_map(Some)],
        0usize..4,
        0usize..800,
        0u64..3,
        proptest::collection::vec(2u64..16, 3),
    )
        .prop_map(|(n_dev, kv_type, kv_resident, slots, budget_tokens, reserve_pages, extra_pages)| Config {
            n_dev,
            kv_type,
            kv_resident,
            slots,
            budget_tokens,
            reserve_pages,
            extra_pages,
        })
}

struct Fixture {
    file: Arc<GgufFile>,
    tokenizer: Tokenizer,
    pool: ThreadPool,
    cpu: HashMap<KvType, Model>,
}

fn fixture() -> &'static Fixture {
    static F: std::sync::OnceLock<Fixture> = std::sync::OnceLock::new();
    F.get_or_init(|| {
        let spec =
            SyntheticSpec { n_layer: N_LAYER, n_embd: 64, n_head: 2, n_head_kv: 1, n_ff: 128, ..Default::default() };
        let file = Arc::new(GgufFile::from_bytes(spec.to_gguf()).expect("synthetic GGUF"));
        let tokenizer = Tokenizer::from_gguf(&file).expect("tokenizer");
        let cpu = [KvType::F16, KvType::Int8]
            .into_iter()
            .map(|t| {
                (t, Model::from_file_with(file.clone(), &LoadOptions { kv_type: t, ..Default::default() }).unwrap())
            })
            .collect();
        Fixture { file, tokenizer, pool: ThreadPool::new(1), cpu }
    })
}

fn params(max_tokens: usize) -> GenerateParams {
    GenerateParams { max_tokens, sampler: SamplerConfig::greedy(), ignore_eos: true, ..Default::default() }
}

fn check(cfg: Config, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let fx = fixture();
    let kv_dim = 32;
    let page_bytes = (KV_PAGE_TOKENS * cfg.kv_type.row_bytes(kv_dim) * 2) as u64; // one layer
    let points: Vec<usize> = match cfg.n_dev {
        1 => vec![],
        2 => vec![1],
        _ => vec![1, 2],
    };
    let big = DeviceSet::from_devices((0..cfg.n_dev).map(|i| Device::sim(i, 1 << 30, 0)).collect());
    let mut opts = LoadOptions {
        devices: big,
        split: if points.is_empty() { None } else { Some(points.clone()) },
        kv_type: cfg.kv_type,
        batch: 64,
        max_context: Some(MAX_CONTEXT),
        kv_resident: cfg.kv_resident,
        ..Default::default()
    };
    let (_, plan) = Model::plan(&fx.file, &opts).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let reserve = cfg.reserve_pages * page_bytes;
    let sims: Vec<Arc<Device>> = plan
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let pages = cfg.extra_pages[i] * s.layers.len() as u64;
            Device::sim(i, s.load_bytes() + reserve + pages * page_bytes, reserve)
        })
        .collect();
    let capacity: Vec<u64> = sims.iter().map(|d| d.total_bytes()).collect();
    opts.devices = DeviceSet::from_devices(sims.clone());
    let devices = opts.devices.clone();
    let model = Model::from_file_with(fx.file.clone(), &opts).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let bytes_per_token = (cfg.kv_type.row_bytes(kv_dim) * 2 * N_LAYER) as u64;
    let scfg = SessionConfig {
        kv_type: cfg.kv_type,
        max_context: MAX_CONTEXT,
        cache_slots: cfg.slots,
        cache_budget_bytes: cfg.budget_tokens as u64 * bytes_per_token,
    };
    let mut session = Session::new(&model, &fx.tokenizer, &fx.pool, &scfg).expect("session");
    let events = session.telemetry.subscribe();
    let (mut parked, mut restored, mut evicted) = (0usize, 0usize, 0usize);
    let mut histories: Vec<Vec<u32>> = vec![Vec::new(); 5];
    let mut next = 0u32;
    let n_vocab = model.cfg.n_vocab as u32;
    let cpu = &fx.cpu[&cfg.kv_type];

    for op in ops {
        match op {
            Op::Turn { conv, user, max_tokens } => {
                let mut prompt = histories[conv].clone();
                prompt.extend((0..user).map(|_| {
                    next += 1;
                    3 + (next.wrapping_mul(2654435761) >> 11) % (n_vocab - 3)
                }));
                match session.serve(&prompt, &params(max_tokens), &mut Quiet) {
                    Ok(served) => {
                        let mut fresh = Sequence::new(cpu, cfg.kv_type, MAX_CONTEXT).expect("sequence");
                        let want = generate(
                            cpu,
                            &fx.tokenizer,
                            &fx.pool,
                            &mut fresh,
                            Request::new(&prompt, &params(max_tokens)),
                            &mut Quiet,
                        )
                        .expect("cpu run");
                        prop_assert_eq!(
                            &served.generation.tokens,
                            &want.tokens,
                            "answer differs from a cache-less run"
                        );
                        prop_assert_eq!(served.reused + served.read, prompt.len());
                        prompt.extend_from_slice(&served.generation.tokens);
                        histories[conv] = prompt;
                    }
                    Err(EngineError::Model(ModelError::Device(DeviceError::AllocFailed { .. }))) => {}
                    Err(EngineError::Model(ModelError::ContextOverflow { .. })) => histories[conv].clear(),
                    Err(e) => return Err(TestCaseError::fail(format!("unexpected error: {e}"))),
                }
            }
            Op::Pressure(d, pages) => sims[d % cfg.n_dev].inject(Fault::PressureBytes(pages * page_bytes)).unwrap(),
            Op::LeaveFree(d, pages) => sims[d % cfg.n_dev].inject(Fault::LeaveFreeBytes(pages * page_bytes)).unwrap(),
            Op::FailSamples(d, k) => sims[d % cfg.n_dev].inject(Fault::FailSamples(k)).unwrap(),
            Op::FailAllocs(d, k) => sims[d % cfg.n_dev].inject(Fault::FailAllocs(k)).unwrap(),
        }
        for e in events.try_iter() {
            if let Entry::Event(e) = e {
                match e.event.as_str() {
                    "parked" => parked += 1,
                    "restored" if e.fields["kind"] == "live" => restored += 1,
                    "evicted" => evicted += 1,
                    _ => {}
                }
            }
        }
        prop_assert!(session.cache.bytes() <= scfg.cache_budget_bytes, "parked bytes over the budget");
        prop_assert!(session.cache.len() <= cfg.slots, "more snapshots than slots");
        prop_assert_eq!(parked, restored + evicted + session.cache.len(), "a snapshot was lost");
        for (i, d) in sims.iter().enumerate() {
            prop_assert!(d.usage().high_water_bytes <= capacity[i], "device {} over capacity", i);
        }
    }
    drop(session);
    drop(model);
    for d in devices.all() {
        prop_assert_eq!(d.usage().total_bytes, 0, "{} holds bytes after unload", d.name());
    }
    Ok(())
}

fn cases() -> u32 {
    std::env::var("STRATA_SOAK_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(2000)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn the_cache_never_changes_an_answer_nor_breaks_its_bounds(
        n_conv in 1usize..=5,
        cfg in config(),
        seed_ops in proptest::collection::vec(op(5), 1..16),
    ) {
        let ops = seed_ops
            .into_iter()
            .map(|o| match o {
                Op::Turn { conv, user, max_tokens } => Op::Turn { conv: conv % n_conv, user, max_tokens },
                other => other,
            })
            .collect();
        check(cfg, ops)?;
    }
}
