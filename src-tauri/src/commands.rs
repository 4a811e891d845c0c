//! The Tauri commands the UI calls (listed in commands.txt; each granted by capabilities/default.json).
//! Arguments are typed and checked here; every failure is a `CommandError` (a settings value refused names
//! its field). Chat replies stream over a `Channel` and are written to the history before each piece is
//! shown, so a crash loses nothing the user saw. Replies in different conversations stream at once, each
//! with its own cancel token (keyed by the conversation's id) and its own file.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tauri::ipc::Channel;
use tauri::{AppHandle, Runtime, State};

use strata::gguf::GgufFile;
use strata::plan::facts::ModelFacts;
use strata::plan::settings::{EngineLocation, EngineSettings, PlanReply};
use strata::server::state::CacheView;
use strata::server::status::{DevicesView, TelemetryView};

use crate::engine::{ChatEnd, ChatFailure, Endpoint, EngineClient, Piece};
use crate::history::now_ms;
use crate::preferences::check_params;
use crate::types::*;
use crate::AppState;

/// A reply's text reaches the UI (and the disk) at most this often.
pub const FLUSH_EVERY: Duration = Duration::from_millis(100);
/// The most a conversation sent at once may hold, in bytes of text.
pub const MAX_CHAT_BYTES: usize = 4 << 20;
/// How long a reply waits for a restarted engine before it gives up.
const RETRY_WAIT: Duration = Duration::from_secs(120);
/// How long deleting a conversation waits for its cancelled reply to make its last write.
const DELETE_WAIT: Duration = Duration::from_secs(10);

fn open_model(path: &str) -> CmdResult<(Arc<GgufFile>, ModelFacts)> {
    let p = std::path::Path::new(path);
    let file = GgufFile::open(p)
        .map_err(|e| CommandError::new(ErrorCode::Model, format!("cannot read {}: {e}", p.display())))?;
    let facts = ModelFacts::of(&file, p)
        .map_err(|e| CommandError::new(ErrorCode::Model, format!("cannot run {}: {e}", p.display())))?;
    Ok((Arc::new(file), facts))
}

#[tauri::command]
pub async fn inspect_model(path: String) -> CmdResult<ModelFacts> {
    tauri::async_runtime::spawn_blocking(move || open_model(&path).map(|(_, f)| f))
        .await
        .map_err(|e| CommandError::io(e.to_string()))?
}

/// The plan of `settings.model_path` (or the loaded model) under `settings`.
#[tauri::command]
pub async fn plan(state: State<'_, AppState>, settings: EngineSettings) -> CmdResult<PlanReply> {
    let path = settings.model_path.clone().or_else(|| state.settings().model_path);
    let Some(path) = path else {
        return Err(CommandError {
            code: ErrorCode::Invalid,
            field: Some("model_path".into()),
            message: "choose a model first".into(),
        });
    };
    tauri::async_runtime::spawn_blocking(move || {
        settings.check()?;
        let (file, _) = open_model(&path)?;
        let plan = settings.plan(&file)?;
        Ok(PlanReply { plan, flags: settings.serve_flags() })
    })
    .await
    .map_err(|e| CommandError::io(e.to_string()))?
}

#[tauri::command]
pub async fn load_model<R: Runtime>(
    app: AppHandle<R>,
    state: State<'_, AppState>,
    path: String,
    on_progress: Channel<LoadProgress>,
) -> CmdResult<ModelFacts> {
    let progress = |stage, fraction, message: Option<String>| {
        let _ = on_progress.send(LoadProgress { path: path.clone(), stage, fraction, message });
    };
    progress(LoadStage::Planning, 0.05, None);
    let mut settings = state.settings();
    settings.model_path = Some(path.clone());
    let s2 = settings.clone();
    let p2 = path.clone();
    let planned = tauri::async_runtime::spawn_blocking(move || -> CmdResult<ModelFacts> {
        let (file, facts) = open_model(&p2)?;
        let plan = s2.plan(&file)?;
        if let Some(problem) = plan.problem {
            return Err(CommandError::new(ErrorCode::Model, format!("{} does not fit: {problem}", facts.name)));
        }
        Ok(facts)
    })
    .await
    .map_err(|e| CommandError::io(e.to_string()))?;
    let facts = match planned {
        Ok(f) => f,
        Err(e) => {
            progress(LoadStage::Failed, 0.0, Some(e.message.clone()));
            return Err(e);
        }
    };
    let settings = state.store_settings(&app, &settings)?;
    progress(LoadStage::Starting, 0.1, None);
    // In place when the engine can (it goes on answering while the model loads beside), else a restart.
    if state.apply_engine(&settings).await? {
        progress(LoadStage::Ready, 1.0, None);
        return Ok(facts);
    }
    // The engine pages the file in as it loads: the fraction is estimated from the file's size (at about
    // 1 GB/s) until it reports ready.
    let started = Instant::now();
    let expected_s = (facts.file_bytes as f64 / 1e9).max(0.5);
    let mut status = state.supervisor.subscribe_status();
    loop {
        let s = status.borrow_and_update().clone();
        match s.state {
            EngineState::Ready => break,
            EngineState::Failed | EngineState::Stopped => {
                let msg = s.message.unwrap_or_else(|| "the engine stopped".into());
                progress(LoadStage::Failed, 0.0, Some(msg.clone()));
                return Err(CommandError::engine(msg));
            }
            _ => {}
        }
        let f = 0.1 + 0.85 * (1.0 - (-started.elapsed().as_secs_f64() / expected_s).exp());
        progress(LoadStage::Loading, f as f32, s.message.clone());
        let _ = tokio::time::timeout(Duration::from_millis(200), status.changed()).await;
    }
    progress(LoadStage::Ready, 1.0, None);
    Ok(facts)
}

#[tauri::command]
pub async fn unload_model<R: Runtime>(app: AppHandle<R>, state: State<'_, AppState>) -> CmdResult<()> {
    state.supervisor.stop(Duration::from_secs(5)).await;
    let mut s = state.settings();
    s.model_path = None;
    state.store_settings(&app, &s).map(|_| ())
}

/// The settings, a remote key masked (`kept` with its hint, or `none`): the key never reaches the page.
#[tauri::command]
pub fn get_settings(state: State<'_, AppState>) -> EngineSettings {
    state.settings()
}

/// Checks and keeps `settings`; when what the engine runs with changed, restarts it with them. A remote
/// key sent as it was read (`kept`) stays, `new` replaces it, `none` clears it; the answer is masked.
#[tauri::command]
pub async fn save_settings<R: Runtime>(
    app: AppHandle<R>,
    state: State<'_, AppState>,
    settings: EngineSettings,
) -> CmdResult<EngineSettings> {
    let s2 = settings.clone();
    tauri::async_runtime::spawn_blocking(move || -> CmdResult<()> {
        s2.check()?;
        if let (EngineLocation::Local, Some(path)) = (&s2.engine, &s2.model_path) {
            let (file, _) = open_model(path).map_err(|e| CommandError { field: Some("model_path".into()), ..e })?;
            s2.plan(&file)?;
        } else if s2.engine == EngineLocation::Local {
            // No model to plan: the placement and the draft model's file are checked on their own.
            s2.load_options()?;
            s2.open_draft()?;
        }
        Ok(())
    })
    .await
    .map_err(|e| CommandError::io(e.to_string()))??;
    let old = state.settings();
    let kept = state.store_settings(&app, &settings)?;
    if old != kept {
        state.apply_engine(&kept).await?;
    }
    Ok(kept)
}

fn check_messages(messages: &[ChatMessage]) -> CmdResult<()> {
    let invalid =
        |m: &str| CommandError { code: ErrorCode::Invalid, field: Some("messages".into()), message: m.into() };
    if messages.is_empty() {
        return Err(invalid("send at least one message"));
    }
    if messages.last().map(|m| m.role) != Some(ChatRole::User) {
        return Err(invalid("the last message is the user's"));
    }
    if messages.iter().map(|m| m.content.len()).sum::<usize>() > MAX_CHAT_BYTES {
        return Err(invalid("the conversation is over 4 MiB of text"));
    }
    Ok(())
}

/// Streams a reply to `messages` into conversation `conversation_id` (whose messages become `messages`
/// plus the reply, and whose title becomes `title` when the page sends one: the page names conversations,
/// this side makes no title). If the engine dies mid-reply, the reply starts again once on the restarted
/// engine.
#[tauri::command]
pub async fn chat_send(
    state: State<'_, AppState>,
    conversation_id: String,
    messages: Vec<ChatMessage>,
    title: Option<String>,
    params: ChatParams,
    on_chunk: Channel<ChatChunk>,
) -> CmdResult<()> {
    check_messages(&messages)?;
    check_params(&params)?;
    let mut conv = state.history.begin_reply(&conversation_id, &messages, title)?;
    // Stored before anything streams: the UI reads the list again (title, count) while the reply runs.
    let _ = on_chunk.send(ChatChunk::Stored);
    let mut cancel = state.cancel_token(&conversation_id);
    let result = stream_reply(&state, &mut conv, &messages, &params, &on_chunk, &mut cancel).await;
    state.drop_cancel(&conversation_id);
    match result {
        Ok(()) => Ok(()),
        Err(e) => {
            let _ = on_chunk.send(ChatChunk::Error { message: e.message.clone() });
            Err(e)
        }
    }
}

async fn stream_reply(
    state: &AppState,
    conv: &mut Conversation,
    messages: &[ChatMessage],
    params: &ChatParams,
    on_chunk: &Channel<ChatChunk>,
    cancel: &mut tokio::sync::watch::Receiver<bool>,
) -> CmdResult<()> {
    let mut retried = false;
    loop {
        let endpoint = state.chat_endpoint().await?;
        let client = EngineClient::new(endpoint.clone());
        let last = conv.messages.len() - 1;
        let mut pending = String::new();
        let mut pending_reasoning = String::new();
        let mut last_flush = Instant::now();
        let mut write_error: Option<CommandError> = None;
        let outcome = {
            let conv_ref = &mut *conv;
            let history = &state.history;
            client
                .chat(
                    messages,
                    params,
                    |piece, t| {
                        match piece {
                            Piece::Reasoning => pending_reasoning.push_str(t),
                            Piece::Content => pending.push_str(t),
                        }
                        if last_flush.elapsed() >= FLUSH_EVERY {
                            add_pieces(&mut conv_ref.messages[last], &pending_reasoning, &pending);
                            // Written before it is shown.
                            match history.save(conv_ref) {
                                Ok(()) => send_pieces(on_chunk, &mut pending_reasoning, &mut pending),
                                Err(e) => write_error = Some(e),
                            }
                            last_flush = Instant::now();
                        }
                    },
                    cancel,
                )
                .await
        };
        if let Some(e) = write_error {
            return Err(e);
        }
        add_pieces(&mut conv.messages[last], &pending_reasoning, &pending);
        match outcome {
            Ok(end) => {
                let (finish_reason, figures) = match end {
                    ChatEnd::Done { finish_reason, figures } => (finish_reason, figures.map(|f| *f)),
                    ChatEnd::Cancelled => ("cancelled".to_owned(), None),
                };
                conv.messages[last].figures = figures.clone();
                conv.messages[last].complete = true;
                conv.updated_ms = now_ms();
                state.history.save(conv)?;
                send_pieces(on_chunk, &mut pending_reasoning, &mut pending);
                let _ = on_chunk.send(ChatChunk::Done { finish_reason, figures });
                return Ok(());
            }
            Err(ChatFailure::Gone(why)) if !retried && state.settings().engine == EngineLocation::Local => {
                retried = true;
                tracing::warn!("the reply was cut ({why}); retrying once on the restarted engine");
                conv.messages[last].content.clear();
                conv.messages[last].reasoning = None;
                state.history.save(conv)?;
                let _ = on_chunk.send(ChatChunk::Retrying { reason: why });
                state.supervisor.ready_other_than(Some(&endpoint), RETRY_WAIT).await.map_err(CommandError::engine)?;
            }
            Err(e) => {
                conv.messages[last].complete = true;
                state.history.save(conv)?;
                return Err(CommandError::engine(e.to_string()));
            }
        }
    }
}

/// Adds pieces of a reply to its stored message: the reasoning (before the answer) and the answer.
fn add_pieces(message: &mut StoredMessage, reasoning: &str, text: &str) {
    if !reasoning.is_empty() {
        message.reasoning.get_or_insert_with(String::new).push_str(reasoning);
    }
    message.content.push_str(text);
}

/// Sends what is pending of a reply, reasoning first, and empties both.
fn send_pieces(on_chunk: &Channel<ChatChunk>, reasoning: &mut String, text: &mut String) {
    if !reasoning.is_empty() {
        let _ = on_chunk.send(ChatChunk::Reasoning { text: std::mem::take(reasoning) });
    }
    if !text.is_empty() {
        let _ = on_chunk.send(ChatChunk::Text { text: std::mem::take(text) });
    }
}

/// The chat preferences (the reply limit, values saved per model); the defaults until some are saved.
#[tauri::command]
pub fn get_preferences(state: State<'_, AppState>) -> CmdResult<ChatPreferences> {
    state.preferences.get()
}

/// Checks and keeps `preferences` (replacing what was kept); returns them.
#[tauri::command]
pub fn save_preferences(state: State<'_, AppState>, preferences: ChatPreferences) -> CmdResult<ChatPreferences> {
    state.preferences.save(&preferences)
}

#[tauri::command]
pub fn chat_cancel(state: State<'_, AppState>, conversation_id: String) -> CmdResult<()> {
    state.cancel(&conversation_id);
    Ok(())
}

#[tauri::command]
pub fn conversations_list(state: State<'_, AppState>) -> CmdResult<Vec<ConversationSummary>> {
    state.history.list()
}

#[tauri::command]
pub fn conversation_get(state: State<'_, AppState>, id: String) -> CmdResult<Conversation> {
    state.history.get(&id)
}

#[tauri::command]
pub fn conversation_create(state: State<'_, AppState>, title: Option<String>) -> CmdResult<Conversation> {
    state.history.create(title)
}

#[tauri::command]
pub fn conversation_rename(state: State<'_, AppState>, id: String, title: String) -> CmdResult<()> {
    state.history.rename(&id, &title)
}

/// Deletes conversation `id`. A reply streaming in it is cancelled first, and the file deleted once that
/// reply has ended: its last write would otherwise store the conversation again.
#[tauri::command]
pub async fn conversation_delete(state: State<'_, AppState>, id: String) -> CmdResult<()> {
    if let Some(reply) = state.cancel(&id) {
        if tokio::time::timeout(DELETE_WAIT, reply.closed()).await.is_err() {
            tracing::warn!("the reply in conversation {id} did not end within {DELETE_WAIT:?} of its cancel");
        }
    }
    state.history.delete(&id)
}

/// Writes `text` (an export the page made) to a file the user picks in the native save dialog, which
/// offers `file_name` (opened here, so the webview never names a path to write); the file's path, or None
/// when the user cancelled.
#[tauri::command]
pub async fn conversation_save<R: Runtime>(
    app: AppHandle<R>,
    file_name: String,
    text: String,
) -> CmdResult<Option<String>> {
    use tauri_plugin_dialog::DialogExt;
    let mut dialog = app.dialog().file().set_file_name(&file_name);
    if let Some(ext) = std::path::Path::new(&file_name).extension().and_then(|e| e.to_str()) {
        dialog = dialog.add_filter(format!("{} document", ext.to_uppercase()), &[ext]);
    }
    let (tx, rx) = tokio::sync::oneshot::channel();
    dialog.save_file(move |p| {
        let _ = tx.send(p);
    });
    let Some(picked) = rx.await.map_err(|_| CommandError::io("the save dialog closed"))? else { return Ok(None) };
    let path = picked.into_path().map_err(|e| CommandError::io(format!("cannot save there: {e}")))?;
    crate::history::write_file_atomic(&path, text.as_bytes())
        .map_err(|e| CommandError::io(format!("cannot write {}: {e}", path.display())))?;
    Ok(Some(path.display().to_string()))
}

async fn strata_read<T: serde::de::DeserializeOwned>(state: &AppState, path: &str) -> CmdResult<Option<T>> {
    let Some(endpoint) = state.read_endpoint() else { return Ok(None) };
    EngineClient::new(endpoint).get_json(path).await.map_err(CommandError::engine)
}

/// The engine's devices; None when a remote engine is not Strata (or none runs).
#[tauri::command]
pub async fn devices(state: State<'_, AppState>) -> CmdResult<Option<DevicesView>> {
    strata_read(&state, "/strata/devices").await
}

/// The app's telemetry after `since_ms` (ms on the app's clock): the engine's samples and events as they
/// arrived, and the app's own (engine restarts). None for a remote engine that is not Strata.
#[tauri::command]
pub async fn telemetry(state: State<'_, AppState>, since_ms: f64) -> CmdResult<Option<TelemetryView>> {
    if let EngineLocation::Remote { .. } = state.settings().engine {
        if strata_read::<DevicesView>(&state, "/strata/devices").await?.is_none() {
            return Ok(None);
        }
    }
    let t = &state.telemetry;
    let (samples, events) = t.since(since_ms);
    Ok(Some(TelemetryView { now_ms: t.now_ms(), samples, events }))
}

#[tauri::command]
pub async fn cache(state: State<'_, AppState>) -> CmdResult<Option<CacheView>> {
    strata_read(&state, "/strata/cache").await
}

#[tauri::command]
pub fn engine_status(state: State<'_, AppState>) -> EngineStatus {
    let mut s = state.supervisor.status();
    if let EngineLocation::Remote { url, .. } = state.settings().engine {
        s.state = EngineState::Remote;
        s.message = Some(url);
    }
    s
}

impl AppState {
    /// Where chats go: the remote endpoint (with the key from the key file), or the local engine once ready.
    async fn chat_endpoint(&self) -> CmdResult<Endpoint> {
        match self.remote_endpoint() {
            Some(e) => Ok(e),
            None => self.supervisor.ready(RETRY_WAIT).await.map_err(CommandError::engine),
        }
    }

    fn read_endpoint(&self) -> Option<Endpoint> {
        self.remote_endpoint().or_else(|| self.supervisor.endpoint())
    }

    /// The remote endpoint, when the settings name one; None for the local engine.
    fn remote_endpoint(&self) -> Option<Endpoint> {
        let EngineLocation::Remote { url, model, .. } = self.settings().engine else { return None };
        Some(Endpoint { url: url.trim_end_matches('/').to_owned(), api_key: self.remote_key.key(), model })
    }
}
