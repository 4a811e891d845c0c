//! What telemetry records, by schema: device samples, engine events and a request's figures, with the reasons
//! they carry (a restore's kind, a fallback's reason). A leaf: the cache, the session and the server name these
//! types, and this module names none of theirs.

use serde::{Deserialize, Serialize};

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
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
pub struct Summary {
    /// The engine's serial number of the request (1, 2, ...): the order it was served in.
    pub job: u64,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Of the completion tokens, those of a chat reply's `<think>` block
    /// (`tokenizer::reasoning::reasoning_token_count`).
    #[serde(default)]
    pub reasoning_tokens: usize,
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

impl Summary {
    /// These figures without the ones that say how much of the prompt the cache or the live sequence already
    /// held (`--reuse-figures hide`): those would tell a client how much of another client's conversation its
    /// prompt shares. The prompt counts as read whole.
    pub fn without_reuse(&self) -> Summary {
        Summary {
            reused: 0,
            read: self.prompt_tokens,
            kept_reply_tokens: 0,
            prompt_tok_s: self.prompt_tokens as f64 / (self.prompt_ms / 1e3).max(1e-9),
            restored: None,
            restored_tokens: None,
            fallback: None,
            ..self.clone()
        }
    }
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

/// How much of a snapshot a restore brings back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
#[serde(rename_all = "snake_case")]
pub enum RestoreKind {
    /// The whole snapshot (the prompt extends it).
    Live,
    /// A prefix, at a checkpoint; the rest of the prompt is read.
    Checkpoint,
}

impl std::fmt::Display for RestoreKind {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str(match self {
            RestoreKind::Live => "live",
            RestoreKind::Checkpoint => "checkpoint",
        })
    }
}

/// Why a cache hit was reread instead of restored.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum Fallback {
    /// The restore gate refused: restoring would leave `device` under its reserve.
    Gate {
        device: usize,
        #[cfg_attr(feature = "ts", ts(type = "number"))]
        free_bytes: u64,
        #[cfg_attr(feature = "ts", ts(type = "number"))]
        need_bytes: u64,
        #[cfg_attr(feature = "ts", ts(type = "number"))]
        reserve_bytes: u64,
        tokens: usize,
    },
    /// An allocation of the restore failed; everything it took was released.
    AllocFailed { error: String, tokens: usize },
}
