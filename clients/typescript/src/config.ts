// Where the daemon is and how to reach it: the address, token and CA as forkctl reads them
// (FORKD_ADDR, FORKD_TOKEN, FORKD_CA_CERT, FORKD_HOME), and what goes with every call.

import { readFileSync } from "node:fs";
import { homedir } from "node:os";
import { join } from "node:path";

import { type ChannelCredentials, type ChannelOptions, Metadata, credentials } from "@grpc/grpc-js";

/** A parsed address: the gRPC target and whether it is TLS. */
export interface Target {
  target: string;
  secure: boolean;
  given: string;
}

/** `unix:/path`, `unix:///path`, `unix:relative`, `http://host:port`, `https://host:port`. */
export function parseAddr(addr: string): Target {
  if (addr.startsWith("unix:")) {
    let path = addr.slice("unix:".length);
    if (path.startsWith("//")) {
      path = path.slice(2);
      if (!path.startsWith("/")) {
        throw new TypeError(`invalid address ${addr}: unix:// needs an absolute path`);
      }
    }
    if (!path) throw new TypeError(`invalid address ${addr}: the socket path is empty`);
    return { target: `unix:${path}`, secure: false, given: addr };
  }
  for (const [scheme, secure] of [
    ["http://", false],
    ["https://", true],
  ] as const) {
    if (addr.startsWith(scheme)) {
      const authority = addr.slice(scheme.length).replace(/\/+$/, "");
      if (!authority) throw new TypeError(`invalid address ${addr}: the host is missing`);
      return { target: authority, secure, given: addr };
    }
  }
  throw new TypeError(
    `invalid address ${addr}: expected unix:/path/forkd.sock, http://host:port or https://host:port`,
  );
}

/** `FORKD_ADDR`, else the socket in `FORKD_HOME` (default `~/.forkd`). */
export function defaultAddr(env: NodeJS.ProcessEnv = process.env): Target {
  if (env.FORKD_ADDR) return parseAddr(env.FORKD_ADDR);
  const home = env.FORKD_HOME || join(homedir(), ".forkd");
  return parseAddr(`unix:${join(home, "forkd.sock")}`);
}

/** The channel's credentials and options for `target`. */
export function channel(
  target: Target,
  tlsCa: string | Buffer | undefined,
): { credentials: ChannelCredentials; options: ChannelOptions } {
  const options: ChannelOptions = {
    // Transcripts and replays can be large: as forkctl, 64 MiB each way.
    "grpc.max_receive_message_length": 64 * 1024 * 1024,
    "grpc.max_send_message_length": 64 * 1024 * 1024,
  };
  // A Unix socket has no host: the daemon is asked as `localhost`, as forkctl does.
  if (target.target.startsWith("unix:")) options["grpc.default_authority"] = "localhost";
  if (!target.secure) return { credentials: credentials.createInsecure(), options };
  const roots = typeof tlsCa === "string" ? readFileSync(tlsCa) : tlsCa;
  return { credentials: credentials.createSsl(roots ?? null), options };
}

/** What this client uses of `@opentelemetry/api`, when it is installed. */
interface OtelApi {
  context: { active(): unknown };
  propagation: { inject(context: unknown, carrier: Record<string, string>): void };
}

/** What this client uses of zod 4, when it is installed. */
export interface ZodApi {
  toJSONSchema(schema: unknown): unknown;
}

// Optional peers, loaded once if present (named through a variable, so that neither is needed
// to build this package).
const optional = async <T>(name: string): Promise<T | undefined> => {
  try {
    return (await import(name)) as T;
  } catch {
    return undefined;
  }
};
const otel = await optional<OtelApi>("@opentelemetry/api");
export const zod = await optional<ZodApi>("zod");

/**
 * The caller's W3C trace context: the active OpenTelemetry context's when `@opentelemetry/api`
 * is installed and a span is active, else `TRACEPARENT` (as CI systems set it).
 */
export function traceparent(env: NodeJS.ProcessEnv = process.env): string | undefined {
  if (otel) {
    const carrier: Record<string, string> = {};
    otel.propagation.inject(otel.context.active(), carrier);
    if (carrier.traceparent) return carrier.traceparent;
  }
  const value = env.TRACEPARENT?.trim();
  return value || undefined;
}

/** `authorization: Bearer <token>` and `traceparent`, for one call. */
export function metadata(token: string | undefined): Metadata {
  const md = new Metadata();
  if (token) md.set("authorization", `Bearer ${token}`);
  const trace = traceparent();
  if (trace) md.set("traceparent", trace);
  return md;
}
