//! What the HTTP side of `strata serve` shares with the engine thread: health, the queue's depth, the
//! telemetry ring, the devices, the cache's published contents, the metrics, and shutdown.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde::{Deserialize, Serialize};

use crate::device::DeviceSet;
use crate::sync::LockUnpoisoned;
use crate::telemetry::{Entry, Summary, Telemetry};

/// The engine events `/metrics` counts.
pub const CACHE_EVENTS: &[&str] =
    &["parked", "restored", "restore_fallback", "sample_failed", "evicted", "oom_averted", "not_parked"];

/// A parked conversation as `/strata/cache` shows it.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
pub struct ParkedView {
    pub tokens: usize,
    #[cfg_attr(feature = "ts", ts(type = "number"))]
    pub bytes: u64,
    /// When it was last used (parked), on the telemetry clock (ms since the server started).
    pub last_use_ms: f64,
    pub checkpoints: Vec<usize>,
}

/// The conversation cache as of the end of the last request.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
pub struct CacheView {
    pub slots: usize,
    /// Conversations parked now (`parked.len()`).
    pub slots_used: usize,
    #[cfg_attr(feature = "ts", ts(type = "number"))]
    pub budget_bytes: u64,
    #[cfg_attr(feature = "ts", ts(type = "number"))]
    pub bytes: u64,
    #[cfg_attr(feature = "ts", ts(type = "number"))]
    pub evictions: u64,
    pub live_tokens: usize,
    pub parked: Vec<ParkedView>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EndpointLabel {
    pub endpoint: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DeviceLabel {
    /// The device's index in --devices (the host's own index when it is not listed).
    pub device: String,
    pub kind: String,
}

/// The Prometheus metrics of `/metrics`.
pub struct Metrics {
    pub registry: Registry,
    pub requests: Family<EndpointLabel, Counter>,
    pub failed: Counter,
    pub cancelled: Counter,
    pub dropped: Counter,
    pub rejected: Family<KindLabel, Counter>,
    pub prompt_tokens: Counter,
    pub reused_tokens: Counter,
    pub generated_tokens: Counter,
    pub prompt_tok_s: Gauge<f64, AtomicU64>,
    pub gen_tok_s: Gauge<f64, AtomicU64>,
    pub queue_depth: Gauge,
    pub slots: Gauge,
    pub slots_busy: Gauge,
    pub cache_events: Family<KindLabel, Counter>,
    pub free_bytes: Family<DeviceLabel, Gauge<f64, AtomicU64>>,
    pub total_bytes: Family<DeviceLabel, Gauge<f64, AtomicU64>>,
}

impl Metrics {
    fn new() -> Metrics {
        let mut registry = Registry::with_prefix("strata");
        let m = Metrics {
            registry: Registry::default(),
            requests: Family::default(),
            failed: Counter::default(),
            cancelled: Counter::default(),
            dropped: Counter::default(),
            rejected: Family::default(),
            prompt_tokens: Counter::default(),
            reused_tokens: Counter::default(),
            generated_tokens: Counter::default(),
            prompt_tok_s: Gauge::default(),
            gen_tok_s: Gauge::default(),
            queue_depth: Gauge::default(),
            slots: Gauge::default(),
            slots_busy: Gauge::default(),
            cache_events: Family::default(),
            free_bytes: Family::default(),
            total_bytes: Family::default(),
        };
        registry.register("requests", "Requests served, by endpoint", m.requests.clone());
        registry.register(
            "requests_failed",
            "Requests the engine failed (out of memory, device faults)",
            m.failed.clone(),
        );
        registry.register(
            "requests_cancelled",
            "Requests whose client went away during generation",
            m.cancelled.clone(),
        );
        registry.register(
            "requests_dropped",
            "Queued requests whose client went away before they started",
            m.dropped.clone(),
        );
        registry.register("requests_rejected", "Requests refused before the engine, by reason", m.rejected.clone());
        registry.register("prompt_tokens", "Prompt tokens of served requests", m.prompt_tokens.clone());
        registry.register(
            "reused_tokens",
            "Prompt tokens reused (live prefix or conversation cache)",
            m.reused_tokens.clone(),
        );
        registry.register("generated_tokens", "Tokens generated", m.generated_tokens.clone());
        registry.register(
            "prompt_tokens_per_second",
            "Prompt processing speed of the last request",
            m.prompt_tok_s.clone(),
        );
        registry.register("generation_tokens_per_second", "Generation speed of the last request", m.gen_tok_s.clone());
        registry.register("queue_depth", "Requests waiting for the engine", m.queue_depth.clone());
        registry.register("slots", "Sequences the engine runs at once (--parallel)", m.slots.clone());
        registry.register("slots_busy", "Sequences generating now", m.slots_busy.clone());
        registry.register(
            "cache_events",
            "Conversation cache events: parked, restored, restore_fallback, evicted, oom_averted, not_parked",
            m.cache_events.clone(),
        );
        registry.register("device_free_bytes", "Free memory per device", m.free_bytes.clone());
        registry.register("device_total_bytes", "Total memory per device", m.total_bytes.clone());
        Metrics { registry, ..m }
    }

    /// Counts one served request.
    pub fn record(&self, endpoint: &str, s: &Summary) {
        self.requests.get_or_create(&EndpointLabel { endpoint: endpoint.to_owned() }).inc();
        self.prompt_tokens.inc_by(s.prompt_tokens as u64);
        self.reused_tokens.inc_by(s.reused as u64);
        self.generated_tokens.inc_by(s.completion_tokens as u64);
        if s.read > 0 {
            self.prompt_tok_s.set(s.prompt_tok_s);
        }
        if s.completion_tokens > 0 {
            self.gen_tok_s.set(s.gen_tok_s);
        }
    }

    pub fn reject(&self, why: &str) {
        self.rejected.get_or_create(&KindLabel { kind: why.to_owned() }).inc();
    }
}

/// State shared by the handlers and the engine thread.
pub struct Shared {
    pub telemetry: Arc<Telemetry>,
    pub devices: DeviceSet,
    health: Mutex<Option<String>>,
    /// Jobs sent to the engine and not yet started.
    pub waiting: AtomicUsize,
    /// Jobs ever put in the queue.
    pub accepted: AtomicU64,
    pub queue_cap: usize,
    /// The engine is serving a job.
    pub busy: AtomicBool,
    /// Sequences the engine runs at once (`--parallel`), and how many are generating now.
    pub slots: AtomicUsize,
    pub slots_busy: AtomicUsize,
    /// Per slot (index = the session's slot number): whether a request is on it now (`GET /slots`).
    /// Written by the engine thread with [`Shared::publish_slots`], together with the two counts above.
    slot_busy: Mutex<Vec<bool>>,
    pub cache: Mutex<CacheView>,
    pub metrics: Metrics,
    /// No new request is taken; queued ones are answered 503.
    pub shutting_down: AtomicBool,
    /// The request in flight ends at its next token (a second signal).
    pub cancel_in_flight: AtomicBool,
    pub exit_code: AtomicU8,
    /// Wakes the accept loop to stop.
    pub shutdown: tokio::sync::watch::Sender<bool>,
    /// Event-stream listeners: the device sampler runs while there is one.
    pub listeners: AtomicUsize,
    /// The device sampler is running.
    pub sampler_running: AtomicBool,
    /// Requests whose body is being read and prepared (at most [`PREPARING_LIMIT`]).
    pub preparing: tokio::sync::Semaphore,
    /// The replies generated so far by their text, with their tokens: a conversation sent back reuses them.
    pub replies: Mutex<crate::tokenizer::turns::ReplyTokens>,
    /// Whether a request's figures say how much of its prompt was reused (`--reuse-figures`): in its reply,
    /// in the `request_done` event and in `/metrics`.
    pub reuse_figures: bool,
}

/// Requests read and prepared at once before they reach the queue.
pub const PREPARING_LIMIT: usize = 64;

/// Exit status after a sticky GPU fault (sysexits' EX_TEMPFAIL): the supervisor restarts the server.
pub const EXIT_DEVICE_FAULT: u8 = 75;

impl Shared {
    pub fn new(telemetry: Arc<Telemetry>, devices: DeviceSet, queue_cap: usize, reuse_figures: bool) -> Arc<Shared> {
        let shared = Arc::new(Shared {
            telemetry,
            devices,
            health: Mutex::new(None),
            waiting: AtomicUsize::new(0),
            accepted: AtomicU64::new(0),
            queue_cap,
            busy: AtomicBool::new(false),
            slots: AtomicUsize::new(1),
            slots_busy: AtomicUsize::new(0),
            slot_busy: Mutex::new(vec![false]),
            cache: Mutex::new(CacheView::default()),
            metrics: Metrics::new(),
            shutting_down: AtomicBool::new(false),
            cancel_in_flight: AtomicBool::new(false),
            exit_code: AtomicU8::new(0),
            shutdown: tokio::sync::watch::channel(false).0,
            listeners: AtomicUsize::new(0),
            sampler_running: AtomicBool::new(false),
            preparing: tokio::sync::Semaphore::new(PREPARING_LIMIT),
            replies: Mutex::new(Default::default()),
            reuse_figures,
        });
        // Cache events are counted as the session emits them.
        let events = shared.metrics.cache_events.clone();
        shared.telemetry.subscribe_with(Box::new(move |e| {
            if let Entry::Event(e) = e {
                if CACHE_EVENTS.contains(&e.event.as_str()) {
                    events.get_or_create(&KindLabel { kind: e.event.clone() }).inc();
                }
            }
            true
        }));
        shared
    }

    /// Why the engine cannot serve, if it cannot.
    pub fn unhealthy(&self) -> Option<String> {
        self.health.lock_unpoisoned().clone()
    }

    /// Marks the engine unhealthy for good (a sticky GPU fault) and starts the shutdown that exits with
    /// [`EXIT_DEVICE_FAULT`].
    pub fn set_unhealthy(&self, why: String) {
        tracing::error!("{why}");
        *self.health.lock_unpoisoned() = Some(why);
        self.exit_code.store(EXIT_DEVICE_FAULT, Ordering::Release);
        self.begin_shutdown();
    }

    /// The engine runs `total` slots and a request is on each of `busy` (slot numbers, each below
    /// `total`): the per-slot flags of `/slots`, the counts of `/health` and `/metrics`, and `busy`.
    pub fn publish_slots(&self, total: usize, busy: impl IntoIterator<Item = usize>) {
        let mut flags = self.slot_busy.lock_unpoisoned();
        flags.clear();
        flags.resize(total, false);
        for slot in busy {
            if let Some(f) = flags.get_mut(slot) {
                *f = true;
            }
        }
        let n = flags.iter().filter(|&&b| b).count();
        self.slots.store(total, Ordering::Release);
        self.slots_busy.store(n, Ordering::Release);
        self.busy.store(n > 0, Ordering::Release);
    }

    /// Whether a request is on each slot now, slot 0 first.
    pub fn slot_flags(&self) -> Vec<bool> {
        self.slot_busy.lock_unpoisoned().clone()
    }

    pub fn begin_shutdown(&self) {
        self.shutting_down.store(true, Ordering::Release);
        self.shutdown.send_replace(true);
    }
}
