// The settings view: an invalid value shows its error AT its field (aria-invalid, a message element
// named by aria-describedby), whether the backend names the field in a CommandError (desktop) or in a
// 400's error.param (browser, through the real HTTP transport); the plan bars follow the values,
// re-planned after a pause; Apply saves; a browser shows the flags to restart strata serve with.
import { fireEvent, render, screen, waitFor } from "@testing-library/preact";
import { describe, expect, it, vi } from "vitest";
import { HttpTransport } from "../src/transport/http";
import { SettingsView } from "../src/views/settings/SettingsView";
import { FakeTransport, MIB, plan, row, settings } from "./fakes";

function input(name: string): HTMLInputElement {
  return document.getElementById(`settings-${name}`) as HTMLInputElement;
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
    fireEvent.input(input("engine_url"), { target: { value: "http://10.0.0.2:8080/v1" } });
    fireEvent.input(input("engine_model"), { target: { value: "llama" } });
    fireEvent.click(screen.getByRole("button", { name: "Apply" }));
    await waitFor(() => expect(t.saveSettings).toHaveBeenCalled());
    expect(t.saveSettings.mock.calls[0]![0]).toEqual({
      ...settings(),
      threads: 8,
      kv: "int8",
      engine: { kind: "remote", url: "http://10.0.0.2:8080/v1", api_key: "", model: "llama" },
    });
    expect(await screen.findByText(/Saved\./)).toBeTruthy();
  });
});
