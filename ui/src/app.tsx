// The app: a header with the engine's status badge, tabs for the four views (Chat, Models, Settings,
// Devices), all kept mounted so a reply streams on and telemetry keeps its window while another tab is
// shown. It also owns what concerns the whole window: files dropped on it (to the models view; in a
// browser, a note that dropping is for the desktop app) and the API key form.
import { useEffect, useState } from "preact/hooks";
import type { EngineStatus } from "./bindings";
import { TelemetryStore } from "./telemetry/store";
import type { Transport } from "./transport/types";
import { ApiKeyPrompt } from "./views/ApiKeyPrompt";
import { ChatView } from "./views/chat/ChatView";
import { DevicePanel } from "./views/devices/DevicePanel";
import type { KeyRequests } from "./views/keyRequests";
import { ModelsView, type DroppedFile } from "./views/models/ModelsView";
import { SettingsView } from "./views/settings/SettingsView";
import { StatusBadge } from "./views/StatusBadge";

export const TABS = ["chat", "models", "settings", "devices"] as const;
export type Tab = (typeof TABS)[number];
const TAB_LABEL: Record<Tab, string> = { chat: "Chat", models: "Models", settings: "Settings", devices: "Devices" };

export interface AppProps {
  transport: Transport;
  keys?: KeyRequests;
  store?: TelemetryStore;
  initialTab?: Tab;
}

export function App({ transport, keys, store: given, initialTab = "chat" }: AppProps) {
  const [tab, setTab] = useState<Tab>(initialTab);
  const [status, setStatus] = useState<EngineStatus | null>(null);
  const [dropped, setDropped] = useState<DroppedFile | null>(null);
  const [browserDrop, setBrowserDrop] = useState(false);
  const [keyWhy, setKeyWhy] = useState<string | null>(keys?.pending?.why ?? null);
  const [store] = useState(() => given ?? new TelemetryStore());

  useEffect(() => store.start(transport), [store, transport]);

  useEffect(() => {
    let stopped = false;
    transport
      .engineStatus()
      .then((s) => !stopped && setStatus(s))
      .catch((e: unknown) => {
        if (!stopped)
          setStatus({ state: "failed", message: e instanceof Error ? e.message : String(e), restarts: 0, pid: null, model: null });
      });
    const stop = transport.onEngineStatus((s) => setStatus(s));
    return () => {
      stopped = true;
      stop();
    };
  }, [transport]);

  useEffect(() => {
    if (!keys) return;
    return keys.subscribe(() => setKeyWhy(keys.pending?.why ?? null));
  }, [keys]);

  // Files dropped on the window: paths in the desktop app; in a browser the drop must not open the file.
  useEffect(() => {
    if (transport.caps.fileDrop) {
      let seq = 0;
      return transport.onFileDrop((paths) => {
        const path = paths[0];
        if (!path) return;
        setDropped({ path, seq: ++seq });
        setTab("models");
      });
    }
    const over = (e: DragEvent) => {
      if (e.dataTransfer?.types.includes("Files")) e.preventDefault();
    };
    const drop = (e: DragEvent) => {
      if (!e.dataTransfer?.types.includes("Files")) return;
      e.preventDefault();
      setBrowserDrop(true);
      setTab("models");
    };
    window.addEventListener("dragover", over);
    window.addEventListener("drop", drop);
    return () => {
      window.removeEventListener("dragover", over);
      window.removeEventListener("drop", drop);
    };
  }, [transport]);

  return (
    <div class="app">
      <header class="app-header">
        <h1 class="app-title">Strata</h1>
        <nav
          class="tabs"
          role="tablist"
          aria-label="Views"
          onKeyDown={(e) => {
            // Arrow keys move between tabs, as in the ARIA tabs pattern (Tab reaches each one too).
            const step = e.key === "ArrowRight" ? 1 : e.key === "ArrowLeft" ? -1 : 0;
            if (step === 0) return;
            e.preventDefault();
            const next = TABS[(TABS.indexOf(tab) + step + TABS.length) % TABS.length] ?? "chat";
            setTab(next);
            document.getElementById(`tab-${next}`)?.focus();
          }}
        >
          {TABS.map((t) => (
            <button
              type="button"
              key={t}
              role="tab"
              id={`tab-${t}`}
              aria-selected={tab === t}
              aria-controls={`panel-${t}`}
              class={tab === t ? "tab active" : "tab"}
              onClick={() => setTab(t)}
            >
              {TAB_LABEL[t]}
            </button>
          ))}
        </nav>
        <StatusBadge status={status} />
      </header>
      <main class="app-main">
        {TABS.map((t) => (
          <section key={t} id={`panel-${t}`} role="tabpanel" aria-labelledby={`tab-${t}`} hidden={tab !== t} class={`panel panel-${t}`}>
            {t === "chat" && <ChatView transport={transport} model={status?.model ?? null} />}
            {t === "models" && <ModelsView transport={transport} dropped={dropped} browserDrop={browserDrop} />}
            {t === "settings" && <SettingsView transport={transport} />}
            {t === "devices" && <DevicePanel transport={transport} store={store} />}
          </section>
        ))}
      </main>
      {keys && keyWhy !== null && <ApiKeyPrompt why={keyWhy} onAnswer={(k) => keys.answer(k)} />}
    </div>
  );
}
