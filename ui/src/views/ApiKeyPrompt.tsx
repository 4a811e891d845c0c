// The small form that asks for the API key of `strata serve` after a 401. The transport sends it as
// `Authorization: Bearer KEY` and keeps it for this tab only (sessionStorage), unless "Remember on this
// browser" is ticked (localStorage: any script of this origin, and anyone at this browser, can read it).
import { useEffect, useRef, useState } from "preact/hooks";
import type { KeyAnswer } from "../transport/http/client";

export function ApiKeyPrompt({ why, onAnswer }: { why: string; onAnswer: (answer: KeyAnswer | null) => void }) {
  const [key, setKey] = useState("");
  const [remember, setRemember] = useState(false);
  const input = useRef<HTMLInputElement>(null);
  useEffect(() => input.current?.focus(), []);
  return (
    <div class="modal-backdrop">
      <div class="modal card" role="dialog" aria-modal="true" aria-labelledby="api-key-title">
      <form
        data-testid="api-key-form"
        onSubmit={(e) => {
          e.preventDefault();
          if (key.trim()) onAnswer({ key: key.trim(), remember });
        }}
        onKeyDown={(e) => {
          if (e.key === "Escape") onAnswer(null);
        }}
      >
        <h2 id="api-key-title">API key needed</h2>
        <p class="muted">{why}</p>
        <label for="api-key-input">API key of strata serve</label>
        <input
          id="api-key-input"
          ref={input}
          type="password"
          autoComplete="off"
          value={key}
          onInput={(e) => setKey((e.target as HTMLInputElement).value)}
        />
        <label class="check-row">
          <input
            type="checkbox"
            checked={remember}
            onChange={(e) => setRemember((e.target as HTMLInputElement).checked)}
          />
          Remember on this browser
        </label>
        <p class="hint">Otherwise the key is forgotten when this tab closes.</p>
        <div class="button-row">
          <button type="submit" class="primary" disabled={key.trim() === ""}>
            Use this key
          </button>
          <button type="button" onClick={() => onAnswer(null)}>
            Cancel
          </button>
        </div>
      </form>
      </div>
    </div>
  );
}
