"""Where the daemon is and how to reach it: the address, token and CA as forkctl reads them
(`FORKD_ADDR`, `FORKD_TOKEN`, `FORKD_CA_CERT`, `FORKD_HOME`), and the channel built from them."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

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


def _options(target: Target) -> list[tuple[str, Any]]:
    options: list[tuple[str, Any]] = [
        ("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", _MAX_MESSAGE_BYTES),
    ]
    if target.target.startswith("unix:"):
        # A Unix socket has no host: the daemon is asked as `localhost`, as forkctl does.
        options.append(("grpc.default_authority", "localhost"))
    return options


def _credentials(tls_ca: str | Path | None) -> grpc.ChannelCredentials:
    roots = Path(tls_ca).read_bytes() if tls_ca else None
    return grpc.ssl_channel_credentials(root_certificates=roots)


def channel(target: Target, tls_ca: str | Path | None) -> grpc.Channel:
    """A channel to `target`: TLS against `tls_ca` (or the system's roots) for https."""
    if not target.secure:
        return grpc.insecure_channel(target.target, options=_options(target))
    return grpc.secure_channel(target.target, _credentials(tls_ca), options=_options(target))


def aio_channel(target: Target, tls_ca: str | Path | None) -> grpc.aio.Channel:
    """[`channel`] for the async client."""
    if not target.secure:
        return grpc.aio.insecure_channel(target.target, options=_options(target))
    return grpc.aio.secure_channel(target.target, _credentials(tls_ca), options=_options(target))


def resolve(
    addr: str | None, token: str | None, tls_ca: str | Path | None
) -> tuple[Target, str | None, str | Path | None]:
    """The address, token and CA given, else `FORKD_ADDR` (or `FORKD_HOME`'s socket),
    `FORKD_TOKEN` and `FORKD_CA_CERT`."""
    target = Target.parse(addr) if addr else Target.default()
    token = token if token is not None else os.environ.get("FORKD_TOKEN") or None
    tls_ca = tls_ca if tls_ca is not None else os.environ.get("FORKD_CA_CERT") or None
    return target, token, tls_ca


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


def metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """What goes with every call: `authorization: Bearer <token>` and the caller's
    `traceparent`."""
    out: list[tuple[str, str]] = []
    if token:
        out.append(("authorization", f"Bearer {token}"))
    trace = traceparent()
    if trace:
        out.append(("traceparent", trace))
    return tuple(out)
