// A tool call in a reply and a tool result in a user's message, each folded as the reply's reasoning is: a
// disclosure closed by default, whose summary names it ("Tool call: get_weather", "Tool result") and whose
// body is its JSON, pretty-printed (or the text as written, when it is not JSON). The parsing is
// chat/toolcalls.ts's; this module only shows segments.
import type { CallSegment } from "../../chat/toolcalls";
import { prettyJson, shownArguments } from "../../chat/toolcalls";

/** What a call's summary reads; `streaming`: the reply is still coming. */
export function callSummary(call: CallSegment, streaming: boolean): string {
  if (!call.complete && streaming) return "Tool call…";
  if (call.valid) return `Tool call: ${call.name}${call.complete ? "" : " (incomplete)"}`;
  return call.complete ? "Tool call (not valid JSON)" : "Tool call (incomplete)";
}

export function ToolCall({ call, streaming }: { call: CallSegment; streaming: boolean }) {
  const busy = streaming && !call.complete;
  return (
    <details class="reasoning tool-call" data-testid="tool-call" aria-busy={busy}>
      <summary data-testid="tool-call-summary">{callSummary(call, streaming)}</summary>
      <pre class="tool-json" data-testid="tool-call-args">
        {shownArguments(call)}
      </pre>
    </details>
  );
}

export function ToolResult({ content }: { content: string }) {
  return (
    <details class="reasoning tool-result" data-testid="tool-result">
      <summary data-testid="tool-result-summary">Tool result</summary>
      <pre class="tool-json" data-testid="tool-result-content">
        {prettyJson(content)}
      </pre>
    </details>
  );
}
