// The chat view: the conversation list beside the open conversation, whose replies stream in as the
// transport delivers chunks (applyChunk), with Stop while streaming. The list is read again as soon as the
// backend has stored the user's message (the `stored` chunk), so its title and count are current while
// the reply streams. A finished reply joins the conversation with its figures; its note (engine restarted,
// stopped) and error stay shown under it. Replies are sent with the Parameters panel's values, and the
// reply limit as max_tokens when Max tokens is empty.
import { useEffect, useRef, useState } from "preact/hooks";
import type { ChatChunk, ChatMessage, Conversation, ConversationSummary, ExportFormat, ModelFacts, StoredMessage } from "../../bindings";
import { shownTitle } from "../../chat/conversation";
import { paramErrors, requestParams } from "../../chat/params";
import { applyChunk, newReply, replyToMessage, stopReply, type ReplyState } from "../../chat/reply";
import type { Transport } from "../../transport/types";
import { messageOf } from "../../util/errors";
import { Composer } from "./Composer";
import { ConversationList } from "./ConversationList";
import { MessageItem, type MessageExtras } from "./MessageItem";
import { ParamsPanel } from "./ParamsPanel";
import { useChatPreferences } from "./useChatPreferences";

interface InFlight {
  convId: string;
  state: ReplyState;
}

/**
 * The messages sent back to the engine: roles and text (a reply's reasoning with it, for the backend to keep;
 * the engine is sent only the text), leaving out empty ones (a failed reply).
 */
export function historyOf(messages: readonly StoredMessage[]): ChatMessage[] {
  return messages
    .filter((m) => m.content !== "")
    .map((m) => {
      const message: ChatMessage = { role: m.role, content: m.content };
      if (m.reasoning) message.reasoning = m.reasoning;
      return message;
    });
}

export interface ChatViewProps {
  transport: Transport;
  /** The current model (its sampling defaults fill the Parameters panel); null when none is known. */
  model?: ModelFacts | null;
  /** How long after chat_cancel a reply may take to end before the view ends it. */
  stopGraceMs?: number;
}

export function ChatView({ transport, model = null, stopGraceMs = 3000 }: ChatViewProps) {
  const [items, setItems] = useState<ConversationSummary[]>([]);
  const [conv, setConv] = useState<Conversation | null>(null);
  const [reply, setReply] = useState<InFlight | null>(null);
  const [extras, setExtras] = useState<Record<number, MessageExtras>>({});
  const [draft, setDraft] = useState("");
  const prefs = useChatPreferences(transport, model?.path || null);
  const [error, setError] = useState<string | null>(null);
  const listRef = useRef<HTMLOListElement>(null);
  const streaming = reply !== null && reply.state.status === "streaming";

  const refreshList = async () => {
    try {
      const list = await transport.listConversations();
      setItems(list);
      return list;
    } catch (e) {
      setError(messageOf(e));
      return [];
    }
  };

  const select = async (id: string) => {
    try {
      const c = await transport.getConversation(id);
      setConv(c);
      setExtras({});
      setError(null);
    } catch (e) {
      setError(messageOf(e));
    }
  };

  useEffect(() => {
    void refreshList().then((list) => {
      const first = list[0];
      if (first) void select(first.id);
    });
  }, [transport]);

  // A reply that has ended joins the conversation.
  useEffect(() => {
    if (!reply || reply.state.status === "streaming") return;
    const done = reply;
    setReply(null);
    if (conv && conv.id === done.convId) {
      const index = conv.messages.length;
      const { status, note, error: err } = done.state;
      setExtras((x) => ({ ...x, [index]: { status, note, error: err } }));
      setConv({ ...conv, messages: [...conv.messages, replyToMessage(done.state)] });
    }
    void refreshList();
  }, [reply]);

  // Follow the conversation's end while it grows, unless the reader scrolled up.
  useEffect(() => {
    const el = listRef.current;
    if (el && el.scrollHeight - el.scrollTop - el.clientHeight < 120) el.scrollTop = el.scrollHeight;
  }, [conv, reply?.state.text]);

  const send = async () => {
    const text = draft.trim();
    if (text === "" || streaming) return;
    const bad = Object.values(paramErrors(prefs.params));
    if (bad.length > 0) {
      setError(`Not sent: ${bad.join("; ")} (see Parameters).`);
      return;
    }
    let c = conv;
    try {
      if (!c) {
        c = await transport.createConversation(null);
        setExtras({});
      }
    } catch (e) {
      setError(messageOf(e));
      return;
    }
    const id = c.id;
    const messages: ChatMessage[] = [...historyOf(c.messages), { role: "user", content: text }];
    setConv({ ...c, messages: [...c.messages, { role: "user", content: text, figures: null, complete: true }] });
    setDraft("");
    setError(null);
    setReply({ convId: id, state: newReply() });
    const onChunk = (chunk: ChatChunk) => {
      // The backend has stored the message: the list's title and count are current now.
      if (chunk.kind === "stored") void refreshList();
      setReply((r) => (r && r.convId === id ? { ...r, state: applyChunk(r.state, chunk) } : r));
    };
    try {
      await transport.chatSend(id, messages, requestParams(prefs.params, prefs.prefs.reply_limit_tokens), onChunk);
    } catch (e) {
      onChunk({ kind: "error", message: messageOf(e) });
    }
  };

  // The backend ends a cancelled reply itself (its last text, then done with finish_reason "cancelled");
  // if nothing comes within stopGraceMs, the reply is ended here.
  const stop = async () => {
    if (!reply) return;
    const id = reply.convId;
    const end = () => setReply((r) => (r && r.convId === id ? { ...r, state: stopReply(r.state) } : r));
    try {
      await transport.chatCancel(id);
    } catch (e) {
      setError(messageOf(e));
      end();
      return;
    }
    setTimeout(end, stopGraceMs);
  };

  const create = async () => {
    try {
      const c = await transport.createConversation(null);
      setConv(c);
      setExtras({});
      await refreshList();
    } catch (e) {
      setError(messageOf(e));
    }
  };

  const rename = async (id: string, title: string) => {
    try {
      await transport.renameConversation(id, title);
      setConv((c) => (c && c.id === id ? { ...c, title } : c));
      await refreshList();
    } catch (e) {
      setError(messageOf(e));
    }
  };

  const remove = async (id: string) => {
    try {
      await transport.deleteConversation(id);
      const list = await refreshList();
      if (conv?.id === id) {
        const first = list[0];
        if (first) await select(first.id);
        else setConv(null);
      }
    } catch (e) {
      setError(messageOf(e));
    }
  };

  const exportDoc = async (id: string, format: ExportFormat) => {
    try {
      await transport.saveExport(id, format);
    } catch (e) {
      setError(messageOf(e));
    }
  };

  const title = shownTitle(conv ? (items.find((c) => c.id === conv.id)?.title ?? conv.title) : "");
  const live = reply && conv && reply.convId === conv.id ? reply.state : null;

  return (
    <div class="chat">
      <ConversationList
        items={items}
        selected={conv?.id ?? null}
        busy={streaming}
        onNew={() => void create()}
        onSelect={(id) => void select(id)}
        onRename={(id, t) => void rename(id, t)}
        onDelete={(id) => void remove(id)}
        onExport={(id, f) => void exportDoc(id, f)}
      />
      <section class="conversation" aria-label={title}>
        <h2 class="conversation-heading">{title}</h2>
        {error && (
          <p class="error" role="alert">
            {error}
          </p>
        )}
        <ol class="messages" ref={listRef} aria-live="polite">
          {(conv?.messages ?? []).map((m, i) => (
            <MessageItem key={i} message={m} extras={extras[i]} />
          ))}
          {live && (
            <MessageItem
              key="live"
              message={replyToMessage(live)}
              extras={{ status: live.status, note: live.note, error: live.error }}
            />
          )}
          {!conv?.messages.length && !live && <li class="muted empty">Say something to start.</li>}
        </ol>
        <Composer
          draft={draft}
          onDraft={setDraft}
          onSend={() => void send()}
          onStop={() => void stop()}
          streaming={streaming}
        >
          <ParamsPanel
            params={prefs.params}
            onParams={prefs.setParams}
            sampling={model?.sampling ?? null}
            modelName={model ? model.name || model.path : null}
            saved={prefs.saved}
            dirty={prefs.dirty}
            onSave={() => void prefs.save()}
            onReset={() => void prefs.reset()}
            replyLimitTokens={prefs.prefs.reply_limit_tokens}
            onReplyLimit={(n) => void prefs.setReplyLimit(n)}
            note={prefs.note}
            error={prefs.error}
          />
        </Composer>
      </section>
    </div>
  );
}
