// A thinking model's reasoning: `reasoning_content` deltas become reasoning chunks (before the text of the
// same delta), the reply keeps them apart from its text, the HTTP transport stores them with the reply, and
// the chat view shows them folded in a "Thinking" disclosure above the answer, marked busy while it streams.
import { act, fireEvent, render, screen, waitFor } from "@testing-library/preact";
import { beforeEach, describe, expect, it, vi } from "vitest";
import type { ChatChunk } from "../src/bindings";
import { NO_PARAMS } from "../src/chat/params";
import { applyChunk, newReply, replyToMessage } from "../src/chat/reply";
import { HttpTransport } from "../src/transport/http";
import { newStreamState, onStreamData } from "../src/transport/http/openai";
import { ChatView, historyOf } from "../src/views/chat/ChatView";
import { conversation, FakeTransport } from "./fakes";

const delta = (d: object, finish: string | null = null) =>
  JSON.stringify({
    object: "chat.completion.chunk",
    choices: [{ index: 0, delta: d, logprobs: null, finish_reason: finish }],
  });

describe("reasoning in the stream", () => {
  it("turns reasoning_content into reasoning chunks, before the content of the same delta", () => {
    const s = newStreamState();
    expect(onStreamData(s, delta({ role: "assistant", content: null }))).toEqual([]);
    expect(onStreamData(s, delta({ reasoning_content: "Let me see." }))).toEqual([
      { kind: "reasoning", text: "Let me see." },
    ]);
    expect(onStreamData(s, delta({ content: "42", reasoning_content: " Done." }))).toEqual([
      { kind: "reasoning", text: " Done." },
      { kind: "text", text: "42" },
    ]);
    expect(onStreamData(s, delta({ reasoning_content: "" }))).toEqual([]);
  });

  it("keeps the reasoning apart from the text, drops it on retrying, and puts it in the stored message", () => {
    let r = newReply();
    r = applyChunk(r, { kind: "reasoning", text: "Hmm" });
    expect(r).toMatchObject({ reasoning: "Hmm", text: "" });
    r = applyChunk(r, { kind: "retrying", reason: "" });
    expect(r.reasoning).toBe("");
    r = applyChunk(r, { kind: "reasoning", text: "Think" });
    r = applyChunk(r, { kind: "reasoning", text: "ing" });
    r = applyChunk(r, { kind: "text", text: "Answer" });
    r = applyChunk(r, { kind: "done", finish_reason: "stop", figures: null });
    expect(replyToMessage(r)).toMatchObject({ content: "Answer", reasoning: "Thinking", complete: true });
    expect(replyToMessage(applyChunk(newReply(), { kind: "text", text: "x" }))).not.toHaveProperty("reasoning");
  });

  it("sends a reply's reasoning back to the backend with its text, never empty replies", () => {
    const h = historyOf([
      { role: "user", content: "q", figures: null, complete: true },
      { role: "assistant", content: "a", reasoning: "r", figures: null, complete: true },
      { role: "assistant", content: "", figures: null, complete: false },
    ]);
    expect(h).toEqual([
      { role: "user", content: "q" },
      { role: "assistant", content: "a", reasoning: "r" },
    ]);
  });
});

describe("HttpTransport with a thinking model", () => {
  beforeEach(() => localStorage.clear());

  it("delivers reasoning then text, stores both, and sends only roles and text to the server", async () => {
    const sse =
      [
        delta({ role: "assistant", content: null }),
        delta({ reasoning_content: "The user" }),
        delta({ reasoning_content: " asks." }),
        delta({ content: "Hi!" }),
        delta({}, "stop"),
      ]
        .map((d) => `data: ${d}\n\n`)
        .join("") + "data: [DONE]\n\n";
    const bodies: unknown[] = [];
    const f = vi.fn(async (input: RequestInfo | URL, init?: RequestInit) => {
      const url = String(input);
      if (url === "/v1/models") return new Response(JSON.stringify({ data: [{ id: "Qwen3" }] }), { status: 200 });
      bodies.push(JSON.parse(String(init?.body)));
      return new Response(sse, { status: 200, headers: { "Content-Type": "text/event-stream" } });
    });
    const transport = new HttpTransport({ fetch: f as unknown as typeof fetch });
    const conv = await transport.createConversation(null);
    const chunks: ChatChunk[] = [];
    const history = [
      { role: "user" as const, content: "q0" },
      { role: "assistant" as const, content: "a0", reasoning: "r0" },
      { role: "user" as const, content: "hello" },
    ];
    await transport.chatSend(conv.id, history, NO_PARAMS, (c) => chunks.push(c));
    expect(chunks.map((c) => c.kind)).toEqual(["stored", "reasoning", "reasoning", "text", "done"]);
    const stored = await transport.getConversation(conv.id);
    expect(stored.messages[1]).toMatchObject({ content: "a0", reasoning: "r0" });
    expect(stored.messages[3]).toMatchObject({ content: "Hi!", reasoning: "The user asks.", complete: true });
    expect((bodies[0] as { messages: unknown }).messages).toEqual([
      { role: "user", content: "q0" },
      { role: "assistant", content: "a0" },
      { role: "user", content: "hello" },
    ]);
  });
});

describe("ChatView with reasoning", () => {
  async function send() {
    const t = new FakeTransport();
    t.listConversations.mockResolvedValue([{ id: "c1", title: "First", updated_ms: 2, messages: 0 }]);
    t.getConversation.mockResolvedValue(conversation({ id: "c1" }));
    render(<ChatView transport={t} />);
    await screen.findByRole("heading", { name: "First" });
    const input = screen.getByTestId("chat-input") as HTMLTextAreaElement;
    fireEvent.input(input, { target: { value: "why?" } });
    fireEvent.keyDown(input, { key: "Enter" });
    await waitFor(() => expect(t.chatSend).toHaveBeenCalled());
    return t;
  }
  const chunk = async (t: FakeTransport, c: ChatChunk) => act(async () => t.sendChunk(c));

  it("folds the reasoning above the answer: Thinking… while it streams, closed, and opens on a click", async () => {
    const t = await send();
    await chunk(t, { kind: "reasoning", text: "First, the sky." });
    const details = screen.getByTestId("reasoning") as HTMLDetailsElement;
    expect(details.open).toBe(false);
    expect(details.getAttribute("aria-busy")).toBe("true");
    expect(screen.getByTestId("reasoning-summary").textContent).toBe("Thinking…");
    expect(screen.getByTestId("reasoning-text").textContent).toBe("First, the sky.");
    // The reasoning is not the answer, and the typing dots give way to the disclosure.
    expect(screen.getByTestId("markdown").textContent).toBe("");
    expect(document.querySelector(".message-typing")).toBeNull();

    await chunk(t, { kind: "text", text: "Because of **Rayleigh** scattering." });
    expect(screen.getByTestId("reasoning-summary").textContent).toBe("Thinking");
    expect(screen.getByTestId("reasoning").getAttribute("aria-busy")).toBe("false");
    const reply = screen.getByTestId("message-assistant");
    // Above the answer, in the same message.
    const order = Array.from(reply.querySelectorAll("[data-testid]")).map((e) => e.getAttribute("data-testid"));
    expect(order.indexOf("reasoning")).toBeLessThan(order.indexOf("markdown"));
    expect(screen.getByTestId("markdown").textContent?.trim()).toBe("Because of Rayleigh scattering.");

    await chunk(t, { kind: "done", finish_reason: "stop", figures: null });
    await waitFor(() => expect(screen.getByTestId("message-assistant").getAttribute("aria-busy")).toBe("false"));
    const done = screen.getByTestId("reasoning") as HTMLDetailsElement;
    expect(done.open).toBe(false);
    fireEvent.click(screen.getByTestId("reasoning-summary"));
    await waitFor(() => expect((screen.getByTestId("reasoning") as HTMLDetailsElement).open).toBe(true));
    expect(screen.getByTestId("reasoning-text").textContent).toBe("First, the sky.");
  });

  it("shows no disclosure for a reply without reasoning, and one for a stored reply with it", async () => {
    const t = await send();
    await chunk(t, { kind: "text", text: "Plain." });
    expect(screen.queryByTestId("reasoning")).toBeNull();
    await chunk(t, { kind: "done", finish_reason: "stop", figures: null });

    const t2 = new FakeTransport();
    t2.listConversations.mockResolvedValue([{ id: "c2", title: "Old", updated_ms: 2, messages: 2 }]);
    t2.getConversation.mockResolvedValue(
      conversation({
        id: "c2",
        title: "Old",
        messages: [
          { role: "user", content: "q", figures: null, complete: true },
          { role: "assistant", content: "a", reasoning: "because", figures: null, complete: true },
        ],
      }),
    );
    document.body.innerHTML = "";
    render(<ChatView transport={t2} />);
    await screen.findByRole("heading", { name: "Old" });
    expect(screen.getByTestId("reasoning-summary").textContent).toBe("Thinking");
    expect(screen.getByTestId("reasoning-text").textContent).toBe("because");
  });
});
