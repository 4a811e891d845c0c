//! The request loop of one sequence: reuse of a cached prefix, prompt processing in chunks, decoding with a
//! sampler, stop conditions, and the timings of each phase.
//!
//! It owns no model state beyond the live sequence (tokens + KV cache); the model is shared and immutable.

pub mod batch;
pub mod session;
pub mod spec;

use std::time::Instant;

use crate::grammar::{Constraint, GrammarError};
use crate::model::{KvCache, KvType, Logits, Model, ModelError};
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
        // Below `min_len` a sliding-window layer has freed keys: back to nothing (the next request rereads).
        let n = if n < self.kv.min_len() { 0 } else { n };
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
    /// The recorded log-probabilities are those of the distribution the sampler draws from (penalties,
    /// filters and temperature applied: llama.cpp's `post_sampling_probs`), not of the model's softmax.
    pub post_sampling: bool,
    pub batch: usize,
    /// The grammar the output must follow (a JSON schema, GBNF, ...), in its state before the first token.
    /// Speculative decoding is off for such a request: every token goes through the mask.
    pub grammar: Option<Constraint>,
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
            post_sampling: false,
            batch: DEFAULT_BATCH,
            grammar: None,
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
    prefill_until(model, pool, seq, prompt, batch, &mut || false)
}

/// [`prefill`] that stops between chunks (with [`EngineError::Cancelled`], the sequence holding the chunks
/// read) when `cancelled` says so.
fn prefill_until(
    model: &Model,
    pool: &ThreadPool,
    seq: &mut Sequence,
    prompt: &[u32],
    batch: usize,
    cancelled: &mut dyn FnMut() -> bool,
) -> Result<(Vec<f32>, usize), EngineError> {
    let reused = keep_prefix(seq, prompt)?;
    let rest = &prompt[reused..];
    let mut last = Vec::new();
    for chunk in rest.chunks(batch.max(1)) {
        if cancelled() {
            return Err(EngineError::Cancelled);
        }
        let logits = model.forward(pool, &mut seq.kv, chunk, &[chunk.len() - 1]).inspect_err(|_| seq.rewind(reused))?;
        seq.tokens.extend_from_slice(chunk);
        last = logits.data;
    }
    // The next turn's common prefix usually ends here (the reply is rendered anew): keep it restorable.
    seq.kv.set_protect(Some(prompt.len()));
    Ok((last, reused))
}

/// Checks `prompt` against `seq` and cuts `seq` back to the longest prefix it shares with it that can be
/// reused: at least the last prompt token is read again (its logits are needed), and a prefix shorter than
/// a sliding-window layer's kept keys is read again whole. How many tokens are reused.
fn keep_prefix(seq: &mut Sequence, prompt: &[u32]) -> Result<usize, EngineError> {
    if prompt.is_empty() {
        return Err(EngineError::EmptyPrompt);
    }
    if prompt.len() > seq.kv.max_tokens {
        return Err(ModelError::ContextOverflow { needed: prompt.len(), max: seq.kv.max_tokens }.into());
    }
    let common = seq.tokens.iter().zip(prompt).take_while(|(a, b)| a == b).count();
    let reused = common.min(prompt.len() - 1);
    let reused = if reused < seq.kv.min_len() { 0 } else { reused };
    seq.tokens.truncate(reused);
    seq.kv.truncate(reused);
    seq.kv.set_protect(None);
    Ok(reused)
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("{0}")]
    Grammar(#[from] GrammarError),
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

/// An [`Observer`] that wants nothing: it drops the text and never cancels.
pub struct Quiet;

impl Observer for Quiet {
    fn on_text(&mut self, _: &str, _: &Generation) {}
}

/// One generation asked of the engine: the prompt to continue, how, and the drafter that speculates for it
/// (none: plain decoding).
pub struct Request<'r, 'd> {
    pub prompt: &'r [u32],
    pub params: &'r GenerateParams,
    pub drafter: Option<&'r mut Drafter<'d>>,
}

impl<'r, 'd> Request<'r, 'd> {
    /// `prompt` continued as `params` say, decoding plainly.
    pub fn new(prompt: &'r [u32], params: &'r GenerateParams) -> Request<'r, 'd> {
        Request { prompt, params, drafter: None }
    }

    /// The same request with speculative decoding by `drafter`, when there is one.
    pub fn drafting(self, drafter: Option<&'r mut Drafter<'d>>) -> Request<'r, 'd> {
        Request { drafter, ..self }
    }
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
    /// With `post_sampling`: the chain the figures come from instead of the softmax.
    post_sampling: Option<PostSampling>,
    /// Bytes of `out.text` already passed to the observer.
    emitted: usize,
}

/// The sampler's own distribution for the recorded figures (`GenerateParams::post_sampling`): a second
/// sampler with the request's configuration (it draws nothing, so the request's random stream is untouched)
/// and the history its penalties look at.
struct PostSampling {
    sampler: Sampler,
    banned: Vec<u32>,
    /// The prompt's last `repeat_last_n` tokens: the penalty window before any output.
    prompt_tail: Vec<u32>,
}

impl PostSampling {
    /// `(id, probability)` of every token the chain could draw after `generated`, most likely first.
    fn distribution(&mut self, logits: &[f32], generated: &[u32]) -> Vec<(u32, f64)> {
        let window = self.sampler.config().repeat_last_n;
        let dist = if generated.len() >= window {
            self.sampler.distribution(logits, &generated[generated.len() - window..], &self.banned)
        } else {
            let history: Vec<u32> = self.prompt_tail.iter().chain(generated).copied().collect();
            self.sampler.distribution(logits, &history, &self.banned)
        };
        dist.unwrap_or_default()
    }
}

impl Emitter<'_> {
    /// Adds `id`, chosen from `logits`, to the output; the reason to stop there, if any.
    fn push(&mut self, out: &mut Generation, logits: &[f32], id: u32, obs: &mut dyn Observer) -> Option<StopReason> {
        if let Some(post) = &mut self.post_sampling {
            let dist = post.distribution(logits, &out.tokens);
            let ln = |p: f64| p.ln() as f32;
            if self.top_logprobs > 0 {
                out.top_logprobs.push(dist.iter().take(self.top_logprobs).map(|&(t, p)| (t, ln(p))).collect());
            }
            out.token_logprobs.push(ln(crate::sample::prob_in(&dist, id)));
        } else {
            if self.top_logprobs > 0 {
                out.top_logprobs.push(log_softmax_top_k(logits, self.top_logprobs));
            }
            if self.logprobs {
                out.token_logprobs.push(log_prob_of(logits, id));
            }
        }
        out.tokens.push(id);
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

/// Generates after `req.prompt` into `seq`: prefill (reusing `seq`'s common prefix, in chunks of
/// `params.batch`), then decode until a stop condition, passing the text to `obs` as it is produced (never a
/// split UTF-8 character, never part of a stop string) and asking it before every pass whether to stop.
///
/// With a drafter, after each token the drafter proposes drafts, the target runs once over the token and its
/// drafts, keeps the longest accepted prefix plus its own next token, and drops the rejected tail's KV (its
/// pages are freed). A step whose batched pass cannot get device memory decodes plainly for the rest of the
/// request.
pub fn generate(
    model: &Model,
    tokenizer: &Tokenizer,
    pool: &ThreadPool,
    seq: &mut Sequence,
    req: Request,
    obs: &mut dyn Observer,
) -> Result<Generation, EngineError> {
    let Request { prompt, params, mut drafter } = req;
    if params.grammar.is_some() {
        drafter = None;
    }
    let t0 = Instant::now();
    let (logits, reused) = prefill_until(model, pool, seq, prompt, params.batch, &mut || obs.cancelled())?;
    if let Some(d) = drafter.as_deref_mut() {
        d.begin(pool, prompt, &params.sampler);
    }
    let mut out = Generation::empty(prompt.len(), reused, t0.elapsed().as_secs_f64() * 1e3);

    let t1 = Instant::now();
    let mut dec = Decoder::new(model, tokenizer, pool, params, prompt, reused);
    // The token just chosen (not yet in the KV cache) and the logits it was chosen from.
    let mut id = dec.sample(&logits, &seq.tokens)?;
    let mut id_logits = logits;
    'decode: loop {
        if let Some(reason) = dec.emit.push(&mut out, &id_logits, id, obs) {
            out.stop_reason = reason;
            break;
        }
        if let Some(reason) = dec.limit(&out, seq, obs) {
            out.stop_reason = reason;
            break;
        }
        let drafts = dec.propose(drafter.as_deref_mut(), seq, id, out.tokens.len());
        if drafts.tokens.is_empty() {
            (id, id_logits) = dec.plain_step(seq, id)?;
            continue;
        }
        let Some(step) = dec.verify(seq, id, &drafts)? else {
            // Nothing was appended and the pass's pages are freed: decode this step plainly, and the rest of
            // the request too.
            drafter = None;
            (id, id_logits) = dec.plain_step(seq, id)?;
            continue;
        };
        let k = drafts.tokens.len();
        out.drafts_proposed += k;
        out.drafts_accepted += step.kept;
        if let Some(d) = drafter.as_deref_mut() {
            d.verified(k, step.kept);
            d.kept(&seq.tokens);
        }
        for i in 0..step.kept {
            if let Some(reason) = dec.emit.push(&mut out, step.rows.row(i), drafts.tokens[i], obs) {
                out.stop_reason = reason;
                break 'decode;
            }
        }
        id = step.next;
        id_logits = step.rows.row(step.kept).to_vec();
    }
    // As without drafts, the sequence holds the prompt and every output token but the last.
    let settled = prompt.len() + out.tokens.len().saturating_sub(1);
    if seq.tokens.len() > settled {
        seq.rewind(settled);
        if let Some(d) = drafter {
            d.kept(&seq.tokens);
        }
    }
    dec.emit.finish(&mut out, obs);
    out.gen_ms = t1.elapsed().as_secs_f64() * 1e3;
    Ok(out)
}

impl Generation {
    /// A generation that has read its prompt and produced nothing yet.
    fn empty(prompt_tokens: usize, reused_tokens: usize, prompt_ms: f64) -> Generation {
        Generation {
            tokens: Vec::new(),
            text: String::new(),
            top_logprobs: Vec::new(),
            token_logprobs: Vec::new(),
            stop_reason: StopReason::Length,
            prompt_tokens,
            reused_tokens,
            prompt_ms,
            gen_ms: 0.0,
            drafts_proposed: 0,
            drafts_accepted: 0,
        }
    }
}

/// One speculative step the target verified: the drafts kept, the target's token after them, and the
/// logits of every position of the pass (row i: after the i-th of the token and its drafts).
struct Verified {
    kept: usize,
    next: u32,
    rows: Logits,
}

/// The decoding side of one generation: the target's passes, the sampler, and the output it feeds.
struct Decoder<'m> {
    model: &'m Model,
    pool: &'m ThreadPool,
    /// `max_tokens` of the request.
    max_tokens: usize,
    sampler: Sampler,
    /// Tokens never sampled (end-of-generation ones under `ignore_eos`).
    banned: Vec<u32>,
    /// The request's grammar, advanced by every token sampled, and the masked copy of the logits.
    grammar: Option<Constraint>,
    masked: Vec<f32>,
    /// Prompt tokens the sequence held before: a failed pass rewinds to them.
    reused: usize,
    emit: Emitter<'m>,
}

impl<'m> Decoder<'m> {
    fn new(
        model: &'m Model,
        tokenizer: &'m Tokenizer,
        pool: &'m ThreadPool,
        params: &GenerateParams,
        prompt: &[u32],
        reused: usize,
    ) -> Decoder<'m> {
        let eog = tokenizer.eog_ids();
        let banned: Vec<u32> = if params.ignore_eos { eog.to_vec() } else { Vec::new() };
        let post_sampling = params.post_sampling.then(|| PostSampling {
            sampler: Sampler::new(params.sampler.clone()),
            banned: banned.clone(),
            prompt_tail: prompt[prompt.len().saturating_sub(params.sampler.repeat_last_n)..].to_vec(),
        });
        let emit = Emitter {
            tokenizer,
            eog,
            ignore_eos: params.ignore_eos,
            stream: StreamDecoder::new(),
            stops: StopStrings::new(params.stop.iter().cloned()),
            top_logprobs: params.top_logprobs,
            logprobs: params.logprobs || params.top_logprobs > 0,
            post_sampling,
            emitted: 0,
        };
        let sampler = Sampler::new(params.sampler.clone());
        Decoder {
            model,
            pool,
            max_tokens: params.max_tokens,
            sampler,
            banned,
            grammar: params.grammar.clone(),
            masked: Vec::new(),
            reused,
            emit,
        }
    }

    /// The next token after `logits`; with a grammar, among the tokens it allows (the grammar then
    /// advances past it).
    fn sample(&mut self, logits: &[f32], history: &[u32]) -> Result<u32, EngineError> {
        let Some(g) = &mut self.grammar else {
            return self.sampler.try_sample(logits, history, &self.banned).ok_or(EngineError::NoToken);
        };
        self.masked.clear();
        self.masked.extend_from_slice(logits);
        g.mask(&mut self.masked)?;
        let id = self.sampler.try_sample(&self.masked, history, &self.banned).ok_or(EngineError::NoToken)?;
        g.commit(id)?;
        Ok(id)
    }

    /// Why decoding stops before the next pass, if it does: `max_tokens`, a full context, or the caller.
    fn limit(&self, out: &Generation, seq: &Sequence, obs: &mut dyn Observer) -> Option<StopReason> {
        if self.grammar.as_ref().is_some_and(Constraint::finished) {
            // The grammar is complete: only an end-of-generation token could follow.
            Some(StopReason::Eog)
        } else if out.tokens.len() >= self.max_tokens {
            Some(StopReason::Length)
        } else if seq.kv.len() >= seq.kv.max_tokens {
            Some(StopReason::Context)
        } else if obs.cancelled() {
            Some(StopReason::Cancelled)
        } else {
            None
        }
    }

    /// The drafter's proposal after `id`, sized to fit what is left of `max_tokens` and of the context after
    /// `id` and the target's own token (none without a drafter or room).
    fn propose(&self, drafter: Option<&mut Drafter>, seq: &Sequence, id: u32, produced: usize) -> Drafts {
        let room = (self.max_tokens - produced - 1).min(seq.kv.max_tokens - seq.kv.len() - 1);
        match drafter {
            Some(d) if room > 0 => {
                let mut context = Vec::with_capacity(seq.tokens.len() + 1);
                context.extend_from_slice(&seq.tokens);
                context.push(id);
                d.propose(self.pool, &context, room, &self.banned)
            }
            _ => Drafts::default(),
        }
    }

    /// One plain pass: `id` enters the sequence; the next token and the logits it was chosen from.
    fn plain_step(&mut self, seq: &mut Sequence, id: u32) -> Result<(u32, Vec<f32>), EngineError> {
        let l = self.model.forward(self.pool, &mut seq.kv, &[id], &[0]).inspect_err(|_| seq.rewind(self.reused))?;
        seq.tokens.push(id);
        let next = self.sample(&l.data, &seq.tokens)?;
        Ok((next, l.data))
    }

    /// One pass over `id` and the drafts, judged position by position; the rejected tail leaves the sequence
    /// and its KV (emptied pages are freed). None when the pass could not get device memory: then nothing
    /// was appended.
    fn verify(&mut self, seq: &mut Sequence, id: u32, drafts: &Drafts) -> Result<Option<Verified>, EngineError> {
        let k = drafts.tokens.len();
        let mut batch = Vec::with_capacity(k + 1);
        batch.push(id);
        batch.extend_from_slice(&drafts.tokens);
        let want: Vec<usize> = (0..=k).collect();
        let rows = match self.model.forward(self.pool, &mut seq.kv, &batch, &want) {
            Ok(l) => l,
            Err(ModelError::Device(e)) => {
                tracing::warn!("speculative decoding: the verification pass failed, plain decoding for the rest of this request: {e}");
                return Ok(None);
            }
            Err(e) => {
                seq.rewind(self.reused);
                return Err(e.into());
            }
        };
        let base = seq.tokens.len() + 1; // positions in the KV cache up to and including `id`
        seq.tokens.extend_from_slice(&batch);
        let mut kept = 0;
        let mut next = None;
        for (i, &d) in drafts.tokens.iter().enumerate() {
            let history = &seq.tokens[..base + i];
            let q = drafts.q.get(i).map(Vec::as_slice);
            match judge(&mut self.sampler, rows.row(i), history, &self.banned, d, q)? {
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
            None => self.sample(rows.row(k), &seq.tokens)?,
        };
        if kept < k {
            seq.rewind(base + kept);
        }
        Ok(Some(Verified { kept, next, rows }))
    }
}
