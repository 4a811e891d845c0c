//! `strata perplexity`: perplexity of a text by llama.cpp's procedure, so figures compare directly.
//!
//! The text is tokenized (the model's BOS rule, special tokens as text) and cut into chunks of `-c` tokens;
//! each chunk is read from an empty cache, and tokens `c/2 + 1 .. c` are scored with the logits of the
//! positions before them. PPL = exp(mean negative log-likelihood).

use std::io::Write;

use anyhow::bail;
use clap::Args;

use strata::model::KvType;

use super::{load_placed, ModelArgs, PlacementArgs};

#[derive(Args, Debug)]
pub struct PerplexityArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The text file to score (UTF-8, at most 256 MiB)
    #[arg(short = 'f', long = "file")]
    pub file: std::path::PathBuf,
    /// Tokens per chunk
    #[arg(short = 'c', long = "ctx-size", default_value_t = 512, value_parser = clap::value_parser!(u32).range(4..=1_048_576))]
    pub ctx: u32,
    /// Score at most this many chunks (default: all)
    #[arg(long = "chunks", value_parser = clap::value_parser!(u64).range(1..))]
    pub chunks: Option<u64>,
    /// Worker threads [default: the number of CPUs]
    #[arg(short = 't', long = "threads", value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub threads: Option<u16>,
    /// KV cache element type: f16, f32 (CPU and sim devices only) or int8
    #[arg(long = "kv", default_value = "f16", value_parser = |s: &str| s.parse::<KvType>())]
    pub kv: KvType,
    /// Tokens per prompt-processing batch
    #[arg(short = 'b', long = "batch-size", default_value_t = 512, value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub batch: u32,
    #[command(flatten)]
    pub placement: PlacementArgs,
}

pub fn main(a: PerplexityArgs) -> anyhow::Result<()> {
    let text = super::input::read_capped(&a.file, super::input::PERPLEXITY_TEXT_CAP_BYTES, "text file")?;
    let text = String::from_utf8_lossy(&text);
    let opts = a.placement.load_options(a.kv, a.batch as usize, Some(a.ctx as usize))?;
    let loaded = load_placed(&a.model, &a.placement, opts)?;
    let tok = &loaded.tokenizer;
    let model = &loaded.model;
    let pool = super::pool_for(a.threads);

    let mut tokens = Vec::new();
    let bos = if tok.add_bos_token() { tok.bos_id() } else { None };
    tokens.extend(bos);
    tokens.extend(tok.encode(&text, false));
    let n_ctx = a.ctx as usize;
    let mut n_chunk = tokens.len() / n_ctx;
    if let Some(c) = a.chunks {
        n_chunk = n_chunk.min(usize::try_from(c).unwrap_or(usize::MAX));
    }
    if n_chunk == 0 {
        bail!("{} has {} tokens, fewer than one chunk of -c {n_ctx}", a.file.display(), tokens.len());
    }
    eprintln!("strata perplexity: {} tokens, {n_chunk} chunks of {n_ctx}", tokens.len());

    let first = n_ctx / 2;
    let want: Vec<usize> = (first..n_ctx - 1).collect();
    let mut nll = 0f64;
    let mut nll2 = 0f64;
    let mut count = 0usize;
    let t0 = std::time::Instant::now();
    let mut kv = model.new_kv(a.kv, n_ctx)?;
    for c in 0..n_chunk {
        let mut chunk = tokens[c * n_ctx..(c + 1) * n_ctx].to_vec();
        if let Some(b) = bos {
            chunk[0] = b;
        }
        kv.truncate(0);
        // Read the chunk in batches, scoring each batch's positions as its logits come back.
        let batch = a.batch as usize;
        for start in (0..n_ctx).step_by(batch) {
            let end = (start + batch).min(n_ctx);
            let scored: Vec<usize> = want.iter().copied().filter(|&p| p >= start && p < end).collect();
            let w: Vec<usize> = scored.iter().map(|&p| p - start).collect();
            let logits = model.forward(&pool, &mut kv, &chunk[start..end], &w)?;
            for (i, &p) in scored.iter().enumerate() {
                let v = -log_softmax_at(logits.row(i), chunk[p + 1] as usize);
                nll += v;
                nll2 += v * v;
                count += 1;
            }
        }
        print!("[{}]{:.4},", c + 1, (nll / count as f64).exp());
        let _ = std::io::stdout().flush();
    }
    println!();
    let mean = nll / count as f64;
    let var = (nll2 / count as f64 - mean * mean).max(0.0);
    let err = (var / (count as f64 - 1.0).max(1.0)).sqrt();
    let ppl = mean.exp();
    eprintln!(
        "strata perplexity: {} chunks in {:.1} s ({:.1} tok/s)",
        n_chunk,
        t0.elapsed().as_secs_f64(),
        (n_chunk * n_ctx) as f64 / t0.elapsed().as_secs_f64()
    );
    println!("Final estimate: PPL = {ppl:.4} +/- {:.5}", ppl * err);
    println!("PPL = {ppl:.4}");
    Ok(())
}

/// log softmax(row)[i], with the sum of exponentials accumulated in f64.
fn log_softmax_at(row: &[f32], i: usize) -> f64 {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = row.iter().map(|&l| ((l - max).exp()) as f64).sum();
    (row[i] - max) as f64 - sum.ln()
}
