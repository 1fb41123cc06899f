/**
 * Webhooks: a tenant's URLs that its task notifications are posted to, signed to the Standard
 * Webhooks specification (docs/operations.md, "Webhooks and schedules"). What the daemon answers
 * about them, and the calls `Client` makes.
 */

import type { CallSignal, Client } from "./client.js";
import * as pb from "./gen/forkd/v1/forkd.js";

/** A registered webhook (its secret is never part of it). */
export interface Webhook {
  webhookId: string;
  url: string;
  /** The notification kinds it receives (`fork`, `typed`, `turn`); empty for all. */
  kinds: string[];
  /** The one session whose notifications it receives; `undefined` for all the tenant's. */
  sessionId?: string;
  /** Receives only the batches that name it (`fork(..., { webhook })`). */
  namedOnly: boolean;
  createdAt?: Date;
  /** When its current run of failed attempts began; `undefined` since its latest success. */
  failingSince?: Date;
  /** Set once it failed every attempt for too long (5 days by default): nothing more is sent. */
  disabledReason?: string;
  disabledAt?: Date;
  /** Until when the secret before the latest rotation still signs. */
  previousSecretUntil?: Date;
}

/** `createWebhook` and `rotateWebhookSecret`: the webhook and its signing secret (`whsec_…`), shown once. */
export interface CreatedWebhook {
  webhook: Webhook;
  secret: string;
}

/** One attempt at one delivery. */
export interface WebhookAttempt {
  /** The delivery's id: the `webhook-id` header of each of its attempts. */
  deliveryId: string;
  /** 1 for a delivery's first attempt. */
  number: number;
  at?: Date;
  /** The receiver's HTTP status; `undefined` when it did not answer. */
  status?: number;
  /** Why it failed; `undefined` when the receiver took it (2xx). */
  error?: string;
  latencyMs: number;
  /** `notification` or `ping`. */
  event: string;
  /** The notification's seq (the tenant's own); `undefined` for a ping. */
  notificationSeq?: number;
  /** The delivery's state now: `pending` (retried later), `delivered` or `failed`. */
  state: string;
}

export interface CreateWebhookOptions extends CallSignal {
  /** The notification kinds it receives (`fork`, `typed`, `turn`); all by default. */
  kinds?: string[];
  /** The one session whose notifications it receives; all the tenant's by default. */
  sessionId?: string;
  /** Receive only the batches that name it. */
  namedOnly?: boolean;
}

/** A webhook as a batch names it: its id, or the webhook. */
export type WebhookRef = string | Webhook;

/** A batch's `webhookId`: empty for none. */
export function webhookIdOf(webhook: WebhookRef | undefined): string {
  if (webhook === undefined) return "";
  if (typeof webhook === "string") return webhook;
  if (typeof webhook === "object" && webhook !== null && typeof webhook.webhookId === "string") {
    return webhook.webhookId;
  }
  throw new TypeError(`webhook is a webhook's id or a Webhook, not ${typeof webhook}`);
}

function webhookOf(w: pb.Webhook | undefined): Webhook {
  const out: Webhook = {
    webhookId: w?.webhookId ?? "",
    url: w?.url ?? "",
    kinds: w?.kinds ?? [],
    namedOnly: w?.namedOnly ?? false,
  };
  if (w?.sessionId) out.sessionId = w.sessionId;
  if (w?.createdAt) out.createdAt = w.createdAt;
  if (w?.failingSince) out.failingSince = w.failingSince;
  if (w?.disabledReason) out.disabledReason = w.disabledReason;
  if (w?.disabledAt) out.disabledAt = w.disabledAt;
  if (w?.previousSecretUntil) out.previousSecretUntil = w.previousSecretUntil;
  return out;
}

function createdOf(r: pb.CreateWebhookResponse): CreatedWebhook {
  return { webhook: webhookOf(r.webhook), secret: r.secret };
}

function attemptOf(a: pb.WebhookAttempt | undefined): WebhookAttempt {
  const out: WebhookAttempt = {
    deliveryId: a?.deliveryId ?? "",
    number: a?.number ?? 0,
    latencyMs: a?.latencyMs ?? 0,
    event: a?.event ?? "",
    state: a?.state ?? "",
  };
  if (a?.at) out.at = a.at;
  if (a?.status) out.status = a.status;
  if (a?.error) out.error = a.error;
  if (a?.notificationSeq) out.notificationSeq = a.notificationSeq;
  return out;
}

const U32 = 2 ** 32 - 1;

/** The calls behind `Client`'s webhook methods. @internal */
export async function createWebhook(c: Client, url: string, options: CreateWebhookOptions): Promise<CreatedWebhook> {
  const kinds: unknown = options.kinds ?? [];
  if (!Array.isArray(kinds)) throw new TypeError(`kinds is an array of notification kinds, not ${typeof kinds}`);
  const request = pb.CreateWebhookRequest.fromPartial({
    url,
    kinds: kinds as string[],
    sessionId: options.sessionId ?? "",
    namedOnly: options.namedOnly ?? false,
  });
  return createdOf(await c.call(c.stub.createWebhook, request, options));
}

/** @internal */
export async function listWebhooks(c: Client, options: CallSignal): Promise<Webhook[]> {
  const reply = await c.call(c.stub.listWebhooks, pb.ListWebhooksRequest.fromPartial({}), options);
  return reply.webhooks.map(webhookOf);
}

/** @internal */
export async function getWebhook(c: Client, webhookId: string, options: CallSignal): Promise<Webhook> {
  const reply = await c.call(c.stub.getWebhook, pb.GetWebhookRequest.fromPartial({ webhookId }), options);
  return webhookOf(reply.webhook);
}

/** @internal */
export async function deleteWebhook(c: Client, webhookId: string, options: CallSignal): Promise<void> {
  await c.call(c.stub.deleteWebhook, pb.DeleteWebhookRequest.fromPartial({ webhookId }), options);
}

/** @internal */
export async function rotateWebhookSecret(c: Client, webhookId: string, options: CallSignal): Promise<CreatedWebhook> {
  const request = pb.RotateWebhookSecretRequest.fromPartial({ webhookId });
  return createdOf(await c.call(c.stub.rotateWebhookSecret, request, options));
}

/** @internal */
export async function testWebhook(c: Client, webhookId: string, options: CallSignal): Promise<WebhookAttempt> {
  const reply = await c.call(c.stub.testWebhook, pb.TestWebhookRequest.fromPartial({ webhookId }), options);
  return attemptOf(reply.attempt);
}

/** @internal */
export async function webhookAttempts(
  c: Client,
  webhookId: string,
  options: CallSignal & { limit?: number },
): Promise<WebhookAttempt[]> {
  const limit: unknown = options.limit;
  if (limit !== undefined) {
    if (typeof limit !== "number") throw new TypeError(`limit is a number, not ${typeof limit}`);
    if (!Number.isInteger(limit) || limit <= 0 || limit > U32) {
      throw new RangeError(`limit must be a positive whole number, not ${limit} (leave it out for 50)`);
    }
  }
  const request = pb.ListWebhookAttemptsRequest.fromPartial({ webhookId, limit: options.limit ?? 0 });
  const reply = await c.call(c.stub.listWebhookAttempts, request, options);
  return reply.attempts.map(attemptOf);
}
