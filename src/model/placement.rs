//! Where a model's parts live and what each stage needs there: the stage plans (a device, its layers, and
//! the weights, scratch, staging and KV bytes per position it takes), sized from the model's config and
//! weights before anything is allocated, the check that each fits its device, and the [`Placement`] a loaded
//! model keeps. Which layers form a stage is `split`'s rule; the sizes are the model's. The same numbers drive
//! `strata plan` and the loader's allocations, so what the plan prints is what the ledger will show.

use std::ops::Range;
use std::sync::Arc;

use crate::device::{Allocation, Device, DeviceError, DeviceSet, Purpose};
use crate::split::{stage_layers, SplitError};

use super::gpu;
use super::kv::{KvType, KV_PAGE_TOKENS, SWA_MARGIN_TOKENS};
use super::{ModelConfig, Weights};

/// What the plan depends on besides the model and the devices.
#[derive(Clone, Debug)]
pub struct PlanOptions {
    pub kv_type: KvType,
    /// Tokens per forward batch the scratch is sized for.
    pub batch: usize,
    pub experts: ExpertsPlacement,
}

/// Where a mixture of experts' blocks (router and experts: most of such a model's bytes, and few of them
/// read per token) live on a split (`--experts`): with the rest of their stage's layer on its device, or
/// in host memory, computed by the CPU while attention stays on the device (llama.cpp's `--n-cpu-moe`).
/// A CPU stage's experts are on the host whatever this says.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ExpertsPlacement {
    /// With their stage while it fits, else the experts of its first layers on the host until the rest
    /// fits; on a GPU stage, the blocks it cannot run (`gpu::experts_unsupported`) on the host.
    #[default]
    Auto,
    /// Every layer's experts on the host.
    Cpu,
    /// Every layer's experts with their stage (refused on a GPU stage for blocks it cannot run).
    Gpu,
    /// The experts of these layers on the host, the others with their stage.
    CpuLayers(Range<usize>),
}

impl ExpertsPlacement {
    /// Parses `--experts`: `auto`, `cpu`, `gpu` or `cpu:A..B` (the experts of layers A..B on the host).
    pub fn parse(spec: &str) -> Result<ExpertsPlacement, SplitError> {
        let bad = |why: &str| SplitError::BadExperts { spec: spec.to_owned(), why: why.to_owned() };
        Ok(match spec.trim() {
            "auto" => ExpertsPlacement::Auto,
            "cpu" => ExpertsPlacement::Cpu,
            "gpu" => ExpertsPlacement::Gpu,
            other => {
                let range = other.strip_prefix("cpu:").ok_or_else(|| bad("expected auto, cpu, gpu or cpu:A..B"))?;
                let (a, b) = range.split_once("..").ok_or_else(|| bad("a layer range is A..B, e.g. cpu:0..12"))?;
                let n =
                    |v: &str| v.trim().parse::<usize>().map_err(|_| bad("layers are whole numbers, e.g. cpu:0..12"));
                let (a, b) = (n(a)?, n(b)?);
                if a >= b {
                    return Err(bad("the range A..B is empty: A must be less than B"));
                }
                ExpertsPlacement::CpuLayers(a..b)
            }
        })
    }

    /// As `--experts` spells it.
    pub fn spec(&self) -> String {
        match self {
            ExpertsPlacement::Auto => "auto".into(),
            ExpertsPlacement::Cpu => "cpu".into(),
            ExpertsPlacement::Gpu => "gpu".into(),
            ExpertsPlacement::CpuLayers(r) => format!("cpu:{}..{}", r.start, r.end),
        }
    }

    /// Whether layer `l`'s experts are asked for on the host (`Auto` decides per stage, in `plan`).
    fn wants_host(&self, l: usize) -> Option<bool> {
        match self {
            ExpertsPlacement::Auto => None,
            ExpertsPlacement::Cpu => Some(true),
            ExpertsPlacement::Gpu => Some(false),
            ExpertsPlacement::CpuLayers(r) => Some(r.contains(&l)),
        }
    }
}

/// One stage: a device, its layers, and what it needs there.
#[derive(Clone, Debug)]
pub struct StagePlan {
    pub device: Arc<Device>,
    pub layers: Range<usize>,
    pub weights_bytes: u64,
    pub scratch_bytes: u64,
    pub staging_bytes: u64,
    /// KV bytes per position for this stage's layers (K and V).
    pub kv_bytes_per_token: u64,
    /// The part of `kv_bytes_per_token` from sliding-window layers that free the pages their window has
    /// passed (on every device), and how many positions those keep at most (window and margin, in whole
    /// pages, one more for alignment).
    pub swa_kv_bytes_per_token: u64,
    pub swa_kept_tokens: usize,
    /// A mixture of experts' blocks of this stage's layers: the bytes on its device (part of
    /// `weights_bytes`), the bytes kept in host memory (not part of it), and per layer of `layers` whether
    /// its block is on the host ([`ExpertsPlacement`]). 0, 0 and all false for a dense model.
    pub experts_bytes: u64,
    pub host_experts_bytes: u64,
    pub experts_on_host: Vec<bool>,
}

impl StagePlan {
    /// Bytes allocated when the model loads.
    pub fn load_bytes(&self) -> u64 {
        self.weights_bytes + self.scratch_bytes + self.staging_bytes
    }

    /// KV bytes on the device when a sequence holds `tokens` positions (whole pages; pages older than the
    /// resident window are on the host).
    /// (Sliding-window layers count only the pages they keep.)
    pub fn kv_device_bytes(&self, tokens: usize, kv_resident: Option<usize>) -> u64 {
        let (device_pages, _) = kv_pages(tokens, kv_resident);
        let swa_pages = device_pages.min(self.swa_kept_tokens.div_ceil(KV_PAGE_TOKENS));
        let global = self.kv_bytes_per_token - self.swa_kv_bytes_per_token;
        KV_PAGE_TOKENS as u64 * (device_pages as u64 * global + swa_pages as u64 * self.swa_kv_bytes_per_token)
    }

    /// KV bytes of this stage's layers on the host at `tokens` positions (the pages out of the window;
    /// a sliding-window layer's kept pages are the newest, resident ones).
    pub fn kv_host_bytes(&self, tokens: usize, kv_resident: Option<usize>) -> u64 {
        let (_, host_pages) = kv_pages(tokens, kv_resident);
        host_pages as u64 * KV_PAGE_TOKENS as u64 * (self.kv_bytes_per_token - self.swa_kv_bytes_per_token)
    }
}

/// (device pages, host pages) per layer when a sequence holds `tokens` positions.
pub fn kv_pages(tokens: usize, kv_resident: Option<usize>) -> (usize, usize) {
    let pages = tokens.div_ceil(KV_PAGE_TOKENS);
    let host = kv_resident.map_or(0, |r| tokens.saturating_sub(r) / KV_PAGE_TOKENS);
    (pages - host, host)
}

/// Scratch bytes of a forward pass of `t_count` tokens on a stage: the activations of one layer at a time
/// (`n_out` output rows on the last stage).
pub fn scratch_bytes(cfg: &ModelConfig, t_count: usize, n_out: usize, last: bool) -> u64 {
    let (d, q, kv) = (cfg.n_embd, cfg.q_dim(), cfg.kv_dim());
    // A mixture of experts: the router's scores and picks, an expert's rows in and out, its gate and up,
    // and every pick's weighted output (`moe::MoeScratch`), in place of the dense FFN's gate and up.
    let (ff, moe) = match cfg.moe {
        Some(m) => (m.n_ff_exp, m.n_expert + 2 * m.n_used + 2 * d + 2 * m.n_ff_exp + m.n_used * d),
        None => (cfg.n_ff, 2 * cfg.n_ff),
    };
    let f32s_per_token = 3 * d + 2 * q + 2 * kv + moe + cfg.rope_dims;
    let quantized_per_token = d.max(q).max(ff) * 9 / 8 + 64;
    let mut bytes = t_count * (f32s_per_token * 4 + quantized_per_token);
    if last {
        bytes += n_out * (d + cfg.n_vocab) * 4;
    }
    bytes as u64
}

/// The stages of a model over `devices`: layer ranges from `points` (or memory proportions), and what each
/// stage needs on its device.
pub fn plan(
    cfg: &ModelConfig,
    weights: &Weights,
    devices: &DeviceSet,
    points: Option<&[usize]>,
    opts: &PlanOptions,
) -> Result<Vec<StagePlan>, SplitError> {
    let devs = &devices.devices;
    let free: Vec<u64> = devs.iter().map(|d| d.sample_free().unwrap_or_else(|_| d.total_bytes())).collect();
    let ranges = stage_layers(cfg.n_layer, devs, points, &free)?;
    if let ExpertsPlacement::CpuLayers(r) = &opts.experts {
        if r.end > cfg.n_layer {
            let why = format!("the model has {} layers (0..{})", cfg.n_layer, cfg.n_layer);
            return Err(SplitError::BadExperts { spec: opts.experts.spec(), why });
        }
    }
    let n_stages = ranges.len();
    let row_bytes = opts.kv_type.row_bytes(cfg.kv_dim()) as u64;
    let hidden_bytes = (opts.batch * cfg.n_embd * 4) as u64;
    let stages = ranges
        .into_iter()
        .enumerate()
        .map(|(s, layers)| {
            let (first, last) = (s == 0, s + 1 == n_stages);
            // Sliding-window layers keep only their window's pages (and the margin), on every device.
            let swa_layers = layers.clone().filter(|&l| cfg.window(l).is_some()).count();
            let swa_kept_tokens =
                cfg.swa_window.map_or(0, |w| ((w + SWA_MARGIN_TOKENS).div_ceil(KV_PAGE_TOKENS) + 1) * KV_PAGE_TOKENS);
            let device = &devs[s];
            let mut experts_on_host = vec![false; layers.len()];
            let moe_layers = || layers.clone().filter(|&l| weights.layers[l].expert_bytes() > 0);
            if device.kind.is_gpu() {
                // The CUDA backend's own layout (see model::gpu): weights as stored, f32 scratch; hidden
                // states pass through host memory.
                for l in moe_layers() {
                    let unsupported = gpu::experts_unsupported(cfg, &weights.layers[l]);
                    experts_on_host[l - layers.start] = match (opts.experts.wants_host(l), unsupported) {
                        (Some(false), Some(why)) => {
                            let spec = opts.experts.spec();
                            return Err(SplitError::ExpertsOnGpu { spec, layer: l, device: device.name(), why });
                        }
                        (Some(on_host), _) => on_host,
                        (None, unsupported) => unsupported.is_some(),
                    };
                }
                let experts_bytes = |on_host: &[bool], which: bool| -> u64 {
                    moe_layers()
                        .filter(|&l| on_host[l - layers.start] == which)
                        .map(|l| gpu::expert_bytes(&weights.layers[l]))
                        .sum()
                };
                let need = |on_host: &[bool]| {
                    gpu::weight_bytes(weights, layers.clone(), last, on_host)
                        + gpu::scratch_bytes(cfg, opts.batch, last, experts_bytes(on_host, false) > 0)
                };
                if opts.experts == ExpertsPlacement::Auto {
                    // The first layers' experts move to the host until the rest fits.
                    let fits = |need: u64| free[s] >= need.saturating_add(device.reserve_bytes);
                    for l in moe_layers() {
                        if fits(need(&experts_on_host)) {
                            break;
                        }
                        experts_on_host[l - layers.start] = true;
                    }
                }
                let on_device = experts_bytes(&experts_on_host, false);
                return Ok(StagePlan {
                    device: device.clone(),
                    kv_bytes_per_token: 2 * row_bytes * layers.len() as u64,
                    swa_kv_bytes_per_token: 2 * row_bytes * swa_layers as u64,
                    swa_kept_tokens,
                    weights_bytes: gpu::weight_bytes(weights, layers.clone(), last, &experts_on_host),
                    scratch_bytes: gpu::scratch_bytes(cfg, opts.batch, last, on_device > 0),
                    staging_bytes: 0,
                    experts_bytes: on_device,
                    host_experts_bytes: experts_bytes(&experts_on_host, true),
                    experts_on_host,
                    layers,
                });
            }
            let mut weights_bytes: u64 = weights.layers[layers.clone()].iter().map(|l| l.device_bytes()).sum();
            if first && !weights.tied_output {
                weights_bytes += weights.token_embd.device_bytes();
            }
            if last {
                weights_bytes += weights.output.device_bytes() + weights.output_norm.len() as u64 * 4;
            }
            // Hidden states arrive from the previous stage; a tied head's embedding rows from the last.
            let staging_bytes = if !first || (weights.tied_output && n_stages > 1) { hidden_bytes } else { 0 };
            let scratch_bytes = scratch_bytes(cfg, opts.batch, 1, last);
            let all_experts: u64 = moe_layers().map(|l| weights.layers[l].expert_bytes()).sum();
            let mut host_experts_bytes = 0;
            if !device.is_host() {
                let free = free[s];
                let fits = |weights_bytes: u64| {
                    free >= (weights_bytes + scratch_bytes + staging_bytes).saturating_add(device.reserve_bytes)
                };
                for l in moe_layers() {
                    // Auto: the first layers' experts move to the host until the rest fits.
                    let on_host = opts.experts.wants_host(l).unwrap_or_else(|| !fits(weights_bytes));
                    if on_host {
                        experts_on_host[l - layers.start] = true;
                        let e = weights.layers[l].expert_bytes();
                        weights_bytes -= e;
                        host_experts_bytes += e;
                    }
                }
            }
            Ok(StagePlan {
                device: device.clone(),
                kv_bytes_per_token: 2 * row_bytes * layers.len() as u64,
                swa_kv_bytes_per_token: 2 * row_bytes * swa_layers as u64,
                swa_kept_tokens,
                layers,
                weights_bytes,
                scratch_bytes,
                staging_bytes,
                experts_bytes: all_experts - host_experts_bytes,
                host_experts_bytes,
                experts_on_host,
            })
        })
        .collect::<Result<Vec<_>, SplitError>>()?;
    Ok(stages)
}

/// Checks that every stage's load fits its device's sampled free memory above the reserve.
/// The host is not checked: its weights are mapped from the file, which the OS pages in and out.
pub fn check_fits(stages: &[StagePlan]) -> Result<(), SplitError> {
    for s in stages.iter().filter(|s| !s.device.is_host()) {
        let free = s.device.sample_free().unwrap_or_else(|_| s.device.total_bytes());
        let need = s.load_bytes();
        let reserve = s.device.reserve_bytes;
        if free < need.saturating_add(reserve) {
            return Err(SplitError::DoesNotFit {
                device: s.device.name(),
                layers: s.layers.clone(),
                need_bytes: need,
                weights_bytes: s.weights_bytes,
                scratch_bytes: s.scratch_bytes,
                staging_bytes: s.staging_bytes,
                free_bytes: free,
                reserve_bytes: reserve,
                shortfall_bytes: need.saturating_add(reserve) - free,
            });
        }
    }
    Ok(())
}

/// Where a loaded model lives: its stages and the device memory they hold.
pub struct Placement {
    pub devices: DeviceSet,
    pub stages: Vec<StagePlan>,
    /// The stage of each layer.
    pub layer_stage: Vec<usize>,
    pub batch: usize,
    pub kv_resident: Option<usize>,
    /// The weights and scratch of each stage on a GPU (`None` for stages that compute on the CPU).
    pub gpu: Vec<Option<gpu::GpuStage>>,
    /// Weights, scratch and staging of every CPU-computed stage, held while the model lives.
    pub(super) _held: Vec<Allocation>,
}

impl Placement {
    /// Takes extra scratch on each stage for a forward pass larger than the scratch was sized for
    /// (`t_count` tokens, `n_out` output rows); the allocations last as long as the returned vector.
    pub(crate) fn extra_scratch(
        &self,
        cfg: &ModelConfig,
        t_count: usize,
        n_out: usize,
    ) -> Result<Vec<Allocation>, DeviceError> {
        let mut held = Vec::new();
        let n = self.stages.len();
        for (i, s) in self.stages.iter().enumerate().filter(|(i, _)| self.gpu[*i].is_none()) {
            let need = scratch_bytes(cfg, t_count, n_out, i + 1 == n);
            if need > s.scratch_bytes {
                held.push(s.device.alloc(Purpose::Scratch, need - s.scratch_bytes)?);
            }
        }
        Ok(held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_pages_follow_the_resident_window() {
        assert_eq!(kv_pages(0, None), (0, 0));
        assert_eq!(kv_pages(4000, None), (63, 0));
        assert_eq!(kv_pages(4000, Some(64)), (2, 61));
        assert_eq!(kv_pages(100, Some(64)), (2, 0));
        assert_eq!(kv_pages(128, Some(64)), (1, 1));
    }
}
