// Tool-call markup in a message's text, split into segments for the conversation view: in a reply, the
// Hermes/Qwen `<tool_call>{"name", "arguments"}</tool_call>` blocks and Mistral's `[TOOL_CALLS][{...}, ...]`
// (or `[TOOL_CALLS]name[ARGS]{...}`) calls; in a user's message, the `<tool_response>...</tool_response>`
// results pasted back. The text around them is kept in order. Pure: it never renders, and a text without
// markup comes back as one text segment, unchanged.

export interface TextSegment {
  kind: "text";
  text: string;
}

export interface CallSegment {
  kind: "call";
  /** The tool's name; null when the call's JSON does not parse (or names no tool) or is not complete yet. */
  name: string | null;
  /** The arguments as parsed (a JSON string of arguments is parsed too); null when there are none. */
  arguments: unknown;
  /** Whether the call parsed (a name and JSON arguments); when not, `raw` is what to show. */
  valid: boolean;
  /** The call's text as written, inside its markup. */
  raw: string;
  /** False while the call streams (its closing markup has not come). */
  complete: boolean;
}

export interface ResultSegment {
  kind: "result";
  /** What was inside `<tool_response>`, trimmed. */
  content: string;
}

export type Segment = TextSegment | CallSegment | ResultSegment;

const CALL_OPEN = "<tool_call>";
const CALL_CLOSE = "</tool_call>";
const RESULT_OPEN = "<tool_response>";
const RESULT_CLOSE = "</tool_response>";
const MISTRAL = "[TOOL_CALLS]";
const MISTRAL_ARGS = "[ARGS]";

function parseJson(text: string): { ok: true; value: unknown } | { ok: false } {
  try {
    return { ok: true, value: JSON.parse(text) };
  } catch {
    return { ok: false };
  }
}

/** One call from its parsed JSON: `{"name", "arguments"}` (or `parameters`, as Llama's format has it). */
function callOf(value: unknown, raw: string): CallSegment {
  const o = typeof value === "object" && value !== null && !Array.isArray(value) ? (value as Record<string, unknown>) : null;
  const name = o && typeof o.name === "string" && o.name !== "" ? o.name : null;
  if (!o || name === null) return unparsed(raw, true);
  let args: unknown = o.arguments ?? o.parameters ?? null;
  // OpenAI's form carries the arguments as a JSON string.
  if (typeof args === "string") {
    const inner = parseJson(args);
    if (inner.ok) args = inner.value;
  }
  return { kind: "call", name, arguments: args, valid: true, raw, complete: true };
}

function unparsed(raw: string, complete: boolean): CallSegment {
  return { kind: "call", name: null, arguments: null, valid: false, raw, complete };
}

/**
 * The index just past the JSON array or object that opens at `start` (`[` or `{`), matching brackets
 * outside strings; -1 when it does not close in `text`.
 */
export function jsonEnd(text: string, start: number): number {
  let depth = 0;
  let inString = false;
  for (let i = start; i < text.length; i++) {
    const c = text[i];
    if (inString) {
      if (c === "\\") i++;
      else if (c === '"') inString = false;
    } else if (c === '"') inString = true;
    else if (c === "[" || c === "{") depth++;
    else if (c === "]" || c === "}") {
      depth--;
      if (depth === 0) return i + 1;
    }
  }
  return -1;
}

/** The length of the longest end of `text` that is the start of one of `markers` (a tag still streaming). */
function partialMarkerAtEnd(text: string, markers: readonly string[]): number {
  let best = 0;
  for (const m of markers) {
    for (let n = Math.min(m.length - 1, text.length); n > best; n--) {
      if (text.endsWith(m.slice(0, n))) {
        best = n;
        break;
      }
    }
  }
  return best;
}

function pushText(out: Segment[], text: string) {
  if (text.trim() === "") return;
  const last = out[out.length - 1];
  if (last?.kind === "text") last.text += text;
  else out.push({ kind: "text", text });
}

/**
 * The calls of one Mistral `[TOOL_CALLS]` marker whose payload starts at `at`; returns them and where the
 * text after them starts (the text's end when they are not complete yet).
 */
function mistralCalls(text: string, at: number): { calls: CallSegment[]; end: number } {
  const ws = text.slice(at).match(/^\s*/)?.[0].length ?? 0;
  const start = at + ws;
  if (text[start] === "[" || text[start] === "{") {
    const end = jsonEnd(text, start);
    if (end < 0) return { calls: [unparsed(text.slice(start), false)], end: text.length };
    const raw = text.slice(start, end);
    const parsed = parseJson(raw);
    if (!parsed.ok) return { calls: [unparsed(raw, true)], end };
    const list = Array.isArray(parsed.value) ? parsed.value : [parsed.value];
    if (list.length === 0) return { calls: [unparsed(raw, true)], end };
    return { calls: list.map((v) => callOf(v, Array.isArray(parsed.value) ? JSON.stringify(v) : raw)), end };
  }
  // The newer form: `name[ARGS]{...}`.
  const args = text.indexOf(MISTRAL_ARGS, start);
  const name = args < 0 ? "" : text.slice(start, args);
  if (args < 0 || !/^[\w.-]+$/.test(name)) {
    // Still streaming the name, or not a call after all: up to the next marker (or the end) is the call.
    const next = text.indexOf(MISTRAL, start);
    const end = next < 0 ? text.length : next;
    return { calls: [unparsed(text.slice(start, end), false)], end };
  }
  const objStart = args + MISTRAL_ARGS.length;
  const end = jsonEnd(text, objStart);
  if (end < 0) return { calls: [unparsed(text.slice(start), false)], end: text.length };
  const raw = text.slice(objStart, end);
  const parsed = parseJson(raw);
  const call: CallSegment = { kind: "call", name, arguments: parsed.ok ? parsed.value : null, valid: parsed.ok, raw, complete: true };
  return { calls: [call], end };
}

/**
 * A reply's segments: its text, and each tool call in place. With `streaming`, an unclosed `<tool_call>` is
 * a call that is not complete, and a tag cut at the end (`<tool_ca`) is held back rather than shown.
 */
export function replySegments(text: string, streaming = false): Segment[] {
  if (!text.includes("<tool_call") && !text.includes("[TOOL_CALLS") && !streaming) return [{ kind: "text", text }];
  const out: Segment[] = [];
  let i = 0;
  while (i < text.length) {
    const call = text.indexOf(CALL_OPEN, i);
    const mistral = text.indexOf(MISTRAL, i);
    const next = call < 0 ? mistral : mistral < 0 ? call : Math.min(call, mistral);
    if (next < 0) {
      let rest = text.slice(i);
      if (streaming) rest = rest.slice(0, rest.length - partialMarkerAtEnd(rest, [CALL_OPEN, MISTRAL]));
      pushText(out, rest);
      break;
    }
    pushText(out, text.slice(i, next));
    if (next === call) {
      const bodyStart = call + CALL_OPEN.length;
      const close = text.indexOf(CALL_CLOSE, bodyStart);
      if (close < 0) {
        // Still streaming; or the reply ended before the call closed: then shown by name if it parses.
        const raw = text.slice(bodyStart).trim();
        const parsed = streaming ? null : parseJson(raw);
        out.push(parsed?.ok ? { ...callOf(parsed.value, raw), complete: false } : unparsed(raw, false));
        break;
      }
      const raw = text.slice(bodyStart, close).trim();
      const parsed = parseJson(raw);
      out.push(parsed.ok ? callOf(parsed.value, raw) : unparsed(raw, true));
      i = close + CALL_CLOSE.length;
    } else {
      const { calls, end } = mistralCalls(text, mistral + MISTRAL.length);
      out.push(...calls);
      i = end;
    }
  }
  // Nothing shown yet (a reply that has not begun, or only a tag being cut): one empty text.
  return out.length === 0 ? [{ kind: "text", text: streaming ? "" : text }] : out;
}

/** A user's message's segments: its text, and each `<tool_response>` block in place (an unclosed one is text). */
export function userSegments(text: string): Segment[] {
  if (!text.includes(RESULT_OPEN)) return [{ kind: "text", text }];
  const out: Segment[] = [];
  let i = 0;
  while (i < text.length) {
    const open = text.indexOf(RESULT_OPEN, i);
    const close = open < 0 ? -1 : text.indexOf(RESULT_CLOSE, open + RESULT_OPEN.length);
    if (open < 0 || close < 0) {
      pushText(out, text.slice(i));
      break;
    }
    pushText(out, text.slice(i, open));
    out.push({ kind: "result", content: text.slice(open + RESULT_OPEN.length, close).trim() });
    i = close + RESULT_CLOSE.length;
  }
  return out;
}

/** `text` pretty-printed when it is JSON, else as it is. */
export function prettyJson(text: string): string {
  const parsed = parseJson(text);
  return parsed.ok && typeof parsed.value === "object" && parsed.value !== null ? JSON.stringify(parsed.value, null, 2) : text;
}

/** A call's arguments as shown: pretty-printed JSON, or the raw text when its JSON did not parse. */
export function shownArguments(call: CallSegment): string {
  if (!call.valid) return call.raw;
  return JSON.stringify(call.arguments, null, 2) ?? "null";
}
