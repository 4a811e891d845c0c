//! The KV cache of one sequence: per layer, the K and V rows of every position, as f16 or as int8 blocks of
//! 32 values with an f16 scale (the Q8_0 layout). Storage grows in pages as the sequence grows, so a short
//! conversation at a long `--max-context` holds only what it uses.

use half::f16;

use crate::quant::{self, GgmlType};

/// Tokens per page: storage grows by this many positions at a time.
pub const KV_PAGE_TOKENS: usize = 256;

/// The element format of the KV cache (`--kv`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum KvType {
    #[default]
    F16,
    Int8,
}

impl KvType {
    /// Bytes of one K (or V) row of `dim` values.
    pub fn row_bytes(self, dim: usize) -> usize {
        match self {
            KvType::F16 => dim * 2,
            KvType::Int8 => dim / 32 * GgmlType::Q8_0.block_bytes(),
        }
    }
}

impl std::str::FromStr for KvType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "f16" => Ok(KvType::F16),
            "int8" | "q8_0" => Ok(KvType::Int8),
            _ => Err(format!("unknown KV type {s:?} (expected f16 or int8)")),
        }
    }
}

/// One layer's K or V rows: `len` rows of `dim` values, in `ty`.
pub enum KvRows {
    F16(Vec<f16>), // (positions, kv_dim)
    Int8(Vec<u8>), // (positions, kv_dim / 32 blocks of 34 bytes)
}

pub struct LayerKv {
    pub k: KvRows,
    pub v: KvRows,
}

pub struct KvCache {
    pub ty: KvType,
    /// Values per row: `n_head_kv * head_dim`.
    pub kv_dim: usize,
    /// Most positions this cache may hold.
    pub max_tokens: usize,
    /// Positions filled.
    len: usize,
    /// Positions storage exists for (a multiple of KV_PAGE_TOKENS, at most max_tokens).
    capacity: usize,
    pub layers: Vec<LayerKv>,
}

impl KvCache {
    /// An empty cache for `n_layer` layers of `kv_dim`-wide rows, holding at most `max_tokens` positions.
    /// `kv_dim` must be a multiple of 32 for int8.
    pub fn new(ty: KvType, n_layer: usize, kv_dim: usize, max_tokens: usize) -> KvCache {
        let empty = || match ty {
            KvType::F16 => KvRows::F16(Vec::new()),
            KvType::Int8 => KvRows::Int8(Vec::new()),
        };
        KvCache {
            ty,
            kv_dim,
            max_tokens,
            len: 0,
            capacity: 0,
            layers: (0..n_layer).map(|_| LayerKv { k: empty(), v: empty() }).collect(),
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Forgets every position after the first `n` (the storage stays).
    pub fn truncate(&mut self, n: usize) {
        self.len = self.len.min(n);
    }

    /// Forgets everything and frees the storage.
    pub fn clear(&mut self) {
        *self = KvCache::new(self.ty, self.layers.len(), self.kv_dim, self.max_tokens);
    }

    /// Bytes of storage held now.
    pub fn allocated_bytes(&self) -> usize {
        self.capacity * self.ty.row_bytes(self.kv_dim) * 2 * self.layers.len()
    }

    /// Makes room for positions up to `n` (exclusive), growing by whole pages.
    pub fn reserve(&mut self, n: usize) {
        if n <= self.capacity {
            return;
        }
        let cap = n.div_ceil(KV_PAGE_TOKENS).saturating_mul(KV_PAGE_TOKENS).min(self.max_tokens).max(n);
        let row = self.ty.row_bytes(self.kv_dim);
        for l in &mut self.layers {
            for rows in [&mut l.k, &mut l.v] {
                match rows {
                    KvRows::F16(v) => v.resize(cap * self.kv_dim, f16::ZERO),
                    KvRows::Int8(v) => v.resize(cap * row, 0),
                }
            }
        }
        self.capacity = cap;
    }

    /// Marks positions up to `n` (exclusive) as filled; they must have been written.
    pub fn set_len(&mut self, n: usize) {
        debug_assert!(n <= self.capacity);
        self.len = n;
    }

    /// Writes the K and V rows of position `pos` in layer `layer`.
    pub fn write(&mut self, layer: usize, pos: usize, k: &[f32], v: &[f32]) {
        let dim = self.kv_dim;
        let row = self.ty.row_bytes(dim);
        let l = &mut self.layers[layer];
        for (rows, src) in [(&mut l.k, k), (&mut l.v, v)] {
            match rows {
                KvRows::F16(buf) => {
                    for (d, s) in buf[pos * dim..(pos + 1) * dim].iter_mut().zip(src) {
                        *d = f16::from_f32(*s);
                    }
                }
                KvRows::Int8(buf) => quant::quantize_q8_0_row(src, &mut buf[pos * row..(pos + 1) * row]),
            }
        }
    }
}
