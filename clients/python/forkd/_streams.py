"""Streams that outlive the daemon, and calls retried across its restart: what forkctl does
(docs/contracts.md, "Streams outlive the daemon"), for both clients."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import TypeVar

import grpc

from forkd.errors import Unavailable, code_of, details_of, from_rpc_error

T = TypeVar("T")

# How long a stream or a retried call keeps trying to reach the daemon again.
DEFAULT_RECONNECT_FOR = 600.0

_FIRST_BACKOFF = 0.1
_MAX_BACKOFF = 5.0

_TIMED_OUT = "the wait's timeout passed (the children go on)"


def is_lost(error: grpc.RpcError) -> bool:
    """Whether a failure is the connection's (the daemon went away), not the daemon's answer."""
    return code_of(error) == grpc.StatusCode.UNAVAILABLE


class Backoff:
    """The waits between tries, 0.1 s doubling to 5 s, until `window` seconds since the first
    loss of an outage."""

    def __init__(self, window: float) -> None:
        self.window = window
        self._since: float | None = None
        self._tries = 0

    def next(self, why: str) -> float:
        """How long to wait before the next try; `Unavailable` once the window is spent."""
        now = time.monotonic()
        if self._since is None:
            self._since = now
        delay: float = min(_FIRST_BACKOFF * 2.0**self._tries, _MAX_BACKOFF)
        if now + delay > self._since + self.window:
            raise Unavailable(
                f"lost the daemon ({why}) and could not reach it again for {self.window:g} s",
                grpc.StatusCode.UNAVAILABLE,
            )
        self._tries += 1
        return delay

    def heard(self) -> None:
        """Something new came: a later loss has the whole window again."""
        self._since = None
        self._tries = 0


class _Resume:
    """The bookkeeping of a resumed stream: the last seq read, and what a failure means."""

    def __init__(self, since: int, window: float, deadline: float | None) -> None:
        self.seq = since
        self.backoff = Backoff(window)
        self.deadline = deadline

    def read(self, seq: int) -> None:
        if seq > self.seq:
            self.seq = seq
            self.backoff.heard()

    def failed(self, error: grpc.RpcError) -> str:
        """Why the stream was lost; raises what is not a loss (the daemon's own answer, or
        the deadline)."""
        if code_of(error) == grpc.StatusCode.DEADLINE_EXCEEDED and self.deadline is not None:
            raise TimeoutError(_TIMED_OUT) from None
        if not is_lost(error):
            raise from_rpc_error(error) from None
        return details_of(error)

    def wait(self, why: str) -> float:
        if self.deadline is not None and time.monotonic() >= self.deadline:
            raise TimeoutError(_TIMED_OUT)
        return self.backoff.next(why)


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
            time.sleep(backoff.next(details_of(e)))


async def aretried(call: Callable[[], Awaitable[T]], window: float) -> T:
    """[`retried`] for the async client."""
    backoff = Backoff(window)
    while True:
        try:
            return await call()
        except grpc.RpcError as e:
            if not is_lost(e):
                raise from_rpc_error(e) from None
            await asyncio.sleep(backoff.next(details_of(e)))


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
    resume = _Resume(since, window, deadline)
    while True:
        try:
            for item in open_stream(resume.seq):
                resume.read(seq_of(item))
                yield item
            if ends:
                return
            why = "the daemon closed the stream"
        except grpc.RpcError as e:
            why = resume.failed(e)
        time.sleep(resume.wait(why))


async def afollow(
    open_stream: Callable[[int], AsyncIterator[T]],
    seq_of: Callable[[T], int],
    since: int,
    window: float,
    deadline: float | None = None,
    ends: bool = False,
) -> AsyncIterator[T]:
    """[`follow`] for the async client."""
    resume = _Resume(since, window, deadline)
    while True:
        try:
            async for item in open_stream(resume.seq):
                resume.read(seq_of(item))
                yield item
            if ends:
                return
            why = "the daemon closed the stream"
        except grpc.RpcError as e:
            why = resume.failed(e)
        await asyncio.sleep(resume.wait(why))


def remaining(deadline: float | None) -> float | None:
    """Seconds until `deadline`, for a call's `timeout=` (None: no deadline)."""
    if deadline is None:
        return None
    return max(deadline - time.monotonic(), 0.001)
