// The models view: a dropped or picked file shows its facts and the per-device plan before anything
// loads; Load streams progress; a file that is not GGUF shows the backend's message as is; a plan that
// does not fit names the device and the shortfall; in a browser the served model is shown and why
// loading is for the desktop app. A plan with a draft model shows the draft's stages after the model's.
import { cleanup, fireEvent, render, screen, waitFor } from "@testing-library/preact";
import { describe, expect, it } from "vitest";
import { App } from "../src/app";
import { ModelsView } from "../src/views/models/ModelsView";
import { PlanTable } from "../src/views/PlanTable";
import { deviceOf, facts, FakeTransport, MIB, plan, row, settings } from "./fakes";

describe("ModelsView", () => {
  it("inspects and plans a file dropped on the window, before loading, then loads it with progress", async () => {
    const t = new FakeTransport();
    t.inspectModel.mockImplementation(async (path) => facts({ path, name: "Dropped", layers: 30 }));
    t.plan.mockResolvedValue({
      plan: plan([row(), row({ device: "sim:400", index: 1, layers: [15, 30], free_bytes: 400 * MIB })]),
      flags: [],
    });
    let finishLoad: () => void = () => {};
    t.loadModel.mockImplementation(
      (path, on) =>
        new Promise((resolve) => {
          on({ path, stage: "loading", fraction: 0.4, message: "weights" });
          finishLoad = () => resolve(facts({ path, name: "Dropped" }));
        }),
    );
    render(<App transport={t} />);
    t.dropFiles(["/models/dropped.gguf"]);
    // The drop switched to the models tab.
    await waitFor(() => expect(screen.getByRole("tab", { name: "Models" }).getAttribute("aria-selected")).toBe("true"));
    const facts_ = await screen.findAllByTestId("model-facts");
    expect(facts_.at(-1)!.textContent).toContain("Dropped");
    expect(t.inspectModel).toHaveBeenCalledWith("/models/dropped.gguf");
    await waitFor(() => expect(screen.getAllByTestId("plan-row")).toHaveLength(2));
    expect(t.plan).toHaveBeenCalledWith({ ...settings(), model_path: "/models/dropped.gguf" });
    expect(t.loadModel).not.toHaveBeenCalled();
    fireEvent.click(screen.getByRole("button", { name: "Load" }));
    const bar = (await screen.findByRole("progressbar")) as HTMLProgressElement;
    await waitFor(() => expect(bar.value).toBeCloseTo(0.4));
    expect(screen.getByTestId("load-progress").textContent).toContain("loading: weights");
    finishLoad();
    await screen.findByText("Loaded.");
  });

  it("inspects a path typed in, as a dropped file, and loads it", async () => {
    const t = new FakeTransport();
    t.loadModel.mockImplementation(async (path) => facts({ path, name: "Typed" }));
    render(<ModelsView transport={t} dropped={null} browserDrop={false} />);
    const open = screen.getByRole("button", { name: "Open path" }) as HTMLButtonElement;
    expect(open.disabled).toBe(true);
    fireEvent.input(screen.getByLabelText("Or type its path"), { target: { value: "  /models/typed.gguf " } });
    fireEvent.click(open);
    await waitFor(() => expect(t.inspectModel).toHaveBeenCalledWith("/models/typed.gguf"));
    await waitFor(() => expect(screen.getAllByTestId("plan-row")).toHaveLength(1));
    expect(t.plan).toHaveBeenCalledWith({ ...settings(), model_path: "/models/typed.gguf" });
    expect(t.loadModel).not.toHaveBeenCalled();
    fireEvent.click(screen.getByRole("button", { name: "Load" }));
    await screen.findByText("Loaded.");
    expect(t.loadModel).toHaveBeenCalledWith("/models/typed.gguf", expect.any(Function));
  });

  it("inspects a file picked with the dialog", async () => {
    const t = new FakeTransport();
    t.pickModelFile.mockResolvedValue("/models/picked.gguf");
    render(<ModelsView transport={t} dropped={null} browserDrop={false} />);
    fireEvent.click(screen.getByRole("button", { name: /Choose a \.gguf file/ }));
    await waitFor(() => expect(t.inspectModel).toHaveBeenCalledWith("/models/picked.gguf"));
    await waitFor(() => expect(screen.getAllByTestId("plan-row")).toHaveLength(1));
    expect(screen.getByRole("button", { name: "Load" })).toBeTruthy();
  });

  it("shows the backend's message as is for a file that is not GGUF, and plans nothing", async () => {
    const t = new FakeTransport();
    const message = "/tmp/notes.txt is not a GGUF file: it starts with bytes 48 65 6c 6c, not the magic GGUF";
    t.inspectModel.mockRejectedValue({ code: "model", field: null, message });
    render(<ModelsView transport={t} dropped={{ path: "/tmp/notes.txt", seq: 1 }} browserDrop={false} />);
    expect((await screen.findByTestId("model-error")).textContent).toBe(message);
    expect(t.plan).not.toHaveBeenCalled();
    expect(screen.queryByRole("button", { name: "Load" })).toBeNull();
  });

  it("says which device a model does not fit on and by how much, and does not offer to load it", async () => {
    const t = new FakeTransport();
    t.plan.mockResolvedValue({
      plan: plan(
        [row(), row({ device: "cuda:1", index: 1, fits: false, total_bytes: 5000 * MIB, headroom_bytes: -1536 * MIB })],
        { problem: "layers 15-30 do not fit on cuda:1" },
      ),
      flags: [],
    });
    render(<ModelsView transport={t} dropped={{ path: "/models/big.gguf", seq: 1 }} browserDrop={false} />);
    const msg = await screen.findByTestId("fit-message");
    expect(msg.textContent).toContain("does not fit on cuda:1 (device 1): short by 1.50 GiB");
    expect(msg.textContent).toContain("layers 15-30 do not fit on cuda:1");
    expect((screen.getByRole("button", { name: "Load" }) as HTMLButtonElement).disabled).toBe(true);
  });

  it("in a browser shows the served model and its plan, and that loading is for the desktop app", async () => {
    const t = new FakeTransport({ loadModels: false, applySettings: false, fileDrop: false });
    t.currentModel.mockResolvedValue(facts({ name: "Served" }));
    t.getSettings.mockResolvedValue(settings({ model_path: "/srv/served.gguf" }));
    render(<ModelsView transport={t} dropped={null} browserDrop={false} />);
    expect((await screen.findByTestId("model-facts")).textContent).toContain("Served");
    await waitFor(() => expect(screen.getAllByTestId("plan-row")).toHaveLength(1));
    expect(t.plan).toHaveBeenCalledWith({ ...settings(), model_path: null });
    expect(screen.getByTestId("served-note").textContent).toContain("desktop app");
    expect(screen.queryByRole("button", { name: /Choose/ })).toBeNull();
    expect(screen.queryByTestId("drop-note")).toBeNull();
  });

  it("in a browser catches a file dropped on the window and says dropping is for the desktop app", async () => {
    const t = new FakeTransport({ loadModels: false, applySettings: false, fileDrop: false });
    render(<App transport={t} />);
    const drop = new Event("drop", { bubbles: true, cancelable: true }) as Event & { dataTransfer: unknown };
    drop.dataTransfer = { types: ["Files"], files: [] };
    window.dispatchEvent(drop);
    expect(drop.defaultPrevented).toBe(true);
    expect((await screen.findByTestId("drop-note")).textContent).toBe("Dropping a model file works only in the desktop app.");
    expect(screen.getByRole("tab", { name: "Models" }).getAttribute("aria-selected")).toBe("true");
    expect(t.inspectModel).not.toHaveBeenCalled();
  });

  it("shows a mixture of experts' experts on each device and in host RAM, and nothing of experts for a dense model", () => {
    const r0 = row({ weights_bytes: 300 * MIB, experts_bytes: 260 * MIB });
    const r1 = row({ device: "sim:400", index: 1, layers: [15, 30], weights_bytes: 40 * MIB, host_experts_bytes: 260 * MIB });
    render(<PlanTable plan={plan([r0, r1])} />);
    const experts = screen.getAllByTestId("plan-experts").map((e) => e.textContent);
    expect(experts).toEqual([" (experts 260 MiB; in host RAM 0 B)", " (experts 0 B; in host RAM 260 MiB)"]);
    cleanup();
    render(<PlanTable plan={plan([row()])} />);
    expect(screen.queryByTestId("plan-experts")).toBeNull();
  });

  it("shows a draft model's stages after the model's, with their device's one headroom", () => {
    const r1 = row({ device: "sim:400", index: 1, layers: [15, 30], headroom_bytes: 140 * MIB });
    const d1 = row({ device: "sim:400", index: 1, layers: [0, 30], weights_bytes: 100 * MIB, headroom_bytes: 140 * MIB });
    render(<PlanTable plan={plan([row(), r1], { draft: { layers: 30, rows: [d1] }, devices: [deviceOf(row()), deviceOf(r1, { draft_bytes: 70 * MIB })] })} />);
    expect(screen.getAllByTestId("plan-row")).toHaveLength(2);
    const drafts = screen.getAllByTestId("plan-draft-row");
    expect(drafts).toHaveLength(1);
    expect(drafts[0]!.querySelector("th")!.textContent).toBe("sim:400 · draft");
    expect(drafts[0]!.textContent).toContain("0–30");
    expect(drafts[0]!.textContent).toContain("100 MiB");
    expect(drafts[0]!.textContent).toContain("140 MiB");
  });
});
