"""forkd's Python client: parent sessions, fork batches whose children share the parent's cached
context, and their task notifications, over gRPC.

    import forkd
    client = forkd.Client()
    session = client.sessions.create(system="You are a reviewer.", context=["README.md"])
    batch = session.fork(["Review the API", "Review the docs"])
    for n in batch.notifications():
        print(n.agent_id, n.status, n.report.result)

A child ends `completed`, or `failed`, `killed` or `timed_out` (past one of its limits:
`session.fork(..., timeout=600, max_turns=40)`, or a directive's own `forkd.Limits`).

Before submitting, `client.capacity()` tells the daemon's free slots, the caller's queued runs
and its budget left; `session.dry_run([...])` what a batch would cost, checked as `fork` would
check it, with nothing stored or started.

Webhooks: `client.create_webhook(url)` registers a URL that the tenant's notifications are posted
to, signed to the Standard Webhooks specification (its secret answered once);
`session.fork([...], webhook=ID)` sends a batch's there whatever the webhook's filter says.

Schedules: `client.create_schedule(name, cron="0 3 * * 1-5", session={...}, directives=[...])`
forks a batch on a clock, each firing in a session of its own; `get_schedule(name)` tells its
next firing times and latest firings with their batches' results.

`forkd.AsyncClient` is the same with `await` and `async for`.
"""

from forkd._aio import (
    AsyncAgent,
    AsyncAgents,
    AsyncBatch,
    AsyncClient,
    AsyncSession,
    AsyncSessions,
)
from forkd._apply import Applied
from forkd._client import Agent, Agents, Batch, Client, Session, Sessions
from forkd._schedules import Schedule, ScheduleFiring, SessionSpec
from forkd._types import (
    AgentInfo,
    BudgetLeft,
    Capacity,
    DryRun,
    Event,
    HookRun,
    Limits,
    Message,
    Notification,
    PacedLimit,
    ProviderCapacity,
    Report,
    RunSlots,
    Usage,
)
from forkd._upload import Upload
from forkd._webhooks import CreatedWebhook, Webhook, WebhookAttempt
from forkd.errors import (
    FailedPrecondition,
    ForkdError,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
)

__all__ = [
    "Agent",
    "AgentInfo",
    "Agents",
    "Applied",
    "AsyncAgent",
    "AsyncAgents",
    "AsyncBatch",
    "AsyncClient",
    "AsyncSession",
    "AsyncSessions",
    "Batch",
    "BudgetLeft",
    "Capacity",
    "Client",
    "CreatedWebhook",
    "DryRun",
    "Event",
    "FailedPrecondition",
    "ForkdError",
    "HookRun",
    "InvalidArgument",
    "Limits",
    "Message",
    "NotFound",
    "Notification",
    "PacedLimit",
    "PermissionDenied",
    "ProviderCapacity",
    "Report",
    "ResourceExhausted",
    "RunSlots",
    "Schedule",
    "ScheduleFiring",
    "Session",
    "SessionSpec",
    "Sessions",
    "Unauthenticated",
    "Unavailable",
    "Upload",
    "Usage",
    "Webhook",
    "WebhookAttempt",
]
