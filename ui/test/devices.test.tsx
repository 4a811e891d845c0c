// The device panel: a marker per event of each marker kind, with a distinct look, placed on the chart's
// time scale and showing the event's figures in the tooltip on hover or focus; the reserve lines; the
// events table with older counts; host RAM and the cache; live entries after the seed; and the message
// for an engine with no device data.
import { act, fireEvent, render, screen, waitFor } from "@testing-library/preact";
import { describe, expect, it } from "vitest";
import type { TelemetryEntry, TelemetryEvent } from "../src/bindings";
import { TelemetryStore } from "../src/telemetry/store";
import { DevicePanel } from "../src/views/devices/DevicePanel";
import { device, FakeTransport, MIB } from "./fakes";
import { FakeUPlot, PLOT_WIDTH_PX } from "./fakeUplot";

const EVENTS: TelemetryEvent[] = [
  { t_ms: 1000, event: "parked", tokens: 800, ms: 3, snapshot_bytes: 12 * MIB, parked: 1, bytes: 12 * MIB, evictions: 0 },
  { t_ms: 2000, event: "restored", kind: "live", tokens: 800, ms: 1, restored_bytes: 12 * MIB, parked: 0, bytes: 0 },
  { t_ms: 3000, event: "restored", kind: "checkpoint", tokens: 512, ms: 2, restored_bytes: 8 * MIB, parked: 0, bytes: 0 },
  { t_ms: 4000, event: "restore_fallback", device: 1, free_mib: 40, need_mib: 120, reserve_mib: 64, tokens: 812 },
  { t_ms: 5000, event: "evicted", tokens: 300, bytes: 4 * MIB },
  { t_ms: 6000, event: "oom_averted", error: "KV page refused on sim:400", tokens: 900 },
  { t_ms: 7000, event: "sample_failed", device: 0, count: 3 },
  { t_ms: 8000, event: "engine_restarted", reason: "the engine process exited (signal 9)", restarts: 1 },
  { t_ms: 8500, event: "not_parked", tokens: 10, bytes: 0, error: "over the budget" },
  { t_ms: 9000, event: "sim_fault", device: 1, leave_free_mib: 40 },
  { t_ms: 9500, event: "request_done", job: 1, prompt_tokens: 10, completion_tokens: 5, reasoning_tokens: 0, reused: 0, read: 10, kept_reply_tokens: 0, prompt_ms: 1, gen_ms: 50, prompt_tok_s: 1, gen_tok_s: 100, queue_ms: 0, drafts_accepted: 0, drafts_proposed: 0, restored: null, restored_tokens: null, fallback: null },
];

function samples(): TelemetryEntry[] {
  const out: TelemetryEntry[] = [];
  for (let t = 0; t <= 10_000; t += 500) {
    out.push({ t_ms: t, device: 0, free_bytes: (150 - t / 200) * MIB, total_bytes: 200 * MIB });
    out.push({ t_ms: t, device: 1, free_bytes: 300 * MIB, total_bytes: 400 * MIB });
  }
  return out;
}

function setup() {
  const t = new FakeTransport();
  t.devices.mockResolvedValue({
    devices: [
      device(),
      device({ index: 1, name: "sim:400", total_bytes: 400 * MIB, reserve_bytes: 32 * MIB }),
      device({ index: 2, name: "cpu", kind: "cpu", host: true, free_bytes: 12 * 1024 * MIB, total_bytes: 32 * 1024 * MIB, reserve_bytes: 0 }),
    ],
  });
  const all = samples();
  t.telemetry.mockResolvedValue({
    now_ms: 10_000,
    samples: all.filter((e) => !("event" in e)) as never,
    events: EVENTS,
  });
  let live: (e: TelemetryEntry) => void = () => {};
  t.onTelemetry.mockImplementation((f) => {
    live = f;
    return () => {};
  });
  const store = new TelemetryStore();
  const stop = store.start(t);
  render(<DevicePanel transport={t} store={store} refreshMs={60_000} />);
  return { t, store, stop, push: (e: TelemetryEntry) => act(() => live(e)) };
}

describe("DevicePanel", () => {
  it("draws a marker per marker event, one look per kind, and none for request_done", async () => {
    setup();
    await waitFor(() => expect(screen.getAllByTestId("marker")).toHaveLength(10));
    const markers = screen.getAllByTestId("marker");
    expect(markers.map((m) => m.getAttribute("data-kind"))).toEqual([
      "parked", "restored", "restored", "restore_fallback", "evicted", "oom_averted", "sample_failed", "engine_restarted", "not_parked", "sim_fault",
    ]);
    const variants = markers.map((m) => m.getAttribute("data-variant"));
    expect(variants).toContain("restored-live");
    expect(variants).toContain("restored-checkpoint");
    expect(new Set(markers.map((m) => m.querySelector(".marker-glyph")?.textContent)).size).toBeGreaterThanOrEqual(9);
    // Placed on the chart's time scale: x runs from 0 s to 10 s over the plot's width.
    const fb = markers.find((m) => m.getAttribute("data-kind") === "restore_fallback")!;
    expect(fb.style.left).toBe(`${(4 / 10) * PLOT_WIDTH_PX}px`);
  });

  it("shows an event's figures in the tooltip while a marker is hovered or focused", async () => {
    setup();
    await waitFor(() => expect(screen.getAllByTestId("marker").length).toBeGreaterThan(0));
    const fb = screen.getAllByTestId("marker").find((m) => m.getAttribute("data-kind") === "restore_fallback")!;
    expect(screen.queryByTestId("marker-tooltip")).toBeNull();
    fireEvent.mouseEnter(fb);
    const tip = await screen.findByTestId("marker-tooltip");
    expect(tip.textContent).toContain("restore fallback");
    expect(tip.textContent).toContain("device 1: free 40 MiB, need 120 MiB, reserve 64 MiB, 812 tokens");
    fireEvent.mouseLeave(fb);
    await waitFor(() => expect(screen.queryByTestId("marker-tooltip")).toBeNull());
    const ckpt = screen.getAllByTestId("marker").find((m) => m.getAttribute("data-variant") === "restored-checkpoint")!;
    fireEvent.focus(ckpt);
    expect((await screen.findByTestId("marker-tooltip")).textContent).toContain("restored (checkpoint)");
    expect(screen.getByTestId("marker-tooltip").textContent).toContain("checkpoint, 512 tokens");
  });

  it("charts free MiB per accelerator with a dashed reserve line each, not the host", async () => {
    setup();
    await waitFor(() => expect(screen.getAllByTestId("marker").length).toBeGreaterThan(0));
    const u = FakeUPlot.instances.at(-1)!;
    const labels = u.opts.series.map((s) => s.label);
    expect(labels).toEqual(["t (s)", "sim:200 free (MiB)", "sim:400 free (MiB)", "sim:200 reserve", "sim:400 reserve"]);
    expect(u.opts.series[3]!.dash).toEqual([6, 4]);
    const [xs, free0, , reserve0, reserve1] = u.data as number[][];
    expect(xs![0]).toBe(0);
    expect(xs!.at(-1)).toBe(10);
    expect(free0![0]).toBe(150);
    expect(reserve0!.every((v) => v === 64)).toBe(true);
    expect(reserve1!.every((v) => v === 32)).toBe(true);
  });

  it("adds live entries after the seed", async () => {
    const { push } = setup();
    await waitFor(() => expect(screen.getAllByTestId("marker")).toHaveLength(10));
    push({ t_ms: 10_500, device: 0, free_bytes: 90 * MIB, total_bytes: 200 * MIB });
    push({ t_ms: 10_500, event: "evicted", tokens: 1, bytes: MIB });
    await waitFor(() => expect(screen.getAllByTestId("marker")).toHaveLength(11));
    const u = FakeUPlot.instances.at(-1)!;
    expect((u.data[0] as number[]).at(-1)).toBe(10.5);
  });

  it("lists recent events newest first, host RAM and the cache", async () => {
    setup();
    const table = await screen.findByTestId("events-table");
    const rows = table.querySelectorAll("tbody tr");
    expect(rows[0]?.getAttribute("data-kind")).toBe("request_done");
    expect(rows[0]?.textContent).toContain("9.5 s");
    expect(table.textContent).toContain("device 1: free 40 MiB, need 120 MiB, reserve 64 MiB, 812 tokens");
    const host = await screen.findByTestId("host-card");
    expect(host.textContent).toContain("Host RAM");
    expect(host.textContent).toContain("12.00 GiB of 32.00 GiB");
    const cache = screen.getByTestId("cache-panel");
    expect(cache.textContent).toContain("1 of 4 used");
    expect(cache.textContent).toContain("12.0 MiB of 4.00 GiB");
    expect(cache.textContent).toContain("Evictions2");
  });

  it("says there is no device data for a remote engine that is not Strata", async () => {
    const t = new FakeTransport();
    t.devices.mockResolvedValue(null);
    t.cache.mockResolvedValue(null);
    t.telemetry.mockResolvedValue(null);
    const store = new TelemetryStore();
    store.start(t);
    render(<DevicePanel transport={t} store={store} />);
    expect((await screen.findByTestId("no-device-data")).textContent).toContain("No device data");
    expect(screen.queryByTestId("memory-chart")).toBeNull();
  });
});

describe("xRange", () => {
  it("widens the samples' range to take in the window's events", async () => {
    const { TelemetryWindow } = await import("../src/telemetry/window");
    const { xRange } = await import("../src/views/devices/MemoryChart");
    const w = new TelemetryWindow();
    expect(xRange(w, null, null)).toEqual([0, 1]);
    expect(xRange(w, 2, 2)).toEqual([1, 3]);
    w.push({ t_ms: 1000, device: 0, free_bytes: 1, total_bytes: 2 });
    w.push({ t_ms: 500, event: "evicted", tokens: 1, bytes: 1 });
    w.push({ t_ms: 4000, event: "evicted", tokens: 1, bytes: 1 });
    expect(xRange(w, 1, 3)).toEqual([0.5, 4]);
  });
});
