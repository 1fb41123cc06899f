"""The async client: `forkd.AsyncClient`, the sync client's calls with `await` and async
iterators, on grpc's asyncio channel. Requests are built in `forkd._requests`, as the sync
client's are."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import grpc

from forkd import _apply, _config, _requests, _schedules, _upload, _webhooks
from forkd._apply import Applied
from forkd._proto.forkd.v1 import forkd_pb2 as pb
from forkd._proto.forkd.v1 import forkd_pb2_grpc as pb_grpc
from forkd._requests import ContextItem, Directive, Hooks
from forkd._schedules import Schedule, ScheduleFiring, SessionSpec
from forkd._streams import DEFAULT_RECONNECT_FOR, Backoff, afollow, aretried, is_lost, remaining
from forkd._types import AgentInfo, Capacity, DryRun, Event, HookRun, Limits, Message, Notification
from forkd._upload import Upload
from forkd._webhooks import CreatedWebhook, Webhook, WebhookAttempt, WebhookRef
from forkd.errors import details_of, from_rpc_error


class AsyncClient:
    """[`forkd.Client`] for asyncio: `async with forkd.AsyncClient() as client: ...`."""

    def __init__(
        self,
        addr: str | None = None,
        token: str | None = None,
        tls_ca: str | Path | None = None,
        reconnect_for: float = DEFAULT_RECONNECT_FOR,
    ) -> None:
        target, self._token, tls_ca = _config.resolve(addr, token, tls_ca)
        self.addr = target.given
        self.reconnect_for = reconnect_for
        self._channel = _config.aio_channel(target, tls_ca)
        self._stub = pb_grpc.ForkdStub(self._channel)
        self.sessions = AsyncSessions(self)
        self.agents = AsyncAgents(self)

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def _call(self, method: str, request: Any, idempotent: bool = False) -> Any:
        rpc = getattr(self._stub, method)

        async def once() -> Any:
            return await rpc(request, metadata=_config.metadata(self._token))

        if idempotent:
            return await aretried(once, self.reconnect_for)
        try:
            return await once()
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None

    def _stream(self, method: str, request: Any, timeout: float | None = None) -> Any:
        rpc = getattr(self._stub, method)
        return rpc(request, timeout=timeout, metadata=_config.metadata(self._token))

    async def upload(self, directory: str | Path) -> Upload:
        """Sends the tree under `directory` (what git would list in a git work tree, else what
        its ignore files keep): only the contents this tenant's store lacks travel. Sessions
        start from it with `upload_id=` (or `sessions.create(upload=DIR)` does both)."""
        tree = _upload.list_tree(directory)
        missing: list[str] = []
        for group in _upload.batches(list(tree.contents)):
            request = pb.FindMissingBlobsRequest(hashes=group)
            missing.extend((await self._call("FindMissingBlobs", request)).missing)
        try:
            reply = await self._stub.UploadWorkspace(
                _upload.requests(tree, missing), metadata=_config.metadata(self._token)
            )
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        return Upload.of(reply)

    async def capacity(self) -> Capacity:
        """[`forkd.Client.capacity`]."""
        return Capacity.of(await self._call("GetCapacity", pb.GetCapacityRequest()))

    async def create_webhook(
        self,
        url: str,
        *,
        kinds: Sequence[str] | None = None,
        session_id: str | None = None,
        named_only: bool = False,
    ) -> CreatedWebhook:
        """[`forkd.Client.create_webhook`]."""
        request = _webhooks.create(url, kinds, session_id, named_only)
        return CreatedWebhook.of(await self._call("CreateWebhook", request))

    async def list_webhooks(self) -> list[Webhook]:
        """[`forkd.Client.list_webhooks`]."""
        reply = await self._call("ListWebhooks", pb.ListWebhooksRequest())
        return [Webhook.of(w) for w in reply.webhooks]

    async def get_webhook(self, webhook_id: str) -> Webhook:
        """[`forkd.Client.get_webhook`]."""
        reply = await self._call("GetWebhook", pb.GetWebhookRequest(webhook_id=webhook_id))
        return Webhook.of(reply.webhook)

    async def delete_webhook(self, webhook_id: str) -> None:
        """[`forkd.Client.delete_webhook`]."""
        await self._call("DeleteWebhook", pb.DeleteWebhookRequest(webhook_id=webhook_id))

    async def rotate_webhook_secret(self, webhook_id: str) -> CreatedWebhook:
        """[`forkd.Client.rotate_webhook_secret`]."""
        request = pb.RotateWebhookSecretRequest(webhook_id=webhook_id)
        return CreatedWebhook.of(await self._call("RotateWebhookSecret", request))

    async def test_webhook(self, webhook_id: str) -> WebhookAttempt:
        """[`forkd.Client.test_webhook`]."""
        reply = await self._call("TestWebhook", pb.TestWebhookRequest(webhook_id=webhook_id))
        return WebhookAttempt.of(reply.attempt)

    async def webhook_attempts(
        self, webhook_id: str, limit: int | None = None
    ) -> list[WebhookAttempt]:
        """[`forkd.Client.webhook_attempts`]."""
        request = _webhooks.attempts(webhook_id, limit)
        reply = await self._call("ListWebhookAttempts", request)
        return [WebhookAttempt.of(a) for a in reply.attempts]

    async def create_schedule(
        self,
        name: str,
        *,
        cron: str,
        directives: Iterable[Directive],
        session: SessionSpec | None = None,
        timezone: str | None = None,
        overlap: str | None = None,
        catch_up: str | None = None,
        isolation: str = "",
        output_schema: dict[str, Any] | None = None,
        output_model: Any = None,
        budget_usd: float = 0.0,
        budget_tokens: int = 0,
        warmup_gating: bool | None = None,
        timeout: float | timedelta | None = None,
        idle_timeout: float | timedelta | None = None,
        max_turns: int | None = None,
        max_output_tokens: int | None = None,
        timeout_excludes_throttle: bool | None = None,
        webhook: WebhookRef | None = None,
    ) -> Schedule:
        """[`forkd.Client.create_schedule`]."""
        session_request, upload = _schedules.session_spec(session)
        batch = _schedules.batch_spec(
            directives,
            isolation,
            output_schema,
            output_model,
            budget_usd,
            budget_tokens,
            warmup_gating,
            Limits(timeout, idle_timeout, max_turns, max_output_tokens, timeout_excludes_throttle),
            webhook,
        )
        if upload is not None:
            session_request.upload_id = (await self.upload(upload)).upload_id
        request = _schedules.create(name, cron, timezone, overlap, catch_up, session_request, batch)
        return Schedule.of((await self._call("CreateSchedule", request)).schedule)

    async def list_schedules(self) -> list[Schedule]:
        """[`forkd.Client.list_schedules`]."""
        reply = await self._call("ListSchedules", pb.ListSchedulesRequest())
        return [Schedule.of(s) for s in reply.schedules]

    async def get_schedule(self, name: str) -> Schedule:
        """[`forkd.Client.get_schedule`]."""
        reply = await self._call("GetSchedule", _schedules.named(name))
        return Schedule.of(reply.schedule)

    async def pause_schedule(self, name: str) -> Schedule:
        """[`forkd.Client.pause_schedule`]."""
        reply = await self._call("PauseSchedule", _schedules.named(name))
        return Schedule.of(reply.schedule)

    async def resume_schedule(self, name: str) -> Schedule:
        """[`forkd.Client.resume_schedule`]."""
        reply = await self._call("ResumeSchedule", _schedules.named(name))
        return Schedule.of(reply.schedule)

    async def delete_schedule(self, name: str) -> None:
        """[`forkd.Client.delete_schedule`]."""
        await self._call("DeleteSchedule", _schedules.named(name))

    async def trigger_schedule(self, name: str) -> ScheduleFiring:
        """[`forkd.Client.trigger_schedule`]."""
        reply = await self._call("TriggerSchedule", _schedules.named(name))
        return ScheduleFiring.of(reply.firing)

    async def notifications(
        self,
        since: int = 0,
        *,
        session_id: str = "",
        batch_id: str = "",
        follow_live: bool = True,
    ) -> AsyncIterator[Notification]:
        """This tenant's task notifications after `since`, resumed across a daemon restart."""
        request = pb.SubscribeNotificationsRequest(
            session_id=session_id, batch_id=batch_id, follow=follow_live
        )

        def open_stream(seq: int) -> AsyncIterator[pb.Notification]:
            request.since_seq = seq
            stream: AsyncIterator[pb.Notification] = self._stream("SubscribeNotifications", request)
            return stream

        window = self.reconnect_for
        async for n in afollow(open_stream, lambda n: n.seq, since, window, ends=not follow_live):
            yield Notification.of(n)


class AsyncSessions:
    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def create(
        self,
        system: str = "",
        context: Sequence[ContextItem] = (),
        *,
        workspace: str | Path | None = None,
        upload: str | Path | None = None,
        upload_id: str | None = None,
        model: str = "",
        permission_mode: str = "",
        sandbox: str = "",
        allow: Sequence[str] = (),
        deny: Sequence[str] = (),
        capacity_tool: bool = False,
        hooks: Hooks | None = None,
        idempotency_key: str | None = None,
    ) -> AsyncSession:
        """[`forkd.Sessions.create`]."""
        if upload is not None:
            if workspace is not None or upload_id is not None:
                raise ValueError("upload= is exclusive with workspace= and upload_id=")
            upload_id = (await self._client.upload(upload)).upload_id
        request = _requests.create_session(
            system,
            context,
            workspace,
            upload_id,
            model,
            permission_mode,
            sandbox,
            allow,
            deny,
            capacity_tool,
            idempotency_key,
            hooks=hooks,
        )
        reply = await self._client._call("CreateSession", request, idempotent=True)
        return AsyncSession(self._client, reply.session)

    async def get(self, session_id: str) -> AsyncSession:
        request = pb.GetSessionRequest(session_id=session_id)
        reply = await self._client._call("GetSession", request)
        return AsyncSession(self._client, reply.session)


class AsyncSession:
    """[`forkd.Session`] for asyncio."""

    def __init__(self, client: AsyncClient, info: pb.Session) -> None:
        self._client = client
        self.info = info
        self.id: str = info.session_id

    def __repr__(self) -> str:
        return f"AsyncSession({self.id!r})"

    @property
    def hook_events(self) -> list[str]:
        """[`forkd.Session.hook_events`]."""
        return list(self.info.hook_events)

    async def fork(
        self,
        directives: Iterable[Directive],
        *,
        isolation: str = "",
        output_schema: dict[str, Any] | None = None,
        output_model: Any = None,
        budget_usd: float = 0.0,
        budget_tokens: int = 0,
        at_turn: int | None = None,
        warmup_gating: bool | None = None,
        timeout: float | timedelta | None = None,
        idle_timeout: float | timedelta | None = None,
        max_turns: int | None = None,
        max_output_tokens: int | None = None,
        timeout_excludes_throttle: bool | None = None,
        webhook: WebhookRef | None = None,
        idempotency_key: str | None = None,
    ) -> AsyncBatch:
        """[`forkd.Session.fork`]."""
        request = _requests.fork(
            self.id,
            directives,
            isolation,
            output_schema,
            output_model,
            budget_usd,
            budget_tokens,
            at_turn,
            warmup_gating,
            idempotency_key,
            Limits(timeout, idle_timeout, max_turns, max_output_tokens, timeout_excludes_throttle),
            webhook_id=_webhooks.webhook_id(webhook),
        )
        reply = await self._client._call("ForkBatch", request, idempotent=True)
        return AsyncBatch(self._client, reply.batch_id, list(reply.agent_ids), output_model)

    async def dry_run(
        self,
        directives: Iterable[Directive],
        *,
        isolation: str = "",
        output_schema: dict[str, Any] | None = None,
        output_model: Any = None,
        budget_usd: float = 0.0,
        budget_tokens: int = 0,
        at_turn: int | None = None,
        warmup_gating: bool | None = None,
        timeout: float | timedelta | None = None,
        idle_timeout: float | timedelta | None = None,
        max_turns: int | None = None,
        max_output_tokens: int | None = None,
        timeout_excludes_throttle: bool | None = None,
        webhook: WebhookRef | None = None,
        idempotency_key: str | None = None,
    ) -> DryRun:
        """[`forkd.Session.dry_run`]."""
        request = _requests.fork(
            self.id,
            directives,
            isolation,
            output_schema,
            output_model,
            budget_usd,
            budget_tokens,
            at_turn,
            warmup_gating,
            idempotency_key,
            Limits(timeout, idle_timeout, max_turns, max_output_tokens, timeout_excludes_throttle),
            dry_run=True,
            webhook_id=_webhooks.webhook_id(webhook),
        )
        reply = await self._client._call("ForkBatch", request, idempotent=True)
        return DryRun.of(reply.dry_run)

    async def send(self, text: str, *, idempotency_key: str | None = None) -> AsyncIterator[Event]:
        """[`forkd.Session.send`]."""
        request = pb.SendMessageRequest(
            session_id=self.id, text=text, idempotency_key=_requests.key(idempotency_key)
        )
        backoff = Backoff(self._client.reconnect_for)
        while True:
            started = False
            try:
                async for event in self._client._stream("SendMessage", request):
                    started = True
                    yield _requests.session_event(event)
                return
            except grpc.RpcError as e:
                if started or not is_lost(e):
                    raise from_rpc_error(e) from None
                await asyncio.sleep(backoff.next(details_of(e)))

    async def branch(self, *, at_turn: int, idempotency_key: str | None = None) -> AsyncSession:
        """[`forkd.Session.branch`]."""
        request = pb.BranchSessionRequest(
            session_id=self.id, at_turn=at_turn, idempotency_key=_requests.key(idempotency_key)
        )
        reply = await self._client._call("BranchSession", request, idempotent=True)
        return AsyncSession(self._client, reply.session)

    async def merge(self, *, summary: bool = False, idempotency_key: str | None = None) -> str:
        """[`forkd.Session.merge`]."""
        request = pb.MergeBranchRequest(
            session_id=self.id, summary=summary, idempotency_key=_requests.key(idempotency_key)
        )
        reply = await self._client._call("MergeBranch", request, idempotent=True)
        return str(reply.note)


class AsyncBatch:
    """[`forkd.Batch`] for asyncio."""

    def __init__(
        self, client: AsyncClient, batch_id: str, agent_ids: list[str], model: Any = None
    ) -> None:
        self._client = client
        self.id = batch_id
        self.agent_ids = agent_ids
        self._model = model

    def __repr__(self) -> str:
        return f"AsyncBatch({self.id!r}, {len(self.agent_ids)} children)"

    async def notifications(self, timeout: float | None = None) -> AsyncIterator[Notification]:
        """[`forkd.Batch.notifications`]."""
        deadline = None if timeout is None else time.monotonic() + timeout
        waiting = set(self.agent_ids)
        request = pb.SubscribeNotificationsRequest(batch_id=self.id, follow=True)

        def open_stream(seq: int) -> AsyncIterator[pb.Notification]:
            request.since_seq = seq
            stream: AsyncIterator[pb.Notification] = self._client._stream(
                "SubscribeNotifications", request, timeout=remaining(deadline)
            )
            return stream

        if not waiting:
            return
        window = self._client.reconnect_for
        async for n in afollow(open_stream, lambda n: n.seq, 0, window, deadline):
            if n.agent_id in waiting:
                waiting.discard(n.agent_id)
                yield Notification.of(n, self._model)
                if not waiting:
                    return

    async def wait(self, timeout: float | None = None) -> list[Notification]:
        """[`forkd.Batch.wait`]."""
        return [n async for n in self.notifications(timeout=timeout)]

    async def changes(self) -> dict[str, pb.GetChangesResponse]:
        """[`forkd.Batch.changes`]."""
        out = {}
        for agent_id in self.agent_ids:
            request = pb.GetChangesRequest(agent_id=agent_id)
            out[agent_id] = await self._client._call("GetChanges", request)
        return out

    async def apply(self, to: str | Path | None = None) -> list[Applied]:
        """Applies the isolated children's changes, in order: to the session's workspace on the
        daemon's machine, or with `to` to a directory here (a checkout of the tree the batch
        forked from; needs git). A child with a conflict stays unapplied, all of its files; its
        result lists the conflicts per file."""
        if to is None:
            apply = pb.ApplyChangesRequest(batch_id=self.id)
            reply = await self._client._call("ApplyChanges", apply)
            return [Applied.of(a) for a in reply.results]
        directory = Path(to).resolve()
        if not directory.is_dir():
            raise ValueError(f"{to} is not a directory")
        results = []
        for agent_id in self.agent_ids:
            request = pb.GetChangesRequest(agent_id=agent_id)
            changes = await self._client._call("GetChanges", request)
            results.append(_apply.apply_to(directory, changes))
        return results


class AsyncAgents:
    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def get(self, agent_id: str) -> AsyncAgent:
        reply = await self._client._call("GetAgent", pb.GetAgentRequest(agent_id=agent_id))
        return AsyncAgent(self._client, AgentInfo.of(reply.agent))


class AsyncAgent:
    """[`forkd.Agent`] for asyncio."""

    def __init__(self, client: AsyncClient, info: AgentInfo) -> None:
        self._client = client
        self.info = info
        self.id = info.agent_id

    def __repr__(self) -> str:
        return f"AsyncAgent({self.id!r}, {self.info.state})"

    async def attach(self, since: int = 0) -> AsyncIterator[Event]:
        """[`forkd.Agent.attach`]."""
        request = pb.AttachRequest(agent_id=self.id)

        def open_stream(seq: int) -> AsyncIterator[pb.AgentEvent]:
            request.since_seq = seq
            stream: AsyncIterator[pb.AgentEvent] = self._client._stream("Attach", request)
            return stream

        window = self._client.reconnect_for
        async for raw in afollow(open_stream, _requests.next_message, since, window):
            event, last = _requests.agent_event(raw)
            yield event
            if last:
                return

    async def background(self) -> str:
        """[`forkd.Agent.background`]."""
        reply = await self._client._call("Background", pb.BackgroundRequest(agent_id=self.id))
        return str(reply.status)

    async def kill(self) -> None:
        """[`forkd.Agent.kill`]."""
        await self._client._call("Kill", pb.KillRequest(agent_id=self.id))

    async def transcript(self, include_shared: bool = False) -> list[Message]:
        """[`forkd.Agent.transcript`]."""
        request = pb.GetTranscriptRequest(agent_id=self.id, include_shared_prefix=include_shared)
        reply = await self._client._call("GetTranscript", request)
        return [Message.of(m) for m in reply.messages]

    async def hook_runs(self) -> list[HookRun]:
        """[`forkd.Agent.hook_runs`]."""
        request = pb.GetTranscriptRequest(agent_id=self.id)
        reply = await self._client._call("GetTranscript", request)
        return [HookRun.of(h) for h in reply.hook_runs]
