// The model library's own settings, where the app keeps them (the desktop app): the models folder (empty:
// the default) and a Hugging Face token for gated repositories. The token never comes back to the page:
// the app says whether one is kept (with its last characters) and where the Hub's token comes from.
import { useEffect, useState } from "preact/hooks";
import { TransportError, type LibraryApi, type LibrarySettingsView } from "../../transport/types";
import { messageOf } from "../../util/errors";

export interface LibrarySettingsFormProps {
  library: LibraryApi;
  /** Called after a save (the folder may have changed: what is here is read again). */
  onSaved: () => void;
}

/** What the form says of the token the Hub gets. */
export function tokenStatus(view: LibrarySettingsView): string {
  const key = view.settings.hf_token;
  if (key.kind === "kept") return key.hint ? `A token is kept (ending in …${key.hint}).` : "A token is kept.";
  if (view.token_from === "environment") return "The Hub gets the token of HF_TOKEN or of the saved Hugging Face login.";
  return "No token: gated repositories cannot be downloaded.";
}

export function LibrarySettingsForm({ library, onSaved }: LibrarySettingsFormProps) {
  const [view, setView] = useState<LibrarySettingsView | null>(null);
  const [dir, setDir] = useState("");
  const [token, setToken] = useState("");
  const [clear, setClear] = useState(false);
  const [errors, setErrors] = useState<{ models_dir?: string; hf_token?: string; other?: string }>({});
  const [saved, setSaved] = useState(false);

  const show = (v: LibrarySettingsView) => {
    setView(v);
    setDir(v.settings.models_dir);
    setToken("");
    setClear(false);
  };

  useEffect(() => {
    library.settings?.().then(show, (e: unknown) => setErrors({ other: messageOf(e) }));
  }, [library]);

  if (!library.settings || !library.saveSettings || !view) return null;
  const kept = view.settings.hf_token.kind === "kept";

  const save = async () => {
    setErrors({});
    setSaved(false);
    const hf_token = token.trim() !== "" ? { kind: "new" as const, key: token.trim() } : clear ? { kind: "none" as const } : view.settings.hf_token;
    try {
      const v = await library.saveSettings!({ models_dir: dir.trim(), hf_token });
      show(v);
      setSaved(true);
      onSaved();
    } catch (e) {
      const field = e instanceof TransportError ? e.field : null;
      if (field === "models_dir" || field === "hf_token") setErrors({ [field]: messageOf(e) });
      else setErrors({ other: messageOf(e) });
    }
  };

  return (
    <form
      class="library-settings"
      data-testid="library-settings"
      onSubmit={(e) => {
        e.preventDefault();
        void save();
      }}
    >
      <h3>Library settings</h3>
      <div class={`field field-wide${errors.models_dir ? " field-invalid" : ""}`}>
        <label for="library-models-dir">Models folder</label>
        <input
          id="library-models-dir"
          data-testid="library-models-dir"
          value={dir}
          placeholder={view.default_models_dir}
          aria-invalid={errors.models_dir ? "true" : "false"}
          onInput={(e) => setDir((e.target as HTMLInputElement).value)}
          spellcheck={false}
        />
        <p class="hint">Downloads go here and its models are listed. Empty: {view.default_models_dir}</p>
        {errors.models_dir && (
          <p class="field-error" data-testid="error-models_dir">
            {errors.models_dir}
          </p>
        )}
      </div>
      <div class={`field field-wide${errors.hf_token ? " field-invalid" : ""}`}>
        <label for="library-hf-token">Hugging Face token</label>
        <div class="key-row">
          <input
            id="library-hf-token"
            data-testid="library-hf-token"
            type="password"
            value={token}
            placeholder={kept && !clear ? "•••••••• (type a new token to replace it)" : "hf_…"}
            aria-invalid={errors.hf_token ? "true" : "false"}
            onInput={(e) => {
              setToken((e.target as HTMLInputElement).value);
              setClear(false);
            }}
            autoComplete="off"
            spellcheck={false}
          />
          {kept && !clear && (
            <button type="button" onClick={() => (setToken(""), setClear(true))}>
              Forget the token
            </button>
          )}
        </div>
        <p class="hint" data-testid="library-token-status">
          {clear ? "The kept token is forgotten when you save." : tokenStatus(view)}
        </p>
        {errors.hf_token && (
          <p class="field-error" data-testid="error-hf_token">
            {errors.hf_token}
          </p>
        )}
      </div>
      <div class="actions">
        <button type="submit" data-testid="library-settings-save">
          Save
        </button>
        {saved && (
          <span class="ok" role="status">
            Saved. Downloads go to {view.models_dir}.
          </span>
        )}
        {errors.other && (
          <span class="error" role="alert">
            {errors.other}
          </span>
        )}
      </div>
    </form>
  );
}
