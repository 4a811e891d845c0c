//! `strata plan`: what a model would need on each device of a split, before anything is allocated.
//!
//! It reads the configuration and the weights index only (no weight is paged in, no device memory taken)
//! and prints, per stage, the layers, the weights, the KV cache at `--tokens` positions on the device and on
//! the host, the scratch and staging buffers, the device's sampled free memory, the reserve and the
//! headroom left (the figures are `strata::plan`'s), and for a mixture of experts each stage's weights by
//! class (shared, experts on the device, experts in host memory). With `--draft-model` the draft's stages
//! follow on its `--draft-devices`, and a device holding both models shows one headroom for the two. A configuration
//! that cannot load fails with the library's error (device, need, shortfall).

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context};
use clap::Args;

use strata::device::mib;
use strata::gguf::GgufFile;
use strata::model::kv::KV_PAGE_TOKENS;
use strata::model::LoadOptions;
use strata::plan::draft::{check_draft_vocab, DraftInput};
use strata::plan::{self, Plan, PlanDevice, PlanRow};

use super::{apply_faults, resolve_model, EngineArgs, ModelArgs, SpecKind};

#[derive(Args, Debug)]
pub struct PlanArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Positions a sequence holds for the KV figures [default: the context, -c or the model's]
    #[arg(long = "tokens", value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub tokens: Option<u32>,
    /// Live sequences, as `strata serve --parallel N` runs them: the KV figures count N sequences of
    /// --tokens positions each
    #[arg(long = "parallel", visible_alias = "np", value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub parallel: u32,
    /// Print one JSON object: {"stages": [...], "draft": {"model", "stages": [...]}, "devices": [...], "tokens", "sequences"}
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
    let draft = draft_input(&a.engine, &file, &opts, &path)?;
    let sequences = a.parallel as usize;
    let p =
        plan::plan_with_draft(&file, &opts, a.tokens.map(|t| t as usize), sequences, draft.as_ref().map(|(_, d)| d))
            .with_context(|| format!("cannot plan model {}", path.display()))?;
    let draft_path = draft.as_ref().map(|(p, _)| p.as_path());
    if a.json {
        print_json(&p, draft_path, sequences);
    } else {
        let window = p.kv_resident.map_or("all".to_owned(), |r| format!("{r} positions"));
        let times = if sequences > 1 { format!(" x {sequences} sequences") } else { String::new() };
        println!(
            "{}: {} layers, KV {} at {} of {} positions{times} (resident per layer: {window})",
            path.display(),
            p.rows.last().map_or(0, |r| r.layers.1),
            p.kv,
            p.tokens,
            p.max_context
        );
        print_table(&p.rows);
        print_experts(&file, &p.rows);
        if let (Some(d), Some(dpath)) = (&p.draft, draft_path) {
            let on: Vec<String> = d.rows.iter().map(|r| r.device.clone()).collect();
            println!("draft {}: {} layers on {}", dpath.display(), d.layers, on.join(", "));
            print_table(&d.rows);
            print_shared(&p);
        }
    }
    // A configuration that cannot load is an error; KV that outgrows a device is only a warning (pages
    // move to the host, the request goes on).
    if let Some(problem) = &p.problem {
        bail!("{problem}");
    }
    for d in &p.devices {
        warn_kv_spill(&p, d, sequences);
    }
    Ok(())
}

/// The draft model `--draft-model` names, opened, its vocabulary checked against the model's, on
/// `--draft-devices`; None without speculative decoding or with `--spec ngram` (no second model).
fn draft_input(
    engine: &EngineArgs,
    file: &Arc<GgufFile>,
    opts: &LoadOptions,
    path: &std::path::Path,
) -> anyhow::Result<Option<(PathBuf, DraftInput)>> {
    let Some((SpecKind::Draft, _)) = engine.spec.config()? else { return Ok(None) };
    let dpath = engine.spec.draft_model.clone().context("no --draft-model")?;
    let devices = engine.spec.draft_devices(&opts.devices)?;
    let dfile = GgufFile::open(&dpath).with_context(|| format!("cannot read draft model {}", dpath.display()))?;
    check_draft_vocab(file, &dfile)
        .with_context(|| format!("draft model {} cannot draft for {}", dpath.display(), path.display()))?;
    Ok(Some((dpath, DraftInput { file: Arc::new(dfile), devices })))
}

/// For a mixture of experts, the weights of each stage by class: the shared ones (attention, norms, the
/// head) and the experts (router and experts) on its device, and its experts kept in host memory
/// (`--experts`), with the host's total.
fn print_experts(file: &GgufFile, rows: &[PlanRow]) {
    let Ok(cfg) = strata::model::ModelConfig::from_gguf(file) else { return };
    let Some(m) = cfg.moe else { return };
    println!("weights by class ({} experts per layer, {} read per token):", m.n_expert, m.n_used);
    let header = ["device", "layers", "shared", "experts", "experts in host memory"];
    let mut table: Vec<Vec<String>> = vec![header.iter().map(|h| h.to_string()).collect()];
    for r in rows {
        table.push(vec![
            r.device.clone(),
            format!("{}..{}", r.layers.0, r.layers.1),
            mib(r.weights_bytes - r.experts_bytes),
            mib(r.experts_bytes),
            mib(r.host_experts_bytes),
        ]);
    }
    let host: u64 = rows.iter().map(|r| r.host_experts_bytes).sum();
    table.push(vec!["host".into(), String::new(), String::new(), String::new(), mib(host)]);
    print_aligned(&table, "  ");
}

/// One line per device holding stages of both models: their total against what is free, one headroom.
fn print_shared(p: &Plan) {
    for d in p.devices.iter().filter(|d| d.draft_bytes > 0 && d.draft_bytes < d.total_bytes) {
        println!(
            "device {} holds both models: {} (the draft's {}) of {} free, reserve {}, headroom {}",
            d.device,
            mib(d.total_bytes),
            mib(d.draft_bytes),
            d.free_bytes.map_or("unknown".to_owned(), mib),
            mib(d.reserve_bytes),
            d.headroom_bytes.map_or("unknown".to_owned(), mib_i),
        );
    }
}

/// Prints `table` (its header first) in columns, after `indent`: the device and layers columns to the
/// left, the figures to the right.
fn print_aligned(table: &[Vec<String>], indent: &str) {
    let columns = table.first().map_or(0, Vec::len);
    let widths: Vec<usize> = (0..columns).map(|c| table.iter().map(|row| row[c].len()).max().unwrap_or(0)).collect();
    for row in table {
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
        println!("{indent}{}", cells.join("  ").trim_end());
    }
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
    print_aligned(&table, "");
    let host_kv: u64 = rows.iter().map(|r| r.kv_host_bytes).sum();
    if host_kv > 0 {
        println!("host: {} of KV out of the resident window", mib(host_kv));
    }
}

fn print_json(p: &Plan, draft_path: Option<&std::path::Path>, sequences: usize) {
    let stages_of = |rows: &[PlanRow]| -> Vec<serde_json::Value> {
        rows.iter()
            .map(|r| {
                serde_json::json!({
                    "experts_bytes": r.experts_bytes,
                    "host_experts_bytes": r.host_experts_bytes,
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
            .collect()
    };
    let devices: Vec<serde_json::Value> = p
        .devices
        .iter()
        .map(|d| {
            serde_json::json!({
                "device": d.device,
                "index": d.index,
                "total_bytes": d.total_bytes,
                "draft_bytes": d.draft_bytes,
                "free_bytes": d.free_bytes,
                "reserve_bytes": d.reserve_bytes,
                "headroom_bytes": d.headroom_bytes,
                "fits": d.fits,
            })
        })
        .collect();
    let mut out = serde_json::json!({
        "stages": stages_of(&p.rows),
        "devices": devices,
        "tokens": p.tokens,
        "sequences": sequences,
    });
    if let Some(d) = &p.draft {
        out["draft"] = serde_json::json!({
            "model": draft_path.map(|p| p.display().to_string()),
            "layers": d.layers,
            "stages": stages_of(&d.rows),
        });
    }
    println!("{out}");
}

/// Warns (stderr) when the KV of `sequences` sequences at `tokens` positions of the stages on a device (both
/// models' with a draft there) does not fit the device above the reserve once the loads are in place, with
/// about how many positions of each sequence stay resident before pages go to the host.
fn warn_kv_spill(p: &Plan, d: &PlanDevice, sequences: usize) {
    let (Some(free), Some(headroom)) = (d.free_bytes, d.headroom_bytes) else { return };
    if headroom >= 0 || d.host || d.kv_bytes_per_token == 0 {
        return;
    }
    let tokens = p.tokens;
    let room = free.saturating_sub(d.reserve_bytes).saturating_sub(d.load_bytes);
    let pages = room / (KV_PAGE_TOKENS as u64 * d.kv_bytes_per_token);
    let resident = (pages as usize / sequences * KV_PAGE_TOKENS).min(tokens);
    let layers = |rows: &[PlanRow]| rows.iter().find(|r| r.index == d.index).map(|r| (r.layers.0, r.layers.1));
    let whose = match (layers(&p.rows), p.draft.as_ref().and_then(|dr| layers(&dr.rows))) {
        (Some((a, b)), Some((c, e))) => format!("layers {a}..{b} and of the draft model's layers {c}..{e}"),
        (Some((a, b)), None) => format!("layers {a}..{b}"),
        (None, Some((c, e))) => format!("the draft model's layers {c}..{e}"),
        (None, None) => return,
    };
    eprintln!(
        "strata: warning: device {}: KV of {whose} at {tokens} positions{} needs {} on the device but {} fits \
         above the reserve: about {resident} positions{} stay resident, older KV goes to the host",
        d.device,
        if sequences > 1 { format!(" x {sequences} sequences") } else { String::new() },
        mib(d.kv_device_bytes),
        mib(room),
        if sequences > 1 { " per sequence" } else { "" },
    );
}
