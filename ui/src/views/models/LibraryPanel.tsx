// The model library in the Models view: good defaults for this machine, a search of the Hugging Face Hub,
// a repository's GGUF files each planned on the engine's devices from its header before it is downloaded
// ("fits", "fits with N of M layers on the CPU", "does not fit: ..."), downloads with progress, speed and
// time left (several at once, each cancellable), and the GGUFs already here (deletable when in the models
// folder). It talks only to `LibraryApi`; every failure shows the engine's message as is.
import { useEffect, useRef, useState } from "preact/hooks";
import type { DownloadView, FileView, FitView, HubModel, Pick } from "../../bindings";
import type { LibraryApi, LocalModels } from "../../transport/types";
import { messageOf } from "../../util/errors";
import { bytesText } from "../../util/format";
import { PlanTable } from "../PlanTable";
import { LibrarySettingsForm } from "./LibrarySettingsForm";

/** How often the downloads are read while one runs. */
export const POLL_MS = 500;

type FitState = { fit: FitView } | { error: string } | "planning";

function secondsText(s: number): string {
  if (!Number.isFinite(s) || s < 0) return "";
  if (s < 60) return `${Math.ceil(s)} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${Math.round(s % 60)} s`;
  return `${Math.floor(s / 3600)} h ${Math.round((s % 3600) / 60)} min`;
}

function DownloadRow({ d, onCancel }: { d: DownloadView; onCancel: () => void }) {
  const p = d.progress;
  const frac = p.total_bytes > 0 ? p.done_bytes / p.total_bytes : 0;
  return (
    <li class={`download download-${d.state}`} data-testid="download">
      <div class="download-name">
        <code>{d.file}</code> <span class="muted">{d.repo}</span>
      </div>
      <progress max={1} value={frac} aria-label={`${d.file} downloaded`} />
      <span class="download-figures" data-testid="download-figures">
        {d.state === "running" && (
          <>
            {bytesText(p.done_bytes)} of {bytesText(p.total_bytes)}
            {p.rate_bytes_per_s > 0 && ` · ${bytesText(p.rate_bytes_per_s)}/s`}
            {p.eta_s !== null && ` · ${secondsText(p.eta_s)} left`}
          </>
        )}
        {d.state === "done" && "downloaded and checked"}
        {d.state === "cancelled" && "cancelled"}
        {d.state === "failed" && (
          <span class="error" role="alert">
            {d.error}
          </span>
        )}
      </span>
      <button type="button" onClick={onCancel} data-testid="download-cancel">
        {d.state === "running" ? "Cancel" : "Clear"}
      </button>
    </li>
  );
}

function FitCell({ state, open, onToggle }: { state: FitState | undefined; open: boolean; onToggle: () => void }) {
  if (state === undefined) return <span class="muted">—</span>;
  if (state === "planning") return <span class="muted">planning…</span>;
  if ("error" in state) return <span class="error">{state.error}</span>;
  const cls = state.fit.fit === "fits" ? "ok" : state.fit.fit === "fits_partly" ? "warn" : "bad";
  return (
    <button type="button" class={`fit fit-${cls}`} data-testid="fit" aria-expanded={open} onClick={onToggle}>
      {state.fit.summary}
    </button>
  );
}

export interface LibraryPanelProps {
  library: LibraryApi;
  /** Opens a model file here in the Models view (inspect, plan, Load): where the transport can load models. */
  onOpen?: (path: string) => void;
  /** Switches the running server to a model here (the browser: `strata serve` switches in place). */
  onLoad?: (path: string) => Promise<void>;
  /** The path of the model served now, marked in the list. */
  servedPath?: string | null;
}

/** A Load pressed in the list: under way, done, or failed with why. */
type LoadState = { path: string; state: "loading" | "done" } | { path: string; state: "failed"; error: string };

export function LibraryPanel({ library, onOpen, onLoad, servedPath }: LibraryPanelProps) {
  const [loading, setLoading] = useState<LoadState | null>(null);
  const [picks, setPicks] = useState<Pick[]>([]);
  const [query, setQuery] = useState("");
  const [results, setResults] = useState<HubModel[] | null>(null);
  const [repo, setRepo] = useState<string | null>(null);
  const [files, setFiles] = useState<FileView[] | null>(null);
  const [fits, setFits] = useState<Record<string, FitState>>({});
  const [openFit, setOpenFit] = useState<string | null>(null);
  const [context, setContext] = useState(4096);
  const [downloads, setDownloads] = useState<DownloadView[]>([]);
  const [local, setLocal] = useState<LocalModels | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);
  /** The path whose Delete was pressed once: a second press deletes. */
  const [confirming, setConfirming] = useState<string | null>(null);
  const repoRef = useRef<string | null>(null);

  const refreshLocal = () =>
    library
      .local()
      .then(setLocal)
      .catch((e: unknown) => setError(messageOf(e)));

  useEffect(() => {
    library
      .picks()
      .then(setPicks)
      .catch(() => setPicks([]));
    void refreshLocal();
    void library.downloads().then(setDownloads, () => {});
  }, [library]);

  // Downloads are read while one runs; when one ends, what is here is read again.
  const running = downloads.some((d) => d.state === "running");
  useEffect(() => {
    if (!running) return;
    const t = setInterval(() => {
      library.downloads().then(
        (ds) => {
          setDownloads((before) => {
            const ended = ds.some((d) => d.state !== "running" && before.find((b) => b.id === d.id)?.state === "running");
            if (ended) {
              void refreshLocal();
              if (repoRef.current) void listFiles(repoRef.current, false);
            }
            return ds;
          });
        },
        (e: unknown) => setError(messageOf(e)),
      );
    }, POLL_MS);
    return () => clearInterval(t);
  }, [running, library]);

  const search = async () => {
    setBusy(true);
    setError(null);
    try {
      setResults(await library.search(query.trim()));
    } catch (e) {
      setError(messageOf(e));
    } finally {
      setBusy(false);
    }
  };

  const planAll = async (name: string, list: FileView[], ctx: number) => {
    for (const f of list) {
      if (f.split !== null) continue;
      if (repoRef.current !== name) return;
      setFits((s) => ({ ...s, [f.path]: "planning" }));
      let state: FitState;
      try {
        state = { fit: await library.fit(name, f.path, ctx) };
      } catch (e) {
        state = { error: messageOf(e) };
      }
      if (repoRef.current !== name) return;
      setFits((s) => ({ ...s, [f.path]: state }));
    }
  };

  const listFiles = async (name: string, plan = true) => {
    setError(null);
    try {
      const list = await library.files(name);
      if (repoRef.current !== name) return;
      setFiles(list);
      if (plan) void planAll(name, list, context);
    } catch (e) {
      setError(messageOf(e));
      setFiles([]);
    }
  };

  const open = (name: string) => {
    repoRef.current = name;
    setRepo(name);
    setFiles(null);
    setFits({});
    setOpenFit(null);
    void listFiles(name);
  };

  const download = async (file: string) => {
    if (!repo) return;
    setError(null);
    try {
      await library.startDownload(repo, file);
      setDownloads(await library.downloads());
    } catch (e) {
      setError(messageOf(e));
    }
  };

  const cancel = async (id: number) => {
    try {
      await library.cancelDownload(id);
      setDownloads(await library.downloads());
    } catch (e) {
      setError(messageOf(e));
    }
  };

  const remove = async (path: string) => {
    try {
      await library.remove(path);
      await refreshLocal();
      if (repo) void listFiles(repo, false);
    } catch (e) {
      setError(messageOf(e));
    }
  };

  const downloading = (file: string) => downloads.some((d) => d.repo === repo && d.file === file && d.state === "running");
  const openPlan = openFit !== null ? fits[openFit] : undefined;

  return (
    <section class="card library" aria-labelledby="library-title" data-testid="library">
      <h2 id="library-title">Model library</h2>
      {error && (
        <p class="error" role="alert" data-testid="library-error">
          {error}
        </p>
      )}
      {picks.length > 0 && (
        <div class="picks" data-testid="picks">
          <h3>Good picks for this machine</h3>
          <ul class="pick-list">
            {picks.map((p) => (
              <li key={p.role}>
                <button type="button" class="pick" onClick={() => open(p.repo)} data-testid="pick">
                  <strong>{p.role}</strong> {p.about} <span class="muted">· about {bytesText(p.need_bytes)}</span>
                </button>
              </li>
            ))}
          </ul>
        </div>
      )}
      <form
        class="library-search"
        onSubmit={(e) => {
          e.preventDefault();
          void search();
        }}
      >
        <label for="library-query">Search Hugging Face for GGUF models</label>
        <input
          id="library-query"
          data-testid="library-query"
          type="search"
          spellcheck={false}
          autocomplete="off"
          placeholder="qwen, gemma, llama…"
          value={query}
          onInput={(e) => setQuery((e.target as HTMLInputElement).value)}
        />
        <button type="submit" class="primary" disabled={busy} data-testid="library-search">
          Search
        </button>
      </form>
      {results !== null && (
        <ul class="results" data-testid="results">
          {results.length === 0 && <li class="muted">No GGUF repository matches.</li>}
          {results.map((m) => (
            <li key={m.id}>
              <button type="button" class={m.id === repo ? "result active" : "result"} onClick={() => open(m.id)} data-testid="result">
                <code>{m.id}</code>
                <span class="muted">
                  {" "}
                  · {m.downloads.toLocaleString("en")} downloads{m.gated ? " · gated: needs HF_TOKEN" : ""}
                </span>
              </button>
            </li>
          ))}
        </ul>
      )}
      {repo && (
        <div class="repo-files" data-testid="repo-files">
          <h3>
            <code>{repo}</code>
          </h3>
          <label class="fit-context">
            Plan at a context of{" "}
            <input
              type="number"
              min={256}
              step={256}
              value={context}
              data-testid="fit-context"
              onChange={(e) => {
                const v = Math.max(1, Math.round(Number((e.target as HTMLInputElement).value) || 4096));
                setContext(v);
                if (files && repo) {
                  setFits({});
                  void planAll(repo, files, v);
                }
              }}
            />{" "}
            tokens
          </label>
          {files === null && <p class="muted">Reading the repository…</p>}
          {files !== null && files.length === 0 && !error && <p class="muted">This repository has no GGUF file.</p>}
          {files !== null && files.length > 0 && (
            <table class="files">
              <thead>
                <tr>
                  <th scope="col">File</th>
                  <th scope="col">Size</th>
                  <th scope="col">On this machine</th>
                  <th scope="col"></th>
                </tr>
              </thead>
              <tbody>
                {files.map((f) => (
                  <tr key={f.path} data-testid="file-row">
                    <th scope="row">
                      <code>{f.path}</code>
                    </th>
                    <td>{bytesText(f.size_bytes)}</td>
                    <td>
                      {f.split !== null ? (
                        <span class="muted">part {f.split[0]} of {f.split[1]}: split models are not read yet</span>
                      ) : (
                        <FitCell state={fits[f.path]} open={openFit === f.path} onToggle={() => setOpenFit(openFit === f.path ? null : f.path)} />
                      )}
                    </td>
                    <td>
                      {f.local_path !== null ? (
                        <span class="ok" data-testid="file-here">
                          here
                        </span>
                      ) : f.split === null ? (
                        <button type="button" onClick={() => void download(f.path)} disabled={downloading(f.path)} data-testid="file-download">
                          {downloading(f.path) ? "Downloading…" : "Download"}
                        </button>
                      ) : null}
                    </td>
                  </tr>
                ))}
              </tbody>
            </table>
          )}
          {openPlan !== undefined && openPlan !== "planning" && "fit" in openPlan && (
            <div data-testid="fit-plan">
              <p class="muted">
                <code>{openFit}</code> at {openPlan.fit.context} tokens: {openPlan.fit.layers} layers
              </p>
              <PlanTable plan={openPlan.fit.plan} />
            </div>
          )}
        </div>
      )}
      {downloads.length > 0 && (
        <div class="downloads">
          <h3>Downloads</h3>
          <ul class="download-list" data-testid="downloads">
            {downloads.map((d) => (
              <DownloadRow key={d.id} d={d} onCancel={() => void cancel(d.id)} />
            ))}
          </ul>
        </div>
      )}
      {local && (
        <div class="local" data-testid="local">
          <h3>On this machine</h3>
          <p class="muted">
            Downloads go to <code>{local.models_dir}</code>; the Hugging Face cache is listed too.
            {!onOpen && onLoad && (
              <>
                {" "}
                Load switches the server to one of them without a restart; the conversations of the model it leaves
                wait in the cache for its return.
              </>
            )}
          </p>
          {local.models.length === 0 ? (
            <p class="muted">No GGUF file yet.</p>
          ) : (
            <ul class="local-list">
              {local.models.map((m) => (
                <li key={m.path} data-testid="local-model">
                  <code>{m.repo ? `${m.repo}/${m.file}` : m.file}</code>{" "}
                  <span class="muted">
                    · {bytesText(m.size_bytes)} · {m.source === "models_folder" ? "models folder" : "Hugging Face cache"}
                  </span>{" "}
                  {onOpen && (
                    <button type="button" onClick={() => onOpen(m.path)} data-testid="local-open">
                      Open
                    </button>
                  )}{" "}
                  {onLoad && m.path === servedPath && (
                    <span class="ok" data-testid="local-served">
                      {loading?.path === m.path && loading.state === "done"
                        ? "served now: switched without a restart"
                        : "served now"}
                    </span>
                  )}
                  {onLoad && m.path !== servedPath && (
                    <button
                      type="button"
                      disabled={loading?.state === "loading"}
                      data-testid="local-load"
                      onClick={() => {
                        setLoading({ path: m.path, state: "loading" });
                        onLoad(m.path).then(
                          () => setLoading({ path: m.path, state: "done" }),
                          (e: unknown) => setLoading({ path: m.path, state: "failed", error: messageOf(e) }),
                        );
                      }}
                    >
                      Load
                    </button>
                  )}{" "}
                  {loading?.path === m.path && !(loading.state === "done" && m.path === servedPath) && (
                    <span
                      class={loading.state === "failed" ? "error" : loading.state === "done" ? "ok" : "muted"}
                      role="status"
                      data-testid="local-load-state"
                    >
                      {loading.state === "failed"
                        ? loading.error
                        : loading.state === "done"
                          ? "loaded: the server switched to it"
                          : "loading beside the served model…"}
                    </span>
                  )}{" "}
                  {m.source === "models_folder" && (
                    <button
                      type="button"
                      class={confirming === m.path ? "danger" : ""}
                      onClick={() => {
                        if (confirming === m.path) {
                          setConfirming(null);
                          void remove(m.path);
                        } else setConfirming(m.path);
                      }}
                      onBlur={() => setConfirming((c) => (c === m.path ? null : c))}
                      data-testid="local-delete"
                    >
                      {confirming === m.path ? "Delete the file?" : "Delete"}
                    </button>
                  )}
                </li>
              ))}
            </ul>
          )}
        </div>
      )}
      {library.settings && <LibrarySettingsForm library={library} onSaved={() => void refreshLocal()} />}
    </section>
  );
}
