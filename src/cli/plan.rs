//! `strata plan`: what a model would need on each device of a split, before anything is allocated.
//!
//! It reads the configuration and the weights index only (no weight is paged in, no device memory taken)
//! and prints, per stage, the layers, the weights, the KV cache at `--tokens` positions on the device and on
//! the host, the scratch and staging buffers, the device's sampled free memory, the reserve and the
//! headroom left. The numbers are the ones the loader allocates, so what it prints is what `run` will hold.
//! A configuration that cannot load fails with the library's error (device, need, shortfall).

use std::sync::Arc;

use anyhow::{bail, Context};
use clap::Args;

use strata::device::mib;
use strata::gguf::GgufFile;
use strata::model::kv::KV_PAGE_TOKENS;
use strata::model::Model;
use strata::split::{self, StagePlan};

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

/// One stage's figures at `tokens` positions.
struct Row<'a> {
    stage: &'a StagePlan,
    kv_device_bytes: u64,
    kv_host_bytes: u64,
    /// Load (weights, scratch, staging) plus the KV on the device.
    total_bytes: u64,
    /// The device's sampled free memory (None: the sample failed).
    free_bytes: Option<u64>,
    /// Free minus reserve minus total; negative when it does not fit.
    headroom_bytes: Option<i64>,
}

pub fn main(a: PlanArgs) -> anyhow::Result<()> {
    let opts = a.engine.load_options()?;
    // Faults now stand for memory other processes hold (nothing is loaded, so "after loading" is now);
    // those with @tokens never fire here.
    let faults = a.engine.placement.faults(&opts.devices)?;
    apply_faults(&opts.devices, &faults)?;
    let path = resolve_model(&a.model)?;
    let file = Arc::new(GgufFile::open(&path).with_context(|| format!("cannot read model {}", path.display()))?);
    let (cfg, stages) = Model::plan(&file, &opts).with_context(|| format!("cannot plan model {}", path.display()))?;
    let max_context = opts.max_context.unwrap_or(cfg.n_ctx_train);
    let tokens = a.tokens.map_or(max_context, |t| t as usize);
    if tokens > max_context {
        bail!("--tokens {tokens} is more than the context of {max_context} positions (-c)");
    }
    let resident = opts.kv_resident;
    let rows: Vec<Row> = stages
        .iter()
        .map(|s| {
            let kv_device_bytes = s.kv_device_bytes(tokens, resident);
            let total_bytes = s.load_bytes() + kv_device_bytes;
            let free_bytes = s.device.sample_free().ok();
            let headroom_bytes = free_bytes.map(|f| signed(f) - signed(s.device.reserve_bytes) - signed(total_bytes));
            Row {
                stage: s,
                kv_device_bytes,
                kv_host_bytes: s.kv_host_bytes(tokens, resident),
                total_bytes,
                free_bytes,
                headroom_bytes,
            }
        })
        .collect();

    if a.json {
        print_json(&rows, tokens);
    } else {
        let kv = format!("{:?}", opts.kv_type).to_lowercase();
        let window = resident.map_or("all".to_owned(), |r| format!("{r} positions"));
        println!(
            "{}: {} layers, KV {kv} at {tokens} of {max_context} positions (resident per layer: {window})",
            path.display(),
            cfg.n_layer
        );
        print_table(&rows);
    }
    // A configuration that cannot load is an error; KV that outgrows a device is only a warning (pages
    // move to the host, the request goes on).
    split::check_fits(&stages)?;
    for r in &rows {
        warn_kv_spill(r, tokens);
    }
    check_host(&rows, &opts.devices.host, tokens)
}

/// The host must hold what lands on it: the KV, scratch and staging of its own stages, the KV of GPU stages
/// out of their resident window, and the KV a GPU has no room for (it moves to the host). Weights mapped from
/// the file are left out: the OS pages them. Refused (exit 1) with the shortfall when it does not fit.
fn check_host(rows: &[Row], host: &strata::device::Device, tokens: usize) -> anyhow::Result<()> {
    let mut kv_bytes = 0u64;
    let mut buffers_bytes = 0u64;
    for r in rows {
        let s = r.stage;
        kv_bytes = kv_bytes.saturating_add(r.kv_host_bytes);
        if s.device.is_host() {
            kv_bytes = kv_bytes.saturating_add(r.kv_device_bytes);
            buffers_bytes = buffers_bytes.saturating_add(s.scratch_bytes + s.staging_bytes);
        } else if let (Some(free), Some(headroom)) = (r.free_bytes, r.headroom_bytes) {
            if headroom < 0 {
                // The part of the device's KV above its room spills to the host.
                let room = free.saturating_sub(s.device.reserve_bytes).saturating_sub(s.load_bytes());
                kv_bytes = kv_bytes.saturating_add(r.kv_device_bytes.saturating_sub(room));
            }
        }
    }
    let need = kv_bytes.saturating_add(buffers_bytes);
    // What the host ledger hands out: available memory less the margin it keeps for the process.
    let available = host.sample_free()?.saturating_sub(strata::device::HOST_MARGIN_BYTES);
    if need > available {
        bail!(
            "the host needs {} at {tokens} positions (KV {}, scratch and staging {}) but has {} available: short by \
             {}; lower -c or --tokens, or use --kv int8",
            mib(need),
            mib(kv_bytes),
            mib(buffers_bytes),
            mib(available),
            mib(need - available)
        );
    }
    Ok(())
}

/// Bytes as a signed number (no device holds 8 EiB).
fn signed(bytes: u64) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}

fn mib_i(bytes: i64) -> String {
    let m = bytes as f64 / (1u64 << 20) as f64;
    format!("{m:.1} MiB")
}

fn print_table(rows: &[Row]) {
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
        let s = r.stage;
        table.push(vec![
            s.device.name(),
            format!("{}..{}", s.layers.start, s.layers.end),
            mib(s.weights_bytes),
            format!("{} B", s.kv_bytes_per_token),
            mib(r.kv_device_bytes),
            mib(r.kv_host_bytes),
            mib(s.scratch_bytes),
            mib(s.staging_bytes),
            mib(r.total_bytes),
            r.free_bytes.map_or("unknown".to_owned(), mib),
            mib(s.device.reserve_bytes),
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

fn print_json(rows: &[Row], tokens: usize) {
    let stages: Vec<serde_json::Value> = rows
        .iter()
        .map(|r| {
            let s = r.stage;
            serde_json::json!({
                "device": s.device.name(),
                "layers": [s.layers.start, s.layers.end],
                "weights_bytes": s.weights_bytes,
                "kv_bytes_per_token": s.kv_bytes_per_token,
                "kv_device_bytes": r.kv_device_bytes,
                "kv_host_bytes": r.kv_host_bytes,
                "scratch_bytes": s.scratch_bytes,
                "staging_bytes": s.staging_bytes,
                "total_bytes": r.total_bytes,
                "free_bytes": r.free_bytes,
                "reserve_bytes": s.device.reserve_bytes,
                "headroom_bytes": r.headroom_bytes,
            })
        })
        .collect();
    println!("{}", serde_json::json!({ "stages": stages, "tokens": tokens }));
}

/// Warns (stderr) when a stage's KV at `tokens` positions does not fit its device above the reserve once
/// the load is in place, with about how many positions stay resident before pages go to the host.
fn warn_kv_spill(r: &Row, tokens: usize) {
    let s = r.stage;
    let (Some(free), Some(headroom)) = (r.free_bytes, r.headroom_bytes) else { return };
    if headroom >= 0 || s.device.is_host() || s.kv_bytes_per_token == 0 {
        return;
    }
    let room = free.saturating_sub(s.device.reserve_bytes).saturating_sub(s.load_bytes());
    let pages = room / (KV_PAGE_TOKENS as u64 * s.kv_bytes_per_token);
    let resident = (pages as usize * KV_PAGE_TOKENS).min(tokens);
    eprintln!(
        "strata: warning: device {}: KV of layers {}..{} at {tokens} positions needs {} on the device but {} fits \
         above the reserve: about {resident} positions stay resident, older KV goes to the host",
        s.device.name(),
        s.layers.start,
        s.layers.end,
        mib(r.kv_device_bytes),
        mib(room),
    );
}
