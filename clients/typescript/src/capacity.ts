/**
 * What a caller may ask before it submits: the daemon's capacity (its running slots, the
 * caller's queue, its budget left, the provider limiter) and a batch's dry run.
 */

import type * as pb from "./gen/forkd/v1/forkd.js";

/** The daemon's running slots (its `max_running_agents`), whoever's runs take them. */
export interface RunSlots {
  used: number;
  /** With no cap, 0 (and `total` 0). */
  free: number;
  /** 0: no cap. */
  total: number;
}

/** What the caller's tenant may still spend under its budget; each one left out where it sets no such limit. */
export interface BudgetLeft {
  usd?: number;
  tokens?: number;
}

/** A limit a provider key's requests are paced by. */
export interface PacedLimit {
  /** `requests`, `tokens`, `input_tokens` or `output_tokens`. */
  name: string;
  perSecond: number;
  burst: number;
  /** `headers` (the provider stated it), `refusals` (learned from them) or `start` (slow start). */
  source: string;
}

/** The daemon's limiter for one provider key and model. */
export interface ProviderCapacity {
  provider: string;
  /** The provider's base URL (empty for a token tenant, and for the embedded sim). */
  endpoint: string;
  model: string;
  limits: PacedLimit[];
  /** The concurrency window (halved on overload). */
  concurrency: number;
  inFlight: number;
  waiting: number;
  /** Requests waiting to go again after a refusal. */
  throttled: number;
  refusalsLastMinute: number;
  /** How long a retry-after still holds every request of the key. */
  pausedForMs: number;
}

/** `client.capacity()`: what the daemon can take now. */
export interface Capacity {
  slots: RunSlots;
  /** The caller's own runs waiting for a slot. */
  queued: number;
  /** `undefined` without a tenant budget. */
  budgetLeft: BudgetLeft | undefined;
  providers: ProviderCapacity[];
}

/** `session.dryRun(...)`: what a batch would be, had it been submitted. */
export interface DryRun {
  children: number;
  /** The tokens every child's first request shares (the history to the fork point, the fork boilerplate). */
  prefixTokens: number;
  /** A directive's block, on average. */
  directiveTokens: number;
  /** The first requests' input cost: child 1 writes the shared prefix, the others read it. */
  forkCostUsd: number;
  /** The same children as independent agents. */
  independentCostUsd: number;
  saving: number;
  /** The daemon's running slots now, and the caller's runs already waiting for one. */
  slots: RunSlots;
  queued: number;
  /** When its first child would start, in milliseconds from now; undefined when the daemon cannot tell yet. */
  startInMs?: number;
  /** When its last child would end (from the queue, the latest runs' wall time, the limiter). */
  finishInMs?: number;
  /** What the estimate was made of, in words. */
  estimateBasis: string;
}

function slotsOf(s: pb.RunSlots | undefined): RunSlots {
  return { used: s?.used ?? 0, free: s?.free ?? 0, total: s?.total ?? 0 };
}

export function capacityOf(r: pb.GetCapacityResponse): Capacity {
  let budgetLeft: BudgetLeft | undefined;
  if (r.budgetLeft) {
    budgetLeft = {};
    if (r.budgetLeft.usd !== undefined) budgetLeft.usd = r.budgetLeft.usd;
    if (r.budgetLeft.tokens !== undefined) budgetLeft.tokens = r.budgetLeft.tokens;
  }
  return {
    slots: slotsOf(r.slots),
    queued: r.queued,
    budgetLeft,
    providers: r.providers.map((p) => ({
      provider: p.provider,
      endpoint: p.endpoint,
      model: p.model,
      limits: p.limits.map((l) => ({ name: l.name, perSecond: l.perSecond, burst: l.burst, source: l.source })),
      concurrency: p.concurrency,
      inFlight: p.inFlight,
      waiting: p.waiting,
      throttled: p.throttled,
      refusalsLastMinute: p.refusalsLastMinute,
      pausedForMs: p.pausedForMs,
    })),
  };
}

export function dryRunOf(d: pb.DryRun | undefined): DryRun {
  return {
    children: d?.children ?? 0,
    prefixTokens: d?.prefixTokens ?? 0,
    directiveTokens: d?.directiveTokens ?? 0,
    forkCostUsd: d?.forkCostUsd ?? 0,
    independentCostUsd: d?.independentCostUsd ?? 0,
    saving: d?.saving ?? 0,
    slots: slotsOf(d?.slots),
    queued: d?.queued ?? 0,
    startInMs: d?.startInMs,
    finishInMs: d?.finishInMs,
    estimateBasis: d?.estimateBasis ?? "",
  };
}
