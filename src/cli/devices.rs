//! `strata devices`: the devices Strata can run on, with their free and total memory and the reserve each
//! GPU keeps. Without `--devices` it lists the host and says whether CUDA devices exist in this build.

use anyhow::Context;
use clap::Args;

use strata::device::{mib, DeviceKind, DeviceSet};

#[derive(Args, Debug)]
pub struct DevicesArgs {
    /// Devices to list: cpu, sim:MIB, cuda:N [default: every device of this build]
    #[arg(long = "devices", value_name = "LIST")]
    pub devices: Option<String>,
    /// MiB each GPU keeps free
    #[arg(long = "vram-reserve-mib", value_name = "N", default_value_t = 0)]
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
            };
            (d, kind, d.sample_free().ok())
        })
        .collect();
    // This build has no CUDA backend (DeviceSet::parse refuses cuda:N), so the default list is the host.
    let cuda_note = "CUDA devices: not available in this build (no CUDA backend; use cpu or sim:MIB)";
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
        println!("{}", serde_json::json!({ "devices": list, "cuda_available": false }));
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
        if a.devices.is_none() {
            println!("{cuda_note}");
        }
    }
    Ok(())
}
