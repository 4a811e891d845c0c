// The SSE parser: events split anywhere across chunks, CRLF split in two, multi-line data, comments.
import { describe, expect, it } from "vitest";
import { MAX_EVENT_CHARS, readSse, SseParser, type SseEvent } from "../src/transport/http/sse";

function feedAll(pieces: string[]): SseEvent[] {
  const p = new SseParser();
  const out: SseEvent[] = [];
  for (const piece of pieces) out.push(...p.feed(piece));
  out.push(...p.end());
  return out;
}

export function bytesStream(chunks: Uint8Array[]): ReadableStream<Uint8Array> {
  return new ReadableStream({
    start(c) {
      for (const ch of chunks) c.enqueue(ch);
      c.close();
    },
  });
}

describe("SseParser", () => {
  const text = 'event: sample\ndata: {"t_ms":1}\n\n: keep-alive\n\nevent: engine\ndata: {"a":\ndata: 2}\n\ndata: [DONE]\n\n';

  it("gives the same events however the stream is cut", () => {
    const whole = feedAll([text]);
    expect(whole).toEqual([
      { event: "sample", data: '{"t_ms":1}', id: null },
      { event: "engine", data: '{"a":\n2}', id: null },
      { event: "message", data: "[DONE]", id: null },
    ]);
    for (let cut = 1; cut < text.length; cut++) {
      expect(feedAll([text.slice(0, cut), text.slice(cut)])).toEqual(whole);
    }
    expect(feedAll(text.split(""))).toEqual(whole);
  });

  it("reads CRLF line ends, also when the CR and LF come in different chunks", () => {
    expect(feedAll(["data: a\r", "\n\r", "\ndata: b\r\n\r\n"])).toEqual([
      { event: "message", data: "a", id: null },
      { event: "message", data: "b", id: null },
    ]);
  });

  it("drops an event the stream ended in the middle of", () => {
    expect(feedAll(["data: complete\n\ndata: cut"])).toEqual([{ event: "message", data: "complete", id: null }]);
  });

  it("does not strip more than one space after the colon", () => {
    expect(feedAll(["data:  two\n\n"])[0]?.data).toBe(" two");
  });

  it("fails an event that grows past the limit, in one line or in many, and frees what it held", () => {
    const chunk = "x".repeat(64 * 1024);
    const p = new SseParser();
    expect(() => {
      for (let fed = 0; fed <= MAX_EVENT_CHARS; fed += chunk.length) p.feed(fed === 0 ? "data: " + chunk : chunk);
    }).toThrow(/event of over 1 MiB/);
    // What it held is gone: the next event reads alone.
    expect(p.feed("data: next\n\n")).toEqual([{ event: "message", data: "next", id: null }]);
    const lines = new SseParser();
    expect(() => {
      for (let fed = 0; fed <= MAX_EVENT_CHARS; fed += chunk.length) lines.feed(`data: ${chunk}\n`);
    }).toThrow(/event of over 1 MiB/);
    // An event just under the limit is read.
    const under = "y".repeat(MAX_EVENT_CHARS - 16);
    expect(feedAll([`data: ${under.slice(0, 1000)}`, `${under.slice(1000)}\n\n`])[0]?.data).toBe(under);
  });
});

describe("readSse", () => {
  it("decodes UTF-8 characters split across byte chunks", async () => {
    const bytes = new TextEncoder().encode("data: héllo ✓\n\n");
    const cut = bytes.indexOf(0xe2) + 1; // inside the three bytes of ✓
    const got: string[] = [];
    await readSse(bytesStream([bytes.slice(0, 8), bytes.slice(8, cut), bytes.slice(cut)]), (e) => got.push(e.data));
    expect(got).toEqual(["héllo ✓"]);
  });

  it("rejects a stream whose event passes the limit and cancels the stream", async () => {
    let cancelled = false;
    const big = new TextEncoder().encode("data: " + "z".repeat(MAX_EVENT_CHARS));
    const body = new ReadableStream<Uint8Array>({
      pull(c) {
        c.enqueue(big);
      },
      cancel() {
        cancelled = true;
      },
    });
    await expect(readSse(body, () => {})).rejects.toThrow(/event of over 1 MiB/);
    expect(cancelled).toBe(true);
  });
});
