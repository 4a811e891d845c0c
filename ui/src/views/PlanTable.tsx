// A plan shown per device: layers, weights, KV (on the device and on the host), scratch and staging, the
// total against what is free, the reserve, the headroom, and whether it fits; with the sentence that says
// why it does not when it does not.
import type { Plan } from "../bindings";
import { fitMessage } from "../settings/bars";
import { bytesText } from "../util/format";

export function PlanTable({ plan }: { plan: Plan }) {
  const why = fitMessage(plan);
  return (
    <div class="plan">
      <p class="plan-summary">
        {plan.kv} KV, context {plan.max_context.toLocaleString("en-US")}, planned for {plan.tokens.toLocaleString("en-US")} tokens:{" "}
        <strong class={plan.fits ? "ok" : "bad"}>{plan.fits ? "fits" : "does not fit"}</strong>
      </p>
      {why && (
        <p class="error" role="alert" data-testid="fit-message">
          {why}
        </p>
      )}
      <div class="table-scroll">
        <table class="plan-table">
          <thead>
            <tr>
              <th scope="col">Device</th>
              <th scope="col">Layers</th>
              <th scope="col">Weights</th>
              <th scope="col">KV device / host</th>
              <th scope="col">Scratch + staging</th>
              <th scope="col">Total</th>
              <th scope="col">Free</th>
              <th scope="col">Reserve</th>
              <th scope="col">Headroom</th>
              <th scope="col">Fits</th>
            </tr>
          </thead>
          <tbody>
            {plan.rows.map((r) => (
              <tr key={r.index} class={r.fits ? "" : "row-bad"} data-testid="plan-row">
                <th scope="row">
                  {r.device}
                  {r.host ? " (host)" : ""}
                </th>
                <td>
                  {r.layers[0]}–{r.layers[1]}
                </td>
                <td>{bytesText(r.weights_bytes)}</td>
                <td>
                  {bytesText(r.kv_device_bytes)} / {bytesText(r.kv_host_bytes)}
                </td>
                <td>{bytesText(r.scratch_bytes + r.staging_bytes)}</td>
                <td>{bytesText(r.total_bytes)}</td>
                <td>{bytesText(r.free_bytes ?? r.memory_bytes)}</td>
                <td>{bytesText(r.reserve_bytes)}</td>
                <td>{bytesText(r.headroom_bytes)}</td>
                <td>{r.fits ? "yes" : "no"}</td>
              </tr>
            ))}
          </tbody>
        </table>
      </div>
    </div>
  );
}
