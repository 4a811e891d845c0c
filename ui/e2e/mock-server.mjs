// A stand-in for `strata serve` for browser checks of the built UI: serves ../dist at / and fakes the
// OpenAI and Strata endpoints (/health, /v1/models, /v1/chat/completions streamed, /strata/model, devices,
// telemetry, events over SSE, cache, settings, plan). With an API key (startMockServer({apiKey})) the /v1
// and /strata paths need `Authorization: Bearer KEY`, as the real server does. A chat whose last message
// asks about the weather gets TOOL_REPLY (a Hermes/Qwen <tool_call>), any other EVIL_REPLY; the bodies of
// the chat requests are kept in `chatBodies`, in order, for the checks to read.
import { createServer } from "node:http";
import { readFile } from "node:fs/promises";
import { extname, join, normalize } from "node:path";
import { fileURLToPath } from "node:url";

const DIST = fileURLToPath(new URL("../dist/", import.meta.url));
const MIB = 1024 * 1024;
const TYPES = { ".html": "text/html", ".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml" };

export const EVIL_REPLY =
  "Here is **bold** and code:\n\n```python\ndef f(x):\n    return x * 2  # double\n```\n\n" +
  'Evil: <img src=x onerror="window.__pwned=1"> <script>window.__pwned=2</script> ' +
  "[click me](javascript:window.__pwned=3) and [a site](https://example.com).";

/** A reply that calls a tool, as a Qwen or Hermes model told about tools writes it. */
export const TOOL_REPLY =
  "Let me look that up.\n\n<tool_call>\n" +
  JSON.stringify({ name: "get_weather", arguments: { city: "Paris", unit: "celsius", days: [1, 2] } }) +
  "\n</tool_call>";

/** The default model's effective sampling, as strata serve reports it in /strata/model. */
export const SAMPLING = {
  temperature: { value: 0.2, source: "preset" },
  top_k: { value: 40, source: "default" },
  top_p: { value: 0.9, source: "preset" },
  min_p: { value: 0.05, source: "default" },
  repeat_penalty: { value: 1, source: "default" },
  repeat_last_n: { value: 64, source: "default" },
  preset: "SmolLM2 (model card)",
};

const SETTINGS = {
  model_path: "/models/SmolLM2-135M-Instruct.Q4_1.gguf",
  devices: "sim:200,sim:400",
  layer_split: "15",
  kv: "f16",
  kv_resident: null,
  max_context: 4096,
  vram_reserve_mib: 64,
  cache_slots: 4,
  cache_mib: 4096,
  threads: null,
  parallel: null,
  engine: { kind: "local" },
  speculative: { kind: "off" },
  draft_max: 16,
  draft_min: 1,
  draft_devices: [],
};

function planFor(s) {
  const split = Number(s.layer_split || "15");
  const reserve = s.vram_reserve_mib * MIB;
  const row = (index, device, layers, free, total) => ({
    device, index, host: false, layers, weights_bytes: total * 0.7, kv_bytes_per_token: 23040, kv_device_bytes: total * 0.2,
    kv_host_bytes: 0, scratch_bytes: total * 0.1, staging_bytes: 0, total_bytes: total, free_bytes: free, memory_bytes: free,
    reserve_bytes: reserve, headroom_bytes: free - total - reserve, fits: free - total - reserve >= 0,
  });
  const rows = [row(0, "sim:200", [0, split], 200 * MIB, split * 6 * MIB), row(1, "sim:400", [split, 30], 400 * MIB, (30 - split) * 6 * MIB)];
  const fits = rows.every((r) => r.fits);
  return {
    plan: { tokens: 4096, sequences: s.parallel ?? 4, max_context: 4096, kv: s.kv, rows, fits, problem: fits ? null : "the split leaves a device under its reserve" },
    flags: ["--devices", s.devices, "--layer-split", s.layer_split, "--kv", s.kv, "--vram-reserve-mib", String(s.vram_reserve_mib)],
  };
}

function json(res, status, body) {
  res.writeHead(status, { "Content-Type": "application/json" });
  res.end(JSON.stringify(body));
}

function apiError(res, status, message, param = null) {
  json(res, status, { error: { message, type: status === 401 ? "authentication_error" : "invalid_request_error", param, code: null } });
}

async function body(req) {
  const chunks = [];
  for await (const c of req) chunks.push(c);
  return JSON.parse(Buffer.concat(chunks).toString("utf8") || "null");
}

export function startMockServer({ apiKey = null, port = 0 } = {}) {
  const chatBodies = [];
  const start = Date.now();
  const now = () => Date.now() - start + 60_000; // the engine has run for a minute already
  const free = (d, t) => (d === 0 ? 120 + 40 * Math.sin(t / 4000) : 300 + 60 * Math.cos(t / 5000)) * MIB;
  const devices = () => ({
    devices: [
      { index: 0, name: "sim:200", kind: "sim", host: false, free_bytes: free(0, now()), total_bytes: 200 * MIB, reserve_bytes: 64 * MIB, strata_bytes: 80 * MIB, by_purpose_bytes: { weights: 60 * MIB, kv: 15 * MIB, scratch: 5 * MIB }, high_water_bytes: 95 * MIB, refused_allocations: 0, failed_samples: 1, layers: [[0, 15]] },
      { index: 1, name: "sim:400", kind: "sim", host: false, free_bytes: free(1, now()), total_bytes: 400 * MIB, reserve_bytes: 64 * MIB, strata_bytes: 90 * MIB, by_purpose_bytes: { weights: 60 * MIB, kv: 30 * MIB }, high_water_bytes: 100 * MIB, refused_allocations: 2, failed_samples: 0, layers: [[15, 30]] },
      { index: 2, name: "cpu", kind: "cpu", host: true, free_bytes: 11 * 1024 * MIB, total_bytes: 31 * 1024 * MIB, reserve_bytes: 0, strata_bytes: 20 * MIB, by_purpose_bytes: {}, high_water_bytes: 30 * MIB, refused_allocations: 0, failed_samples: 0, layers: [] },
    ],
  });
  const events = [
    { t_ms: 5_000, event: "model_loaded", model: "SmolLM2-135M-Instruct.Q4_1", max_context: 4096 },
    { t_ms: 12_000, event: "parked", tokens: 800, ms: 3.2, snapshot_bytes: 12 * MIB, parked: 1, bytes: 12 * MIB, evictions: 0 },
    { t_ms: 20_000, event: "restored", kind: "live", tokens: 800, ms: 1.1, restored_bytes: 12 * MIB, parked: 0, bytes: 0 },
    { t_ms: 28_000, event: "restore_fallback", device: 1, free_mib: 40, need_mib: 120, reserve_mib: 64, tokens: 812 },
    { t_ms: 34_000, event: "restored", kind: "checkpoint", tokens: 512, ms: 2.5, restored_bytes: 8 * MIB, parked: 0, bytes: 0 },
    { t_ms: 40_000, event: "evicted", tokens: 300, bytes: 4 * MIB },
    { t_ms: 46_000, event: "oom_averted", error: "KV page refused on sim:400", tokens: 900 },
    { t_ms: 52_000, event: "sample_failed", device: 0, count: 1 },
    { t_ms: 56_000, event: "sim_fault", device: 1, pressure_mib: null, leave_free_mib: 40, fail_samples: null, fail_alloc: null },
  ];
  const server = createServer(async (req, res) => {
    const url = new URL(req.url ?? "/", "http://x");
    const p = url.pathname;
    if ((p.startsWith("/v1/") || p.startsWith("/strata/")) && apiKey && req.headers.authorization !== `Bearer ${apiKey}`) {
      return apiError(res, 401, "missing or incorrect API key: send it as 'Authorization: Bearer KEY' (the server was started with --api-key)");
    }
    try {
      if (p === "/health") return json(res, 200, { status: "ok", model: "SmolLM2-135M-Instruct.Q4_1", busy: false, queue: 0, queue_limit: 16, accepted: 3 });
      if (p === "/v1/models") return json(res, 200, { object: "list", data: [{ id: "SmolLM2-135M-Instruct.Q4_1", object: "model" }] });
      if (p === "/strata/model") {
        return json(res, 200, { id: "SmolLM2-135M-Instruct.Q4_1", path: SETTINGS.model_path, file_bytes: 98 * MIB, architecture: "llama", quantization: "Q4_1", parameters: 134515008, layers: 30, vocab: 49152, context: 4096, trained_context: 8192, split: [], flags: [], sampling: SAMPLING });
      }
      if (p === "/strata/devices") return json(res, 200, devices());
      // The model library, empty: this mock has no Hub (scripts/e2e-browser checks the library for real).
      if (p === "/strata/library/picks") return json(res, 200, { memory_bytes: 16 * 1024 * MIB, picks: [] });
      if (p === "/strata/library/local") return json(res, 200, { models_dir: "/home/user/.local/share/strata/models", models: [] });
      if (p === "/strata/library/downloads") return json(res, 200, { downloads: [] });
      if (p === "/strata/cache") return json(res, 200, { slots: 4, slots_used: 1, budget_bytes: 4096 * MIB, bytes: 12 * MIB, evictions: 1, live_tokens: 120, parked: [{ tokens: 800, bytes: 12 * MIB, last_use_ms: 12_000, checkpoints: [256, 512] }] });
      if (p === "/strata/settings") return json(res, 200, SETTINGS);
      if (p === "/strata/plan" && req.method === "POST") {
        const s = await body(req);
        const split = Number(s.layer_split);
        if (!/^\d+$/.test(s.layer_split) || split < 1 || split >= 30) {
          return apiError(res, 400, `layer_split: "${s.layer_split}" must be one layer count from 1 to 29 (the model has 30 layers)`, "layer_split");
        }
        return json(res, 200, planFor(s));
      }
      if (p === "/strata/telemetry") {
        const since = Number(url.searchParams.get("since_ms") ?? "-1");
        const samples = [];
        for (let t = 0; t <= now(); t += 500) for (const d of [0, 1, 2]) samples.push({ t_ms: t, device: d, free_bytes: d === 2 ? 11 * 1024 * MIB : free(d, t), total_bytes: 200 * MIB });
        return json(res, 200, { now_ms: now(), samples: samples.filter((s) => s.t_ms > since), events: events.filter((e) => e.t_ms > since) });
      }
      if (p === "/strata/events") {
        res.writeHead(200, { "Content-Type": "text/event-stream", "Cache-Control": "no-cache" });
        let n = 0;
        const timer = setInterval(() => {
          const t = now();
          for (const d of [0, 1, 2]) res.write(`event: sample\ndata: ${JSON.stringify({ t_ms: t, device: d, free_bytes: d === 2 ? 11 * 1024 * MIB : free(d, t), total_bytes: 200 * MIB })}\n\n`);
          if (++n % 10 === 0) res.write(`event: engine\ndata: ${JSON.stringify({ t_ms: t, event: "parked", tokens: 100 + n, ms: 1, snapshot_bytes: MIB, parked: 1, bytes: MIB, evictions: 0 })}\n\n`);
        }, 500);
        req.on("close", () => clearInterval(timer));
        return;
      }
      if (p === "/v1/chat/completions" && req.method === "POST") {
        const b = await body(req);
        chatBodies.push(b);
        res.writeHead(200, { "Content-Type": "text/event-stream" });
        const asked = String(b.messages?.[b.messages.length - 1]?.content ?? "");
        const pieces = (/weather/i.test(asked) ? TOOL_REPLY : EVIL_REPLY).match(/[\s\S]{1,7}/g);
        const chunk = (delta, finish = null) => `data: ${JSON.stringify({ object: "chat.completion.chunk", model: b.model, choices: [{ index: 0, delta, logprobs: null, finish_reason: finish }], usage: null })}\n\n`;
        res.write(chunk({ role: "assistant", content: "" }));
        for (const piece of pieces) {
          await new Promise((r) => setTimeout(r, 15));
          res.write(chunk({ content: piece }));
        }
        res.write(chunk({}, "stop"));
        res.write(`data: ${JSON.stringify({ choices: [], usage: { prompt_tokens: 40, completion_tokens: 60 }, strata: { job: 1, reused: 36, read: 4, kept_reply_tokens: 0, prompt_ms: 13, gen_ms: 500, prompt_tok_s: 300, gen_tok_s: 120.5, queue_ms: 0, drafts_accepted: 0, drafts_proposed: 0, restored: "checkpoint", restored_tokens: 36, fallback: null } })}\n\n`);
        res.end("data: [DONE]\n\n");
        return;
      }
      if (p.startsWith("/v1/") || p.startsWith("/strata/")) return apiError(res, 404, `no such path: ${p}`);
      const file = normalize(join(DIST, p === "/" ? "index.html" : p));
      if (!file.startsWith(DIST)) return apiError(res, 404, "no");
      const data = await readFile(file);
      res.writeHead(200, { "Content-Type": TYPES[extname(file)] ?? "application/octet-stream" });
      res.end(data);
    } catch (e) {
      if (!res.headersSent) apiError(res, 404, String(e));
    }
  });
  return new Promise((resolve) => server.listen(port, "127.0.0.1", () => resolve({ server, url: `http://127.0.0.1:${server.address().port}`, chatBodies })));
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const { url } = await startMockServer({ apiKey: process.env.STRATA_KEY ?? null, port: Number(process.env.PORT ?? 8080) });
  console.log(`mock strata serve: listening on ${url}`);
}
