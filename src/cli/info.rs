//! `strata info`: what a model file holds, and the memory it needs at a context size.

use std::collections::BTreeMap;

use anyhow::Context;
use clap::Args;

use strata::gguf::GgufFile;
use strata::model::{kv, KvType, ModelConfig};

use super::{resolve_model, ModelArgs};

#[derive(Args, Debug)]
pub struct InfoArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Context size (tokens) for the memory estimate [default: the model's training context]
    #[arg(short = 'c', long = "max-context", visible_alias = "ctx-size", value_parser = clap::value_parser!(u32).range(1..))]
    pub ctx: Option<u32>,
    /// List every tensor
    #[arg(long = "tensors")]
    pub tensors: bool,
}

const MIB: f64 = (1u64 << 20) as f64;

/// Bytes of `t`'s repacked copy when the CPU would multiply it in the row-interleaved layout: a 2-D weight
/// matrix (`*.weight`, not a norm) of a packable type; the embedding table only when it is also the output
/// head (`tied`: the file has no `output.weight`).
fn packed_bytes(t: &strata::gguf::TensorInfo, tied: bool) -> Option<usize> {
    if t.dims.len() != 2 || !t.name.ends_with(".weight") || (t.name == "token_embd.weight" && !tied) {
        return None;
    }
    strata::quant::packed::PackedMatrix::bytes_for(t.ty, t.dims[1] as usize, t.dims[0] as usize)
}

pub fn main(a: InfoArgs) -> anyhow::Result<()> {
    let path = resolve_model(&a.model)?;
    let file = GgufFile::open(&path).with_context(|| format!("cannot read {}", path.display()))?;
    println!(
        "file: {} ({} bytes, GGUF v{}, alignment {})",
        path.display(),
        file.file_bytes(),
        file.version,
        file.alignment
    );
    println!("metadata ({} keys):", file.metadata.len());
    for (k, v) in &file.metadata {
        println!("  {k} = {}", v.display_short());
    }
    let mut by_type: BTreeMap<String, (usize, u64)> = BTreeMap::new();
    for t in &file.tensors {
        let e = by_type.entry(t.ty.name().to_owned()).or_default();
        e.0 += 1;
        e.1 += t.n_bytes;
    }
    let weight_bytes: u64 = file.tensors.iter().map(|t| t.n_bytes).sum();
    let params: u64 = file.tensors.iter().map(|t| t.n_elements()).sum();
    println!(
        "tensors: {} ({:.1} M parameters, {:.2} MiB)",
        file.tensors.len(),
        params as f64 / 1e6,
        weight_bytes as f64 / MIB
    );
    for (ty, (n, bytes)) in &by_type {
        println!("  {ty:>5}: {n:>4} tensors, {:.2} MiB", *bytes as f64 / MIB);
    }
    // The layout each weight matrix gets on the CPU (`quant::packed`): repacked at load, or the file's rows.
    let mut packed: BTreeMap<String, (usize, u64, u64)> = BTreeMap::new();
    let tied = file.tensor("output.weight").is_none();
    for t in &file.tensors {
        if let Some(bytes) = packed_bytes(t, tied) {
            let e = packed.entry(t.ty.name().to_owned()).or_default();
            e.0 += 1;
            e.1 += t.n_bytes;
            e.2 += bytes as u64;
        }
    }
    for (ty, (n, file_bytes, bytes)) in &packed {
        println!(
            "  {ty:>5}: {n} matrices repacked for the CPU at load (16-row interleaved): {:.2} MiB in RAM for the file's {:.2} MiB{}",
            *bytes as f64 / MIB,
            *file_bytes as f64 / MIB,
            if strata::model::repack_enabled() { "" } else { " (off: STRATA_LAYOUT=file)" }
        );
    }
    if a.tensors {
        for t in &file.tensors {
            let layout = if packed_bytes(t, tied).is_some() { "16-row interleaved" } else { "file rows" };
            println!("  {:<32} {:>5} {:<18} {:?}", t.name, t.ty.name(), layout, t.dims);
        }
    }
    println!(
        "sampling for fields a request does not send: {}",
        strata::sample::defaults::SamplingDefaults::of(&file).describe()
    );
    match ModelConfig::from_gguf(&file) {
        Ok(cfg) => {
            println!(
                "architecture: {} ({} layers, n_embd {}, {} heads / {} KV heads of {}, FFN {}, vocab {}, rope {:?} base {}, trained context {})",
                cfg.arch_name, cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.n_head_kv, cfg.head_dim, cfg.n_ff,
                cfg.n_vocab, cfg.rope_kind, cfg.rope_base, cfg.n_ctx_train
            );
            println!("family: {} ({})", cfg.family.name, cfg.family.features);
            if let Some(m) = cfg.moe {
                println!(
                    "experts: {} per layer, {} used per token, {} rows each (a softmax router, the picked weights \
                     {}), on the CPU",
                    m.n_expert,
                    m.n_used,
                    m.n_ff_exp,
                    if m.norm_weights { "renormalized" } else { "as they are" }
                );
            }
            if let Some(w) = cfg.swa_window {
                let swa = cfg.swa_layers.iter().filter(|&&s| s).count();
                println!(
                    "sliding window: {w} positions on {swa} of {} layers (RoPE base {} there), which keep only their \
                     window of KV (and a margin), on the CPU and on GPUs",
                    cfg.n_layer, cfg.rope_swa.base
                );
            }
            let ctx = a.ctx.map_or(cfg.n_ctx_train, |c| c as usize);
            // Scratch of one prompt batch of 512 tokens: the widest activations plus one logits row.
            let batch = 512usize;
            // (In f64: figures for a context of billions must not overflow.)
            let scratch = strata::model::placement::scratch_bytes(&cfg, batch, 1, true) as f64;
            println!("memory at context {ctx}:");
            // A sliding-window layer holds its window and a margin, in whole pages (`KvCache`).
            let kept = cfg.swa_window.map_or(ctx, |w| {
                ctx.min(((w + kv::SWA_MARGIN_TOKENS).div_ceil(kv::KV_PAGE_TOKENS) + 1) * kv::KV_PAGE_TOKENS)
            });
            let swa = cfg.swa_layers.iter().filter(|&&s| s).count();
            for ty in [KvType::F16, KvType::F32, KvType::Int8] {
                let row = (ty.row_bytes(cfg.kv_dim()) * 2) as f64;
                let kv = row * ((cfg.n_layer - swa) as f64 * ctx as f64 + swa as f64 * kept as f64);
                println!(
                    "  --kv {:<4}: weights {:.1} MiB + KV {:.1} MiB ({} bytes/token) + scratch {:.1} MiB = {:.1} MiB",
                    format!("{ty:?}").to_lowercase(),
                    weight_bytes as f64 / MIB,
                    kv / MIB,
                    ty.row_bytes(cfg.kv_dim()) * 2 * cfg.n_layer,
                    scratch / MIB,
                    (weight_bytes as f64 + kv + scratch) / MIB
                );
            }
        }
        Err(e) => println!("architecture: cannot run this model: {e}"),
    }
    Ok(())
}
