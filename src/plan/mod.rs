//! What a model would need on each device of a split, before anything is allocated: the figures behind
//! `strata plan`, the desktop app's fit bars and the server's `POST /strata/plan`.
//!
//! It reads the configuration and the weights index only (no weight is paged in, no device memory taken).
//! Per stage: the layers, the weights, the KV cache of `sequences` sequences at `tokens` positions each on
//! the device and on the host, the scratch and staging buffers, the device's sampled free memory, the
//! reserve and the headroom left. The numbers are the ones the loader allocates, so what a plan says is
//! what a load will hold.
//!
//! With a draft model (speculative decoding) its stages are planned the same way on its devices, at the
//! same positions, and each device's free memory, headroom and fit count both models together: a device
//! holding layers of the model and the draft has one headroom figure ([`PlanDevice`]).

pub mod draft;
pub mod facts;
pub mod parallel;
pub mod settings;

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::device::{mib, Device, HOST_MARGIN_BYTES};
use crate::gguf::GgufFile;
use crate::model::placement::{self, StagePlan};
use crate::model::{KvType, LoadOptions, Model, ModelError};

use draft::{DraftInput, SharedShortfall};

/// One stage's figures at `tokens` positions.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
pub struct PlanRow {
    pub device: String,
    pub index: usize,
    pub host: bool,
    /// [start, end) of the layers on this device.
    pub layers: (usize, usize),
    #[cfg_attr(feature = "ts", ts(type = "number"))]
    pub weights_bytes: u64,
    /// A mixture of experts' blocks of this stage's layers (router and experts): the part of
    /// `weights_bytes` on the device, and the bytes kept in host memory instead (`--experts`, not part of
    /// `weights_bytes`). Both 0 for a dense model.
    #[cfg_attr(feature = "ts", ts(type = "number"))]
    pub experts_bytes: u64,
    #[cfg_attr(feature = "ts", ts(type = "number"))]
    pub host_experts_bytes: u64,
    #[cfg_attr(feature = "ts", ts(type = "number"))]
    pub kv_bytes_per_token: u64,
    #[cfg_attr(feature = "ts", ts(type = "number"))]
    pub kv_device_bytes: u64,
    #[cfg_attr(feature = "ts", ts(type = "number"))]
    pub kv_host_bytes: u64,
    #[cfg_attr(feature = "ts", ts(type = "number"))]
    pub scratch_bytes: u64,
    #[cfg_attr(feature = "ts", ts(type = "number"))]
    pub staging_bytes: u64,
    /// Load (weights, scratch, staging) plus the KV on the device.
    #[cfg_attr(feature = "ts", ts(type = "number"))]
    pub total_bytes: u64,
    /// The device's sampled free memory (None: the sample failed).
    #[cfg_attr(feature = "ts", ts(type = "number | null"))]
    pub free_bytes: Option<u64>,
    /// The device's whole memory.
    #[cfg_attr(feature = "ts", ts(type = "number"))]
    pub memory_bytes: u64,
    #[cfg_attr(feature = "ts", ts(type = "number"))]
    pub reserve_bytes: u64,
    /// Free minus reserve minus what the device holds (this row's total, and with a draft model on the
    /// same device the draft's too: the device's [`PlanDevice::headroom_bytes`]); negative when the KV at
    /// `tokens` does not fit (pages then go to the host) or, below the load itself, when it cannot load.
    #[cfg_attr(feature = "ts", ts(type = "number | null"))]
    pub headroom_bytes: Option<i64>,
    /// The device's loads (this row's, and a draft's on it) fit above the reserve.
    pub fits: bool,
}

impl PlanRow {
    /// Weights, scratch and staging: what loading allocates.
    pub fn load_bytes(&self) -> u64 {
        self.weights_bytes + self.scratch_bytes + self.staging_bytes
    }
}

/// One device with everything planned on it: the model's stage and the draft model's, added up.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
pub struct PlanDevice {
    pub device: String,
    pub index: usize,
    pub host: bool,
    /// Weights, scratch and staging of both models.
    #[cfg_attr(feature = "ts", ts(type = "number"))]
    pub load_bytes: u64,
    #[cfg_attr(feature = "ts", ts(type = "number"))]
    pub kv_bytes_per_token: u64,
    #[cfg_attr(feature = "ts", ts(type = "number"))]
    pub kv_device_bytes: u64,
    /// Load plus the KV on the device, both models.
    #[cfg_attr(feature = "ts", ts(type = "number"))]
    pub total_bytes: u64,
    /// The draft model's part of `total_bytes` (0: no draft on this device).
    #[cfg_attr(feature = "ts", ts(type = "number"))]
    pub draft_bytes: u64,
    #[cfg_attr(feature = "ts", ts(type = "number | null"))]
    pub free_bytes: Option<u64>,
    #[cfg_attr(feature = "ts", ts(type = "number"))]
    pub memory_bytes: u64,
    #[cfg_attr(feature = "ts", ts(type = "number"))]
    pub reserve_bytes: u64,
    /// Free minus reserve minus `total_bytes`.
    #[cfg_attr(feature = "ts", ts(type = "number | null"))]
    pub headroom_bytes: Option<i64>,
    /// Both loads fit above the reserve (the host always: its weights are paged from the file).
    pub fits: bool,
}

/// The draft model's part of a plan: its stages on its devices, at the plan's positions.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
pub struct DraftPlan {
    pub layers: usize,
    /// Its stages; `headroom_bytes` and `fits` are their devices' (both models).
    pub rows: Vec<PlanRow>,
}

/// A model on a set of devices at a number of positions (with its draft model, when there is one).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
pub struct Plan {
    pub tokens: usize,
    /// Live sequences of `tokens` positions each that every KV figure counts (`--parallel`).
    pub sequences: usize,
    pub max_context: usize,
    pub kv: KvType,
    /// Per-layer resident window on the devices (None: all positions).
    pub kv_resident: Option<usize>,
    pub rows: Vec<PlanRow>,
    /// The draft model of speculative decoding (None: no draft model).
    pub draft: Option<DraftPlan>,
    /// Each device that holds a stage, in device order, with both models' figures added up.
    pub devices: Vec<PlanDevice>,
    /// The model loads: every device holds its load above the reserve, and the host its share.
    pub fits: bool,
    /// Why it does not fit (the device, the need and the shortfall), when it does not.
    pub problem: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("--tokens {tokens} is more than the context of {max_context} positions (-c)")]
    TokensBeyondContext { tokens: usize, max_context: usize },
    /// The draft model cannot be planned (its file, its configuration, its devices' split).
    #[error("the draft model: {0}")]
    Draft(#[source] ModelError),
}

/// Plans `file` on `opts`' devices at `tokens` positions (default: the context, `opts.max_context` or the
/// model's). Device faults already applied count as memory other processes hold.
pub fn plan(file: &Arc<GgufFile>, opts: &LoadOptions, tokens: Option<usize>) -> Result<Plan, PlanError> {
    plan_with_draft(file, opts, tokens, 1, None)
}

/// [`plan`] for `sequences` live sequences of `tokens` positions each (`strata serve --parallel`: every
/// KV figure counts them all), with a draft model beside the model: its stages on `draft.devices` (split
/// by their memory, as loading it does), its KV at the same positions, and each device's figures for both
/// models together. A device short for the two loads together makes the plan not fit, its problem naming
/// the device and the shortfall.
pub fn plan_with_draft(
    file: &Arc<GgufFile>,
    opts: &LoadOptions,
    tokens: Option<usize>,
    sequences: usize,
    draft: Option<&DraftInput>,
) -> Result<Plan, PlanError> {
    let sequences = sequences.max(1);
    let (cfg, stages) = Model::plan(file, opts)?;
    let max_context = opts.max_context.unwrap_or(cfg.n_ctx_train);
    let tokens = tokens.unwrap_or(max_context);
    if tokens > max_context {
        return Err(PlanError::TokensBeyondContext { tokens, max_context });
    }
    let resident = opts.kv_resident;
    let mut rows: Vec<PlanRow> = stages.iter().map(|s| row(s, tokens, resident, sequences as u64)).collect();
    let mut draft_plan = match draft {
        None => None,
        Some(d) => {
            // `--experts` names the target's layers; the draft places its own experts as `auto`.
            let dopts = LoadOptions {
                devices: d.devices.clone(),
                split: None,
                experts: crate::model::ExpertsPlacement::Auto,
                ..opts.clone()
            };
            let (dcfg, dstages) = Model::plan(&d.file, &dopts).map_err(PlanError::Draft)?;
            let drows = dstages.iter().map(|s| row(s, tokens, resident, sequences as u64)).collect();
            Some(DraftPlan { layers: dcfg.n_layer, rows: drows })
        }
    };
    let draft_rows: &[PlanRow] = draft_plan.as_ref().map_or(&[], |d| &d.rows);
    let devices = device_totals(&rows, draft_rows);
    // One headroom and one fit per device: a row's are its device's, both models counted.
    for r in rows.iter_mut().chain(draft_plan.iter_mut().flat_map(|d| d.rows.iter_mut())) {
        if let Some(d) = devices.iter().find(|d| d.index == r.index) {
            r.headroom_bytes = d.headroom_bytes;
            r.fits = d.fits;
        }
    }
    let draft_rows: &[PlanRow] = draft_plan.as_ref().map_or(&[], |d| &d.rows);
    let problem = match placement::check_fits(&stages) {
        Err(e) => Some(e.to_string()),
        Ok(()) => check_shared(&rows, draft_rows, &devices)
            .map_err(|e| e.to_string())
            .and_then(|()| check_host(&rows, draft_rows, &devices, &opts.devices.host, tokens))
            .err(),
    };
    Ok(Plan {
        tokens,
        sequences,
        max_context,
        kv: opts.kv_type,
        kv_resident: resident,
        rows,
        draft: draft_plan,
        devices,
        fits: problem.is_none(),
        problem,
    })
}

/// Each device's figures with the rows of both models on it added up, in device order.
fn device_totals(rows: &[PlanRow], draft_rows: &[PlanRow]) -> Vec<PlanDevice> {
    let mut devices: Vec<PlanDevice> = Vec::new();
    for (r, is_draft) in rows.iter().map(|r| (r, false)).chain(draft_rows.iter().map(|r| (r, true))) {
        let at = match devices.iter().position(|d| d.index == r.index) {
            Some(at) => at,
            None => {
                devices.push(PlanDevice {
                    device: r.device.clone(),
                    index: r.index,
                    host: r.host,
                    load_bytes: 0,
                    kv_bytes_per_token: 0,
                    kv_device_bytes: 0,
                    total_bytes: 0,
                    draft_bytes: 0,
                    free_bytes: r.free_bytes,
                    memory_bytes: r.memory_bytes,
                    reserve_bytes: r.reserve_bytes,
                    headroom_bytes: None,
                    fits: true,
                });
                devices.len() - 1
            }
        };
        let d = &mut devices[at];
        d.load_bytes += r.load_bytes();
        d.kv_bytes_per_token += r.kv_bytes_per_token;
        d.kv_device_bytes += r.kv_device_bytes;
        d.total_bytes += r.total_bytes;
        if is_draft {
            d.draft_bytes += r.total_bytes;
        }
    }
    for d in &mut devices {
        d.headroom_bytes = d.free_bytes.map(|f| signed(f) - signed(d.reserve_bytes) - signed(d.total_bytes));
        d.fits = d.host || d.free_bytes.unwrap_or(d.memory_bytes) >= d.load_bytes.saturating_add(d.reserve_bytes);
    }
    devices.sort_by_key(|d| d.index);
    devices
}

/// The first device whose loads of both models do not fit together above its reserve (each model's stage
/// alone was checked by `placement::check_fits`).
fn check_shared(rows: &[PlanRow], draft_rows: &[PlanRow], devices: &[PlanDevice]) -> Result<(), SharedShortfall> {
    let Some(d) = devices.iter().find(|d| !d.host && !d.fits && d.draft_bytes > 0) else { return Ok(()) };
    let on = |r: &&PlanRow| r.index == d.index;
    let target = rows.iter().find(on);
    let draft_layers = draft_rows
        .iter()
        .filter(on)
        .map(|r| r.layers.0..r.layers.1)
        .reduce(|a, b| a.start.min(b.start)..a.end.max(b.end));
    let free_bytes = d.free_bytes.unwrap_or(d.memory_bytes);
    Err(SharedShortfall {
        device: d.device.clone(),
        target_layers: target.map(|r| r.layers.0..r.layers.1),
        draft_layers: draft_layers.unwrap_or(0..0),
        target_bytes: target.map_or(0, |r| r.load_bytes()),
        draft_bytes: draft_rows.iter().filter(on).map(|r| r.load_bytes()).sum(),
        free_bytes,
        reserve_bytes: d.reserve_bytes,
        shortfall_bytes: d.load_bytes.saturating_add(d.reserve_bytes).saturating_sub(free_bytes),
    })
}

/// A stage's own figures for `sequences` sequences of `tokens` positions; its headroom and fit are its
/// device's, set once every stage is known.
fn row(s: &StagePlan, tokens: usize, resident: Option<usize>, sequences: u64) -> PlanRow {
    let kv_device_bytes = s.kv_device_bytes(tokens, resident).saturating_mul(sequences);
    PlanRow {
        device: s.device.name(),
        index: s.device.index,
        host: s.device.is_host(),
        layers: (s.layers.start, s.layers.end),
        weights_bytes: s.weights_bytes,
        experts_bytes: s.experts_bytes,
        host_experts_bytes: s.host_experts_bytes,
        kv_bytes_per_token: s.kv_bytes_per_token,
        kv_device_bytes,
        kv_host_bytes: s.kv_host_bytes(tokens, resident).saturating_mul(sequences),
        scratch_bytes: s.scratch_bytes,
        staging_bytes: s.staging_bytes,
        total_bytes: s.load_bytes() + kv_device_bytes,
        free_bytes: s.device.sample_free().ok(),
        memory_bytes: s.device.total_bytes(),
        reserve_bytes: s.device.reserve_bytes,
        headroom_bytes: None,
        fits: true,
    }
}

/// The host must hold what lands on it: the KV, scratch and staging of its own stages (both models'), the
/// KV of GPU stages out of their resident window, and the KV a GPU has no room for (it moves to the host).
/// Weights mapped from the file are left out: the OS pages them.
fn check_host(
    rows: &[PlanRow],
    draft_rows: &[PlanRow],
    devices: &[PlanDevice],
    host: &Device,
    tokens: usize,
) -> Result<(), String> {
    let mut kv_bytes = 0u64;
    let mut buffers_bytes = 0u64;
    for r in rows.iter().chain(draft_rows) {
        kv_bytes = kv_bytes.saturating_add(r.kv_host_bytes);
        if r.host {
            kv_bytes = kv_bytes.saturating_add(r.kv_device_bytes);
            buffers_bytes = buffers_bytes.saturating_add(r.scratch_bytes + r.staging_bytes);
        }
    }
    for d in devices.iter().filter(|d| !d.host) {
        if let (Some(free), Some(headroom)) = (d.free_bytes, d.headroom_bytes) {
            if headroom < 0 {
                // The part of the device's KV above its room spills to the host.
                let room = free.saturating_sub(d.reserve_bytes).saturating_sub(d.load_bytes);
                kv_bytes = kv_bytes.saturating_add(d.kv_device_bytes.saturating_sub(room));
            }
        }
    }
    let need = kv_bytes.saturating_add(buffers_bytes);
    // What the host ledger hands out: available memory less the margin it keeps for the process.
    let available = host.sample_free().map_err(|e| e.to_string())?.saturating_sub(HOST_MARGIN_BYTES);
    if need > available {
        return Err(format!(
            "the host needs {} at {tokens} positions (KV {}, scratch and staging {}) but has {} available: short by \
             {}; lower -c, --tokens or --parallel, or use --kv int8",
            mib(need),
            mib(kv_bytes),
            mib(buffers_bytes),
            mib(available),
            mib(need - available)
        ));
    }
    Ok(())
}

/// Bytes as a signed number (no device holds 8 EiB).
fn signed(bytes: u64) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}
