// A text input for one number or nothing: it keeps what the user typed as typed (so "0." stays while
// "0.2" is being written, and junk stays visible with its error) and reports the number (null: empty;
// NaN: not a number). A value set from outside (restored, reset) replaces the text.
import { useEffect, useState } from "preact/hooks";

/** "" is null; anything else is its number, NaN when it is not one. */
export function parseNumber(text: string): number | null {
  const t = text.trim();
  return t === "" ? null : Number(t);
}

function same(a: number | null, b: number | null): boolean {
  return a === b || (a !== null && b !== null && Number.isNaN(a) && Number.isNaN(b));
}

export interface NumberInputProps {
  id: string;
  value: number | null;
  onValue: (v: number | null) => void;
  /** The input lost focus (after a change) or Enter was pressed, with this value. */
  onCommit?: (v: number | null) => void;
  integer: boolean;
  placeholder: string;
  describedBy?: string | undefined;
  invalid: boolean;
}

export function NumberInput(p: NumberInputProps) {
  const [text, setText] = useState(p.value === null ? "" : String(p.value));
  useEffect(() => {
    if (!same(parseNumber(text), p.value)) setText(p.value === null ? "" : String(p.value));
  }, [p.value]);
  return (
    <input
      id={p.id}
      type="text"
      inputMode={p.integer ? "numeric" : "decimal"}
      autoComplete="off"
      spellcheck={false}
      value={text}
      placeholder={p.placeholder}
      aria-invalid={p.invalid ? "true" : "false"}
      aria-describedby={p.describedBy}
      onInput={(e) => {
        const t = (e.target as HTMLInputElement).value;
        setText(t);
        p.onValue(parseNumber(t));
      }}
      onChange={(e) => p.onCommit?.(parseNumber((e.target as HTMLInputElement).value))}
      onKeyDown={(e) => {
        // Enter commits this field; it does not submit the form around it (the message).
        if (e.key === "Enter") {
          e.preventDefault();
          p.onCommit?.(parseNumber((e.target as HTMLInputElement).value));
        }
      }}
    />
  );
}
