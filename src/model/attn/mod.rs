//! Attention on the CPU over the paged KV cache, in the flash-attention scheme: keys in tiles of
//! `KEY_TILE` positions with an online softmax (a running max, sum and output per query, rescaled tile by
//! tile) inside chunks of `CHUNK_KEYS` keys, whose states are then merged in order. No score row as long
//! as the context is kept. A batch runs a query's chunks one after the other, converting each K and V tile
//! to f32 once for all the heads of a GQA group and up to `QUERY_TOKENS` tokens; decoding (one block of
//! tokens) runs the chunks on the threads, each over whole KV rows (every head, contiguous memory).
//!
//! What it keeps of the engine's promises:
//! - Batch invariance: a query's result is computed by the same operations in the same order whatever
//!   other queries share its pass and whichever thread runs a chunk. Tiles and chunks start at multiples of
//!   `KEY_TILE` and `CHUNK_KEYS` (absolute positions), a query reads only its keys (the other lanes of its
//!   last tile are masked to a weight of exactly 0), and every reduction (over head dimensions, over a
//!   tile's keys, over tiles, over chunks) has a fixed order. So logits are bit-identical across batch
//!   sizes, chunkings and thread counts, and a restored cache gives what a reread one does.
//! - Page location: on the CPU every page is host memory and is read the same way; a tile never straddles
//!   a page (`KV_PAGE_TOKENS` is a multiple of `KEY_TILE`).
//! - The arithmetic is plain f32 (no fused multiply-adds, which Rust never contracts), with `exp` from a
//!   polynomial (`exp_nonpos`), so the AVX2 instance (the same code compiled with AVX2 enabled, for 8-lane
//!   vectors) and the portable one give the same bits.
//!
//! Hot path: a key's score is eight lanes of products summed in a fixed tree, eight keys per step; the
//! weighted sum of V runs along the head dimension with the output in registers. Consecutive queries that
//! read the same keys (the heads of a GQA group, or the next token's) take a tile together, two on AVX2 and
//! three on AVX-512, so each K and V vector is loaded once for them all; each query's operations and their
//! order are the ones it gets alone. Scratch lives per thread
//! (`SCRATCH`), the work items in the caller's `ITEMS` and the chunk states in its `PARTIALS`: a call
//! allocates only the list of its sequences' layers (`attention_many`'s `parts`, one entry per sequence).
//!
//! With int8 KV (q8_0 rows) the scores are integer dot products, as llama.cpp's quantized-KV path: each
//! query is quantized to q8_0 once per call (`quantize_queries`, the activations' quantizer), the K tile
//! keeps its 8-bit values, and a key's score is, block by block in order, `(d_k * d_q) * isum` added up in
//! f32, where `isum` is the block's exact integer sum. Integer sums have one value in any order, so every
//! instance gives the same bits here too. The values stay f32 (converted once per tile).
//!
//! Rooms: this file holds the entry point (`attention`), the scheme's sizes and the buffers a pass works
//! in; `plan.rs` cuts a call into work items (query blocks by KV head, or key chunks on the threads) and
//! merges the chunks' states in order; `kernel.rs` is a chunk's pass (the online softmax over tiles) and
//! its portable, AVX2 and AVX-512 instances; `simd.rs` the x86-64 vector forms of its steps, each giving
//! the portable step's bits; `tile.rs` brings a K/V tile from the pages into the scratch as the kernels
//! read it. It never reads a GPU layer's pages (those attend with a kernel) and never allocates per token
//! once its buffers have grown.

mod exp;
mod kernel;
mod plan;
#[cfg(target_arch = "x86_64")]
mod simd;
#[cfg(test)]
mod tests;
mod tile;

use std::cell::RefCell;
use std::ops::Range;

use crate::quant::{self, GgmlType, QK};
use crate::threadpool::ThreadPool;

use super::kv::{KvCache, KvPage, KV_PAGE_TOKENS};
use super::ops::AttnShape;

pub use exp::exp_nonpos;
use plan::{attend_all, Part};

/// Keys per tile.
pub const KEY_TILE: usize = 32;
/// Bytes of a q8_0 block (int8 KV rows and the quantized queries): an f16 scale, then `QK` signed bytes.
const Q8_BLOCK: usize = 2 + QK;
/// Keys per chunk: a query attends its keys chunk by chunk (tiles with an online softmax inside a chunk,
/// from a fresh state), and the chunks' states are merged in order. Decoding runs a query's chunks on
/// different threads; a batch runs them one after the other. Same operations either way.
pub const CHUNK_KEYS: usize = 256;
/// Tokens of a batch whose queries share one pass over the keys.
const QUERY_TOKENS: usize = 8;

const _: () = assert!(KV_PAGE_TOKENS.is_multiple_of(KEY_TILE), "a tile must not straddle a page");
const _: () = assert!(CHUNK_KEYS.is_multiple_of(KEY_TILE), "a tile must not straddle a chunk");

/// One query of a pass: its vector, its keys (causal: `lo..=pos`, `lo` past 0 in a sliding-window layer)
/// and where its output goes (an offset into the output, `head_dim` values).
#[derive(Clone, Copy)]
struct Query {
    q_at: usize,
    pos: usize,
    lo: usize,
    out_at: usize,
    kvh: usize,
    /// The head's sink score (`AttnOpts::sinks`), or -inf without one.
    sink: f32,
}

/// Per-thread buffers of a pass.
#[derive(Default)]
struct Scratch {
    k: Vec<f32>,     // (KEY_TILE, heads of the tile, head_dim); with int8 KV unused
    kq: Vec<i8>,     // (KEY_TILE, heads of the tile, head_dim): int8 KV's key quants
    kd: Vec<f32>,    // (heads of the tile * head_dim / 32, KEY_TILE): int8 KV's key block scales, by block
    v: Vec<f32>,     // (KEY_TILE, heads of the tile, head_dim)
    m: Vec<f32>,     // (queries): a chunk's running max of the scores
    l: Vec<f32>,     // (queries): a chunk's running sum of the weights
    acc: Vec<f32>,   // (queries, head_dim): a chunk's running weighted sum of V
    total: Vec<f32>, // (queries, 2 + head_dim): the merged chunks' (m, l, acc)
    queries: Vec<Query>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
    /// The caller's buffer of chunk states when a query's chunks run on different threads:
    /// (items, queries per item, 2 + head_dim).
    static PARTIALS: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// The caller's queries quantized to q8_0 for int8 KV: (t_count, n_head * head_dim / 32) blocks.
    static QUERY_BLOCKS: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// The queries of a call: `f` (t_count, n_head * head_dim) in f32, and with int8 KV `blocks`, the same
/// values as q8_0 blocks (34 bytes per 32 values: an f16 scale, then 32 signed bytes) for the scores.
#[derive(Clone, Copy)]
struct Queries<'a> {
    f: &'a [f32],
    blocks: &'a [u8],
}

/// Quantizes `q` to q8_0 blocks in `blocks` (the activations' quantizer, llama.cpp's for a quantized-KV
/// product). Every 32 values are one block, so a head's blocks are its own (`head_dim` is a multiple of 32
/// for int8 KV).
fn quantize_queries(q: &[f32], blocks: &mut Vec<u8>) {
    blocks.resize(q.len() / QK * Q8_BLOCK, 0);
    quant::quantize_row_act(GgmlType::Q8_0, q, blocks);
}

/// What a pass needs to find a head's rows in the layer's pages.
struct Layer<'a> {
    pages: &'a [KvPage],
    kv_dim: usize,
    head_dim: usize,
    row_bytes: usize,
    head_bytes: usize,
    scale: f32,
    /// Scores become `c * tanh(score * scale / c)` (gemma2), then enter the softmax unscaled.
    softcap: Option<f32>,
    /// A query at `pos` reads the keys `pos + 1 - window..=pos` (a sliding-window layer).
    window: Option<usize>,
    /// (n_head): each head's sink score (`AttnOpts::sinks`).
    sinks: Option<&'a [f32]>,
    /// K and V are q8_0 rows: the scores are integer dot products against the quantized queries.
    int8: bool,
}

impl Layer<'_> {
    /// The first key a query at `pos` reads.
    fn first_key(&self, pos: usize) -> usize {
        self.window.map_or(0, |w| (pos + 1).saturating_sub(w))
    }
}

/// How one layer's attention scores: the scale, an optional soft-cap, an optional sliding window, optional
/// sinks.
#[derive(Clone, Copy, Debug)]
pub struct AttnOpts<'a> {
    pub scale: f32,
    pub softcap: Option<f32>,
    pub window: Option<usize>,
    /// (n_head): a score per head that joins each query's softmax as one more key whose value is zero
    /// (gpt-oss's `attn_sinks`, compared with the scaled scores as llama.cpp's softmax does). A query's
    /// merged state starts from it (`m` = the sink, `l` = 1) instead of from the empty state.
    pub sinks: Option<&'a [f32]>,
}

/// Causal attention of the `t_count` queries in `q` at positions `pos0..pos0 + t_count` over layer `layer`
/// of `kv` (already holding those positions, and in a sliding-window layer at least each query's window).
/// `q`: (t_count, n_head * head_dim); `out`: same shape.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    pool: &ThreadPool,
    kv: &KvCache,
    layer: usize,
    shape: &AttnShape,
    opts: &AttnOpts,
    q: &[f32],
    pos0: usize,
    out: &mut [f32],
) {
    let rows = 0..q.len() / (shape.n_head * shape.head_dim);
    attention_many(pool, &[SeqRows { kv, rows, pos0 }], layer, shape, opts, q, out);
}

/// One sequence of an [`attention_many`] call: its cache, its rows of the queries and the output (token
/// indices), and the position of its first row.
pub struct SeqRows<'a> {
    pub kv: &'a KvCache,
    pub rows: Range<usize>,
    pub pos0: usize,
}

/// [`attention`] for several sequences at once, in one run on the threads: each sequence's rows of `q`
/// attend over layer `layer` of its own cache. `q`: (tokens, n_head * head_dim); `out`: same shape. Each
/// row's result is the one it gets alone.
pub fn attention_many(
    pool: &ThreadPool,
    seqs: &[SeqRows],
    layer: usize,
    shape: &AttnShape,
    opts: &AttnOpts,
    q: &[f32],
    out: &mut [f32],
) {
    let AttnShape { n_head_kv, head_dim, .. } = *shape;
    let parts: Vec<Part> = seqs
        .iter()
        .map(|seq| Part {
            ctx: Layer {
                pages: &seq.kv.layers[layer].pages,
                kv_dim: n_head_kv * head_dim,
                head_dim,
                row_bytes: seq.kv.ty.row_bytes(n_head_kv * head_dim),
                head_bytes: seq.kv.ty.row_bytes(head_dim),
                scale: opts.scale,
                softcap: opts.softcap,
                window: opts.window,
                sinks: opts.sinks,
                int8: seq.kv.ty == super::KvType::Int8,
            },
            rows: seq.rows.clone(),
            pos0: seq.pos0,
        })
        .collect();
    // Every sequence of a pass has the model's KV type.
    let int8 = parts.first().is_some_and(|p| p.ctx.int8);
    QUERY_BLOCKS.with_borrow_mut(|blocks| {
        if int8 {
            quantize_queries(q, blocks);
        }
        let q = Queries { f: q, blocks };
        attend_all(pool, &parts, shape, q, out);
    });
}
