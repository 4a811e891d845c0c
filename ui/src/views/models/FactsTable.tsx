// A model file's facts (ModelFacts) as a definition list.
import type { ModelFacts } from "../../bindings";
import { bytesText, countText } from "../../util/format";

export function FactsTable({ facts }: { facts: ModelFacts }) {
  const rows: [string, string][] = [
    ["Name", facts.name],
    ["Architecture", facts.architecture],
    ["Features", facts.features || "—"],
    ["Quantization", facts.quantization],
    ["Parameters", countText(facts.parameters)],
    ["Layers", String(facts.layers)],
    ["Trained context", facts.trained_context.toLocaleString("en-US")],
    ["Vocabulary", facts.vocab.toLocaleString("en-US")],
    ["File size", bytesText(facts.file_bytes)],
    ["Path", facts.path],
  ];
  return (
    <dl class="facts" data-testid="model-facts">
      {rows.map(([k, v]) => (
        <div key={k} class="fact">
          <dt>{k}</dt>
          <dd>{v}</dd>
        </div>
      ))}
    </dl>
  );
}
