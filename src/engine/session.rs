//! Many conversations over a few live sequences (slots): the request path of DESIGN.md. A prompt that
//! extends a slot's sequence continues it; otherwise that sequence is parked in the conversation cache,
//! the cache is looked up (longest common prefix), and a hit goes through the restore gate: admitted, the
//! snapshot's KV comes back (all pages allocated first; any failure releases them, keeps the snapshot and
//! rereads); refused, the snapshot stays where it was, the sequence keeps its common prefix, and the rest
//! is read. Results never depend on the path: restored KV is a byte copy and the forward pass is
//! batch-invariant.
//!
//! `serve` runs one generation on slot 0 (with speculative decoding when there is a drafter); `begin`,
//! `step` and `end` run several at once, one stream per slot, advanced together (`engine::batch`).

use std::sync::Arc;
use std::time::Instant;

use crate::cache::gate::{self, GateDecision};
use crate::cache::{ConversationCache, KvIdentity, ParkOutcome, RestoreKind, Snapshot};
use crate::device::Purpose;
use crate::model::kv::KvSnapshot;
use crate::model::{KvType, Model, ModelError};
/// Why a cache hit was reread instead of restored (its schema is telemetry's).
pub use crate::telemetry::Fallback;
use crate::telemetry::{EngineEvent, Telemetry};
use crate::threadpool::ThreadPool;
use crate::tokenizer::Tokenizer;

use super::batch::{self, Active, Progress, Stream};
use super::spec::Drafter;
use super::{generate, EngineError, GenerateParams, Generation, Observer, Request, Sequence};

/// A checkpoint is recorded every this many prompt tokens (and at the end of every prompt).
pub const CHECKPOINT_EVERY: usize = 4096;

#[derive(Clone, Debug)]
pub struct SessionConfig {
    pub kv_type: KvType,
    pub max_context: usize,
    /// `--conversation-cache-slots` (0: no cache).
    pub cache_slots: usize,
    /// `--conversation-cache-mib`, in bytes.
    pub cache_budget_bytes: u64,
}

/// One served request.
#[derive(Clone, Debug)]
pub struct Served {
    pub generation: Generation,
    /// Prompt tokens whose state was not read (live prefix or restored).
    pub reused: usize,
    /// Prompt tokens read.
    pub read: usize,
    /// A restore from the cache, and how many tokens it brought back.
    pub restored: Option<(RestoreKind, usize)>,
    /// A cache hit that was not restored, and why.
    pub fallback: Option<Fallback>,
    /// Prompt tokens the draft model read (the rest came back with the snapshot or its live sequence).
    pub draft_read: Option<usize>,
}

/// One live sequence of the session: a conversation's state, its checkpoints, whether a stream is
/// generating on it, and when it was last taken (a new conversation takes the least recently used idle
/// one).
struct Slot {
    seq: Sequence,
    checkpoints: Vec<usize>,
    busy: bool,
    last_use: u64,
    /// While busy: the length its stream may reach (prompt and `max_tokens`, within the context).
    target_len: usize,
    /// A preempted stream's KV, parked in host RAM until it resumes, and the count of ended streams when it
    /// was preempted (it resumes once another has ended and freed memory, or when nothing else runs).
    suspended: Option<(KvSnapshot, u64)>,
}

/// How a slot came to its start state: a restore from the cache (its kind and tokens), or a cache hit that
/// was reread instead (why).
type StartState = (Option<(RestoreKind, usize)>, Option<Fallback>);

/// A generation started by [`Session::begin`] on a slot, with what its start state cost.
pub struct Begun<'a> {
    pub slot: usize,
    pub stream: Stream<'a>,
    pub restored: Option<(RestoreKind, usize)>,
    pub fallback: Option<Fallback>,
}

pub struct Session<'a> {
    model: &'a Model,
    tokenizer: &'a Tokenizer,
    pool: &'a ThreadPool,
    /// The live sequences; `serve` (and speculative decoding) runs on slot 0.
    slots: Vec<Slot>,
    /// Slot takings so far (the clock of `Slot::last_use`).
    takings: u64,
    /// Streams ended so far, and streams preempted so far.
    ends: u64,
    pub preemptions: u64,
    pub cache: ConversationCache,
    pub telemetry: Arc<Telemetry>,
    identity: KvIdentity,
    /// Speculative decoding's drafter (with a draft model's live sequence, parked and restored with the
    /// target's).
    drafter: Option<Drafter<'a>>,
    /// Free-memory samples that failed at a gate decision.
    pub sample_failures: u64,
}

impl Slot {
    fn new(model: &Model, cfg: &SessionConfig) -> Result<Slot, EngineError> {
        let seq = Sequence::new(model, cfg.kv_type, cfg.max_context)?;
        Ok(Slot { seq, checkpoints: Vec::new(), busy: false, last_use: 0, target_len: 0, suspended: None })
    }
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

fn mib_f(bytes: u64) -> f64 {
    (bytes as f64 / (1u64 << 20) as f64 * 10.0).round() / 10.0
}

impl<'a> Session<'a> {
    pub fn new(
        model: &'a Model,
        tokenizer: &'a Tokenizer,
        pool: &'a ThreadPool,
        cfg: &SessionConfig,
    ) -> Result<Session<'a>, EngineError> {
        let identity = KvIdentity {
            // The file's fingerprint: a snapshot never restores into another model of the same shape (the
            // server switches models and keeps the old one's snapshots).
            model: format!("{}:{}:{:016x}", model.cfg.arch_name, model.weight_bytes(), model.file.fingerprint()),
            kv_type: cfg.kv_type,
            n_layer: model.cfg.n_layer,
            kv_dim: model.cfg.kv_dim(),
        };
        Ok(Session {
            model,
            tokenizer,
            pool,
            slots: vec![Slot::new(model, cfg)?],
            takings: 0,
            ends: 0,
            preemptions: 0,
            cache: ConversationCache::new(cfg.cache_slots, cfg.cache_budget_bytes),
            telemetry: Arc::new(Telemetry::new()),
            identity,
            drafter: None,
            sample_failures: 0,
        })
    }

    /// Decodes with speculative drafts from `drafter`. A draft model becomes part of the KV identity: a
    /// snapshot parks both KV caches and restores only into the same pair.
    pub fn with_drafter(mut self, drafter: Drafter<'a>) -> Session<'a> {
        if let Some(m) = drafter.draft_model() {
            self.identity.model.push_str(&format!(
                " + draft {}:{}:{:016x}",
                m.cfg.arch_name,
                m.weight_bytes(),
                m.file.fingerprint()
            ));
        }
        self.drafter = Some(drafter);
        self
    }

    /// The drafter, if speculative decoding is on.
    pub fn drafter(&self) -> Option<&Drafter<'a>> {
        self.drafter.as_ref()
    }

    /// With `n` live sequences (at least one): up to `n` streams generate at once (see [`Session::begin`]).
    /// Their KV pages are taken as they fill, so an idle slot holds no memory beyond what it last held.
    pub fn with_parallel(mut self, n: usize, cfg: &SessionConfig) -> Result<Session<'a>, EngineError> {
        while self.slots.len() < n.max(1) {
            self.slots.push(Slot::new(self.model, cfg)?);
        }
        Ok(self)
    }

    /// Parks every live sequence in the cache before the session ends (the server switching models): a
    /// conversation that comes back to this model later restores instead of being read again. Every slot
    /// must be idle. How many were parked.
    pub fn park_live(&mut self) -> usize {
        let mut parked = 0;
        for slot in 0..self.slots.len() {
            debug_assert!(!self.slots[slot].busy, "parking a slot a stream runs on");
            parked += usize::from(self.park(slot));
        }
        parked
    }

    /// The conversation cache, leaving this session an empty one (the session ends: its cache goes on in the
    /// next, with the snapshots under their identities).
    pub fn take_cache(&mut self) -> ConversationCache {
        std::mem::replace(&mut self.cache, ConversationCache::new(0, 0))
    }

    /// Takes over `cache` (another session's), with this session's limits (`cfg`): what no longer fits
    /// leaves, least recently used first.
    pub fn adopt_cache(&mut self, mut cache: ConversationCache, cfg: &SessionConfig) {
        for e in cache.set_limits(cfg.cache_slots, cfg.cache_budget_bytes) {
            self.telemetry.emit(EngineEvent::Evicted { tokens: e.tokens, bytes: e.bytes });
        }
        self.cache = cache;
    }

    /// What a snapshot must carry to restore here: the model file, KV type and layout.
    pub fn identity(&self) -> &KvIdentity {
        &self.identity
    }

    /// How many live sequences the session keeps.
    pub fn parallel(&self) -> usize {
        self.slots.len()
    }

    /// Slots with a stream generating on them.
    pub fn busy_slots(&self) -> usize {
        self.slots.iter().filter(|s| s.busy).count()
    }

    /// Slots whose stream is preempted now (its KV parked in host RAM until it resumes).
    pub fn suspended_slots(&self) -> usize {
        self.slots.iter().filter(|s| s.suspended.is_some()).count()
    }

    /// Slot 0's tokens (the live sequence of `serve`).
    pub fn live_tokens(&self) -> &[u32] {
        &self.slots[0].seq.tokens
    }

    /// Tokens held by all live sequences.
    pub fn live_token_count(&self) -> usize {
        self.slots.iter().map(|s| s.seq.tokens.len()).sum()
    }

    /// Another generation after the same `prompt` as the last [`Session::serve`] (one more of a request's n
    /// choices): the live sequence goes back to the end of the prompt, only its last token is read again,
    /// and nothing is parked.
    pub fn serve_again(
        &mut self,
        prompt: &[u32],
        params: &GenerateParams,
        obs: &mut dyn Observer,
    ) -> Result<Served, EngineError> {
        self.rewind_to(0, prompt);
        self.serve(prompt, params, obs)
    }

    /// Generates after `prompt` from the best start state (see the module comment), passing the text to
    /// `obs` as it comes and asking it whether to stop. It runs on slot 0, alone (with speculative
    /// decoding when the session has a drafter).
    pub fn serve(
        &mut self,
        prompt: &[u32],
        params: &GenerateParams,
        obs: &mut dyn Observer,
    ) -> Result<Served, EngineError> {
        let (restored, fallback) = self.prepare(0, prompt)?;
        let req = Request::new(prompt, params).drafting(self.drafter.as_mut());
        let generation = generate(self.model, self.tokenizer, self.pool, &mut self.slots[0].seq, req, obs)?;
        let (reused, read) = self.settle(0, prompt.len(), &generation);
        let draft_read = self.drafter.as_ref().and_then(Drafter::prompt_read);
        Ok(Served { generation, reused, read, restored, fallback, draft_read })
    }

    /// Starts a generation after `prompt` on an idle slot (the one whose sequence shares the longest prefix
    /// with it; else an empty one; else the least recently used), from the best start state as `serve`
    /// takes it; the slot is busy until [`Session::end`]. Its stream advances with the others' in
    /// [`Session::step`]. None when every slot is busy.
    pub fn begin(&mut self, prompt: &[u32], params: &GenerateParams) -> Option<Result<Begun<'a>, EngineError>> {
        let common = |slot: &Slot| slot.seq.tokens.iter().zip(prompt).take_while(|(a, b)| a == b).count();
        let slot = (0..self.slots.len()).filter(|&i| !self.slots[i].busy).max_by_key(|&i| {
            let s = &self.slots[i];
            (common(s), s.seq.tokens.is_empty(), std::cmp::Reverse(s.last_use))
        })?;
        Some(self.begin_on(slot, prompt, params))
    }

    /// Another generation after the same `prompt` on `slot` (one more of a request's n choices, as
    /// `serve_again`).
    pub fn begin_again(
        &mut self,
        slot: usize,
        prompt: &[u32],
        params: &GenerateParams,
    ) -> Result<Begun<'a>, EngineError> {
        self.rewind_to(slot, prompt);
        self.begin_on(slot, prompt, params)
    }

    fn begin_on(&mut self, slot: usize, prompt: &[u32], params: &GenerateParams) -> Result<Begun<'a>, EngineError> {
        let (restored, fallback) = self.prepare(slot, prompt)?;
        let stream = Stream::start(self.model, self.tokenizer, self.pool, &mut self.slots[slot].seq, prompt, params)?;
        self.takings += 1;
        let s = &mut self.slots[slot];
        s.busy = true;
        s.last_use = self.takings;
        s.target_len = (prompt.len() + params.max_tokens).min(s.seq.kv.max_tokens);
        Ok(Begun { slot, stream, restored, fallback })
    }

    /// One pass over the running streams (`(slot, stream, observer)`), at most `budget` tokens of prompt
    /// beside every decoding stream's token (see `batch::step`). What became of each, in order.
    ///
    /// Never an out-of-memory for a stream that shares the pass: when a stream's KV pages find no device
    /// memory, the newest running stream is preempted (its KV parked in host RAM, its device pages freed)
    /// and the starved one tries again next step; a preempted stream resumes (its KV restored, a byte copy,
    /// so its reply is unchanged) once another stream has ended, or when nothing else runs. One that cannot
    /// come back while nothing else runs ends with the device's error.
    pub fn step(
        &mut self,
        running: &mut [(usize, &mut Stream<'a>, &mut dyn Observer)],
        budget: usize,
    ) -> Vec<Progress> {
        if running.iter().any(|r| r.0 >= self.slots.len()) {
            // A slot that does not exist: a caller's bug, refused plainly.
            return running.iter().map(|_| Progress::Done(Err(EngineError::Cancelled))).collect();
        }
        let mut progress: Vec<Option<Progress>> = running.iter().map(|_| None).collect();
        // A preempted stream whose client cancelled ends now, not once it resumes.
        for ((slot, stream, obs), p) in running.iter_mut().zip(&mut progress) {
            if self.slots[*slot].suspended.is_some() && obs.cancelled() {
                *p = Some(stream.cancel(&mut **obs));
            }
        }
        self.resume_suspended(running, &mut progress);
        let mut seqs: Vec<Option<&mut Sequence>> =
            self.slots.iter_mut().map(|s| if s.suspended.is_none() { Some(&mut s.seq) } else { None }).collect();
        let mut active: Vec<Active> = Vec::with_capacity(running.len());
        let mut in_pass = Vec::with_capacity(running.len());
        for (n, (slot, stream, obs)) in running.iter_mut().enumerate() {
            if progress[n].is_some() {
                continue;
            }
            if let Some(seq) = seqs[*slot].take() {
                active.push(Active { seq, stream, obs: &mut **obs });
                in_pass.push(n);
            }
        }
        let stepped = batch::step(self.model, self.pool, &mut active, budget);
        drop(active);
        let mut starved = false;
        for (n, p) in in_pass.into_iter().zip(stepped) {
            starved |= matches!(p, Progress::Starved);
            progress[n] = Some(p);
        }
        if starved {
            self.preempt_newest(running, &progress);
        }
        progress
            .into_iter()
            .map(|p| match p {
                None | Some(Progress::Starved) => Progress::Going,
                Some(p) => p,
            })
            .collect()
    }

    /// Brings back the suspended streams among `running` whose time has come (see `step`); one that cannot
    /// come back while nothing else runs ends with the error (in `progress`).
    fn resume_suspended(
        &mut self,
        running: &[(usize, &mut Stream<'a>, &mut dyn Observer)],
        progress: &mut [Option<Progress>],
    ) {
        let others_running = |slots: &[Slot]| running.iter().any(|r| slots[r.0].suspended.is_none());
        for (n, r) in running.iter().enumerate() {
            if progress[n].is_some() {
                continue;
            }
            let Some((_, at)) = &self.slots[r.0].suspended else { continue };
            let alone = !others_running(&self.slots);
            if *at >= self.ends && !alone {
                continue;
            }
            let s = &mut self.slots[r.0];
            let Some((snap, at)) = s.suspended.take() else { continue };
            match s.seq.kv.restore(&snap, snap.len) {
                Ok(()) => tracing::info!("continuous batching: resumed a preempted sequence ({} tokens)", snap.len),
                Err(e) => {
                    s.seq.kv.truncate(0);
                    s.seq.kv.release_unused();
                    if alone {
                        tracing::warn!("continuous batching: a preempted sequence cannot come back: {e}");
                        s.seq.rewind(0);
                        progress[n] = Some(Progress::Done(Err(ModelError::Device(e).into())));
                    } else {
                        s.suspended = Some((snap, at));
                    }
                }
            }
        }
    }

    /// Parks the newest running stream's KV in host RAM and frees its device pages, to make room for a
    /// starved one.
    fn preempt_newest(
        &mut self,
        running: &[(usize, &mut Stream<'a>, &mut dyn Observer)],
        progress: &[Option<Progress>],
    ) {
        let victim = running
            .iter()
            .zip(progress)
            .filter(|(r, p)| self.slots[r.0].suspended.is_none() && !matches!(p, Some(Progress::Done(_))))
            .map(|(r, _)| r.0)
            .max_by_key(|&slot| self.slots[slot].last_use);
        let Some(slot) = victim else { return };
        let s = &mut self.slots[slot];
        match s.seq.kv.snapshot() {
            Ok(snap) => {
                let tokens = snap.len;
                s.seq.kv.truncate(0);
                s.seq.kv.release_unused();
                s.suspended = Some((snap, self.ends));
                self.preemptions += 1;
                tracing::info!(
                    "continuous batching: a device ran out of memory mid-batch: preempted the newest sequence ({tokens} tokens parked in host RAM) until another ends"
                );
            }
            Err(e) => tracing::warn!("continuous batching: could not preempt a sequence: {e}"),
        }
    }

    /// The stream on `slot` is done: the slot is idle again, and with a generation its checkpoints and log
    /// line follow as after `serve`. The prompt tokens (reused, read).
    pub fn end(&mut self, slot: usize, prompt_len: usize, generation: Option<&Generation>) -> (usize, usize) {
        let Some(s) = self.slots.get_mut(slot) else { return (0, 0) };
        s.busy = false;
        let was_suspended = s.suspended.take().is_some();
        if was_suspended {
            // Ended while preempted (its client left): its parked KV goes, and so does its sequence.
            s.seq.rewind(0);
        }
        self.ends += 1;
        let prompt_tokens = match generation {
            Some(g) => self.settle(slot, prompt_len, g),
            None => (0, 0),
        };
        if was_suspended {
            self.slots[slot].checkpoints.clear();
        }
        self.trim_idle();
        prompt_tokens
    }

    /// The embedding of each of `inputs` ([`Model::embed`]), each read into one throwaway cache beside the
    /// live sequences (which keep their state) and freed after it. `stop` is asked before each input: true
    /// ends the work with `Cancelled` (its client went away).
    pub fn embed(&mut self, inputs: &[Vec<u32>], mut stop: impl FnMut() -> bool) -> Result<Vec<Vec<f32>>, EngineError> {
        let max_tokens = self.slots[0].seq.kv.max_tokens;
        let mut kv = self.model.new_kv(self.identity.kv_type, max_tokens)?;
        let mut out = Vec::with_capacity(inputs.len());
        for tokens in inputs {
            if stop() {
                return Err(EngineError::Cancelled);
            }
            out.push(self.model.embed(self.pool, &mut kv, tokens)?);
        }
        Ok(out)
    }

    /// KV bytes held by idle slots other than the most recently used one: conversations kept live beside
    /// the newest, which count against the conversation cache's budget (see `trim_idle`).
    pub fn idle_live_bytes(&self) -> u64 {
        self.idle_beside_newest().iter().map(|&i| self.slots[i].seq.kv.allocated_bytes() as u64).sum()
    }

    /// The idle slots that hold a conversation, less the most recently used one.
    fn idle_beside_newest(&self) -> Vec<usize> {
        let mut idle: Vec<usize> =
            (0..self.slots.len()).filter(|&i| !self.slots[i].busy && !self.slots[i].seq.tokens.is_empty()).collect();
        idle.sort_by_key(|&i| self.slots[i].last_use);
        idle.pop();
        idle
    }

    /// Keeps the conversations idle slots hold live within the conversation cache's budget
    /// (`--conversation-cache-mib`): the newest idle one stays live as a lone slot's would, the others' KV
    /// and the parked snapshots together stay within the budget. While they pass it, the least recently used
    /// idle slot is parked in the cache (which evicts its oldest to make room, as any park does) and emptied;
    /// a request that comes back to it restores from the cache, or rereads.
    fn trim_idle(&mut self) {
        loop {
            let idle = self.idle_beside_newest();
            let Some(&oldest) = idle.first() else { return };
            let (held, parked) = (self.idle_live_bytes(), self.cache.bytes());
            if held.saturating_add(parked) <= self.cache.budget_bytes {
                return;
            }
            let tokens = self.slots[oldest].seq.tokens.len();
            self.park(oldest);
            let s = &mut self.slots[oldest];
            s.seq.rewind(0);
            s.checkpoints.clear();
            tracing::info!(
                "continuous batching: an idle slot's conversation ({tokens} tokens) left RAM for the conversation cache: idle slots held {} MiB beside {} MiB parked, over the budget of {} MiB",
                mib_f(held),
                mib_f(parked),
                mib_f(self.cache.budget_bytes)
            );
        }
    }

    /// Takes `slot`'s sequence back to the end of `prompt` when it holds it (its reply's tokens dropped).
    fn rewind_to(&mut self, slot: usize, prompt: &[u32]) {
        let seq = &mut self.slots[slot].seq;
        if seq.tokens.starts_with(prompt) {
            seq.rewind(prompt.len());
        }
    }

    /// Readies `slot` for `prompt`: a sequence that would lose tokens is parked in the conversation cache;
    /// a snapshot that holds more of the prompt than the sequence keeps (an empty slot keeps nothing) goes
    /// through the restore gate; else the prompt continues the sequence. The restore and the fallback, if
    /// any.
    fn prepare(&mut self, slot: usize, prompt: &[u32]) -> Result<StartState, EngineError> {
        let live = &self.slots[slot].seq;
        if prompt.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        if prompt.len() > live.kv.max_tokens {
            return Err(ModelError::ContextOverflow { needed: prompt.len(), max: live.kv.max_tokens }.into());
        }
        let live_common = live.tokens.iter().zip(prompt).take_while(|(a, b)| a == b).count();
        let mut restored = None;
        let mut fallback = None;
        // A snapshot that holds more of the prompt than the live sequence (an empty slot's is nothing).
        let cand = self.cache.lookup(prompt, &self.identity, live_common);
        if let Some(c) = cand {
            self.cache.pin(c.id);
        }
        if live_common < live.tokens.len() {
            // The live sequence would lose tokens: park it first.
            self.park(slot);
        }
        if let Some(c) = cand {
            match self.restore(slot, c.id, c.tokens, c.kind, prompt.len(), live_common) {
                Ok(()) => restored = Some((c.kind, c.tokens)),
                Err(f) => fallback = f,
            }
        }
        Ok((restored, fallback))
    }

    /// After a generation on `slot`: its checkpoints, and the log line. The prompt tokens (reused, read).
    fn settle(&mut self, slot: usize, prompt_len: usize, g: &Generation) -> (usize, usize) {
        let reused = g.reused_tokens;
        let read = prompt_len - reused;
        let checkpoints = &mut self.slots[slot].checkpoints;
        checkpoints.retain(|&c| c <= reused);
        checkpoints.extend((reused + 1..=prompt_len).filter(|p| p % CHECKPOINT_EVERY == 0));
        if checkpoints.last() != Some(&prompt_len) {
            checkpoints.push(prompt_len);
        }
        tracing::info!(
            "prompt {} tokens = {} reused + {} read in {:.0} ms ({:.1} tok/s), {} generated in {:.0} ms ({:.1} tok/s), drafts accepted {} of {}, {} checkpoints",
            prompt_len,
            reused,
            read,
            g.prompt_ms,
            read as f64 / (g.prompt_ms / 1e3).max(1e-9),
            g.tokens.len(),
            g.gen_ms,
            g.tokens.len() as f64 / (g.gen_ms / 1e3).max(1e-9),
            g.drafts_accepted,
            g.drafts_proposed,
            checkpoints.len(),
        );
        (reused, read)
    }

    /// Parks `slot`'s sequence in the cache (when it fits the budget), evicting as needed (with slot 0's, the
    /// drafter's sequence too). The sequence itself is left as it is. Whether it was parked.
    fn park(&mut self, slot: usize) -> bool {
        let live = &self.slots[slot];
        let n = live.seq.tokens.len();
        if n == 0 || self.cache.slots == 0 {
            return false;
        }
        let t0 = Instant::now();
        let draft_live =
            self.drafter.as_ref().and_then(Drafter::draft_seq).filter(|d| slot == 0 && !d.tokens.is_empty());
        let draft_bytes = draft_live.map_or(0, |d| d.kv.snapshot_bytes());
        let bytes = live.seq.kv.snapshot_bytes() + draft_bytes;
        let Some(room) = self.cache.make_room(bytes) else {
            tracing::info!(
                "conversation cache: not parked: {n} tokens take {bytes} bytes, more than the budget of {} bytes can hold",
                self.cache.budget_bytes
            );
            self.telemetry.emit(EngineEvent::NotParked { tokens: n, bytes, error: None });
            return false;
        };
        for e in &room.evicted {
            self.telemetry.emit(EngineEvent::Evicted { tokens: e.tokens, bytes: e.bytes });
        }
        let host = self.model.placement.devices.host.clone();
        // The evicted snapshot's buffers are written again: only what they lack is new memory.
        let reused = room.spare.as_ref().map_or(0, |s| s.bytes().min(bytes));
        let held = match host.alloc_reusing(Purpose::Kv, bytes, reused) {
            Ok(a) => a,
            Err(e) => {
                tracing::info!("conversation cache: not parked: {e}");
                self.telemetry.emit(EngineEvent::NotParked { tokens: n, bytes, error: None });
                return false;
            }
        };
        let draft = draft_live.map(|d| d.kv.snapshot_into(None)).transpose();
        let kv = match draft.and_then(|draft| Ok((live.seq.kv.snapshot_into(room.spare)?, draft))) {
            Ok(kv) => kv,
            Err(e) => {
                tracing::warn!("conversation cache: not parked: {e}");
                self.telemetry.emit(EngineEvent::NotParked { tokens: n, bytes, error: Some(e.to_string()) });
                return false;
            }
        };
        let (kv, draft) = kv;
        host.count_copy_in(bytes);
        let mut snap = Snapshot::new(live.seq.tokens.clone(), live.checkpoints.clone(), kv, self.identity.clone());
        snap.draft = draft;
        snap.host = Some(held);
        match self.cache.park(snap) {
            ParkOutcome::Parked { .. } => {
                let elapsed = ms(t0);
                tracing::info!(
                    "conversation cache: parked {n} tokens in {elapsed:.1} ms; parked={} bytes={} evictions={} snapshot_bytes={bytes}",
                    self.cache.len(),
                    self.cache.bytes(),
                    self.cache.evictions()
                );
                self.telemetry.emit(EngineEvent::Parked {
                    tokens: n,
                    ms: elapsed,
                    snapshot_bytes: bytes,
                    parked: self.cache.len(),
                    bytes: self.cache.bytes(),
                    evictions: self.cache.evictions(),
                });
            }
            ParkOutcome::NoRoom { .. } | ParkOutcome::Disabled => return false,
        }
        true
    }

    /// Restores `tokens` positions of snapshot `id` into `slot`'s sequence if the gate admits it (counting
    /// that sequence's own pages as free: they go first; the other slots' pages are in use) and every allocation succeeds; false
    /// otherwise, with the snapshot kept (unpinned) and, when the gate refused, the live sequence intact; the
    /// error says why (None: the snapshot was gone).
    /// A whole snapshot becomes the live sequence and leaves the cache; a checkpoint restore leaves it there
    /// (its later tokens may still be wanted).
    fn restore(
        &mut self,
        slot: usize,
        id: u64,
        tokens: usize,
        kind: RestoreKind,
        prompt_len: usize,
        live_common: usize,
    ) -> Result<(), Option<Fallback>> {
        // The draft model's KV comes back with the target's: the gate counts both, per device.
        let draft = self.cache.get(id).and_then(|s| s.draft.as_ref()).filter(|_| slot == 0);
        let draft_tokens = draft.map_or(0, |d| d.len.min(tokens));
        let firsts = self.cache.get(id).map(|s| s.kv.firsts.clone()).unwrap_or_default();
        let needs = self.restore_needs(slot, tokens, &firsts, draft_tokens);
        // The live sequence keeps its common prefix with the prompt; the rest is read.
        self.ask_gate(id, &needs, tokens, prompt_len - live_common).map_err(Some)?;
        let t0 = Instant::now();
        self.copy_in(slot, id, tokens, draft_tokens, prompt_len)?;
        let Some(snap) = self.cache.get(id) else { return Err(None) };
        let bytes = snap.kv.bytes() * tokens as u64 / snap.kv.len.max(1) as u64;
        match kind {
            RestoreKind::Live => drop(self.cache.remove(id)),
            RestoreKind::Checkpoint => self.cache.unpin(id),
        }
        let elapsed = ms(t0);
        tracing::info!(
            "conversation cache: restored {tokens} tokens ({kind}) in {elapsed:.1} ms; parked={} bytes={}",
            self.cache.len(),
            self.cache.bytes()
        );
        self.telemetry.emit(EngineEvent::Restored {
            kind,
            tokens,
            ms: elapsed,
            restored_bytes: bytes,
            parked: self.cache.len(),
            bytes: self.cache.bytes(),
        });
        Ok(())
    }

    /// What restoring `tokens` (and `draft_tokens` of the draft model) into `slot` needs on each device,
    /// beside what the other running streams will still take there, with the credit of what the slot's
    /// sequences hold there now (they are released first). `firsts`: the
    /// snapshot's first position per layer (a sliding-window layer brings back only its window).
    fn restore_needs(&self, slot: usize, tokens: usize, firsts: &[usize], draft_tokens: usize) -> Vec<gate::Need> {
        let live = &self.slots[slot].seq;
        let mut held = live.kv.device_held_bytes();
        let mut need = live.kv.device_need_bytes_from(tokens, firsts);
        if let Some(d) = self.drafter.as_ref().and_then(Drafter::draft_seq).filter(|_| slot == 0) {
            held.extend(d.kv.device_held_bytes());
            need.extend(d.kv.device_need_bytes(draft_tokens));
        }
        // The other streams will still grow to their target lengths: those pages are not this restore's
        // to take (a restore that would squeeze a running stream falls back instead).
        for other in self.slots.iter().enumerate().filter(|&(i, s)| i != slot && s.busy).map(|(_, s)| s) {
            let other_held = other.seq.kv.device_held_bytes();
            for (device, bytes) in other.seq.kv.device_need_bytes(other.target_len) {
                let h: u64 = other_held.iter().filter(|(d, _)| Arc::ptr_eq(d, &device)).map(|(_, b)| *b).sum();
                need.push((device, bytes.saturating_sub(h)));
            }
        }
        let mut needs: Vec<gate::Need> = Vec::new();
        for (device, need_bytes) in need {
            match needs.iter_mut().find(|n| Arc::ptr_eq(&n.device, &device)) {
                Some(n) => n.need_bytes += need_bytes,
                None => {
                    let credit_bytes = held.iter().filter(|(d, _)| Arc::ptr_eq(d, &device)).map(|(_, b)| *b).sum();
                    needs.push(gate::Need { device, need_bytes, credit_bytes });
                }
            }
        }
        needs
    }

    /// The gate's word on restoring snapshot `id`: a refusal unpins it and becomes the fallback (with its
    /// log line and event; `reread` tokens will be read instead); an admission reports failed samples.
    fn ask_gate(&mut self, id: u64, needs: &[gate::Need], tokens: usize, reread: usize) -> Result<(), Fallback> {
        match gate::decide(needs, &self.telemetry) {
            GateDecision::Refuse { device, free_bytes, need_bytes, reserve_bytes } => {
                self.cache.unpin(id);
                tracing::info!(
                    "conversation cache: restore skipped: device {device} free {:.0} MiB - need {:.0} MiB < reserve {:.0} MiB; snapshot kept, rereading {reread} tokens",
                    mib_f(free_bytes),
                    mib_f(need_bytes),
                    mib_f(reserve_bytes),
                );
                self.telemetry.emit(EngineEvent::RestoreFallback {
                    device,
                    free_mib: mib_f(free_bytes),
                    need_mib: mib_f(need_bytes),
                    reserve_mib: mib_f(reserve_bytes),
                    tokens,
                });
                Err(Fallback::Gate { device, free_bytes, need_bytes, reserve_bytes, tokens })
            }
            GateDecision::Admit { failed_samples } => {
                for device in failed_samples {
                    self.sample_failures += 1;
                    tracing::info!(
                        "conversation cache: free-memory sample of device {device} failed; restoring without it ({} failed so far)",
                        self.sample_failures
                    );
                    self.telemetry.emit(EngineEvent::SampleFailed { device, count: self.sample_failures });
                }
                Ok(())
            }
        }
    }

    /// Copies the first `tokens` of snapshot `id` (and `draft_tokens` of its draft KV) into the emptied live
    /// sequences. A copy that cannot get device memory leaves them empty, unpins the snapshot and becomes
    /// the fallback (None: the snapshot was gone).
    fn copy_in(
        &mut self,
        slot: usize,
        id: u64,
        tokens: usize,
        draft_tokens: usize,
        prompt_len: usize,
    ) -> Result<(), Option<Fallback>> {
        let live = &mut self.slots[slot];
        live.seq.rewind(0);
        live.checkpoints.clear();
        let mut draft_seq = self.drafter.as_mut().and_then(Drafter::draft_seq_mut).filter(|_| slot == 0);
        if let Some(d) = draft_seq.as_deref_mut() {
            d.rewind(0);
        }
        let Some(snap) = self.cache.get(id) else { return Err(None) };
        let restored =
            live.seq.kv.restore(&snap.kv, tokens).and_then(|()| match (draft_seq.as_deref_mut(), &snap.draft) {
                (Some(d), Some(kv)) => {
                    d.kv.restore(kv, draft_tokens)?;
                    d.tokens = snap.tokens[..draft_tokens].to_vec();
                    Ok(())
                }
                _ => Ok(()),
            });
        if let Err(e) = restored {
            live.seq.rewind(0);
            if let Some(d) = draft_seq {
                d.rewind(0);
            }
            self.cache.unpin(id);
            tracing::info!("conversation cache: restore failed, released and rereading {prompt_len} tokens: {e}");
            self.telemetry.emit(EngineEvent::OomAverted { error: e.to_string(), tokens });
            return Err(Some(Fallback::AllocFailed { error: e.to_string(), tokens }));
        }
        live.seq.tokens = snap.tokens[..tokens].to_vec();
        live.checkpoints = snap.checkpoints.iter().copied().filter(|&c| c <= tokens).collect();
        Ok(())
    }
}
