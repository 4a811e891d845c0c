// The model library over `strata serve`'s /strata/library/* (src/server/library.rs): reads are GETs, what
// downloads, cancels or deletes is a JSON POST. Errors come back as the server's TransportError.
import type { DownloadView, FileView, FitView, HubModel, Pick } from "../../bindings";
import type { LibraryApi, LocalModels } from "../types";
import type { ApiClient } from "./client";

const q = encodeURIComponent;

export class HttpLibrary implements LibraryApi {
  constructor(private readonly client: ApiClient) {}

  async search(text: string): Promise<HubModel[]> {
    return (await this.client.getJson<{ models: HubModel[] }>(`/strata/library/search?q=${q(text)}`)).models;
  }

  async files(repo: string): Promise<FileView[]> {
    return (await this.client.getJson<{ files: FileView[] }>(`/strata/library/files?repo=${q(repo)}`)).files;
  }

  fit(repo: string, file: string, context: number | null): Promise<FitView> {
    const ctx = context === null ? "" : `&context=${q(String(context))}`;
    return this.client.getJson<FitView>(`/strata/library/fit?repo=${q(repo)}&file=${q(file)}${ctx}`);
  }

  async picks(): Promise<Pick[]> {
    return (await this.client.getJson<{ picks: Pick[] }>("/strata/library/picks")).picks;
  }

  local(): Promise<LocalModels> {
    return this.client.getJson<LocalModels>("/strata/library/local");
  }

  async remove(path: string): Promise<void> {
    await this.client.request("/strata/library/delete", { method: "POST", json: { path } });
  }

  async downloads(): Promise<DownloadView[]> {
    return (await this.client.getJson<{ downloads: DownloadView[] }>("/strata/library/downloads")).downloads;
  }

  async startDownload(repo: string, file: string): Promise<number> {
    return (await this.client.postJson<{ id: number }>("/strata/library/downloads", { repo, file })).id;
  }

  async cancelDownload(id: number): Promise<void> {
    await this.client.request(`/strata/library/downloads/${q(String(id))}/cancel`, { method: "POST", json: {} });
  }
}
