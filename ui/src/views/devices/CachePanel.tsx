// The conversation cache (CacheView): slots used of slots, bytes of the budget, evictions, the live
// sequence's tokens, and each parked conversation.
import type { CacheView } from "../../bindings";
import { bytesText } from "../../util/format";

export function CachePanel({ cache }: { cache: CacheView }) {
  const pct = cache.budget_bytes > 0 ? Math.min(100, (cache.bytes / cache.budget_bytes) * 100) : 0;
  return (
    <section class="card" aria-labelledby="cache-heading" data-testid="cache-panel">
      <h3 id="cache-heading">Conversation cache</h3>
      <dl class="facts compact">
        <div class="fact">
          <dt>Slots</dt>
          <dd>
            {cache.slots_used} of {cache.slots} used
          </dd>
        </div>
        <div class="fact">
          <dt>Memory</dt>
          <dd>
            {bytesText(cache.bytes)} of {bytesText(cache.budget_bytes)}
          </dd>
        </div>
        <div class="fact">
          <dt>Evictions</dt>
          <dd>{cache.evictions}</dd>
        </div>
        <div class="fact">
          <dt>Live tokens</dt>
          <dd>{cache.live_tokens}</dd>
        </div>
      </dl>
      <div class="usage-bar" role="img" aria-label={`cache ${pct.toFixed(0)}% of its budget`}>
        <div class="usage-used" style={{ width: `${pct}%` }} />
      </div>
      {cache.parked.length > 0 && (
        <div class="table-scroll">
          <table>
            <thead>
              <tr>
                <th scope="col">Parked tokens</th>
                <th scope="col">Bytes</th>
                <th scope="col">Last use</th>
                <th scope="col">Checkpoints</th>
              </tr>
            </thead>
            <tbody>
              {cache.parked.map((p, i) => (
                <tr key={i}>
                  <td>{p.tokens}</td>
                  <td>{bytesText(p.bytes)}</td>
                  <td>{(p.last_use_ms / 1000).toFixed(1)} s</td>
                  <td>{p.checkpoints.join(", ") || "—"}</td>
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      )}
    </section>
  );
}
