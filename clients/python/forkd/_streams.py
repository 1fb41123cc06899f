"""Streams that outlive the daemon, and calls retried across its restart: what forkctl does
(docs/contracts.md, "Streams outlive the daemon"), for the Python client."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import grpc

from forkd.errors import Unavailable, from_rpc_error

T = TypeVar("T")

# How long a stream or a retried call keeps trying to reach the daemon again.
DEFAULT_RECONNECT_FOR = 600.0

_FIRST_BACKOFF = 0.1
_MAX_BACKOFF = 5.0


def is_lost(error: grpc.RpcError) -> bool:
    """Whether a failure is the connection's (the daemon went away), not the daemon's answer."""
    return isinstance(error, grpc.Call) and error.code() == grpc.StatusCode.UNAVAILABLE


class Backoff:
    """Waits between tries, 0.1 s doubling to 5 s, until `window` seconds since the first loss."""

    def __init__(self, window: float) -> None:
        self.window = window
        self._since: float | None = None
        self._tries = 0

    def wait(self, why: str) -> None:
        """Sleeps before the next try, or raises `Unavailable` once the window is spent."""
        now = time.monotonic()
        if self._since is None:
            self._since = now
        delay = min(_FIRST_BACKOFF * 2**self._tries, _MAX_BACKOFF)
        if now + delay > self._since + self.window:
            raise Unavailable(
                f"lost the daemon ({why}) and could not reach it again for {self.window:g} s",
                grpc.StatusCode.UNAVAILABLE,
            )
        self._tries += 1
        time.sleep(delay)

    def heard(self) -> None:
        """Something new came: a later loss has the whole window again."""
        self._since = None
        self._tries = 0


def retried(call: Callable[[], T], window: float) -> T:
    """`call()`, sent again while the daemon is unavailable (for calls with an idempotency key,
    which never create or store anything twice)."""
    backoff = Backoff(window)
    while True:
        try:
            return call()
        except grpc.RpcError as e:
            if not is_lost(e):
                raise from_rpc_error(e) from None
            backoff.wait(e.details() if isinstance(e, grpc.Call) else str(e))


def follow(
    open_stream: Callable[[int], Iterator[T]],
    seq_of: Callable[[T], int],
    since: int,
    window: float,
    deadline: float | None = None,
    ends: bool = False,
) -> Iterator[T]:
    """The items of `open_stream(since)`, opened again after the last `seq` read whenever the
    connection is lost or the daemon ends the stream (unless `ends`: a stream that ends when it
    is done). `deadline` (a `time.monotonic()` instant) raises `TimeoutError` when passed."""
    backoff = Backoff(window)
    seq = since
    while True:
        try:
            for item in open_stream(seq):
                s = seq_of(item)
                if s > seq:
                    seq = s
                    backoff.heard()
                yield item
            if ends:
                return
            why = "the daemon closed the stream"
        except grpc.RpcError as e:
            code = e.code() if isinstance(e, grpc.Call) else None
            if code == grpc.StatusCode.DEADLINE_EXCEEDED and deadline is not None:
                raise TimeoutError("the wait's timeout passed (the children go on)") from None
            if not is_lost(e):
                raise from_rpc_error(e) from None
            why = e.details() if isinstance(e, grpc.Call) else str(e)
        if deadline is not None and time.monotonic() >= deadline:
            raise TimeoutError("the wait's timeout passed (the children go on)")
        backoff.wait(why)


def remaining(deadline: float | None) -> float | None:
    """Seconds until `deadline`, for a call's `timeout=` (None: no deadline)."""
    if deadline is None:
        return None
    return max(deadline - time.monotonic(), 0.001)
