// A plan shown per device: layers, weights (for a mixture of experts, the experts' part on the device and
// the experts kept in host RAM, `--experts`), KV (on the device and on the host), scratch and staging, the
// total against what is free, the reserve, the headroom, and whether it fits; with the sentence that says
// why it does not when it does not. A draft model's stages follow the model's, marked "draft"; the headroom
// and fit of a device holding both are the two models' together.
import type { Plan, PlanRow } from "../bindings";
import { fitMessage } from "../settings/bars";
import { bytesText } from "../util/format";

function Row({ r, draft }: { r: PlanRow; draft: boolean }) {
  return (
    <tr class={r.fits ? "" : "row-bad"} data-testid={draft ? "plan-draft-row" : "plan-row"}>
      <th scope="row">
        {r.device}
        {r.host ? " (host)" : ""}
        {draft ? " · draft" : ""}
      </th>
      <td>
        {r.layers[0]}–{r.layers[1]}
      </td>
      <td>
        {bytesText(r.weights_bytes)}
        {r.experts_bytes + r.host_experts_bytes > 0 && (
          <span class="plan-experts" data-testid="plan-experts">
            {" "}
            (experts {bytesText(r.experts_bytes)}; in host RAM {bytesText(r.host_experts_bytes)})
          </span>
        )}
      </td>
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
  );
}

export function PlanTable({ plan }: { plan: Plan }) {
  const why = fitMessage(plan);
  const draftRows = plan.draft?.rows ?? [];
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
              <Row key={`m${r.index}`} r={r} draft={false} />
            ))}
            {draftRows.map((r) => (
              <Row key={`d${r.index}`} r={r} draft={true} />
            ))}
          </tbody>
        </table>
      </div>
    </div>
  );
}
