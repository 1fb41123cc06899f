"""Webhooks: a tenant's URLs that its task notifications are posted to, signed to the Standard
Webhooks specification (docs/operations.md, "Webhooks and schedules"). What the daemon answers
about them, as plain typed values, and the requests both clients send."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone

from google.protobuf import timestamp_pb2

from forkd._proto.forkd.v1 import forkd_pb2 as pb

_U32 = 2**32 - 1


def _time(t: timestamp_pb2.Timestamp) -> datetime:
    return t.ToDatetime(tzinfo=timezone.utc)


@dataclass(frozen=True)
class Webhook:
    """A registered webhook (its secret is never part of it). `kinds` are the notification kinds
    it receives (`fork`, `typed`, `turn`; empty for all), `session_id` the one session whose
    notifications it receives (`None`: all the tenant's); a `named_only` one receives only the
    batches that name it (`session.fork(..., webhook=ID)`). `failing_since` is when its current
    run of failed attempts began (`None` since its latest success); once it failed every attempt
    for too long it is disabled (`disabled_reason`, `disabled_at`) and gets nothing more.
    `previous_secret_until`: until when the secret before the latest rotation still signs."""

    webhook_id: str
    url: str
    kinds: list[str] = field(default_factory=list)
    session_id: str | None = None
    named_only: bool = False
    created_at: datetime | None = None
    failing_since: datetime | None = None
    disabled_reason: str | None = None
    disabled_at: datetime | None = None
    previous_secret_until: datetime | None = None

    @staticmethod
    def of(w: pb.Webhook) -> Webhook:
        return Webhook(
            w.webhook_id,
            w.url,
            list(w.kinds),
            w.session_id or None,
            w.named_only,
            _time(w.created_at) if w.HasField("created_at") else None,
            _time(w.failing_since) if w.HasField("failing_since") else None,
            w.disabled_reason or None,
            _time(w.disabled_at) if w.HasField("disabled_at") else None,
            _time(w.previous_secret_until) if w.HasField("previous_secret_until") else None,
        )


@dataclass(frozen=True)
class CreatedWebhook:
    """`client.create_webhook(...)` and `client.rotate_webhook_secret(id)`: the webhook and its
    signing secret (`whsec_…`), which the daemon never shows again."""

    webhook: Webhook
    secret: str = field(repr=False)

    @staticmethod
    def of(r: pb.CreateWebhookResponse) -> CreatedWebhook:
        return CreatedWebhook(Webhook.of(r.webhook), r.secret)


@dataclass(frozen=True)
class WebhookAttempt:
    """One attempt at one delivery. `delivery_id` is the `webhook-id` header of each of the
    delivery's attempts, `number` 1 for its first; `status` the receiver's HTTP status (`None`
    when it did not answer), `error` why it failed (`None` when the receiver took it); `event`
    is `notification` or `ping`, `notification_seq` the notification's seq (`None` for a ping);
    `state` the delivery's now: `pending` (retried later), `delivered` or `failed`."""

    delivery_id: str
    number: int
    at: datetime | None
    status: int | None
    error: str | None
    latency_ms: int
    event: str
    notification_seq: int | None
    state: str

    @property
    def ok(self) -> bool:
        """Whether the receiver took it (a 2xx answer)."""
        return self.status is not None and 200 <= self.status < 300

    @staticmethod
    def of(a: pb.WebhookAttempt) -> WebhookAttempt:
        return WebhookAttempt(
            a.delivery_id,
            a.number,
            _time(a.at) if a.HasField("at") else None,
            a.status or None,
            a.error or None,
            a.latency_ms,
            a.event,
            a.notification_seq or None,
            a.state,
        )


def create(
    url: str, kinds: Sequence[str] | None, session_id: str | None, named_only: bool
) -> pb.CreateWebhookRequest:
    if isinstance(kinds, str):
        raise TypeError(f"kinds is a list of notification kinds, not a string: [{kinds!r}]")
    return pb.CreateWebhookRequest(
        url=url, kinds=list(kinds or ()), session_id=session_id or "", named_only=named_only
    )


def attempts(webhook_id: str, limit: int | None) -> pb.ListWebhookAttemptsRequest:
    """The latest `limit` attempts' request (`None`: the daemon's default, 50)."""
    if limit is not None:
        if not isinstance(limit, int) or isinstance(limit, bool):
            raise TypeError(f"limit is a whole number, not {type(limit).__name__}")
        if not 0 < limit <= _U32:
            raise ValueError(f"limit must be positive, not {limit!r} (leave it out for 50)")
    return pb.ListWebhookAttemptsRequest(webhook_id=webhook_id, limit=limit or 0)


WebhookRef = str | Webhook
"""A webhook as a batch names it: its id, or the webhook."""


def webhook_id(webhook: WebhookRef | None) -> str:
    """A batch's `webhook_id`: empty for none."""
    if webhook is None:
        return ""
    if isinstance(webhook, Webhook):
        return webhook.webhook_id
    if not isinstance(webhook, str):
        raise TypeError(
            f"webhook is a webhook's id or a forkd.Webhook, not {type(webhook).__name__}"
        )
    return webhook
