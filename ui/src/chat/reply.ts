// The state of one assistant reply while it streams, and how each ChatChunk changes it. Pure: the chat
// view keeps one of these per conversation whose reply is in flight and renders the open one's.
import type { ChatChunk, Conversation, StoredMessage, Summary } from "../bindings";

export type ReplyStatus = "streaming" | "done" | "stopped" | "error";

export interface ReplyState {
  text: string;
  /** The reasoning before the answer (a thinking model's `<think>` block); "" when there is none. */
  reasoning: string;
  status: ReplyStatus;
  figures: Summary | null;
  finishReason: string | null;
  /** Shown under the reply: "engine restarted, retrying" after a `retrying` chunk. */
  note: string | null;
  error: string | null;
  /** How many times the engine restarted during this reply. */
  retries: number;
}

export const RETRY_NOTE = "engine restarted, retrying";

export function newReply(): ReplyState {
  return {
    text: "",
    reasoning: "",
    status: "streaming",
    figures: null,
    finishReason: null,
    note: null,
    error: null,
    retries: 0,
  };
}

/** The reply after one chunk. Chunks after the reply has ended change nothing. */
export function applyChunk(s: ReplyState, c: ChatChunk): ReplyState {
  if (s.status !== "streaming") return s;
  switch (c.kind) {
    case "stored":
      // About the conversation, not the reply's text (the chat view reads the list again).
      return s;
    case "reasoning":
      return { ...s, reasoning: s.reasoning + c.text };
    case "text":
      return { ...s, text: s.text + c.text };
    case "retrying":
      // The reply starts again from scratch on a new engine: what was shown so far is discarded.
      return { ...s, text: "", reasoning: "", retries: s.retries + 1, note: c.reason ? `${RETRY_NOTE} (${c.reason})` : RETRY_NOTE };
    case "done": {
      const stopped = c.finish_reason === "cancelled";
      return { ...s, status: stopped ? "stopped" : "done", finishReason: c.finish_reason, figures: c.figures };
    }
    case "error":
      return { ...s, status: "error", error: c.message };
  }
}

/** The reply after the user pressed Stop and the backend confirmed (or failed to say anything more). */
export function stopReply(s: ReplyState): ReplyState {
  return s.status === "streaming" ? { ...s, status: "stopped" } : s;
}

/** The reply as a message of the conversation. */
export function replyToMessage(s: ReplyState): StoredMessage {
  const m: StoredMessage = { role: "assistant", content: s.text, figures: s.figures, complete: s.status === "done" };
  if (s.reasoning) m.reasoning = s.reasoning;
  return m;
}

/**
 * A conversation read while its reply streams, without that reply: the backend stores the reply being
 * written as the last message, incomplete, and the chat view shows it from its own ReplyState instead.
 */
export function withoutPendingReply(c: Conversation): Conversation {
  const last = c.messages[c.messages.length - 1];
  return last && last.role === "assistant" && !last.complete ? { ...c, messages: c.messages.slice(0, -1) } : c;
}
