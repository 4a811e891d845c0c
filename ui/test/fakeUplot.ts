// A stand-in for uPlot in jsdom (which has no canvas): it keeps the data, places x linearly over a
// 600-pixel plot area like uPlot's valToPos, and runs the draw hooks on every setData.
import type uPlot from "uplot";

export const PLOT_WIDTH_PX = 600;

export class FakeUPlot {
  static instances: FakeUPlot[] = [];
  readonly root: HTMLDivElement;
  readonly over: HTMLDivElement;
  data: uPlot.AlignedData;
  readonly opts: uPlot.Options;

  constructor(opts: uPlot.Options, data: uPlot.AlignedData, target: HTMLElement) {
    this.opts = opts;
    this.data = data;
    this.root = document.createElement("div");
    this.root.className = "uplot";
    this.over = document.createElement("div");
    this.over.className = "u-over";
    Object.defineProperty(this.over, "clientWidth", { value: PLOT_WIDTH_PX });
    Object.defineProperty(this.over, "clientHeight", { value: 200 });
    this.root.appendChild(this.over);
    target.appendChild(this.root);
    FakeUPlot.instances.push(this);
    this.draw();
  }

  setData(data: uPlot.AlignedData): void {
    this.data = data;
    this.draw();
  }

  setSize(_s: { width: number; height: number }): void {}

  valToPos(v: number, _scale: string): number {
    const xs = this.data[0] as number[];
    const min = xs[0] ?? 0;
    const max = xs[xs.length - 1] ?? 1;
    return max === min ? 0 : ((v - min) / (max - min)) * PLOT_WIDTH_PX;
  }

  destroy(): void {
    this.root.remove();
  }

  private draw(): void {
    for (const h of this.opts.hooks?.draw ?? []) (h as (u: unknown) => void)(this);
  }
}

export default FakeUPlot;
