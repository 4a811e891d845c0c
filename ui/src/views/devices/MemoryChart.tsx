// The live chart of free memory (MiB) per device over time (x: seconds of the engine's clock), with a
// dashed reserve line per device and the engine's events as markers over it. uPlot draws the lines on a
// canvas; the markers are DOM elements placed with u.valToPos (MarkerLayer). The chart is rebuilt when the
// devices or the OS theme change, fed new columns in place otherwise, and follows its container's width.
// The markers are placed after each of uPlot's draws (its scale is only current then), and the chart
// renders again only when the plot's box or a marker moved: a draw that changes nothing renders nothing.
import { useEffect, useRef, useState } from "preact/hooks";
import uPlot from "uplot";
import "uplot/dist/uPlot.min.css";
import type { DeviceView } from "../../bindings";
import { placeMarkers, type PlacedMarker } from "../../telemetry/markers";
import type { TelemetryWindow } from "../../telemetry/window";
import { MIB } from "../../util/format";
import { chartColors, onSchemeChange, prefersDark } from "./chartColors";
import { MarkerLayer, type PlotBox } from "./MarkerLayer";

/** The devices charted: the accelerators, or the host when there is nothing else. */
export function chartedDevices(devices: readonly DeviceView[]): DeviceView[] {
  const gpus = devices.filter((d) => !d.host);
  return gpus.length > 0 ? gpus : [...devices];
}

/** The chart's columns: x, each device's free MiB, then each device's reserve (a constant line). */
export function chartData(win: TelemetryWindow, devices: readonly DeviceView[]): uPlot.AlignedData {
  const [xs, ...free] = win.columns(devices.map((d) => d.index));
  const reserves = devices.map((d) => xs.map(() => d.reserve_bytes / MIB));
  return [xs, ...free, ...reserves] as uPlot.AlignedData;
}

/** The x range (seconds): the samples' range widened to take in every event of the window. */
export function xRange(win: TelemetryWindow, dataMin: number | null, dataMax: number | null): uPlot.Range.MinMax {
  let min = dataMin ?? Infinity;
  let max = dataMax ?? -Infinity;
  const evs = win.events;
  const first = evs[0];
  const last = evs[evs.length - 1];
  if (first) min = Math.min(min, first.t_ms / 1000);
  if (last) max = Math.max(max, last.t_ms / 1000);
  if (!Number.isFinite(min) || !Number.isFinite(max)) return [0, 1];
  return min === max ? [min - 1, max + 1] : [min, max];
}

export interface MemoryChartProps {
  win: TelemetryWindow;
  /** The window's version: a new one means new data. */
  version: number;
  devices: readonly DeviceView[];
  heightPx?: number;
}

const NO_BOX: PlotBox = { left: 0, top: 0, width: 0, height: 0 };

export function MemoryChart({ win, version, devices, heightPx = 260 }: MemoryChartProps) {
  const wrap = useRef<HTMLDivElement>(null);
  const host = useRef<HTMLDivElement>(null);
  const plot = useRef<uPlot | null>(null);
  const [layout, setLayout] = useState<{ box: PlotBox; markers: PlacedMarker[] }>({ box: NO_BOX, markers: [] });
  // What the last layout showed, to skip a render that would show the same.
  const shown = useRef("");
  // The window as of the last render, for the draw hook (which the chart kept from its creation).
  const latest = useRef(win);
  latest.current = win;
  const [dark, setDark] = useState(prefersDark());
  const charted = chartedDevices(devices);
  const shape = charted.map((d) => `${d.index}:${d.name}:${d.reserve_bytes}`).join(",") + (dark ? ":dark" : ":light");

  const measure = () => {
    const u = plot.current;
    const w = wrap.current;
    if (!u || !w) return;
    const o = u.over.getBoundingClientRect();
    const r = w.getBoundingClientRect();
    const box = { left: o.left - r.left, top: o.top - r.top, width: u.over.clientWidth || o.width, height: u.over.clientHeight || o.height };
    const markers = placeMarkers(latest.current.events, (s) => u.valToPos(s, "x"), box.width);
    const key = JSON.stringify([box, markers]);
    if (key === shown.current) return;
    shown.current = key;
    setLayout({ box, markers });
  };

  useEffect(() => onSchemeChange(() => setDark(prefersDark())), []);

  useEffect(() => {
    const el = host.current;
    if (!el || charted.length === 0) return;
    const colors = chartColors(el);
    const color = (i: number) => colors.series[i % colors.series.length] ?? "#888";
    const axis = { stroke: colors.axis, grid: { stroke: colors.grid, width: 1 }, ticks: { stroke: colors.grid, width: 1 } };
    const opts: uPlot.Options = {
      width: Math.max(el.clientWidth, 320),
      height: heightPx,
      scales: {
        // Events newer or older than every sample still fall inside the plot.
        x: { time: false, range: (_u, min, max) => xRange(win, min, max) },
      },
      legend: { show: true },
      // The data moves every half second, which would undo a drag-zoom at once: no zoom.
      cursor: { drag: { x: false, y: false } },
      series: [
        { label: "t (s)", value: (_u, v) => (v === null || v === undefined ? "—" : `${v.toFixed(1)} s`) },
        ...charted.map((d, i) => ({
          label: `${d.name} free (MiB)`,
          stroke: color(i),
          width: 2,
          spanGaps: true,
          points: { show: false },
        })),
        ...charted.map((d, i) => ({
          label: `${d.name} reserve`,
          stroke: color(i),
          width: 1,
          dash: [6, 4],
          points: { show: false },
        })),
      ],
      axes: [
        { ...axis, label: "seconds" },
        { ...axis, label: "free MiB", size: 60 },
      ],
      hooks: { draw: [() => measure()], setSize: [() => measure()] },
    };
    const u = new uPlot(opts, chartData(win, charted), el);
    plot.current = u;
    measure();
    return () => {
      u.destroy();
      plot.current = null;
      shown.current = "";
    };
  }, [shape, heightPx]);

  useEffect(() => {
    const u = plot.current;
    if (!u) return;
    u.setData(chartData(win, charted));
    measure();
  }, [version, shape]);

  useEffect(() => {
    const el = host.current;
    if (!el) return;
    const resize = () => {
      const u = plot.current;
      if (u && el.clientWidth > 0) u.setSize({ width: el.clientWidth, height: heightPx });
    };
    if (typeof ResizeObserver === "function") {
      const ro = new ResizeObserver(resize);
      ro.observe(el);
      return () => ro.disconnect();
    }
    window.addEventListener("resize", resize);
    return () => window.removeEventListener("resize", resize);
  }, [heightPx]);

  return (
    <div class="chart" ref={wrap} data-testid="memory-chart">
      <div class="chart-plot" ref={host} />
      {charted.length === 0 && <p class="muted">No devices to chart yet.</p>}
      <MarkerLayer markers={plot.current ? layout.markers : []} box={layout.box} />
    </div>
  );
}
