//! Continuous batching: several generations, each on its own sequence, advanced together by one
//! [`Model::forward_many`] pass per step. A step takes every decoding stream's next token, then prompt
//! chunks of the streams still reading their prompts under a token budget, so a long prompt is read in
//! slices between the others' tokens instead of stalling them; a stream joins or leaves between steps.
//!
//! A stream's reply is the one [`generate`](super::generate) gives on its sequence alone: the pass gives
//! each sequence the logits it has alone (bit for bit), and each stream samples with its own sampler.

use std::time::Instant;

use crate::model::{Logits, Model, ModelError, SeqInput};
use crate::threadpool::ThreadPool;
use crate::tokenizer::Tokenizer;

use super::{keep_prefix, Decoder, EngineError, GenerateParams, Generation, Observer, Sequence, StopReason};

/// One generation in progress (plain decoding: speculative decoding runs alone, through `generate`).
pub struct Stream<'m> {
    dec: Decoder<'m>,
    prompt: Vec<u32>,
    /// Tokens of `prompt` in the sequence (reused or read so far).
    read: usize,
    /// The most prompt tokens one pass reads of this stream (`params.batch`).
    chunk: usize,
    /// The token chosen last, not yet in the sequence: what the next pass takes once decoding started.
    next: Option<u32>,
    out: Generation,
    started: Instant,
    decoding_since: Option<Instant>,
}

/// What a step did to a stream.
pub enum Progress {
    /// It took no part (no budget left for its prompt) or goes on.
    Going,
    /// Its tokens found no device memory for their KV pages while other streams shared the pass: it holds
    /// what it held before the step and takes part again in a later one (the session makes room by
    /// preempting a stream, see `Session::step`).
    Starved,
    /// It ended: its generation, or the error that ended it (the sequence then holds what it held before,
    /// or the prompt chunks read before a cancellation).
    Done(Result<Generation, EngineError>),
}

impl<'m> Stream<'m> {
    /// Starts a generation after `prompt` on `seq`, reusing the longest common prefix with what `seq`
    /// holds (`keep_prefix`, as `prefill` does).
    pub fn start(
        model: &'m Model,
        tokenizer: &'m Tokenizer,
        pool: &'m ThreadPool,
        seq: &mut Sequence,
        prompt: &[u32],
        params: &GenerateParams,
    ) -> Result<Stream<'m>, EngineError> {
        let reused = keep_prefix(seq, prompt)?;
        Ok(Stream {
            dec: Decoder::new(model, tokenizer, pool, params, prompt, reused),
            prompt: prompt.to_vec(),
            read: reused,
            chunk: params.batch.max(1),
            next: None,
            out: Generation::empty(prompt.len(), reused, 0.0),
            started: Instant::now(),
            decoding_since: None,
        })
    }

    /// Prompt tokens whose state came from the sequence instead of being read.
    pub fn reused(&self) -> usize {
        self.dec.reused
    }

    /// Whether the stream still reads its prompt.
    pub fn reading(&self) -> bool {
        self.next.is_none()
    }

    /// The tokens the next pass would take of this stream with `budget` tokens left in it: the token chosen
    /// last, or the next prompt chunk; and the index of the one whose logits are wanted (a chunk that does
    /// not end the prompt wants none).
    fn input(&self, budget: usize) -> (&[u32], Option<usize>) {
        if let Some(id) = &self.next {
            return (std::slice::from_ref(id), Some(0));
        }
        let n = (self.prompt.len() - self.read).min(self.chunk).min(budget);
        let ends = self.read + n == self.prompt.len();
        (&self.prompt[self.read..self.read + n], ends.then(|| n - 1))
    }

    /// Takes the pass's result for the `n` tokens this stream gave it: they enter `seq`, a token is sampled
    /// where logits came back, and its text goes to `obs`.
    fn advance(
        &mut self,
        seq: &mut Sequence,
        n: usize,
        result: Result<Logits, ModelError>,
        obs: &mut dyn Observer,
    ) -> Progress {
        let logits = match result {
            Ok(l) => l,
            Err(e) => {
                seq.rewind(self.dec.reused);
                return Progress::Done(Err(e.into()));
            }
        };
        let sampled = match self.next.take() {
            Some(id) => {
                seq.tokens.push(id);
                self.dec.sample(logits.row(0), &seq.tokens)
            }
            None => {
                seq.tokens.extend_from_slice(&self.prompt[self.read..self.read + n]);
                self.read += n;
                if self.read < self.prompt.len() {
                    return Progress::Going;
                }
                // The next turn's common prefix usually ends here: keep it restorable.
                seq.kv.set_protect(Some(self.prompt.len()));
                self.out.prompt_ms = self.started.elapsed().as_secs_f64() * 1e3;
                self.decoding_since = Some(Instant::now());
                self.dec.sample(logits.row(0), &seq.tokens)
            }
        };
        let id = match sampled {
            Ok(id) => id,
            Err(e) => return Progress::Done(Err(e)),
        };
        let stop = self.dec.emit.push(&mut self.out, logits.row(0), id, obs);
        match stop.or_else(|| self.dec.limit(&self.out, seq, obs)) {
            Some(reason) => Progress::Done(Ok(self.finish(reason, obs))),
            None => {
                self.next = Some(id);
                Progress::Going
            }
        }
    }

    /// Ends the stream at its client's word while it takes no part in passes (preempted): a stream still
    /// reading its prompt ends with `EngineError::Cancelled`, a decoding one with what it generated so far
    /// (stop reason `Cancelled`), as it would at its next step.
    pub fn cancel(&mut self, obs: &mut dyn Observer) -> Progress {
        if self.reading() {
            return Progress::Done(Err(EngineError::Cancelled));
        }
        Progress::Done(Ok(self.finish(StopReason::Cancelled, obs)))
    }

    /// Ends the generation for `reason`: the text held back goes out, and the timings are set.
    fn finish(&mut self, reason: StopReason, obs: &mut dyn Observer) -> Generation {
        self.out.stop_reason = reason;
        self.dec.emit.finish(&mut self.out, obs);
        self.out.gen_ms = self.decoding_since.map_or(0.0, |t| t.elapsed().as_secs_f64() * 1e3);
        std::mem::replace(&mut self.out, Generation::empty(0, 0, 0.0))
    }
}

/// A stream with its sequence and the observer its text goes to, for one [`step`].
pub struct Active<'a, 'm> {
    pub seq: &'a mut Sequence,
    pub stream: &'a mut Stream<'m>,
    pub obs: &'a mut dyn Observer,
}

/// One pass over the active streams: every decoding stream's token, then prompt chunks in the given order
/// while `budget` tokens last (the first reading stream reads at least one token). A reading stream whose
/// observer cancels ends before the pass (`EngineError::Cancelled`, its chunks read so far kept).
/// Returns what became of each stream, in order.
pub fn step(model: &Model, pool: &ThreadPool, active: &mut [Active], budget: usize) -> Vec<Progress> {
    let mut progress: Vec<Option<Progress>> = active.iter().map(|_| None).collect();
    for (a, p) in active.iter_mut().zip(&mut progress) {
        if a.stream.reading() && a.obs.cancelled() {
            *p = Some(Progress::Done(Err(EngineError::Cancelled)));
        }
    }
    // Who takes part, and how many tokens: decoding streams first.
    let mut takes: Vec<(usize, usize)> = Vec::new();
    let mut left = budget.max(1);
    for (i, a) in active.iter().enumerate() {
        if progress[i].is_none() && !a.stream.reading() {
            takes.push((i, 1));
            left = left.saturating_sub(1);
        }
    }
    let mut first_reader = true;
    for (i, a) in active.iter().enumerate() {
        if progress[i].is_none() && a.stream.reading() && (left > 0 || first_reader) {
            let n = a.stream.input(left.max(1)).0.len();
            takes.push((i, n));
            left = left.saturating_sub(n);
            first_reader = false;
        }
    }
    takes.sort_unstable();
    let wants: Vec<Vec<usize>> = takes
        .iter()
        .map(|&(i, n)| {
            let (tokens, want) = active[i].stream.input(n);
            debug_assert_eq!(tokens.len(), n);
            want.into_iter().collect()
        })
        .collect();
    let results = {
        let mut inputs: Vec<SeqInput> = Vec::with_capacity(takes.len());
        let mut t = takes.iter().zip(&wants).peekable();
        for (i, a) in active.iter_mut().enumerate() {
            if let Some(&(&(_, n), want)) = t.peek().filter(|((j, _), _)| *j == i) {
                t.next();
                let tokens = a.stream.input(n).0;
                inputs.push(SeqInput { kv: &mut a.seq.kv, tokens, want });
            }
        }
        model.forward_many(pool, &mut inputs)
    };
    let shared = takes.len() > 1;
    for (&(i, n), result) in takes.iter().zip(results) {
        let a = &mut active[i];
        let starved = shared && matches!(&result, Err(ModelError::Device(e)) if !e.is_fatal());
        progress[i] = Some(if starved { Progress::Starved } else { a.stream.advance(a.seq, n, result, a.obs) });
    }
    progress.into_iter().map(|p| p.unwrap_or(Progress::Going)).collect()
}
