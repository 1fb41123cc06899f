// The requests `Client` sends to create sessions and fork batches, built here once: `Sessions`
// and `Session` send them, and a schedule's spec is one of each (`schedules.ts`).

import { randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";

import type { CreateSessionOptions, Directive, ForkOptions, Limits } from "./client.js";
import { zod } from "./config.js";
import * as pb from "./gen/forkd/v1/forkd.js";
import { webhookIdOf } from "./webhooks.js";

/** A zod schema (zod 4), as far as this client uses one. */
export interface ZodLike {
  safeParse(value: unknown): unknown;
  parse(value: unknown): unknown;
}

function isZod(schema: unknown): schema is ZodLike {
  return typeof (schema as Partial<ZodLike> | undefined)?.safeParse === "function";
}

const U32 = 2 ** 32 - 1;

function positive(name: string, value: unknown, most: number): number | undefined {
  if (value === undefined) return undefined;
  if (typeof value !== "number") throw new TypeError(`${name} is a number, not ${typeof value}`);
  if (!Number.isInteger(value) || value <= 0) {
    throw new RangeError(`${name} must be a positive whole number, not ${value} (leave it out for no limit here)`);
  }
  if (value > most) throw new RangeError(`${name} is too large: ${value} (at most ${most})`);
  return value;
}

/** The wire's `Limits` for `limits` (validated), or `undefined` when none is set. */
function limitsRequest(limits: Limits): pb.Limits | undefined {
  const throttle: unknown = limits.timeoutExcludesThrottle;
  if (throttle !== undefined && typeof throttle !== "boolean") {
    throw new TypeError(`timeoutExcludesThrottle is a boolean, not ${typeof throttle}`);
  }
  const out = {
    timeoutMs: positive("timeoutMs", limits.timeoutMs, Number.MAX_SAFE_INTEGER),
    idleTimeoutMs: positive("idleTimeoutMs", limits.idleTimeoutMs, Number.MAX_SAFE_INTEGER),
    maxTurns: positive("maxTurns", limits.maxTurns, U32),
    maxOutputTokens: positive("maxOutputTokens", limits.maxOutputTokens, Number.MAX_SAFE_INTEGER),
    timeoutExcludesThrottle: throttle,
  };
  if (Object.values(out).every((v) => v === undefined)) return undefined;
  return pb.Limits.fromPartial(out);
}

function directiveRequest(d: Directive): pb.Directive {
  if (typeof d === "string") {
    return pb.Directive.fromPartial({ description: (d.split("\n")[0] ?? "").slice(0, 80), prompt: d });
  }
  const [description, prompt, limits] = d;
  if (limits !== undefined && (typeof limits !== "object" || limits === null)) {
    throw new TypeError(`a directive's third item is its limits (an object), not ${typeof limits}`);
  }
  return pb.Directive.fromPartial({ description, prompt, limits: limits && limitsRequest(limits) });
}

/**
 * A batch's request (and the zod schema its results are parsed with, if one was given): built
 * here for `fork` and `dryRun` alike, so that a dry run checks exactly what the fork would send.
 */
export function forkRequest(
  sessionId: string,
  directives: Directive[],
  options: ForkOptions,
  dryRun: boolean,
): { request: pb.ForkBatchRequest; model: ZodLike | undefined } {
  let schema: object | undefined = options.outputSchema;
  const model = isZod(schema) ? schema : undefined;
  if (model) {
    if (!zod) throw new TypeError("a zod schema as outputSchema needs zod 4 installed");
    schema = zod.toJSONSchema(model) as object;
  }
  const request = pb.ForkBatchRequest.fromPartial({
    sessionId,
    directives: directives.map(directiveRequest),
    isolation: options.isolation ?? "",
    outputSchema: schema ? JSON.stringify(schema) : "",
    budgetUsd: options.budgetUsd ?? 0,
    budgetTokens: options.budgetTokens ?? 0,
    atTurn: options.atTurn,
    warmupGating: options.warmupGating,
    limits: limitsRequest(options),
    idempotencyKey: options.idempotencyKey ?? randomUUID(),
    dryRun,
    webhookId: webhookIdOf(options.webhook),
  });
  return { request, model };
}

/** A session's request: `Sessions.create`'s, and each firing's of a schedule (its key cleared). */
export function sessionRequest(options: CreateSessionOptions, uploadId: string | undefined): pb.CreateSessionRequest {
  return pb.CreateSessionRequest.fromPartial({
    systemPrompt: options.system ?? "",
    contextFiles: (options.context ?? []).map((item) =>
      typeof item === "string"
        ? { path: item, content: readFileSync(item, "utf8") }
        : { path: item[0], content: item[1] },
    ),
    workspace: options.workspace ?? "",
    uploadId: uploadId ?? "",
    model: options.model ?? "",
    permissionMode: options.permissionMode ?? "",
    sandbox: options.sandbox ?? "",
    allowRules: options.allow ?? [],
    denyRules: options.deny ?? [],
    capacityTool: options.capacityTool ?? false,
    hooksJson: hooksJson(options.hooks),
    idempotencyKey: options.idempotencyKey ?? randomUUID(),
  });
}

/** A session's own hooks as the wire carries them: an object JSON-encoded, a string as is. */
function hooksJson(hooks: object | string | undefined): string {
  if (hooks === undefined || hooks === null) return "";
  if (typeof hooks === "string") return hooks;
  if (typeof hooks !== "object" || Array.isArray(hooks)) {
    throw new TypeError(`hooks is a settings object or its JSON text, not ${Array.isArray(hooks) ? "an array" : typeof hooks}`);
  }
  return JSON.stringify(hooks);
}
