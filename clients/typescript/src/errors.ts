// forkd's errors by meaning: each gRPC status the daemon answers with is one class, its message
// kept as the daemon wrote it.

import { type ServiceError, status } from "@grpc/grpc-js";

import { RetryInfo } from "./gen/google/rpc/error_details.js";
import { Status } from "./gen/google/rpc/status.js";

/** A call the daemon refused, or could not be reached for. */
export class ForkdError extends Error {
  /** The gRPC status code (`@grpc/grpc-js`'s `status`), when there is one. */
  readonly code: number | undefined;

  constructor(message: string, code?: number) {
    super(message);
    this.name = new.target.name;
    this.code = code;
  }
}

/** No such session, batch or agent (for this tenant). */
export class NotFound extends ForkdError {}
/** A malformed request: no directives, a schema that is not one. */
export class InvalidArgument extends ForkdError {}
/** The token may not do this: another tenant's id, a path outside the tenant's roots. */
export class PermissionDenied extends ForkdError {}
/** No token, or one the daemon does not know. */
export class Unauthenticated extends ForkdError {}
/** The daemon could not be reached, or went away for longer than `reconnectForMs`. */
export class Unavailable extends ForkdError {}
/** The state forbids it: a turn already running, a key reused with other parameters. */
export class FailedPrecondition extends ForkdError {}

/** A quota or limit was reached; `retryAfterMs` says when to ask again, when the daemon said. */
export class ResourceExhausted extends ForkdError {
  readonly retryAfterMs: number | undefined;

  constructor(message: string, code?: number, retryAfterMs?: number) {
    super(message, code);
    this.retryAfterMs = retryAfterMs;
  }
}

const BY_CODE: Record<number, new (message: string, code?: number) => ForkdError> = {
  [status.NOT_FOUND]: NotFound,
  [status.INVALID_ARGUMENT]: InvalidArgument,
  [status.PERMISSION_DENIED]: PermissionDenied,
  [status.UNAUTHENTICATED]: Unauthenticated,
  [status.UNAVAILABLE]: Unavailable,
  [status.FAILED_PRECONDITION]: FailedPrecondition,
};

/** Whether `e` is a failed gRPC call (rather than a bug of ours). */
export function isServiceError(e: unknown): e is ServiceError {
  return e instanceof Error && typeof (e as Partial<ServiceError>).code === "number";
}

/** The error class for a failed call, with the daemon's message. */
export function fromServiceError(e: unknown): Error {
  if (!isServiceError(e)) return e instanceof Error ? e : new Error(String(e));
  const message = e.details || e.message;
  if (e.code === status.RESOURCE_EXHAUSTED) {
    return new ResourceExhausted(message, e.code, retryAfterMs(e));
  }
  const Class = BY_CODE[e.code] ?? ForkdError;
  return new Class(message, e.code);
}

/** `google.rpc.RetryInfo`'s delay from the status details, when the daemon sent one. */
function retryAfterMs(e: ServiceError): number | undefined {
  const raw = e.metadata?.get("grpc-status-details-bin")[0];
  if (!(raw instanceof Buffer)) return undefined;
  for (const detail of Status.decode(raw).details) {
    if (detail.typeUrl !== "type.googleapis.com/google.rpc.RetryInfo") continue;
    const delay = RetryInfo.decode(detail.value).retryDelay;
    return delay ? delay.seconds * 1000 + Math.round(delay.nanos / 1e6) : 0;
  }
  return undefined;
}
