//! Properties of the split and the ledger over random configurations (2-3 sim devices, split points, KV
//! type and residency, reserve, capacity) and random sequences of requests and faults (pressure from
//! another process, failing samples, failing allocations), on a tiny synthetic model:
//! - a device's allocations never exceed its capacity;
//! - no engine step leaves a device's free memory under the reserve (or lower, when pressure already put
//!   it there), whenever the step could sample it;
//! - a failed step appends nothing and holds no pages past the sequence;
//! - with `--kv-resident N`, no layer keeps more than the pages of its newest N positions on its device;
//! - the logits are bit-identical to a cpu run of the same steps, wherever the KV pages went;
//! - every device, the host included, is back to zero bytes once the model and its sequence are dropped.

use std::sync::Arc;

use proptest::prelude::*;

use strata::device::{Device, DeviceError, DeviceSet, Fault};
use strata::gguf::GgufFile;
use strata::model::kv::KV_PAGE_TOKENS;
use strata::model::synthetic::SyntheticSpec;
use strata::model::{KvType, LoadOptions, Model, ModelError};
use strata::threadpool::ThreadPool;

const N_LAYER: usize = 4;
const MAX_TOKENS: usize = 1024;

#[derive(Clone, Debug)]
enum Op {
    Forward(usize),
    Truncate(u8),
    Clear,
    Pressure(usize, u64),
    LeaveFree(usize, u64),
    FailSamples(usize, u32),
    FailAllocs(usize, u32),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (1usize..160).prop_map(Op::Forward),
        1 => (0u8..8).prop_map(Op::Truncate),
        1 => Just(Op::Clear),
        2 => (0usize..3, 0u64..24).prop_map(|(d, p)| Op::Pressure(d, p)),
        2 => (0usize..3, 0u64..6).prop_map(|(d, p)| Op::LeaveFree(d, p)),
        1 => (0usize..3, 1u32..3).prop_map(|(d, k)| Op::FailSamples(d, k)),
        1 => (0usize..3, 1u32..3).prop_map(|(d, k)| Op::FailAllocs(d, k)),
    ]
}

#[derive(Clone, Debug)]
struct Config {
    points: Vec<usize>,
    kv_type: KvType,
    kv_resident: Option<usize>,
    reserve_pages: u64,
    extra_pages: Vec<u64>,
}

fn config() -> impl Strategy<Value = Config> {
    let points = prop_oneof![
        (1usize..N_LAYER).prop_map(|p| vec![p]),
        (1usize..N_LAYER - 1).prop_flat_map(|a| (a + 1..N_LAYER).prop_map(move |b| vec![a, b])),
    ];
    (
        points,
        prop_oneof![Just(KvType::F16), Just(KvType::Int8)],
        prop_oneof![Just(None), (1usize..300).prop_map(Some)],
        0u64..4,
        proptest::collection::vec(0u64..12, 3),
    )
        .prop_map(|(points, kv_type, kv_resident, reserve_pages, extra_pages)| Config {
            points,
            kv_type,
            kv_resident,
            reserve_pages,
            extra_pages,
        })
}

fn file() -> Arc<GgufFile> {
    let spec =
        SyntheticSpec { n_layer: N_LAYER, n_embd: 128, n_head: 4, n_head_kv: 2, n_ff: 256, ..Default::default() };
    Arc::new(GgufFile::from_bytes(spec.to_gguf()).expect("synthetic GGUF"))
}

fn token(i: usize, n_vocab: usize) -> u32 {
    ((i as u32).wrapping_mul(2654435761) >> 9) % n_vocab as u32
}

fn check(cfg: Config, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let file = file();
    let pool = ThreadPool::new(2);
    let n_dev = cfg.points.len() + 1;
    let kv_dim = 64;
    let page_bytes = (KV_PAGE_TOKENS * cfg.kv_type.row_bytes(kv_dim) * 2) as u64; // one layer

    // Size the sims from the plan: what the stage loads, the reserve, and some pages of KV.
    let big = DeviceSet::from_devices((0..n_dev).map(|i| Device::sim(i, 1 << 30, 0)).collect());
    let mut opts = LoadOptions {
        devices: big,
        split: Some(cfg.points.clone()),
        kv_type: cfg.kv_type,
        batch: 64,
        max_context: Some(MAX_TOKENS),
        kv_resident: cfg.kv_resident,
        ..Default::default()
    };
    let (_, plan) = Model::plan(&file, &opts).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let reserve = cfg.reserve_pages * page_bytes;
    let sims: Vec<Arc<Device>> = plan
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let layers = s.layers.len() as u64;
            Device::sim(i, s.load_bytes() + reserve + cfg.extra_pages[i] * layers * page_bytes, reserve)
        })
        .collect();
    let capacity: Vec<u64> = sims.iter().map(|d| d.total_bytes()).collect();
    opts.devices = DeviceSet::from_devices(sims.clone());
    let devices = opts.devices.clone();
    let model = Model::from_file_with(file.clone(), &opts).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let cpu_opts = LoadOptions { kv_type: cfg.kv_type, kv_resident: cfg.kv_resident, batch: 64, ..Default::default() };
    let cpu = Model::from_file_with(file.clone(), &cpu_opts).expect("cpu model");
    let n_vocab = model.cfg.n_vocab;
    let mut kv = model.new_kv(cfg.kv_type, MAX_TOKENS).expect("kv");
    let mut cpu_kv = cpu.new_kv(cfg.kv_type, MAX_TOKENS).expect("kv");
    let mut next_token = 0usize;

    for op in ops {
        let free_before: Vec<u64> = sims.iter().map(|d| d.sim_true_free().unwrap()).collect();
        let failed_samples_before: Vec<u64> = sims.iter().map(|d| d.usage().failed_samples).collect();
        match op {
            Op::Forward(n) => {
                let n = n.min(MAX_TOKENS - kv.len());
                if n == 0 {
                    continue;
                }
                let toks: Vec<u32> = (next_token..next_token + n).map(|i| token(i, n_vocab)).collect();
                next_token += n;
                let len_before = kv.len();
                match model.forward(&pool, &mut kv, &toks, &[n - 1]) {
                    Ok(logits) => {
                        let want = cpu.forward(&pool, &mut cpu_kv, &toks, &[n - 1]).expect("cpu forward");
                        prop_assert_eq!(
                            logits.data.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                            want.data.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                            "logits differ from the cpu run"
                        );
                    }
                    Err(ModelError::Device(DeviceError::AllocFailed { .. })) => {
                        prop_assert_eq!(kv.len(), len_before, "a failed step appended");
                        let pages = kv.len().div_ceil(KV_PAGE_TOKENS);
                        prop_assert_eq!(kv.allocated_bytes() as u64, (N_LAYER * pages) as u64 * page_bytes);
                    }
                    Err(e) => return Err(TestCaseError::fail(format!("unexpected error: {e}"))),
                }
                prop_assert_eq!(kv.len(), cpu_kv.len());
                for (i, d) in sims.iter().enumerate() {
                    let sampled = d.usage().failed_samples == failed_samples_before[i];
                    let free = d.sim_true_free().unwrap();
                    if sampled {
                        prop_assert!(
                            free >= reserve.min(free_before[i]),
                            "device {i}: free {free} < reserve {reserve} (was {})",
                            free_before[i]
                        );
                    }
                }
            }
            Op::Truncate(eighths) => {
                let n = kv.len() * eighths as usize / 8;
                kv.truncate(n);
                cpu_kv.truncate(n);
            }
            Op::Clear => {
                kv.clear();
                cpu_kv.clear();
            }
            Op::Pressure(d, pages) => sims[d % n_dev].inject(Fault::PressureBytes(pages * page_bytes)).unwrap(),
            Op::LeaveFree(d, pages) => sims[d % n_dev].inject(Fault::LeaveFreeBytes(pages * page_bytes)).unwrap(),
            Op::FailSamples(d, k) => sims[d % n_dev].inject(Fault::FailSamples(k)).unwrap(),
            Op::FailAllocs(d, k) => sims[d % n_dev].inject(Fault::FailAllocs(k)).unwrap(),
        }
        if let Some(n) = cfg.kv_resident {
            // The resident window: at most the pages covering the newest N positions stay on a device.
            for (l, layer) in kv.layers.iter().enumerate() {
                let resident = layer.pages.iter().filter(|p| !p.on_host()).count();
                prop_assert!(resident <= n.div_ceil(KV_PAGE_TOKENS) + 1, "layer {l}: {resident} pages resident");
            }
        }
        for (i, d) in sims.iter().enumerate() {
            let u = d.usage();
            prop_assert!(
                u.total_bytes <= capacity[i],
                "device {i}: {} allocated > capacity {}",
                u.total_bytes,
                capacity[i]
            );
            prop_assert!(u.high_water_bytes <= capacity[i]);
        }
    }
    drop(kv);
    drop(model);
    for d in devices.all() {
        prop_assert_eq!(d.usage().total_bytes, 0, "{} holds bytes after unload", d.name());
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn ledger_reserve_and_results_hold_under_random_splits_and_faults(
        cfg in config(),
        ops in proptest::collection::vec(op(), 1..14),
    ) {
        check(cfg, ops)?;
    }
}
