// Tool-call markup split into segments (chat/toolcalls.ts): Hermes/Qwen <tool_call> blocks (several, with
// text before, between and after), a block whose JSON does not parse, an unclosed one while the reply
// streams (and a tag cut at the end), Mistral's [TOOL_CALLS] forms, <tool_response> in a user's message,
// and text without markup, which comes back unchanged.
import { describe, expect, it } from "vitest";
import { jsonEnd, prettyJson, replySegments, shownArguments, userSegments, type CallSegment } from "../src/chat/toolcalls";

const call = (name: string, args: unknown) => `<tool_call>\n${JSON.stringify({ name, arguments: args })}\n</tool_call>`;

describe("replySegments: Hermes/Qwen <tool_call>", () => {
  it("splits several calls out of the text, keeping the text before, between and after in order", () => {
    const text = `Let me check.\n\n${call("get_weather", { city: "Paris" })}\nAnd:\n${call("get_time", { tz: "CET" })}\nDone.`;
    const segs = replySegments(text);
    expect(segs.map((s) => s.kind)).toEqual(["text", "call", "text", "call", "text"]);
    expect(segs[0]).toEqual({ kind: "text", text: "Let me check.\n\n" });
    expect(segs[1]).toMatchObject({ kind: "call", name: "get_weather", arguments: { city: "Paris" }, valid: true, complete: true });
    expect((segs[1] as CallSegment).raw).toBe('{"name":"get_weather","arguments":{"city":"Paris"}}');
    expect(segs[2]).toEqual({ kind: "text", text: "\nAnd:\n" });
    expect(segs[3]).toMatchObject({ kind: "call", name: "get_time", arguments: { tz: "CET" } });
    expect(segs[4]).toEqual({ kind: "text", text: "\nDone." });
  });

  it("drops the whitespace between back-to-back calls, and parses arguments sent as a JSON string", () => {
    const text = `${call("a", {})}\n${`<tool_call>{"name": "b", "arguments": "{\\"x\\": [1, 2]}"}</tool_call>`}`;
    const segs = replySegments(text);
    expect(segs).toHaveLength(2);
    expect(segs[1]).toMatchObject({ name: "b", arguments: { x: [1, 2] } });
    expect(shownArguments(segs[1] as CallSegment)).toBe('{\n  "x": [\n    1,\n    2\n  ]\n}');
  });

  it("keeps a block whose JSON does not parse as a call to show raw", () => {
    const segs = replySegments('Try:<tool_call>{"name": "get_weather", "arguments": {city: Paris}}</tool_call>');
    expect(segs[0]).toEqual({ kind: "text", text: "Try:" });
    const c = segs[1] as CallSegment;
    expect(c).toMatchObject({ kind: "call", name: null, valid: false, complete: true });
    expect(shownArguments(c)).toBe('{"name": "get_weather", "arguments": {city: Paris}}');
    // JSON that names no tool is not a call either.
    expect(replySegments('<tool_call>{"arguments": {}}</tool_call>')[0]).toMatchObject({ valid: false, name: null });
  });

  it("shows an unclosed call while the reply streams as an incomplete call, never as markup", () => {
    const segs = replySegments('Checking.\n<tool_call>\n{"name": "get_wea', true);
    expect(segs).toEqual([
      { kind: "text", text: "Checking.\n" },
      { kind: "call", name: null, arguments: null, valid: false, raw: '{"name": "get_wea', complete: false },
    ]);
    // The opening tag itself still coming: held back, not shown as text.
    for (const cut of ["<", "<tool", "<tool_call"]) {
      expect(replySegments(`Checking.\n${cut}`, true)).toEqual([{ kind: "text", text: "Checking.\n" }]);
    }
    expect(replySegments("<tool_ca", true)).toEqual([{ kind: "text", text: "" }]);
    // Once the reply has ended, a call left open is shown by name if its JSON is whole.
    expect(replySegments('<tool_call>{"name": "f", "arguments": {"a": 1}}')[0]).toMatchObject({
      name: "f",
      arguments: { a: 1 },
      valid: true,
      complete: false,
    });
    expect(replySegments("x <tool_ca")).toEqual([{ kind: "text", text: "x <tool_ca" }]);
  });

  it("leaves a text without markup unchanged, streaming or not", () => {
    for (const text of ["", "Hello **world**", "a < b and [x]", "  \n  ", "<tool_calls> is not a tag"]) {
      expect(replySegments(text)).toEqual([{ kind: "text", text }]);
    }
    expect(replySegments("Hello, world", true)).toEqual([{ kind: "text", text: "Hello, world" }]);
  });
});

describe("replySegments: Mistral [TOOL_CALLS]", () => {
  it("turns the JSON array into one call each", () => {
    const text = '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", "arguments": {}}]';
    const segs = replySegments(text);
    expect(segs).toHaveLength(2);
    expect(segs[0]).toMatchObject({ kind: "call", name: "get_weather", arguments: { city: "Paris" }, complete: true });
    expect(segs[1]).toMatchObject({ kind: "call", name: "get_time", arguments: {} });
  });

  it("keeps the text before and after the array, even with brackets in strings", () => {
    const segs = replySegments('Sure. [TOOL_CALLS] [{"name": "echo", "arguments": {"s": "a]}\\"b"}}] Then more.');
    expect(segs.map((s) => s.kind)).toEqual(["text", "call", "text"]);
    expect(segs[1]).toMatchObject({ name: "echo", arguments: { s: 'a]}"b' } });
    expect(segs[2]).toEqual({ kind: "text", text: " Then more." });
  });

  it("reads the newer name[ARGS]{...} form, and an unclosed array while streaming", () => {
    expect(replySegments('[TOOL_CALLS]get_weather[ARGS]{"city": "Oslo"}')).toEqual([
      { kind: "call", name: "get_weather", arguments: { city: "Oslo" }, valid: true, raw: '{"city": "Oslo"}', complete: true },
    ]);
    const streaming = replySegments('[TOOL_CALLS][{"name": "get_weather", "argu', true);
    expect(streaming).toEqual([
      { kind: "call", name: null, arguments: null, valid: false, raw: '[{"name": "get_weather", "argu', complete: false },
    ]);
    expect(replySegments("Ok [TOOL_C", true)).toEqual([{ kind: "text", text: "Ok " }]);
    expect(replySegments("[TOOL_CALLS][{oops}]")[0]).toMatchObject({ valid: false, raw: "[{oops}]", complete: true });
  });
});

describe("userSegments: <tool_response>", () => {
  it("splits results out of a user's message, keeping the text around them", () => {
    const text = 'Here:\n<tool_response>\n{"temp_c": 21}\n</tool_response>\n<tool_response>sunny</tool_response>\nWhat now?';
    expect(userSegments(text)).toEqual([
      { kind: "text", text: "Here:\n" },
      { kind: "result", content: '{"temp_c": 21}' },
      { kind: "result", content: "sunny" },
      { kind: "text", text: "\nWhat now?" },
    ]);
    expect(prettyJson('{"temp_c": 21}')).toBe('{\n  "temp_c": 21\n}');
    expect(prettyJson("sunny")).toBe("sunny");
    expect(prettyJson("42")).toBe("42");
  });

  it("leaves a message without a closed block unchanged", () => {
    for (const text of ["plain", "<tool_response>open", "<tool_call>{}</tool_call>"]) {
      expect(userSegments(text)).toEqual([{ kind: "text", text }]);
    }
  });
});

describe("jsonEnd", () => {
  it("finds the end of a JSON value, skipping brackets in strings and escapes", () => {
    const text = 'x[{"a": "]"}, 1] y';
    expect(text.slice(1, jsonEnd(text, 1))).toBe('[{"a": "]"}, 1]');
    const escaped = '{"a": "\\"}"} z';
    expect(escaped.slice(0, jsonEnd(escaped, 0))).toBe('{"a": "\\"}"}');
    expect(jsonEnd('[{"a": 1}', 0)).toBe(-1);
  });
});
