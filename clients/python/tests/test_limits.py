"""Limits on a run: the options as the request carries them (checked on requests caught before
they leave, no daemon), values refused before sending, `timed_out` read back as a status and a
state, and a batch with limits taken by a real daemon."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from conftest import Daemon

import forkd
from forkd import _requests
from forkd._proto.forkd.v1 import forkd_pb2 as pb


class _Stub:
    """Catches the ForkBatch requests a client sends, and answers them."""

    def __init__(self) -> None:
        self.sent: list[pb.ForkBatchRequest] = []

    def ForkBatch(self, request: pb.ForkBatchRequest, **_: Any) -> pb.ForkBatchResponse:
        self.sent.append(request)
        ids = [f"a{i}" for i in range(len(request.directives))]
        return pb.ForkBatchResponse(batch_id="b", agent_ids=ids)


class _AsyncStub(_Stub):
    async def ForkBatch(  # type: ignore[override]
        self, request: pb.ForkBatchRequest, **kwargs: Any
    ) -> pb.ForkBatchResponse:
        return super().ForkBatch(request, **kwargs)


def _session() -> tuple[forkd.Session, _Stub]:
    client = forkd.Client(addr="unix:/nonexistent/forkd.sock", reconnect_for=0.1)
    stub = _Stub()
    client._stub = stub  # type: ignore[assignment]
    return forkd.Session(client, pb.Session(session_id="s")), stub


def test_a_batchs_limits_go_in_its_request() -> None:
    session, stub = _session()
    batch = session.fork(
        ["One.", "Two."],
        timeout=600,
        idle_timeout=timedelta(seconds=90),
        max_turns=40,
        max_output_tokens=20_000,
        timeout_excludes_throttle=True,
    )
    assert batch.agent_ids == ["a0", "a1"]
    (request,) = stub.sent
    assert request.HasField("limits")
    assert request.limits == pb.Limits(
        timeout_ms=600_000,
        idle_timeout_ms=90_000,
        max_turns=40,
        max_output_tokens=20_000,
        timeout_excludes_throttle=True,
    )
    # Fractions of a second are milliseconds; `False` is sent, not left out.
    session.fork(["x"], timeout=1.5, timeout_excludes_throttle=False)
    assert stub.sent[-1].limits.timeout_ms == 1500
    assert stub.sent[-1].limits.HasField("timeout_excludes_throttle")
    assert not stub.sent[-1].limits.timeout_excludes_throttle
    # No limits: no Limits message at all (each child gets the next layer's).
    session.fork(["x"])
    assert not stub.sent[-1].HasField("limits")
    assert not stub.sent[-1].directives[0].HasField("limits")


def test_a_directive_carries_its_own_limits() -> None:
    session, stub = _session()
    session.fork(
        [
            "Plain.",
            ("api", "Review the API."),
            ("docs", "Review the docs.", forkd.Limits(timeout=timedelta(minutes=2), max_turns=5)),
        ],
        max_turns=10,
    )
    (request,) = stub.sent
    assert request.limits == pb.Limits(max_turns=10)
    plain, api, docs = request.directives
    assert (plain.description, plain.prompt) == ("Plain.", "Plain.")
    assert not plain.HasField("limits") and not api.HasField("limits")
    assert (docs.description, docs.prompt) == ("docs", "Review the docs.")
    assert docs.limits == pb.Limits(timeout_ms=120_000, max_turns=5)
    # A directive whose third item is not a Limits.
    with pytest.raises(TypeError, match=r"forkd\.Limits"):
        _requests.directive(("d", "p", {"max_turns": 5}))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("options", "error", "words"),
    [
        ({"timeout": 0}, ValueError, "timeout must be positive"),
        ({"timeout": -5}, ValueError, "timeout must be positive"),
        ({"timeout": timedelta(0)}, ValueError, "timeout must be positive"),
        ({"timeout": float("nan")}, ValueError, "timeout must be positive"),
        ({"timeout": float("inf")}, ValueError, "timeout must be positive"),
        ({"timeout": 0.0001}, ValueError, "at least a millisecond"),
        ({"timeout": True}, TypeError, "seconds or a timedelta"),
        ({"timeout": "10s"}, TypeError, "seconds or a timedelta"),
        ({"idle_timeout": 0}, ValueError, "idle_timeout must be positive"),
        ({"idle_timeout": timedelta(seconds=-1)}, ValueError, "idle_timeout must be positive"),
        ({"max_turns": 0}, ValueError, "max_turns must be positive"),
        ({"max_turns": -1}, ValueError, "max_turns must be positive"),
        ({"max_turns": 2**32}, ValueError, "max_turns is too large"),
        ({"max_turns": 2.0}, TypeError, "max_turns is a whole number"),
        ({"max_output_tokens": 0}, ValueError, "max_output_tokens must be positive"),
        ({"max_output_tokens": 2**64}, ValueError, "max_output_tokens is too large"),
        ({"timeout_excludes_throttle": 1}, TypeError, "timeout_excludes_throttle is a bool"),
    ],
)
def test_a_limit_that_is_not_positive_is_refused_before_sending(
    options: dict[str, Any], error: type[Exception], words: str
) -> None:
    session, stub = _session()
    with pytest.raises(error, match=words):
        session.fork(["x"], **options)
    with pytest.raises(error, match=words):
        session.fork([("d", "p", forkd.Limits(**options))])
    assert stub.sent == []


def test_the_async_client_sends_the_same_limits() -> None:
    async def run() -> None:
        async with forkd.AsyncClient(addr="unix:/nonexistent/forkd.sock") as client:
            stub = _AsyncStub()
            client._stub = stub  # type: ignore[assignment]
            session = forkd.AsyncSession(client, pb.Session(session_id="s"))
            await session.fork(
                ["One.", ("two", "Two.", forkd.Limits(idle_timeout=30))],
                timeout=timedelta(minutes=10),
                max_output_tokens=1000,
            )
            (request,) = stub.sent
            assert request.limits == pb.Limits(timeout_ms=600_000, max_output_tokens=1000)
            assert request.directives[1].limits == pb.Limits(idle_timeout_ms=30_000)
            with pytest.raises(ValueError, match="max_turns must be positive"):
                await session.fork(["x"], max_turns=0)
            assert len(stub.sent) == 1

    asyncio.run(run())


def test_timed_out_is_a_status_and_a_state() -> None:
    n = forkd.Notification.of(
        pb.Notification(
            agent_id="a",
            status=pb.NOTIFICATION_STATUS_TIMED_OUT,
            report=pb.Report(result="half done", issues="stopped: timeout (10m) reached"),
        )
    )
    assert n.status == "timed_out"
    assert n.status != "completed"
    assert n.report.result == "half done"
    assert "timeout" in n.report.issues
    statuses = {
        forkd.Notification.of(pb.Notification(status=s)).status
        for s in pb.NotificationStatus.values()
    }
    assert statuses == {"unknown", "completed", "failed", "killed", "timed_out"}
    states = {forkd.AgentInfo.of(pb.Agent(state=s)).state for s in pb.AgentState.values()}
    assert "timed_out" in states and "unknown" in states


def test_an_agents_limits_and_start_are_read_back() -> None:
    started = datetime(2026, 3, 1, 12, 0, 5, tzinfo=timezone.utc)
    raw = pb.Agent(
        agent_id="a",
        state=pb.AGENT_STATE_TIMED_OUT,
        limits=pb.Limits(
            timeout_ms=600_000, max_turns=40, idle_timeout_ms=1500, timeout_excludes_throttle=False
        ),
    )
    raw.started_at.FromDatetime(started)
    info = forkd.AgentInfo.of(raw)
    assert info.state == "timed_out"
    assert info.limits == forkd.Limits(
        timeout=600.0, idle_timeout=1.5, max_turns=40, timeout_excludes_throttle=False
    )
    assert info.limits.max_output_tokens is None
    assert info.started_at == started
    # Not started, no limits sent: None throughout.
    bare = forkd.AgentInfo.of(pb.Agent(agent_id="b", state=pb.AGENT_STATE_PENDING))
    assert bare.started_at is None
    assert bare.limits == forkd.Limits()
    assert not bare.limits
    # What was read back goes out again unchanged.
    assert info.limits.to_proto() == raw.limits


def test_a_batch_with_limits_is_taken_by_the_daemon(client: forkd.Client, daemon: Daemon) -> None:
    session = client.sessions.create(system="s", workspace=daemon.workspace)
    batch = session.fork(
        [
            "Quick.\n@sim say quick",
            ("own", "Own limits.\n@sim say own", forkd.Limits(timeout=120, max_turns=8)),
        ],
        timeout=timedelta(minutes=5),
        idle_timeout=60,
        max_turns=10,
        max_output_tokens=100_000,
        timeout_excludes_throttle=True,
    )
    done = batch.wait(timeout=60)
    assert sorted(n.agent_id for n in done) == sorted(batch.agent_ids)
    assert all(n.status == "completed" for n in done)
    own = client.agents.get(batch.agent_ids[1]).info
    assert own.state == "completed"
    # The daemon tells them back, resolved: the child's own over the batch's.
    assert own.limits.timeout == 120.0
    assert own.limits.max_turns == 8
    assert own.limits.idle_timeout == 60.0
    assert own.limits.max_output_tokens == 100_000
    assert own.limits.timeout_excludes_throttle is True
    assert own.started_at is not None


def test_a_child_past_its_limit_times_out(client: forkd.Client, daemon: Daemon) -> None:
    session = client.sessions.create(system="s", workspace=daemon.workspace)
    batch = session.fork(
        ["Quick.\n@sim say quick", "Stalls.\n@sim stall\n@sim say never"],
        idle_timeout=0.5,
    )
    done = {n.agent_id: n for n in batch.wait(timeout=60)}
    assert done[batch.agent_ids[0]].status == "completed"
    late = done[batch.agent_ids[1]]
    assert late.status == "timed_out"
    assert late.report.issues.startswith("timed out: no model output"), late.report.issues
    assert client.agents.get(batch.agent_ids[1]).info.state == "timed_out"
