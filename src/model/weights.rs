//! The weights of a model: quantized matrices borrowed from the mapped GGUF file, small
//! vectors (norms, biases) dequantized to f32 at load, and, for the matrices the CPU multiplies in a
//! format that has one, a row-interleaved copy made at load (`quant::packed`) that the products read
//! instead of the file's bytes.

use std::sync::{Arc, Mutex};

use crate::gguf::{GgufFile, TensorInfo};
use crate::quant::packed::PackedMatrix;
use crate::quant::{self, GgmlType};
use crate::sync::LockUnpoisoned;

use super::config::{ModelConfig, MoeConfig};
use super::ModelError;

/// A matrix in its on-disk block format: `rows` rows of `cols` values, each row `row_bytes` bytes.
pub struct QTensor {
    file: Arc<GgufFile>,
    info: TensorInfo,
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub row_bytes: usize,
    /// Dequantized columns (one value per row) at the channels where activations carry outliers; see
    /// `acts`. A handful per matrix: the channels of a model's massive activations are few and fixed.
    columns: Mutex<Vec<(usize, Arc<[f32]>)>>,
    /// The row-interleaved copy the CPU's products use, when `pack` made one.
    packed: Option<PackedMatrix>,
}

/// The layout a matrix's products read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// The file's rows, read from the memory map.
    File,
    /// Rows interleaved in groups of 16 (`quant::packed`), in memory of its own.
    Interleaved16,
}

impl Layout {
    pub fn name(self) -> &'static str {
        match self {
            Layout::File => "file rows (mapped)",
            Layout::Interleaved16 => "16-row interleaved",
        }
    }
}

/// Columns kept per matrix; past this, further columns are computed on each use.
const MAX_CACHED_COLUMNS: usize = 16;

impl QTensor {
    /// Column `c` dequantized (`W[r][c]` for every row `r`): from the cache, else built and cached while the
    /// cache has room (the first channels seen are the model's fixed massive ones); `None` past that (the
    /// product reads the values it needs from the weights).
    pub fn column(&self, c: usize) -> Option<Arc<[f32]>> {
        let mut cache = self.columns.lock_unpoisoned();
        if let Some((_, col)) = cache.iter().find(|(i, _)| *i == c) {
            return Some(col.clone());
        }
        if cache.len() >= MAX_CACHED_COLUMNS {
            return None;
        }
        let col: Arc<[f32]> = (0..self.rows).map(|r| self.value(r, c)).collect();
        cache.push((c, col.clone()));
        Some(col)
    }

    /// Device bytes this matrix takes: its blocks and the budget of its cached columns.
    pub fn device_bytes(&self) -> u64 {
        self.info.n_bytes + (MAX_CACHED_COLUMNS * self.rows * 4) as u64
    }

    /// Value `(r, c)` dequantized, from the packed copy where there is one (so the file's pages of a
    /// packed matrix stay out of memory).
    pub fn value(&self, r: usize, c: usize) -> f32 {
        match &self.packed {
            Some(p) => p.value(r, c),
            None => quant::dequantize_value(self.ty, self.row(r), c),
        }
    }

    /// Values `(r, c)` for rows `r0..r0 + out.len()`, which lie in one group of `PACK_ROWS` rows.
    pub fn values_at(&self, r0: usize, c: usize, out: &mut [f32]) {
        match &self.packed {
            Some(p) => p.values_in_group(r0, c, out),
            None => {
                for (i, o) in out.iter_mut().enumerate() {
                    *o = quant::dequantize_value(self.ty, self.row(r0 + i), c);
                }
            }
        }
    }

    /// The row-interleaved copy, when the matrix has one.
    pub fn packed(&self) -> Option<&PackedMatrix> {
        self.packed.as_ref()
    }

    /// The layout the products read.
    pub fn layout(&self) -> Layout {
        if self.packed.is_some() {
            Layout::Interleaved16
        } else {
            Layout::File
        }
    }

    /// Makes the row-interleaved copy where the format has one (and drops the file's pages of the matrix
    /// from memory); returns the bytes the copy holds, 0 when the format keeps the file's layout.
    pub fn pack(&mut self) -> usize {
        if self.packed.is_none() && quant::packed::packable(self.ty) {
            // The sizes were checked at load; a matrix that cannot be packed keeps the file's layout.
            self.packed = PackedMatrix::pack(self.ty, self.rows, self.cols, self.data()).ok();
            if self.packed.is_some() {
                self.file.advise_dontneed(&self.info);
            }
        }
        self.packed.as_ref().map_or(0, |p| p.bytes())
    }

    /// All rows' bytes, row-major.
    pub fn data(&self) -> &[u8] {
        self.file.tensor_data(&self.info)
    }

    /// The bytes of row `r`.
    pub fn row(&self, r: usize) -> &[u8] {
        &self.data()[r * self.row_bytes..(r + 1) * self.row_bytes]
    }

    /// Row `r` as f32 values (`out.len() == cols`).
    pub fn dequantize_row_into(&self, r: usize, out: &mut [f32]) {
        quant::dequantize_row(self.ty, self.row(r), out);
    }
}

pub struct LayerWeights {
    pub attn_norm: Vec<f32>, // (n_embd)
    /// Per-head RMS norms of q and k before RoPE (qwen3, gemma3).
    pub q_norm: Option<Vec<f32>>, // (head_dim)
    pub k_norm: Option<Vec<f32>>, // (head_dim)
    /// RMS norms of the attention's and the FFN's outputs before the residual add (gemma2, gemma3).
    pub attn_post_norm: Option<Vec<f32>>, // (n_embd)
    pub ffn_post_norm: Option<Vec<f32>>, // (n_embd)
    pub wq: QTensor,         // (q_dim rows, n_embd cols)
    pub wk: QTensor,         // (kv_dim, n_embd)
    pub wv: QTensor,         // (kv_dim, n_embd)
    pub bq: Option<Vec<f32>>, // (q_dim), qwen2 only
    pub bk: Option<Vec<f32>>, // (kv_dim)
    pub bv: Option<Vec<f32>>, // (kv_dim)
    pub wo: QTensor,         // (n_embd, q_dim)
    pub bo: Option<Vec<f32>>, // (n_embd), gpt-oss
    /// Each head's attention sink score (gpt-oss's `attn_sinks`).
    pub sinks: Option<Vec<f32>>, // (n_head)
    /// The norm before the FFN (`Family::ffn_norm` names its tensor).
    pub ffn_norm: Vec<f32>, // (n_embd)
    pub ffn: Ffn,
}

/// A layer's feed-forward block: one gated FFN, or a mixture of experts.
#[allow(clippy::large_enum_variant)] // one per layer: the bytes do not matter, the direct fields read well
pub enum Ffn {
    Dense {
        gate: QTensor, // (n_ff, n_embd)
        up: QTensor,   // (n_ff, n_embd)
        down: QTensor, // (n_embd, n_ff)
    },
    Moe(Experts),
}

/// A mixture of experts' matrices (`config::MoeConfig` says how it routes). Each expert's matrix is a view
/// of its slab of the file's 3-d tensor (`ffn_gate_exps` etc., experts outermost), not a copy.
pub struct Experts {
    pub cfg: MoeConfig,
    pub router: QTensor,    // (n_expert, n_embd): `ffn_gate_inp`
    pub gate: Vec<QTensor>, // n_expert x (n_ff_exp, n_embd)
    pub up: Vec<QTensor>,   // n_expert x (n_ff_exp, n_embd)
    pub down: Vec<QTensor>, // n_expert x (n_embd, n_ff_exp)
    /// Biases of the router and of each expert's products (gpt-oss), when the file has them.
    pub biases: Option<ExpertBiases>,
}

/// A mixture's biases: the router's and, per expert, its gate's, up's and down's (`*.bias` tensors).
pub struct ExpertBiases {
    pub router: Vec<f32>, // (n_expert)
    pub gate: Vec<f32>,   // (n_expert, n_ff_exp)
    pub up: Vec<f32>,     // (n_expert, n_ff_exp)
    pub down: Vec<f32>,   // (n_expert, n_embd)
}

impl Experts {
    /// Expert `e`'s (gate, up, down) biases, when the mixture has them.
    pub fn biases_of(&self, e: usize) -> [Option<&[f32]>; 3] {
        let (ff, d) = (self.cfg.n_ff_exp, self.down[0].rows);
        match &self.biases {
            None => [None; 3],
            Some(b) => [
                Some(&b.gate[e * ff..(e + 1) * ff]),
                Some(&b.up[e * ff..(e + 1) * ff]),
                Some(&b.down[e * d..(e + 1) * d]),
            ],
        }
    }
}

impl Ffn {
    /// The block's matrices (a mixture's router, then every expert's gate, up and down).
    pub fn matrices(&self) -> Vec<&QTensor> {
        match self {
            Ffn::Dense { gate, up, down } => vec![gate, up, down],
            Ffn::Moe(e) => {
                std::iter::once(&e.router).chain(e.gate.iter()).chain(e.up.iter()).chain(e.down.iter()).collect()
            }
        }
    }

    fn matrices_mut(&mut self) -> Vec<&mut QTensor> {
        match self {
            Ffn::Dense { gate, up, down } => vec![gate, up, down],
            Ffn::Moe(e) => std::iter::once(&mut e.router)
                .chain(e.gate.iter_mut())
                .chain(e.up.iter_mut())
                .chain(e.down.iter_mut())
                .collect(),
        }
    }

    /// The dense FFN's (gate, up, down), None for a mixture of experts.
    pub fn dense(&self) -> Option<(&QTensor, &QTensor, &QTensor)> {
        match self {
            Ffn::Dense { gate, up, down } => Some((gate, up, down)),
            Ffn::Moe(_) => None,
        }
    }
}

impl LayerWeights {
    /// The layer's matrices: attention's four, then the FFN's.
    pub fn matrices_mut(&mut self) -> Vec<&mut QTensor> {
        let mut v = vec![&mut self.wq, &mut self.wk, &mut self.wv, &mut self.wo];
        v.extend(self.ffn.matrices_mut());
        v
    }

    /// The layer's matrices: attention's four, then the FFN's.
    pub fn matrices(&self) -> Vec<&QTensor> {
        let mut v = vec![&self.wq, &self.wk, &self.wv, &self.wo];
        v.extend(self.ffn.matrices());
        v
    }

    /// The layer's f32 vectors (norms and biases) that it has.
    pub fn vectors(&self) -> impl Iterator<Item = &Vec<f32>> {
        [
            Some(&self.attn_norm),
            Some(&self.ffn_norm),
            self.bq.as_ref(),
            self.bk.as_ref(),
            self.bv.as_ref(),
            self.q_norm.as_ref(),
            self.k_norm.as_ref(),
            self.attn_post_norm.as_ref(),
            self.ffn_post_norm.as_ref(),
            self.bo.as_ref(),
            self.sinks.as_ref(),
        ]
        .into_iter()
        .flatten()
        .chain(self.expert_vectors())
    }

    /// A mixture's biases (empty without them).
    pub fn expert_vectors(&self) -> impl Iterator<Item = &Vec<f32>> {
        let b = match &self.ffn {
            Ffn::Moe(Experts { biases: Some(b), .. }) => Some(b),
            _ => None,
        };
        b.into_iter().flat_map(|b| [&b.router, &b.gate, &b.up, &b.down])
    }

    /// Device bytes of the layer: its matrices (with their column caches) and its f32 vectors.
    pub fn device_bytes(&self) -> u64 {
        self.matrices().iter().map(|m| m.device_bytes()).sum::<u64>()
            + self.vectors().map(|v| v.len() as u64 * 4).sum::<u64>()
    }

    /// The part of [`LayerWeights::device_bytes`] that is a mixture of experts' block (its router and
    /// every expert's matrices and biases: what `--experts` places); 0 for a dense FFN.
    pub fn expert_bytes(&self) -> u64 {
        match &self.ffn {
            Ffn::Dense { .. } => 0,
            Ffn::Moe(_) => {
                self.ffn.matrices().iter().map(|m| m.device_bytes()).sum::<u64>()
                    + self.expert_vectors().map(|v| v.len() as u64 * 4).sum::<u64>()
            }
        }
    }
}

pub struct Weights {
    pub token_embd: QTensor, // (n_vocab, n_embd)
    pub layers: Vec<LayerWeights>,
    pub output_norm: Vec<f32>, // (n_embd)
    /// The output head; the embedding matrix itself when the model ties them.
    pub output: QTensor, // (n_vocab, n_embd)
    pub tied_output: bool,
    pub rope_factors: RopeFactors,
}

/// Per-dimension divisors of RoPE's frequencies, from the file: llama 3's `rope_freqs` (its long-context
/// scaling), or phi3's LongRoPE pair, the long one for contexts beyond the original training length.
#[derive(Clone, Debug, Default)]
pub struct RopeFactors {
    pub freqs: Option<Vec<f32>>, // (rope_dims / 2)
    pub long: Option<Vec<f32>>,  // (rope_dims / 2)
    pub short: Option<Vec<f32>>, // (rope_dims / 2)
}

/// One of the factor sets a file may hold (`RopeFactors::choose`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FactorSet {
    Freqs,
    Long,
    Short,
}

impl RopeFactors {
    /// The divisors for a sequence of up to `max_tokens` positions: LongRoPE's long factors past the
    /// original context `orig_ctx` (llama.cpp decides on its context size the same way), else the short
    /// ones; llama 3's factors always.
    pub fn for_context(&self, max_tokens: usize, orig_ctx: usize) -> Option<&[f32]> {
        self.choose(max_tokens, orig_ctx).and_then(|set| self.get(set))
    }

    /// Which set `for_context` takes (a GPU stage holds every set and picks its copy of this one).
    pub fn choose(&self, max_tokens: usize, orig_ctx: usize) -> Option<FactorSet> {
        if self.freqs.is_some() {
            return Some(FactorSet::Freqs);
        }
        match (&self.long, &self.short) {
            (Some(_), _) if max_tokens > orig_ctx => Some(FactorSet::Long),
            (_, Some(_)) => Some(FactorSet::Short),
            _ => None,
        }
    }

    /// The set `set`, when the file holds it.
    pub fn get(&self, set: FactorSet) -> Option<&[f32]> {
        match set {
            FactorSet::Freqs => self.freqs.as_deref(),
            FactorSet::Long => self.long.as_deref(),
            FactorSet::Short => self.short.as_deref(),
        }
    }
}

/// What `Weights::pack_for_cpu` did: per weight type, the matrices packed and the bytes they hold.
#[derive(Debug, Default, Clone)]
pub struct PackReport {
    /// (type, layout, matrices, bytes in the file, bytes in memory), in type order.
    pub by_type: Vec<(GgmlType, Layout, usize, u64, u64)>,
}

impl PackReport {
    fn add(&mut self, m: &QTensor, mem_bytes: u64) {
        let layout = m.layout();
        match self.by_type.iter_mut().find(|e| e.0 == m.ty && e.1 == layout) {
            Some(e) => {
                e.2 += 1;
                e.3 += m.info.n_bytes;
                e.4 += mem_bytes;
            }
            None => self.by_type.push((m.ty, layout, 1, m.info.n_bytes, mem_bytes)),
        }
        self.by_type.sort_by_key(|e| (e.0.id(), e.1 == Layout::File));
    }

    /// One line per (type, layout): `q4_0: 210 matrices 16-row interleaved, 76.3 MiB in RAM (file 72.1 MiB)`.
    pub fn lines(&self) -> Vec<String> {
        const MIB: f64 = (1u64 << 20) as f64;
        self.by_type
            .iter()
            .map(|&(ty, layout, n, file, mem)| match layout {
                Layout::File => format!("{ty}: {n} matrices as {}, {:.1} MiB", layout.name(), file as f64 / MIB),
                _ => format!(
                    "{ty}: {n} matrices {}, {:.1} MiB in RAM (the file's {:.1} MiB released)",
                    layout.name(),
                    mem as f64 / MIB,
                    file as f64 / MIB
                ),
            })
            .collect()
    }
}

impl Weights {
    /// Repacks the matrices the CPU multiplies, those of `layers` and the output head when `output`, where
    /// their format has a packed layout (`quant::packed`); the rest keep reading the file.
    pub fn pack_for_cpu(&mut self, layers: std::ops::Range<usize>, output: bool) -> PackReport {
        let mut report = PackReport::default();
        for l in &mut self.layers[layers] {
            for m in l.matrices_mut() {
                let bytes = m.pack() as u64;
                report.add(m, bytes);
            }
        }
        if output {
            let bytes = self.output.pack() as u64;
            report.add(&self.output, bytes);
        }
        report
    }
    /// Repacks the mixture-of-experts matrices (router and experts) of `layers`, which the CPU multiplies
    /// for a GPU stage that keeps them in host memory (`--experts`), as [`Weights::pack_for_cpu`] does.
    pub fn pack_experts_for_cpu(&mut self, layers: impl IntoIterator<Item = usize>) -> PackReport {
        let mut report = PackReport::default();
        for l in layers {
            if let Ffn::Moe(_) = self.layers[l].ffn {
                for m in self.layers[l].ffn.matrices_mut() {
                    let bytes = m.pack() as u64;
                    report.add(m, bytes);
                }
            }
        }
        report
    }

    pub fn load(file: &Arc<GgufFile>, cfg: &ModelConfig) -> Result<Weights, ModelError> {
        // Rows `first..first + rows` of the matrix `name` of `total` rows: a fused matrix (phi3's qkv and
        // gate/up) is read as its parts, each a view of the file's rows (no copy).
        let part = |name: &str, first: usize, rows: usize, total: usize, cols: usize| -> Result<QTensor, ModelError> {
            let mut m = matrix_of(file, name, total, cols)?;
            let row_bytes = m.row_bytes as u64;
            m.info.file_offset += first as u64 * row_bytes;
            m.info.n_bytes = rows as u64 * row_bytes;
            m.info.dims[1] = rows as u64;
            m.rows = rows;
            Ok(m)
        };
        let matrix = |name: &str, rows: usize, cols: usize| matrix_of(file, name, rows, cols);
        let vector = |name: &str, len: usize| -> Result<Vec<f32>, ModelError> {
            let info = file.tensor(name).ok_or_else(|| ModelError::MissingTensor(name.to_owned()))?;
            if info.n_elements() != len as u64 || info.dims[0] != len as u64 {
                return Err(ModelError::TensorShape {
                    name: name.to_owned(),
                    expected: vec![len as u64],
                    found: info.dims.clone(),
                });
            }
            if !GgmlType::WEIGHT_TYPES.contains(&info.ty) {
                return Err(ModelError::TensorType { name: name.to_owned(), ty: info.ty });
            }
            let mut out = vec![0f32; len];
            quant::dequantize_row(info.ty, file.tensor_data(info), &mut out);
            Ok(out)
        };
        let optional_vector = |name: &str, len: usize| -> Result<Option<Vec<f32>>, ModelError> {
            match file.tensor(name) {
                Some(_) => vector(name, len).map(Some),
                None => Ok(None),
            }
        };
        let fam = cfg.family;
        let required = |name: &str, len: usize, wanted: bool| -> Result<Option<Vec<f32>>, ModelError> {
            if wanted {
                vector(name, len).map(Some)
            } else {
                Ok(None)
            }
        };

        let (d, q, kv, ff, hd) = (cfg.n_embd, cfg.q_dim(), cfg.kv_dim(), cfg.n_ff, cfg.head_dim);
        let token_embd = matrix("token_embd.weight", cfg.n_vocab, d)?;
        let mut layers = Vec::with_capacity(cfg.n_layer);
        for l in 0..cfg.n_layer {
            let n = |s: &str| format!("blk.{l}.{s}");
            let (wq, wk, wv) = if fam.fused_qkv {
                let qkv = n("attn_qkv.weight");
                let total = q + 2 * kv;
                (part(&qkv, 0, q, total, d)?, part(&qkv, q, kv, total, d)?, part(&qkv, q + kv, kv, total, d)?)
            } else {
                (
                    matrix(&n("attn_q.weight"), q, d)?,
                    matrix(&n("attn_k.weight"), kv, d)?,
                    matrix(&n("attn_v.weight"), kv, d)?,
                )
            };
            let ffn = match &cfg.moe {
                Some(m) => Ffn::Moe(experts_of(file, l, d, m)?),
                None => {
                    let (gate, up) = if fam.fused_gate_up {
                        let up = n("ffn_up.weight");
                        (part(&up, 0, ff, 2 * ff, d)?, part(&up, ff, ff, 2 * ff, d)?)
                    } else {
                        (matrix(&n("ffn_gate.weight"), ff, d)?, matrix(&n("ffn_up.weight"), ff, d)?)
                    };
                    Ffn::Dense { gate, up, down: matrix(&n("ffn_down.weight"), d, ff)? }
                }
            };
            layers.push(LayerWeights {
                attn_norm: vector(&n("attn_norm.weight"), d)?,
                q_norm: required(&n("attn_q_norm.weight"), hd, fam.qk_norm)?,
                k_norm: required(&n("attn_k_norm.weight"), hd, fam.qk_norm)?,
                attn_post_norm: required(&n("post_attention_norm.weight"), d, fam.post_norms)?,
                ffn_post_norm: required(&n("post_ffw_norm.weight"), d, fam.post_norms)?,
                wq,
                wk,
                wv,
                bq: optional_vector(&n("attn_q.bias"), q)?,
                bk: optional_vector(&n("attn_k.bias"), kv)?,
                bv: optional_vector(&n("attn_v.bias"), kv)?,
                wo: matrix(&n("attn_output.weight"), d, q)?,
                bo: optional_vector(&n("attn_output.bias"), d)?,
                sinks: required(&n("attn_sinks.weight"), cfg.n_head, fam.attn_sinks)?,
                ffn_norm: vector(&n(&format!("{}.weight", fam.ffn_norm)), d)?,
                ffn,
            });
        }
        let output_norm = vector("output_norm.weight", d)?;
        let (output, tied_output) = match file.tensor("output.weight") {
            Some(_) => (matrix("output.weight", cfg.n_vocab, d)?, false),
            None => (matrix("token_embd.weight", cfg.n_vocab, d)?, true),
        };
        let half = cfg.rope_dims / 2;
        let rope_factors = RopeFactors {
            freqs: optional_vector("rope_freqs.weight", half)?,
            long: optional_vector("rope_factors_long.weight", half)?,
            short: optional_vector("rope_factors_short.weight", half)?,
        };
        Ok(Weights { token_embd, layers, output_norm, output, tied_output, rope_factors })
    }
}

/// Layer `l`'s mixture of experts: the router and each expert's gate, up and down as views of the 3-d
/// tensors (`[cols, rows, n_expert]`, experts outermost), shapes and types checked. A fused
/// `ffn_gate_up_exps` (each expert's gate rows, then its up rows) is read as its two halves.
fn experts_of(file: &Arc<GgufFile>, l: usize, d: usize, m: &MoeConfig) -> Result<Experts, ModelError> {
    let (n_expert, ff) = (m.n_expert, m.n_ff_exp);
    let name = |s: &str| format!("blk.{l}.{s}");
    let router = matrix_of(file, &name("ffn_gate_inp.weight"), n_expert, d)?;
    // Expert `e`'s `rows` rows starting at row `first` of its slab of `slab_rows`.
    let slabs =
        |tensor: &str, slab_rows: usize, cols: usize, first: usize, rows: usize| -> Result<Vec<QTensor>, ModelError> {
            let info = file.tensor(tensor).ok_or_else(|| ModelError::MissingTensor(tensor.to_owned()))?;
            let want = [cols as u64, slab_rows as u64, n_expert as u64];
            if info.dims != want {
                return Err(ModelError::TensorShape {
                    name: tensor.to_owned(),
                    expected: want.to_vec(),
                    found: info.dims.clone(),
                });
            }
            if !GgmlType::WEIGHT_TYPES.contains(&info.ty) {
                return Err(ModelError::TensorType { name: tensor.to_owned(), ty: info.ty });
            }
            let slab_bytes = info.n_bytes / n_expert as u64;
            let row_bytes = slab_bytes / slab_rows as u64;
            (0..n_expert)
                .map(|e| {
                    let mut part = info.clone();
                    part.file_offset += e as u64 * slab_bytes + first as u64 * row_bytes;
                    part.n_bytes = rows as u64 * row_bytes;
                    part.dims = vec![cols as u64, rows as u64];
                    Ok(QTensor {
                        file: file.clone(),
                        ty: info.ty,
                        info: part,
                        rows,
                        cols,
                        row_bytes: row_bytes as usize,
                        columns: Mutex::new(Vec::new()),
                        packed: None,
                    })
                })
                .collect()
        };
    let fused = name("ffn_gate_up_exps.weight");
    let (gate, up) = if file.tensor(&fused).is_some() {
        (slabs(&fused, 2 * ff, d, 0, ff)?, slabs(&fused, 2 * ff, d, ff, ff)?)
    } else {
        (slabs(&name("ffn_gate_exps.weight"), ff, d, 0, ff)?, slabs(&name("ffn_up_exps.weight"), ff, d, 0, ff)?)
    };
    let down = slabs(&name("ffn_down_exps.weight"), d, ff, 0, d)?;
    // The biases come as a set (gpt-oss writes all four) or not at all.
    let biases = match file.tensor(&name("ffn_gate_inp.bias")) {
        None => None,
        Some(_) => Some(ExpertBiases {
            router: bias_of(file, &name("ffn_gate_inp.bias"), &[n_expert])?,
            gate: bias_of(file, &name("ffn_gate_exps.bias"), &[ff, n_expert])?,
            up: bias_of(file, &name("ffn_up_exps.bias"), &[ff, n_expert])?,
            down: bias_of(file, &name("ffn_down_exps.bias"), &[d, n_expert])?,
        }),
    };
    Ok(Experts { cfg: *m, router, gate, up, down, biases })
}

/// A mixture's bias `name` of shape `dims` (ggml's order: [len, n_expert] per expert, read as (n_expert,
/// len) f32 values; the router's [n_expert]).
fn bias_of(file: &GgufFile, name: &str, dims: &[usize]) -> Result<Vec<f32>, ModelError> {
    let info = file.tensor(name).ok_or_else(|| ModelError::MissingTensor(name.to_owned()))?;
    let want: Vec<u64> = dims.iter().map(|&n| n as u64).collect();
    if info.dims != want {
        return Err(ModelError::TensorShape {
            name: name.to_owned(),
            expected: want.to_vec(),
            found: info.dims.clone(),
        });
    }
    // Experts outermost: the values read as one row.
    let mut out = vec![0f32; dims.iter().product()];
    if !GgmlType::WEIGHT_TYPES.contains(&info.ty) {
        return Err(ModelError::TensorType { name: name.to_owned(), ty: info.ty });
    }
    quant::dequantize_row(info.ty, file.tensor_data(info), &mut out);
    Ok(out)
}

/// The matrix `name` of `rows` rows of `cols` values, its shape and type checked, read from the mapped file.
fn matrix_of(file: &Arc<GgufFile>, name: &str, rows: usize, cols: usize) -> Result<QTensor, ModelError> {
    let info = file.tensor(name).ok_or_else(|| ModelError::MissingTensor(name.to_owned()))?;
    if rows == 0 || cols == 0 || info.dims.len() != 2 || info.dims[0] != cols as u64 || info.dims[1] != rows as u64 {
        return Err(ModelError::TensorShape {
            name: name.to_owned(),
            expected: vec![cols as u64, rows as u64],
            found: info.dims.clone(),
        });
    }
    if !GgmlType::WEIGHT_TYPES.contains(&info.ty) {
        return Err(ModelError::TensorType { name: name.to_owned(), ty: info.ty });
    }
    Ok(QTensor {
        file: file.clone(),
        info: info.clone(),
        ty: info.ty,
        rows,
        cols,
        row_bytes: (info.n_bytes / rows as u64) as usize,
        columns: Mutex::new(Vec::new()),
        packed: None,
    })
}
