//! `strata serve`: an HTTP server (axum on tokio) over one engine. The OpenAI-compatible API is in
//! [`api`] and [`openai`], llama.cpp's native `/completion` and `/slots` in [`native`], the Strata API (health, devices, telemetry, events, cache, model, sim faults,
//! metrics) in [`status`], the engine thread and its FIFO queue in [`worker`], what they share in
//! [`state`], errors in OpenAI's shape in [`error`], the web UI at `/` in [`ui`].
//!
//! Connections are served by hyper directly (not `axum::serve`) so that the time a client may take to send
//! its headers is bounded, and so that shutdown is graceful: on SIGINT or SIGTERM the listener closes, queued
//! requests are answered 503, the request in flight finishes (a second signal ends it at its next token),
//! the event streams end, and the process exits 0 (75 after a sticky GPU fault).

pub mod anthropic;
pub mod api;
pub mod embeddings;
pub mod error;
pub mod fair;
pub mod guard;
pub mod library;
pub mod native;
pub mod openai;
pub mod responses;
pub mod state;
pub mod status;
pub mod switch;
pub mod ui;
pub mod worker;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use tower::ServiceExt;

use crate::engine::session::SessionConfig;
use crate::model::Model;
use crate::telemetry::Telemetry;
use crate::tokenizer::{ChatTemplate, Tokenizer};

use error::ApiError;
use state::Shared;
use worker::{EngineParts, Job};

/// `system_fingerprint` of every response: the engine and its version.
pub const FINGERPRINT: &str = concat!("strata-", env!("CARGO_PKG_VERSION"));

/// The loaded model, shared by the handlers (tokenizing, rendering, facts) and the engine thread.
pub struct ServedModel {
    pub model: Arc<Model>,
    pub tokenizer: Arc<Tokenizer>,
    pub template: ChatTemplate,
    /// The name clients use: the file name without `.gguf`.
    pub id: String,
    pub max_context: usize,
    /// Unix seconds when it was loaded (`created` of /v1/models).
    pub created: u64,
    /// What `/strata/model` shows.
    pub info: serde_json::Value,
    /// The settings it runs with (`GET /strata/settings`).
    pub settings: crate::plan::settings::EngineSettings,
    /// What a request gets for the sampling fields it does not send.
    pub sampling: crate::sample::defaults::SamplingDefaults,
    /// The grammar engine over the model's vocabulary (`response_format`, `grammar`, `json_schema`).
    pub grammars: crate::grammar::Grammars,
    /// 0 for the model the server started with, one more for each model a switch loaded since.
    pub generation: u64,
}

/// How the server runs.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    pub addr: SocketAddr,
    pub api_key: Option<String>,
    /// More names `/v1/models` lists for the served model (`--model-alias`).
    pub aliases: Vec<String>,
    /// Only the served id and the aliases are answered; another `model` is a 404 (`--strict-model`).
    pub strict_model: bool,
    pub max_body_bytes: u64,
    pub queue: usize,
    pub cors_origins: Vec<HeaderValue>,
    /// The `Host` names answered besides localhost and IP addresses (`--allowed-host`).
    pub allowed_hosts: guard::HostPolicy,
    /// Connections held at once; one more is answered 503 and closed (`--max-connections`).
    pub max_connections: usize,
    /// `/strata/events` streams open at once; one more is a 503 (`--max-event-streams`).
    pub max_event_streams: usize,
    /// How long a request may take from its arrival to its last token, queue included; then it ends with
    /// 504 (`--request-timeout-s`; None: no limit).
    pub request_timeout: Option<Duration>,
    /// Whether answers say how much of the prompt was reused from the cache (`usage.cached_tokens`, the
    /// `strata` figures): a client could learn from them how much another client's conversation shares
    /// with its prompt. On for a loopback server (one user's), off for one on the network unless
    /// `--reuse-figures show` (`--reuse-figures`).
    pub reuse_figures: bool,
    /// A built web UI on disk to serve at `/` instead of the one embedded in the binary (`--ui-dir`, made
    /// canonical: files whose real path leads out of it are not served); a directory without an
    /// index.html serves the page that lists the API.
    pub ui_dir: Option<PathBuf>,
    /// How long a client may take to send its request line and headers (then the connection is closed),
    /// and its body (then 408).
    pub header_timeout: Duration,
    pub body_timeout: Duration,
    /// Telemetry entries kept of each kind (samples, events).
    pub telemetry_entries: usize,
    pub batch: usize,
    pub threads: usize,
    pub session: SessionConfig,
    /// Speculative decoding (`--spec ngram`, `--draft-model`), or None.
    pub spec: Option<crate::engine::spec::SpecSetup>,
    /// Requests generating at once (`--parallel`).
    pub parallel: usize,
    /// Shut down when stdin reaches its end: a supervisor that dies (its end of the pipe closes) takes
    /// the server with it, on every OS.
    pub exit_with_stdin: bool,
    /// Where the model library downloads to and looks for models (`--models-dir`).
    pub models_dir: PathBuf,
    /// `POST /strata/model/load` loads any GGUF file, not only the library's (`--load-any-path`).
    pub load_any_path: bool,
}

/// What every handler gets.
#[derive(Clone)]
pub struct App {
    pub shared: Arc<Shared>,
    /// The model served now, which `POST /strata/model/load` replaces ([`switch`]).
    pub models: Arc<switch::ModelSlot>,
    pub opts: Arc<ServeOptions>,
    pub jobs: std::sync::mpsc::Sender<Job>,
    /// The model library: the Hub, the models folder, the downloads under way.
    pub library: Arc<crate::hub::library::Library>,
}

impl App {
    /// The model served now. A request that tokenizes for it holds the lease
    /// ([`switch::ModelSlot::lease`]) meanwhile, so that it runs on the model it was made for.
    pub fn model(&self) -> Arc<ServedModel> {
        self.models.current()
    }
}

/// The router: every path, the Host/Origin/body-type guard ([`guard`]), the API key check, CORS when asked
/// for, JSON 404 and 405.
pub fn router(app: App) -> Router {
    let protected = Router::new()
        .route("/v1/chat/completions", post(api::chat))
        .route("/v1/completions", post(api::completions))
        .route("/v1/responses", post(responses::responses))
        .route("/v1/embeddings", post(embeddings::embeddings))
        .route("/v1/messages", post(anthropic::messages_endpoint))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .route("/v1/models", get(api::models))
        .route("/v1/models/{id}", get(api::model))
        // The same without /v1, as llama-server serves them: clients configured with a base URL that has no
        // /v1 work too.
        .route("/chat/completions", post(api::chat))
        .route("/completions", post(api::completions))
        .route("/responses", post(responses::responses))
        .route("/embeddings", post(embeddings::embeddings_bare))
        .route("/models", get(api::models))
        // llama-server's native endpoints (its `/completions` alias stays the OpenAI path above).
        .route("/completion", post(native::completion))
        .route("/slots", get(native::slots))
        .route("/strata/devices", get(status::devices))
        .route("/strata/telemetry", get(status::telemetry))
        .route("/strata/events", get(status::events))
        .route("/strata/cache", get(status::cache))
        .route("/strata/model", get(status::model))
        .route("/strata/model/load", post(switch::load))
        .route("/strata/settings", get(status::settings))
        .route("/strata/plan", post(status::plan))
        .route("/strata/sim", post(status::sim))
        .route("/strata/library/search", get(library::search))
        .route("/strata/library/files", get(library::files))
        .route("/strata/library/fit", get(library::fit))
        .route("/strata/library/picks", get(library::picks_route))
        .route("/strata/library/local", get(library::local))
        .route("/strata/library/delete", post(library::delete))
        .route("/strata/library/downloads", get(library::downloads).post(library::start))
        .route("/strata/library/downloads/{id}/cancel", post(library::cancel))
        .route("/metrics", get(status::metrics))
        .route_layer(axum::middleware::from_fn_with_state(app.clone(), require_key));
    let mut r = Router::new().route("/health", get(status::health)).merge(protected);
    match app.opts.ui_dir.clone() {
        Some(dir) if dir.join("index.html").is_file() => {
            r = r.fallback(move |req: Request| async move {
                match ui::serve_dir(&dir, &req) {
                    Some(resp) => resp,
                    None => not_found().await,
                }
            })
        }
        None if ui::embedded() => {
            r = r.fallback(|req: Request| async move {
                match ui::serve_embedded(&req) {
                    Some(resp) => resp,
                    None => not_found().await,
                }
            })
        }
        _ => r = r.route("/", get(status::index)).fallback(not_found),
    }
    let mut r = r.method_not_allowed_fallback(|| async { ApiError::method_not_allowed() }).with_state(app.clone());
    if !app.opts.cors_origins.is_empty() {
        let origins = app.opts.cors_origins.clone();
        let allow: tower_http::cors::AllowOrigin = if origins.iter().any(|o| o == "*") {
            tower_http::cors::AllowOrigin::any()
        } else {
            tower_http::cors::AllowOrigin::predicate(move |origin, _| {
                origin.to_str().is_ok_and(|o| guard::cors_allows(&origins, o))
            })
        };
        let cors = tower_http::cors::CorsLayer::new()
            .allow_origin(allow)
            .allow_methods([Method::GET, Method::POST, Method::OPTIONS])
            .allow_headers([header::AUTHORIZATION, header::CONTENT_TYPE, header::HeaderName::from_static("x-api-key")])
            .max_age(Duration::from_secs(600));
        r = r.layer(cors);
    }
    // Outermost: a foreign Host or Origin, or a body that is not JSON, is refused before CORS and the key.
    r.layer(axum::middleware::from_fn_with_state(app, guard::check))
}

async fn not_found() -> Response {
    ApiError::not_found("no such path: see GET / for what this server serves").into_response()
}

/// Compares without stopping at the first difference.
fn same_key(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn require_key(State(app): State<App>, req: Request, next: Next) -> Response {
    if let Some(key) = &app.opts.api_key {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
            // Anthropic's clients send the key as X-Api-Key.
            .or_else(|| req.headers().get("x-api-key").and_then(|v| v.to_str().ok()))
            .map(str::trim);
        if !given.is_some_and(|g| same_key(g.as_bytes(), key.as_bytes())) {
            app.shared.metrics.reject("unauthorized");
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(req).await
}

/// Runs the server until a signal or a sticky fault; returns the exit status (0, or 75 after a fault).
/// `on_listening` gets the bound address (with `--port 0`, the port picked) before any request is taken.
pub fn serve(opts: ServeOptions, model: ServedModel, on_listening: impl FnOnce(SocketAddr)) -> anyhow::Result<u8> {
    let telemetry = Arc::new(Telemetry::with_capacity(opts.telemetry_entries));
    let devices = model.model.placement.devices.clone();
    let shared = Shared::new(telemetry, devices, opts.queue, opts.reuse_figures);
    let (jobs_tx, jobs_rx) = std::sync::mpsc::channel();
    worker::spawn(
        EngineParts {
            model: model.model.clone(),
            tokenizer: model.tokenizer.clone(),
            threads: opts.threads,
            session: opts.session.clone(),
            spec: opts.spec.clone(),
            parallel: opts.parallel,
        },
        shared.clone(),
        jobs_rx,
    )?;
    shared
        .telemetry
        .emit(crate::telemetry::EngineEvent::ModelLoaded { model: model.id.clone(), max_context: model.max_context });
    for d in shared.devices.all() {
        shared.telemetry.sample(d.index, d.observe_free(), d.total_bytes());
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        // Rendering and tokenizing run here; a few threads keep up with one engine.
        .max_blocking_threads(4)
        .thread_name("strata-http")
        .enable_all()
        .build()?;
    if opts.exit_with_stdin {
        let s = shared.clone();
        std::thread::Builder::new().name("strata-stdin".into()).spawn(move || {
            let mut sink = [0u8; 256];
            let mut stdin = std::io::stdin().lock();
            while matches!(std::io::Read::read(&mut stdin, &mut sink), Ok(n) if n > 0) {}
            tracing::info!("stdin closed (the supervisor is gone): shutting down now");
            s.begin_shutdown();
            s.cancel_in_flight.store(true, Ordering::Release);
        })?;
    }
    let library = crate::hub::library::Library::from_env(opts.models_dir.clone());
    let models = Arc::new(switch::ModelSlot::new(model));
    let app = App { shared: shared.clone(), models, opts: Arc::new(opts), jobs: jobs_tx, library };
    rt.block_on(accept_loop(app, on_listening))?;
    // Engine and sampler threads are left to the process's end: nothing is in flight any more.
    rt.shutdown_timeout(Duration::from_secs(1));
    Ok(shared.exit_code.load(Ordering::Acquire))
}

async fn accept_loop(app: App, on_listening: impl FnOnce(SocketAddr)) -> anyhow::Result<()> {
    use hyper_util::rt::{TokioIo, TokioTimer};
    let listener = tokio::net::TcpListener::bind(app.opts.addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", app.opts.addr))?;
    on_listening(listener.local_addr()?);
    let shared = app.shared.clone();
    let mut shutdown = shared.shutdown.subscribe();
    tokio::spawn(signals(shared.clone()));
    let header_timeout = app.opts.header_timeout;
    let max_connections = app.opts.max_connections;
    let connections = Arc::new(tokio::sync::Semaphore::new(max_connections));
    let metrics_shared = app.shared.clone();
    let router = router(app);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    while !*shutdown.borrow() {
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    // Out of file descriptors and the like: wait a little rather than spin.
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = shutdown.changed() => break,
        };
        let _ = stream.set_nodelay(true);
        let Ok(permit) = connections.clone().try_acquire_owned() else {
            metrics_shared.metrics.reject("too_many_connections");
            tokio::spawn(refuse_connection(stream, max_connections));
            continue;
        };
        // The handlers read the peer's address from the request (the queue's lanes, `fair`).
        let peer = fair::Peer(peer.ip());
        let svc = hyper_util::service::TowerToHyperService::new(router.clone().map_request(
            move |mut req: Request<hyper::body::Incoming>| {
                req.extensions_mut().insert(peer);
                req
            },
        ));
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(header_timeout)
            .max_buf_size(64 * 1024)
            .serve_connection(TokioIo::new(stream), svc);
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            let _ = conn.await;
            drop(permit);
        });
    }
    drop(listener);
    tracing::info!("shutting down: no new requests; finishing the one in flight");
    // After a second signal the request in flight ends at its next token; a client that then does not take
    // its last bytes within a few seconds is not waited for.
    let forced = async {
        while !shared.cancel_in_flight.load(Ordering::Acquire) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    };
    tokio::select! {
        _ = graceful.shutdown() => {}
        _ = forced => tracing::info!("connections still open after the second signal: closing them"),
    }
    tracing::info!("stopped");
    Ok(())
}

/// Answers a connection over `--max-connections` with a 503 that says so, and closes it. The request is
/// read first (briefly) so that the client sees the answer rather than a reset.
async fn refuse_connection(mut stream: tokio::net::TcpStream, limit: usize) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let e = ApiError::too_many_connections(limit);
    let body = e.body().to_string();
    let head = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\n\
         connection: close\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    let mut sink = [0u8; 4096];
    let _ = tokio::time::timeout(Duration::from_millis(200), stream.read(&mut sink)).await;
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(body.as_bytes()).await?;
        stream.shutdown().await
    })
    .await;
}

/// First SIGINT/SIGTERM: shut down gracefully; a second one: end the request in flight now.
async fn signals(shared: Arc<Shared>) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
            tracing::warn!("cannot listen for signals: SIGINT and SIGTERM end the process at once");
            return;
        };
        let mut seen = 0;
        loop {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            seen += 1;
            if seen == 1 {
                tracing::info!("signal received: shutting down (send it again to end the request in flight now)");
                shared.begin_shutdown();
            } else {
                tracing::info!("second signal: ending the request in flight");
                shared.cancel_in_flight.store(true, Ordering::Release);
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
        shared.begin_shutdown();
    }
}
