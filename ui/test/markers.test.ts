// Markers: which events get one, a distinct look per kind, figures per kind, placement inside the plot.
import { describe, expect, it } from "vitest";
import type { TelemetryEvent } from "../src/bindings";
import { eventFigures, MARKER_GAP_PX, markerStyle, MARKER_KINDS, placeMarkers } from "../src/telemetry/markers";

const fallback: TelemetryEvent = { t_ms: 5000, event: "restore_fallback", device: 1, free_mib: 40, need_mib: 120, reserve_mib: 64, tokens: 812 };

describe("markers", () => {
  it("gives every marker kind its own look, and live and checkpoint restores different ones", () => {
    const live = markerStyle({ t_ms: 0, event: "restored", kind: "live", tokens: 1, ms: 1, restored_bytes: 1, parked: 0, bytes: 0 });
    const ckpt = markerStyle({ t_ms: 0, event: "restored", kind: "checkpoint", tokens: 1, ms: 1, restored_bytes: 1, parked: 0, bytes: 0 });
    expect(live.variant).toBe("restored-live");
    expect(ckpt.variant).toBe("restored-checkpoint");
    expect(live.glyph).not.toBe(ckpt.glyph);
    expect(MARKER_KINDS).toEqual(
      expect.arrayContaining(["parked", "restored", "restore_fallback", "evicted", "oom_averted", "sample_failed", "engine_restarted"]),
    );
  });

  it("writes a restore fallback's figures", () => {
    expect(eventFigures(fallback)).toBe("device 1: free 40 MiB, need 120 MiB, reserve 64 MiB, 812 tokens");
  });

  it("writes figures of an event kind it does not know as its fields", () => {
    const odd = { t_ms: 1, event: "something_new", x: 3 } as unknown as TelemetryEvent;
    expect(eventFigures(odd)).toBe('{"x":3}');
  });

  it("places markers with the scale given and leaves out those outside the plot and non-marker events", () => {
    const events: TelemetryEvent[] = [
      { ...fallback, t_ms: 1000 },
      { t_ms: 2000, event: "request_done", ...({} as object) } as TelemetryEvent,
      { t_ms: 3000, event: "evicted", tokens: 1, bytes: 1 },
      { t_ms: 9000, event: "evicted", tokens: 1, bytes: 1 },
    ];
    const placed = placeMarkers(events, (s) => (s - 1) * 100, 300);
    expect(placed.map((p) => [p.event.event, p.leftPx])).toEqual([
      ["restore_fallback", 0],
      ["evicted", 200],
    ]);
  });

  it("draws markers of the same instant side by side, each reachable, and keeps them on the plot", () => {
    const at = (t_ms: number, event: "parked" | "evicted"): TelemetryEvent => ({ t_ms, event, tokens: 1, bytes: 1 }) as TelemetryEvent;
    const events = [at(1000, "parked"), { ...fallback, t_ms: 1000 }, at(1000, "evicted"), at(3000, "evicted")];
    const placed = placeMarkers(events, (s) => (s - 1) * 100, 300);
    expect(placed.map((p) => p.leftPx)).toEqual([0, 0, 0, 200]);
    expect(placed.map((p) => p.drawnPx)).toEqual([0, MARKER_GAP_PX, 2 * MARKER_GAP_PX, 200]);
    // At the right edge the cluster moves back inside.
    const edge = placeMarkers([at(4000, "parked"), at(4000, "evicted")], (s) => (s - 1) * 100, 300);
    expect(edge.map((p) => p.drawnPx)).toEqual([300 - MARKER_GAP_PX, 300]);
  });
});
