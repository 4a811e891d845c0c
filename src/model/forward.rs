//! The forward pass of a model over a batch of tokens appended to a sequence's KV cache.
//!
//! Hot path: one decoded token runs this once (a batch of 1); a prompt runs it once per chunk. Each step is
//! written once for any batch size, which is what makes the logits batch-invariant (see `ops`). The layers
//! run stage by stage on their devices (see `split`); the hidden state crosses stages by a counted copy,
//! and every stage runs the same code, so a split changes no bit of the result.

use std::sync::Arc;

use crate::device::{Device, DeviceError};
use crate::threadpool::{SharedMut, ThreadPool};

use super::acts::QuantActs;
use super::attn::{self, AttnOpts};
use super::gpu::{GpuStage, HostSide};
use super::kv::KvCache;
use super::moe::{self, MoeScratch};
use super::ops::{self, AttnShape, MatJob};
use super::profile::{self, Part};
use super::weights::Ffn;
use super::{Model, ModelConfig, ModelError};

/// Logits of the requested positions of a batch: `rows` rows of `n_vocab` values.
pub struct Logits {
    pub n_vocab: usize,
    pub data: Vec<f32>, // (rows, n_vocab)
}

impl Logits {
    pub fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.n_vocab..(i + 1) * self.n_vocab]
    }
}

/// The activations of one layer over a batch, reused layer after layer.
struct Scratch {
    xn: Vec<f32>,   // (t_count, n_embd)
    q: Vec<f32>,    // (t_count, q_dim)
    k: Vec<f32>,    // (t_count, kv_dim)
    v: Vec<f32>,    // (t_count, kv_dim)
    att: Vec<f32>,  // (t_count, q_dim)
    proj: Vec<f32>, // (t_count, n_embd)
    gate: Vec<f32>, // (t_count, n_ff)
    up: Vec<f32>,   // (t_count, n_ff)
    act: QuantActs,
    /// A mixture of experts' buffers (empty for a dense model).
    moe: MoeScratch,
    ropes: Vec<Vec<(f32, f32)>>,     // (t_count, rope_dims / 2): the global layers'
    ropes_swa: Vec<Vec<(f32, f32)>>, // (t_count, rope_dims / 2): the sliding-window layers', when they differ
}

impl Scratch {
    /// Zeroed activations for a batch whose token `t` sits at position `at[t].0` of its sequence, with
    /// their rope tables (`at[t].1`: the file's per-dimension frequency divisors for that sequence's
    /// context).
    fn new(cfg: &ModelConfig, at: &[(usize, Option<&[f32]>)]) -> Scratch {
        let t_count = at.len();
        let (d, q_dim, kv_dim) = (cfg.n_embd, cfg.q_dim(), cfg.kv_dim());
        // A mixture of experts keeps its gate and up rows in `moe`.
        let ff = if cfg.moe.is_some() { 0 } else { cfg.n_ff };
        let table =
            |rope| at.iter().map(|&(pos, factors)| ops::rope_table(pos, cfg.rope_dims, rope, factors)).collect();
        let swa_differs = cfg.swa_layers.iter().any(|&s| s) && cfg.rope_swa != cfg.rope;
        Scratch {
            xn: vec![0f32; t_count * d],
            q: vec![0f32; t_count * q_dim],
            k: vec![0f32; t_count * kv_dim],
            v: vec![0f32; t_count * kv_dim],
            att: vec![0f32; t_count * q_dim],
            proj: vec![0f32; t_count * d],
            gate: vec![0f32; t_count * ff],
            up: vec![0f32; t_count * ff],
            act: QuantActs::default(),
            moe: MoeScratch::default(),
            ropes: table(&cfg.rope),
            ropes_swa: if swa_differs { table(&cfg.rope_swa) } else { Vec::new() },
        }
    }
}

/// What a pass gives back for its wanted rows: the logits, or the hidden state after the output norm
/// (`n_embd` values a row, what embeddings are pooled from).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Head {
    Logits,
    Hidden,
}

/// Where a batch sits: its size, its first position in the sequence, and the rows whose logits are wanted.
#[derive(Clone, Copy)]
struct Span<'a> {
    t_count: usize,
    pos0: usize,
    want: &'a [usize], // (n_out), ascending indices into the batch
}

/// One sequence's rows of a batch that holds several: rows `start..start + t_count` of the batch go to
/// positions `pos0..` of `kv`.
pub(super) struct Segment<'k> {
    pub(super) kv: &'k mut KvCache,
    pub(super) start: usize,
    pub(super) t_count: usize,
    pub(super) pos0: usize,
}

/// One sequence's part of a [`Model::forward_many`] call: its tokens, appended to `kv`, and the indices
/// into `tokens` (ascending) whose logits are wanted.
pub struct SeqInput<'k, 't> {
    pub kv: &'k mut KvCache,
    pub tokens: &'t [u32],
    pub want: &'t [usize],
}

/// Copies the hidden state `x` into `to` (`memcpy_dtod` between stages), counted in its ledger. A sim
/// device's memory is host memory, so the copy is a plain one.
fn copy_to(to: &Arc<Device>, x: Vec<f32>) -> Vec<f32> {
    to.count_copy_in((x.len() * 4) as u64);
    x.as_slice().to_vec()
}

impl Model {
    /// Appends `tokens` to the sequence in `kv` and returns the logits of the batch positions listed in
    /// `want` (indices into `tokens`, ascending). On error nothing is appended and the pages this call
    /// took are freed.
    ///
    /// A batch larger than the one the stages' scratch was sized for runs in pieces of that size (the
    /// result is the same: the pass is batch-invariant).
    pub fn forward(
        &self,
        pool: &ThreadPool,
        kv: &mut KvCache,
        tokens: &[u32],
        want: &[usize],
    ) -> Result<Logits, ModelError> {
        let data = self.forward_rows(pool, kv, tokens, want, Head::Logits)?;
        Ok(Logits { n_vocab: self.cfg.n_vocab, data })
    }

    /// [`Model::forward`] giving `head`'s rows of the wanted positions: (n_out, n_vocab) logits or
    /// (n_out, n_embd) hidden states.
    pub(super) fn forward_rows(
        &self,
        pool: &ThreadPool,
        kv: &mut KvCache,
        tokens: &[u32],
        want: &[usize],
        head: Head,
    ) -> Result<Vec<f32>, ModelError> {
        if let Some(&bad) = want.iter().find(|&&t| t >= tokens.len()) {
            return Err(ModelError::Inconsistent(format!("logits wanted at {bad} of a {}-token batch", tokens.len())));
        }
        let batch = self.placement.batch;
        if tokens.len() <= batch {
            return self.forward_batch(pool, kv, tokens, want, head);
        }
        let pos0 = kv.len();
        let width = if head == Head::Logits { self.cfg.n_vocab } else { self.cfg.n_embd };
        let mut data = Vec::with_capacity(want.len() * width);
        for (i, piece) in tokens.chunks(batch).enumerate() {
            let start = i * batch;
            let piece_want: Vec<usize> =
                want.iter().filter(|&&t| t >= start && t < start + piece.len()).map(|t| t - start).collect();
            match self.forward_batch(pool, kv, piece, &piece_want, head) {
                Ok(rows) => data.extend_from_slice(&rows),
                Err(e) => {
                    kv.truncate(pos0);
                    kv.release_unused();
                    return Err(e);
                }
            }
        }
        Ok(data)
    }

    /// Appends each input's tokens to its own sequence, all in one pass (continuous batching: several
    /// sequences' prompt chunks and decode steps together), and returns each input's wanted logits, or
    /// why that input failed: an input that fails (too long, a bad token, no memory for its pages) appends
    /// nothing and holds no new page, and the others go on without it.
    ///
    /// Each sequence's logits are the same bits as [`Model::forward`] on it alone: every step but attention
    /// treats a row alone, whatever rows stand beside it (see `ops`), and attention runs per sequence. GPU
    /// stages take each sequence's rows as its own pass would (`GpuStage::run_layers_many`: a decoded token
    /// by the one-token kernel, a prompt chunk by the batch kernel over its own rows), so there too a
    /// sequence's bits do not depend on the others (on the GPU they depend on its chunking, as alone).
    /// More tokens than the stages' scratch was sized for run one input after another (the same results).
    pub fn forward_many(&self, pool: &ThreadPool, inputs: &mut [SeqInput]) -> Vec<Result<Logits, ModelError>> {
        let total: usize = inputs.iter().map(|i| i.tokens.len()).sum();
        if inputs.len() <= 1 || total > self.placement.batch {
            return inputs.iter_mut().map(|i| self.forward(pool, i.kv, i.tokens, i.want)).collect();
        }
        let n_vocab = self.cfg.n_vocab;
        // Each input checked and its pages taken; None: it runs in the pass.
        let mut results: Vec<Option<Result<Logits, ModelError>>> = inputs
            .iter_mut()
            .map(|i| {
                if let Some(&bad) = i.want.iter().find(|&&t| t >= i.tokens.len()) {
                    let msg = format!("logits wanted at {bad} of a {}-token batch", i.tokens.len());
                    return Some(Err(ModelError::Inconsistent(msg)));
                }
                if let Err(e) = self.check_batch(i.kv, i.tokens) {
                    return Some(Err(e));
                }
                if i.tokens.is_empty() {
                    return Some(Ok(Logits { n_vocab, data: Vec::new() }));
                }
                self.placement.devices.on_progress(i.kv.len());
                match i.kv.reserve(i.kv.len() + i.tokens.len()) {
                    Ok(()) => None,
                    Err(e) => {
                        i.kv.release_unused();
                        Some(Err(e.into()))
                    }
                }
            })
            .collect();
        let live: Vec<usize> = (0..inputs.len()).filter(|&n| results[n].is_none()).collect();
        if live.is_empty() {
            return results.into_iter().flatten().collect();
        }
        // The pass's rows: each live input's tokens in turn, with its positions and its wanted rows.
        let (mut tokens, mut at, mut want) = (Vec::new(), Vec::new(), Vec::new());
        for &n in &live {
            let i = &inputs[n];
            let (start, pos0, factors) = (tokens.len(), i.kv.len(), self.rope_factors(i.kv));
            tokens.extend_from_slice(i.tokens);
            at.extend((0..i.tokens.len()).map(|t| (pos0 + t, factors)));
            want.extend(i.want.iter().map(|&t| start + t));
        }
        let span = Span { t_count: tokens.len(), pos0: 0, want: &want };
        let scratch = self.placement.extra_scratch(&self.cfg, span.t_count, want.len());
        let _extra_scratch = match scratch {
            Ok(held) => held,
            Err(e) => {
                for &n in &live {
                    inputs[n].kv.release_unused();
                    results[n] = Some(Err(e.clone().into()));
                }
                return results.into_iter().flatten().collect();
            }
        };
        // The wanted rows of each live input: (first, count) in `want`.
        let want_parts: Vec<(usize, usize)> = live
            .iter()
            .scan(0, |first, &n| {
                let count = inputs[n].want.len();
                *first += count;
                Some((*first - count, count))
            })
            .collect();
        let mut segs: Vec<Segment> = Vec::with_capacity(live.len());
        let mut start = 0;
        for (n, i) in inputs.iter_mut().enumerate() {
            if results[n].is_none() {
                let (t_count, pos0) = (i.tokens.len(), i.kv.len());
                segs.push(Segment { kv: &mut *i.kv, start, t_count, pos0 });
                start += t_count;
            }
        }
        let passed = self.run_stages_many(pool, &mut segs, span, &want_parts, &tokens, &at);
        let (x, mut s, gpu_logits) = match passed {
            Ok(p) => p,
            Err(e) => {
                // A device failed: no sequence keeps what this pass appended (as alone: nothing appended,
                // the pages it took freed).
                for seg in &mut segs {
                    seg.kv.release_unused();
                }
                drop(segs);
                for &n in &live {
                    results[n] = Some(Err(e.clone().into()));
                }
                return results.into_iter().flatten().collect();
            }
        };
        for seg in &mut segs {
            seg.kv.set_len(seg.pos0 + seg.t_count);
        }
        drop(segs);
        let data = match gpu_logits {
            Some(data) => data,
            None => self.cpu_head(pool, span, &x, &mut s),
        };
        let mut rows = data.chunks_exact(n_vocab);
        for &n in &live {
            let data: Vec<f32> = rows.by_ref().take(inputs[n].want.len()).flatten().copied().collect();
            results[n] = Some(Ok(Logits { n_vocab, data }));
        }
        results.into_iter().flatten().collect()
    }

    /// [`Model::forward_many`]'s stages over its rows (`tokens`, at positions `at`), every sequence's rows
    /// together: the hidden state `x` after the last stage (on the host) with the CPU stages' scratch, or the
    /// logits of the wanted rows when the last stage is a GPU (its head ran there).
    #[allow(clippy::type_complexity)]
    fn run_stages_many(
        &self,
        pool: &ThreadPool,
        segs: &mut [Segment],
        span: Span<'_>,
        want_parts: &[(usize, usize)],
        tokens: &[u32],
        at: &[(usize, Option<&[f32]>)],
    ) -> Result<(Vec<f32>, Option<Scratch>, Option<Vec<f32>>), DeviceError> {
        let placement = &self.placement;
        let d = self.cfg.n_embd;
        // Rows gathered on the GPU are scaled there (`GpuStage::embed`), the host's by `embed_host`.
        let first_gathers = placement.gpu[0].as_ref().filter(|g| g.holds_embeddings());
        let mut x = match first_gathers {
            Some(g) => {
                g.embed(tokens, d)?;
                Vec::new()
            }
            None => self.embed_host(tokens),
        };
        let mut s: Option<Scratch> = None;
        let mut gpu_logits = None;
        for (si, stage) in placement.stages.iter().enumerate() {
            if let Some(g) = &placement.gpu[si] {
                match si.checked_sub(1).and_then(|p| placement.gpu[p].as_ref()) {
                    Some(p) => g.receive_x(p, span.t_count, d)?,
                    None if si == 0 && first_gathers.is_some() => {}
                    None => g.upload_x(&x)?,
                }
                g.run_layers_many(&self.cfg, HostSide { pool, weights: &self.weights }, segs)?;
                if si + 1 == placement.stages.len() {
                    gpu_logits = Some(g.head(&self.cfg, span.want, want_parts)?);
                } else if !placement.gpu.get(si + 1).is_some_and(Option::is_some) {
                    x = g.download_x(span.t_count, d)?;
                }
                continue;
            }
            if si > 0 {
                x = copy_to(&stage.device, x);
            }
            for l in stage.layers.clone() {
                let scratch = s.get_or_insert_with(|| Scratch::new(&self.cfg, at));
                self.layer(pool, segs, l, &mut x, scratch);
            }
        }
        Ok((x, s, gpu_logits))
    }

    /// One batch of at most `placement.batch` tokens: checks it, takes its KV pages and extra scratch,
    /// runs the stages and `head` over the wanted rows. On error nothing is appended and the pages it took
    /// are freed.
    fn forward_batch(
        &self,
        pool: &ThreadPool,
        kv: &mut KvCache,
        tokens: &[u32],
        want: &[usize],
        head: Head,
    ) -> Result<Vec<f32>, ModelError> {
        let span = Span { t_count: tokens.len(), pos0: kv.len(), want };
        self.check_batch(kv, tokens)?;
        if span.t_count == 0 {
            return Ok(Vec::new());
        }
        let placement = &self.placement;
        placement.devices.on_progress(span.pos0);
        // Pages for the new positions on each layer's device (or the host), and scratch for more output
        // rows than the one the last stage was sized for.
        kv.reserve(span.pos0 + span.t_count)?;
        let _extra_scratch =
            placement.extra_scratch(&self.cfg, span.t_count, want.len()).inspect_err(|_| kv.release_unused())?;

        // Rows gathered on the GPU are scaled there (`GpuStage::embed`), the host's by `embed_host`.
        let (mut x, embedded_on_gpu) = self.embed_tokens(kv, tokens)?;
        let mut s: Option<Scratch> = None;
        let gpu_logits = self.run_stages(pool, kv, span, embedded_on_gpu, head, &mut x, &mut s)?;
        kv.set_len(span.pos0 + span.t_count);
        if let Some(data) = gpu_logits {
            return Ok(data);
        }
        Ok(match head {
            Head::Logits => self.cpu_head(pool, span, &x, &mut s),
            Head::Hidden => self.output_norm_rows(span, &x),
        })
    }

    /// Refuses a batch that would overflow the cache, or that holds a token outside the vocabulary.
    fn check_batch(&self, kv: &KvCache, tokens: &[u32]) -> Result<(), ModelError> {
        let n_vocab = self.cfg.n_vocab;
        let needed = kv.len() + tokens.len();
        if needed > kv.max_tokens {
            return Err(ModelError::ContextOverflow { needed, max: kv.max_tokens });
        }
        if let Some(&id) = tokens.iter().find(|&&id| id as usize >= n_vocab) {
            return Err(ModelError::BadToken { id, n_vocab });
        }
        Ok(())
    }

    /// The batch's embedding rows as `x`: (t_count, n_embd), the residual stream, with true when the first
    /// stage's GPU gathered them itself (then `x` is empty). A tied head lives on the last stage, so with
    /// several stages the first gathers its embedding rows from there.
    fn embed_tokens(&self, kv: &mut KvCache, tokens: &[u32]) -> Result<(Vec<f32>, bool), ModelError> {
        // On the GPU when the first stage holds the table (a tied head on one GPU), else from the mapped
        // file on the host.
        match self.placement.gpu[0].as_ref().filter(|g| g.holds_embeddings()) {
            Some(g) => {
                g.embed(tokens, self.cfg.n_embd).inspect_err(|_| kv.release_unused())?;
                Ok((Vec::new(), true))
            }
            None => Ok((self.embed_host(tokens), false)),
        }
    }

    /// The batch's embedding rows gathered on the host from the mapped file (scaled where the family scales
    /// them), in the first stage's memory (a tied head lives on the last stage, so with several stages the
    /// first gathers its rows from there): `x`, (t_count, n_embd).
    fn embed_host(&self, tokens: &[u32]) -> Vec<f32> {
        let (w, d, stages) = (&self.weights, self.cfg.n_embd, &self.placement.stages);
        let mut x = vec![0f32; tokens.len() * d];
        for (t, &id) in tokens.iter().enumerate() {
            w.token_embd.dequantize_row_into(id as usize, &mut x[t * d..(t + 1) * d]);
        }
        if self.cfg.family.embed_scale {
            let scale = (d as f32).sqrt();
            x.iter_mut().for_each(|v| *v *= scale);
        }
        if w.tied_output && stages.len() > 1 {
            x = copy_to(&stages[0].device, x);
        }
        x
    }

    /// Runs every stage over the batch in order, the hidden state `x` crossing from stage to stage; CPU
    /// stages share the scratch `s`, made at the first. Returns the logits when the last stage is on a GPU
    /// and `head` asks for them (its head ran there; for hidden states the GPU leaves `x` on the host); on
    /// a GPU's failure the pages past the filled positions are freed.
    #[allow(clippy::too_many_arguments)]
    fn run_stages(
        &self,
        pool: &ThreadPool,
        kv: &mut KvCache,
        span: Span<'_>,
        embedded_on_gpu: bool,
        head: Head,
        x: &mut Vec<f32>,
        s: &mut Option<Scratch>,
    ) -> Result<Option<Vec<f32>>, ModelError> {
        let placement = &self.placement;
        // Stages on a GPU take the hidden state from the host and return it (or, last, the logits).
        let mut gpu_logits = None;
        for (si, stage) in placement.stages.iter().enumerate() {
            if let Some(g) = &placement.gpu[si] {
                match self.run_gpu_stage(pool, si, g, kv, span, embedded_on_gpu, head, x) {
                    Ok(logits) => gpu_logits = logits,
                    Err(e) => {
                        kv.release_unused();
                        return Err(e.into());
                    }
                }
                continue;
            }
            if si > 0 {
                *x = copy_to(&stage.device, std::mem::take(x));
            }
            for l in stage.layers.clone() {
                let scratch = s.get_or_insert_with(|| self.scratch(kv, span));
                let t_count = span.t_count;
                self.layer(pool, &mut [Segment { kv, start: 0, t_count, pos0: span.pos0 }], l, x, scratch);
            }
        }
        Ok(gpu_logits)
    }

    /// GPU stage `si` over the batch: the hidden state arrives (from the previous GPU stage device to
    /// device; from the host, embeddings or a CPU stage, up), its layers run, and it returns the logits
    /// (last stage, `Head::Logits`) or leaves `x` on the host (for a CPU stage next, or the host's output
    /// norm of hidden states).
    #[allow(clippy::too_many_arguments)]
    fn run_gpu_stage(
        &self,
        pool: &ThreadPool,
        si: usize,
        g: &GpuStage,
        kv: &mut KvCache,
        span: Span<'_>,
        embedded_on_gpu: bool,
        head: Head,
        x: &mut Vec<f32>,
    ) -> Result<Option<Vec<f32>>, DeviceError> {
        let (cfg, placement, d) = (&self.cfg, &self.placement, self.cfg.n_embd);
        match si.checked_sub(1).and_then(|p| placement.gpu[p].as_ref()) {
            Some(p) => g.receive_x(p, span.t_count, d)?,
            None if embedded_on_gpu => {}
            None => g.upload_x(x)?,
        }
        g.run_layers(cfg, HostSide { pool, weights: &self.weights }, kv, span.t_count, span.pos0)?;
        let last = si + 1 == placement.stages.len();
        if last && head == Head::Logits {
            return Ok(Some(g.head(cfg, span.want, &[(0, span.want.len())])?));
        }
        if last {
            *x = g.download_x(span.t_count, d)?;
            return Ok(None);
        }
        let next_on_gpu = placement.gpu.get(si + 1).is_some_and(Option::is_some);
        if !next_on_gpu {
            *x = g.download_x(span.t_count, d)?;
        }
        Ok(None)
    }

    /// Output head on the CPU (last stage), for the wanted positions only: final norm, then the vocabulary
    /// projection, (n_out, n_vocab).
    fn cpu_head(&self, pool: &ThreadPool, span: Span<'_>, x: &[f32], s: &mut Option<Scratch>) -> Vec<f32> {
        let (cfg, w) = (&self.cfg, &self.weights);
        let (d, n_out) = (cfg.n_embd, span.want.len());
        let hn = self.output_norm_rows(span, x);
        let mut data = vec![0f32; n_out * cfg.n_vocab];
        if n_out > 0 {
            let _t = profile::time(Part::Output);
            let act = &mut s.get_or_insert_with(|| Scratch::new(cfg, &[])).act;
            act.quantize(pool, w.output.ty, &hn, d);
            ops::matmul(pool, &[MatJob { w: &w.output, bias: None, out: SharedMut::new(&mut data) }], act);
        }
        if let Some(c) = cfg.final_softcap {
            ops::softcap(&mut data, c);
        }
        data
    }

    /// The final norm of the wanted rows of the hidden state `x`: (n_out, n_embd).
    fn output_norm_rows(&self, span: Span<'_>, x: &[f32]) -> Vec<f32> {
        let (cfg, d) = (&self.cfg, self.cfg.n_embd);
        let mut hn = vec![0f32; span.want.len() * d];
        for (i, &t) in span.want.iter().enumerate() {
            ops::rms_norm(&x[t * d..(t + 1) * d], &self.weights.output_norm, cfg.rms_eps, &mut hn[i * d..(i + 1) * d]);
        }
        hn
    }

    /// The CPU stages' scratch for a batch, its rope tables for this sequence's context.
    fn scratch(&self, kv: &KvCache, span: Span<'_>) -> Scratch {
        let factors = self.rope_factors(kv);
        let at: Vec<_> = (0..span.t_count).map(|t| (span.pos0 + t, factors)).collect();
        Scratch::new(&self.cfg, &at)
    }

    /// The file's rope frequency divisors for the context of the sequence in `kv` (None: plain rope).
    fn rope_factors(&self, kv: &KvCache) -> Option<&[f32]> {
        self.weights.rope_factors.for_context(kv.max_tokens, self.cfg.rope_orig_ctx)
    }

    /// Layer `l` over the batch: attention (writing each segment's K and V rows at its positions, and
    /// attending within its own sequence) and feed-forward, added to the residual stream `x`. Every step
    /// but attention treats the batch's rows alike, whichever sequence they belong to.
    fn layer(&self, pool: &ThreadPool, segs: &mut [Segment], l: usize, x: &mut [f32], s: &mut Scratch) {
        let cfg = &self.cfg;
        let lw = &self.weights.layers[l];
        let (d, q_dim, kv_dim) = (cfg.n_embd, cfg.q_dim(), cfg.kv_dim());
        let t_count = x.len() / d;
        let shape = AttnShape { n_head: cfg.n_head, n_head_kv: cfg.n_head_kv, head_dim: cfg.head_dim };

        // Attention block.
        ops::rms_norm_rows(pool, x, &lw.attn_norm, cfg.rms_eps, d, &mut s.xn[..t_count * d]);
        let products = profile::time(Part::AttnProducts);
        s.act.quantize(pool, lw.wq.ty, &s.xn, d);
        let same_act = lw.wk.ty == lw.wq.ty && lw.wv.ty == lw.wq.ty;
        if same_act {
            ops::matmul(
                pool,
                &[
                    MatJob { w: &lw.wq, bias: lw.bq.as_deref(), out: SharedMut::new(&mut s.q) },
                    MatJob { w: &lw.wk, bias: lw.bk.as_deref(), out: SharedMut::new(&mut s.k) },
                    MatJob { w: &lw.wv, bias: lw.bv.as_deref(), out: SharedMut::new(&mut s.v) },
                ],
                &s.act,
            );
        } else {
            for (wt, b, out) in [(&lw.wq, &lw.bq, &mut s.q), (&lw.wk, &lw.bk, &mut s.k), (&lw.wv, &lw.bv, &mut s.v)] {
                s.act.quantize(pool, wt.ty, &s.xn, d);
                ops::matmul(pool, &[MatJob { w: wt, bias: b.as_deref(), out: SharedMut::new(out) }], &s.act);
            }
        }
        drop(products);
        ops::prefetch_products(pool, &[&lw.wo], t_count);
        let attention = profile::time(Part::Attention);
        let (hd, rope_dims) = (cfg.head_dim, cfg.rope_dims);
        let ropes = if cfg.swa_layers[l] && !s.ropes_swa.is_empty() { &s.ropes_swa } else { &s.ropes };
        for seg in segs.iter_mut() {
            for (t, rope) in ropes.iter().enumerate().skip(seg.start).take(seg.t_count) {
                for h in 0..cfg.n_head {
                    let at = t * q_dim + h * hd;
                    if let Some(w) = &lw.q_norm {
                        ops::rms_norm_in_place(&mut s.q[at..at + hd], w, cfg.rms_eps);
                    }
                    ops::rope_apply(&mut s.q[at..at + rope_dims], rope, cfg.rope_kind);
                }
                for h in 0..cfg.n_head_kv {
                    let at = t * kv_dim + h * hd;
                    if let Some(w) = &lw.k_norm {
                        ops::rms_norm_in_place(&mut s.k[at..at + hd], w, cfg.rms_eps);
                    }
                    ops::rope_apply(&mut s.k[at..at + rope_dims], rope, cfg.rope_kind);
                }
                let (k, v) = (&s.k[t * kv_dim..(t + 1) * kv_dim], &s.v[t * kv_dim..(t + 1) * kv_dim]);
                seg.kv.write(l, seg.pos0 + t - seg.start, k, v);
            }
        }
        let opts = AttnOpts {
            scale: cfg.attn_scale,
            softcap: cfg.attn_softcap,
            window: cfg.window(l),
            sinks: lw.sinks.as_deref(),
        };
        let seqs: Vec<attn::SeqRows> = segs
            .iter()
            .map(|g| attn::SeqRows { kv: &*g.kv, rows: g.start..g.start + g.t_count, pos0: g.pos0 })
            .collect();
        attn::attention_many(pool, &seqs, l, &shape, &opts, &s.q[..t_count * q_dim], &mut s.att[..t_count * q_dim]);
        drop(attention);
        let products = profile::time(Part::AttnProducts);
        s.act.quantize(pool, lw.wo.ty, &s.att, q_dim);
        ops::matmul(pool, &[MatJob { w: &lw.wo, bias: lw.bo.as_deref(), out: SharedMut::new(&mut s.proj) }], &s.act);
        drop(products);
        if let Some((gate, up, _)) = lw.ffn.dense() {
            ops::prefetch_products(pool, &[gate, up], t_count);
        }
        if let Some(w) = &lw.attn_post_norm {
            ops::rms_norm_rows_in_place(pool, &mut s.proj[..t_count * d], w, cfg.rms_eps, d);
        }
        ops::add_par(pool, x, &s.proj);

        // Feed-forward block (gated: SwiGLU or GeGLU), or a mixture of such blocks.
        ops::rms_norm_rows(pool, x, &lw.ffn_norm, cfg.rms_eps, d, &mut s.xn[..t_count * d]);
        let products = profile::time(Part::FfnProducts);
        match &lw.ffn {
            Ffn::Dense { gate, up, down } => ops::gated_ffn(
                pool,
                (gate, up, down),
                [None; 3],
                cfg.family.ffn_act,
                &s.xn,
                d,
                &mut s.act,
                (&mut s.gate, &mut s.up),
                &mut s.proj,
            ),
            Ffn::Moe(e) => moe::forward(
                pool,
                e,
                cfg.family.ffn_act,
                &s.xn[..t_count * d],
                d,
                &mut s.act,
                &mut s.moe,
                &mut s.proj[..t_count * d],
            ),
        }
        drop(products);
        // The next products: the next layer's attention, or the output head after the last layer.
        match self.weights.layers.get(l + 1) {
            Some(next) => ops::prefetch_products(pool, &[&next.wq, &next.wk, &next.wv], t_count),
            None => ops::prefetch_products(pool, &[&self.weights.output], t_count),
        }
        if let Some(w) = &lw.ffn_post_norm {
            ops::rms_norm_rows_in_place(pool, &mut s.proj[..t_count * d], w, cfg.rms_eps, d);
        }
        ops::add_par(pool, x, &s.proj);
    }
}
