//! Subcommands of the `strata` binary, and what they share: model location and loading, engine flags,
//! error reporting in one line.

pub mod bench;
pub mod chat;
pub mod info;
pub mod perplexity;
pub mod run;
pub mod tokenize;

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{bail, Context};
use clap::Args;

use strata::gguf::GgufFile;
use strata::model::{KvType, Model};
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
    /// KV cache element type: f16, or int8 (blocks of 32 with a scale; half the memory)
    #[arg(long = "kv", default_value = "f16", value_parser = parse_kv)]
    pub kv: KvType,
    /// Tokens per prompt-processing batch
    #[arg(short = 'b', long = "batch-size", default_value_t = 512, value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub batch: u32,
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
}

/// A thread pool of `threads` threads, or one per CPU when not given.
pub fn pool_for(threads: Option<u16>) -> ThreadPool {
    let n =
        threads.map(usize::from).unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1));
    ThreadPool::new(n)
}

/// Finds the model file: `-m`, else $STRATA_MODEL, else `models/<default>` in the current directory or
/// next to the repository the binary was built in.
pub fn resolve_model(args: &ModelArgs) -> anyhow::Result<PathBuf> {
    if let Some(p) = &args.model {
        return Ok(p.clone());
    }
    if let Some(p) = std::env::var_os("STRATA_MODEL") {
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

/// Opens the GGUF file, reads the weights into memory (with a progress bar on a terminal) and builds the
/// tokenizer.
pub fn load(args: &ModelArgs) -> anyhow::Result<Loaded> {
    let path = resolve_model(args)?;
    let file = GgufFile::open(&path).with_context(|| format!("cannot load model {}", path.display()))?;
    let file = Arc::new(file);
    let model = Model::from_file(file.clone()).with_context(|| format!("cannot load model {}", path.display()))?;
    let tokenizer =
        Tokenizer::from_gguf(&file).with_context(|| format!("cannot load the tokenizer of {}", path.display()))?;
    page_in(&file, std::io::stderr().is_terminal());
    Ok(Loaded { model, tokenizer, path })
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
    let mut ids = Vec::new();
    if tok.add_bos_token() {
        if let Some(bos) = tok.bos_id() {
            ids.push(bos);
        }
    }
    ids.extend(tok.encode(text, true));
    ids
}

/// An error chain as one line: "outer: cause: root cause".
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
            eprintln!("strata: error: {first} (see strata --help)");
            ExitCode::from(2)
        }
    }
}

/// Sampling flags shared by `run` and `chat`.
#[derive(Args, Clone, Debug)]
pub struct SamplingArgs {
    /// Temperature; 0 = greedy (always the most likely token)
    #[arg(long = "temp", default_value_t = 0.8)]
    pub temp: f32,
    /// Keep the K most likely tokens (0 = off)
    #[arg(long = "top-k", default_value_t = 40)]
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability sums to P (1 = off)
    #[arg(long = "top-p", default_value_t = 0.95)]
    pub top_p: f32,
    /// Drop tokens less likely than P times the most likely one (0 = off)
    #[arg(long = "min-p", default_value_t = 0.05)]
    pub min_p: f32,
    /// Penalize tokens repeated within --repeat-last-n (1 = off)
    #[arg(long = "repeat-penalty", default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// Window of recent tokens the penalties look at
    #[arg(long = "repeat-last-n", default_value_t = 64)]
    pub repeat_last_n: usize,
    /// Subtract this from the logits of tokens present in the window (0 = off)
    #[arg(long = "presence-penalty", default_value_t = 0.0)]
    pub presence_penalty: f32,
    /// Subtract this times the count of each token in the window (0 = off)
    #[arg(long = "frequency-penalty", default_value_t = 0.0)]
    pub frequency_penalty: f32,
    /// Random seed of the sampler
    #[arg(long = "seed", default_value_t = 0)]
    pub seed: u64,
    /// Stop when this text appears (repeatable)
    #[arg(long = "stop", value_name = "TEXT")]
    pub stop: Vec<String>,
}

impl SamplingArgs {
    pub fn config(&self) -> anyhow::Result<strata::sample::SamplerConfig> {
        if !(self.temp.is_finite() && self.temp >= 0.0) {
            bail!("--temp must be a number >= 0, got {}", self.temp);
        }
        if !(0.0..=1.0).contains(&self.top_p) {
            bail!("--top-p must be in [0, 1], got {}", self.top_p);
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            bail!("--min-p must be in [0, 1], got {}", self.min_p);
        }
        if !(self.repeat_penalty.is_finite() && self.repeat_penalty > 0.0) {
            bail!("--repeat-penalty must be > 0, got {}", self.repeat_penalty);
        }
        if !self.presence_penalty.is_finite() || !self.frequency_penalty.is_finite() {
            bail!("--presence-penalty and --frequency-penalty must be finite numbers");
        }
        Ok(strata::sample::SamplerConfig {
            temperature: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            seed: self.seed,
        })
    }
}

/// Tokenizes the output of a chat template: special tokens parsed; BOS added when the model asks for it
/// and the template did not already write it.
pub fn tokenize_prompt_templated(tok: &Tokenizer, rendered: &str) -> Vec<u32> {
    let mut ids = tok.encode(rendered, true);
    if tok.add_bos_token() {
        if let Some(bos) = tok.bos_id() {
            if ids.first() != Some(&bos) {
                ids.insert(0, bos);
            }
        }
    }
    ids
}
