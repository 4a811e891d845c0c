// The chart's colours, read from the CSS custom properties of the current theme (light or dark, following
// the OS), so the canvas matches the page; and whether the OS prefers dark.

export interface ChartColors {
  axis: string;
  grid: string;
  series: string[];
}

const FALLBACK = ["#2563eb", "#d97706", "#059669", "#db2777", "#7c3aed", "#0891b2"];

export function chartColors(el: Element): ChartColors {
  const css = getComputedStyle(el);
  const v = (name: string, d: string) => css.getPropertyValue(name).trim() || d;
  return {
    axis: v("--chart-axis", "#555"),
    grid: v("--chart-grid", "rgba(128,128,128,0.2)"),
    series: FALLBACK.map((d, i) => v(`--series-${i}`, d)),
  };
}

export function prefersDark(): boolean {
  return typeof matchMedia === "function" && matchMedia("(prefers-color-scheme: dark)").matches;
}

/** Calls `f` when the OS switches between light and dark; returns the way to stop. */
export function onSchemeChange(f: () => void): () => void {
  if (typeof matchMedia !== "function") return () => {};
  const mq = matchMedia("(prefers-color-scheme: dark)");
  mq.addEventListener?.("change", f);
  return () => mq.removeEventListener?.("change", f);
}
