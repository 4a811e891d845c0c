// The settings form's conversions, the field names of backend errors, and plan bars / fit messages.
import { describe, expect, it } from "vitest";
import { fitMessage, planBar, planBars } from "../src/settings/bars";
import {
  fieldOf,
  forPlanning,
  formFromSettings,
  INSECURE_URL_MESSAGE,
  isInsecureUrl,
  KV_CHOICES,
  kvChoiceOf,
  remoteKeyOf,
  settingsFromForm,
  urlHost,
} from "../src/settings/form";
import { keyStatus } from "../src/views/settings/RemoteKeyField";
import { deviceOf, MIB, plan, row, settings } from "./fakes";

describe("settings form", () => {
  it("offers every KV type and reads a select's value as one", () => {
    expect(KV_CHOICES.map((c) => c.value)).toEqual(["f16", "f32", "int8"]);
    for (const kv of ["f16", "f32", "int8"] as const) {
      expect(kvChoiceOf(kv)).toBe(kv);
      const f = formFromSettings(settings({ kv }));
      expect(settingsFromForm(f)).toEqual({ ok: true, settings: settings({ kv }) });
    }
    expect(kvChoiceOf("q4")).toBe("f16");
  });

  it("round-trips settings, optional numbers as empty fields", () => {
    const s = settings({
      engine: { kind: "remote", url: "https://h:1/v1", api_key: { kind: "kept", hint: "wxyz" }, model: "m", allow_insecure: false },
    });
    const f = formFromSettings(s);
    expect(f.kv_resident).toBe("");
    expect(settingsFromForm(f)).toEqual({ ok: true, settings: s });
  });

  it("keeps a kept key unless a new one is typed or it is cleared, and never shows it", () => {
    const remote = (api_key: string | null) =>
      formFromSettings(
        settings({
          engine: {
            kind: "remote",
            url: "https://h",
            api_key: api_key === null ? { kind: "none" } : { kind: "kept", hint: api_key },
            model: "",
            allow_insecure: false,
          },
        }),
      );
    const kept = remote("wxyz");
    expect([kept.engine_api_key, kept.engine_key_kept, kept.engine_key_clear]).toEqual(["", "wxyz", false]);
    expect(keyStatus(kept)).toBe("A key is kept (ending in …wxyz).");
    expect(keyStatus(remote(""))).toBe("A key is kept.");
    expect(keyStatus(remote(null))).toBeNull();
    // Untouched: sent back as kept, so the backend keeps it.
    expect(remoteKeyOf(kept)).toEqual({ kind: "kept", hint: "wxyz" });
    // A typed key replaces it (trimmed); cleared, none is sent; with none kept and none typed, none.
    const typed = { ...kept, engine_api_key: " sk-new \n" };
    expect(remoteKeyOf(typed)).toEqual({ kind: "new", key: "sk-new" });
    expect(keyStatus(typed)).toBe("The key typed below replaces the kept one when you apply.");
    const cleared = { ...kept, engine_key_clear: true };
    expect(remoteKeyOf(cleared)).toEqual({ kind: "none" });
    expect(keyStatus(cleared)).toBe("The kept key is removed when you apply.");
    expect(remoteKeyOf(remote(null))).toEqual({ kind: "none" });
    // A typed key is never sent to be planned.
    const parsed = settingsFromForm(typed);
    expect(parsed.ok).toBe(true);
    if (parsed.ok) {
      expect(parsed.settings.engine).toMatchObject({ api_key: { kind: "new", key: "sk-new" } });
      expect(JSON.stringify(forPlanning(parsed.settings))).not.toContain("sk-new");
      expect(forPlanning(settings())).toEqual(settings());
    }
  });

  it("refuses an http:// URL to another machine unless Allow insecure is ticked", () => {
    for (const url of ["https://gpu-box:8000/v1", "http://127.0.0.1:8080/v1", "http://127.9.0.1", "http://localhost:8080", "http://[::1]:8080/v1", "http://LocalHost"]) {
      expect(isInsecureUrl(url, false)).toBe(false);
    }
    for (const url of ["http://gpu-box:8000/v1", "http://10.0.0.2", "http://[::2]:1", "http://localhost.example.com", "http://127.0.0.1@gpu-box", "http://127.0.0.256"]) {
      expect(isInsecureUrl(url, false)).toBe(true);
      expect(isInsecureUrl(url, true)).toBe(false);
    }
    expect([urlHost("http://u@h:1/p"), urlHost("https://[::1]:80"), urlHost("http://"), urlHost("ftp://x")]).toEqual(["h", "::1", null, null]);
    const f = formFromSettings(settings());
    const remote = { ...f, engine_kind: "remote" as const, engine_url: "http://10.0.0.2:8080/v1" };
    expect(settingsFromForm(remote)).toEqual({ ok: false, errors: { engine_url: INSECURE_URL_MESSAGE } });
    expect(INSECURE_URL_MESSAGE).toBe("an http:// endpoint sends the key in clear text: use https:// or tick Allow insecure");
    const allowed = settingsFromForm({ ...remote, engine_allow_insecure: true });
    expect(allowed.ok && allowed.settings.engine).toEqual({
      kind: "remote",
      url: "http://10.0.0.2:8080/v1",
      api_key: { kind: "none" },
      model: "",
      allow_insecure: true,
    });
  });

  it("names the field that is not a whole number", () => {
    const f = { ...formFromSettings(settings()), vram_reserve_mib: "lots", threads: "-2" };
    const r = settingsFromForm(f);
    expect(r.ok).toBe(false);
    if (!r.ok) expect(Object.keys(r.errors).sort()).toEqual(["threads", "vram_reserve_mib"]);
  });

  it("reads requests at once as a number, empty as the server's default", () => {
    const three = formFromSettings(settings({ parallel: 3 }));
    expect(three.parallel).toBe("3");
    expect(settingsFromForm(three)).toEqual({ ok: true, settings: settings({ parallel: 3 }) });
    expect(formFromSettings(settings()).parallel).toBe("");
    expect(settingsFromForm({ ...three, parallel: " " })).toEqual({ ok: true, settings: settings({ parallel: null }) });
    const bad = settingsFromForm({ ...three, parallel: "two" });
    expect(bad).toEqual({ ok: false, errors: { parallel: "Requests at once must be a whole number (0 or more)" } });
    expect(fieldOf("parallel")).toBe("parallel");
    // A server from before the field sends none: the default.
    const { parallel: _, ...old } = settings();
    expect(formFromSettings(old as ReturnType<typeof settings>).parallel).toBe("");
  });

  it("round-trips where a mixture's experts live; empty is auto; the backend's error lands on the field", () => {
    const s = settings({ experts: "cpu:0..12" });
    const f = formFromSettings(s);
    expect(f.experts).toBe("cpu:0..12");
    expect(settingsFromForm(f)).toEqual({ ok: true, settings: s });
    expect(settingsFromForm({ ...f, experts: "  " })).toEqual({ ok: true, settings: settings({ experts: "auto" }) });
    expect(fieldOf("settings.experts")).toBe("experts");
    const { experts: _, ...old } = settings();
    expect(formFromSettings(old as ReturnType<typeof settings>).experts).toBe("auto");
  });

  it("round-trips the drafting settings, devices as a list", () => {
    const s = settings({ speculative: { kind: "draft", model_path: "/m/d.gguf" }, draft_max: 8, draft_min: 2, draft_devices: [1, 0] });
    const f = formFromSettings(s);
    expect([f.speculative_kind, f.draft_model_path, f.draft_devices]).toEqual(["draft", "/m/d.gguf", "1,0"]);
    expect(settingsFromForm(f)).toEqual({ ok: true, settings: s });
    expect(settingsFromForm(formFromSettings(settings({ speculative: { kind: "ngram" } })))).toEqual({
      ok: true,
      settings: settings({ speculative: { kind: "ngram" } }),
    });
  });

  it("checks the drafting values only while drafting is on", () => {
    const f = { ...formFromSettings(settings()), draft_max: "lots", draft_min: "", draft_devices: "x" };
    // Off: hidden values are kept when they are numbers, else their defaults; never an error.
    expect(settingsFromForm(f)).toEqual({ ok: true, settings: settings() });
    const on = settingsFromForm({ ...f, speculative_kind: "draft", draft_model_path: "" });
    expect(on.ok).toBe(false);
    if (!on.ok) expect(Object.keys(on.errors).sort()).toEqual(["draft_devices", "draft_max", "draft_min", "draft_model_path"]);
    // N-gram lookup has no devices or model of its own to check.
    const ngram = settingsFromForm({ ...f, speculative_kind: "ngram", draft_max: "4", draft_min: "1" });
    expect(ngram.ok && ngram.settings.draft_devices).toEqual([]);
  });

  it("maps backend field names onto form fields", () => {
    expect(fieldOf("layer_split")).toBe("layer_split");
    expect(fieldOf("settings.vram_reserve_mib")).toBe("vram_reserve_mib");
    expect(fieldOf("engine.url")).toBe("engine_url");
    expect(fieldOf("engine.api_key")).toBe("engine_api_key");
    expect(fieldOf("devices")).toBe("devices");
    expect(fieldOf("speculative.model_path")).toBe("draft_model_path");
    expect(fieldOf("settings.draft_devices[1]")).toBe("draft_devices");
    expect(fieldOf("draft_max")).toBe("draft_max");
    expect(fieldOf("speculative")).toBe("speculative_kind");
    expect(fieldOf("nonsense")).toBeNull();
    expect(fieldOf(null)).toBeNull();
  });
});

describe("plan bars", () => {
  it("scales the bar to what is free and marks the reserve at its end", () => {
    const b = planBar(row({ total_bytes: 50 * MIB, free_bytes: 200 * MIB, reserve_bytes: 50 * MIB }));
    expect(b.usedPct).toBe(25);
    expect(b.reserveStartPct).toBe(75);
    expect(b.reservePct).toBe(25);
  });

  it("widens the scale when the plan takes more than is free", () => {
    const b = planBar(row({ total_bytes: 400 * MIB, free_bytes: 200 * MIB, fits: false }));
    expect(b.usedPct).toBe(100);
    expect(b.reserveStartPct).toBeCloseTo(((200 - 64) / 400) * 100);
  });

  it("draws a device's bar from both models, the draft's share at the end of the used part", () => {
    const r1 = row({ device: "sim:400", index: 1, total_bytes: 100 * MIB, free_bytes: 400 * MIB, reserve_bytes: 0 });
    const p = plan([row(), r1], { devices: [deviceOf(row()), deviceOf(r1, { total_bytes: 300 * MIB, draft_bytes: 200 * MIB })] });
    const bars = planBars(p);
    expect(bars.map((b) => [b.device.index, b.usedPct, b.draftPct])).toEqual([
      [0, 35, 0],
      [1, 75, 50],
    ]);
  });

  it("names a device short for the model and its draft together once", () => {
    const r1 = row({ device: "sim:150", index: 1, fits: false, headroom_bytes: -50 * MIB });
    const p = plan([row(), r1], {
      devices: [deviceOf(row()), deviceOf(r1, { draft_bytes: 110 * MIB, headroom_bytes: -51 * MIB })],
      fits: false,
    });
    expect(fitMessage(p)).toBe("does not fit on sim:150 (device 1): short by 51.0 MiB");
  });

  it("says which device a plan does not fit on and by how much", () => {
    const p = plan(
      [row(), row({ device: "sim:400", index: 1, fits: false, headroom_bytes: -150 * MIB })],
      { problem: "layers 15-30 need 150 MiB more on sim:400" },
    );
    expect(fitMessage(p)).toBe("does not fit on sim:400 (device 1): short by 150 MiB; layers 15-30 need 150 MiB more on sim:400");
    expect(fitMessage(plan([row()]))).toBeNull();
  });
});
