//! The Strata API beside the OpenAI one: `/health`, `/strata/devices`, `/strata/telemetry`,
//! `/strata/events` (SSE), `/strata/cache`, `/strata/model`, `/strata/sim` (sim devices only) and
//! `/metrics` (Prometheus text), plus the page at `/`.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::device::{Device, DeviceKind, Fault, Purpose};
use crate::plan::settings::{EngineLocation, EngineSettings, PlanReply};
use crate::sync::LockUnpoisoned;
use crate::telemetry::{DeviceSample, EngineEvent, Entry};

use super::error::ApiError;
use super::state::{DeviceLabel, Shared};
use super::App;

/// Entries an event-stream client may fall behind by before new ones are skipped for it.
pub const EVENTS_BACKLOG: usize = 4096;

/// How often the event stream samples every device's free memory.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(500);

/// `GET /health`: 200 when the model is loaded and the engine can serve; 503 with the reason otherwise.
pub async fn health(State(app): State<App>) -> Response {
    let s = &app.shared;
    let queue = s.waiting.load(Ordering::Acquire);
    let busy = s.busy.load(Ordering::Acquire);
    if let Some(why) = s.unhealthy() {
        return (StatusCode::SERVICE_UNAVAILABLE, Json(json!({"status": "unhealthy", "reason": why}))).into_response();
    }
    if s.shutting_down.load(Ordering::Acquire) {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "shutting_down", "reason": "the server is shutting down"})),
        )
            .into_response();
    }
    let accepted = s.accepted.load(Ordering::Acquire);
    let slots = json!({"total": s.slots.load(Ordering::Acquire), "busy": s.slots_busy.load(Ordering::Acquire)});
    Json(json!({"status": "ok", "model": app.model().id, "busy": busy, "queue": queue, "queue_limit": s.queue_cap,
        "accepted": accepted, "slots": slots}))
    .into_response()
}

fn kind_name(k: &DeviceKind) -> &'static str {
    match k {
        DeviceKind::Cpu => "cpu",
        DeviceKind::Sim { .. } => "sim",
        DeviceKind::Emu { .. } => "emu",
        DeviceKind::Cuda { .. } => "cuda",
    }
}

/// One device as `/strata/devices` shows it: its memory now, what Strata holds on it and for what.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
pub struct DeviceView {
    pub index: usize,
    pub name: String,
    /// cpu, sim, emu or cuda.
    pub kind: String,
    /// The host (CPU memory), whether or not --devices lists it.
    pub host: bool,
    #[cfg_attr(feature = "ts", ts(type = "number | null"))]
    pub free_bytes: Option<u64>,
    #[cfg_attr(feature = "ts", ts(type = "number"))]
    pub total_bytes: u64,
    #[cfg_attr(feature = "ts", ts(type = "number"))]
    pub reserve_bytes: u64,
    #[cfg_attr(feature = "ts", ts(type = "number"))]
    pub strata_bytes: u64,
    /// Bytes by purpose (weights, kv, scratch, staging).
    #[cfg_attr(feature = "ts", ts(type = "{ [key in string]?: number }"))]
    pub by_purpose_bytes: BTreeMap<String, u64>,
    #[cfg_attr(feature = "ts", ts(type = "number"))]
    pub high_water_bytes: u64,
    #[cfg_attr(feature = "ts", ts(type = "{ [key in string]?: number }"))]
    pub high_water_by_purpose_bytes: BTreeMap<String, u64>,
    #[cfg_attr(feature = "ts", ts(type = "number"))]
    pub refused_allocations: u64,
    #[cfg_attr(feature = "ts", ts(type = "number"))]
    pub failed_samples: u64,
    /// The layer ranges placed on it, [start, end).
    pub layers: Vec<(usize, usize)>,
}

/// `GET /strata/devices`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
pub struct DevicesView {
    pub devices: Vec<DeviceView>,
}

/// `GET /strata/telemetry`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
pub struct TelemetryView {
    /// The server's clock now (ms since it started).
    pub now_ms: f64,
    pub samples: Vec<DeviceSample>,
    pub events: Vec<crate::telemetry::Event>,
}

fn purposes(bytes: &[u64; 4]) -> BTreeMap<String, u64> {
    Purpose::ALL.iter().zip(bytes).map(|(p, b)| (json!(p).as_str().unwrap_or("").to_owned(), *b)).collect()
}

fn device_view(app: &App, d: &Arc<Device>) -> DeviceView {
    let u = d.usage();
    let layers = app
        .model()
        .model
        .placement
        .stages
        .iter()
        .filter(|s| Arc::ptr_eq(&s.device, d))
        .map(|s| (s.layers.start, s.layers.end))
        .collect();
    DeviceView {
        index: d.index,
        name: d.name(),
        kind: kind_name(&d.kind).to_owned(),
        host: d.is_host(),
        free_bytes: d.observe_free(),
        total_bytes: d.total_bytes(),
        reserve_bytes: d.reserve_bytes,
        strata_bytes: u.total_bytes,
        by_purpose_bytes: purposes(&u.by_purpose_bytes),
        high_water_bytes: u.high_water_bytes,
        high_water_by_purpose_bytes: purposes(&u.high_water_by_purpose_bytes),
        refused_allocations: u.refused_allocations,
        failed_samples: u.failed_samples,
        layers,
    }
}

/// `GET /strata/devices`.
pub async fn devices(State(app): State<App>) -> Response {
    let devices = app.shared.devices.all().iter().map(|d| device_view(&app, d)).collect();
    Json(DevicesView { devices }).into_response()
}

/// `GET /strata/telemetry?since_ms=T`: samples and events after T (ms on the server's clock).
pub async fn telemetry(State(app): State<App>, Query(q): Query<HashMap<String, String>>) -> Response {
    let since_ms = match q.get("since_ms").map(|s| s.parse::<f64>()) {
        None => -1.0,
        Some(Ok(t)) if t.is_finite() => t,
        Some(_) => {
            return ApiError::invalid("since_ms", "since_ms must be a number of milliseconds (the server's clock)")
                .into_response()
        }
    };
    let t = &app.shared.telemetry;
    let (samples, events) = t.since(since_ms);
    Json(TelemetryView { now_ms: t.now_ms(), samples, events }).into_response()
}

/// Ends with the listener count decremented, whatever ends the stream.
struct Listener(Arc<Shared>);

impl Drop for Listener {
    fn drop(&mut self) {
        self.0.listeners.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Samples every device while someone listens to the event stream; ends when nobody does. One at a time.
fn start_sampler(shared: Arc<Shared>) {
    if shared.sampler_running.compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire).is_err() {
        return;
    }
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(SAMPLE_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tick.tick().await;
            if shared.listeners.load(Ordering::Acquire) == 0 || shared.shutting_down.load(Ordering::Acquire) {
                shared.sampler_running.store(false, Ordering::Release);
                // A listener that arrived as this one stopped starts its own.
                if shared.listeners.load(Ordering::Acquire) > 0 && !shared.shutting_down.load(Ordering::Acquire) {
                    start_sampler(shared.clone());
                }
                break;
            }
            let s = shared.clone();
            let _ = tokio::task::spawn_blocking(move || {
                for d in s.devices.all() {
                    s.telemetry.sample(d.index, d.observe_free(), d.total_bytes());
                }
            })
            .await;
        }
    });
}

/// `GET /strata/events`: SSE with `event: sample` (a device's free memory, about twice a second per device)
/// and `event: engine` (every engine event as it happens). It ends when the server shuts down. At most
/// `--max-event-streams` are open at once; one more is a 503.
pub async fn events(State(app): State<App>) -> Response {
    let shared = app.shared.clone();
    let limit = app.opts.max_event_streams;
    if shared.listeners.fetch_add(1, Ordering::AcqRel) >= limit {
        shared.listeners.fetch_sub(1, Ordering::AcqRel);
        shared.metrics.reject("too_many_event_streams");
        return ApiError::too_many_streams(limit).into_response();
    }
    let guard = Listener(shared.clone());
    // Bounded: a client that stops reading loses entries (the ring still has them), never the server's memory.
    let (tx, rx) = tokio::sync::mpsc::channel::<Entry>(EVENTS_BACKLOG);
    shared.telemetry.subscribe_with(Box::new(move |e| {
        !matches!(tx.try_send(e.clone()), Err(tokio::sync::mpsc::error::TrySendError::Closed(_)))
    }));
    start_sampler(shared.clone());
    let shutdown = shared.shutdown.subscribe();
    let s = futures_util::stream::unfold((rx, shutdown, guard), |(mut rx, mut shutdown, guard)| async move {
        if *shutdown.borrow() {
            return None;
        }
        let entry = tokio::select! {
            e = rx.recv() => e?,
            _ = shutdown.changed() => return None,
        };
        let (name, data) = match &entry {
            Entry::Sample(s) => ("sample", serde_json::to_string(s).unwrap_or_default()),
            Entry::Event(e) => ("engine", serde_json::to_string(e).unwrap_or_default()),
        };
        Some((Ok::<_, Infallible>(Event::default().event(name).data(data)), (rx, shutdown, guard)))
    });
    Sse::new(s).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))).into_response()
}

/// `GET /strata/cache`: the parked conversations and the cache's limits, as of the last request.
pub async fn cache(State(app): State<App>) -> Response {
    let v = app.shared.cache.lock_unpoisoned().clone();
    Json(v).into_response()
}

/// `GET /strata/model`.
pub async fn model(State(app): State<App>) -> Response {
    Json(app.model().info.clone()).into_response()
}

/// `GET /strata/settings`: the settings the server runs with, as the web UI's settings view edits them.
pub async fn settings(State(app): State<App>) -> Response {
    Json(app.model().settings.clone()).into_response()
}

/// `POST /strata/plan` with settings: the served model's plan under them and the flags that apply them, or
/// 400 naming the field at fault (`param`). A server cannot restart itself with new flags: applying them is
/// restarting `strata serve` with `flags`.
pub async fn plan(State(app): State<App>, headers: HeaderMap, body: Body) -> Response {
    match plan_inner(&app, &headers, body).await {
        Ok(r) => Json(r).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn plan_inner(app: &App, headers: &HeaderMap, body: Body) -> Result<PlanReply, ApiError> {
    let bytes = super::api::read_body(headers, body, 1 << 16, app.opts.body_timeout).await?;
    let settings: EngineSettings = super::openai::parse(&bytes)?;
    let served = &app.model().settings;
    if settings.model_path.as_ref().is_some_and(|p| Some(p) != served.model_path.as_ref()) {
        return Err(ApiError::invalid(
            "model_path",
            format!(
                "this server plans only the model it serves ({}); leave model_path empty",
                served.model_path.as_deref().unwrap_or("?")
            ),
        ));
    }
    // A client must not learn what files the server can read: only the draft model the server runs with.
    if let crate::plan::settings::Speculative::Draft { model_path } = &settings.speculative {
        let served_draft = match &served.speculative {
            crate::plan::settings::Speculative::Draft { model_path } => Some(model_path),
            _ => None,
        };
        if served_draft != Some(model_path) {
            return Err(ApiError::invalid(
                "speculative.model_path",
                match served_draft {
                    Some(p) => format!("this server plans only the draft model it runs with ({p})"),
                    None => "this server runs without a draft model: it plans none".to_owned(),
                },
            ));
        }
    }
    if settings.engine != EngineLocation::Local {
        return Err(ApiError::invalid("engine", "a server plans its own engine only: engine.kind is local"));
    }
    let file = app.model().model.file.clone();
    let planned = tokio::task::spawn_blocking(move || settings.plan(&file).map(|p| (p, settings.serve_flags())))
        .await
        .map_err(|e| ApiError::internal(format!("the plan failed: {e}")))?;
    match planned {
        Ok((plan, flags)) => Ok(PlanReply { plan, flags }),
        Err(e) => Err(ApiError::invalid(&e.field, e.message)),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SimRequest {
    device: usize,
    pressure_mib: Option<u64>,
    leave_free_mib: Option<u64>,
    fail_samples: Option<u32>,
    fail_alloc: Option<u32>,
}

/// `POST /strata/sim` (only when a sim device is in --devices): squeezes a simulated device while the
/// server runs. One of pressure_mib, leave_free_mib, fail_samples, fail_alloc.
pub async fn sim(State(app): State<App>, headers: HeaderMap, body: Body) -> Response {
    match sim_inner(&app, &headers, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn sim_inner(app: &App, headers: &HeaderMap, body: Body) -> Result<Response, ApiError> {
    let sims: Vec<&Arc<Device>> =
        app.shared.devices.devices.iter().filter(|d| matches!(d.kind, DeviceKind::Sim { .. })).collect();
    if sims.is_empty() {
        return Err(ApiError::not_found("/strata/sim is only served when --devices lists a sim device"));
    }
    let bytes = super::api::read_body(headers, body, 1 << 16, app.opts.body_timeout).await?;
    let r: SimRequest = super::openai::parse(&bytes)?;
    let mib = 1u64 << 20;
    let given =
        [r.pressure_mib.is_some(), r.leave_free_mib.is_some(), r.fail_samples.is_some(), r.fail_alloc.is_some()];
    if given.iter().filter(|g| **g).count() != 1 {
        return Err(ApiError::invalid(
            "",
            "give exactly one of pressure_mib, leave_free_mib, fail_samples and fail_alloc",
        ));
    }
    let Some(device) = sims.iter().find(|d| d.index == r.device) else {
        let names: Vec<String> = sims.iter().map(|d| format!("{} ({})", d.index, d.name())).collect();
        return Err(ApiError::invalid(
            "device",
            format!("device {} is not a sim device: the sim devices are {}", r.device, names.join(", ")),
        ));
    };
    let fault = if let Some(m) = r.pressure_mib {
        Fault::PressureBytes(m.saturating_mul(mib))
    } else if let Some(m) = r.leave_free_mib {
        Fault::LeaveFreeBytes(m.saturating_mul(mib))
    } else if let Some(n) = r.fail_samples {
        Fault::FailSamples(n)
    } else {
        Fault::FailAllocs(r.fail_alloc.unwrap_or(0))
    };
    device.inject(fault).map_err(|e| ApiError::invalid("device", e.to_string()))?;
    let event = EngineEvent::SimFault {
        device: device.index,
        pressure_mib: r.pressure_mib,
        leave_free_mib: r.leave_free_mib,
        fail_samples: r.fail_samples,
        fail_alloc: r.fail_alloc,
    };
    // What was applied: the event's one fault field.
    let mut what = serde_json::to_value(&event).unwrap_or(Value::Null);
    if let Some(m) = what.as_object_mut() {
        m.remove("event");
        m.remove("device");
    }
    app.shared.telemetry.emit(event);
    app.shared.telemetry.sample(device.index, device.observe_free(), device.total_bytes());
    tracing::info!("device {}: sim fault applied: {what}", device.name());
    Ok(Json(json!({"device": device.index, "applied": what, "free_bytes": device.observe_free()})).into_response())
}

/// `GET /metrics`: Prometheus text (OpenMetrics).
pub async fn metrics(State(app): State<App>) -> Response {
    let s = &app.shared;
    let m = &s.metrics;
    m.queue_depth.set(s.waiting.load(Ordering::Acquire) as i64);
    m.slots.set(s.slots.load(Ordering::Acquire) as i64);
    m.slots_busy.set(s.slots_busy.load(Ordering::Acquire) as i64);
    for d in s.devices.all() {
        let label = DeviceLabel { device: d.index.to_string(), kind: kind_name(&d.kind).to_owned() };
        if let Some(free) = d.observe_free() {
            m.free_bytes.get_or_create(&label).set(free as f64);
        }
        m.total_bytes.get_or_create(&label).set(d.total_bytes() as f64);
    }
    let mut text = String::new();
    if let Err(e) = prometheus_client::encoding::text::encode(&mut text, &m.registry) {
        return ApiError::internal(format!("cannot encode the metrics: {e}")).into_response();
    }
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], text).into_response()
}

/// `GET /` when there is no built web UI: a page that says what is here.
pub async fn index(State(app): State<App>) -> Response {
    let id = html_escape(&app.model().id);
    Html(format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>Strata</title></head><body>\
         <h1>Strata</h1><p>Serving <b>{id}</b>. This server speaks the OpenAI API at <code>/v1</code> \
         (<code>POST /v1/chat/completions</code>, <code>POST /v1/completions</code>, <code>GET /v1/models</code>) \
         and the Strata API: <a href=\"/health\">/health</a>, <a href=\"/strata/devices\">/strata/devices</a>, \
         <a href=\"/strata/telemetry\">/strata/telemetry</a>, <code>/strata/events</code> (SSE), \
         <a href=\"/strata/cache\">/strata/cache</a>, <a href=\"/strata/model\">/strata/model</a>, \
         <a href=\"/metrics\">/metrics</a>. With an API key, the /v1, /strata and /metrics paths need \
         <code>Authorization: Bearer KEY</code>.</p>\
         <p>Every endpoint, with a curl example, is in the README: \
         <a href=\"https://github.com/strata-llm/strata#strata-serve\">strata serve</a>.</p></body></html>"
    ))
    .into_response()
}

fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}
