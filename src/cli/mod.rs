//! Subcommands of the `strata` binary, and what they share: model location and loading, engine flags
//! (threads, context, KV type, and where the model runs: devices, layer split, reserve, simulated faults),
//! error reporting in one line.

pub mod bandwidth;
pub mod bench;
pub mod chat;
pub mod devices;
pub mod info;
pub mod input;
pub mod perplexity;
pub mod plan;
pub mod pull;
pub mod quantize;
pub mod replay;
pub mod run;
pub mod serve;
pub mod synth;
pub mod tokenize;

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{bail, Context};
use clap::Args;

use strata::device::{DeviceSet, FaultSpec};
use strata::engine::spec::{SpecConfig, SpecSetup};
use strata::gguf::GgufFile;
use strata::model::{ExpertsPlacement, KvType, LoadOptions, Model};
use strata::sample::defaults::SamplingDefaults;
use strata::split;
use strata::threadpool::ThreadPool;
use strata::tokenizer::Tokenizer;

/// File name of the default model in `models/`.
pub const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// Where the model comes from.
#[derive(Args, Clone, Debug)]
pub struct ModelArgs {
    /// Path to a GGUF model [default: $STRATA_MODEL, else models/SmolLM2-135M-Instruct.Q4_1.gguf]
    #[arg(short = 'm', long = "model", value_name = "MODEL")]
    pub model: Option<PathBuf>,
}

/// Flags of the engine shared by every subcommand that runs the model.
#[derive(Args, Clone, Debug)]
pub struct EngineArgs {
    /// Worker threads [default: the number of CPUs]
    #[arg(short = 't', long = "threads", value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub threads: Option<u16>,
    /// Most tokens a sequence may hold (prompt + generated) [default: the model's training context]
    #[arg(short = 'c', long = "max-context", visible_alias = "ctx-size", value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_context: Option<u32>,
    /// KV cache element type: f16; f32 (the values exactly, twice the memory; CPU and sim devices only); or
    /// int8 (blocks of 32 with a scale; half the memory)
    #[arg(long = "kv", default_value = "f16", value_parser = parse_kv)]
    pub kv: KvType,
    /// Tokens per prompt-processing batch
    #[arg(short = 'b', long = "batch-size", default_value_t = 512, value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub batch: u32,
    #[command(flatten)]
    pub placement: PlacementArgs,
    #[command(flatten)]
    pub spec: SpecArgs,
}

/// Speculative decoding: where drafts come from and how many.
#[derive(Args, Clone, Debug)]
pub struct SpecArgs {
    /// A smaller model with the same vocabulary that drafts tokens for the target to verify in one batch
    #[arg(long = "draft-model", visible_alias = "model-draft", value_name = "PATH")]
    pub draft_model: Option<PathBuf>,
    /// Speculative decoding without a second model: `ngram` drafts what followed the longest earlier match
    /// of the last tokens (prompt lookup); `draft` (implied by --draft-model) uses the draft model
    #[arg(long = "spec", value_name = "KIND", value_enum)]
    pub spec: Option<SpecKind>,
    /// Most drafts per verification
    #[arg(long = "draft-max", value_name = "N", default_value_t = 16,
          value_parser = clap::value_parser!(u32).range(1..=256))]
    pub draft_max: u32,
    /// Fewer drafts than this are not verified (the step decodes plainly)
    #[arg(long = "draft-min", value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(0..=256))]
    pub draft_min: u32,
    /// The draft model stops drafting when its best token is less likely than this
    #[arg(long = "draft-p-min", value_name = "P", default_value_t = 0.75)]
    pub draft_p_min: f32,
    /// Devices of the draft model, as indices into --devices (e.g. 1, or 0,1) [default: the first device]
    #[arg(long = "draft-devices", value_name = "LIST")]
    pub draft_devices: Option<String>,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpecKind {
    Ngram,
    Draft,
}

impl SpecArgs {
    /// The drafting configuration when speculative decoding is on (checked: --draft-min <= --draft-max,
    /// --spec draft needs --draft-model, ngram takes none).
    pub fn config(&self) -> anyhow::Result<Option<(SpecKind, SpecConfig)>> {
        let kind = match (self.spec, &self.draft_model) {
            (None, None) => {
                if self.draft_devices.is_some() {
                    bail!("--draft-devices places a draft model: give one with --draft-model");
                }
                return Ok(None);
            }
            (Some(SpecKind::Ngram), Some(_)) => {
                bail!("--spec ngram drafts without a second model: drop --draft-model, or use --spec draft")
            }
            (Some(SpecKind::Draft), None) => {
                bail!("--spec draft needs a draft model: give one with --draft-model PATH")
            }
            (Some(SpecKind::Ngram), None) => SpecKind::Ngram,
            (_, Some(_)) => SpecKind::Draft,
        };
        if self.draft_min > self.draft_max {
            bail!("--draft-min {} is more than --draft-max {}", self.draft_min, self.draft_max);
        }
        if !(0.0..=1.0).contains(&self.draft_p_min) {
            bail!("--draft-p-min must be in [0, 1], got {}", self.draft_p_min);
        }
        let cfg = SpecConfig {
            draft_max: self.draft_max as usize,
            draft_min: self.draft_min as usize,
            p_min: self.draft_p_min,
        };
        Ok(Some((kind, cfg)))
    }

    /// The draft model's devices: those of `target` that --draft-devices names (default the first),
    /// sharing their ledgers, with the target's host.
    pub fn draft_devices(&self, target: &DeviceSet) -> anyhow::Result<DeviceSet> {
        let list = self.draft_devices.as_deref().unwrap_or("0");
        let indices = strata::plan::draft::parse_indices(list).with_context(|| format!("--draft-devices {list:?}"))?;
        strata::plan::draft::select_devices(target, &indices).with_context(|| format!("--draft-devices {list:?}"))
    }
}

/// Speculative decoding as the flags ask: n-gram lookup, or the draft model loaded on --draft-devices (its
/// weights, scratch and KV in the same ledgers as the target's) after its vocabulary was checked.
pub fn load_spec(engine: &EngineArgs, target: &Loaded) -> anyhow::Result<Option<SpecSetup>> {
    let Some((kind, cfg)) = engine.spec.config()? else { return Ok(None) };
    let draft = match kind {
        SpecKind::Ngram => None,
        SpecKind::Draft => Some(load_draft(engine, target)?),
    };
    Ok(Some(SpecSetup { cfg, draft }))
}

/// The draft model on --draft-devices (default the target's first device), after its vocabulary was checked.
fn load_draft(engine: &EngineArgs, target: &Loaded) -> anyhow::Result<Arc<Model>> {
    let path = engine.spec.draft_model.clone().context("no --draft-model")?;
    let devices = engine.spec.draft_devices(&target.model.placement.devices)?;
    let mut opts = engine.load_options()?;
    opts.devices = devices;
    opts.split = None;
    // `--experts` names the target's layers; the draft places its own experts as `auto`.
    opts.experts = ExpertsPlacement::Auto;
    let file = GgufFile::open(&path).with_context(|| format!("cannot load draft model {}", path.display()))?;
    let file = Arc::new(file);
    let tokenizer = Tokenizer::from_gguf(&file)
        .with_context(|| format!("cannot load the tokenizer of draft model {}", path.display()))?;
    strata::engine::spec::check_vocab(&target.tokenizer, &tokenizer)
        .with_context(|| format!("draft model {} cannot draft for {}", path.display(), target.path.display()))?;
    let model = Model::from_file_with(file.clone(), &opts)
        .with_context(|| format!("cannot load draft model {}", path.display()))?;
    page_in(&file, std::io::stderr().is_terminal());
    tracing::info!("speculative decoding: draft model {} on {}", path.display(), stages_summary(&model));
    Ok(Arc::new(model))
}

fn parse_kv(s: &str) -> Result<KvType, String> {
    s.parse()
}

impl EngineArgs {
    pub fn pool(&self) -> ThreadPool {
        pool_for(self.threads)
    }

    pub fn context(&self, model: &Model) -> usize {
        self.max_context.map(|c| c as usize).unwrap_or(model.cfg.n_ctx_train)
    }

    /// How to place the model: the devices, the split, the KV type and residency, the batch the scratch is
    /// sized for, and the context `-c` asks for.
    pub fn load_options(&self) -> anyhow::Result<LoadOptions> {
        self.placement.load_options(self.kv, self.batch as usize, self.max_context.map(|c| c as usize))
    }
}

/// Where the model runs: the devices, the layer split over them, the memory kept free on each GPU, KV
/// residency, and faults for simulated GPUs. Part of [`EngineArgs`]; `perplexity` takes it on its own (its
/// `-c` means the chunk size).
#[derive(Args, Clone, Debug)]
pub struct PlacementArgs {
    /// Devices to run on, in stage order: cpu, cuda:N, cuda:N@MIB (CUDA device N acting as a MIB MiB card),
    /// sim:MIB (a simulated GPU computing on the CPU), emu:MIB (the CUDA backend on a CPU emulator; slow)
    #[arg(long = "devices", value_name = "LIST", default_value = "cpu")]
    pub devices: String,
    /// Layers where each stage after the first starts, e.g. 15 or 10,20 (one point fewer than devices)
    /// [default: layers in proportion to each device's memory]
    #[arg(long = "layer-split", value_name = "POINTS")]
    pub layer_split: Option<String>,
    /// MiB each GPU keeps free: no allocation may leave less than this
    #[arg(long = "vram-reserve-mib", value_name = "N", default_value_t = 0,
          value_parser = clap::value_parser!(u64).range(0..=1 << 24))]
    pub vram_reserve_mib: u64,
    /// Positions of KV per layer kept on the device; older pages move to the host [default: all]
    #[arg(long = "kv-resident", value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub kv_resident: Option<u32>,
    /// Where a mixture of experts' experts live: auto (with their stage while it fits, the first layers'
    /// in host memory until the rest does), cpu (host memory, computed by the CPU; attention stays on the
    /// device), gpu (with their stage), or cpu:A..B (the experts of layers A..B in host memory, the others
    /// with their stage)
    #[arg(long = "experts", value_name = "WHERE", default_value = "auto", value_parser = parse_experts)]
    pub experts: ExpertsPlacement,
    /// A fault for a GPU-like device (sim, emu, cuda), DEVICE:WHAT=N[@tokens=T] with WHAT pressure-mib,
    /// leave-free-mib (on cuda: memory really taken), fail-samples, fail-allocs or fault-context=1 (emu:
    /// a sticky context fault) (repeatable), e.g. 1:leave-free-mib=64@tokens=2048
    #[arg(long = "sim-fault", value_name = "SPEC", value_parser = parse_fault)]
    pub sim_fault: Vec<FaultSpec>,
    /// A file of --sim-fault specs, one per line (# starts a comment)
    #[arg(long = "sim-faults", value_name = "FILE")]
    pub sim_faults: Option<PathBuf>,
}

fn parse_experts(s: &str) -> Result<ExpertsPlacement, String> {
    ExpertsPlacement::parse(s).map_err(|e| e.to_string())
}

fn parse_fault(s: &str) -> Result<FaultSpec, String> {
    FaultSpec::parse(s).map_err(|e| e.to_string())
}

const MIB: u64 = 1 << 20;

impl PlacementArgs {
    /// The devices (each GPU with the reserve) and the model's placement on them.
    pub fn load_options(
        &self,
        kv_type: KvType,
        batch: usize,
        max_context: Option<usize>,
    ) -> anyhow::Result<LoadOptions> {
        let reserve_bytes = self
            .vram_reserve_mib
            .checked_mul(MIB)
            .with_context(|| format!("--vram-reserve-mib {} is too large", self.vram_reserve_mib))?;
        let devices = DeviceSet::parse(&self.devices, reserve_bytes)?;
        let split = self.layer_split.as_deref().map(split::parse_points).transpose()?;
        Ok(LoadOptions {
            devices,
            split,
            kv_type,
            batch,
            max_context,
            kv_resident: self.kv_resident.map(|n| n as usize),
            experts: self.experts.clone(),
        })
    }

    /// The faults of `--sim-fault` and of the `--sim-faults` file, checked against `devices`.
    pub fn faults(&self, devices: &DeviceSet) -> anyhow::Result<Vec<FaultSpec>> {
        let mut specs = self.sim_fault.clone();
        if let Some(path) = &self.sim_faults {
            let text = input::read_text_capped(path, input::SIM_FAULTS_CAP_BYTES, "--sim-faults")?;
            let from_file = FaultSpec::parse_file_text(&text)
                .with_context(|| format!("bad fault in --sim-faults {}", path.display()))?;
            specs.extend(from_file);
        }
        for s in &specs {
            if s.device >= devices.devices.len() {
                let names: Vec<String> = devices.devices.iter().map(|d| d.name()).collect();
                bail!(
                    "a sim fault names device {}, but --devices lists {} device(s): {}",
                    s.device,
                    names.len(),
                    names.join(", ")
                );
            }
        }
        Ok(specs)
    }
}

/// Applies fault specs to their devices: now, or when a sequence reaches the spec's `@tokens`. Only sim
/// devices take faults; the library refuses the others.
pub fn apply_faults(devices: &DeviceSet, specs: &[FaultSpec]) -> anyhow::Result<()> {
    for s in specs {
        let device = devices.devices.get(s.device).with_context(|| {
            format!("a sim fault names device {}, but --devices lists {} device(s)", s.device, devices.devices.len())
        })?;
        let applied = match s.at_tokens {
            Some(at) => device.schedule(at, s.fault),
            None => device.inject(s.fault),
        };
        applied.with_context(|| format!("cannot apply a fault to device {}", device.name()))?;
    }
    Ok(())
}

/// A thread pool of `threads` threads, or one per CPU when not given.
pub fn pool_for(threads: Option<u16>) -> ThreadPool {
    ThreadPool::new(thread_count(threads))
}

/// `threads`, or one per CPU when not given.
pub fn thread_count(threads: Option<u16>) -> usize {
    threads.map(usize::from).unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1))
}

/// The conversation cache's flags, shared by `replay` and `serve`.
#[derive(Args, Clone, Debug)]
pub struct CacheArgs {
    /// Conversations the cache may hold parked (0: no cache, every switch rereads)
    #[arg(long = "conversation-cache-slots", value_name = "N", default_value_t = 4)]
    pub cache_slots: usize,
    /// Host memory the parked conversations may take, in MiB
    #[arg(long = "conversation-cache-mib", value_name = "M", default_value_t = 4096)]
    pub cache_mib: u64,
}

impl CacheArgs {
    /// `--conversation-cache-mib` in bytes.
    pub fn budget_bytes(&self) -> anyhow::Result<u64> {
        self.cache_mib
            .checked_mul(MIB)
            .with_context(|| format!("--conversation-cache-mib {} is too large", self.cache_mib))
    }
}

/// Finds the model file: `-m`, else $STRATA_MODEL, else `models/<default>` in the current directory or
/// next to the repository the binary was built in.
pub fn resolve_model(args: &ModelArgs) -> anyhow::Result<PathBuf> {
    if let Some(p) = &args.model {
        return Ok(p.clone());
    }
    if let Some(p) = std::env::var_os("STRATA_MODEL") {
        if p.is_empty() {
            bail!("STRATA_MODEL is set but empty: set it to a GGUF file, unset it for the default model, or pass -m MODEL");
        }
        return Ok(PathBuf::from(p));
    }
    let mut candidates = vec![PathBuf::from("models").join(DEFAULT_MODEL_FILE)];
    if let Ok(exe) = std::env::current_exe() {
        // target/{debug,release}/strata -> the repository root is three levels up.
        if let Some(root) = exe.ancestors().nth(3) {
            candidates.push(root.join("models").join(DEFAULT_MODEL_FILE));
        }
    }
    candidates.push(Path::new(env!("CARGO_MANIFEST_DIR")).join("models").join(DEFAULT_MODEL_FILE));
    for c in &candidates {
        if c.is_file() {
            return Ok(c.clone());
        }
    }
    bail!("no model given and the default model {DEFAULT_MODEL_FILE} is not in models/: run scripts/fetch-model, or pass -m MODEL")
}

/// A loaded model with its tokenizer.
pub struct Loaded {
    pub model: Model,
    pub tokenizer: Tokenizer,
    pub path: PathBuf,
}

/// Opens the GGUF file, places the model on the devices of `engine`, reads the weights into memory (with a
/// progress bar on a terminal), builds the tokenizer, and applies the sim faults (those with `@tokens` fire
/// during generation).
pub fn load(args: &ModelArgs, engine: &EngineArgs) -> anyhow::Result<Loaded> {
    load_placed(args, &engine.placement, engine.load_options()?)
}

/// [`load`] with placement options built by the caller (`perplexity`, whose `-c` is not a context limit).
pub fn load_placed(args: &ModelArgs, placement: &PlacementArgs, opts: LoadOptions) -> anyhow::Result<Loaded> {
    let faults = placement.faults(&opts.devices)?;
    // Faults apply before loading, as in `plan`: memory another process holds is there when the model loads.
    apply_faults(&opts.devices, &faults)?;
    let path = resolve_model(args)?;
    let file = GgufFile::open(&path).with_context(|| format!("cannot load model {}", path.display()))?;
    let file = Arc::new(file);
    let model =
        Model::from_file_with(file.clone(), &opts).with_context(|| format!("cannot load model {}", path.display()))?;
    let tokenizer =
        Tokenizer::from_gguf(&file).with_context(|| format!("cannot load the tokenizer of {}", path.display()))?;
    page_in(&file, std::io::stderr().is_terminal());
    Ok(Loaded { model, tokenizer, path })
}

/// The tokenizer of the model alone (no weights are read, nothing is placed on a device).
pub fn load_tokenizer(args: &ModelArgs) -> anyhow::Result<Tokenizer> {
    let path = resolve_model(args)?;
    let file = GgufFile::open(&path).with_context(|| format!("cannot load model {}", path.display()))?;
    Tokenizer::from_gguf(&file).with_context(|| format!("cannot load the tokenizer of {}", path.display()))
}

/// The stages of a loaded model in short: `sim:200[0..15] sim:400[15..30]`.
pub fn stages_summary(model: &Model) -> String {
    let stages = &model.placement.stages;
    let parts: Vec<String> =
        stages.iter().map(|s| format!("{}[{}..{}]", s.device.kind, s.layers.start, s.layers.end)).collect();
    parts.join(" ")
}

/// Reads every tensor's pages once so the first request does not pay for page faults, showing progress
/// when `show` (a terminal is attached).
fn page_in(file: &GgufFile, show: bool) {
    file.advise_willneed();
    if !show {
        return;
    }
    let total: u64 = file.tensors.iter().map(|t| t.n_bytes).sum();
    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(
        indicatif::ProgressStyle::with_template("loading {bar:40} {bytes}/{total_bytes} {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let mut sink = 0u8;
    for t in &file.tensors {
        let data = file.tensor_data(t);
        for page in data.chunks(4096) {
            sink ^= page[0];
        }
        bar.inc(t.n_bytes);
    }
    std::hint::black_box(sink);
    bar.finish_and_clear();
}

/// Tokenizes a raw prompt: special tokens parsed, BOS added when the model asks for it.
pub fn tokenize_prompt(tok: &Tokenizer, text: &str) -> Vec<u32> {
    tok.encode_with_bos(text, true)
}

/// An error chain as one line: "outer: cause: root cause".
/// The device error in `e`'s chain that faulted a GPU for good (a sticky CUDA error), if any.
pub fn device_fault(e: &anyhow::Error) -> Option<&strata::device::DeviceError> {
    use strata::engine::EngineError;
    use strata::model::ModelError;
    e.chain().find_map(|c| {
        let d = c
            .downcast_ref::<strata::device::DeviceError>()
            .or_else(|| match c.downcast_ref::<ModelError>() {
                Some(ModelError::Device(d)) => Some(d),
                _ => None,
            })
            .or_else(|| match c.downcast_ref::<EngineError>() {
                Some(EngineError::Model(ModelError::Device(d))) => Some(d),
                _ => None,
            })?;
        d.is_fatal().then_some(d)
    })
}

pub fn one_line(e: &anyhow::Error) -> String {
    let parts: Vec<String> = e.chain().map(|c| c.to_string()).collect();
    let mut out: Vec<String> = Vec::new();
    for p in parts {
        // thiserror's transparent wrappers repeat their source's message; keep each once.
        if out.last().is_some_and(|l| l.ends_with(&p)) {
            continue;
        }
        out.push(p);
    }
    out.join(": ").replace('\n', " ")
}

/// Prints a command-line parse error as one line (help and version requests print normally).
pub fn report_usage_error(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = e.print();
            if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            }
        }
        _ => {
            let rendered = e.render().to_string();
            let first = rendered.lines().next().unwrap_or("invalid arguments");
            let first = first.strip_prefix("error: ").unwrap_or(first);
            // A value outside a fixed set says which values there are.
            let valid = match e.get(clap::error::ContextKind::ValidValue) {
                Some(clap::error::ContextValue::Strings(v)) if !v.is_empty() => format!("; one of: {}", v.join(", ")),
                _ => String::new(),
            };
            eprintln!("strata: error: {first}{valid} (see strata --help)");
            ExitCode::from(2)
        }
    }
}

/// Sampling flags shared by `run` and `chat`.
#[derive(Args, Clone, Debug)]
pub struct SamplingArgs {
    /// Temperature; 0 = greedy (always the most likely token) [default: the model's, see below]
    #[arg(long = "temp")]
    pub temp: Option<f32>,
    /// Keep the K most likely tokens (0 = off)
    #[arg(long = "top-k", value_parser = clap::value_parser!(u32).range(0..))]
    pub top_k: Option<u32>,
    /// Keep the smallest set of tokens whose probability sums to P (1 = off)
    #[arg(long = "top-p")]
    pub top_p: Option<f32>,
    /// Drop tokens less likely than P times the most likely one (0 = off)
    #[arg(long = "min-p")]
    pub min_p: Option<f32>,
    /// Penalize tokens repeated within --repeat-last-n (1 = off)
    #[arg(long = "repeat-penalty")]
    pub repeat_penalty: Option<f32>,
    /// Window of recent tokens the penalties look at
    #[arg(long = "repeat-last-n", value_parser = clap::value_parser!(u32).range(0..))]
    pub repeat_last_n: Option<u32>,
    /// Subtract this from the logits of tokens present in the window (0 = off)
    #[arg(long = "presence-penalty", default_value_t = 0.0)]
    pub presence_penalty: f32,
    /// Subtract this times the count of each token in the window (0 = off)
    #[arg(long = "frequency-penalty", default_value_t = 0.0)]
    pub frequency_penalty: f32,
    /// Random seed of the sampler
    #[arg(long = "seed", default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..))]
    pub seed: u64,
    /// Stop when this text appears (repeatable)
    #[arg(long = "stop", value_name = "TEXT")]
    pub stop: Vec<String>,
}

impl SamplingArgs {
    /// The sampler: each flag given as given, each one not given from the model's defaults (its file's
    /// `general.sampling.*` keys, its family's preset, else Strata's chain: `strata info` shows them).
    pub fn config(&self, defaults: &SamplingDefaults) -> anyhow::Result<strata::sample::SamplerConfig> {
        let temp = self.temp.unwrap_or(defaults.temperature.value as f32);
        let top_p = self.top_p.unwrap_or(defaults.top_p.value as f32);
        let min_p = self.min_p.unwrap_or(defaults.min_p.value as f32);
        let repeat_penalty = self.repeat_penalty.unwrap_or(defaults.repeat_penalty.value as f32);
        if !(temp.is_finite() && temp >= 0.0) {
            bail!("--temp must be a number >= 0, got {temp}");
        }
        if !(0.0..=1.0).contains(&top_p) {
            bail!("--top-p must be in [0, 1], got {top_p}");
        }
        if !(0.0..=1.0).contains(&min_p) {
            bail!("--min-p must be in [0, 1], got {min_p}");
        }
        if !(repeat_penalty.is_finite() && repeat_penalty > 0.0) {
            bail!("--repeat-penalty must be > 0, got {repeat_penalty}");
        }
        if !self.presence_penalty.is_finite() || !self.frequency_penalty.is_finite() {
            bail!("--presence-penalty and --frequency-penalty must be finite numbers");
        }
        Ok(strata::sample::SamplerConfig {
            temperature: temp,
            top_k: self.top_k.unwrap_or(defaults.top_k.value) as usize,
            top_p,
            min_p,
            repeat_penalty,
            repeat_last_n: self.repeat_last_n.unwrap_or(defaults.repeat_last_n.value) as usize,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            seed: self.seed,
        })
    }

    /// Checks the flags that do not depend on the model, before it loads.
    pub fn check(&self) -> anyhow::Result<()> {
        self.config(&SamplingDefaults::fallback()).map(|_| ())
    }
}

/// Tokenizes the output of a chat template: special tokens parsed; BOS added when the model asks for it
/// and the template did not already write it.
pub fn tokenize_prompt_templated(tok: &Tokenizer, rendered: &str) -> Vec<u32> {
    tok.encode_templated(rendered)
}
