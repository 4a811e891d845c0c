// HTTP requests to `strata serve` on the page's own origin: the optional API key (asked for on a 401, kept
// in localStorage, sent as `Authorization: Bearer KEY` on every request) and the mapping of OpenAI error
// JSON and HTTP statuses to TransportError. It owns no endpoint's meaning: http/index.ts does.
import type { ErrorCode } from "../../bindings";
import { TransportError } from "../types";

/** Asks the user for the API key (`why`: the server's message); null when the user declines. */
export type AskKey = (why: string) => Promise<string | null>;

export const KEY_STORAGE = "strata.apiKey";

export interface ClientOptions {
  /** Origin and path prefix; "" is the page's own origin. */
  baseUrl?: string;
  fetch?: typeof fetch;
  storage?: Storage;
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
  private askKey: AskKey | null;
  private key: string | null;
  private asking: Promise<string | null> | null = null;

  constructor(opts: ClientOptions = {}) {
    this.baseUrl = (opts.baseUrl ?? "").replace(/\/+$/, "");
    this.fetchFn = opts.fetch ?? ((input, init) => fetch(input, init));
    this.storage = opts.storage ?? (typeof localStorage === "undefined" ? null : localStorage);
    this.askKey = opts.askKey ?? null;
    this.key = this.readKey();
  }

  /** Who asks for the key on a 401 (the app sets it once it can show the form). */
  setAskKey(ask: AskKey | null): void {
    this.askKey = ask;
  }

  /** Forgets the stored key. */
  clearKey(): void {
    this.key = null;
    try {
      this.storage?.removeItem(KEY_STORAGE);
    } catch {
      // storage unavailable: the key was only in memory
    }
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
        const key = await this.promptKey(keyUsed ? `The key was refused: ${refused.message}` : refused.message);
        if (!key) throw refused;
        this.storeKey(key);
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

  private promptKey(why: string): Promise<string | null> {
    if (!this.askKey) return Promise.resolve(null);
    // One form for every request that got a 401 at the same time.
    if (!this.asking) {
      this.asking = this.askKey(why).finally(() => {
        this.asking = null;
      });
    }
    return this.asking.then((k) => (k && k.trim() ? k.trim() : null));
  }

  private storeKey(key: string): void {
    this.key = key;
    try {
      this.storage?.setItem(KEY_STORAGE, key);
    } catch {
      // storage unavailable: keep it for this page only
    }
  }

  private readKey(): string | null {
    try {
      return this.storage?.getItem(KEY_STORAGE) ?? null;
    } catch {
      return null;
    }
  }
}

async function readJson(res: Response): Promise<unknown> {
  try {
    return JSON.parse(await res.text()) as unknown;
  } catch {
    return null;
  }
}
