// The Parameters panel's logic: the fields of ChatParams with their ranges, what a field the user left
// empty gets (the model's SamplingDefaults) and where that comes from, the JSON-mode switch, the params a
// reply is sent with (the reply limit as max_tokens when Max tokens is empty), and the values kept per model
// in ChatPreferences. Pure: no transport, no view.
import type { ChatParams, ChatPreferences, SamplingDefaults, SamplingSource, Sourced } from "../bindings";

/** The numeric fields (every field of ChatParams but the JSON-mode switch). */
export type ParamKey = Exclude<keyof ChatParams, "json_mode">;
/** The fields whose default the model's SamplingDefaults gives. */
export type SampledKey = "temperature" | "top_k" | "top_p" | "min_p" | "repeat_penalty";

export interface ParamField {
  key: ParamKey;
  label: string;
  step: string;
  integer: boolean;
  /** Whether a value is in range (the backends check the same ranges). */
  inRange: (v: number) => boolean;
  /** The range, for the error at the field: "between 0 and 2". */
  range: string;
}

export const PARAM_FIELDS: readonly ParamField[] = [
  { key: "temperature", label: "Temperature", step: "0.05", integer: false, inRange: (v) => v >= 0 && v <= 2, range: "between 0 and 2" },
  { key: "top_k", label: "Top k", step: "1", integer: true, inRange: (v) => v >= 0 && v <= 0xffff_ffff, range: "0 (off) or more" },
  { key: "top_p", label: "Top p", step: "0.05", integer: false, inRange: (v) => v >= 0 && v <= 1, range: "between 0 and 1" },
  { key: "min_p", label: "Min p", step: "0.01", integer: false, inRange: (v) => v >= 0 && v <= 1, range: "between 0 and 1" },
  { key: "repeat_penalty", label: "Repeat penalty", step: "0.05", integer: false, inRange: (v) => v > 0 && v <= 100, range: "above 0 and at most 100" },
  { key: "max_tokens", label: "Max tokens", step: "1", integer: true, inRange: (v) => v >= 1 && v <= 0xffff_ffff, range: "at least 1" },
  { key: "seed", label: "Seed", step: "1", integer: true, inRange: (v) => v >= 0 && Number.isSafeInteger(v), range: "0 or more" },
];

const SAMPLED: readonly ParamKey[] = ["temperature", "top_k", "top_p", "min_p", "repeat_penalty"];

export function isSampled(key: ParamKey): key is SampledKey {
  return SAMPLED.includes(key);
}

export const NO_PARAMS: ChatParams = {
  temperature: null,
  top_k: null,
  top_p: null,
  min_p: null,
  repeat_penalty: null,
  max_tokens: null,
  seed: null,
  json_mode: null,
};

/** Whether JSON mode is on (null and false are both off). */
export function jsonModeOn(p: ChatParams): boolean {
  return p.json_mode === true;
}

/** `p` with JSON mode switched on or off (off is stored as null, as a field left empty). */
export function withJsonMode(p: ChatParams, on: boolean): ChatParams {
  return { ...p, json_mode: on ? true : null };
}

/** The reply limit of a fresh install (the Rust side's DEFAULT_REPLY_LIMIT_TOKENS). */
export const DEFAULT_REPLY_LIMIT_TOKENS = 2048;
/** The longest reply limit the backends accept (MAX_REPLY_LIMIT_TOKENS). */
export const MAX_REPLY_LIMIT_TOKENS = 1 << 20;

export function defaultPreferences(): ChatPreferences {
  return { reply_limit_tokens: DEFAULT_REPLY_LIMIT_TOKENS, params_by_model: {} };
}

/**
 * Strata's own defaults, the rule's last step (the library's `SamplingDefaults::fallback`): what a server
 * that does not say applies, taken as such when /strata/model carries no `sampling`.
 */
export function strataDefaultSampling(): SamplingDefaults {
  const d = (value: number): Sourced<number> => ({ value, source: "default" });
  return {
    temperature: d(0.6),
    top_k: d(40),
    top_p: d(0.95),
    min_p: d(0.05),
    repeat_penalty: d(1),
    repeat_last_n: d(64),
    preset: null,
  };
}

/** Where an effective value comes from, as shown beside its field. */
export function sourceLabel(source: SamplingSource, preset: string | null): string {
  switch (source) {
    case "model":
      return "model file";
    case "preset":
      return preset ?? "family preset";
    case "default":
      return "Strata default";
  }
}

/** A number as the user would type it (0.2, not 0.20000000298 from an f32). */
export function formatNumber(v: number): string {
  return String(Number(v.toPrecision(6)));
}

/** What an empty field gets: the value shown as its placeholder, and where it comes from. */
export interface Effective {
  value: string;
  source: string;
}

export function effectiveOf(key: ParamKey, sampling: SamplingDefaults | null, replyLimitTokens: number): Effective {
  if (key === "max_tokens") return { value: String(replyLimitTokens), source: "reply limit" };
  if (key === "seed") return { value: "random", source: "new each reply" };
  if (!sampling) return { value: "default", source: "the engine's default" };
  const s = sampling[key];
  return { value: formatNumber(s.value), source: sourceLabel(s.source, sampling.preset) };
}

/** The error of one field's value, or null when it is empty or in range. */
export function paramError(field: ParamField, value: number | null): string | null {
  if (value === null) return null;
  if (!Number.isFinite(value)) return `${field.label} must be a number`;
  if (field.integer && !Number.isInteger(value)) return `${field.label} must be a whole number`;
  return field.inRange(value) ? null : `${field.label} must be ${field.range}`;
}

/** Every field's error, keyed by field; empty when all are fine. */
export function paramErrors(p: ChatParams): Partial<Record<ParamKey, string>> {
  const out: Partial<Record<ParamKey, string>> = {};
  for (const f of PARAM_FIELDS) {
    const e = paramError(f, p[f.key]);
    if (e) out[f.key] = e;
  }
  return out;
}

export function replyLimitError(n: number | null): string | null {
  if (n === null || !Number.isInteger(n) || n < 1 || n > MAX_REPLY_LIMIT_TOKENS) {
    return `the reply limit must be a whole number of tokens from 1 to ${MAX_REPLY_LIMIT_TOKENS}`;
  }
  return null;
}

/** The params a reply is sent with: as set, and the reply limit as max_tokens when Max tokens is empty. */
export function requestParams(p: ChatParams, replyLimitTokens: number): ChatParams {
  return p.max_tokens === null ? { ...p, max_tokens: replyLimitTokens } : p;
}

export function sameParams(a: ChatParams, b: ChatParams): boolean {
  return PARAM_FIELDS.every((f) => a[f.key] === b[f.key]) && jsonModeOn(a) === jsonModeOn(b);
}

export function isEmptyParams(p: ChatParams): boolean {
  return sameParams(p, NO_PARAMS);
}

/** The values saved for the model at `modelPath`, or null. */
export function savedParams(prefs: ChatPreferences, modelPath: string): ChatParams | null {
  return prefs.params_by_model[modelPath] ?? null;
}

/** `prefs` with `params` saved for `modelPath` (all empty: nothing saved for it). */
export function withSaved(prefs: ChatPreferences, modelPath: string, params: ChatParams): ChatPreferences {
  if (isEmptyParams(params)) return withoutSaved(prefs, modelPath);
  return { ...prefs, params_by_model: { ...prefs.params_by_model, [modelPath]: { ...params } } };
}

/** `prefs` with nothing saved for `modelPath`. */
export function withoutSaved(prefs: ChatPreferences, modelPath: string): ChatPreferences {
  const rest = { ...prefs.params_by_model };
  delete rest[modelPath];
  return { ...prefs, params_by_model: rest };
}

/** The first problem of preferences about to be kept (as the app's backend checks them), or null. */
export function preferencesError(p: ChatPreferences): { field: string; message: string } | null {
  const limit = replyLimitError(p.reply_limit_tokens);
  if (limit) return { field: "reply_limit_tokens", message: limit };
  for (const [path, params] of Object.entries(p.params_by_model)) {
    if (!params) continue;
    if (path.trim() === "") return { field: "params_by_model", message: "a model's path is empty" };
    for (const f of PARAM_FIELDS) {
      const e = paramError(f, params[f.key]);
      if (e) return { field: `params_by_model.${f.key}`, message: `${path}: ${e}` };
    }
  }
  return null;
}

function isNumberOrNull(v: unknown): v is number | null {
  return v === null || (typeof v === "number" && Number.isFinite(v));
}

export function isChatParams(v: unknown): v is ChatParams {
  if (typeof v !== "object" || v === null) return false;
  const o = v as Record<string, unknown>;
  const jsonMode = o.json_mode;
  return PARAM_FIELDS.every((f) => isNumberOrNull(o[f.key])) && (jsonMode === null || typeof jsonMode === "boolean");
}

/** Preferences read back from storage, or null when they are not that shape. */
export function toPreferences(v: unknown): ChatPreferences | null {
  if (typeof v !== "object" || v === null) return null;
  const o = v as Record<string, unknown>;
  if (typeof o.reply_limit_tokens !== "number") return null;
  const byModel = o.params_by_model;
  if (typeof byModel !== "object" || byModel === null || Array.isArray(byModel)) return null;
  const params_by_model: Record<string, ChatParams> = {};
  for (const [path, params] of Object.entries(byModel as Record<string, unknown>)) {
    // A field missing from an older version's file is empty.
    if (!isChatParams({ ...NO_PARAMS, ...(params as object) })) return null;
    params_by_model[path] = { ...NO_PARAMS, ...(params as Partial<ChatParams>) };
  }
  return { reply_limit_tokens: o.reply_limit_tokens, params_by_model };
}

function isSourced(v: unknown): v is Sourced<number> {
  if (typeof v !== "object" || v === null) return false;
  const o = v as Record<string, unknown>;
  return typeof o.value === "number" && (o.source === "model" || o.source === "preset" || o.source === "default");
}

/** /strata/model's `sampling` object, or null when it is absent or not that shape. */
export function toSampling(v: unknown): SamplingDefaults | null {
  if (typeof v !== "object" || v === null) return null;
  const o = v as Record<string, unknown>;
  const { temperature, top_k, top_p, min_p, repeat_penalty, repeat_last_n, preset } = o;
  if (
    !isSourced(temperature) ||
    !isSourced(top_k) ||
    !isSourced(top_p) ||
    !isSourced(min_p) ||
    !isSourced(repeat_penalty) ||
    !isSourced(repeat_last_n)
  ) {
    return null;
  }
  const name = typeof preset === "string" ? preset : null;
  return { temperature, top_k, top_p, min_p, repeat_penalty, repeat_last_n, preset: name };
}
