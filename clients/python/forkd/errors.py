"""forkd's errors by meaning: each gRPC status the daemon answers with is one class, its message
kept as the daemon wrote it."""

from __future__ import annotations

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

__all__ = [
    "FailedPrecondition",
    "ForkdError",
    "InvalidArgument",
    "NotFound",
    "PermissionDenied",
    "ResourceExhausted",
    "Unauthenticated",
    "Unavailable",
]


class ForkdError(Exception):
    """A call the daemon refused, or could not be reached for."""

    def __init__(self, message: str, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


class NotFound(ForkdError):
    """No such session, batch or agent (for this tenant)."""


class InvalidArgument(ForkdError):
    """The request was malformed: an empty directive list, a bad schema, an unknown setting."""


class PermissionDenied(ForkdError):
    """The token may not do this: another tenant's id, a path outside the tenant's roots."""


class Unauthenticated(ForkdError):
    """No token, or one the daemon does not know."""


class ResourceExhausted(ForkdError):
    """A quota or limit was reached; `retry_after` (seconds) says when to ask again, when known."""

    def __init__(
        self,
        message: str,
        code: grpc.StatusCode | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message, code)
        self.retry_after = retry_after


class Unavailable(ForkdError):
    """The daemon could not be reached, or went away and did not come back in time."""


class FailedPrecondition(ForkdError):
    """The request does not fit the state: a session still running a turn, a reused key."""


_BY_CODE: dict[grpc.StatusCode, type[ForkdError]] = {
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
}


def code_of(error: grpc.RpcError) -> grpc.StatusCode | None:
    """A failed call's status code (the sync client's errors are `grpc.Call`s, the async
    client's `grpc.aio.AioRpcError`s: both have `code()`)."""
    code = getattr(error, "code", None)
    return code() if callable(code) else None


def details_of(error: grpc.RpcError) -> str:
    """A failed call's message, as the daemon wrote it."""
    details = getattr(error, "details", None)
    return (details() if callable(details) else None) or str(error)


def from_rpc_error(error: grpc.RpcError) -> ForkdError:
    """The error class for a failed call, with the daemon's message."""
    code = code_of(error)
    message = details_of(error)
    cls = _BY_CODE.get(code, ForkdError) if code is not None else ForkdError
    if cls is ResourceExhausted:
        return ResourceExhausted(message, code, _retry_after(error))
    return cls(message, code)


def _retry_after(error: grpc.RpcError) -> float | None:
    """`google.rpc.RetryInfo`'s delay from the status details, if the daemon sent it."""
    if code_of(error) is None:
        return None
    status = rpc_status.from_call(error)  # type: ignore[arg-type]
    if status is None:
        return None
    for detail in status.details:
        if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            info = error_details_pb2.RetryInfo()
            detail.Unpack(info)
            return float(info.retry_delay.ToTimedelta().total_seconds())
    return None
