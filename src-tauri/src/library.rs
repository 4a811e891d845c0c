//! The model library's commands: the app runs `strata::hub::library` in its own process (so that a person
//! with no model yet can find one: no engine has to run), over the models folder `STRATA_MODELS_DIR` or
//! `~/.local/share/strata/models` names, the same one `strata pull` and `strata serve` use. A file is
//! planned under the app's settings (its devices) before it is downloaded. Its own settings (the models
//! folder, a Hugging Face token for gated repositories) are kept apart from the engine's: the folder in the
//! settings store, the token in a 0600 file of its own (`remote_key::HF_TOKEN_FILE`), never shown again.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tauri::{Runtime, State};
use tauri_plugin_store::StoreExt;

use strata::hub::library::Library;
use strata::plan::settings::RemoteKey;

use strata::hub::library::{picks, DownloadView, FileView, FitView, LibraryError, Pick};
use strata::hub::local::LocalModel;
use strata::hub::{HubError, HubModel};

use crate::types::{CmdResult, CommandError, ErrorCode};
use crate::AppState;

/// The GGUFs here and the folder downloads go to (as `/strata/library/local` answers).
#[derive(Clone, Debug, serde::Serialize)]
pub struct LocalModels {
    pub models_dir: PathBuf,
    pub models: Vec<LocalModel>,
}

fn error(e: LibraryError) -> CommandError {
    let message = e.to_string();
    let (code, field) = match e {
        LibraryError::Hub(HubError::BadRepo(_)) => (ErrorCode::Invalid, Some("repo")),
        LibraryError::Hub(HubError::BadFile(_) | HubError::BadHeader { .. })
        | LibraryError::NoSuchFile { .. }
        | LibraryError::SplitPart(_)
        | LibraryError::Plan(_) => (ErrorCode::Invalid, Some("file")),
        LibraryError::NotDeletable(_) => (ErrorCode::Invalid, Some("path")),
        LibraryError::NoSuchDownload(_) | LibraryError::Hub(HubError::NotFound { .. }) => (ErrorCode::NotFound, None),
        LibraryError::TooMany | LibraryError::AlreadyRunning { .. } => (ErrorCode::Busy, None),
        LibraryError::InUse(_) => (ErrorCode::Busy, Some("path")),
        LibraryError::Delete { .. } => (ErrorCode::Io, None),
        _ => (ErrorCode::Engine, None),
    };
    CommandError { code, field: field.map(str::to_owned), message }
}

#[tauri::command]
pub async fn library_search(state: State<'_, AppState>, text: String) -> CmdResult<Vec<HubModel>> {
    state.library().search(&text).await.map_err(error)
}

#[tauri::command]
pub async fn library_files(state: State<'_, AppState>, repo: String) -> CmdResult<Vec<FileView>> {
    state.library().files(&repo).await.map_err(error)
}

#[tauri::command]
pub async fn library_fit(
    state: State<'_, AppState>,
    repo: String,
    file: String,
    context: Option<u32>,
) -> CmdResult<FitView> {
    if context == Some(0) {
        return Err(CommandError {
            code: ErrorCode::Invalid,
            field: Some("context".into()),
            message: "context must be at least 1 position".into(),
        });
    }
    let settings = state.settings();
    state.library().fit(&repo, &file, &settings, context).await.map_err(error)
}

/// Good defaults for the memory of the app's devices (the host's and every GPU's of its settings).
#[tauri::command]
pub async fn library_picks(state: State<'_, AppState>) -> CmdResult<Vec<Pick>> {
    let opts = state.settings().load_options()?;
    let ds = opts.devices;
    let gpus: u64 = ds.devices.iter().filter(|d| !d.is_host()).map(|d| d.total_bytes()).sum();
    Ok(picks(ds.host.total_bytes() + gpus))
}

#[tauri::command]
pub async fn library_local(state: State<'_, AppState>) -> CmdResult<LocalModels> {
    let lib = state.library().clone();
    tauri::async_runtime::spawn_blocking(move || LocalModels {
        models: lib.local(),
        models_dir: lib.models_dir.clone(),
    })
    .await
    .map_err(|e| CommandError::engine(e.to_string()))
}

#[tauri::command]
pub async fn library_delete(state: State<'_, AppState>, path: PathBuf) -> CmdResult<()> {
    let loaded = state.settings().model_path.map(PathBuf::from);
    state.library().delete(&path, loaded.as_deref()).map_err(error)
}

#[tauri::command]
pub async fn library_downloads(state: State<'_, AppState>) -> CmdResult<Vec<DownloadView>> {
    Ok(state.library().downloads())
}

#[tauri::command]
pub async fn library_start(state: State<'_, AppState>, repo: String, file: String) -> CmdResult<u64> {
    state.library().start(&repo, &file).await.map_err(error)
}

#[tauri::command]
pub async fn library_cancel(state: State<'_, AppState>, id: u64) -> CmdResult<()> {
    state.library().cancel(id).map_err(error)
}

/// The store key of the library's settings (in the settings store).
const LIBRARY_KEY: &str = "library";

/// The library's settings as the page reads and sends them.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct LibrarySettings {
    /// The models folder: downloads go there and its GGUFs are listed ("" for the default).
    pub models_dir: String,
    /// A Hugging Face token for gated repositories: `kept` (with its hint) or `none` as read; `new` to keep
    /// another, `none` to forget it.
    pub hf_token: RemoteKey,
}

/// What the page reads: the settings, the folder they come to, the default one, and where the token the
/// Hub gets comes from (`settings`, `environment`: HF_TOKEN or the saved login, or `none`).
#[derive(Clone, Debug, Serialize)]
pub struct LibrarySettingsView {
    pub settings: LibrarySettings,
    pub models_dir: PathBuf,
    pub default_models_dir: PathBuf,
    pub token_from: &'static str,
}

/// The library over `models_dir` ("" for the default) with `token` (else the environment's).
pub(crate) fn make_library(models_dir: &str, token: Option<String>) -> Arc<Library> {
    let dir = match models_dir.trim() {
        "" => strata::hub::local::default_models_dir(),
        d => PathBuf::from(d),
    };
    let endpoint = std::env::var("HF_ENDPOINT").ok().filter(|e| !e.trim().is_empty());
    let client = strata::hub::HubClient::new(
        endpoint.as_deref().unwrap_or(strata::hub::DEFAULT_ENDPOINT),
        token.or_else(strata::hub::token_from_env),
    );
    Library::new(client, dir, strata::hub::local::hf_hub_cache())
}

/// The models folder the store keeps ("" when none is set or the store cannot be read).
pub(crate) fn stored_models_dir<R: Runtime>(app: &tauri::AppHandle<R>, dir: &Path) -> String {
    app.store(dir.join(crate::SETTINGS_FILE))
        .ok()
        .and_then(|s| s.get(LIBRARY_KEY))
        .and_then(|v| v.get("models_dir").and_then(|d| d.as_str()).map(str::to_owned))
        .unwrap_or_default()
}

fn view(state: &AppState) -> LibrarySettingsView {
    let token_from = if state.hf_token.key().is_some() {
        "settings"
    } else if strata::hub::token_from_env().is_some() {
        "environment"
    } else {
        "none"
    };
    LibrarySettingsView {
        settings: LibrarySettings { models_dir: state.library_dir(), hf_token: state.hf_token.masked() },
        models_dir: state.library().models_dir.clone(),
        default_models_dir: strata::hub::local::default_models_dir(),
        token_from,
    }
}

#[tauri::command]
pub fn library_settings(state: State<'_, AppState>) -> LibrarySettingsView {
    view(&state)
}

/// Keeps the library's settings: the folder must be an absolute path to a folder that exists or can be
/// made; nothing changes while a download runs (it writes into the old folder).
#[tauri::command]
pub async fn library_save_settings<R: Runtime>(
    app: tauri::AppHandle<R>,
    state: State<'_, AppState>,
    settings: LibrarySettings,
) -> CmdResult<LibrarySettingsView> {
    let invalid =
        |field: &str, message: String| CommandError { code: ErrorCode::Invalid, field: Some(field.into()), message };
    let dir = settings.models_dir.trim().to_owned();
    if !dir.is_empty() {
        let p = Path::new(&dir);
        if !p.is_absolute() {
            return Err(invalid("models_dir", format!("{dir}: name the folder by its whole path")));
        }
        if p.exists() && !p.is_dir() {
            return Err(invalid("models_dir", format!("{dir} is a file, not a folder")));
        }
        std::fs::create_dir_all(p).map_err(|e| invalid("models_dir", format!("{dir}: cannot make it: {e}")))?;
    }
    if let RemoteKey::New { key } = &settings.hf_token {
        if key.trim().is_empty() || key.trim().chars().any(char::is_whitespace) {
            return Err(invalid("hf_token", "a Hugging Face token is one word (hf_...)".into()));
        }
    }
    if state.library().downloads().iter().any(|d| d.state == strata::hub::library::DownloadState::Running) {
        return Err(CommandError {
            code: ErrorCode::Busy,
            field: None,
            message: "a download is running into the models folder: wait for it or cancel it first".into(),
        });
    }
    state.hf_token.keep(&settings.hf_token).map_err(|e| CommandError::io(e.to_string()))?;
    let store = app
        .store(state.data_dir.join(crate::SETTINGS_FILE))
        .map_err(|e| CommandError::io(format!("cannot open the settings store: {e}")))?;
    store.set(LIBRARY_KEY, serde_json::json!({ "models_dir": dir }));
    store.save().map_err(|e| CommandError::io(format!("cannot save the settings: {e}")))?;
    state.set_library(&dir);
    Ok(view(&state))
}
