// The memory chart renders only when what it shows changes: uPlot's draw hook places the markers, and a
// draw that moves nothing (no new data, the same box) must not render the chart again; new data does.
import { act, render, screen } from "@testing-library/preact";
import { describe, expect, it, vi } from "vitest";
import type { TelemetryEntry } from "../src/bindings";
import { TelemetryWindow } from "../src/telemetry/window";
import { device, MIB } from "./fakes";
import { FakeUPlot } from "./fakeUplot";

const layerRenders = vi.hoisted(() => ({ count: 0 }));
vi.mock("../src/views/devices/MarkerLayer", async (importOriginal) => {
  const real = await importOriginal<typeof import("../src/views/devices/MarkerLayer")>();
  return {
    ...real,
    MarkerLayer: (props: Parameters<typeof real.MarkerLayer>[0]) => {
      layerRenders.count++;
      return real.MarkerLayer(props);
    },
  };
});

const { MemoryChart } = await import("../src/views/devices/MemoryChart");

function windowWith(entries: TelemetryEntry[]): TelemetryWindow {
  const w = new TelemetryWindow();
  w.pushAll(entries);
  return w;
}

describe("MemoryChart", () => {
  it("does not render again for a draw that changes nothing, and does for new data", () => {
    const entries: TelemetryEntry[] = [];
    for (let t = 0; t <= 4000; t += 500) entries.push({ t_ms: t, device: 0, free_bytes: 100 * MIB, total_bytes: 200 * MIB });
    entries.push({ t_ms: 2000, event: "evicted", tokens: 3, bytes: MIB });
    const win = windowWith(entries);
    const devices = [device()];
    const { rerender } = render(<MemoryChart win={win} version={win.version} devices={devices} />);
    const u = FakeUPlot.instances.at(-1)!;
    expect(screen.getAllByTestId("marker")).toHaveLength(1);
    const before = layerRenders.count;
    const draw = () => {
      for (const h of u.opts.hooks?.draw ?? []) (h as (p: unknown) => void)(u);
    };
    act(() => {
      for (let i = 0; i < 20; i++) draw();
    });
    expect(layerRenders.count).toBe(before);

    act(() => {
      win.push({ t_ms: 4500, device: 0, free_bytes: 90 * MIB, total_bytes: 200 * MIB });
      win.push({ t_ms: 4500, event: "evicted", tokens: 1, bytes: MIB });
    });
    rerender(<MemoryChart win={win} version={win.version} devices={devices} />);
    expect(screen.getAllByTestId("marker")).toHaveLength(2);
    expect(layerRenders.count).toBeGreaterThan(before);
  });
});
