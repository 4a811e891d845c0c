//! The forward pass of a llama-shaped model over a batch of tokens appended to a sequence's KV cache.
//!
//! Hot path: one decoded token runs this once (a batch of 1); a prompt runs it once per chunk. Each step is
//! written once for any batch size, which is what makes the logits batch-invariant (see `ops`). The layers
//! run stage by stage on their devices (see `split`); the hidden state crosses stages by a counted copy,
//! and every stage runs the same code, so a split changes no bit of the result.

use std::sync::Arc;

use crate::device::Device;
use crate::threadpool::{SharedMut, ThreadPool};

use super::acts::QuantActs;
use super::attn;
use super::kv::KvCache;
use super::ops::{self, AttnShape, MatJob};
use super::{Model, ModelError};

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
    ropes: Vec<Vec<(f32, f32)>>, // (t_count, rope_dims / 2)
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

    fn forward_batch(
        &self,
        pool: &ThreadPool,
        kv: &mut KvCache,
        tokens: &[u32],
        want: &[usize],
    ) -> Result<Logits, ModelError> {
        let cfg = &self.cfg;
        let w = &self.weights;
        let n_vocab = cfg.n_vocab;
        let t_count = tokens.len();
        let pos0 = kv.len();
        if pos0 + t_count > kv.max_tokens {
            return Err(ModelError::ContextOverflow { needed: pos0 + t_count, max: kv.max_tokens });
        }
        if let Some(&id) = tokens.iter().find(|&&id| id as usize >= n_vocab) {
            return Err(ModelError::BadToken { id, n_vocab });
        }
        if t_count == 0 {
            return Ok(Logits { n_vocab, data: Vec::new() });
        }
        let placement = &self.placement;
        placement.devices.on_progress(pos0);
        // Pages for the new positions on each layer's device (or the host), and scratch for more output
        // rows than the one the last stage was sized for.
        kv.reserve(pos0 + t_count)?;
        let _extra_scratch = placement.extra_scratch(cfg, t_count, want.len()).inspect_err(|_| kv.release_unused())?;

        let (d, q_dim, kv_dim, ff) = (cfg.n_embd, cfg.q_dim(), cfg.kv_dim(), cfg.n_ff);
        let stages = &placement.stages;

        // x: (t_count, n_embd), the residual stream. A tied head lives on the last stage, so the first
        // gathers its embedding rows from there.
        // The embedding rows: on the GPU when the first stage holds the table (a tied head on one GPU),
        // else from the mapped file on the host.
        let embedded_on_gpu = match placement.gpu[0].as_ref().filter(|g| g.holds_embeddings()) {
            Some(g) => {
                g.embed(tokens, d).inspect_err(|_| kv.release_unused())?;
                true
            }
            None => false,
        };
        let mut x = vec![0f32; if embedded_on_gpu { 0 } else { t_count * d }];
        if !embedded_on_gpu {
            for (t, &id) in tokens.iter().enumerate() {
                w.token_embd.dequantize_row_into(id as usize, &mut x[t * d..(t + 1) * d]);
            }
        }
        if w.tied_output && stages.len() > 1 {
            x = copy_to(&stages[0].device, x);
        }
        // Stages on a GPU take the hidden state from the host and return it (or, last, the logits).
        let mut gpu_logits = None;
        // The CPU's activations, for stages computed on the CPU (GPU stages keep their own).
        let new_scratch = || Scratch {
            xn: vec![0f32; t_count * d],
            q: vec![0f32; t_count * q_dim],
            k: vec![0f32; t_count * kv_dim],
            v: vec![0f32; t_count * kv_dim],
            att: vec![0f32; t_count * q_dim],
            proj: vec![0f32; t_count * d],
            gate: vec![0f32; t_count * ff],
            up: vec![0f32; t_count * ff],
            act: QuantActs::default(),
            ropes: (0..t_count).map(|t| ops::rope_table(pos0 + t, cfg.rope_dims, cfg.rope_base)).collect(),
        };
        let mut s: Option<Scratch> = None;
        for (si, stage) in stages.iter().enumerate() {
            if let Some(g) = &placement.gpu[si] {
                // From the previous GPU stage device to device; from the host (embeddings, a CPU stage) up.
                let prev = si.checked_sub(1).and_then(|p| placement.gpu[p].as_ref());
                let arrive = match prev {
                    Some(p) => g.receive_x(p, t_count, d),
                    None if embedded_on_gpu => Ok(()),
                    None => g.upload_x(&x),
                };
                let next_on_gpu = placement.gpu.get(si + 1).is_some_and(Option::is_some);
                let ran = arrive.and_then(|_| g.run_layers(cfg, kv, t_count, pos0)).and_then(|_| {
                    if si + 1 == stages.len() {
                        gpu_logits = Some(g.head(cfg, want)?);
                    } else if !next_on_gpu {
                        x = g.download_x(t_count, d)?;
                    }
                    Ok(())
                });
                if let Err(e) = ran {
                    kv.release_unused();
                    return Err(e.into());
                }
                continue;
            }
            if si > 0 {
                x = copy_to(&stage.device, x);
            }
            for l in stage.layers.clone() {
                self.layer(pool, kv, l, pos0, &mut x, s.get_or_insert_with(new_scratch));
            }
        }
        kv.set_len(pos0 + t_count);
        if let Some(data) = gpu_logits {
            return Ok(Logits { n_vocab, data });
        }

        // Output head (last stage), for the wanted positions only.
        let n_out = want.len();
        let mut hn = vec![0f32; n_out * d];
        for (i, &t) in want.iter().enumerate() {
            ops::rms_norm(&x[t * d..(t + 1) * d], &w.output_norm, cfg.rms_eps, &mut hn[i * d..(i + 1) * d]);
        }
        let mut data = vec![0f32; n_out * n_vocab];
        if n_out > 0 {
            let act = &mut s.get_or_insert_with(new_scratch).act;
            act.quantize(pool, w.output.ty, &hn, d);
            ops::matmul(pool, &[MatJob { w: &w.output, bias: None, out: SharedMut::new(&mut data) }], act);
        }
        Ok(Logits { n_vocab, data })
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
        for t in 0..t_count {
            ops::rms_norm(&x[t * d..(t + 1) * d], &lw.attn_norm, cfg.rms_eps, &mut s.xn[t * d..(t + 1) * d]);
        }
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
        for t in 0..t_count {
            for h in 0..cfg.n_head {
                let at = t * q_dim + h * cfg.head_dim;
                ops::rope_apply(&mut s.q[at..at + cfg.rope_dims], &s.ropes[t], cfg.rope_kind);
            }
            for h in 0..cfg.n_head_kv {
                let at = t * kv_dim + h * cfg.head_dim;
                ops::rope_apply(&mut s.k[at..at + cfg.rope_dims], &s.ropes[t], cfg.rope_kind);
            }
            kv.write(l, pos0 + t, &s.k[t * kv_dim..(t + 1) * kv_dim], &s.v[t * kv_dim..(t + 1) * kv_dim]);
        }
        attn::attention(pool, kv, l, &shape, &s.q, pos0, &mut s.att);
        s.act.quantize(pool, lw.wo.ty, &s.att, q_dim);
        ops::matmul(pool, &[MatJob { w: &lw.wo, bias: None, out: SharedMut::new(&mut s.proj) }], &s.act);
        for (a, b) in x.iter_mut().zip(&s.proj) {
            *a += b;
        }

        // Feed-forward block (SwiGLU).
        for t in 0..t_count {
            ops::rms_norm(&x[t * d..(t + 1) * d], &lw.ffn_norm, cfg.rms_eps, &mut s.xn[t * d..(t + 1) * d]);
        }
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
        ops::swiglu(&mut s.gate, &s.up);
        s.act.quantize(pool, lw.w_down.ty, &s.gate, ff);
        ops::matmul(pool, &[MatJob { w: &lw.w_down, bias: None, out: SharedMut::new(&mut s.proj) }], &s.act);
        for (a, b) in x.iter_mut().zip(&s.proj) {
            *a += b;
        }
    }
}
