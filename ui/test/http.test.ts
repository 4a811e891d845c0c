// The HTTP transport against a mocked fetch: the chat stream (split at awkward places), the figures from
// the last chunk, errors before and during a stream, Stop, the API key on a 401, a 400's param as the
// error's field, /health as EngineStatus, 404s as "no data", and the event stream.
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import type { ChatChunk, TelemetryEntry } from "../src/bindings";
import { KEY_STORAGE, REMEMBERED_KEY_STORAGE, type AskKey } from "../src/transport/http/client";
import { HttpTransport } from "../src/transport/http";
import { TransportError } from "../src/transport/types";
import { exportDocument, titleFrom } from "../src/chat/conversation";
import { NO_PARAMS } from "../src/chat/params";
import { MIB, plan, row, settings } from "./fakes";

type Handler = (url: string, init: RequestInit) => Response | Promise<Response>;

function mockFetch(handler: Handler) {
  return vi.fn(async (input: RequestInfo | URL, init?: RequestInit) => handler(String(input), init ?? {}));
}

function json(status: number, body: unknown): Response {
  return new Response(JSON.stringify(body), { status, headers: { "Content-Type": "application/json" } });
}

/** A streamed response whose body arrives in exactly these pieces. */
function streamed(pieces: string[], opts: { hang?: boolean } = {}): Response {
  const enc = new TextEncoder();
  const body = new ReadableStream<Uint8Array>({
    start(c) {
      for (const p of pieces) c.enqueue(enc.encode(p));
      if (!opts.hang) c.close();
    },
  });
  return new Response(body, { status: 200, headers: { "Content-Type": "text/event-stream" } });
}

function headerOf(init: RequestInit, name: string): string | null {
  return new Headers(init.headers).get(name);
}

const STRATA = {
  job: 7, reused: 30, read: 6, prompt_ms: 12, gen_ms: 90, prompt_tok_s: 500, gen_tok_s: 88.8, queue_ms: 1,
  drafts_accepted: 2, drafts_proposed: 4, restored: "live", restored_tokens: 30, fallback: null,
};

function chatSse(): string {
  const chunk = (delta: object, finish: string | null = null) =>
    `data: ${JSON.stringify({ object: "chat.completion.chunk", choices: [{ index: 0, delta, logprobs: null, finish_reason: finish }], usage: null })}\n\n`;
  return (
    chunk({ role: "assistant", content: "" }) +
    chunk({ content: "Hello" }) +
    chunk({ content: ", wörld" }) +
    chunk({}, "stop") +
    `data: ${JSON.stringify({ choices: [], usage: { prompt_tokens: 36, completion_tokens: 3 }, strata: STRATA })}\n\n` +
    "data: [DONE]\n\n"
  );
}

let transport: HttpTransport;

beforeEach(() => {
  localStorage.clear();
  sessionStorage.clear();
});

afterEach(() => {
  vi.useRealTimers();
});

function setup(handler: Handler, askKey?: AskKey) {
  const f = mockFetch(handler);
  transport = new HttpTransport({ fetch: f as unknown as typeof fetch, askKey, reconnectMinMs: 5, reconnectMaxMs: 20 });
  return f;
}

function models(url: string): Response | null {
  return url === "/v1/models" ? json(200, { object: "list", data: [{ id: "SmolLM2" }] }) : null;
}

describe("HttpTransport chat", () => {
  it("streams text pieces split at every byte boundary, then done with the figures", async () => {
    const sse = chatSse();
    for (const size of [1, 3, 7, 50, sse.length]) {
      const pieces: string[] = [];
      for (let i = 0; i < sse.length; i += size) pieces.push(sse.slice(i, i + size));
      let body: Record<string, unknown> = {};
      setup((url, init) => models(url) ?? ((body = JSON.parse(String(init.body))), streamed(pieces)));
      const conv = await transport.createConversation(null);
      const chunks: ChatChunk[] = [];
      const listed: unknown[] = [];
      const params = { ...NO_PARAMS, temperature: 0, top_k: 20, min_p: 0.1, repeat_penalty: 1.1, max_tokens: 8, seed: 3 };
      await transport.chatSend(conv.id, [{ role: "user", content: "Hi" }], params, (c) => {
        // When `stored` comes, the list already has the title and the messages (user, reply to come).
        if (c.kind === "stored") void transport.listConversations().then((l) => listed.push(l));
        chunks.push(c);
      });
      expect(chunks[0]).toEqual({ kind: "stored" });
      expect(listed[0]).toContainEqual(expect.objectContaining({ id: conv.id, title: "Hi", messages: 2 }));
      const text = chunks.filter((c) => c.kind === "text").map((c) => (c as { text: string }).text).join("");
      expect(text).toBe("Hello, wörld");
      const done = chunks[chunks.length - 1];
      expect(done).toMatchObject({ kind: "done", finish_reason: "stop" });
      if (done?.kind !== "done") throw new Error("no done");
      expect(done.figures).toMatchObject({ prompt_tokens: 36, completion_tokens: 3, reused: 30, read: 6, gen_tok_s: 88.8, restored: "live", restored_tokens: 30, drafts_accepted: 2 });
      expect(body).toEqual({
        model: "SmolLM2",
        messages: [{ role: "user", content: "Hi" }],
        stream: true,
        stream_options: { include_usage: true },
        temperature: 0,
        top_k: 20,
        min_p: 0.1,
        repeat_penalty: 1.1,
        max_tokens: 8,
        seed: 3,
      });
      // The conversation is stored with the reply and its figures.
      const stored = await transport.getConversation(conv.id);
      expect(stored.title).toBe("Hi");
      expect(stored.messages.map((m) => [m.role, m.content, m.complete])).toEqual([
        ["user", "Hi", true],
        ["assistant", "Hello, wörld", true],
      ]);
      expect(stored.messages[1]?.figures?.gen_tok_s).toBe(88.8);
    }
  });

  it("asks for a JSON object reply (response_format) only when JSON mode is on", async () => {
    const bodies: Record<string, unknown>[] = [];
    setup((url, init) => models(url) ?? (bodies.push(JSON.parse(String(init.body))), streamed([chatSse()])));
    const conv = await transport.createConversation("t");
    for (const json_mode of [true, false, null]) {
      await transport.chatSend(conv.id, [{ role: "user", content: "Hi" }], { ...NO_PARAMS, json_mode }, () => {});
    }
    expect(bodies.map((b) => b.response_format)).toEqual([{ type: "json_object" }, undefined, undefined]);
    expect(bodies.map((b) => "json_mode" in b)).toEqual([false, false, false]);
  });

  it("reports an error line in the middle of the stream", async () => {
    setup((url) =>
      models(url) ??
      streamed([
        `data: {"choices":[{"index":0,"delta":{"content":"par"},"finish_reason":null}]}\n\n`,
        `data: {"error":{"message":"out of memory on sim:400","type":"server_error","param":null,"code":"out_of_memory"}}\n\n`,
      ]),
    );
    const conv = await transport.createConversation("t");
    const chunks: ChatChunk[] = [];
    await transport.chatSend(conv.id, [{ role: "user", content: "x" }], NO_PARAMS, (c) => chunks.push(c));
    expect(chunks).toEqual([
      { kind: "stored" },
      { kind: "text", text: "par" },
      { kind: "error", message: "out of memory on sim:400" },
    ]);
    expect((await transport.getConversation(conv.id)).messages[1]).toMatchObject({ content: "par", complete: false });
  });

  it("reports an HTTP error before the stream with the server's message", async () => {
    setup((url) =>
      models(url) ??
      json(400, { error: { message: "the prompt is 9000 tokens but the context holds 8192", type: "invalid_request_error", param: "messages", code: "context_length_exceeded" } }),
    );
    const conv = await transport.createConversation(null);
    const chunks: ChatChunk[] = [];
    await transport.chatSend(conv.id, [{ role: "user", content: "x" }], NO_PARAMS, (c) => chunks.push(c));
    expect(chunks).toEqual([{ kind: "stored" }, { kind: "error", message: "the prompt is 9000 tokens but the context holds 8192" }]);
  });

  it("stops a reply with chatCancel (the request is aborted)", async () => {
    let signal: AbortSignal | null | undefined;
    setup((url, init) => {
      if (models(url)) return models(url)!;
      signal = init.signal;
      return streamed([`data: {"choices":[{"index":0,"delta":{"content":"so far"}}]}\n\n`], { hang: true });
    });
    const conv = await transport.createConversation(null);
    const chunks: ChatChunk[] = [];
    const sent = transport.chatSend(conv.id, [{ role: "user", content: "x" }], NO_PARAMS, (c) => chunks.push(c));
    await vi.waitFor(() => expect(chunks).toHaveLength(2));
    await transport.chatCancel(conv.id);
    await sent;
    expect(signal?.aborted).toBe(true);
    expect(chunks[2]).toEqual({ kind: "done", finish_reason: "cancelled", figures: null });
    expect((await transport.getConversation(conv.id)).messages[1]).toMatchObject({ content: "so far", complete: false });
  });
});

describe("HttpTransport API key", () => {
  it("asks for the key on a 401, keeps it, and sends it on every request after", async () => {
    const seen: (string | null)[] = [];
    const ask = vi.fn(async () => ({ key: "sekrit", remember: false }));
    setup((url, init) => {
      const auth = headerOf(init, "Authorization");
      seen.push(auth);
      if (auth !== "Bearer sekrit") {
        return json(401, { error: { message: "missing or incorrect API key", type: "authentication_error", param: null, code: "invalid_api_key" } });
      }
      return url === "/strata/devices" ? json(200, { devices: [] }) : json(200, { slots: 0 });
    }, ask);
    expect(await transport.devices()).toEqual({ devices: [] });
    expect(ask).toHaveBeenCalledTimes(1);
    expect(ask.mock.calls[0]).toEqual(["missing or incorrect API key"]);
    // Kept for this tab only: nothing in localStorage.
    expect(sessionStorage.getItem(KEY_STORAGE)).toBe("sekrit");
    expect(localStorage.length).toBe(0);
    await transport.cache();
    expect(seen).toEqual([null, "Bearer sekrit", "Bearer sekrit"]);
    expect(ask).toHaveBeenCalledTimes(1);
  });

  it("keeps the key on this browser only when asked to remember it, in one place", async () => {
    let answer = { key: "first", remember: true };
    let want = "first";
    setup((_url, init) =>
      headerOf(init, "Authorization") === `Bearer ${want}` ? json(200, { devices: [] }) : json(401, { error: { message: "missing or incorrect API key" } }),
      async () => answer,
    );
    await transport.devices();
    expect(localStorage.getItem(REMEMBERED_KEY_STORAGE)).toBe("first");
    expect(sessionStorage.getItem(KEY_STORAGE)).toBeNull();
    // A new page of this browser (a new tab: its sessionStorage empty) sends it from the start.
    const next = mockFetch(() => json(200, { devices: [] }));
    await new HttpTransport({ fetch: next as unknown as typeof fetch }).devices();
    expect(headerOf(next.mock.calls[0]![1]!, "Authorization")).toBe("Bearer first");
    // The key is refused later, and the new one is not to be remembered: the remembered one goes.
    answer = { key: "second", remember: false };
    want = "second";
    await transport.devices();
    expect(localStorage.getItem(REMEMBERED_KEY_STORAGE)).toBeNull();
    expect(sessionStorage.getItem(KEY_STORAGE)).toBe("second");
    transport.client.clearKey();
    expect([sessionStorage.length, localStorage.length]).toEqual([0, 0]);
  });

  it("moves a key an older UI left in localStorage to this tab's storage", async () => {
    localStorage.setItem(KEY_STORAGE, "from-before");
    const f = setup(() => json(200, { devices: [] }));
    await transport.devices();
    expect(headerOf(f.mock.calls[0]![1]!, "Authorization")).toBe("Bearer from-before");
    expect(localStorage.getItem(KEY_STORAGE)).toBeNull();
    expect(sessionStorage.getItem(KEY_STORAGE)).toBe("from-before");
  });

  it("rejects with the server's message when the user declines", async () => {
    setup(() => json(401, { error: { message: "missing or incorrect API key", type: "authentication_error" } }), async () => null);
    await expect(transport.devices()).rejects.toMatchObject({ message: "missing or incorrect API key" });
  });

  it("uses a key remembered on an earlier visit, or kept earlier in this tab", async () => {
    localStorage.setItem(REMEMBERED_KEY_STORAGE, "old");
    const f = setup(() => json(200, { devices: [] }));
    await transport.devices();
    expect(headerOf(f.mock.calls[0]![1]!, "Authorization")).toBe("Bearer old");
    sessionStorage.setItem(KEY_STORAGE, "this-tab");
    const g = setup(() => json(200, { devices: [] }));
    await transport.devices();
    expect(headerOf(g.mock.calls[0]![1]!, "Authorization")).toBe("Bearer this-tab");
  });
});

describe("HttpTransport Strata API", () => {
  it("turns a 400 of POST /strata/plan into an error at the field its param names", async () => {
    let posted: unknown;
    setup((url, init) => {
      posted = JSON.parse(String(init.body));
      expect(url).toBe("/strata/plan");
      expect(init.method).toBe("POST");
      return json(400, { error: { message: "layer_split: 40 is past the model's 30 layers", type: "invalid_request_error", param: "layer_split", code: null } });
    });
    const err = await transport.plan(settings({ layer_split: "40" })).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(TransportError);
    expect(err).toMatchObject({ code: "invalid", field: "layer_split", message: "layer_split: 40 is past the model's 30 layers" });
    expect(posted).toMatchObject({ layer_split: "40" });
  });

  it("loads a model in place: POST /strata/model/load with the served settings and the new path; a refusal names why", async () => {
    const bodies: unknown[] = [];
    let refuse = false;
    setup((url, init) => {
      if (url === "/strata/settings") return json(200, settings({ model_path: "/srv/a.gguf", cache_mib: 512 }));
      if (url === "/strata/model") return json(200, { id: "b", name: "b", path: "/m/b.gguf", architecture: "llama" });
      expect(url).toBe("/strata/model/load");
      bodies.push(JSON.parse(String(init.body)));
      if (refuse) {
        return json(409, { error: { message: "changing the devices needs the engine started again", type: "invalid_request_error", param: "devices", code: "needs_restart" } });
      }
      return json(200, { model: { id: "b", name: "b", path: "/m/b.gguf", architecture: "llama" }, switch: { ms: 40, parked: 1, cached: 1 } });
    });
    const stages: string[] = [];
    const facts = await transport.loadModel("/m/b.gguf", (p) => stages.push(p.stage));
    expect(bodies[0]).toMatchObject({ model_path: "/m/b.gguf", cache_mib: 512 });
    expect(facts).toMatchObject({ name: "b", path: "/m/b.gguf", architecture: "llama" });
    expect(stages).toEqual(["planning", "loading", "ready"]);
    expect((await transport.currentModel())?.path).toBe("/m/b.gguf");
    refuse = true;
    const err = await transport.loadModel("/m/c.gguf", () => {}).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(TransportError);
    expect(err).toMatchObject({ field: "devices", message: "changing the devices needs the engine started again" });
  });

  it("plans and reads settings", async () => {
    const reply = { plan: plan([row()]), flags: ["--devices", "sim:200"] };
    setup((url) => (url === "/strata/settings" ? json(200, settings()) : json(200, reply)));
    expect(await transport.getSettings()).toEqual(settings());
    expect(await transport.plan(settings())).toEqual(reply);
  });

  it("maps /health to EngineStatus: ready with the model, or failed with the reason", async () => {
    setup((url) =>
      url === "/health"
        ? json(200, { status: "ok", model: "SmolLM2", busy: false, queue: 0 })
        : json(200, { id: "SmolLM2", path: "/m/SmolLM2.gguf", architecture: "llama", quantization: "Q4_1", parameters: 1, layers: 30, trained_context: 8192, vocab: 49152, file_bytes: 2, context: 4096, split: [], flags: [] }),
    );
    const s = await transport.engineStatus();
    expect(s).toMatchObject({ state: "ready", message: null });
    expect(s.model).toMatchObject({ name: "SmolLM2", layers: 30, trained_context: 8192 });
    setup(() => json(503, { status: "unhealthy", reason: "a sticky CUDA fault on cuda:0" }));
    expect(await transport.engineStatus()).toMatchObject({ state: "failed", message: "a sticky CUDA fault on cuda:0" });
    setup(() => Promise.reject(new TypeError("Failed to fetch")));
    expect(await transport.engineStatus()).toMatchObject({ state: "failed", message: expect.stringContaining("cannot reach strata serve") });
  });

  it("says no data when the server has no Strata API (404)", async () => {
    setup(() => json(404, { error: { message: "no such path", type: "not_found_error", code: "not_found" } }));
    expect(await transport.devices()).toBeNull();
    expect(await transport.telemetry(0)).toBeNull();
    expect(await transport.cache()).toBeNull();
  });

  it("asks telemetry since a time", async () => {
    const f = setup(() => json(200, { now_ms: 5, samples: [], events: [] }));
    await transport.telemetry(1234.5);
    expect(f.mock.calls[0]![0]).toBe("/strata/telemetry?since_ms=1234.5");
  });

  it("follows /strata/events, split across chunks, and reconnects when it drops", async () => {
    const sample = { t_ms: 10, device: 0, free_bytes: 100 * MIB, total_bytes: 200 * MIB };
    const event = { t_ms: 11, event: "evicted", tokens: 5, bytes: 1024 };
    let connects = 0;
    const gaps: string[] = [];
    const missed = { t_ms: 12, device: 1, free_bytes: MIB, total_bytes: 2 * MIB };
    setup((url) => {
      if (url.startsWith("/strata/telemetry")) {
        gaps.push(url);
        return json(200, { now_ms: 13, samples: [missed], events: [] });
      }
      expect(url).toBe("/strata/events");
      connects++;
      const text = `event: sample\ndata: ${JSON.stringify(sample)}\n\n: ping\n\nevent: engine\ndata: ${JSON.stringify(event)}\n\n`;
      return streamed([text.slice(0, 17), text.slice(17, 60), text.slice(60)]);
    });
    const got: TelemetryEntry[] = [];
    const stop = transport.onTelemetry((e) => got.push(e));
    await vi.waitFor(() => expect(connects).toBeGreaterThanOrEqual(2));
    stop();
    expect(got.slice(0, 4)).toEqual([sample, event, missed, sample]);
    // After the drop, what was missed since the last entry seen is read before the new stream.
    expect(gaps[0]).toBe("/strata/telemetry?since_ms=11");
  });
});

describe("HttpTransport exports", () => {
  it("saves an export as a browser download named after the title", async () => {
    setup(() => json(404, {}));
    const conv = await transport.createConversation("Trip: Lisbon");
    const create = vi.fn((_b: Blob) => "blob:x");
    Object.assign(URL, { createObjectURL: create, revokeObjectURL: vi.fn() });
    const names: string[] = [];
    const click = vi.spyOn(HTMLAnchorElement.prototype, "click").mockImplementation(function (this: HTMLAnchorElement) {
      names.push(this.download);
    });
    expect(await transport.saveExport(conv.id, "markdown")).toBe("Trip-Lisbon.md");
    expect(await transport.saveExport(conv.id, "json")).toBe("Trip-Lisbon.json");
    // Renamed, it is exported under the new title; untitled, under the one it is shown with.
    await transport.renameConversation(conv.id, "Trip:\n  Porto ");
    expect(await transport.saveExport(conv.id, "markdown")).toBe("Trip-Porto.md");
    const untitled = await transport.createConversation(null);
    expect(await transport.saveExport(untitled.id, "markdown")).toBe("New-conversation.md");
    expect(names).toEqual(["Trip-Lisbon.md", "Trip-Lisbon.json", "Trip-Porto.md", "New-conversation.md"]);
    const texts = await Promise.all(create.mock.calls.map((c) => c[0].text()));
    expect(texts[0]).toBe(exportDocument(conv, "markdown"));
    expect(texts[0]).toBe("# Trip: Lisbon\n");
    expect(JSON.parse(texts[1]!)).toMatchObject({ id: conv.id, title: "Trip: Lisbon", messages: [] });
    expect(texts[2]).toMatch(/^# Trip: Porto\n/);
    expect(texts[3]).toMatch(/^# New conversation\n/);
    click.mockRestore();
  });
});

describe("HttpTransport titles", () => {
  it("keeps a new conversation untitled until its first user message names it by chat/conversation.ts", async () => {
    setup((url) => models(url) ?? streamed([`data: {"choices":[{"index":0,"delta":{"content":"ok"},"finish_reason":"stop"}]}\n\n`, "data: [DONE]\n\n"]));
    const conv = await transport.createConversation(null);
    expect(conv.title).toBe("");
    const messages = [{ role: "user" as const, content: "\n  A question about   trains, buses and ferries in Portugal in the summer\nmore" }];
    await transport.chatSend(conv.id, messages, NO_PARAMS, () => {});
    const named = (await transport.getConversation(conv.id)).title;
    expect(named).toBe(titleFrom(messages));
    expect(named).toBe("A question about trains, buses and ferries in P…");
    // A title it has is kept by the next messages.
    await transport.chatSend(conv.id, [...messages, { role: "assistant", content: "ok" }, { role: "user", content: "Next" }], NO_PARAMS, () => {});
    expect((await transport.getConversation(conv.id)).title).toBe(named);
  });
});
