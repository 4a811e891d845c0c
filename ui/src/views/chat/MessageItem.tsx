// One message of the conversation: the user's text as typed, the assistant's as sanitized Markdown (above it,
// its reasoning folded in a "Thinking" disclosure, when the model thought before answering), and under a reply
// its figures, a note (engine restarted, stopped) and its error, if any.
import { useEffect, useMemo, useRef, useState } from "preact/hooks";
import type { StoredMessage } from "../../bindings";
import { replyFigures } from "../../chat/figures";
import { renderMarkdown } from "../../chat/markdown";
import type { ReplyStatus } from "../../chat/reply";

export interface MessageExtras {
  status?: ReplyStatus;
  note?: string | null;
  error?: string | null;
}

/** Replies longer than this are re-rendered at most every THROTTLE_MS while they stream. */
const LONG_CHARS = 4000;
const THROTTLE_MS = 100;

/**
 * The text to render: `text` itself, or while a long reply streams, its value at most THROTTLE_MS old,
 * since each chunk re-renders the whole reply's Markdown.
 */
function useThrottledText(text: string, streaming: boolean): string {
  const [shown, setShown] = useState(text);
  const last = useRef(0);
  const throttle = streaming && text.length > LONG_CHARS;
  useEffect(() => {
    if (!throttle) return;
    const wait = Math.max(0, last.current + THROTTLE_MS - Date.now());
    const t = setTimeout(() => {
      last.current = Date.now();
      setShown(text);
    }, wait);
    return () => clearTimeout(t);
  }, [text, throttle]);
  return throttle ? shown : text;
}

export function Markdown({ text, streaming = false }: { text: string; streaming?: boolean }) {
  const current = useThrottledText(text, streaming);
  const html = useMemo(() => renderMarkdown(current), [current]);
  // Links are inert (no href); a click on anything inside must not navigate the app either.
  return (
    <div
      class="markdown"
      data-testid="markdown"
      onClick={(e) => {
        if ((e.target as Element | null)?.closest?.("a")) e.preventDefault();
      }}
      dangerouslySetInnerHTML={{ __html: html }}
    />
  );
}

/**
 * A reply's reasoning, folded: a disclosure closed by default (the user opens it), whose summary says
 * "Thinking…" (marked busy) while the reasoning streams, "Thinking" once the answer has begun or the reply
 * has ended.
 */
export function Reasoning({ text, thinking }: { text: string; thinking: boolean }) {
  return (
    <details class="reasoning" data-testid="reasoning" aria-busy={thinking}>
      <summary data-testid="reasoning-summary">{thinking ? "Thinking…" : "Thinking"}</summary>
      <div class="reasoning-text" data-testid="reasoning-text">
        {text}
      </div>
    </details>
  );
}

export function MessageItem({ message, extras }: { message: StoredMessage; extras?: MessageExtras }) {
  const streaming = extras?.status === "streaming";
  const roleLabel = message.role === "user" ? "You" : message.role === "assistant" ? "Assistant" : "System";
  return (
    <li class={`message message-${message.role}`} data-testid={`message-${message.role}`} aria-busy={streaming}>
      <div class="message-role">{roleLabel}</div>
      {message.role === "assistant" && message.reasoning && (
        <Reasoning text={message.reasoning} thinking={streaming && message.content === ""} />
      )}
      {message.role === "assistant" ? (
        <Markdown text={message.content} streaming={streaming} />
      ) : (
        <div class="message-text">{message.content}</div>
      )}
      {streaming && message.content === "" && !message.reasoning && <div class="message-typing">…</div>}
      {extras?.note && (
        <p class="message-note" data-testid="reply-note">
          {extras.note}
        </p>
      )}
      {extras?.status === "stopped" && (
        <p class="message-note" data-testid="reply-stopped">
          stopped
        </p>
      )}
      {extras?.error && (
        <p class="message-error" role="alert" data-testid="reply-error">
          {extras.error}
        </p>
      )}
      {message.role === "assistant" && message.figures && (
        <ul class="figures" data-testid="figures" aria-label="Reply figures">
          {replyFigures(message.figures).map((f) => (
            <li key={f.key} data-figure={f.key} title={f.detail}>
              {f.text}
            </li>
          ))}
        </ul>
      )}
    </li>
  );
}
