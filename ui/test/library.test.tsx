// The model library panel: picks and a search open a repository whose files are each planned before any
// download (fits / partly / does not fit, the plan per device on a click); a download shows its progress,
// speed and time left while it runs, and the file appears as here when it ends; a failure shows the
// engine's message; a delete needs a second press; split parts offer no download.
import { cleanup, fireEvent, render, screen, waitFor, within } from "@testing-library/preact";
import { afterEach, describe, expect, it, vi } from "vitest";
import type { DownloadView, FileView, FitView, LocalModel } from "../src/bindings";
import {
  TransportError,
  type LibraryApi,
  type LibrarySettings,
  type LibrarySettingsView,
  type LocalModels,
} from "../src/transport/types";
import { LibraryPanel } from "../src/views/models/LibraryPanel";
import { ModelsView } from "../src/views/models/ModelsView";
import { FakeTransport, plan, row } from "./fakes";

const MIB = 1024 * 1024;

function file(path: string, size: number, over: Partial<FileView> = {}): FileView {
  return { path, size_bytes: size, sha256: null, split: null, local_path: null, ...over };
}

function fitOf(fit: FitView["fit"], summary: string): FitView {
  return { fit, summary, context: 4096, layers: 30, cpu_layers: fit === "fits_partly" ? 12 : 0, plan: plan([row()]) };
}

class FakeLibrary implements LibraryApi {
  here: LocalModel[] = [];
  list: DownloadView[] = [];
  search = vi.fn(async (_t: string) => [
    { id: "bartowski/Qwen-GGUF", downloads: 12000, likes: 4, gated: false, lastModified: null, tags: [] },
    { id: "meta/Llama-GGUF", downloads: 900, likes: 1, gated: true, lastModified: null, tags: [] },
  ]);
  files = vi.fn(async (_r: string) => [
    file("Qwen-Q4_K_M.gguf", 400 * MIB, { local_path: this.here.length ? "/m/Qwen-Q4_K_M.gguf" : null }),
    file("Qwen-Q8_0.gguf", 700 * MIB),
    file("Qwen-F16-00001-of-00002.gguf", 900 * MIB, { split: [1, 2] }),
  ]);
  fit = vi.fn(async (_r: string, f: string, _c: number | null) =>
    f.includes("Q4") ? fitOf("fits", "fits") : fitOf("does_not_fit", "does not fit: sim:200 is short by 300 MiB"),
  );
  picks = vi.fn(async () => [
    { role: "chat", repo: "unsloth/Qwen3-8B-GGUF", quant: "Q4_K_M", about: "Qwen3 8B", need_bytes: 6000 * MIB },
  ]);
  local = vi.fn(async (): Promise<LocalModels> => ({ models_dir: "/m", models: this.here }));
  remove = vi.fn(async (_p: string) => {
    this.here = [];
  });
  downloads = vi.fn(async () => this.list);
  startDownload = vi.fn(async (repo: string, f: string) => {
    this.list = [
      {
        id: 1,
        repo,
        file: f,
        state: "running",
        progress: { done_bytes: 100 * MIB, total_bytes: 400 * MIB, rate_bytes_per_s: 50 * MIB, eta_s: 6 },
        path: null,
        error: null,
      },
    ];
    return 1;
  });
  cancelDownload = vi.fn(async (_id: number) => {});
  settings?: () => Promise<LibrarySettingsView>;
  saveSettings?: (s: LibrarySettings) => Promise<LibrarySettingsView>;
}

afterEach(cleanup);

describe("LibraryPanel", () => {
  it("plans every file of a repository before download, downloads with progress, and lists the file as here", async () => {
    const lib = new FakeLibrary();
    render(<LibraryPanel library={lib} />);
    expect((await screen.findByTestId("pick")).textContent).toContain("Qwen3 8B");
    fireEvent.input(screen.getByTestId("library-query"), { target: { value: "qwen" } });
    fireEvent.click(screen.getByTestId("library-search"));
    const results = await screen.findAllByTestId("result");
    expect(lib.search).toHaveBeenCalledWith("qwen");
    expect(results[1]!.textContent).toContain("gated: needs HF_TOKEN");
    fireEvent.click(results[0]!);
    await waitFor(() => expect(screen.getAllByTestId("fit")).toHaveLength(2));
    const fits = screen.getAllByTestId("fit").map((f) => f.textContent);
    expect(fits).toEqual(["fits", "does not fit: sim:200 is short by 300 MiB"]);
    expect(lib.fit).toHaveBeenCalledWith("bartowski/Qwen-GGUF", "Qwen-Q4_K_M.gguf", 4096);
    // The split part is not planned and offers no download.
    const rows = screen.getAllByTestId("file-row");
    expect(rows[2]!.textContent).toContain("split models are not read yet");
    expect(within(rows[2]!).queryByTestId("file-download")).toBeNull();
    expect(lib.fit).toHaveBeenCalledTimes(2);
    // The plan per device on a click.
    fireEvent.click(screen.getAllByTestId("fit")[1]!);
    expect(within(screen.getByTestId("fit-plan")).getAllByTestId("plan-row")).toHaveLength(1);
    // A download: progress, speed and time left while it runs.
    vi.useFakeTimers({ shouldAdvanceTime: true });
    try {
      fireEvent.click(within(rows[0]!).getByTestId("file-download"));
      const figures = await screen.findByTestId("download-figures");
      expect(figures.textContent).toBe("100 MiB of 400 MiB · 50.0 MiB/s · 6 s left");
      expect((screen.getByRole("progressbar", { name: "Qwen-Q4_K_M.gguf downloaded" }) as HTMLProgressElement).value).toBeCloseTo(0.25);
      // It ends: the file is here.
      lib.here = [{ path: "/m/Qwen-Q4_K_M.gguf", repo: "bartowski/Qwen-GGUF", file: "Qwen-Q4_K_M.gguf", size_bytes: 400 * MIB, source: "models_folder" }];
      lib.list = [{ ...lib.list[0]!, state: "done", progress: { done_bytes: 400 * MIB, total_bytes: 400 * MIB, rate_bytes_per_s: 0, eta_s: 0 }, path: "/m/Qwen-Q4_K_M.gguf" }];
      await vi.advanceTimersByTimeAsync(600);
      await waitFor(() => expect(screen.getByTestId("download-figures").textContent).toBe("downloaded and checked"));
      await waitFor(() => expect(screen.getByTestId("file-here")).toBeTruthy());
      expect(screen.getByTestId("local-model").textContent).toContain("bartowski/Qwen-GGUF/Qwen-Q4_K_M.gguf");
    } finally {
      vi.useRealTimers();
    }
    // Delete needs a second press.
    fireEvent.click(screen.getByTestId("local-delete"));
    expect(lib.remove).not.toHaveBeenCalled();
    expect(screen.getByTestId("local-delete").textContent).toBe("Delete the file?");
    fireEvent.click(screen.getByTestId("local-delete"));
    await waitFor(() => expect(lib.remove).toHaveBeenCalledWith("/m/Qwen-Q4_K_M.gguf"));
    await waitFor(() => expect(screen.getByTestId("local").textContent).toContain("No GGUF file yet."));
  });

  it("shows the engine's message when the Hub refuses, and a failed download's reason", async () => {
    const lib = new FakeLibrary();
    lib.files.mockRejectedValue(new TransportError("engine", "meta/Llama-GGUF is gated: it needs a Hugging Face token (set HF_TOKEN ...)"));
    lib.list = [
      {
        id: 3,
        repo: "a/b",
        file: "x.gguf",
        state: "failed",
        progress: { done_bytes: 0, total_bytes: 10, rate_bytes_per_s: 0, eta_s: null },
        path: null,
        error: "not enough disk space in /m: x.gguf needs 10 B more, 0 B is free",
      },
    ];
    render(<LibraryPanel library={lib} />);
    expect((await screen.findByTestId("download-figures")).textContent).toContain("not enough disk space");
    fireEvent.click(screen.getByTestId("library-search"));
    fireEvent.click((await screen.findAllByTestId("result"))[1]!);
    expect((await screen.findByTestId("library-error")).textContent).toContain("set HF_TOKEN");
    // Clearing a finished download forgets it.
    fireEvent.click(screen.getByTestId("download-cancel"));
    await waitFor(() => expect(lib.cancelDownload).toHaveBeenCalledWith(3));
  });

  it("in the desktop app a model here opens in the Models view (inspected and planned before Load)", async () => {
    const t = new FakeTransport();
    const lib = new FakeLibrary();
    lib.here = [{ path: "/m/a/b/x.gguf", repo: "a/b", file: "x.gguf", size_bytes: 10 * MIB, source: "hugging_face_cache" }];
    t.library = lib;
    render(<ModelsView transport={t} dropped={null} browserDrop={false} />);
    fireEvent.click(await screen.findByTestId("local-open"));
    await waitFor(() => expect(t.inspectModel).toHaveBeenCalledWith("/m/a/b/x.gguf"));
    await waitFor(() => expect(t.plan).toHaveBeenCalled());
    // A file of the Hugging Face cache is not the app's to delete; the browser's note is not shown.
    expect(screen.queryByTestId("local-delete")).toBeNull();
    expect(screen.getByTestId("local").textContent).not.toContain("strata serve -m");
  });

  it("in the browser a model here is loaded in place: Load switches the server, and a refusal shows why", async () => {
    const lib = new FakeLibrary();
    lib.here = [
      { path: "/m/a/b/x.gguf", repo: "a/b", file: "x.gguf", size_bytes: 10 * MIB, source: "models_folder" },
      { path: "/m/a/b/served.gguf", repo: "a/b", file: "served.gguf", size_bytes: 10 * MIB, source: "models_folder" },
    ];
    let fail = false;
    const onLoad = vi.fn(async (_p: string) => {
      if (fail) throw new TransportError("model", "does not fit beside the model served now");
    });
    render(<LibraryPanel library={lib} onLoad={onLoad} servedPath="/m/a/b/served.gguf" />);
    // The served model is marked, the other one has Load; no Open (the browser inspects no file).
    await screen.findByTestId("local-served");
    expect(screen.getAllByTestId("local-load")).toHaveLength(1);
    expect(screen.queryByTestId("local-open")).toBeNull();
    expect(screen.getByTestId("local").textContent).toContain("without a restart");
    fireEvent.click(screen.getByTestId("local-load"));
    await waitFor(() => expect(screen.getByTestId("local-load-state").textContent).toBe("loaded: the server switched to it"));
    expect(onLoad).toHaveBeenCalledWith("/m/a/b/x.gguf");
    fail = true;
    fireEvent.click(screen.getByTestId("local-load"));
    await waitFor(() =>
      expect(screen.getByTestId("local-load-state").textContent).toContain("does not fit beside the model served now"),
    );
  });

  it("in the desktop app the models folder and a Hugging Face token are settings; the token never comes back", async () => {
    const lib = new FakeLibrary();
    const view = (models_dir: string, hf_token: LibrarySettingsView["settings"]["hf_token"]): LibrarySettingsView => ({
      settings: { models_dir, hf_token },
      models_dir: models_dir || "/home/u/.local/share/strata/models",
      default_models_dir: "/home/u/.local/share/strata/models",
      token_from: hf_token.kind === "kept" ? "settings" : "none",
    });
    const saved: LibrarySettings[] = [];
    lib.settings = vi.fn(async () => view("", { kind: "kept", hint: "wxyz" }));
    lib.saveSettings = vi.fn(async (s: LibrarySettings) => {
      saved.push(s);
      if (!s.models_dir.startsWith("/") && s.models_dir !== "") {
        throw new TransportError("invalid", `${s.models_dir}: name the folder by its whole path`, "models_dir");
      }
      return view(s.models_dir, s.hf_token.kind === "new" ? { kind: "kept", hint: s.hf_token.key.slice(-4) } : s.hf_token);
    });
    render(<LibraryPanel library={lib} />);
    const form = await screen.findByTestId("library-settings");
    expect(within(form).getByTestId("library-token-status").textContent).toBe("A token is kept (ending in …wxyz).");
    expect((within(form).getByTestId("library-models-dir") as HTMLInputElement).placeholder).toBe("/home/u/.local/share/strata/models");
    // A relative folder is refused at its field.
    fireEvent.input(within(form).getByTestId("library-models-dir"), { target: { value: "models" } });
    fireEvent.click(within(form).getByTestId("library-settings-save"));
    await waitFor(() => expect(within(form).getByTestId("error-models_dir").textContent).toContain("whole path"));
    // A folder and a new token are saved; the kept token is sent back as kept, never as its text.
    fireEvent.input(within(form).getByTestId("library-models-dir"), { target: { value: "/data/models" } });
    fireEvent.input(within(form).getByTestId("library-hf-token"), { target: { value: "hf_abcdefgh1234" } });
    fireEvent.click(within(form).getByTestId("library-settings-save"));
    await waitFor(() => expect(within(form).getByRole("status").textContent).toContain("Downloads go to /data/models"));
    expect(saved.at(-1)).toEqual({ models_dir: "/data/models", hf_token: { kind: "new", key: "hf_abcdefgh1234" } });
    expect((within(form).getByTestId("library-hf-token") as HTMLInputElement).value).toBe("");
    expect(within(form).getByTestId("library-token-status").textContent).toBe("A token is kept (ending in …1234).");
    // Forget the token: sent as none.
    fireEvent.click(within(form).getByRole("button", { name: "Forget the token" }));
    fireEvent.click(within(form).getByTestId("library-settings-save"));
    await waitFor(() => expect(saved.at(-1)?.hf_token).toEqual({ kind: "none" }));
    await waitFor(() => expect(within(form).getByTestId("library-token-status").textContent).toContain("No token"));
    expect(lib.local).toHaveBeenCalledTimes(3);
  });
});
