//! The draft model of speculative decoding in a plan: the devices it goes on (`--draft-devices`: indices
//! into the target's devices, sharing their ledgers and the target's host), whether it can draft for the
//! target at all (the same vocabulary), and the check that each device holds the loads of both models
//! together.
//!
//! It allocates nothing and plans no stage itself: the draft's stages are made by `Model::plan` exactly as
//! the target's are, and `plan::plan_with_draft` puts both in one [`Plan`](super::Plan).

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use crate::device::{mib, Device, DeviceSet};
use crate::engine::spec::{check_vocab, VocabMismatch};
use crate::gguf::GgufFile;
use crate::tokenizer::{Tokenizer, TokenizerError};

/// The draft model to plan beside the target: its file and its devices (from [`select_devices`]).
#[derive(Clone, Debug)]
pub struct DraftInput {
    pub file: Arc<GgufFile>,
    pub devices: DeviceSet,
}

/// Why a list of draft devices cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DraftDevicesError {
    #[error("{part:?} is not a device index (0 is the first of the devices)")]
    NotAnIndex { part: String },
    #[error("device {index} is not among the {count} device(s): {names}")]
    Missing { index: usize, count: usize, names: String },
    #[error("device {index} is listed twice")]
    Twice { index: usize },
}

/// Parses a list of device indices such as `1` or `0,1` (blank: none, which [`select_devices`] reads as
/// the first device).
pub fn parse_indices(list: &str) -> Result<Vec<usize>, DraftDevicesError> {
    if list.trim().is_empty() {
        return Ok(Vec::new());
    }
    list.split(',')
        .map(str::trim)
        .map(|p| p.parse::<usize>().map_err(|_| DraftDevicesError::NotAnIndex { part: p.to_owned() }))
        .collect()
}

/// The draft's devices: those of `target` that `indices` name, in that order (none: the first), the same
/// `Arc`s (so the draft's allocations land in the ledgers the target's do), with the target's host.
pub fn select_devices(target: &DeviceSet, indices: &[usize]) -> Result<DeviceSet, DraftDevicesError> {
    let indices = if indices.is_empty() { &[0][..] } else { indices };
    let mut devices: Vec<Arc<Device>> = Vec::with_capacity(indices.len());
    for &index in indices {
        let Some(d) = target.devices.get(index) else {
            let names: Vec<String> = target.devices.iter().map(|d| d.name()).collect();
            return Err(DraftDevicesError::Missing { index, count: names.len(), names: names.join(", ") });
        };
        if devices.iter().any(|x| Arc::ptr_eq(x, d)) {
            return Err(DraftDevicesError::Twice { index });
        }
        devices.push(d.clone());
    }
    Ok(DeviceSet { devices, host: target.host.clone() })
}

/// Why a model cannot draft for another.
#[derive(Debug, thiserror::Error)]
pub enum DraftVocabError {
    #[error("cannot read the draft model's tokenizer: {0}")]
    DraftTokenizer(#[source] TokenizerError),
    #[error("cannot read the model's tokenizer: {0}")]
    TargetTokenizer(#[source] TokenizerError),
    #[error("it cannot draft for this model: {0}")]
    Mismatch(#[from] VocabMismatch),
}

/// Checks that the model in `draft` can draft for the one in `target` (`engine::spec::check_vocab` on both
/// tokenizers, as loading the draft does).
pub fn check_draft_vocab(target: &GgufFile, draft: &GgufFile) -> Result<(), DraftVocabError> {
    let t = Tokenizer::from_gguf(target).map_err(DraftVocabError::TargetTokenizer)?;
    let d = Tokenizer::from_gguf(draft).map_err(DraftVocabError::DraftTokenizer)?;
    Ok(check_vocab(&t, &d)?)
}

/// A device short of memory for the loads of both models together (each alone may fit).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SharedShortfall {
    pub device: String,
    /// The target's layers on the device (None: the device holds only the draft).
    pub target_layers: Option<Range<usize>>,
    pub draft_layers: Range<usize>,
    /// Weights, scratch and staging of the target's stage on the device.
    pub target_bytes: u64,
    /// Weights, scratch and staging of the draft's stage on the device.
    pub draft_bytes: u64,
    pub free_bytes: u64,
    pub reserve_bytes: u64,
    pub shortfall_bytes: u64,
}

impl fmt::Display for SharedShortfall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = &self.draft_layers;
        match &self.target_layers {
            Some(t) => write!(
                f,
                "device {} cannot hold the draft model's layers {}..{} beside layers {}..{} of the model: needs {} \
                 (the model's {} + the draft's {}) with {} free and a reserve of {}: short by {}",
                self.device,
                d.start,
                d.end,
                t.start,
                t.end,
                mib(self.target_bytes + self.draft_bytes),
                mib(self.target_bytes),
                mib(self.draft_bytes),
                mib(self.free_bytes),
                mib(self.reserve_bytes),
                mib(self.shortfall_bytes),
            )?,
            None => write!(
                f,
                "device {} cannot hold the draft model's layers {}..{}: needs {} with {} free and a reserve of {}: \
                 short by {}",
                self.device,
                d.start,
                d.end,
                mib(self.draft_bytes),
                mib(self.free_bytes),
                mib(self.reserve_bytes),
                mib(self.shortfall_bytes),
            )?,
        }
        f.write_str("; choose other --draft-devices, a smaller draft model, or fewer layers of the model there")
    }
}

impl std::error::Error for SharedShortfall {}

#[cfg(test)]
mod tests {
    use super::*;

    fn two_sims() -> DeviceSet {
        DeviceSet::parse("sim:200,sim:400", 0).unwrap()
    }

    #[test]
    fn indices_parse_and_name_what_is_wrong() {
        assert_eq!(parse_indices("1"), Ok(vec![1]));
        assert_eq!(parse_indices(" 0, 1 "), Ok(vec![0, 1]));
        assert_eq!(parse_indices(""), Ok(vec![]));
        assert_eq!(parse_indices("1,x"), Err(DraftDevicesError::NotAnIndex { part: "x".into() }));
        assert_eq!(parse_indices("1,"), Err(DraftDevicesError::NotAnIndex { part: "".into() }));
    }

    #[test]
    fn selected_devices_share_the_targets_ledgers() {
        let target = two_sims();
        let d = select_devices(&target, &[1]).unwrap();
        assert_eq!(d.devices.len(), 1);
        assert!(Arc::ptr_eq(&d.devices[0], &target.devices[1]));
        assert!(Arc::ptr_eq(&d.host, &target.host));
        // None listed: the first device.
        assert!(Arc::ptr_eq(&select_devices(&target, &[]).unwrap().devices[0], &target.devices[0]));
        let e = select_devices(&target, &[2]).unwrap_err();
        assert!(matches!(e, DraftDevicesError::Missing { index: 2, count: 2, .. }), "{e}");
        assert!(e.to_string().contains("1 (sim:400)"), "{e}");
        assert_eq!(select_devices(&target, &[1, 1]).unwrap_err(), DraftDevicesError::Twice { index: 1 });
    }

    #[test]
    fn a_shortfall_names_the_device_both_loads_and_the_shortfall() {
        let s = SharedShortfall {
            device: "1 (sim:150)".into(),
            target_layers: Some(15..30),
            draft_layers: 0..30,
            target_bytes: 60 << 20,
            draft_bytes: 110 << 20,
            free_bytes: 150 << 20,
            reserve_bytes: 0,
            shortfall_bytes: 20 << 20,
        };
        let m = s.to_string();
        assert!(
            m.starts_with("device 1 (sim:150) cannot hold the draft model's layers 0..30 beside layers 15..30"),
            "{m}"
        );
        assert!(m.contains("needs 170.0 MiB (the model's 60.0 MiB + the draft's 110.0 MiB)"), "{m}");
        assert!(m.contains("short by 20.0 MiB"), "{m}");
    }
}
