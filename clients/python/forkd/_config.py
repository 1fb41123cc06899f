"""Where the daemon is and how to reach it: the address, token and CA as forkctl reads them
(`FORKD_ADDR`, `FORKD_TOKEN`, `FORKD_CA_CERT`, `FORKD_HOME`), and the channel built from them."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import grpc

# Transcripts and replays can be large: as forkctl, 64 MiB each way.
_MAX_MESSAGE_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class Target:
    """A parsed address: the gRPC target, whether it is TLS, and the address as given."""

    target: str
    secure: bool
    given: str

    @staticmethod
    def parse(addr: str) -> Target:
        """`unix:/path`, `unix:///path`, `unix:relative`, `http://host:port`, `https://host:port`."""
        if addr.startswith("unix:"):
            rest = addr[len("unix:") :]
            if rest.startswith("//"):
                rest = rest[2:]
                if not rest.startswith("/"):
                    raise ValueError(f"invalid address {addr!r}: unix:// needs an absolute path")
            if not rest:
                raise ValueError(f"invalid address {addr!r}: the socket path is empty")
            return Target(f"unix:{rest}", secure=False, given=addr)
        for scheme, secure in (("http://", False), ("https://", True)):
            if addr.startswith(scheme):
                authority = addr[len(scheme) :].rstrip("/")
                if not authority:
                    raise ValueError(f"invalid address {addr!r}: the host is missing")
                return Target(authority, secure=secure, given=addr)
        raise ValueError(
            f"invalid address {addr!r}: expected unix:/path/forkd.sock, http://host:port "
            "or https://host:port"
        )

    @staticmethod
    def default() -> Target:
        """`FORKD_ADDR`, else the socket in `FORKD_HOME` (default `~/.forkd`)."""
        addr = os.environ.get("FORKD_ADDR")
        if addr:
            return Target.parse(addr)
        home = os.environ.get("FORKD_HOME") or str(Path.home() / ".forkd")
        return Target.parse(f"unix:{Path(home) / 'forkd.sock'}")


def channel(target: Target, tls_ca: str | Path | None) -> grpc.Channel:
    """A channel to `target`: TLS against `tls_ca` (or the system's roots) for https."""
    options: list[tuple[str, Any]] = [
        ("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", _MAX_MESSAGE_BYTES),
    ]
    if target.target.startswith("unix:"):
        # A Unix socket has no host: the daemon is asked as `localhost`, as forkctl does.
        options.append(("grpc.default_authority", "localhost"))
    if not target.secure:
        return grpc.insecure_channel(target.target, options=options)
    roots = Path(tls_ca).read_bytes() if tls_ca else None
    credentials = grpc.ssl_channel_credentials(root_certificates=roots)
    return grpc.secure_channel(target.target, credentials, options=options)


def traceparent() -> str | None:
    """The caller's W3C trace context: the current OpenTelemetry span's when `opentelemetry-api`
    is installed and one is active, else `TRACEPARENT` (as CI systems set it)."""
    try:
        from opentelemetry import propagate
    except ImportError:
        pass
    else:
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        if carrier.get("traceparent"):
            return carrier["traceparent"]
    value = os.environ.get("TRACEPARENT", "").strip()
    return value or None


class _Details(NamedTuple):
    method: str
    timeout: float | None
    metadata: list[tuple[str, str | bytes]] | None
    credentials: grpc.CallCredentials | None
    wait_for_ready: bool | None
    compression: grpc.Compression | None


class Metadata(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
):
    """Adds `authorization: Bearer <token>` and `traceparent` to every call."""

    def __init__(self, token: str | None) -> None:
        self._token = token

    def _with(self, details: grpc.ClientCallDetails) -> _Details:
        metadata = list(details.metadata or [])
        if self._token:
            metadata.append(("authorization", f"Bearer {self._token}"))
        trace = traceparent()
        if trace:
            metadata.append(("traceparent", trace))
        return _Details(
            details.method,
            details.timeout,
            metadata,
            details.credentials,
            getattr(details, "wait_for_ready", None),
            getattr(details, "compression", None),
        )

    def intercept_unary_unary(
        self, continuation: Callable[..., Any], details: grpc.ClientCallDetails, request: Any
    ) -> Any:
        return continuation(self._with(details), request)

    def intercept_unary_stream(
        self, continuation: Callable[..., Any], details: grpc.ClientCallDetails, request: Any
    ) -> Any:
        return continuation(self._with(details), request)

    def intercept_stream_unary(
        self,
        continuation: Callable[..., Any],
        details: grpc.ClientCallDetails,
        requests: Iterator[Any],
    ) -> Any:
        return continuation(self._with(details), requests)
