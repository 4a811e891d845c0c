// Picks the transport at startup: the Tauri one inside the desktop app (window.__TAURI_INTERNALS__ is
// there), else HTTP against the page's own origin (`strata serve`), which asks for an API key through
// `askKey` when the server answers 401.
import type { AskKey } from "./http/client";
import { HttpTransport } from "./http";
import { TauriTransport } from "./tauri";
import type { Transport } from "./types";

export function isTauri(w: object = window): boolean {
  return "__TAURI_INTERNALS__" in w && (w as { __TAURI_INTERNALS__?: unknown }).__TAURI_INTERNALS__ != null;
}

export function createTransport(askKey: AskKey): Transport {
  return isTauri() ? new TauriTransport() : new HttpTransport({ askKey });
}
