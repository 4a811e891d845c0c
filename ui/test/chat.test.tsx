// The chat view over a fake transport: Enter sends and Shift+Enter does not, chunks stream into the reply,
// a retrying chunk clears the partial reply with a note, Stop calls chat_cancel, figures show under the
// reply, errors show inline, and model output renders with no script, handler or javascript: link. Two
// conversations stream at once: chunks interleaved land each in its own, Stop in one leaves the other
// streaming, Send is blocked only in the streaming one, and the list marks each replying conversation.
import { act, fireEvent, render, screen, waitFor, within } from "@testing-library/preact";
import { describe, expect, it, vi } from "vitest";
import type { ChatChunk, Conversation, StoredMessage } from "../src/bindings";
import { NO_PARAMS } from "../src/chat/params";
import { ChatView } from "../src/views/chat/ChatView";
import { conversation, FakeTransport, MIB, summary } from "./fakes";

async function setup(existing = true, stopGraceMs = 3000) {
  const t = new FakeTransport();
  if (existing) {
    t.listConversations.mockResolvedValue([{ id: "c1", title: "First", updated_ms: 2, messages: 0 }]);
    t.getConversation.mockResolvedValue(conversation({ id: "c1" }));
  }
  render(<ChatView transport={t} stopGraceMs={stopGraceMs} />);
  if (existing) await screen.findByRole("heading", { name: "First" });
  const input = screen.getByTestId("chat-input") as HTMLTextAreaElement;
  return { t, input };
}

async function type(input: HTMLTextAreaElement, text: string) {
  fireEvent.input(input, { target: { value: text } });
}

async function chunk(t: FakeTransport, c: ChatChunk) {
  await act(async () => t.sendChunk(c));
}

describe("ChatView", () => {
  it("sends on Enter, not on Shift+Enter", async () => {
    const { t, input } = await setup();
    await type(input, "line one");
    fireEvent.keyDown(input, { key: "Enter", shiftKey: true });
    expect(t.chatSend).not.toHaveBeenCalled();
    await type(input, "line one\nline two");
    fireEvent.keyDown(input, { key: "Enter" });
    await waitFor(() => expect(t.chatSend).toHaveBeenCalledTimes(1));
    const [id, messages, params] = t.chatSend.mock.calls[0]!;
    expect(id).toBe("c1");
    expect(messages).toEqual([{ role: "user", content: "line one\nline two" }]);
    // Nothing set in the panel: no sampling field, and the reply limit as max_tokens.
    expect(params).toEqual({ ...NO_PARAMS, max_tokens: 2048 });
    expect(input.value).toBe("");
    expect(screen.getByTestId("message-user").textContent).toContain("line one\nline two");
  });

  it("shows an untitled conversation as New conversation in the list and the heading", async () => {
    const t = new FakeTransport();
    t.listConversations.mockResolvedValue([{ id: "c1", title: "", updated_ms: 2, messages: 0 }]);
    t.getConversation.mockResolvedValue(conversation({ id: "c1", title: "" }));
    render(<ChatView transport={t} />);
    await screen.findByRole("heading", { name: "New conversation" });
    const item = screen.getByRole("button", { name: /messages$/ });
    expect(item.querySelector(".conversation-title")?.textContent).toBe("New conversation");
  });

  it("creates a conversation when there is none", async () => {
    const { t, input } = await setup(false);
    await type(input, "hello");
    fireEvent.keyDown(input, { key: "Enter" });
    await waitFor(() => expect(t.chatSend).toHaveBeenCalled());
    expect(t.createConversation).toHaveBeenCalledWith(null);
    expect(t.chatSend.mock.calls[0]![0]).toBe("new");
  });

  it("appends streamed text, restarts it on retrying with a note, and shows the figures", async () => {
    const { t, input } = await setup();
    await type(input, "hi");
    fireEvent.keyDown(input, { key: "Enter" });
    await waitFor(() => expect(t.chatSend).toHaveBeenCalled());
    await chunk(t, { kind: "text", text: "Partial " });
    await chunk(t, { kind: "text", text: "answer" });
    const reply = () => screen.getByTestId("message-assistant");
    expect(reply().textContent).toContain("Partial answer");
    await chunk(t, { kind: "retrying", reason: "" });
    expect(reply().textContent).not.toContain("Partial");
    expect(screen.getByTestId("reply-note").textContent).toBe("engine restarted, retrying");
    await chunk(t, { kind: "text", text: "Fresh **reply**" });
    const figures = summary({
      gen_tok_s: 42.5,
      reused: 30,
      read: 6,
      restored: "live",
      restored_tokens: 30,
      drafts_accepted: 2,
      drafts_proposed: 3,
      fallback: { reason: "gate", device: 1, free_bytes: 40 * MIB, need_bytes: 120 * MIB, reserve_bytes: 64 * MIB, tokens: 30 },
    });
    await chunk(t, { kind: "done", finish_reason: "stop", figures });
    await waitFor(() => expect(screen.getByTestId("figures")).toBeTruthy());
    expect(reply().querySelector("strong")?.textContent).toBe("reply");
    const shown = within(screen.getByTestId("figures"))
      .getAllByRole("listitem")
      .map((li) => li.textContent);
    expect(shown).toEqual([
      "42.5 tok/s",
      "30 reused · 6 read",
      "restored live (30 tokens)",
      "fallback: gate on device 1: free 40 MiB, need 120 MiB, reserve 64 MiB",
      "drafts 2/3 accepted",
    ]);
    // The note stays with the reply once it has ended; the Send button is back.
    expect(screen.getByTestId("reply-note").textContent).toBe("engine restarted, retrying");
    expect(screen.getByRole("button", { name: "Send" })).toBeTruthy();
  });

  it("shows Stop while streaming, which calls chat_cancel and ends the reply", async () => {
    const { t, input } = await setup();
    await type(input, "count to 100");
    fireEvent.keyDown(input, { key: "Enter" });
    await waitFor(() => expect(t.chatSend).toHaveBeenCalled());
    await chunk(t, { kind: "text", text: "1, 2, 3" });
    expect(screen.queryByRole("button", { name: "Send" })).toBeNull();
    fireEvent.click(screen.getByRole("button", { name: "Stop" }));
    await waitFor(() => expect(t.chatCancel).toHaveBeenCalledWith("c1"));
    // The backend flushes what it had, then ends the reply as cancelled.
    await chunk(t, { kind: "text", text: ", 4" });
    await chunk(t, { kind: "done", finish_reason: "cancelled", figures: null });
    await waitFor(() => expect(screen.getByTestId("reply-stopped")).toBeTruthy());
    expect(screen.getByTestId("message-assistant").textContent).toContain("1, 2, 3, 4");
    expect(screen.getByRole("button", { name: "Send" })).toBeTruthy();
  });

  it("ends the reply itself when the backend says nothing after chat_cancel", async () => {
    const { t, input } = await setup(true, 20);
    await type(input, "count");
    fireEvent.keyDown(input, { key: "Enter" });
    await waitFor(() => expect(t.chatSend).toHaveBeenCalled());
    await chunk(t, { kind: "text", text: "1" });
    fireEvent.click(screen.getByRole("button", { name: "Stop" }));
    await waitFor(() => expect(screen.getByTestId("reply-stopped")).toBeTruthy());
    await chunk(t, { kind: "text", text: " late" });
    expect(screen.getByTestId("message-assistant").textContent).not.toContain("late");
  });

  it("does not send a second message while a reply streams", async () => {
    const { t, input } = await setup();
    await type(input, "one");
    fireEvent.keyDown(input, { key: "Enter" });
    await waitFor(() => expect(t.chatSend).toHaveBeenCalledTimes(1));
    await type(input, "two");
    fireEvent.keyDown(input, { key: "Enter" });
    await new Promise((r) => setTimeout(r, 10));
    expect(t.chatSend).toHaveBeenCalledTimes(1);
  });

  it("shows an error chunk, and a rejected send, inline on that reply", async () => {
    const { t, input } = await setup();
    await type(input, "hi");
    fireEvent.keyDown(input, { key: "Enter" });
    await waitFor(() => expect(t.chatSend).toHaveBeenCalled());
    await chunk(t, { kind: "text", text: "so" });
    await chunk(t, { kind: "error", message: "out of memory on cuda:1" });
    await waitFor(() => expect(screen.getByTestId("reply-error").textContent).toBe("out of memory on cuda:1"));

    t.chatSend.mockRejectedValueOnce({ code: "busy", field: null, message: "the engine is restarting" });
    await type(input, "again");
    fireEvent.keyDown(input, { key: "Enter" });
    await waitFor(() => expect(screen.getAllByTestId("reply-error").map((e) => e.textContent)).toContain("the engine is restarting"));
  });

  it("renders model output without script, event handlers or javascript: links", async () => {
    const { t, input } = await setup();
    const alert = vi.fn();
    (window as unknown as { alert: unknown }).alert = alert;
    await type(input, "be evil");
    fireEvent.keyDown(input, { key: "Enter" });
    await waitFor(() => expect(t.chatSend).toHaveBeenCalled());
    await chunk(t, {
      kind: "text",
      text: 'Look: <img src=x onerror=alert(1)> <script>alert(2)</script> [click](javascript:alert(3)) <a href="javascript:alert(4)" onclick="alert(5)">raw</a>',
    });
    await chunk(t, { kind: "done", finish_reason: "stop", figures: null });
    const md = await screen.findByTestId("markdown");
    expect(md.querySelector("script, img, iframe")).toBeNull();
    for (const el of md.querySelectorAll("*")) {
      for (const a of el.attributes) {
        expect(a.name.startsWith("on")).toBe(false);
        expect(a.value).not.toMatch(/javascript:/i);
      }
    }
    expect(md.querySelector("a[href]")).toBeNull();
    for (const a of md.querySelectorAll("a")) fireEvent.click(a);
    expect(alert).not.toHaveBeenCalled();
    expect(md.textContent).toContain("<script>alert(2)</script>");
  });

  it("renames, deletes and exports the selected conversation", async () => {
    const { t } = await setup();
    t.renameConversation.mockImplementation(async (id, title) => {
      t.listConversations.mockResolvedValue([{ id, title, updated_ms: 3, messages: 0 }]);
    });
    fireEvent.click(screen.getByRole("button", { name: "Rename" }));
    fireEvent.input(screen.getByLabelText("Title"), { target: { value: "Renamed" } });
    fireEvent.click(screen.getByRole("button", { name: "Save" }));
    await waitFor(() => expect(t.renameConversation).toHaveBeenCalledWith("c1", "Renamed"));
    // The transport saves the file (the app's save dialog, or a browser download), named from the stored
    // title (tauri.test.ts and http.test.ts show the name).
    fireEvent.click(screen.getByRole("button", { name: "Export Markdown" }));
    await waitFor(() => expect(t.saveExport).toHaveBeenCalledWith("c1", "markdown"));
    fireEvent.click(screen.getByRole("button", { name: "Export JSON" }));
    await waitFor(() => expect(t.saveExport).toHaveBeenCalledWith("c1", "json"));
    fireEvent.click(screen.getByRole("button", { name: "Delete" }));
    expect(t.deleteConversation).not.toHaveBeenCalled();
    fireEvent.click(within(screen.getByRole("group", { name: "Delete this conversation?" })).getByRole("button", { name: "Delete" }));
    await waitFor(() => expect(t.deleteConversation).toHaveBeenCalledWith("c1"));
  });
});

/**
 * Two conversations, "First" (c1) open and "Second" (c2). The fake backend stores what the view sends as a
 * real one does: the user's message and the reply as it streams (incomplete), complete once it ends.
 */
async function setupTwo(stopGraceMs = 3000) {
  const t = new FakeTransport();
  const stored: Record<string, Conversation> = {
    c1: conversation({ id: "c1", title: "First" }),
    c2: conversation({ id: "c2", title: "Second", updated_ms: 1 }),
  };
  t.listConversations.mockImplementation(async () =>
    Object.values(stored).map((c) => ({ id: c.id, title: c.title, updated_ms: c.updated_ms, messages: c.messages.length })),
  );
  t.getConversation.mockImplementation(async (id) => structuredClone(stored[id]!));
  t.chatSend.mockImplementation(async (id, messages, _p, on) => {
    const c = stored[id]!;
    const reply: StoredMessage = { role: "assistant", content: "", figures: null, complete: false };
    c.messages = [...messages.map((m) => ({ ...m, figures: null, complete: true })), reply];
    t.sendChunk = on;
    // What the backend streams is stored as it goes; its end completes the stored reply.
    (t as unknown as { chunkOf: Map<string, (c: ChatChunk) => void> }).chunkOf.set(id, (ch) => {
      if (ch.kind === "text") reply.content += ch.text;
      if (ch.kind === "done") reply.complete = true;
      on(ch);
    });
  });
  render(<ChatView transport={t} stopGraceMs={stopGraceMs} />);
  await screen.findByRole("heading", { name: "First" });
  const input = screen.getByTestId("chat-input") as HTMLTextAreaElement;
  return { t, input };
}

const row = (title: string) => screen.getByRole("button", { name: new RegExp(`^${title}`) });
const replyingRows = () => screen.queryAllByTestId("conversation-replying").map((el) => el.closest("button")?.querySelector(".conversation-title")?.textContent);

async function open(title: string) {
  fireEvent.click(row(title));
  await screen.findByRole("heading", { name: title });
}

async function sendIn(input: HTMLTextAreaElement, text: string) {
  await type(input, text);
  fireEvent.keyDown(input, { key: "Enter" });
  await waitFor(() => expect(userTexts()).toContain(text));
}

async function chunkTo(t: FakeTransport, id: string, c: ChatChunk) {
  await act(async () => t.sendChunkTo(id, c));
}

const userTexts = () => screen.queryAllByTestId("message-user").map((m) => m.querySelector(".message-text")?.textContent ?? "");
const assistantTexts = () => screen.queryAllByTestId("message-assistant").map((m) => (m.querySelector('[data-testid="markdown"]')?.textContent ?? "").trim());

describe("ChatView with two conversations streaming at once", () => {
  it("streams both replies with chunks interleaved, each landing in its own conversation", async () => {
    const { t, input } = await setupTwo();
    await sendIn(input, "first question");
    await open("Second");
    // Send is not blocked by the reply streaming in First.
    await sendIn(input, "second question");
    await waitFor(() => expect(t.chatSend).toHaveBeenCalledTimes(2));
    expect(t.chatSend.mock.calls.map((c) => c[0])).toEqual(["c1", "c2"]);
    await waitFor(() => expect(replyingRows()).toEqual(["First", "Second"]));
    expect(row("First").getAttribute("aria-busy")).toBe("true");

    await chunkTo(t, "c1", { kind: "text", text: "Alpha " });
    await chunkTo(t, "c2", { kind: "text", text: "Beta " });
    await chunkTo(t, "c1", { kind: "text", text: "one" });
    await chunkTo(t, "c2", { kind: "text", text: "two" });
    // The open conversation shows its own reply only.
    expect(assistantTexts()).toEqual(["Beta two"]);

    // Back in First: its live reply, once (not also as stored so far), with all its text.
    await open("First");
    await waitFor(() => expect(assistantTexts()).toEqual(["Alpha one"]));
    expect(screen.getByRole("button", { name: "Stop" })).toBeTruthy();

    // Second's reply ends while First is open: it does not join First.
    await chunkTo(t, "c2", { kind: "done", finish_reason: "stop", figures: summary() });
    await waitFor(() => expect(replyingRows()).toEqual(["First"]));
    expect(assistantTexts()).toEqual(["Alpha one"]);
    expect(screen.queryByTestId("figures")).toBeNull();

    // First's ends in the open conversation: it joins its messages, with its figures.
    await chunkTo(t, "c1", { kind: "text", text: " more" });
    await chunkTo(t, "c1", { kind: "done", finish_reason: "stop", figures: summary({ gen_tok_s: 12 }) });
    await waitFor(() => expect(screen.getByTestId("figures").textContent).toContain("12.0 tok/s"));
    expect(assistantTexts()).toEqual(["Alpha one more"]);
    expect(replyingRows()).toEqual([]);
    expect(screen.getByRole("button", { name: "Send" })).toBeTruthy();

    // Second, read again, has its reply as the backend stored it.
    await open("Second");
    await waitFor(() => expect(assistantTexts()).toEqual(["Beta two"]));
    expect(userTexts()).toEqual(["second question"]);
  });

  it("blocks Send only in the conversation that is streaming", async () => {
    const { t, input } = await setupTwo();
    await sendIn(input, "first question");
    expect(screen.queryByRole("button", { name: "Send" })).toBeNull();
    await type(input, "again in First");
    fireEvent.keyDown(input, { key: "Enter" });
    await new Promise((r) => setTimeout(r, 10));
    expect(t.chatSend).toHaveBeenCalledTimes(1);

    await open("Second");
    expect(screen.queryByRole("button", { name: "Stop" })).toBeNull();
    await type(input, "in Second");
    const send = screen.getByRole("button", { name: "Send" }) as HTMLButtonElement;
    expect(send.disabled).toBe(false);
    fireEvent.click(send);
    await waitFor(() => expect(t.chatSend).toHaveBeenCalledTimes(2));
    expect(t.chatSend.mock.calls[1]![0]).toBe("c2");
    // Now Second streams too: Send is blocked here as well.
    expect(screen.queryByRole("button", { name: "Send" })).toBeNull();
    expect(screen.getByRole("button", { name: "Stop" })).toBeTruthy();
  });

  it("stops one conversation's reply and leaves the other streaming", async () => {
    const { t, input } = await setupTwo();
    await sendIn(input, "first question");
    await open("Second");
    await sendIn(input, "second question");
    await chunkTo(t, "c1", { kind: "text", text: "Alpha" });
    await chunkTo(t, "c2", { kind: "text", text: "Beta" });

    fireEvent.click(screen.getByRole("button", { name: "Stop" }));
    await waitFor(() => expect(t.chatCancel).toHaveBeenCalledWith("c2"));
    expect(t.chatCancel).toHaveBeenCalledTimes(1);
    await chunkTo(t, "c2", { kind: "done", finish_reason: "cancelled", figures: null });
    await waitFor(() => expect(screen.getByTestId("reply-stopped")).toBeTruthy());
    expect(screen.getByRole("button", { name: "Send" })).toBeTruthy();
    expect(replyingRows()).toEqual(["First"]);

    // First still streams: its later text arrives, and it is shown when opened.
    await chunkTo(t, "c1", { kind: "text", text: " goes on" });
    await open("First");
    await waitFor(() => expect(assistantTexts()).toEqual(["Alpha goes on"]));
    expect(screen.getByRole("button", { name: "Stop" })).toBeTruthy();
    expect(screen.queryByTestId("reply-stopped")).toBeNull();
  });

  it("ends only the stopped reply when the backend says nothing after chat_cancel", async () => {
    const { t, input } = await setupTwo(20);
    await sendIn(input, "first question");
    await open("Second");
    await sendIn(input, "second question");
    fireEvent.click(screen.getByRole("button", { name: "Stop" }));
    await waitFor(() => expect(screen.getByTestId("reply-stopped")).toBeTruthy());
    await new Promise((r) => setTimeout(r, 40));
    expect(replyingRows()).toEqual(["First"]);
    await chunkTo(t, "c1", { kind: "text", text: "still here" });
    await open("First");
    await waitFor(() => expect(assistantTexts()).toEqual(["still here"]));
    expect(screen.getByRole("button", { name: "Stop" })).toBeTruthy();
  });

  it("stops a replying conversation before deleting it, and refuses to rename it meanwhile", async () => {
    const { t, input } = await setupTwo();
    await sendIn(input, "first question");
    expect((screen.getByRole("button", { name: "Rename" }) as HTMLButtonElement).disabled).toBe(true);
    fireEvent.click(screen.getByRole("button", { name: "Delete" }));
    const confirm = screen.getByRole("group", { name: "Delete this conversation?" });
    expect(confirm.textContent).toContain("Its reply is stopped first.");
    t.chatCancel.mockImplementation(async (id) => t.sendChunkTo(id, { kind: "done", finish_reason: "cancelled", figures: null }));
    fireEvent.click(within(confirm).getByRole("button", { name: "Delete" }));
    await waitFor(() => expect(t.deleteConversation).toHaveBeenCalledWith("c1"));
    expect(t.chatCancel).toHaveBeenCalledWith("c1");
    expect(t.chatCancel.mock.invocationCallOrder[0]!).toBeLessThan(t.deleteConversation.mock.invocationCallOrder[0]!);
    // Once the reply has ended, Rename is back for a conversation that is not replying.
    await open("Second");
    expect((screen.getByRole("button", { name: "Rename" }) as HTMLButtonElement).disabled).toBe(false);
  });
});

describe("MessageItem", () => {
  it("re-renders a long streaming reply at most every 100 ms, and at once when it ends", async () => {
    const { MessageItem } = await import("../src/views/chat/MessageItem");
    const long = "word ".repeat(1000);
    const msg = (content: string) => ({ role: "assistant" as const, content, figures: null, complete: false });
    const { rerender } = render(<MessageItem message={msg(long + "A")} extras={{ status: "streaming" }} />);
    const md = () => screen.getByTestId("markdown").textContent ?? "";
    expect(md()).toContain("A");
    rerender(<MessageItem message={msg(long + "A B")} extras={{ status: "streaming" }} />);
    await waitFor(() => expect(md()).toContain("A B"), { timeout: 500 });
    rerender(<MessageItem message={msg(long + "A B C")} extras={{ status: "streaming" }} />);
    expect(md()).not.toContain("A B C");
    rerender(<MessageItem message={msg(long + "A B C D")} extras={{ status: "done" }} />);
    expect(md()).toContain("A B C D");
  });
});
