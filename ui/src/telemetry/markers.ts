// How engine events appear on the device chart and in the events table: which kinds get a marker, the
// marker's glyph and line style per kind (restored live and restored from a checkpoint differ), the
// figures of each event as one line of text, and where markers fall on the plot. Pure.
import type { TelemetryEvent } from "../bindings";

/** Event kinds drawn as markers on the chart. */
export const MARKER_KINDS = [
  "parked",
  "restored",
  "restore_fallback",
  "evicted",
  "oom_averted",
  "sample_failed",
  "engine_restarted",
  "not_parked",
  "sim_fault",
] as const;

export type MarkerKind = (typeof MARKER_KINDS)[number];

/** A marker's look: `variant` is the kind, or restored-live / restored-checkpoint. */
export interface MarkerStyle {
  variant: string;
  glyph: string;
  label: string;
  line: "solid" | "dashed" | "dotted";
}

const STYLES: Record<string, Omit<MarkerStyle, "variant">> = {
  parked: { glyph: "▼", label: "parked", line: "dotted" },
  "restored-live": { glyph: "●", label: "restored (live)", line: "solid" },
  "restored-checkpoint": { glyph: "◆", label: "restored (checkpoint)", line: "dashed" },
  restore_fallback: { glyph: "▲", label: "restore fallback", line: "dashed" },
  evicted: { glyph: "✕", label: "evicted", line: "dotted" },
  oom_averted: { glyph: "!", label: "OOM averted", line: "solid" },
  sample_failed: { glyph: "?", label: "sample failed", line: "dotted" },
  engine_restarted: { glyph: "⟳", label: "engine restarted", line: "solid" },
  not_parked: { glyph: "○", label: "not parked", line: "dotted" },
  sim_fault: { glyph: "⚡", label: "sim fault", line: "dashed" },
};

export function isMarkerEvent(e: TelemetryEvent): boolean {
  return (MARKER_KINDS as readonly string[]).includes(e.event);
}

export function markerStyle(e: TelemetryEvent): MarkerStyle {
  const variant = e.event === "restored" ? `restored-${e.kind}` : e.event;
  const s = STYLES[variant] ?? { glyph: "•", label: e.event.replace(/_/g, " "), line: "dotted" as const };
  return { variant, ...s };
}

function mibOf(bytes: number): string {
  return `${(bytes / (1024 * 1024)).toFixed(1)} MiB`;
}

/** The event's figures as one line, e.g. "device 1: free 40 MiB, need 120 MiB, reserve 64 MiB, 812 tokens". */
export function eventFigures(e: TelemetryEvent): string {
  switch (e.event) {
    case "model_loaded":
      return `${e.model}, context ${e.max_context}`;
    case "parked":
      return `${e.tokens} tokens, snapshot ${mibOf(e.snapshot_bytes)} in ${Math.round(e.ms)} ms; ${e.parked} parked, ${mibOf(e.bytes)}, ${e.evictions} evictions`;
    case "not_parked":
      return `${e.tokens} tokens, ${mibOf(e.bytes)}${e.error ? `: ${e.error}` : ""}`;
    case "evicted":
      return `${e.tokens} tokens, ${mibOf(e.bytes)}`;
    case "restored":
      return `${e.kind}, ${e.tokens} tokens, ${mibOf(e.restored_bytes)} in ${Math.round(e.ms)} ms; ${e.parked} parked, ${mibOf(e.bytes)}`;
    case "restore_fallback":
      return `device ${e.device}: free ${e.free_mib} MiB, need ${e.need_mib} MiB, reserve ${e.reserve_mib} MiB, ${e.tokens} tokens`;
    case "sample_failed":
      return `device ${e.device}, ${e.count} failed`;
    case "oom_averted":
      return `${e.tokens} tokens: ${e.error}`;
    case "request_done":
      return `${e.prompt_tokens} prompt tokens (${e.reused} reused, ${e.read} read), ${e.completion_tokens} generated at ${e.gen_tok_s.toFixed(1)} tok/s`;
    case "sim_fault": {
      const parts: string[] = [];
      if (e.pressure_mib !== null && e.pressure_mib !== undefined) parts.push(`pressure ${e.pressure_mib} MiB`);
      if (e.leave_free_mib !== null && e.leave_free_mib !== undefined) parts.push(`leave free ${e.leave_free_mib} MiB`);
      if (e.fail_samples !== null && e.fail_samples !== undefined) parts.push(`fail ${e.fail_samples} samples`);
      if (e.fail_alloc !== null && e.fail_alloc !== undefined) parts.push(`fail ${e.fail_alloc} allocations`);
      return `device ${e.device}: ${parts.join(", ") || "fault"}`;
    }
    case "engine_restarted":
      return `${e.reason} (restart ${e.restarts})`;
    default: {
      const { t_ms: _t, event: _k, ...rest } = e as Record<string, unknown>;
      return JSON.stringify(rest);
    }
  }
}

export interface PlacedMarker {
  event: TelemetryEvent;
  style: MarkerStyle;
  /** Pixels from the plot area's left edge: the event's time. */
  leftPx: number;
  /** Where the marker is drawn: its time, moved right past a marker drawn closer than MARKER_GAP_PX before it
   * (a park and a restore in the same millisecond stay two markers a mouse can reach). */
  drawnPx: number;
}

/** The least distance between two drawn markers: a marker's width. */
export const MARKER_GAP_PX = 12;

/**
 * The markers inside the plot: `toPx` maps seconds to pixels (uPlot's valToPos on the x scale); those
 * outside [0, widthPx] are left out.
 */
export function placeMarkers(
  events: readonly TelemetryEvent[],
  toPx: (seconds: number) => number,
  widthPx: number,
): PlacedMarker[] {
  const out: PlacedMarker[] = [];
  for (const event of events) {
    if (!isMarkerEvent(event)) continue;
    const leftPx = toPx(event.t_ms / 1000);
    if (!Number.isFinite(leftPx) || leftPx < -0.5 || leftPx > widthPx + 0.5) continue;
    out.push({ event, style: markerStyle(event), leftPx, drawnPx: leftPx });
  }
  out.sort((a, b) => a.leftPx - b.leftPx);
  let prev: PlacedMarker | undefined;
  for (const m of out) {
    if (prev) m.drawnPx = Math.max(m.leftPx, prev.drawnPx + MARKER_GAP_PX);
    prev = m;
  }
  // A cluster pushed past the right edge moves back left as a whole.
  let limit = widthPx;
  for (const m of [...out].reverse()) {
    if (m.drawnPx <= limit) break;
    m.drawnPx = Math.max(0, limit);
    limit -= MARKER_GAP_PX;
  }
  return out;
}
