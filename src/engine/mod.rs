//! The request loop of one sequence: reuse of a cached prefix, prompt processing in chunks, decoding with a
//! sampler, stop conditions, and the timings of each phase.
//!
//! It owns no model state beyond the live sequence (tokens + KV cache); the model is shared and immutable.

pub mod session;

use std::time::Instant;

use crate::model::{KvCache, KvType, Model, ModelError};
use crate::sample::{log_prob_of, log_softmax_top_k, Sampler, SamplerConfig, StopCheck, StopStrings};
use crate::threadpool::ThreadPool;
use crate::tokenizer::{StreamDecoder, Tokenizer};

pub use crate::model::DEFAULT_BATCH;

/// A live sequence: the tokens whose K and V rows are in `kv`.
pub struct Sequence {
    pub tokens: Vec<u32>,
    pub kv: KvCache,
}

impl Sequence {
    pub fn new(model: &Model, kv_type: KvType, max_tokens: usize) -> Result<Sequence, ModelError> {
        Ok(Sequence { tokens: Vec::new(), kv: model.new_kv(kv_type, max_tokens)? })
    }

    /// Forgets every token.
    pub fn clear(&mut self) {
        self.tokens.clear();
        self.kv.truncate(0);
    }

    /// Goes back to the first `n` tokens and frees the KV pages past them: what a failed request does,
    /// so that it holds no device memory afterwards.
    pub fn rewind(&mut self, n: usize) {
        self.tokens.truncate(n);
        self.kv.truncate(n);
        self.kv.release_unused();
    }
}

/// What to generate.
#[derive(Clone, Debug)]
pub struct GenerateParams {
    pub max_tokens: usize,
    pub sampler: SamplerConfig,
    /// Never stop at (nor sample) end-of-generation tokens.
    pub ignore_eos: bool,
    pub stop: Vec<String>,
    /// Record the k most likely tokens with log-probabilities at every step (0 = off).
    pub top_logprobs: usize,
    /// Record the log-probability of every chosen token (also on when `top_logprobs > 0`).
    pub logprobs: bool,
    pub batch: usize,
}

impl Default for GenerateParams {
    fn default() -> Self {
        GenerateParams {
            max_tokens: 128,
            sampler: SamplerConfig::default(),
            ignore_eos: false,
            stop: Vec::new(),
            top_logprobs: 0,
            logprobs: false,
            batch: DEFAULT_BATCH,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// An end-of-generation token.
    Eog,
    /// A stop string.
    Stop,
    /// `max_tokens` reached.
    Length,
    /// The context is full.
    Context,
    /// The caller asked to stop (a client that went away).
    Cancelled,
}

/// The result of one generation.
#[derive(Clone, Debug)]
pub struct Generation {
    pub tokens: Vec<u32>,
    pub text: String,
    pub top_logprobs: Vec<Vec<(u32, f32)>>,
    /// The log-probability of each token in `tokens` (empty unless asked for).
    pub token_logprobs: Vec<f32>,
    pub stop_reason: StopReason,
    pub prompt_tokens: usize,
    /// Prompt tokens whose state came from the live sequence instead of being read.
    pub reused_tokens: usize,
    pub prompt_ms: f64,
    pub gen_ms: f64,
}

/// Reads `prompt` into `seq`, reusing the longest common prefix with what `seq` holds; returns the logits of
/// the last prompt position and how many tokens were reused.
pub fn prefill(
    model: &Model,
    pool: &ThreadPool,
    seq: &mut Sequence,
    prompt: &[u32],
    batch: usize,
) -> Result<(Vec<f32>, usize), EngineError> {
    prefill_observed(model, pool, seq, prompt, batch, &mut |_| {}, &mut || false)
}

/// [`prefill`] that reports the tokens read so far after each chunk and stops between chunks (with
/// [`EngineError::Cancelled`], the sequence holding the chunks read) when `cancelled` says so.
pub fn prefill_observed(
    model: &Model,
    pool: &ThreadPool,
    seq: &mut Sequence,
    prompt: &[u32],
    batch: usize,
    on_chunk: &mut dyn FnMut(usize),
    cancelled: &mut dyn FnMut() -> bool,
) -> Result<(Vec<f32>, usize), EngineError> {
    if prompt.is_empty() {
        return Err(EngineError::EmptyPrompt);
    }
    if prompt.len() > seq.kv.max_tokens {
        return Err(ModelError::ContextOverflow { needed: prompt.len(), max: seq.kv.max_tokens }.into());
    }
    let common = seq.tokens.iter().zip(prompt).take_while(|(a, b)| a == b).count();
    // At least the last prompt token is read again: its logits are needed.
    let reused = common.min(prompt.len() - 1);
    seq.tokens.truncate(reused);
    seq.kv.truncate(reused);
    let rest = &prompt[reused..];
    let mut last = Vec::new();
    for chunk in rest.chunks(batch.max(1)) {
        if cancelled() {
            return Err(EngineError::Cancelled);
        }
        let logits = model.forward(pool, &mut seq.kv, chunk, &[chunk.len() - 1]).inspect_err(|_| seq.rewind(reused))?;
        seq.tokens.extend_from_slice(chunk);
        last = logits.data;
        on_chunk(seq.tokens.len());
    }
    Ok((last, reused))
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("no token can be sampled: every logit is banned or not a number (broken weights?)")]
    NoToken,
    #[error("the request was cancelled")]
    Cancelled,
}

/// What a generation reports as it goes, and how it is stopped from outside.
pub trait Observer {
    /// Text ready to show (never a split UTF-8 character, never part of a stop string), with the
    /// generation so far: its tokens, and their log-probabilities when asked for.
    fn on_text(&mut self, text: &str, so_far: &Generation);
    /// Checked before every forward pass: true ends the generation (`StopReason::Cancelled`; during the
    /// prompt, `EngineError::Cancelled`).
    fn cancelled(&mut self) -> bool {
        false
    }
}

/// An [`Observer`] that passes the text to a closure and never cancels.
pub(crate) struct TextOnly<F>(pub(crate) F);

impl<F: FnMut(&str)> Observer for TextOnly<F> {
    fn on_text(&mut self, text: &str, _: &Generation) {
        (self.0)(text)
    }
}

/// Generates after `prompt`: prefill (reusing `seq`'s common prefix), then decode until a stop condition.
/// `on_text` receives the text as it is produced (never a split UTF-8 character, never part of a stop
/// string).
pub fn generate(
    model: &Model,
    tokenizer: &Tokenizer,
    pool: &ThreadPool,
    seq: &mut Sequence,
    prompt: &[u32],
    params: &GenerateParams,
    on_text: impl FnMut(&str),
) -> Result<Generation, EngineError> {
    generate_observed(model, tokenizer, pool, seq, prompt, params, &mut TextOnly(on_text))
}

/// [`generate`] with an [`Observer`]: text as it comes with the tokens so far, and cancellation.
pub fn generate_observed(
    model: &Model,
    tokenizer: &Tokenizer,
    pool: &ThreadPool,
    seq: &mut Sequence,
    prompt: &[u32],
    params: &GenerateParams,
    obs: &mut dyn Observer,
) -> Result<Generation, EngineError> {
    let t0 = Instant::now();
    let (mut logits, reused) =
        prefill_observed(model, pool, seq, prompt, params.batch, &mut |_| {}, &mut || obs.cancelled())?;
    let prompt_ms = t0.elapsed().as_secs_f64() * 1e3;

    let t1 = Instant::now();
    let mut sampler = Sampler::new(params.sampler.clone());
    let eog = tokenizer.eog_ids();
    let banned: Vec<u32> = if params.ignore_eos { eog.to_vec() } else { Vec::new() };
    let mut stream = StreamDecoder::new();
    let stops = StopStrings::new(params.stop.iter().cloned());
    let mut out = Generation {
        tokens: Vec::new(),
        text: String::new(),
        top_logprobs: Vec::new(),
        token_logprobs: Vec::new(),
        stop_reason: StopReason::Length,
        prompt_tokens: prompt.len(),
        reused_tokens: reused,
        prompt_ms,
        gen_ms: 0.0,
    };
    let mut emitted = 0; // bytes of out.text already passed to on_text
    let logprobs = params.logprobs || params.top_logprobs > 0;
    while out.tokens.len() < params.max_tokens {
        if params.top_logprobs > 0 {
            out.top_logprobs.push(log_softmax_top_k(&logits, params.top_logprobs));
        }
        let id = sampler.try_sample(&logits, &seq.tokens, &banned).ok_or(EngineError::NoToken)?;
        out.tokens.push(id);
        if logprobs {
            out.token_logprobs.push(log_prob_of(&logits, id));
        }
        if !params.ignore_eos && eog.contains(&id) {
            out.stop_reason = StopReason::Eog;
            break;
        }
        out.text.push_str(&stream.push(tokenizer, id));
        let held_back = match stops.check(&out.text) {
            StopCheck::Stop { cut_at } => {
                out.text.truncate(cut_at);
                out.stop_reason = StopReason::Stop;
                break;
            }
            StopCheck::Continue { held_back_bytes } => held_back_bytes,
        };
        let safe = out.text.len() - held_back;
        if safe > emitted {
            obs.on_text(&out.text[emitted..safe], &out);
            emitted = safe;
        }
        if out.tokens.len() >= params.max_tokens {
            break;
        }
        if seq.kv.len() >= seq.kv.max_tokens {
            out.stop_reason = StopReason::Context;
            break;
        }
        if obs.cancelled() {
            out.stop_reason = StopReason::Cancelled;
            break;
        }
        let l = model.forward(pool, &mut seq.kv, &[id], &[0]).inspect_err(|_| seq.rewind(reused))?;
        seq.tokens.push(id);
        logits = l.data;
    }
    if out.stop_reason != StopReason::Stop {
        out.text.push_str(&stream.finish());
    }
    if out.text.len() > emitted {
        let rest = out.text[emitted..].to_owned();
        obs.on_text(&rest, &out);
    }
    out.gen_ms = t1.elapsed().as_secs_f64() * 1e3;
    Ok(out)
}
