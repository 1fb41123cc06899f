"""What the daemon answers, as plain typed values (the generated messages stay inside)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from forkd._proto.forkd.v1 import forkd_pb2 as pb

_STATUS = {
    pb.NOTIFICATION_STATUS_COMPLETED: "completed",
    pb.NOTIFICATION_STATUS_FAILED: "failed",
    pb.NOTIFICATION_STATUS_KILLED: "killed",
}

_STATE = {
    pb.AGENT_STATE_PENDING: "pending",
    pb.AGENT_STATE_RUNNING: "running",
    pb.AGENT_STATE_COMPLETED: "completed",
    pb.AGENT_STATE_FAILED: "failed",
    pb.AGENT_STATE_KILLED: "killed",
    pb.AGENT_STATE_IDLE: "idle",
}


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
    """A child's task notification: how it ended, its report, usage and cost."""

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
        )


@dataclass(frozen=True)
class AgentInfo:
    """An agent as `GetAgent` tells it."""

    agent_id: str
    session_id: str
    batch_id: str
    kind: str
    state: str
    description: str
    usage: Usage
    cost_usd: float
    error: str

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
class Event:
    """One event of a parent turn (`session.send`) or of an attached agent (`agent.attach`):
    `kind` is the event's name (`text_delta`, `tool_call`, `tool_result`, `fork_launched`,
    `turn_ended`, `async_launched`, `message`, `ended`, …), `text` its text when it has one,
    `raw` the daemon's message."""

    kind: str
    text: str
    raw: Any
