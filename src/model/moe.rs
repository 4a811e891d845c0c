//! A mixture-of-experts feed-forward block over a batch (qwen3moe, Mixtral, gpt-oss): the router's scores,
//! the top-k pick of each token and its weights (`route`: a softmax over every expert, or over the picked
//! scores), then every expert's gated FFN over the tokens that picked it (with the expert's biases where the
//! file has them), and each token's weighted sum of its experts' outputs.
//!
//! Bit-identity across batch sizes holds as for the dense block: an expert's products give each of its
//! tokens the bits that token gets alone (the kernels are batch-invariant, `ops`), and each token sums its
//! experts in a fixed order (best first, as llama.cpp adds them), whatever else shares the pass. Ties in
//! the pick go to the lower expert index, which is what llama.cpp's `std::sort` (an insertion sort at up to
//! 16 experts) gives.

use crate::threadpool::{SharedMut, ThreadPool};

use super::acts::QuantActs;
use super::config::MoeConfig;
use super::family::{FfnAct, Gating};
use super::ops::{self, MatJob};
use super::weights::{Experts, QTensor};

/// One token's pick: an expert and its weight in the token's sum.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Pick {
    pub expert: usize,
    pub weight: f32,
}

/// llama.cpp's clamp of the picked probabilities' sum before it divides by it (the smallest normal f16).
const MIN_WEIGHT_SUM: f32 = 6.103_515_6e-5;

/// The picks of each token from its router scores (`logits`: (t_count, n_expert)), `n_used` per token,
/// best first: `out` gets (t_count * n_used) picks. With `Gating::Softmax`: softmax over all experts
/// (max-subtracted, the sum in f64), the `n_used` most probable (ties: the lower index first), their
/// probabilities divided by their sum when `norm_weights` (the sum clamped below as llama.cpp does), then
/// scaled by `weights_scale`. With `Gating::SoftmaxOfPicked`: the `n_used` highest scores, weighted by a
/// softmax over those scores alone. A NaN score counts as the least probable.
pub fn route(logits: &[f32], m: &MoeConfig, out: &mut Vec<Pick>) {
    if m.gating == Gating::SoftmaxOfPicked {
        return route_softmax_of_picked(logits, m, out);
    }
    let n = m.n_expert;
    out.clear();
    let mut probs = vec![0f32; n];
    let mut order: Vec<usize> = Vec::with_capacity(n);
    for row in logits.chunks_exact(n) {
        let max = row.iter().copied().filter(|x| !x.is_nan()).fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0f64;
        for (p, &x) in probs.iter_mut().zip(row) {
            *p = if x.is_nan() { 0.0 } else { (x - max).exp() };
            sum += *p as f64;
        }
        let inv = (1.0 / sum) as f32;
        probs.iter_mut().for_each(|p| *p *= inv);
        order.clear();
        order.extend(0..n);
        // Stable: equal probabilities keep the lower index first.
        order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]));
        let picked = &order[..m.n_used];
        let total: f32 = picked.iter().map(|&e| probs[e]).sum();
        let div = if m.norm_weights { total.max(MIN_WEIGHT_SUM) } else { 1.0 };
        for &e in picked {
            let mut w = probs[e];
            if m.norm_weights {
                w /= div;
            }
            if m.weights_scale != 1.0 {
                w *= m.weights_scale;
            }
            out.push(Pick { expert: e, weight: w });
        }
    }
}

/// `route` for `Gating::SoftmaxOfPicked` (gpt-oss): the `n_used` highest scores (ties: the lower index;
/// NaN last), their weights `e^(s - max) / sum` over the picked scores, scaled by `weights_scale`.
fn route_softmax_of_picked(logits: &[f32], m: &MoeConfig, out: &mut Vec<Pick>) {
    let n = m.n_expert;
    out.clear();
    let mut order: Vec<usize> = Vec::with_capacity(n);
    let key = |x: f32| if x.is_nan() { f32::NEG_INFINITY } else { x };
    for row in logits.chunks_exact(n) {
        order.clear();
        order.extend(0..n);
        // Stable: equal scores keep the lower index first.
        order.sort_by(|&a, &b| key(row[b]).total_cmp(&key(row[a])));
        let picked = &order[..m.n_used];
        let max = key(row[picked[0]]);
        let mut sum = 0f64;
        let first = out.len();
        for &e in picked {
            let w = if max == f32::NEG_INFINITY { 1.0 } else { (key(row[e]) - max).exp() };
            sum += w as f64;
            out.push(Pick { expert: e, weight: w });
        }
        let inv = (1.0 / sum) as f32;
        for p in &mut out[first..] {
            p.weight *= inv;
            if m.weights_scale != 1.0 {
                p.weight *= m.weights_scale;
            }
        }
    }
}

/// The block's buffers, kept across layers and grown to the largest batch.
#[derive(Default)]
pub struct MoeScratch {
    logits: Vec<f32>, // (t_count, n_expert)
    picks: Vec<Pick>, // (t_count, n_used)
    /// The rows of the tokens one expert runs on, and where each goes back: (token, rank in its picks).
    rows: Vec<f32>, // (tokens of the expert, n_embd)
    slots: Vec<(usize, usize)>,
    gate: Vec<f32>, // (tokens of the expert, n_ff_exp)
    up: Vec<f32>,   // (tokens of the expert, n_ff_exp)
    down: Vec<f32>, // (tokens of the expert, n_embd)
    /// Every token's expert outputs, already weighted, by rank: (t_count, n_used, n_embd).
    outs: Vec<f32>,
}

/// The block over `xn` (the normed rows, (t_count, d)): `out` ((t_count, d)) gets each token's weighted
/// sum of its experts' outputs.
#[allow(clippy::too_many_arguments)] // the block's inputs and buffers, each used once
pub fn forward(
    pool: &ThreadPool,
    e: &Experts,
    act_fn: FfnAct,
    xn: &[f32],
    d: usize,
    act: &mut QuantActs,
    s: &mut MoeScratch,
    out: &mut [f32],
) {
    let m = &e.cfg;
    let t_count = xn.len() / d;
    let k = m.n_used;
    s.logits.resize(t_count * m.n_expert, 0.0);
    act.quantize(pool, e.router.ty, xn, d);
    let router_bias = e.biases.as_ref().map(|b| &b.router[..]);
    ops::matmul(pool, &[MatJob { w: &e.router, bias: router_bias, out: SharedMut::new(&mut s.logits) }], act);
    route(&s.logits, m, &mut s.picks);
    s.outs.resize(t_count * k * d, 0.0);
    if t_count == 1 && same_types(e, &s.picks) {
        one_token(pool, e, act_fn, xn, d, act, s);
    } else {
        by_expert(pool, e, act_fn, xn, d, act, s);
    }
    // Each token's sum, best expert first.
    for (t, o) in out.chunks_exact_mut(d).enumerate().take(t_count) {
        let mine = &s.outs[t * k * d..(t + 1) * k * d];
        o.copy_from_slice(&mine[..d]);
        for r in 1..k {
            for (a, &b) in o.iter_mut().zip(&mine[r * d..(r + 1) * d]) {
                *a += b;
            }
        }
    }
}

/// Whether the picked experts' gate and up matrices share one type (their products can share one
/// quantization of the token's row).
fn same_types(e: &Experts, picks: &[Pick]) -> bool {
    let ty = e.gate[picks[0].expert].ty;
    picks.iter().all(|p| e.gate[p.expert].ty == ty && e.up[p.expert].ty == ty)
}

/// One token (a decode step): its row quantized once and every picked expert's gate and up in one product
/// call (one parallel region instead of one per expert), then each expert's down. Each product gives the
/// bits `by_expert` gives (the same kernels, row by row).
fn one_token(
    pool: &ThreadPool,
    e: &Experts,
    act_fn: FfnAct,
    xn: &[f32],
    d: usize,
    act: &mut QuantActs,
    s: &mut MoeScratch,
) {
    let (k, ff) = (e.cfg.n_used, e.cfg.n_ff_exp);
    s.gate.resize(k * ff, 0.0);
    s.up.resize(k * ff, 0.0);
    let gate_up: Vec<&QTensor> = s.picks.iter().flat_map(|p| [&e.gate[p.expert], &e.up[p.expert]]).collect();
    ops::prefetch_products(pool, &gate_up, 1);
    act.quantize(pool, e.gate[s.picks[0].expert].ty, xn, d);
    {
        let gates = s.gate.chunks_exact_mut(ff);
        let ups = s.up.chunks_exact_mut(ff);
        let jobs: Vec<MatJob> = s
            .picks
            .iter()
            .zip(gates.zip(ups))
            .flat_map(|(p, (g, u))| {
                let [gb, ub, _] = e.biases_of(p.expert);
                [
                    MatJob { w: &e.gate[p.expert], bias: gb, out: SharedMut::new(g) },
                    MatJob { w: &e.up[p.expert], bias: ub, out: SharedMut::new(u) },
                ]
            })
            .collect();
        ops::matmul(pool, &jobs, act);
    }
    ops::prefetch_products(pool, &[&e.down[s.picks[0].expert]], 1);
    ops::glu_par(pool, &mut s.gate, &s.up, act_fn);
    for (rank, p) in s.picks.iter().enumerate() {
        let down = &e.down[p.expert];
        if let Some(next) = s.picks.get(rank + 1) {
            // The next expert's first rows start coming while this one's product runs.
            ops::prefetch_products(pool, &[&e.down[next.expert]], 1);
        }
        act.quantize(pool, down.ty, &s.gate[rank * ff..(rank + 1) * ff], ff);
        let out = &mut s.outs[rank * d..(rank + 1) * d];
        let [_, _, db] = e.biases_of(p.expert);
        ops::matmul(pool, &[MatJob { w: down, bias: db, out: SharedMut::new(out) }], act);
        out.iter_mut().for_each(|x| *x *= p.weight);
    }
}

/// Any batch: each expert over the tokens that picked it (their rows gathered), its outputs weighted and
/// put back by (token, rank).
fn by_expert(
    pool: &ThreadPool,
    e: &Experts,
    act_fn: FfnAct,
    xn: &[f32],
    d: usize,
    act: &mut QuantActs,
    s: &mut MoeScratch,
) {
    let (k, ff) = (e.cfg.n_used, e.cfg.n_ff_exp);
    for ex in 0..e.cfg.n_expert {
        s.slots.clear();
        for (i, p) in s.picks.iter().enumerate() {
            if p.expert == ex {
                s.slots.push((i / k, i % k));
            }
        }
        let n = s.slots.len();
        if n == 0 {
            continue;
        }
        s.rows.resize(n * d, 0.0);
        for (row, &(t, _)) in s.rows.chunks_exact_mut(d).zip(&s.slots) {
            row.copy_from_slice(&xn[t * d..(t + 1) * d]);
        }
        s.gate.resize(n * ff, 0.0);
        s.up.resize(n * ff, 0.0);
        s.down.resize(n * d, 0.0);
        let mats = (&e.gate[ex], &e.up[ex], &e.down[ex]);
        let biases = e.biases_of(ex);
        ops::gated_ffn(pool, mats, biases, act_fn, &s.rows, d, act, (&mut s.gate, &mut s.up), &mut s.down);
        for (row, &(t, rank)) in s.down.chunks_exact(d).zip(&s.slots) {
            let w = s.picks[t * k + rank].weight;
            let at = (t * k + rank) * d;
            for (o, &x) in s.outs[at..at + d].iter_mut().zip(row) {
                *o = x * w;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn cfg(n_expert: usize, n_used: usize) -> MoeConfig {
        MoeConfig { n_expert, n_used, n_ff_exp: 8, norm_weights: true, weights_scale: 1.0, gating: Gating::Softmax }
    }

    /// The indices of `keys`, largest first, by insertion sort (as libstdc++'s `std::sort` does below 16
    /// elements): equal keys keep the lower index first.
    fn sorted_descending(keys: &[f64]) -> Vec<usize> {
        let mut idx: Vec<usize> = (0..keys.len()).collect();
        for i in 1..idx.len() {
            let mut j = i;
            while j > 0 && keys[idx[j]] > keys[idx[j - 1]] {
                idx.swap(j, j - 1);
                j -= 1;
            }
        }
        idx
    }

    /// The pick as llama.cpp's graph computes it, written plainly: softmax, a stable descending sort of the
    /// indices (its insertion sort at up to 16 experts), the first `n_used`, renormalized.
    fn reference(row: &[f32], m: &MoeConfig) -> Vec<(usize, f64)> {
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let e: Vec<f64> = row.iter().map(|&x| (x as f64 - max).exp()).collect();
        let sum: f64 = e.iter().sum();
        let p: Vec<f64> = e.iter().map(|x| x / sum).collect();
        let idx = sorted_descending(&p);
        let picked = &idx[..m.n_used];
        let total: f64 = picked.iter().map(|&i| p[i]).sum();
        picked.iter().map(|&i| (i, p[i] / total)).collect()
    }

    #[test]
    fn the_best_experts_are_picked_and_their_weights_sum_to_one() {
        let m = cfg(4, 2);
        let mut picks = Vec::new();
        route(&[0.0, 2.0, 1.0, -1.0], &m, &mut picks);
        assert_eq!(picks.iter().map(|p| p.expert).collect::<Vec<_>>(), vec![1, 2]);
        assert!((picks[0].weight + picks[1].weight - 1.0).abs() < 1e-6);
        assert!((picks[0].weight / picks[1].weight - 1f32.exp()).abs() < 1e-5, "{picks:?}");
    }

    #[test]
    fn ties_go_to_the_lower_index_and_nan_scores_are_never_picked_first() {
        let m = cfg(6, 3);
        let mut picks = Vec::new();
        route(&[1.0, 3.0, 1.0, 3.0, f32::NAN, 1.0], &m, &mut picks);
        assert_eq!(picks.iter().map(|p| p.expert).collect::<Vec<_>>(), vec![1, 3, 0]);
    }

    /// gpt-oss's pick as llama.cpp's graph computes it: the scores sorted stably (ties: the lower index),
    /// the first `n_used`, their weights a softmax over those scores alone.
    fn reference_of_picked(row: &[f32], n_used: usize) -> Vec<(usize, f64)> {
        let keys: Vec<f64> = row.iter().map(|&x| x as f64).collect();
        let idx = sorted_descending(&keys);
        let picked = &idx[..n_used];
        let max = row[picked[0]] as f64;
        let e: Vec<f64> = picked.iter().map(|&i| (row[i] as f64 - max).exp()).collect();
        let sum: f64 = e.iter().sum();
        picked.iter().zip(&e).map(|(&i, w)| (i, w / sum)).collect()
    }

    #[test]
    fn gpt_oss_weighs_the_picked_experts_by_a_softmax_of_their_scores() {
        let m = MoeConfig { norm_weights: false, gating: Gating::SoftmaxOfPicked, ..cfg(4, 2) };
        let mut picks = Vec::new();
        route(&[0.0, 2.0, 1.0, -1.0], &m, &mut picks);
        assert_eq!(picks.iter().map(|p| p.expert).collect::<Vec<_>>(), vec![1, 2]);
        // e^2 / (e^2 + e^1) and e^1 / (e^2 + e^1): the unpicked scores take no part.
        let e = 1f32.exp();
        assert!((picks[0].weight - e / (e + 1.0)).abs() < 1e-6 && (picks[1].weight - 1.0 / (e + 1.0)).abs() < 1e-6);
    }

    proptest! {
        /// gpt-oss's routing breaks ties as llama.cpp does and weighs the picked experts as it does (up to
        /// 16 experts, where libstdc++'s `std::sort` is an insertion sort; past that its introsort orders
        /// equal scores its own way, and Strata keeps the lower index first).
        #[test]
        fn gpt_oss_routing_picks_what_llama_cpp_picks(
            (n, k, scores) in (2usize..=16).prop_flat_map(|n| (Just(n), 1..=n.min(8), proptest::collection::vec(0i32..4, n)))
        ) {
            let m = MoeConfig { norm_weights: false, gating: Gating::SoftmaxOfPicked, ..cfg(n, k) };
            let row: Vec<f32> = scores.iter().map(|&s| s as f32 * 0.5).collect();
            let mut picks = Vec::new();
            route(&row, &m, &mut picks);
            let want = reference_of_picked(&row, k);
            prop_assert_eq!(picks.iter().map(|p| p.expert).collect::<Vec<_>>(), want.iter().map(|w| w.0).collect::<Vec<_>>());
            for (p, w) in picks.iter().zip(&want) {
                prop_assert!((p.weight as f64 - w.1).abs() < 1e-6, "{:?} {:?}", picks, want);
            }
        }

        /// Routing ties are broken as llama.cpp breaks them: scores drawn from a few values, so most rows
        /// have equal scores, picked in the reference's order with its weights.
        #[test]
        fn routing_picks_what_llama_cpp_s_sort_picks(
            (n, k, scores) in (2usize..=16).prop_flat_map(|n| (Just(n), 1..=n, proptest::collection::vec(0i32..4, n)))
        ) {
            let m = cfg(n, k);
            let row: Vec<f32> = scores.iter().map(|&s| s as f32 * 0.5).collect();
            let mut picks = Vec::new();
            route(&row, &m, &mut picks);
            let want = reference(&row, &m);
            prop_assert_eq!(picks.iter().map(|p| p.expert).collect::<Vec<_>>(), want.iter().map(|w| w.0).collect::<Vec<_>>());
            for (p, w) in picks.iter().zip(&want) {
                prop_assert!((p.weight as f64 - w.1).abs() < 1e-6, "{:?} {:?}", picks, want);
            }
        }
    }
}
