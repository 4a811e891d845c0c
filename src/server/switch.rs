//! Switching the model and settings of a running `strata serve` (`POST /strata/model/load`), instead of a
//! process restart: the new model is loaded beside the one serving (which goes on answering meanwhile),
//! then, between requests, the engine parks its live conversations in the cache under the old model's
//! identity and starts a session over the new model, which takes the cache over; the old model is freed
//! when the last request made for it lets go of it. A conversation that comes back to the old model later
//! restores from the cache instead of being read again.
//!
//! Requests wait while the switch takes its turn (a lease: every request that tokenizes for the served
//! model holds it from its start to its place in the queue), so none is ever run on a model other than
//! the one it was tokenized for. Settings that only a new process applies (the devices, the reserve,
//! the engine's location, speculative decoding) are refused with `needs_restart`: the desktop app then
//! restarts the engine, as before. A failed switch leaves the old model serving.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use crate::device::DeviceSet;
use crate::engine::session::SessionConfig;
use crate::gguf::GgufFile;
use crate::model::Model;
use crate::plan::facts::ModelFacts;
use crate::plan::settings::{EngineLocation, EngineSettings, Speculative};
use crate::sync::LockUnpoisoned;
use crate::tokenizer::{ChatTemplate, Tokenizer};

use super::api::{self, Queued};
use super::error::ApiError;
use super::fair::ClientKey;
use super::openai::Checked;
use super::worker::{EngineParts, Msg, SwitchOrder, Switched, Task};
use super::{App, ServedModel};

/// How long a request waits for a switch under way before it is answered 503.
pub const LEASE_WAIT: Duration = Duration::from_secs(600);

const MIB: u64 = 1 << 20;

/// The model being served, replaced by a switch, and the lease requests hold on it.
pub struct ModelSlot {
    current: RwLock<Arc<ServedModel>>,
    /// Read: a request preparing for the current model (from its start until it is queued). Write: a switch
    /// taking its turn.
    lease: tokio::sync::RwLock<()>,
    /// One switch at a time (held by the task that loads and switches, which a client leaving does not end).
    switching: Arc<tokio::sync::Mutex<()>>,
    /// Every model file served by this process: they may be loaded again (besides the library's).
    served_paths: Mutex<Vec<PathBuf>>,
    /// The model the server started with: its file, and the chat template and pooling it ran with
    /// (`--chat-template-file`, `--pooling`), which it runs with again when a switch comes back to it.
    start: Option<StartModel>,
}

struct StartModel {
    path: PathBuf,
    template_source: String,
    pooling: crate::model::config::Pooling,
}

impl ModelSlot {
    pub fn new(model: ServedModel) -> ModelSlot {
        let paths: Vec<PathBuf> =
            model.settings.model_path.iter().filter_map(|p| std::fs::canonicalize(p).ok()).collect();
        let start = paths.first().map(|p| StartModel {
            path: p.clone(),
            template_source: model.template.source().to_owned(),
            pooling: model.model.cfg.pooling,
        });
        ModelSlot {
            start,
            current: RwLock::new(Arc::new(model)),
            lease: tokio::sync::RwLock::new(()),
            switching: Arc::new(tokio::sync::Mutex::new(())),
            served_paths: Mutex::new(paths),
        }
    }

    /// The model served now.
    pub fn current(&self) -> Arc<ServedModel> {
        self.current.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn replace(&self, model: ServedModel) {
        if let Some(p) = model.settings.model_path.as_ref().and_then(|p| std::fs::canonicalize(p).ok()) {
            let mut paths = self.served_paths.lock_unpoisoned();
            if !paths.contains(&p) {
                paths.push(p);
            }
        }
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(model);
    }

    /// The lease of a request that prepares for the current model: while it is held, the model does not
    /// change. Waits for a switch under way, up to [`LEASE_WAIT`].
    pub async fn lease(&self) -> Result<tokio::sync::RwLockReadGuard<'_, ()>, ApiError> {
        tokio::time::timeout(LEASE_WAIT, self.lease.read()).await.map_err(|_| ApiError::switching_models())
    }
}

/// A settings change that a running engine cannot take: the field, and why.
pub fn needs_restart(old: &EngineSettings, new: &EngineSettings) -> Option<(&'static str, String)> {
    let restart = |field: &'static str, what: &str| {
        Some((field, format!("changing {what} needs the engine started again (a new `strata serve` with its flags)")))
    };
    if new.engine != EngineLocation::Local {
        return Some(("engine", "a server switches its own engine only: engine.kind is local".into()));
    }
    if new.devices.trim() != old.devices.trim() {
        return restart("devices", "the devices");
    }
    if new.vram_reserve_mib != old.vram_reserve_mib {
        return restart("vram_reserve_mib", "the memory kept free on each GPU");
    }
    let speculative_same = new.speculative == old.speculative
        && new.draft_max == old.draft_max
        && new.draft_min == old.draft_min
        && new.draft_devices == old.draft_devices;
    if !speculative_same || matches!(new.speculative, Speculative::Draft { .. }) {
        return restart("speculative", "speculative decoding, or switching with a draft model,");
    }
    None
}

/// What a switch loads: the model with its tokenizer and template, and the engine's parts for it.
struct Prepared {
    served: ServedModel,
    parts: EngineParts,
}

/// Loads the model `settings` name onto `devices` (the devices of the server: their ledgers go on counting
/// what every model holds), beside the one serving.
fn prepare(settings: &EngineSettings, devices: DeviceSet, app: &App, generation: u64) -> Result<Prepared, ApiError> {
    let field = |e: crate::plan::settings::FieldError| ApiError::invalid(&e.field, e.message);
    let path = settings.model_path.clone().ok_or_else(|| ApiError::invalid("model_path", "name the model to load"))?;
    let file = GgufFile::open(Path::new(&path))
        .map_err(|e| ApiError::invalid("model_path", format!("{path}: cannot read it: {e}")))?;
    let file = Arc::new(file);
    // The settings checked field by field, and the model planned on the devices alone...
    let alone = settings.plan(&file).map_err(field)?;
    if let Some(problem) = alone.problem {
        // (A GPU's free memory is the driver's: the model served now is not in it.)
        return Err(ApiError::conflict(
            "model_does_not_fit",
            format!(
                "{path} does not fit on the devices as they are now (the model served now holds part of them): \
                 {problem}; if it fits them alone, start the engine again with it (`strata serve -m {path}`)"
            ),
        ));
    }
    // ...then beside the model served now (the server's devices hold it).
    let mut opts = settings.load_options().map_err(field)?;
    opts.devices = devices;
    opts.batch = app.opts.batch;
    let sequences = settings.sequences(&file, &opts).map_err(field)?;
    let beside = crate::plan::plan_with_draft(&file, &opts, None, sequences, None)
        .map_err(|e| ApiError::invalid("model_path", format!("{path}: {e}")))?;
    if let Some(problem) = beside.problem {
        return Err(ApiError::conflict(
            "model_does_not_fit",
            format!(
                "{path} does not fit beside the model served now: {problem}; start the engine again with it \
                 (`strata serve -m {path}`), which frees the old one first"
            ),
        ));
    }
    let t0 = Instant::now();
    let mut model = Model::from_file_with(file.clone(), &opts)
        .map_err(|e| ApiError::conflict("model_load_failed", format!("cannot load {path}: {e}")))?;
    let tokenizer = Tokenizer::from_gguf(&file)
        .map_err(|e| ApiError::invalid("model_path", format!("cannot load the tokenizer of {path}: {e}")))?;
    // Back to the model the server started with: with the template and pooling it started with.
    let start = app.models.start.as_ref().filter(|s| std::fs::canonicalize(&path).is_ok_and(|p| p == s.path));
    let template = match start {
        Some(s) => {
            model.cfg.pooling = s.pooling;
            ChatTemplate::for_gguf(&file, &s.template_source, "the chat template the server started with")
        }
        None => ChatTemplate::from_gguf(&file),
    }
    .map_err(|e| ApiError::invalid("model_path", format!("cannot read the chat template of {path}: {e}")))?;
    file.advise_willneed();
    let max_context = opts.max_context.unwrap_or(model.cfg.n_ctx_train);
    let facts =
        ModelFacts::of(&file, Path::new(&path)).map_err(|e| ApiError::invalid("model_path", format!("{path}: {e}")))?;
    let id = model_id(Path::new(&path));
    let info = info_of(&facts, &model, &id, settings, max_context, &app.opts.aliases);
    tracing::info!("model switch: {path} loaded beside the served model in {:.0} ms", t0.elapsed().as_secs_f64() * 1e3);
    let model = Arc::new(model);
    let tokenizer = Arc::new(tokenizer);
    let threads = settings
        .threads
        .map(usize::from)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let session = SessionConfig {
        kv_type: settings.kv,
        max_context,
        cache_slots: settings.cache_slots as usize,
        cache_budget_bytes: settings.cache_mib.saturating_mul(MIB),
    };
    let parts = EngineParts {
        model: model.clone(),
        tokenizer: tokenizer.clone(),
        threads,
        session,
        spec: app.opts.spec.clone(),
        parallel: if app.opts.spec.is_some() { 1 } else { sequences },
    };
    let served = ServedModel {
        sampling: crate::sample::defaults::SamplingDefaults::of(&model.file),
        grammars: crate::grammar::Grammars::new(tokenizer.clone()),
        model,
        tokenizer,
        template,
        id,
        max_context,
        created: api::unix_now(),
        info,
        settings: settings.clone(),
        generation,
    };
    Ok(Prepared { served, parts })
}

/// The id a model is served under: its file name without `.gguf`.
pub fn model_id(path: &Path) -> String {
    path.file_name().map(|n| n.to_string_lossy().trim_end_matches(".gguf").to_owned()).unwrap_or_else(|| "model".into())
}

/// The split as `/strata/model` shows it: each stage's device, layers and bytes.
pub fn split_json(m: &Model) -> Vec<Value> {
    m.placement
        .stages
        .iter()
        .map(|s| {
            json!({
                "device": s.device.name(),
                "index": s.device.index,
                "layers": [s.layers.start, s.layers.end],
                "weights_bytes": s.weights_bytes,
                "scratch_bytes": s.scratch_bytes,
                "kv_bytes_per_token": s.kv_bytes_per_token,
            })
        })
        .collect()
}

/// What `/strata/model` shows of a model a switch loaded (the keys of the one the server started with).
fn info_of(
    facts: &ModelFacts,
    m: &Model,
    id: &str,
    settings: &EngineSettings,
    max_context: usize,
    aliases: &[String],
) -> Value {
    let stages = split_json(m);
    let summary: Vec<String> =
        m.placement.stages.iter().map(|s| format!("{}[{}..{}]", s.device.kind, s.layers.start, s.layers.end)).collect();
    let mut flags = vec!["-m".to_owned(), settings.model_path.clone().unwrap_or_default()];
    flags.extend(settings.serve_flags());
    let mut info = serde_json::to_value(facts).unwrap_or_else(|_| json!({}));
    let more = json!({
        "id": id,
        "aliases": aliases,
        "n_embd": m.cfg.n_embd,
        "n_head": m.cfg.n_head,
        "n_head_kv": m.cfg.n_head_kv,
        "context": max_context,
        "kv_type": settings.kv.to_string(),
        "kv_resident": settings.kv_resident,
        "vram_reserve_mib": settings.vram_reserve_mib,
        "split": stages,
        "split_summary": summary.join(" "),
        "conversation_cache": {"slots": settings.cache_slots, "mib": settings.cache_mib},
        "flags": flags,
    });
    if let (Some(info), Value::Object(more)) = (info.as_object_mut(), more) {
        info.extend(more);
    }
    info
}

/// Whether `path` may be loaded: a model this process served, or one the model library lists (the models
/// folder, the Hugging Face cache), or with `--load-any-path` any file. A client must not learn what other
/// files the server can read.
fn loadable(app: &App, path: &str) -> Result<(), ApiError> {
    let refuse = || {
        ApiError::invalid(
            "model_path",
            format!(
                "{path} is not a model this server can load: it loads the models of GET /strata/library/local \
                 (the models folder, {}, and the Hugging Face cache) and those it served",
                app.library.models_dir.display()
            ),
        )
    };
    let real = std::fs::canonicalize(path).map_err(|_| refuse())?;
    if app.opts.load_any_path {
        return Ok(());
    }
    if app.models.served_paths.lock_unpoisoned().contains(&real) {
        return Ok(());
    }
    let listed = app.library.local().into_iter().any(|m| std::fs::canonicalize(&m.path).is_ok_and(|p| p == real));
    if listed {
        Ok(())
    } else {
        Err(refuse())
    }
}

/// `POST /strata/model/load` with settings (those of `GET /strata/settings`, `model_path` naming the model):
/// switches the engine to them, and answers what `/strata/model` shows now with what the switch did.
pub async fn load(State(app): State<App>, headers: HeaderMap, body: Body) -> Response {
    match load_inner(&app, &headers, body).await {
        Ok(v) => Json(v).into_response(),
        Err(e) => {
            app.shared.metrics.reject(e.code.unwrap_or(e.kind));
            e.into_response()
        }
    }
}

async fn load_inner(app: &App, headers: &HeaderMap, body: Body) -> Result<Value, ApiError> {
    let bytes = api::read_body(headers, body, 1 << 16, app.opts.body_timeout).await?;
    let settings: EngineSettings = super::openai::parse(&bytes)?;
    settings.check().map_err(|e| ApiError::invalid(&e.field, e.message))?;
    let Ok(one) = app.models.switching.clone().try_lock_owned() else {
        return Err(ApiError::conflict("switch_busy", "a model switch is under way: wait for it to end"));
    };
    let current = app.model();
    if let Some((field, why)) = needs_restart(&current.settings, &settings) {
        return Err(ApiError { param: Some(field.into()), ..ApiError::conflict("needs_restart", why) });
    }
    drop(current);
    let path = settings.model_path.clone().ok_or_else(|| ApiError::invalid("model_path", "name the model to load"))?;
    let t0 = Instant::now();
    // Loading and switching go on if the client leaves, holding the one-switch guard to their end: the lease
    // must not be let go half-way, nor a second switch plan beside a model not yet counted.
    let a2 = app.clone();
    let p2 = path.clone();
    let switched = tokio::spawn(async move {
        let _one = one;
        let (a3, p3) = (a2.clone(), p2.clone());
        tokio::task::spawn_blocking(move || loadable(&a3, &p3))
            .await
            .map_err(|e| ApiError::internal(format!("checking the path failed: {e}")))??;
        let current = a2.model();
        let devices = current.model.placement.devices.clone();
        let generation = current.generation + 1;
        drop(current);
        let a3 = a2.clone();
        let prepared = tokio::task::spawn_blocking(move || prepare(&settings, devices, &a3, generation))
            .await
            .map_err(|e| ApiError::internal(format!("loading the model failed: {e}")))??;
        take_turn(&a2, prepared).await
    })
    .await
    .map_err(|e| ApiError::internal(format!("the switch failed: {e}")))??;
    let now = app.model();
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    tracing::info!(
        "model switch: serving {} ({path}) after {ms:.0} ms; {} conversation(s) parked, {} in the cache",
        now.id,
        switched.parked,
        switched.cached
    );
    Ok(json!({
        "model": now.info,
        "switch": {"ms": ms, "engine_ms": switched.ms, "parked": switched.parked, "cached": switched.cached},
    }))
}

/// Waits for the requests prepared for the old model to be queued, hands the engine its new parts (it
/// takes them once those requests have ended), and serves the new model.
async fn take_turn(app: &App, prepared: Prepared) -> Result<Switched, ApiError> {
    let _turn = app.models.lease.write().await;
    let (tx, rx) = tokio::sync::oneshot::channel();
    let Prepared { served, parts } = prepared;
    let order = SwitchOrder { parts, reply: tx };
    let queued = Queued {
        prompt: Vec::new(),
        kept_reply_tokens: 0,
        top_logprobs: 0,
        endpoint: "model_load",
        reply_format: None,
        client: ClientKey::of(Some("strata model switch"), None),
    };
    let checked =
        Checked { params: crate::engine::GenerateParams::default(), choices: 1, stream: false, include_usage: false };
    // The job's own channel stays open while the engine works (a closed one reads as a client gone).
    let (_replies, _guard): (tokio::sync::mpsc::Receiver<Msg>, _) =
        api::submit_task(app, Task::Switch(Box::new(order)), queued, checked)?;
    let done = rx.await.map_err(|_| ApiError::internal("the engine ended without finishing the switch"))?;
    let done = done.map_err(|e| {
        let after = match app.shared.unhealthy() {
            None => "; the model loaded before goes on serving",
            Some(_) => "",
        };
        ApiError::conflict("model_load_failed", format!("the engine could not start the new model: {e}{after}"))
    })?;
    let id = served.id.clone();
    let max_context = served.max_context;
    app.models.replace(served);
    app.shared.telemetry.emit(crate::telemetry::EngineEvent::ModelLoaded { model: id, max_context });
    for d in app.shared.devices.all() {
        app.shared.telemetry.sample(d.index, d.observe_free(), d.total_bytes());
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Model, split, KV, context, cache, threads and parallel change in the running engine; devices, the
    /// reserve, the engine's location and speculative decoding need a new process.
    #[test]
    fn what_needs_a_restart_is_named() {
        let old = EngineSettings { model_path: Some("/m/a.gguf".into()), ..EngineSettings::default() };
        let same = |f: fn(&mut EngineSettings)| {
            let mut s = old.clone();
            f(&mut s);
            needs_restart(&old, &s).map(|(field, _)| field)
        };
        assert_eq!(same(|s| s.model_path = Some("/m/b.gguf".into())), None);
        assert_eq!(same(|s| s.layer_split = "3".into()), None);
        assert_eq!(same(|s| s.kv = crate::model::KvType::Int8), None);
        assert_eq!(same(|s| s.max_context = Some(512)), None);
        assert_eq!(same(|s| s.cache_mib = 64), None);
        assert_eq!(same(|s| s.parallel = Some(2)), None);
        assert_eq!(same(|s| s.threads = Some(1)), None);
        assert_eq!(same(|s| s.devices = "sim:200".into()), Some("devices"));
        assert_eq!(same(|s| s.vram_reserve_mib = 64), Some("vram_reserve_mib"));
        assert_eq!(same(|s| s.speculative = Speculative::Ngram), Some("speculative"));
        let remote = EngineLocation::Remote {
            url: "http://127.0.0.1:9".into(),
            api_key: crate::plan::settings::RemoteKey::None,
            model: String::new(),
            allow_insecure: false,
        };
        let mut s = old.clone();
        s.engine = remote;
        assert_eq!(needs_restart(&old, &s).map(|(f, _)| f), Some("engine"));
    }
}
