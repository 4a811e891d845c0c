//! A transformer model of one of the families in `family` (llama, mistral, qwen2, qwen3, gemma2, gemma3,
//! phi3): its configuration, its weights, and the forward pass.
//!
//! The model owns the mapped file and never changes after load; all per-sequence state lives in a
//! [`KvCache`], so one model serves many sequences. Its [`Placement`] says which device runs which layers
//! and holds the ledger entries of its weights, scratch and staging: dropping the model gives them back.

pub mod acts;
pub mod attn;
pub mod config;
mod embed;
pub mod family;
mod forward;
pub mod gpu;
pub mod kv;
pub mod moe;
pub mod ops;
pub mod placement;
pub mod profile;
mod staging;
pub mod synthetic;
pub mod weights;

use std::path::Path;
use std::sync::Arc;

use crate::device::{DeviceError, DeviceSet, Purpose};
use crate::gguf::{GgufError, GgufFile};
use crate::quant::GgmlType;
use crate::split::SplitError;

pub use config::{Arch, ModelConfig, Pooling, RopeKind, RopeParams, Yarn};
pub use family::{Family, FfnAct};
pub use forward::{Logits, SeqInput};
pub use kv::{KvCache, KvType};
pub use placement::{ExpertsPlacement, Placement, PlanOptions, StagePlan};
pub use weights::Weights;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("unsupported model architecture {0:?} (supported: {supported})", supported = family::supported_names())]
    UnsupportedArch(String),
    #[error("model metadata lacks {0}")]
    MissingKey(String),
    #[error("model metadata {key} is {found}, expected {expected}")]
    WrongType { key: String, found: String, expected: &'static str },
    #[error("model metadata {key} has an invalid value {value}")]
    BadValue { key: String, value: String },
    #[error("model hyper-parameters are inconsistent: {0}")]
    Inconsistent(String),
    #[error("model lacks tensor {0}")]
    MissingTensor(String),
    #[error("tensor {name} has shape {found:?}, expected {expected:?}")]
    TensorShape { name: String, expected: Vec<u64>, found: Vec<u64> },
    #[error("tensor {name} has type {ty}, which cannot be used as a weight")]
    TensorType { name: String, ty: GgmlType },
    #[error("the prompt needs {needed} positions but the context holds {max} (--max-context / -c)")]
    ContextOverflow { needed: usize, max: usize },
    #[error("token id {id} is outside the vocabulary of {n_vocab}")]
    BadToken { id: u32, n_vocab: usize },
    #[error("--kv int8 needs heads whose size is a multiple of 32 (this model's is {0})")]
    KvLayout(usize),
    #[error(
        "--kv {kv} runs on the CPU and sim devices only, and device {device} is a GPU (the CUDA kernels read \
         f16 or int8 KV)"
    )]
    KvOnGpu { kv: KvType, device: String },
    #[error("no embedding: {0}")]
    NoEmbedding(String),
    #[error(transparent)]
    Split(#[from] SplitError),
    #[error(transparent)]
    Device(#[from] DeviceError),
}

/// Tokens per prompt-processing batch unless told otherwise; the scratch of each stage is sized for it.
pub const DEFAULT_BATCH: usize = 512;

/// Whether the CPU's matrices are repacked at load (`quant::packed`); `STRATA_LAYOUT=file` keeps every
/// matrix in the file's layout (to compare speed and results).
pub fn repack_enabled() -> bool {
    std::env::var("STRATA_LAYOUT").map_or(true, |v| v != "file")
}

/// How a model is placed on devices.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    pub devices: DeviceSet,
    /// `--layer-split` points (None: one device, or layers in proportion to each device's memory).
    pub split: Option<Vec<usize>>,
    pub kv_type: KvType,
    pub batch: usize,
    /// Used by `strata plan` to show resident KV; sequences take their own limit.
    pub max_context: Option<usize>,
    /// `--kv-resident`: positions per layer kept on the device (None: all).
    pub kv_resident: Option<usize>,
    /// `--experts`: where a mixture of experts' blocks live.
    pub experts: ExpertsPlacement,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            devices: DeviceSet::cpu(),
            split: None,
            kv_type: KvType::F16,
            batch: DEFAULT_BATCH,
            max_context: None,
            kv_resident: None,
            experts: ExpertsPlacement::Auto,
        }
    }
}

pub struct Model {
    pub cfg: ModelConfig,
    pub weights: Weights,
    pub file: Arc<GgufFile>,
    pub placement: Placement,
}

impl Model {
    /// Opens the GGUF file at `path` and maps its weights.
    pub fn load(path: &Path) -> Result<Model, ModelError> {
        Self::load_with(path, &LoadOptions::default())
    }

    pub fn load_with(path: &Path, opts: &LoadOptions) -> Result<Model, ModelError> {
        let file = Arc::new(GgufFile::open(path)?);
        Self::from_file_with(file, opts)
    }

    /// The model on the host alone.
    pub fn from_file(file: Arc<GgufFile>) -> Result<Model, ModelError> {
        Self::from_file_with(file, &LoadOptions::default())
    }

    /// The model placed on devices as `opts` says. Refused before any allocation when a stage does not fit
    /// its device (naming the device, the need and the shortfall).
    pub fn from_file_with(file: Arc<GgufFile>, opts: &LoadOptions) -> Result<Model, ModelError> {
        let cfg = ModelConfig::from_gguf(&file)?;
        let mut weights = Weights::load(&file, &cfg)?;
        let stages = Self::plan_stages(&cfg, &weights, opts)?;
        placement::check_fits(&stages)?;
        let mut held = Vec::new();
        let mut gpu_stages = Vec::new();
        let n_stages = stages.len();
        for (i, s) in stages.iter().enumerate() {
            if s.device.kind.is_gpu() {
                let last = i + 1 == n_stages;
                gpu_stages.push(Some(gpu::GpuStage::load(
                    &s.device,
                    &cfg,
                    &weights,
                    s.layers.clone(),
                    last,
                    opts.batch.max(1),
                    &s.experts_on_host,
                )?));
                if s.host_experts_bytes > 0 {
                    held.push(opts.devices.host.alloc(Purpose::Weights, s.host_experts_bytes)?);
                    // The rows going down and up and the experts' buffers, grown to a full batch.
                    let scratch = gpu::host_scratch_bytes(&cfg, opts.batch.max(1));
                    held.push(opts.devices.host.alloc(Purpose::Scratch, scratch)?);
                    if repack_enabled() {
                        let on_host = s.experts_on_host.iter().enumerate().filter(|(_, &h)| h);
                        let report = weights.pack_experts_for_cpu(on_host.map(|(i, _)| s.layers.start + i));
                        for line in report.lines() {
                            tracing::debug!("experts of {} in host memory: {line}", s.device.name());
                        }
                    }
                }
                continue;
            }
            gpu_stages.push(None);
            if repack_enabled() {
                // At debug level (`STRATA_LOG=debug`): a plain run's stderr stays one line per event.
                let report = weights.pack_for_cpu(s.layers.clone(), i + 1 == n_stages);
                for line in report.lines() {
                    tracing::debug!(
                        "weights on {} (layers {}..{}): {line}",
                        s.device.name(),
                        s.layers.start,
                        s.layers.end
                    );
                }
            }
            // Experts kept on the host are counted there (mapped from the file, as the host's weights are).
            if s.host_experts_bytes > 0 && !s.device.is_host() {
                held.push(opts.devices.host.alloc(Purpose::Weights, s.host_experts_bytes)?);
            }
            for (purpose, bytes) in [
                (Purpose::Weights, s.weights_bytes),
                (Purpose::Scratch, s.scratch_bytes),
                (Purpose::Staging, s.staging_bytes),
            ] {
                if bytes > 0 {
                    held.push(s.device.alloc(purpose, bytes)?);
                }
            }
        }
        let mut layer_stage = vec![0; cfg.n_layer];
        for (i, s) in stages.iter().enumerate() {
            layer_stage[s.layers.clone()].fill(i);
        }
        let placement = Placement {
            devices: opts.devices.clone(),
            stages,
            layer_stage,
            batch: opts.batch.max(1),
            kv_resident: opts.kv_resident,
            gpu: gpu_stages,
            _held: held,
        };
        Ok(Model { cfg, weights, file, placement })
    }

    /// The stages `opts` would make for the model in `file`, without allocating anything (`strata plan`).
    pub fn plan(file: &Arc<GgufFile>, opts: &LoadOptions) -> Result<(ModelConfig, Vec<StagePlan>), ModelError> {
        let cfg = ModelConfig::from_gguf(file)?;
        let weights = Weights::load(file, &cfg)?;
        let stages = Self::plan_stages(&cfg, &weights, opts)?;
        Ok((cfg, stages))
    }

    fn plan_stages(cfg: &ModelConfig, weights: &Weights, opts: &LoadOptions) -> Result<Vec<StagePlan>, ModelError> {
        if opts.kv_type == KvType::Int8 && !cfg.head_dim.is_multiple_of(32) {
            return Err(ModelError::KvLayout(cfg.head_dim));
        }
        let popts = PlanOptions { kv_type: opts.kv_type, batch: opts.batch.max(1), experts: opts.experts.clone() };
        let stages = placement::plan(cfg, weights, &opts.devices, opts.split.as_deref(), &popts)?;
        check_kv_devices(opts.kv_type, &stages)?;
        Ok(stages)
    }

    /// A new empty KV cache for this model holding up to `max_tokens` positions, each layer's pages on its
    /// stage's device.
    pub fn new_kv(&self, ty: KvType, max_tokens: usize) -> Result<KvCache, ModelError> {
        if ty == KvType::Int8 && !self.cfg.head_dim.is_multiple_of(32) {
            return Err(ModelError::KvLayout(self.cfg.head_dim));
        }
        check_kv_devices(ty, &self.placement.stages)?;
        let p = &self.placement;
        let layer_devices = p.layer_stage.iter().map(|&s| p.stages[s].device.clone()).collect();
        let mut kv =
            KvCache::new(ty, self.cfg.kv_dim(), max_tokens, layer_devices, p.devices.host.clone(), p.kv_resident);
        let windows: Vec<Option<usize>> = (0..self.cfg.n_layer).map(|l| self.cfg.window(l)).collect();
        kv.set_windows(&windows);
        Ok(kv)
    }

    /// Bytes of weights (the mapped tensor data).
    pub fn weight_bytes(&self) -> u64 {
        self.file.tensors.iter().map(|t| t.n_bytes).sum()
    }

    /// Weight bytes one decoded token reads: every layer's matrices (of a mixture of experts, the router
    /// and the share of the experts a token runs, `n_used / n_expert`) and the output head (the embedding
    /// table only when it is the head), in the layout the products read.
    pub fn decode_read_bytes(&self) -> u64 {
        let w = &self.weights;
        let m = |q: &weights::QTensor| q.packed().map_or(q.data().len() as u64, |p| p.bytes() as u64);
        let layers: u64 = w
            .layers
            .iter()
            .map(|l| {
                let attn = [&l.wq, &l.wk, &l.wv, &l.wo].into_iter().map(m).sum::<u64>();
                let ffn = match &l.ffn {
                    weights::Ffn::Dense { .. } => l.ffn.matrices().into_iter().map(m).sum::<u64>(),
                    weights::Ffn::Moe(e) => {
                        let experts = e.gate.iter().chain(&e.up).chain(&e.down).map(m).sum::<u64>();
                        m(&e.router) + experts * e.cfg.n_used as u64 / e.cfg.n_expert as u64
                    }
                };
                attn + ffn
            })
            .sum();
        layers + m(&w.output)
    }

    /// Bytes of KV cache per position for `ty`, over all layers, K and V.
    pub fn kv_bytes_per_token(&self, ty: KvType) -> usize {
        ty.row_bytes(self.cfg.kv_dim()) * 2 * self.cfg.n_layer
    }
}

/// Refuses f32 KV when a stage runs on a GPU (`cuda`, `emu`): the CUDA kernels store and read f16 or int8
/// KV only. `sim` stages compute on the CPU, so they take any KV type.
fn check_kv_devices(ty: KvType, stages: &[StagePlan]) -> Result<(), ModelError> {
    match stages.iter().find(|s| s.device.kind.is_gpu()) {
        Some(s) if ty == KvType::F32 => Err(ModelError::KvOnGpu { kv: ty, device: s.device.name() }),
        _ => Ok(()),
    }
}
