// The chat view: the conversation list beside the open conversation, whose replies stream in as the
// transport delivers chunks (applyChunk), with Stop while streaming. Several conversations may stream at
// once (the server batches them): each in-flight reply is kept by its conversation's id, Send is blocked
// only in a conversation that is itself streaming, and the list marks every conversation that is replying.
// Opening a streaming conversation shows its live reply; a reply that ends in a conversation that is not
// open is left to the backend, which has stored it (opening that conversation reads it). The list is read
// again as soon as the backend has stored the user's message (the `stored` chunk), so its title and count
// are current while the reply streams. A finished reply joins the open conversation with its figures; its
// note (engine restarted, stopped) and error stay shown under it. Replies are sent with the Parameters
// panel's values, and the reply limit as max_tokens when Max tokens is empty.
import { useEffect, useRef, useState } from "preact/hooks";
import type { ChatChunk, ChatMessage, Conversation, ConversationSummary, ExportFormat, ModelFacts, StoredMessage } from "../../bindings";
import { shownTitle } from "../../chat/conversation";
import { paramErrors, requestParams } from "../../chat/params";
import { applyChunk, newReply, replyToMessage, stopReply, withoutPendingReply, type ReplyState } from "../../chat/reply";
import type { Transport } from "../../transport/types";
import { messageOf } from "../../util/errors";
import { Composer } from "./Composer";
import { ConversationList } from "./ConversationList";
import { MessageItem, type MessageExtras } from "./MessageItem";
import { ParamsPanel } from "./ParamsPanel";
import { useChatPreferences } from "./useChatPreferences";

/** A reply streaming in one conversation. */
interface InFlight {
  /** Which send it is: a late chunk (or Stop's timer) of an earlier reply in the same conversation is ignored. */
  seq: number;
  state: ReplyState;
}

/** The replies in flight, by conversation id. */
type Replies = Readonly<Record<string, InFlight>>;

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
  const [conv, setConvState] = useState<Conversation | null>(null);
  const [replies, setRepliesState] = useState<Replies>({});
  const [extras, setExtras] = useState<Record<number, MessageExtras>>({});
  const [draft, setDraft] = useState("");
  const prefs = useChatPreferences(transport, model?.path || null);
  const [error, setError] = useState<string | null>(null);
  const listRef = useRef<HTMLOListElement>(null);
  // The open conversation and the replies as last set, for chunk callbacks and awaits that outlive a render.
  const convRef = useRef<Conversation | null>(null);
  const repliesRef = useRef<Replies>({});
  // Each conversation's chatSend until it settles (the backend has stored the reply's end by then).
  const sends = useRef(new Map<string, Promise<void>>());
  const sendSeq = useRef(0);
  const selectSeq = useRef(0);

  const setConv = (c: Conversation | null) => {
    convRef.current = c;
    setConvState(c);
  };
  const setReplies = (r: Replies) => {
    repliesRef.current = r;
    setRepliesState(r);
  };
  const streamingIn = (id: string | undefined) => id !== undefined && repliesRef.current[id] !== undefined;
  const live = conv ? (replies[conv.id]?.state ?? null) : null;
  const streaming = live !== null;

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

  /**
   * The reply of send `seq` in conversation `id` after `f`. One that has ended leaves the map; in the open
   * conversation it joins the messages, elsewhere the backend has stored it.
   */
  const updateReply = (id: string, seq: number, f: (s: ReplyState) => ReplyState) => {
    const cur = repliesRef.current[id];
    if (!cur || cur.seq !== seq) return;
    const state = f(cur.state);
    if (state === cur.state) return;
    if (state.status === "streaming") {
      setReplies({ ...repliesRef.current, [id]: { seq, state } });
      return;
    }
    const { [id]: _ended, ...rest } = repliesRef.current;
    setReplies(rest);
    const c = convRef.current;
    if (c && c.id === id) {
      const index = c.messages.length;
      setExtras((x) => ({ ...x, [index]: { status: state.status, note: state.note, error: state.error } }));
      setConv({ ...c, messages: [...c.messages, replyToMessage(state)] });
    }
    void refreshList();
  };

  /** Waits for conversation `id`'s chatSend to settle, at most `ms`. */
  const settled = async (id: string, ms: number) => {
    const p = sends.current.get(id);
    if (p) await Promise.race([p, new Promise((r) => setTimeout(r, ms))]);
  };

  const select = async (id: string) => {
    const seq = ++selectSeq.current;
    try {
      // A reply that has ended but whose send has not settled may not be stored yet.
      if (!streamingIn(id)) await settled(id, stopGraceMs);
      const wasLive = repliesRef.current[id]?.seq;
      let c = await transport.getConversation(id);
      // The reply ended while the conversation was read: read it again once the backend has stored it.
      if (wasLive !== undefined && repliesRef.current[id]?.seq !== wasLive) {
        await settled(id, stopGraceMs);
        c = await transport.getConversation(id);
      }
      if (seq !== selectSeq.current) return;
      // Streaming still: its reply is shown from its ReplyState, not as stored so far.
      setConv(streamingIn(id) ? withoutPendingReply(c) : c);
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

  // Follow the conversation's end while it grows, unless the reader scrolled up.
  useEffect(() => {
    const el = listRef.current;
    if (el && el.scrollHeight - el.scrollTop - el.clientHeight < 120) el.scrollTop = el.scrollHeight;
  }, [conv, live?.text]);

  const send = async () => {
    const text = draft.trim();
    if (text === "" || streamingIn(convRef.current?.id)) return;
    const bad = Object.values(paramErrors(prefs.params));
    if (bad.length > 0) {
      setError(`Not sent: ${bad.join("; ")} (see Parameters).`);
      return;
    }
    let c = convRef.current;
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
    if (streamingIn(id)) return;
    const messages: ChatMessage[] = [...historyOf(c.messages), { role: "user", content: text }];
    setConv({ ...c, messages: [...c.messages, { role: "user", content: text, figures: null, complete: true }] });
    setDraft("");
    setError(null);
    const seq = ++sendSeq.current;
    setReplies({ ...repliesRef.current, [id]: { seq, state: newReply() } });
    const onChunk = (chunk: ChatChunk) => {
      // The backend has stored the message: the list's title and count are current now.
      if (chunk.kind === "stored") void refreshList();
      updateReply(id, seq, (s) => applyChunk(s, chunk));
    };
    const done = transport
      .chatSend(id, messages, requestParams(prefs.params, prefs.prefs.reply_limit_tokens), onChunk)
      .catch((e: unknown) => onChunk({ kind: "error", message: messageOf(e) }));
    sends.current.set(id, done);
    await done;
    if (sends.current.get(id) === done) sends.current.delete(id);
  };

  // The backend ends a cancelled reply itself (its last text, then done with finish_reason "cancelled");
  // if nothing comes within stopGraceMs, the reply is ended here.
  const stop = async (id: string) => {
    const cur = repliesRef.current[id];
    if (!cur) return;
    const end = () => updateReply(id, cur.seq, stopReply);
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
    const seq = ++selectSeq.current;
    try {
      const c = await transport.createConversation(null);
      if (seq === selectSeq.current) setConv(c);
      setExtras({});
      await refreshList();
    } catch (e) {
      setError(messageOf(e));
    }
  };

  const rename = async (id: string, title: string) => {
    try {
      await transport.renameConversation(id, title);
      const c = convRef.current;
      if (c && c.id === id) setConv({ ...c, title });
      await refreshList();
    } catch (e) {
      setError(messageOf(e));
    }
  };

  // A conversation whose reply streams is stopped first, and deleted once the backend has ended the reply
  // (else the reply's last write could store it again).
  const remove = async (id: string) => {
    try {
      if (streamingIn(id)) {
        await stop(id);
        await settled(id, stopGraceMs);
      }
      await transport.deleteConversation(id);
      const list = await refreshList();
      if (convRef.current?.id === id) {
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

  return (
    <div class="chat">
      <ConversationList
        items={items}
        selected={conv?.id ?? null}
        replying={Object.keys(replies)}
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
          onStop={() => {
            if (conv) void stop(conv.id);
          }}
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
