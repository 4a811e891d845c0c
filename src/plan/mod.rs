//! What a model would need on each device of a split, before anything is allocated: the figures behind
//! `strata plan`, the desktop app's fit bars and the server's `POST /strata/plan`.
//!
//! It reads the configuration and the weights index only (no weight is paged in, no device memory taken).
//! Per stage: the layers, the weights, the KV cache at `tokens` positions on the device and on the host, the
//! scratch and staging buffers, the device's sampled free memory, the reserve and the headroom left. The
//! numbers are the ones the loader allocates, so what a plan says is what a load will hold.

pub mod facts;
pub mod settings;

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::device::{mib, Device, HOST_MARGIN_BYTES};
use crate::gguf::GgufFile;
use crate::model::{KvType, LoadOptions, Model, ModelError};
use crate::split::{self, StagePlan};

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
    /// Free minus reserve minus total; negative when the KV at `tokens` does not fit (pages then go to the
    /// host) or, below the load itself, when the model cannot load.
    #[cfg_attr(feature = "ts", ts(type = "number | null"))]
    pub headroom_bytes: Option<i64>,
    /// The load (weights, scratch, staging) fits above the reserve.
    pub fits: bool,
}

impl PlanRow {
    /// Weights, scratch and staging: what loading allocates.
    pub fn load_bytes(&self) -> u64 {
        self.weights_bytes + self.scratch_bytes + self.staging_bytes
    }
}

/// A model on a set of devices at a number of positions.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
pub struct Plan {
    pub tokens: usize,
    pub max_context: usize,
    pub kv: KvType,
    /// Per-layer resident window on the devices (None: all positions).
    pub kv_resident: Option<usize>,
    pub rows: Vec<PlanRow>,
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
}

/// Plans `file` on `opts`' devices at `tokens` positions (default: the context, `opts.max_context` or the
/// model's). Device faults already applied count as memory other processes hold.
pub fn plan(file: &Arc<GgufFile>, opts: &LoadOptions, tokens: Option<usize>) -> Result<Plan, PlanError> {
    let (cfg, stages) = Model::plan(file, opts)?;
    let max_context = opts.max_context.unwrap_or(cfg.n_ctx_train);
    let tokens = tokens.unwrap_or(max_context);
    if tokens > max_context {
        return Err(PlanError::TokensBeyondContext { tokens, max_context });
    }
    let resident = opts.kv_resident;
    let rows: Vec<PlanRow> = stages.iter().map(|s| row(s, tokens, resident)).collect();
    let problem = match split::check_fits(&stages) {
        Err(e) => Some(e.to_string()),
        Ok(()) => check_host(&rows, &opts.devices.host, tokens).err(),
    };
    Ok(Plan { tokens, max_context, kv: opts.kv_type, kv_resident: resident, rows, fits: problem.is_none(), problem })
}

fn row(s: &StagePlan, tokens: usize, resident: Option<usize>) -> PlanRow {
    let kv_device_bytes = s.kv_device_bytes(tokens, resident);
    let total_bytes = s.load_bytes() + kv_device_bytes;
    let free_bytes = s.device.sample_free().ok();
    let reserve_bytes = s.device.reserve_bytes;
    let headroom_bytes = free_bytes.map(|f| signed(f) - signed(reserve_bytes) - signed(total_bytes));
    let fits = s.device.is_host()
        || free_bytes.unwrap_or_else(|| s.device.total_bytes()) >= s.load_bytes().saturating_add(reserve_bytes);
    PlanRow {
        device: s.device.name(),
        index: s.device.index,
        host: s.device.is_host(),
        layers: (s.layers.start, s.layers.end),
        weights_bytes: s.weights_bytes,
        kv_bytes_per_token: s.kv_bytes_per_token,
        kv_device_bytes,
        kv_host_bytes: s.kv_host_bytes(tokens, resident),
        scratch_bytes: s.scratch_bytes,
        staging_bytes: s.staging_bytes,
        total_bytes,
        free_bytes,
        memory_bytes: s.device.total_bytes(),
        reserve_bytes,
        headroom_bytes,
        fits,
    }
}

/// The host must hold what lands on it: the KV, scratch and staging of its own stages, the KV of GPU stages
/// out of their resident window, and the KV a GPU has no room for (it moves to the host). Weights mapped from
/// the file are left out: the OS pages them.
fn check_host(rows: &[PlanRow], host: &Device, tokens: usize) -> Result<(), String> {
    let mut kv_bytes = 0u64;
    let mut buffers_bytes = 0u64;
    for r in rows {
        kv_bytes = kv_bytes.saturating_add(r.kv_host_bytes);
        if r.host {
            kv_bytes = kv_bytes.saturating_add(r.kv_device_bytes);
            buffers_bytes = buffers_bytes.saturating_add(r.scratch_bytes + r.staging_bytes);
        } else if let (Some(free), Some(headroom)) = (r.free_bytes, r.headroom_bytes) {
            if headroom < 0 {
                // The part of the device's KV above its room spills to the host.
                let room = free.saturating_sub(r.reserve_bytes).saturating_sub(r.load_bytes());
                kv_bytes = kv_bytes.saturating_add(r.kv_device_bytes.saturating_sub(room));
            }
        }
    }
    let need = kv_bytes.saturating_add(buffers_bytes);
    // What the host ledger hands out: available memory less the margin it keeps for the process.
    let available = host.sample_free().map_err(|e| e.to_string())?.saturating_sub(HOST_MARGIN_BYTES);
    if need > available {
        return Err(format!(
            "the host needs {} at {tokens} positions (KV {}, scratch and staging {}) but has {} available: short by \
             {}; lower -c or --tokens, or use --kv int8",
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
