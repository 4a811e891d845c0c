// The figures under an assistant reply, as short labelled strings: speed, where the prompt's state came
// from (reused, read, earlier replies kept as generated, restored live or from a checkpoint, or why a
// restore fell back) and speculative drafts. Pure.
import type { Fallback, Summary } from "../bindings";
import { mib } from "../util/format";

export interface Figure {
  /** A stable name for tests and styling. */
  key: "speed" | "tokens" | "kept" | "restore" | "fallback" | "drafts";
  text: string;
  /** A longer explanation (title attribute). */
  detail?: string;
}

export function fallbackText(f: Fallback): string {
  if (f.reason === "gate") {
    return `fallback: gate on device ${f.device}: free ${mib(f.free_bytes)} MiB, need ${mib(f.need_bytes)} MiB, reserve ${mib(f.reserve_bytes)} MiB`;
  }
  return `fallback: alloc_failed (${f.error})`;
}

export function replyFigures(s: Summary): Figure[] {
  const out: Figure[] = [
    {
      key: "speed",
      text: `${s.gen_tok_s.toFixed(1)} tok/s`,
      detail: `${s.completion_tokens} tokens generated in ${Math.round(s.gen_ms)} ms; prompt ${s.prompt_tok_s.toFixed(1)} tok/s`,
    },
    {
      key: "tokens",
      text: `${s.reused} reused · ${s.read} read`,
      detail: `prompt of ${s.prompt_tokens} tokens: ${s.reused} reused from the cache, ${s.read} read`,
    },
  ];
  if (s.kept_reply_tokens > 0) {
    out.push({
      key: "kept",
      text: `${s.kept_reply_tokens} reply tokens kept`,
      detail: `${s.kept_reply_tokens} prompt tokens are earlier replies, taken as they were generated (not retokenized)`,
    });
  }
  if (s.restored) {
    const n = s.restored_tokens ?? 0;
    out.push({ key: "restore", text: `restored ${s.restored} (${n} tokens)` });
  }
  if (s.fallback) {
    out.push({ key: "fallback", text: fallbackText(s.fallback), detail: `${s.fallback.tokens} tokens reread instead` });
  }
  if (s.drafts_proposed > 0) {
    out.push({ key: "drafts", text: `drafts ${s.drafts_accepted}/${s.drafts_proposed} accepted` });
  }
  return out;
}
