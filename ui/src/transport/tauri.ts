// The Transport of the desktop app: Tauri commands (invoke), Channels for streamed replies and load
// progress, events for telemetry and engine status, the webview's drag-and-drop and the dialog plugin.
// Every invoke goes through `callCommand`, whose names come from COMMANDS (commands.ts). Argument keys are
// camelCase: Tauri 2 maps them to the Rust commands' snake_case parameters. Titles and exports follow
// chat/conversation.ts, here as in the browser: the backend stores the title it is sent and writes the
// document it is given, deciding neither.
import { Channel, invoke } from "@tauri-apps/api/core";
import { listen } from "@tauri-apps/api/event";
import { getCurrentWebview } from "@tauri-apps/api/webview";
import { open } from "@tauri-apps/plugin-dialog";
import type {
  CacheView,
  ChatChunk,
  ChatMessage,
  ChatParams,
  ChatPreferences,
  Conversation,
  ConversationSummary,
  DevicesView,
  EngineSettings,
  EngineStatus,
  ExportFormat,
  LoadProgress,
  ModelFacts,
  PlanReply,
  TelemetryEntry,
  TelemetryView,
} from "../bindings";
import { cleanTitle, exportFile, titleAfter } from "../chat/conversation";
import type { CommandName, EventName } from "./commands";
import {
  TransportError,
  type LibraryApi,
  type LibrarySettingsView,
  type LocalModels,
  type Transport,
  type Unsubscribe,
} from "./types";

/** Invokes one command of COMMANDS; a rejection becomes a TransportError (CommandError fields kept). */
export async function callCommand<T>(name: CommandName, args?: Record<string, unknown>): Promise<T> {
  try {
    return await invoke<T>(name, args);
  } catch (e) {
    throw TransportError.from(e);
  }
}

/** Listens to a Tauri event; the returned function unlistens, even before `listen` has resolved. */
function follow<T>(name: EventName, onPayload: (payload: T) => void): Unsubscribe {
  let stopped = false;
  let unlisten: (() => void) | null = null;
  listen<T>(name, (e) => {
    if (!stopped) onPayload(e.payload);
  })
    .then((u) => {
      if (stopped) u();
      else unlisten = u;
    })
    .catch((e: unknown) => console.warn(`cannot listen to ${name}:`, e));
  return () => {
    stopped = true;
    unlisten?.();
    unlisten = null;
  };
}

export class TauriTransport implements Transport {
  readonly kind = "tauri" as const;
  readonly caps = { loadModels: true, applySettings: true, fileDrop: true };
  /** The model library runs in the app's own process (src-tauri/src/library.rs): no engine need run. */
  readonly library: LibraryApi = {
    search: (text) => callCommand("library_search", { text }),
    files: (repo) => callCommand("library_files", { repo }),
    fit: (repo, file, context) => callCommand("library_fit", { repo, file, context }),
    picks: () => callCommand("library_picks"),
    local: () => callCommand<LocalModels>("library_local"),
    remove: (path) => callCommand("library_delete", { path }),
    downloads: () => callCommand("library_downloads"),
    startDownload: (repo, file) => callCommand("library_start", { repo, file }),
    cancelDownload: (id) => callCommand("library_cancel", { id }),
    settings: () => callCommand<LibrarySettingsView>("library_settings"),
    saveSettings: (settings) => callCommand<LibrarySettingsView>("library_save_settings", { settings }),
  };

  inspectModel(path: string): Promise<ModelFacts> {
    return callCommand("inspect_model", { path });
  }

  plan(settings: EngineSettings): Promise<PlanReply> {
    return callCommand("plan", { settings });
  }

  async loadModel(path: string, onProgress: (p: LoadProgress) => void): Promise<ModelFacts> {
    const channel = new Channel<LoadProgress>(onProgress);
    return callCommand("load_model", { path, onProgress: channel });
  }

  async unloadModel(): Promise<void> {
    await callCommand<null>("unload_model");
  }

  async currentModel(): Promise<ModelFacts | null> {
    return (await this.engineStatus()).model;
  }

  async pickModelFile(): Promise<string | null> {
    try {
      const picked = await open({
        title: "Choose a GGUF model",
        multiple: false,
        directory: false,
        filters: [{ name: "GGUF model", extensions: ["gguf"] }],
      });
      return typeof picked === "string" ? picked : null;
    } catch (e) {
      throw TransportError.from(e, "io");
    }
  }

  onFileDrop(onPaths: (paths: string[]) => void): Unsubscribe {
    let stopped = false;
    let unlisten: (() => void) | null = null;
    let webview: ReturnType<typeof getCurrentWebview>;
    try {
      webview = getCurrentWebview();
    } catch (e) {
      console.warn("no webview to follow file drops on:", e);
      return () => {};
    }
    webview
      .onDragDropEvent((e) => {
        if (!stopped && e.payload.type === "drop" && e.payload.paths.length > 0) onPaths(e.payload.paths);
      })
      .then((u) => {
        if (stopped) u();
        else unlisten = u;
      })
      .catch((e: unknown) => console.warn("cannot follow file drops:", e));
    return () => {
      stopped = true;
      unlisten?.();
      unlisten = null;
    };
  }

  getSettings(): Promise<EngineSettings> {
    return callCommand("get_settings");
  }

  saveSettings(settings: EngineSettings): Promise<EngineSettings> {
    return callCommand("save_settings", { settings });
  }

  async chatSend(
    conversationId: string,
    messages: ChatMessage[],
    params: ChatParams,
    onChunk: (chunk: ChatChunk) => void,
  ): Promise<void> {
    // The title the messages give the conversation; null when it keeps the one it has.
    const current = (await this.getConversation(conversationId)).title;
    const next = titleAfter(current, messages);
    const title = next !== current ? next : null;
    const channel = new Channel<ChatChunk>(onChunk);
    await callCommand<null>("chat_send", { conversationId, messages, title, params, onChunk: channel });
  }

  async chatCancel(conversationId: string): Promise<void> {
    await callCommand<null>("chat_cancel", { conversationId });
  }

  getPreferences(): Promise<ChatPreferences> {
    return callCommand("get_preferences");
  }

  savePreferences(preferences: ChatPreferences): Promise<ChatPreferences> {
    return callCommand("save_preferences", { preferences });
  }

  listConversations(): Promise<ConversationSummary[]> {
    return callCommand("conversations_list");
  }

  getConversation(id: string): Promise<Conversation> {
    return callCommand("conversation_get", { id });
  }

  createConversation(title: string | null): Promise<Conversation> {
    return callCommand("conversation_create", { title: title === null ? null : cleanTitle(title) });
  }

  async renameConversation(id: string, title: string): Promise<void> {
    await callCommand<null>("conversation_rename", { id, title: cleanTitle(title) });
  }

  async deleteConversation(id: string): Promise<void> {
    await callCommand<null>("conversation_delete", { id });
  }

  async saveExport(id: string, format: ExportFormat): Promise<string | null> {
    const { fileName, text } = exportFile(await this.getConversation(id), format);
    return callCommand("conversation_save", { fileName, text });
  }

  devices(): Promise<DevicesView | null> {
    return callCommand("devices");
  }

  telemetry(sinceMs: number): Promise<TelemetryView | null> {
    return callCommand("telemetry", { sinceMs });
  }

  cache(): Promise<CacheView | null> {
    return callCommand("cache");
  }

  engineStatus(): Promise<EngineStatus> {
    return callCommand("engine_status");
  }

  onTelemetry(onEntry: (entry: TelemetryEntry) => void): Unsubscribe {
    return follow<TelemetryEntry>("telemetry", onEntry);
  }

  onEngineStatus(onStatus: (status: EngineStatus) => void): Unsubscribe {
    return follow<EngineStatus>("engine_status", onStatus);
  }
}
