//! `strata plan`: what a model would need on each device of a split, before anything is allocated.
//!
//! It reads the configuration and the weights index only (no weight is paged in, no device memory taken)
//! and prints, per stage, the layers, the weights, the KV cache at `--tokens` positions on the device and on
//! the host, the scratch and staging buffers, the device's sampled free memory, the reserve and the
//! headroom left (the figures are `strata::plan`'s). A configuration that cannot load fails with the
//! library's error (device, need, shortfall).

use std::sync::Arc;

use anyhow::{bail, Context};
use clap::Args;

use strata::device::mib;
use strata::gguf::GgufFile;
use strata::model::kv::KV_PAGE_TOKENS;
use strata::plan::{self, Plan, PlanRow};

use super::{apply_faults, resolve_model, EngineArgs, ModelArgs};

#[derive(Args, Debug)]
pub struct PlanArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Positions a sequence holds for the KV figures [default: the context, -c or the model's]
    #[arg(long = "tokens", value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub tokens: Option<u32>,
    /// Print one JSON object: {"stages": [...], "tokens"}
    #[arg(long = "json")]
    pub json: bool,
    #[command(flatten)]
    pub engine: EngineArgs,
}

pub fn main(a: PlanArgs) -> anyhow::Result<()> {
    let opts = a.engine.load_options()?;
    // Faults now stand for memory other processes hold (nothing is loaded, so "after loading" is now);
    // those with @tokens never fire here.
    let faults = a.engine.placement.faults(&opts.devices)?;
    apply_faults(&opts.devices, &faults)?;
    let path = resolve_model(&a.model)?;
    let file = Arc::new(GgufFile::open(&path).with_context(|| format!("cannot read model {}", path.display()))?);
    let p = plan::plan(&file, &opts, a.tokens.map(|t| t as usize))
        .with_context(|| format!("cannot plan model {}", path.display()))?;
    if a.json {
        print_json(&p);
    } else {
        let window = p.kv_resident.map_or("all".to_owned(), |r| format!("{r} positions"));
        println!(
            "{}: {} layers, KV {} at {} of {} positions (resident per layer: {window})",
            path.display(),
            p.rows.last().map_or(0, |r| r.layers.1),
            p.kv,
            p.tokens,
            p.max_context
        );
        print_table(&p.rows);
    }
    // A configuration that cannot load is an error; KV that outgrows a device is only a warning (pages
    // move to the host, the request goes on).
    if let Some(problem) = &p.problem {
        bail!("{problem}");
    }
    for r in &p.rows {
        warn_kv_spill(r, p.tokens);
    }
    Ok(())
}

fn mib_i(bytes: i64) -> String {
    let m = bytes as f64 / (1u64 << 20) as f64;
    format!("{m:.1} MiB")
}

fn print_table(rows: &[PlanRow]) {
    let header = [
        "device",
        "layers",
        "weights",
        "KV/token",
        "KV device",
        "KV host",
        "scratch",
        "staging",
        "total",
        "free",
        "reserve",
        "headroom",
    ];
    let mut table: Vec<Vec<String>> = vec![header.iter().map(|h| h.to_string()).collect()];
    for r in rows {
        table.push(vec![
            r.device.clone(),
            format!("{}..{}", r.layers.0, r.layers.1),
            mib(r.weights_bytes),
            format!("{} B", r.kv_bytes_per_token),
            mib(r.kv_device_bytes),
            mib(r.kv_host_bytes),
            mib(r.scratch_bytes),
            mib(r.staging_bytes),
            mib(r.total_bytes),
            r.free_bytes.map_or("unknown".to_owned(), mib),
            mib(r.reserve_bytes),
            r.headroom_bytes.map_or("unknown".to_owned(), mib_i),
        ]);
    }
    let widths: Vec<usize> =
        (0..header.len()).map(|c| table.iter().map(|row| row[c].len()).max().unwrap_or(0)).collect();
    for row in &table {
        let cells: Vec<String> = row
            .iter()
            .enumerate()
            .map(
                |(c, cell)| {
                    if c < 2 {
                        format!("{cell:<w$}", w = widths[c])
                    } else {
                        format!("{cell:>w$}", w = widths[c])
                    }
                },
            )
            .collect();
        println!("{}", cells.join("  ").trim_end());
    }
    let host_kv: u64 = rows.iter().map(|r| r.kv_host_bytes).sum();
    if host_kv > 0 {
        println!("host: {} of KV out of the resident window", mib(host_kv));
    }
}

fn print_json(p: &Plan) {
    let stages: Vec<serde_json::Value> = p
        .rows
        .iter()
        .map(|r| {
            serde_json::json!({
                "device": r.device,
                "layers": [r.layers.0, r.layers.1],
                "weights_bytes": r.weights_bytes,
                "kv_bytes_per_token": r.kv_bytes_per_token,
                "kv_device_bytes": r.kv_device_bytes,
                "kv_host_bytes": r.kv_host_bytes,
                "scratch_bytes": r.scratch_bytes,
                "staging_bytes": r.staging_bytes,
                "total_bytes": r.total_bytes,
                "free_bytes": r.free_bytes,
                "reserve_bytes": r.reserve_bytes,
                "headroom_bytes": r.headroom_bytes,
            })
        })
        .collect();
    println!("{}", serde_json::json!({ "stages": stages, "tokens": p.tokens }));
}

/// Warns (stderr) when a stage's KV at `tokens` positions does not fit its device above the reserve once
/// the load is in place, with about how many positions stay resident before pages go to the host.
fn warn_kv_spill(r: &PlanRow, tokens: usize) {
    let (Some(free), Some(headroom)) = (r.free_bytes, r.headroom_bytes) else { return };
    if headroom >= 0 || r.host || r.kv_bytes_per_token == 0 {
        return;
    }
    let room = free.saturating_sub(r.reserve_bytes).saturating_sub(r.load_bytes());
    let pages = room / (KV_PAGE_TOKENS as u64 * r.kv_bytes_per_token);
    let resident = (pages as usize * KV_PAGE_TOKENS).min(tokens);
    eprintln!(
        "strata: warning: device {}: KV of layers {}..{} at {tokens} positions needs {} on the device but {} fits \
         above the reserve: about {resident} positions stay resident, older KV goes to the host",
        r.device,
        r.layers.0,
        r.layers.1,
        mib(r.kv_device_bytes),
        mib(room),
    );
}
