//! `strata synth`: writes a llama-shaped GGUF model with seeded random weights, for speed and memory tests
//! where a real model of that size is not at hand (the GPU checks copy only the binary and write their
//! ~1B-parameter model on the spot). The same seed and shape always give the same file.

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Args;

use strata::model::synthetic::{SyntheticSpec, SyntheticVocab};
use strata::quant::GgmlType;

#[derive(Args, Debug)]
pub struct SynthArgs {
    /// Where to write the model
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: PathBuf,
    /// A shape: tiny (2 layers, n_embd 256), 1b (22 layers, n_embd 2048, FFN 5632: about 1.0B parameters) or
    /// moe (Mixtral's layout scaled to a small machine: 8 layers, n_embd 1024, 32 experts of 512 rows, 4 used
    /// per token: 0.42B parameters, 0.07B active) or gpt-oss (gpt-oss-20b's layout scaled the same way:
    /// attention sinks, YaRN, a 128-token window on the even layers, biases, 32 MXFP4 experts of 512 rows, 4
    /// used, the harmony chat format; --type sets the other matrices)
    #[arg(long = "preset", default_value = "tiny")]
    pub preset: String,
    /// Override the preset's layer count
    #[arg(long = "layers")]
    pub layers: Option<usize>,
    /// Matrix type: q4_0, q4_1, q5_0, q5_1, q8_0, q4_k, q5_k, q6_k, f16, f32
    #[arg(long = "type", default_value = "q4_1")]
    pub ty: String,
    /// Seed of the random weights
    #[arg(long = "seed", default_value_t = 1)]
    pub seed: u64,
}

pub fn main(a: SynthArgs) -> anyhow::Result<()> {
    let ty = GgmlType::WEIGHT_TYPES
        .iter()
        .copied()
        .find(|t| t.name().eq_ignore_ascii_case(&a.ty))
        .with_context(|| format!("unknown --type {:?}", a.ty))?;
    let mut spec = match a.preset.as_str() {
        "tiny" => SyntheticSpec::default(),
        "1b" => SyntheticSpec {
            n_layer: 22,
            n_embd: 2048,
            n_head: 32,
            n_head_kv: 4,
            n_ff: 5632,
            n_ctx_train: 4096,
            ..SyntheticSpec::default()
        },
        "moe" => SyntheticSpec {
            n_layer: 8,
            n_embd: 1024,
            n_head: 16,
            n_head_kv: 4,
            n_ff: 512,
            n_ctx_train: 4096,
            experts: Some((32, 4)),
            ..SyntheticSpec::default()
        },
        "gpt-oss" => SyntheticSpec {
            arch: "gpt-oss",
            n_layer: 8,
            n_embd: 1024,
            n_head: 16,
            n_head_kv: 4,
            n_ff: 512,
            n_ctx_train: 8192,
            experts: Some((32, 4)),
            expert_type: Some(GgmlType::MXFP4),
            output_type: Some(GgmlType::Q8_0),
            vocab: SyntheticVocab::Harmony,
            ..SyntheticSpec::default()
        },
        other => bail!("unknown --preset {other:?} (tiny, 1b, moe or gpt-oss)"),
    };
    if let Some(l) = a.layers {
        if l == 0 || l > 512 {
            bail!("--layers must be 1 to 512, got {l}");
        }
        spec.n_layer = l;
    }
    if spec.n_embd % ty.block_len() != 0 || spec.n_ff % ty.block_len() != 0 {
        bail!("--type {} needs rows that are whole blocks of {} values", ty.name(), ty.block_len());
    }
    spec.matrix_types = vec![ty];
    spec.seed = a.seed;
    let (d, ff, l) = (spec.n_embd as u64, spec.n_ff as u64, spec.n_layer as u64);
    let kv = d / spec.n_head as u64 * spec.n_head_kv as u64;
    let n_expert = spec.experts.map_or(1, |(n, _)| n as u64);
    let params = l * (2 * d * d + 2 * d * kv + 3 * d * ff * n_expert);
    // The image is built in memory: refuse what this machine could not hold rather than be killed.
    let image_bytes = params as f64 * ty.block_bytes() as f64 / ty.block_len() as f64;
    let available = strata::device::Device::cpu(0).sample_free().unwrap_or(u64::MAX) as f64;
    if image_bytes * 2.5 > available {
        bail!(
            "a {:.1} GB model needs about {:.1} GB of memory to write, and {:.1} GB is available",
            image_bytes / 1e9,
            image_bytes * 2.5 / 1e9,
            available / 1e9
        );
    }
    eprintln!(
        "strata synth: {} layers, n_embd {d}, FFN {ff}, {} matrices: {:.2}B parameters",
        l,
        ty.name(),
        params as f64 / 1e9
    );
    let bytes = spec.to_gguf();
    std::fs::write(&a.output, &bytes).with_context(|| format!("cannot write {}", a.output.display()))?;
    eprintln!("strata synth: wrote {} ({} bytes)", a.output.display(), bytes.len());
    Ok(())
}
