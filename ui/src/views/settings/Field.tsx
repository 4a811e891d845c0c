// A labelled input (or select) with its error shown at it: aria-invalid and aria-describedby point at the
// message.

export interface FieldProps {
  name: string;
  label: string;
  value: string;
  onInput: (v: string) => void;
  error?: string | undefined;
  hint?: string;
  type?: "text" | "password" | "url";
  inputMode?: "numeric" | "text";
  placeholder?: string;
  /** Takes the whole row of its card (a path). */
  wide?: boolean;
}

export function Field(p: FieldProps) {
  const id = `settings-${p.name}`;
  const errorId = `${id}-error`;
  const hintId = `${id}-hint`;
  const described = [p.hint ? hintId : null, p.error ? errorId : null].filter(Boolean).join(" ") || undefined;
  return (
    <div class={`field${p.wide ? " field-wide" : ""}${p.error ? " field-invalid" : ""}`}>
      <label for={id}>{p.label}</label>
      <input
        id={id}
        name={p.name}
        // Preact types narrow attributes by input type; these three take the same ones.
        type={(p.type ?? "text") as "text"}
        inputMode={p.inputMode}
        value={p.value}
        placeholder={p.placeholder}
        aria-invalid={p.error ? "true" : "false"}
        aria-describedby={described}
        onInput={(e) => p.onInput((e.target as HTMLInputElement).value)}
        autoComplete="off"
        spellcheck={false}
      />
      {p.hint && (
        <p id={hintId} class="hint">
          {p.hint}
        </p>
      )}
      {p.error && (
        <p id={errorId} class="field-error" data-testid={`error-${p.name}`}>
          {p.error}
        </p>
      )}
    </div>
  );
}

export interface SelectFieldProps<T extends string> {
  name: string;
  label: string;
  value: T;
  options: readonly { value: T; label: string }[];
  onChange: (v: T) => void;
  error?: string | undefined;
  hint?: string;
}

export function SelectField<T extends string>(p: SelectFieldProps<T>) {
  const id = `settings-${p.name}`;
  const errorId = `${id}-error`;
  const hintId = `${id}-hint`;
  const described = [p.hint ? hintId : null, p.error ? errorId : null].filter(Boolean).join(" ") || undefined;
  return (
    <div class={`field${p.error ? " field-invalid" : ""}`}>
      <label for={id}>{p.label}</label>
      <select
        id={id}
        name={p.name}
        value={p.value}
        aria-invalid={p.error ? "true" : "false"}
        aria-describedby={described}
        onChange={(e) => {
          const v = (e.target as HTMLSelectElement).value;
          const picked = p.options.find((o) => o.value === v);
          if (picked) p.onChange(picked.value);
        }}
      >
        {p.options.map((o) => (
          <option key={o.value} value={o.value}>
            {o.label}
          </option>
        ))}
      </select>
      {p.hint && (
        <p id={hintId} class="hint">
          {p.hint}
        </p>
      )}
      {p.error && (
        <p id={errorId} class="field-error" data-testid={`error-${p.name}`}>
          {p.error}
        </p>
      )}
    </div>
  );
}

export interface CheckFieldProps {
  name: string;
  label: string;
  checked: boolean;
  onChange: (checked: boolean) => void;
  error?: string | undefined;
  hint?: string;
}

/** A labelled checkbox, with a hint and its error as the other fields have them. */
export function CheckField(p: CheckFieldProps) {
  const id = `settings-${p.name}`;
  const errorId = `${id}-error`;
  const hintId = `${id}-hint`;
  const described = [p.hint ? hintId : null, p.error ? errorId : null].filter(Boolean).join(" ") || undefined;
  return (
    <div class={`field field-check${p.error ? " field-invalid" : ""}`}>
      <label for={id}>
        <input
          id={id}
          name={p.name}
          type="checkbox"
          checked={p.checked}
          aria-invalid={p.error ? "true" : "false"}
          aria-describedby={described}
          onChange={(e) => p.onChange((e.target as HTMLInputElement).checked)}
        />
        {p.label}
      </label>
      {p.hint && (
        <p id={hintId} class="hint">
          {p.hint}
        </p>
      )}
      {p.error && (
        <p id={errorId} class="field-error" data-testid={`error-${p.name}`}>
          {p.error}
        </p>
      )}
    </div>
  );
}
