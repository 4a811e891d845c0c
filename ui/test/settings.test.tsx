// The settings view: an invalid value shows its error AT its field (aria-invalid, a message element
// named by aria-describedby), whether the backend names the field in a CommandError (desktop) or in a
// 400's error.param (browser, through the real HTTP transport); the plan bars follow the values,
// re-planned after a pause; Apply saves; a browser shows the flags to restart strata serve with, or applies
// them in the running server (POST /strata/model/load), a restart-only one refused at its field. The
// speculative decoding card shows the fields of the kind chosen, sends them, and shows their errors at
// them; a device holding the model and its draft has one bar with the draft's share marked. Requests at
// once are planned as typed (empty: the server's default), the bars and the count following.
import { fireEvent, render, screen, waitFor } from "@testing-library/preact";
import { describe, expect, it, vi } from "vitest";
import { HttpTransport } from "../src/transport/http";
import { SettingsView } from "../src/views/settings/SettingsView";
import { deviceOf, FakeTransport, MIB, plan, row, settings } from "./fakes";

function input(name: string): HTMLInputElement {
  return document.getElementById(`settings-${name}`) as HTMLInputElement;
}

function select(name: string): HTMLSelectElement {
  return document.getElementById(`settings-${name}`) as HTMLSelectElement;
}

function expectErrorAt(name: string, message: string) {
  const el = input(name);
  expect(el.getAttribute("aria-invalid")).toBe("true");
  const msg = screen.getByTestId(`error-${name}`);
  expect(msg.textContent).toBe(message);
  expect(el.getAttribute("aria-describedby")?.split(" ")).toContain(msg.id);
  // No other field is marked.
  for (const other of document.querySelectorAll('[aria-invalid="true"]')) expect(other).toBe(el);
}

describe("SettingsView", () => {
  it("shows a CommandError at the field it names, and clears it when the value is fixed", async () => {
    const t = new FakeTransport();
    t.plan.mockImplementation(async (s) => {
      if (s.layer_split === "40") {
        throw { code: "invalid", field: "layer_split", message: "layer_split 40 is past the model's 30 layers" };
      }
      return { plan: plan([row()]), flags: [] };
    });
    render(<SettingsView transport={t} planDelayMs={5} />);
    await waitFor(() => expect(input("layer_split").value).toBe("15"));
    fireEvent.input(input("layer_split"), { target: { value: "40" } });
    await waitFor(() => expectErrorAt("layer_split", "layer_split 40 is past the model's 30 layers"));
    expect(input("devices").getAttribute("aria-invalid")).toBe("false");
    fireEvent.input(input("layer_split"), { target: { value: "20" } });
    await waitFor(() => expect(input("layer_split").getAttribute("aria-invalid")).toBe("false"));
    expect(screen.queryByTestId("error-layer_split")).toBeNull();
  });

  it("shows a save_settings error at its field", async () => {
    const t = new FakeTransport();
    t.saveSettings.mockRejectedValue({ code: "invalid", field: "vram_reserve_mib", message: "the reserve is larger than sim:200 has" });
    render(<SettingsView transport={t} planDelayMs={5} />);
    await waitFor(() => expect(input("vram_reserve_mib").value).toBe("64"));
    fireEvent.input(input("vram_reserve_mib"), { target: { value: "900" } });
    fireEvent.click(screen.getByRole("button", { name: "Apply" }));
    await waitFor(() => expectErrorAt("vram_reserve_mib", "the reserve is larger than sim:200 has"));
    expect(t.saveSettings).toHaveBeenCalledWith(expect.objectContaining({ vram_reserve_mib: 900 }));
  });

  it("marks a field that is not a number before asking the backend", async () => {
    const t = new FakeTransport();
    render(<SettingsView transport={t} planDelayMs={5} />);
    await waitFor(() => expect(input("cache_mib").value).toBe("4096"));
    await waitFor(() => expect(t.plan).toHaveBeenCalledTimes(1));
    fireEvent.input(input("cache_mib"), { target: { value: "4 GiB" } });
    await waitFor(() => expectErrorAt("cache_mib", "Cache MiB must be a whole number (0 or more)"));
    await new Promise((r) => setTimeout(r, 30));
    expect(t.plan).toHaveBeenCalledTimes(1);
  });

  it("shows a 400's error.param at that field through the HTTP transport", async () => {
    const fetchFn = vi.fn(async (url: RequestInfo | URL, init?: RequestInit) => {
      if (String(url) === "/strata/settings") return new Response(JSON.stringify(settings({ model_path: "/m/a b.gguf" })), { status: 200 });
      const body = JSON.parse(String(init?.body)) as { devices: string };
      if (body.devices.includes("tpu")) {
        return new Response(
          JSON.stringify({ error: { message: 'devices: "tpu:0" is not a device: use cpu, cuda:N or sim:MIB', type: "invalid_request_error", param: "devices", code: null } }),
          { status: 400 },
        );
      }
      return new Response(JSON.stringify({ plan: plan([row()]), flags: ["--devices", body.devices, "--kv", "f16"] }), { status: 200 });
    });
    const t = new HttpTransport({ fetch: fetchFn as unknown as typeof fetch });
    render(<SettingsView transport={t} planDelayMs={5} />);
    await waitFor(() => expect(input("devices").value).toBe("sim:200,sim:400"));
    fireEvent.input(input("devices"), { target: { value: "tpu:0" } });
    await waitFor(() => expectErrorAt("devices", 'devices: "tpu:0" is not a device: use cpu, cuda:N or sim:MIB'));
    // A browser checks and shows the flags instead of applying.
    fireEvent.input(input("devices"), { target: { value: "cuda:0,cuda:1" } });
    await waitFor(() => expect(input("devices").getAttribute("aria-invalid")).toBe("false"));
    fireEvent.click(screen.getByRole("button", { name: "Check" }));
    const flags = await screen.findByTestId("restart-flags");
    expect(flags.textContent).toContain("restart strata serve with:");
    // The flags leave the model out: it is added from the settings, quoted for the shell.
    expect(flags.textContent).toContain("strata serve -m '/m/a b.gguf' --devices cuda:0,cuda:1 --kv f16");
  });

  it("in a browser applies settings without a restart through POST /strata/model/load; a restart-only one is refused at its field", async () => {
    let served = settings({ model_path: "/m/a.gguf", devices: "cpu" });
    const loads: Record<string, unknown>[] = [];
    const fetchFn = vi.fn(async (url: RequestInfo | URL, init?: RequestInit) => {
      const u = String(url);
      if (u === "/strata/settings") return new Response(JSON.stringify(served), { status: 200 });
      if (u === "/strata/model/load") {
        const body = JSON.parse(String(init?.body)) as typeof served;
        loads.push(body);
        if (body.devices !== "cpu") {
          return new Response(
            JSON.stringify({ error: { message: "changing the devices needs the engine started again", type: "invalid_request_error", param: "devices", code: "needs_restart" } }),
            { status: 409 },
          );
        }
        served = body;
        return new Response(JSON.stringify({ model: { id: "a" }, switch: { ms: 5, parked: 0, cached: 0 } }), { status: 200 });
      }
      return new Response(JSON.stringify({ plan: plan([row()]), flags: ["--devices", "cpu"] }), { status: 200 });
    });
    const t = new HttpTransport({ fetch: fetchFn as unknown as typeof fetch });
    render(<SettingsView transport={t} planDelayMs={5} />);
    await waitFor(() => expect(input("devices").value).toBe("cpu"));
    fireEvent.input(input("cache_mib"), { target: { value: "512" } });
    fireEvent.click(screen.getByTestId("apply-in-place"));
    await waitFor(() => expect(screen.getByRole("status").textContent).toContain("without a restart"));
    expect(loads[0]).toMatchObject({ model_path: "/m/a.gguf", cache_mib: 512 });
    expect(input("cache_mib").value).toBe("512");
    fireEvent.input(input("devices"), { target: { value: "sim:300" } });
    fireEvent.click(screen.getByTestId("apply-in-place"));
    await waitFor(() => expectErrorAt("devices", "changing the devices needs the engine started again"));
    expect(served.devices).toBe("cpu");
  });

  it("re-plans after a pause as values change and the bars follow", async () => {
    const t = new FakeTransport();
    t.plan.mockImplementation(async (s) => {
      const reserve = s.vram_reserve_mib * MIB;
      const used = s.layer_split === "10" ? 50 * MIB : 150 * MIB;
      return {
        plan: plan([
          row({ total_bytes: used, free_bytes: 200 * MIB, reserve_bytes: reserve, fits: used + reserve <= 200 * MIB }),
          row({ device: "sim:400", index: 1, total_bytes: 100 * MIB, free_bytes: 400 * MIB, reserve_bytes: reserve }),
        ]),
        flags: [],
      };
    });
    render(<SettingsView transport={t} planDelayMs={40} />);
    await waitFor(() => expect(screen.getAllByTestId("plan-bar")).toHaveLength(2));
    const bar0 = () => screen.getAllByTestId("plan-bar")[0]!;
    expect(bar0().getAttribute("data-used-pct")).toBe("75.0");
    expect(bar0().className).toContain("over");
    const calls = t.plan.mock.calls.length;
    // Several quick edits are planned once, with the last values.
    fireEvent.input(input("layer_split"), { target: { value: "1" } });
    fireEvent.input(input("layer_split"), { target: { value: "10" } });
    await waitFor(() => expect(bar0().getAttribute("data-used-pct")).toBe("25.0"));
    expect(t.plan.mock.calls.length).toBe(calls + 1);
    expect(t.plan.mock.calls.at(-1)![0].layer_split).toBe("10");
    expect(bar0().className).toContain("fits");
    const reserve = bar0().querySelector("[data-testid=plan-bar-reserve]") as HTMLElement;
    expect(reserve.style.left).toBe("68%");
    expect(reserve.style.width).toBe("32%");
  });

  it("applies with save_settings, sending every field", async () => {
    const t = new FakeTransport();
    render(<SettingsView transport={t} planDelayMs={5} />);
    await waitFor(() => expect(input("threads")).toBeTruthy());
    fireEvent.input(input("threads"), { target: { value: "8" } });
    fireEvent.change(document.getElementById("settings-kv") as HTMLSelectElement, { target: { value: "int8" } });
    fireEvent.click(screen.getByLabelText("Remote OpenAI-compatible endpoint"));
    fireEvent.input(input("engine_url"), { target: { value: "https://10.0.0.2:8080/v1" } });
    fireEvent.input(input("engine_model"), { target: { value: "llama" } });
    fireEvent.click(screen.getByRole("button", { name: "Apply" }));
    await waitFor(() => expect(t.saveSettings).toHaveBeenCalled());
    expect(t.saveSettings.mock.calls[0]![0]).toEqual({
      ...settings(),
      threads: 8,
      kv: "int8",
      engine: { kind: "remote", url: "https://10.0.0.2:8080/v1", api_key: { kind: "none" }, model: "llama", allow_insecure: false },
    });
    expect(await screen.findByText(/Saved\./)).toBeTruthy();
  });

  it("applies with the model loaded since the form was read, not the one it was read with", async () => {
    const t = new FakeTransport();
    t.getSettings.mockResolvedValueOnce(settings({ model_path: null }));
    render(<SettingsView transport={t} planDelayMs={5} />);
    await waitFor(() => expect(input("threads")).toBeTruthy());
    // The Models view loads a model meanwhile.
    t.getSettings.mockResolvedValue(settings({ model_path: "/models/loaded-since.gguf" }));
    fireEvent.input(input("threads"), { target: { value: "4" } });
    fireEvent.click(screen.getByRole("button", { name: "Apply" }));
    await waitFor(() => expect(t.saveSettings).toHaveBeenCalled());
    expect(t.saveSettings.mock.calls[0]![0]).toMatchObject({ threads: 4, model_path: "/models/loaded-since.gguf" });
  });

  it("shows a kept key masked, replaces it with a typed one, and never puts the key in the page", async () => {
    const t = new FakeTransport();
    const kept = { kind: "remote" as const, url: "https://gpu-box:8000/v1", api_key: { kind: "kept" as const, hint: "wxyz" }, model: "", allow_insecure: false };
    t.getSettings.mockResolvedValue(settings({ engine: kept }));
    // The backend answers masked, as the app's does.
    t.saveSettings.mockImplementation(async (s) => {
      if (s.engine.kind !== "remote") return s;
      const api_key = s.engine.api_key.kind === "new" ? { kind: "kept" as const, hint: s.engine.api_key.key.slice(-4) } : s.engine.api_key;
      return { ...s, engine: { ...s.engine, api_key } };
    });
    render(<SettingsView transport={t} planDelayMs={5} />);
    await waitFor(() => expect(screen.getByTestId("key-status").textContent).toBe("A key is kept (ending in …wxyz)."));
    expect(input("engine_api_key").value).toBe("");
    expect(input("engine_api_key").type).toBe("password");
    // Applied untouched: the key is kept.
    fireEvent.click(screen.getByRole("button", { name: "Apply" }));
    await waitFor(() => expect(t.saveSettings).toHaveBeenCalledTimes(1));
    expect(t.saveSettings.mock.calls[0]![0].engine).toEqual(kept);
    // A typed key replaces it; it is not planned with, and once saved the form forgets it.
    fireEvent.input(input("engine_api_key"), { target: { value: "sk-new-key-abcd" } });
    await waitFor(() => expect(screen.getByTestId("key-status").textContent).toContain("replaces the kept one"));
    await new Promise((r) => setTimeout(r, 20));
    for (const [planned] of t.plan.mock.calls) expect(JSON.stringify(planned)).not.toContain("sk-new-key-abcd");
    fireEvent.click(screen.getByRole("button", { name: "Apply" }));
    await waitFor(() => expect(t.saveSettings).toHaveBeenCalledTimes(2));
    expect(t.saveSettings.mock.calls[1]![0].engine).toMatchObject({ api_key: { kind: "new", key: "sk-new-key-abcd" } });
    await waitFor(() => expect(screen.getByTestId("key-status").textContent).toBe("A key is kept (ending in …abcd)."));
    expect(input("engine_api_key").value).toBe("");
    expect(document.body.innerHTML).not.toContain("sk-new-key-abcd");
    // Cleared (and undone, then cleared again): none is sent.
    fireEvent.click(screen.getByRole("button", { name: "Clear key" }));
    expect(screen.getByTestId("key-status").textContent).toBe("The kept key is removed when you apply.");
    fireEvent.click(screen.getByRole("button", { name: "Keep the key" }));
    expect(screen.getByTestId("key-status").textContent).toBe("A key is kept (ending in …abcd).");
    fireEvent.click(screen.getByRole("button", { name: "Clear key" }));
    fireEvent.click(screen.getByRole("button", { name: "Apply" }));
    await waitFor(() => expect(t.saveSettings).toHaveBeenCalledTimes(3));
    expect(t.saveSettings.mock.calls[2]![0].engine).toMatchObject({ api_key: { kind: "none" } });
    await waitFor(() => expect(screen.queryByTestId("key-status")).toBeNull());
  });

  it("marks an http:// URL to another machine at the URL until Allow insecure is ticked", async () => {
    const t = new FakeTransport();
    render(<SettingsView transport={t} planDelayMs={5} />);
    await waitFor(() => expect(t.plan).toHaveBeenCalledTimes(1));
    fireEvent.click(screen.getByLabelText("Remote OpenAI-compatible endpoint"));
    fireEvent.input(input("engine_url"), { target: { value: "http://gpu-box:8000/v1" } });
    await waitFor(() => expectErrorAt("engine_url", "an http:// endpoint sends the key in clear text: use https:// or tick Allow insecure"));
    fireEvent.click(screen.getByRole("button", { name: "Apply" }));
    await new Promise((r) => setTimeout(r, 20));
    expect(t.saveSettings).not.toHaveBeenCalled();
    // Loopback crosses no network: no error.
    fireEvent.input(input("engine_url"), { target: { value: "http://127.0.0.1:8080/v1" } });
    await waitFor(() => expect(input("engine_url").getAttribute("aria-invalid")).toBe("false"));
    fireEvent.input(input("engine_url"), { target: { value: "http://gpu-box:8000/v1" } });
    await waitFor(() => expect(input("engine_url").getAttribute("aria-invalid")).toBe("true"));
    const box = screen.getByLabelText("Allow insecure (http)") as HTMLInputElement;
    expect(box.checked).toBe(false);
    fireEvent.click(box);
    await waitFor(() => expect(input("engine_url").getAttribute("aria-invalid")).toBe("false"));
    fireEvent.click(screen.getByRole("button", { name: "Apply" }));
    await waitFor(() => expect(t.saveSettings).toHaveBeenCalled());
    expect(t.saveSettings.mock.calls[0]![0].engine).toMatchObject({ url: "http://gpu-box:8000/v1", allow_insecure: true });
  });

  it("shows the backend's http refusal at the URL", async () => {
    const t = new FakeTransport();
    t.getSettings.mockResolvedValue(
      settings({ engine: { kind: "remote", url: "https://gpu-box", api_key: { kind: "none" }, model: "", allow_insecure: false } }),
    );
    t.saveSettings.mockRejectedValue({ code: "invalid", field: "engine.url", message: "an http:// endpoint sends the key in clear text: use https:// or tick Allow insecure" });
    render(<SettingsView transport={t} planDelayMs={5} />);
    await waitFor(() => expect(input("engine_url").value).toBe("https://gpu-box"));
    fireEvent.click(screen.getByRole("button", { name: "Apply" }));
    await waitFor(() => expectErrorAt("engine_url", "an http:// endpoint sends the key in clear text: use https:// or tick Allow insecure"));
  });

  it("shows the drafting fields of the kind chosen and applies them", async () => {
    const t = new FakeTransport();
    render(<SettingsView transport={t} planDelayMs={5} />);
    await waitFor(() => expect(select("speculative_kind").value).toBe("off"));
    for (const f of ["draft_max", "draft_min", "draft_model_path", "draft_devices"]) expect(input(f)).toBeNull();
    // N-gram lookup has no second model: the numbers only.
    fireEvent.change(select("speculative_kind"), { target: { value: "ngram" } });
    await waitFor(() => expect(input("draft_max").value).toBe("16"));
    expect(input("draft_min").value).toBe("1");
    expect(input("draft_model_path")).toBeNull();
    fireEvent.change(select("speculative_kind"), { target: { value: "draft" } });
    await waitFor(() => expect(input("draft_model_path")).toBeTruthy());
    // Labelled, so reachable by name from the keyboard and a screen reader.
    expect(screen.getByLabelText("Draft model (GGUF file)")).toBe(input("draft_model_path"));
    expect(screen.getByLabelText("Drafts from")).toBe(select("speculative_kind"));
    fireEvent.input(input("draft_model_path"), { target: { value: " /m/draft.gguf " } });
    fireEvent.input(input("draft_devices"), { target: { value: "1, 0" } });
    fireEvent.input(input("draft_max"), { target: { value: "8" } });
    fireEvent.click(screen.getByRole("button", { name: "Apply" }));
    await waitFor(() => expect(t.saveSettings).toHaveBeenCalled());
    expect(t.saveSettings.mock.calls[0]![0]).toEqual({
      ...settings(),
      speculative: { kind: "draft", model_path: "/m/draft.gguf" },
      draft_devices: [1, 0],
      draft_max: 8,
    });
    // Off hides them again (and sends drafting off).
    fireEvent.change(select("speculative_kind"), { target: { value: "off" } });
    await waitFor(() => expect(input("draft_max")).toBeNull());
  });

  it("shows the backend's drafting errors at their fields", async () => {
    const t = new FakeTransport();
    t.getSettings.mockResolvedValue(settings({ speculative: { kind: "draft", model_path: "/m/notes.txt" } }));
    t.plan.mockImplementation(async (s) => {
      if (s.speculative.kind === "draft" && s.speculative.model_path.endsWith("notes.txt")) {
        throw { code: "invalid", field: "speculative.model_path", message: 'cannot read the draft model /m/notes.txt: not a GGUF file: magic is "this"' };
      }
      if (s.draft_devices.includes(5)) {
        throw { code: "invalid", field: "draft_devices", message: "device 5 is not among the 2 device(s): 0 (sim:200), 1 (sim:400)" };
      }
      if (s.draft_min > s.draft_max) throw { code: "invalid", field: "draft_min", message: "6 is more than the most drafts per verification (4)" };
      return { plan: plan([row()]), flags: [] };
    });
    render(<SettingsView transport={t} planDelayMs={5} />);
    await waitFor(() => expectErrorAt("draft_model_path", 'cannot read the draft model /m/notes.txt: not a GGUF file: magic is "this"'));
    fireEvent.input(input("draft_model_path"), { target: { value: "/m/draft.gguf" } });
    await waitFor(() => expect(input("draft_model_path").getAttribute("aria-invalid")).toBe("false"));
    fireEvent.input(input("draft_devices"), { target: { value: "5" } });
    await waitFor(() => expectErrorAt("draft_devices", "device 5 is not among the 2 device(s): 0 (sim:200), 1 (sim:400)"));
    fireEvent.input(input("draft_devices"), { target: { value: "1" } });
    fireEvent.input(input("draft_max"), { target: { value: "4" } });
    fireEvent.input(input("draft_min"), { target: { value: "6" } });
    await waitFor(() => expectErrorAt("draft_min", "6 is more than the most drafts per verification (4)"));
  });

  it("marks drafting values that cannot be read before asking the backend", async () => {
    const t = new FakeTransport();
    t.getSettings.mockResolvedValue(settings({ speculative: { kind: "draft", model_path: "/m/draft.gguf" } }));
    render(<SettingsView transport={t} planDelayMs={5} />);
    await waitFor(() => expect(t.plan).toHaveBeenCalledTimes(1));
    fireEvent.input(input("draft_max"), { target: { value: "lots" } });
    await waitFor(() => expectErrorAt("draft_max", "Most drafts must be a whole number (0 or more)"));
    fireEvent.input(input("draft_max"), { target: { value: "16" } });
    fireEvent.input(input("draft_devices"), { target: { value: "1,x" } });
    await waitFor(() => expectErrorAt("draft_devices", 'Draft devices are device numbers separated by commas, e.g. "1" or "0,1"'));
    fireEvent.input(input("draft_devices"), { target: { value: "1" } });
    fireEvent.input(input("draft_model_path"), { target: { value: "  " } });
    await waitFor(() => expectErrorAt("draft_model_path", "Choose the draft model's GGUF file"));
    await new Promise((r) => setTimeout(r, 30));
    expect(t.plan).toHaveBeenCalledTimes(1);
  });

  it("plans the requests at once typed (empty: the server's default), the bars following, errors at the field", async () => {
    const t = new FakeTransport();
    // As the backend: each request at once adds its KV; the default here is 4; more than 1 with drafting is refused.
    t.plan.mockImplementation(async (s) => {
      if (s.parallel !== null && s.parallel > 1 && s.speculative.kind !== "off") {
        throw { code: "invalid", field: "parallel", message: `${s.parallel} requests at once: speculative decoding runs one request at a time; set 1, or turn speculative decoding off` };
      }
      if (s.parallel === 0) throw { code: "invalid", field: "parallel", message: "0 is not between 1 and 256 requests at once (empty: the server's default)" };
      const sequences = s.parallel ?? 4;
      const kv = 20 * MIB * sequences;
      return { plan: plan([row({ kv_device_bytes: kv, total_bytes: 50 * MIB + kv, free_bytes: 200 * MIB })], { sequences }), flags: [] };
    });
    render(<SettingsView transport={t} planDelayMs={5} />);
    await waitFor(() => expect(screen.getByTestId("plan-sequences").textContent).toBe("KV for 4 requests at once"));
    expect(input("parallel").value).toBe("");
    expect(screen.getByLabelText("Requests at once")).toBe(input("parallel"));
    const used = () => screen.getByTestId("plan-bar").getAttribute("data-used-pct");
    expect(used()).toBe("65.0");
    // Set: planned with it, the bar follows.
    fireEvent.input(input("parallel"), { target: { value: "1" } });
    await waitFor(() => expect(screen.getByTestId("plan-sequences").textContent).toBe("KV for 1 request at once"));
    expect(used()).toBe("35.0");
    expect(t.plan.mock.calls.at(-1)![0].parallel).toBe(1);
    // Not a number: marked before asking the backend; the backend's refusals are shown at the field too.
    fireEvent.input(input("parallel"), { target: { value: "a few" } });
    await waitFor(() => expectErrorAt("parallel", "Requests at once must be a whole number (0 or more)"));
    fireEvent.input(input("parallel"), { target: { value: "0" } });
    await waitFor(() => expectErrorAt("parallel", "0 is not between 1 and 256 requests at once (empty: the server's default)"));
    fireEvent.input(input("parallel"), { target: { value: "2" } });
    fireEvent.change(select("speculative_kind"), { target: { value: "ngram" } });
    await waitFor(() =>
      expectErrorAt("parallel", "2 requests at once: speculative decoding runs one request at a time; set 1, or turn speculative decoding off"),
    );
    fireEvent.change(select("speculative_kind"), { target: { value: "off" } });
    await waitFor(() => expect(screen.getByTestId("plan-sequences").textContent).toBe("KV for 2 requests at once"));
    expect(input("parallel").getAttribute("aria-invalid")).toBe("false");
    // Cleared: the server's default again, and sent as null when applied.
    fireEvent.input(input("parallel"), { target: { value: "" } });
    await waitFor(() => expect(screen.getByTestId("plan-sequences").textContent).toBe("KV for 4 requests at once"));
    expect(t.plan.mock.calls.at(-1)![0].parallel).toBeNull();
    fireEvent.input(input("parallel"), { target: { value: "3" } });
    fireEvent.click(screen.getByRole("button", { name: "Apply" }));
    await waitFor(() => expect(t.saveSettings).toHaveBeenCalled());
    expect(t.saveSettings.mock.calls[0]![0]).toEqual({ ...settings(), parallel: 3 });
  });

  it("draws one bar for a device holding the model and its draft, the draft's share marked", async () => {
    const t = new FakeTransport();
    const r0 = row();
    const r1 = row({ device: "sim:400", index: 1, layers: [15, 30], total_bytes: 100 * MIB, free_bytes: 400 * MIB, memory_bytes: 400 * MIB, reserve_bytes: 0 });
    const d1 = row({ device: "sim:400", index: 1, layers: [0, 30], total_bytes: 160 * MIB, free_bytes: 400 * MIB, memory_bytes: 400 * MIB, reserve_bytes: 0 });
    t.plan.mockResolvedValue({
      plan: plan([r0, r1], {
        draft: { layers: 30, rows: [d1] },
        devices: [deviceOf(r0), deviceOf(r1, { total_bytes: 260 * MIB, draft_bytes: 160 * MIB, headroom_bytes: 140 * MIB })],
      }),
      flags: [],
    });
    render(<SettingsView transport={t} planDelayMs={5} />);
    await waitFor(() => expect(screen.getAllByTestId("plan-bar")).toHaveLength(2));
    const bar1 = screen.getAllByTestId("plan-bar")[1]!;
    expect(bar1.getAttribute("data-used-pct")).toBe("65.0");
    expect(bar1.getAttribute("data-draft-pct")).toBe("40.0");
    expect(bar1.getAttribute("aria-label")).toBe("sim:400: 260 MiB (draft model 160 MiB) of 400 MiB free, reserve 0 B");
    const draft = bar1.querySelector("[data-testid=plan-bar-draft]") as HTMLElement;
    expect(draft.style.left).toBe("25%");
    expect(draft.style.width).toBe("40%");
    expect(screen.getAllByTestId("plan-bar")[0]!.querySelector("[data-testid=plan-bar-draft]")).toBeNull();
  });
});
