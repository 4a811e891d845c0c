//! The app's integration tests, in one binary (each test binary links the whole webview stack):
//! `commands` (the commands through Tauri's IPC on a mock runtime), `chats` (chat_send in two
//! conversations at once, against a stand-in engine), `bindings` (the TypeScript bindings are current),
//! `supervisor` (the engine supervisor with stand-in engines).

mod bindings;
mod chats;
mod commands;
#[cfg(unix)]
mod supervisor;
