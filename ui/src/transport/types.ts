// The one seam between the views and the engine: `Transport`. The Tauri app implements it with invoke,
// Channel and events (tauri.ts); a browser talking to `strata serve` implements it with fetch and SSE
// (http.ts). Views never know which one they hold, and tests hand them a fake. This module owns the
// interface and the error every method rejects with; it must never import either implementation.
import type {
  CacheView,
  ChatChunk,
  ChatMessage,
  ChatParams,
  ChatPreferences,
  CommandError,
  Conversation,
  ConversationSummary,
  DevicesView,
  DownloadView,
  FileView,
  FitView,
  HubModel,
  LocalModel,
  Pick,
  EngineSettings,
  EngineStatus,
  ErrorCode,
  ExportFormat,
  LoadProgress,
  ModelFacts,
  PlanReply,
  RemoteKey,
  TelemetryEntry,
  TelemetryView,
} from "../bindings";

/** Stops a subscription; safe to call twice. */
export type Unsubscribe = () => void;

/** What a transport can do beyond the common part, for views to offer or explain. */
export interface Capabilities {
  /** Inspect, load and unload model files other than the served one (the desktop app). */
  readonly loadModels: boolean;
  /** Apply settings by restarting the engine (the desktop app); otherwise they are only checked. */
  readonly applySettings: boolean;
  /** Files dropped on the window reach the app as paths (the desktop app). */
  readonly fileDrop: boolean;
}

/** The GGUFs here and the folder downloads go to. */
export interface LocalModels {
  models_dir: string;
  models: LocalModel[];
}

/**
 * The model library: the Hugging Face Hub searched and planned on the engine's machine, downloads into its
 * models folder, the GGUFs already there. Every method rejects with a TransportError naming what failed
 * (a gated repository names HF_TOKEN; a full disk says how much is needed).
 */
export interface LibraryApi {
  search(text: string): Promise<HubModel[]>;
  files(repo: string): Promise<FileView[]>;
  /** A file's plan on the engine's devices at `context` positions (null: 4096, or less for a shorter model). */
  fit(repo: string, file: string, context: number | null): Promise<FitView>;
  /** Good defaults for the machine's memory: one chat, one code and one small model. */
  picks(): Promise<Pick[]>;
  local(): Promise<LocalModels>;
  /** Deletes a GGUF of the models folder (nothing else). */
  remove(path: string): Promise<void>;
  downloads(): Promise<DownloadView[]>;
  /** Starts a download; resolves with its id. */
  startDownload(repo: string, file: string): Promise<number>;
  /** Stops a running download (its part is deleted) or forgets a finished one. */
  cancelDownload(id: number): Promise<void>;
  /** The library's own settings, where the app keeps them (the desktop app; a server takes flags). */
  settings?(): Promise<LibrarySettingsView>;
  saveSettings?(settings: LibrarySettings): Promise<LibrarySettingsView>;
}

/** The library's settings: the models folder ("" for the default) and a Hugging Face token (kept or not). */
export interface LibrarySettings {
  models_dir: string;
  hf_token: RemoteKey;
}

/** The library's settings as read: the folder they come to, the default, and where the Hub's token comes from. */
export interface LibrarySettingsView {
  settings: LibrarySettings;
  models_dir: string;
  default_models_dir: string;
  token_from: "settings" | "environment" | "none";
}

export interface Transport {
  /** Which implementation this is, for labels only: views branch on `caps`, never on this. */
  readonly kind: "tauri" | "http";
  readonly caps: Capabilities;
  /** The model library, where this transport has one (null: the view does not offer it). */
  readonly library: LibraryApi | null;

  /** Reads a model file's facts without loading it. */
  inspectModel(path: string): Promise<ModelFacts>;
  /** Plans a load (settings.model_path: the file to plan; null: the loaded model), per device. */
  plan(settings: EngineSettings): Promise<PlanReply>;
  /**
   * Applies settings to the running engine without a restart, where the transport can (a browser's
   * `strata serve`: POST /strata/model/load); resolves with the settings it runs with then. A setting only a
   * restart applies is refused at its field.
   */
  applyInPlace?(settings: EngineSettings): Promise<EngineSettings>;
  /** Loads a model, reporting progress, and resolves with its facts. */
  loadModel(path: string, onProgress: (p: LoadProgress) => void): Promise<ModelFacts>;
  /** Unloads the model. */
  unloadModel(): Promise<void>;
  /** The loaded (or served) model's facts; null when none is loaded. */
  currentModel(): Promise<ModelFacts | null>;
  /** Asks the user for a .gguf file (null: cancelled). */
  pickModelFile(): Promise<string | null>;
  /** Calls `onPaths` with the paths of files dropped on the window. */
  onFileDrop(onPaths: (paths: string[]) => void): Unsubscribe;

  /** The engine's settings. */
  getSettings(): Promise<EngineSettings>;
  /** Validates and saves settings (restarting the engine when its flags changed); resolves with them. */
  saveSettings(settings: EngineSettings): Promise<EngineSettings>;

  /**
   * Sends a conversation's messages; the backend stores them as the conversation, with the title they give
   * it (titleAfter in chat/conversation.ts), and appends the reply, streamed to `onChunk`: `stored` once
   * the messages are stored (the list's title and count are current from then on), text pieces, maybe
   * `retrying`, then `done` or `error`. Each field of `params` that is set is sent and used exactly; a null
   * one is not sent (the model's default applies).
   */
  chatSend(
    conversationId: string,
    messages: ChatMessage[],
    params: ChatParams,
    onChunk: (chunk: ChatChunk) => void,
  ): Promise<void>;
  /** Stops the reply being streamed in that conversation. */
  chatCancel(conversationId: string): Promise<void>;

  /** The chat preferences (reply limit, values saved per model); the defaults until some are saved. */
  getPreferences(): Promise<ChatPreferences>;
  /** Checks and keeps the chat preferences (replacing what was kept); resolves with them. */
  savePreferences(preferences: ChatPreferences): Promise<ChatPreferences>;

  listConversations(): Promise<ConversationSummary[]>;
  getConversation(id: string): Promise<Conversation>;
  /** Creates a conversation (title null: untitled, shown as DEFAULT_TITLE until its first message names it). */
  createConversation(title: string | null): Promise<Conversation>;
  /** Renames a conversation (the title cleaned by cleanTitle). */
  renameConversation(id: string, title: string): Promise<void>;
  deleteConversation(id: string): Promise<void>;
  /**
   * Saves the conversation as a document (exportFile in chat/conversation.ts: the text and the file name
   * from its title): in the app through the native save dialog (the backend writes the file the user
   * picked), in a browser as a download. The file's path or name, or null when the user cancelled.
   */
  saveExport(id: string, format: ExportFormat): Promise<string | null>;

  /** Every device's memory; null when the engine is a remote one that is not Strata. */
  devices(): Promise<DevicesView | null>;
  /** Samples and events after `sinceMs` (the engine's clock); null as for devices. */
  telemetry(sinceMs: number): Promise<TelemetryView | null>;
  /** The conversation cache; null as for devices. */
  cache(): Promise<CacheView | null>;
  /** The engine's state. */
  engineStatus(): Promise<EngineStatus>;

  /** Live samples and events, as they happen. */
  onTelemetry(onEntry: (entry: TelemetryEntry) => void): Unsubscribe;
  /** Engine state changes. */
  onEngineStatus(onStatus: (status: EngineStatus) => void): Unsubscribe;
}

const CODES: readonly ErrorCode[] = ["invalid", "model", "engine", "io", "not_found", "busy", "cancelled"];

/** What every transport method rejects with: a CommandError as an Error. */
export class TransportError extends Error implements CommandError {
  readonly code: ErrorCode;
  /** The settings field (or request field) the error is about, when code is "invalid". */
  readonly field: string | null;

  constructor(code: ErrorCode, message: string, field: string | null = null) {
    super(message);
    this.name = "TransportError";
    this.code = code;
    this.field = field;
  }

  /** Turns whatever a call rejected with into a TransportError (CommandError objects keep their fields). */
  static from(e: unknown, fallback: ErrorCode = "engine"): TransportError {
    if (e instanceof TransportError) return e;
    if (isCommandError(e)) return new TransportError(e.code, e.message, e.field ?? null);
    if (e instanceof Error) return new TransportError(fallback, e.message);
    if (typeof e === "string") return new TransportError(fallback, e);
    return new TransportError(fallback, "unknown error: " + safeJson(e));
  }
}

export function isCommandError(e: unknown): e is CommandError {
  if (typeof e !== "object" || e === null) return false;
  const o = e as Record<string, unknown>;
  return (
    typeof o.code === "string" &&
    (CODES as readonly string[]).includes(o.code) &&
    typeof o.message === "string" &&
    (o.field === undefined || o.field === null || typeof o.field === "string")
  );
}

function safeJson(v: unknown): string {
  try {
    return JSON.stringify(v) ?? String(v);
  } catch {
    return String(v);
  }
}
