// Event markers over the chart's plot area, as DOM elements (uPlot draws on a canvas): a vertical line and
// a glyph per event, styled per kind, each focusable; hovering or focusing one shows its figures in
// [data-testid=marker-tooltip].
import { useState } from "preact/hooks";
import { eventFigures, type PlacedMarker } from "../../telemetry/markers";

export interface PlotBox {
  left: number;
  top: number;
  width: number;
  height: number;
}

export function MarkerLayer({ markers, box }: { markers: PlacedMarker[]; box: PlotBox }) {
  const [active, setActive] = useState<number | null>(null);
  const shown = active === null ? null : (markers[active] ?? null);
  return (
    <div
      class="marker-layer"
      data-testid="marker-layer"
      style={{ left: `${box.left}px`, top: `${box.top}px`, width: `${box.width}px`, height: `${box.height}px` }}
    >
      {markers.map((m, i) => {
        const figures = eventFigures(m.event);
        return (
          <button
            type="button"
            key={`${m.event.t_ms}-${m.event.event}-${i}`}
            class={`marker marker-${m.style.variant} line-${m.style.line}`}
            data-testid="marker"
            data-kind={m.event.event}
            data-variant={m.style.variant}
            style={{ left: `${m.drawnPx}px` }}
            aria-label={`${m.style.label} at ${(m.event.t_ms / 1000).toFixed(1)} s: ${figures}`}
            onMouseEnter={() => setActive(i)}
            onMouseLeave={() => setActive((a) => (a === i ? null : a))}
            onFocus={() => setActive(i)}
            onBlur={() => setActive((a) => (a === i ? null : a))}
          >
            <span class="marker-glyph" aria-hidden="true">
              {m.style.glyph}
            </span>
          </button>
        );
      })}
      {shown && (
        <div
          class={`marker-tooltip${shown.drawnPx > box.width / 2 ? " flip" : ""}`}
          role="tooltip"
          data-testid="marker-tooltip"
          style={{ left: `${shown.drawnPx}px` }}
        >
          <strong>{shown.style.label}</strong>
          <span class="muted"> at {(shown.event.t_ms / 1000).toFixed(1)} s</span>
          <div>{eventFigures(shown.event)}</div>
        </div>
      )}
    </div>
  );
}
