"""The requests both clients send, and what their events become: built here once, so that the
sync and async clients cannot drift apart."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from forkd._proto.forkd.v1 import forkd_pb2 as pb
from forkd._types import Event, Limits, Message, Notification

ContextItem = str | Path | tuple[str, str]
"""A context file: a path read here, or `(name, text)`."""

Directive = str | tuple[str, str] | tuple[str, str, Limits]
"""A child's directive: its prompt (described by its first line), `(description, prompt)`, or
`(description, prompt, forkd.Limits(...))`: that child's own limits, over the batch's."""

Hooks = Mapping[str, Any] | str
"""A session's own hooks: a Claude Code settings object (`{"hooks": {"PreToolUse": [...]}}`,
JSON-encoded here) or its JSON text (sent as is)."""


def key(given: str | None) -> str:
    """The idempotency key given, or a new one: a retry sends the same."""
    return given or str(uuid.uuid4())


def create_session(
    system: str,
    context: Sequence[ContextItem],
    workspace: str | Path | None,
    upload_id: str | None,
    model: str,
    permission_mode: str,
    sandbox: str,
    allow: Sequence[str],
    deny: Sequence[str],
    capacity_tool: bool,
    idempotency_key: str | None,
    hooks: Hooks | None = None,
) -> pb.CreateSessionRequest:
    files = []
    for item in context:
        if isinstance(item, tuple):
            name, text = item
        else:
            name, text = str(item), Path(item).read_text()
        files.append(pb.ContextFile(path=name, content=text))
    return pb.CreateSessionRequest(
        system_prompt=system,
        context_files=files,
        model=model,
        workspace=str(workspace) if workspace is not None else "",
        permission_mode=permission_mode,
        sandbox=sandbox,
        allow_rules=list(allow),
        deny_rules=list(deny),
        upload_id=upload_id or "",
        capacity_tool=capacity_tool,
        hooks_json=hooks_json(hooks),
        idempotency_key=key(idempotency_key),
    )


def hooks_json(hooks: Hooks | None) -> str:
    """A session's own hooks as the wire carries them: a settings object JSON-encoded, a string
    as is, none as the empty string."""
    if hooks is None:
        return ""
    if isinstance(hooks, str):
        return hooks
    if isinstance(hooks, Mapping):
        return json.dumps(dict(hooks))
    raise TypeError(f"hooks is a settings dict or its JSON text, not {type(hooks).__name__}")


def fork(
    session_id: str,
    directives: Iterable[Directive],
    isolation: str,
    output_schema: dict[str, Any] | None,
    output_model: Any,
    budget_usd: float,
    budget_tokens: int,
    at_turn: int | None,
    warmup_gating: bool | None,
    idempotency_key: str | None,
    limits: Limits | None = None,
    dry_run: bool = False,
    webhook_id: str = "",
) -> pb.ForkBatchRequest:
    """A fork batch's request; with `dry_run`, the same request asking the daemon only to check
    it and tell what the batch would be (`session.dry_run`): both are built here, so that a dry
    run checks exactly what the fork would send."""
    items = [directive(d) for d in directives]
    if output_model is not None:
        output_schema = output_model.model_json_schema()
    request = pb.ForkBatchRequest(
        session_id=session_id,
        directives=items,
        isolation=isolation,
        output_schema=json.dumps(output_schema) if output_schema is not None else "",
        budget_usd=budget_usd,
        budget_tokens=budget_tokens,
        idempotency_key=key(idempotency_key),
        dry_run=dry_run,
        webhook_id=webhook_id,
    )
    if at_turn is not None:
        request.at_turn = at_turn
    if warmup_gating is not None:
        request.warmup_gating = warmup_gating
    if limits:
        request.limits.CopyFrom(limits.to_proto())
    return request


def directive(d: Directive) -> pb.Directive:
    """One directive as the wire carries it (its limits validated here)."""
    if isinstance(d, str):
        return pb.Directive(description=d.split("\n", 1)[0][:80], prompt=d)
    if len(d) == 3:
        description, prompt, limits = d
        if not isinstance(limits, Limits):
            kind = type(limits).__name__
            raise TypeError(f"a directive's third item is a forkd.Limits, not {kind}")
        out = pb.Directive(description=description, prompt=prompt)
        if limits:
            out.limits.CopyFrom(limits.to_proto())
        return out
    description, prompt = d
    return pb.Directive(description=description, prompt=prompt)


def session_event(event: pb.SessionEvent) -> Event:
    """A parent turn's event: `text_delta`'s text, `turn_ended`'s final text."""
    kind = event.WhichOneof("event") or ""
    value = getattr(event, kind) if kind else None
    text = value if isinstance(value, str) else getattr(value, "text", "")
    return Event(kind, text or "", value)


def agent_event(event: pb.AgentEvent) -> tuple[Event, bool]:
    """An attached agent's event, and whether the stream ends after it."""
    kind = event.WhichOneof("event") or ""
    if kind == "message":
        m = event.message
        return Event(kind, "", Message(m.role, json.loads(m.content_json), m.seq, False)), False
    if kind == "ended":
        return Event(kind, event.ended.summary, Notification.of(event.ended)), True
    value = getattr(event, kind) if kind else None
    return Event(kind, getattr(value, "reason", ""), value), kind == "async_launched"


def next_message(event: pb.AgentEvent) -> int:
    """Where an attach stream opened again starts: after the last message read."""
    return event.message.seq + 1 if event.WhichOneof("event") == "message" else 0
