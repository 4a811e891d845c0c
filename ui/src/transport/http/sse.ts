// Server-sent events read from a fetch body (not EventSource, so that an Authorization header can be sent).
// `SseParser` is the pure part: text in, events out, lines and events split anywhere across chunks; `readSse`
// feeds it from a byte stream (UTF-8 decoded in streaming mode, so a character split across chunks
// survives). Follows the WHATWG event-stream rules: data lines joined by "\n", comments ignored, an event
// ends at a blank line, and an unfinished event at the end of the stream is dropped. It holds at most one
// event of MAX_EVENT_CHARS (a complete event, or a line still arriving): past that the stream fails and what
// it held is freed, so a server cannot make the page buffer without end.
import { TransportError } from "../types";

/** The most one event (or one line still arriving) may hold, in characters. */
export const MAX_EVENT_CHARS = 1 << 20;

export interface SseEvent {
  /** The `event:` field; "message" when none was given. */
  event: string;
  data: string;
  id: string | null;
}

export class SseParser {
  private buf = "";
  private data: string[] = [];
  private hasData = false;
  private event = "";
  private id: string | null = null;
  /** Characters of the event being read (its data lines so far). */
  private dataChars = 0;

  /**
   * Takes the next piece of the stream; returns the events it completed. Throws (a TransportError, and
   * forgets what it held) when an event grows past MAX_EVENT_CHARS.
   */
  feed(text: string): SseEvent[] {
    const out: SseEvent[] = [];
    const buf = this.buf + text;
    let start = 0;
    // What was held is one unfinished line (perhaps ending in a CR): only the new text can end it.
    for (let i = Math.max(0, this.buf.length - 1); i < buf.length; i++) {
      const c = buf.charCodeAt(i);
      if (c !== 10 && c !== 13) continue;
      // A CR at the very end may be the first half of a CRLF that the next chunk completes.
      if (c === 13 && i === buf.length - 1) break;
      const line = buf.slice(start, i);
      if (c === 13 && buf.charCodeAt(i + 1) === 10) i++;
      start = i + 1;
      this.line(line, out);
    }
    this.buf = buf.slice(start);
    if (this.buf.length + this.dataChars > MAX_EVENT_CHARS) {
      this.buf = "";
      this.reset();
      throw new TransportError("engine", `the server sent an event of over ${MAX_EVENT_CHARS >> 20} MiB`);
    }
    return out;
  }

  /** The stream ended: a final line without its newline is still read; an unfinished event is dropped. */
  end(): SseEvent[] {
    const out: SseEvent[] = [];
    if (this.buf.endsWith("\r")) this.line(this.buf.slice(0, -1), out);
    this.buf = "";
    this.reset();
    return out;
  }

  private line(line: string, out: SseEvent[]): void {
    if (line === "") {
      if (this.hasData) out.push({ event: this.event || "message", data: this.data.join("\n"), id: this.id });
      this.reset();
      return;
    }
    if (line.startsWith(":")) return;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    switch (field) {
      case "data":
        this.data.push(value);
        this.dataChars += value.length + 1;
        this.hasData = true;
        break;
      case "event":
        this.event = value;
        break;
      case "id":
        this.id = value;
        break;
      default:
        break; // retry and unknown fields: nothing to do here
    }
  }

  private reset(): void {
    this.data = [];
    this.dataChars = 0;
    this.hasData = false;
    this.event = "";
  }
}

/** Reads an event stream to its end (or until `signal` aborts, which rejects with the abort reason). */
export async function readSse(
  body: ReadableStream<Uint8Array>,
  onEvent: (e: SseEvent) => void,
  signal?: AbortSignal,
): Promise<void> {
  const reader = body.getReader();
  const decoder = new TextDecoder("utf-8");
  const parser = new SseParser();
  const onAbort = () => {
    reader.cancel().catch(() => {});
  };
  signal?.addEventListener("abort", onAbort, { once: true });
  try {
    for (;;) {
      if (signal?.aborted) throw abortError(signal);
      const { done, value } = await reader.read();
      if (signal?.aborted) throw abortError(signal);
      if (done) break;
      for (const e of parser.feed(decoder.decode(value, { stream: true }))) onEvent(e);
    }
    for (const e of parser.feed(decoder.decode())) onEvent(e);
    for (const e of parser.end()) onEvent(e);
  } catch (e) {
    reader.cancel().catch(() => {});
    throw e;
  } finally {
    signal?.removeEventListener("abort", onAbort);
    reader.releaseLock();
  }
}

function abortError(signal: AbortSignal): unknown {
  return signal.reason ?? new DOMException("aborted", "AbortError");
}
