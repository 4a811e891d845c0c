// Tool calls and results in the conversation (MessageItem over chat/toolcalls.ts): a reply's calls folded
// in place, closed, summarized "Tool call: NAME", their arguments pretty-printed inside; the reply's text
// around them still Markdown; an unclosed call while streaming a busy "Tool call…", never raw markup; a
// call that is not JSON shown raw; a user's <tool_response> folded as "Tool result".
import { render, screen } from "@testing-library/preact";
import { describe, expect, it } from "vitest";
import type { StoredMessage } from "../src/bindings";
import { MessageItem } from "../src/views/chat/MessageItem";

const reply = (content: string, complete = true): StoredMessage => ({ role: "assistant", content, figures: null, complete });
const user = (content: string): StoredMessage => ({ role: "user", content, figures: null, complete: true });

const WEATHER = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>';

describe("tool calls in a reply", () => {
  it("folds each call, closed, named in its summary, with its arguments as pretty JSON, in order with the text", () => {
    render(<MessageItem message={reply(`I'll **check**.\n\n${WEATHER}\n${WEATHER.replace("get_weather", "get_time")}\nDone.`)} />);
    const calls = screen.getAllByTestId("tool-call") as HTMLDetailsElement[];
    expect(calls).toHaveLength(2);
    expect(calls.map((c) => c.open)).toEqual([false, false]);
    expect(screen.getAllByTestId("tool-call-summary").map((s) => s.textContent)).toEqual(["Tool call: get_weather", "Tool call: get_time"]);
    const args = screen.getAllByTestId("tool-call-args")[0]!;
    expect(args.tagName).toBe("PRE");
    expect(args.textContent).toBe('{\n  "city": "Paris",\n  "unit": "celsius"\n}');
    // The text around the calls is Markdown, before and after them; no markup is left in it.
    const md = screen.getAllByTestId("markdown");
    expect(md.map((m) => m.textContent?.trim())).toEqual(["I'll check.", "Done."]);
    expect(md[0]!.querySelector("strong")?.textContent).toBe("check");
    const li = screen.getByTestId("message-assistant");
    expect(li.textContent).not.toContain("<tool_call>");
    expect(Array.from(li.children).map((c) => c.getAttribute("data-testid"))).toEqual([
      null,
      "markdown",
      "tool-call",
      "tool-call",
      "markdown",
    ]);
  });

  it("shows a call that is not JSON raw, and a Mistral reply's calls", () => {
    const { unmount } = render(<MessageItem message={reply("<tool_call>{name: get_weather}</tool_call>")} />);
    expect(screen.getByTestId("tool-call-summary").textContent).toBe("Tool call (not valid JSON)");
    expect(screen.getByTestId("tool-call-args").textContent).toBe("{name: get_weather}");
    unmount();
    render(<MessageItem message={reply('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo"}}, {"name": "ping", "arguments": {}}]')} />);
    expect(screen.getAllByTestId("tool-call-summary").map((s) => s.textContent)).toEqual(["Tool call: get_weather", "Tool call: ping"]);
    expect(screen.queryByText(/TOOL_CALLS/)).toBeNull();
  });

  it("while the reply streams, shows an unclosed call as a busy 'Tool call…', never as markup", () => {
    const { rerender } = render(
      <MessageItem message={reply('Checking.\n<tool_call>\n{"name": "get_wea', false)} extras={{ status: "streaming" }} />,
    );
    const call = screen.getByTestId("tool-call") as HTMLDetailsElement;
    expect(call.open).toBe(false);
    expect(call.getAttribute("aria-busy")).toBe("true");
    expect(screen.getByTestId("tool-call-summary").textContent).toBe("Tool call…");
    expect(screen.getByTestId("message-assistant").textContent).not.toContain("<tool_call>");
    // A tag still arriving is not shown either.
    rerender(<MessageItem message={reply("Checking.\n<tool_ca", false)} extras={{ status: "streaming" }} />);
    expect(screen.getByTestId("message-assistant").textContent).not.toContain("<tool_ca");
    // Closed and ended: named, no longer busy.
    rerender(<MessageItem message={reply(`Checking.\n${WEATHER}`)} extras={{}} />);
    expect(screen.getByTestId("tool-call").getAttribute("aria-busy")).toBe("false");
    expect(screen.getByTestId("tool-call-summary").textContent).toBe("Tool call: get_weather");
  });

  it("renders a reply without markup as one Markdown block, as before", () => {
    render(<MessageItem message={reply("Just **text** with a < sign.")} />);
    expect(screen.getAllByTestId("markdown")).toHaveLength(1);
    expect(screen.queryByTestId("tool-call")).toBeNull();
  });
});

describe("tool results in a user's message", () => {
  it("folds each <tool_response> as 'Tool result', closed, its JSON pretty-printed, the text kept", () => {
    render(<MessageItem message={user('The tool said:\n<tool_response>\n{"temp_c": 21, "sky": "clear"}\n</tool_response>\nSummarize.')} />);
    const result = screen.getByTestId("tool-result") as HTMLDetailsElement;
    expect(result.open).toBe(false);
    expect(screen.getByTestId("tool-result-summary").textContent).toBe("Tool result");
    expect(screen.getByTestId("tool-result-content").textContent).toBe('{\n  "temp_c": 21,\n  "sky": "clear"\n}');
    const texts = Array.from(document.querySelectorAll(".message-text")).map((e) => e.textContent);
    expect(texts).toEqual(["The tool said:\n", "\nSummarize."]);
    expect(screen.getByTestId("message-user").textContent).not.toContain("<tool_response>");
  });

  it("leaves a user's message without results as typed, markup and all", () => {
    render(<MessageItem message={user("<tool_call>{}</tool_call> is what it writes")} />);
    expect(document.querySelector(".message-text")?.textContent).toBe("<tool_call>{}</tool_call> is what it writes");
    expect(screen.queryByTestId("tool-result")).toBeNull();
  });
});
