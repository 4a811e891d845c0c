// Conversations kept in the browser's localStorage (the desktop app keeps them in its backend), in the same
// Conversation shape. It owns that one storage key and never talks to the server. Titles follow
// chat/conversation.ts: a new conversation is untitled ("") until its first user message names it.
import type { ChatMessage, Conversation, ConversationSummary, StoredMessage } from "../../bindings";
import { cleanTitle, titleAfter } from "../../chat/conversation";
import { TransportError } from "../types";

export const CONVERSATIONS_STORAGE = "strata.conversations.v1";

function newId(): string {
  const c = globalThis.crypto;
  if (c && typeof c.randomUUID === "function") return c.randomUUID();
  return `c-${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 10)}`;
}

export class LocalConversations {
  constructor(
    private readonly storage: Storage,
    private readonly now: () => number = Date.now,
  ) {}

  list(): ConversationSummary[] {
    return this.all()
      .map((c) => ({ id: c.id, title: c.title, updated_ms: c.updated_ms, messages: c.messages.length }))
      .sort((a, b) => b.updated_ms - a.updated_ms);
  }

  get(id: string): Conversation {
    const c = this.all().find((x) => x.id === id);
    if (!c) throw new TransportError("not_found", `no conversation ${id}`);
    return c;
  }

  /** A new conversation; title null: untitled. */
  create(title: string | null): Conversation {
    const t = this.now();
    const c: Conversation = { id: newId(), title: cleanTitle(title ?? ""), created_ms: t, updated_ms: t, messages: [] };
    this.write([...this.all(), c]);
    return c;
  }

  /** Renames the conversation; a title that is empty once cleaned leaves it as it was. */
  rename(id: string, title: string): void {
    this.update(id, (c) => ({ ...c, title: cleanTitle(title) || c.title }));
  }

  delete(id: string): void {
    const all = this.all();
    if (!all.some((c) => c.id === id)) throw new TransportError("not_found", `no conversation ${id}`);
    this.write(all.filter((c) => c.id !== id));
  }

  /**
   * Stores `messages` as the conversation, and the title they give it (titleAfter). A message equal to the
   * stored one at the same place keeps its figures (the UI sends only roles and text back).
   */
  setMessages(id: string, messages: ChatMessage[]): Conversation {
    return this.update(id, (c) => {
      const kept: StoredMessage[] = messages.map((m, i) => {
        const old = c.messages[i];
        if (old && old.role === m.role && old.content === m.content) return old;
        const stored: StoredMessage = { role: m.role, content: m.content, figures: null, complete: true };
        if (m.reasoning) stored.reasoning = m.reasoning;
        return stored;
      });
      return { ...c, title: titleAfter(c.title, messages), messages: kept };
    });
  }

  /** Appends the assistant's reply, or replaces it when the last message already is that reply. */
  putReply(id: string, reply: StoredMessage, replaceLast: boolean): Conversation {
    return this.update(id, (c) => {
      const messages = replaceLast ? [...c.messages.slice(0, -1), reply] : [...c.messages, reply];
      return { ...c, messages };
    });
  }

  private update(id: string, f: (c: Conversation) => Conversation): Conversation {
    const all = this.all();
    const i = all.findIndex((c) => c.id === id);
    const old = all[i];
    if (!old) throw new TransportError("not_found", `no conversation ${id}`);
    const next = { ...f(old), updated_ms: this.now() };
    all[i] = next;
    this.write(all);
    return next;
  }

  private all(): Conversation[] {
    let raw: string | null;
    try {
      raw = this.storage.getItem(CONVERSATIONS_STORAGE);
    } catch (e) {
      throw TransportError.from(e, "io");
    }
    if (!raw) return [];
    try {
      const parsed: unknown = JSON.parse(raw);
      return Array.isArray(parsed) ? (parsed.filter(isConversation) as Conversation[]) : [];
    } catch {
      return [];
    }
  }

  private write(all: Conversation[]): void {
    try {
      this.storage.setItem(CONVERSATIONS_STORAGE, JSON.stringify(all));
    } catch (e) {
      throw new TransportError("io", `cannot store the conversations in this browser: ${e instanceof Error ? e.message : String(e)}`);
    }
  }
}

function isConversation(v: unknown): boolean {
  if (typeof v !== "object" || v === null) return false;
  const c = v as Record<string, unknown>;
  return typeof c.id === "string" && typeof c.title === "string" && Array.isArray(c.messages);
}
