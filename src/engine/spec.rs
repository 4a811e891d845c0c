//! Speculative decoding: where drafts come from (n-gram lookup in the sequence so far, or a smaller draft
//! model with its own KV), and the acceptance rule the target applies to them.
//!
//! It owns the draft side only: the draft model's live sequence and sampler, and the lookup. The target's
//! batched verification lives in the decode loop (`engine::generate`), which asks a [`Drafter`] for
//! drafts after each token and tells it how many the target kept. With greedy sampling a draft is kept
//! when it is the target's own argmax, so the output is bit-identical to decoding without drafts (the
//! forward pass is batch-invariant); with temperature the standard speculative sampling rule keeps the
//! target's distribution (`sample::residual`).

use std::sync::Arc;

use crate::model::{KvType, Model};
use crate::sample::{log_prob_of, Sampler, SamplerConfig};
use crate::threadpool::ThreadPool;
use crate::tokenizer::Tokenizer;

use super::{prefill, EngineError, Sequence};

/// The longest and shortest n-gram `--spec ngram` looks up (shorter matches predict too little to pay for
/// their verification on a CPU: measured in BENCHMARKS.md).
pub const NGRAM_MAX: usize = 4;
pub const NGRAM_MIN: usize = 3;
/// N-gram lookup's first draft length in a request (it adapts from there, up to `--draft-max`).
pub const NGRAM_FIRST_WINDOW: usize = 8;

/// How drafts are made and how many.
#[derive(Clone, Debug, PartialEq)]
pub struct SpecConfig {
    /// `--draft-max`: most drafts per verification.
    pub draft_max: usize,
    /// `--draft-min`: fewer drafts than this are not worth a batched pass; the step decodes plainly.
    pub draft_min: usize,
    /// `--draft-p-min`: a draft model stops drafting when its most likely token is less likely than this.
    pub p_min: f32,
}

impl Default for SpecConfig {
    fn default() -> Self {
        SpecConfig { draft_max: 16, draft_min: 1, p_min: 0.75 }
    }
}

/// Speculative decoding as configured for an engine: the draft model when drafts come from one (else
/// n-gram lookup). Each sequence gets its [`Drafter`] from it.
#[derive(Clone)]
pub struct SpecSetup {
    pub cfg: SpecConfig,
    pub draft: Option<Arc<Model>>,
}

impl std::fmt::Debug for SpecSetup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let draft = self.draft.as_ref().map(|m| format!("{} ({} bytes)", m.cfg.arch_name, m.weight_bytes()));
        f.debug_struct("SpecSetup").field("cfg", &self.cfg).field("draft", &draft).finish()
    }
}

impl SpecSetup {
    /// A drafter for a sequence of up to `max_tokens` positions of a target with `target_vocab` tokens.
    pub fn drafter(&self, kv_type: KvType, max_tokens: usize, target_vocab: usize) -> Result<Drafter<'_>, EngineError> {
        match &self.draft {
            None => Ok(Drafter::ngram(self.cfg.clone())),
            Some(m) => Drafter::model(self.cfg.clone(), m, kv_type, max_tokens, target_vocab),
        }
    }
}

/// Most tokens the two vocabularies may differ by in size (llama.cpp's limit).
pub const VOCAB_MAX_SIZE_DIFFERENCE: usize = 128;

/// Why a model cannot draft for another.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum VocabMismatch {
    #[error("the vocabularies differ in size by more than {VOCAB_MAX_SIZE_DIFFERENCE}: {target} tokens in the target, {draft} in the draft")]
    Size { target: usize, draft: usize },
    #[error("the vocabularies differ at token {id}: {target:?} in the target, {draft:?} in the draft")]
    Token { id: u32, target: String, draft: String },
    #[error("the {which} token differs: {target:?} in the target, {draft:?} in the draft")]
    Special { which: &'static str, target: Option<u32>, draft: Option<u32> },
}

/// Checks that `draft` can draft for `target` as llama.cpp does: sizes within
/// [`VOCAB_MAX_SIZE_DIFFERENCE`], the same BOS and EOS, and the same text for every token both have.
pub fn check_vocab(target: &Tokenizer, draft: &Tokenizer) -> Result<(), VocabMismatch> {
    let (nt, nd) = (target.n_vocab(), draft.n_vocab());
    if nt.abs_diff(nd) > VOCAB_MAX_SIZE_DIFFERENCE {
        return Err(VocabMismatch::Size { target: nt, draft: nd });
    }
    if target.bos_id() != draft.bos_id() {
        return Err(VocabMismatch::Special { which: "BOS", target: target.bos_id(), draft: draft.bos_id() });
    }
    if target.eos_id() != draft.eos_id() {
        return Err(VocabMismatch::Special { which: "EOS", target: target.eos_id(), draft: draft.eos_id() });
    }
    for id in 0..nt.min(nd) as u32 {
        let (a, b) = (target.token_text(id), draft.token_text(id));
        if a != b {
            return Err(VocabMismatch::Token {
                id,
                target: a.unwrap_or_default().to_owned(),
                draft: b.unwrap_or_default().to_owned(),
            });
        }
    }
    Ok(())
}

/// Drafts for one step, with the draft's distribution for each when they were sampled (empty lists for
/// deterministic drafts: a point mass on the draft).
#[derive(Clone, Debug, Default)]
pub struct Drafts {
    pub tokens: Vec<u32>,
    pub q: Vec<Vec<(u32, f64)>>,
}

/// Where drafts come from: lookup, or a draft model placed on its devices, sharing the target's vocabulary.
#[allow(clippy::large_enum_variant)] // one per sequence
enum Source<'a> {
    Ngram,
    Model { model: &'a Model, seq: Sequence, sampler: Option<Sampler>, target_vocab: usize },
}

/// Makes drafts for one sequence; lives as long as the sequence (a session's live sequence).
pub struct Drafter<'a> {
    pub cfg: SpecConfig,
    source: Source<'a>,
    /// False for the rest of a request after the draft failed (it decodes plainly).
    active: bool,
    /// Prompt tokens the draft model read at the start of the last request (the rest it reused).
    prompt_read: Option<usize>,
    /// N-gram lookup's draft length now: doubled after a fully kept run of drafts, halved after a
    /// rejection, so that poor matches cost small verifications.
    window: usize,
}

impl<'a> Drafter<'a> {
    /// Drafts from the longest earlier match of the last tokens (`--spec ngram`).
    pub fn ngram(cfg: SpecConfig) -> Drafter<'a> {
        Drafter {
            window: cfg.draft_max.min(NGRAM_FIRST_WINDOW),
            cfg,
            source: Source::Ngram,
            active: true,
            prompt_read: None,
        }
    }

    /// Drafts from `model` (`--draft-model`), with its own KV cache of `max_tokens` positions; ids the
    /// target's vocabulary (`target_vocab` tokens) lacks are never drafted.
    pub fn model(
        cfg: SpecConfig,
        model: &'a Model,
        kv_type: KvType,
        max_tokens: usize,
        target_vocab: usize,
    ) -> Result<Drafter<'a>, EngineError> {
        let seq = Sequence::new(model, kv_type, max_tokens)?;
        Ok(Drafter {
            window: cfg.draft_max,
            cfg,
            source: Source::Model { model, seq, sampler: None, target_vocab },
            active: true,
            prompt_read: None,
        })
    }

    /// Prompt tokens the draft model read at the start of the last request (None for n-gram lookup, or
    /// when the draft failed).
    pub fn prompt_read(&self) -> Option<usize> {
        self.prompt_read
    }

    /// The draft model's live sequence (None for n-gram lookup).
    pub fn draft_seq(&self) -> Option<&Sequence> {
        match &self.source {
            Source::Model { seq, .. } => Some(seq),
            Source::Ngram => None,
        }
    }

    pub fn draft_seq_mut(&mut self) -> Option<&mut Sequence> {
        match &mut self.source {
            Source::Model { seq, .. } => Some(seq),
            Source::Ngram => None,
        }
    }

    /// The draft model (None for n-gram lookup).
    pub fn draft_model(&self) -> Option<&'a Model> {
        match &self.source {
            Source::Model { model, .. } => Some(model),
            Source::Ngram => None,
        }
    }

    /// What drafts, for log lines: `ngram` or `draft model llama:…`.
    pub fn describe(&self) -> String {
        match &self.source {
            Source::Ngram => "ngram".into(),
            Source::Model { model, .. } => format!("draft model {}", model.cfg.arch_name),
        }
    }

    /// Starts a request after `prompt`: drafting on again, and a draft model reads the prompt now (reusing
    /// what its sequence holds), so that its cost counts as prompt processing. A failure turns drafting off
    /// for the request, with a log line; it is never the request's error.
    pub fn begin(&mut self, pool: &ThreadPool, prompt: &[u32], sampler: &SamplerConfig) {
        self.active = true;
        if let Source::Ngram = self.source {
            self.window = self.cfg.draft_max.min(NGRAM_FIRST_WINDOW);
        }
        if let Source::Model { model, seq, sampler: s, .. } = &mut self.source {
            // The draft samples with the target's chain on a stream of its own.
            *s = (!sampler.is_greedy())
                .then(|| Sampler::new(SamplerConfig { seed: sampler.seed ^ 0x5eed_d4af_7000_0001, ..sampler.clone() }));
            match prefill(model, pool, seq, prompt, model.placement.batch) {
                Ok((_, reused)) => self.prompt_read = Some(prompt.len() - reused),
                Err(e) => {
                    self.prompt_read = None;
                    self.fail(&e);
                }
            }
        }
    }

    /// Stops drafting for the rest of this request: the draft's pages are released and the request goes on
    /// decoding plainly.
    fn fail(&mut self, e: &EngineError) {
        tracing::warn!("speculative decoding: the draft failed, plain decoding for the rest of this request: {e}");
        self.active = false;
        if let Source::Model { seq, .. } = &mut self.source {
            seq.rewind(0);
        }
    }

    /// Up to `room` drafts to follow `context` (the sequence so far, ending with the token the target just
    /// chose). `banned` ids are never drafted.
    pub fn propose(&mut self, pool: &ThreadPool, context: &[u32], room: usize, banned: &[u32]) -> Drafts {
        let k = room.min(self.window.max(1));
        if !self.active || k == 0 || k < self.cfg.draft_min {
            return Drafts::default();
        }
        let drafts = match &mut self.source {
            Source::Ngram => {
                let mut tokens = ngram_drafts(context, k);
                if let Some(at) = tokens.iter().position(|t| banned.contains(t)) {
                    tokens.truncate(at);
                }
                Ok(Drafts { tokens, q: Vec::new() })
            }
            Source::Model { model, seq, sampler, target_vocab } => {
                draft_from_model(model, pool, seq, sampler.as_mut(), context, k, self.cfg.p_min, banned).map(|mut d| {
                    if let Some(at) = d.tokens.iter().position(|&t| t as usize >= *target_vocab) {
                        d.tokens.truncate(at);
                        d.q.truncate(at);
                    }
                    d
                })
            }
        };
        match drafts {
            Ok(d) if d.tokens.len() >= self.cfg.draft_min => d,
            Ok(_) => Drafts::default(),
            Err(e) => {
                self.fail(&e);
                Drafts::default()
            }
        }
    }

    /// The target verified `proposed` drafts and kept `kept` of them: n-gram lookup adapts its length.
    pub fn verified(&mut self, proposed: usize, kept: usize) {
        if let Source::Ngram = self.source {
            self.window =
                if kept == proposed { (self.window * 2).min(self.cfg.draft_max) } else { (self.window / 2).max(1) };
        }
    }

    /// The target kept `tokens` (its sequence now): the draft model forgets what it drafted past them.
    pub fn kept(&mut self, tokens: &[u32]) {
        if let Source::Model { seq, .. } = &mut self.source {
            let common = seq.tokens.iter().zip(tokens).take_while(|(a, b)| a == b).count();
            if common < seq.tokens.len() {
                seq.rewind(common);
            }
        }
    }
}

/// The tokens that followed the most recent earlier occurrence of the longest suffix of `context` (of
/// `NGRAM_MAX` down to `NGRAM_MIN` tokens), at most `k` of them; empty when no suffix occurred before.
pub fn ngram_drafts(context: &[u32], k: usize) -> Vec<u32> {
    let len = context.len();
    for n in (NGRAM_MIN..=NGRAM_MAX).rev() {
        if len <= n {
            continue;
        }
        let suffix = &context[len - n..];
        // The latest start before the suffix itself whose n tokens equal it, with at least one token after.
        let found = (0..len - n).rev().find(|&s| &context[s..s + n] == suffix);
        if let Some(s) = found {
            let from = s + n;
            return context[from..(from + k).min(len)].to_vec();
        }
    }
    Vec::new()
}

/// Runs the draft model after `context` (reusing what `seq` holds) for up to `k` tokens: greedy, stopping
/// when its best token's probability falls under `p_min`; with a sampler, drawn from its distribution
/// (recorded for the acceptance rule).
#[allow(clippy::too_many_arguments)]
fn draft_from_model(
    model: &Model,
    pool: &ThreadPool,
    seq: &mut Sequence,
    mut sampler: Option<&mut Sampler>,
    context: &[u32],
    k: usize,
    p_min: f32,
    banned: &[u32],
) -> Result<Drafts, EngineError> {
    if context.len() + k > seq.kv.max_tokens {
        return Ok(Drafts::default());
    }
    let (mut logits, _) = prefill(model, pool, seq, context, model.placement.batch)?;
    let mut out = Drafts::default();
    let mut history = context.to_vec();
    loop {
        let (id, q) = match sampler.as_deref_mut() {
            None => {
                let mut best = None::<(u32, f32)>;
                for (i, &l) in logits.iter().enumerate() {
                    if !banned.contains(&(i as u32)) && !l.is_nan() && best.is_none_or(|(_, b)| l > b) {
                        best = Some((i as u32, l));
                    }
                }
                let Some((id, _)) = best else { break };
                if log_prob_of(&logits, id).exp() < p_min {
                    break;
                }
                (id, Vec::new())
            }
            Some(s) => {
                let Some(dist) = s.distribution(&logits, &history, banned) else { break };
                if dist[0].1 < p_min as f64 {
                    break;
                }
                let Some(id) = s.draw_from(&dist) else { break };
                (id, dist)
            }
        };
        out.tokens.push(id);
        if !q.is_empty() {
            out.q.push(q);
        }
        history.push(id);
        if out.tokens.len() >= k {
            break;
        }
        logits = model.forward(pool, &mut seq.kv, &[id], &[0])?.data;
        seq.tokens.push(id);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ngram_copies_what_followed_the_longest_latest_match() {
        // "1 2 3 4 9 ... 1 2 3 4" -> what followed the earlier 4-gram.
        let ctx = [1, 2, 3, 4, 9, 8, 7, 5, 2, 3, 4, 6, 1, 2, 3, 4];
        assert_eq!(ngram_drafts(&ctx, 3), vec![9, 8, 7]);
        // Only a 3-gram "2 3 4" matches (twice): the latest occurrence wins.
        let ctx = [2, 3, 4, 9, 5, 2, 3, 4, 6, 7, 2, 3, 4];
        assert_eq!(ngram_drafts(&ctx, 2), vec![6, 7]);
        // Drafts stop at the end of the context.
        let ctx = [5, 6, 7, 8, 5, 6, 7];
        assert_eq!(ngram_drafts(&ctx, 8), vec![8, 5, 6, 7]);
        // No earlier trigram: nothing (a match of one or two tokens is not enough).
        assert!(ngram_drafts(&[1, 2, 3, 1, 2, 4, 1, 2], 4).is_empty());
        assert!(ngram_drafts(&[], 4).is_empty());
    }
}
