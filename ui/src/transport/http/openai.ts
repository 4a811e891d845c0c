// The shapes of `strata serve`'s replies turned into the bindings' types: a streamed chat completion into
// ChatChunks (reasoning pieces from `reasoning_content`, text pieces, then done with the `strata` figures, or
// error), /health into EngineStatus, and
// /strata/model into ModelFacts. Pure except `streamChat`, which reads one response body.
import type { ChatChunk, ChatMessage, ChatParams, EngineStatus, ModelFacts, Summary } from "../../bindings";
import { jsonModeOn, PARAM_FIELDS, strataDefaultSampling, toSampling } from "../../chat/params";
import { streamError } from "./client";
import { readSse } from "./sse";

/**
 * The body of POST /v1/chat/completions for a streamed reply. Each parameter that is set is sent under its
 * own name (the OpenAI fields, and llama.cpp's top_k, min_p, repeat_penalty); a null one is left out, never
 * sent as null, so the server applies the model's default. JSON mode on asks for
 * `response_format: {"type": "json_object"}` (the server constrains the reply to a JSON object).
 */
export function chatRequestBody(model: string | null, messages: ChatMessage[], params: ChatParams): Record<string, unknown> {
  const body: Record<string, unknown> = {
    messages: messages.map((m) => ({ role: m.role, content: m.content })),
    stream: true,
    stream_options: { include_usage: true },
  };
  if (model) body.model = model;
  for (const f of PARAM_FIELDS) {
    const v = params[f.key];
    if (v !== null && v !== undefined) body[f.key] = v;
  }
  if (jsonModeOn(params)) body.response_format = { type: "json_object" };
  return body;
}

function num(v: unknown, fallback = 0): number {
  return typeof v === "number" && Number.isFinite(v) ? v : fallback;
}

function obj(v: unknown): Record<string, unknown> {
  return typeof v === "object" && v !== null ? (v as Record<string, unknown>) : {};
}

/** The figures of a reply from its last chunk's `usage` and `strata` objects. */
export function toSummary(usage: unknown, strata: unknown): Summary {
  const u = obj(usage);
  const s = obj(strata);
  const restored = s.restored === "live" || s.restored === "checkpoint" ? s.restored : null;
  return {
    job: num(s.job),
    prompt_tokens: num(u.prompt_tokens),
    completion_tokens: num(u.completion_tokens),
    reasoning_tokens: num(s.reasoning_tokens),
    reused: num(s.reused),
    read: num(s.read),
    kept_reply_tokens: num(s.kept_reply_tokens),
    prompt_ms: num(s.prompt_ms),
    gen_ms: num(s.gen_ms),
    prompt_tok_s: num(s.prompt_tok_s),
    gen_tok_s: num(s.gen_tok_s),
    queue_ms: num(s.queue_ms),
    drafts_accepted: num(s.drafts_accepted),
    drafts_proposed: num(s.drafts_proposed),
    restored,
    restored_tokens: typeof s.restored_tokens === "number" ? s.restored_tokens : null,
    fallback: (s.fallback ?? null) as Summary["fallback"],
  };
}

/** What a chat stream has told so far: its finish reason, its figures, whether it has ended. */
export interface StreamState {
  finishReason: string | null;
  figures: Summary | null;
  done: boolean;
  failed: boolean;
}

export function newStreamState(): StreamState {
  return { finishReason: null, figures: null, done: false, failed: false };
}

/** Reads one `data:` line of a chat completion stream; returns the chunks to deliver now. */
export function onStreamData(state: StreamState, data: string): ChatChunk[] {
  if (state.done || state.failed) return [];
  if (data.trim() === "[DONE]") {
    state.done = true;
    return [{ kind: "done", finish_reason: state.finishReason ?? "stop", figures: state.figures }];
  }
  let parsed: unknown;
  try {
    parsed = JSON.parse(data);
  } catch {
    state.failed = true;
    return [{ kind: "error", message: `the server sent a line that is not JSON: ${data.slice(0, 120)}` }];
  }
  const err = streamError(parsed);
  if (err) {
    state.failed = true;
    return [{ kind: "error", message: err.message }];
  }
  const o = obj(parsed);
  const out: ChatChunk[] = [];
  const choices = Array.isArray(o.choices) ? o.choices : [];
  for (const c of choices) {
    const choice = obj(c);
    if (num(choice.index) !== 0) continue;
    const delta = obj(choice.delta);
    // A delta may carry both (the piece where the think block closes): the reasoning comes first.
    if (typeof delta.reasoning_content === "string" && delta.reasoning_content !== "")
      out.push({ kind: "reasoning", text: delta.reasoning_content });
    if (typeof delta.content === "string" && delta.content !== "") out.push({ kind: "text", text: delta.content });
    if (typeof choice.finish_reason === "string") state.finishReason = choice.finish_reason;
  }
  if (o.strata !== undefined && o.strata !== null) state.figures = toSummary(o.usage, o.strata);
  return out;
}

/** The chunk that closes a stream that ended without `[DONE]` or an error; null when it closed properly. */
export function onStreamEnd(state: StreamState): ChatChunk | null {
  if (state.done || state.failed) return null;
  state.failed = true;
  return { kind: "error", message: "the reply stream ended before it was complete" };
}

/** Reads a chat completion stream, delivering its chunks; resolves at the end, rejects on abort. */
export async function streamChat(
  body: ReadableStream<Uint8Array>,
  onChunk: (c: ChatChunk) => void,
  signal?: AbortSignal,
): Promise<void> {
  const state = newStreamState();
  await readSse(
    body,
    (e) => {
      for (const c of onStreamData(state, e.data)) onChunk(c);
    },
    signal,
  );
  const last = onStreamEnd(state);
  if (last) onChunk(last);
}

/** /health's reply (200 or 503) as an EngineStatus. */
export function healthToStatus(httpStatus: number, body: unknown, model: ModelFacts | null): EngineStatus {
  const b = obj(body);
  if (httpStatus === 200 && b.status === "ok") {
    const busy = b.busy === true;
    const queue = num(b.queue);
    const message = busy || queue > 0 ? `busy, ${queue} waiting` : null;
    return { state: "ready", message, restarts: 0, pid: null, model };
  }
  const reason = typeof b.reason === "string" ? b.reason : `HTTP ${httpStatus}`;
  const state = b.status === "shutting_down" ? "stopped" : "failed";
  return { state, message: reason, restarts: 0, pid: null, model };
}

/**
 * /strata/model's JSON as ModelFacts (it has every ModelFacts field but `name`, which is its `id`). A
 * server that sends no `sampling` (one older than it) is taken to apply Strata's own defaults.
 */
export function toModelFacts(info: unknown): ModelFacts {
  const i = obj(info);
  const str = (v: unknown, d = "") => (typeof v === "string" ? v : d);
  return {
    path: str(i.path),
    name: str(i.name, str(i.id)),
    architecture: str(i.architecture, "?"),
    features: str(i.features),
    quantization: str(i.quantization, "?"),
    parameters: num(i.parameters),
    layers: num(i.layers),
    trained_context: num(i.trained_context),
    vocab: num(i.vocab),
    file_bytes: num(i.file_bytes),
    sampling: toSampling(i.sampling) ?? strataDefaultSampling(),
  };
}
