// Between the HTTP transport, which learns on a 401 that it needs an API key, and the form that asks the
// user for it: `ask` is handed to the transport; the app shows the form while a request is pending and
// passes the answer back with `answer` (the key, and whether to remember it on this browser).
import type { KeyAnswer } from "../transport/http/client";

export interface KeyRequest {
  why: string;
}

export class KeyRequests {
  private current: { why: string; resolve: (answer: KeyAnswer | null) => void } | null = null;
  private listeners = new Set<() => void>();

  get pending(): KeyRequest | null {
    return this.current ? { why: this.current.why } : null;
  }

  /** What the transport calls: resolves with the key the user gives, or null when they cancel. */
  readonly ask = (why: string): Promise<KeyAnswer | null> =>
    new Promise((resolve) => {
      this.current?.resolve(null);
      this.current = { why, resolve };
      this.notify();
    });

  answer(answer: KeyAnswer | null): void {
    const c = this.current;
    this.current = null;
    c?.resolve(answer);
    this.notify();
  }

  subscribe(f: () => void): () => void {
    this.listeners.add(f);
    return () => this.listeners.delete(f);
  }

  private notify(): void {
    for (const f of [...this.listeners]) f();
  }
}
