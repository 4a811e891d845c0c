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
use strata::engine::spec::{Drafter, SpecSetup};
use strata::engine::{generate, GenerateParams, Quiet, Request, Sequence};
use strata::model::profile::{self, Part};
use strata::model::{KvCache, KvType, Model, SeqInput};
use strata::sample::SamplerConfig;
use strata::threadpool::ThreadPool;
use strata::tokenizer::Tokenizer;

use super::{load, load_spec, tokenize_prompt, EngineArgs, Loaded, ModelArgs};

mod report;
use report::{Memory, Report};

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
    /// The tg tests decode this many sequences at once, each from its own context of the test's depth,
    /// in one batched pass per step (`strata serve --parallel`): reported as `tgN x S`, aggregate tok/s
    #[arg(long = "streams", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub streams: u32,
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
    /// Also say where the time of each pp and tg test goes: attention products, attention, FFN products,
    /// output head and the rest, per token, beside the weight types and layouts of each part's matrices
    #[arg(long = "type-report")]
    pub type_report: bool,
    /// Also measure this machine's memory read bandwidth (all threads) and give each tg figure as a fraction
    /// of the decode floor it sets (weight bytes read once per token)
    #[arg(long = "host-bandwidth")]
    pub host_bandwidth: bool,
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
    /// Sequences decoded at once (tg tests; 1 otherwise).
    streams: usize,
    /// Tokens per second, one per timed run.
    samples_tok_s: Vec<f64>,
    /// With --type-report: seconds per token in each `profile::Part`, and in all, over the timed runs.
    parts: Option<Parts>,
}

/// Where a test's time went (--type-report): seconds per token by part, and the whole.
#[derive(Clone, Copy, Debug, Default)]
struct Parts {
    per_token_s: [f64; 4],
    total_per_token_s: f64,
}

impl Parts {
    /// (name, seconds per token) for each part and the rest ("other": norms, embedding, sampling, ...).
    fn rows(&self) -> Vec<(&'static str, f64)> {
        let mut rows: Vec<(&'static str, f64)> =
            Part::ALL.iter().zip(self.per_token_s).map(|(p, s)| (p.name(), s)).collect();
        let other = self.total_per_token_s - self.per_token_s.iter().sum::<f64>();
        rows.push(("other", other.max(0.0)));
        rows
    }
}

impl Measured {
    /// llama-bench's name for the test: `pp512`, `tg128 @ d4096`, `tg200+ngram`.
    fn name(&self) -> String {
        let base = match self.kind {
            Kind::Pp(n) => format!("pp{n}"),
            Kind::Tg(n) => format!("tg{n}"),
        };
        let spec = self.spec.map_or(String::new(), |s| format!("+{s}"));
        let streams = if self.streams > 1 { format!(" x{}", self.streams) } else { String::new() };
        let depth = if self.depth > 0 { format!(" @ d{}", self.depth) } else { String::new() };
        format!("{base}{spec}{streams}{depth}")
    }

    /// The mean rate over the timed runs and its standard deviation.
    fn mean_sd(&self) -> (f64, f64) {
        mean_sd(&self.samples_tok_s)
    }

    /// The test as one entry of the JSON object's `tests`.
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
            "streams": self.streams,
            "tok_s": mean,
            "tok_s_stddev": sd,
            "samples_tok_s": self.samples_tok_s,
            "type_report": self.parts.map(|p| {
                p.rows().into_iter().map(|(n, s)| (n.to_owned(), serde_json::json!(s * 1e3))).collect::<serde_json::Map<_, _>>()
            }),
        })
    }
}

/// Runs the tests the flags ask for, after refusing any that cannot fit, and prints what they measured.
pub fn main(a: BenchArgs) -> anyhow::Result<()> {
    let loaded = load(&a.model, &a.engine)?;
    let model = &loaded.model;
    let pool = a.engine.pool();
    let plan = Plan::new(&a, a.engine.context(model))?;
    let spec = load_spec(&a.engine, &loaded)?;
    plan.check_depth_without_prompt(spec.is_some() || a.prompt_file.is_some())?;
    if a.streams > 1 && (spec.is_some() || a.prompt_file.is_some()) {
        bail!("--streams {}: the tg tests after a real prompt (--prompt-file, --spec) run one sequence", a.streams);
    }
    check_kv_fits(model, a.engine.kv, plan.kv_positions(&a) * a.streams as usize)?;
    let tokens = random_tokens(model.cfg.n_vocab, plan.max_depth + plan.pps.iter().copied().max().unwrap_or(0));
    let text_prompt = text_prompt(&a, &loaded.tokenizer, spec.is_some(), plan.pps.first().copied(), &tokens)?;
    let random = RandomRun {
        model,
        pool: &pool,
        e: &a.engine,
        tokens: &tokens,
        reps: a.reps,
        type_report: a.type_report,
        streams: a.streams as usize,
    };
    let mut tests = random.at_depths(&plan, &a.n_depth, text_prompt.is_none())?;
    let spec_tg = match &text_prompt {
        Some(p) => text_tests(&a, &loaded, &pool, spec.as_ref(), p, &plan, &mut tests)?,
        None => None,
    };
    let report = Report {
        a: &a,
        model,
        name: loaded.path.file_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default(),
        threads: pool.n_threads(),
        context: plan.context,
        tests,
        spec_tg,
        prompt_file_tokens: a.prompt_file.as_ref().and(text_prompt.as_ref()).map(Vec::len),
        memory: Memory::measure(&a, model, &pool)?,
    };
    if a.json {
        report.print_json();
    } else {
        report.print_table();
    }
    Ok(())
}

/// The test sizes the flags ask for (zeros dropped) and the positions they need.
struct Plan {
    /// Prompt tokens of the pp tests.
    pps: Vec<usize>,
    /// Generated tokens of the tg tests.
    tgs: Vec<usize>,
    /// Positions every test must fit: `-c`, else the model's.
    context: usize,
    /// The deepest `-d`.
    max_depth: usize,
    /// Positions the random-token KV cache is reserved for: the deepest depth and the largest test.
    ctx: usize,
    /// Tokens of the conversation --bandwidth parks and restores.
    kv_tokens: usize,
}

impl Plan {
    /// The tests of `a`, refused when one (at any depth) does not fit `context`.
    fn new(a: &BenchArgs, context: usize) -> anyhow::Result<Plan> {
        let nonzero = |sizes: &[usize]| sizes.iter().copied().filter(|&n| n > 0).collect::<Vec<usize>>();
        let (pps, tgs) = (nonzero(&a.n_prompt), nonzero(&a.n_gen));
        let max_test = pps.iter().chain(&tgs).copied().max().unwrap_or(0);
        let max_depth = a.n_depth.iter().copied().max().unwrap_or(0);
        let ctx = (max_depth + max_test).max(1);
        let plan = Plan { pps, tgs, context, max_depth, ctx, kv_tokens: a.kv_tokens as usize };
        plan.check_context(a)?;
        Ok(plan)
    }

    /// Refuses a test, a depth or --kv-tokens that needs more positions than the context holds.
    fn check_context(&self, a: &BenchArgs) -> anyhow::Result<()> {
        let context = self.context;
        for &d in &a.n_depth {
            let sizes = self.pps.iter().map(|&n| ("-p", n)).chain(self.tgs.iter().map(|&n| ("-n", n)));
            for (flag, n) in sizes {
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
        let kv_tokens = self.kv_tokens;
        if a.bandwidth && kv_tokens > context {
            bail!(
                "bench --kv-tokens {kv_tokens}: the test needs {kv_tokens} positions but the context holds {context} (-c)"
            );
        }
        Ok(())
    }

    /// Refuses a depth when the tg test runs after a real prompt (`real_prompt`), which is its context.
    fn check_depth_without_prompt(&self, real_prompt: bool) -> anyhow::Result<()> {
        let max_depth = self.max_depth;
        if max_depth > 0 && real_prompt {
            bail!(
                "bench -d {max_depth}: the tg test after a real prompt (--prompt-file, speculative decoding) has its \
                 prompt for context; -d is for the random-token tests"
            );
        }
        Ok(())
    }

    /// Positions the largest KV cache of the run holds: the random-token tests', or --bandwidth's.
    fn kv_positions(&self, a: &BenchArgs) -> usize {
        self.ctx.max(if a.bandwidth { self.kv_tokens } else { 0 })
    }
}

/// `n` random tokens below `n_vocab`, the same on every run: the depth's, then the pp tests'.
fn random_tokens(n_vocab: usize, n: usize) -> Vec<u32> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
    (0..n).map(|_| rng.gen_range(0..n_vocab as u32)).collect()
}

/// The prompt the tg tests decode after: --prompt-file's tokens, else with speculative decoding (`spec`) the
/// first pp test's (`first_pp`) random tokens; none for an empty one.
fn text_prompt(
    a: &BenchArgs,
    tokenizer: &Tokenizer,
    spec: bool,
    first_pp: Option<usize>,
    tokens: &[u32],
) -> anyhow::Result<Option<Vec<u32>>> {
    Ok(match &a.prompt_file {
        Some(p) => {
            let text = super::input::read_text_capped(p, super::input::PROMPT_FILE_CAP_BYTES, "--prompt-file")?;
            Some(tokenize_prompt(tokenizer, &text))
        }
        None => spec.then(|| tokens[..first_pp.unwrap_or(0)].to_vec()).filter(|p| !p.is_empty()),
    })
}

/// Runs each tg test after `prompt`, plainly and (with `spec`) with drafts, adding them to `tests`: the rate
/// and drafts counted of the first test with drafts.
fn text_tests(
    a: &BenchArgs,
    loaded: &Loaded,
    pool: &ThreadPool,
    spec: Option<&SpecSetup>,
    prompt: &[u32],
    plan: &Plan,
    tests: &mut Vec<Measured>,
) -> anyhow::Result<Option<SpecRate>> {
    let (model, context) = (&loaded.model, plan.context);
    let mut spec_tg = None;
    for &n in &plan.tgs {
        let need = prompt.len() + n;
        if need > context {
            bail!(
                "bench: the prompt ({} tokens) and -n {n} need {need} positions but the context holds {context} (-c)",
                prompt.len()
            );
        }
        let mut drafter = spec.map(|s| s.drafter(a.engine.kv, need, model.cfg.n_vocab)).transpose()?;
        let text = TextRun {
            model,
            tokenizer: &loaded.tokenizer,
            pool,
            prompt,
            n,
            batch: a.engine.batch as usize,
            kv: a.engine.kv,
        };
        let (plain, drafted) = text.measure(a.reps, drafter.as_mut())?;
        tests.push(Measured { kind: Kind::Tg(n), depth: 0, spec: None, streams: 1, samples_tok_s: plain, parts: None });
        if let Some(s) = drafted {
            let samples_tok_s = s.samples.clone();
            tests.push(Measured {
                kind: Kind::Tg(n),
                depth: 0,
                spec: Some(spec_kind(&a.engine)),
                streams: 1,
                samples_tok_s,
                parts: None,
            });
            spec_tg.get_or_insert(s);
        }
    }
    Ok(spec_tg)
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
    /// Time the parts of the forward pass (--type-report).
    type_report: bool,
    /// Sequences the tg tests decode at once (--streams).
    streams: usize,
}

impl RandomRun<'_> {
    /// Runs the pp tests and (`with_tg`: when no real prompt comes first) the tg tests at each depth.
    fn at_depths(&self, plan: &Plan, depths: &[usize], with_tg: bool) -> anyhow::Result<Vec<Measured>> {
        let mut tests = Vec::new();
        for &d in depths {
            let pps = plan.pps.iter().map(|&n| Kind::Pp(n));
            let kinds: Vec<Kind> = pps.chain(plan.tgs.iter().filter(|_| with_tg).map(|&n| Kind::Tg(n))).collect();
            if !kinds.is_empty() {
                tests.extend(self.at_depth(d, plan.ctx, &kinds)?);
            }
        }
        Ok(tests)
    }

    /// Computes `depth` tokens of context once (untimed) in a KV cache reserved for `cap` positions up front
    /// (as llama-bench allocates before timing), then runs each test `1 + reps` times from it.
    fn at_depth(&self, depth: usize, cap: usize, kinds: &[Kind]) -> anyhow::Result<Vec<Measured>> {
        let mut kvs = Vec::with_capacity(self.streams);
        for _ in 0..self.streams {
            let mut kv = self.model.new_kv(self.e.kv, cap)?;
            kv.reserve(cap).with_context(|| format!("cannot reserve the KV cache of {cap} positions"))?;
            self.prefill(&mut kv, &self.tokens[..depth])?;
            kvs.push(kv);
        }
        let mut out = Vec::new();
        for &kind in kinds {
            let mut samples_tok_s = Vec::new();
            let mut parts = Parts::default();
            profile::set_enabled(self.type_report);
            for rep in 0..=self.reps {
                kvs.iter_mut().for_each(|kv| kv.truncate(depth));
                profile::take();
                let (secs, n) = match kind {
                    Kind::Pp(n) => {
                        let t = Instant::now();
                        self.prefill(&mut kvs[0], &self.tokens[depth..depth + n])?;
                        (t.elapsed().as_secs_f64(), n)
                    }
                    Kind::Tg(n) => (self.decode(&mut kvs, n)?, n * self.streams),
                };
                let spent = profile::take();
                // The first run warms up.
                if rep > 0 {
                    samples_tok_s.push(n as f64 / secs);
                    let timed = (self.reps as usize * n) as f64;
                    for (p, s) in parts.per_token_s.iter_mut().zip(spent) {
                        *p += s / timed;
                    }
                    parts.total_per_token_s += secs / timed;
                }
            }
            profile::set_enabled(false);
            let parts = self.type_report.then_some(parts);
            let streams = if matches!(kind, Kind::Tg(_)) { self.streams } else { 1 };
            out.push(Measured { kind, depth, spec: None, streams, samples_tok_s, parts });
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

    /// Seconds to decode `n` tokens one at a time in each of `kvs` (together in one pass per step when
    /// there are several).
    fn decode(&self, kvs: &mut [KvCache], n: usize) -> anyhow::Result<f64> {
        let last = self.model.cfg.n_vocab as u32 - 1;
        // Each sequence starts from its own token.
        let mut tokens: Vec<u32> = (0..kvs.len() as u32).map(|i| (1 + i).min(last)).collect();
        let t = Instant::now();
        for _ in 0..n {
            if let [kv] = kvs {
                let logits = self.model.forward(self.pool, kv, &tokens, &[0])?;
                tokens[0] = argmax(logits.row(0));
                continue;
            }
            let mut inputs: Vec<SeqInput> = kvs
                .iter_mut()
                .zip(&tokens)
                .map(|(kv, t)| SeqInput { kv, tokens: std::slice::from_ref(t), want: &[0] })
                .collect();
            let out = self.model.forward_many(self.pool, &mut inputs);
            for (token, logits) in tokens.iter_mut().zip(out) {
                *token = argmax(logits?.row(0));
            }
        }
        Ok(t.elapsed().as_secs_f64())
    }
}

/// The most likely token: fed back so that each step's work depends on the one before, as in real decoding.
fn argmax(logits: &[f32]) -> u32 {
    logits.iter().enumerate().fold((0, f32::NEG_INFINITY), |b, (i, &v)| if v > b.1 { (i, v) } else { b }).0 as u32
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
        let req = Request::new(self.prompt, &params).drafting(drafter);
        let g = generate(self.model, self.tokenizer, self.pool, &mut seq, req, &mut Quiet)?;
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

/// The mean of `rates` and their sample standard deviation.
fn mean_sd(rates: &[f64]) -> (f64, f64) {
    let mean = rates.iter().sum::<f64>() / rates.len() as f64;
    let var = rates.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / (rates.len().max(2) - 1) as f64;
    (mean, var.sqrt())
}
