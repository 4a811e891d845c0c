// The chat preferences of a browser (the desktop app keeps them in its backend), in localStorage under one
// key, checked as the app's backend checks them before they are kept. It owns that key and never talks to
// the server.
import type { ChatPreferences } from "../../bindings";
import { defaultPreferences, preferencesError, toPreferences } from "../../chat/params";
import { TransportError } from "../types";

export const PREFERENCES_STORAGE = "strata.chatPreferences.v1";

export class LocalPreferences {
  constructor(private readonly storage: Storage) {}

  /** What is stored; the defaults when nothing is, or when what is stored is not preferences. */
  get(): ChatPreferences {
    let raw: string | null;
    try {
      raw = this.storage.getItem(PREFERENCES_STORAGE);
    } catch (e) {
      throw TransportError.from(e, "io");
    }
    if (!raw) return defaultPreferences();
    let parsed: unknown;
    try {
      parsed = JSON.parse(raw);
    } catch {
      parsed = null;
    }
    const prefs = toPreferences(parsed);
    if (!prefs) console.warn(`${PREFERENCES_STORAGE} in this browser is not chat preferences: using the defaults`);
    return prefs ?? defaultPreferences();
  }

  save(p: ChatPreferences): ChatPreferences {
    const bad = preferencesError(p);
    if (bad) throw new TransportError("invalid", bad.message, bad.field);
    try {
      this.storage.setItem(PREFERENCES_STORAGE, JSON.stringify(p));
    } catch (e) {
      throw new TransportError("io", `cannot store the chat preferences in this browser: ${e instanceof Error ? e.message : String(e)}`);
    }
    return p;
  }
}
