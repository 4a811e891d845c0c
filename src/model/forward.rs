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
use super::gpu::GpuStage;
use super::kv::KvCache;
use super::ops::{self, AttnShape, MatJob};
use super::profile::{self, Part};
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
    ropes: Vec<Vec<(f32, f32)>>,     // (t_count, rope_dims / 2): the global layers'
    ropes_swa: Vec<Vec<(f32, f32)>>, // (t_count, rope_dims / 2): the sliding-window layers', when they differ
}

impl Scratch {
    /// Zeroed activations for `t_count` positions from `pos0`, with their rope tables (`factors`: the
    /// file's per-dimension frequency divisors for this sequence's context).
    fn new(cfg: &ModelConfig, factors: Option<&[f32]>, t_count: usize, pos0: usize) -> Scratch {
        let (d, q_dim, kv_dim, ff) = (cfg.n_embd, cfg.q_dim(), cfg.kv_dim(), cfg.n_ff);
        let table = |rope| (0..t_count).map(|t| ops::rope_table(pos0 + t, cfg.rope_dims, rope, factors)).collect();
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
            ropes: table(&cfg.rope),
            ropes_swa: if swa_differs { table(&cfg.rope_swa) } else { Vec::new() },
        }
    }
}

/// Where a batch sits: its size, its first position in the sequence, and the rows whose logits are wanted.
#[derive(Clone, Copy)]
struct Span<'a> {
    t_count: usize,
    pos0: usize,
    want: &'a [usize], // (n_out), ascending indices into the batch
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
        if let Some(&bad) = want.iter().find(|&&t| t >= tokens.len()) {
            return Err(ModelError::Inconsistent(format!("logits wanted at {bad} of a {}-token batch", tokens.len())));
        }
        let batch = self.placement.batch;
        if tokens.len() <= batch {
            return self.forward_batch(pool, kv, tokens, want);
        }
        let pos0 = kv.len();
        let mut data = Vec::with_capacity(want.len() * self.cfg.n_vocab);
        for (i, piece) in tokens.chunks(batch).enumerate() {
            let start = i * batch;
            let piece_want: Vec<usize> =
                want.iter().filter(|&&t| t >= start && t < start + piece.len()).map(|t| t - start).collect();
            match self.forward_batch(pool, kv, piece, &piece_want) {
                Ok(l) => data.extend_from_slice(&l.data),
                Err(e) => {
                    kv.truncate(pos0);
                    kv.release_unused();
                    return Err(e);
                }
            }
        }
        Ok(Logits { n_vocab: self.cfg.n_vocab, data })
    }

    /// One batch of at most `placement.batch` tokens: checks it, takes its KV pages and extra scratch,
    /// runs the stages and the output head. On error nothing is appended and the pages it took are freed.
    fn forward_batch(
        &self,
        pool: &ThreadPool,
        kv: &mut KvCache,
        tokens: &[u32],
        want: &[usize],
    ) -> Result<Logits, ModelError> {
        let n_vocab = self.cfg.n_vocab;
        let span = Span { t_count: tokens.len(), pos0: kv.len(), want };
        self.check_batch(kv, tokens)?;
        if span.t_count == 0 {
            return Ok(Logits { n_vocab, data: Vec::new() });
        }
        let placement = &self.placement;
        placement.devices.on_progress(span.pos0);
        // Pages for the new positions on each layer's device (or the host), and scratch for more output
        // rows than the one the last stage was sized for.
        kv.reserve(span.pos0 + span.t_count)?;
        let _extra_scratch =
            placement.extra_scratch(&self.cfg, span.t_count, want.len()).inspect_err(|_| kv.release_unused())?;

        let (mut x, embedded_on_gpu) = self.embed_tokens(kv, tokens)?;
        // Rows gathered on the GPU are scaled there (`GpuStage::embed`); these are the host's.
        if self.cfg.family.embed_scale && !embedded_on_gpu {
            let scale = (self.cfg.n_embd as f32).sqrt();
            x.iter_mut().for_each(|v| *v *= scale);
        }
        let mut s: Option<Scratch> = None;
        let gpu_logits = self.run_stages(pool, kv, span, embedded_on_gpu, &mut x, &mut s)?;
        kv.set_len(span.pos0 + span.t_count);
        if let Some(data) = gpu_logits {
            return Ok(Logits { n_vocab, data });
        }
        let data = self.cpu_head(pool, span, &x, &mut s);
        Ok(Logits { n_vocab, data })
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
        let (w, d, stages) = (&self.weights, self.cfg.n_embd, &self.placement.stages);
        // On the GPU when the first stage holds the table (a tied head on one GPU), else from the mapped
        // file on the host.
        let embedded_on_gpu = match self.placement.gpu[0].as_ref().filter(|g| g.holds_embeddings()) {
            Some(g) => {
                g.embed(tokens, d).inspect_err(|_| kv.release_unused())?;
                true
            }
            None => false,
        };
        let mut x = vec![0f32; if embedded_on_gpu { 0 } else { tokens.len() * d }];
        if !embedded_on_gpu {
            for (t, &id) in tokens.iter().enumerate() {
                w.token_embd.dequantize_row_into(id as usize, &mut x[t * d..(t + 1) * d]);
            }
        }
        if w.tied_output && stages.len() > 1 {
            x = copy_to(&stages[0].device, x);
        }
        Ok((x, embedded_on_gpu))
    }

    /// Runs every stage over the batch in order, the hidden state `x` crossing from stage to stage; CPU
    /// stages share the scratch `s`, made at the first. Returns the logits when the last stage is on a GPU
    /// (its head ran there); on a GPU's failure the pages past the filled positions are freed.
    fn run_stages(
        &self,
        pool: &ThreadPool,
        kv: &mut KvCache,
        span: Span<'_>,
        embedded_on_gpu: bool,
        x: &mut Vec<f32>,
        s: &mut Option<Scratch>,
    ) -> Result<Option<Vec<f32>>, ModelError> {
        let placement = &self.placement;
        // Stages on a GPU take the hidden state from the host and return it (or, last, the logits).
        let mut gpu_logits = None;
        for (si, stage) in placement.stages.iter().enumerate() {
            if let Some(g) = &placement.gpu[si] {
                match self.run_gpu_stage(si, g, kv, span, embedded_on_gpu, x) {
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
                self.layer(pool, kv, l, span.pos0, x, scratch);
            }
        }
        Ok(gpu_logits)
    }

    /// GPU stage `si` over the batch: the hidden state arrives (from the previous GPU stage device to
    /// device; from the host, embeddings or a CPU stage, up), its layers run, and it returns the logits
    /// (last stage) or leaves `x` on the host for a CPU stage next.
    fn run_gpu_stage(
        &self,
        si: usize,
        g: &GpuStage,
        kv: &mut KvCache,
        span: Span<'_>,
        embedded_on_gpu: bool,
        x: &mut Vec<f32>,
    ) -> Result<Option<Vec<f32>>, DeviceError> {
        let (cfg, placement, d) = (&self.cfg, &self.placement, self.cfg.n_embd);
        match si.checked_sub(1).and_then(|p| placement.gpu[p].as_ref()) {
            Some(p) => g.receive_x(p, span.t_count, d)?,
            None if embedded_on_gpu => {}
            None => g.upload_x(x)?,
        }
        g.run_layers(cfg, kv, span.t_count, span.pos0)?;
        if si + 1 == placement.stages.len() {
            return Ok(Some(g.head(cfg, span.want)?));
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
        let (d, want) = (cfg.n_embd, span.want);
        let n_out = want.len();
        let mut hn = vec![0f32; n_out * d];
        for (i, &t) in want.iter().enumerate() {
            ops::rms_norm(&x[t * d..(t + 1) * d], &w.output_norm, cfg.rms_eps, &mut hn[i * d..(i + 1) * d]);
        }
        let mut data = vec![0f32; n_out * cfg.n_vocab];
        if n_out > 0 {
            let _t = profile::time(Part::Output);
            let act = &mut s.get_or_insert_with(|| Scratch::new(cfg, None, span.t_count, span.pos0)).act;
            act.quantize(pool, w.output.ty, &hn, d);
            ops::matmul(pool, &[MatJob { w: &w.output, bias: None, out: SharedMut::new(&mut data) }], act);
        }
        if let Some(c) = cfg.final_softcap {
            ops::softcap(&mut data, c);
        }
        data
    }

    /// The CPU stages' scratch for a batch, its rope tables for this sequence's context.
    fn scratch(&self, kv: &KvCache, span: Span<'_>) -> Scratch {
        let factors = self.weights.rope_factors.for_context(kv.max_tokens, self.cfg.rope_orig_ctx);
        Scratch::new(&self.cfg, factors, span.t_count, span.pos0)
    }

    /// Layer `l` over the batch: attention (writing the batch's K and V rows at `pos0..`) and feed-forward,
    /// added to the residual stream `x`.
    fn layer(&self, pool: &ThreadPool, kv: &mut KvCache, l: usize, pos0: usize, x: &mut [f32], s: &mut Scratch) {
        let cfg = &self.cfg;
        let lw = &self.weights.layers[l];
        let (d, q_dim, kv_dim, ff) = (cfg.n_embd, cfg.q_dim(), cfg.kv_dim(), cfg.n_ff);
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
        for (t, rope) in ropes.iter().enumerate().take(t_count) {
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
            kv.write(l, pos0 + t, &s.k[t * kv_dim..(t + 1) * kv_dim], &s.v[t * kv_dim..(t + 1) * kv_dim]);
        }
        let opts = AttnOpts { scale: cfg.attn_scale, softcap: cfg.attn_softcap, window: cfg.window(l) };
        attn::attention(pool, kv, l, &shape, &opts, &s.q, pos0, &mut s.att);
        drop(attention);
        let products = profile::time(Part::AttnProducts);
        s.act.quantize(pool, lw.wo.ty, &s.att, q_dim);
        ops::matmul(pool, &[MatJob { w: &lw.wo, bias: None, out: SharedMut::new(&mut s.proj) }], &s.act);
        drop(products);
        ops::prefetch_products(pool, &[&lw.w_gate, &lw.w_up], t_count);
        if let Some(w) = &lw.attn_post_norm {
            ops::rms_norm_rows_in_place(pool, &mut s.proj[..t_count * d], w, cfg.rms_eps, d);
        }
        ops::add_par(pool, x, &s.proj);

        // Feed-forward block (gated: SwiGLU or GeGLU).
        ops::rms_norm_rows(pool, x, &lw.ffn_norm, cfg.rms_eps, d, &mut s.xn[..t_count * d]);
        let products = profile::time(Part::FfnProducts);
        s.act.quantize(pool, lw.w_gate.ty, &s.xn, d);
        if lw.w_up.ty == lw.w_gate.ty {
            ops::matmul(
                pool,
                &[
                    MatJob { w: &lw.w_gate, bias: None, out: SharedMut::new(&mut s.gate) },
                    MatJob { w: &lw.w_up, bias: None, out: SharedMut::new(&mut s.up) },
                ],
                &s.act,
            );
        } else {
            ops::matmul(pool, &[MatJob { w: &lw.w_gate, bias: None, out: SharedMut::new(&mut s.gate) }], &s.act);
            s.act.quantize(pool, lw.w_up.ty, &s.xn, d);
            ops::matmul(pool, &[MatJob { w: &lw.w_up, bias: None, out: SharedMut::new(&mut s.up) }], &s.act);
        }
        ops::prefetch_products(pool, &[&lw.w_down], t_count);
        ops::glu_par(pool, &mut s.gate, &s.up, cfg.family.ffn_act);
        s.act.quantize(pool, lw.w_down.ty, &s.gate, ff);
        ops::matmul(pool, &[MatJob { w: &lw.w_down, bias: None, out: SharedMut::new(&mut s.proj) }], &s.act);
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
