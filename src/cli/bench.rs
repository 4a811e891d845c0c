//! `strata bench`: prompt processing and generation speed, measured like llama-bench. pp: a batch of `-p`
//! tokens; tg: `-n` tokens decoded one at a time; each after `-d` tokens of context already in the KV cache
//! (0 by default). `-p`, `-n` and `-d` take comma-separated lists (`-p 512,4096 -d 0,4096`): every pp and tg
//! size runs at every depth. One warm-up run per test, then `-r` timed repetitions, mean and standard
//! deviation. The depth's context is computed once per depth, untimed, and each run starts from it (the KV
//! truncated back to the depth), as llama-bench starts each run from a computed depth. Each test must fit the
//! context (`-c`, else the model's) and its KV the host's available memory: a test that cannot is refused
//! before anything runs.
//!
//! With speculative decoding on (`--spec ngram`, `--draft-model`), the tg test decodes greedily after a real
//! prompt (`--prompt-file`, else the first pp test's tokens) twice per repetition, alternating: plainly and
//! with drafts, so the two rates and their ratio come from one run; the drafts proposed and accepted are
//! counted.

use std::time::Instant;

use anyhow::{bail, Context};
use clap::Args;
use rand::{Rng, SeedableRng};

use strata::device::mib;
use strata::engine::spec::Drafter;
use strata::engine::{generate_with, GenerateParams, Sequence, TextOnly};
use strata::model::{KvCache, KvType, Model};
use strata::sample::SamplerConfig;
use strata::threadpool::ThreadPool;
use strata::tokenizer::Tokenizer;

use super::{load, load_spec, stages_summary, tokenize_prompt, EngineArgs, ModelArgs};

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompt tokens of the pp tests, a comma-separated list (0 = none)
    #[arg(short = 'p', long = "n-prompt", value_delimiter = ',', default_value = "512", value_parser = parse_count)]
    pub n_prompt: Vec<usize>,
    /// Generated tokens of the tg tests, a comma-separated list (0 = none)
    #[arg(short = 'n', long = "n-gen", value_delimiter = ',', default_value = "128", value_parser = parse_count)]
    pub n_gen: Vec<usize>,
    /// Tokens of context already in the KV cache before each test, a comma-separated list (llama-bench's -d)
    #[arg(short = 'd', long = "n-depth", value_delimiter = ',', default_value = "0", value_parser = parse_count)]
    pub n_depth: Vec<usize>,
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
    /// A prompt (raw text, special tokens parsed) that the tg tests decode after, greedily; with
    /// speculative decoding the default is the first pp test's random tokens
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

/// What one test measures.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    /// A batch of this many prompt tokens.
    Pp(usize),
    /// This many tokens decoded one at a time.
    Tg(usize),
}

/// One measured configuration: its rates over the timed runs.
struct Measured {
    kind: Kind,
    depth: usize,
    /// `ngram` or `draft` for the tg test with drafts, after a real prompt.
    spec: Option<&'static str>,
    /// Tokens per second, one per timed run.
    samples_tok_s: Vec<f64>,
}

impl Measured {
    /// llama-bench's name for the test: `pp512`, `tg128 @ d4096`, `tg200+ngram`.
    fn name(&self) -> String {
        let base = match self.kind {
            Kind::Pp(n) => format!("pp{n}"),
            Kind::Tg(n) => format!("tg{n}"),
        };
        let spec = self.spec.map_or(String::new(), |s| format!("+{s}"));
        let depth = if self.depth > 0 { format!(" @ d{}", self.depth) } else { String::new() };
        format!("{base}{spec}{depth}")
    }

    fn mean_sd(&self) -> (f64, f64) {
        mean_sd(&self.samples_tok_s)
    }

    fn json(&self) -> serde_json::Value {
        let (mean, sd) = self.mean_sd();
        let (n_prompt, n_gen) = match self.kind {
            Kind::Pp(n) => (n, 0),
            Kind::Tg(n) => (0, n),
        };
        serde_json::json!({
            "test": self.name(),
            "n_prompt": n_prompt,
            "n_gen": n_gen,
            "n_depth": self.depth,
            "spec": self.spec,
            "tok_s": mean,
            "tok_s_stddev": sd,
            "samples_tok_s": self.samples_tok_s,
        })
    }
}

pub fn main(a: BenchArgs) -> anyhow::Result<()> {
    let loaded = load(&a.model, &a.engine)?;
    let model = &loaded.model;
    let pool = a.engine.pool();
    let context = a.engine.context(model);
    let kv_tokens = a.kv_tokens as usize;
    let pps: Vec<usize> = a.n_prompt.iter().copied().filter(|&n| n > 0).collect();
    let tgs: Vec<usize> = a.n_gen.iter().copied().filter(|&n| n > 0).collect();
    let max_test = pps.iter().chain(&tgs).copied().max().unwrap_or(0);
    let depths = &a.n_depth;
    for &d in depths {
        for (flag, n) in pps.iter().map(|&n| ("-p", n)).chain(tgs.iter().map(|&n| ("-n", n))) {
            let need = d.saturating_add(n);
            if need > context {
                let at = if d > 0 { format!(" at -d {d}") } else { String::new() };
                bail!("bench {flag} {n}{at}: the test needs {need} positions but the context holds {context} (-c)");
            }
        }
        if d > context {
            bail!("bench -d {d}: the depth needs {d} positions but the context holds {context} (-c)");
        }
    }
    if a.bandwidth && kv_tokens > context {
        bail!(
            "bench --kv-tokens {kv_tokens}: the test needs {kv_tokens} positions but the context holds {context} (-c)"
        );
    }
    let max_depth = depths.iter().copied().max().unwrap_or(0);
    let spec = load_spec(&a.engine, &loaded)?;
    if max_depth > 0 && (spec.is_some() || a.prompt_file.is_some()) {
        bail!(
            "bench -d {max_depth}: the tg test after a real prompt (--prompt-file, speculative decoding) has its \
             prompt for context; -d is for the random-token tests"
        );
    }
    let ctx = (max_depth + max_test).max(1);
    check_kv_fits(model, a.engine.kv, ctx.max(if a.bandwidth { kv_tokens } else { 0 }))?;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
    // The depth's tokens, then the pp tests' (each test reads from the start of its part).
    let tokens: Vec<u32> = (0..max_depth + pps.iter().copied().max().unwrap_or(0))
        .map(|_| rng.gen_range(0..model.cfg.n_vocab as u32))
        .collect();

    let text_prompt = match &a.prompt_file {
        Some(p) => {
            let text = super::input::read_text_capped(p, super::input::PROMPT_FILE_CAP_BYTES, "--prompt-file")?;
            Some(tokenize_prompt(&loaded.tokenizer, &text))
        }
        None => spec.is_some().then(|| tokens[..pps.first().copied().unwrap_or(0)].to_vec()).filter(|p| !p.is_empty()),
    };
    let random = RandomRun { model, pool: &pool, e: &a.engine, tokens: &tokens, reps: a.reps };
    let mut tests = Vec::new();
    for &d in depths {
        let kinds: Vec<Kind> = pps
            .iter()
            .map(|&n| Kind::Pp(n))
            .chain(tgs.iter().filter(|_| text_prompt.is_none()).map(|&n| Kind::Tg(n)))
            .collect();
        if !kinds.is_empty() {
            tests.extend(random.at_depth(d, ctx, &kinds)?);
        }
    }
    let mut spec_tg = None;
    if let Some(p) = &text_prompt {
        for &n in &tgs {
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
            tests.push(Measured { kind: Kind::Tg(n), depth: 0, spec: None, samples_tok_s: plain });
            if let Some(s) = drafted {
                tests.push(Measured {
                    kind: Kind::Tg(n),
                    depth: 0,
                    spec: Some(spec_kind(&a.engine)),
                    samples_tok_s: s.samples.clone(),
                });
                spec_tg.get_or_insert(s);
            }
        }
    }
    let first = |pp: bool| {
        tests.iter().find(|t| t.spec.is_none() && matches!(t.kind, Kind::Pp(_)) == pp).map(Measured::mean_sd)
    };
    let (pp, tg) = (first(true), first(false));
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
        let (spec_mean, spec_sd) = spec_tg.as_ref().map(|s| mean_sd(&s.samples)).unzip();
        let obj = serde_json::json!({
            "model": name,
            "threads": pool.n_threads(),
            "kv": format!("{:?}", a.engine.kv).to_lowercase(),
            "devices": a.engine.placement.devices,
            "stages": split,
            "context": context,
            "n_prompt": a.n_prompt.first(),
            "n_gen": a.n_gen.first(),
            "n_depth": depths.first(),
            "repetitions": a.reps,
            "tests": tests.iter().map(Measured::json).collect::<Vec<_>>(),
            "pp_tok_s": pp.map(|s| s.0),
            "pp_tok_s_stddev": pp.map(|s| s.1),
            "tg_tok_s": tg.map(|s| s.0),
            "tg_tok_s_stddev": tg.map(|s| s.1),
            "prompt_file_tokens": a.prompt_file.as_ref().and(text_prompt.as_ref()).map(Vec::len),
            "spec": spec_tg.as_ref().map(|s| serde_json::json!({
                "kind": spec_kind(&a.engine),
                "tg_tok_s": spec_mean,
                "tg_tok_s_stddev": spec_sd,
                "speedup": tg.zip(spec_mean).map(|(t, m)| m / t.0),
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
        for t in &tests {
            let (mean, sd) = t.mean_sd();
            println!(
                "| {name} | {size} | {} | {kv} | {stages} | {} | {mean:.2} ± {sd:.2} |",
                pool.n_threads(),
                t.name()
            );
        }
        if let Some(s) = &spec_tg {
            let speedup = tg.map_or(String::new(), |t| format!(", {:.2}x plain decoding", mean_sd(&s.samples).0 / t.0));
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

/// The tests on random tokens (llama-bench's): each from a context of a given depth.
struct RandomRun<'a> {
    model: &'a Model,
    pool: &'a ThreadPool,
    e: &'a EngineArgs,
    /// The depth's tokens, then the pp tests'.
    tokens: &'a [u32],
    reps: u32,
}

impl RandomRun<'_> {
    /// Computes `depth` tokens of context once (untimed) in a KV cache reserved for `cap` positions up front
    /// (as llama-bench allocates before timing), then runs each test `1 + reps` times from it.
    fn at_depth(&self, depth: usize, cap: usize, kinds: &[Kind]) -> anyhow::Result<Vec<Measured>> {
        let mut kv = self.model.new_kv(self.e.kv, cap)?;
        kv.reserve(cap).with_context(|| format!("cannot reserve the KV cache of {cap} positions"))?;
        self.prefill(&mut kv, &self.tokens[..depth])?;
        let mut out = Vec::new();
        for &kind in kinds {
            let mut samples_tok_s = Vec::new();
            for rep in 0..=self.reps {
                kv.truncate(depth);
                let (secs, n) = match kind {
                    Kind::Pp(n) => {
                        let t = Instant::now();
                        self.prefill(&mut kv, &self.tokens[depth..depth + n])?;
                        (t.elapsed().as_secs_f64(), n)
                    }
                    Kind::Tg(n) => (self.decode(&mut kv, n)?, n),
                };
                // The first run warms up.
                if rep > 0 {
                    samples_tok_s.push(n as f64 / secs);
                }
            }
            out.push(Measured { kind, depth, spec: None, samples_tok_s });
        }
        Ok(out)
    }

    /// Prompt processing in batches of `-b`, the last token's logits computed.
    fn prefill(&self, kv: &mut KvCache, tokens: &[u32]) -> anyhow::Result<()> {
        for chunk in tokens.chunks(self.e.batch as usize) {
            self.model.forward(self.pool, kv, chunk, &[chunk.len() - 1])?;
        }
        Ok(())
    }

    /// Seconds to decode `n` tokens one at a time.
    fn decode(&self, kv: &mut KvCache, n: usize) -> anyhow::Result<f64> {
        let mut token = 1u32.min(self.model.cfg.n_vocab as u32 - 1);
        let t = Instant::now();
        for _ in 0..n {
            let logits = self.model.forward(self.pool, kv, &[token], &[0])?;
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
    /// Tokens per second, one per timed run.
    samples: Vec<f64>,
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
    /// after the other: the plain rates, and the rates with drafts.
    fn measure(&self, reps: u32, mut drafter: Option<&mut Drafter>) -> anyhow::Result<(Vec<f64>, Option<SpecRate>)> {
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
        let spec = (!drafted.is_empty()).then_some(SpecRate { samples: drafted, proposed, accepted });
        Ok((plain, spec))
    }
}

fn mean_sd(rates: &[f64]) -> (f64, f64) {
    let mean = rates.iter().sum::<f64>() / rates.len() as f64;
    let var = rates.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / (rates.len().max(2) - 1) as f64;
    (mean, var.sqrt())
}
