// The small form that asks for the API key of `strata serve` after a 401. The key is kept in localStorage
// by the transport and sent as `Authorization: Bearer KEY`.
import { useEffect, useRef, useState } from "preact/hooks";

export function ApiKeyPrompt({ why, onAnswer }: { why: string; onAnswer: (key: string | null) => void }) {
  const [key, setKey] = useState("");
  const input = useRef<HTMLInputElement>(null);
  useEffect(() => input.current?.focus(), []);
  return (
    <div class="modal-backdrop">
      <div class="modal card" role="dialog" aria-modal="true" aria-labelledby="api-key-title">
      <form
        data-testid="api-key-form"
        onSubmit={(e) => {
          e.preventDefault();
          if (key.trim()) onAnswer(key.trim());
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
