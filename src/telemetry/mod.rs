//! Telemetry of one engine: a ring buffer of device samples (free and total memory per device) and engine
//! events (parked, restored, restore_fallback, sample_failed, evicted, oom_averted, ...), with subscribers
//! that receive every new entry. It never blocks the engine: a subscriber that went away is dropped.

use std::collections::VecDeque;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Mutex;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::cache::RestoreKind;
use crate::engine::session::Fallback;

/// Entries kept of each kind by default; older ones are dropped.
pub const RING_ENTRIES: usize = 4096;

/// Free memory of one device at one moment (`free_bytes` is None when the sample failed).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
pub struct DeviceSample {
    pub t_ms: f64,
    pub device: usize,
    #[cfg_attr(feature = "ts", ts(type = "number | null"))]
    pub free_bytes: Option<u64>,
    #[cfg_attr(feature = "ts", ts(type = "number"))]
    pub total_bytes: u64,
}

/// The figures of one served request: the `strata` object of a server reply and the `request_done` event.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
pub struct Summary {
    /// The engine's serial number of the request (1, 2, ...): the order it was served in.
    pub job: u64,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens the live sequence or a restored snapshot already held.
    pub reused: usize,
    /// Prompt tokens read (prefilled) for this request.
    pub read: usize,
    /// Prompt tokens that are earlier replies sent back unchanged, taken as they were generated (not
    /// retokenized), so the live sequence's copy of them is reused.
    #[serde(default)]
    pub kept_reply_tokens: usize,
    pub prompt_ms: f64,
    pub gen_ms: f64,
    pub prompt_tok_s: f64,
    pub gen_tok_s: f64,
    pub queue_ms: f64,
    pub drafts_accepted: usize,
    pub drafts_proposed: usize,
    pub restored: Option<RestoreKind>,
    pub restored_tokens: Option<usize>,
    pub fallback: Option<Fallback>,
}

/// What an engine event says, by kind: the schema of every event in the ring, in `/strata/telemetry`,
/// `/strata/events` and the desktop app's chart. (Serialized as `{"event": kind, ...fields}`.)
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum EngineEvent {
    ModelLoaded {
        model: String,
        max_context: usize,
    },
    /// The live sequence was parked in the conversation cache.
    Parked {
        tokens: usize,
        ms: f64,
        #[cfg_attr(feature = "ts", ts(type = "number"))]
        snapshot_bytes: u64,
        /// Conversations parked now, and their bytes.
        parked: usize,
        #[cfg_attr(feature = "ts", ts(type = "number"))]
        bytes: u64,
        #[cfg_attr(feature = "ts", ts(type = "number"))]
        evictions: u64,
    },
    /// The live sequence could not be parked (no room in the budget, or host memory refused).
    NotParked {
        tokens: usize,
        #[cfg_attr(feature = "ts", ts(type = "number"))]
        bytes: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
    Evicted {
        tokens: usize,
        #[cfg_attr(feature = "ts", ts(type = "number"))]
        bytes: u64,
    },
    Restored {
        kind: RestoreKind,
        tokens: usize,
        ms: f64,
        #[cfg_attr(feature = "ts", ts(type = "number"))]
        restored_bytes: u64,
        parked: usize,
        #[cfg_attr(feature = "ts", ts(type = "number"))]
        bytes: u64,
    },
    /// The restore gate refused a cache hit: restoring would leave `device` under its reserve.
    RestoreFallback {
        device: usize,
        free_mib: f64,
        need_mib: f64,
        reserve_mib: f64,
        tokens: usize,
    },
    SampleFailed {
        device: usize,
        /// Failed samples so far in this session.
        #[cfg_attr(feature = "ts", ts(type = "number"))]
        count: u64,
    },
    /// A restore's allocation failed and was rolled back; the prompt is reread.
    OomAverted {
        error: String,
        tokens: usize,
    },
    RequestDone(Summary),
    /// A fault injected into a simulated device (`POST /strata/sim`).
    SimFault {
        device: usize,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[cfg_attr(feature = "ts", ts(type = "number"))]
        pressure_mib: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[cfg_attr(feature = "ts", ts(type = "number"))]
        leave_free_mib: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        fail_samples: Option<u32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        fail_alloc: Option<u32>,
    },
    /// The desktop app restarted its engine (it died or was killed).
    EngineRestarted {
        reason: String,
        restarts: u32,
    },
}

impl EngineEvent {
    /// The kind, as serialized in the `event` field.
    pub fn kind(&self) -> &'static str {
        match self {
            EngineEvent::ModelLoaded { .. } => "model_loaded",
            EngineEvent::Parked { .. } => "parked",
            EngineEvent::NotParked { .. } => "not_parked",
            EngineEvent::Evicted { .. } => "evicted",
            EngineEvent::Restored { .. } => "restored",
            EngineEvent::RestoreFallback { .. } => "restore_fallback",
            EngineEvent::SampleFailed { .. } => "sample_failed",
            EngineEvent::OomAverted { .. } => "oom_averted",
            EngineEvent::RequestDone(_) => "request_done",
            EngineEvent::SimFault { .. } => "sim_fault",
            EngineEvent::EngineRestarted { .. } => "engine_restarted",
        }
    }
}

/// An engine event as recorded: when, its kind and its fields (a JSON object that follows [`EngineEvent`]).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Event {
    pub t_ms: f64,
    pub event: String,
    #[serde(flatten)]
    pub fields: serde_json::Map<String, serde_json::Value>,
}

#[cfg(feature = "ts")]
mod ts_event {
    //! `Event` in TypeScript: `{ t_ms } & EngineEvent` (the fields follow the kind's schema).
    use ts_rs::{Config, TypeVisitor, TS};

    impl TS for super::Event {
        type WithoutGenerics = Self;
        type OptionInnerType = Self;
        fn name(_: &Config) -> String {
            "TelemetryEvent".to_owned()
        }
        fn inline(cfg: &Config) -> String {
            format!("{{ t_ms: number, }} & {}", super::EngineEvent::name(cfg))
        }
        fn decl(cfg: &Config) -> String {
            format!("type TelemetryEvent = {};", Self::inline(cfg))
        }
        fn decl_concrete(cfg: &Config) -> String {
            Self::decl(cfg)
        }
        fn visit_dependencies(v: &mut impl TypeVisitor) {
            v.visit::<super::EngineEvent>();
        }
        fn output_path() -> Option<std::path::PathBuf> {
            Some("TelemetryEvent.ts".into())
        }
    }
}

/// A sample or an event (a sample has no `event` field).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS), ts(rename = "TelemetryEntry"))]
#[serde(untagged)]
pub enum Entry {
    Event(Event),
    Sample(DeviceSample),
}

/// Receives every new entry; returns false when it wants no more (it is then dropped).
pub type Subscriber = Box<dyn FnMut(&Entry) -> bool + Send>;

#[derive(Default)]
struct Ring {
    samples: VecDeque<DeviceSample>,
    events: VecDeque<Event>,
    subscribers: Vec<Subscriber>,
}

pub struct Telemetry {
    start: Instant,
    ring: Mutex<Ring>,
    /// Entries kept of each kind.
    capacity: usize,
}

impl Default for Telemetry {
    fn default() -> Self {
        Telemetry::with_capacity(RING_ENTRIES)
    }
}

impl Telemetry {
    pub fn new() -> Telemetry {
        Telemetry::default()
    }

    /// A ring keeping the last `capacity` samples and the last `capacity` events (at least one of each).
    pub fn with_capacity(capacity: usize) -> Telemetry {
        Telemetry { start: Instant::now(), ring: Mutex::new(Ring::default()), capacity: capacity.max(1) }
    }

    /// Milliseconds since the engine started.
    pub fn now_ms(&self) -> f64 {
        self.start.elapsed().as_secs_f64() * 1e3
    }

    fn publish(&self, ring: &mut Ring, entry: Entry) {
        ring.subscribers.retain_mut(|s| s(&entry));
    }

    pub fn sample(&self, device: usize, free_bytes: Option<u64>, total_bytes: u64) {
        let s = DeviceSample { t_ms: self.now_ms(), device, free_bytes, total_bytes };
        let mut ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        if ring.samples.len() >= self.capacity {
            ring.samples.pop_front();
        }
        ring.samples.push_back(s.clone());
        self.publish(&mut ring, Entry::Sample(s));
    }

    /// Records an engine event.
    pub fn emit(&self, event: EngineEvent) {
        let fields = match serde_json::to_value(&event) {
            Ok(serde_json::Value::Object(mut m)) => {
                m.remove("event");
                serde_json::Value::Object(m)
            }
            _ => serde_json::Value::Null,
        };
        self.event(event.kind(), fields);
    }

    /// Records an event `kind` with `fields` (a JSON object; other values are recorded under "value").
    fn event(&self, kind: &str, fields: serde_json::Value) {
        let fields = match fields {
            serde_json::Value::Object(m) => m,
            serde_json::Value::Null => serde_json::Map::new(),
            v => serde_json::Map::from_iter([("value".to_owned(), v)]),
        };
        let e = Event { t_ms: self.now_ms(), event: kind.to_owned(), fields };
        let mut ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        if ring.events.len() >= self.capacity {
            ring.events.pop_front();
        }
        ring.events.push_back(e.clone());
        self.publish(&mut ring, Entry::Event(e));
    }

    /// Every new entry from now on.
    pub fn subscribe(&self) -> Receiver<Entry> {
        let (tx, rx): (Sender<Entry>, _) = channel();
        self.subscribe_with(Box::new(move |e| tx.send(e.clone()).is_ok()));
        rx
    }

    /// Calls `f` with every new entry from now on, under the ring's lock (it must not block), until it
    /// returns false.
    pub fn subscribe_with(&self, f: Subscriber) {
        self.ring.lock().unwrap_or_else(|e| e.into_inner()).subscribers.push(f);
    }

    /// Subscribers now.
    pub fn subscribers(&self) -> usize {
        self.ring.lock().unwrap_or_else(|e| e.into_inner()).subscribers.len()
    }

    /// Samples and events recorded after `since_ms`, oldest first.
    pub fn since(&self, since_ms: f64) -> (Vec<DeviceSample>, Vec<Event>) {
        let ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        (
            ring.samples.iter().filter(|s| s.t_ms > since_ms).cloned().collect(),
            ring.events.iter().filter(|e| e.t_ms > since_ms).cloned().collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_publishes_and_forgets_the_oldest() {
        let t = Telemetry::new();
        let rx = t.subscribe();
        t.sample(1, Some(100), 200);
        t.event("parked", serde_json::json!({"tokens": 5}));
        assert!(matches!(rx.try_recv().unwrap(), Entry::Sample(DeviceSample { device: 1, .. })));
        match rx.try_recv().unwrap() {
            Entry::Event(e) => assert_eq!((e.event.as_str(), e.fields["tokens"].as_u64()), ("parked", Some(5))),
            other => panic!("{other:?}"),
        }
        for i in 0..RING_ENTRIES + 10 {
            t.event("evicted", serde_json::json!({ "i": i }));
        }
        let (samples, events) = t.since(-1.0);
        assert_eq!((samples.len(), events.len()), (1, RING_ENTRIES));
        assert_eq!(events[0].fields["i"].as_u64(), Some(10));
        drop(rx);
        t.event("x", serde_json::Value::Null); // a gone subscriber is dropped, not an error
    }
}
