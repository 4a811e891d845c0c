//! The model library's commands: the app runs `strata::hub::library` in its own process (so that a person
//! with no model yet can find one: no engine has to run), over the models folder `STRATA_MODELS_DIR` or
//! `~/.local/share/strata/models` names, the same one `strata pull` and `strata serve` use. A file is
//! planned under the app's settings (its devices) before it is downloaded.

use std::path::PathBuf;

use tauri::State;

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
    state.library.search(&text).await.map_err(error)
}

#[tauri::command]
pub async fn library_files(state: State<'_, AppState>, repo: String) -> CmdResult<Vec<FileView>> {
    state.library.files(&repo).await.map_err(error)
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
    state.library.fit(&repo, &file, &settings, context).await.map_err(error)
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
    let lib = state.library.clone();
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
    state.library.delete(&path, loaded.as_deref()).map_err(error)
}

#[tauri::command]
pub async fn library_downloads(state: State<'_, AppState>) -> CmdResult<Vec<DownloadView>> {
    Ok(state.library.downloads())
}

#[tauri::command]
pub async fn library_start(state: State<'_, AppState>, repo: String, file: String) -> CmdResult<u64> {
    state.library.start(&repo, &file).await.map_err(error)
}

#[tauri::command]
pub async fn library_cancel(state: State<'_, AppState>, id: u64) -> CmdResult<()> {
    state.library.cancel(id).map_err(error)
}
