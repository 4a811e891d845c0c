// Test doubles: a Transport whose every method is a vi.fn with a plain default (tests override what they
// exercise), and sample values of the bindings' types.
import { vi } from "vitest";
import type {
  CacheView,
  ChatChunk,
  ChatPreferences,
  Conversation,
  DeviceView,
  EngineSettings,
  ModelFacts,
  Plan,
  PlanDevice,
  PlanRow,
  SamplingDefaults,
  Summary,
} from "../src/bindings";
import type { Capabilities, Transport } from "../src/transport/types";

export const MIB = 1024 * 1024;

export function settings(over: Partial<EngineSettings> = {}): EngineSettings {
  return {
    model_path: null,
    devices: "sim:200,sim:400",
    layer_split: "15",
    kv: "f16",
    kv_resident: null,
    max_context: 4096,
    vram_reserve_mib: 64,
    cache_slots: 4,
    cache_mib: 4096,
    threads: null,
    parallel: null,
    engine: { kind: "local" },
    speculative: { kind: "off" },
    draft_max: 16,
    draft_min: 1,
    draft_devices: [],
    experts: "auto",
    ...over,
  };
}

/** The default model's effective sampling: SmolLM2's preset for temperature and top_p, Strata's for the rest. */
export function sampling(over: Partial<SamplingDefaults> = {}): SamplingDefaults {
  return {
    temperature: { value: 0.2, source: "preset" },
    top_k: { value: 40, source: "default" },
    top_p: { value: 0.9, source: "preset" },
    min_p: { value: 0.05, source: "default" },
    repeat_penalty: { value: 1, source: "default" },
    repeat_last_n: { value: 64, source: "default" },
    preset: "SmolLM2 (model card)",
    ...over,
  };
}

export function preferences(over: Partial<ChatPreferences> = {}): ChatPreferences {
  return { reply_limit_tokens: 2048, params_by_model: {}, ...over };
}

export function facts(over: Partial<ModelFacts> = {}): ModelFacts {
  return {
    path: "/models/SmolLM2-135M-Instruct.Q4_1.gguf",
    name: "SmolLM2-135M-Instruct.Q4_1",
    architecture: "llama",
    quantization: "Q4_1",
    parameters: 134_515_008,
    layers: 30,
    trained_context: 8192,
    features: "SwiGLU, RoPE; grouped-query attention (9 heads, 3 KV)",
    vocab: 49152,
    file_bytes: 98 * MIB,
    sampling: sampling(),
    ...over,
  };
}

export function row(over: Partial<PlanRow> = {}): PlanRow {
  return {
    device: "sim:200",
    index: 0,
    host: false,
    layers: [0, 15],
    weights_bytes: 40 * MIB,
    experts_bytes: 0,
    host_experts_bytes: 0,
    kv_bytes_per_token: 23040,
    kv_device_bytes: 20 * MIB,
    kv_host_bytes: 0,
    scratch_bytes: 10 * MIB,
    staging_bytes: 0,
    total_bytes: 70 * MIB,
    free_bytes: 200 * MIB,
    memory_bytes: 200 * MIB,
    reserve_bytes: 64 * MIB,
    headroom_bytes: 66 * MIB,
    fits: true,
    ...over,
  };
}

/** A row as its device, as the backend adds up a device holding no draft. */
export function deviceOf(r: PlanRow, over: Partial<PlanDevice> = {}): PlanDevice {
  return {
    device: r.device,
    index: r.index,
    host: r.host,
    load_bytes: r.weights_bytes + r.scratch_bytes + r.staging_bytes,
    kv_bytes_per_token: r.kv_bytes_per_token,
    kv_device_bytes: r.kv_device_bytes,
    total_bytes: r.total_bytes,
    draft_bytes: 0,
    free_bytes: r.free_bytes,
    memory_bytes: r.memory_bytes,
    reserve_bytes: r.reserve_bytes,
    headroom_bytes: r.headroom_bytes,
    fits: r.fits,
    ...over,
  };
}

export function plan(rows: PlanRow[], over: Partial<Plan> = {}): Plan {
  return {
    tokens: 4096,
    sequences: 1,
    max_context: 4096,
    kv: "f16",
    kv_resident: null,
    rows,
    draft: null,
    devices: rows.map((r) => deviceOf(r)),
    fits: rows.every((r) => r.fits),
    problem: null,
    ...over,
  };
}

export function summary(over: Partial<Summary> = {}): Summary {
  return {
    job: 3,
    prompt_tokens: 40,
    completion_tokens: 12,
    reasoning_tokens: 0,
    reused: 36,
    read: 4,
    kept_reply_tokens: 0,
    prompt_ms: 13,
    gen_ms: 110,
    prompt_tok_s: 300.5,
    gen_tok_s: 106.6,
    queue_ms: 0,
    drafts_accepted: 0,
    drafts_proposed: 0,
    restored: null,
    restored_tokens: null,
    fallback: null,
    ...over,
  };
}

export function device(over: Partial<DeviceView> = {}): DeviceView {
  return {
    index: 0,
    name: "sim:200",
    kind: "sim",
    host: false,
    free_bytes: 120 * MIB,
    total_bytes: 200 * MIB,
    reserve_bytes: 64 * MIB,
    strata_bytes: 80 * MIB,
    by_purpose_bytes: { weights: 40 * MIB, kv: 30 * MIB, scratch: 10 * MIB },
    high_water_by_purpose_bytes: { weights: 40 * MIB, kv: 30 * MIB, scratch: 10 * MIB },
    high_water_bytes: 90 * MIB,
    refused_allocations: 0,
    failed_samples: 0,
    layers: [[0, 15]],
    ...over,
  };
}

export function cacheView(over: Partial<CacheView> = {}): CacheView {
  return {
    slots: 4,
    slots_used: 1,
    budget_bytes: 4096 * MIB,
    bytes: 12 * MIB,
    evictions: 2,
    live_tokens: 120,
    parked: [{ tokens: 800, bytes: 12 * MIB, last_use_ms: 5000, checkpoints: [256, 512] }],
    ...over,
  };
}

export function conversation(over: Partial<Conversation> = {}): Conversation {
  return { id: "c1", title: "First", created_ms: 1, updated_ms: 2, messages: [], ...over };
}

/**
 * A Transport of vi.fn()s. `chatSend` keeps the last onChunk in `sendChunk`, and each conversation's in
 * `sendChunkTo`, for the test to drive.
 */
export class FakeTransport implements Transport {
  readonly kind: "tauri" | "http";
  readonly caps: Capabilities;
  library: import("../src/transport/types").LibraryApi | null = null;
  /** The onChunk of the last chatSend. */
  sendChunk: (c: ChatChunk) => void = () => {};
  /** The onChunk of the last chatSend in each conversation. */
  private chunkOf = new Map<string, (c: ChatChunk) => void>();
  private drop: ((paths: string[]) => void) | null = null;

  constructor(caps: Partial<Capabilities> = {}) {
    this.caps = { loadModels: true, applySettings: true, fileDrop: true, ...caps };
    this.kind = this.caps.loadModels ? "tauri" : "http";
  }

  /** Simulates a drop of files on the window. */
  dropFiles(paths: string[]): void {
    this.drop?.(paths);
  }

  inspectModel = vi.fn(async (path: string) => facts({ path }));
  plan = vi.fn(async (_s: EngineSettings) => ({ plan: plan([row()]), flags: ["--devices", "sim:200"] }));
  loadModel = vi.fn(async (path: string, _on: (p: import("../src/bindings").LoadProgress) => void) => facts({ path }));
  unloadModel = vi.fn(async () => {});
  currentModel = vi.fn(async () => null as ModelFacts | null);
  pickModelFile = vi.fn(async () => null as string | null);
  onFileDrop = vi.fn((f: (paths: string[]) => void) => {
    this.drop = f;
    return () => {
      this.drop = null;
    };
  });
  getSettings = vi.fn(async () => settings());
  saveSettings = vi.fn(async (s: EngineSettings) => s);
  chatSend = vi.fn(
    async (id: string, _m: import("../src/bindings").ChatMessage[], _p: import("../src/bindings").ChatParams, on: (c: ChatChunk) => void) => {
      this.sendChunk = on;
      this.chunkOf.set(id, on);
    },
  );

  /** Delivers `c` to the last chatSend in conversation `id`. */
  sendChunkTo(id: string, c: ChatChunk): void {
    const on = this.chunkOf.get(id);
    if (!on) throw new Error(`no chatSend in ${id}`);
    on(c);
  }
  chatCancel = vi.fn(async (_id: string) => {});
  /** What savePreferences kept last (getPreferences returns it). */
  prefs: ChatPreferences = preferences();
  getPreferences = vi.fn(async () => this.prefs);
  savePreferences = vi.fn(async (p: ChatPreferences) => {
    this.prefs = p;
    return p;
  });
  listConversations = vi.fn(async () => [] as import("../src/bindings").ConversationSummary[]);
  getConversation = vi.fn(async (id: string) => conversation({ id }));
  createConversation = vi.fn(async (title: string | null) => conversation({ id: "new", title: title ?? "" }));
  renameConversation = vi.fn(async (_id: string, _t: string) => {});
  deleteConversation = vi.fn(async (_id: string) => {});
  saveExport = vi.fn(async (_id: string, _f: import("../src/bindings").ExportFormat) => "doc.md");
  devices = vi.fn(async () => ({ devices: [device()] }) as import("../src/bindings").DevicesView | null);
  telemetry = vi.fn(async (_since: number) => ({ now_ms: 0, samples: [], events: [] }) as import("../src/bindings").TelemetryView | null);
  cache = vi.fn(async () => cacheView() as CacheView | null);
  engineStatus = vi.fn(async () => ({ state: "ready" as const, message: null, restarts: 0, pid: 42, model: facts() }));
  onTelemetry = vi.fn((_f: (e: import("../src/bindings").TelemetryEntry) => void) => () => {});
  onEngineStatus = vi.fn((_f: (s: import("../src/bindings").EngineStatus) => void) => () => {});
}
