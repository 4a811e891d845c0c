// Each device's memory as the engine counts it (DevicesView): free and total, the reserve, what Strata
// holds by purpose, the high-water mark, the layers it holds, refused allocations and failed samples. The
// host device is titled Host RAM.
import type { DeviceView } from "../../bindings";
import { bytesText } from "../../util/format";

function UsageBar({ d }: { d: DeviceView }) {
  const total = Math.max(d.total_bytes, 1);
  const used = d.free_bytes === null ? null : Math.max(0, d.total_bytes - d.free_bytes);
  const usedPct = used === null ? 0 : Math.min(100, (used / total) * 100);
  const reservePct = Math.min(100, (d.reserve_bytes / total) * 100);
  return (
    <div class="usage-bar" role="img" aria-label={`${bytesText(used)} used of ${bytesText(d.total_bytes)}`}>
      <div class="usage-used" style={{ width: `${usedPct}%` }} />
      <div class="usage-reserve" style={{ left: `${100 - reservePct}%`, width: `${reservePct}%` }} />
    </div>
  );
}

export function DeviceCard({ d }: { d: DeviceView }) {
  const purposes = Object.entries(d.by_purpose_bytes).filter(([, b]) => (b ?? 0) > 0);
  return (
    <section class="card device-card" data-testid={d.host ? "host-card" : "device-card"} aria-label={d.host ? "Host RAM" : d.name}>
      <h3>
        {d.host ? "Host RAM" : d.name}
        {d.host && <span class="muted"> ({d.name})</span>}
      </h3>
      <UsageBar d={d} />
      <dl class="facts compact">
        <div class="fact">
          <dt>Free</dt>
          <dd>
            {d.free_bytes === null ? "not sampled" : bytesText(d.free_bytes)} of {bytesText(d.total_bytes)}
          </dd>
        </div>
        <div class="fact">
          <dt>Reserve</dt>
          <dd>{bytesText(d.reserve_bytes)}</dd>
        </div>
        <div class="fact">
          <dt>Strata holds</dt>
          <dd>
            {bytesText(d.strata_bytes)}
            {purposes.length > 0 && ` (${purposes.map(([p, b]) => `${p} ${bytesText(b ?? 0)}`).join(", ")})`}
          </dd>
        </div>
        <div class="fact">
          <dt>High water</dt>
          <dd>{bytesText(d.high_water_bytes)}</dd>
        </div>
        {d.layers.length > 0 && (
          <div class="fact">
            <dt>Layers</dt>
            <dd>{d.layers.map(([a, b]) => `${a}–${b}`).join(", ")}</dd>
          </div>
        )}
        {(d.refused_allocations > 0 || d.failed_samples > 0) && (
          <div class="fact">
            <dt>Refused / failed</dt>
            <dd>
              {d.refused_allocations} allocations refused, {d.failed_samples} samples failed
            </dd>
          </div>
        )}
      </dl>
    </section>
  );
}
