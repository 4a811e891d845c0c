// The chat view's Parameters panel and conversation list over a fake transport: empty fields show the
// model's effective values and their sources, values are saved per model and restored when that model is
// current again, Reset clears them, the reply limit goes as max_tokens only when Max tokens is empty, an
// out-of-range value is shown at its field and not sent, and the list's title and count change as soon as
// the backend has stored the message, while the reply still streams.
import { act, fireEvent, render, screen, waitFor, within } from "@testing-library/preact";
import { describe, expect, it } from "vitest";
import type { ConversationSummary, ModelFacts } from "../src/bindings";
import { NO_PARAMS } from "../src/chat/params";
import { TransportError } from "../src/transport/types";
import { ChatView } from "../src/views/chat/ChatView";
import { conversation, facts, FakeTransport, preferences, sampling } from "./fakes";

const SMOL = facts();
const OTHER = facts({
  path: "/models/Other-1B.gguf",
  name: "Other-1B",
  sampling: sampling({ temperature: { value: 0.8, source: "model" }, top_p: { value: 0.95, source: "default" }, preset: null }),
});

function transport(): FakeTransport {
  const t = new FakeTransport();
  t.listConversations.mockResolvedValue([{ id: "c1", title: "First", updated_ms: 2, messages: 0 }]);
  t.getConversation.mockResolvedValue(conversation({ id: "c1" }));
  return t;
}

async function show(t: FakeTransport, model: ModelFacts | null) {
  const view = render(<ChatView transport={t} model={model} />);
  await screen.findByRole("heading", { name: "First" });
  await waitFor(() => expect(t.getPreferences).toHaveBeenCalled());
  return view;
}

const field = (label: string) => screen.getByLabelText(label) as HTMLInputElement;
const source = (key: string) => screen.getByTestId(`param-source-${key}`).textContent;

function typeIn(label: string, value: string) {
  fireEvent.input(field(label), { target: { value } });
}

async function send(text: string) {
  const input = screen.getByTestId("chat-input") as HTMLTextAreaElement;
  fireEvent.input(input, { target: { value: text } });
  fireEvent.keyDown(input, { key: "Enter" });
}

describe("Parameters panel", () => {
  it("shows, for each empty field, the model's effective value and where it comes from", async () => {
    const t = transport();
    const { rerender } = await show(t, SMOL);
    expect(field("Temperature").placeholder).toBe("0.2");
    expect(source("temperature")).toBe("SmolLM2 (model card)");
    expect(field("Top p").placeholder).toBe("0.9");
    expect(source("top_p")).toBe("SmolLM2 (model card)");
    expect([field("Top k").placeholder, source("top_k")]).toEqual(["40", "Strata default"]);
    expect([field("Min p").placeholder, source("min_p")]).toEqual(["0.05", "Strata default"]);
    expect([field("Repeat penalty").placeholder, source("repeat_penalty")]).toEqual(["1", "Strata default"]);
    expect([field("Max tokens").placeholder, source("max_tokens")]).toEqual(["2048", "reply limit"]);
    // The source is the field's description; a set field still says what empty would give.
    expect(field("Temperature").getAttribute("aria-describedby")).toContain("param-temperature-source");
    typeIn("Temperature", "0.7");
    expect(source("temperature")).toBe("default 0.2 · SmolLM2 (model card)");
    // Another model, another source.
    rerender(<ChatView transport={t} model={OTHER} />);
    await waitFor(() => expect(field("Temperature").placeholder).toBe("0.8"));
    expect(source("temperature")).toBe("model file");
    expect(source("top_p")).toBe("Strata default");
  });

  it("saves the values for this model and restores them when it is current again", async () => {
    const t = transport();
    const { rerender, unmount } = await show(t, SMOL);
    typeIn("Temperature", "0.7");
    typeIn("Top k", "20");
    expect(screen.getByTestId("params-status").textContent).toBe("Not saved: for this session.");
    fireEvent.click(screen.getByRole("button", { name: "Save for this model" }));
    await waitFor(() => expect(t.savePreferences).toHaveBeenCalledTimes(1));
    const kept = t.savePreferences.mock.calls[0]![0];
    expect(kept.params_by_model).toEqual({ [SMOL.path]: { ...NO_PARAMS, temperature: 0.7, top_k: 20 } });
    await waitFor(() => expect(screen.getByTestId("params-status").textContent).toBe("Saved for this model."));
    // Sent as saved.
    await send("hi");
    await waitFor(() => expect(t.chatSend).toHaveBeenCalledTimes(1));
    expect(t.chatSend.mock.calls[0]![2]).toMatchObject({ temperature: 0.7, top_k: 20 });
    await act(async () => t.sendChunk({ kind: "done", finish_reason: "stop", figures: null }));
    // Another model has nothing saved: every field is empty.
    rerender(<ChatView transport={t} model={OTHER} />);
    await waitFor(() => expect(field("Temperature").value).toBe(""));
    expect(field("Top k").value).toBe("");
    // Back to the first: its values return.
    rerender(<ChatView transport={t} model={SMOL} />);
    await waitFor(() => expect(field("Temperature").value).toBe("0.7"));
    expect(field("Top k").value).toBe("20");
    expect(screen.getByTestId("params-status").textContent).toBe(`Saved for ${SMOL.name}.`);
    // And after a restart of the app (the preferences read back from the backend).
    unmount();
    await show(t, SMOL);
    await waitFor(() => expect(field("Temperature").value).toBe("0.7"));
  });

  it("switches JSON mode on for a reply, keeps it for this model, and off again", async () => {
    const t = transport();
    const { rerender } = await show(t, SMOL);
    const sw = () => screen.getByRole("switch", { name: "JSON mode" }) as HTMLInputElement;
    expect(sw().checked).toBe(false);
    expect(sw().getAttribute("aria-describedby")).toBe("param-json-mode-hint");
    expect(screen.getByText("Replies are a JSON object")).toBeTruthy();
    fireEvent.click(sw());
    expect(sw().checked).toBe(true);
    expect(screen.getByTestId("params-status").textContent).toBe("Not saved: for this session.");
    await send("one");
    await waitFor(() => expect(t.chatSend).toHaveBeenCalledTimes(1));
    expect(t.chatSend.mock.calls[0]![2]).toEqual({ ...NO_PARAMS, max_tokens: 2048, json_mode: true });
    await act(async () => t.sendChunk({ kind: "done", finish_reason: "stop", figures: null }));
    fireEvent.click(screen.getByRole("button", { name: "Save for this model" }));
    await waitFor(() => expect(t.savePreferences).toHaveBeenCalledTimes(1));
    expect(t.savePreferences.mock.calls[0]![0].params_by_model).toEqual({ [SMOL.path]: { ...NO_PARAMS, json_mode: true } });
    // Another model: off; back: on again.
    rerender(<ChatView transport={t} model={OTHER} />);
    await waitFor(() => expect(sw().checked).toBe(false));
    rerender(<ChatView transport={t} model={SMOL} />);
    await waitFor(() => expect(sw().checked).toBe(true));
    fireEvent.click(sw());
    await send("two");
    await waitFor(() => expect(t.chatSend).toHaveBeenCalledTimes(2));
    expect(t.chatSend.mock.calls[1]![2].json_mode).toBeNull();
  });

  it("Reset clears the fields and what was saved for this model", async () => {
    const t = transport();
    t.prefs = preferences({
      params_by_model: { [SMOL.path]: { ...NO_PARAMS, temperature: 1.2 }, [OTHER.path]: { ...NO_PARAMS, seed: 9 } },
    });
    await show(t, SMOL);
    await waitFor(() => expect(field("Temperature").value).toBe("1.2"));
    fireEvent.click(screen.getByRole("button", { name: "Reset" }));
    await waitFor(() => expect(t.savePreferences).toHaveBeenCalledTimes(1));
    expect(t.savePreferences.mock.calls[0]![0].params_by_model).toEqual({ [OTHER.path]: { ...NO_PARAMS, seed: 9 } });
    expect(field("Temperature").value).toBe("");
    expect(field("Temperature").placeholder).toBe("0.2");
    await send("hi");
    await waitFor(() => expect(t.chatSend).toHaveBeenCalled());
    expect(t.chatSend.mock.calls[0]![2]).toEqual({ ...NO_PARAMS, max_tokens: 2048 });
  });

  it("sends the reply limit as max_tokens only when Max tokens is empty, and keeps a new limit", async () => {
    const t = transport();
    await show(t, SMOL);
    await send("one");
    await waitFor(() => expect(t.chatSend).toHaveBeenCalledTimes(1));
    expect(t.chatSend.mock.calls[0]![2].max_tokens).toBe(2048);
    await act(async () => t.sendChunk({ kind: "done", finish_reason: "stop", figures: null }));
    // The user's own Max tokens wins.
    typeIn("Max tokens", "100");
    await send("two");
    await waitFor(() => expect(t.chatSend).toHaveBeenCalledTimes(2));
    expect(t.chatSend.mock.calls[1]![2].max_tokens).toBe(100);
    await act(async () => t.sendChunk({ kind: "done", finish_reason: "stop", figures: null }));
    // A new reply limit is kept and applies to replies whose Max tokens is empty.
    typeIn("Max tokens", "");
    typeIn("Reply limit", "300");
    fireEvent.change(field("Reply limit"), { target: { value: "300" } });
    await waitFor(() => expect(t.savePreferences).toHaveBeenCalledWith(preferences({ reply_limit_tokens: 300 })));
    await waitFor(() => expect(field("Max tokens").placeholder).toBe("300"));
    await send("three");
    await waitFor(() => expect(t.chatSend).toHaveBeenCalledTimes(3));
    expect(t.chatSend.mock.calls[2]![2].max_tokens).toBe(300);
  });

  it("shows a reply limit that is not a count at its field, and keeps nothing", async () => {
    const t = transport();
    await show(t, SMOL);
    fireEvent.change(field("Reply limit"), { target: { value: "0" } });
    expect(screen.getByTestId("error-reply_limit").textContent).toMatch(/from 1 to/);
    expect(field("Reply limit").getAttribute("aria-invalid")).toBe("true");
    expect(t.savePreferences).not.toHaveBeenCalled();
  });

  it("shows an out-of-range value at its field and does not send it", async () => {
    const t = transport();
    await show(t, SMOL);
    typeIn("Temperature", "3");
    expect(screen.getByTestId("error-temperature").textContent).toBe("Temperature must be between 0 and 2");
    expect(field("Temperature").getAttribute("aria-invalid")).toBe("true");
    expect((screen.getByRole("button", { name: "Save for this model" }) as HTMLButtonElement).disabled).toBe(true);
    await send("hi");
    await waitFor(() => expect(screen.getByRole("alert").textContent).toContain("Temperature must be between 0 and 2"));
    expect(t.chatSend).not.toHaveBeenCalled();
    typeIn("Temperature", "abc");
    expect(screen.getByTestId("error-temperature").textContent).toBe("Temperature must be a number");
    expect(field("Temperature").value).toBe("abc");
  });

  it("says why the values were not saved", async () => {
    const t = transport();
    t.savePreferences.mockRejectedValueOnce(new TransportError("io", "disk full"));
    await show(t, SMOL);
    typeIn("Seed", "5");
    fireEvent.click(screen.getByRole("button", { name: "Save for this model" }));
    await waitFor(() => expect(screen.getByTestId("params-error").textContent).toBe("not saved: disk full"));
  });

  it("with no model, cannot save, and shows what the engine decides", async () => {
    const t = transport();
    await show(t, null);
    expect(field("Temperature").placeholder).toBe("default");
    expect((screen.getByRole("button", { name: "Save for this model" }) as HTMLButtonElement).disabled).toBe(true);
    expect(screen.getByTestId("params-status").textContent).toMatch(/No model loaded/);
  });
});

describe("Conversation list while a reply streams", () => {
  it("shows the backend's title and count once the message is stored, before the reply ends", async () => {
    const t = new FakeTransport();
    const fresh: ConversationSummary = { id: "c1", title: "New conversation", updated_ms: 1, messages: 0 };
    t.listConversations.mockResolvedValue([fresh]);
    t.getConversation.mockResolvedValue(conversation({ id: "c1", title: "New conversation" }));
    render(<ChatView transport={t} model={SMOL} />);
    await screen.findByRole("heading", { name: "New conversation" });
    const list = () => within(screen.getByRole("complementary", { name: "Conversations" }));
    expect(list().getByText("0 messages")).toBeTruthy();
    await send("Plan a trip to Lisbon");
    await waitFor(() => expect(t.chatSend).toHaveBeenCalled());
    // The backend stores the message (titling the conversation by its own rule), then says so.
    t.listConversations.mockResolvedValue([{ ...fresh, title: "Plan a trip to Lisbon", messages: 2 }]);
    await act(async () => t.sendChunk({ kind: "stored" }));
    await act(async () => t.sendChunk({ kind: "text", text: "Day 1" }));
    await waitFor(() => expect(list().getByText("2 messages")).toBeTruthy());
    expect(list().getByText("Plan a trip to Lisbon")).toBeTruthy();
    expect(screen.getByRole("heading", { name: "Plan a trip to Lisbon" })).toBeTruthy();
    // Still streaming.
    expect(screen.getByRole("button", { name: "Stop" })).toBeTruthy();
    expect(screen.getByTestId("message-assistant").getAttribute("aria-busy")).toBe("true");
  });
});
