//! The engine's settings as the desktop app and the web UI edit them: one typed value for the flags of
//! `strata serve` (devices, split, KV, context, reserve, conversation cache, threads, requests at once,
//! speculative decoding)
//! plus where the engine runs (local, or a remote OpenAI-compatible endpoint). Validation names the field
//! at fault, so a form can show the message beside it; `serve_flags` is the command line that applies them,
//! and `plan` counts the sequences the server will run at once.
//! A remote endpoint's API key is never a plain value of these settings once kept: [`RemoteKey`] says only
//! whether one is kept (the desktop app holds the key in a file of its own), and an `http://` endpoint is
//! refused unless it is loopback or the user allowed it (`allow_insecure`).

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::device::DeviceSet;
use crate::gguf::GgufFile;
use crate::model::{ExpertsPlacement, KvType, LoadOptions, Model, ModelError, DEFAULT_BATCH};
use crate::split::{self, SplitError};

use super::draft::{self, DraftInput, DraftVocabError};
use super::parallel::{self, MAX_PARALLEL, SPECULATIVE_ONE_AT_A_TIME};
use super::{Plan, PlanError};

const MIB: u64 = 1 << 20;
/// The largest reserve or cache budget accepted, in MiB (16 TiB), as the CLI's flags.
pub const MAX_MIB: u64 = 1 << 24;
/// The most conversations the cache may hold.
pub const MAX_CACHE_SLOTS: u32 = 4096;
/// The most drafts per verification (`--draft-max`'s range is 1 to this).
pub const MAX_DRAFTS: u32 = 256;

/// Speculative decoding: where drafts come from.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Speculative {
    /// Plain decoding, one token per step.
    #[default]
    Off,
    /// `--spec ngram`: drafts are what followed an earlier match of the last tokens (no second model).
    Ngram,
    /// `--draft-model PATH`: a smaller model with the same vocabulary drafts, on `draft_devices`.
    Draft { model_path: String },
}

fn default_experts() -> String {
    "auto".into()
}

fn default_draft_max() -> u32 {
    16
}

fn default_draft_min() -> u32 {
    1
}

/// Where the engine runs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum EngineLocation {
    /// A `strata serve` child process of the app.
    #[default]
    Local,
    /// An OpenAI-compatible endpoint elsewhere (vLLM, llama.cpp's server, another Strata).
    Remote {
        /// Base URL, e.g. `https://gpu-box:8000` (the `/v1` paths are added). `http://` only to a loopback
        /// host or with `allow_insecure`.
        url: String,
        /// Whether a key is kept, or a new one to keep (settings stored before keys were kept apart held
        /// the key itself as a string: it reads as a new key, which the app then moves out).
        api_key: RemoteKey,
        /// The model to ask for (empty: the first the endpoint lists).
        model: String,
        /// Accept an `http://` URL to a host that is not loopback: the key and the chats then cross the
        /// network in clear text. Off in settings stored before it existed.
        #[serde(default)]
        allow_insecure: bool,
    },
}

/// The characters of a kept key shown as its hint (its last ones).
pub const KEY_HINT_CHARS: usize = 4;
/// A key shorter than this shows no hint (4 characters of a short key would give away too much of it).
pub const KEY_HINT_MIN_CHARS: usize = 12;

/// A remote endpoint's API key as the settings carry it. The key itself is in the settings only on its way
/// in (`New`, from the form); what is stored and what the page reads back is `Kept` with a hint, or `None`.
/// The page sends back what it read to keep the key, `New` to replace it, `None` to clear it.
#[derive(Clone, Default, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum RemoteKey {
    /// No key: requests carry no `Authorization` header.
    #[default]
    None,
    /// A key is kept, not here; `hint` is its last [`KEY_HINT_CHARS`] characters (empty for a key shorter
    /// than [`KEY_HINT_MIN_CHARS`]).
    Kept { hint: String },
    /// A key typed in the form, to keep in place of any other. Never written to the settings file, never
    /// sent to the page.
    New { key: String },
}

impl RemoteKey {
    /// What the settings say of a kept `key`: `Kept` with its hint, or `None` for an empty one.
    pub fn kept_of(key: &str) -> RemoteKey {
        let chars = key.chars().count();
        if chars == 0 {
            return RemoteKey::None;
        }
        let hint = if chars >= KEY_HINT_MIN_CHARS {
            key.chars().skip(chars - KEY_HINT_CHARS).collect()
        } else {
            String::new()
        };
        RemoteKey::Kept { hint }
    }
}

/// Never the key itself, so that a settings value in a log or an error gives nothing away.
impl std::fmt::Debug for RemoteKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RemoteKey::None => f.write_str("None"),
            RemoteKey::Kept { hint } => f.debug_struct("Kept").field("hint", hint).finish(),
            RemoteKey::New { key } => write!(f, "New {{ key: <{} characters> }}", key.chars().count()),
        }
    }
}

/// The tagged form (`{"kind": "none" | "kept" | "new", ...}`), or a string: how settings and pages before
/// keys were kept apart said the key itself (`""`: none).
impl<'de> Deserialize<'de> for RemoteKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
        enum Tagged {
            None,
            Kept { hint: String },
            New { key: String },
        }
        struct KeyVisitor;
        impl<'de> serde::de::Visitor<'de> for KeyVisitor {
            type Value = RemoteKey;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(
                    r#"{"kind": "none"}, {"kind": "kept", "hint"}, {"kind": "new", "key"} or the key as a string"#,
                )
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<RemoteKey, E> {
                Ok(if v.is_empty() { RemoteKey::None } else { RemoteKey::New { key: v.to_owned() } })
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<RemoteKey, A::Error> {
                Ok(match Tagged::deserialize(serde::de::value::MapAccessDeserializer::new(map))? {
                    Tagged::None => RemoteKey::None,
                    Tagged::Kept { hint } => RemoteKey::Kept { hint },
                    Tagged::New { key } => RemoteKey::New { key },
                })
            }
        }
        d.deserialize_any(KeyVisitor)
    }
}

/// The settings of the engine.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
#[serde(deny_unknown_fields)]
pub struct EngineSettings {
    /// The GGUF file to serve (None: none chosen yet).
    pub model_path: Option<String>,
    /// `--devices`: `cpu`, `cuda:0,cuda:1`, `sim:200,sim:400`, ...
    pub devices: String,
    /// `--layer-split`: empty (by free memory), `15`, `10,20`.
    pub layer_split: String,
    pub kv: KvType,
    pub kv_resident: Option<u32>,
    pub max_context: Option<u32>,
    #[cfg_attr(feature = "ts", ts(type = "number"))]
    pub vram_reserve_mib: u64,
    pub cache_slots: u32,
    #[cfg_attr(feature = "ts", ts(type = "number"))]
    pub cache_mib: u64,
    pub threads: Option<u16>,
    /// `--parallel`: requests generating at once, 1 to [`MAX_PARALLEL`], each with its own KV. None: the
    /// server's default, which [`plan`](EngineSettings::plan) counts as the server would pick it now
    /// (`plan::parallel`: on the CPU as many as the host holds at the full context, up to 4; 1 with a GPU
    /// stage or speculative decoding). Settings stored before it existed read as None.
    #[serde(default)]
    pub parallel: Option<u32>,
    pub engine: EngineLocation,
    /// Speculative decoding (settings stored before it existed read as off).
    #[serde(default)]
    pub speculative: Speculative,
    /// `--draft-max`: most drafts per verification, 1 to [`MAX_DRAFTS`].
    #[serde(default = "default_draft_max")]
    pub draft_max: u32,
    /// `--draft-min`: fewer drafts than this are not verified (the step decodes plainly).
    #[serde(default = "default_draft_min")]
    pub draft_min: u32,
    /// `--draft-devices`: the draft model's devices as indices into `devices` (empty: the first).
    #[serde(default)]
    pub draft_devices: Vec<usize>,
    /// `--experts`: where a mixture of experts' experts live: `auto`, `cpu`, `gpu` or `cpu:A..B`
    /// (settings stored before it existed read as `auto`).
    #[serde(default = "default_experts")]
    pub experts: String,
}

impl Default for EngineSettings {
    fn default() -> Self {
        EngineSettings {
            model_path: None,
            devices: "cpu".into(),
            layer_split: String::new(),
            kv: KvType::F16,
            kv_resident: None,
            max_context: None,
            vram_reserve_mib: 0,
            cache_slots: 4,
            cache_mib: 4096,
            threads: None,
            parallel: None,
            engine: EngineLocation::Local,
            speculative: Speculative::Off,
            draft_max: default_draft_max(),
            draft_min: default_draft_min(),
            draft_devices: Vec::new(),
            experts: default_experts(),
        }
    }
}

/// A plan and the `strata serve` flags of the settings it was made for.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
pub struct PlanReply {
    pub plan: Plan,
    pub flags: Vec<String>,
}

/// A value refused, and the field that holds it (the names of [`EngineSettings`]; `engine.url` for a
/// remote endpoint's).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
#[error("{field}: {message}")]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

impl FieldError {
    pub fn new(field: &str, message: impl Into<String>) -> FieldError {
        FieldError { field: field.to_owned(), message: message.into() }
    }
}

impl EngineSettings {
    /// Checks each value on its own (ranges, syntax); the model and the devices are checked by [`plan`].
    ///
    /// [`plan`]: EngineSettings::plan
    pub fn check(&self) -> Result<(), FieldError> {
        if self.devices.trim().is_empty() {
            return Err(FieldError::new("devices", "list at least one device, e.g. cpu or cuda:0"));
        }
        if !self.layer_split.trim().is_empty() {
            split::parse_points(self.layer_split.trim()).map_err(|e| FieldError::new("layer_split", e.to_string()))?;
        }
        if self.kv_resident == Some(0) {
            return Err(FieldError::new("kv_resident", "keep at least 1 position resident, or leave it empty for all"));
        }
        ExpertsPlacement::parse(&self.experts).map_err(|e| FieldError::new("experts", e.to_string()))?;
        if self.max_context == Some(0) {
            return Err(FieldError::new("max_context", "the context holds at least 1 position"));
        }
        if self.vram_reserve_mib > MAX_MIB {
            return Err(FieldError::new("vram_reserve_mib", format!("at most {MAX_MIB} MiB")));
        }
        if self.cache_slots > MAX_CACHE_SLOTS {
            return Err(FieldError::new("cache_slots", format!("at most {MAX_CACHE_SLOTS} conversations")));
        }
        if self.cache_mib > MAX_MIB {
            return Err(FieldError::new("cache_mib", format!("at most {MAX_MIB} MiB")));
        }
        if let Some(t) = self.threads {
            if !(1..=1024).contains(&t) {
                return Err(FieldError::new("threads", "between 1 and 1024 threads, or empty for one per core"));
            }
        }
        if let Some(n) = self.parallel {
            if !(1..=MAX_PARALLEL).contains(&n) {
                return Err(FieldError::new(
                    "parallel",
                    format!("{n} is not between 1 and {MAX_PARALLEL} requests at once (empty: the server's default)"),
                ));
            }
            if n > 1 && self.speculative != Speculative::Off {
                return Err(FieldError::new(
                    "parallel",
                    format!(
                        "{n} requests at once: {SPECULATIVE_ONE_AT_A_TIME}; set 1, or turn speculative decoding off"
                    ),
                ));
            }
        }
        if let Some(p) = &self.model_path {
            if p.trim().is_empty() {
                return Err(FieldError::new("model_path", "empty: choose a GGUF file"));
            }
        }
        self.check_speculative()?;
        if let EngineLocation::Remote { url, api_key, model, allow_insecure } = &self.engine {
            check_url(url, *allow_insecure)?;
            if let RemoteKey::New { key } = api_key {
                if key.trim().is_empty() {
                    return Err(FieldError::new("engine.api_key", "the new key is empty: type one, or clear the key"));
                }
                if key.chars().any(|c| c.is_control()) {
                    return Err(FieldError::new("engine.api_key", "the key has a control character"));
                }
            }
            if model.chars().any(|c| c.is_control()) {
                return Err(FieldError::new("engine.model", "the model name has a control character"));
            }
        }
        Ok(())
    }

    /// The drafting values, when speculative decoding is on (off, they are kept but not used).
    fn check_speculative(&self) -> Result<(), FieldError> {
        if self.speculative == Speculative::Off {
            return Ok(());
        }
        if !(1..=MAX_DRAFTS).contains(&self.draft_max) {
            return Err(FieldError::new("draft_max", format!("between 1 and {MAX_DRAFTS} drafts per verification")));
        }
        if self.draft_min > self.draft_max {
            return Err(FieldError::new(
                "draft_min",
                format!("{} is more than the most drafts per verification ({})", self.draft_min, self.draft_max),
            ));
        }
        if let Speculative::Draft { model_path } = &self.speculative {
            if model_path.trim().is_empty() {
                return Err(FieldError::new("speculative.model_path", "empty: choose the draft model's GGUF file"));
            }
        }
        Ok(())
    }

    /// The draft model's file, opened (its index read, nothing paged in), when drafts come from one; a file
    /// that is not a readable GGUF is the GGUF reader's error at `speculative.model_path`.
    pub fn open_draft(&self) -> Result<Option<Arc<GgufFile>>, FieldError> {
        let Speculative::Draft { model_path } = &self.speculative else { return Ok(None) };
        let path = std::path::Path::new(model_path.trim());
        let file = GgufFile::open(path).map_err(|e| {
            FieldError::new("speculative.model_path", format!("cannot read the draft model {}: {e}", path.display()))
        })?;
        Ok(Some(Arc::new(file)))
    }

    /// The devices and placement these settings give (fresh devices: nothing is allocated). With a draft
    /// model, `draft_devices` must name devices of the list.
    pub fn load_options(&self) -> Result<LoadOptions, FieldError> {
        self.check()?;
        let reserve_bytes = self.vram_reserve_mib * MIB;
        let devices = DeviceSet::parse(self.devices.trim(), reserve_bytes)
            .map_err(|e| FieldError::new("devices", e.to_string()))?;
        // The model would refuse it at load (`ModelError::KvOnGpu`); said here, the settings need no model.
        if let (KvType::F32, Some(d)) = (self.kv, devices.devices.iter().find(|d| d.kind.is_gpu())) {
            return Err(FieldError::new("kv", ModelError::KvOnGpu { kv: self.kv, device: d.name() }.to_string()));
        }
        for d in devices.devices.iter().filter(|d| !d.is_host()) {
            if reserve_bytes >= d.total_bytes() {
                return Err(FieldError::new(
                    "vram_reserve_mib",
                    format!(
                        "a reserve of {} MiB is not below device {}'s {} MiB of memory",
                        self.vram_reserve_mib,
                        d.name(),
                        d.total_bytes() / MIB
                    ),
                ));
            }
        }
        let split = match self.layer_split.trim() {
            "" => None,
            s => Some(split::parse_points(s).map_err(|e| FieldError::new("layer_split", e.to_string()))?),
        };
        if matches!(self.speculative, Speculative::Draft { .. }) {
            draft::select_devices(&devices, &self.draft_devices)
                .map_err(|e| FieldError::new("draft_devices", e.to_string()))?;
        }
        Ok(LoadOptions {
            devices,
            split,
            kv_type: self.kv,
            batch: DEFAULT_BATCH,
            max_context: self.max_context.map(|c| c as usize),
            kv_resident: self.kv_resident.map(|n| n as usize),
            experts: ExpertsPlacement::parse(&self.experts).map_err(|e| FieldError::new("experts", e.to_string()))?,
        })
    }

    /// The plan of `file` under these settings at their context for the sequences the server will run at
    /// once ([`sequences`](EngineSettings::sequences)), with the draft model beside it when drafts come
    /// from one, or the field at fault: a split that does not match the devices or the model's
    /// layers, a KV type the model cannot use, a reserve above a device's memory, a draft model that cannot
    /// be read or whose vocabulary is not the model's. A plan that does not fit is not an error: its `fits`
    /// is false and its `problem` says which device is short and by how much.
    pub fn plan(&self, file: &Arc<GgufFile>) -> Result<Plan, FieldError> {
        let opts = self.load_options()?;
        let draft = match self.open_draft()? {
            None => None,
            Some(d) => {
                draft::check_draft_vocab(file, &d).map_err(|e| match e {
                    e @ DraftVocabError::TargetTokenizer(_) => FieldError::new("model_path", e.to_string()),
                    e => FieldError::new("speculative.model_path", format!("the draft model: {e}")),
                })?;
                let devices = draft::select_devices(&opts.devices, &self.draft_devices)
                    .map_err(|e| FieldError::new("draft_devices", e.to_string()))?;
                Some(DraftInput { file: d, devices })
            }
        };
        let sequences = self.sequences(file, &opts)?;
        super::plan_with_draft(file, &opts, None, sequences, draft.as_ref()).map_err(|e| match e {
            PlanError::Model(m) => model_field_error(m),
            e @ PlanError::TokensBeyondContext { .. } => FieldError::new("max_context", e.to_string()),
            PlanError::Draft(m) => {
                let field = match &m {
                    ModelError::Split(_) | ModelError::Device(_) => "draft_devices",
                    ModelError::KvLayout(_) | ModelError::KvOnGpu { .. } => "kv",
                    _ => "speculative.model_path",
                };
                FieldError::new(field, format!("the draft model: {m}"))
            }
        })
    }

    /// The sequences `strata serve` runs at once under these settings: `parallel`, else the number it would
    /// pick for `file` placed on `opts` (the host's memory sampled now; the server samples it at start, after
    /// loading, and logs the number it picks).
    pub fn sequences(&self, file: &Arc<GgufFile>, opts: &LoadOptions) -> Result<usize, FieldError> {
        if let Some(n) = self.parallel {
            return Ok(n as usize);
        }
        let (cfg, stages) = Model::plan(file, opts).map_err(model_field_error)?;
        let max_context = opts.max_context.unwrap_or(cfg.n_ctx_train);
        let speculative = self.speculative != Speculative::Off;
        Ok(parallel::default_parallel(&stages, max_context, opts.kv_resident, &opts.devices.host, speculative)
            .sequences())
    }

    /// The flags of `strata serve` that apply these settings (the model and the engine location aside).
    pub fn serve_flags(&self) -> Vec<String> {
        let mut f: Vec<String> = vec!["--devices".into(), self.devices.trim().to_owned()];
        if !self.layer_split.trim().is_empty() {
            f.extend(["--layer-split".into(), self.layer_split.trim().to_owned()]);
        }
        f.extend(["--kv".into(), self.kv.to_string()]);
        if let Some(n) = self.kv_resident {
            f.extend(["--kv-resident".into(), n.to_string()]);
        }
        if self.experts.trim() != "auto" {
            f.extend(["--experts".into(), self.experts.trim().to_owned()]);
        }
        if let Some(c) = self.max_context {
            f.extend(["--max-context".into(), c.to_string()]);
        }
        f.extend(["--vram-reserve-mib".into(), self.vram_reserve_mib.to_string()]);
        f.extend(["--conversation-cache-slots".into(), self.cache_slots.to_string()]);
        f.extend(["--conversation-cache-mib".into(), self.cache_mib.to_string()]);
        if let Some(t) = self.threads {
            f.extend(["--threads".into(), t.to_string()]);
        }
        if let Some(n) = self.parallel {
            f.extend(["--parallel".into(), n.to_string()]);
        }
        match &self.speculative {
            Speculative::Off => return f,
            Speculative::Ngram => f.extend(["--spec".into(), "ngram".into()]),
            Speculative::Draft { model_path } => {
                f.extend(["--draft-model".into(), model_path.trim().to_owned()]);
                if !self.draft_devices.is_empty() {
                    let list: Vec<String> = self.draft_devices.iter().map(usize::to_string).collect();
                    f.extend(["--draft-devices".into(), list.join(",")]);
                }
            }
        }
        f.extend(["--draft-max".into(), self.draft_max.to_string()]);
        f.extend(["--draft-min".into(), self.draft_min.to_string()]);
        f
    }
}

fn model_field_error(e: ModelError) -> FieldError {
    let field = match &e {
        ModelError::Split(SplitError::Device(_)) | ModelError::Device(_) => "devices",
        ModelError::Split(_) => "layer_split",
        ModelError::KvLayout(_) | ModelError::KvOnGpu { .. } => "kv",
        ModelError::ContextOverflow { .. } => "max_context",
        _ => "model_path",
    };
    FieldError::new(field, e.to_string())
}

/// The error of an `http://` endpoint that is not loopback, without `allow_insecure`.
pub const INSECURE_URL_MESSAGE: &str =
    "an http:// endpoint sends the key in clear text: use https:// or tick Allow insecure";

/// A URL with a host, `https://`, or `http://` to a loopback host (no network crossed, e.g. a local
/// llama-server) or with `allow_insecure`.
fn check_url(url: &str, allow_insecure: bool) -> Result<(), FieldError> {
    let (secure, rest) = match (url.strip_prefix("https://"), url.strip_prefix("http://")) {
        (Some(rest), _) => (true, rest),
        (None, Some(rest)) => (false, rest),
        (None, None) => return Err(FieldError::new("engine.url", "the URL starts with https:// (or http://)")),
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host = url_host(authority);
    if host.is_empty() || url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(FieldError::new("engine.url", format!("{url:?} is not a URL with a host")));
    }
    if !secure && !allow_insecure && !is_loopback_host(host) {
        return Err(FieldError::new("engine.url", INSECURE_URL_MESSAGE));
    }
    Ok(())
}

/// The host of a URL's authority (`user@host:port`): `[::1]` as `::1`, the port and user left out.
fn url_host(authority: &str) -> &str {
    let hostport = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if let Some(v6) = hostport.strip_prefix('[') {
        return v6.split_once(']').map_or("", |(h, _)| h);
    }
    hostport.split(':').next().unwrap_or("")
}

/// `localhost`, or an address of the loopback ranges (127.0.0.0/8, ::1): requests to it stay on this machine.
pub fn is_loopback_host(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost") || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests;
