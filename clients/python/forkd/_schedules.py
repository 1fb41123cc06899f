"""Schedules: a tenant's batches on a clock (docs/operations.md, "Webhooks and schedules"). Each
firing creates a session of its own and forks a batch on it, both from the spec the schedule
keeps. What the daemon answers about them, as plain typed values, and the requests both clients
send."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from google.protobuf import timestamp_pb2

from forkd import _requests, _webhooks
from forkd._proto.forkd.v1 import forkd_pb2 as pb
from forkd._requests import ContextItem, Directive
from forkd._types import Limits
from forkd._webhooks import WebhookRef


def _time(t: timestamp_pb2.Timestamp) -> dt.datetime:
    return t.ToDatetime(tzinfo=dt.timezone.utc)


class SessionSpec(TypedDict, total=False):
    """The session each firing creates: `sessions.create`'s keyword arguments (but the
    idempotency key, which each firing's is, and `hooks`: a schedule's session cannot bring its
    own, the operator's run for it). `upload` (a directory here) is uploaded once, when the
    schedule is created; every firing's session starts from that upload."""

    system: str
    context: Sequence[ContextItem]
    workspace: str | Path
    upload: str | Path
    upload_id: str
    model: str
    permission_mode: str
    sandbox: str
    allow: Sequence[str]
    deny: Sequence[str]
    capacity_tool: bool


_SESSION_KEYS = frozenset(SessionSpec.__annotations__)


@dataclass(frozen=True)
class ScheduleFiring:
    """One firing: `fire_time` when it was due (a trigger's: when it was asked), `state`
    `firing` (its batch being created), `fired`, `skipped` or `failed`, `manual` for a trigger's.
    `session_id` and `batch_id` are what it created (`None` before, or when it created none),
    `reason` why it was skipped or failed. `children`, `completed`, `failed` and `cost_usd`: its
    batch's children and how many ended each way so far (`get_schedule` only)."""

    fire_time: dt.datetime | None
    state: str
    manual: bool = False
    session_id: str | None = None
    batch_id: str | None = None
    reason: str | None = None
    children: int = 0
    completed: int = 0
    failed: int = 0
    cost_usd: float = 0.0

    @staticmethod
    def of(f: pb.ScheduleFiring) -> ScheduleFiring:
        return ScheduleFiring(
            _time(f.fire_time) if f.HasField("fire_time") else None,
            f.state,
            f.manual,
            f.session_id or None,
            f.batch_id or None,
            f.reason or None,
            f.children,
            f.completed,
            f.failed,
            f.cost_usd,
        )


@dataclass(frozen=True)
class Schedule:
    """A schedule: its `cron` expression read in `timezone` (IANA; `UTC` by default), `overlap`
    (`skip`: a firing while the previous firing's batch runs is recorded as skipped; `allow`),
    `catch_up` (`once`: after downtime the latest missed firing runs once; `none`), whether it is
    `paused`, how many `directives` each firing's batch has and the webhook it names
    (`webhook_id`, `None` for none). `next_fires` (up to 5, none while paused) and `firings`
    (the latest, newest first) come with `get_schedule` and the calls that change it, not with
    `list_schedules`."""

    name: str
    cron: str
    timezone: str
    overlap: str
    catch_up: str
    paused: bool = False
    created_at: dt.datetime | None = None
    directives: int = 0
    webhook_id: str | None = None
    next_fires: list[dt.datetime] = field(default_factory=list)
    firings: list[ScheduleFiring] = field(default_factory=list)

    @staticmethod
    def of(s: pb.Schedule) -> Schedule:
        return Schedule(
            s.name,
            s.cron,
            s.timezone,
            s.overlap,
            s.catch_up,
            s.paused,
            _time(s.created_at) if s.HasField("created_at") else None,
            s.directives,
            s.webhook_id or None,
            [_time(t) for t in s.next_fires],
            [ScheduleFiring.of(f) for f in s.firings],
        )


def session_spec(session: SessionSpec | None) -> tuple[pb.CreateSessionRequest, Path | None]:
    """The session each firing creates, with no idempotency key (each firing's is its own), and
    the directory to upload first (`upload=`), if any: the caller uploads it and sets
    `upload_id`."""
    args: dict[str, Any] = dict(session or {})
    unknown = sorted(set(args) - _SESSION_KEYS)
    if unknown:
        known = ", ".join(sorted(_SESSION_KEYS))
        raise TypeError(f"session has no {', '.join(unknown)}: it takes {known}")
    upload = args.get("upload")
    if upload is not None and (args.get("workspace") is not None or args.get("upload_id")):
        raise ValueError("session's upload is exclusive with its workspace and upload_id")
    request = _requests.create_session(
        args.get("system", ""),
        args.get("context", ()),
        args.get("workspace"),
        args.get("upload_id"),
        args.get("model", ""),
        args.get("permission_mode", ""),
        args.get("sandbox", ""),
        args.get("allow", ()),
        args.get("deny", ()),
        args.get("capacity_tool", False),
        None,
    )
    request.idempotency_key = ""
    return request, Path(upload) if upload is not None else None


def batch_spec(
    directives: Iterable[Directive],
    isolation: str,
    output_schema: dict[str, Any] | None,
    output_model: Any,
    budget_usd: float,
    budget_tokens: int,
    warmup_gating: bool | None,
    limits: Limits,
    webhook: WebhookRef | None,
) -> pb.ForkBatchRequest:
    """The batch each firing forks, as `fork` builds it, with no session id nor idempotency key
    (each firing's are its own)."""
    if isinstance(directives, str):
        raise TypeError(f"directives is a list of directives, not a string: [{directives!r}]")
    request = _requests.fork(
        "",
        directives,
        isolation,
        output_schema,
        output_model,
        budget_usd,
        budget_tokens,
        None,
        warmup_gating,
        None,
        limits,
        webhook_id=_webhooks.webhook_id(webhook),
    )
    request.idempotency_key = ""
    return request


def _option(name: str, value: str | None) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise TypeError(f"{name} is a string, not {type(value).__name__}")
    return value


def create(
    name: str,
    cron: str,
    timezone: str | None,
    overlap: str | None,
    catch_up: str | None,
    session: pb.CreateSessionRequest,
    batch: pb.ForkBatchRequest,
) -> pb.CreateScheduleRequest:
    return pb.CreateScheduleRequest(
        name=name,
        cron=_option("cron", cron),
        timezone=_option("timezone", timezone),
        overlap=_option("overlap", overlap),
        catch_up=_option("catch_up", catch_up),
        spec=pb.ScheduleSpec(session=session, batch=batch),
    )


def named(name: str) -> pb.ScheduleNameRequest:
    if not isinstance(name, str):
        raise TypeError(f"a schedule's name is a string, not {type(name).__name__}")
    return pb.ScheduleNameRequest(name=name)
