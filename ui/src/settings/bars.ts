// A plan as one bar per device (what the load would take against what is free, the reserve marked), and
// a plan that does not fit as a sentence naming each device and its shortfall. Pure; used by the settings
// and models views.
import type { Plan, PlanRow } from "../bindings";
import { bytesText } from "../util/format";

export interface Bar {
  row: PlanRow;
  /** What the bar's full width stands for: the larger of what is free and what the plan takes. */
  scaleBytes: number;
  /** What is free (free_bytes, or the device's memory when it could not be sampled). */
  freeBytes: number;
  /** Percent of the width each part takes. */
  usedPct: number;
  reserveStartPct: number;
  reservePct: number;
  fits: boolean;
}

function pct(part: number, whole: number): number {
  return whole > 0 ? Math.max(0, Math.min(100, (part / whole) * 100)) : 0;
}

export function planBar(row: PlanRow): Bar {
  const freeBytes = row.free_bytes ?? row.memory_bytes;
  const scaleBytes = Math.max(freeBytes, row.total_bytes, 1);
  const reserve = Math.min(row.reserve_bytes, freeBytes);
  return {
    row,
    scaleBytes,
    freeBytes,
    usedPct: pct(row.total_bytes, scaleBytes),
    reserveStartPct: pct(freeBytes - reserve, scaleBytes),
    reservePct: pct(reserve, scaleBytes),
    fits: row.fits,
  };
}

export function planBars(plan: Plan): Bar[] {
  return plan.rows.map(planBar);
}

export interface Shortfall {
  device: string;
  index: number;
  shortBytes: number;
}

/** The devices a plan does not fit on, with how much it is short (its negative headroom). */
export function shortfalls(plan: Plan): Shortfall[] {
  return plan.rows
    .filter((r) => !r.fits)
    .map((r) => ({ device: r.device, index: r.index, shortBytes: Math.max(0, -(r.headroom_bytes ?? 0)) }));
}

/** Why a plan does not fit, naming each device and its shortfall; null when it fits. */
export function fitMessage(plan: Plan): string | null {
  if (plan.fits) return null;
  const parts = shortfalls(plan).map(
    (s) => `does not fit on ${s.device} (device ${s.index}): short by ${bytesText(s.shortBytes)}`,
  );
  if (plan.problem) parts.push(plan.problem);
  return parts.length > 0 ? parts.join("; ") : "does not fit";
}
