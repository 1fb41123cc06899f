// Streams that outlive the daemon, and calls retried across its restart: what forkctl and the
// Python client do (docs/contracts.md, "Streams outlive the daemon").

import { type ClientReadableStream, status } from "@grpc/grpc-js";

import { Unavailable, fromServiceError, isServiceError } from "./errors.js";

/** How long streams and retried calls keep trying to reach the daemon again, by default. */
export const DEFAULT_RECONNECT_FOR_MS = 600_000;

const FIRST_BACKOFF_MS = 100;
const MAX_BACKOFF_MS = 5_000;

/** Whether a failure is the connection's (the daemon went away), not the daemon's answer. */
export function isLost(e: unknown): boolean {
  return isServiceError(e) && e.code === status.UNAVAILABLE;
}

/** The waits between tries, 0.1 s doubling to 5 s, until `windowMs` since an outage began. */
export class Backoff {
  private since: number | undefined;
  private tries = 0;

  constructor(private readonly windowMs: number) {}

  /** How long to wait before the next try; `Unavailable` once the window is spent. */
  next(why: string): number {
    const now = Date.now();
    this.since ??= now;
    const delay = Math.min(FIRST_BACKOFF_MS * 2 ** this.tries, MAX_BACKOFF_MS);
    if (now + delay > this.since + this.windowMs) {
      throw new Unavailable(
        `lost the daemon (${why}) and could not reach it again for ${this.windowMs / 1000} s`,
        status.UNAVAILABLE,
      );
    }
    this.tries += 1;
    return delay;
  }

  /** Something new came: a later loss has the whole window again. */
  heard(): void {
    this.since = undefined;
    this.tries = 0;
  }
}

/** Sleeps `ms`, or throws the signal's reason when it aborts first. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    const onAbort = (): void => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/** `call()`, sent again while the daemon is unavailable (calls with an idempotency key). */
export async function retried<T>(
  call: () => Promise<T>,
  windowMs: number,
  signal?: AbortSignal,
): Promise<T> {
  const backoff = new Backoff(windowMs);
  for (;;) {
    try {
      return await call();
    } catch (e) {
      if (signal?.aborted) throw signal.reason;
      if (!isLost(e)) throw fromServiceError(e);
      await sleep(backoff.next(isServiceError(e) ? e.details : String(e)), signal);
    }
  }
}

export interface FollowOptions {
  /** A stream that ends when it is done (`follow: false`): not opened again when it ends. */
  ends?: boolean;
  signal?: AbortSignal | undefined;
}

/**
 * The items of `open(since)`, opened again after the last `seq` read whenever the connection is
 * lost or the daemon ends the stream. An aborted `signal` cancels the call and throws its reason.
 */
export async function* follow<T>(
  open: (seq: number) => ClientReadableStream<T>,
  seqOf: (item: T) => number,
  since: number,
  windowMs: number,
  options: FollowOptions = {},
): AsyncGenerator<T> {
  const { ends = false, signal } = options;
  const backoff = new Backoff(windowMs);
  let seq = since;
  for (;;) {
    if (signal?.aborted) throw signal.reason;
    const call = open(seq);
    const cancel = (): void => call.cancel();
    signal?.addEventListener("abort", cancel, { once: true });
    let why: string;
    try {
      for await (const item of call as AsyncIterable<T>) {
        const s = seqOf(item);
        if (s > seq) {
          seq = s;
          backoff.heard();
        }
        yield item;
      }
      if (ends) return;
      why = "the daemon closed the stream";
    } catch (e) {
      if (signal?.aborted) throw signal.reason;
      if (!isLost(e)) throw fromServiceError(e);
      why = isServiceError(e) ? e.details : String(e);
    } finally {
      signal?.removeEventListener("abort", cancel);
      call.cancel();
    }
    await sleep(backoff.next(why), signal);
  }
}
