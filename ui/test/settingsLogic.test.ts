// The settings form's conversions, the field names of backend errors, and plan bars / fit messages.
import { describe, expect, it } from "vitest";
import { fitMessage, planBar } from "../src/settings/bars";
import { fieldOf, formFromSettings, settingsFromForm } from "../src/settings/form";
import { MIB, plan, row, settings } from "./fakes";

describe("settings form", () => {
  it("round-trips settings, optional numbers as empty fields", () => {
    const s = settings({ engine: { kind: "remote", url: "http://h:1/v1", api_key: "k", model: "m" } });
    const f = formFromSettings(s);
    expect(f.kv_resident).toBe("");
    expect(settingsFromForm(f)).toEqual({ ok: true, settings: s });
  });

  it("names the field that is not a whole number", () => {
    const f = { ...formFromSettings(settings()), vram_reserve_mib: "lots", threads: "-2" };
    const r = settingsFromForm(f);
    expect(r.ok).toBe(false);
    if (!r.ok) expect(Object.keys(r.errors).sort()).toEqual(["threads", "vram_reserve_mib"]);
  });

  it("maps backend field names onto form fields", () => {
    expect(fieldOf("layer_split")).toBe("layer_split");
    expect(fieldOf("settings.vram_reserve_mib")).toBe("vram_reserve_mib");
    expect(fieldOf("engine.url")).toBe("engine_url");
    expect(fieldOf("devices")).toBe("devices");
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

  it("says which device a plan does not fit on and by how much", () => {
    const p = plan(
      [row(), row({ device: "sim:400", index: 1, fits: false, headroom_bytes: -150 * MIB })],
      { problem: "layers 15-30 need 150 MiB more on sim:400" },
    );
    expect(fitMessage(p)).toBe("does not fit on sim:400 (device 1): short by 150 MiB; layers 15-30 need 150 MiB more on sim:400");
    expect(fitMessage(plan([row()]))).toBeNull();
  });
});
