// The client: sessions, fork batches, agents and notifications, with the Python client's names
// where the languages allow.

import { randomUUID } from "node:crypto";

import type { CallOptions, ClientReadableStream, ClientUnaryCall, Metadata, ServiceError } from "@grpc/grpc-js";

import { type Capacity, type DryRun, capacityOf, dryRunOf } from "./capacity.js";
import { channel, defaultAddr, metadata, parseAddr } from "./config.js";
import { fromServiceError, isServiceError } from "./errors.js";
import { type Applied, applyTo, listTree, uploadRequests } from "./files.js";
import * as pb from "./gen/forkd/v1/forkd.js";
import { type ZodLike, forkRequest, sessionRequest } from "./requests.js";
import * as sched from "./schedules.js";
import type { CreateScheduleOptions, Schedule, ScheduleFiring } from "./schedules.js";
import { Backoff, DEFAULT_RECONNECT_FOR_MS, follow, isLost, retried, sleep } from "./streams.js";
import * as hooks from "./webhooks.js";
import type { CreateWebhookOptions, CreatedWebhook, Webhook, WebhookAttempt, WebhookRef } from "./webhooks.js";

export type { Applied } from "./files.js";
export type { BudgetLeft, Capacity, DryRun, PacedLimit, ProviderCapacity, RunSlots } from "./capacity.js";
export type { CreateScheduleOptions, Schedule, ScheduleFiring, SessionSpec } from "./schedules.js";
export type { CreatedWebhook, CreateWebhookOptions, Webhook, WebhookAttempt, WebhookRef } from "./webhooks.js";

/** An upload the daemon stored: sessions start from it (`uploadId`). */
export interface Upload {
  uploadId: string;
  files: number;
  bytes: number;
  gitCommit: string;
  /** What this upload carried: the rest the tenant had already. */
  blobsReceived: number;
  bytesReceived: number;
}

export interface ClientOptions {
  /** `unix:/path/forkd.sock`, `http://host:port` or `https://host:port`; default `FORKD_ADDR`, else `FORKD_HOME`'s socket. */
  addr?: string;
  /** The bearer token; default `FORKD_TOKEN`. */
  token?: string;
  /** For `https://`: a PEM CA (a path or its bytes); default `FORKD_CA_CERT`, else the system's roots. */
  tlsCa?: string | Buffer;
  /** How long streams and retried calls keep trying to reach a daemon that went away. */
  reconnectForMs?: number;
}

/** Every call takes an `AbortSignal`. */
export interface CallSignal {
  signal?: AbortSignal;
}

/**
 * How a child ended: `completed`, or a failure: `failed`, `killed`, or `timed_out` (past one of
 * its limits, with a partial report whose `issues` names the limit).
 */
export type Status = "completed" | "failed" | "killed" | "timed_out" | "unknown";

export interface Report {
  scope: string;
  result: string;
  keyFiles: string[];
  filesChanged: string[];
  issues: string;
  /** With an output schema: the JSON object the child ended with. */
  structured: unknown;
}

/** A child's task notification: how it ended, its report, usage and cost. */
export interface TaskNotification {
  seq: number;
  sessionId: string;
  batchId: string;
  agentId: string;
  kind: string;
  status: Status;
  summary: string;
  report: Report;
  usage: pb.Usage | undefined;
  costUsd: number;
  /** The schedule whose firing forked the batch, if one did. */
  schedule?: string;
}

const STATUS: Record<number, Status> = {
  [pb.NotificationStatus.NOTIFICATION_STATUS_COMPLETED]: "completed",
  [pb.NotificationStatus.NOTIFICATION_STATUS_FAILED]: "failed",
  [pb.NotificationStatus.NOTIFICATION_STATUS_KILLED]: "killed",
  [pb.NotificationStatus.NOTIFICATION_STATUS_TIMED_OUT]: "timed_out",
};

/**
 * Limits on an agent's run: past one it ends `timed_out`, with a partial report whose `issues`
 * names the limit. Each one left out is the next layer's: a child's own, its batch's, the
 * tenant's default, the daemon's. A value that is not a positive whole number throws a
 * `RangeError` before anything is sent.
 */
export interface Limits {
  /** Wall time from the agent's first start, in milliseconds (it counts across restarts). */
  timeoutMs?: number;
  /** No output token and no tool call started or finished for this long, in milliseconds. */
  idleTimeoutMs?: number;
  /** Model requests at most. */
  maxTurns?: number;
  /** Output tokens at most. */
  maxOutputTokens?: number;
  /** `timeoutMs` leaves out the time spent waiting on the provider's rate limits. */
  timeoutExcludesThrottle?: boolean;
}

/** One hook command's run for an agent: what it was about, what it decided and said. */
export interface HookRun {
  /** `PreToolUse`, `PostToolUse`, `UserPromptSubmit`, `Stop`, `SubagentStop`, `PreCompact` or `Notification`. */
  event: string;
  /** The tool call it was about; `undefined` for the other events. */
  toolUseId?: string;
  toolName?: string;
  /** The command's first word (never the whole command). */
  program: string;
  /** `undefined` when it was killed (its timeout) or never started. */
  exitCode?: number;
  /** `stop`, `deny`, `block`, `ask`, `allow`, `error` or `none`. */
  decision: string;
  /** What it said: its reason, its context, its `systemMessage`, an error (at most 2,000 bytes). */
  output: string;
  startedAt?: Date;
  durationMs: number;
}

function hookRunOf(h: pb.HookRun): HookRun {
  const out: HookRun = {
    event: h.event,
    program: h.program,
    decision: h.decision,
    output: h.output,
    durationMs: h.durationMs,
  };
  if (h.toolUseId) out.toolUseId = h.toolUseId;
  if (h.toolName) out.toolName = h.toolName;
  if (h.exitCode !== undefined) out.exitCode = h.exitCode;
  if (h.startedAt) out.startedAt = h.startedAt;
  return out;
}

function notificationOf(n: pb.Notification, schema?: ZodLike): TaskNotification {
  const r = n.report;
  const structured: unknown = r?.structuredJson ? JSON.parse(r.structuredJson) : undefined;
  return {
    seq: n.seq,
    sessionId: n.sessionId,
    batchId: n.batchId,
    agentId: n.agentId,
    kind: n.kind,
    status: STATUS[n.status] ?? "unknown",
    summary: n.summary,
    report: {
      scope: r?.scope ?? "",
      result: r?.result ?? "",
      keyFiles: r?.keyFiles ?? [],
      filesChanged: r?.filesChanged ?? [],
      issues: r?.issues ?? "",
      structured: structured !== undefined && schema ? schema.parse(structured) : structured,
    },
    usage: n.usage,
    costUsd: n.costUsd,
    ...(n.schedule ? { schedule: n.schedule } : {}),
  };
}

type Unary<Req, Res> = (
  request: Req,
  metadata: Metadata,
  options: Partial<CallOptions>,
  callback: (error: ServiceError | null, response: Res) => void,
) => ClientUnaryCall;

/** A connection to forkd. */
export class Client {
  readonly addr: string;
  readonly reconnectForMs: number;
  readonly sessions: Sessions;
  readonly agents: Agents;
  /** @internal */
  readonly stub: pb.ForkdClient;
  private readonly token: string | undefined;

  constructor(options: ClientOptions = {}) {
    const target = options.addr ? parseAddr(options.addr) : defaultAddr();
    this.addr = target.given;
    this.token = options.token ?? (process.env.FORKD_TOKEN || undefined);
    this.reconnectForMs = options.reconnectForMs ?? DEFAULT_RECONNECT_FOR_MS;
    const { credentials, options: channelOptions } = channel(
      target,
      options.tlsCa ?? (process.env.FORKD_CA_CERT || undefined),
    );
    this.stub = new pb.ForkdClient(target.target, credentials, channelOptions);
    this.sessions = new Sessions(this);
    this.agents = new Agents(this);
  }

  close(): void {
    this.stub.close();
  }

  /** @internal One unary call, its failure as a `ForkdError`; retried while unavailable when `idempotent`. */
  call<Req, Res>(
    method: Unary<Req, Res>,
    request: Req,
    options: CallSignal & { idempotent?: boolean } = {},
  ): Promise<Res> {
    const once = (): Promise<Res> =>
      new Promise<Res>((resolve, reject) => {
        const call = method.call(this.stub, request, metadata(this.token), {}, (error, response) =>
          error ? reject(error) : resolve(response),
        );
        options.signal?.addEventListener("abort", () => call.cancel(), { once: true });
      });
    if (options.idempotent) return retried(once, this.reconnectForMs, options.signal);
    return once().catch((e: unknown) => {
      throw options.signal?.aborted ? options.signal.reason : fromServiceError(e);
    });
  }

  /** @internal The metadata of one streaming call. */
  meta(): Metadata {
    return metadata(this.token);
  }

  /**
   * Sends the tree under `dir` (what git would list in a git work tree, else what its ignore
   * files keep): only the contents this tenant's store lacks travel.
   */
  async upload(dir: string, options: CallSignal = {}): Promise<Upload> {
    const tree = listTree(dir);
    const hashes = [...tree.contents.keys()];
    const missing: string[] = [];
    for (let at = 0; at < hashes.length; at += 10_000) {
      const request = pb.FindMissingBlobsRequest.fromPartial({ hashes: hashes.slice(at, at + 10_000) });
      missing.push(...(await this.call(this.stub.findMissingBlobs, request, options)).missing);
    }
    const reply = await new Promise<pb.UploadWorkspaceResponse>((resolve, reject) => {
      const call = this.stub.uploadWorkspace(this.meta(), (error, response) =>
        error ? reject(fromServiceError(error)) : resolve(response),
      );
      options.signal?.addEventListener("abort", () => call.cancel(), { once: true });
      try {
        for (const request of uploadRequests(tree, missing)) call.write(request);
        call.end();
      } catch (e) {
        call.cancel();
        reject(e);
      }
    });
    return {
      uploadId: reply.uploadId,
      files: reply.files,
      bytes: reply.bytes,
      gitCommit: reply.gitCommit,
      blobsReceived: reply.blobsReceived,
      bytesReceived: reply.bytesReceived,
    };
  }

  /**
   * What the daemon can take now, to ask before submitting: its running slots (used, free,
   * total), the caller's own runs waiting for one, what the tenant's budget has left
   * (`undefined` without one), and the provider limiter per key and model.
   */
  async capacity(options: CallSignal = {}): Promise<Capacity> {
    return capacityOf(await this.call(this.stub.getCapacity, pb.GetCapacityRequest.fromPartial({}), options));
  }

  /**
   * Registers `url` (http:// or https://) as a webhook of the caller's tenant: its task
   * notifications are posted there, signed to the Standard Webhooks specification. `kinds` and
   * `sessionId` filter them; a `namedOnly` one receives only the batches that name it
   * (`fork(..., { webhook })`). Answers the webhook and its signing secret (`whsec_…`), shown
   * this once. `InvalidArgument` for a URL whose address the daemon does not reach (loopback,
   * private, link-local, metadata).
   */
  createWebhook(url: string, options: CreateWebhookOptions = {}): Promise<CreatedWebhook> {
    return hooks.createWebhook(this, url, options);
  }

  /** The caller's tenant's webhooks. */
  listWebhooks(options: CallSignal = {}): Promise<Webhook[]> {
    return hooks.listWebhooks(this, options);
  }

  /** One webhook of the caller's tenant (`NotFound` for another tenant's). */
  getWebhook(webhookId: string, options: CallSignal = {}): Promise<Webhook> {
    return hooks.getWebhook(this, webhookId, options);
  }

  /** Deletes a webhook: nothing more is sent to it. */
  deleteWebhook(webhookId: string, options: CallSignal = {}): Promise<void> {
    return hooks.deleteWebhook(this, webhookId, options);
  }

  /**
   * A new signing secret, shown this once; the one it replaces signs too until
   * `webhook.previousSecretUntil` (24 hours by default), so a receiver verifies either meanwhile.
   */
  rotateWebhookSecret(webhookId: string, options: CallSignal = {}): Promise<CreatedWebhook> {
    return hooks.rotateWebhookSecret(this, webhookId, options);
  }

  /** Sends the webhook a `ping` now, once, and answers how it went. */
  testWebhook(webhookId: string, options: CallSignal = {}): Promise<WebhookAttempt> {
    return hooks.testWebhook(this, webhookId, options);
  }

  /** The webhook's latest attempts, newest first (`limit`: the daemon's 50 by default). */
  webhookAttempts(webhookId: string, options: CallSignal & { limit?: number } = {}): Promise<WebhookAttempt[]> {
    return hooks.webhookAttempts(this, webhookId, options);
  }

  /**
   * Forks a batch on a clock: each firing creates a session of its own (`session`:
   * `sessions.create`'s options; an `upload` directory is uploaded now, once) and forks
   * `directives` on it with `fork`'s options. `cron` is 5 fields, or 6 with seconds first, read in
   * `timezone` (IANA; UTC by default). A name taken is `FailedPrecondition`; a cron expression or
   * time zone that does not parse, or a spec that would not fork, `InvalidArgument`.
   */
  createSchedule(name: string, options: CreateScheduleOptions): Promise<Schedule> {
    return sched.createSchedule(this, name, options);
  }

  /** The caller's tenant's schedules (without their next firing times and firings). */
  listSchedules(options: CallSignal = {}): Promise<Schedule[]> {
    return sched.listSchedules(this, options);
  }

  /** A schedule with its next firing times and its latest firings, newest first (`NotFound` for another tenant's). */
  getSchedule(name: string, options: CallSignal = {}): Promise<Schedule> {
    return sched.getSchedule(this, name, options);
  }

  /** Stops the schedule firing until it is resumed (a trigger still fires it). */
  pauseSchedule(name: string, options: CallSignal = {}): Promise<Schedule> {
    return sched.pauseSchedule(this, name, options);
  }

  /** Fires the schedule again from now: what was due while it was paused is not caught up. */
  resumeSchedule(name: string, options: CallSignal = {}): Promise<Schedule> {
    return sched.resumeSchedule(this, name, options);
  }

  /** Deletes the schedule and its record of firings (their sessions and batches stay). */
  deleteSchedule(name: string, options: CallSignal = {}): Promise<void> {
    return sched.deleteSchedule(this, name, options);
  }

  /** Fires the schedule now, outside its clock (a paused one too), and answers the firing. */
  triggerSchedule(name: string, options: CallSignal = {}): Promise<ScheduleFiring> {
    return sched.triggerSchedule(this, name, options);
  }

  /**
   * This tenant's task notifications after `since`: the stored ones, then live ones (unless
   * `follow` is false), resumed after the last one yielded across a daemon restart.
   */
  async *notifications(
    options: { since?: number; sessionId?: string; batchId?: string; follow?: boolean } & CallSignal = {},
  ): AsyncGenerator<TaskNotification> {
    const live = options.follow ?? true;
    const open = (seq: number): ClientReadableStream<pb.Notification> =>
      this.stub.subscribeNotifications(
        pb.SubscribeNotificationsRequest.fromPartial({
          sinceSeq: seq,
          sessionId: options.sessionId ?? "",
          batchId: options.batchId ?? "",
          follow: live,
        }),
        this.meta(),
      );
    const stream = follow(open, (n) => n.seq, options.since ?? 0, this.reconnectForMs, {
      ends: !live,
      signal: options.signal,
    });
    for await (const n of stream) yield notificationOf(n);
  }
}

/** A context file: a path read here, or `[name, text]`. */
export type ContextItem = string | [string, string];
/**
 * A child's directive: its prompt (described by its first line), `[description, prompt]`, or
 * `[description, prompt, limits]`: that child's own limits, over the batch's.
 */
export type Directive = string | [string, string] | [string, string, Limits];

export interface CreateSessionOptions extends CallSignal {
  system?: string;
  context?: ContextItem[];
  workspace?: string;
  /** A directory here: uploaded first, and the session starts from it. */
  upload?: string;
  uploadId?: string;
  model?: string;
  permissionMode?: string;
  sandbox?: string;
  allow?: string[];
  deny?: string[];
  /** Give the model the read-only `Capacity` tool (how busy the daemon is, to size its fan-out). */
  capacityTool?: boolean;
  /**
   * The session's own hooks: a Claude Code settings object (`{ hooks: { PreToolUse: [...] } }`,
   * JSON-encoded here) or its JSON text (sent as is). Its `hooks` block runs after the operator's,
   * each command in the session's sandbox, for the session, its children and its branches;
   * `InvalidArgument` if it does not parse or a hook asks for `"sandbox": false`.
   */
  hooks?: object | string;
  idempotencyKey?: string;
}

export class Sessions {
  constructor(private readonly client: Client) {}

  /** A new parent session; retried across a daemon restart under one idempotency key. */
  async create(options: CreateSessionOptions = {}): Promise<Session> {
    let uploadId = options.uploadId;
    if (options.upload !== undefined) {
      if (options.workspace !== undefined || uploadId !== undefined) {
        throw new TypeError("upload is exclusive with workspace and uploadId");
      }
      uploadId = (await this.client.upload(options.upload, options)).uploadId;
    }
    const request = sessionRequest(options, uploadId);
    const reply = await this.client.call(this.client.stub.createSession, request, {
      idempotent: true,
      signal: options.signal,
    });
    return new Session(this.client, reply.session!);
  }

  async get(sessionId: string, options: CallSignal = {}): Promise<Session> {
    const reply = await this.client.call(
      this.client.stub.getSession,
      pb.GetSessionRequest.fromPartial({ sessionId }),
      options,
    );
    return new Session(this.client, reply.session!);
  }
}

/** A batch's options; its `Limits` are its children's (a directive's own win). */
export interface ForkOptions extends CallSignal, Limits {
  isolation?: "copy" | "none";
  /**
   * A JSON Schema object, or a zod 4 schema (converted with zod's `toJSONSchema`; the results are
   * parsed with it): each child ends with a JSON object valid against it (`report.structured`).
   */
  outputSchema?: object;
  budgetUsd?: number;
  budgetTokens?: number;
  atTurn?: number;
  warmupGating?: boolean;
  /**
   * A webhook of the caller's tenant (its id, or the webhook) that receives this batch's
   * notifications, whatever its own filter says (`NotFound` for another tenant's or a missing one).
   */
  webhook?: WebhookRef;
  idempotencyKey?: string;
}

/** A parent session: fork children from it, send it turns, branch it. */
export class Session {
  readonly id: string;

  constructor(
    private readonly client: Client,
    readonly info: pb.Session,
  ) {
    this.id = info.sessionId;
  }

  /** The events its own hooks (`hooks` at creation) are for, e.g. `["PreToolUse"]`; their commands are never shown. */
  get hookEvents(): string[] {
    return [...this.info.hookEvents];
  }

  /**
   * Forks one child per directive; they inherit the session's context. The limits among
   * `options` are the children's (`timeoutMs`, `idleTimeoutMs`, `maxTurns`, `maxOutputTokens`,
   * `timeoutExcludesThrottle`); a child past one ends `timed_out`, a failure.
   */
  async fork(directives: Directive[], options: ForkOptions = {}): Promise<Batch> {
    const { request, model } = forkRequest(this.id, directives, options, false);
    const reply = await this.client.call(this.client.stub.forkBatch, request, {
      idempotent: true,
      signal: options.signal,
    });
    return new Batch(this.client, reply.batchId, reply.agentIds, model);
  }

  /**
   * Asks the daemon what `fork` with the same arguments would do, without doing it: the batch is
   * checked as a submission would be (refused the same way: `InvalidArgument` for a turn that
   * has not ended, a bad schema, …), nothing is stored or started, and the idempotency key is
   * not recorded. Tells the children, the prefix they would share, the first requests' cost
   * forked and as independent agents, and the daemon's slots and the caller's queued runs now.
   */
  async dryRun(directives: Directive[], options: ForkOptions = {}): Promise<DryRun> {
    const { request } = forkRequest(this.id, directives, options, true);
    const reply = await this.client.call(this.client.stub.forkBatch, request, {
      idempotent: true,
      signal: options.signal,
    });
    return dryRunOf(reply.dryRun);
  }

  /**
   * Runs one parent turn on `text`: its events as they come, the last `turnEnded`. Sent again
   * under its idempotency key while the daemon is unavailable before the turn's first event (the
   * daemon stores the message once); a turn cut off later throws.
   */
  async *send(
    text: string,
    options: CallSignal & { idempotencyKey?: string } = {},
  ): AsyncGenerator<NonNullable<pb.SessionEvent["event"]>> {
    const request = pb.SendMessageRequest.fromPartial({
      sessionId: this.id,
      text,
      idempotencyKey: options.idempotencyKey ?? randomUUID(),
    });
    const backoff = new Backoff(this.client.reconnectForMs);
    for (;;) {
      const call = this.client.stub.sendMessage(request, this.client.meta());
      const cancel = (): void => call.cancel();
      options.signal?.addEventListener("abort", cancel, { once: true });
      let started = false;
      try {
        for await (const event of call as AsyncIterable<pb.SessionEvent>) {
          started = true;
          if (event.event) yield event.event;
        }
        return;
      } catch (e) {
        if (options.signal?.aborted) throw options.signal.reason;
        if (started || !isLost(e)) throw fromServiceError(e);
        await sleep(backoff.next(isServiceError(e) ? e.details : String(e)), options.signal);
      } finally {
        options.signal?.removeEventListener("abort", cancel);
      }
    }
  }

  /** A new session holding this one's history up to turn `atTurn`. */
  async branch(atTurn: number, options: CallSignal & { idempotencyKey?: string } = {}): Promise<Session> {
    const request = pb.BranchSessionRequest.fromPartial({
      sessionId: this.id,
      point: { $case: "atTurn", value: atTurn },
      idempotencyKey: options.idempotencyKey ?? randomUUID(),
    });
    const reply = await this.client.call(this.client.stub.branchSession, request, {
      idempotent: true,
      signal: options.signal,
    });
    return new Session(this.client, reply.session!);
  }

  /** Merges this branch back into the session it branched from; the note the origin reads. */
  async merge(options: CallSignal & { summary?: boolean; idempotencyKey?: string } = {}): Promise<string> {
    const request = pb.MergeBranchRequest.fromPartial({
      sessionId: this.id,
      summary: options.summary ?? false,
      idempotencyKey: options.idempotencyKey ?? randomUUID(),
    });
    const reply = await this.client.call(this.client.stub.mergeBranch, request, {
      idempotent: true,
      signal: options.signal,
    });
    return reply.note;
  }
}

/** A fork batch: its children's ids, their notifications and changes. */
export class Batch {
  constructor(
    private readonly client: Client,
    readonly id: string,
    readonly agentIds: string[],
    private readonly schema?: ZodLike,
  ) {}

  /**
   * Each child's notification as it ends, once (replayed, then live), until every child has
   * reported; resumed across a daemon restart. An aborted `signal` throws its reason (the
   * children go on).
   */
  async *notifications(options: CallSignal = {}): AsyncGenerator<TaskNotification> {
    const waiting = new Set(this.agentIds);
    if (waiting.size === 0) return;
    const open = (seq: number): ClientReadableStream<pb.Notification> =>
      this.client.stub.subscribeNotifications(
        pb.SubscribeNotificationsRequest.fromPartial({ sinceSeq: seq, batchId: this.id, follow: true }),
        this.client.meta(),
      );
    const stream = follow(open, (n) => n.seq, 0, this.client.reconnectForMs, { signal: options.signal });
    for await (const n of stream) {
      if (!waiting.delete(n.agentId)) continue;
      yield notificationOf(n, this.schema);
      if (waiting.size === 0) return;
    }
  }

  /** Every child's notification, in the order they ended. */
  async wait(options: CallSignal = {}): Promise<TaskNotification[]> {
    const done: TaskNotification[] = [];
    for await (const n of this.notifications(options)) done.push(n);
    return done;
  }

  /** Each isolated child's changes (files, diff, state), by agent id. */
  async changes(options: CallSignal = {}): Promise<Map<string, pb.GetChangesResponse>> {
    const out = new Map<string, pb.GetChangesResponse>();
    for (const agentId of this.agentIds) {
      const request = pb.GetChangesRequest.fromPartial({ agentId });
      out.set(agentId, await this.client.call(this.client.stub.getChanges, request, options));
    }
    return out;
  }

  /**
   * Applies the isolated children's changes, in order: to the session's workspace on the
   * daemon's machine, or with `to` to a directory here (a checkout of the tree the batch forked
   * from; needs git). A child with a conflict stays unapplied, all of its files.
   */
  async apply(options: CallSignal & { to?: string } = {}): Promise<Applied[]> {
    if (options.to === undefined) {
      const request = pb.ApplyChangesRequest.fromPartial({ batchId: this.id });
      const reply = await this.client.call(this.client.stub.applyChanges, request, options);
      return reply.results.map((a) => ({ agentId: a.agentId, applied: a.applied, conflicts: a.conflicts }));
    }
    const results: Applied[] = [];
    for (const [, changes] of await this.changes(options)) results.push(applyTo(options.to, changes));
    return results;
  }
}

export class Agents {
  constructor(private readonly client: Client) {}

  async get(agentId: string, options: CallSignal = {}): Promise<Agent> {
    const reply = await this.client.call(
      this.client.stub.getAgent,
      pb.GetAgentRequest.fromPartial({ agentId }),
      options,
    );
    return new Agent(this.client, reply.agent!);
  }
}

/** An agent's state, as `agent.state` names it. */
export type AgentState = "pending" | "running" | "idle" | "completed" | "failed" | "killed" | "timed_out" | "unknown";

const STATE: Record<number, AgentState> = {
  [pb.AgentState.AGENT_STATE_PENDING]: "pending",
  [pb.AgentState.AGENT_STATE_RUNNING]: "running",
  [pb.AgentState.AGENT_STATE_COMPLETED]: "completed",
  [pb.AgentState.AGENT_STATE_FAILED]: "failed",
  [pb.AgentState.AGENT_STATE_KILLED]: "killed",
  [pb.AgentState.AGENT_STATE_IDLE]: "idle",
  [pb.AgentState.AGENT_STATE_TIMED_OUT]: "timed_out",
};

/**
 * One agent: stop it, hand it to the background, read its transcript and its hooks' runs. `info`
 * is the daemon's record as it was read (`client.agents.get` reads it again).
 */
export class Agent {
  readonly id: string;

  constructor(
    private readonly client: Client,
    readonly info: pb.Agent,
  ) {
    this.id = info.agentId;
  }

  /** Its state: `timed_out` when it ran past one of its limits. */
  get state(): AgentState {
    return STATE[this.info.state] ?? "unknown";
  }

  /** The limits it runs under (resolved when it was created); each one unset left out. */
  get limits(): Limits {
    const l = this.info.limits;
    const out: Limits = {};
    if (l?.timeoutMs) out.timeoutMs = l.timeoutMs;
    if (l?.idleTimeoutMs) out.idleTimeoutMs = l.idleTimeoutMs;
    if (l?.maxTurns) out.maxTurns = l.maxTurns;
    if (l?.maxOutputTokens) out.maxOutputTokens = l.maxOutputTokens;
    if (l?.timeoutExcludesThrottle !== undefined) out.timeoutExcludesThrottle = l.timeoutExcludesThrottle;
    return out;
  }

  /** When it first started (what its timeout counts from); `undefined` before. */
  get startedAt(): Date | undefined {
    return this.info.startedAt;
  }

  /**
   * The agent's messages from `since`, then live ones, then `ended` (its notification); resumed
   * at the next message across a daemon restart.
   */
  async *attach(options: CallSignal & { since?: number } = {}): AsyncGenerator<NonNullable<pb.AgentEvent["event"]>> {
    const open = (seq: number): ClientReadableStream<pb.AgentEvent> =>
      this.client.stub.attach(pb.AttachRequest.fromPartial({ agentId: this.id, sinceSeq: seq }), this.client.meta());
    const nextMessage = (e: pb.AgentEvent): number => (e.event?.$case === "message" ? e.event.value.seq + 1 : 0);
    const stream = follow(open, nextMessage, options.since ?? 0, this.client.reconnectForMs, { signal: options.signal });
    for await (const event of stream) {
      if (!event.event) continue;
      yield event.event;
      if (event.event.$case === "ended" || event.event.$case === "asyncLaunched") return;
    }
  }

  /** Stops the agent at once; it ends `killed` with its partial result. */
  async kill(options: CallSignal = {}): Promise<void> {
    await this.client.call(this.client.stub.kill, pb.KillRequest.fromPartial({ agentId: this.id }), options);
  }

  /** Hands the agent's attached clients to the background; the agent goes on. */
  async background(options: CallSignal = {}): Promise<string> {
    const reply = await this.client.call(
      this.client.stub.background,
      pb.BackgroundRequest.fromPartial({ agentId: this.id }),
      options,
    );
    return reply.status;
  }

  /** The agent's own messages (with `includeShared`, the inherited prefix too). */
  async transcript(options: CallSignal & { includeShared?: boolean } = {}): Promise<pb.TranscriptMessage[]> {
    const reply = await this.client.call(
      this.client.stub.getTranscript,
      pb.GetTranscriptRequest.fromPartial({ agentId: this.id, includeSharedPrefix: options.includeShared ?? false }),
      options,
    );
    return reply.messages;
  }

  /**
   * Each hook command's run for the agent (the operator's hooks and the session's own), in the
   * order they ended: what it was about, what it decided and said, when and how long.
   */
  async hookRuns(options: CallSignal = {}): Promise<HookRun[]> {
    const reply = await this.client.call(
      this.client.stub.getTranscript,
      pb.GetTranscriptRequest.fromPartial({ agentId: this.id }),
      options,
    );
    return reply.hookRuns.map(hookRunOf);
  }
}
