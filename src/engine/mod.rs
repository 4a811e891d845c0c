//! The request loop of one sequence: reuse of a cached prefix, prompt processing in chunks, decoding with a
//! sampler, stop conditions, and the timings of each phase.
//!
//! It owns no model state beyond the live sequence (tokens + KV cache); the model is shared and immutable.

pub mod session;
pub mod spec;

use std::time::Instant;

use crate::model::{KvCache, KvType, Model, ModelError};
use crate::sample::{
    log_prob_of, log_softmax_top_k, prob_in, residual, Sampler, SamplerConfig, StopCheck, StopStrings,
};
use crate::threadpool::ThreadPool;
use crate::tokenizer::{StreamDecoder, Tokenizer};

use spec::{Drafter, Drafts};

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
    /// Draft tokens the target verified, and how many of them it kept (speculative decoding).
    pub drafts_proposed: usize,
    pub drafts_accepted: usize,
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
pub struct TextOnly<F>(pub F);

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
    generate_with(model, tokenizer, pool, seq, prompt, params, obs, None)
}

/// The output side of a generation: tokens with their log-probabilities, text through the stream decoder
/// and the stop strings, and what was already passed to the observer.
struct Emitter<'t> {
    tokenizer: &'t Tokenizer,
    eog: &'t [u32],
    ignore_eos: bool,
    stream: StreamDecoder,
    stops: StopStrings,
    top_logprobs: usize,
    logprobs: bool,
    /// Bytes of `out.text` already passed to the observer.
    emitted: usize,
}

impl Emitter<'_> {
    /// Adds `id`, chosen from `logits`, to the output; the reason to stop there, if any.
    fn push(&mut self, out: &mut Generation, logits: &[f32], id: u32, obs: &mut dyn Observer) -> Option<StopReason> {
        if self.top_logprobs > 0 {
            out.top_logprobs.push(log_softmax_top_k(logits, self.top_logprobs));
        }
        out.tokens.push(id);
        if self.logprobs {
            out.token_logprobs.push(log_prob_of(logits, id));
        }
        if !self.ignore_eos && self.eog.contains(&id) {
            return Some(StopReason::Eog);
        }
        out.text.push_str(&self.stream.push(self.tokenizer, id));
        let held_back = match self.stops.check(&out.text) {
            StopCheck::Stop { cut_at } => {
                out.text.truncate(cut_at);
                return Some(StopReason::Stop);
            }
            StopCheck::Continue { held_back_bytes } => held_back_bytes,
        };
        let safe = out.text.len() - held_back;
        if safe > self.emitted {
            obs.on_text(&out.text[self.emitted..safe], out);
            self.emitted = safe;
        }
        None
    }

    /// The text held back at the end (a partial character, a stop string's possible start), passed on.
    fn finish(&mut self, out: &mut Generation, obs: &mut dyn Observer) {
        if out.stop_reason != StopReason::Stop {
            out.text.push_str(&self.stream.finish());
        }
        if out.text.len() > self.emitted {
            let rest = out.text[self.emitted..].to_owned();
            obs.on_text(&rest, out);
        }
    }
}

/// The target's choice after one verified position: the draft kept, or the token that replaces it.
enum Verdict {
    Keep,
    Replace(u32),
}

/// Speculative sampling's test of draft `d` against the target's `logits` (Leviathan et al. 2023): greedy
/// keeps `d` exactly when it is the target's own pick; with temperature, `d` is kept with probability
/// `min(1, p(d) / q(d))` (q: the draft's distribution, a point mass for deterministic drafts), and a
/// rejected one is replaced by a draw from `max(0, p - q)`.
fn judge(
    sampler: &mut Sampler,
    logits: &[f32],
    history: &[u32],
    banned: &[u32],
    d: u32,
    q: Option<&[(u32, f64)]>,
) -> Result<Verdict, EngineError> {
    if sampler.config().is_greedy() {
        let t = sampler.try_sample(logits, history, banned).ok_or(EngineError::NoToken)?;
        return Ok(if t == d { Verdict::Keep } else { Verdict::Replace(t) });
    }
    let p = sampler.distribution(logits, history, banned).ok_or(EngineError::NoToken)?;
    let point = [(d, 1.0)];
    let q = q.unwrap_or(&point);
    let (pd, qd) = (prob_in(&p, d), prob_in(q, d));
    if qd > 0.0 && sampler.uniform() * qd < pd {
        return Ok(Verdict::Keep);
    }
    sampler.draw_from(&residual(&p, q)).map(Verdict::Replace).ok_or(EngineError::NoToken)
}

/// [`generate_observed`] with speculative decoding when `drafter` is given: after each token the drafter
/// proposes drafts, the target runs once over the token and its drafts, keeps the longest accepted prefix
/// plus its own next token, and drops the rejected tail's KV (its pages are freed). A step whose batched
/// pass cannot get device memory decodes plainly for the rest of the request.
#[allow(clippy::too_many_arguments)]
pub fn generate_with(
    model: &Model,
    tokenizer: &Tokenizer,
    pool: &ThreadPool,
    seq: &mut Sequence,
    prompt: &[u32],
    params: &GenerateParams,
    obs: &mut dyn Observer,
    mut drafter: Option<&mut Drafter>,
) -> Result<Generation, EngineError> {
    let t0 = Instant::now();
    let (logits, reused) =
        prefill_observed(model, pool, seq, prompt, params.batch, &mut |_| {}, &mut || obs.cancelled())?;
    if let Some(d) = drafter.as_deref_mut() {
        d.begin(pool, prompt, &params.sampler);
    }
    let prompt_ms = t0.elapsed().as_secs_f64() * 1e3;

    let t1 = Instant::now();
    let mut sampler = Sampler::new(params.sampler.clone());
    let eog = tokenizer.eog_ids();
    let banned: Vec<u32> = if params.ignore_eos { eog.to_vec() } else { Vec::new() };
    let mut emit = Emitter {
        tokenizer,
        eog,
        ignore_eos: params.ignore_eos,
        stream: StreamDecoder::new(),
        stops: StopStrings::new(params.stop.iter().cloned()),
        top_logprobs: params.top_logprobs,
        logprobs: params.logprobs || params.top_logprobs > 0,
        emitted: 0,
    };
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
        drafts_proposed: 0,
        drafts_accepted: 0,
    };
    // The token just chosen (not yet in the KV cache) and the logits it was chosen from.
    let mut id = sampler.try_sample(&logits, &seq.tokens, &banned).ok_or(EngineError::NoToken)?;
    let mut id_logits = logits;
    'decode: loop {
        if let Some(reason) = emit.push(&mut out, &id_logits, id, obs) {
            out.stop_reason = reason;
            break;
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
        // Drafts fit in what is left of max_tokens and of the context, after `id` and the target's token.
        let room = (params.max_tokens - out.tokens.len() - 1).min(seq.kv.max_tokens - seq.kv.len() - 1);
        let drafts = match drafter.as_deref_mut() {
            Some(d) if room > 0 => {
                let mut context = Vec::with_capacity(seq.tokens.len() + 1);
                context.extend_from_slice(&seq.tokens);
                context.push(id);
                d.propose(pool, &context, room, &banned)
            }
            _ => Drafts::default(),
        };
        if drafts.tokens.is_empty() {
            let l = model.forward(pool, &mut seq.kv, &[id], &[0]).inspect_err(|_| seq.rewind(reused))?;
            seq.tokens.push(id);
            id_logits = l.data;
            id = sampler.try_sample(&id_logits, &seq.tokens, &banned).ok_or(EngineError::NoToken)?;
            continue;
        }
        // One pass over `id` and the k drafts: row i holds the logits after the i-th of them.
        let k = drafts.tokens.len();
        let mut batch = Vec::with_capacity(k + 1);
        batch.push(id);
        batch.extend_from_slice(&drafts.tokens);
        let want: Vec<usize> = (0..=k).collect();
        let rows = match model.forward(pool, &mut seq.kv, &batch, &want) {
            Ok(l) => l,
            Err(ModelError::Device(e)) => {
                // Nothing was appended and the pass's pages are freed: decode this step plainly, and the
                // rest of the request too.
                tracing::warn!("speculative decoding: the verification pass failed, plain decoding for the rest of this request: {e}");
                drafter = None;
                let l = model.forward(pool, &mut seq.kv, &[id], &[0]).inspect_err(|_| seq.rewind(reused))?;
                seq.tokens.push(id);
                id_logits = l.data;
                id = sampler.try_sample(&id_logits, &seq.tokens, &banned).ok_or(EngineError::NoToken)?;
                continue;
            }
            Err(e) => {
                seq.rewind(reused);
                return Err(e.into());
            }
        };
        let base = seq.tokens.len() + 1; // positions in the KV cache up to and including `id`
        seq.tokens.extend_from_slice(&batch);
        let mut kept = 0;
        let mut next = None;
        for (i, &d) in drafts.tokens.iter().enumerate() {
            let history = &seq.tokens[..base + i];
            match judge(&mut sampler, rows.row(i), history, &banned, d, drafts.q.get(i).map(Vec::as_slice))? {
                Verdict::Keep => kept += 1,
                Verdict::Replace(t) => {
                    next = Some(t);
                    break;
                }
            }
        }
        let next = match next {
            Some(t) => t,
            // Every draft kept: the target's own token after the last one.
            None => sampler.try_sample(rows.row(k), &seq.tokens, &banned).ok_or(EngineError::NoToken)?,
        };
        out.drafts_proposed += k;
        out.drafts_accepted += kept;
        // The rejected tail leaves the sequence and its KV (emptied pages are freed).
        if kept < k {
            seq.rewind(base + kept);
        }
        if let Some(d) = drafter.as_deref_mut() {
            d.verified(k, kept);
            d.kept(&seq.tokens);
        }
        for i in 0..kept {
            if let Some(reason) = emit.push(&mut out, rows.row(i), drafts.tokens[i], obs) {
                out.stop_reason = reason;
                break 'decode;
            }
        }
        id = next;
        id_logits = rows.row(kept).to_vec();
    }
    // As without drafts, the sequence holds the prompt and every output token but the last.
    let settled = prompt.len() + out.tokens.len().saturating_sub(1);
    if seq.tokens.len() > settled {
        seq.rewind(settled);
        if let Some(d) = drafter {
            d.kept(&seq.tokens);
        }
    }
    emit.finish(&mut out, obs);
    out.gen_ms = t1.elapsed().as_secs_f64() * 1e3;
    Ok(out)
}
