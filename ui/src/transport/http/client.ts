// HTTP requests to `strata serve` on the page's own origin: the optional API key (asked for on a 401, sent
// as `Authorization: Bearer KEY` on every request) and the mapping of OpenAI error JSON and HTTP statuses
// to TransportError. It owns no endpoint's meaning: http/index.ts does.
// The key is kept in sessionStorage (gone when the tab closes) unless the user chose "Remember on this
// browser", which keeps it in localStorage under its own name. A key an older UI left in localStorage
// (it never asked) is moved to sessionStorage when read.
import type { ErrorCode } from "../../bindings";
import { TransportError } from "../types";

/** The user's answer to the key form: the key, and whether to keep it past this tab. */
export interface KeyAnswer {
  key: string;
  remember: boolean;
}

/** Asks the user for the API key (`why`: the server's message); null when the user declines. */
export type AskKey = (why: string) => Promise<KeyAnswer | null>;

/** The key's name in sessionStorage (this tab), and where an older UI kept it in localStorage. */
export const KEY_STORAGE = "strata.apiKey";
/** The key's name in localStorage when the user chose to remember it on this browser. */
export const REMEMBERED_KEY_STORAGE = "strata.apiKey.remembered";

export interface ClientOptions {
  /** Origin and path prefix; "" is the page's own origin. */
  baseUrl?: string;
  fetch?: typeof fetch;
  /** The browser's lasting storage (localStorage): a remembered key, and the transport's conversations. */
  storage?: Storage;
  /** This tab's storage (sessionStorage): the key by default. */
  session?: Storage;
  askKey?: AskKey;
}

export interface RequestOptions {
  method?: "GET" | "POST";
  /** A body sent as JSON. */
  json?: unknown;
  signal?: AbortSignal;
  accept?: string;
  /** Statuses handed back as a Response instead of rejected (e.g. 503 of /health). */
  pass?: readonly number[];
}

/** OpenAI's error body: {error: {message, type, param, code}}. */
interface OpenAiErrorBody {
  error?: { message?: unknown; type?: unknown; param?: unknown; code?: unknown };
}

/** The TransportError for an HTTP error status and its body (OpenAI's error JSON when there is one). */
export function httpError(status: number, body: unknown): TransportError {
  const err = (body as OpenAiErrorBody | null)?.error;
  const message = typeof err?.message === "string" ? err.message : `HTTP ${status}`;
  const param = typeof err?.param === "string" && err.param !== "" ? err.param : null;
  const code = typeof err?.code === "string" ? err.code : null;
  let kind: ErrorCode;
  if (status === 404) kind = "not_found";
  else if (status === 503 && (code === "server_busy" || code === "shutting_down")) kind = "busy";
  else if (status === 503 && code === "out_of_memory") kind = "engine";
  else if (status >= 500) kind = "engine";
  else kind = "invalid";
  return new TransportError(kind, message, kind === "invalid" ? param : null);
}

/** The error of a stream's `data: {"error": ...}` line, or null when the object is not one. */
export function streamError(obj: unknown): TransportError | null {
  if (typeof obj !== "object" || obj === null || !("error" in obj)) return null;
  return httpError(500, obj);
}

export function isAbort(e: unknown): boolean {
  return (
    (e instanceof DOMException && e.name === "AbortError") ||
    (e instanceof Error && e.name === "AbortError") ||
    (e instanceof TransportError && e.code === "cancelled")
  );
}

export class ApiClient {
  private readonly baseUrl: string;
  private readonly fetchFn: typeof fetch;
  private readonly storage: Storage | null;
  private readonly session: Storage | null;
  private askKey: AskKey | null;
  private key: string | null;
  private asking: Promise<KeyAnswer | null> | null = null;

  constructor(opts: ClientOptions = {}) {
    this.baseUrl = (opts.baseUrl ?? "").replace(/\/+$/, "");
    this.fetchFn = opts.fetch ?? ((input, init) => fetch(input, init));
    this.storage = opts.storage ?? (typeof localStorage === "undefined" ? null : localStorage);
    this.session = opts.session ?? (typeof sessionStorage === "undefined" ? null : sessionStorage);
    this.askKey = opts.askKey ?? null;
    this.key = this.readKey();
  }

  /** Who asks for the key on a 401 (the app sets it once it can show the form). */
  setAskKey(ask: AskKey | null): void {
    this.askKey = ask;
  }

  /** Forgets the key, in this tab and on this browser. */
  clearKey(): void {
    this.key = null;
    for (const [store, name] of this.places()) remove(store, name);
  }

  /** Sends a request; an error status rejects with a TransportError, a 401 asks for the key and retries. */
  async request(path: string, opts: RequestOptions = {}): Promise<Response> {
    for (;;) {
      const keyUsed = this.key;
      const headers: Record<string, string> = {};
      if (keyUsed) headers.Authorization = `Bearer ${keyUsed}`;
      if (opts.accept) headers.Accept = opts.accept;
      let body: string | undefined;
      if (opts.json !== undefined) {
        headers["Content-Type"] = "application/json";
        body = JSON.stringify(opts.json);
      }
      let res: Response;
      try {
        res = await this.fetchFn(this.baseUrl + path, {
          method: opts.method ?? (body === undefined ? "GET" : "POST"),
          headers,
          body,
          signal: opts.signal,
        });
      } catch (e) {
        if (isAbort(e) || opts.signal?.aborted) throw new TransportError("cancelled", "cancelled");
        throw new TransportError("io", `cannot reach strata serve: ${e instanceof Error ? e.message : String(e)}`);
      }
      if (res.ok || opts.pass?.includes(res.status)) return res;
      const parsed = await readJson(res);
      if (res.status === 401) {
        // Another request may have got a new key while this one was on its way: try that one first.
        if (this.key !== keyUsed && this.key) continue;
        const refused = httpError(401, parsed);
        const answer = await this.promptKey(keyUsed ? `The key was refused: ${refused.message}` : refused.message);
        if (!answer) throw refused;
        this.storeKey(answer);
        continue;
      }
      throw httpError(res.status, parsed);
    }
  }

  async getJson<T>(path: string, signal?: AbortSignal): Promise<T> {
    const res = await this.request(path, { signal, accept: "application/json" });
    return (await res.json()) as T;
  }

  async postJson<T>(path: string, json: unknown, signal?: AbortSignal): Promise<T> {
    const res = await this.request(path, { method: "POST", json, signal, accept: "application/json" });
    return (await res.json()) as T;
  }

  private promptKey(why: string): Promise<KeyAnswer | null> {
    if (!this.askKey) return Promise.resolve(null);
    // One form for every request that got a 401 at the same time.
    if (!this.asking) {
      this.asking = this.askKey(why).finally(() => {
        this.asking = null;
      });
    }
    return this.asking.then((a) => (a && a.key.trim() ? { key: a.key.trim(), remember: a.remember } : null));
  }

  /** Every place a key may be: this tab's, the remembered one, and where an older UI left it. */
  private places(): [Storage | null, string][] {
    return [
      [this.session, KEY_STORAGE],
      [this.storage, REMEMBERED_KEY_STORAGE],
      [this.storage, KEY_STORAGE],
    ];
  }

  /** Keeps the key in one place only: this browser's storage when remembered, else this tab's. */
  private storeKey({ key, remember }: KeyAnswer): void {
    this.key = key;
    for (const [store, name] of this.places()) remove(store, name);
    // Storage unavailable: the key is kept for this page only.
    if (remember) set(this.storage, REMEMBERED_KEY_STORAGE, key);
    else set(this.session, KEY_STORAGE, key);
  }

  private readKey(): string | null {
    const here = get(this.session, KEY_STORAGE) ?? get(this.storage, REMEMBERED_KEY_STORAGE);
    if (here) return here;
    // An older UI kept the key in localStorage without asking: it moves to this tab's storage.
    const old = get(this.storage, KEY_STORAGE);
    if (old) {
      remove(this.storage, KEY_STORAGE);
      set(this.session, KEY_STORAGE, old);
    }
    return old;
  }
}

function get(store: Storage | null, name: string): string | null {
  try {
    return store?.getItem(name) ?? null;
  } catch {
    return null;
  }
}

function set(store: Storage | null, name: string, value: string): void {
  try {
    store?.setItem(name, value);
  } catch {
    // storage unavailable (private mode, quota): the key stays in memory
  }
}

function remove(store: Storage | null, name: string): void {
  try {
    store?.removeItem(name);
  } catch {
    // storage unavailable: nothing was kept there
  }
}

async function readJson(res: Response): Promise<unknown> {
  try {
    return JSON.parse(await res.text()) as unknown;
  } catch {
    return null;
  }
}
