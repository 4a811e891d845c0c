//! The forward pass of a llama-shaped model over a batch of tokens appended to a sequence's KV cache.
//!
//! Hot path: one decoded token runs this once (a batch of 1); a prompt runs it once per chunk. Each step is
//! written once for any batch size, which is what makes the logits batch-invariant (see `ops`).

use crate::threadpool::ThreadPool;

use super::acts::QuantActs;
use super::kv::KvCache;
use super::ops::{self, AttnShape, MatJob, SharedMut};
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

impl Model {
    /// Appends `tokens` to the sequence in `kv` and returns the logits of the batch positions listed in
    /// `want` (indices into `tokens`, ascending). On error nothing is appended.
    pub fn forward(
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
        kv.reserve(pos0 + t_count);

        let (d, q_dim, kv_dim, ff) = (cfg.n_embd, cfg.q_dim(), cfg.kv_dim(), cfg.n_ff);
        let shape = AttnShape { n_head: cfg.n_head, n_head_kv: cfg.n_head_kv, head_dim: cfg.head_dim };

        // x: (t_count, n_embd), the residual stream.
        let mut x = vec![0f32; t_count * d];
        for (t, &id) in tokens.iter().enumerate() {
            w.token_embd.dequantize_row_into(id as usize, &mut x[t * d..(t + 1) * d]);
        }
        let ropes: Vec<Vec<(f32, f32)>> =
            (0..t_count).map(|t| ops::rope_table(pos0 + t, cfg.rope_dims, cfg.rope_base)).collect();

        let mut xn = vec![0f32; t_count * d]; // (t_count, n_embd)
        let mut q = vec![0f32; t_count * q_dim]; // (t_count, q_dim)
        let mut k = vec![0f32; t_count * kv_dim]; // (t_count, kv_dim)
        let mut v = vec![0f32; t_count * kv_dim]; // (t_count, kv_dim)
        let mut att = vec![0f32; t_count * q_dim]; // (t_count, q_dim)
        let mut proj = vec![0f32; t_count * d]; // (t_count, n_embd)
        let mut gate = vec![0f32; t_count * ff]; // (t_count, n_ff)
        let mut up = vec![0f32; t_count * ff]; // (t_count, n_ff)
        let mut act = QuantActs::default();

        for (l, lw) in w.layers.iter().enumerate() {
            // Attention block.
            for t in 0..t_count {
                ops::rms_norm(&x[t * d..(t + 1) * d], &lw.attn_norm, cfg.rms_eps, &mut xn[t * d..(t + 1) * d]);
            }
            act.quantize(pool, lw.wq.ty, &xn, d);
            debug_assert_eq!(lw.wq.ty, lw.wk.ty);
            let same_act = lw.wk.ty == lw.wq.ty && lw.wv.ty == lw.wq.ty;
            if same_act {
                ops::matmul(
                    pool,
                    &[
                        MatJob { w: &lw.wq, bias: lw.bq.as_deref(), out: SharedMut::new(&mut q) },
                        MatJob { w: &lw.wk, bias: lw.bk.as_deref(), out: SharedMut::new(&mut k) },
                        MatJob { w: &lw.wv, bias: lw.bv.as_deref(), out: SharedMut::new(&mut v) },
                    ],
                    &act,
                );
            } else {
                for (wt, b, out) in [(&lw.wq, &lw.bq, &mut q), (&lw.wk, &lw.bk, &mut k), (&lw.wv, &lw.bv, &mut v)] {
                    act.quantize(pool, wt.ty, &xn, d);
                    ops::matmul(pool, &[MatJob { w: wt, bias: b.as_deref(), out: SharedMut::new(out) }], &act);
                }
            }
            for t in 0..t_count {
                for h in 0..cfg.n_head {
                    let at = t * q_dim + h * cfg.head_dim;
                    ops::rope_apply(&mut q[at..at + cfg.rope_dims], &ropes[t], cfg.rope_kind);
                }
                for h in 0..cfg.n_head_kv {
                    let at = t * kv_dim + h * cfg.head_dim;
                    ops::rope_apply(&mut k[at..at + cfg.rope_dims], &ropes[t], cfg.rope_kind);
                }
                kv.write(l, pos0 + t, &k[t * kv_dim..(t + 1) * kv_dim], &v[t * kv_dim..(t + 1) * kv_dim]);
            }
            ops::attention(pool, kv, l, &shape, &q, pos0, &mut att);
            act.quantize(pool, lw.wo.ty, &att, q_dim);
            ops::matmul(pool, &[MatJob { w: &lw.wo, bias: None, out: SharedMut::new(&mut proj) }], &act);
            for (a, b) in x.iter_mut().zip(&proj) {
                *a += b;
            }

            // Feed-forward block (SwiGLU).
            for t in 0..t_count {
                ops::rms_norm(&x[t * d..(t + 1) * d], &lw.ffn_norm, cfg.rms_eps, &mut xn[t * d..(t + 1) * d]);
            }
            act.quantize(pool, lw.w_gate.ty, &xn, d);
            if lw.w_up.ty == lw.w_gate.ty {
                ops::matmul(
                    pool,
                    &[
                        MatJob { w: &lw.w_gate, bias: None, out: SharedMut::new(&mut gate) },
                        MatJob { w: &lw.w_up, bias: None, out: SharedMut::new(&mut up) },
                    ],
                    &act,
                );
            } else {
                ops::matmul(pool, &[MatJob { w: &lw.w_gate, bias: None, out: SharedMut::new(&mut gate) }], &act);
                act.quantize(pool, lw.w_up.ty, &xn, d);
                ops::matmul(pool, &[MatJob { w: &lw.w_up, bias: None, out: SharedMut::new(&mut up) }], &act);
            }
            ops::swiglu(&mut gate, &up);
            act.quantize(pool, lw.w_down.ty, &gate, ff);
            ops::matmul(pool, &[MatJob { w: &lw.w_down, bias: None, out: SharedMut::new(&mut proj) }], &act);
            for (a, b) in x.iter_mut().zip(&proj) {
                *a += b;
            }
        }
        kv.set_len(pos0 + t_count);

        // Output head, for the wanted positions only.
        let n_out = want.len();
        let mut hn = vec![0f32; n_out * d];
        for (i, &t) in want.iter().enumerate() {
            ops::rms_norm(&x[t * d..(t + 1) * d], &w.output_norm, cfg.rms_eps, &mut hn[i * d..(i + 1) * d]);
        }
        let mut data = vec![0f32; n_out * n_vocab];
        if n_out > 0 {
            act.quantize(pool, w.output.ty, &hn, d);
            ops::matmul(pool, &[MatJob { w: &w.output, bias: None, out: SharedMut::new(&mut data) }], &act);
        }
        Ok(Logits { n_vocab, data })
    }
}
