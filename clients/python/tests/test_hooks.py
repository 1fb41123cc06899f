"""A session's own hooks (`hooks=`): sent as the settings text (a dict JSON-encoded, a string as
is), their events read back as `session.hook_events`, run for the session's children against a
real daemon (a `PreToolUse` hook that blocks `Bash`) with each run read back as `agent.hook_runs()`,
and refused when a hook asks to run outside the sandbox, by the sync and the async client alike."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timezone
from typing import Any

import pytest
from conftest import Daemon
from google.protobuf.timestamp_pb2 import Timestamp

import forkd
from forkd import _requests
from forkd._proto.forkd.v1 import forkd_pb2 as pb

BLOCK: dict[str, Any] = {
    "type": "command",
    "command": "echo blocked-by-hook >&2; exit 2",
}
HOOKS: dict[str, Any] = {"hooks": {"PreToolUse": [{"matcher": "Bash", "hooks": [BLOCK]}]}}
OUTSIDE: dict[str, Any] = {
    "hooks": {"Stop": [{"hooks": [{"type": "command", "command": "true", "sandbox": False}]}]}
}
BASH = 'Go.\n@sim tool Bash {"command":"echo hi"}\n@sim say done'


def _request(hooks: _requests.Hooks | None) -> pb.CreateSessionRequest:
    return _requests.create_session("s", (), None, None, "", "", "", (), (), False, None, hooks)


def test_hooks_are_sent_as_the_settings_text() -> None:
    assert _request(HOOKS).hooks_json == json.dumps(HOOKS)
    assert json.loads(_request(HOOKS).hooks_json) == HOOKS
    text = '{"hooks": {"Stop": []}}'
    assert _request(text).hooks_json == text
    assert _request(None).hooks_json == ""
    with pytest.raises(TypeError, match="hooks is a settings dict or its JSON text"):
        _request([HOOKS])  # type: ignore[arg-type]
    # A schedule's session cannot bring its own: refused before anything is sent.
    with (
        forkd.Client(addr="unix:/nonexistent.sock") as client,
        pytest.raises(TypeError, match="session has no hooks"),
    ):
        client.create_schedule(
            "n",
            cron="* * * * *",
            directives=["x"],
            session={"hooks": HOOKS},  # type: ignore[arg-type]
        )


def _blocked(runs: list[forkd.HookRun]) -> None:
    """The one run of `BLOCK` for the child's `Bash` call: denied, with what it wrote."""
    assert len(runs) == 1, runs
    (run,) = runs
    assert run.event == "PreToolUse"
    assert run.tool_name == "Bash"
    assert run.tool_use_id is not None and run.tool_use_id.startswith("toolu_"), run
    assert run.program == "echo"
    assert run.decision == "deny"
    assert run.exit_code == 2
    assert run.output == "blocked-by-hook"
    assert run.started_at is not None and run.started_at.tzinfo is not None
    assert run.started_at <= datetime.now(timezone.utc)
    assert run.duration_ms >= 0


def test_hook_runs_are_mapped_from_the_daemons_answer() -> None:
    started = Timestamp(seconds=1_700_000_000, nanos=5_000_000)
    full = pb.HookRun(
        event="PreToolUse",
        tool_use_id="toolu_1",
        tool_name="Bash",
        program="python3",
        exit_code=0,
        decision="allow",
        output="ok",
        started_at=started,
        duration_ms=31,
    )
    assert forkd.HookRun.of(full) == forkd.HookRun(
        "PreToolUse",
        "toolu_1",
        "Bash",
        "python3",
        0,
        "allow",
        "ok",
        datetime(2023, 11, 14, 22, 13, 20, 5000, tzinfo=timezone.utc),
        31,
    )
    # Not about a tool call, killed before it exited: no tool, no exit code (0 is one).
    bare = forkd.HookRun.of(pb.HookRun(event="Stop", program="sh", decision="error"))
    assert (bare.tool_use_id, bare.tool_name, bare.exit_code, bare.started_at) == (None,) * 4
    assert (bare.output, bare.duration_ms) == ("", 0)


def test_a_sessions_own_hooks_run_for_its_children(client: forkd.Client, daemon: Daemon) -> None:
    session = client.sessions.create(
        system="s",
        workspace=daemon.workspace,
        permission_mode="bypassPermissions",
        hooks=HOOKS,
    )
    assert session.hook_events == ["PreToolUse"]
    assert client.sessions.get(session.id).hook_events == ["PreToolUse"]
    plain = client.sessions.create(system="s", workspace=daemon.workspace)
    assert plain.hook_events == []

    batch = session.fork([BASH])
    (n,) = batch.wait(timeout=60)
    assert n.status == "completed"
    transcript = client.agents.get(batch.agent_ids[0]).transcript()
    text = json.dumps([m.content for m in transcript])
    assert "blocked-by-hook" in text, text
    _blocked(client.agents.get(batch.agent_ids[0]).hook_runs())
    # A session without hooks of its own: its child's runs are the operator's (none here).
    bare = client.sessions.create(
        system="s", workspace=daemon.workspace, permission_mode="bypassPermissions"
    )
    (quiet,) = bare.fork([BASH]).wait(timeout=60)
    assert quiet.status == "completed"
    assert client.agents.get(quiet.agent_id).hook_runs() == []

    with pytest.raises(forkd.InvalidArgument) as e:
        client.sessions.create(system="s", workspace=daemon.workspace, hooks=OUTSIDE)
    assert "sandbox" in e.value.message
    with pytest.raises(forkd.InvalidArgument):
        client.sessions.create(system="s", workspace=daemon.workspace, hooks="{not json")


def test_the_async_client_takes_hooks_too(daemon: Daemon) -> None:
    async def run() -> None:
        async with forkd.AsyncClient(addr=daemon.addr) as client:
            session = await client.sessions.create(
                system="s",
                workspace=daemon.workspace,
                permission_mode="bypassPermissions",
                hooks=json.dumps(HOOKS),
            )
            assert session.hook_events == ["PreToolUse"]
            assert (await client.sessions.get(session.id)).hook_events == ["PreToolUse"]
            batch = await session.fork([BASH])
            (n,) = await batch.wait(timeout=60)
            assert n.status == "completed"
            _blocked(await (await client.agents.get(n.agent_id)).hook_runs())
            with pytest.raises(forkd.InvalidArgument):
                await client.sessions.create(system="s", workspace=daemon.workspace, hooks=OUTSIDE)

    asyncio.run(run())
