"""Schedules against a real daemon: a six-field schedule fires every two seconds, each firing a
batch of its own; its next firing times; a trigger, pause and resume; the spec's options (limits,
a webhook) carried into each firing's batch; names taken, bad expressions and missing schedules
raise by meaning. And, with no daemon, the daemon's answers mapped and the spec as the request
carries it."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, TypeVar
from zoneinfo import ZoneInfo

import pytest
from conftest import Daemon, running_daemon
from google.protobuf.timestamp_pb2 import Timestamp

import forkd
from forkd._proto.forkd.v1 import forkd_pb2 as pb

T = TypeVar("T")


@pytest.fixture(scope="module")
def scheduling() -> Iterator[Daemon]:
    """A daemon whose webhooks may name loopback (a `named_only` one the spec names)."""
    yield from running_daemon(
        "forkd-py-sch-", speed="0", config="[webhooks]\nallow_private = true\n"
    )


def eventually(check: Callable[[], T | None], within: float = 20.0) -> T:
    deadline = time.monotonic() + within
    while True:
        value = check()
        if value is not None:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("not within the time")
        time.sleep(0.1)


def _gaps(times: list[datetime]) -> list[float]:
    return [(b - a).total_seconds() for a, b in itertools.pairwise(times)]


def test_a_six_field_schedule_fires_every_two_seconds(scheduling: Daemon) -> None:
    with scheduling.client() as client:
        created = client.create_schedule(
            "every2",
            cron="*/2 * * * * *",
            session={"system": "s", "workspace": scheduling.workspace},
            directives=["Hi."],
        )
        assert (created.name, created.cron, created.timezone) == ("every2", "*/2 * * * * *", "UTC")
        assert (created.overlap, created.catch_up, created.paused) == ("skip", "once", False)
        assert (created.directives, created.webhook_id) == (1, None)
        assert created.created_at is not None
        assert created.created_at <= datetime.now(timezone.utc)
        assert len(created.next_fires) == 5
        assert _gaps(created.next_fires) == [2.0] * 4
        assert created.next_fires[0] > created.created_at

        def two_fired() -> list[forkd.ScheduleFiring] | None:
            firings = client.get_schedule("every2").firings
            fired = [f for f in firings if f.state == "fired" and not f.manual]
            return fired if len(fired) >= 2 else None

        fired = eventually(two_fired)
        assert len({f.batch_id for f in fired}) == len(fired)
        assert len({f.session_id for f in fired}) == len(fired)
        for f in fired:
            assert f.batch_id is not None and f.session_id is not None and f.reason is None
            assert f.fire_time is not None and f.fire_time.timestamp() % 2 == 0
        # Each firing's batch is an ordinary one: its child ends and reports.
        batch = fired[-1].batch_id
        assert batch is not None
        done = eventually(
            lambda: [n for n in client.notifications(batch_id=batch, follow_live=False)] or None
        )
        assert [n.status for n in done] == ["completed"]

        def settled_firing() -> forkd.ScheduleFiring | None:
            firings = client.get_schedule("every2").firings
            return next((f for f in firings if f.batch_id == batch and f.completed == 1), None)

        settled = eventually(settled_firing)
        assert (settled.children, settled.failed) == (1, 0)

        got = client.get_schedule("every2")
        assert len(got.next_fires) == 5 and _gaps(got.next_fires) == [2.0] * 4
        times = [f.fire_time for f in got.firings if f.fire_time is not None]
        assert len(times) == len(got.firings) and times == sorted(times, reverse=True)
        listed = {s.name: s for s in client.list_schedules()}
        assert listed["every2"].cron == "*/2 * * * * *"
        assert (listed["every2"].next_fires, listed["every2"].firings) == ([], [])

        # A trigger fires now, outside the clock.
        triggered = client.trigger_schedule("every2")
        assert (triggered.state, triggered.manual) == ("fired", True)
        assert triggered.batch_id is not None and triggered.batch_id not in {
            f.batch_id for f in fired
        }
        assert triggered.session_id is not None and triggered.fire_time is not None
        # Its notifications name the schedule.
        first = next(iter(client.notifications(batch_id=triggered.batch_id)))
        assert first.schedule == "every2"

        # Paused: no next firing times (nor firings); resumed: its times from now.
        paused = client.pause_schedule("every2")
        assert paused.paused and paused.next_fires == []
        got = client.get_schedule("every2")
        assert got.paused and got.next_fires == []
        assert any(f.manual and f.batch_id == triggered.batch_id for f in got.firings)
        # A paused schedule's trigger still fires.
        assert client.trigger_schedule("every2").state == "fired"
        resumed = client.resume_schedule("every2")
        assert not resumed.paused and len(resumed.next_fires) == 5
        assert resumed.next_fires[0] > datetime.now(timezone.utc) - timedelta(seconds=1)

        # The name is taken; a cron expression or a zone that does not parse; no directives.
        def again(**kwargs: Any) -> forkd.Schedule:
            options: dict[str, Any] = {
                "cron": "*/2 * * * * *",
                "session": {"system": "s", "workspace": scheduling.workspace},
                "directives": ["Hi."],
                **kwargs,
            }
            return client.create_schedule(options.pop("name", "every2"), **options)

        with pytest.raises(forkd.FailedPrecondition):
            again()
        with pytest.raises(forkd.InvalidArgument):
            again(name="bad-cron", cron="not a cron")
        with pytest.raises(forkd.InvalidArgument):
            again(name="bad-zone", cron="0 3 * * *", timezone="Mars/Olympus")
        with pytest.raises(forkd.InvalidArgument):
            again(name="bad-overlap", overlap="sometimes")
        with pytest.raises(forkd.InvalidArgument):
            again(name="no-directives", directives=[])
        with pytest.raises(forkd.InvalidArgument):
            again(name="bad name!")
        assert {s.name for s in client.list_schedules()} == {"every2"}

        client.delete_schedule("every2")
        with pytest.raises(forkd.NotFound):
            client.get_schedule("every2")
        for call in (
            client.delete_schedule,
            client.pause_schedule,
            client.resume_schedule,
            client.trigger_schedule,
        ):
            with pytest.raises(forkd.NotFound):
                call("every2")
        assert client.list_schedules() == []


def test_the_spec_carries_the_batchs_options(scheduling: Daemon, tmp_path: Path) -> None:
    with scheduling.client() as client:
        hook = client.create_webhook("http://127.0.0.1:9/", named_only=True).webhook
        created = client.create_schedule(
            "nightly",
            cron="0 3 * * 1-5",
            timezone="Europe/Berlin",
            overlap="allow",
            catch_up="none",
            session={
                "system": "s",
                "context": [("notes.md", "Be brief.")],
                "workspace": scheduling.workspace,
            },
            directives=[
                "One.\n@sim say one",
                ("two", "Two.\n@sim say two", forkd.Limits(max_turns=5)),
            ],
            max_turns=3,
            timeout=timedelta(minutes=10),
            webhook=hook,
        )
        assert (created.timezone, created.overlap, created.catch_up) == (
            "Europe/Berlin",
            "allow",
            "none",
        )
        assert (created.directives, created.webhook_id) == (2, hook.webhook_id)
        berlin = [t.astimezone(ZoneInfo("Europe/Berlin")) for t in created.next_fires]
        assert len(berlin) == 5
        assert all((t.hour, t.minute, t.second) == (3, 0, 0) and t.weekday() < 5 for t in berlin)

        firing = client.trigger_schedule("nightly")
        assert firing.state == "fired" and firing.batch_id is not None
        batch = firing.batch_id

        def both_ended() -> list[forkd.Notification] | None:
            ended = list(client.notifications(batch_id=batch, follow_live=False))
            return ended if len(ended) == 2 else None

        agents = [client.agents.get(n.agent_id).info for n in eventually(both_ended)]
        limits = {a.description: a.limits for a in agents}
        assert limits["One."].max_turns == 3 and limits["two"].max_turns == 5
        assert limits["One."].timeout == 600
        client.delete_schedule("nightly")
        client.delete_webhook(hook.webhook_id)

        # A tree uploaded once, when the schedule is created: each firing's session starts from it.
        tree = tmp_path / "tree"
        tree.mkdir()
        (tree / "README.md").write_text("# Uploaded\n")
        client.create_schedule(
            "uploaded", cron="0 3 * * *", session={"upload": tree}, directives=["Hi."]
        )
        firing = client.trigger_schedule("uploaded")
        assert firing.state == "fired" and firing.session_id is not None, firing
        assert client.sessions.get(firing.session_id).info.upload_origin.upload_id
        client.delete_schedule("uploaded")
        with pytest.raises(forkd.NotFound):
            client.create_schedule(
                "missing-hook",
                cron="0 3 * * *",
                session={"workspace": scheduling.workspace},
                directives=["x"],
                webhook="01a00000-0000-7000-8000-000000000000",
            )


def test_the_async_client_has_the_same_calls(scheduling: Daemon) -> None:
    async def run() -> None:
        async with forkd.AsyncClient(addr=scheduling.addr) as client:
            created = await client.create_schedule(
                "async-every2",
                cron="*/2 * * * * *",
                session={"system": "s", "workspace": scheduling.workspace},
                directives=["Hi."],
            )
            assert len(created.next_fires) == 5
            assert "async-every2" in [s.name for s in await client.list_schedules()]
            deadline = time.monotonic() + 20
            while not any(
                f.state == "fired" and not f.manual
                for f in (await client.get_schedule("async-every2")).firings
            ):
                assert time.monotonic() < deadline
                await asyncio.sleep(0.1)
            triggered = await client.trigger_schedule("async-every2")
            assert (triggered.state, triggered.manual) == ("fired", True)
            paused = await client.pause_schedule("async-every2")
            assert paused.paused and paused.next_fires == []
            assert (await client.get_schedule("async-every2")).paused
            resumed = await client.resume_schedule("async-every2")
            assert not resumed.paused and len(resumed.next_fires) == 5
            with pytest.raises(forkd.FailedPrecondition):
                await client.create_schedule(
                    "async-every2",
                    cron="* * * * *",
                    session={"workspace": scheduling.workspace},
                    directives=["Hi."],
                )
            with pytest.raises(forkd.InvalidArgument):
                await client.create_schedule(
                    "async-bad",
                    cron="61 * * * *",
                    session={"workspace": scheduling.workspace},
                    directives=["Hi."],
                )
            await client.delete_schedule("async-every2")
            with pytest.raises(forkd.NotFound):
                await client.get_schedule("async-every2")

    asyncio.run(run())


# With no daemon.


def test_schedules_and_firings_are_mapped_from_the_daemons_answers() -> None:
    utc = timezone.utc
    raw = pb.Schedule(
        name="nightly",
        cron="0 3 * * 1-5",
        timezone="Europe/Berlin",
        overlap="skip",
        catch_up="once",
        paused=True,
        created_at=Timestamp(seconds=1_700_000_000),
        next_fires=[Timestamp(seconds=1_700_000_100), Timestamp(seconds=1_700_000_200)],
        firings=[
            pb.ScheduleFiring(
                fire_time=Timestamp(seconds=1_700_000_050),
                state="fired",
                session_id="s",
                batch_id="b",
                children=3,
                completed=2,
                failed=1,
                cost_usd=0.25,
            ),
            pb.ScheduleFiring(
                fire_time=Timestamp(seconds=1_700_000_000),
                state="skipped",
                manual=True,
                reason="the previous firing's batch still runs",
            ),
        ],
        directives=3,
        webhook_id="w",
    )
    assert forkd.Schedule.of(raw) == forkd.Schedule(
        name="nightly",
        cron="0 3 * * 1-5",
        timezone="Europe/Berlin",
        overlap="skip",
        catch_up="once",
        paused=True,
        created_at=datetime.fromtimestamp(1_700_000_000, utc),
        directives=3,
        webhook_id="w",
        next_fires=[
            datetime.fromtimestamp(1_700_000_100, utc),
            datetime.fromtimestamp(1_700_000_200, utc),
        ],
        firings=[
            forkd.ScheduleFiring(
                fire_time=datetime.fromtimestamp(1_700_000_050, utc),
                state="fired",
                manual=False,
                session_id="s",
                batch_id="b",
                reason=None,
                children=3,
                completed=2,
                failed=1,
                cost_usd=0.25,
            ),
            forkd.ScheduleFiring(
                fire_time=datetime.fromtimestamp(1_700_000_000, utc),
                state="skipped",
                manual=True,
                reason="the previous firing's batch still runs",
            ),
        ],
    )
    bare = forkd.Schedule.of(pb.Schedule(name="n"))
    assert (bare.created_at, bare.webhook_id, bare.next_fires, bare.firings) == (None, None, [], [])
    empty = forkd.ScheduleFiring.of(pb.ScheduleFiring(state="firing"))
    assert (empty.fire_time, empty.session_id, empty.batch_id, empty.reason) == (
        None,
        None,
        None,
        None,
    )


class _Stub:
    def __init__(self) -> None:
        self.sent: list[Any] = []

    def _answer(self, request: Any) -> pb.ScheduleResponse:
        self.sent.append(request)
        return pb.ScheduleResponse(schedule=pb.Schedule(name=request.name))

    def CreateSchedule(self, request: Any, **_: Any) -> pb.ScheduleResponse:
        return self._answer(request)

    def GetSchedule(self, request: Any, **_: Any) -> pb.ScheduleResponse:
        return self._answer(request)

    def PauseSchedule(self, request: Any, **_: Any) -> pb.ScheduleResponse:
        return self._answer(request)

    def ResumeSchedule(self, request: Any, **_: Any) -> pb.ScheduleResponse:
        return self._answer(request)

    def ListSchedules(self, request: Any, **_: Any) -> pb.ListSchedulesResponse:
        self.sent.append(request)
        return pb.ListSchedulesResponse(schedules=[pb.Schedule(name="a"), pb.Schedule(name="b")])

    def DeleteSchedule(self, request: Any, **_: Any) -> pb.DeleteScheduleResponse:
        self.sent.append(request)
        return pb.DeleteScheduleResponse()

    def TriggerSchedule(self, request: Any, **_: Any) -> pb.TriggerScheduleResponse:
        self.sent.append(request)
        return pb.TriggerScheduleResponse(
            firing=pb.ScheduleFiring(state="fired", manual=True, batch_id="b")
        )


def _client() -> tuple[forkd.Client, _Stub]:
    client = forkd.Client(addr="unix:/nonexistent/forkd.sock", reconnect_for=0.1)
    stub = _Stub()
    client._stub = stub  # type: ignore[assignment]
    return client, stub


def test_the_spec_is_a_session_and_a_batch_without_keys() -> None:
    client, stub = _client()
    schema = {"type": "object", "required": ["verdict"]}
    client.create_schedule(
        "nightly",
        cron="0 3 * * 1-5",
        timezone="Europe/Berlin",
        overlap="allow",
        catch_up="none",
        session={
            "system": "You are a reviewer.",
            "context": [("notes.md", "Be brief.")],
            "upload_id": "u",
            "model": "m",
            "allow": ["Read"],
            "capacity_tool": True,
        },
        directives=["Review the API.", ("docs", "Review the docs.", forkd.Limits(max_turns=4))],
        isolation="copy",
        output_schema=schema,
        budget_usd=2.5,
        budget_tokens=1000,
        max_turns=10,
        idle_timeout=timedelta(seconds=90),
        webhook=forkd.Webhook(webhook_id="w", url="http://x/"),
    )
    (sent,) = stub.sent
    assert (sent.name, sent.cron, sent.timezone, sent.overlap, sent.catch_up) == (
        "nightly",
        "0 3 * * 1-5",
        "Europe/Berlin",
        "allow",
        "none",
    )
    session, batch = sent.spec.session, sent.spec.batch
    assert session == pb.CreateSessionRequest(
        system_prompt="You are a reviewer.",
        context_files=[pb.ContextFile(path="notes.md", content="Be brief.")],
        upload_id="u",
        model="m",
        allow_rules=["Read"],
        capacity_tool=True,
    )
    assert (batch.session_id, batch.idempotency_key, batch.dry_run) == ("", "", False)
    assert [d.description for d in batch.directives] == ["Review the API.", "docs"]
    assert batch.directives[1].limits.max_turns == 4
    assert (batch.isolation, batch.budget_usd, batch.budget_tokens) == ("copy", 2.5, 1000)
    assert batch.output_schema and '"verdict"' in batch.output_schema
    assert (batch.limits.max_turns, batch.limits.idle_timeout_ms) == (10, 90_000)
    assert batch.webhook_id == "w" and not batch.HasField("at_turn")

    # The defaults: empty strings the daemon reads as its defaults.
    client.create_schedule("plain", cron="* * * * *", directives=["x"])
    plain = stub.sent[-1]
    assert (plain.timezone, plain.overlap, plain.catch_up) == ("", "", "")
    assert plain.spec.session == pb.CreateSessionRequest()
    assert not plain.spec.batch.HasField("limits") and plain.spec.batch.webhook_id == ""

    # Refused before anything is sent.
    with pytest.raises(TypeError, match="session has no idempotency_key"):
        client.create_schedule(
            "x",
            cron="* * * * *",
            directives=["x"],
            session={"idempotency_key": "k"},  # type: ignore[arg-type]
        )
    with pytest.raises(ValueError, match="exclusive"):
        client.create_schedule(
            "x", cron="* * * * *", directives=["x"], session={"upload": ".", "workspace": "/w"}
        )
    with pytest.raises(TypeError):
        client.create_schedule("x", cron="* * * * *", directives="Hi.")
    with pytest.raises(ValueError):
        client.create_schedule("x", cron="* * * * *", directives=["x"], max_turns=0)
    with pytest.raises(TypeError):
        client.create_schedule("x", cron="* * * * *", directives=["x"], timezone=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        client.create_schedule("x", cron="* * * * *", directives=["x"], webhook=7)  # type: ignore[arg-type]
    assert len(stub.sent) == 2

    # The other calls name the schedule.
    assert [s.name for s in client.list_schedules()] == ["a", "b"]
    assert client.get_schedule("n").name == "n"
    assert client.pause_schedule("n").name == "n"
    assert client.resume_schedule("n").name == "n"
    client.delete_schedule("n")
    assert client.trigger_schedule("n") == forkd.ScheduleFiring(
        fire_time=None, state="fired", manual=True, batch_id="b"
    )
    names = [r.name for r in stub.sent[3:] if isinstance(r, pb.ScheduleNameRequest)]
    assert names == ["n"] * 5
    with pytest.raises(TypeError):
        client.get_schedule(7)  # type: ignore[arg-type]
