// The recent engine events, newest first (time, kind, figures), and the events older than the window,
// counted per kind.
import type { TelemetryEvent } from "../../bindings";
import { eventFigures, markerStyle } from "../../telemetry/markers";

export function EventsTable({
  events,
  olderCounts,
  windowMs,
  limit = 100,
}: {
  events: readonly TelemetryEvent[];
  olderCounts: Readonly<Record<string, number>>;
  windowMs: number;
  limit?: number;
}) {
  const recent = events.slice(-limit).reverse();
  const older = Object.entries(olderCounts).filter(([, n]) => n > 0);
  return (
    <section class="card" aria-labelledby="events-heading">
      <h3 id="events-heading">Recent events</h3>
      {older.length > 0 && (
        <p class="muted" data-testid="older-counts">
          Older than {Math.round(windowMs / 60000)} min:{" "}
          {older.map(([k, n]) => `${k.replace(/_/g, " ")} ${n}`).join(", ")}
        </p>
      )}
      {recent.length === 0 ? (
        <p class="muted">No events yet.</p>
      ) : (
        <div class="table-scroll events-scroll">
          <table class="events-table" data-testid="events-table">
            <thead>
              <tr>
                <th scope="col">Time</th>
                <th scope="col">Kind</th>
                <th scope="col">Figures</th>
              </tr>
            </thead>
            <tbody>
              {recent.map((e, i) => {
                const s = markerStyle(e);
                return (
                  <tr key={`${e.t_ms}-${e.event}-${i}`} data-kind={e.event}>
                    <td>{(e.t_ms / 1000).toFixed(1)} s</td>
                    <td>
                      <span class={`glyph marker-${s.variant}`} aria-hidden="true">
                        {s.glyph}
                      </span>{" "}
                      {s.label}
                    </td>
                    <td>{eventFigures(e)}</td>
                  </tr>
                );
              })}
            </tbody>
          </table>
        </div>
      )}
    </section>
  );
}
