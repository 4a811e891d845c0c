// The models view. In the desktop app: a .gguf dropped anywhere on the window (the app hands its path in),
// picked with the dialog, or typed as a path (for the keyboard, and for WebDriver tests, which can drive
// neither the native dialog nor a drop) is inspected and planned per device BEFORE loading; Load then
// streams the load's progress. A file that is not GGUF or is corrupt shows the backend's message as is; one
// that does not fit says on which device and by how much. In the browser: the served model's facts and
// plan, and why loading another is for the desktop app.
import { useEffect, useState } from "preact/hooks";
import type { LoadProgress, ModelFacts, Plan } from "../../bindings";
import type { Transport } from "../../transport/types";
import { messageOf } from "../../util/errors";
import { PlanTable } from "../PlanTable";
import { FactsTable } from "./FactsTable";
import { LibraryPanel } from "./LibraryPanel";

/** A path handed in by a drop on the window; `seq` tells two drops of the same file apart. */
export interface DroppedFile {
  path: string;
  seq: number;
}

interface Candidate {
  path: string;
  facts: ModelFacts | null;
  plan: Plan | null;
  error: string | null;
  planError: string | null;
  progress: LoadProgress | null;
  loadError: string | null;
  loaded: boolean;
  busy: boolean;
}

function candidate(path: string): Candidate {
  return { path, facts: null, plan: null, error: null, planError: null, progress: null, loadError: null, loaded: false, busy: true };
}

export interface ModelsViewProps {
  transport: Transport;
  dropped: DroppedFile | null;
  /** The browser saw a file dropped on the window (dropping works in the desktop app only). */
  browserDrop: boolean;
}

export function ModelsView({ transport, dropped, browserDrop }: ModelsViewProps) {
  const canLoad = transport.caps.loadModels;
  const [current, setCurrent] = useState<ModelFacts | null>(null);
  const [currentPlan, setCurrentPlan] = useState<Plan | null>(null);
  const [currentError, setCurrentError] = useState<string | null>(null);
  const [cand, setCand] = useState<Candidate | null>(null);
  const [typed, setTyped] = useState("");
  /** The file the server serves (the browser: from its settings). */
  const [servedPath, setServedPath] = useState<string | null>(null);

  const refreshCurrent = async () => {
    try {
      setCurrent(await transport.currentModel());
      setCurrentError(null);
    } catch (e) {
      setCurrentError(messageOf(e));
    }
  };

  useEffect(() => {
    void refreshCurrent();
    if (!canLoad) {
      // The served model's plan, with the server's own flags.
      transport
        .getSettings()
        .then((s) => {
          setServedPath(s.model_path);
          return transport.plan({ ...s, model_path: null });
        })
        .then((r) => setCurrentPlan(r.plan))
        .catch((e: unknown) => setCurrentError(messageOf(e)));
    }
  }, [transport]);

  const choose = async (path: string) => {
    setCand(candidate(path));
    const update = (f: (c: Candidate) => Candidate) => setCand((c) => (c && c.path === path ? f(c) : c));
    let facts: ModelFacts;
    try {
      facts = await transport.inspectModel(path);
    } catch (e) {
      update((c) => ({ ...c, error: messageOf(e), busy: false }));
      return;
    }
    update((c) => ({ ...c, facts }));
    try {
      const settings = await transport.getSettings();
      const reply = await transport.plan({ ...settings, model_path: path });
      update((c) => ({ ...c, plan: reply.plan, busy: false }));
    } catch (e) {
      update((c) => ({ ...c, planError: messageOf(e), busy: false }));
    }
  };

  useEffect(() => {
    if (dropped && canLoad) void choose(dropped.path);
  }, [dropped?.seq]);

  const pick = async () => {
    try {
      const path = await transport.pickModelFile();
      if (path) await choose(path);
    } catch (e) {
      setCand({ ...candidate(""), error: messageOf(e), busy: false });
    }
  };

  const load = async () => {
    if (!cand) return;
    const path = cand.path;
    const update = (f: (c: Candidate) => Candidate) => setCand((c) => (c && c.path === path ? f(c) : c));
    update((c) => ({ ...c, busy: true, loadError: null, progress: { path, stage: "planning", fraction: 0, message: null } }));
    try {
      const facts = await transport.loadModel(path, (p) => update((c) => ({ ...c, progress: p })));
      update((c) => ({ ...c, busy: false, loaded: true, facts, progress: { path, stage: "ready", fraction: 1, message: null } }));
      setCurrent(facts);
    } catch (e) {
      update((c) => ({ ...c, busy: false, loadError: messageOf(e) }));
    }
  };

  const unload = async () => {
    try {
      await transport.unloadModel();
      setCurrent(null);
    } catch (e) {
      setCurrentError(messageOf(e));
    }
  };

  return (
    <div class="models">
      <section class="card" aria-labelledby="current-model">
        <h2 id="current-model">{canLoad ? "Loaded model" : "Served model"}</h2>
        {currentError && (
          <p class="error" role="alert">
            {currentError}
          </p>
        )}
        {current ? <FactsTable facts={current} /> : <p class="muted">No model is loaded.</p>}
        {canLoad && current && (
          <button type="button" onClick={() => void unload()}>
            Unload
          </button>
        )}
        {!canLoad && currentPlan && <PlanTable plan={currentPlan} />}
        {!canLoad && (
          <p class="note" data-testid="served-note">
            This page is served by <code>strata serve</code>, which serves this model with the flags it was started
            with. Load one of the models on this machine below to switch the server to it without a restart;
            inspecting and planning any other model file is done in the Strata desktop app.
          </p>
        )}
        {!canLoad && browserDrop && (
          <p class="note" role="status" data-testid="drop-note">
            Dropping a model file works only in the desktop app.
          </p>
        )}
      </section>
      {canLoad && (
        <section class="card" aria-labelledby="open-model">
          <h2 id="open-model">Open a model</h2>
          <p class="muted">Drop a .gguf file anywhere on the window, or choose one.</p>
          <button type="button" class="primary" onClick={() => void pick()}>
            Choose a .gguf file…
          </button>
          <form
            class="model-path-form"
            data-testid="model-path-form"
            style={{ display: "flex", flexWrap: "wrap", alignItems: "center", gap: "0.5rem", marginTop: "0.75rem" }}
            onSubmit={(e) => {
              e.preventDefault();
              const path = typed.trim();
              if (path !== "") void choose(path);
            }}
          >
            <label for="model-path-input">Or type its path</label>
            <input
              id="model-path-input"
              data-testid="model-path-input"
              type="text"
              spellcheck={false}
              autocomplete="off"
              placeholder="/path/to/model.gguf"
              style={{ flex: "1 1 20rem", minWidth: 0 }}
              value={typed}
              onInput={(e) => setTyped((e.target as HTMLInputElement).value)}
            />
            <button type="submit" data-testid="model-path-open" disabled={typed.trim() === ""}>
              Open path
            </button>
          </form>
          {cand && (
            <div class="candidate" data-testid="candidate">
              {cand.path && (
                <p class="path">
                  <code>{cand.path}</code>
                </p>
              )}
              {cand.error && (
                <p class="error" role="alert" data-testid="model-error">
                  {cand.error}
                </p>
              )}
              {cand.busy && !cand.progress && <p class="muted">Reading…</p>}
              {cand.facts && <FactsTable facts={cand.facts} />}
              {cand.planError && (
                <p class="error" role="alert">
                  {cand.planError}
                </p>
              )}
              {cand.plan && <PlanTable plan={cand.plan} />}
              {cand.facts && cand.plan && !cand.loaded && (
                <button
                  type="button"
                  class="primary"
                  onClick={() => void load()}
                  disabled={cand.busy || !cand.plan.fits}
                  title={cand.plan.fits ? undefined : "This model does not fit with the current settings"}
                >
                  Load
                </button>
              )}
              {cand.progress && (
                <div class="progress" data-testid="load-progress">
                  <label for="load-progress-bar">
                    {cand.progress.stage}
                    {cand.progress.message ? `: ${cand.progress.message}` : ""}
                  </label>
                  <progress id="load-progress-bar" max={1} value={cand.progress.fraction} />
                </div>
              )}
              {cand.loaded && <p class="ok" role="status">Loaded.</p>}
              {cand.loadError && (
                <p class="error" role="alert">
                  {cand.loadError}
                </p>
              )}
            </div>
          )}
        </section>
      )}
      {transport.library && (
        <LibraryPanel
          library={transport.library}
          servedPath={servedPath}
          onLoad={
            canLoad
              ? undefined
              : async (path) => {
                  const facts = await transport.loadModel(path, () => {});
                  setCurrent(facts);
                  setServedPath(path);
                  const s = await transport.getSettings();
                  const r = await transport.plan({ ...s, model_path: null });
                  setCurrentPlan(r.plan);
                }
          }
          onOpen={
            canLoad
              ? (path) => {
                  void choose(path);
                  const card = document.getElementById("open-model");
                  if (card && typeof card.scrollIntoView === "function") card.scrollIntoView({ block: "start" });
                }
              : undefined
          }
        />
      )}
    </div>
  );
}
