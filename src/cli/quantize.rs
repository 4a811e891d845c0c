//! `strata quantize IN OUT --type T`: rewrites a GGUF model with its weight matrices in another type, as
//! llama.cpp's `llama-quantize` does. It owns the choice of each tensor's type and the streaming, atomic
//! write of the new file; the block formats are `quant`'s and the file layout is `gguf`'s. It never
//! modifies IN and never leaves a partial OUT behind.
//!
//! Which tensors change (llama-quantize's rules):
//! - Weight matrices (names ending in `weight`, two or more dimensions) take the target type. `token_embd`
//!   and `output` do too: this is llama-quantize's `--pure`. Its default of q6_K for `output.weight` (or
//!   for the embedding when the head is tied to it) under the 4-bit and K-quant types is not applied, so a
//!   q4_K file is all q4_K and says `general.file_type` = MOSTLY_Q4_K_S (14).
//! - `q4_K_M` and `q5_K_M` are llama-quantize's mixes (see `Mix::wanted`): the output head and the
//!   `attn_v` / `ffn_down` of the layers that get more bits take q6_K, the rest the base K type.
//! - A matrix whose rows are not whole blocks of the target type falls back as llama-quantize does
//!   (`tensor_type_fallback` in llama.cpp b11312): q2_K and q3_K to q4_0, q4_K to q5_0, q5_K to q5_1, q6_K
//!   to q8_0, iq4_xs to iq4_nl; and f16 where even 32-value blocks do not fit (f16 always fits). Each
//!   fallback is said on stderr.
//! - Everything else is copied byte for byte: 1-D tensors (norms and biases, f32 in llama.cpp's
//!   conversions), the matrices llama-quantize never quantizes (expert routers, position embeddings and
//!   the small state-space and RWKV ones), and matrices already in their new type.
//! - Metadata keeps its order and its bytes, except `general.file_type`, which becomes llama.cpp's
//!   `LLAMA_FTYPE` value for the target (a u32, added at the end when the input has none).
//!
//! Quantized inputs are requantized without asking (llama-quantize wants `--allow-requantize`): each row
//! is dequantized to f32 and quantized again. To f16 that costs only f16 rounding; between quantized types
//! the errors add up, which is said once on stderr. Every type's blocks are ggml's reference quantizers'
//! (`quant::quantize_row`, byte for byte what llama-quantize writes without an importance matrix).
//!
//! Memory: IN is memory-mapped and OUT is streamed. At any time this holds the header (metadata and tensor
//! index), one tensor's output bytes, and one f32 row per thread. OUT is written to a temporary file in
//! its folder, flushed to disk, read back (its index must match the plan), then renamed over OUT.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context};
use clap::builder::{PossibleValue, TypedValueParser};
use clap::{Args, ValueEnum};

use strata::gguf::{GgufFile, GgufValue, GgufWriter, TensorEntry, TensorInfo};
use strata::quant::{self, GgmlType};

#[derive(Args, Debug)]
pub struct QuantizeArgs {
    /// The GGUF model to read
    #[arg(value_name = "IN")]
    pub input: PathBuf,
    /// Where to write the new model (replaced at once, never left half-written)
    #[arg(value_name = "OUT")]
    pub output: PathBuf,
    /// Type of the weight matrices (q4_K_M, q5_K_M: llama-quantize's mixes, q6_K where they give more bits)
    #[arg(long = "type", value_name = "TYPE", value_parser = TargetParser)]
    pub target: Target,
    /// Worker threads [default: the number of CPUs]
    #[arg(short = 't', long = "threads", value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub threads: Option<u16>,
}

/// The types a model can be quantized to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Target {
    #[value(name = "f16")]
    F16,
    #[value(name = "q8_0")]
    Q8_0,
    #[value(name = "q4_0")]
    Q4_0,
    #[value(name = "q4_1")]
    Q4_1,
    #[value(name = "q5_0")]
    Q5_0,
    #[value(name = "q5_1")]
    Q5_1,
    #[value(name = "q2_K")]
    Q2K,
    #[value(name = "q3_K")]
    Q3K,
    #[value(name = "q4_K")]
    Q4K,
    #[value(name = "q5_K")]
    Q5K,
    #[value(name = "q6_K")]
    Q6K,
    // llama-quantize's Q4_K_M mix: q4_K, with q6_K for the output head and for `attn_v` / `ffn_down` in the
    // layers that get more bits (`Mix::wanted`).
    #[value(name = "q4_K_M")]
    Q4KM,
    // The Q5_K_M mix: q5_K, with q6_K as in Q4_K_M.
    #[value(name = "q5_K_M")]
    Q5KM,
    #[value(name = "iq4_nl")]
    IQ4NL,
    #[value(name = "iq4_xs")]
    IQ4XS,
    #[value(name = "mxfp4")]
    MXFP4,
}

impl Target {
    pub fn ggml_type(self) -> GgmlType {
        match self {
            Target::F16 => GgmlType::F16,
            Target::Q8_0 => GgmlType::Q8_0,
            Target::Q4_0 => GgmlType::Q4_0,
            Target::Q4_1 => GgmlType::Q4_1,
            Target::Q5_0 => GgmlType::Q5_0,
            Target::Q5_1 => GgmlType::Q5_1,
            Target::Q2K => GgmlType::Q2K,
            Target::Q3K => GgmlType::Q3K,
            Target::Q4K => GgmlType::Q4K,
            Target::Q5K => GgmlType::Q5K,
            Target::Q6K => GgmlType::Q6K,
            Target::Q4KM => GgmlType::Q4K,
            Target::Q5KM => GgmlType::Q5K,
            Target::IQ4NL => GgmlType::IQ4NL,
            Target::IQ4XS => GgmlType::IQ4XS,
            Target::MXFP4 => GgmlType::MXFP4,
        }
    }

    /// llama.cpp's `enum llama_ftype` for a file of this type (`general.file_type`).
    pub fn llama_ftype(self) -> u32 {
        match self {
            Target::F16 => 1,    // LLAMA_FTYPE_MOSTLY_F16
            Target::Q4_0 => 2,   // LLAMA_FTYPE_MOSTLY_Q4_0
            Target::Q4_1 => 3,   // LLAMA_FTYPE_MOSTLY_Q4_1
            Target::Q8_0 => 7,   // LLAMA_FTYPE_MOSTLY_Q8_0
            Target::Q5_0 => 8,   // LLAMA_FTYPE_MOSTLY_Q5_0
            Target::Q5_1 => 9,   // LLAMA_FTYPE_MOSTLY_Q5_1
            Target::Q2K => 10,   // LLAMA_FTYPE_MOSTLY_Q2_K
            Target::Q3K => 11,   // LLAMA_FTYPE_MOSTLY_Q3_K_S: every matrix q3_K (Q3_K_M/L mix in more bits)
            Target::Q4K => 14,   // LLAMA_FTYPE_MOSTLY_Q4_K_S: every matrix q4_K (Q4_K_M mixes in q6_K)
            Target::Q5K => 16,   // LLAMA_FTYPE_MOSTLY_Q5_K_S
            Target::Q6K => 18,   // LLAMA_FTYPE_MOSTLY_Q6_K
            Target::Q4KM => 15,  // LLAMA_FTYPE_MOSTLY_Q4_K_M
            Target::Q5KM => 17,  // LLAMA_FTYPE_MOSTLY_Q5_K_M
            Target::IQ4NL => 25, // LLAMA_FTYPE_MOSTLY_IQ4_NL
            Target::IQ4XS => 30, // LLAMA_FTYPE_MOSTLY_IQ4_XS
            Target::MXFP4 => 38, // LLAMA_FTYPE_MOSTLY_MXFP4_MOE (llama.cpp's only mxfp4 file type)
        }
    }
}

/// Parses `--type` case-insensitively, with a one-line error that lists the valid types (clap's own puts
/// them on a second line, which the CLI's one-line error report would drop).
#[derive(Clone)]
struct TargetParser;

impl TypedValueParser for TargetParser {
    type Value = Target;

    fn parse_ref(&self, cmd: &clap::Command, _arg: Option<&clap::Arg>, value: &OsStr) -> Result<Target, clap::Error> {
        let text = value.to_string_lossy();
        Target::from_str(&text, true).map_err(|_| {
            let valid: Vec<String> = Target::value_variants()
                .iter()
                .filter_map(|t| t.to_possible_value())
                .map(|p| p.get_name().to_owned())
                .collect();
            let message = format!("unknown --type {text:?}: the valid types are {}\n", valid.join(", "));
            clap::Error::raw(clap::error::ErrorKind::InvalidValue, message).with_cmd(cmd)
        })
    }

    fn possible_values(&self) -> Option<Box<dyn Iterator<Item = PossibleValue> + '_>> {
        Some(Box::new(Target::value_variants().iter().filter_map(|t| t.to_possible_value())))
    }
}

/// Substrings of the names of matrices llama-quantize never quantizes (`llama_model_quantize_impl`).
const NEVER_QUANTIZED: [&str; 12] = [
    "_norm.weight",
    "ffn_gate_inp.weight",
    "altup",
    "laurel",
    "per_layer_model_proj",
    "pos_embd.weight",
    "token_types.weight",
    "ssm_conv1d.weight",
    "shortconv.conv.weight",
    "time_mix_first.weight",
    "time_mix_w1.weight",
    "attn_rel_b.weight",
];

/// Dimensions as ggml counts them: trailing 1s do not count (`ggml_n_dims`).
fn n_dims(dims: &[u64]) -> usize {
    dims.iter().rposition(|&d| d != 1).map_or(1, |i| i + 1)
}

/// Whether llama-quantize would quantize the tensor `name` of dimensions `dims`.
fn is_weight_matrix(name: &str, dims: &[u64]) -> bool {
    name.ends_with("weight") && n_dims(dims) >= 2 && !NEVER_QUANTIZED.iter().any(|s| name.contains(s))
}

/// The type a matrix with rows of `row_len` values gets for `target`: the target when rows are whole blocks
/// of it, else llama-quantize's fallback (see the top of this file), else f16.
fn type_for_rows(target: GgmlType, row_len: u64) -> GgmlType {
    let fits = |t: GgmlType| row_len.is_multiple_of(t.block_len() as u64);
    if fits(target) {
        return target;
    }
    let fallback = match target {
        GgmlType::Q2K | GgmlType::Q3K => GgmlType::Q4_0,
        GgmlType::Q4K => GgmlType::Q5_0,
        GgmlType::Q5K => GgmlType::Q5_1,
        GgmlType::Q6K => GgmlType::Q8_0,
        GgmlType::IQ4XS => GgmlType::IQ4NL,
        _ => GgmlType::F16,
    };
    if fits(fallback) {
        fallback
    } else {
        GgmlType::F16
    }
}

/// Where each matrix sits in the model, for the K_M mixes: llama-quantize counts the `attn_v` and
/// `ffn_down` matrices in file order and asks whether the model has an `output.weight` of its own.
struct Mix {
    target: Target,
    has_output: bool,
    n_attn_v: usize,
    n_ffn_down: usize,
}

impl Mix {
    fn new(target: Target, tensors: &[TensorInfo]) -> Mix {
        let count = |part: &str| tensors.iter().filter(|t| t.name.contains(part)).count();
        Mix {
            target,
            has_output: tensors.iter().any(|t| t.name == "output.weight"),
            n_attn_v: count("attn_v.weight"),
            n_ffn_down: count("ffn_down"),
        }
    }

    /// The type the matrices take before the row-length fallback: the target's, or for the K_M mixes
    /// llama-quantize's choice (`llama_tensor_get_type_impl`, llama.cpp b11312, for a model without
    /// experts): the output head (the tied embedding when there is no `output.weight`) q6_K, or q8_0 when
    /// its rows are not whole 256-value blocks; `attn_v` and `ffn_down` q6_K in the layers `use_more_bits`
    /// picks; a fused `attn_qkv` q5_K (Q4_K_M) or q6_K (Q5_K_M). `i_attn_v` and `i_ffn_down` count the
    /// matrices of their kind before this one.
    fn wanted(&self, t: &TensorInfo, i_attn_v: usize, i_ffn_down: usize) -> GgmlType {
        let base = self.target.ggml_type();
        if !matches!(self.target, Target::Q4KM | Target::Q5KM) {
            return base;
        }
        let name = t.name.as_str();
        if name == "output.weight" || (!self.has_output && name == "token_embd.weight") {
            return if t.dims[0].is_multiple_of(256) { GgmlType::Q6K } else { GgmlType::Q8_0 };
        }
        if name.contains("attn_v.weight") && use_more_bits(i_attn_v, self.n_attn_v) {
            return GgmlType::Q6K;
        }
        if name.contains("ffn_down") && use_more_bits(i_ffn_down, self.n_ffn_down) {
            return GgmlType::Q6K;
        }
        if name.contains("attn_qkv.weight") {
            return if self.target == Target::Q4KM { GgmlType::Q5K } else { GgmlType::Q6K };
        }
        base
    }
}

/// llama-quantize's choice of the layers whose `attn_v` and `ffn_down` get more bits: the first and last
/// eighth, and every third layer between.
fn use_more_bits(i_layer: usize, n_layers: usize) -> bool {
    i_layer < n_layers / 8 || i_layer >= 7 * n_layers / 8 || (i_layer as i64 - (n_layers / 8) as i64) % 3 == 2
}

/// The layer of a tensor named `blk.N.…`, -1 for the others.
fn layer_of(name: &str) -> i64 {
    name.strip_prefix("blk.").and_then(|r| r.split('.').next()).and_then(|n| n.parse().ok()).unwrap_or(-1)
}

/// Each tensor's wanted type, in file order (see `Mix::wanted`). llama-quantize counts the matrices in its
/// loader's order, by layer and then by name (`weight_name_comparer`), whatever the file's order.
fn wanted_types(target: Target, tensors: &[TensorInfo]) -> Vec<GgmlType> {
    let mix = Mix::new(target, tensors);
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    order.sort_by(|&a, &b| {
        let (a, b) = (&tensors[a].name, &tensors[b].name);
        (layer_of(a), a).cmp(&(layer_of(b), b))
    });
    let mut wanted = vec![GgmlType::F16; tensors.len()];
    let (mut i_attn_v, mut i_ffn_down) = (0, 0);
    for i in order {
        let t = &tensors[i];
        wanted[i] = mix.wanted(t, i_attn_v, i_ffn_down);
        if is_weight_matrix(&t.name, &t.dims) {
            i_attn_v += t.name.contains("attn_v.weight") as usize;
            i_ffn_down += t.name.contains("ffn_down") as usize;
        }
    }
    wanted
}

/// What happens to one tensor of IN.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Action {
    /// Its bytes are copied as they are.
    Keep,
    /// Its rows are dequantized and quantized to this type.
    Convert(GgmlType),
}

/// The action for tensor `t` when the matrices go to `target`.
fn plan_tensor(t: &TensorInfo, target: GgmlType) -> Action {
    if !is_weight_matrix(&t.name, &t.dims) {
        return Action::Keep;
    }
    match type_for_rows(target, t.dims[0]) {
        ty if ty == t.ty => Action::Keep,
        ty => Action::Convert(ty),
    }
}

/// One tensor of OUT.
struct Step<'a> {
    info: &'a TensorInfo,
    action: Action,
    ty: GgmlType,
    n_bytes: u64,
}

impl Step<'_> {
    fn new(info: &TensorInfo, target: GgmlType) -> anyhow::Result<Step<'_>> {
        let action = plan_tensor(info, target);
        let (ty, n_bytes) = match action {
            Action::Keep => (info.ty, info.n_bytes),
            Action::Convert(ty) => {
                let row_bytes = ty.row_bytes(info.dims[0]).with_context(|| {
                    format!("tensor {:?}: rows of {} values do not fit {ty} (a bug)", info.name, info.dims[0])
                })?;
                let n_bytes = row_bytes
                    .checked_mul(info.n_rows())
                    .with_context(|| format!("tensor {:?} of shape {:?} is too large as {ty}", info.name, info.dims))?;
                (ty, n_bytes)
            }
        };
        Ok(Step { info, action, ty, n_bytes })
    }
}

pub fn main(a: QuantizeArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    let target = a.target.ggml_type();
    refuse_same_file(&a.input, &a.output)?;
    if a.output.is_dir() {
        bail!("OUT {} is a directory: give the path of the file to write", a.output.display());
    }
    let file = GgufFile::open(&a.input).with_context(|| format!("input {}", a.input.display()))?;
    file.advise_willneed();
    let wanted = wanted_types(a.target, &file.tensors);
    let steps = file.tensors.iter().zip(&wanted).map(|(t, &w)| Step::new(t, w)).collect::<anyhow::Result<Vec<_>>>()?;
    report_fallbacks(&steps, &wanted);
    report_requantization(&steps);

    let entries: Vec<TensorEntry> = steps
        .iter()
        .map(|s| TensorEntry { name: &s.info.name, dims: &s.info.dims, ty: s.ty, n_bytes: s.n_bytes })
        .collect();
    let header = output_metadata(&file, a.target.llama_ftype()).header_for(file.version, &entries);

    let n_threads = match a.threads {
        Some(n) => n as usize,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    let mut out = TempFile::create(&a.output)?;
    let tmp_path = out.path.clone();
    let io = |e: std::io::Error| anyhow::anyhow!("cannot write {}: {e}", tmp_path.display());
    let mut w = BufWriter::with_capacity(8 << 20, out.file()?);
    w.write_all(&header.bytes).map_err(io)?;
    let mut pos_bytes = header.bytes.len() as u64;
    let base = pos_bytes;
    let (mut n_converted, mut n_kept) = (0usize, 0usize);
    for (step, &offset) in steps.iter().zip(&header.data_offsets) {
        write_zeros(&mut w, base + offset - pos_bytes).map_err(io)?;
        let src = file.tensor_data(step.info);
        match step.action {
            Action::Keep => {
                w.write_all(src).map_err(io)?;
                n_kept += 1;
            }
            Action::Convert(ty) => {
                let data = convert_tensor(step.info, src, ty, n_threads)
                    .with_context(|| format!("input {}: tensor {:?}", a.input.display(), step.info.name))?;
                w.write_all(&data).map_err(io)?;
                n_converted += 1;
            }
        }
        tracing::debug!("{} {:?}: {} -> {}", step.info.name, step.info.dims, step.info.ty, step.ty);
        pos_bytes = base + offset + step.n_bytes;
    }
    write_zeros(&mut w, pos_bytes.next_multiple_of(header.alignment) - pos_bytes).map_err(io)?;
    let out_bytes = pos_bytes.next_multiple_of(header.alignment);
    let f = w.into_inner().map_err(|e| io(e.into_error()))?;
    f.sync_all().map_err(io)?;
    drop(f);
    check_written(&out.path, &steps)?;
    out.commit(&a.output)?;

    eprintln!(
        "strata quantize: wrote {} ({}): {n_converted} tensors requantized, {n_kept} kept; {:.1} MB -> {:.1} MB \
         in {:.1} s",
        a.output.display(),
        a.target.to_possible_value().map_or_else(|| target.name().to_owned(), |v| v.get_name().to_owned()),
        file.file_bytes() as f64 / 1e6,
        out_bytes as f64 / 1e6,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// IN's metadata in its order, with `general.file_type` set to `file_type` (in place, or last if absent).
fn output_metadata(file: &GgufFile, file_type: u32) -> GgufWriter {
    let mut w = GgufWriter::new();
    for (key, value) in &file.metadata {
        let value = if key == "general.file_type" { GgufValue::U32(file_type) } else { value.clone() };
        w.set(key, value);
    }
    if file.get("general.file_type").is_none() {
        w.set("general.file_type", GgufValue::U32(file_type));
    }
    w
}

/// Refuses an OUT that is IN itself (the same path, a link to it, or a hard link of it).
fn refuse_same_file(input: &Path, output: &Path) -> anyhow::Result<()> {
    let same_path = match (std::fs::canonicalize(input), std::fs::canonicalize(output)) {
        (Ok(i), Ok(o)) => i == o,
        // OUT does not exist yet (so it is not IN), or IN does not (the reader says so).
        _ => false,
    };
    #[cfg(unix)]
    let same_inode = {
        use std::os::unix::fs::MetadataExt;
        match (std::fs::metadata(input), std::fs::metadata(output)) {
            (Ok(i), Ok(o)) => i.dev() == o.dev() && i.ino() == o.ino(),
            _ => false,
        }
    };
    #[cfg(not(unix))]
    let same_inode = false;
    if same_path || same_inode {
        bail!("IN and OUT are the same file ({}): write the new model to another path", output.display());
    }
    Ok(())
}

/// Says on stderr which matrices do not take their wanted type, grouped by row length, type and fallback.
fn report_fallbacks(steps: &[Step], wanted: &[GgmlType]) {
    // Keyed by (row length, wanted type's id, fallback's id): ordered and printable.
    type Group<'a> = (GgmlType, GgmlType, Vec<&'a str>);
    let mut groups: BTreeMap<(u64, u32, u32), Group> = BTreeMap::new();
    for (s, &want) in steps.iter().zip(wanted) {
        if is_weight_matrix(&s.info.name, &s.info.dims) && s.ty != want {
            let key = (s.info.dims[0], want.id(), s.ty.id());
            groups.entry(key).or_insert_with(|| (want, s.ty, Vec::new())).2.push(&s.info.name);
        }
    }
    for ((row_len, _, _), (target, fallback, names)) in groups {
        let shown = names.iter().take(3).copied().collect::<Vec<_>>().join(", ");
        let more = if names.len() > 3 { format!(" and {} more", names.len() - 3) } else { String::new() };
        let what = if names.len() == 1 { "matrix has" } else { "matrices have" };
        eprintln!(
            "strata quantize: {} {what} rows of {row_len} values, not whole {}-value blocks of {target}: \
             {fallback} instead ({shown}{more})",
            names.len(),
            target.block_len(),
        );
    }
}

/// Whether values of type `ty` are block-quantized (not plain floats).
fn is_quantized(ty: GgmlType) -> bool {
    !matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
}

/// Says once on stderr when quantized matrices are quantized again (their errors add up).
fn report_requantization(steps: &[Step]) {
    let mut from: Vec<&str> = Vec::new();
    let mut n = 0usize;
    for s in steps {
        if let Action::Convert(ty) = s.action {
            if is_quantized(s.info.ty) && is_quantized(ty) {
                n += 1;
                if !from.contains(&s.info.ty.name()) {
                    from.push(s.info.ty.name());
                }
            }
        }
    }
    if n > 0 {
        let (what, are) = if n == 1 { ("matrix is", "it") } else { ("matrices are", "them") };
        eprintln!(
            "strata quantize: note: {n} {what} already quantized ({}); quantizing {are} again adds up both \
             errors (an f16 or f32 model as IN gives the best result)",
            from.join(", ")
        );
    }
}

/// Tensor `t`'s data `src` dequantized and quantized to `ty`, rows split over `n_threads` threads.
fn convert_tensor(t: &TensorInfo, src: &[u8], ty: GgmlType, n_threads: usize) -> anyhow::Result<Vec<u8>> {
    let row_len = t.dims[0];
    let n_rows = t.n_rows() as usize;
    let (Some(in_row), Some(out_row)) = (t.ty.row_bytes(row_len), ty.row_bytes(row_len)) else {
        bail!("rows of {row_len} values are not whole blocks");
    };
    let (row_len, in_row, out_row) = (row_len as usize, in_row as usize, out_row as usize);
    let mut out = vec![0u8; n_rows * out_row];
    if n_rows == 0 || row_len == 0 {
        return Ok(out);
    }
    // Small tensors are not worth a thread.
    let n_threads = if n_rows * row_len < 1 << 16 { 1 } else { n_threads.clamp(1, n_rows) };
    let rows_per_thread = n_rows.div_ceil(n_threads);
    std::thread::scope(|s| {
        let workers: Vec<_> = src
            .chunks(rows_per_thread * in_row)
            .zip(out.chunks_mut(rows_per_thread * out_row))
            .enumerate()
            .map(|(i, (src, dst))| {
                let first_row = i * rows_per_thread;
                s.spawn(move || convert_rows(t.ty, src, ty, dst, row_len, first_row))
            })
            .collect();
        workers.into_iter().try_for_each(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
    })?;
    Ok(out)
}

/// Converts whole rows of `row_len` values from `src` (type `from`) into `dst` (type `to`). `first_row` is
/// the index of the first row in its tensor, for messages. The hot loop of the command.
fn convert_rows(
    from: GgmlType,
    src: &[u8],
    to: GgmlType,
    dst: &mut [u8],
    row_len: usize,
    first_row: usize,
) -> anyhow::Result<()> {
    let (in_row, out_row) = (quant::row_len_bytes(from, row_len)?, quant::row_len_bytes(to, row_len)?);
    let mut x = vec![0f32; row_len];
    for (r, (s, d)) in src.chunks_exact(in_row).zip(dst.chunks_exact_mut(out_row)).enumerate() {
        quant::try_dequantize_row(from, s, &mut x)?;
        if let Some(j) = x.iter().position(|v| !v.is_finite()) {
            bail!("row {}, value {j} is {}: the input is corrupt", first_row + r, x[j]);
        }
        quant::quantize_row(to, &x, d);
    }
    Ok(())
}

fn write_zeros(w: &mut impl Write, n_bytes: u64) -> std::io::Result<()> {
    const ZEROS: [u8; 4096] = [0; 4096];
    let mut left = n_bytes;
    while left > 0 {
        let n = left.min(ZEROS.len() as u64) as usize;
        w.write_all(&ZEROS[..n])?;
        left -= n as u64;
    }
    Ok(())
}

/// Reads the written file's index back: every tensor in place with its planned type and size.
fn check_written(path: &Path, steps: &[Step]) -> anyhow::Result<()> {
    let f = GgufFile::open(path).with_context(|| format!("the written file {} does not read back", path.display()))?;
    let ok = f.tensors.len() == steps.len()
        && f.tensors.iter().zip(steps).all(|(t, s)| t.name == s.info.name && t.ty == s.ty && t.n_bytes == s.n_bytes);
    if !ok {
        bail!("the written file {} does not match its plan (a bug in strata quantize)", path.display());
    }
    Ok(())
}

/// A temporary file next to the destination, removed on drop unless renamed over it by `commit`.
struct TempFile {
    path: PathBuf,
    file: Option<File>,
    committed: bool,
}

impl TempFile {
    fn create(dest: &Path) -> anyhow::Result<TempFile> {
        let name = dest.file_name().with_context(|| format!("OUT {} names no file", dest.display()))?;
        let dir = match dest.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let path = dir.join(format!(".{}.strata-tmp-{}", name.to_string_lossy(), std::process::id()));
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .with_context(|| format!("cannot create a temporary file in {}", dir.display()))?;
        Ok(TempFile { path, file: Some(file), committed: false })
    }

    /// The open file, for writing (once).
    fn file(&mut self) -> anyhow::Result<File> {
        self.file.take().context("the temporary file is already taken")
    }

    /// Renames the (written and synced) file over `dest`, then syncs the folder so the rename is durable.
    fn commit(mut self, dest: &Path) -> anyhow::Result<()> {
        std::fs::rename(&self.path, dest).with_context(|| format!("cannot replace {}", dest.display()))?;
        self.committed = true;
        if let Some(dir) = self.path.parent() {
            // Some file systems cannot sync a folder; the data itself is already on disk.
            let _ = File::open(dir).and_then(|d| d.sync_all());
        }
        Ok(())
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.committed {
            self.file.take();
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(name: &str, dims: &[u64], ty: GgmlType) -> TensorInfo {
        TensorInfo { name: name.into(), dims: dims.to_vec(), ty, file_offset: 0, n_bytes: 0 }
    }

    #[test]
    fn rows_that_are_not_whole_blocks_fall_back_like_llama_quantize() {
        assert_eq!(type_for_rows(GgmlType::Q4K, 512), GgmlType::Q4K);
        assert_eq!(type_for_rows(GgmlType::Q4K, 576), GgmlType::Q5_0);
        assert_eq!(type_for_rows(GgmlType::Q6K, 576), GgmlType::Q8_0);
        assert_eq!(type_for_rows(GgmlType::Q5K, 576), GgmlType::Q5_1);
        assert_eq!(type_for_rows(GgmlType::Q2K, 576), GgmlType::Q4_0);
        assert_eq!(type_for_rows(GgmlType::Q3K, 576), GgmlType::Q4_0);
        assert_eq!(type_for_rows(GgmlType::IQ4XS, 576), GgmlType::IQ4NL);
        assert_eq!(type_for_rows(GgmlType::IQ4XS, 1536), GgmlType::IQ4XS);
        assert_eq!(type_for_rows(GgmlType::IQ4XS, 40), GgmlType::F16);
        assert_eq!(type_for_rows(GgmlType::MXFP4, 576), GgmlType::MXFP4);
        assert_eq!(type_for_rows(GgmlType::IQ4NL, 40), GgmlType::F16);
        assert_eq!(type_for_rows(GgmlType::Q6K, 40), GgmlType::F16);
        assert_eq!(type_for_rows(GgmlType::Q4_0, 40), GgmlType::F16);
        assert_eq!(type_for_rows(GgmlType::F16, 7), GgmlType::F16);
    }

    #[test]
    fn only_weight_matrices_are_converted() {
        let t = GgmlType::Q8_0;
        assert_eq!(plan_tensor(&info("blk.0.attn_q.weight", &[64, 64], GgmlType::F32), t), Action::Convert(t));
        assert_eq!(plan_tensor(&info("token_embd.weight", &[64, 100], GgmlType::Q4_1), t), Action::Convert(t));
        assert_eq!(plan_tensor(&info("blk.0.attn_norm.weight", &[64], GgmlType::F32), t), Action::Keep);
        // A row vector stored with a trailing 1 is 1-D for ggml.
        assert_eq!(plan_tensor(&info("blk.0.attn_q.bias", &[64, 1], GgmlType::F32), t), Action::Keep);
        assert_eq!(plan_tensor(&info("blk.0.ffn_gate_inp.weight", &[64, 8], GgmlType::F32), t), Action::Keep);
        // Already the target type: copied, not requantized.
        assert_eq!(plan_tensor(&info("output.weight", &[64, 100], GgmlType::Q8_0), t), Action::Keep);
    }

    /// A 30-layer model shaped like SmolLM2 (576-wide rows, 1536-wide `ffn_down`, the output tied to the
    /// embedding), in llama.cpp's tensor order.
    fn smollm2_like() -> Vec<TensorInfo> {
        let mut t = vec![info("token_embd.weight", &[576, 49152], GgmlType::Q8_0)];
        for l in 0..30 {
            for (part, dims) in [
                ("attn_norm", &[576u64][..]),
                ("attn_q", &[576, 576]),
                ("attn_k", &[576, 192]),
                ("attn_v", &[576, 192]),
                ("attn_output", &[576, 576]),
                ("ffn_gate", &[576, 1536]),
                ("ffn_up", &[576, 1536]),
                ("ffn_down", &[1536, 576]),
            ] {
                t.push(info(&format!("blk.{l}.{part}.weight"), dims, GgmlType::Q4_1));
            }
        }
        t
    }

    #[test]
    fn the_k_m_mixes_choose_as_llama_quantize_does() {
        assert_eq!(
            (0..30).filter(|&i| use_more_bits(i, 30)).collect::<Vec<_>>(),
            [0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 26, 27, 28, 29]
        );
        let tensors = smollm2_like();
        let count = |target: Target| {
            let wanted = wanted_types(target, &tensors);
            let mut n: BTreeMap<&str, usize> = BTreeMap::new();
            for (t, w) in tensors.iter().zip(wanted) {
                if is_weight_matrix(&t.name, &t.dims) {
                    *n.entry(type_for_rows(w, t.dims[0]).name()).or_default() += 1;
                }
            }
            n
        };
        // llama-quantize --allow-requantize ... Q4_K_M on SmolLM2-135M (b11312) wrote q4_K:16 q5_0:166
        // q6_K:14 q8_0:15: ffn_down q6_K in the 14 layers with more bits, attn_v there q6_K -> q8_0 (576-wide
        // rows), the tied embedding q8_0, the rest q4_K -> q5_0.
        let q4km = count(Target::Q4KM);
        assert_eq!(q4km, BTreeMap::from([("q4_K", 16), ("q5_0", 166), ("q6_K", 14), ("q8_0", 15)]));
        let q5km = count(Target::Q5KM);
        assert_eq!(q5km, BTreeMap::from([("q5_K", 16), ("q5_1", 166), ("q6_K", 14), ("q8_0", 15)]));
        // Counted by layer (llama.cpp's loader order), not in the file's order: blk.11 gets more bits, blk.10
        // does not, even when the names sort blk.10 before blk.2.
        let wanted = wanted_types(Target::Q4KM, &tensors);
        let of = |name: &str| wanted[tensors.iter().position(|t| t.name == name).unwrap()];
        assert_eq!(of("blk.11.ffn_down.weight"), GgmlType::Q6K);
        assert_eq!(of("blk.10.ffn_down.weight"), GgmlType::Q4K);
        assert_eq!(of("blk.2.attn_v.weight"), GgmlType::Q6K);
        let mut shuffled = tensors.clone();
        shuffled.reverse();
        let w2 = wanted_types(Target::Q4KM, &shuffled);
        assert_eq!(w2[shuffled.iter().position(|t| t.name == "blk.11.ffn_down.weight").unwrap()], GgmlType::Q6K);
        // The plain types do not mix.
        assert_eq!(count(Target::Q4K), BTreeMap::from([("q4_K", 30), ("q5_0", 181)]));
        // With an output.weight of its own, the embedding takes the base type and the head q6_K.
        let mut with_head = tensors.clone();
        with_head.push(info("output.weight", &[1024, 49152], GgmlType::F16));
        let wanted = wanted_types(Target::Q4KM, &with_head);
        assert_eq!(wanted[0], GgmlType::Q4K);
        assert_eq!(*wanted.last().unwrap(), GgmlType::Q6K);
    }

    #[test]
    fn file_types_are_llama_cpps() {
        let want = [
            (Target::F16, 1),
            (Target::Q4_0, 2),
            (Target::Q4_1, 3),
            (Target::Q8_0, 7),
            (Target::Q5_0, 8),
            (Target::Q5_1, 9),
            (Target::Q2K, 10),
            (Target::Q3K, 11),
            (Target::Q4K, 14),
            (Target::Q5K, 16),
            (Target::Q6K, 18),
            (Target::Q4KM, 15),
            (Target::Q5KM, 17),
            (Target::IQ4NL, 25),
            (Target::IQ4XS, 30),
            (Target::MXFP4, 38),
        ];
        for (t, ftype) in want {
            assert_eq!(t.llama_ftype(), ftype, "{t:?}");
        }
    }
}
