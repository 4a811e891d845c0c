// The Parameters panel's logic: what an empty field shows (the model's effective value and its source),
// the params a reply is sent with (the reply limit as max_tokens only when Max tokens is empty), ranges,
// values saved per model, and reading preferences and /strata/model's sampling back.
import { describe, expect, it } from "vitest";
import {
  effectiveOf,
  isEmptyParams,
  jsonModeOn,
  NO_PARAMS,
  paramErrors,
  preferencesError,
  requestParams,
  savedParams,
  sourceLabel,
  strataDefaultSampling,
  toPreferences,
  sameParams,
  toSampling,
  withJsonMode,
  withoutSaved,
  withSaved,
} from "../src/chat/params";
import { LocalPreferences, PREFERENCES_STORAGE } from "../src/transport/http/preferences";
import { chatRequestBody, toModelFacts } from "../src/transport/http/openai";
import { TransportError } from "../src/transport/types";
import { preferences, sampling } from "./fakes";

describe("effective values", () => {
  it("shows each empty field's effective value with where it comes from", () => {
    const s = sampling({ min_p: { value: 0.1, source: "model" } });
    expect(effectiveOf("temperature", s, 2048)).toEqual({ value: "0.2", source: "SmolLM2 (model card)" });
    expect(effectiveOf("top_p", s, 2048)).toEqual({ value: "0.9", source: "SmolLM2 (model card)" });
    expect(effectiveOf("top_k", s, 2048)).toEqual({ value: "40", source: "Strata default" });
    expect(effectiveOf("min_p", s, 2048)).toEqual({ value: "0.1", source: "model file" });
    expect(effectiveOf("repeat_penalty", s, 2048)).toEqual({ value: "1", source: "Strata default" });
    expect(effectiveOf("max_tokens", s, 512)).toEqual({ value: "512", source: "reply limit" });
    expect(effectiveOf("seed", s, 512).value).toBe("random");
  });

  it("shows an f32 as typed, and says so when the model is unknown", () => {
    expect(effectiveOf("temperature", sampling({ temperature: { value: 0.20000000298023224, source: "model" } }), 1).value).toBe("0.2");
    expect(effectiveOf("temperature", null, 1)).toEqual({ value: "default", source: "the engine's default" });
    expect(sourceLabel("preset", null)).toBe("family preset");
  });
});

describe("request params", () => {
  it("sends the reply limit as max_tokens only when Max tokens is empty", () => {
    expect(requestParams(NO_PARAMS, 2048)).toEqual({ ...NO_PARAMS, max_tokens: 2048 });
    expect(requestParams({ ...NO_PARAMS, max_tokens: 100, temperature: 0 }, 2048)).toEqual({ ...NO_PARAMS, max_tokens: 100, temperature: 0 });
  });

  it("refuses values out of the backends' ranges, naming the field", () => {
    expect(paramErrors({ ...NO_PARAMS, temperature: 2, top_p: 0, min_p: 1, repeat_penalty: 100, top_k: 0, max_tokens: 1 })).toEqual({});
    const e = paramErrors({ temperature: 2.5, top_k: 1.5, top_p: -0.1, min_p: 1.1, repeat_penalty: 0, max_tokens: 0, seed: Number.NaN, json_mode: null });
    expect(e).toEqual({
      temperature: "Temperature must be between 0 and 2",
      top_k: "Top k must be a whole number",
      top_p: "Top p must be between 0 and 1",
      min_p: "Min p must be between 0 and 1",
      repeat_penalty: "Repeat penalty must be above 0 and at most 100",
      max_tokens: "Max tokens must be at least 1",
      seed: "Seed must be a number",
    });
  });
});

describe("JSON mode", () => {
  it("is off unless set to true, and off is the same as never set", () => {
    expect(jsonModeOn(NO_PARAMS)).toBe(false);
    expect(jsonModeOn({ ...NO_PARAMS, json_mode: false })).toBe(false);
    const on = withJsonMode(NO_PARAMS, true);
    expect(on.json_mode).toBe(true);
    expect(withJsonMode(on, false).json_mode).toBeNull();
    expect(isEmptyParams(on)).toBe(false);
    expect(isEmptyParams({ ...NO_PARAMS, json_mode: false })).toBe(true);
    expect(sameParams(on, NO_PARAMS)).toBe(false);
  });

  it("puts response_format in the request body only when on", () => {
    const msgs = [{ role: "user" as const, content: "x" }];
    expect(chatRequestBody("m", msgs, withJsonMode(NO_PARAMS, true)).response_format).toEqual({ type: "json_object" });
    for (const json_mode of [false, null]) {
      const body = chatRequestBody("m", msgs, { ...NO_PARAMS, json_mode });
      expect(body).not.toHaveProperty("response_format");
      expect(body).not.toHaveProperty("json_mode");
    }
  });

  it("is saved per model, read back, and missing from older stored preferences means off", () => {
    const p = withSaved(preferences(), "/a.gguf", withJsonMode(NO_PARAMS, true));
    expect(savedParams(p, "/a.gguf")).toEqual({ ...NO_PARAMS, json_mode: true });
    expect(toPreferences(JSON.parse(JSON.stringify(p)))).toEqual(p);
    localStorage.clear();
    new LocalPreferences(localStorage).save(p);
    expect(new LocalPreferences(localStorage).get()).toEqual(p);
    const older = { reply_limit_tokens: 9, params_by_model: { "/m": { ...NO_PARAMS, json_mode: undefined, seed: 1 } } };
    expect(toPreferences(JSON.parse(JSON.stringify(older)))?.params_by_model["/m"]).toEqual({ ...NO_PARAMS, seed: 1 });
    expect(toPreferences({ reply_limit_tokens: 9, params_by_model: { "/m": { json_mode: "yes" } } })).toBeNull();
  });
});

describe("values saved per model", () => {
  it("saves, replaces and clears one model's values, leaving the others", () => {
    const a = "/models/a.gguf";
    const b = "/models/b.gguf";
    let p = withSaved(preferences(), a, { ...NO_PARAMS, temperature: 0.7 });
    p = withSaved(p, b, { ...NO_PARAMS, top_k: 5 });
    expect(savedParams(p, a)).toEqual({ ...NO_PARAMS, temperature: 0.7 });
    p = withSaved(p, a, { ...NO_PARAMS, temperature: 1 });
    expect(savedParams(p, a)?.temperature).toBe(1);
    expect(savedParams(withoutSaved(p, a), a)).toBeNull();
    expect(savedParams(withoutSaved(p, a), b)).toEqual({ ...NO_PARAMS, top_k: 5 });
    // Saving nothing is not saving.
    expect(savedParams(withSaved(p, a, NO_PARAMS), a)).toBeNull();
  });

  it("checks preferences as the app's backend does", () => {
    expect(preferencesError(preferences())).toBeNull();
    expect(preferencesError(preferences({ reply_limit_tokens: 0 }))?.field).toBe("reply_limit_tokens");
    const bad = preferences({ params_by_model: { "/m.gguf": { ...NO_PARAMS, temperature: 3 } } });
    expect(preferencesError(bad)).toEqual({ field: "params_by_model.temperature", message: "/m.gguf: Temperature must be between 0 and 2" });
  });

  it("reads stored preferences back, taking a missing field as empty and junk as the defaults", () => {
    expect(toPreferences({ reply_limit_tokens: 9, params_by_model: { "/m": { temperature: 0.5 } } })).toEqual({
      reply_limit_tokens: 9,
      params_by_model: { "/m": { ...NO_PARAMS, temperature: 0.5 } },
    });
    expect(toPreferences({ reply_limit_tokens: "9", params_by_model: {} })).toBeNull();
    expect(toPreferences({ reply_limit_tokens: 9, params_by_model: { "/m": { temperature: "hot" } } })).toBeNull();
  });

  it("keeps a browser's preferences in localStorage, refusing bad ones with their field", () => {
    localStorage.clear();
    const store = new LocalPreferences(localStorage);
    expect(store.get()).toEqual(preferences());
    const p = withSaved(preferences({ reply_limit_tokens: 300 }), "/m.gguf", { ...NO_PARAMS, seed: 4 });
    store.save(p);
    expect(new LocalPreferences(localStorage).get()).toEqual(p);
    let err: unknown = null;
    try {
      store.save(preferences({ reply_limit_tokens: -1 }));
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(TransportError);
    expect((err as TransportError).field).toBe("reply_limit_tokens");
    expect(store.get()).toEqual(p);
    localStorage.setItem(PREFERENCES_STORAGE, "{not json");
    expect(store.get()).toEqual(preferences());
  });
});

describe("/strata/model's sampling", () => {
  it("is carried into ModelFacts, and Strata's defaults stand in when the server sends none", () => {
    const served = sampling();
    expect(toModelFacts({ id: "m", sampling: served }).sampling).toEqual(served);
    expect(toModelFacts({ id: "m" }).sampling).toEqual(strataDefaultSampling());
    expect(toSampling({ ...served, top_k: { value: 40, source: "guess" } })).toBeNull();
    expect(strataDefaultSampling()).toMatchObject({ temperature: { value: 0.6 }, top_k: { value: 40 }, top_p: { value: 0.95 }, min_p: { value: 0.05 } });
  });
});
