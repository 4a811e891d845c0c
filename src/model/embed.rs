//! Embeddings: one vector per input, pooled from the output-normed hidden states of a pass over it as the
//! model's `pooling_type` says (mean by default), L2-normalized, as llama.cpp's server makes them; with
//! pooling "none", every token's state as it is.
//!
//! The pass is [`Model::forward`]'s, run over a throwaway KV cache the caller gives (empty): the same
//! stages and the same batch-invariant products, so an input's vector does not depend on how it was
//! chunked, and a failed allocation is an error for that input, never an abort.

use crate::threadpool::ThreadPool;

use super::config::Pooling;
use super::forward::Head;
use super::kv::KvCache;
use super::{Model, ModelError};

impl Model {
    /// The embedding of `tokens` (n_embd values, unit length unless every pooled state is zero), read into
    /// `kv`, which must be empty and is left empty (its pages freed). With [`Pooling::None`]: every token's
    /// output-normed state, not normalized, one after another (`tokens.len() * n_embd` values).
    pub fn embed(&self, pool: &ThreadPool, kv: &mut KvCache, tokens: &[u32]) -> Result<Vec<f32>, ModelError> {
        let d = self.cfg.n_embd;
        if tokens.is_empty() {
            return Err(ModelError::NoEmbedding("the input has no tokens".into()));
        }
        if !kv.is_empty() {
            return Err(ModelError::Inconsistent(format!("an embedding's cache must be empty, it holds {}", kv.len())));
        }
        let want: Vec<usize> = match self.cfg.pooling {
            Pooling::Mean | Pooling::None => (0..tokens.len()).collect(),
            Pooling::Cls => vec![0],
            Pooling::Last => vec![tokens.len() - 1],
            p @ Pooling::Unsupported(n) => {
                return Err(ModelError::NoEmbedding(format!(
                    "the model's {}.pooling_type is {n} ({}): Strata makes embeddings with mean, cls or last pooling",
                    self.cfg.arch_name,
                    p.name()
                )))
            }
        };
        let rows = self.forward_rows(pool, kv, tokens, &want, Head::Hidden);
        kv.truncate(0);
        kv.release_unused();
        let rows = rows?;
        if self.cfg.pooling == Pooling::None {
            return Ok(rows);
        }
        let mut v = vec![0f32; d];
        for row in rows.chunks_exact(d) {
            v.iter_mut().zip(row).for_each(|(a, b)| *a += b);
        }
        let n = want.len() as f32;
        v.iter_mut().for_each(|a| *a /= n);
        normalize(&mut v);
        Ok(v)
    }
}

/// Scales `v` to unit Euclidean length (a zero vector stays zero). The sum runs in f64, in order.
pub fn normalize(v: &mut [f32]) {
    let norm = v.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x = (*x as f64 / norm) as f32);
    }
}
