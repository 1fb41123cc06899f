"""Asking before submitting: `client.capacity()` and `session.dry_run(...)`. Their results mapped
from the daemon's messages, a dry run's request the same as the fork's (caught before it
leaves, no daemon), and both against a real daemon: a fresh one's slots, a dry run that forks
nothing and leaves its idempotency key free, and one the daemon refuses."""

from __future__ import annotations

import asyncio
import inspect
from datetime import timedelta
from typing import Any

import pytest
from conftest import Daemon

import forkd
from forkd._proto.forkd.v1 import forkd_pb2 as pb
from forkd._requests import Directive

_DRY = pb.DryRun(
    children=2,
    prefix_tokens=1072,
    directive_tokens=12,
    fork_cost_usd=0.0044,
    independent_cost_usd=0.0065,
    saving=0.32,
    slots=pb.RunSlots(used=3, free=253, total=256),
    queued=1,
    start_in_ms=0,
    estimate_basis="no run has ended here yet",
)


class _Stub:
    """Catches the ForkBatch requests a client sends, and answers them (a dry run with `_DRY`)."""

    def __init__(self) -> None:
        self.sent: list[pb.ForkBatchRequest] = []

    def ForkBatch(self, request: pb.ForkBatchRequest, **_: Any) -> pb.ForkBatchResponse:
        self.sent.append(request)
        if request.dry_run:
            return pb.ForkBatchResponse(dry_run=_DRY)
        ids = [f"a{i}" for i in range(len(request.directives))]
        return pb.ForkBatchResponse(batch_id="b", agent_ids=ids)

    def GetCapacity(self, request: pb.GetCapacityRequest, **_: Any) -> pb.GetCapacityResponse:
        return pb.GetCapacityResponse(slots=pb.RunSlots(used=1, free=7, total=8), queued=2)


class _AsyncStub(_Stub):
    async def ForkBatch(  # type: ignore[override]
        self, request: pb.ForkBatchRequest, **kwargs: Any
    ) -> pb.ForkBatchResponse:
        return super().ForkBatch(request, **kwargs)

    async def GetCapacity(  # type: ignore[override]
        self, request: pb.GetCapacityRequest, **kwargs: Any
    ) -> pb.GetCapacityResponse:
        return super().GetCapacity(request, **kwargs)


_OPTIONS: dict[str, Any] = {
    "isolation": "copy",
    "output_schema": {"type": "object"},
    "budget_usd": 2.5,
    "budget_tokens": 100_000,
    "at_turn": 3,
    "warmup_gating": False,
    "timeout": timedelta(minutes=10),
    "idle_timeout": 90,
    "max_turns": 40,
    "max_output_tokens": 20_000,
    "timeout_excludes_throttle": True,
    "webhook": "w",
    "idempotency_key": "k",
}
_DIRECTIVES: list[Directive] = [
    "One.",
    ("two", "Two.", forkd.Limits(max_turns=5)),
]


def test_capacity_is_mapped_from_the_daemons_answer() -> None:
    raw = pb.GetCapacityResponse(
        providers=[
            pb.ProviderCapacity(
                provider="anthropic",
                endpoint="https://api.anthropic.com",
                model="claude-sonnet-4-5",
                limits=[pb.PacedLimit(name="requests", per_second=0.8, burst=4, source="headers")],
                concurrency=32,
                in_flight=3,
                waiting=1,
                throttled=2,
                refusals_last_minute=5,
                paused_for_ms=1500,
            )
        ],
        slots=pb.RunSlots(used=250, free=6, total=256),
        queued=4,
        budget_left=pb.BudgetLeft(usd=1.25),
    )
    capacity = forkd.Capacity.of(raw)
    assert capacity.slots == forkd.RunSlots(used=250, free=6, total=256)
    assert capacity.queued == 4
    assert capacity.budget_left == forkd.BudgetLeft(usd=1.25, tokens=None)
    (provider,) = capacity.providers
    assert provider == forkd.ProviderCapacity(
        provider="anthropic",
        endpoint="https://api.anthropic.com",
        model="claude-sonnet-4-5",
        limits=[forkd.PacedLimit(name="requests", per_second=0.8, burst=4.0, source="headers")],
        concurrency=32.0,
        in_flight=3,
        waiting=1,
        throttled=2,
        refusals_last_minute=5,
        paused_for=1.5,
    )
    # A budget of tokens only; a limit of 0 left is one (not `None`).
    tokens = forkd.Capacity.of(pb.GetCapacityResponse(budget_left=pb.BudgetLeft(tokens=0)))
    assert tokens.budget_left == forkd.BudgetLeft(usd=None, tokens=0)
    # No budget, no cap: `None`, and zeros.
    bare = forkd.Capacity.of(pb.GetCapacityResponse())
    assert bare.budget_left is None
    assert bare.slots == forkd.RunSlots(0, 0, 0)
    assert bare.providers == []
    with pytest.raises(AttributeError):
        bare.queued = 1  # type: ignore[misc]


def test_a_dry_run_is_mapped_from_the_daemons_answer() -> None:
    assert forkd.DryRun.of(_DRY) == forkd.DryRun(
        children=2,
        prefix_tokens=1072,
        directive_tokens=12,
        fork_cost_usd=0.0044,
        independent_cost_usd=0.0065,
        saving=0.32,
        slots=forkd.RunSlots(used=3, free=253, total=256),
        queued=1,
        start_in_ms=0,
        finish_in_ms=None,
        estimate_basis="no run has ended here yet",
    )


@pytest.mark.parametrize("session_class", [forkd.Session, forkd.AsyncSession])
def test_a_dry_run_takes_exactly_forks_options(session_class: type[Any]) -> None:
    fork = inspect.signature(session_class.fork).parameters
    dry_run = inspect.signature(session_class.dry_run).parameters
    assert fork == dry_run


def test_a_dry_runs_request_is_the_forks_with_dry_run_set() -> None:
    client = forkd.Client(addr="unix:/nonexistent/forkd.sock", reconnect_for=0.1)
    stub = _Stub()
    client._stub = stub  # type: ignore[assignment]
    session = forkd.Session(client, pb.Session(session_id="s"))
    dry = session.dry_run(_DIRECTIVES, **_OPTIONS)
    assert dry == forkd.DryRun.of(_DRY)
    batch = session.fork(_DIRECTIVES, **_OPTIONS)
    assert batch.agent_ids == ["a0", "a1"]
    asked, forked = stub.sent
    assert asked.dry_run and not forked.dry_run
    asked.dry_run = False
    assert asked == forked
    assert forked.limits == pb.Limits(
        timeout_ms=600_000,
        idle_timeout_ms=90_000,
        max_turns=40,
        max_output_tokens=20_000,
        timeout_excludes_throttle=True,
    )
    assert forked.directives[1].limits == pb.Limits(max_turns=5)
    assert forked.webhook_id == "w"
    # Refused here as the fork's are, before anything is sent.
    with pytest.raises(ValueError, match="max_turns must be positive"):
        session.dry_run(["x"], max_turns=0)
    assert len(stub.sent) == 2
    assert client.capacity().slots == forkd.RunSlots(used=1, free=7, total=8)


def test_the_async_client_asks_the_same() -> None:
    async def run() -> None:
        async with forkd.AsyncClient(addr="unix:/nonexistent/forkd.sock") as client:
            stub = _AsyncStub()
            client._stub = stub  # type: ignore[assignment]
            session = forkd.AsyncSession(client, pb.Session(session_id="s"))
            assert await session.dry_run(_DIRECTIVES, **_OPTIONS) == forkd.DryRun.of(_DRY)
            await session.fork(_DIRECTIVES, **_OPTIONS)
            asked, forked = stub.sent
            assert asked.dry_run
            asked.dry_run = False
            assert asked == forked
            capacity = await client.capacity()
            assert (capacity.slots.total, capacity.queued, capacity.budget_left) == (8, 2, None)

    asyncio.run(run())


# Against the daemon: first, while it is fresh.


def test_a_fresh_daemons_capacity(client: forkd.Client) -> None:
    capacity = client.capacity()
    # The default max_running_agents, none taken; nothing of ours waits; no tenant budget.
    assert capacity.slots == forkd.RunSlots(used=0, free=256, total=256)
    assert capacity.queued == 0
    assert capacity.budget_left is None


def _agents(client: forkd.Client, session: forkd.Session) -> list[pb.Agent]:
    request = pb.ListAgentsRequest(session_id=session.id, include_ended=True)
    return list(client._call("ListAgents", request).agents)


def test_a_dry_run_forks_nothing_and_leaves_its_key_free(
    client: forkd.Client, daemon: Daemon
) -> None:
    session = client.sessions.create(system="s", workspace=daemon.workspace)
    assert list(session.send("Hello.\n@sim say hi"))[-1].kind == "turn_ended"
    directives: list[Directive] = [
        "Review the API.\n@sim say api ok",
        ("docs", "Review the docs.\n@sim say docs ok", forkd.Limits(max_turns=5)),
    ]
    options: dict[str, Any] = {
        "at_turn": 1,
        "max_turns": 10,
        "idempotency_key": "dry-then-real",
    }
    dry = session.dry_run(directives, **options)
    assert isinstance(dry, forkd.DryRun)
    assert dry.children == len(directives)
    assert dry.fork_cost_usd > 0
    assert dry.independent_cost_usd > dry.fork_cost_usd
    assert 0 < dry.saving < 1
    assert dry.prefix_tokens > 0 and dry.directive_tokens > 0
    assert dry.slots.total == 256
    assert dry.queued == 0
    # Nothing was forked: the session's only agent is its parent's main loop.
    assert [a.kind for a in _agents(client, session)] == ["parent"]

    # The key was not recorded: the fork under it forks now (not `existing`).
    replies: list[pb.ForkBatchResponse] = []
    fork_batch = client._stub.ForkBatch

    def caught(*args: Any, **kwargs: Any) -> Any:
        reply = fork_batch(*args, **kwargs)
        replies.append(reply)
        return reply

    client._stub.ForkBatch = caught  # type: ignore[assignment]
    try:
        batch = session.fork(directives, **options)
        # Sent again under its key, the fork is the first one's (what `existing` tells).
        again = session.fork(directives, **options)
    finally:
        client._stub.ForkBatch = fork_batch
    assert [r.existing for r in replies] == [False, True]
    assert not replies[0].HasField("dry_run")
    assert batch.id and len(batch.agent_ids) == 2
    assert again.id == batch.id
    done = batch.wait(timeout=60)
    assert all(n.status == "completed" for n in done)
    kinds = sorted(a.kind for a in _agents(client, session))
    assert kinds.count("parent") == 1 and len(kinds) == 3


def test_a_dry_run_the_daemon_refuses_raises(client: forkd.Client, daemon: Daemon) -> None:
    session = client.sessions.create(system="s", workspace=daemon.workspace)
    with pytest.raises(forkd.InvalidArgument) as e:
        session.dry_run(["x"], at_turn=99)
    assert "turn" in e.value.message
    with pytest.raises(forkd.InvalidArgument):
        session.dry_run([])
    with pytest.raises(forkd.InvalidArgument):
        session.dry_run(["x"], output_schema={"type": "objet"})
    assert _agents(client, session) == []


def test_the_async_client_asks_the_daemon(daemon: Daemon) -> None:
    async def run() -> None:
        async with forkd.AsyncClient(addr=daemon.addr) as client:
            capacity = await client.capacity()
            assert capacity.slots.total == 256
            assert capacity.budget_left is None
            session = await client.sessions.create(system="s", workspace=daemon.workspace)
            dry = await session.dry_run(["One.\n@sim say one", "Two.\n@sim say two"])
            assert dry.children == 2 and dry.fork_cost_usd > 0
            assert "Capacity" not in session.info.tool_names
            sizing = await client.sessions.create(
                system="s", workspace=daemon.workspace, capacity_tool=True
            )
            assert "Capacity" in sizing.info.tool_names
            with pytest.raises(forkd.InvalidArgument):
                await session.dry_run(["x"], at_turn=99)

    asyncio.run(run())
