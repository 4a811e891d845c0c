//! The conversation cache on the default model, on a 2-way sim split (`sim:200,sim:400`, layers 15/15,
//! f16 KV): park and restore throughput against a one-thread memcpy of the same bytes, the return to a
//! 4,000-token conversation (one short new turn) against rereading it, and the restore gate's cost.
//!
//! Run with `cargo bench --bench cache` (needs models/SmolLM2-135M-Instruct.Q4_1.gguf; `-t` is 2 threads).

use std::hint::black_box;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use strata::cache::gate;
use strata::device::{DeviceKind, DeviceSet};
use strata::engine::session::{Session, SessionConfig};
use strata::engine::{prefill, GenerateParams, Quiet, Sequence};
use strata::gguf::GgufFile;
use strata::model::{KvType, LoadOptions, Model};
use strata::sample::SamplerConfig;
use strata::telemetry::Telemetry;
use strata::threadpool::ThreadPool;
use strata::tokenizer::Tokenizer;

const MIB: u64 = 1 << 20;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let path = std::env::var_os("STRATA_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/SmolLM2-135M-Instruct.Q4_1.gguf"));
    let file = Arc::new(GgufFile::open(&path).expect("the default model (scripts/fetch-model)"));
    let tok = Tokenizer::from_gguf(&file).expect("tokenizer");
    let kinds = [DeviceKind::Sim { capacity_bytes: 200 * MIB }, DeviceKind::Sim { capacity_bytes: 400 * MIB }];
    let devices = DeviceSet::from_kinds(&kinds, 32 * MIB).expect("sims");
    let opts = LoadOptions { devices: devices.clone(), split: Some(vec![15]), ..Default::default() };
    let model = Model::from_file_with(file.clone(), &opts).expect("model");
    let pool = ThreadPool::new(2);
    let text = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/reference/perplexity_GPL-3.txt"),
    )
    .expect("text");
    let ids = tok.encode(&text, false);
    let conv: Vec<u32> = ids[..4000].to_vec();

    // 1. Park (device KV -> host snapshot) and restore (snapshot -> device pages), against memcpy.
    let mut seq = Sequence::new(&model, KvType::F16, 8192).expect("sequence");
    prefill(&model, &pool, &mut seq, &conv, 512).expect("prefill");
    let reps = 7;
    let mut park_s = Vec::new();
    let mut park_reuse_s = Vec::new();
    let mut restore_s = Vec::new();
    let mut snap = seq.kv.snapshot().expect("snapshot");
    let bytes = snap.bytes();
    for _ in 0..reps {
        let t = Instant::now();
        snap = black_box(seq.kv.snapshot().expect("snapshot"));
        park_s.push(t.elapsed().as_secs_f64());
        // At the slot limit a park evicts a snapshot and writes into its buffers.
        let t = Instant::now();
        snap = black_box(seq.kv.snapshot_into(Some(snap)).expect("snapshot"));
        park_reuse_s.push(t.elapsed().as_secs_f64());
        let mut target = model.new_kv(KvType::F16, 8192).expect("kv");
        let t = Instant::now();
        target.restore(&snap, snap.len).expect("restore");
        restore_s.push(t.elapsed().as_secs_f64());
        black_box(&target);
    }
    let src = vec![1u8; bytes as usize];
    let mut memcpy_s = Vec::new();
    let mut memcpy_fresh_s = Vec::new();
    let mut dst = vec![0u8; bytes as usize];
    for _ in 0..reps {
        let t = Instant::now();
        dst.copy_from_slice(black_box(&src));
        memcpy_s.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        let fresh = black_box(&src).to_vec();
        memcpy_fresh_s.push(t.elapsed().as_secs_f64());
        black_box(&fresh);
    }
    black_box(&dst);
    let gbs = |s: f64| bytes as f64 / s / 1e9;
    let (park, restore, memcpy, fresh) = (median(park_s), median(restore_s), median(memcpy_s), median(memcpy_fresh_s));
    let park_reuse = median(park_reuse_s);
    println!("snapshot of 4000 tokens: {bytes} bytes ({:.1} MiB)", bytes as f64 / MIB as f64);
    println!("park    {:.2} ms  {:.2} GB/s", park * 1e3, gbs(park));
    println!("park into an evicted snapshot's buffers {:.2} ms  {:.2} GB/s", park_reuse * 1e3, gbs(park_reuse));
    println!("restore {:.2} ms  {:.2} GB/s", restore * 1e3, gbs(restore));
    println!("memcpy into a touched buffer {:.2} ms  {:.2} GB/s (one thread)", memcpy * 1e3, gbs(memcpy));
    println!("memcpy into a new buffer     {:.2} ms  {:.2} GB/s (one thread)", fresh * 1e3, gbs(fresh));
    println!(
        "park / memcpy = {:.2} (new memory: {:.2} of a memcpy into new memory), restore / memcpy = {:.2}",
        memcpy / park_reuse,
        fresh / park,
        memcpy / restore
    );
    drop(seq);

    // 2. Returning to a 4,000-token conversation with one short new turn, against rereading it.
    let cfg = SessionConfig { kv_type: KvType::F16, max_context: 8192, cache_slots: 2, cache_budget_bytes: 1 << 30 };
    let params =
        GenerateParams { max_tokens: 1, sampler: SamplerConfig::greedy(), ignore_eos: true, ..Default::default() };
    let other: Vec<u32> = ids[5000..5100].to_vec();
    let mut turn = conv.clone();
    turn.extend_from_slice(&ids[4500..4516]);
    let mut returns = Vec::new();
    let mut rereads = Vec::new();
    for _ in 0..3 {
        let mut s = Session::new(&model, &tok, &pool, &cfg).expect("session");
        s.serve(&conv, &params, &mut Quiet).expect("conversation a");
        s.serve(&other, &params, &mut Quiet).expect("conversation b parks a");
        let t = Instant::now();
        let served = s.serve(&turn, &params, &mut Quiet).expect("back to a");
        returns.push(t.elapsed().as_secs_f64());
        assert!(served.restored.is_some() && served.reused >= 4000, "{:?}", served.restored);

        let mut cold = Session::new(&model, &tok, &pool, &cfg).expect("session");
        let t = Instant::now();
        cold.serve(&turn, &params, &mut Quiet).expect("reread");
        rereads.push(t.elapsed().as_secs_f64());
    }
    let (ret, reread) = (median(returns), median(rereads));
    println!(
        "return to the 4000-token conversation (+16 tokens, 1 generated): {:.1} ms; rereading it: {:.1} ms; {:.0}x faster",
        ret * 1e3,
        reread * 1e3,
        reread / ret
    );

    // 3. The gate decision: sample both devices, compare with need + reserve.
    let t = Telemetry::new();
    let needs: Vec<_> = devices
        .devices
        .iter()
        .map(|d| gate::Need { device: d.clone(), need_bytes: 20 * MIB, credit_bytes: 0 })
        .collect();
    let n = 100_000;
    let start = Instant::now();
    for _ in 0..n {
        black_box(gate::decide(black_box(&needs), &t));
    }
    println!("gate decision (2 devices, samples recorded): {:.3} us", start.elapsed().as_secs_f64() * 1e6 / n as f64);
}
