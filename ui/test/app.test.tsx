// The app frame: the status badge follows engine_status, the tabs switch views and are buttons, and in a
// browser a 401 brings up the API key form whose key then goes with every request.
import { act, fireEvent, render, screen, waitFor } from "@testing-library/preact";
import { describe, expect, it, vi } from "vitest";
import type { EngineStatus, TelemetryEntry } from "../src/bindings";
import { App } from "../src/app";
import { TelemetryStore } from "../src/telemetry/store";
import { HttpTransport } from "../src/transport/http";
import { KeyRequests } from "../src/views/keyRequests";
import { FakeTransport, MIB } from "./fakes";

describe("App", () => {
  it("shows the engine's status and follows its changes", async () => {
    const t = new FakeTransport();
    let push: (s: EngineStatus) => void = () => {};
    t.onEngineStatus.mockImplementation((f) => {
      push = f;
      return () => {};
    });
    render(<App transport={t} />);
    const badge = screen.getByTestId("status-badge");
    await waitFor(() => expect(badge.textContent).toContain("ready"));
    act(() => push({ state: "restarting", message: "the engine exited: restarting (1 of 5)", restarts: 1, pid: null, model: null }));
    expect(badge.className).toContain("state-restarting");
    expect(badge.textContent).toContain("the engine exited: restarting (1 of 5)");
    act(() => push({ state: "failed", message: "cuda:0 is gone", restarts: 5, pid: null, model: null }));
    expect(badge.textContent).toContain("failed");
    expect(badge.textContent).toContain("cuda:0 is gone");
  });

  it("switches views with tab buttons, keeping the others mounted", async () => {
    const t = new FakeTransport();
    render(<App transport={t} />);
    const tabs = screen.getAllByRole("tab");
    expect(tabs.map((b) => b.textContent)).toEqual(["Chat", "Models", "Settings", "Devices"]);
    for (const b of tabs) expect(b.tagName).toBe("BUTTON");
    fireEvent.click(screen.getByRole("tab", { name: "Devices" }));
    expect(document.getElementById("panel-devices")?.hidden).toBe(false);
    expect(document.getElementById("panel-chat")?.hidden).toBe(true);
    expect(document.getElementById("chat-input")).not.toBeNull();
    fireEvent.keyDown(screen.getByRole("tab", { name: "Devices" }), { key: "ArrowRight" });
    expect(screen.getByRole("tab", { name: "Chat" }).getAttribute("aria-selected")).toBe("true");
    expect(document.activeElement).toBe(screen.getByRole("tab", { name: "Chat" }));
    fireEvent.keyDown(screen.getByRole("tab", { name: "Chat" }), { key: "ArrowLeft" });
    expect(screen.getByRole("tab", { name: "Devices" }).getAttribute("aria-selected")).toBe("true");
  });

  it("asks for the API key after a 401 and sends it from then on", async () => {
    const keys = new KeyRequests();
    const auths: (string | null)[] = [];
    const fetchFn = vi.fn(async (url: RequestInfo | URL, init?: RequestInit) => {
      const auth = new Headers(init?.headers).get("Authorization");
      auths.push(auth);
      if (String(url) === "/health") return new Response(JSON.stringify({ status: "ok", busy: false, queue: 0 }));
      if (auth !== "Bearer k-123") {
        return new Response(JSON.stringify({ error: { message: "missing or incorrect API key", type: "authentication_error" } }), { status: 401 });
      }
      if (String(url) === "/strata/events") return new Response(new ReadableStream({ start() {} }));
      return new Response(JSON.stringify({ error: { message: "no such path" } }), { status: 404 });
    });
    const t = new HttpTransport({ fetch: fetchFn as unknown as typeof fetch, askKey: keys.ask });
    render(<App transport={t} keys={keys} />);
    const form = await screen.findByTestId("api-key-form");
    expect(form.textContent).toContain("missing or incorrect API key");
    fireEvent.input(screen.getByLabelText("API key of strata serve"), { target: { value: "k-123" } });
    // Not remembered unless ticked: kept for this tab only.
    expect((screen.getByLabelText("Remember on this browser") as HTMLInputElement).checked).toBe(false);
    fireEvent.click(screen.getByRole("button", { name: "Use this key" }));
    await waitFor(() => expect(screen.queryByTestId("api-key-form")).toBeNull());
    await waitFor(() => expect(auths.filter((a) => a === "Bearer k-123").length).toBeGreaterThan(2));
    expect(sessionStorage.getItem("strata.apiKey")).toBe("k-123");
    expect(localStorage.getItem("strata.apiKey")).toBeNull();
    expect(localStorage.getItem("strata.apiKey.remembered")).toBeNull();
  });

  it("keeps the key on this browser when Remember is ticked", async () => {
    const keys = new KeyRequests();
    const fetchFn = vi.fn(async (url: RequestInfo | URL, init?: RequestInit) => {
      const auth = new Headers(init?.headers).get("Authorization");
      if (String(url) === "/health") return new Response(JSON.stringify({ status: "ok", busy: false, queue: 0 }));
      if (auth !== "Bearer k-456") return new Response(JSON.stringify({ error: { message: "missing or incorrect API key" } }), { status: 401 });
      if (String(url) === "/strata/events") return new Response(new ReadableStream({ start() {} }));
      return new Response(JSON.stringify({ error: { message: "no such path" } }), { status: 404 });
    });
    const t = new HttpTransport({ fetch: fetchFn as unknown as typeof fetch, askKey: keys.ask });
    render(<App transport={t} keys={keys} />);
    await screen.findByTestId("api-key-form");
    fireEvent.input(screen.getByLabelText("API key of strata serve"), { target: { value: " k-456 " } });
    fireEvent.click(screen.getByLabelText("Remember on this browser"));
    fireEvent.click(screen.getByRole("button", { name: "Use this key" }));
    await waitFor(() => expect(screen.queryByTestId("api-key-form")).toBeNull());
    await waitFor(() => expect(localStorage.getItem("strata.apiKey.remembered")).toBe("k-456"));
    expect(sessionStorage.getItem("strata.apiKey")).toBeNull();
  });
});

describe("TelemetryStore", () => {
  it("keeps live entries that arrive while the seed is on its way", async () => {
    const t = new FakeTransport();
    let live: (e: TelemetryEntry) => void = () => {};
    t.onTelemetry.mockImplementation((f) => {
      live = f;
      return () => {};
    });
    let answer: (v: { now_ms: number; samples: never[]; events: never[] }) => void = () => {};
    t.telemetry.mockReturnValue(new Promise((r) => (answer = r as typeof answer)));
    const store = new TelemetryStore();
    store.start(t);
    expect(t.telemetry).toHaveBeenCalledWith(0);
    live({ t_ms: 5, device: 0, free_bytes: MIB, total_bytes: 2 * MIB });
    expect(store.window.samplesOf(0)).toHaveLength(0);
    answer({
      now_ms: 4,
      samples: [{ t_ms: 4, device: 0, free_bytes: MIB, total_bytes: 2 * MIB }] as never[],
      events: [],
    });
    await waitFor(() => expect(store.window.samplesOf(0).map((s) => s.t_ms)).toEqual([4, 5]));
    expect(store.state).toBe("live");
  });
});
