//! `strata bench`: prompt processing and generation speed, measured like llama-bench (pp: a batch of `-p`
//! tokens from an empty cache; tg: `-n` tokens decoded one at a time from an empty cache; one warm-up run
//! each, then `-r` timed repetitions, mean and standard deviation). Each test must fit the context (`-c`, else
//! the model's) and its KV the host's available memory: a test that cannot is refused before anything runs.
//!
//! With speculative decoding on (`--spec ngram`, `--draft-model`), the tg test decodes greedily after a real
//! prompt (`--prompt-file`, else the pp test's tokens) twice per repetition, alternating: plainly and with
//! drafts, so the two rates and their ratio come from one run; the drafts proposed and accepted are counted.

use std::time::Instant;

use anyhow::{bail, Context};
use clap::Args;
use rand::{Rng, SeedableRng};

use strata::device::mib;
use strata::engine::spec::Drafter;
use strata::engine::{generate_with, GenerateParams, Sequence, TextOnly};
use strata::model::{KvType, Model};
use strata::sample::SamplerConfig;
use strata::threadpool::ThreadPool;
use strata::tokenizer::Tokenizer;

use super::{load, load_spec, stages_summary, tokenize_prompt, EngineArgs, ModelArgs};

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompt tokens of the pp test (0 = skip)
    #[arg(short = 'p', long = "n-prompt", default_value_t = 512, value_parser = parse_count)]
    pub n_prompt: usize,
    /// Generated tokens of the tg test (0 = skip)
    #[arg(short = 'n', long = "n-gen", default_value_t = 128, value_parser = parse_count)]
    pub n_gen: usize,
    /// Timed repetitions of each test
    #[arg(short = 'r', long = "repetitions", default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    pub reps: u32,
    /// Print one JSON object instead of a table
    #[arg(long = "json")]
    pub json: bool,
    /// Also measure memory: each GPU's device and host-to-device bandwidth (and the decode floor they set),
    /// and parking / restoring the KV of a conversation of --kv-tokens tokens
    #[arg(long = "bandwidth")]
    pub bandwidth: bool,
    /// Tokens of the conversation whose KV --bandwidth parks and restores (at most the context)
    #[arg(long = "kv-tokens", default_value_t = 4096, value_parser = clap::value_parser!(u32).range(1..))]
    pub kv_tokens: u32,
    /// A prompt (raw text, special tokens parsed) that the tg test decodes after, greedily; with
    /// speculative decoding the default is the pp test's random tokens
    #[arg(long = "prompt-file", value_name = "FILE")]
    pub prompt_file: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// A token count: a whole number from 0 (said so for a negative one).
fn parse_count(s: &str) -> Result<usize, String> {
    match s.trim().parse::<i128>() {
        Ok(n) if n < 0 => Err(format!("{n} is negative: a token count is 0 or more")),
        Ok(n) => usize::try_from(n).map_err(|_| format!("{n} is too large")),
        Err(_) => Err(format!("{s:?} is not a whole number")),
    }
}

pub fn main(a: BenchArgs) -> anyhow::Result<()> {
    let loaded = load(&a.model, &a.engine)?;
    let model = &loaded.model;
    let pool = a.engine.pool();
    let context = a.engine.context(model);
    let kv_tokens = a.kv_tokens as usize;
    for (flag, n) in [("-p", a.n_prompt), ("-n", a.n_gen), ("--kv-tokens", if a.bandwidth { kv_tokens } else { 0 })] {
        if n > context {
            bail!("bench {flag} {n}: the test needs {n} positions but the context holds {context} (-c)");
        }
    }
    let ctx = (a.n_prompt.max(a.n_gen)).max(1);
    check_kv_fits(model, a.engine.kv, ctx.max(if a.bandwidth { kv_tokens } else { 0 }))?;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
    let prompt: Vec<u32> = (0..a.n_prompt).map(|_| rng.gen_range(0..model.cfg.n_vocab as u32)).collect();

    let pp = if a.n_prompt > 0 {
        Some(measure(a.reps, || run_pp(model, &pool, &a.engine, &prompt, ctx), a.n_prompt)?)
    } else {
        None
    };
    let spec = load_spec(&a.engine, &loaded)?;
    let text_prompt = match &a.prompt_file {
        Some(p) => {
            let text = super::input::read_text_capped(p, super::input::PROMPT_FILE_CAP_BYTES, "--prompt-file")?;
            Some(tokenize_prompt(&loaded.tokenizer, &text))
        }
        None => spec.is_some().then(|| prompt.clone()).filter(|p| !p.is_empty()),
    };
    let mut spec_tg = None;
    let tg = match (&text_prompt, a.n_gen) {
        (_, 0) => None,
        (None, n) => Some(measure(a.reps, || run_tg(model, &pool, &a.engine, n, ctx), n)?),
        (Some(p), n) => {
            let need = p.len() + n;
            if need > context {
                bail!("bench: the prompt ({} tokens) and -n {n} need {need} positions but the context holds {context} (-c)", p.len());
            }
            let mut drafter = spec.as_ref().map(|s| s.drafter(a.engine.kv, need, model.cfg.n_vocab)).transpose()?;
            let text = TextRun {
                model,
                tokenizer: &loaded.tokenizer,
                pool: &pool,
                prompt: p,
                n,
                batch: a.engine.batch as usize,
                kv: a.engine.kv,
            };
            let (plain, drafted) = text.measure(a.reps, drafter.as_mut())?;
            spec_tg = drafted;
            Some(plain)
        }
    };
    let (gpus, kv_copies) = if a.bandwidth {
        let gpus = model
            .placement
            .devices
            .devices
            .iter()
            .filter(|d| d.gpu().is_some())
            .map(|d| super::bandwidth::measure_gpu(d, 256 << 20))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let kv = super::bandwidth::measure_kv(model, &pool, a.engine.kv, a.engine.batch as usize, kv_tokens)?;
        (gpus, Some(kv))
    } else {
        (Vec::new(), None)
    };
    // The decode floor: every weight byte read once per token at the slowest GPU's device bandwidth.
    let floor_tg = gpus.iter().map(|g| g.device_gbps).reduce(f64::min).map(|bw| bw * 1e9 / model.weight_bytes() as f64);
    let name = loaded.path.file_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let stages = stages_summary(model);
    if a.json {
        let split: Vec<serde_json::Value> = model
            .placement
            .stages
            .iter()
            .map(|s| serde_json::json!({"device": s.device.name(), "layers": [s.layers.start, s.layers.end]}))
            .collect();
        let obj = serde_json::json!({
            "model": name,
            "threads": pool.n_threads(),
            "kv": format!("{:?}", a.engine.kv).to_lowercase(),
            "devices": a.engine.placement.devices,
            "stages": split,
            "context": context,
            "n_prompt": a.n_prompt,
            "n_gen": a.n_gen,
            "repetitions": a.reps,
            "pp_tok_s": pp.map(|s| s.0),
            "pp_tok_s_stddev": pp.map(|s| s.1),
            "tg_tok_s": tg.map(|s| s.0),
            "tg_tok_s_stddev": tg.map(|s| s.1),
            "prompt_file_tokens": a.prompt_file.as_ref().and(text_prompt.as_ref()).map(Vec::len),
            "spec": spec_tg.as_ref().map(|s| serde_json::json!({
                "kind": spec_kind(&a.engine),
                "tg_tok_s": s.mean,
                "tg_tok_s_stddev": s.stddev,
                "speedup": tg.map(|t| s.mean / t.0),
                "drafts_proposed": s.proposed,
                "drafts_accepted": s.accepted,
            })),
            "weight_bytes": model.weight_bytes(),
            "gpus": gpus,
            "floor_tg_tok_s": floor_tg,
            "kv_copies": kv_copies,
        });
        println!("{obj}");
    } else {
        println!("| model | size | threads | kv | devices [layers] | test | t/s |");
        println!("| --- | ---: | ---: | --- | --- | --- | ---: |");
        let size = format!("{:.2} MiB", model.weight_bytes() as f64 / (1 << 20) as f64);
        let kv = format!("{:?}", a.engine.kv).to_lowercase();
        for (test, s) in [(format!("pp{}", a.n_prompt), pp), (format!("tg{}", a.n_gen), tg)] {
            if let Some((mean, sd)) = s {
                println!("| {name} | {size} | {} | {kv} | {stages} | {test} | {mean:.2} ± {sd:.2} |", pool.n_threads());
            }
        }
        if let Some(s) = &spec_tg {
            println!(
                "| {name} | {size} | {} | {kv} | {stages} | tg{}+{} | {:.2} ± {:.2} |",
                pool.n_threads(),
                a.n_gen,
                spec_kind(&a.engine),
                s.mean,
                s.stddev
            );
            let speedup = tg.map_or(String::new(), |t| format!(", {:.2}x plain decoding", s.mean / t.0));
            println!("drafts accepted {} of {} over the timed runs{speedup}", s.accepted, s.proposed);
        }
        for g in &gpus {
            println!(
                "{} ({}): device {:.1} GB/s, host-to-device pinned {:.1} GB/s, pageable {:.1} GB/s",
                g.device, g.name, g.device_gbps, g.h2d_pinned_gbps, g.h2d_pageable_gbps
            );
        }
        if let Some(f) = floor_tg {
            println!("decode floor (weight bytes / device bandwidth): {f:.1} tok/s");
        }
        if let Some(k) = &kv_copies {
            println!(
                "KV of {} tokens ({:.1} MiB): park {:.2} GB/s (into reused buffers {:.2}), restore {:.2} GB/s",
                k.tokens,
                k.bytes as f64 / (1 << 20) as f64,
                k.park_gbps,
                k.park_reused_gbps,
                k.restore_gbps
            );
        }
    }
    Ok(())
}

/// Refuses a test whose KV cache (reserved up front, as llama-bench does) the host could not hold when the
/// model runs on host memory (the CPU and simulated GPUs); real GPUs move what does not fit to the host page
/// by page, and the ledger refuses what the host cannot take.
fn check_kv_fits(model: &Model, kv: KvType, tokens: usize) -> anyhow::Result<()> {
    let devices = &model.placement.devices;
    if devices.devices.iter().any(|d| d.gpu().is_some()) {
        return Ok(());
    }
    let need = (model.kv_bytes_per_token(kv) as u64).saturating_mul(tokens as u64);
    let available = devices.host.sample_free()?.saturating_sub(strata::device::HOST_MARGIN_BYTES);
    if need > available {
        bail!(
            "bench: the KV cache of {tokens} positions needs {} but the host has {} available: use fewer tokens \
             (-p, -n, --kv-tokens, -c) or --kv int8",
            mib(need),
            mib(available)
        );
    }
    Ok(())
}

/// One warm-up run, then `reps` timed runs of `f`; returns (mean, stddev) of tokens per second.
fn measure(reps: u32, mut f: impl FnMut() -> anyhow::Result<f64>, n_tokens: usize) -> anyhow::Result<(f64, f64)> {
    f()?;
    let mut rates = Vec::new();
    for _ in 0..reps {
        let secs = f()?;
        rates.push(n_tokens as f64 / secs);
    }
    Ok(mean_sd(&rates))
}

fn run_pp(model: &Model, pool: &ThreadPool, e: &EngineArgs, prompt: &[u32], ctx: usize) -> anyhow::Result<f64> {
    let mut kv = model.new_kv(e.kv, ctx)?;
    // Allocated before timing, as llama-bench does.
    kv.reserve(ctx).with_context(|| format!("cannot reserve the KV cache of {ctx} positions"))?;
    let t = Instant::now();
    for chunk in prompt.chunks(e.batch as usize) {
        model.forward(pool, &mut kv, chunk, &[chunk.len() - 1])?;
    }
    Ok(t.elapsed().as_secs_f64())
}

/// `ngram` or `draft` (for the tables).
fn spec_kind(e: &EngineArgs) -> &'static str {
    if e.spec.draft_model.is_some() {
        "draft"
    } else {
        "ngram"
    }
}

/// The decode rate with drafts, and the drafts counted over the timed runs.
struct SpecRate {
    mean: f64,
    stddev: f64,
    proposed: usize,
    accepted: usize,
}

/// The tg test after a real prompt: greedy, end-of-generation tokens ignored, only the decode timed.
struct TextRun<'a> {
    model: &'a Model,
    tokenizer: &'a Tokenizer,
    pool: &'a ThreadPool,
    prompt: &'a [u32],
    n: usize,
    batch: usize,
    kv: KvType,
}

impl TextRun<'_> {
    /// Seconds to decode `n` tokens, and the drafts proposed and accepted.
    fn once(&self, drafter: Option<&mut Drafter>) -> anyhow::Result<(f64, usize, usize)> {
        let mut seq = Sequence::new(self.model, self.kv, self.prompt.len() + self.n)?;
        let params = GenerateParams {
            max_tokens: self.n,
            sampler: SamplerConfig::greedy(),
            ignore_eos: true,
            batch: self.batch,
            ..Default::default()
        };
        let g = generate_with(
            self.model,
            self.tokenizer,
            self.pool,
            &mut seq,
            self.prompt,
            &params,
            &mut TextOnly(|_: &str| {}),
            drafter,
        )?;
        Ok((g.gen_ms / 1e3, g.drafts_proposed, g.drafts_accepted))
    }

    /// One warm-up, then `reps` rounds of plain decoding and (with a drafter) decoding with drafts, one
    /// after the other: (mean, stddev) of the plain rate, and the rate with drafts.
    fn measure(&self, reps: u32, mut drafter: Option<&mut Drafter>) -> anyhow::Result<((f64, f64), Option<SpecRate>)> {
        self.once(None)?;
        if let Some(d) = drafter.as_deref_mut() {
            self.once(Some(d))?;
        }
        let (mut plain, mut drafted, mut proposed, mut accepted) = (Vec::new(), Vec::new(), 0, 0);
        for _ in 0..reps {
            plain.push(self.n as f64 / self.once(None)?.0);
            if let Some(d) = drafter.as_deref_mut() {
                let (secs, p, a) = self.once(Some(d))?;
                drafted.push(self.n as f64 / secs);
                proposed += p;
                accepted += a;
            }
        }
        let spec = (!drafted.is_empty()).then(|| {
            let (mean, stddev) = mean_sd(&drafted);
            SpecRate { mean, stddev, proposed, accepted }
        });
        Ok((mean_sd(&plain), spec))
    }
}

fn mean_sd(rates: &[f64]) -> (f64, f64) {
    let mean = rates.iter().sum::<f64>() / rates.len() as f64;
    let var = rates.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / (rates.len().max(2) - 1) as f64;
    (mean, var.sqrt())
}

fn run_tg(model: &Model, pool: &ThreadPool, e: &EngineArgs, n: usize, ctx: usize) -> anyhow::Result<f64> {
    let mut kv = model.new_kv(e.kv, ctx)?;
    kv.reserve(ctx).with_context(|| format!("cannot reserve the KV cache of {ctx} positions"))?;
    let mut token = 1u32.min(model.cfg.n_vocab as u32 - 1);
    let t = Instant::now();
    for _ in 0..n {
        let logits = model.forward(pool, &mut kv, &[token], &[0])?;
        // Feed back the argmax so the work depends on the previous step, as in real decoding.
        token = logits
            .row(0)
            .iter()
            .enumerate()
            .fold((0, f32::NEG_INFINITY), |b, (i, &v)| if v > b.1 { (i, v) } else { b })
            .0 as u32;
    }
    Ok(t.elapsed().as_secs_f64())
}
