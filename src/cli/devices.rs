//! `strata devices`: the devices Strata can run on, with their free and total memory and the reserve each
//! GPU keeps. Without `--devices` it lists the host and the CUDA devices the driver reports (usable as
//! `cuda:N` in `--devices`), or why there are none (no driver, no GPU).

use anyhow::Context;
use clap::Args;

use strata::device::cuda::{self, Probe};
use strata::device::{mib, DeviceKind, DeviceSet};

#[derive(Args, Debug)]
pub struct DevicesArgs {
    /// Devices to list: cpu, cuda:N, cuda:N@MIB, sim:MIB, emu:MIB [default: the host and every CUDA device found]
    #[arg(long = "devices", value_name = "LIST")]
    pub devices: Option<String>,
    /// MiB each GPU keeps free
    #[arg(long = "vram-reserve-mib", value_name = "N", default_value_t = 0,
          value_parser = clap::value_parser!(u64).range(0..=1 << 24))]
    pub vram_reserve_mib: u64,
    /// Print one JSON object: {"devices": [...], "cuda_available"}
    #[arg(long = "json")]
    pub json: bool,
}

pub fn main(a: DevicesArgs) -> anyhow::Result<()> {
    let reserve_bytes = a
        .vram_reserve_mib
        .checked_mul(1 << 20)
        .with_context(|| format!("--vram-reserve-mib {} is too large", a.vram_reserve_mib))?;
    let set = DeviceSet::parse(a.devices.as_deref().unwrap_or("cpu"), reserve_bytes)?;
    let devices: Vec<_> = set
        .devices
        .iter()
        .map(|d| {
            let kind = match d.kind {
                DeviceKind::Cpu => "cpu",
                DeviceKind::Sim { .. } => "sim",
                DeviceKind::Cuda { .. } => "cuda",
                DeviceKind::Emu { .. } => "emu",
            };
            (d, kind, d.sample_free().ok())
        })
        .collect();
    // CUDA devices are probed (never a panic without a driver or a GPU) and listed.
    let probe = if a.devices.is_none() { Some(cuda::probe()) } else { None };
    let found: Vec<cuda::CudaInfo> = match &probe {
        Some(Probe::Devices(d)) => d.clone(),
        _ => Vec::new(),
    };
    let why_none = probe.as_ref().and_then(|p| p.why_none());
    if a.json {
        let list: Vec<serde_json::Value> = devices
            .iter()
            .map(|(d, kind, free)| {
                serde_json::json!({
                    "index": d.index,
                    "kind": kind,
                    "name": d.kind.to_string(),
                    "free_bytes": free,
                    "total_bytes": d.total_bytes(),
                    "reserve_bytes": d.reserve_bytes,
                })
            })
            .collect();
        println!(
            "{}",
            serde_json::json!({ "devices": list, "cuda_available": !found.is_empty(), "cuda_found": found, "cuda_none_why": why_none })
        );
    } else {
        for (d, kind, free) in &devices {
            println!(
                "{}  {kind:<4}  {:<12}  free {:>12}  total {:>12}  reserve {}",
                d.index,
                d.kind.to_string(),
                free.map_or("unknown".to_owned(), mib),
                mib(d.total_bytes()),
                mib(d.reserve_bytes)
            );
        }
        for c in &found {
            println!(
                "cuda:{}  {} (compute {}.{})  free {}  total {}",
                c.ordinal,
                c.name,
                c.compute_capability.0,
                c.compute_capability.1,
                mib(c.free_bytes),
                mib(c.total_bytes)
            );
        }
        if let Some(why) = why_none {
            println!("CUDA devices: none ({why})");
        }
    }
    Ok(())
}
