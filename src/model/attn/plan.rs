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

/// One sequence of a call: its layer's pages, its rows of the queries and the output (token indices), and
/// the position of its first row.
pub(super) struct Part<'a> {
    pub ctx: Layer<'a>,
    pub rows: Range<usize>,
    pub pos0: usize,
}

impl Part<'_> {
    /// The key chunks a lone block's queries read, as items on the threads (`first..end`), or `None` when
    /// the part is read as blocks of tokens by KV head (several blocks, or one chunk of keys).
    fn lone_chunks(&self) -> Option<Range<usize>> {
        let t_count = self.rows.len();
        // Chunks wholly before every query's window hold no key any query reads.
        let first = self.ctx.first_key(self.pos0) / CHUNK_KEYS;
        let end = (self.pos0 + t_count).div_ceil(CHUNK_KEYS);
        (t_count <= QUERY_TOKENS && end - first > 1).then_some(first..end)
    }
}

/// A work item of a call.
#[derive(Clone, Copy)]
enum Item {
    /// Block `block` of a part's tokens with the heads of KV head `kvh`, its key chunks one after the
    /// other; it writes its queries' outputs.
    Block { part: usize, block: usize, kvh: usize },
    /// The key chunk at `c0` of a lone block, every head; its states go to `PARTIALS` at `slot`.
    Chunk { part: usize, c0: usize, slot: usize },
}

thread_local! {
    /// The caller's work items of a call.
    static ITEMS: std::cell::RefCell<Vec<Item>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// `attention` with each part's layer found and the queries ready: every part's work items in one run on
/// the threads (several sequences' decoding tokens share one parallel region), then the lone blocks'
/// chunk states merged in key order.
pub(super) fn attend_all(pool: &ThreadPool, parts: &[Part], shape: &AttnShape, q: Queries, out: &mut [f32]) {
    let AttnShape { n_head, n_head_kv, head_dim } = *shape;
    let q_dim = n_head * head_dim;
    let group = n_head / n_head_kv;
    // A work item is a block of tokens with all the heads of one KV head (each K/V tile converted once for
    // them all). A lone block (decoding, small batches) over several key chunks would give too few items
    // for the threads, so there an item is a chunk of the keys for every head, read as whole rows
    // (contiguous memory), and the chunks' states are merged after. Which queries share a pass, which
    // sequences share the run, and on which thread a chunk runs, changes no bit.
    let queries_of = |part: &Part, block: usize, kv_heads: Range<usize>, list: &mut Vec<Query>| {
        list.clear();
        for t in block * QUERY_TOKENS..((block + 1) * QUERY_TOKENS).min(part.rows.len()) {
            for h in kv_heads.start * group..kv_heads.end * group {
                let at = (part.rows.start + t) * q_dim + h * head_dim;
                let pos = part.pos0 + t;
                let sink = part.ctx.sinks.map_or(f32::NEG_INFINITY, |s| s[h]);
                list.push(Query { q_at: at, pos, lo: part.ctx.first_key(pos), out_at: at, kvh: h / group, sink });
            }
        }
    };
    let per_item = |part: &Part| part.rows.len() * n_head * (2 + head_dim);
    let shared_out = SharedMut::new(out);
    ITEMS.with_borrow_mut(|items| {
        items.clear();
        let mut slots = 0;
        for (pi, part) in parts.iter().enumerate() {
            match part.lone_chunks() {
                Some(chunks) => {
                    for c in chunks {
                        items.push(Item::Chunk { part: pi, c0: c * CHUNK_KEYS, slot: slots });
                        slots += per_item(part);
                    }
                }
                None => {
                    for block in 0..part.rows.len().div_ceil(QUERY_TOKENS) {
                        items.extend((0..n_head_kv).map(|kvh| Item::Block { part: pi, block, kvh }));
                    }
                }
            }
        }
        let items = &*items;
        PARTIALS.with_borrow_mut(|partials| {
            partials.resize(slots, 0.0);
            let shared = SharedMut::new(partials);
            let n_chunks = pool.chunks_for(items.len());
            pool.run(n_chunks, |chunk| {
                SCRATCH.with_borrow_mut(|s| {
                    for &item in &items[split_range(chunk, n_chunks, items.len())] {
                        match item {
                            Item::Chunk { part, c0, slot } => {
                                let part = &parts[part];
                                queries_of(part, 0, 0..n_head_kv, &mut s.queries);
                                chunk_pass(&part.ctx, 0..n_head_kv, q, c0, s);
                                // SAFETY: each item writes its own slot.
                                save_chunk(s, head_dim, unsafe { shared.slice(slot, per_item(part)) });
                            }
                            Item::Block { part, block, kvh } => {
                                let part = &parts[part];
                                queries_of(part, block, kvh..kvh + 1, &mut s.queries);
                                let last = s.queries.iter().map(|x| x.pos).max().unwrap_or(0);
                                let first = s.queries.iter().map(|x| x.lo).min().unwrap_or(0) / CHUNK_KEYS * CHUNK_KEYS;
                                start_totals(s, head_dim);
                                for c0 in (first..=last).step_by(CHUNK_KEYS) {
                                    chunk_pass(&part.ctx, kvh..kvh + 1, q, c0, s);
                                    merge_chunk(s, head_dim, c0);
                                }
                                write_out(s, head_dim, shared_out);
                            }
                        }
                    }
                })
            });
            // The lone blocks' chunk states, merged in key order.
            SCRATCH.with_borrow_mut(|s| {
                let mut slot = 0;
                for part in parts {
                    let Some(chunks) = part.lone_chunks() else { continue };
                    queries_of(part, 0, 0..n_head_kv, &mut s.queries);
                    start_totals(s, head_dim);
                    let n = per_item(part);
                    for c in chunks {
                        merge_saved(s, head_dim, c * CHUNK_KEYS, &partials[slot..slot + n]);
                        slot += n;
                    }
                    write_out(s, head_dim, shared_out);
                }
            });
        });
    });
}

/// Sets every query's merged state to the empty one (m = -inf, l = 0, acc = 0), or with a sink to the
/// sink's own: m = the sink's score, l = e^0 = 1, acc = 0 (its value is zero).
fn start_totals(s: &mut Scratch, hd: usize) {
    s.total.clear();
    s.total.resize(s.queries.len() * (2 + hd), 0.0);
    for (t, q) in s.total.chunks_exact_mut(2 + hd).zip(&s.queries) {
        t[0] = q.sink;
        t[1] = if q.sink == f32::NEG_INFINITY { 0.0 } else { 1.0 };
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
