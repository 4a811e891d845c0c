// Number formatting shared by the views: bytes as MiB/GiB, counts, seconds. Pure.

export const MIB = 1024 * 1024;
export const GIB = 1024 * MIB;

/** Bytes as whole MiB (rounded), as a string with no unit. */
export function mib(bytes: number): string {
  return String(Math.round(bytes / MIB));
}

/** Bytes with the unit that reads best: KiB, MiB or GiB. */
export function bytesText(bytes: number | null | undefined): string {
  if (bytes === null || bytes === undefined || !Number.isFinite(bytes)) return "—";
  const abs = Math.abs(bytes);
  if (abs >= GIB) return `${(bytes / GIB).toFixed(2)} GiB`;
  if (abs >= MIB) return `${(bytes / MIB).toFixed(abs >= 100 * MIB ? 0 : 1)} MiB`;
  if (abs >= 1024) return `${(bytes / 1024).toFixed(1)} KiB`;
  return `${bytes} B`;
}

/** A count with thousands separators: 135000000 -> "135,000,000"; large ones also as M/B. */
export function countText(n: number): string {
  if (n >= 1e9) return `${(n / 1e9).toFixed(2)} B`;
  if (n >= 1e6) return `${(n / 1e6).toFixed(1)} M`;
  return n.toLocaleString("en-US");
}

/** Milliseconds of the engine clock as seconds with one decimal. */
export function secondsText(ms: number): string {
  return `${(ms / 1000).toFixed(1)} s`;
}
