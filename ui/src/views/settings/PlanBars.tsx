// One bar per device of a plan: what the load takes against what is free, with the reserve marked at the
// free end (a plan that reaches into it does not fit) and a draft model's share marked at the end of the
// used part (a device holding both models has one bar).
import type { Plan } from "../../bindings";
import { planBars } from "../../settings/bars";
import { bytesText } from "../../util/format";

export function PlanBars({ plan }: { plan: Plan }) {
  return (
    <ul class="plan-bars" aria-label="Memory per device">
      {planBars(plan).map((b) => {
        const d = b.device;
        const draft = b.draftBytes > 0 ? ` (draft model ${bytesText(b.draftBytes)})` : "";
        const label = `${d.device}: ${bytesText(d.total_bytes)}${draft} of ${bytesText(b.freeBytes)} free, reserve ${bytesText(d.reserve_bytes)}${b.fits ? "" : " — does not fit"}`;
        return (
          <li key={d.index} class="plan-bar-item">
            <div class="plan-bar-label">{label}</div>
            <div
              class={`plan-bar ${b.fits ? "fits" : "over"}`}
              role="img"
              aria-label={label}
              data-testid="plan-bar"
              data-device={d.index}
              data-used-pct={b.usedPct.toFixed(1)}
              data-draft-pct={b.draftPct.toFixed(1)}
            >
              <div class="plan-bar-used" style={{ width: `${b.usedPct}%` }} />
              {b.draftPct > 0 && (
                <div
                  class="plan-bar-draft"
                  data-testid="plan-bar-draft"
                  style={{ left: `${Math.max(0, b.usedPct - b.draftPct)}%`, width: `${b.draftPct}%` }}
                  title={`draft model ${bytesText(b.draftBytes)}`}
                />
              )}
              <div
                class="plan-bar-reserve"
                data-testid="plan-bar-reserve"
                style={{ left: `${b.reserveStartPct}%`, width: `${b.reservePct}%` }}
                title={`reserve ${bytesText(d.reserve_bytes)}`}
              />
            </div>
          </li>
        );
      })}
    </ul>
  );
}
