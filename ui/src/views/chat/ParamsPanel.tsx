// The Parameters panel under the message box: one field per sampling parameter, each left empty showing
// as its placeholder the value the model gets for it and, beside it, where that value comes from (the
// model file, its family's preset, Strata's default); the reply limit (max_tokens when Max tokens is
// empty); the JSON-mode switch; and Save for this model / Reset, which keep or clear the values for the
// current model.
import { useEffect, useState } from "preact/hooks";
import type { ChatParams, SamplingDefaults } from "../../bindings";
import {
  effectiveOf,
  jsonModeOn,
  PARAM_FIELDS,
  paramErrors,
  replyLimitError,
  withJsonMode,
  type ParamField,
} from "../../chat/params";
import { NumberInput } from "./NumberInput";

export interface ParamsPanelProps {
  params: ChatParams;
  onParams: (p: ChatParams) => void;
  /** The current model's effective sampling; null when no model is known. */
  sampling: SamplingDefaults | null;
  /** The current model's name; null: none (nothing can be saved for it). */
  modelName: string | null;
  /** Whether values are saved for the current model, and whether the fields differ from what is saved. */
  saved: boolean;
  dirty: boolean;
  onSave: () => void;
  onReset: () => void;
  replyLimitTokens: number;
  onReplyLimit: (tokens: number) => void;
  /** What the last save did ("Saved for this model."), or the preferences' error. */
  note: string | null;
  error: string | null;
}

interface ParamInputProps {
  field: ParamField;
  value: number | null;
  placeholder: string;
  source: string;
  error: string | undefined;
  onValue: (v: number | null) => void;
}

function ParamInput({ field, value, placeholder, source, error, onValue }: ParamInputProps) {
  const id = `param-${field.key}`;
  return (
    <div class={`param${error ? " field-invalid" : ""}`}>
      <label for={id}>{field.label}</label>
      <NumberInput
        id={id}
        value={value}
        onValue={onValue}
        integer={field.integer}
        placeholder={placeholder}
        describedBy={`${id}-source${error ? ` ${id}-error` : ""}`}
        invalid={error !== undefined}
      />
      <span id={`${id}-source`} class="param-source" data-testid={`param-source-${field.key}`}>
        {value === null ? source : `default ${placeholder} · ${source}`}
      </span>
      {error && (
        <span id={`${id}-error`} class="field-error" data-testid={`error-${field.key}`}>
          {error}
        </span>
      )}
    </div>
  );
}

function ReplyLimit({ tokens, onTokens }: { tokens: number; onTokens: (n: number) => void }) {
  const [value, setValue] = useState<number | null>(tokens);
  const [error, setError] = useState<string | null>(null);
  // The limit read from the preferences (or saved) replaces what the field shows.
  useEffect(() => {
    setValue(tokens);
    setError(null);
  }, [tokens]);
  const commit = (v: number | null) => {
    const e = replyLimitError(v);
    setError(e);
    if (!e && v !== null && v !== tokens) onTokens(v);
  };
  return (
    <div class={`param${error ? " field-invalid" : ""}`}>
      <label for="param-reply-limit">Reply limit</label>
      <NumberInput
        id="param-reply-limit"
        value={value}
        onValue={(v) => {
          setValue(v);
          if (error) setError(replyLimitError(v));
        }}
        onCommit={commit}
        integer={true}
        placeholder={String(tokens)}
        describedBy={`param-reply-limit-hint${error ? " param-reply-limit-error" : ""}`}
        invalid={error !== null}
      />
      <span id="param-reply-limit-hint" class="param-source">
        tokens, every model
      </span>
      {error && (
        <span id="param-reply-limit-error" class="field-error" data-testid="error-reply_limit">
          {error}
        </span>
      )}
    </div>
  );
}

/** JSON mode: a switch, kept per model with the sampling values. */
function JsonModeSwitch({ on, onSwitch }: { on: boolean; onSwitch: (on: boolean) => void }) {
  return (
    <div class="param param-switch">
      <label for="param-json-mode">
        <input
          id="param-json-mode"
          type="checkbox"
          role="switch"
          checked={on}
          aria-checked={on}
          aria-describedby="param-json-mode-hint"
          data-testid="param-json-mode"
          onChange={(e) => onSwitch((e.currentTarget as HTMLInputElement).checked)}
        />
        JSON mode
      </label>
      <span id="param-json-mode-hint" class="param-source">
        Replies are a JSON object
      </span>
    </div>
  );
}

function statusOf(p: ParamsPanelProps): string {
  if (!p.modelName) return "No model loaded: these values apply to this session.";
  if (p.saved && !p.dirty) return `Saved for ${p.modelName}.`;
  if (p.saved) return `Changed since saved for ${p.modelName}.`;
  if (p.dirty) return `Not saved: for this session.`;
  return `The defaults of ${p.modelName}.`;
}

export function ParamsPanel(p: ParamsPanelProps) {
  const errors = paramErrors(p.params);
  const valid = Object.keys(errors).length === 0;
  return (
    <details class="params" data-testid="params">
      <summary>Parameters</summary>
      <div class="params-body">
        <div class="params-grid">
          {PARAM_FIELDS.map((f) => {
            const eff = effectiveOf(f.key, p.sampling, p.replyLimitTokens);
            return (
              <ParamInput
                key={f.key}
                field={f}
                value={p.params[f.key]}
                placeholder={eff.value}
                source={eff.source}
                error={errors[f.key]}
                onValue={(v) => p.onParams({ ...p.params, [f.key]: v })}
              />
            );
          })}
          <ReplyLimit tokens={p.replyLimitTokens} onTokens={p.onReplyLimit} />
          <JsonModeSwitch on={jsonModeOn(p.params)} onSwitch={(on) => p.onParams(withJsonMode(p.params, on))} />
        </div>
        <div class="params-footer">
          <button type="button" onClick={p.onSave} disabled={!p.modelName || !p.dirty || !valid}>
            Save for this model
          </button>
          <button type="button" onClick={p.onReset} disabled={!p.saved && !p.dirty}>
            Reset
          </button>
          <span class="muted" data-testid="params-status">
            {p.note ?? statusOf(p)}
          </span>
          {p.error && (
            <p class="error" role="alert" data-testid="params-error">
              {p.error}
            </p>
          )}
        </div>
      </div>
    </details>
  );
}
