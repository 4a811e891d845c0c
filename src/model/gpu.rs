//! A stage of the forward pass on a GPU (`cuda`, or `emu` for tests): its weights uploaded as stored, its
//! scratch, and the layer as a sequence of kernel launches (kernels/*.cu). The hidden state arrives from the
//! host (token embeddings are looked up there, from the mapped file) or from the previous stage, and leaves
//! for the next stage or, on the last stage, as the logits of the wanted rows.
//!
//! Every family of `family::FAMILIES` runs here: q/k head norms (RMSNorm over rows of `head_dim`), post-norms
//! (the projection into scratch, normed and added to the residual stream in one launch), SwiGLU or GeGLU,
//! each layer's RoPE (base, linear scale, attention factor) with the file's frequency factors for the
//! sequence's context, sliding windows and score soft-caps in the attention kernels, the embeddings' scale
//! and the final soft-cap. `supported` names what a stage refuses at load; nothing runs half-supported.
//!
//! A mixture of experts' block runs where the plan put it (`--experts`). On the device (`GpuFfn::Experts`):
//! the router's scores come down, the host picks each token's experts with the CPU's `moe::route` (the
//! same ties), the picks go up, and each expert with tokens runs its gate, up and down products over its
//! gathered rows with the dense kernels; its outputs are weighted and put by (token, rank), and each
//! token's sum is taken best expert first, as the CPU adds them. In host memory (`GpuFfn::HostExperts`):
//! the normed rows go down, the CPU runs the router and the experts as a CPU stage does, and the sum comes
//! up into the residual stream.
//!
//! Activations stay exact f32 (the CPU quantizes them to 8 bits per block, as llama.cpp does), so the GPU is
//! the more exact of the two: on the default model its logits are within 0.02 of a float64 forward pass,
//! the CPU's within 0.4 to 1.2 (tests/gpu_forward.rs). GPU and CPU logits therefore agree within the CPU's
//! quantization error, not bit for bit. One token takes the matrix-vector kernels; a batch takes the tiled
//! products. Every allocation goes through the device's ledger (`Device::alloc`), so a GPU stage's memory
//! is exactly what `strata plan` predicts ([`weight_bytes`], [`scratch_bytes`]).

use std::ops::Range;
use std::sync::{Arc, Mutex};

use crate::device::cuda::gpu::{launch, Arg, Dims, Gpu, GpuError};
use crate::device::cuda::kernels;
use crate::device::{Allocation, Device, DeviceError, Purpose};
use crate::quant::GgmlType;

use super::acts::QuantActs;
use super::config::{ModelConfig, RopeKind};
use super::family::{Family, FfnAct, SwaLayers};
use super::forward::Segment;
use super::kv::{KvCache, KvType};
use super::moe::{self, MoeScratch};
use super::weights::{Experts, FactorSet, Ffn, LayerWeights, QTensor, RopeFactors, Weights};
use crate::sync::LockUnpoisoned;
use crate::threadpool::ThreadPool;

/// A weight matrix in GPU memory, in its on-disk format: `offset` bytes into `mem` (a mixture's experts of
/// one kind share one allocation).
struct GpuMatrix {
    mem: Arc<Allocation>,
    offset: u64,
    rows: usize,
    cols: usize,
    row_bytes: usize,
    matvec: &'static str,
    matvec_many: &'static str,
    gemm: &'static str,
}

struct GpuLayer {
    attn_norm: Allocation,              // (n_embd) f32
    q_norm: Option<Allocation>,         // (head_dim): qwen3, gemma3
    k_norm: Option<Allocation>,         // (head_dim)
    attn_post_norm: Option<Allocation>, // (n_embd): gemma2, gemma3
    ffn_post_norm: Option<Allocation>,  // (n_embd)
    wq: GpuMatrix,
    wk: GpuMatrix,
    wv: GpuMatrix,
    bq: Option<Allocation>,
    bk: Option<Allocation>,
    bv: Option<Allocation>,
    wo: GpuMatrix,
    bo: Option<Allocation>,    // (n_embd): gpt-oss
    sinks: Option<Allocation>, // (n_head): gpt-oss
    ffn_norm: Allocation,
    ffn: GpuFfn,
}

/// A layer's feed-forward block on a GPU stage.
enum GpuFfn {
    Dense(Box<GpuDense>),
    /// A mixture of experts in this device's memory.
    Experts(Box<GpuExperts>),
    /// A mixture of experts kept in host memory (`--experts`): the normed rows go down, the CPU runs the
    /// router and the experts (`moe::forward`, the CPU backend's own bits), and their sum comes back up.
    HostExperts,
}

struct GpuDense {
    gate: GpuMatrix, // (n_ff, n_embd)
    up: GpuMatrix,   // (n_ff, n_embd)
    down: GpuMatrix, // (n_embd, n_ff)
}

/// A mixture of experts' block on a GPU stage: the router, and each expert's matrices, the experts of a
/// kind in one allocation (in expert order, each as stored).
struct GpuExperts {
    router: GpuMatrix,               // (n_expert, n_embd)
    router_bias: Option<Allocation>, // (n_expert)
    gate: Vec<GpuMatrix>,            // n_expert x (n_ff_exp, n_embd)
    up: Vec<GpuMatrix>,              // n_expert x (n_ff_exp, n_embd)
    down: Vec<GpuMatrix>,            // n_expert x (n_embd, n_ff_exp)
    /// The experts' biases (gpt-oss): gate and up (n_expert, n_ff_exp), down (n_expert, n_embd).
    biases: Option<[Allocation; 3]>,
}

/// What a GPU stage's layers need from the host: the pool and the weights its host-side experts run on.
#[derive(Clone, Copy)]
pub struct HostSide<'a> {
    pub pool: &'a ThreadPool,
    pub weights: &'a Weights,
}

/// The host's buffers for a pass's host-side experts, and for routing the device's.
#[derive(Default)]
struct HostScratch {
    act: QuantActs,
    moe: MoeScratch,
    out: Vec<f32>,         // (t, n_embd)
    picks: Vec<moe::Pick>, // (t, n_used)
}

/// Activations of one layer over a batch of up to `batch` tokens, f32.
struct Scratch {
    x: Allocation,   // (batch, n_embd): the residual stream
    xn: Allocation,  // (batch, n_embd)
    q: Allocation,   // (batch, q_dim)
    k: Allocation,   // (batch, kv_dim)
    v: Allocation,   // (batch, kv_dim)
    att: Allocation, // (batch, q_dim)
    /// The dense FFN's, or an expert's on this device (n_ff_exp wide); None when every block of the model
    /// is a mixture kept on the host.
    gate: Option<Allocation>, // (batch, ff)
    up: Option<Allocation>, // (batch, ff)
    idx: Allocation, // (batch) i32: rows wanted from the head
    /// A mixture's buffers when this stage holds experts.
    moe: Option<MoeBuffers>,
}

/// What a mixture of experts on the device works in besides `gate` and `up` (`moe.cu`).
struct MoeBuffers {
    logits: Allocation, // (batch, n_expert): the router's scores
    rows: Allocation,   // (batch, n_embd): one expert's tokens, gathered
    down: Allocation,   // (batch, n_embd): its down product
    outs: Allocation,   // (batch, n_used, n_embd): every pick's weighted output
    /// The picks, grouped by expert: the tokens (i32), their slots (i32, token * n_used + rank) and
    /// weights (f32), batch * n_used of each, in that order.
    picks: Allocation,
}

/// The output head of the last stage, with room for one row of logits.
struct Head {
    norm: Allocation, // (n_embd)
    output: GpuMatrix,
    /// The head is the token embedding table (a tied model): `rows_T` looks tokens up in it.
    tied: bool,
    rows: &'static str,
    hn: Allocation,     // (1, n_embd)
    logits: Allocation, // (1, n_vocab)
}

/// The file's RoPE frequency factors on the GPU, every set it holds (the sequence's context picks one).
struct GpuRopeFactors {
    host: RopeFactors,
    freqs: Option<Allocation>, // (rope_dims / 2)
    long: Option<Allocation>,  // (rope_dims / 2)
    short: Option<Allocation>, // (rope_dims / 2)
}

impl GpuRopeFactors {
    /// The device address of the factors for a sequence of up to `max_tokens` positions, 0 for none.
    fn for_context(&self, max_tokens: usize, orig_ctx: usize) -> u64 {
        let a = match self.host.choose(max_tokens, orig_ctx) {
            Some(FactorSet::Freqs) => &self.freqs,
            Some(FactorSet::Long) => &self.long,
            Some(FactorSet::Short) => &self.short,
            None => &None,
        };
        a.as_ref().map_or(0, ptr)
    }
}

pub struct GpuStage {
    device: Arc<Device>,
    gpu: Arc<dyn Gpu>,
    layers: Range<usize>,
    weights: Vec<GpuLayer>,
    rope_factors: GpuRopeFactors,
    /// The embeddings' scale when this stage looks them up itself (Gemma: `sqrt(n_embd)`).
    embed_scale: Option<f32>,
    head: Option<Head>,
    scratch: Scratch,
    /// The host's buffers for host-side experts, kept between passes.
    host_scratch: Mutex<HostScratch>,
    batch: usize,
}

/// Bytes a GPU stage holds for the weights of `layers` (and the head on the last stage), but for the
/// mixture-of-experts blocks `experts_on_host` keeps on the host (one flag per layer of `layers`). Token
/// embeddings are looked up on the host, so only a tied head puts the embedding matrix on a GPU.
pub fn weight_bytes(weights: &Weights, layers: Range<usize>, last: bool, experts_on_host: &[bool]) -> u64 {
    let mut bytes = 0u64;
    for (i, l) in weights.layers[layers.clone()].iter().enumerate() {
        bytes += l.matrices().iter().map(|m| m.data().len() as u64).sum::<u64>();
        bytes += l.vectors().map(|v| v.len() as u64 * 4).sum::<u64>();
        if experts_on_host.get(i).copied().unwrap_or(false) {
            bytes -= expert_bytes(l);
        }
    }
    if !layers.is_empty() {
        let f = &weights.rope_factors;
        for v in [&f.freqs, &f.long, &f.short].into_iter().flatten() {
            bytes += v.len() as u64 * 4;
        }
    }
    if last {
        bytes += weights.output.data().len() as u64 + weights.output_norm.len() as u64 * 4;
    }
    bytes
}

/// Bytes of a layer's mixture-of-experts block as a GPU stage would hold it (as stored); 0 for a dense FFN.
pub fn expert_bytes(l: &LayerWeights) -> u64 {
    match &l.ffn {
        Ffn::Dense { .. } => 0,
        Ffn::Moe(_) => {
            l.ffn.matrices().iter().map(|m| m.data().len() as u64).sum::<u64>()
                + l.expert_vectors().map(|v| v.len() as u64 * 4).sum::<u64>()
        }
    }
}

/// Why a GPU stage cannot run layer `l`'s mixture of experts (such a block runs from host memory only): a
/// weight type without kernels, or experts whose rows are not whole 32-value chunks. None for a dense
/// layer or a mixture the GPU runs.
pub fn experts_unsupported(cfg: &ModelConfig, l: &LayerWeights) -> Option<String> {
    let (Ffn::Moe(_), Some(m)) = (&l.ffn, cfg.moe) else { return None };
    if let Some(ty) = l.ffn.matrices().iter().map(|m| m.ty).find(|&ty| !kernels::has_weight_kernels(ty)) {
        return Some(format!("it has no kernels for their {} weights", ty.name()));
    }
    if !m.n_ff_exp.is_multiple_of(32) {
        return Some(format!("their rows of {} values are not whole 32-value chunks", m.n_ff_exp));
    }
    None
}

/// Scratch bytes of a GPU stage for batches of up to `batch` tokens (one row of logits on the last stage),
/// `experts` when it holds a mixture's experts.
pub fn scratch_bytes(cfg: &ModelConfig, batch: usize, last: bool, experts: bool) -> u64 {
    let (d, q, kv, ff) = (cfg.n_embd, cfg.q_dim(), cfg.kv_dim(), ffn_width(cfg, experts));
    let mut f32s = batch * (2 * d + 2 * q + 2 * kv + 2 * ff) + batch; // + idx
    if let (Some(m), true) = (cfg.moe, experts) {
        // MoeBuffers.
        f32s += batch * (m.n_expert + 2 * d + m.n_used * d + 3 * m.n_used);
    }
    if last {
        f32s += d + cfg.n_vocab;
    }
    f32s as u64 * 4
}

/// Rows of the gate/up buffers: the dense FFN's, an expert's when the stage holds experts, else 0 (a
/// mixture whose experts run on the host).
fn ffn_width(cfg: &ModelConfig, experts: bool) -> usize {
    match cfg.moe {
        None => cfg.n_ff,
        Some(m) if experts => m.n_ff_exp,
        Some(_) => 0,
    }
}

/// Host bytes a GPU stage's host-side mixture of experts works in for a batch of up to `batch` tokens (the
/// rows going down and coming back, the router's scores, each expert's gathered rows and gate/up/down
/// outputs, every token's weighted outputs, the quantized activations): what `HostScratch` grows to.
pub fn host_scratch_bytes(cfg: &ModelConfig, batch: usize) -> u64 {
    let Some(m) = cfg.moe else { return 0 };
    let d = cfg.n_embd;
    let f32s = batch * (3 * d + m.n_expert + 2 * m.n_ff_exp + d + m.n_used * d);
    // Quantized activations: at most one byte per value plus a block scale per 32, and the outlier lists.
    let act_bytes = batch * (d.max(m.n_ff_exp) * 2 + 64);
    (f32s * 4 + act_bytes) as u64
}

fn gpu_err(device: &Device, e: GpuError) -> DeviceError {
    DeviceError::Gpu { device: device.name(), msg: e.to_string(), sticky: e.is_sticky() }
}

/// Whether a GPU stage runs `cfg`'s family: `Err(why)` names the feature it cannot run. Every field of
/// `Family` is named here, so a feature added to the table does not compile until this says whether the
/// GPU runs it (a GPU stage never computes a family half-supported).
pub fn supported(cfg: &ModelConfig) -> Result<(), String> {
    let Family {
        arch: _,
        name,
        rope_kind: _,               // rope_f32: both pairings
        qk_norm: _,                 // rms_norm_f32 over rows of head_dim
        post_norms: _,              // rms_norm_add_f32
        ffn_act,                    // below
        embed_scale: _,             // scale_f32 after a GPU lookup; the host scales its own rows
        fused_qkv: _,               // split into row views at load: separate matrices here
        fused_gate_up: _,           // the same
        swa,                        // below
        experts: _,                 // cfg.moe below
        gating: _,                  // the host's moe::route, on the device's scores or the CPU's
        attn_sinks: _,              // the attention kernels' sinks
        ffn_norm: _,                // a tensor name: the loader reads it
        attn_softcap: _,            // the attention kernels' softcap
        final_softcap: _,           // softcap_f32 in the head
        swa_rope_base: _,           // each layer's RopeParams
        scale_by_embd_at_layers: _, // cfg.attn_scale
        features: _,
    } = cfg.family;
    match ffn_act {
        FfnAct::Silu | FfnAct::GeluTanh | FfnAct::SwigluOai => {}
    }
    match swa {
        SwaLayers::None | SwaLayers::Pattern(_) => {}
    }
    if cfg.head_dim > 256 || !cfg.head_dim.is_multiple_of(2) {
        return Err(format!(
            "{name}: the CUDA backend needs heads of at most 256 values (this model's: {})",
            cfg.head_dim
        ));
    }
    if !cfg.n_embd.is_multiple_of(32) || !cfg.n_ff.is_multiple_of(32) || !cfg.q_dim().is_multiple_of(32) {
        return Err(format!("{name}: the CUDA backend needs matrix widths that are multiples of 32"));
    }
    Ok(())
}

fn kernel(prefix: &str, ty: GgmlType) -> Result<&'static str, DeviceError> {
    let name = format!("{prefix}_{}", ty.name());
    kernels::entry(&name).map(|e| e.name).ok_or_else(|| DeviceError::Unavailable {
        device: "cuda".into(),
        why: format!("no GPU kernel for {} weights", ty.name()),
    })
}

impl GpuStage {
    /// Uploads the weights of `layers` (and the head when `last`) to `device` and takes its scratch.
    pub fn load(
        device: &Arc<Device>,
        cfg: &ModelConfig,
        weights: &Weights,
        layers: Range<usize>,
        last: bool,
        batch: usize,
        experts_on_host: &[bool],
    ) -> Result<GpuStage, DeviceError> {
        let gpu = device
            .gpu()
            .cloned()
            .ok_or_else(|| DeviceError::Unavailable { device: device.name(), why: "not a GPU".into() })?;
        // What the kernels assume: heads of at most 256 values (attention keeps up to 8 per lane) and rows of
        // whole 32-value chunks; and a family whose every feature has its kernels.
        supported(cfg).map_err(|why| DeviceError::Unavailable { device: device.name(), why })?;
        let upload = |purpose: Purpose, bytes: &[u8]| -> Result<Allocation, DeviceError> {
            let a = device.alloc(purpose, bytes.len() as u64)?;
            a.mem().expect("GPU allocations have memory").write_at(0, bytes).map_err(|e| gpu_err(device, e))?;
            device.count_copy_in(bytes.len() as u64);
            Ok(a)
        };
        let vector = |v: &[f32]| upload(Purpose::Weights, bytemuck::cast_slice(v));
        let optional = |v: &Option<Vec<f32>>| v.as_deref().map(vector).transpose();
        let view = |mem: &Arc<Allocation>, offset: u64, m: &QTensor| -> Result<GpuMatrix, DeviceError> {
            Ok(GpuMatrix {
                mem: mem.clone(),
                offset,
                rows: m.rows,
                cols: m.cols,
                row_bytes: m.row_bytes,
                matvec: kernel("matvec", m.ty)?,
                matvec_many: kernel("matvec_many", m.ty)?,
                gemm: kernel("gemm", m.ty)?,
            })
        };
        let matrix = |m: &QTensor| view(&Arc::new(upload(Purpose::Weights, m.data())?), 0, m);
        // The matrices of one kind of a mixture's experts, one after another in one allocation.
        let experts = |ms: &[QTensor]| -> Result<Vec<GpuMatrix>, DeviceError> {
            let total: u64 = ms.iter().map(|m| m.data().len() as u64).sum();
            let mem = Arc::new(device.alloc(Purpose::Weights, total)?);
            let gpu_mem = mem.mem().expect("GPU allocations have memory");
            let mut offset = 0u64;
            let mut views = Vec::with_capacity(ms.len());
            for m in ms {
                views.push(view(&mem, offset, m)?);
                gpu_mem.write_at(offset, m.data()).map_err(|e| gpu_err(device, e))?;
                device.count_copy_in(m.data().len() as u64);
                offset += m.data().len() as u64;
            }
            Ok(views)
        };
        let mut gpu_layers = Vec::with_capacity(layers.len());
        for (i, l) in weights.layers[layers.clone()].iter().enumerate() {
            let ffn = match (&l.ffn, experts_on_host.get(i).copied().unwrap_or(false)) {
                (Ffn::Dense { gate, up, down }, _) => {
                    GpuFfn::Dense(Box::new(GpuDense { gate: matrix(gate)?, up: matrix(up)?, down: matrix(down)? }))
                }
                (Ffn::Moe(_), true) => GpuFfn::HostExperts,
                (Ffn::Moe(e), false) => {
                    // The plan keeps such blocks on the host; a caller that skipped it is refused here.
                    if let Some(why) = experts_unsupported(cfg, l) {
                        let why = format!("layer {}: its experts cannot run here: {why}", layers.start + i);
                        return Err(DeviceError::Unavailable { device: device.name(), why });
                    }
                    GpuFfn::Experts(Box::new(GpuExperts {
                        router: matrix(&e.router)?,
                        router_bias: e.biases.as_ref().map(|b| vector(&b.router)).transpose()?,
                        gate: experts(&e.gate)?,
                        up: experts(&e.up)?,
                        down: experts(&e.down)?,
                        biases: match &e.biases {
                            Some(b) => Some([vector(&b.gate)?, vector(&b.up)?, vector(&b.down)?]),
                            None => None,
                        },
                    }))
                }
            };
            gpu_layers.push(GpuLayer {
                attn_norm: vector(&l.attn_norm)?,
                q_norm: optional(&l.q_norm)?,
                k_norm: optional(&l.k_norm)?,
                attn_post_norm: optional(&l.attn_post_norm)?,
                ffn_post_norm: optional(&l.ffn_post_norm)?,
                wq: matrix(&l.wq)?,
                wk: matrix(&l.wk)?,
                wv: matrix(&l.wv)?,
                bq: l.bq.as_deref().map(vector).transpose()?,
                bk: l.bk.as_deref().map(vector).transpose()?,
                bv: l.bv.as_deref().map(vector).transpose()?,
                wo: matrix(&l.wo)?,
                bo: optional(&l.bo)?,
                sinks: optional(&l.sinks)?,
                ffn_norm: vector(&l.ffn_norm)?,
                ffn,
            });
        }
        let f = &weights.rope_factors;
        let has_layers = !layers.is_empty();
        let rope_factors = GpuRopeFactors {
            host: f.clone(),
            freqs: if has_layers { optional(&f.freqs)? } else { None },
            long: if has_layers { optional(&f.long)? } else { None },
            short: if has_layers { optional(&f.short)? } else { None },
        };
        let f32s = |n: usize| device.alloc(Purpose::Scratch, (n * 4) as u64);
        let holds_experts = gpu_layers.iter().any(|l| matches!(l.ffn, GpuFfn::Experts(_)));
        let (d, q, kv, ff) = (cfg.n_embd, cfg.q_dim(), cfg.kv_dim(), ffn_width(cfg, holds_experts));
        let dense = |n: usize| if ff > 0 { f32s(n).map(Some) } else { Ok(None) };
        let moe = match (cfg.moe, holds_experts) {
            (Some(m), true) => Some(MoeBuffers {
                logits: f32s(batch * m.n_expert)?,
                rows: f32s(batch * d)?,
                down: f32s(batch * d)?,
                outs: f32s(batch * m.n_used * d)?,
                picks: f32s(3 * batch * m.n_used)?,
            }),
            _ => None,
        };
        let scratch = Scratch {
            x: f32s(batch * d)?,
            xn: f32s(batch * d)?,
            q: f32s(batch * q)?,
            k: f32s(batch * kv)?,
            v: f32s(batch * kv)?,
            att: f32s(batch * q)?,
            gate: dense(batch * ff)?,
            up: dense(batch * ff)?,
            idx: f32s(batch)?,
            moe,
        };
        let head = if last {
            Some(Head {
                norm: vector(&weights.output_norm)?,
                output: matrix(&weights.output)?,
                tied: weights.tied_output,
                rows: kernel("rows", weights.output.ty)?,
                hn: f32s(d)?,
                logits: f32s(cfg.n_vocab)?,
            })
        } else {
            None
        };
        let embed_scale = cfg.family.embed_scale.then(|| (cfg.n_embd as f32).sqrt());
        Ok(GpuStage {
            device: device.clone(),
            gpu,
            layers,
            weights: gpu_layers,
            rope_factors,
            embed_scale,
            head,
            scratch,
            host_scratch: Mutex::new(HostScratch::default()),
            batch,
        })
    }

    fn err(&self, e: GpuError) -> DeviceError {
        gpu_err(&self.device, e)
    }

    fn run(&self, kernel: &'static str, dims: Dims, args: &[Arg]) -> Result<(), DeviceError> {
        // SAFETY: every caller passes addresses of this stage's own memory (its scratch, sized for `batch`
        // tokens, its weights, the KV pages of its layers), held by `self` or the cache while the stream's
        // work runs, with the sizes and dimensions the kernel's contract in kernels/ expects.
        unsafe { launch(&*self.gpu, kernel, dims, args) }.map_err(|e| self.err(e))
    }

    /// `y (t, m.rows) = x (t, m.cols) . W^T`, or added to `y` (a projection into the residual stream): one
    /// token by `matvec`, more by `gemm`.
    fn product(&self, m: &GpuMatrix, x: u64, y: u64, t: usize, accumulate: bool) -> Result<(), DeviceError> {
        let mut args = matrix_args(m, x, y);
        if t == 1 {
            args.push(Arg::I32(i32::from(accumulate)));
            // Eight rows (warps) per block.
            self.run(m.matvec, Dims::linear(m.rows.div_ceil(8) as u32, 256), &args)
        } else {
            args.push(Arg::I32(t as i32));
            args.push(Arg::I32(i32::from(accumulate)));
            let dims = Dims { grid: [m.rows.div_ceil(32) as u32, t.div_ceil(32) as u32, 1], block: [256, 1, 1] };
            self.run(m.gemm, dims, &args)
        }
    }

    /// [`GpuStage::product`] over the rows of several sequences, `parts` (start row, rows) in order, each
    /// part's rows taken as a product of that sequence alone takes them: a decoded token (one row) by
    /// `matvec` (consecutive ones in one `matvec_many` launch, the same bits per token), a prompt chunk by
    /// `gemm` over its own rows. So every row gets the bits it gets alone.
    fn products(
        &self,
        m: &GpuMatrix,
        x: u64,
        y: u64,
        parts: &[(usize, usize)],
        accumulate: bool,
    ) -> Result<(), DeviceError> {
        if let [(0, t)] = parts {
            return self.product(m, x, y, *t, accumulate);
        }
        let (x_row, y_row) = ((m.cols * 4) as u64, (m.rows * 4) as u64);
        let mut i = 0;
        while i < parts.len() {
            let (start, t) = parts[i];
            let (xs, ys) = (x + start as u64 * x_row, y + start as u64 * y_row);
            if t == 1 {
                // Consecutive one-row parts are consecutive rows.
                let run = parts[i..].iter().take_while(|p| p.1 == 1).count();
                if run == 1 {
                    self.product(m, xs, ys, 1, accumulate)?;
                } else {
                    let mut args = matrix_args(m, xs, ys);
                    args.extend([Arg::I32(run as i32), Arg::I32(i32::from(accumulate))]);
                    // Eight rows (warps) per block, eight tokens per warp (MATVEC_MANY).
                    let dims =
                        Dims { grid: [m.rows.div_ceil(8) as u32, run.div_ceil(8) as u32, 1], block: [256, 1, 1] };
                    self.run(m.matvec_many, dims, &args)?;
                }
                i += run;
            } else {
                if t > 0 {
                    self.product(m, xs, ys, t, accumulate)?;
                }
                i += 1;
            }
        }
        Ok(())
    }

    /// `out = rms_norm(x) * w` over `rows` rows of `n` values (`x` may be `out`).
    fn rms_norm(&self, x: u64, w: &Allocation, out: u64, rows: usize, n: usize, eps: f32) -> Result<(), DeviceError> {
        let args = [Arg::Ptr(x), Arg::Ptr(ptr(w)), Arg::Ptr(out), Arg::I32(n as i32), Arg::F32(eps)];
        self.run("rms_norm_f32", Dims::linear(rows as u32, 256), &args)
    }

    /// `out += rms_norm(x) * w` over `rows` rows of `n` values (a post-norm into the residual stream).
    fn rms_norm_add(
        &self,
        x: u64,
        w: &Allocation,
        out: u64,
        rows: usize,
        n: usize,
        eps: f32,
    ) -> Result<(), DeviceError> {
        let args = [Arg::Ptr(x), Arg::Ptr(ptr(w)), Arg::Ptr(out), Arg::I32(n as i32), Arg::F32(eps)];
        self.run("rms_norm_add_f32", Dims::linear(rows as u32, 256), &args)
    }

    /// `x = c * tanh(x / c)` over `n` values.
    fn softcap(&self, x: u64, c: f32, n: usize) -> Result<(), DeviceError> {
        self.run("softcap_f32", Dims::over(n, 256), &[Arg::Ptr(x), Arg::F32(c), Arg::I32(n as i32)])
    }

    fn add_bias(&self, x: u64, b: &Option<Allocation>, n: usize, rows: usize) -> Result<(), DeviceError> {
        self.add_bias_at(x, opt_ptr(b), n, rows)
    }

    /// [`GpuStage::add_bias`] with the bias at a device address (0: none).
    fn add_bias_at(&self, x: u64, b: u64, n: usize, rows: usize) -> Result<(), DeviceError> {
        if b == 0 || rows == 0 {
            return Ok(());
        }
        let args = [Arg::Ptr(x), Arg::Ptr(b), Arg::I32(n as i32), Arg::I32((n * rows) as i32)];
        self.run("add_bias_f32", Dims::over(n * rows, 256), &args)
    }

    /// RoPE of layer `l` on the queries `q` and keys `k` of `t` tokens, in one launch; `factors` the device
    /// address of the frequency factors (0: none).
    #[allow(clippy::too_many_arguments)]
    fn rope(
        &self,
        cfg: &ModelConfig,
        l: usize,
        factors: u64,
        q: u64,
        k: u64,
        t: usize,
        pos0: usize,
    ) -> Result<(), DeviceError> {
        let rope = cfg.rope_of(l);
        // The CPU's rope_table computes the same.
        let theta_scale = rope.base.powf(-2.0 / cfg.rope_dims as f32);
        let heads = cfg.n_head + cfg.n_head_kv;
        let args = [
            Arg::Ptr(q),
            Arg::Ptr(k),
            Arg::Ptr(factors),
            Arg::I32(t as i32),
            Arg::I32(cfg.n_head as i32),
            Arg::I32(cfg.n_head_kv as i32),
            Arg::I32(cfg.head_dim as i32),
            Arg::I32(cfg.rope_dims as i32),
            Arg::I32(pos0 as i32),
            Arg::F32(theta_scale),
            Arg::F32(rope.freq_scale),
            Arg::F32(rope.mscale),
            Arg::I32(i32::from(cfg.rope_kind == RopeKind::Neox)),
            Arg::I32(i32::from(rope.yarn.is_some())),
            Arg::F32(rope.yarn.map_or(0.0, |y| y.low)),
            Arg::F32(rope.yarn.map_or(0.0, |y| y.high)),
        ];
        self.run("rope_f32", Dims::over(t * heads * cfg.rope_dims / 2, 128), &args)
    }

    /// True when this stage holds the token embedding table (the tied head of a single-stage model).
    pub fn holds_embeddings(&self) -> bool {
        self.layers.start == 0 && self.head.as_ref().is_some_and(|h| h.tied)
    }

    /// The embedding rows of `tokens` into the stage's hidden state, looked up on the GPU (`rows_T`) and
    /// scaled where the family scales them (the host scales only the rows it looks up itself).
    pub fn embed(&self, tokens: &[u32], n_embd: usize) -> Result<(), DeviceError> {
        let head = self.head.as_ref().expect("holds_embeddings checked");
        let ids: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
        let idx = self.scratch.idx.mem().expect("GPU memory");
        idx.write_at(0, bytemuck::cast_slice(&ids)).map_err(|e| self.err(e))?;
        let m = &head.output;
        let args = [
            Arg::Ptr(ptr(&m.mem)),
            Arg::Ptr(idx.ptr()),
            Arg::Ptr(ptr(&self.scratch.x)),
            Arg::I32(n_embd as i32),
            Arg::I64(m.row_bytes as i64),
        ];
        self.run(head.rows, Dims::linear(tokens.len() as u32, 64), &args)?;
        match self.embed_scale {
            Some(scale) => {
                let n = tokens.len() * n_embd;
                let args = [Arg::Ptr(ptr(&self.scratch.x)), Arg::F32(scale), Arg::I32(n as i32)];
                self.run("scale_f32", Dims::over(n, 256), &args)
            }
            None => Ok(()),
        }
    }

    /// Copies the hidden state `x` (t, n_embd) from the host into the stage.
    pub fn upload_x(&self, x: &[f32]) -> Result<(), DeviceError> {
        self.scratch.x.mem().expect("GPU memory").write_at(0, bytemuck::cast_slice(x)).map_err(|e| self.err(e))?;
        self.device.count_copy_in((x.len() * 4) as u64);
        Ok(())
    }

    /// Copies the hidden state of `t` tokens from the previous stage's GPU (device to device; between two
    /// cards the driver stages it through host memory, since peer access is not enabled yet). Waits for
    /// the previous stage first.
    pub fn receive_x(&self, prev: &GpuStage, t: usize, n_embd: usize) -> Result<(), DeviceError> {
        prev.gpu.synchronize().map_err(|e| prev.err(e))?;
        let bytes = (t * n_embd * 4) as u64;
        // SAFETY: both hidden-state buffers hold `batch * n_embd` f32s and `t <= batch` (the caller's chunk).
        unsafe { self.gpu.dtod(ptr(&self.scratch.x), ptr(&prev.scratch.x), bytes) }.map_err(|e| self.err(e))?;
        self.device.count_copy_in(bytes);
        Ok(())
    }

    /// The hidden state of `t` tokens, back on the host.
    pub fn download_x(&self, t: usize, n_embd: usize) -> Result<Vec<f32>, DeviceError> {
        self.scratch.x.mem().expect("GPU memory").read_f32(t * n_embd).map_err(|e| self.err(e))
    }

    /// The stage's layers over the `t` tokens in `x` at positions `pos0..`, writing their K and V into `kv`.
    pub fn run_layers(
        &self,
        cfg: &ModelConfig,
        host: HostSide<'_>,
        kv: &mut KvCache,
        t: usize,
        pos0: usize,
    ) -> Result<(), DeviceError> {
        self.run_layers_many(cfg, host, &mut [Segment { kv, start: 0, t_count: t, pos0 }])
    }

    /// This stage's layers over rows of several sequences at once (`Model::forward_many`): every step but
    /// attention runs over all the rows; RoPE, the KV store and attention run per sequence, on its rows
    /// (`start..start + t_count` of the scratch) and its own cache. Each row's results are the bits it gets
    /// alone: the kernels treat a row alone, whatever rows stand beside it.
    pub(super) fn run_layers_many(
        &self,
        cfg: &ModelConfig,
        host: HostSide<'_>,
        segs: &mut [Segment],
    ) -> Result<(), DeviceError> {
        let t: usize = segs.iter().map(|s| s.t_count).sum();
        debug_assert!(t <= self.batch);
        let Some(kv_ty) = segs.first().map(|s| s.kv.ty) else {
            return Ok(());
        };
        let s = &self.scratch;
        let (d, q_dim, kv_dim, ff) = (cfg.n_embd, cfg.q_dim(), cfg.kv_dim(), cfg.n_ff);
        let (x, xn, q, k, v, att, gate, up) =
            (ptr(&s.x), ptr(&s.xn), ptr(&s.q), ptr(&s.k), ptr(&s.v), ptr(&s.att), opt_ptr(&s.gate), opt_ptr(&s.up));
        let int8 = match kv_ty {
            KvType::F16 => false,
            KvType::Int8 => true,
            KvType::F32 => unreachable!("f32 KV is refused on GPU stages (Model::new_kv)"),
        };
        // q8_0 blocks must not straddle heads (Model::new_kv refuses int8 KV for such heads first).
        if int8 && !cfg.head_dim.is_multiple_of(32) {
            let why = format!("int8 KV needs heads of a multiple of 32 values (this model's: {})", cfg.head_dim);
            return Err(DeviceError::Unavailable { device: self.device.name(), why });
        }
        let factors: Vec<u64> =
            segs.iter().map(|s| self.rope_factors.for_context(s.kv.max_tokens, cfg.rope_orig_ctx)).collect();
        let glu = glu_kernel(cfg.family.ffn_act);
        let hd = cfg.head_dim;
        let (store, attend) =
            if int8 { ("kv_store_q8_0", "attention_q8_0") } else { ("kv_store_f16", "attention_f16") };
        let store_values = if int8 { kv_dim / 32 } else { kv_dim };
        // Byte offsets of a row in q / att (q_dim f32s) and in k / v (kv_dim f32s).
        let (q_row, kv_row) = ((q_dim * 4) as u64, (kv_dim * 4) as u64);
        let parts: Vec<(usize, usize)> = segs.iter().map(|s| (s.start, s.t_count)).collect();
        let mut host_scratch = self.host_scratch.lock_unpoisoned();
        for (l, w) in self.layers.clone().zip(&self.weights) {
            // Attention block.
            self.rms_norm(x, &w.attn_norm, xn, t, d, cfg.rms_eps)?;
            self.products(&w.wq, xn, q, &parts, false)?;
            self.products(&w.wk, xn, k, &parts, false)?;
            self.products(&w.wv, xn, v, &parts, false)?;
            self.add_bias(q, &w.bq, q_dim, t)?;
            self.add_bias(k, &w.bk, kv_dim, t)?;
            self.add_bias(v, &w.bv, kv_dim, t)?;
            if let Some(n) = &w.q_norm {
                self.rms_norm(q, n, q, t * cfg.n_head, hd, cfg.rms_eps)?;
            }
            if let Some(n) = &w.k_norm {
                self.rms_norm(k, n, k, t * cfg.n_head_kv, hd, cfg.rms_eps)?;
            }
            for (seg, &factors) in segs.iter_mut().zip(&factors) {
                let (start, ts, pos0) = (seg.start as u64, seg.t_count, seg.pos0);
                let (q, k, v, att) = (q + start * q_row, k + start * kv_row, v + start * kv_row, att + start * q_row);
                self.rope(cfg, l, factors, q, k, ts, pos0)?;
                let (k_table, v_table) = seg.kv.gpu_tables(l)?;
                let args = [
                    Arg::Ptr(k),
                    Arg::Ptr(v),
                    Arg::Ptr(k_table),
                    Arg::Ptr(v_table),
                    Arg::I32(ts as i32),
                    Arg::I32(pos0 as i32),
                    Arg::I32(kv_dim as i32),
                ];
                self.run(store, Dims::over(2 * ts * store_values, 128), &args)?;
                let args = [
                    Arg::Ptr(q),
                    Arg::Ptr(att),
                    Arg::Ptr(k_table),
                    Arg::Ptr(v_table),
                    Arg::I32(pos0 as i32),
                    Arg::I32(cfg.n_head as i32),
                    Arg::I32(cfg.n_head_kv as i32),
                    Arg::I32(hd as i32),
                    Arg::F32(cfg.attn_scale),
                    Arg::I32(cfg.window(l).unwrap_or(0) as i32),
                    Arg::F32(cfg.attn_softcap.unwrap_or(0.0)),
                    Arg::Ptr(w.sinks.as_ref().map_or(0, ptr)),
                ];
                self.run(attend, Dims::linear((ts * cfg.n_head) as u32, 128), &args)?;
            }
            self.project_into_residual(&w.wo, &w.bo, &w.attn_post_norm, att, cfg, &parts)?;

            // Feed-forward block (SwiGLU or GeGLU).
            self.rms_norm(x, &w.ffn_norm, xn, t, d, cfg.rms_eps)?;
            match &w.ffn {
                GpuFfn::Dense(m) => {
                    self.products(&m.gate, xn, gate, &parts, false)?;
                    self.products(&m.up, xn, up, &parts, false)?;
                    let args = [Arg::Ptr(gate), Arg::Ptr(up), Arg::I32((t * ff) as i32)];
                    self.run(glu, Dims::over(t * ff, 256), &args)?;
                    self.project_into_residual(&m.down, &None, &w.ffn_post_norm, gate, cfg, &parts)?;
                }
                GpuFfn::HostExperts => {
                    let Ffn::Moe(e) = &host.weights.layers[l].ffn else {
                        unreachable!("HostExperts is made for a mixture of experts' layer")
                    };
                    self.host_experts(cfg, host.pool, e, &w.ffn_post_norm, t, &mut host_scratch)?;
                }
                GpuFfn::Experts(e) => {
                    self.device_experts(cfg, e, &w.ffn_post_norm, &parts, &mut host_scratch.picks)?;
                }
            }
        }
        Ok(())
    }

    /// A mixture of experts' block on the device over the normed rows in `xn` (the rows of `parts`, one
    /// part per sequence): the router's scores come down and the host picks (`moe::route`); the picks go
    /// up grouped by expert, each expert's in token order; each expert with tokens gathers their rows and
    /// runs its gate, up, GLU and down over them, a sequence's rows as that sequence alone would (a lone
    /// row by `matvec`), and its outputs go weighted to their (token, rank) slots; each token's sum, best
    /// expert first, comes into `xn`, then into the residual stream (post-normed first where the family
    /// has an FFN post-norm).
    fn device_experts(
        &self,
        cfg: &ModelConfig,
        e: &GpuExperts,
        post_norm: &Option<Allocation>,
        parts: &[(usize, usize)],
        picks: &mut Vec<moe::Pick>,
    ) -> Result<(), DeviceError> {
        let m = cfg.moe.as_ref().expect("a mixture of experts has its config");
        let b = self.scratch.moe.as_ref().expect("a stage holding experts has their buffers");
        let (d, k, ff) = (cfg.n_embd, m.n_used, m.n_ff_exp);
        let t: usize = parts.iter().map(|p| p.1).sum();
        let xn = ptr(&self.scratch.xn);
        let (gate, up) = (opt_ptr(&self.scratch.gate), opt_ptr(&self.scratch.up));
        let (logits, rows, down, outs) = (ptr(&b.logits), ptr(&b.rows), ptr(&b.down), ptr(&b.outs));

        self.products(&e.router, xn, logits, parts, false)?;
        self.add_bias(logits, &e.router_bias, m.n_expert, t)?;
        let scores = b.logits.mem().expect("GPU memory").read_f32(t * m.n_expert).map_err(|e| self.err(e))?;
        moe::route(&scores, m, picks);

        // The picks grouped by expert (a stable sort: each expert's in token order).
        let n = t * k;
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by_key(|&i| picks[i].expert);
        let mut up_bytes: Vec<u32> = Vec::with_capacity(3 * n);
        up_bytes.extend(order.iter().map(|&i| (i / k) as u32));
        up_bytes.extend(order.iter().map(|&i| i as u32));
        up_bytes.extend(order.iter().map(|&i| picks[i].weight.to_bits()));
        let picks_mem = b.picks.mem().expect("GPU memory");
        picks_mem.write_at(0, bytemuck::cast_slice(&up_bytes)).map_err(|e| self.err(e))?;
        self.device.count_copy_in((up_bytes.len() * 4) as u64);
        let (token_at, slot_at, weight_at) =
            (picks_mem.ptr(), picks_mem.ptr() + n as u64 * 4, picks_mem.ptr() + 2 * n as u64 * 4);

        let glu = glu_kernel(cfg.family.ffn_act);
        let mut first = 0;
        for group in order.chunk_by(|&a, &b| picks[a].expert == picks[b].expert) {
            let (ex, count) = (picks[group[0]].expert, group.len());
            // This expert's rows per sequence part, in the gathered buffer's order.
            let mut expert_parts = Vec::with_capacity(parts.len());
            let mut at = 0;
            for &(start, len) in parts {
                let c = group.iter().filter(|&&i| (start..start + len).contains(&(i / k))).count();
                expert_parts.push((at, c));
                at += c;
            }
            let off = first as u64 * 4;
            let args = [Arg::Ptr(xn), Arg::Ptr(token_at + off), Arg::Ptr(rows), Arg::I32(d as i32)];
            self.run("gather_rows_f32", Dims::linear(count as u32, 256), &args)?;
            let bias = |which: usize, width: usize| {
                e.biases.as_ref().map_or(0, |bs| ptr(&bs[which]) + (ex * width * 4) as u64)
            };
            self.products(&e.gate[ex], rows, gate, &expert_parts, false)?;
            self.add_bias_at(gate, bias(0, ff), ff, count)?;
            self.products(&e.up[ex], rows, up, &expert_parts, false)?;
            self.add_bias_at(up, bias(1, ff), ff, count)?;
            self.run(glu, Dims::over(count * ff, 256), &[Arg::Ptr(gate), Arg::Ptr(up), Arg::I32((count * ff) as i32)])?;
            self.products(&e.down[ex], gate, down, &expert_parts, false)?;
            self.add_bias_at(down, bias(2, d), d, count)?;
            let args = [
                Arg::Ptr(down),
                Arg::Ptr(outs),
                Arg::Ptr(slot_at + off),
                Arg::Ptr(weight_at + off),
                Arg::I32(d as i32),
            ];
            self.run("moe_scatter_f32", Dims::linear(count as u32, 256), &args)?;
            first += count;
        }
        let args = [Arg::Ptr(outs), Arg::Ptr(xn), Arg::I32(k as i32), Arg::I32(d as i32), Arg::I32((t * d) as i32)];
        self.run("moe_sum_f32", Dims::over(t * d, 256), &args)?;
        self.add_block_output(post_norm, cfg, t)
    }

    /// A mixture of experts' block on the host: the normed rows in `xn` (t, n_embd) go down, the CPU runs
    /// the router and the experts as the CPU backend does, and their sum comes up into `xn`, then into the
    /// residual stream (post-normed first where the family has an FFN post-norm).
    fn host_experts(
        &self,
        cfg: &ModelConfig,
        pool: &ThreadPool,
        e: &Experts,
        post_norm: &Option<Allocation>,
        t: usize,
        hs: &mut HostScratch,
    ) -> Result<(), DeviceError> {
        let d = cfg.n_embd;
        let xn_mem = self.scratch.xn.mem().expect("GPU memory");
        let rows = xn_mem.read_f32(t * d).map_err(|e| self.err(e))?;
        hs.out.resize(t * d, 0.0);
        moe::forward(pool, e, cfg.family.ffn_act, &rows, d, &mut hs.act, &mut hs.moe, &mut hs.out);
        xn_mem.write_f32(&hs.out).map_err(|e| self.err(e))?;
        self.device.count_copy_in((t * d * 4) as u64);
        self.add_block_output(post_norm, cfg, t)
    }

    /// `x += post_norm(xn)` over `t` rows, or `x += xn` without a post-norm: a block's output, in `xn`,
    /// into the residual stream.
    fn add_block_output(&self, post_norm: &Option<Allocation>, cfg: &ModelConfig, t: usize) -> Result<(), DeviceError> {
        let (x, xn, d) = (ptr(&self.scratch.x), ptr(&self.scratch.xn), cfg.n_embd);
        match post_norm {
            Some(n) => self.rms_norm_add(xn, n, x, t, d, cfg.rms_eps),
            // x += xn: a "bias" as long as the whole batch.
            None => self.run(
                "add_bias_f32",
                Dims::over(t * d, 256),
                &[Arg::Ptr(x), Arg::Ptr(xn), Arg::I32((t * d) as i32), Arg::I32((t * d) as i32)],
            ),
        }
    }

    /// `x += post_norm(input . W^T + bias)`, or without a post-norm and a bias the product added straight
    /// into `x`. The product passes through `xn`, free by then (the block's products have read it).
    fn project_into_residual(
        &self,
        m: &GpuMatrix,
        bias: &Option<Allocation>,
        post_norm: &Option<Allocation>,
        input: u64,
        cfg: &ModelConfig,
        parts: &[(usize, usize)],
    ) -> Result<(), DeviceError> {
        let t: usize = parts.iter().map(|p| p.1).sum();
        if bias.is_none() && post_norm.is_none() {
            return self.products(m, input, ptr(&self.scratch.x), parts, true);
        }
        let (xn, d) = (ptr(&self.scratch.xn), cfg.n_embd);
        self.products(m, input, xn, parts, false)?;
        self.add_bias(xn, bias, d, t)?;
        self.add_block_output(post_norm, cfg, t)
    }

    /// Logits of the batch rows `want` (the last stage only): (want.len(), n_vocab), on the host. `parts`
    /// groups the wanted rows by sequence ((first, count) in `want`; one part for one sequence), each group's
    /// product taken as that sequence's alone ([`GpuStage::products`]).
    pub fn head(&self, cfg: &ModelConfig, want: &[usize], parts: &[(usize, usize)]) -> Result<Vec<f32>, DeviceError> {
        let head = self.head.as_ref().expect("the head is on the last stage");
        let (d, n_vocab, n_out) = (cfg.n_embd, cfg.n_vocab, want.len());
        if n_out == 0 {
            return Ok(Vec::new());
        }
        // One row fits the standing buffers; more take buffers for this call.
        let extra = if n_out > 1 {
            Some((
                self.device.alloc(Purpose::Scratch, (n_out * d * 4) as u64)?,
                self.device.alloc(Purpose::Scratch, (n_out * n_vocab * 4) as u64)?,
            ))
        } else {
            None
        };
        let (hn, logits) = match &extra {
            Some((h, l)) => (ptr(h), ptr(l)),
            None => (ptr(&head.hn), ptr(&head.logits)),
        };
        let idx: Vec<i32> = want.iter().map(|&t| t as i32).collect();
        let idx_mem = self.scratch.idx.mem().expect("GPU memory");
        for (i, chunk) in idx.chunks(self.batch).enumerate() {
            idx_mem.write_at(0, bytemuck::cast_slice(chunk)).map_err(|e| self.err(e))?;
            let args = [
                Arg::Ptr(ptr(&self.scratch.x)),
                Arg::Ptr(idx_mem.ptr()),
                Arg::Ptr(hn + (i * self.batch * d * 4) as u64),
                Arg::I32(d as i32),
            ];
            self.run("gather_rows_f32", Dims::linear(chunk.len() as u32, 256), &args)?;
        }
        self.rms_norm(hn, &head.norm, hn, n_out, d, cfg.rms_eps)?;
        self.products(&head.output, hn, logits, parts, false)?;
        if let Some(c) = cfg.final_softcap {
            self.softcap(logits, c, n_out * n_vocab)?;
        }
        let mut out = vec![0f32; n_out * n_vocab];
        // SAFETY: `logits` is the head's buffer of `batch * n_vocab` f32s and `n_out <= batch`.
        unsafe { self.gpu.dtoh(bytemuck::cast_slice_mut(&mut out), logits) }.map_err(|e| self.err(e))?;
        Ok(out)
    }
}

/// The arguments every product kernel starts with: the weights, `x`, `y` and the matrix's shape.
fn matrix_args(m: &GpuMatrix, x: u64, y: u64) -> Vec<Arg> {
    vec![
        Arg::Ptr(ptr(&m.mem) + m.offset),
        Arg::Ptr(x),
        Arg::Ptr(y),
        Arg::I32(m.rows as i32),
        Arg::I32(m.cols as i32),
        Arg::I64(m.row_bytes as i64),
    ]
}

/// The GLU kernel of a family's FFN activation.
fn glu_kernel(act: FfnAct) -> &'static str {
    match act {
        FfnAct::Silu => "swiglu_f32",
        FfnAct::GeluTanh => "geglu_f32",
        FfnAct::SwigluOai => "swiglu_oai_f32",
    }
}

/// The device address of an optional buffer (0: none).
fn opt_ptr(a: &Option<Allocation>) -> u64 {
    a.as_ref().map_or(0, ptr)
}

fn ptr(a: &Allocation) -> u64 {
    a.mem().expect("GPU allocations have memory").ptr()
}
