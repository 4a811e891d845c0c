//! The `strata` command line: glue over the library. Each subcommand lives in `cli/`.

mod cli;

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "strata",
    version,
    about = "Run large language models locally: GGUF models on the CPU, layers split over devices (--devices, --layer-split)",
    long_about = "Strata runs GGUF language models on your own machine.\n\nWith no -m, the default model \
                  (SmolLM2-135M-Instruct Q4_1, fetched by scripts/fetch-model) is used; STRATA_MODEL overrides it."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate a continuation of a raw prompt (special tokens parsed, the model's BOS rule).
    Run(cli::run::RunArgs),
    /// Chat with the model using its chat template (interactive, or one turn with --message).
    Chat(cli::chat::ChatArgs),
    /// Print the token ids of a text.
    Tokenize(cli::tokenize::TokenizeArgs),
    /// Perplexity of a text file, by llama.cpp's procedure (chunks of -c tokens, second halves scored).
    Perplexity(cli::perplexity::PerplexityArgs),
    /// Prompt-processing and generation speed, like llama-bench.
    Bench(cli::bench::BenchArgs),
    /// Model metadata, tensor types and the memory needed at a context size.
    Info(cli::info::InfoArgs),
    /// What each device of a split would hold (weights, KV, scratch), and whether it fits; allocates nothing.
    Plan(cli::plan::PlanArgs),
    /// The devices to run on, with their free and total memory.
    Devices(cli::devices::DevicesArgs),
    /// Run a scripted workload (conversations, device faults) and print every engine event as JSON lines.
    Replay(cli::replay::ReplayArgs),
    /// An OpenAI-compatible HTTP server with the Strata API (devices, telemetry, conversation cache).
    Serve(cli::serve::ServeArgs),
    /// Write a llama-shaped model with seeded random weights (speed and memory tests).
    Synth(cli::synth::SynthArgs),
    /// Requantize a GGUF model's weight matrices (f16, q8_0, q4_0 .. q5_1, q2_K .. q6_K, iq4_nl, iq4_xs,
    /// mxfp4), like llama-quantize.
    Quantize(cli::quantize::QuantizeArgs),
    /// Download a GGUF model from the Hugging Face Hub into the models folder (resumable, sha256-checked).
    Pull(cli::pull::PullArgs),
}

impl Command {
    /// The subcommand's name, as typed.
    fn name(&self) -> &'static str {
        match self {
            Command::Run(_) => "run",
            Command::Chat(_) => "chat",
            Command::Tokenize(_) => "tokenize",
            Command::Perplexity(_) => "perplexity",
            Command::Bench(_) => "bench",
            Command::Info(_) => "info",
            Command::Plan(_) => "plan",
            Command::Devices(_) => "devices",
            Command::Replay(_) => "replay",
            Command::Synth(_) => "synth",
            Command::Quantize(_) => "quantize",
            Command::Pull(_) => "pull",
            Command::Serve(_) => "serve",
        }
    }
}

/// Exit status when a GPU faulted for good (a sticky CUDA error): sysexits' EX_TEMPFAIL, "try again", for
/// a supervisor to restart on. Other errors exit with 1.
const EXIT_DEVICE_FAULT: u8 = 75;

fn main() -> ExitCode {
    // A closed pipe (`strata tokenize ... | head`) ends the process quietly, as for any Unix tool, instead
    // of a panic in the first print after it. SAFETY: first thing in main, before any thread exists.
    #[cfg(unix)]
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    // `-n -1` is a value out of range (said so by the range check), not an unknown flag `-1`.
    let command = Cli::command().mut_subcommands(|s| s.allow_negative_numbers(true));
    let cli = match command.try_get_matches().and_then(|m| Cli::from_arg_matches(&m)) {
        Ok(c) => c,
        Err(e) => return cli::report_usage_error(e),
    };
    init_logging(cli.command.name());
    let result = match cli.command {
        Command::Run(a) => cli::run::main(a),
        Command::Chat(a) => cli::chat::main(a),
        Command::Tokenize(a) => cli::tokenize::main(a),
        Command::Perplexity(a) => cli::perplexity::main(a),
        Command::Bench(a) => cli::bench::main(a),
        Command::Info(a) => cli::info::main(a),
        Command::Plan(a) => cli::plan::main(a),
        Command::Devices(a) => cli::devices::main(a),
        Command::Replay(a) => cli::replay::main(a),
        Command::Synth(a) => cli::synth::main(a),
        Command::Quantize(a) => cli::quantize::main(a),
        Command::Pull(a) => cli::pull::main(a),
        Command::Serve(a) => match cli::serve::main(a) {
            Ok(0) => Ok(()),
            Ok(code) => return ExitCode::from(code),
            Err(e) => Err(e),
        },
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("strata: error: {}", cli::one_line(&e));
            if let Some(fault) = cli::device_fault(&e) {
                // Never compute on after a faulted context: say so and leave with the code a supervisor
                // restarts on.
                eprintln!(
                    "strata: unhealthy: {fault}; exiting with status {EXIT_DEVICE_FAULT} so that a supervisor restarts strata"
                );
                return ExitCode::from(EXIT_DEVICE_FAULT);
            }
            ExitCode::FAILURE
        }
    }
}

/// Log lines on stderr as `strata <subcommand>: message`, e.g. `strata replay: conversation cache: parked ...`
/// (info and above; `STRATA_LOG=debug` or any tracing filter for more, `STRATA_LOG=off` for none).
fn init_logging(subcommand: &'static str) {
    use tracing_subscriber::fmt::{format::Writer, FmtContext, FormatEvent, FormatFields};
    use tracing_subscriber::registry::LookupSpan;

    struct Line(&'static str);
    impl<S, N> FormatEvent<S, N> for Line
    where
        S: tracing::Subscriber + for<'a> LookupSpan<'a>,
        N: for<'a> FormatFields<'a> + 'static,
    {
        fn format_event(
            &self,
            ctx: &FmtContext<'_, S, N>,
            mut w: Writer<'_>,
            event: &tracing::Event<'_>,
        ) -> std::fmt::Result {
            write!(w, "strata {}: ", self.0)?;
            ctx.field_format().format_fields(w.by_ref(), event)?;
            writeln!(w)
        }
    }
    let spec = std::env::var("STRATA_LOG").unwrap_or_default();
    let spec = if spec.trim().is_empty() { "strata=info" } else { spec.as_str() };
    let filter = tracing_subscriber::EnvFilter::try_new(spec)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("strata=info"));
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter)
        .event_format(Line(subcommand))
        .try_init();
}
