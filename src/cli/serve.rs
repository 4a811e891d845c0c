//! `strata serve`: the flags of the server, the model loaded as for `run`, and what `/strata/model` shows;
//! the server itself is `strata::server`.

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context};
use axum::http::HeaderValue;
use clap::Args;

use strata::engine::session::SessionConfig;
use strata::engine::spec::SpecSetup;
use strata::model::Pooling;
use strata::plan::facts::ModelFacts;
use strata::plan::parallel::{self, DefaultParallel, CPU_PARALLEL_DEFAULT, MAX_PARALLEL, SPECULATIVE_ONE_AT_A_TIME};
use strata::plan::settings::{EngineLocation, EngineSettings, Speculative};
use strata::sample::defaults::SamplingDefaults;
use strata::server::guard::HostPolicy;
use strata::server::{ServeOptions, ServedModel};
use strata::tokenizer::ChatTemplate;

use super::{load, stages_summary, EngineArgs, ModelArgs, SpecKind};

const MIB: u64 = 1 << 20;

#[derive(Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Address to listen on; anything but loopback needs an API key
    #[arg(long = "host", default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: any free port; the first stdout line says which)
    #[arg(long = "port", default_value_t = 8080)]
    pub port: u16,
    /// Clients must send 'Authorization: Bearer KEY' (the /v1, /strata and /metrics paths)
    #[arg(long = "api-key", value_name = "KEY", conflicts_with = "api_key_file")]
    pub api_key: Option<String>,
    /// Read the API key from the first line of a file (keeps it out of the process list)
    #[arg(long = "api-key-file", value_name = "FILE")]
    pub api_key_file: Option<PathBuf>,
    /// Another name /v1/models lists for the loaded model (repeatable)
    #[arg(long = "model-alias", visible_alias = "alias", value_name = "NAME")]
    pub alias: Vec<String>,
    /// Answer only the served id and the aliases as "model"; any other name is a 404 [default: every
    /// name is answered by the one model served, and the response names the served id]
    #[arg(long = "strict-model")]
    pub strict_model: bool,
    /// Every "model" name is answered by the loaded model (the default; kept for older command lines)
    #[arg(long = "any-model", hide = true, conflicts_with = "strict_model")]
    pub any_model: bool,
    /// Largest request body, in MiB
    #[arg(long = "max-body-mib", value_name = "M", default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub max_body_mib: u64,
    /// Requests that may wait while the engine serves another; more get 503 with Retry-After
    #[arg(long = "queue", value_name = "N", default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub queue: u32,

    /// Requests generating at once, each on its own sequence, decoded together in one batched pass per
    /// step (continuous batching, on GPU stages too); more wait in the queue. Default: as many as the host
    /// holds at the full context, up to 4, when every layer runs on the CPU (or sim devices); 1 with a GPU
    /// stage (each sequence's KV takes device memory). Speculative decoding (--spec, --draft-model) runs one
    /// at a time
    #[arg(long = "parallel", visible_alias = "np", value_name = "N", value_parser = clap::value_parser!(u32).range(1..=MAX_PARALLEL as i64))]
    pub parallel: Option<u32>,
    /// Allow browser pages of this origin (repeatable; localhost: any origin on a loopback name or
    /// address; '*' for any). Without it, a request that carries a foreign Origin is refused with 403 (the
    /// server's own page is not foreign)
    #[arg(long = "cors-origin", value_name = "ORIGIN")]
    pub cors_origin: Vec<String>,
    /// Answer requests whose Host is this name (repeatable; .example.com: the domain and its subdomains;
    /// '*' for any). localhost and IP addresses are always answered; other names get 403 (DNS rebinding)
    #[arg(long = "allowed-host", value_name = "NAME")]
    pub allowed_host: Vec<String>,
    /// Connections held at once; one more is answered 503 and closed
    #[arg(long = "max-connections", value_name = "N", default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_connections: u32,
    /// /strata/events streams open at once; one more is a 503
    #[arg(long = "max-event-streams", value_name = "N", default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub max_event_streams: u32,
    /// Seconds a request may take from its arrival in the queue to its last token; then it ends with 504
    /// (0: no limit)
    #[arg(long = "request-timeout-s", value_name = "S", default_value_t = 3600)]
    pub request_timeout_s: u64,
    /// Whether answers say how much of the prompt the cache reused (usage.cached_tokens, the "strata"
    /// figures), which tells a client how much another client's conversation shares with its prompt.
    /// auto: show on a loopback address, hide on any other
    #[arg(long = "reuse-figures", value_enum, default_value_t = ReuseFigures::Auto)]
    pub reuse_figures: ReuseFigures,
    /// The model library's folder: downloads go there, and its GGUFs are listed with the Hugging Face
    /// cache's [default: $STRATA_MODELS_DIR, else ~/.local/share/strata/models]
    #[arg(long = "models-dir", value_name = "DIR")]
    pub models_dir: Option<std::path::PathBuf>,
    /// `POST /strata/model/load` may load any GGUF file this process can read, not only those of the
    /// models folder, the Hugging Face cache and those served before (the desktop app's own engine, whose
    /// key only the app holds)
    #[arg(long = "load-any-path")]
    pub load_any_path: bool,
    /// Seconds a client may take to send its request line and headers; then the connection is closed
    #[arg(long = "header-timeout-s", value_name = "S", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub header_timeout_s: u64,
    /// Seconds a client may take to send its request body; then 408
    #[arg(long = "body-timeout-s", value_name = "S", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub body_timeout_s: u64,
    /// Telemetry kept for /strata/telemetry: the last N device samples and the last N engine events
    #[arg(long = "telemetry-entries", value_name = "N", default_value_t = strata::telemetry::RING_ENTRIES as u32,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub telemetry_entries: u32,
    /// Shut down when stdin closes (for a supervisor: the server ends with it, even if it is killed)
    #[arg(long = "exit-with-stdin")]
    pub exit_with_stdin: bool,
    /// A Jinja chat template file to render conversations with instead of the model's own
    /// (tokenizer.chat_template), for a model whose template is missing or broken
    #[arg(long = "chat-template-file", value_name = "FILE")]
    pub chat_template_file: Option<PathBuf>,
    /// How embeddings pool a sequence's hidden states: mean, cls, last, or none (every token's vector,
    /// unnormalized, answered at /embeddings only) [default: the model's pooling_type, mean when absent]
    #[arg(long = "pooling", value_name = "POOLING", value_parser = parse_pooling)]
    pub pooling: Option<Pooling>,
    /// Serve the built web UI in DIR at / instead of the one built into the binary (for UI development)
    #[arg(long = "ui-dir", value_name = "DIR")]
    pub ui_dir: Option<PathBuf>,
    #[command(flatten)]
    pub cache: super::CacheArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// `--reuse-figures`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ReuseFigures {
    Auto,
    Show,
    Hide,
}

/// The address to bind: an IP address or `localhost`.
fn host_ip(host: &str) -> anyhow::Result<IpAddr> {
    if host.eq_ignore_ascii_case("localhost") {
        return Ok(IpAddr::V4(Ipv4Addr::LOCALHOST));
    }
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .with_context(|| format!("--host {host:?} is not an IP address (e.g. 127.0.0.1, ::1, 0.0.0.0)"))
}

fn api_key(a: &ServeArgs) -> anyhow::Result<Option<String>> {
    let key = match (&a.api_key, &a.api_key_file) {
        (Some(k), _) => k.trim().to_owned(),
        (None, Some(f)) => {
            let text = super::input::read_text_capped(f, 64 * 1024, "--api-key-file")?;
            text.lines().next().unwrap_or("").trim().to_owned()
        }
        (None, None) => return Ok(None),
    };
    if key.is_empty() {
        bail!("the API key is empty: give one with --api-key KEY or a file whose first line is the key");
    }
    Ok(Some(key))
}

/// Lets the server hold as many connections as the system allows (the soft limit is often 1024).
fn raise_fd_limit() {
    #[cfg(unix)]
    unsafe {
        // SAFETY: plain libc calls on a local struct.
        let mut l = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) == 0 && l.rlim_cur < l.rlim_max {
            l.rlim_cur = l.rlim_max.min(65536);
            libc::setrlimit(libc::RLIMIT_NOFILE, &l);
        }
    }
}

/// Checks the flags, loads the model and serves it until the server stops: the exit code it ends with.
pub fn main(a: ServeArgs) -> anyhow::Result<u8> {
    let access = Access::of(&a)?;
    let ui_dir = match &a.ui_dir {
        Some(d) => Some(d.canonicalize().with_context(|| format!("--ui-dir {}: cannot open it", d.display()))?),
        None => None,
    };
    let cache_budget_bytes = a.cache.budget_bytes()?;
    raise_fd_limit();

    let mut loaded = load(&a.model, &a.engine)?;
    let spec = super::load_spec(&a.engine, &loaded)?;
    let template = chat_template(&a, &loaded.model.file)?;
    if let Some(p) = a.pooling {
        tracing::info!("embeddings pool {} (--pooling; the model says {})", p.name(), loaded.model.cfg.pooling.name());
        loaded.model.cfg.pooling = p;
    }
    let max_context = a.engine.context(&loaded.model);
    let id = strata::server::switch::model_id(&loaded.path);
    let info = model_info(&loaded, &id, &a, max_context)?;
    let sampling = SamplingDefaults::of(&loaded.model.file);
    tracing::info!("sampling for fields a request does not send: {}", sampling.describe());
    tracing::info!("{} loaded: {}, context {max_context}", loaded.path.display(), stages_summary(&loaded.model));
    let threads = super::thread_count(a.engine.threads);
    log_ui(ui_dir.as_deref());
    let session =
        SessionConfig { kv_type: a.engine.kv, max_context, cache_slots: a.cache.cache_slots, cache_budget_bytes };
    let parallel = parallel_of(&a, &loaded.model, max_context, spec.is_some())?;
    tracing::info!("parallel: up to {parallel} requests generate at once (--parallel)");
    let settings = settings_of(&a, &loaded.path);
    let opts = serve_options(&a, access, ui_dir, threads, spec, session, parallel);
    let created = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let tokenizer = Arc::new(loaded.tokenizer);
    let model = ServedModel {
        model: Arc::new(loaded.model),
        grammars: strata::grammar::Grammars::new(tokenizer.clone()),
        tokenizer,
        template,
        id,
        max_context,
        created,
        info,
        settings,
        sampling,
        generation: 0,
    };
    strata::server::serve(opts, model, announce)
}

/// The model's chat template, or the one `--chat-template-file` names.
fn chat_template(a: &ServeArgs, file: &strata::gguf::GgufFile) -> anyhow::Result<ChatTemplate> {
    let Some(path) = &a.chat_template_file else {
        return ChatTemplate::from_gguf(file).context("cannot read the chat template");
    };
    let source = super::input::read_text_capped(path, 1 << 20, "--chat-template-file")?;
    let origin = format!("the chat template file {}", path.display());
    let t = ChatTemplate::for_gguf(file, &source, &origin)
        .with_context(|| format!("--chat-template-file {}: cannot use it", path.display()))?;
    tracing::info!("chat template: {origin} (--chat-template-file), not the model's own");
    Ok(t)
}

/// `--pooling`.
fn parse_pooling(s: &str) -> Result<Pooling, String> {
    Pooling::of_name(s).ok_or_else(|| format!("{s:?} is not a pooling: none, mean, cls or last"))
}

/// How many requests generate at once: `--parallel`, else what the server picks for this placement
/// (`strata::plan::parallel`: as many as the host holds at the full context, up to 4, when every stage runs
/// on the host's memory; 1 with GPU stages or speculative decoding), which `--parallel` above 1
/// contradicts.
fn parallel_of(
    a: &ServeArgs,
    model: &strata::model::Model,
    max_context: usize,
    speculative: bool,
) -> anyhow::Result<usize> {
    match (a.parallel, speculative) {
        (Some(n), true) if n > 1 => anyhow::bail!(
            "--parallel {n} with --spec or --draft-model: {SPECULATIVE_ONE_AT_A_TIME}; drop one of the two"
        ),
        (Some(n), _) => Ok(n as usize),
        (None, _) => {
            let p = &model.placement;
            let d = parallel::default_parallel(&p.stages, max_context, p.kv_resident, &p.devices.host, speculative);
            if let DefaultParallel::Host { sequences, per_sequence_bytes, available_bytes } = d {
                if sequences < CPU_PARALLEL_DEFAULT {
                    tracing::info!(
                        "parallel: {sequences} (not {CPU_PARALLEL_DEFAULT}): a sequence's KV at {max_context} positions takes {}, the host has {} available",
                        strata::device::mib(per_sequence_bytes),
                        strata::device::mib(available_bytes)
                    );
                }
            }
            Ok(d.sequences())
        }
    }
}

/// Who may reach the server: the address it listens on, the API key, the browser origins and the Host names
/// it answers.
struct Access {
    ip: IpAddr,
    key: Option<String>,
    cors: Vec<HeaderValue>,
    allowed_hosts: HostPolicy,
}

impl Access {
    /// Reads the flags, refusing an address other than loopback without an API key.
    fn of(a: &ServeArgs) -> anyhow::Result<Access> {
        let ip = host_ip(&a.host)?;
        let key = api_key(a)?;
        if !ip.is_loopback() && key.is_none() {
            bail!(
                "refusing to listen on {ip} without an API key: anyone who can reach this machine could use the \
                 model; pass --api-key KEY (or --api-key-file FILE), or listen on 127.0.0.1"
            );
        }
        let cors = cors_origins(&a.cors_origin)?;
        let allowed_hosts = HostPolicy::parse(&a.allowed_host).map_err(anyhow::Error::msg)?;
        if allowed_hosts.allows_any() {
            tracing::warn!(
                "--allowed-host '*': every Host is answered, so a web page can reach this server by DNS rebinding"
            );
        }
        Ok(Access { ip, key, cors, allowed_hosts })
    }
}

/// The --cors-origin values as headers: each an http(s) origin, `localhost` or `*`.
fn cors_origins(origins: &[String]) -> anyhow::Result<Vec<HeaderValue>> {
    let mut cors = Vec::new();
    for o in origins {
        let v = HeaderValue::from_str(o.trim())
            .ok()
            .filter(|_| o == "*" || o == "localhost" || o.starts_with("http://") || o.starts_with("https://"))
            .with_context(|| {
                format!("--cors-origin {o:?} is not an origin (e.g. http://localhost:5173, localhost for any loopback one, or *)")
            })?;
        cors.push(v);
    }
    Ok(cors)
}

/// Logs where the web UI at / comes from: --ui-dir, the binary, or nowhere.
fn log_ui(ui_dir: Option<&Path>) {
    match ui_dir {
        Some(d) => tracing::info!("web UI at /: {} (--ui-dir)", d.display()),
        None if strata::server::ui::embedded() => {
            tracing::info!("web UI at /: built into this binary ({} files)", strata::server::ui::embedded_files())
        }
        None => tracing::warn!(
            "this binary was built without the web UI (run `npm run build --prefix ui` before `cargo build`): / lists the API"
        ),
    }
}

/// The server's options: the flags, who may reach it, the engine's threads, speculative decoding and the
/// session's KV and cache.
fn serve_options(
    a: &ServeArgs,
    access: Access,
    ui_dir: Option<PathBuf>,
    threads: usize,
    spec: Option<SpecSetup>,
    session: SessionConfig,
    parallel: usize,
) -> ServeOptions {
    ServeOptions {
        addr: SocketAddr::new(access.ip, a.port),
        api_key: access.key,
        aliases: a.alias.clone(),
        strict_model: a.strict_model,
        max_body_bytes: a.max_body_mib * MIB,
        queue: a.queue as usize,
        cors_origins: access.cors,
        allowed_hosts: access.allowed_hosts,
        max_connections: a.max_connections as usize,
        max_event_streams: a.max_event_streams as usize,
        request_timeout: (a.request_timeout_s > 0).then(|| std::time::Duration::from_secs(a.request_timeout_s)),
        reuse_figures: match a.reuse_figures {
            ReuseFigures::Show => true,
            ReuseFigures::Hide => false,
            ReuseFigures::Auto => access.ip.is_loopback(),
        },
        ui_dir,
        header_timeout: std::time::Duration::from_secs(a.header_timeout_s),
        body_timeout: std::time::Duration::from_secs(a.body_timeout_s),
        telemetry_entries: a.telemetry_entries as usize,
        batch: a.engine.batch as usize,
        threads,
        exit_with_stdin: a.exit_with_stdin,
        models_dir: a.models_dir.clone().unwrap_or_else(strata::hub::local::default_models_dir),
        load_any_path: a.load_any_path,
        spec,
        session,
        parallel,
    }
}

/// Says where the server listens: the first line on stdout, for a supervisor to read the port from.
fn announce(addr: SocketAddr) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "strata serve: listening on http://{addr}");
    let _ = out.flush();
    tracing::info!("listening on http://{addr}");
}

/// What `/strata/model` shows: the file, the architecture, the split and the flags the server started with.
fn model_info(
    loaded: &super::Loaded,
    id: &str,
    a: &ServeArgs,
    max_context: usize,
) -> anyhow::Result<serde_json::Value> {
    let m = &loaded.model;
    let facts = ModelFacts::of(&m.file, &loaded.path)?;
    let stages = strata::server::switch::split_json(m);
    let mut info = serde_json::to_value(&facts)?;
    let more = serde_json::json!({
        "id": id,
        "aliases": a.alias,
        "n_embd": m.cfg.n_embd,
        "n_head": m.cfg.n_head,
        "n_head_kv": m.cfg.n_head_kv,
        "context": max_context,
        "kv_type": a.engine.kv.to_string(),
        "kv_resident": a.engine.placement.kv_resident,
        "vram_reserve_mib": a.engine.placement.vram_reserve_mib,
        "split": stages,
        "split_summary": stages_summary(m),
        "conversation_cache": {"slots": a.cache.cache_slots, "mib": a.cache.cache_mib},
        "flags": redacted_args(std::env::args().skip(1)),
    });
    if let (Some(info), serde_json::Value::Object(more)) = (info.as_object_mut(), more) {
        info.extend(more);
    }
    Ok(info)
}

/// The settings view of the flags the server started with, each as given (`parallel` None without
/// `--parallel`: the server's default, whose number `/health`'s slots and the plan's `sequences` say), so
/// that settings saved from it keep the defaults defaults.
fn settings_of(a: &ServeArgs, path: &std::path::Path) -> EngineSettings {
    let p = &a.engine.placement;
    let spec = &a.engine.spec;
    EngineSettings {
        model_path: Some(path.display().to_string()),
        devices: p.devices.clone(),
        layer_split: p.layer_split.clone().unwrap_or_default(),
        kv: a.engine.kv,
        kv_resident: p.kv_resident,
        max_context: a.engine.max_context,
        vram_reserve_mib: p.vram_reserve_mib,
        cache_slots: u32::try_from(a.cache.cache_slots).unwrap_or(u32::MAX),
        cache_mib: a.cache.cache_mib,
        threads: a.engine.threads,
        parallel: a.parallel,
        engine: EngineLocation::Local,
        speculative: match (&spec.draft_model, spec.spec) {
            (Some(p), _) => Speculative::Draft { model_path: p.display().to_string() },
            (None, Some(SpecKind::Ngram)) => Speculative::Ngram,
            (None, _) => Speculative::Off,
        },
        draft_max: spec.draft_max,
        experts: p.experts.spec(),
        draft_min: spec.draft_min,
        // Checked when the draft loaded (a list that does not parse never gets this far).
        draft_devices: spec
            .draft_devices
            .as_deref()
            .and_then(|l| strata::plan::draft::parse_indices(l).ok())
            .unwrap_or_default(),
    }
}

/// The command line with an API key given on it replaced by `***`.
fn redacted_args(args: impl Iterator<Item = String>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for a in args {
        if out.last().is_some_and(|l| l == "--api-key") {
            out.push("***".into());
        } else if a.starts_with("--api-key=") {
            out.push("--api-key=***".into());
        } else {
            out.push(a);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_and_keys() {
        assert!(host_ip("localhost").unwrap().is_loopback());
        assert!(host_ip("::1").unwrap().is_loopback());
        assert!(!host_ip("0.0.0.0").unwrap().is_loopback());
        assert!(host_ip("example.com").is_err());
        let args = ["serve", "--api-key", "s3cret", "--api-key=other", "--port", "0"].map(String::from);
        assert_eq!(redacted_args(args.into_iter()), ["serve", "--api-key", "***", "--api-key=***", "--port", "0"]);
    }
}
