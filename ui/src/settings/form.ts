// The settings form: EngineSettings as the text of its fields and back. Numbers are checked here (a field
// that is not a whole number is an error at that field before anything is sent); everything else (device
// names, the layer split, the engine's own limits) is the backend's to judge, whose errors name the field
// (CommandError.field, or error.param of POST /strata/plan) and are mapped onto the form by `fieldOf`.
// The drafting values (speculative decoding) are checked only while drafting is on: off, they are kept as
// they were but hidden, so they can never hold an error the user cannot see.
import type { EngineSettings, KvChoice, Speculative } from "../bindings";

export type SpeculativeKind = Speculative["kind"];

export interface SettingsForm {
  model_path: string | null;
  devices: string;
  layer_split: string;
  kv: KvChoice;
  kv_resident: string;
  max_context: string;
  vram_reserve_mib: string;
  cache_slots: string;
  cache_mib: string;
  threads: string;
  engine_kind: "local" | "remote";
  engine_url: string;
  engine_api_key: string;
  engine_model: string;
  speculative_kind: SpeculativeKind;
  draft_model_path: string;
  draft_max: string;
  draft_min: string;
  /** Indices into the devices, e.g. "1" or "0,1"; empty: the first device. */
  draft_devices: string;
}

/** The form's fields that can carry an error message. */
export type FieldName = Exclude<keyof SettingsForm, "model_path" | "engine_kind"> | "engine";

export type FieldErrors = Partial<Record<FieldName, string>>;

export function formFromSettings(s: EngineSettings): SettingsForm {
  const opt = (n: number | null) => (n === null ? "" : String(n));
  return {
    model_path: s.model_path,
    devices: s.devices,
    layer_split: s.layer_split,
    kv: s.kv,
    kv_resident: opt(s.kv_resident),
    max_context: opt(s.max_context),
    vram_reserve_mib: String(s.vram_reserve_mib),
    cache_slots: String(s.cache_slots),
    cache_mib: String(s.cache_mib),
    threads: opt(s.threads),
    engine_kind: s.engine.kind,
    engine_url: s.engine.kind === "remote" ? s.engine.url : "",
    engine_api_key: s.engine.kind === "remote" ? s.engine.api_key : "",
    engine_model: s.engine.kind === "remote" ? s.engine.model : "",
    speculative_kind: s.speculative.kind,
    draft_model_path: s.speculative.kind === "draft" ? s.speculative.model_path : "",
    draft_max: String(s.draft_max),
    draft_min: String(s.draft_min),
    draft_devices: s.draft_devices.join(","),
  };
}

const WHOLE = /^\d+$/;

function whole(value: string, field: FieldName, errors: FieldErrors, what: string): number {
  const v = value.trim();
  if (!WHOLE.test(v) || !Number.isSafeInteger(Number(v))) {
    errors[field] = `${what} must be a whole number (0 or more)`;
    return 0;
  }
  return Number(v);
}

function optionalWhole(value: string, field: FieldName, errors: FieldErrors, what: string): number | null {
  return value.trim() === "" ? null : whole(value, field, errors, what);
}

/** A hidden field's number: what it says when it is one, else `fallback` (never an error). */
function kept(value: string, fallback: number): number {
  const v = value.trim();
  return WHOLE.test(v) && Number.isSafeInteger(Number(v)) ? Number(v) : fallback;
}

/** "1, 0" as [1, 0]: each part a whole number; empty: none (the first device). */
function indices(value: string, field: FieldName, errors: FieldErrors | null): number[] {
  const v = value.trim();
  if (v === "") return [];
  const parts = v.split(",").map((p) => p.trim());
  if (parts.every((p) => WHOLE.test(p) && Number.isSafeInteger(Number(p)))) return parts.map(Number);
  if (errors) errors[field] = 'Draft devices are device numbers separated by commas, e.g. "1" or "0,1"';
  return [];
}

function speculativeOf(f: SettingsForm, errors: FieldErrors): Speculative {
  switch (f.speculative_kind) {
    case "off":
      return { kind: "off" };
    case "ngram":
      return { kind: "ngram" };
    case "draft": {
      const model_path = f.draft_model_path.trim();
      if (model_path === "") errors.draft_model_path = "Choose the draft model's GGUF file";
      return { kind: "draft", model_path };
    }
  }
}

export type Parsed = { ok: true; settings: EngineSettings } | { ok: false; errors: FieldErrors };

/** The settings the form says, or the errors of the fields that cannot be read. */
export function settingsFromForm(f: SettingsForm): Parsed {
  const errors: FieldErrors = {};
  const drafting = f.speculative_kind !== "off";
  const draftModel = f.speculative_kind === "draft";
  const settings: EngineSettings = {
    model_path: f.model_path,
    devices: f.devices.trim(),
    layer_split: f.layer_split.trim(),
    kv: f.kv,
    kv_resident: optionalWhole(f.kv_resident, "kv_resident", errors, "KV resident"),
    max_context: optionalWhole(f.max_context, "max_context", errors, "Max context"),
    vram_reserve_mib: whole(f.vram_reserve_mib, "vram_reserve_mib", errors, "VRAM reserve"),
    cache_slots: whole(f.cache_slots, "cache_slots", errors, "Cache slots"),
    cache_mib: whole(f.cache_mib, "cache_mib", errors, "Cache MiB"),
    threads: optionalWhole(f.threads, "threads", errors, "Threads"),
    engine:
      f.engine_kind === "local"
        ? { kind: "local" }
        : { kind: "remote", url: f.engine_url.trim(), api_key: f.engine_api_key, model: f.engine_model.trim() },
    speculative: speculativeOf(f, errors),
    draft_max: drafting ? whole(f.draft_max, "draft_max", errors, "Most drafts") : kept(f.draft_max, 16),
    draft_min: drafting ? whole(f.draft_min, "draft_min", errors, "Fewest drafts") : kept(f.draft_min, 1),
    draft_devices: indices(f.draft_devices, "draft_devices", draftModel ? errors : null),
  };
  if (f.engine_kind === "remote" && settings.engine.kind === "remote" && settings.engine.url === "") {
    errors.engine_url = "A remote engine needs its URL (e.g. http://127.0.0.1:8080/v1)";
  }
  return Object.keys(errors).length > 0 ? { ok: false, errors } : { ok: true, settings };
}

const SERVER_FIELDS: Record<string, FieldName> = {
  devices: "devices",
  layer_split: "layer_split",
  kv: "kv",
  kv_resident: "kv_resident",
  max_context: "max_context",
  vram_reserve_mib: "vram_reserve_mib",
  cache_slots: "cache_slots",
  cache_mib: "cache_mib",
  threads: "threads",
  engine: "engine",
  "engine.url": "engine_url",
  "engine.api_key": "engine_api_key",
  "engine.model": "engine_model",
  url: "engine_url",
  api_key: "engine_api_key",
  speculative: "speculative_kind",
  "speculative.model_path": "draft_model_path",
  draft_max: "draft_max",
  draft_min: "draft_min",
  draft_devices: "draft_devices",
};

/** The form field a backend error names ("layer_split", "settings.engine.url", ...); null when none. */
export function fieldOf(name: string | null | undefined): FieldName | null {
  if (!name) return null;
  const n = name.replace(/^settings\./, "").replace(/\[\d+\]$/, "");
  return SERVER_FIELDS[n] ?? null;
}
