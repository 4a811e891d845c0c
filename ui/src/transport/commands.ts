// The Tauri commands the UI invokes, one string literal per line, so that a Rust test can read this file and
// check that each is registered and allowed by the window's capability. Every invoke goes through
// `callCommand` in tauri.ts, whose name parameter is typed by this list: a command missing here does not
// compile.
export const COMMANDS = [
  "inspect_model",
  "plan",
  "load_model",
  "unload_model",
  "get_settings",
  "save_settings",
  "chat_send",
  "chat_cancel",
  "get_preferences",
  "save_preferences",
  "conversations_list",
  "conversation_get",
  "conversation_create",
  "conversation_rename",
  "conversation_delete",
  "conversation_save",
  "devices",
  "telemetry",
  "cache",
  "engine_status",
  "library_search",
  "library_files",
  "library_fit",
  "library_picks",
  "library_local",
  "library_delete",
  "library_downloads",
  "library_start",
  "library_cancel",
  "library_settings",
  "library_save_settings",
] as const;

/** One of the commands above. */
export type CommandName = (typeof COMMANDS)[number];

/** The Tauri events the UI listens to (payloads: TelemetryEntry, EngineStatus). */
export const EVENTS = [
  "telemetry",
  "engine_status",
] as const;

export type EventName = (typeof EVENTS)[number];
