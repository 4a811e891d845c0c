// The chat view's preferences: read once from the transport, the Parameters panel's values (restored from
// what is saved for a model when that model becomes current), and saving them for the model, resetting
// them, and changing the reply limit, each kept through the transport at once.
import { useEffect, useRef, useState } from "preact/hooks";
import type { ChatParams, ChatPreferences } from "../../bindings";
import { defaultPreferences, NO_PARAMS, sameParams, savedParams, withoutSaved, withSaved } from "../../chat/params";
import type { Transport } from "../../transport/types";
import { messageOf } from "../../util/errors";

export interface ChatPreferencesState {
  prefs: ChatPreferences;
  params: ChatParams;
  setParams: (p: ChatParams) => void;
  /** Values are saved for the current model / the fields differ from them (or from empty). */
  saved: boolean;
  dirty: boolean;
  save: () => Promise<void>;
  reset: () => Promise<void>;
  setReplyLimit: (tokens: number) => Promise<void>;
  note: string | null;
  error: string | null;
}

export function useChatPreferences(transport: Transport, modelPath: string | null): ChatPreferencesState {
  const [prefs, setPrefs] = useState<ChatPreferences>(defaultPreferences);
  const [loaded, setLoaded] = useState(false);
  const [params, setParamsState] = useState<ChatParams>(NO_PARAMS);
  const [note, setNote] = useState<string | null>(null);
  const [error, setError] = useState<string | null>(null);
  // The model whose saved values the fields were last set from.
  const restoredFor = useRef<string | null>(null);

  useEffect(() => {
    let stopped = false;
    transport.getPreferences().then(
      (p) => {
        if (stopped) return;
        setPrefs(p);
        setLoaded(true);
      },
      (e: unknown) => {
        if (stopped) return;
        setError(`cannot read the chat preferences: ${messageOf(e)}`);
        setLoaded(true);
      },
    );
    return () => {
      stopped = true;
    };
  }, [transport]);

  // A model that becomes current gets its saved values (none saved: every field empty). No model (unloaded,
  // or the engine briefly unreachable) leaves the fields as they are.
  useEffect(() => {
    if (!loaded || modelPath === null || restoredFor.current === modelPath) return;
    restoredFor.current = modelPath;
    setParamsState(savedParams(prefs, modelPath) ?? NO_PARAMS);
    setNote(null);
  }, [loaded, modelPath]);

  const saved = modelPath !== null && savedParams(prefs, modelPath) !== null;
  const dirty = !sameParams(params, (modelPath !== null ? savedParams(prefs, modelPath) : null) ?? NO_PARAMS);

  const keep = async (next: ChatPreferences, done: string) => {
    try {
      setPrefs(await transport.savePreferences(next));
      setError(null);
      setNote(done);
    } catch (e) {
      setError(`not saved: ${messageOf(e)}`);
      setNote(null);
    }
  };

  return {
    prefs,
    params,
    setParams: (p) => {
      setParamsState(p);
      setNote(null);
    },
    saved,
    dirty,
    save: async () => {
      if (modelPath === null) return;
      await keep(withSaved(prefs, modelPath, params), "Saved for this model.");
    },
    reset: async () => {
      setParamsState(NO_PARAMS);
      if (modelPath !== null && saved) await keep(withoutSaved(prefs, modelPath), "Reset to the model's defaults.");
      else setNote("Reset to the model's defaults.");
    },
    setReplyLimit: (tokens) => keep({ ...prefs, reply_limit_tokens: tokens }, `Reply limit: ${tokens} tokens.`),
    note,
    error,
  };
}
