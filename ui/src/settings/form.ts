// The settings form: EngineSettings as the text of its fields and back. Numbers are checked here (a field
// that is not a whole number is an error at that field before anything is sent); everything else (device
// names, the layer split, the engine's own limits) is the backend's to judge, whose errors name the field
// (CommandError.field, or error.param of POST /strata/plan) and are mapped onto the form by `fieldOf`.
// The drafting values (speculative decoding) are checked only while drafting is on: off, they are kept as
// they were but hidden, so they can never hold an error the user cannot see.
// A remote endpoint's API key is never in the form as read: the backend says only whether one is kept (and
// its last characters); the form sends that back to keep it, a typed key to replace it, or none to clear
// it. An http:// URL to a host that is not this machine is an error at the URL unless Allow insecure is
// ticked (the backend applies the same rule).
import type { EngineSettings, KvChoice, RemoteKey, Speculative } from "../bindings";

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
  /** Requests generating at once (`--parallel`); empty: the server's default. */
  parallel: string;
  engine_kind: "local" | "remote";
  engine_url: string;
  /** A new key typed in the form; empty: the kept one (if any) stays. */
  engine_api_key: string;
  /** The hint of the key the backend keeps ("" when too short to show any); null when none is kept. */
  engine_key_kept: string | null;
  /** The user asked to clear the kept key. */
  engine_key_clear: boolean;
  engine_model: string;
  /** Accept an http:// URL to a host that is not loopback. */
  engine_allow_insecure: boolean;
  speculative_kind: SpeculativeKind;
  draft_model_path: string;
  draft_max: string;
  draft_min: string;
  /** Indices into the devices, e.g. "1" or "0,1"; empty: the first device. */
  draft_devices: string;
  /** `--experts`: auto, cpu, gpu or cpu:A..B; empty: auto. */
  experts: string;
}

/** The form's fields that can carry an error message. */
export type FieldName =
  | Exclude<keyof SettingsForm, "model_path" | "engine_kind" | "engine_key_kept" | "engine_key_clear">
  | "engine";

export type FieldErrors = Partial<Record<FieldName, string>>;

export function formFromSettings(s: EngineSettings): SettingsForm {
  const opt = (n: number | null) => (n === null ? "" : String(n));
  const key: RemoteKey = s.engine.kind === "remote" ? s.engine.api_key : { kind: "none" };
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
    // (Settings from a server before the field existed have none: the default.)
    parallel: opt(s.parallel ?? null),
    engine_kind: s.engine.kind,
    engine_url: s.engine.kind === "remote" ? s.engine.url : "",
    // (A backend never sends a key; a new one still on its way in is the form's typed key.)
    engine_api_key: key.kind === "new" ? key.key : "",
    engine_key_kept: key.kind === "kept" ? key.hint : null,
    engine_key_clear: false,
    engine_model: s.engine.kind === "remote" ? s.engine.model : "",
    engine_allow_insecure: s.engine.kind === "remote" ? s.engine.allow_insecure : false,
    speculative_kind: s.speculative.kind,
    draft_model_path: s.speculative.kind === "draft" ? s.speculative.model_path : "",
    draft_max: String(s.draft_max),
    draft_min: String(s.draft_min),
    draft_devices: s.draft_devices.join(","),
    // A server from before the field sends none: its default.
    experts: s.experts ?? "auto",
  };
}

/** The KV types a select offers, in the order the backend lists them, each with its label. */
export const KV_CHOICES: readonly { value: KvChoice; label: string }[] = [
  { value: "f16", label: "f16" },
  { value: "f32", label: "f32 (exact; CPU and sim devices only)" },
  { value: "int8", label: "int8" },
];

/** A select's value as a KV type; anything else reads as the default, f16. */
export function kvChoiceOf(value: string): KvChoice {
  return KV_CHOICES.find((c) => c.value === value)?.value ?? "f16";
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

/** What the form says of the key: a typed one is new, else the kept one stays unless cleared. */
export function remoteKeyOf(f: SettingsForm): RemoteKey {
  const typed = f.engine_api_key.trim();
  if (typed !== "") return { kind: "new", key: typed };
  if (f.engine_key_kept !== null && !f.engine_key_clear) return { kind: "kept", hint: f.engine_key_kept };
  return { kind: "none" };
}

/** The error at the URL of an http:// endpoint that is not loopback, without Allow insecure. */
export const INSECURE_URL_MESSAGE = "an http:// endpoint sends the key in clear text: use https:// or tick Allow insecure";

/** The host of an http(s) URL ("[::1]" as "::1", no port or user); null when it has none. */
export function urlHost(url: string): string | null {
  const m = /^https?:\/\/([^/?#]*)/.exec(url);
  if (!m) return null;
  const authority = m[1] ?? "";
  const hostport = authority.slice(authority.lastIndexOf("@") + 1);
  if (hostport.startsWith("[")) {
    const end = hostport.indexOf("]");
    return end > 1 ? hostport.slice(1, end) : null;
  }
  const host = hostport.split(":")[0] ?? "";
  return host === "" ? null : host;
}

/** localhost, 127.0.0.0/8 or ::1: a request to it stays on this machine. */
export function isLoopbackHost(host: string): boolean {
  if (host.toLowerCase() === "localhost" || host === "::1") return true;
  const v4 = /^127\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})$/.exec(host);
  return v4 !== null && v4.slice(1).every((o) => Number(o) <= 255);
}

/** True when `url` would send the key in clear text across a network: http://, not loopback, not allowed. */
export function isInsecureUrl(url: string, allowInsecure: boolean): boolean {
  if (allowInsecure || !url.startsWith("http://")) return false;
  const host = urlHost(url);
  return host !== null && !isLoopbackHost(host);
}

/** The settings to plan with: a typed key is not sent (a plan needs none), only whether one is kept. */
export function forPlanning(s: EngineSettings): EngineSettings {
  if (s.engine.kind !== "remote" || s.engine.api_key.kind !== "new") return s;
  return { ...s, engine: { ...s.engine, api_key: { kind: "none" } } };
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
    parallel: optionalWhole(f.parallel, "parallel", errors, "Requests at once"),
    engine:
      f.engine_kind === "local"
        ? { kind: "local" }
        : {
            kind: "remote",
            url: f.engine_url.trim(),
            api_key: remoteKeyOf(f),
            model: f.engine_model.trim(),
            allow_insecure: f.engine_allow_insecure,
          },
    speculative: speculativeOf(f, errors),
    draft_max: drafting ? whole(f.draft_max, "draft_max", errors, "Most drafts") : kept(f.draft_max, 16),
    draft_min: drafting ? whole(f.draft_min, "draft_min", errors, "Fewest drafts") : kept(f.draft_min, 1),
    draft_devices: indices(f.draft_devices, "draft_devices", draftModel ? errors : null),
    experts: f.experts.trim() || "auto",
  };
  if (f.engine_kind === "remote" && settings.engine.kind === "remote") {
    if (settings.engine.url === "") errors.engine_url = "A remote engine needs its URL (e.g. https://gpu-box:8000/v1)";
    else if (isInsecureUrl(settings.engine.url, settings.engine.allow_insecure)) errors.engine_url = INSECURE_URL_MESSAGE;
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
  parallel: "parallel",
  engine: "engine",
  "engine.url": "engine_url",
  "engine.api_key": "engine_api_key",
  "engine.model": "engine_model",
  "engine.allow_insecure": "engine_allow_insecure",
  url: "engine_url",
  api_key: "engine_api_key",
  speculative: "speculative_kind",
  "speculative.model_path": "draft_model_path",
  draft_max: "draft_max",
  draft_min: "draft_min",
  draft_devices: "draft_devices",
  experts: "experts",
};

/** The form field a backend error names ("layer_split", "settings.engine.url", ...); null when none. */
export function fieldOf(name: string | null | undefined): FieldName | null {
  if (!name) return null;
  const n = name.replace(/^settings\./, "").replace(/\[\d+\]$/, "");
  return SERVER_FIELDS[n] ?? null;
}
