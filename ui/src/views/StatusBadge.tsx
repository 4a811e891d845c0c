// The engine's state as a small badge in the header: starting, ready, restarting, failed (with its
// message), stopped or remote.
import type { EngineStatus } from "../bindings";

export function StatusBadge({ status }: { status: EngineStatus | null }) {
  const state = status?.state ?? "starting";
  const text = status === null ? "connecting" : state;
  const model = status?.model?.name;
  return (
    <div class={`status-badge state-${state}`} role="status" aria-live="polite" data-testid="status-badge">
      <span class="status-dot" aria-hidden="true" />
      <span class="status-state">{text}</span>
      {model && state === "ready" && <span class="status-model">{model}</span>}
      {status?.message && <span class="status-message">{status.message}</span>}
      {status && status.restarts > 0 && <span class="status-restarts">{status.restarts} restarts</span>}
    </div>
  );
}
