//! Telemetry of one engine: a ring buffer of device samples (free and total memory per device) and engine
//! events (parked, restored, restore_fallback, sample_failed, evicted, oom_averted, ...), with subscribers
//! that receive every new entry. It never blocks the engine: a subscriber that went away is dropped.

use std::collections::VecDeque;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Mutex;
use std::time::Instant;

use crate::sync::LockUnpoisoned;

mod events;

pub use events::{DeviceSample, EngineEvent, Entry, Event, Fallback, RestoreKind, Summary};

/// Entries kept of each kind by default; older ones are dropped.
pub const RING_ENTRIES: usize = 4096;

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
        let mut ring = self.ring.lock_unpoisoned();
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
        let mut ring = self.ring.lock_unpoisoned();
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
        self.ring.lock_unpoisoned().subscribers.push(f);
    }

    /// Subscribers now.
    pub fn subscribers(&self) -> usize {
        self.ring.lock_unpoisoned().subscribers.len()
    }

    /// Samples and events recorded after `since_ms`, oldest first.
    pub fn since(&self, since_ms: f64) -> (Vec<DeviceSample>, Vec<Event>) {
        let ring = self.ring.lock_unpoisoned();
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
