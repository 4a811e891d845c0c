// The Tauri transport through @tauri-apps/api/mocks: each method invokes the right command with the right
// argument keys, Channel messages reach the caller in order, CommandErrors keep their field, events reach
// the listeners; and COMMANDS is one string literal per line, as the Rust-side test reads it.
import { clearMocks, mockIPC } from "@tauri-apps/api/mocks";
import { readdirSync, readFileSync, statSync } from "node:fs";
import { join } from "node:path";
import { afterEach, describe, expect, it, vi } from "vitest";
import type { ChatChunk, LoadProgress, TelemetryEntry } from "../src/bindings";
import { COMMANDS } from "../src/transport/commands";
import { isTauri } from "../src/transport/index";
import { TauriTransport } from "../src/transport/tauri";
import { TransportError } from "../src/transport/types";
import { exportDocument, titleFrom } from "../src/chat/conversation";
import { NO_PARAMS } from "../src/chat/params";
import { conversation, facts, preferences, settings, summary } from "./fakes";

interface Call {
  cmd: string;
  args: Record<string, unknown>;
}

/** Sends `message` as the index-th message of the Channel passed as an argument, as the Rust side does. */
function sendOnChannel(channel: unknown, index: number, message: unknown): void {
  const ref = (channel as { toJSON(): string }).toJSON(); // "__CHANNEL__:<callback id>"
  const id = Number(ref.split(":")[1]);
  const internals = (window as unknown as { __TAURI_INTERNALS__: { runCallback(id: number, data: unknown): void } }).__TAURI_INTERNALS__;
  internals.runCallback(id, { index, message });
}

function record(reply: (c: Call) => unknown): Call[] {
  const calls: Call[] = [];
  mockIPC((cmd, args) => {
    const c = { cmd, args: (args ?? {}) as Record<string, unknown> };
    calls.push(c);
    return reply(c);
  });
  return calls;
}

afterEach(() => clearMocks());

describe("TauriTransport", () => {
  it("is picked when __TAURI_INTERNALS__ is there", () => {
    expect(isTauri({})).toBe(false);
    expect(isTauri({ __TAURI_INTERNALS__: {} })).toBe(true);
  });

  it("invokes each command by its name with camelCase argument keys", async () => {
    const trip = conversation({ id: "c1", title: "Trip: Lisbon", messages: [{ role: "user", content: "Plan it", figures: null, complete: true }] });
    const calls = record(({ cmd }) => {
      switch (cmd) {
        case "conversations_list":
          return [];
        case "conversation_get":
          return trip;
        case "conversation_save":
          return "/home/u/Trip-Lisbon.md";
        case "engine_status":
          return { state: "ready", message: null, restarts: 0, pid: 1, model: facts() };
        default:
          return null;
      }
    });
    const t = new TauriTransport();
    const s = settings();
    await t.inspectModel("/m/a.gguf");
    await t.plan(s);
    await t.unloadModel();
    await t.getSettings();
    await t.saveSettings(s);
    await t.chatCancel("c1");
    const prefs = preferences({ reply_limit_tokens: 300 });
    await t.getPreferences();
    await t.savePreferences(prefs);
    await t.listConversations();
    await t.getConversation("c1");
    await t.createConversation(null);
    await t.createConversation("  Two\n lines ");
    await t.renameConversation("c1", "New title");
    await t.deleteConversation("c1");
    expect(await t.saveExport("c1", "markdown")).toBe("/home/u/Trip-Lisbon.md");
    await t.devices();
    await t.telemetry(1500);
    await t.cache();
    expect((await t.currentModel())?.name).toBe(facts().name);
    expect(calls).toEqual([
      { cmd: "inspect_model", args: { path: "/m/a.gguf" } },
      { cmd: "plan", args: { settings: s } },
      { cmd: "unload_model", args: {} },
      { cmd: "get_settings", args: {} },
      { cmd: "save_settings", args: { settings: s } },
      { cmd: "chat_cancel", args: { conversationId: "c1" } },
      { cmd: "get_preferences", args: {} },
      { cmd: "save_preferences", args: { preferences: prefs } },
      { cmd: "conversations_list", args: {} },
      { cmd: "conversation_get", args: { id: "c1" } },
      { cmd: "conversation_create", args: { title: null } },
      // Titles are cleaned here (chat/conversation.ts); the backend stores them as sent.
      { cmd: "conversation_create", args: { title: "Two lines" } },
      { cmd: "conversation_rename", args: { id: "c1", title: "New title" } },
      { cmd: "conversation_delete", args: { id: "c1" } },
      // The export is made here from the stored conversation; the backend only writes it where the user says.
      { cmd: "conversation_get", args: { id: "c1" } },
      { cmd: "conversation_save", args: { fileName: "Trip-Lisbon.md", text: exportDocument(trip, "markdown") } },
      { cmd: "devices", args: {} },
      { cmd: "telemetry", args: { sinceMs: 1500 } },
      { cmd: "cache", args: {} },
      { cmd: "engine_status", args: {} },
    ]);
    for (const c of calls) expect(COMMANDS).toContain(c.cmd);
  });

  it("streams chat chunks through the onChunk Channel, in order even when sent out of order", async () => {
    const calls = record(({ cmd, args }) => {
      if (cmd === "conversation_get") return conversation({ id: "c9", title: "Kept" });
      if (cmd !== "chat_send") return null;
      const ch = args.onChunk;
      sendOnChannel(ch, 1, { kind: "text", text: " world" });
      sendOnChannel(ch, 0, { kind: "text", text: "Hello" });
      sendOnChannel(ch, 2, { kind: "retrying", reason: "engine exited" });
      sendOnChannel(ch, 3, { kind: "done", finish_reason: "stop", figures: summary() });
      return null;
    });
    const chunks: ChatChunk[] = [];
    const messages = [{ role: "user" as const, content: "Hi" }];
    const params = { temperature: 0.7, top_k: 20, top_p: null, min_p: 0.1, repeat_penalty: null, max_tokens: 64, seed: null, json_mode: true };
    await new TauriTransport().chatSend("c9", messages, params, (c) => chunks.push(c));
    expect(calls.map((c) => c.cmd)).toEqual(["conversation_get", "chat_send"]);
    const send = calls[1]!;
    expect(Object.keys(send.args).sort()).toEqual(["conversationId", "messages", "onChunk", "params", "title"]);
    // A titled conversation keeps its title: none is sent.
    expect(send.args).toMatchObject({ conversationId: "c9", messages, params, title: null });
    expect(String((send.args.onChunk as { toJSON(): string }).toJSON())).toMatch(/^__CHANNEL__:\d+$/);
    expect(chunks.map((c) => c.kind)).toEqual(["text", "text", "retrying", "done"]);
    expect(chunks.slice(0, 2)).toEqual([
      { kind: "text", text: "Hello" },
      { kind: "text", text: " world" },
    ]);
  });

  it("sends the title chat/conversation.ts gives an untitled conversation; the backend decides none", async () => {
    for (const stored of ["", "New conversation"]) {
      const calls = record(({ cmd }) => (cmd === "conversation_get" ? conversation({ id: "c9", title: stored }) : null));
      const long = "  Plan a trip to Lisbon and Porto, with the trains between them and a day in Sintra\nsecond line";
      const messages = [
        { role: "system" as const, content: "Be brief." },
        { role: "user" as const, content: long },
      ];
      await new TauriTransport().chatSend("c9", messages, NO_PARAMS, () => {});
      const title = calls.find((c) => c.cmd === "chat_send")?.args.title;
      expect(title).toBe(titleFrom(messages));
      expect(title).toBe("Plan a trip to Lisbon and Porto, with the train…");
      clearMocks();
    }
  });

  it("reports load progress through the onProgress Channel and resolves with the facts", async () => {
    const calls = record(({ cmd, args }) => {
      if (cmd !== "load_model") return null;
      sendOnChannel(args.onProgress, 0, { path: args.path, stage: "loading", fraction: 0.5, message: null });
      sendOnChannel(args.onProgress, 1, { path: args.path, stage: "ready", fraction: 1, message: null });
      return facts({ path: String(args.path) });
    });
    const progress: LoadProgress[] = [];
    const f = await new TauriTransport().loadModel("/m/b.gguf", (p) => progress.push(p));
    expect(Object.keys(calls[0]!.args).sort()).toEqual(["onProgress", "path"]);
    expect(f.path).toBe("/m/b.gguf");
    expect(progress.map((p) => [p.stage, p.fraction])).toEqual([
      ["loading", 0.5],
      ["ready", 1],
    ]);
  });

  it("rejects with the CommandError's code, field and message", async () => {
    mockIPC(() => {
      throw { code: "invalid", field: "vram_reserve_mib", message: "the reserve is larger than sim:200" };
    });
    const err = await new TauriTransport().saveSettings(settings()).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(TransportError);
    expect(err).toMatchObject({ code: "invalid", field: "vram_reserve_mib", message: "the reserve is larger than sim:200" });
    mockIPC(() => {
      throw "command plan not allowed";
    });
    await expect(new TauriTransport().plan(settings())).rejects.toMatchObject({ message: "command plan not allowed" });
  });

  it("delivers telemetry and engine_status events to their listeners until unsubscribed", async () => {
    mockIPC(() => null, { shouldMockEvents: true });
    const { emit } = await import("@tauri-apps/api/event");
    const t = new TauriTransport();
    const entries: TelemetryEntry[] = [];
    const states: string[] = [];
    const stopT = t.onTelemetry((e) => entries.push(e));
    const stopS = t.onEngineStatus((s) => states.push(s.state));
    await vi.waitFor(async () => {
      await emit("engine_status", { state: "restarting", message: null, restarts: 1, pid: null, model: null });
      expect(states.length).toBeGreaterThan(0);
    });
    await emit("telemetry", { t_ms: 5, device: 0, free_bytes: 1, total_bytes: 2 });
    await emit("telemetry", { t_ms: 6, event: "evicted", tokens: 1, bytes: 1 });
    expect(entries).toEqual([
      { t_ms: 5, device: 0, free_bytes: 1, total_bytes: 2 },
      { t_ms: 6, event: "evicted", tokens: 1, bytes: 1 },
    ]);
    stopT();
    stopS();
    await emit("telemetry", { t_ms: 7, device: 0, free_bytes: 1, total_bytes: 2 });
    expect(entries).toHaveLength(2);
    expect(states[0]).toBe("restarting");
  });

  it("picks a model with the dialog plugin's open and a gguf filter", async () => {
    const calls = record(({ cmd }) => (cmd === "plugin:dialog|open" ? "/m/picked.gguf" : null));
    expect(await new TauriTransport().pickModelFile()).toBe("/m/picked.gguf");
    expect(calls[0]?.cmd).toBe("plugin:dialog|open");
    expect(calls[0]?.args).toMatchObject({ options: { multiple: false, filters: [{ extensions: ["gguf"] }] } });
  });
});

/** ui/src (vitest runs in ui/). */
const SRC = join(process.cwd(), "src");

describe("COMMANDS", () => {
  it("is one string literal per line between `COMMANDS = [` and `] as const`", () => {
    const src = readFileSync(join(SRC, "transport/commands.ts"), "utf8");
    const block = /export const COMMANDS = \[\n([\s\S]*?)\n\] as const;/.exec(src);
    expect(block).not.toBeNull();
    const lines = block![1]!.split("\n");
    for (const l of lines) expect(l).toMatch(/^ {2}"[a-z_]+",$/);
    expect(lines.map((l) => l.trim().slice(1, -2))).toEqual([...COMMANDS]);
  });

  it("lists every command name that src/ invokes, and src/ invokes only through callCommand", () => {
    const root = SRC;
    const files: string[] = [];
    const walk = (d: string) => {
      for (const n of readdirSync(d)) {
        const p = join(d, n);
        if (statSync(p).isDirectory()) {
          if (n !== "bindings") walk(p);
        } else if (/\.tsx?$/.test(n)) files.push(p);
      }
    };
    walk(root);
    const used = new Set<string>();
    for (const f of files) {
      const src = readFileSync(f, "utf8");
      for (const m of src.matchAll(/callCommand(?:<[^>]*>)?\("([a-z_]+)"/g)) used.add(m[1]!);
      const invokes = [...src.matchAll(/\binvoke(?:<[^>]*>)?\(/g)].length;
      expect(invokes, `${f} calls invoke directly`).toBe(f.endsWith("transport/tauri.ts") ? 1 : 0);
    }
    expect([...used].sort()).toEqual([...COMMANDS].sort());
  });
});
