"""The sync client against a real daemon: every call, errors by meaning, typed results, a wait
that times out, and a batch followed across a SIGKILL and restart of the daemon."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pydantic
import pytest
from conftest import Daemon

import forkd


def test_a_batch_is_forked_and_each_child_reports_once(
    client: forkd.Client, daemon: Daemon
) -> None:
    session = client.sessions.create(
        system="You are a reviewer.",
        context=[daemon.workspace / "README.md", ("notes.md", "Be brief.")],
        workspace=daemon.workspace,
    )
    assert session.id
    assert client.sessions.get(session.id).id == session.id
    batch = session.fork(
        ["Review the API.\n@sim say api ok", ("docs", "Review.\n@sim say docs ok")]
    )
    assert len(batch.agent_ids) == 2
    seen = list(batch.notifications())
    assert sorted(n.agent_id for n in seen) == sorted(batch.agent_ids)
    assert all(n.status == "completed" for n in seen)
    assert {n.batch_id for n in seen} == {batch.id}
    # `wait` replays what already ended.
    done = batch.wait(timeout=30)
    assert sorted(n.agent_id for n in done) == sorted(batch.agent_ids)
    # The tenant's stream holds them too, and resumes after the seq given.
    stored = list(client.notifications(since=0, follow_live=False))
    mine = [n for n in stored if n.batch_id == batch.id]
    assert len(mine) == 2
    later = list(client.notifications(since=mine[0].seq, follow_live=False))
    assert mine[0].seq not in {n.seq for n in later}
    # An agent: its record and transcript.
    agent = client.agents.get(batch.agent_ids[0])
    assert agent.info.state == "completed"
    assert agent.info.batch_id == batch.id
    assert any(m.role == "assistant" for m in agent.transcript())


def test_errors_keep_their_meaning(client: forkd.Client, daemon: Daemon) -> None:
    with pytest.raises(forkd.NotFound) as e:
        client.sessions.get("01a00000-0000-7000-8000-000000000000")
    assert e.value.message
    session = client.sessions.create(system="s", workspace=daemon.workspace)
    with pytest.raises(forkd.InvalidArgument):
        session.fork([])
    with pytest.raises(forkd.InvalidArgument):
        session.fork(["x"], output_schema={"type": "objet"})
    gone = forkd.Client(addr=f"unix:{daemon.home / 'nobody.sock'}", reconnect_for=0.5)
    with pytest.raises(forkd.Unavailable):
        gone.sessions.get(session.id)
    with pytest.raises(ValueError):
        forkd.Client(addr="ftp://x")


class Verdict(pydantic.BaseModel):
    verdict: str
    findings: list[str]


def test_results_come_back_as_the_model_given(client: forkd.Client, daemon: Daemon) -> None:
    session = client.sessions.create(system="s", workspace=daemon.workspace)
    verdict = json.dumps({"verdict": "pass", "findings": ["a.rs"]})
    batch = session.fork([f"Judge.\n@sim json {verdict}"], output_model=Verdict)
    (n,) = batch.wait(timeout=30)
    assert n.status == "completed"
    assert n.report.structured == Verdict(verdict="pass", findings=["a.rs"])
    # A plain schema: a dict back.
    plain = session.fork(
        [f"Judge.\n@sim json {verdict}"], output_schema=Verdict.model_json_schema()
    )
    (n,) = plain.wait(timeout=30)
    assert n.report.structured == {"verdict": "pass", "findings": ["a.rs"]}


def test_a_wait_that_runs_out_raises_and_the_child_goes_on(
    client: forkd.Client, daemon: Daemon
) -> None:
    session = client.sessions.create(system="s", workspace=daemon.workspace)
    batch = session.fork(["Slow.\n@sim sleep 4s\n@sim say at last"])
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        batch.wait(timeout=0.5)
    assert time.monotonic() - started < 3
    (n,) = batch.wait(timeout=30)
    assert n.status == "completed"


def test_turns_branches_and_kills(client: forkd.Client, daemon: Daemon) -> None:
    session = client.sessions.create(system="s", workspace=daemon.workspace)
    events = list(session.send("Hello.\n@sim say hi there"))
    assert events[-1].kind == "turn_ended"
    assert "hi there" in "".join(e.text for e in events if e.kind == "text_delta")
    branch = session.branch(at_turn=1)
    assert branch.id != session.id
    batch = session.fork(["Long.\n@sim sleep 20s\n@sim say never"])
    agent = client.agents.get(batch.agent_ids[0])
    assert agent.background() == "async_launched"
    agent.kill()
    (n,) = batch.wait(timeout=30)
    assert n.status == "killed"
    events = list(client.agents.get(batch.agent_ids[0]).attach())
    assert events[-1].kind == "ended"


def test_a_batch_is_followed_across_a_daemon_restart(daemon: Daemon) -> None:
    client = daemon.client()
    session = client.sessions.create(system="s", workspace=daemon.workspace)
    batch = session.fork([f"Part {i}.\n@sim sleep 2s\n@sim say part {i} done" for i in range(2)])
    # Counts the streams opened: the restart makes the wait open a second one.
    opened = []
    subscribe = client._stub.SubscribeNotifications

    def counted(*args: Any, **kwargs: Any) -> Any:
        opened.append(1)
        return subscribe(*args, **kwargs)

    client._stub.SubscribeNotifications = counted  # type: ignore[assignment]

    def restart() -> None:
        time.sleep(0.7)
        daemon.kill9()
        time.sleep(0.5)
        daemon.start()

    t = threading.Thread(target=restart)
    t.start()
    try:
        done = batch.wait(timeout=60)
    finally:
        t.join()
    assert sorted(n.agent_id for n in done) == sorted(batch.agent_ids)
    assert all(n.status == "completed" for n in done)
    assert len(opened) >= 2, "the stream was not opened again"

    # A turn sent while the daemon is down goes once it is back, under its key.
    daemon.kill9()

    def start_later() -> None:
        time.sleep(0.5)
        daemon.start()

    t = threading.Thread(target=start_later)
    t.start()
    try:
        events = list(session.send("Still there?\n@sim say yes"))
    finally:
        t.join()
    assert events[-1].kind == "turn_ended"
    assert session.refresh().info.finished_turns == 1
    client.close()


def test_a_thousand_children_are_waited_on_in_little_memory(daemon: Daemon) -> None:
    """The client's peak RSS while it waits on 1000 children, in a process of its own."""
    script = Path(__file__).with_name("wait_many.py")
    out = subprocess.run(
        [sys.executable, str(script), daemon.addr, str(daemon.workspace), "1000"],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    report = json.loads(out.stdout)
    print(f"1000-child wait: {report}")
    assert report["completed"] == 1000
    assert report["peak_rss_mib"] < 128
