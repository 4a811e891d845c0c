// A page-side stand-in for the Tauri runtime, injected before the UI loads, so that the built UI runs its
// Tauri transport in a real browser: window.__TAURI_INTERNALS__ (invoke, callbacks, metadata) answering
// the app's commands, Channels fed as the Rust side feeds them, and helpers to drop a file
// (window.__simDrop) and emit an event (window.__simEmit).
export const TAURI_SIM = String.raw`
(() => {
  const MIB = 1024 * 1024;
  const callbacks = new Map();
  const listeners = new Map();
  let next = 1;
  const facts = (path) => ({ path, name: path.split("/").pop().replace(/\.gguf$/, ""), architecture: "llama", quantization: "Q4_1",
    parameters: 134515008, layers: 30, trained_context: 8192, vocab: 49152, file_bytes: 98 * MIB,
    sampling: { temperature: { value: 0.2, source: "preset" }, top_k: { value: 40, source: "default" }, top_p: { value: 0.9, source: "preset" },
      min_p: { value: 0.05, source: "default" }, repeat_penalty: { value: 1, source: "default" }, repeat_last_n: { value: 64, source: "default" },
      preset: "SmolLM2 (model card)" } });
  const settings = { model_path: null, devices: "cuda:0,cuda:1", layer_split: "15", kv: "f16", kv_resident: null, max_context: 4096,
    vram_reserve_mib: 512, cache_slots: 4, cache_mib: 4096, threads: null, parallel: null, engine: { kind: "local" },
    speculative: { kind: "off" }, draft_max: 16, draft_min: 1, draft_devices: [] };
  const row = (index, device, free, total) => ({ device, index, host: false, layers: index ? [15, 30] : [0, 15], weights_bytes: total * 0.8,
    kv_bytes_per_token: 23040, kv_device_bytes: total * 0.15, kv_host_bytes: 0, scratch_bytes: total * 0.05, staging_bytes: 0,
    total_bytes: total, free_bytes: free, memory_bytes: free, reserve_bytes: 512 * MIB, headroom_bytes: free - total - 512 * MIB,
    fits: free - total - 512 * MIB >= 0 });
  const send = (ch, index, message) => runCallback(Number(ch.toJSON().split(":")[1]), { index, message });
  const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
  let conv = null;
  let prefs = { reply_limit_tokens: 2048, params_by_model: {} };
  window.__simSent = [];
  function runCallback(id, data) { const f = callbacks.get(id); if (f) f(data); }
  async function invoke(cmd, args) {
    switch (cmd) {
      case "plugin:event|listen": {
        if (!listeners.has(args.event)) listeners.set(args.event, []);
        listeners.get(args.event).push(args.handler);
        return args.handler;
      }
      case "plugin:event|unlisten": return null;
      case "plugin:dialog|open": return "/models/picked.gguf";
      case "engine_status": return { state: "ready", message: null, restarts: 0, pid: 4242, model: facts("/models/SmolLM2.gguf") };
      case "get_settings": return settings;
      case "save_settings": return args.settings;
      case "inspect_model":
        if (!args.path.endsWith(".gguf")) throw { code: "model", field: null, message: args.path + " is not a GGUF file (it starts with 'hell', not 'GGUF')" };
        return facts(args.path);
      case "plan": {
        const big = (args.settings.model_path || "").includes("big");
        return { plan: { tokens: 4096, sequences: 1, max_context: 4096, kv: "f16", rows: [row(0, "cuda:0", 8000 * MIB, 3000 * MIB), row(1, "cuda:1", 4000 * MIB, big ? 6000 * MIB : 3000 * MIB)],
          fits: !big, problem: big ? "layers 15-30 need 2.5 GiB more on cuda:1" : null }, flags: [] };
      }
      case "load_model": {
        for (let i = 0; i <= 4; i++) { send(args.onProgress, i, { path: args.path, stage: i < 4 ? "loading" : "ready", fraction: i / 4, message: i < 4 ? "layer " + i * 7 : null }); await sleep(150); }
        return facts(args.path);
      }
      case "conversations_list": return conv ? [{ id: conv.id, title: conv.title, updated_ms: 1, messages: conv.messages.length }] : [];
      case "conversation_create": conv = { id: "c1", title: args.title ?? "", created_ms: 1, updated_ms: 1, messages: [] }; return conv;
      case "conversation_get": return conv;
      case "get_preferences": return prefs;
      case "save_preferences": prefs = args.preferences; return prefs;
      case "chat_send": {
        window.__simSent.push(args.params);
        conv.messages = [...args.messages.map((m) => ({ ...m, figures: null, complete: true })), { role: "assistant", content: "", figures: null, complete: false }];
        // As the app's backend: the title is the one the page sent, if any (it makes none).
        if (args.title != null) conv.title = args.title;
        (async () => {
          send(args.onChunk, 0, { kind: "stored" });
          let i = 1;
          for (const t of ["Partial ", "text that ", "dies"]) { send(args.onChunk, i++, { kind: "text", text: t }); await sleep(60); }
          send(args.onChunk, i++, { kind: "retrying", reason: "" });
          for (const t of ["Fresh ", "**answer**"]) { send(args.onChunk, i++, { kind: "text", text: t }); await sleep(60); }
          send(args.onChunk, i++, { kind: "done", finish_reason: "stop", figures: { job: 1, prompt_tokens: 5, completion_tokens: 2, reasoning_tokens: 0, reused: 0, read: 5, kept_reply_tokens: 0,
            prompt_ms: 1, gen_ms: 20, prompt_tok_s: 5000, gen_tok_s: 99.9, queue_ms: 0, drafts_accepted: 1, drafts_proposed: 2, restored: null,
            restored_tokens: null, fallback: { reason: "alloc_failed", error: "cuda:1 refused 96 MiB", tokens: 40 } } });
        })();
        return null;
      }
      case "chat_cancel": return null;
      case "devices": return { devices: [
        { index: 0, name: "cuda:0", kind: "cuda", host: false, free_bytes: 7000 * MIB, total_bytes: 8192 * MIB, reserve_bytes: 512 * MIB, strata_bytes: 1000 * MIB, by_purpose_bytes: { weights: 900 * MIB }, high_water_bytes: 1100 * MIB, refused_allocations: 0, failed_samples: 0, layers: [[0, 15]] },
        { index: 1, name: "cpu", kind: "cpu", host: true, free_bytes: 9000 * MIB, total_bytes: 16000 * MIB, reserve_bytes: 0, strata_bytes: 0, by_purpose_bytes: {}, high_water_bytes: 0, refused_allocations: 0, failed_samples: 0, layers: [] } ] };
      case "telemetry": {
        const samples = []; for (let t = 0; t <= 20000; t += 500) samples.push({ t_ms: t, device: 0, free_bytes: (7000 + 300 * Math.sin(t / 3000)) * MIB, total_bytes: 8192 * MIB });
        return { now_ms: 20000, samples, events: [{ t_ms: 10000, event: "engine_restarted", reason: "the engine exited with signal 9", restarts: 1 }] };
      }
      case "cache": return { slots: 4, slots_used: 0, budget_bytes: 4096 * MIB, bytes: 0, evictions: 0, live_tokens: 0, parked: [] };
      case "library_picks": return [];
      case "library_local": return { models_dir: "/home/user/.local/share/strata/models", models: [] };
      case "library_downloads": return [];
      default: throw { code: "not_found", field: null, message: "sim: no command " + cmd };
    }
  }
  window.__TAURI_INTERNALS__ = {
    invoke,
    transformCallback(cb, once) { const id = next++; callbacks.set(id, (d) => { if (once) callbacks.delete(id); cb && cb(d); }); return id; },
    unregisterCallback(id) { callbacks.delete(id); },
    runCallback,
    callbacks,
    metadata: { currentWindow: { label: "main" }, currentWebview: { windowLabel: "main", label: "main" } },
  };
  window.__TAURI_EVENT_PLUGIN_INTERNALS__ = { unregisterListener() {} };
  window.__simEmit = (event, payload) => { for (const h of listeners.get(event) || []) runCallback(h, { event, id: h, payload }); };
  window.__simDrop = (paths) => window.__simEmit("tauri://drag-drop", { paths, position: { x: 10, y: 10 } });
})();
`;
