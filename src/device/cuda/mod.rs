//! CUDA devices, found through cudarc with the driver loaded at run time: the binary builds with no CUDA
//! toolkit, and a machine without a driver or without a GPU simply has no CUDA device (with the reason),
//! never a panic. Raw driver calls stay inside this module.
//!
//! This build finds and describes CUDA devices (name, total and free memory, sampled in each device's own
//! context); computing on them (kernels, the forward pass) is not built yet, so `cuda:N` in `--devices` is
//! refused with what was found.

pub mod driver;
pub mod emu;
pub mod gpu;
pub mod kernels;
pub mod ptx;

use std::panic::{catch_unwind, AssertUnwindSafe};

use cudarc::driver::CudaContext;

/// One CUDA device as the driver describes it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct CudaInfo {
    pub ordinal: usize,
    pub name: String,
    pub total_bytes: u64,
    pub free_bytes: u64,
    pub compute_capability: (i32, i32),
}

/// What probing for CUDA found.
#[derive(Clone, Debug)]
pub enum Probe {
    /// No driver library (libcuda) could be loaded.
    NoDriver,
    /// A driver, but it reports an error (no GPU, a driver too old, ...).
    DriverError(String),
    Devices(Vec<CudaInfo>),
}

impl Probe {
    /// Why there is no CUDA device, or None when there are some.
    pub fn why_none(&self) -> Option<String> {
        match self {
            Probe::NoDriver => Some("no NVIDIA driver (libcuda.so.1 / nvcuda.dll cannot be loaded)".into()),
            Probe::DriverError(e) => Some(format!("the NVIDIA driver is present but reports {e}")),
            Probe::Devices(d) if d.is_empty() => Some("the NVIDIA driver reports no GPU".into()),
            Probe::Devices(_) => None,
        }
    }
}

fn probe_devices() -> Result<Vec<CudaInfo>, String> {
    let n = CudaContext::device_count().map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for ordinal in 0..n.max(0) as usize {
        let ctx = CudaContext::new(ordinal).map_err(|e| format!("device {ordinal}: {e}"))?;
        let (free, total) = ctx.mem_get_info().map_err(|e| format!("device {ordinal}: {e}"))?;
        out.push(CudaInfo {
            ordinal,
            name: ctx.name().unwrap_or_else(|_| "unknown".into()),
            total_bytes: total as u64,
            free_bytes: free as u64,
            compute_capability: ctx.compute_capability().unwrap_or((0, 0)),
        });
    }
    Ok(out)
}

/// Looks for CUDA devices. Never panics: cudarc panics when a driver library lacks a symbol it needs, so
/// the probe runs under `catch_unwind` and such a driver counts as an error.
pub fn probe() -> Probe {
    // SAFETY: only tries to open the library by name.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Probe::NoDriver;
    }
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let result = catch_unwind(AssertUnwindSafe(probe_devices));
    std::panic::set_hook(hook);
    match result {
        Ok(Ok(devices)) => Probe::Devices(devices),
        Ok(Err(e)) => Probe::DriverError(e),
        Err(_) => Probe::DriverError("an incomplete driver library (a CUDA function is missing)".into()),
    }
}
