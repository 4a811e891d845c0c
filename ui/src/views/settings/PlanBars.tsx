// One bar per device of a plan: what the load takes against what is free, with the reserve marked at the
// free end (a plan that reaches into it does not fit).
import type { Plan } from "../../bindings";
import { planBars } from "../../settings/bars";
import { bytesText } from "../../util/format";

export function PlanBars({ plan }: { plan: Plan }) {
  return (
    <ul class="plan-bars" aria-label="Memory per device">
      {planBars(plan).map((b) => {
        const label = `${b.row.device}: ${bytesText(b.row.total_bytes)} of ${bytesText(b.freeBytes)} free, reserve ${bytesText(b.row.reserve_bytes)}${b.fits ? "" : " — does not fit"}`;
        return (
          <li key={b.row.index} class="plan-bar-item">
            <div class="plan-bar-label">{label}</div>
            <div
              class={`plan-bar ${b.fits ? "fits" : "over"}`}
              role="img"
              aria-label={label}
              data-testid="plan-bar"
              data-device={b.row.index}
              data-used-pct={b.usedPct.toFixed(1)}
            >
              <div class="plan-bar-used" style={{ width: `${b.usedPct}%` }} />
              <div
                class="plan-bar-reserve"
                data-testid="plan-bar-reserve"
                style={{ left: `${b.reserveStartPct}%`, width: `${b.reservePct}%` }}
                title={`reserve ${bytesText(b.row.reserve_bytes)}`}
              />
            </div>
          </li>
        );
      })}
    </ul>
  );
}
