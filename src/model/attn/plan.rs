//! The plan of a call: which queries share a pass over the keys, which pass runs on which thread, and the
//! in-order merge of the key chunks' states into each query's output. A work item is a block of
//! `QUERY_TOKENS` tokens with the heads of one KV head, its chunks run one after the other; a lone block
//! (decoding) becomes one item per chunk of `CHUNK_KEYS` keys over every head, run on the threads, whose
//! states are saved in `PARTIALS` and merged after. Either way a query's chunks are merged in key order with
//! the same operations, so neither the batch nor the thread count changes a bit. It never touches the K/V
//! pages itself: each chunk's pass is `kernel::chunk_pass`.

use std::ops::Range;

use crate::model::ops::AttnShape;
use crate::threadpool::{split_range, SharedMut, ThreadPool};

use super::exp::exp_nonpos;
use super::kernel::chunk_pass;
use super::{Layer, Queries, Query, Scratch, CHUNK_KEYS, PARTIALS, QUERY_TOKENS, SCRATCH};

/// `attention` with the layer found and the queries ready.
pub(super) fn attend_all(pool: &ThreadPool, ctx: &Layer, shape: &AttnShape, q: Queries, pos0: usize, out: &mut [f32]) {
    let AttnShape { n_head, n_head_kv, head_dim } = *shape;
    let q_dim = n_head * head_dim;
    let t_count = q.f.len() / q_dim;
    let group = n_head / n_head_kv;
    // A work item is a block of tokens with all the heads of one KV head (each K/V tile converted once for
    // them all). With one block (decoding, small batches) that is too few items for the threads, so there
    // an item is a chunk of the keys for every head, read as whole rows (contiguous memory), and the
    // chunks' states are merged after. Which queries share a pass, and on which thread a chunk runs,
    // changes no bit.
    let n_blocks = t_count.div_ceil(QUERY_TOKENS);
    let queries_of = |block: usize, kv_heads: Range<usize>, list: &mut Vec<Query>| {
        list.clear();
        for t in block * QUERY_TOKENS..((block + 1) * QUERY_TOKENS).min(t_count) {
            for h in kv_heads.start * group..kv_heads.end * group {
                let at = t * q_dim + h * head_dim;
                let pos = pos0 + t;
                list.push(Query { q_at: at, pos, lo: ctx.first_key(pos), out_at: at, kvh: h / group });
            }
        }
    };
    let shared_out = SharedMut::new(out);
    let n_key_chunks = (pos0 + t_count).div_ceil(CHUNK_KEYS);
    // Chunks wholly before every query's window hold no key any query reads.
    let first_chunk = ctx.first_key(pos0) / CHUNK_KEYS;
    if n_blocks == 1 && n_key_chunks - first_chunk > 1 {
        let per_item = t_count * n_head * (2 + head_dim);
        let items = n_key_chunks - first_chunk;
        PARTIALS.with_borrow_mut(|partials| {
            partials.resize(items * per_item, 0.0);
            let shared = SharedMut::new(partials);
            let n_chunks = pool.chunks_for(items);
            pool.run(n_chunks, |chunk| {
                SCRATCH.with_borrow_mut(|s| {
                    for c in split_range(chunk, n_chunks, items) {
                        queries_of(0, 0..n_head_kv, &mut s.queries);
                        chunk_pass(ctx, 0..n_head_kv, q, (first_chunk + c) * CHUNK_KEYS, s);
                        // SAFETY: each item writes its own slot.
                        save_chunk(s, head_dim, unsafe { shared.slice(c * per_item, per_item) });
                    }
                })
            });
            SCRATCH.with_borrow_mut(|s| {
                queries_of(0, 0..n_head_kv, &mut s.queries);
                start_totals(s, head_dim);
                for c in 0..items {
                    let c0 = (first_chunk + c) * CHUNK_KEYS;
                    merge_saved(s, head_dim, c0, &partials[c * per_item..(c + 1) * per_item]);
                }
                write_out(s, head_dim, shared_out);
            });
        });
        return;
    }
    let items = n_blocks * n_head_kv;
    let n_chunks = pool.chunks_for(items);
    pool.run(n_chunks, |chunk| {
        SCRATCH.with_borrow_mut(|s| {
            for item in split_range(chunk, n_chunks, items) {
                let kvh = item % n_head_kv;
                queries_of(item / n_head_kv, kvh..kvh + 1, &mut s.queries);
                let last = s.queries.iter().map(|x| x.pos).max().unwrap_or(0);
                let first = s.queries.iter().map(|x| x.lo).min().unwrap_or(0) / CHUNK_KEYS * CHUNK_KEYS;
                start_totals(s, head_dim);
                for c0 in (first..=last).step_by(CHUNK_KEYS) {
                    chunk_pass(ctx, kvh..kvh + 1, q, c0, s);
                    merge_chunk(s, head_dim, c0);
                }
                write_out(s, head_dim, shared_out);
            }
        })
    });
}

/// Sets every query's merged state to the empty one: m = -inf, l = 0, acc = 0.
fn start_totals(s: &mut Scratch, hd: usize) {
    s.total.clear();
    s.total.resize(s.queries.len() * (2 + hd), 0.0);
    for t in s.total.chunks_exact_mut(2 + hd) {
        t[0] = f32::NEG_INFINITY;
    }
}

/// Copies the chunk's states into `slot`: (queries, 2 + hd) as (m, l, acc).
fn save_chunk(s: &Scratch, hd: usize, slot: &mut [f32]) {
    for (qi, o) in slot.chunks_exact_mut(2 + hd).take(s.queries.len()).enumerate() {
        o[0] = s.m[qi];
        o[1] = s.l[qi];
        o[2..].copy_from_slice(&s.acc[qi * hd..(qi + 1) * hd]);
    }
}

/// Merges the states of the chunk at `c0` that `save_chunk` wrote into the totals.
fn merge_saved(s: &mut Scratch, hd: usize, c0: usize, slot: &[f32]) {
    for ((query, t), st) in s.queries.iter().zip(s.total.chunks_exact_mut(2 + hd)).zip(slot.chunks_exact(2 + hd)) {
        if reads_chunk(query, c0) {
            merge(t, st[0], st[1], &st[2..]);
        }
    }
}

/// Merges the chunk states `chunk_pass` left in `s` into the totals.
fn merge_chunk(s: &mut Scratch, hd: usize, c0: usize) {
    let Scratch { m, l, acc, total, queries, .. } = s;
    for (qi, (query, t)) in queries.iter().zip(total.chunks_exact_mut(2 + hd)).enumerate() {
        if reads_chunk(query, c0) {
            merge(t, m[qi], l[qi], &acc[qi * hd..(qi + 1) * hd]);
        }
    }
}

/// Whether `query` reads a key of the chunk at `c0` (its state from the chunk is not the empty one).
fn reads_chunk(query: &Query, c0: usize) -> bool {
    query.pos >= c0 && query.lo < c0 + CHUNK_KEYS
}

/// Merges a chunk's state (`m`, `l`, `acc`) into a query's total `t` = (m, l, acc...). Into the empty total
/// it gives the chunk's state exactly (weights 0 and e^0 = 1).
#[inline(always)]
fn merge(t: &mut [f32], m: f32, l: f32, acc: &[f32]) {
    let m_new = t[0].max(m);
    let a = if t[0] == f32::NEG_INFINITY { 0.0 } else { exp_nonpos(t[0] - m_new) };
    let b = exp_nonpos(m - m_new);
    t[0] = m_new;
    t[1] = t[1] * a + l * b;
    for (x, &y) in t[2..].iter_mut().zip(acc) {
        *x = *x * a + y * b;
    }
}

/// Each query's output: its total weighted V over its total weight.
fn write_out(s: &Scratch, hd: usize, out: SharedMut<f32>) {
    for (query, t) in s.queries.iter().zip(s.total.chunks_exact(2 + hd)) {
        let inv = 1.0 / t[1];
        // SAFETY: a query's output is written by the one item that holds it.
        let o = unsafe { out.slice(query.out_at, hd) };
        for (y, &x) in o.iter_mut().zip(&t[2..]) {
            *y = x * inv;
        }
    }
}
