// The bounded telemetry window: a fixed amount held however long it runs, older events counted per kind.
import { describe, expect, it } from "vitest";
import type { DeviceSample, TelemetryEvent } from "../src/bindings";
import { DEFAULT_WINDOW_MS, TelemetryWindow } from "../src/telemetry/window";

const MIB = 1024 * 1024;

function sample(t_ms: number, device = 0, freeMib: number | null = 100): DeviceSample {
  return { t_ms, device, free_bytes: freeMib === null ? null : freeMib * MIB, total_bytes: 200 * MIB };
}

function parked(t_ms: number): TelemetryEvent {
  return { t_ms, event: "parked", tokens: 10, ms: 1, snapshot_bytes: MIB, parked: 1, bytes: MIB, evictions: 0 };
}

function evicted(t_ms: number): TelemetryEvent {
  return { t_ms, event: "evicted", tokens: 10, bytes: MIB };
}

describe("TelemetryWindow", () => {
  it("keeps 30 minutes by default", () => {
    expect(new TelemetryWindow().windowMs).toBe(DEFAULT_WINDOW_MS);
    expect(DEFAULT_WINDOW_MS).toBe(30 * 60 * 1000);
  });

  it("stays bounded over days of samples and events, and counts the events that left", () => {
    const w = new TelemetryWindow({ windowMs: 60_000 });
    // Three days of two devices sampled twice a second, an event every 10 s alternating kinds.
    const days = 3;
    const end = days * 24 * 3600 * 1000;
    let events = 0;
    for (let t = 0; t <= end; t += 500) {
      w.push(sample(t, 0));
      w.push(sample(t + 1, 1));
      if (t % 10_000 === 0) {
        w.push(events % 2 === 0 ? parked(t) : evicted(t));
        events++;
      }
    }
    // One minute of samples: 121 per device at most.
    expect(w.samplesOf(0).length).toBeLessThanOrEqual(121);
    expect(w.samplesOf(1).length).toBeLessThanOrEqual(121);
    expect(w.samplesOf(0)[0]!.t_ms).toBeGreaterThanOrEqual(end - 60_000);
    expect(w.events.length).toBeLessThanOrEqual(7);
    expect(w.size()).toBeLessThan(260);
    const older = w.olderCounts;
    expect((older.parked ?? 0) + (older.evicted ?? 0) + w.events.length).toBe(events);
    expect(older.parked).toBeGreaterThan(0);
    expect(older.evicted).toBeGreaterThan(0);
  });

  it("caps counts even when everything is within the window", () => {
    const w = new TelemetryWindow({ maxSamplesPerDevice: 50, maxEvents: 10 });
    for (let t = 0; t < 1000; t++) {
      w.push(sample(t));
      w.push(parked(t + 0.5));
    }
    expect(w.samplesOf(0).length).toBe(50);
    expect(w.events.length).toBe(10);
    expect(w.olderCounts.parked).toBe(990);
  });

  it("drops duplicates from a seed that overlaps the live stream, and keeps events in time order", () => {
    const w = new TelemetryWindow();
    w.push(sample(2000));
    w.push(parked(2000));
    w.seed({ now_ms: 2000, samples: [sample(1000), sample(2000)], events: [evicted(1500), parked(2000)] });
    expect(w.samplesOf(0).map((s) => s.t_ms)).toEqual([2000]);
    expect(w.events.map((e) => [e.t_ms, e.event])).toEqual([
      [1500, "evicted"],
      [2000, "parked"],
    ]);
  });

  it("counts an event that arrives already older than the window", () => {
    const w = new TelemetryWindow({ windowMs: 1000 });
    w.push(sample(10_000));
    w.push(parked(100));
    expect(w.events).toHaveLength(0);
    expect(w.olderCounts.parked).toBe(1);
  });

  it("makes aligned chart columns in seconds and MiB, null where a device has no sample", () => {
    const w = new TelemetryWindow();
    w.pushAll([sample(1000, 0, 100), sample(1500, 1, 300), sample(2000, 0, 90), sample(2000, 1, null)]);
    expect(w.columns([0, 1])).toEqual([
      [1, 1.5, 2],
      [100, null, 90],
      [null, 300, null],
    ]);
  });
});
