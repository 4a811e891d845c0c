//! `/strata/library/*`: the model library over HTTP, for the web UI's Models view (the desktop app calls
//! [`crate::hub::library`] in its own process). Reads are GETs; what downloads, cancels or deletes is a
//! POST with a JSON body, so the guard's rules for a cross-site request apply to it. Every route sits behind
//! the API key when there is one.
//!
//! - `GET search?q=` the Hub's GGUF repositories; `GET files?repo=` a repository's GGUF files, each with its
//!   path here when it is here; `GET fit?repo=&file=&context=` a file's plan on this server's devices,
//!   read from its header; `GET picks` good defaults for this machine's memory.
//! - `GET local` the GGUFs in the models folder and the Hugging Face cache; `POST delete {path}`.
//! - `GET downloads`; `POST downloads {repo, file}` starts one (`{id}`); `POST downloads/{id}/cancel`.

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;

use super::error::ApiError;
use super::App;
use crate::hub::library::{picks, LibraryError};
use crate::hub::HubError;

/// The error a library failure is for the client.
fn api_error(e: LibraryError) -> ApiError {
    let message = e.to_string();
    match e {
        LibraryError::Hub(HubError::BadRepo(_)) => ApiError::invalid("repo", message),
        LibraryError::Hub(HubError::BadFile(_) | HubError::BadHeader { .. })
        | LibraryError::NoSuchFile { .. }
        | LibraryError::SplitPart(_) => ApiError::invalid("file", message),
        LibraryError::NotDeletable(_) => ApiError::invalid("path", message),
        LibraryError::NoSuchDownload(_) | LibraryError::Hub(HubError::NotFound { .. }) => ApiError::not_found(message),
        LibraryError::TooMany | LibraryError::AlreadyRunning { .. } => ApiError::conflict("download_busy", message),
        LibraryError::Hub(HubError::NeedsToken { .. } | HubError::Refused { .. }) => {
            ApiError::upstream("hub_token", message)
        }
        LibraryError::Hub(_) => ApiError::upstream("hub_unreachable", message),
        LibraryError::Plan(_) => ApiError::invalid("file", message),
        LibraryError::InUse(_) => ApiError::conflict("model_in_use", message),
        LibraryError::Delete { .. } | LibraryError::Internal(_) => ApiError::internal(message),
    }
}

#[derive(Deserialize)]
pub struct SearchQuery {
    #[serde(default)]
    q: String,
}

pub async fn search(State(app): State<App>, Query(q): Query<SearchQuery>) -> Response {
    match app.library.search(&q.q).await {
        Ok(v) => Json(serde_json::json!({ "models": v })).into_response(),
        Err(e) => api_error(e).into_response(),
    }
}

#[derive(Deserialize)]
pub struct RepoQuery {
    repo: String,
}

pub async fn files(State(app): State<App>, Query(q): Query<RepoQuery>) -> Response {
    match app.library.files(&q.repo).await {
        Ok(v) => Json(serde_json::json!({ "repo": q.repo, "files": v })).into_response(),
        Err(e) => api_error(e).into_response(),
    }
}

#[derive(Deserialize)]
pub struct FitQuery {
    repo: String,
    file: String,
    context: Option<u32>,
}

pub async fn fit(State(app): State<App>, Query(q): Query<FitQuery>) -> Response {
    if q.context == Some(0) {
        return ApiError::invalid("context", "context must be at least 1 position").into_response();
    }
    match app.library.fit(&q.repo, &q.file, &app.model().settings, q.context).await {
        Ok(v) => Json(v).into_response(),
        Err(e) => api_error(e).into_response(),
    }
}

/// Good defaults for the memory of this server's devices (the host's and every GPU's, together).
pub async fn picks_route(State(app): State<App>) -> Response {
    let memory_bytes: u64 = app.shared.devices.all().iter().map(|d| d.total_bytes()).sum();
    Json(serde_json::json!({ "memory_bytes": memory_bytes, "picks": picks(memory_bytes) })).into_response()
}

pub async fn local(State(app): State<App>) -> Response {
    let lib = app.library.clone();
    match tokio::task::spawn_blocking(move || (lib.local(), lib.models_dir.clone())).await {
        Ok((models, dir)) => Json(serde_json::json!({ "models_dir": dir, "models": models })).into_response(),
        Err(e) => ApiError::internal(e.to_string()).into_response(),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DeleteBody {
    path: std::path::PathBuf,
}

pub async fn delete(State(app): State<App>, headers: HeaderMap, body: axum::body::Body) -> Response {
    let req: DeleteBody = match read(&app, &headers, body).await {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let model = app.model();
    let served = model.settings.model_path.as_deref().map(std::path::Path::new);
    match app.library.delete(&req.path, served) {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => api_error(e).into_response(),
    }
}

pub async fn downloads(State(app): State<App>) -> Response {
    Json(serde_json::json!({ "downloads": app.library.downloads() })).into_response()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StartBody {
    repo: String,
    file: String,
}

pub async fn start(State(app): State<App>, headers: HeaderMap, body: axum::body::Body) -> Response {
    let req: StartBody = match read(&app, &headers, body).await {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    match app.library.start(&req.repo, &req.file).await {
        Ok(id) => (StatusCode::ACCEPTED, Json(serde_json::json!({ "id": id }))).into_response(),
        Err(e) => api_error(e).into_response(),
    }
}

pub async fn cancel(State(app): State<App>, Path(id): Path<u64>) -> Response {
    match app.library.cancel(id) {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => api_error(e).into_response(),
    }
}

async fn read<T: serde::de::DeserializeOwned>(
    app: &App,
    headers: &HeaderMap,
    body: axum::body::Body,
) -> Result<T, ApiError> {
    let bytes = super::api::read_body(headers, body, 1 << 16, app.opts.body_timeout).await?;
    super::openai::parse(&bytes)
}
