"""The async client against a real daemon: the same calls as the sync client's, with `await`
and `async for`, a stream resumed across a SIGKILL and restart, and a branch merged back."""

from __future__ import annotations

import asyncio
import json

import pytest
from conftest import Daemon

import forkd


def test_the_async_client_makes_the_same_calls(daemon: Daemon) -> None:
    async def run() -> None:
        async with forkd.AsyncClient(addr=daemon.addr) as client:
            session = await client.sessions.create(
                system="s", context=[("notes.md", "Be brief.")], workspace=daemon.workspace
            )
            assert (await client.sessions.get(session.id)).id == session.id
            verdict = json.dumps({"verdict": "pass"})
            batch = await session.fork(
                ["One.\n@sim say one", f"Two.\n@sim json {verdict}"],
                output_schema={"type": "object"},
            )
            seen = [n async for n in batch.notifications(timeout=30)]
            assert sorted(n.agent_id for n in seen) == sorted(batch.agent_ids)
            assert {"verdict": "pass"} in [n.report.structured for n in seen]
            assert len(await batch.wait(timeout=30)) == 2
            stored = [n async for n in client.notifications(follow_live=False)]
            assert batch.id in {n.batch_id for n in stored}
            agent = await client.agents.get(batch.agent_ids[0])
            assert agent.info.state == "completed"
            assert await agent.transcript()
            events = [e async for e in agent.attach()]
            assert events[-1].kind == "ended"

            turn = [e async for e in session.send("Hi.\n@sim say hello")]
            assert turn[-1].kind == "turn_ended"
            branch = await session.branch(at_turn=1)
            assert [e async for e in branch.send("More.\n@sim say more")][-1].kind == "turn_ended"
            assert await branch.merge()

            slow = await session.fork(["Slow.\n@sim sleep 20s\n@sim say never"])
            with pytest.raises(TimeoutError):
                await slow.wait(timeout=0.3)
            await (await client.agents.get(slow.agent_ids[0])).kill()
            (n,) = await slow.wait(timeout=30)
            assert n.status == "killed"

            tree = daemon.home.parent / "tree"
            tree.mkdir(exist_ok=True)
            (tree / "a.txt").write_text("from an async upload\n")
            uploaded = await client.sessions.create(system="s", upload=tree)
            assert uploaded.info.upload_origin.files == 1
            assert (await client.upload(tree)).blobs_received == 0

            with pytest.raises(forkd.NotFound):
                await client.sessions.get("01a00000-0000-7000-8000-000000000000")
            with pytest.raises(forkd.InvalidArgument):
                await session.fork([])

    asyncio.run(run())


def test_an_async_wait_is_resumed_across_a_daemon_restart(daemon: Daemon) -> None:
    async def run() -> None:
        async with forkd.AsyncClient(addr=daemon.addr) as client:
            session = await client.sessions.create(system="s", workspace=daemon.workspace)
            prompts = [f"Part {i}.\n@sim sleep 2s\n@sim say part {i} done" for i in range(2)]
            batch = await session.fork(prompts)

            async def restart() -> None:
                await asyncio.sleep(0.7)
                daemon.kill9()
                await asyncio.sleep(0.5)
                await asyncio.to_thread(daemon.start)

            restarting = asyncio.create_task(restart())
            done = await batch.wait(timeout=60)
            await restarting
            assert sorted(n.agent_id for n in done) == sorted(batch.agent_ids)
            assert all(n.status == "completed" for n in done)

    asyncio.run(run())
