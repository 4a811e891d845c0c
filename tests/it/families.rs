//! Every model family against llama.cpp on the tiny random-weight fixtures of tests/data/families (made by
//! scripts/family-fixtures with the `gguf` package; llama.cpp b11312's outputs beside them): greedy tokens
//! and the first step's log-probs, and the bit-identity promises (batch, chunking, threads) per family.

use std::path::PathBuf;
use std::sync::Arc;

use serde_json::Value;

use crate::common::families::{self, floats, ids, log_softmax, reference, FIXTURES};
use strata::device::{DeviceKind, DeviceSet, Purpose};
use strata::gguf::GgufFile;
use strata::model::synthetic::SyntheticSpec;
use strata::model::{ExpertsPlacement, FfnAct, KvType, LoadOptions, Model, SeqInput};
use strata::quant::GgmlType;
use strata::threadpool::ThreadPool;

fn load(stem: &str) -> Model {
    Model::load(&families::file(&format!("{stem}.gguf"))).unwrap_or_else(|e| panic!("{stem}.gguf loads: {e}"))
}

fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as u32
}

/// The prompt's last log-probs and `n` greedy tokens after it, one token per step.
fn run(model: &Model, pool: &ThreadPool, prompt: &[u32], n: usize, ctx: usize) -> (Vec<f64>, Vec<u32>) {
    let mut kv = model.new_kv(KvType::F32, ctx).expect("kv");
    let logits = model.forward(pool, &mut kv, prompt, &[prompt.len() - 1]).expect("prompt");
    let first = log_softmax(logits.row(0));
    let mut next = argmax(logits.row(0));
    let mut greedy = vec![next];
    while greedy.len() < n {
        let l = model.forward(pool, &mut kv, &[next], &[0]).expect("decode");
        next = argmax(l.row(0));
        greedy.push(next);
    }
    (first, greedy)
}

#[test]
fn every_family_gives_llama_cpps_greedy_tokens_and_log_probs() {
    let pool = ThreadPool::new(2);
    let mut report = Vec::new();
    for (stem, ref_stem, ctx) in FIXTURES {
        let model = load(stem);
        let r = reference(ref_stem);
        let prompt = ids(&r["prompt"]);
        let want = ids(&r["greedy"]);
        let (first, greedy) = run(&model, &pool, &prompt, want.len(), ctx);
        let llama = floats(&r["logprobs_last"]);
        let diff = first.iter().zip(&llama).map(|(a, b)| (a - b).abs()).fold(0f64, f64::max);
        assert_eq!(greedy, want, "{ref_stem}: greedy tokens");
        // llama.cpp's GELU reads an f16 table (its input rounded to f16): on the gemma files it is up to
        // 5.6e-3 nat from the exact GELU of the float64 pass, which Strata follows to 1e-3 there.
        let exact = floats(&r["f64"]["logprobs_last"]);
        let diff64 = first.iter().zip(&exact).map(|(a, b)| (a - b).abs()).fold(0f64, f64::max);
        report.push(format!("{ref_stem}: max |strata - llama.cpp| {diff:.2e} nat, |strata - float64| {diff64:.2e}"));
        let bound = if model.cfg.family.ffn_act == FfnAct::GeluTanh { 1e-2 } else { 1e-3 };
        assert!(diff < bound, "{ref_stem}: first-step log-probs differ from llama.cpp's by {diff:e} nat");
        assert!(diff64 < 1e-3, "{ref_stem}: first-step log-probs differ from the float64 pass by {diff64:e} nat");
    }
    println!("{}", report.join("\n"));
}

/// Logits of every position of `tokens` read in batches of `batch` into a cache sized `ctx`, the cache
/// first filled from `start` (a restored snapshot) when given.
fn logits(model: &Model, pool: &ThreadPool, tokens: &[u32], batch: usize, ctx: usize) -> Vec<u32> {
    logits_kv(model, pool, tokens, batch, ctx, KvType::F32)
}

fn logits_kv(model: &Model, pool: &ThreadPool, tokens: &[u32], batch: usize, ctx: usize, ty: KvType) -> Vec<u32> {
    let mut kv = model.new_kv(ty, ctx).expect("kv");
    let mut out = Vec::new();
    for chunk in tokens.chunks(batch) {
        let want: Vec<usize> = (0..chunk.len()).collect();
        out.extend(model.forward(pool, &mut kv, chunk, &want).expect("forward").data.iter().map(|x| x.to_bits()));
    }
    out
}

/// The engine's promise per family: a position's logits have the same bits whether the prompt is read in
/// one batch, in chunks or token by token, on one thread or two, on the CPU or split over two simulated
/// GPUs, and after a snapshot of the cache is restored (whole, or cut back to a shorter prefix).
#[test]
fn every_family_is_bit_identical_across_batches_threads_splits_and_restores() {
    let (pool, pool1) = (ThreadPool::new(2), ThreadPool::new(1));
    for stem in families::MODELS {
        let model = load(stem);
        let r = reference(stem);
        let mut tokens = ids(&r["prompt"]);
        tokens.extend(ids(&r["greedy"]));
        let (n, ctx, v) = (tokens.len(), 512, model.cfg.n_vocab);
        let whole = logits(&model, &pool, &tokens, n, ctx);
        for batch in [1, 7, 32] {
            assert!(logits(&model, &pool, &tokens, batch, ctx) == whole, "{stem}: batches of {batch}");
        }
        assert!(logits(&model, &pool1, &tokens, 7, ctx) == whole, "{stem}: one thread");

        let kinds = vec![DeviceKind::Sim { capacity_bytes: 64 << 20 }; 2];
        let devices = DeviceSet::from_kinds(&kinds, 0).expect("sim devices");
        let opts = LoadOptions { devices, split: Some(vec![1]), ..Default::default() };
        let path = families::file(&format!("{stem}.gguf"));
        let split = Model::load_with(&path, &opts).expect("split model loads");
        assert_eq!(split.placement.stages.len(), 2, "{stem}: two stages");
        assert!(logits(&split, &pool, &tokens, 9, ctx) == whole, "{stem}: split over two sim devices");

        // Park after 30 positions, restore all of them or the first 23, and read on.
        let mut kv = model.new_kv(KvType::F32, ctx).expect("kv");
        model.forward(&pool, &mut kv, &tokens[..30], &[]).expect("prompt");
        let snap = kv.snapshot().expect("snapshot");
        for keep in [30, 23] {
            let mut back = model.new_kv(KvType::F32, ctx).expect("kv");
            back.restore(&snap, keep).expect("restore");
            let want: Vec<usize> = (0..n - keep).collect();
            let rest = model.forward(&pool, &mut back, &tokens[keep..], &want).expect("read on");
            let bits: Vec<u32> = rest.data.iter().map(|x| x.to_bits()).collect();
            assert!(bits == whole[keep * v..], "{stem}: restored {keep} of 30 positions");
        }
    }
}

/// Reads `seqs` together, `forward_many` step after step: sequence `i` joins at step `i`, takes chunks whose
/// sizes follow `sizes` (prompt chunks of one beside single tokens of another), and leaves when it is read.
/// Every position's logits of each sequence, as bits.
fn read_together(model: &Model, pool: &ThreadPool, seqs: &[Vec<u32>], sizes: &[usize], ctx: usize) -> Vec<Vec<u32>> {
    read_together_kv(model, pool, seqs, sizes, ctx, KvType::F32)
}

fn read_together_kv(
    model: &Model,
    pool: &ThreadPool,
    seqs: &[Vec<u32>],
    sizes: &[usize],
    ctx: usize,
    ty: KvType,
) -> Vec<Vec<u32>> {
    let mut kvs: Vec<_> = seqs.iter().map(|_| model.new_kv(ty, ctx).expect("kv")).collect();
    let mut got = vec![Vec::new(); seqs.len()];
    let mut at = vec![0; seqs.len()];
    for step in 0.. {
        let takes: Vec<(usize, usize)> = (0..seqs.len().min(step + 1))
            .filter(|&i| at[i] < seqs[i].len())
            .map(|i| (i, sizes[(step + 3 * i) % sizes.len()].min(seqs[i].len() - at[i])))
            .collect();
        if takes.is_empty() && at.iter().zip(seqs).all(|(a, s)| *a == s.len()) {
            break;
        }
        let wants: Vec<Vec<usize>> = takes.iter().map(|&(_, n)| (0..n).collect()).collect();
        let mut inputs: Vec<SeqInput> = Vec::new();
        for (kv, (i, n)) in
            kvs.iter_mut().enumerate().filter_map(|(i, kv)| takes.iter().find(|t| t.0 == i).map(|t| (kv, *t)))
        {
            let want = &wants[takes.iter().position(|t| t.0 == i).expect("taken")];
            inputs.push(SeqInput { kv, tokens: &seqs[i][at[i]..at[i] + n], want });
        }
        for (result, &(i, n)) in model.forward_many(pool, &mut inputs).into_iter().zip(&takes) {
            got[i].extend(result.expect("forward_many").data.iter().map(|x| x.to_bits()));
            at[i] += n;
        }
    }
    got
}

/// Continuous batching's promise per family: sequences read together in one pass (a prompt chunk of one
/// beside another's single tokens, joining and leaving at different steps, at different positions) give each
/// sequence the same logits, bit for bit, as reading it alone; on the CPU and split over two sim devices.
#[test]
fn sequences_read_together_give_each_the_logits_it_has_alone() {
    let pool = ThreadPool::new(2);
    for stem in families::MODELS {
        let model = load(stem);
        let r = reference(stem);
        let mut base = ids(&r["prompt"]);
        base.extend(ids(&r["greedy"]));
        let (ctx, v) = (512, model.cfg.n_vocab as u32);
        let seqs: Vec<Vec<u32>> = vec![
            base.clone(),
            base.iter().rev().copied().collect(),
            base.iter().map(|&t| (t * 7 + 3) % v).chain(base.iter().copied()).collect(),
            base[..5].to_vec(),
        ];
        let alone: Vec<Vec<u32>> = seqs.iter().map(|s| logits(&model, &pool, s, s.len(), ctx)).collect();
        for sizes in [&[1usize][..], &[5, 1, 1, 9, 1, 2, 17, 1], &[40, 3]] {
            let together = read_together(&model, &pool, &seqs, sizes, ctx);
            for (i, (t, a)) in together.iter().zip(&alone).enumerate() {
                assert!(t == a, "{stem}: sequence {i} read together (chunks {sizes:?}) differs from alone");
            }
        }
        if stem == "gemma3" || stem == "llama3" || stem == "qwen3moe" {
            let kinds = vec![DeviceKind::Sim { capacity_bytes: 64 << 20 }; 2];
            let devices = DeviceSet::from_kinds(&kinds, 0).expect("sim devices");
            let opts = LoadOptions { devices, split: Some(vec![1]), ..Default::default() };
            let split = Model::load_with(&families::file(&format!("{stem}.gguf")), &opts).expect("split loads");
            let together = read_together(&split, &pool, &seqs, &[5, 1, 1, 9, 1, 2, 17, 1], ctx);
            assert!(together == alone, "{stem}: sequences read together on a split differ from alone");
        }
    }
}

/// The same promise through the CUDA backend (on its CPU emulator, which runs the kernels' PTX): on one
/// GPU, and split between the CPU and a GPU, sequences read together in one pass (their matrix products over
/// all rows at once, RoPE, the KV store and attention per sequence) give each the logits it has alone.
#[test]
fn sequences_read_together_on_an_emulated_gpu_give_each_the_logits_it_has_alone() {
    let pool = ThreadPool::new(2);
    for stem in ["llama3", "gemma3", "gpt-oss"] {
        let r = reference(stem);
        let mut base = ids(&r["prompt"]);
        base.extend(ids(&r["greedy"]));
        let path = families::file(&format!("{stem}.gguf"));
        for (kinds, split) in [
            (vec![DeviceKind::Emu { capacity_bytes: 64 << 20 }], None),
            (vec![DeviceKind::Cpu, DeviceKind::Emu { capacity_bytes: 64 << 20 }], Some(vec![1])),
        ] {
            let devices = DeviceSet::from_kinds(&kinds, 0).expect("devices");
            let opts = LoadOptions { devices, split, ..Default::default() };
            let model = Model::load_with(&path, &opts).expect("loads on the emulated GPU");
            assert!(model.placement.gpu.iter().any(Option::is_some), "{stem}: a GPU stage");
            let (ctx, v) = (256, model.cfg.n_vocab as u32);
            let seqs: Vec<Vec<u32>> = vec![
                base.clone(),
                base.iter().rev().copied().collect(),
                base.iter().map(|&t| (t * 7 + 3) % v).chain(base[..4].iter().copied()).collect(),
            ];
            // Each alone in the chunks it takes together (the GPU's kernels give a row the same bits
            // whatever rows stand beside it, but not whatever chunk its prompt was read in).
            let sizes = [5, 1, 1, 9, 1, 2];
            let alone: Vec<Vec<u32>> = (0..seqs.len())
                .map(|i| {
                    let only: Vec<Vec<u32>> =
                        (0..seqs.len()).map(|j| if j == i { seqs[i].clone() } else { Vec::new() }).collect();
                    read_together_kv(&model, &pool, &only, &sizes, ctx, KvType::F16).swap_remove(i)
                })
                .collect();
            let together = read_together_kv(&model, &pool, &seqs, &sizes, ctx, KvType::F16);
            for (i, (t, a)) in together.iter().zip(&alone).enumerate() {
                assert!(t == a, "{stem} on {kinds:?}: sequence {i} read together differs from alone");
            }
        }
    }
}

/// `--experts` on a split: a GPU or sim stage holds its experts or keeps them in host memory as asked, and
/// `auto` moves the first layers' experts to the host only when the stage would not fit. Every device's
/// ledger holds what the plan says: a stage's weights without its host experts, the host those experts.
/// A GPU stage refuses `gpu` for experts whose weight type it has no kernels for, naming the layer, the
/// type and the way out, and `auto` keeps those on the host.
#[test]
fn experts_live_where_the_placement_says_and_the_ledgers_hold_them_there() {
    let path = families::file("mixtral.gguf");
    let file = Arc::new(GgufFile::open(&path).expect("fixture"));
    let emu = DeviceKind::Emu { capacity_bytes: 64 << 20 };
    let sim = |mib: u64| DeviceKind::Sim { capacity_bytes: mib << 20 };
    let opts = |kinds: &[DeviceKind], experts: ExpertsPlacement| LoadOptions {
        devices: DeviceSet::from_kinds(kinds, 0).expect("devices"),
        split: (kinds.len() == 2).then(|| vec![1]),
        experts,
        ..Default::default()
    };

    // Experts a GPU cannot run: a weight type without kernels (q2_K), rows that are not whole 32-value
    // chunks (the qwen3moe fixture's experts of 48 rows).
    let q2k =
        SyntheticSpec { n_layer: 2, experts: Some((4, 2)), expert_type: Some(GgmlType::Q2K), ..Default::default() };
    let q2k = Arc::new(GgufFile::from_bytes(q2k.to_gguf()).expect("synthetic"));
    let qwen3moe = Arc::new(GgufFile::open(&families::file("qwen3moe.gguf")).expect("fixture"));
    for (f, why) in [(&q2k, "q2_K weights"), (&qwen3moe, "rows of 48 values")] {
        let err = match Model::from_file_with(f.clone(), &opts(&[emu], ExpertsPlacement::Gpu)) {
            Ok(_) => panic!("a GPU stage took experts it cannot run ({why})"),
            Err(e) => e.to_string(),
        };
        let named = ["--experts gpu", "layer 0", why, "--experts auto or cpu"];
        assert!(named.iter().all(|n| err.contains(n)), "{err}");
        let (_, stages) = Model::plan(f, &opts(&[emu], ExpertsPlacement::Auto)).expect("plan");
        assert_eq!(stages[0].experts_on_host, vec![true, true], "auto keeps the experts on the host ({why})");
    }

    // (devices, --experts, whether each stage's experts are on the host)
    let cases = [
        (vec![emu], ExpertsPlacement::Auto, vec![false]),
        (vec![emu], ExpertsPlacement::Gpu, vec![false]),
        (vec![emu], ExpertsPlacement::Cpu, vec![true]),
        (vec![sim(64), emu], ExpertsPlacement::Auto, vec![false, false]),
        (vec![emu, emu], ExpertsPlacement::parse("cpu:1..2").unwrap(), vec![false, true]),
        (vec![sim(64), sim(64)], ExpertsPlacement::Auto, vec![false, false]),
        (vec![sim(64), sim(64)], ExpertsPlacement::Cpu, vec![true, true]),
        (vec![sim(64), sim(64)], ExpertsPlacement::parse("cpu:1..2").unwrap(), vec![false, true]),
        (vec![DeviceKind::Cpu, sim(64)], ExpertsPlacement::Cpu, vec![false, true]),
    ];
    for (kinds, experts, on_host) in cases {
        let o = opts(&kinds, experts.clone());
        let (_, stages) = Model::plan(&file, &o).expect("plan");
        let model = Model::from_file_with(file.clone(), &o).expect("loads");
        let case = format!("{kinds:?} --experts {}", experts.spec());
        let mut host_experts = 0;
        for (s, &host) in stages.iter().zip(&on_host) {
            assert!(s.experts_on_host.iter().all(|&h| h == host), "{case}: {:?}", s.experts_on_host);
            assert!((s.host_experts_bytes > 0) == host && (s.experts_bytes > 0) != host, "{case}");
            if !s.device.is_host() {
                assert_eq!(s.device.usage().bytes(Purpose::Weights), s.weights_bytes, "{case}: {}", s.device.name());
            }
            if s.device.kind.is_gpu() {
                // The experts' buffers (router scores, gathered rows, picks) when the stage holds experts.
                assert_eq!(s.device.usage().bytes(Purpose::Scratch), s.scratch_bytes, "{case}: {}", s.device.name());
            }
            host_experts += s.host_experts_bytes;
        }
        let host = &model.placement.devices.host;
        let host_stage: u64 = stages.iter().filter(|s| s.device.is_host()).map(|s| s.weights_bytes).sum();
        assert_eq!(host.usage().bytes(Purpose::Weights), host_stage + host_experts, "{case}: the host");
        // A GPU stage running its experts on the host holds their working buffers there too.
        let gpu_host_experts = stages.iter().any(|s| s.device.kind.is_gpu() && s.host_experts_bytes > 0);
        let host_scratch = host.usage().bytes(Purpose::Scratch);
        let want = if gpu_host_experts { strata::model::gpu::host_scratch_bytes(&model.cfg, 1) } else { 0 };
        assert!(host_scratch >= want && (want == 0 || host_scratch > 0), "{case}: host scratch {host_scratch}");
    }

    // Auto on a sim or GPU card too small for both layers' experts: the first layer's go to the host; on
    // one just large enough, none.
    let cards: [fn(u64) -> DeviceKind; 2] =
        [|capacity_bytes| DeviceKind::Sim { capacity_bytes }, |capacity_bytes| DeviceKind::Emu { capacity_bytes }];
    for card in cards {
        let (_, full) = Model::plan(&file, &opts(&[card(64 << 20)], ExpertsPlacement::Gpu)).expect("plan");
        let (need, half) = (full[0].load_bytes(), full[0].experts_bytes / 2);
        for (capacity_bytes, want) in [(need - half / 2, vec![true, false]), (need, vec![false, false])] {
            let kind = card(capacity_bytes);
            let (_, stages) = Model::plan(&file, &opts(&[kind], ExpertsPlacement::Auto)).expect("plan");
            assert_eq!(stages[0].experts_on_host, want, "{kind:?} for a load of {need} B");
        }
    }
}

/// The real Gemma 3 270M Q4_K_M (scripts/fetch-gemma) against llama.cpp (tests/data/families/
/// gemma3-270m-q4_k_m.json, f32 KV). Both engines quantize activations to 8 bits, in blocks that Gemma's
/// large activations make coarse, so their log-probs differ by up to about 0.3 nat and each is about
/// 0.15 nat from the same weights run with exact activations (llama.cpp on the file dequantized to F32,
/// where Strata agrees to 2e-3). The fair checks, as for the default model: under teacher forcing along
/// llama.cpp's greedy tokens, the same argmax at every step where llama.cpp's top-2 margin exceeds 0.4
/// nat; the first step's top-10 log-probs within 0.3 nat of the exact-activation run, and no further from it
/// than llama.cpp's.
#[test]
fn gemma3_270m_q4_k_m_follows_llama_cpps_tokens() {
    let path = std::env::var_os("STRATA_GEMMA_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/gemma-3-270m-q4_k_m.gguf"));
    if !path.exists() {
        println!("skipped: {} is absent (run scripts/fetch-gemma)", path.display());
        return;
    }
    let model = Model::load(&path).expect("gemma loads");
    assert_eq!(model.cfg.arch_name, "gemma3");
    let r = reference("gemma3-270m-q4_k_m");
    let pool = ThreadPool::new(2);
    let pairs = |v: &Value| -> Vec<(usize, f64)> {
        v.as_array()
            .expect("pairs")
            .iter()
            .map(|p| (p[0].as_u64().expect("id") as usize, p[1].as_f64().expect("logprob")))
            .collect()
    };
    for case in r["cases"].as_array().expect("cases") {
        let text = case["text"].as_str().unwrap_or_default();
        let prompt = ids(&case["prompt"]);
        let greedy = ids(&case["greedy"]);
        let mut all = prompt.clone();
        all.extend_from_slice(&greedy);
        let mut kv = model.new_kv(KvType::F32, 512).expect("kv");
        let want: Vec<usize> = (prompt.len() - 1..all.len()).collect();
        let logits = model.forward(&pool, &mut kv, &all, &want).expect("forward");
        let (mut checked, mut agreed) = (0, 0);
        for (step, top2) in case["forced_top2"].as_array().expect("forced").iter().enumerate() {
            let top2 = pairs(top2);
            if top2[0].1 - top2[1].1 <= 0.4 {
                continue;
            }
            checked += 1;
            let ours = argmax(logits.row(step)) as usize;
            assert_eq!(ours, top2[0].0, "{text:?}: step {step} (llama.cpp's margin {:.3})", top2[0].1 - top2[1].1);
            agreed += 1;
        }
        let first = log_softmax(logits.row(0));
        let llama = pairs(&case["top10_last"]);
        let exact = pairs(&case["top10_last_dequantized"]);
        let ours_err = exact.iter().map(|&(i, lp)| (first[i] - lp).abs()).fold(0f64, f64::max);
        let llama_at = |i: usize| llama.iter().find(|p| p.0 == i).map(|p| p.1);
        let llama_err = exact.iter().filter_map(|&(i, lp)| Some((llama_at(i)? - lp).abs())).fold(0f64, f64::max);
        let vs_llama = llama.iter().map(|&(i, lp)| (first[i] - lp).abs()).fold(0f64, f64::max);
        println!(
            "{text:?}: argmax equal at {agreed} of {checked} clear steps; top-10 vs exact activations: strata \
             {ours_err:.3} nat, llama.cpp {llama_err:.3}; strata vs llama.cpp {vs_llama:.3}"
        );
        assert_eq!(argmax(logits.row(0)), greedy[0], "{text:?}: the first token");
        assert!(
            ours_err < 0.3 && ours_err <= llama_err,
            "{text:?}: top-10 log-probs {ours_err} nat from the exact-activation run (llama.cpp's: {llama_err})"
        );
    }
}

/// Sliding-window layers keep only their window (and a margin) of KV: on the gemma fixtures (windows of 6
/// and 8 positions) over 400 positions, the freed pages change no bit of the logits, whatever the batches;
/// the cache, a snapshot and a restore hold only what is kept; and a cut or a restore below what the
/// windows kept is refused, never attended wrongly.
#[test]
fn sliding_window_layers_keep_only_their_window() {
    use strata::model::kv::{KV_PAGE_TOKENS, SWA_MARGIN_TOKENS};
    let pool = ThreadPool::new(2);
    for stem in ["gemma3", "gemma2"] {
        let model = load(stem);
        let cfg = &model.cfg;
        let w = cfg.swa_window.expect("a window");
        let n = 400;
        let tokens = strata_tokens(n, cfg.n_vocab);
        // One batch: nothing is freed before every position is read.
        let whole = logits(&model, &pool, &tokens, n, 512);
        for batch in [1, 7, 64] {
            assert!(logits(&model, &pool, &tokens, batch, 512) == whole, "{stem}: batches of {batch}");
        }
        let mut kv = model.new_kv(KvType::F32, 512).expect("kv");
        model.forward(&pool, &mut kv, &tokens, &[]).expect("read");
        let pages = |l: usize| kv.layers[l].pages.iter().filter(|p| p.held()).count();
        let window_pages = (w + SWA_MARGIN_TOKENS).div_ceil(KV_PAGE_TOKENS) + 1;
        for l in 0..cfg.n_layer {
            if cfg.swa_layers[l] {
                assert!(pages(l) <= window_pages, "{stem}: layer {l} holds {} pages", pages(l));
            } else {
                assert_eq!(pages(l), n.div_ceil(KV_PAGE_TOKENS), "{stem}: global layer {l} holds every page");
            }
        }
        // Positions a sliding-window layer frees at least, and the bytes of a position of one layer.
        let swa = cfg.swa_layers.iter().filter(|&&s| s).count();
        let freed = n - window_pages * KV_PAGE_TOKENS;
        let row = (kv.ty.row_bytes(kv.kv_dim) * 2) as u64;
        let pages_bytes = (n.div_ceil(KV_PAGE_TOKENS) * KV_PAGE_TOKENS * cfg.n_layer) as u64 * row;
        // The memory plan counts what the layers keep: at least what they hold, less what they free.
        let plan = LoadOptions { kv_type: KvType::F32, ..Default::default() };
        let (_, stages) = Model::plan(&model.file, &plan).expect("plan");
        let planned = stages[0].kv_device_bytes(n, None);
        let held = kv.allocated_bytes() as u64;
        assert!(
            held <= planned && planned <= pages_bytes - (swa * freed) as u64 * row,
            "{stem}: plan {planned}, held {held}, every page {pages_bytes}"
        );
        // A snapshot holds the kept rows only.
        let snap = kv.snapshot().expect("snapshot");
        assert_eq!(snap.bytes(), kv.snapshot_bytes());
        let all_rows = (n * cfg.n_layer) as u64 * row;
        assert!(snap.bytes() <= all_rows - (swa * freed) as u64 * row, "{stem}: snapshot {} bytes", snap.bytes());
        let min = kv.min_len();
        assert!(min > 0 && min <= n - SWA_MARGIN_TOKENS, "{stem}: min_len {min}");

        // Restored at its length, the sequence reads on with the bits of one that never parked.
        let v = cfg.n_vocab;
        let more = strata_tokens(20, cfg.n_vocab);
        let mut all = tokens.clone();
        all.extend_from_slice(&more);
        let want = logits(&model, &pool, &all, all.len(), 512);
        for keep in [n, n - SWA_MARGIN_TOKENS + 1] {
            let mut back = model.new_kv(KvType::F32, 512).expect("kv");
            back.restore(&snap, keep).expect("restore");
            let idx: Vec<usize> = (0..all.len() - keep).collect();
            let got = model.forward(&pool, &mut back, &all[keep..], &idx).expect("read on");
            let bits: Vec<u32> = got.data.iter().map(|x| x.to_bits()).collect();
            assert!(bits == want[keep * v..], "{stem}: restored at {keep}");
        }
        // Below what the windows kept: refused, and a cut there empties the cache.
        let mut back = model.new_kv(KvType::F32, 512).expect("kv");
        assert!(back.restore(&snap, min - 1).is_err(), "{stem}: a restore below min_len is refused");
        assert_eq!(back.len(), 0);
        kv.truncate(min - 1);
        assert_eq!(kv.len(), 0, "{stem}: a cut below min_len empties the cache");
    }
}

/// `n` token ids spread over the vocabulary past its four special ones (`common::tokens`, deterministic).
fn strata_tokens(n: usize, n_vocab: usize) -> Vec<u32> {
    crate::common::tokens(n, n_vocab - 4, n as u32).into_iter().map(|t| t + 4).collect()
}

/// The conversation cache on a sliding-window model (the gemma3 fixture on a 2-way sim split): a
/// conversation parked and come back to with an edited last message restores from the checkpoint at the
/// end of its first prompt (whose window its sliding-window layers kept), reads only the rest, and
/// replies with the tokens of a full reread on the CPU.
#[test]
fn a_sliding_window_conversation_restores_from_its_checkpoint_as_a_reread() {
    use std::sync::Arc;
    use strata::cache::RestoreKind;
    use strata::engine::session::{Session, SessionConfig};
    use strata::engine::{generate, GenerateParams, Quiet, Request, Sequence};
    use strata::gguf::GgufFile;
    use strata::sample::SamplerConfig;
    use strata::tokenizer::Tokenizer;

    const MIB: u64 = 1 << 20;
    let file = Arc::new(GgufFile::open(&families::file("gemma3.gguf")).expect("fixture"));
    let tok = Tokenizer::from_gguf(&file).expect("tokenizer");
    let pool = ThreadPool::new(2);
    let kinds = [DeviceKind::Sim { capacity_bytes: 64 * MIB }, DeviceKind::Sim { capacity_bytes: 64 * MIB }];
    let devices = DeviceSet::from_kinds(&kinds, MIB).expect("sims");
    let opts = LoadOptions { devices, split: Some(vec![3]), kv_type: KvType::F32, ..Default::default() };
    let model = Model::from_file_with(file.clone(), &opts).expect("model");
    let cfg = SessionConfig { kv_type: KvType::F32, max_context: 512, cache_slots: 4, cache_budget_bytes: 64 * MIB };
    let mut session = Session::new(&model, &tok, &pool, &cfg).expect("session");
    let params =
        GenerateParams { max_tokens: 8, sampler: SamplerConfig::greedy(), ignore_eos: true, ..Default::default() };

    let first = strata_tokens(300, model.cfg.n_vocab);
    let reply = session.serve(&first, &params, &mut Quiet).expect("turn 1").generation.tokens;
    let mut history = first.clone();
    history.extend_from_slice(&reply);
    let mut turn2 = history.clone();
    turn2.extend(strata_tokens(40, 200).iter().map(|t| t + 50));
    session.serve(&turn2, &params, &mut Quiet).expect("turn 2");
    session.serve(&strata_tokens(30, 100), &params, &mut Quiet).expect("conversation b");
    let mut edited = history.clone();
    edited.extend(strata_tokens(25, 150).iter().map(|t| t + 100));
    let served = session.serve(&edited, &params, &mut Quiet).expect("edited turn");

    assert_eq!(served.restored, Some((RestoreKind::Checkpoint, first.len())), "{:?}", served.restored);
    assert_eq!((served.reused, served.read), (first.len(), edited.len() - first.len()));
    let cpu = Model::from_file(file).expect("cpu model");
    let mut fresh = Sequence::new(&cpu, KvType::F32, 512).expect("sequence");
    let want = generate(&cpu, &tok, &pool, &mut fresh, Request::new(&edited, &params), &mut Quiet).expect("reread");
    assert_eq!(served.generation.tokens, want.tokens, "a checkpoint restore gives the reread's tokens");
}
