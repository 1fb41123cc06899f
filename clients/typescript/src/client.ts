// The client: sessions, fork batches, agents and notifications, with the Python client's names
// where the languages allow.

import { randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";

import type { CallOptions, ClientReadableStream, ClientUnaryCall, Metadata, ServiceError } from "@grpc/grpc-js";

import { channel, defaultAddr, metadata, parseAddr } from "./config.js";
import { fromServiceError } from "./errors.js";
import * as pb from "./gen/forkd/v1/forkd.js";
import { DEFAULT_RECONNECT_FOR_MS, follow, retried } from "./streams.js";

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

export type Status = "completed" | "failed" | "killed" | "unknown";

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
}

const STATUS: Record<number, Status> = {
  [pb.NotificationStatus.NOTIFICATION_STATUS_COMPLETED]: "completed",
  [pb.NotificationStatus.NOTIFICATION_STATUS_FAILED]: "failed",
  [pb.NotificationStatus.NOTIFICATION_STATUS_KILLED]: "killed",
};

function notificationOf(n: pb.Notification): TaskNotification {
  const r = n.report;
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
      structured: r?.structuredJson ? JSON.parse(r.structuredJson) : undefined,
    },
    usage: n.usage,
    costUsd: n.costUsd,
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
/** A child's directive: its prompt (described by its first line), or `[description, prompt]`. */
export type Directive = string | [string, string];

export interface CreateSessionOptions extends CallSignal {
  system?: string;
  context?: ContextItem[];
  workspace?: string;
  uploadId?: string;
  model?: string;
  permissionMode?: string;
  sandbox?: string;
  allow?: string[];
  deny?: string[];
  idempotencyKey?: string;
}

export class Sessions {
  constructor(private readonly client: Client) {}

  /** A new parent session; retried across a daemon restart under one idempotency key. */
  async create(options: CreateSessionOptions = {}): Promise<Session> {
    const request = pb.CreateSessionRequest.fromPartial({
      systemPrompt: options.system ?? "",
      contextFiles: (options.context ?? []).map((item) =>
        typeof item === "string"
          ? { path: item, content: readFileSync(item, "utf8") }
          : { path: item[0], content: item[1] },
      ),
      workspace: options.workspace ?? "",
      uploadId: options.uploadId ?? "",
      model: options.model ?? "",
      permissionMode: options.permissionMode ?? "",
      sandbox: options.sandbox ?? "",
      allowRules: options.allow ?? [],
      denyRules: options.deny ?? [],
      idempotencyKey: options.idempotencyKey ?? randomUUID(),
    });
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

export interface ForkOptions extends CallSignal {
  isolation?: "copy" | "none";
  /** A JSON Schema object: each child ends with a JSON object valid against it (`report.structured`). */
  outputSchema?: object;
  budgetUsd?: number;
  budgetTokens?: number;
  atTurn?: number;
  warmupGating?: boolean;
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

  /** Forks one child per directive; they inherit the session's context. */
  async fork(directives: Directive[], options: ForkOptions = {}): Promise<Batch> {
    const request = pb.ForkBatchRequest.fromPartial({
      sessionId: this.id,
      directives: directives.map((d) =>
        typeof d === "string"
          ? { description: (d.split("\n")[0] ?? "").slice(0, 80), prompt: d }
          : { description: d[0], prompt: d[1] },
      ),
      isolation: options.isolation ?? "",
      outputSchema: options.outputSchema ? JSON.stringify(options.outputSchema) : "",
      budgetUsd: options.budgetUsd ?? 0,
      budgetTokens: options.budgetTokens ?? 0,
      atTurn: options.atTurn,
      warmupGating: options.warmupGating,
      idempotencyKey: options.idempotencyKey ?? randomUUID(),
    });
    const reply = await this.client.call(this.client.stub.forkBatch, request, {
      idempotent: true,
      signal: options.signal,
    });
    return new Batch(this.client, reply.batchId, reply.agentIds);
  }

  /** Runs one parent turn on `text`: its events as they come, the last `turnEnded`. */
  async *send(
    text: string,
    options: CallSignal & { idempotencyKey?: string } = {},
  ): AsyncGenerator<NonNullable<pb.SessionEvent["event"]>> {
    const request = pb.SendMessageRequest.fromPartial({
      sessionId: this.id,
      text,
      idempotencyKey: options.idempotencyKey ?? randomUUID(),
    });
    const call = this.client.stub.sendMessage(request, this.client.meta());
    options.signal?.addEventListener("abort", () => call.cancel(), { once: true });
    try {
      for await (const event of call as AsyncIterable<pb.SessionEvent>) {
        if (event.event) yield event.event;
      }
    } catch (e) {
      throw options.signal?.aborted ? options.signal.reason : fromServiceError(e);
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
}

/** A fork batch: its children's ids and their notifications. */
export class Batch {
  constructor(
    private readonly client: Client,
    readonly id: string,
    readonly agentIds: string[],
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
      yield notificationOf(n);
      if (waiting.size === 0) return;
    }
  }

  /** Every child's notification, in the order they ended. */
  async wait(options: CallSignal = {}): Promise<TaskNotification[]> {
    const done: TaskNotification[] = [];
    for await (const n of this.notifications(options)) done.push(n);
    return done;
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

/** One agent: stop it, hand it to the background, read its transcript. */
export class Agent {
  readonly id: string;

  constructor(
    private readonly client: Client,
    readonly info: pb.Agent,
  ) {
    this.id = info.agentId;
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
}
