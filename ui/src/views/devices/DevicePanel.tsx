// The device panel: the live memory chart with event markers, each device's and the host's memory, the
// conversation cache, and the recent events. Devices and the cache are re-read every few seconds (and
// after cache events); samples and events come from the app's TelemetryStore. A remote engine that is not
// Strata has no device data, and the panel says so.
import { useEffect, useState } from "preact/hooks";
import type { CacheView, DevicesView } from "../../bindings";
import type { TelemetryStore } from "../../telemetry/store";
import type { Transport } from "../../transport/types";
import { messageOf } from "../../util/errors";
import { CachePanel } from "./CachePanel";
import { DeviceCard } from "./DeviceCards";
import { EventsTable } from "./EventsTable";
import { MemoryChart } from "./MemoryChart";

/** Re-renders on every change of the store; returns the window's version. */
export function useStoreVersion(store: TelemetryStore): number {
  const [version, setVersion] = useState(store.window.version);
  useEffect(() => {
    setVersion(store.window.version);
    return store.subscribe(() => setVersion(store.window.version));
  }, [store]);
  return version;
}

export interface DevicePanelProps {
  transport: Transport;
  store: TelemetryStore;
  refreshMs?: number;
}

export function DevicePanel({ transport, store, refreshMs = 3000 }: DevicePanelProps) {
  const version = useStoreVersion(store);
  const [devs, setDevs] = useState<DevicesView | null | undefined>(undefined);
  const [cache, setCache] = useState<CacheView | null>(null);
  const [error, setError] = useState<string | null>(null);

  useEffect(() => {
    let stopped = false;
    const read = async () => {
      try {
        const [d, c] = await Promise.all([transport.devices(), transport.cache()]);
        if (stopped) return;
        setDevs(d);
        setCache(c);
        setError(null);
      } catch (e) {
        if (!stopped) setError(messageOf(e));
      }
    };
    void read();
    const timer = setInterval(() => void read(), refreshMs);
    return () => {
      stopped = true;
      clearInterval(timer);
    };
  }, [transport, refreshMs]);

  if (devs === null || store.state === "no_data") {
    return (
      <div class="devices">
        <p class="note" data-testid="no-device-data">
          No device data: the engine is a remote OpenAI-compatible server that is not Strata, so it reports no devices,
          memory or cache events.
        </p>
      </div>
    );
  }
  const win = store.window;
  const list = devs?.devices ?? [];
  const hosts = list.filter((d) => d.host);
  const gpus = list.filter((d) => !d.host);
  return (
    <div class="devices">
      {error && (
        <p class="error" role="alert">
          {error}
        </p>
      )}
      {store.state === "error" && store.error && (
        <p class="error" role="alert">
          Telemetry: {store.error}
        </p>
      )}
      <section class="card" aria-labelledby="chart-heading">
        <h3 id="chart-heading">
          Free memory <span class="muted">(last {Math.round(win.windowMs / 60000)} min; dashed: reserve)</span>
        </h3>
        <MemoryChart win={win} version={version} devices={list} />
      </section>
      <div class="card-grid">
        {gpus.map((d) => (
          <DeviceCard key={d.index} d={d} />
        ))}
        {hosts.map((d) => (
          <DeviceCard key={d.index} d={d} />
        ))}
        {cache && <CachePanel cache={cache} />}
      </div>
      <EventsTable events={win.events} olderCounts={win.olderCounts} windowMs={win.windowMs} />
    </div>
  );
}
