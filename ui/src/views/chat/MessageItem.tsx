// One message of the conversation: the user's text as typed, the assistant's as sanitized Markdown (above it,
// its reasoning folded in a "Thinking" disclosure, when the model thought before answering), tool calls in a
// reply and tool results in a user's message folded in place (ToolCalls.tsx), and under a reply its figures,
// a note (engine restarted, stopped) and its error, if any.
import { useEffect, useMemo, useRef, useState } from "preact/hooks";
import type { StoredMessage } from "../../bindings";
import { replyFigures } from "../../chat/figures";
import { renderMarkdown } from "../../chat/markdown";
import type { ReplyStatus } from "../../chat/reply";
import { replySegments, userSegments } from "../../chat/toolcalls";
import { ToolCall, ToolResult } from "./ToolCalls";

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

/** `text` as sanitized Markdown, rendered on every change (ReplyBody throttles a long streaming reply). */
export function Markdown({ text }: { text: string }) {
  const html = useMemo(() => renderMarkdown(text), [text]);
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

/**
 * A reply's text: Markdown, with each tool call folded in its place (an unclosed one too, while it streams).
 * A long reply is split and rendered at most every THROTTLE_MS while it streams.
 */
function ReplyBody({ text, streaming }: { text: string; streaming: boolean }) {
  const current = useThrottledText(text, streaming);
  const segments = useMemo(() => replySegments(current, streaming), [current, streaming]);
  return (
    <>
      {segments.map((s, i) =>
        s.kind === "call" ? (
          <ToolCall key={i} call={s} streaming={streaming} />
        ) : s.kind === "text" ? (
          <Markdown key={i} text={s.text} />
        ) : null,
      )}
    </>
  );
}

/** A user's text as typed, with each pasted `<tool_response>` folded in its place. */
function UserBody({ text }: { text: string }) {
  const segments = useMemo(() => userSegments(text), [text]);
  return (
    <>
      {segments.map((s, i) =>
        s.kind === "result" ? (
          <ToolResult key={i} content={s.content} />
        ) : s.kind === "text" ? (
          <div key={i} class="message-text">
            {s.text}
          </div>
        ) : null,
      )}
    </>
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
        <ReplyBody text={message.content} streaming={streaming} />
      ) : message.role === "user" ? (
        <UserBody text={message.content} />
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
