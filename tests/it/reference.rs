//! The default model (SmolLM2-135M-Instruct Q4_1) against llama.cpp's reference outputs
//! (tests/data/reference/greedy.json), and batch invariance of its logits.
//!
//! The model is numerically touchy (see tests/data/reference/README.md), so the checks are the fair ones:
//! the exact first token, the first step's top-5 set (up to a near-tie at fifth place, within 0.1 nat)
//! with log-probs within 0.4 nat (and within 0.2 nat of the exact float64 pass), and, under teacher forcing along llama.cpp's tokens, the same argmax at every
//! step whose top-1/top-2 margin exceeds 0.4 nat.

use crate::common;

use std::collections::BTreeSet;

use serde_json::Value;
use strata::model::{KvType, Model};
use strata::sample::log_softmax_top_k;
use strata::threadpool::ThreadPool;
use strata::tokenizer::Tokenizer;

const EOG: [u32; 3] = [0, 2, 4];
const MARGIN_NAT: f32 = 0.4;
/// Log-probs this close at the top-5 boundary count as a tie: half the 0.2 nat the engine may differ from
/// the float64 pass, so their order is rounding (packing q4_1 moved 314 above 3365 by 0.065 nat on
/// raw_quick_brown_fox, where llama.cpp's own 3365 sits 0.08 nat below the float64 pass's).
const TIE_NAT: f32 = 0.1;

fn load() -> (Model, Tokenizer) {
    let model = Model::load(&common::model_path()).expect("the default model loads");
    let tok = Tokenizer::from_gguf(&model.file).expect("its tokenizer loads");
    (model, tok)
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().expect("an array of ids").iter().map(|x| x.as_u64().expect("an id") as u32).collect()
}

/// llama.cpp's top-5 of one step as (id, logprob).
fn top5(v: &Value) -> Vec<(u32, f32)> {
    v.as_array()
        .expect("top5 list")
        .iter()
        .map(|p| (p[0].as_u64().expect("id") as u32, p[1].as_f64().expect("logprob") as f32))
        .collect()
}

fn argmax(row: &[f32], banned: &[u32]) -> u32 {
    let mut best = (0u32, f32::NEG_INFINITY);
    for (i, &v) in row.iter().enumerate() {
        if v > best.1 && !banned.contains(&(i as u32)) {
            best = (i as u32, v);
        }
    }
    best.0
}

/// Logits at every step of `path` after `prompt` (teacher forcing), in one batch.
fn forced_logits(model: &Model, pool: &ThreadPool, prompt: &[u32], path: &[u32]) -> Vec<Vec<f32>> {
    let mut all = prompt.to_vec();
    all.extend_from_slice(&path[..path.len() - 1]);
    let want: Vec<usize> = (prompt.len() - 1..all.len()).collect();
    let mut kv = model.new_kv(KvType::F16, all.len()).expect("kv");
    let logits = model.forward(pool, &mut kv, &all, &want).expect("forward");
    (0..want.len()).map(|i| logits.row(i).to_vec()).collect()
}

#[test]
fn greedy_reference_first_token_top5_and_teacher_forcing() {
    let (model, tok) = load();
    let pool = ThreadPool::new(2);
    let reference = common::reference_json("greedy.json");
    let results = reference["results"].as_array().expect("results");
    assert_eq!(results.len(), 3);
    for r in results {
        let name = r["name"].as_str().unwrap_or("?");
        let prompt = ids(&r["prompt_tokens"]);
        assert_eq!(tok.encode(r["prompt"].as_str().expect("prompt"), true), prompt, "{name}: prompt tokens");

        for (kind, banned) in [("greedy", &[][..]), ("greedy_ignore_eos", &EOG[..])] {
            let path = ids(&r[kind]["tokens"]);
            let steps = r[kind]["per_step_top5"].as_array().expect("per_step_top5");
            let rows = forced_logits(&model, &pool, &prompt, &path);

            // Step 0: the exact first token, and the top-5 set with log-probs within 0.4 nat of llama.cpp's.
            // The set may instead equal the exact float64 pass's set: on chat_colors_custom_sys llama.cpp's
            // 5th token (788) differs from the float64 pass's (23390), and an accurate engine sides with
            // the float64 pass (see tests/data/reference/README.md on how touchy this model is).
            assert_eq!(argmax(&rows[0], banned), path[0], "{name}/{kind}: first token");
            let theirs = top5(&steps[0]);
            let exact = top5(&r["f64_numpy_reference"]["first_token_top5"]);
            let ours = log_softmax_top_k(&rows[0], 5);
            let full = log_softmax_top_k(&rows[0], 50);
            let set = |v: &[(u32, f32)]| v.iter().map(|p| p.0).collect::<BTreeSet<u32>>();
            // Near the fifth place two candidates may be tied within rounding: a reference token missing
            // from our five must sit within TIE_NAT of our fifth (we only ordered a near-tie differently).
            let lp = |id: u32| full.iter().find(|p| p.0 == id).map_or(f32::NEG_INFINITY, |p| p.1);
            let fifth = ours[4].1;
            let agrees = |reference: &[(u32, f32)]| {
                set(&ours) == set(reference)
                    || set(reference).difference(&set(&ours)).all(|&id| fifth - lp(id) <= TIE_NAT)
            };
            assert!(
                agrees(&theirs) || agrees(&exact),
                "{name}/{kind}: first-step top-5 {ours:?}, llama.cpp {theirs:?}, float64 {exact:?}; ours for theirs {:?}",
                theirs.iter().map(|p| (p.0, lp(p.0))).collect::<Vec<_>>()
            );
            for (id, lp) in &theirs {
                let mine = full.iter().find(|p| p.0 == *id).map(|p| p.1).expect("in our top 50");
                assert!((mine - lp).abs() <= MARGIN_NAT, "{name}/{kind}: token {id} logprob {mine} vs {lp}");
            }
            // And close to the exact float64 pass: the engine's own accuracy.
            for (id, lp) in &exact {
                let mine = full.iter().find(|p| p.0 == *id).map(|p| p.1).expect("in our top 50");
                assert!((mine - lp).abs() <= 0.2, "{name}/{kind}: token {id} logprob {mine} vs float64 {lp}");
            }

            // Teacher forcing: the same argmax wherever llama.cpp's top-1/top-2 margin exceeds 0.4 nat.
            let (mut checked, mut agreed) = (0, 0);
            for (i, step) in steps.iter().enumerate() {
                let cands: Vec<(u32, f32)> = top5(step).into_iter().filter(|p| !banned.contains(&p.0)).collect();
                let mine = argmax(&rows[i], banned);
                agreed += usize::from(mine == path[i]);
                if cands.len() >= 2 && cands[0].1 - cands[1].1 > MARGIN_NAT {
                    checked += 1;
                    assert_eq!(mine, path[i], "{name}/{kind}: step {i} (margin {})", cands[0].1 - cands[1].1);
                }
            }
            println!(
                "{name}/{kind}: argmax equal at {agreed}/{} steps, {checked} with margin > 0.4 all equal",
                steps.len()
            );
        }
    }
}

#[test]
fn logits_are_bit_identical_across_batch_sizes_1_7_64_512() {
    let (model, tok) = load();
    let pool = ThreadPool::new(2);
    let text = std::fs::read_to_string(common::reference_path("perplexity_GPL-3.txt")).expect("text");
    let tokens: Vec<u32> = tok.encode(&text, false).into_iter().take(600).collect();
    assert_eq!(tokens.len(), 600);
    let reference = common::logits_in_batches(&model, &pool, KvType::F16, &tokens, 512);
    for batch in [1, 7, 64] {
        let other = common::logits_in_batches(&model, &pool, KvType::F16, &tokens, batch);
        let first_diff = reference.iter().zip(&other).position(|(a, b)| a.to_bits() != b.to_bits());
        assert_eq!(first_diff, None, "batch {batch}: logits differ from batch 512 (value index {first_diff:?})");
    }
}
