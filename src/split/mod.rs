//! The layer split: which device runs which layers (the stages). `--layer-split 15` puts layers 0..15 on
//! device 0 and the rest on device 1; `--layer-split 10,20` makes three stages; without points, each device
//! takes layers in proportion to its memory. What each stage then needs on its device is sized by
//! `model::placement`; this module knows devices and layer counts, nothing of a model's tensors.

use std::ops::Range;
use std::sync::Arc;

use crate::device::{mib, Device, DeviceError};

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
    /// `--experts` puts a mixture's experts on a GPU stage that cannot run them (`why`).
    #[error(
        "--experts {spec} puts the experts of layer {layer} on {device}, but the CUDA backend cannot run them \
         ({why}): use --experts auto or cpu (attention stays on the GPU, the experts run from host memory)"
    )]
    ExpertsOnGpu { spec: String, layer: usize, device: String, why: String },
    #[error("bad --experts {spec:?}: {why}")]
    BadExperts { spec: String, why: String },
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
}
