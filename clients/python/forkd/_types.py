"""What the daemon answers, as plain typed values (the generated messages stay inside)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from forkd._proto.forkd.v1 import forkd_pb2 as pb

_STATUS = {
    pb.NOTIFICATION_STATUS_COMPLETED: "completed",
    pb.NOTIFICATION_STATUS_FAILED: "failed",
    pb.NOTIFICATION_STATUS_KILLED: "killed",
    pb.NOTIFICATION_STATUS_TIMED_OUT: "timed_out",
}

_STATE = {
    pb.AGENT_STATE_PENDING: "pending",
    pb.AGENT_STATE_RUNNING: "running",
    pb.AGENT_STATE_COMPLETED: "completed",
    pb.AGENT_STATE_FAILED: "failed",
    pb.AGENT_STATE_KILLED: "killed",
    pb.AGENT_STATE_IDLE: "idle",
    pb.AGENT_STATE_TIMED_OUT: "timed_out",
}

_U32 = 2**32 - 1
_U64 = 2**64 - 1


def _milliseconds(name: str, value: float | timedelta) -> int:
    """A duration given in seconds (or as a `timedelta`), in whole milliseconds; refused unless
    it is at least one."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise TypeError(f"{name} is seconds or a timedelta, not {type(value).__name__}")
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"{name} must be positive, not {value!r} (leave it out for no limit here)")
    ms = round(seconds * 1000)
    if ms < 1:
        raise ValueError(f"{name} must be at least a millisecond, not {value!r}")
    if ms > _U64:
        raise ValueError(f"{name} is too long: {value!r}")
    return ms


def _count(name: str, value: int, most: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} is a whole number, not {type(value).__name__}")
    if value <= 0:
        raise ValueError(f"{name} must be positive, not {value!r} (leave it out for no limit here)")
    if value > most:
        raise ValueError(f"{name} is too large: {value!r} (at most {most})")
    return value


@dataclass(frozen=True)
class Usage:
    input_tokens: int = 0
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0
    output_tokens: int = 0

    @staticmethod
    def of(u: pb.Usage) -> Usage:
        return Usage(
            u.input_tokens,
            u.cache_creation_input_tokens,
            u.cache_read_input_tokens,
            u.output_tokens,
        )


@dataclass(frozen=True)
class Limits:
    """Limits on an agent's run: past one it ends `timed_out`, with a partial report whose
    `issues` names the limit. `timeout` (wall time from its first start) and `idle_timeout` (no
    output token and no tool call for that long) are seconds or a `timedelta`; `max_turns` caps
    its model requests, `max_output_tokens` its output tokens; `timeout_excludes_throttle` leaves
    the time spent waiting on the provider's rate limits out of `timeout`. Each one left `None`
    is the next layer's: a child's own, its batch's, the tenant's default, the daemon's. A value
    that is not positive raises `ValueError` here, before anything is sent.

    Read back from the daemon (`AgentInfo.limits`), the durations are seconds (floats)."""

    timeout: float | timedelta | None = None
    idle_timeout: float | timedelta | None = None
    max_turns: int | None = None
    max_output_tokens: int | None = None
    timeout_excludes_throttle: bool | None = None

    def __post_init__(self) -> None:
        throttle = self.timeout_excludes_throttle
        if throttle is not None and not isinstance(throttle, bool):
            raise TypeError(f"timeout_excludes_throttle is a bool, not {type(throttle).__name__}")
        self.to_proto()

    def __bool__(self) -> bool:
        """Whether any limit is set."""
        return any(
            v is not None
            for v in (
                self.timeout,
                self.idle_timeout,
                self.max_turns,
                self.max_output_tokens,
                self.timeout_excludes_throttle,
            )
        )

    def to_proto(self) -> pb.Limits:
        """The wire's `Limits` (validated: `ValueError` or `TypeError` for a bad value)."""
        out = pb.Limits()
        if self.timeout is not None:
            out.timeout_ms = _milliseconds("timeout", self.timeout)
        if self.idle_timeout is not None:
            out.idle_timeout_ms = _milliseconds("idle_timeout", self.idle_timeout)
        if self.max_turns is not None:
            out.max_turns = _count("max_turns", self.max_turns, _U32)
        if self.max_output_tokens is not None:
            out.max_output_tokens = _count("max_output_tokens", self.max_output_tokens, _U64)
        if self.timeout_excludes_throttle is not None:
            out.timeout_excludes_throttle = self.timeout_excludes_throttle
        return out

    @staticmethod
    def of(lim: pb.Limits) -> Limits:
        """What the daemon sent: 0 (unset) as `None`, durations in seconds."""
        return Limits(
            lim.timeout_ms / 1000 if lim.timeout_ms else None,
            lim.idle_timeout_ms / 1000 if lim.idle_timeout_ms else None,
            lim.max_turns or None,
            lim.max_output_tokens or None,
            lim.timeout_excludes_throttle if lim.HasField("timeout_excludes_throttle") else None,
        )


@dataclass(frozen=True)
class Report:
    """A child's report: the five fields, and with an output schema the JSON object it ended with
    (`structured`: a dict, or an instance of the fork's `output_model`)."""

    scope: str = ""
    result: str = ""
    key_files: list[str] = field(default_factory=list)
    files_changed: list[str] = field(default_factory=list)
    issues: str = ""
    structured: Any = None

    @staticmethod
    def of(r: pb.Report, model: Any = None) -> Report:
        structured: Any = json.loads(r.structured_json) if r.structured_json else None
        if structured is not None and model is not None:
            structured = model.model_validate(structured)
        return Report(
            r.scope,
            r.result,
            list(r.key_files),
            list(r.files_changed),
            r.issues,
            structured,
        )


@dataclass(frozen=True)
class Notification:
    """A child's task notification: how it ended (`status`: `completed`, or a failure:
    `failed`, `killed`, `timed_out`), its report, usage and cost. A `timed_out` child's report
    is partial, and its `issues` names the limit it ran past."""

    seq: int
    session_id: str
    batch_id: str
    agent_id: str
    kind: str
    status: str
    summary: str
    report: Report
    usage: Usage
    cost_usd: float
    # The schedule whose firing forked the batch, if one did.
    schedule: str | None = None

    @staticmethod
    def of(n: pb.Notification, model: Any = None) -> Notification:
        return Notification(
            n.seq,
            n.session_id,
            n.batch_id,
            n.agent_id,
            n.kind,
            _STATUS.get(n.status, "unknown"),
            n.summary,
            Report.of(n.report, model),
            Usage.of(n.usage),
            n.cost_usd,
            n.schedule or None,
        )


@dataclass(frozen=True)
class AgentInfo:
    """An agent as `GetAgent` tells it: `state` is `pending`, `running`, `idle`, `completed`,
    `failed`, `killed` or `timed_out`; `limits` what it runs under (resolved when it was
    created); `started_at` when it first started (what its timeout counts from), `None` before."""

    agent_id: str
    session_id: str
    batch_id: str
    kind: str
    state: str
    description: str
    usage: Usage
    cost_usd: float
    error: str
    limits: Limits = field(default_factory=Limits)
    started_at: datetime | None = None

    @staticmethod
    def of(a: pb.Agent) -> AgentInfo:
        return AgentInfo(
            a.agent_id,
            a.session_id,
            a.batch_id,
            a.kind,
            _STATE.get(a.state, "unknown"),
            a.description,
            Usage.of(a.usage),
            a.cost_usd,
            a.error,
            Limits.of(a.limits),
            a.started_at.ToDatetime(tzinfo=timezone.utc) if a.HasField("started_at") else None,
        )


@dataclass(frozen=True)
class Message:
    """A transcript message: its role and content blocks (the exact JSON sent to the model)."""

    role: str
    content: list[Any]
    seq: int | None
    shared: bool

    @staticmethod
    def of(m: pb.TranscriptMessage) -> Message:
        return Message(
            m.role,
            json.loads(m.content_json),
            m.seq if m.HasField("seq") else None,
            m.shared,
        )


@dataclass(frozen=True)
class HookRun:
    """One hook command's run for an agent: `event` (`PreToolUse`, `PostToolUse`,
    `UserPromptSubmit`, `Stop`, `SubagentStop`, `PreCompact`, `Notification`), the tool call it
    was about (`tool_use_id` and `tool_name`, `None` for the other events), `program` (the
    command's first word, never the whole command), `exit_code` (`None` when it was killed or
    never started), `decision` (`stop`, `deny`, `block`, `ask`, `allow`, `error` or `none`),
    `output` (what it said, at most 2,000 bytes), `started_at` and `duration_ms`."""

    event: str
    tool_use_id: str | None
    tool_name: str | None
    program: str
    exit_code: int | None
    decision: str
    output: str
    started_at: datetime | None
    duration_ms: int

    @staticmethod
    def of(h: pb.HookRun) -> HookRun:
        return HookRun(
            h.event,
            h.tool_use_id or None,
            h.tool_name or None,
            h.program,
            h.exit_code if h.HasField("exit_code") else None,
            h.decision,
            h.output,
            h.started_at.ToDatetime(tzinfo=timezone.utc) if h.HasField("started_at") else None,
            h.duration_ms,
        )


@dataclass(frozen=True)
class Event:
    """One event of a parent turn (`session.send`) or of an attached agent (`agent.attach`):
    `kind` is the event's name (`text_delta`, `tool_call`, `tool_result`, `fork_launched`,
    `turn_ended`, `async_launched`, `message`, `ended`, …), `text` its text when it has one,
    `raw` the daemon's message."""

    kind: str
    text: str
    raw: Any


@dataclass(frozen=True)
class RunSlots:
    """The daemon's running slots (its `max_running_agents`), whoever's runs take them: `used`,
    `free`, and `total` (0: no cap, and then `free` is 0 too)."""

    used: int = 0
    free: int = 0
    total: int = 0

    @staticmethod
    def of(s: pb.RunSlots) -> RunSlots:
        return RunSlots(s.used, s.free, s.total)


@dataclass(frozen=True)
class BudgetLeft:
    """What the caller's tenant may still spend under its budget: `usd` and `tokens`, each `None`
    where the budget sets no such limit."""

    usd: float | None = None
    tokens: int | None = None

    @staticmethod
    def of(b: pb.BudgetLeft) -> BudgetLeft:
        return BudgetLeft(
            b.usd if b.HasField("usd") else None,
            b.tokens if b.HasField("tokens") else None,
        )


@dataclass(frozen=True)
class PacedLimit:
    """A limit a provider key's requests are paced by: `name` (`requests`, `tokens`,
    `input_tokens` or `output_tokens`), its rate and burst, and where it came from (`source`:
    `headers`, `refusals` or `start`)."""

    name: str
    per_second: float
    burst: float
    source: str

    @staticmethod
    def of(p: pb.PacedLimit) -> PacedLimit:
        return PacedLimit(p.name, p.per_second, p.burst, p.source)


@dataclass(frozen=True)
class ProviderCapacity:
    """The daemon's limiter for one provider key and model: the limits it paces by, its
    concurrency window, requests in flight, waiting and throttled, the last minute's refusals,
    and how long a retry-after still holds every request of the key (`paused_for`, seconds)."""

    provider: str
    endpoint: str
    model: str
    limits: list[PacedLimit]
    concurrency: float
    in_flight: int
    waiting: int
    throttled: int
    refusals_last_minute: int
    paused_for: float

    @staticmethod
    def of(p: pb.ProviderCapacity) -> ProviderCapacity:
        return ProviderCapacity(
            p.provider,
            p.endpoint,
            p.model,
            [PacedLimit.of(lim) for lim in p.limits],
            p.concurrency,
            p.in_flight,
            p.waiting,
            p.throttled,
            p.refusals_last_minute,
            p.paused_for_ms / 1000,
        )


@dataclass(frozen=True)
class Capacity:
    """`client.capacity()`: the daemon's running slots, the caller's own runs waiting for one
    (`queued`), what its tenant's budget has left (`None` without a budget), and the provider
    limiter per key and model."""

    slots: RunSlots
    queued: int
    budget_left: BudgetLeft | None
    providers: list[ProviderCapacity]

    @staticmethod
    def of(r: pb.GetCapacityResponse) -> Capacity:
        return Capacity(
            RunSlots.of(r.slots),
            r.queued,
            BudgetLeft.of(r.budget_left) if r.HasField("budget_left") else None,
            [ProviderCapacity.of(p) for p in r.providers],
        )


@dataclass(frozen=True)
class DryRun:
    """`session.dry_run(...)`: what a batch would be, had it been submitted. `prefix_tokens` is
    what every child's first request shares (the history to the fork point and the fork
    boilerplate), `directive_tokens` a directive's block on average; `fork_cost_usd` the first
    requests' input cost (child 1 writes the prefix to the cache, the others read it),
    `independent_cost_usd` the same children as independent agents, `saving` the share saved;
    `slots` and `queued` as `client.capacity()` tells them now. `start_in_ms` and `finish_in_ms`
    estimate when its first child would start and its last end, in milliseconds from now (from
    the queue, the latest runs' wall time and the limiter; `None` when the daemon cannot tell yet),
    and `estimate_basis` says in words what the estimate was made of."""

    children: int
    prefix_tokens: int
    directive_tokens: int
    fork_cost_usd: float
    independent_cost_usd: float
    saving: float
    slots: RunSlots
    queued: int
    start_in_ms: int | None = None
    finish_in_ms: int | None = None
    estimate_basis: str = ""

    @staticmethod
    def of(d: pb.DryRun) -> DryRun:
        return DryRun(
            d.children,
            d.prefix_tokens,
            d.directive_tokens,
            d.fork_cost_usd,
            d.independent_cost_usd,
            d.saving,
            RunSlots.of(d.slots),
            d.queued,
            d.start_in_ms if d.HasField("start_in_ms") else None,
            d.finish_in_ms if d.HasField("finish_in_ms") else None,
            d.estimate_basis,
        )
