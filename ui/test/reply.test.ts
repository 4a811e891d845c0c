// How chunks build a reply, and the figures shown under it.
import { describe, expect, it } from "vitest";
import { replyFigures } from "../src/chat/figures";
import { applyChunk, newReply, RETRY_NOTE, stopReply, withoutPendingReply } from "../src/chat/reply";
import { conversation, MIB, summary } from "./fakes";

describe("applyChunk", () => {
  it("appends text, clears it on retrying with a note, ends on done with figures", () => {
    let r = newReply();
    r = applyChunk(r, { kind: "text", text: "Hel" });
    r = applyChunk(r, { kind: "text", text: "lo" });
    expect(r.text).toBe("Hello");
    r = applyChunk(r, { kind: "retrying", reason: "" });
    expect(r.text).toBe("");
    expect(r.note).toBe(RETRY_NOTE);
    expect(r.retries).toBe(1);
    r = applyChunk(r, { kind: "text", text: "Hi" });
    r = applyChunk(r, { kind: "done", finish_reason: "stop", figures: summary() });
    expect(r).toMatchObject({ text: "Hi", status: "done", finishReason: "stop" });
    expect(applyChunk(r, { kind: "text", text: "late" }).text).toBe("Hi");
  });

  it("ends with the error message; a stop ends a streaming reply", () => {
    expect(applyChunk(newReply(), { kind: "error", message: "boom" })).toMatchObject({ status: "error", error: "boom" });
    expect(stopReply(newReply()).status).toBe("stopped");
  });
});

describe("withoutPendingReply", () => {
  it("drops the stored reply still being written, and nothing else", () => {
    const user = { role: "user" as const, content: "hi", figures: null, complete: true };
    const partial = { role: "assistant" as const, content: "Hel", figures: null, complete: false };
    const ended = { ...partial, content: "Hello", complete: true };
    expect(withoutPendingReply(conversation({ messages: [user, partial] })).messages).toEqual([user]);
    expect(withoutPendingReply(conversation({ messages: [user, ended] })).messages).toEqual([user, ended]);
    expect(withoutPendingReply(conversation({ messages: [user] })).messages).toEqual([user]);
    expect(withoutPendingReply(conversation()).messages).toEqual([]);
  });
});

describe("replyFigures", () => {
  it("writes speed, reused/read, a restore and drafts", () => {
    const f = replyFigures(summary({ restored: "checkpoint", restored_tokens: 512, drafts_accepted: 3, drafts_proposed: 5 }));
    expect(f.map((x) => x.text)).toEqual(["106.6 tok/s", "36 reused · 4 read", "restored checkpoint (512 tokens)", "drafts 3/5 accepted"]);
  });

  it("counts the earlier replies' tokens kept as generated, only when there are some", () => {
    expect(replyFigures(summary({ kept_reply_tokens: 7 })).find((x) => x.key === "kept")?.text).toBe("7 reply tokens kept");
    expect(replyFigures(summary({ kept_reply_tokens: 0 })).some((x) => x.key === "kept")).toBe(false);
  });

  it("writes a gate fallback in MiB and an allocation failure", () => {
    const gate = replyFigures(
      summary({ fallback: { reason: "gate", device: 1, free_bytes: 40 * MIB, need_bytes: 120 * MIB, reserve_bytes: 64 * MIB, tokens: 800 } }),
    );
    expect(gate.find((x) => x.key === "fallback")?.text).toBe("fallback: gate on device 1: free 40 MiB, need 120 MiB, reserve 64 MiB");
    const alloc = replyFigures(summary({ fallback: { reason: "alloc_failed", error: "out of memory on cuda:0", tokens: 800 } }));
    expect(alloc.find((x) => x.key === "fallback")?.text).toBe("fallback: alloc_failed (out of memory on cuda:0)");
  });
});
