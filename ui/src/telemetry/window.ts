// The bounded window of telemetry the device panel shows: free-memory samples per device and engine
// events, kept for `windowMs` (30 minutes by default) behind the newest entry seen, and capped in count,
// so that an app left open for days holds the same amount as one open for an hour. Events that leave the
// window are not forgotten entirely: they are counted per kind (`olderCounts`). Times are the engine's
// clock (t_ms). Pure: no timers, no DOM; the store (store.ts) feeds it.
import type { DeviceSample, TelemetryEntry, TelemetryEvent, TelemetryView } from "../bindings";

export const DEFAULT_WINDOW_MS = 30 * 60 * 1000;

export interface WindowOptions {
  windowMs?: number;
  /** Most samples kept per device, whatever their times (a guard against a flood). */
  maxSamplesPerDevice?: number;
  /** Most events kept in the window; older ones beyond it are counted as if they had left it. */
  maxEvents?: number;
}

export function isEvent(e: TelemetryEntry): e is TelemetryEvent {
  return typeof (e as { event?: unknown }).event === "string";
}

/** uPlot's columns: x in seconds, then one series per device (free MiB; null where it has no sample). */
export type Columns = [number[], ...(number | null)[][]];

export class TelemetryWindow {
  readonly windowMs: number;
  readonly maxSamplesPerDevice: number;
  readonly maxEvents: number;
  private readonly samples = new Map<number, DeviceSample[]>();
  private evs: TelemetryEvent[] = [];
  private readonly eventKeys = new Set<string>();
  private readonly older: Record<string, number> = {};
  private newestMs = -Infinity;
  /** Bumped by every change, for views to notice. */
  version = 0;

  constructor(opts: WindowOptions = {}) {
    this.windowMs = opts.windowMs ?? DEFAULT_WINDOW_MS;
    this.maxSamplesPerDevice = opts.maxSamplesPerDevice ?? 20_000;
    this.maxEvents = opts.maxEvents ?? 2_000;
  }

  /** The newest time seen (engine clock, ms); -Infinity before any entry. */
  get latestMs(): number {
    return this.newestMs;
  }

  /** Where the window starts now. */
  get startMs(): number {
    return this.newestMs - this.windowMs;
  }

  /** The events in the window, oldest first. */
  get events(): readonly TelemetryEvent[] {
    return this.evs;
  }

  /** Events that left the window, counted per kind. */
  get olderCounts(): Readonly<Record<string, number>> {
    return this.older;
  }

  /** Devices that have samples, in index order. */
  devices(): number[] {
    return [...this.samples.keys()].sort((a, b) => a - b);
  }

  samplesOf(device: number): readonly DeviceSample[] {
    return this.samples.get(device) ?? [];
  }

  /** Samples and events held, all devices together. */
  size(): number {
    let n = this.evs.length;
    for (const s of this.samples.values()) n += s.length;
    return n;
  }

  /** Takes a sample or an event. A sample not newer than its device's last one is a duplicate: dropped. */
  push(entry: TelemetryEntry): void {
    if (!Number.isFinite(entry.t_ms)) return;
    if (isEvent(entry)) this.pushEvent(entry);
    else this.pushSample(entry);
    if (entry.t_ms > this.newestMs) this.newestMs = entry.t_ms;
    this.trim();
    this.version++;
  }

  pushAll(entries: Iterable<TelemetryEntry>): void {
    for (const e of entries) this.push(e);
  }

  /** Takes a telemetry() reply: its samples and events merged by time. */
  seed(view: TelemetryView): void {
    const all: TelemetryEntry[] = [...view.samples, ...view.events];
    all.sort((a, b) => a.t_ms - b.t_ms);
    this.pushAll(all);
  }

  /** The chart's data for these devices: the union of their sample times, each device null where absent. */
  columns(devices: readonly number[]): Columns {
    const lists = devices.map((d) => this.samples.get(d) ?? []);
    const pos = lists.map(() => 0);
    const xs: number[] = [];
    const ys: (number | null)[][] = lists.map(() => []);
    for (;;) {
      let t = Infinity;
      for (let i = 0; i < lists.length; i++) {
        const s = lists[i]![pos[i]!];
        if (s && s.t_ms < t) t = s.t_ms;
      }
      if (t === Infinity) break;
      xs.push(t / 1000);
      for (let i = 0; i < lists.length; i++) {
        const s = lists[i]![pos[i]!];
        if (s && s.t_ms === t) {
          ys[i]!.push(s.free_bytes === null ? null : s.free_bytes / (1024 * 1024));
          pos[i]!++;
        } else {
          ys[i]!.push(null);
        }
      }
    }
    return [xs, ...ys];
  }

  private pushSample(s: DeviceSample): void {
    let list = this.samples.get(s.device);
    if (!list) {
      list = [];
      this.samples.set(s.device, list);
    }
    const last = list[list.length - 1];
    if (last && s.t_ms <= last.t_ms) return;
    list.push(s);
  }

  private pushEvent(e: TelemetryEvent): void {
    if (e.t_ms < this.startMs) {
      this.count(e.event);
      return;
    }
    const key = `${e.t_ms}|${e.event}`;
    if (this.eventKeys.has(key)) return;
    this.eventKeys.add(key);
    const last = this.evs[this.evs.length - 1];
    if (!last || e.t_ms >= last.t_ms) {
      this.evs.push(e);
      return;
    }
    // Late (a seed after live entries): keep the list in time order.
    let i = this.evs.length;
    while (i > 0 && this.evs[i - 1]!.t_ms > e.t_ms) i--;
    this.evs.splice(i, 0, e);
  }

  private trim(): void {
    const start = this.startMs;
    for (const list of this.samples.values()) {
      let k = 0;
      while (k < list.length && list[k]!.t_ms < start) k++;
      k = Math.max(k, list.length - this.maxSamplesPerDevice);
      if (k > 0) list.splice(0, k);
    }
    let k = 0;
    while (k < this.evs.length && this.evs[k]!.t_ms < start) k++;
    k = Math.max(k, this.evs.length - this.maxEvents);
    if (k > 0) {
      for (const e of this.evs.slice(0, k)) {
        this.count(e.event);
        this.eventKeys.delete(`${e.t_ms}|${e.event}`);
      }
      this.evs.splice(0, k);
    }
  }

  private count(kind: string): void {
    this.older[kind] = (this.older[kind] ?? 0) + 1;
  }
}
