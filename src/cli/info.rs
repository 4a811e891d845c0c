//! `strata info`: what a model file holds, and the memory it needs at a context size.

use std::collections::BTreeMap;

use anyhow::Context;
use clap::Args;

use strata::gguf::GgufFile;
use strata::model::{KvType, ModelConfig};

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
    if a.tensors {
        for t in &file.tensors {
            println!("  {:<32} {:>5} {:?}", t.name, t.ty.name(), t.dims);
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
            let ctx = a.ctx.map_or(cfg.n_ctx_train, |c| c as usize);
            // Scratch of one prompt batch of 512 tokens: the widest activations plus one logits row.
            let batch = 512usize;
            // (In f64: figures for a context of billions must not overflow.)
            let widths = (4 * cfg.n_embd + 3 * cfg.q_dim() + 2 * cfg.kv_dim() + 2 * cfg.n_ff) as f64;
            let scratch = batch as f64 * widths * 4.0 + cfg.n_vocab as f64 * 4.0;
            println!("memory at context {ctx}:");
            for ty in [KvType::F16, KvType::Int8] {
                let kv = (ty.row_bytes(cfg.kv_dim()) * 2 * cfg.n_layer) as f64 * ctx as f64;
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
