// The message box: Enter sends, Shift+Enter inserts a newline; a Send button, or Stop while a reply
// streams; beside them its children (the Parameters panel).
import type { ComponentChildren } from "preact";

export interface ComposerProps {
  draft: string;
  onDraft: (text: string) => void;
  onSend: () => void;
  onStop: () => void;
  streaming: boolean;
  children?: ComponentChildren;
}

export function Composer(p: ComposerProps) {
  return (
    <form
      class="composer"
      onSubmit={(e) => {
        e.preventDefault();
        if (!p.streaming) p.onSend();
      }}
    >
      <label class="visually-hidden" for="chat-input">
        Message
      </label>
      <textarea
        id="chat-input"
        data-testid="chat-input"
        rows={3}
        placeholder="Message (Enter sends, Shift+Enter for a new line)"
        value={p.draft}
        onInput={(e) => p.onDraft((e.target as HTMLTextAreaElement).value)}
        onKeyDown={(e) => {
          if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
            e.preventDefault();
            if (!p.streaming) p.onSend();
          }
        }}
      />
      <div class="composer-actions">
        {p.streaming ? (
          <button type="button" class="danger" onClick={p.onStop}>
            Stop
          </button>
        ) : (
          <button type="submit" class="primary" disabled={p.draft.trim() === ""}>
            Send
          </button>
        )}
        {p.children}
      </div>
    </form>
  );
}
