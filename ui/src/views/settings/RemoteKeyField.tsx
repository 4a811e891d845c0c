// The remote endpoint's API key in the settings form. The key itself never reaches the page: the backend
// says whether one is kept and shows its last characters, so this field shows that (masked), takes a new
// key to replace it, or clears it (undone until Apply). A typed key stays in the form only until saved.
import type { FieldErrors, SettingsForm } from "../../settings/form";

export interface RemoteKeyFieldProps {
  form: SettingsForm;
  set: (patch: Partial<SettingsForm>) => void;
  errors: FieldErrors;
}

/** What the status line says of the key (null: none kept, nothing to say). */
export function keyStatus(form: SettingsForm): string | null {
  if (form.engine_key_kept === null) return null;
  if (form.engine_key_clear) return "The kept key is removed when you apply.";
  if (form.engine_api_key.trim() !== "") return "The key typed below replaces the kept one when you apply.";
  return form.engine_key_kept === "" ? "A key is kept." : `A key is kept (ending in …${form.engine_key_kept}).`;
}

export function RemoteKeyField({ form, set, errors }: RemoteKeyFieldProps) {
  const id = "settings-engine_api_key";
  const error = errors.engine_api_key;
  const kept = form.engine_key_kept !== null;
  const status = keyStatus(form);
  const described = [status ? `${id}-status` : null, error ? `${id}-error` : null].filter(Boolean).join(" ") || undefined;
  return (
    <div class={`field field-wide${error ? " field-invalid" : ""}`}>
      <label for={id}>API key</label>
      <div class="key-row">
        <input
          id={id}
          name="engine_api_key"
          type="password"
          value={form.engine_api_key}
          placeholder={kept && !form.engine_key_clear ? "•••••••• (type a new key to replace it)" : "none"}
          aria-invalid={error ? "true" : "false"}
          aria-describedby={described}
          onInput={(e) => set({ engine_api_key: (e.target as HTMLInputElement).value, engine_key_clear: false })}
          autoComplete="off"
          spellcheck={false}
        />
        {kept && !form.engine_key_clear && (
          <button type="button" onClick={() => set({ engine_api_key: "", engine_key_clear: true })}>
            Clear key
          </button>
        )}
        {kept && form.engine_key_clear && (
          <button type="button" onClick={() => set({ engine_key_clear: false })}>
            Keep the key
          </button>
        )}
      </div>
      {status && (
        <p id={`${id}-status`} class="hint" data-testid="key-status">
          {status}
        </p>
      )}
      {error && (
        <p id={`${id}-error`} class="field-error" data-testid="error-engine_api_key">
          {error}
        </p>
      )}
    </div>
  );
}
