//! The Strata desktop app's backend: the app state (settings, history, telemetry, the engine supervisor),
//! the Tauri builder with its plugins and commands, and the app's lifecycle (the engine starts with the
//! app's model and stops when the app quits). Module map: `commands` (what the UI calls), `supervisor` (the
//! engine child process), `engine` (HTTP to an engine), `history` (conversations on disk), `preferences`
//! (the chat preferences file), `remote_key` (the remote endpoint's API key, in a 0600 file of its own,
//! never in settings.json nor sent to the page), `types` (what crosses to TypeScript).

pub mod commands;
pub mod engine;
pub mod history;
pub mod library;
pub mod preferences;
pub mod remote_key;
pub mod supervisor;
pub mod types;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tauri::{Emitter, Manager, Runtime};
use tauri_plugin_store::StoreExt;

use strata::plan::facts::ModelFacts;
use strata::plan::settings::{EngineLocation, EngineSettings};
use strata::sync::LockUnpoisoned;
use strata::telemetry::Telemetry;

use history::History;
use preferences::Preferences;
use remote_key::KeyFile;
use supervisor::{EngineSpec, Supervisor};
use types::{CmdResult, CommandError};

/// Telemetry entries the app keeps of each kind: 30 minutes of samples at 2 per second for 4 devices.
pub const TELEMETRY_ENTRIES: usize = 30 * 60 * 2 * 4;
/// The settings store's file in the data folder, and its key.
pub const SETTINGS_FILE: &str = "settings.json";
const SETTINGS_KEY: &str = "engine";

pub struct AppState {
    pub data_dir: PathBuf,
    pub history: History,
    pub preferences: Preferences,
    pub telemetry: Arc<Telemetry>,
    pub supervisor: Supervisor,
    /// The remote endpoint's API key (the settings hold only whether one is kept).
    pub remote_key: KeyFile,
    /// Always masked: the key is in `remote_key`, never here.
    settings: Mutex<EngineSettings>,
    cancels: Mutex<HashMap<String, tokio::sync::watch::Sender<bool>>>,
    /// The model library (the Hub, the models folder, the downloads under way): replaced when its
    /// settings change ([`library::library_save_settings`]).
    library: Mutex<Arc<strata::hub::library::Library>>,
    /// The models folder the library's settings name ("" for the default).
    library_dir: Mutex<String>,
    /// The Hugging Face token the library's settings keep (else `HF_TOKEN` or the saved login).
    pub hf_token: KeyFile,
    /// Held while settings are applied to the engine (a switch in place or a restart).
    applying: tokio::sync::Mutex<()>,
}

/// Why settings were not applied in place: the engine is started again with them, or they are refused.
enum Switch {
    Restart(String),
    Refused(CommandError),
}

impl AppState {
    pub fn new(data_dir: PathBuf, remote_key: KeyFile, settings: EngineSettings) -> CmdResult<AppState> {
        let hf_token = KeyFile::open_named(&data_dir, remote_key::HF_TOKEN_FILE).unwrap_or_else(|e| {
            tracing::warn!("{e}: the model library has no token of its own until one is saved");
            KeyFile::unread_named(&data_dir, remote_key::HF_TOKEN_FILE)
        });
        let telemetry = Arc::new(Telemetry::with_capacity(TELEMETRY_ENTRIES));
        let supervisor = Supervisor::new(telemetry.clone(), tauri::async_runtime::handle().inner().clone());
        Ok(AppState {
            history: History::open(data_dir.join("conversations"))?,
            preferences: Preferences::in_dir(&data_dir),
            data_dir,
            telemetry,
            supervisor,
            remote_key,
            settings: Mutex::new(settings),
            cancels: Mutex::new(HashMap::new()),
            library: Mutex::new(library::make_library("", hf_token.key())),
            library_dir: Mutex::new(String::new()),
            hf_token,
            applying: tokio::sync::Mutex::new(()),
        })
    }

    /// The model library as its settings are now.
    pub fn library(&self) -> Arc<strata::hub::library::Library> {
        self.library.lock_unpoisoned().clone()
    }

    /// The models folder the library's settings name ("" for the default).
    pub fn library_dir(&self) -> String {
        self.library_dir.lock_unpoisoned().clone()
    }

    /// Replaces the library with one over `models_dir` ("" for the default) and the kept token.
    pub(crate) fn set_library(&self, models_dir: &str) {
        *self.library.lock_unpoisoned() = library::make_library(models_dir, self.hf_token.key());
        *self.library_dir.lock_unpoisoned() = models_dir.to_owned();
    }

    pub fn settings(&self) -> EngineSettings {
        self.settings.lock_unpoisoned().clone()
    }

    /// Keeps `s`: a new remote key in the key file first, then the rest, the key masked, in memory and in
    /// the store (saved at once). Returns what is kept, as the page may see it.
    pub fn store_settings<R: Runtime>(
        &self,
        app: &tauri::AppHandle<R>,
        s: &EngineSettings,
    ) -> CmdResult<EngineSettings> {
        let mut masked = s.clone();
        self.remote_key.absorb(&mut masked).map_err(|e| CommandError::io(e.to_string()))?;
        write_settings(app, &self.data_dir, &masked)?;
        *self.settings.lock_unpoisoned() = masked.clone();
        Ok(masked)
    }

    /// (Re)starts the local engine for `s`; stops it for a remote engine or no model. (`STRATA_NO_ENGINE`
    /// set: never, for tests of the commands alone.)
    pub fn start_engine(&self, s: &EngineSettings) -> CmdResult<()> {
        if std::env::var_os("STRATA_NO_ENGINE").is_some() {
            tracing::info!("STRATA_NO_ENGINE is set: no engine is started");
            return Ok(());
        }
        let (EngineLocation::Local, Some(model)) = (&s.engine, &s.model_path) else {
            let sup = self.supervisor.clone();
            tauri::async_runtime::spawn(async move { sup.stop(Duration::from_secs(5)).await });
            return Ok(());
        };
        let binary = engine_binary().ok_or_else(|| {
            CommandError::engine("the engine (strata) is not installed beside the app; set STRATA_ENGINE")
        })?;
        let facts =
            strata::gguf::GgufFile::open(Path::new(model)).ok().and_then(|f| ModelFacts::of(&f, Path::new(model)).ok());
        self.supervisor.start(EngineSpec { binary, model: PathBuf::from(model), flags: s.serve_flags(), facts });
        Ok(())
    }

    /// Applies `s` to the running engine in place when it can (`POST /strata/model/load`: the model loads
    /// beside the one serving, the conversations parked under the old model's identity), else by starting
    /// the engine again: when none is ready, when a setting needs a new process, or when the switch fails.
    /// Whether it switched in place.
    pub async fn apply_engine(&self, s: &EngineSettings) -> CmdResult<bool> {
        // One at a time: a second Load waits for the first instead of restarting the engine under it.
        let _one = self.applying.lock().await;
        match self.switch_engine(s).await {
            Ok(()) => return Ok(true),
            Err(Switch::Refused(e)) => return Err(e),
            Err(Switch::Restart(why)) => tracing::info!("the engine is started again ({why})"),
        }
        self.start_engine(s)?;
        Ok(false)
    }

    async fn switch_engine(&self, s: &EngineSettings) -> Result<(), Switch> {
        use Switch::Restart;
        if std::env::var_os("STRATA_NO_ENGINE").is_some() {
            return Err(Restart("STRATA_NO_ENGINE is set".into()));
        }
        let (EngineLocation::Local, Some(model)) = (&s.engine, &s.model_path) else {
            return Err(Restart("no local model to switch to".into()));
        };
        let generation = self.supervisor.generation();
        let (Some(endpoint), Some(running)) = (self.supervisor.endpoint(), self.supervisor.spec()) else {
            return Err(Restart("no engine is ready".into()));
        };
        if self.supervisor.status().state != crate::types::EngineState::Ready {
            return Err(Restart("the engine is not ready".into()));
        }
        let client = crate::engine::EngineClient::new(endpoint);
        let body = serde_json::to_value(s).map_err(|e| Restart(e.to_string()))?;
        let t0 = std::time::Instant::now();
        let reply = client.post_json("/strata/model/load", &body, supervisor::LOAD_TIMEOUT).await.map_err(|e| {
            match (e.status, e.code.as_deref()) {
                (Some(404), _) => Restart("this engine cannot switch models in place".to_owned()),
                // A setting the engine refuses as it would at a restart: said at its field, nothing restarted.
                (Some(400), _) => Switch::Refused(CommandError {
                    code: types::ErrorCode::Invalid,
                    field: e.param,
                    message: e.message,
                }),
                (_, Some(code)) => Restart(format!("{code}: {}", e.message)),
                _ => Restart(e.message),
            }
        })?;
        tracing::info!(
            "switched the engine to {model} in place in {:.0} ms ({} conversation(s) parked)",
            t0.elapsed().as_secs_f64() * 1e3,
            reply["switch"]["parked"]
        );
        let facts =
            strata::gguf::GgufFile::open(Path::new(model)).ok().and_then(|f| ModelFacts::of(&f, Path::new(model)).ok());
        let spec = EngineSpec { binary: running.binary, model: PathBuf::from(model), flags: s.serve_flags(), facts };
        if !self.supervisor.switched(generation, spec) {
            tracing::info!("the engine was started again meanwhile: it runs what that start asked for");
        }
        Ok(())
    }

    pub(crate) fn cancel_token(&self, id: &str) -> tokio::sync::watch::Receiver<bool> {
        let (tx, rx) = tokio::sync::watch::channel(false);
        self.cancels.lock_unpoisoned().insert(id.to_owned(), tx);
        rx
    }

    pub(crate) fn drop_cancel(&self, id: &str) {
        self.cancels.lock_unpoisoned().remove(id);
    }

    /// Asks the reply streaming in conversation `id`, if there is one, to stop. Returns its token, whose
    /// `closed()` resolves once that reply has ended (its chat_send drops the receiver after its last
    /// write). Replies in other conversations have tokens of their own and go on.
    pub(crate) fn cancel(&self, id: &str) -> Option<tokio::sync::watch::Sender<bool>> {
        let tx = self.cancels.lock_unpoisoned().get(id).cloned()?;
        let _ = tx.send(true);
        Some(tx)
    }
}

/// The engine binary: `$STRATA_ENGINE`, else `strata` beside the app (where bundles put the sidecar),
/// else a workspace build (`target/release/strata`).
pub fn engine_binary() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("STRATA_ENGINE").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    let name = format!("strata{}", std::env::consts::EXE_SUFFIX);
    [dir.join(&name), dir.join("..").join("release").join(&name)].into_iter().find(|p| p.is_file())
}

/// The app's data folder: `$STRATA_APP_DATA`, else the OS's place for this app.
fn data_dir<R: Runtime>(app: &tauri::AppHandle<R>) -> CmdResult<PathBuf> {
    if let Some(p) = std::env::var_os("STRATA_APP_DATA").filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    app.path().app_data_dir().map_err(|e| CommandError::io(format!("no data folder: {e}")))
}

/// Writes `s` (masked: `store_settings` and the migration are the callers) to the settings store.
fn write_settings<R: Runtime>(app: &tauri::AppHandle<R>, dir: &Path, s: &EngineSettings) -> CmdResult<()> {
    let store = app
        .store(dir.join(SETTINGS_FILE))
        .map_err(|e| CommandError::io(format!("cannot open the settings store: {e}")))?;
    store.set(SETTINGS_KEY, serde_json::to_value(s).map_err(|e| CommandError::io(e.to_string()))?);
    store.save().map_err(|e| CommandError::io(format!("cannot save the settings: {e}")))
}

/// Settings as stored, else defaults with the model from `$STRATA_MODEL` (the quick start's default model).
/// A key that an older settings.json still holds is moved to the key file and the settings file written
/// again without it; what is returned is masked either way.
fn initial_settings<R: Runtime>(app: &tauri::AppHandle<R>, dir: &Path, key: &KeyFile) -> EngineSettings {
    let stored = app.store(dir.join(SETTINGS_FILE)).ok().and_then(|s| s.get(SETTINGS_KEY)).and_then(|v| {
        serde_json::from_value::<EngineSettings>(v).map_err(|e| tracing::warn!("stored settings ignored: {e}")).ok()
    });
    let mut s = stored.unwrap_or_default();
    match key.migrate(&mut s) {
        Ok(true) => match write_settings(app, dir, &s) {
            Ok(()) => tracing::info!("the remote API key moved from {SETTINGS_FILE} to {}", key.path().display()),
            Err(e) => tracing::warn!(
                "the remote API key is in {}, but {SETTINGS_FILE} still holds it: {}",
                key.path().display(),
                e.message
            ),
        },
        Ok(false) => {}
        Err(e) => tracing::warn!("{e}; {SETTINGS_FILE} keeps the key until the settings are saved"),
    }
    if s.model_path.is_none() {
        s.model_path = std::env::var("STRATA_MODEL").ok().filter(|p| Path::new(p).is_file());
    }
    s
}

/// Creates the app's state (data folder, settings, history, telemetry, supervisor), wires telemetry and
/// engine status to UI events, and starts the engine for the stored model. Run by `setup` (tests call it
/// on a mock app, whose `setup` does not run until its event loop does).
pub fn init<R: Runtime>(handle: &tauri::AppHandle<R>) -> CmdResult<()> {
    let dir = data_dir(handle)?;
    std::fs::create_dir_all(&dir).map_err(|e| CommandError::io(format!("{}: {e}", dir.display())))?;
    let remote_key = KeyFile::open(&dir).unwrap_or_else(|e| {
        tracing::warn!("{e}: the remote endpoint has no key until one is saved");
        KeyFile::unread(&dir)
    });
    let settings = initial_settings(handle, &dir, &remote_key);
    let state = AppState::new(dir, remote_key, settings.clone())?;
    let models_dir = library::stored_models_dir(handle, &state.data_dir);
    if !models_dir.is_empty() {
        state.set_library(&models_dir);
    }
    // Telemetry and the engine's status reach the UI as events.
    let h = handle.clone();
    state.telemetry.subscribe_with(Box::new(move |e| {
        let _ = h.emit("telemetry", e);
        true
    }));
    let mut status = state.supervisor.subscribe_status();
    let h = handle.clone();
    tauri::async_runtime::spawn(async move {
        while status.changed().await.is_ok() {
            let s = status.borrow_and_update().clone();
            let _ = h.emit("engine_status", s);
        }
    });
    if let Err(e) = state.start_engine(&settings) {
        tracing::warn!("{}", e.message);
    }
    handle.manage(state);
    Ok(())
}

/// The builder with everything but the context: plugins, state, commands (the tests use it with a mock
/// runtime).
pub fn builder<R: Runtime>(b: tauri::Builder<R>) -> tauri::Builder<R> {
    b.plugin(tauri_plugin_store::Builder::default().build())
        .plugin(tauri_plugin_dialog::init())
        .setup(|app| init(app.handle()).map_err(|e| e.message.into()))
        .invoke_handler(tauri::generate_handler![
            commands::inspect_model,
            commands::plan,
            commands::load_model,
            commands::unload_model,
            commands::get_settings,
            commands::save_settings,
            commands::chat_send,
            commands::get_preferences,
            commands::save_preferences,
            commands::chat_cancel,
            commands::conversations_list,
            commands::conversation_get,
            commands::conversation_create,
            commands::conversation_rename,
            commands::conversation_delete,
            commands::conversation_save,
            commands::devices,
            commands::telemetry,
            commands::cache,
            commands::engine_status,
            library::library_search,
            library::library_files,
            library::library_fit,
            library::library_picks,
            library::library_local,
            library::library_delete,
            library::library_downloads,
            library::library_start,
            library::library_cancel,
            library::library_settings,
            library::library_save_settings,
        ])
}

pub fn run() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .try_init();
    let app = match builder(tauri::Builder::default()).build(tauri::generate_context!()) {
        Ok(app) => app,
        Err(e) => {
            eprintln!("strata-desktop: error: {e}");
            std::process::exit(1);
        }
    };
    app.run(|handle, event| {
        if let tauri::RunEvent::Exit = event {
            // No orphan: the engine goes with the app.
            if let Some(state) = handle.try_state::<AppState>() {
                state.supervisor.stop_blocking(Duration::from_secs(5));
            }
        }
    });
}
