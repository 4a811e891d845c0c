// The message box: Enter sends, Shift+Enter inserts a newline; a Send button, or Stop while a reply
// streams; and the sampling parameters (empty: the engine's defaults).
import type { ChatParams } from "../../bindings";

export interface ComposerProps {
  draft: string;
  onDraft: (text: string) => void;
  onSend: () => void;
  onStop: () => void;
  streaming: boolean;
  params: ChatParams;
  onParams: (p: ChatParams) => void;
}

function numberOrNull(v: string, integer: boolean): number | null {
  const t = v.trim();
  if (t === "") return null;
  const n = Number(t);
  if (!Number.isFinite(n)) return null;
  return integer ? Math.trunc(n) : n;
}

const PARAMS: { key: keyof ChatParams; label: string; step: string; integer: boolean }[] = [
  { key: "temperature", label: "Temperature", step: "0.1", integer: false },
  { key: "top_p", label: "Top p", step: "0.05", integer: false },
  { key: "max_tokens", label: "Max tokens", step: "1", integer: true },
  { key: "seed", label: "Seed", step: "1", integer: true },
];

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
        <details class="params">
          <summary>Parameters</summary>
          <div class="params-grid">
            {PARAMS.map((f) => (
              <label key={f.key}>
                {f.label}
                <input
                  type="number"
                  step={f.step}
                  value={p.params[f.key] === null ? "" : String(p.params[f.key])}
                  placeholder="default"
                  onInput={(e) =>
                    p.onParams({ ...p.params, [f.key]: numberOrNull((e.target as HTMLInputElement).value, f.integer) })
                  }
                />
              </label>
            ))}
          </div>
        </details>
      </div>
    </form>
  );
}
