// The Transport of a browser talking to `strata serve` on the page's own origin: the OpenAI chat endpoint
// (streamed over SSE), the Strata API (/health, /strata/*), and conversations kept in localStorage. The
// server serves one model with the flags it was started with, so loading other models is refused and
// settings are only checked (POST /strata/plan), never applied. Chat preferences live in localStorage too.
import { exportFile } from "../../chat/conversation";
import { downloadText } from "../../util/download";
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
  StoredMessage,
  TelemetryEntry,
  TelemetryView,
} from "../../bindings";
import { TransportError, type Transport, type Unsubscribe } from "../types";
import { ApiClient, isAbort, type AskKey, type ClientOptions } from "./client";
import { LocalConversations } from "./conversations";
import { HttpLibrary } from "./library";
import { LocalPreferences } from "./preferences";
import { chatRequestBody, healthToStatus, streamChat, toModelFacts } from "./openai";
import { readSse } from "./sse";

export interface HttpOptions extends ClientOptions {
  /** How often /health is polled for onEngineStatus. */
  healthEveryMs?: number;
  /** First and longest wait before reconnecting the event stream. */
  reconnectMinMs?: number;
  reconnectMaxMs?: number;
}

const DESKTOP_ONLY = "strata serve serves one model: inspecting and loading other model files is done in the desktop app";

export class HttpTransport implements Transport {
  readonly kind = "http" as const;
  readonly caps = { loadModels: false, applySettings: false, fileDrop: false };
  readonly client: ApiClient;
  readonly library: HttpLibrary;
  private readonly store: LocalConversations;
  private readonly prefs: LocalPreferences;
  private readonly inflight = new Map<string, AbortController>();
  private readonly healthEveryMs: number;
  private readonly reconnectMinMs: number;
  private readonly reconnectMaxMs: number;
  private model: Promise<ModelFacts | null> | null = null;
  private modelId: Promise<string | null> | null = null;
  /** The id /health named when `model` was read: another one (a switch) reads the facts again. */
  private healthModel: string | null = null;
  /** The status pollers of onEngineStatus, asked to poll now after a switch. */
  private readonly pollers = new Set<() => void>();

  constructor(opts: HttpOptions = {}) {
    this.client = new ApiClient(opts);
    this.library = new HttpLibrary(this.client);
    this.store = new LocalConversations(opts.storage ?? localStorage);
    this.prefs = new LocalPreferences(opts.storage ?? localStorage);
    this.healthEveryMs = opts.healthEveryMs ?? 5000;
    this.reconnectMinMs = opts.reconnectMinMs ?? 1000;
    this.reconnectMaxMs = opts.reconnectMaxMs ?? 30000;
  }

  setAskKey(ask: AskKey | null): void {
    this.client.setAskKey(ask);
  }

  async inspectModel(): Promise<ModelFacts> {
    throw new TransportError("invalid", DESKTOP_ONLY);
  }

  async plan(settings: EngineSettings): Promise<PlanReply> {
    return this.client.postJson<PlanReply>("/strata/plan", settings);
  }

  /**
   * Switches the server to a model it lists (GET /strata/library/local) or served before, in place: POST
   * /strata/model/load with the settings it runs with. A setting that needs a new process is refused there
   * (`needs_restart`), with the field named.
   */
  async loadModel(path: string, onProgress: (p: LoadProgress) => void): Promise<ModelFacts> {
    onProgress({ path, stage: "planning", fraction: 0.05, message: null });
    const settings = await this.getSettings();
    onProgress({ path, stage: "loading", fraction: 0.3, message: "loading beside the served model" });
    // Split points name layers of one model: another model is split by free memory.
    const layer_split = path === settings.model_path ? settings.layer_split : "";
    const reply = await this.client.postJson<{ model: unknown }>("/strata/model/load", { ...settings, model_path: path, layer_split });
    this.model = null;
    this.modelId = null;
    const facts = toModelFacts(reply.model);
    for (const poll of this.pollers) poll();
    onProgress({ path, stage: "ready", fraction: 1, message: null });
    return facts;
  }

  async applyInPlace(settings: EngineSettings): Promise<EngineSettings> {
    await this.client.postJson<{ model: unknown }>("/strata/model/load", settings);
    this.model = null;
    this.modelId = null;
    for (const poll of this.pollers) poll();
    return this.getSettings();
  }

  async unloadModel(): Promise<void> {
    throw new TransportError("invalid", DESKTOP_ONLY);
  }

  currentModel(): Promise<ModelFacts | null> {
    if (!this.model) {
      this.model = this.client.getJson<unknown>("/strata/model").then(toModelFacts, (e: unknown) => {
        this.model = null;
        if (e instanceof TransportError && e.code === "not_found") return null;
        throw e;
      });
    }
    return this.model;
  }

  async pickModelFile(): Promise<string | null> {
    throw new TransportError("invalid", DESKTOP_ONLY);
  }

  onFileDrop(): Unsubscribe {
    return () => {};
  }

  getSettings(): Promise<EngineSettings> {
    return this.client.getJson<EngineSettings>("/strata/settings");
  }

  async saveSettings(): Promise<EngineSettings> {
    throw new TransportError("invalid", "a browser cannot restart strata serve: restart it with the flags shown");
  }

  async chatSend(
    conversationId: string,
    messages: ChatMessage[],
    params: ChatParams,
    onChunk: (chunk: ChatChunk) => void,
  ): Promise<void> {
    this.store.setMessages(conversationId, messages);
    this.store.putReply(conversationId, { role: "assistant", content: "", figures: null, complete: false }, false);
    onChunk({ kind: "stored" });
    this.inflight.get(conversationId)?.abort();
    const ctrl = new AbortController();
    this.inflight.set(conversationId, ctrl);
    let text = "";
    let reasoning = "";
    let final: ChatChunk | null = null;
    const deliver = (c: ChatChunk) => {
      if (final) return;
      if (c.kind === "text") text += c.text;
      if (c.kind === "reasoning") reasoning += c.text;
      if (c.kind === "done" || c.kind === "error") final = c;
      onChunk(c);
    };
    try {
      const model = await this.servedModelId();
      const res = await this.client.request("/v1/chat/completions", {
        method: "POST",
        json: chatRequestBody(model, messages, params),
        signal: ctrl.signal,
        accept: "text/event-stream",
      });
      if (!res.body) throw new TransportError("io", "the server's reply has no body");
      await streamChat(res.body, deliver, ctrl.signal);
    } catch (e) {
      if (isAbort(e) || ctrl.signal.aborted) deliver({ kind: "done", finish_reason: "cancelled", figures: null });
      else deliver({ kind: "error", message: TransportError.from(e).message });
    } finally {
      if (this.inflight.get(conversationId) === ctrl) this.inflight.delete(conversationId);
      const done = final as ChatChunk | null;
      const complete = done?.kind === "done" && done.finish_reason !== "cancelled";
      const figures = done?.kind === "done" ? done.figures : null;
      try {
        const reply: StoredMessage = { role: "assistant", content: text, figures, complete };
        if (reasoning) reply.reasoning = reasoning;
        this.store.putReply(conversationId, reply, true);
      } catch (e) {
        console.warn("cannot store the reply:", e);
      }
    }
  }

  async chatCancel(conversationId: string): Promise<void> {
    this.inflight.get(conversationId)?.abort();
  }

  async getPreferences(): Promise<ChatPreferences> {
    return this.prefs.get();
  }

  async savePreferences(preferences: ChatPreferences): Promise<ChatPreferences> {
    return this.prefs.save(preferences);
  }

  async listConversations(): Promise<ConversationSummary[]> {
    return this.store.list();
  }

  async getConversation(id: string): Promise<Conversation> {
    return this.store.get(id);
  }

  async createConversation(title: string | null): Promise<Conversation> {
    return this.store.create(title);
  }

  async renameConversation(id: string, title: string): Promise<void> {
    this.store.rename(id, title);
  }

  async deleteConversation(id: string): Promise<void> {
    this.store.delete(id);
  }

  async saveExport(id: string, format: ExportFormat): Promise<string | null> {
    const f = exportFile(this.store.get(id), format);
    downloadText(f.fileName, f.text, f.mime);
    return f.fileName;
  }

  devices(): Promise<DevicesView | null> {
    return this.orNull(this.client.getJson<DevicesView>("/strata/devices"));
  }

  telemetry(sinceMs: number): Promise<TelemetryView | null> {
    return this.orNull(this.client.getJson<TelemetryView>(`/strata/telemetry?since_ms=${encodeURIComponent(String(sinceMs))}`));
  }

  cache(): Promise<CacheView | null> {
    return this.orNull(this.client.getJson<CacheView>("/strata/cache"));
  }

  async engineStatus(): Promise<EngineStatus> {
    let res: Response;
    try {
      res = await this.client.request("/health", { pass: [503], accept: "application/json" });
    } catch (e) {
      const err = TransportError.from(e, "io");
      return { state: "failed", message: err.message, restarts: 0, pid: null, model: null };
    }
    const body: unknown = await res.json().catch(() => null);
    const served = body && typeof body === "object" && "model" in body ? String((body as { model: unknown }).model) : null;
    if (served !== this.healthModel) {
      // The server switched models (here or from another client): its facts are read again.
      this.healthModel = served;
      this.model = null;
      this.modelId = null;
    }
    const model = res.status === 200 ? await this.currentModel().catch(() => null) : null;
    return healthToStatus(res.status, body, model);
  }

  onTelemetry(onEntry: (entry: TelemetryEntry) => void): Unsubscribe {
    const ctrl = new AbortController();
    void this.followEvents(onEntry, ctrl.signal);
    return () => ctrl.abort();
  }

  onEngineStatus(onStatus: (status: EngineStatus) => void): Unsubscribe {
    let last = "";
    let stopped = false;
    const poll = async () => {
      const s = await this.engineStatus();
      const key = JSON.stringify(s);
      if (!stopped && key !== last) {
        last = key;
        onStatus(s);
      }
    };
    const timer = setInterval(() => void poll(), this.healthEveryMs);
    const now = () => void poll();
    this.pollers.add(now);
    return () => {
      stopped = true;
      clearInterval(timer);
      this.pollers.delete(now);
    };
  }

  /**
   * Follows /strata/events, reconnecting with a doubling wait when it drops; stops on abort or a 404.
   * After a reconnect, what was missed meanwhile is read from /strata/telemetry (the server subscribes
   * the new stream before it answers, so nothing falls between the two).
   */
  private async followEvents(onEntry: (entry: TelemetryEntry) => void, signal: AbortSignal): Promise<void> {
    let waitMs = this.reconnectMinMs;
    let lastMs: number | null = null;
    const deliver = (e: TelemetryEntry) => {
      if (typeof e.t_ms === "number" && (lastMs === null || e.t_ms > lastMs)) lastMs = e.t_ms;
      onEntry(e);
    };
    while (!signal.aborted) {
      try {
        const res = await this.client.request("/strata/events", { signal, accept: "text/event-stream" });
        if (!res.body) throw new TransportError("io", "the event stream has no body");
        waitMs = this.reconnectMinMs;
        if (lastMs !== null) {
          const gap = await this.telemetry(lastMs).catch(() => null);
          if (gap) [...gap.samples, ...gap.events].sort((a, b) => a.t_ms - b.t_ms).forEach(deliver);
        }
        await readSse(
          res.body,
          (e) => {
            if (e.event !== "sample" && e.event !== "engine") return;
            try {
              deliver(JSON.parse(e.data) as TelemetryEntry);
            } catch {
              console.warn("an event of /strata/events is not JSON:", e.data.slice(0, 120));
            }
          },
          signal,
        );
      } catch (e) {
        if (signal.aborted || isAbort(e)) return;
        if (e instanceof TransportError && e.code === "not_found") return;
      }
      if (signal.aborted) return;
      await sleep(waitMs, signal);
      waitMs = Math.min(waitMs * 2, this.reconnectMaxMs);
    }
  }

  private servedModelId(): Promise<string | null> {
    if (!this.modelId) {
      this.modelId = this.client.getJson<{ data?: { id?: unknown }[] }>("/v1/models").then(
        (r) => {
          const id = r.data?.[0]?.id;
          return typeof id === "string" ? id : null;
        },
        (e: unknown) => {
          this.modelId = null;
          // Without the list the request goes without a model name, which the server takes as its own.
          if (e instanceof TransportError && e.code === "not_found") return null;
          throw e;
        },
      );
    }
    return this.modelId;
  }

  private async orNull<T>(p: Promise<T>): Promise<T | null> {
    try {
      return await p;
    } catch (e) {
      if (e instanceof TransportError && e.code === "not_found") return null;
      throw e;
    }
  }
}

function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const t = setTimeout(done, ms);
    function done() {
      clearTimeout(t);
      signal.removeEventListener("abort", done);
      resolve();
    }
    signal.addEventListener("abort", done, { once: true });
  });
}
