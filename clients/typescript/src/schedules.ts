/**
 * Schedules: a tenant's batches on a clock (docs/operations.md, "Webhooks and schedules"). Each
 * firing creates a session of its own and forks a batch on it, both from the spec the schedule
 * keeps. What the daemon answers about them, and the calls `Client` makes.
 */

import type { CallSignal, Client, CreateSessionOptions, Directive, ForkOptions } from "./client.js";
import * as pb from "./gen/forkd/v1/forkd.js";
import { forkRequest, sessionRequest } from "./requests.js";

/** One firing of a schedule. */
export interface ScheduleFiring {
  /** When it was due; a trigger's: when it was asked. */
  fireTime?: Date;
  /** `firing` (its batch being created), `fired`, `skipped` or `failed`. */
  state: string;
  /** A trigger's (`triggerSchedule`), not the clock's. */
  manual: boolean;
  /** The session and batch it created; `undefined` before, or when it created none. */
  sessionId?: string;
  batchId?: string;
  /** Why it was skipped or failed. */
  reason?: string;
  /** Its batch's children, and how many ended each way so far (`getSchedule` only). */
  children: number;
  completed: number;
  failed: number;
  costUsd: number;
}

/**
 * A schedule. `nextFires` and `firings` come with `getSchedule` and the calls that change it,
 * not with `listSchedules`.
 */
export interface Schedule {
  name: string;
  cron: string;
  /** The IANA time zone `cron` is read in (`UTC` by default). */
  timezone: string;
  /** `skip`: a firing while the previous firing's batch runs is recorded as skipped; `allow`. */
  overlap: string;
  /** `once`: after downtime, the latest missed firing runs once; `none`. */
  catchUp: string;
  paused: boolean;
  createdAt?: Date;
  /** How many directives each firing's batch has. */
  directives: number;
  /** The webhook each firing's batch names; `undefined` for none. */
  webhookId?: string;
  /** The next firing times (up to 5); none while paused. */
  nextFires: Date[];
  /** The latest firings, newest first. */
  firings: ScheduleFiring[];
}

/**
 * The session each firing creates: `sessions.create`'s options but its idempotency key (each
 * firing's is its own) and `hooks` (a schedule's session cannot bring its own; the operator's run
 * for it). An `upload` directory is uploaded once, when the schedule is created.
 */
export type SessionSpec = Omit<CreateSessionOptions, "idempotencyKey" | "signal" | "hooks">;

const SESSION_KEYS = new Set([
  "system",
  "context",
  "workspace",
  "upload",
  "uploadId",
  "model",
  "permissionMode",
  "sandbox",
  "allow",
  "deny",
  "capacityTool",
]);

/** A schedule's clock and spec: the batch each firing forks takes `fork`'s options. */
export interface CreateScheduleOptions extends Omit<ForkOptions, "atTurn" | "idempotencyKey"> {
  /** 5 fields (minute hour day-of-month month day-of-week), or 6 with seconds first. */
  cron: string;
  /** One child per directive, in each firing's batch. */
  directives: Directive[];
  session?: SessionSpec;
  /** An IANA time zone (`Europe/Berlin`); UTC by default. */
  timezone?: string;
  /** `skip` (default) or `allow`. */
  overlap?: "skip" | "allow";
  /** `once` (default) or `none`. */
  catchUp?: "once" | "none";
}

function firingOf(f: pb.ScheduleFiring | undefined): ScheduleFiring {
  const out: ScheduleFiring = {
    state: f?.state ?? "",
    manual: f?.manual ?? false,
    children: f?.children ?? 0,
    completed: f?.completed ?? 0,
    failed: f?.failed ?? 0,
    costUsd: f?.costUsd ?? 0,
  };
  if (f?.fireTime) out.fireTime = f.fireTime;
  if (f?.sessionId) out.sessionId = f.sessionId;
  if (f?.batchId) out.batchId = f.batchId;
  if (f?.reason) out.reason = f.reason;
  return out;
}

function scheduleOf(s: pb.Schedule | undefined): Schedule {
  const out: Schedule = {
    name: s?.name ?? "",
    cron: s?.cron ?? "",
    timezone: s?.timezone ?? "",
    overlap: s?.overlap ?? "",
    catchUp: s?.catchUp ?? "",
    paused: s?.paused ?? false,
    directives: s?.directives ?? 0,
    nextFires: s?.nextFires ?? [],
    firings: (s?.firings ?? []).map(firingOf),
  };
  if (s?.createdAt) out.createdAt = s.createdAt;
  if (s?.webhookId) out.webhookId = s.webhookId;
  return out;
}

function text(name: string, value: unknown): string {
  if (value === undefined) return "";
  if (typeof value !== "string") throw new TypeError(`${name} is a string, not ${typeof value}`);
  return value;
}

/** The schedule's spec: a session and a batch with no idempotency key nor session id (each firing's are its own). */
function spec(options: CreateScheduleOptions): { session: pb.CreateSessionRequest; batch: pb.ForkBatchRequest } {
  const given: unknown = options.session ?? {};
  if (typeof given !== "object" || given === null) throw new TypeError(`session is an object, not ${typeof given}`);
  const unknown = Object.keys(given).filter((k) => !SESSION_KEYS.has(k));
  if (unknown.length > 0) {
    throw new TypeError(`session has no ${unknown.join(", ")}: it takes ${[...SESSION_KEYS].join(", ")}`);
  }
  const s = given as SessionSpec;
  if (s.upload !== undefined && (s.workspace !== undefined || s.uploadId !== undefined)) {
    throw new TypeError("session's upload is exclusive with its workspace and uploadId");
  }
  const directives: unknown = options.directives;
  if (!Array.isArray(directives)) throw new TypeError(`directives is an array, not ${typeof directives}`);
  const session = sessionRequest(s, s.uploadId);
  session.idempotencyKey = "";
  const { request: batch } = forkRequest("", directives as Directive[], { ...options, atTurn: undefined }, false);
  batch.idempotencyKey = "";
  return { session, batch };
}

/** The calls behind `Client`'s schedule methods. @internal */
export async function createSchedule(c: Client, name: string, options: CreateScheduleOptions): Promise<Schedule> {
  const { session, batch } = spec(options);
  const request = pb.CreateScheduleRequest.fromPartial({
    name,
    cron: text("cron", options.cron),
    timezone: text("timezone", options.timezone),
    overlap: text("overlap", options.overlap),
    catchUp: text("catchUp", options.catchUp),
  });
  if (options.session?.upload !== undefined) {
    session.uploadId = (await c.upload(options.session.upload, options)).uploadId;
  }
  request.spec = { session, batch };
  const reply = await c.call(c.stub.createSchedule, request, options);
  return scheduleOf(reply.schedule);
}

/** @internal */
export async function listSchedules(c: Client, options: CallSignal): Promise<Schedule[]> {
  const reply = await c.call(c.stub.listSchedules, pb.ListSchedulesRequest.fromPartial({}), options);
  return reply.schedules.map(scheduleOf);
}

function named(name: string): pb.ScheduleNameRequest {
  return pb.ScheduleNameRequest.fromPartial({ name: text("a schedule's name", name) });
}

/** @internal */
export async function getSchedule(c: Client, name: string, options: CallSignal): Promise<Schedule> {
  return scheduleOf((await c.call(c.stub.getSchedule, named(name), options)).schedule);
}

/** @internal */
export async function pauseSchedule(c: Client, name: string, options: CallSignal): Promise<Schedule> {
  return scheduleOf((await c.call(c.stub.pauseSchedule, named(name), options)).schedule);
}

/** @internal */
export async function resumeSchedule(c: Client, name: string, options: CallSignal): Promise<Schedule> {
  return scheduleOf((await c.call(c.stub.resumeSchedule, named(name), options)).schedule);
}

/** @internal */
export async function deleteSchedule(c: Client, name: string, options: CallSignal): Promise<void> {
  await c.call(c.stub.deleteSchedule, named(name), options);
}

/** @internal */
export async function triggerSchedule(c: Client, name: string, options: CallSignal): Promise<ScheduleFiring> {
  return firingOf((await c.call(c.stub.triggerSchedule, named(name), options)).firing);
}
