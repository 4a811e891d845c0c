// Keeps the app's one TelemetryWindow fed from a transport for as long as the app runs (not only while the
// device panel is shown): it subscribes to the live stream first, seeds from telemetry(since 0), then
// applies what arrived meanwhile (the window drops duplicates). Listeners are told after each change,
// at most once per animation frame.
import type { TelemetryEntry } from "../bindings";
import type { Transport, Unsubscribe } from "../transport/types";
import { TelemetryWindow, type WindowOptions } from "./window";

export type StoreState = "idle" | "seeding" | "live" | "no_data" | "error";

export class TelemetryStore {
  readonly window: TelemetryWindow;
  state: StoreState = "idle";
  error: string | null = null;
  private listeners = new Set<() => void>();
  private scheduled = false;

  constructor(opts: WindowOptions = {}) {
    this.window = new TelemetryWindow(opts);
  }

  /** Calls `f` after changes; returns the way to stop. */
  subscribe(f: () => void): Unsubscribe {
    this.listeners.add(f);
    return () => this.listeners.delete(f);
  }

  /** Starts following the transport; the returned function stops it. */
  start(transport: Transport): Unsubscribe {
    let buffered: TelemetryEntry[] | null = [];
    const stop = transport.onTelemetry((e) => {
      if (buffered) buffered.push(e);
      else {
        this.window.push(e);
        this.changed();
      }
    });
    this.state = "seeding";
    this.changed();
    transport
      .telemetry(0)
      .then((view) => {
        if (view === null) {
          this.state = "no_data";
        } else {
          this.window.seed(view);
          this.state = "live";
        }
      })
      .catch((e: unknown) => {
        this.state = "error";
        this.error = e instanceof Error ? e.message : String(e);
      })
      .finally(() => {
        const pending = buffered ?? [];
        buffered = null;
        this.window.pushAll(pending);
        this.changed();
      });
    return () => {
      stop();
      buffered = null;
    };
  }

  private changed(): void {
    if (this.scheduled) return;
    this.scheduled = true;
    const run = () => {
      this.scheduled = false;
      for (const f of [...this.listeners]) f();
    };
    if (typeof requestAnimationFrame === "function" && typeof document !== "undefined" && !document.hidden) {
      requestAnimationFrame(run);
    } else {
      setTimeout(run, 0);
    }
  }
}
