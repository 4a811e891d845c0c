// A plan as one bar per device (what the load would take against what is free, the reserve marked, a draft
// model's share marked apart), and a plan that does not fit as a sentence naming each device and its
// shortfall. A device holding stages of both the model and its draft model has one bar: the plan's
// `devices` add them up. Pure; used by the settings and models views.
import type { Plan, PlanDevice } from "../bindings";
import { bytesText } from "../util/format";

/** What a bar is drawn from: a device of the plan (or, in a plan without them, a row). */
export type BarSource = Pick<PlanDevice, "device" | "index" | "total_bytes" | "free_bytes" | "memory_bytes" | "reserve_bytes" | "headroom_bytes" | "fits"> & {
  draft_bytes?: number;
};

export interface Bar {
  device: BarSource;
  /** What the bar's full width stands for: the larger of what is free and what the plan takes. */
  scaleBytes: number;
  /** What is free (free_bytes, or the device's memory when it could not be sampled). */
  freeBytes: number;
  /** The draft model's part of total_bytes (0: none on this device). */
  draftBytes: number;
  /** Percent of the width each part takes; the draft's part is the end of the used part. */
  usedPct: number;
  draftPct: number;
  reserveStartPct: number;
  reservePct: number;
  fits: boolean;
}

function pct(part: number, whole: number): number {
  return whole > 0 ? Math.max(0, Math.min(100, (part / whole) * 100)) : 0;
}

export function planBar(d: BarSource): Bar {
  const freeBytes = d.free_bytes ?? d.memory_bytes;
  const scaleBytes = Math.max(freeBytes, d.total_bytes, 1);
  const reserve = Math.min(d.reserve_bytes, freeBytes);
  const draftBytes = d.draft_bytes ?? 0;
  return {
    device: d,
    scaleBytes,
    freeBytes,
    draftBytes,
    usedPct: pct(d.total_bytes, scaleBytes),
    draftPct: pct(draftBytes, scaleBytes),
    reserveStartPct: pct(freeBytes - reserve, scaleBytes),
    reservePct: pct(reserve, scaleBytes),
    fits: d.fits,
  };
}

/** The plan's devices (both models added up); a plan made without them (an older server) has its rows. */
export function planDevices(plan: Plan): BarSource[] {
  const devices: PlanDevice[] | undefined = plan.devices;
  return devices && devices.length > 0 ? devices : plan.rows;
}

export function planBars(plan: Plan): Bar[] {
  return planDevices(plan).map(planBar);
}

export interface Shortfall {
  device: string;
  index: number;
  shortBytes: number;
}

/** The devices a plan does not fit on, with how much it is short (its negative headroom). */
export function shortfalls(plan: Plan): Shortfall[] {
  return planDevices(plan)
    .filter((d) => !d.fits)
    .map((d) => ({ device: d.device, index: d.index, shortBytes: Math.max(0, -(d.headroom_bytes ?? 0)) }));
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
