//! Many conversations over one live sequence: the request path of DESIGN.md. A prompt that extends the live
//! sequence continues it; otherwise the live sequence is parked in the conversation cache, the cache is
//! looked up (longest common prefix), and a hit goes through the restore gate: admitted, the snapshot's KV
//! comes back (all pages allocated first; any failure releases them, keeps the snapshot and rereads);
//! refused, the snapshot stays where it was, the live sequence keeps its common prefix, and the rest is read. Results never depend on the path:
//! restored KV is a byte copy and the forward pass is batch-invariant.

use std::sync::Arc;
use std::time::Instant;

use crate::cache::gate::{self, GateDecision};
use crate::cache::{ConversationCache, KvIdentity, ParkOutcome, RestoreKind, Snapshot};
use crate::device::Purpose;
use crate::model::{KvType, Model, ModelError};
/// Why a cache hit was reread instead of restored (its schema is telemetry's).
pub use crate::telemetry::Fallback;
use crate::telemetry::{EngineEvent, Telemetry};
use crate::threadpool::ThreadPool;
use crate::tokenizer::Tokenizer;

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

pub struct Session<'a> {
    model: &'a Model,
    tokenizer: &'a Tokenizer,
    pool: &'a ThreadPool,
    live: Sequence,
    live_checkpoints: Vec<usize>,
    pub cache: ConversationCache,
    pub telemetry: Arc<Telemetry>,
    identity: KvIdentity,
    /// Speculative decoding's drafter (with a draft model's live sequence, parked and restored with the
    /// target's).
    drafter: Option<Drafter<'a>>,
    /// Free-memory samples that failed at a gate decision.
    pub sample_failures: u64,
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
            model: format!("{}:{}", model.cfg.arch_name, model.weight_bytes()),
            kv_type: cfg.kv_type,
            n_layer: model.cfg.n_layer,
            kv_dim: model.cfg.kv_dim(),
        };
        Ok(Session {
            model,
            tokenizer,
            pool,
            live: Sequence::new(model, cfg.kv_type, cfg.max_context)?,
            live_checkpoints: Vec::new(),
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
            self.identity.model.push_str(&format!(" + draft {}:{}", m.cfg.arch_name, m.weight_bytes()));
        }
        self.drafter = Some(drafter);
        self
    }

    /// The drafter, if speculative decoding is on.
    pub fn drafter(&self) -> Option<&Drafter<'a>> {
        self.drafter.as_ref()
    }

    /// The live sequence's tokens.
    pub fn live_tokens(&self) -> &[u32] {
        &self.live.tokens
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
        if self.live.tokens.starts_with(prompt) {
            self.live.rewind(prompt.len());
        }
        self.serve(prompt, params, obs)
    }

    /// Generates after `prompt` from the best start state (see the module comment), passing the text to
    /// `obs` as it comes and asking it whether to stop.
    pub fn serve(
        &mut self,
        prompt: &[u32],
        params: &GenerateParams,
        obs: &mut dyn Observer,
    ) -> Result<Served, EngineError> {
        if prompt.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        if prompt.len() > self.live.kv.max_tokens {
            return Err(ModelError::ContextOverflow { needed: prompt.len(), max: self.live.kv.max_tokens }.into());
        }
        let live_common = self.live.tokens.iter().zip(prompt).take_while(|(a, b)| a == b).count();
        let mut restored = None;
        let mut fallback = None;
        if live_common < self.live.tokens.len() {
            // The live sequence would lose tokens: park it, then take the best start state.
            let cand = self.cache.lookup(prompt, &self.identity, live_common);
            if let Some(c) = cand {
                self.cache.pin(c.id);
            }
            self.park_live();
            if let Some(c) = cand {
                match self.restore(c.id, c.tokens, c.kind, prompt.len(), live_common) {
                    Ok(()) => restored = Some((c.kind, c.tokens)),
                    Err(f) => fallback = f,
                }
            }
        }
        let req = Request::new(prompt, params).drafting(self.drafter.as_mut());
        let generation = generate(self.model, self.tokenizer, self.pool, &mut self.live, req, obs)?;
        let reused = generation.reused_tokens;
        let read = prompt.len() - reused;
        self.live_checkpoints.retain(|&c| c <= reused);
        self.live_checkpoints.extend((reused + 1..=prompt.len()).filter(|p| p % CHECKPOINT_EVERY == 0));
        if self.live_checkpoints.last() != Some(&prompt.len()) {
            self.live_checkpoints.push(prompt.len());
        }
        let g = &generation;
        tracing::info!(
            "prompt {} tokens = {} reused + {} read in {:.0} ms ({:.1} tok/s), {} generated in {:.0} ms ({:.1} tok/s), drafts accepted {} of {}, {} checkpoints",
            prompt.len(),
            reused,
            read,
            g.prompt_ms,
            read as f64 / (g.prompt_ms / 1e3).max(1e-9),
            g.tokens.len(),
            g.gen_ms,
            g.tokens.len() as f64 / (g.gen_ms / 1e3).max(1e-9),
            g.drafts_accepted,
            g.drafts_proposed,
            self.live_checkpoints.len(),
        );
        let draft_read = self.drafter.as_ref().and_then(Drafter::prompt_read);
        Ok(Served { generation, reused, read, restored, fallback, draft_read })
    }

    /// Parks the live sequence in the cache (when it fits the budget), evicting as needed. The live
    /// sequence itself is left as it is.
    fn park_live(&mut self) {
        let n = self.live.tokens.len();
        if n == 0 || self.cache.slots == 0 {
            return;
        }
        let t0 = Instant::now();
        let draft_live = self.drafter.as_ref().and_then(Drafter::draft_seq).filter(|d| !d.tokens.is_empty());
        let draft_bytes = draft_live.map_or(0, |d| d.kv.snapshot_bytes());
        let bytes = self.live.kv.snapshot_bytes() + draft_bytes;
        let Some(room) = self.cache.make_room(bytes) else {
            tracing::info!(
                "conversation cache: not parked: {n} tokens take {bytes} bytes, more than the budget of {} bytes can hold",
                self.cache.budget_bytes
            );
            self.telemetry.emit(EngineEvent::NotParked { tokens: n, bytes, error: None });
            return;
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
                return;
            }
        };
        let draft = draft_live.map(|d| d.kv.snapshot_into(None)).transpose();
        let kv = match draft.and_then(|draft| Ok((self.live.kv.snapshot_into(room.spare)?, draft))) {
            Ok(kv) => kv,
            Err(e) => {
                tracing::warn!("conversation cache: not parked: {e}");
                self.telemetry.emit(EngineEvent::NotParked { tokens: n, bytes, error: Some(e.to_string()) });
                return;
            }
        };
        let (kv, draft) = kv;
        host.count_copy_in(bytes);
        let mut snap =
            Snapshot::new(self.live.tokens.clone(), self.live_checkpoints.clone(), kv, self.identity.clone());
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
            ParkOutcome::NoRoom { .. } | ParkOutcome::Disabled => {}
        }
    }

    /// Restores `tokens` positions of snapshot `id` into the live sequence if the gate admits it (counting
    /// the live sequence's own pages as free: they go first) and every allocation succeeds; false
    /// otherwise, with the snapshot kept (unpinned) and, when the gate refused, the live sequence intact; the
    /// error says why (None: the snapshot was gone).
    /// A whole snapshot becomes the live sequence and leaves the cache; a checkpoint restore leaves it there
    /// (its later tokens may still be wanted).
    fn restore(
        &mut self,
        id: u64,
        tokens: usize,
        kind: RestoreKind,
        prompt_len: usize,
        live_common: usize,
    ) -> Result<(), Option<Fallback>> {
        // The draft model's KV comes back with the target's: the gate counts both, per device.
        let draft_tokens = self.cache.get(id).and_then(|s| s.draft.as_ref()).map_or(0, |d| d.len.min(tokens));
        let firsts = self.cache.get(id).map(|s| s.kv.firsts.clone()).unwrap_or_default();
        let needs = self.restore_needs(tokens, &firsts, draft_tokens);
        // The live sequence keeps its common prefix with the prompt; the rest is read.
        self.ask_gate(id, &needs, tokens, prompt_len - live_common).map_err(Some)?;
        let t0 = Instant::now();
        self.copy_in(id, tokens, draft_tokens, prompt_len)?;
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

    /// What restoring `tokens` (and `draft_tokens` of the draft model) needs on each device, with the
    /// credit of what the live sequences hold there now (they are released first). `firsts`: the
    /// snapshot's first position per layer (a sliding-window layer brings back only its window).
    fn restore_needs(&self, tokens: usize, firsts: &[usize], draft_tokens: usize) -> Vec<gate::Need> {
        let mut held = self.live.kv.device_held_bytes();
        let mut need = self.live.kv.device_need_bytes_from(tokens, firsts);
        if let Some(d) = self.drafter.as_ref().and_then(Drafter::draft_seq) {
            held.extend(d.kv.device_held_bytes());
            need.extend(d.kv.device_need_bytes(draft_tokens));
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
        id: u64,
        tokens: usize,
        draft_tokens: usize,
        prompt_len: usize,
    ) -> Result<(), Option<Fallback>> {
        self.live.rewind(0);
        self.live_checkpoints.clear();
        let mut draft_seq = self.drafter.as_mut().and_then(Drafter::draft_seq_mut);
        if let Some(d) = draft_seq.as_deref_mut() {
            d.rewind(0);
        }
        let Some(snap) = self.cache.get(id) else { return Err(None) };
        let restored =
            self.live.kv.restore(&snap.kv, tokens).and_then(|()| match (draft_seq.as_deref_mut(), &snap.draft) {
                (Some(d), Some(kv)) => {
                    d.kv.restore(kv, draft_tokens)?;
                    d.tokens = snap.tokens[..draft_tokens].to_vec();
                    Ok(())
                }
                _ => Ok(()),
            });
        if let Err(e) = restored {
            self.live.rewind(0);
            if let Some(d) = draft_seq {
                d.rewind(0);
            }
            self.cache.unpin(id);
            tracing::info!("conversation cache: restore failed, released and rereading {prompt_len} tokens: {e}");
            self.telemetry.emit(EngineEvent::OomAverted { error: e.to_string(), tokens });
            return Err(Some(Fallback::AllocFailed { error: e.to_string(), tokens }));
        }
        self.live.tokens = snap.tokens[..tokens].to_vec();
        self.live_checkpoints = snap.checkpoints.iter().copied().filter(|&c| c <= tokens).collect();
        Ok(())
    }
}
