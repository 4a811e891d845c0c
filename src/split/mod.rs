//! The split plan: which device runs which layers (the stages), and what each stage needs on its device
//! (weights, KV bytes per token, scratch, staging), computed before anything is allocated.
//!
//! `--layer-split 15` puts layers 0..15 on device 0 and the rest on device 1; `--layer-split 10,20` makes
//! three stages. Embeddings go with the first stage, the output norm and head with the last; a head tied to
//! the embeddings is placed where it is used as the head (the last stage), and the first stage gathers its
//! embedding rows from there by a counted copy. The same numbers drive `strata plan` and the loader's
//! allocations, so what the plan prints is what the ledger will show.

use std::ops::Range;
use std::sync::Arc;

use crate::device::{mib, Device, DeviceError, DeviceSet};
use crate::model::gpu;
use crate::model::kv::KV_PAGE_TOKENS;
use crate::model::{KvType, ModelConfig, Weights};

#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum SplitError {
    #[error("bad --layer-split {spec:?}: {why}")]
    BadSpec { spec: String, why: String },
    #[error("--layer-split makes {stages} stages but --devices lists {devices} device(s): give one device per stage")]
    DeviceCount { stages: usize, devices: usize },
    #[error("--layer-split point {point} is beyond the model's {n_layer} layers")]
    PointBeyondLayers { point: usize, n_layer: usize },
    #[error("--layer-split leaves stage {stage} (device {device}) with no layers ({start}..{end})")]
    EmptyStage { stage: usize, device: String, start: usize, end: usize },
    #[error(
        "device {device} cannot hold layers {}..{}: needs {} (weights {} + scratch {} + staging {}) with {} free and a reserve of {}: short by {}",
        layers.start, layers.end, mib(*need_bytes), mib(*weights_bytes), mib(*scratch_bytes), mib(*staging_bytes),
        mib(*free_bytes), mib(*reserve_bytes), mib(*shortfall_bytes)
    )]
    DoesNotFit {
        device: String,
        layers: Range<usize>,
        need_bytes: u64,
        weights_bytes: u64,
        scratch_bytes: u64,
        staging_bytes: u64,
        free_bytes: u64,
        reserve_bytes: u64,
        shortfall_bytes: u64,
    },
    #[error(transparent)]
    Device(#[from] DeviceError),
}

/// Parses `--layer-split`: split points, comma-separated, e.g. `15` or `10,20`.
pub fn parse_points(spec: &str) -> Result<Vec<usize>, SplitError> {
    let bad = |why: &str| SplitError::BadSpec { spec: spec.to_owned(), why: why.to_owned() };
    let points = spec
        .split(',')
        .map(|p| p.trim().parse::<usize>().map_err(|_| bad("split points are whole numbers, e.g. 15 or 10,20")))
        .collect::<Result<Vec<_>, _>>()?;
    if points.is_empty() {
        return Err(bad("no split point"));
    }
    Ok(points)
}

/// Layer ranges of the stages: from split points, or without them, one stage per device with layers in
/// proportion to `free_bytes` (each device's memory).
pub fn stage_layers(
    n_layer: usize,
    devices: &[Arc<Device>],
    points: Option<&[usize]>,
    free_bytes: &[u64],
) -> Result<Vec<Range<usize>>, SplitError> {
    let bounds: Vec<usize> = match points {
        Some(points) => {
            if points.len() + 1 != devices.len() {
                return Err(SplitError::DeviceCount { stages: points.len() + 1, devices: devices.len() });
            }
            if let Some(&p) = points.iter().find(|&&p| p > n_layer) {
                return Err(SplitError::PointBeyondLayers { point: p, n_layer });
            }
            points.to_vec()
        }
        None => {
            // Proportional to memory, at least one layer per device (a model with fewer layers than
            // devices leaves the last devices unused).
            let k = devices.len().min(n_layer).max(1);
            let free = &free_bytes[..k.min(free_bytes.len())];
            let total: u128 = free.iter().map(|&f| f as u128).sum::<u128>().max(1);
            let mut acc = 0u128;
            let mut bounds = Vec::new();
            for (i, f) in free.iter().enumerate().take(k - 1) {
                acc += *f as u128;
                let b = ((acc * n_layer as u128 + total / 2) / total) as usize;
                bounds.push(b.clamp(i + 1, n_layer - (k - 1 - i)));
            }
            bounds
        }
    };
    let mut ranges = Vec::with_capacity(bounds.len() + 1);
    let mut start = 0;
    for (stage, &end) in bounds.iter().chain(std::iter::once(&n_layer)).enumerate() {
        if end <= start {
            let device = devices[stage].name();
            return Err(SplitError::EmptyStage { stage, device, start, end: end.max(start) });
        }
        ranges.push(start..end);
        start = end;
    }
    Ok(ranges)
}

/// What the plan depends on besides the model and the devices.
#[derive(Clone, Debug)]
pub struct PlanOptions {
    pub kv_type: KvType,
    /// Tokens per forward batch the scratch is sized for.
    pub batch: usize,
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
}

impl StagePlan {
    /// Bytes allocated when the model loads.
    pub fn load_bytes(&self) -> u64 {
        self.weights_bytes + self.scratch_bytes + self.staging_bytes
    }

    /// KV bytes on the device when a sequence holds `tokens` positions (whole pages; pages older than the
    /// resident window are on the host).
    pub fn kv_device_bytes(&self, tokens: usize, kv_resident: Option<usize>) -> u64 {
        let (device_pages, _) = kv_pages(tokens, kv_resident);
        device_pages as u64 * KV_PAGE_TOKENS as u64 * self.kv_bytes_per_token
    }

    /// KV bytes of this stage's layers on the host at `tokens` positions (the pages out of the window).
    pub fn kv_host_bytes(&self, tokens: usize, kv_resident: Option<usize>) -> u64 {
        let (_, host_pages) = kv_pages(tokens, kv_resident);
        host_pages as u64 * KV_PAGE_TOKENS as u64 * self.kv_bytes_per_token
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
    let (d, q, kv, ff) = (cfg.n_embd, cfg.q_dim(), cfg.kv_dim(), cfg.n_ff);
    let f32s_per_token = 3 * d + 2 * q + 2 * kv + 2 * ff + cfg.rope_dims;
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
    let n_stages = ranges.len();
    let row_bytes = opts.kv_type.row_bytes(cfg.kv_dim()) as u64;
    let hidden_bytes = (opts.batch * cfg.n_embd * 4) as u64;
    let stages = ranges
        .into_iter()
        .enumerate()
        .map(|(s, layers)| {
            let (first, last) = (s == 0, s + 1 == n_stages);
            if devs[s].kind.is_gpu() {
                // The CUDA backend's own layout (see model::gpu): weights as stored, f32 scratch; hidden
                // states pass through host memory.
                return StagePlan {
                    device: devs[s].clone(),
                    kv_bytes_per_token: 2 * row_bytes * layers.len() as u64,
                    weights_bytes: gpu::weight_bytes(weights, layers.clone(), last),
                    scratch_bytes: gpu::scratch_bytes(cfg, opts.batch, last),
                    staging_bytes: 0,
                    layers,
                };
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
            StagePlan {
                device: devs[s].clone(),
                kv_bytes_per_token: 2 * row_bytes * layers.len() as u64,
                layers,
                weights_bytes,
                scratch_bytes: scratch_bytes(cfg, opts.batch, 1, last),
                staging_bytes,
            }
        })
        .collect();
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

#[cfg(test)]
mod tests {
    use super::*;

    fn sims(n: usize) -> Vec<Arc<Device>> {
        (0..n).map(|i| Device::sim(i, 100 << 20, 0)).collect()
    }

    #[test]
    fn split_points_make_stages() {
        let d = sims(3);
        assert_eq!(stage_layers(30, &d[..2], Some(&[15]), &[]).unwrap(), vec![0..15, 15..30]);
        assert_eq!(stage_layers(30, &d, Some(&[10, 20]), &[]).unwrap(), vec![0..10, 10..20, 20..30]);
        assert_eq!(stage_layers(30, &d[..1], None, &[1]).unwrap(), vec![0..30]);
        assert_eq!(stage_layers(30, &d[..2], None, &[200, 400]).unwrap(), vec![0..10, 10..30]);
        assert_eq!(stage_layers(2, &d, None, &[1000, 1, 1]).unwrap(), vec![0..1, 1..2]);
    }

    #[test]
    fn bad_splits_are_refused_with_the_reason() {
        let d = sims(3);
        let e = |r: Result<_, SplitError>| r.unwrap_err().to_string();
        assert!(e(stage_layers(30, &d[..2], Some(&[10, 20]), &[])).contains("3 stages but --devices lists 2"));
        assert!(e(stage_layers(30, &d[..2], Some(&[31]), &[])).contains("31 is beyond the model's 30 layers"));
        assert!(e(stage_layers(30, &d[..2], Some(&[30]), &[])).contains("stage 1 (device 1 (sim:100)) with no layers"));
        assert!(e(stage_layers(30, &d[..2], Some(&[0]), &[])).contains("stage 0"));
        assert!(e(stage_layers(30, &d, Some(&[20, 10]), &[])).contains("stage 1"));
        assert!(parse_points("10,x").is_err() && parse_points("").is_err());
        assert_eq!(parse_points("10, 20").unwrap(), vec![10, 20]);
    }

    #[test]
    fn kv_pages_follow_the_resident_window() {
        assert_eq!(kv_pages(0, None), (0, 0));
        assert_eq!(kv_pages(4000, None), (63, 0));
        assert_eq!(kv_pages(4000, Some(64)), (2, 61));
        assert_eq!(kv_pages(100, Some(64)), (2, 0));
        assert_eq!(kv_pages(128, Some(64)), (1, 1));
    }
}
