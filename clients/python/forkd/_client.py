"""The synchronous client: sessions, fork batches, agents and notifications. (`forkd._aio` is
the same with `await`; both build their requests in `forkd._requests`.)"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
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
from forkd._streams import DEFAULT_RECONNECT_FOR, Backoff, follow, is_lost, remaining, retried
from forkd._types import AgentInfo, Capacity, DryRun, Event, HookRun, Limits, Message, Notification
from forkd._upload import Upload
from forkd._webhooks import CreatedWebhook, Webhook, WebhookAttempt, WebhookRef
from forkd.errors import details_of, from_rpc_error


class Client:
    """A connection to forkd. With no arguments: `FORKD_ADDR` (else the socket in `FORKD_HOME`,
    default `~/.forkd`), `FORKD_TOKEN` and `FORKD_CA_CERT`, as forkctl reads them.

    `reconnect_for` (seconds): how long streams and retried calls keep trying to reach a daemon
    that went away (restarted, say) before raising `forkd.Unavailable`."""

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
        self._channel = _config.channel(target, tls_ca)
        self._stub = pb_grpc.ForkdStub(self._channel)
        self.sessions = Sessions(self)
        self.agents = Agents(self)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _call(self, method: str, request: Any, idempotent: bool = False) -> Any:
        rpc = getattr(self._stub, method)

        def once() -> Any:
            return rpc(request, metadata=_config.metadata(self._token))

        if idempotent:
            return retried(once, self.reconnect_for)
        try:
            return once()
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None

    def _stream(self, method: str, request: Any, timeout: float | None = None) -> Any:
        rpc = getattr(self._stub, method)
        return rpc(request, timeout=timeout, metadata=_config.metadata(self._token))

    def upload(self, directory: str | Path) -> Upload:
        """Sends the tree under `directory` (what git would list in a git work tree, else what
        its ignore files keep): only the contents this tenant's store lacks travel. Sessions
        start from it with `upload_id=` (or `sessions.create(upload=DIR)` does both)."""
        tree = _upload.list_tree(directory)
        missing: list[str] = []
        for group in _upload.batches(list(tree.contents)):
            request = pb.FindMissingBlobsRequest(hashes=group)
            missing.extend((self._call("FindMissingBlobs", request)).missing)
        try:
            reply = self._stub.UploadWorkspace(
                _upload.requests(tree, missing), metadata=_config.metadata(self._token)
            )
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        return Upload.of(reply)

    def capacity(self) -> Capacity:
        """What the daemon can take now, to ask before submitting: its running slots (used, free,
        total), the caller's own runs waiting for one, what the tenant's budget has left (`None`
        without one), and the provider limiter per key and model."""
        return Capacity.of(self._call("GetCapacity", pb.GetCapacityRequest()))

    def create_webhook(
        self,
        url: str,
        *,
        kinds: Sequence[str] | None = None,
        session_id: str | None = None,
        named_only: bool = False,
    ) -> CreatedWebhook:
        """Registers `url` (http:// or https://) as a webhook of the caller's tenant: its task
        notifications are posted there, signed to the Standard Webhooks specification. `kinds`
        (`fork`, `typed`, `turn`; all by default) and `session_id` filter them; a `named_only`
        one receives only the batches that name it (`fork(..., webhook=ID)`). Answers the
        webhook and its signing secret (`whsec_…`), shown this once. `InvalidArgument` for a URL
        whose address the daemon does not reach (loopback, private, link-local, metadata)."""
        request = _webhooks.create(url, kinds, session_id, named_only)
        return CreatedWebhook.of(self._call("CreateWebhook", request))

    def list_webhooks(self) -> list[Webhook]:
        """The caller's tenant's webhooks."""
        reply = self._call("ListWebhooks", pb.ListWebhooksRequest())
        return [Webhook.of(w) for w in reply.webhooks]

    def get_webhook(self, webhook_id: str) -> Webhook:
        """One webhook of the caller's tenant (`NotFound` for another tenant's)."""
        reply = self._call("GetWebhook", pb.GetWebhookRequest(webhook_id=webhook_id))
        return Webhook.of(reply.webhook)

    def delete_webhook(self, webhook_id: str) -> None:
        """Deletes a webhook: nothing more is sent to it."""
        self._call("DeleteWebhook", pb.DeleteWebhookRequest(webhook_id=webhook_id))

    def rotate_webhook_secret(self, webhook_id: str) -> CreatedWebhook:
        """A new signing secret for the webhook, shown this once. The one it replaces signs too
        until `webhook.previous_secret_until` (the daemon's overlap, 24 hours by default), so a
        receiver verifies either while it switches."""
        request = pb.RotateWebhookSecretRequest(webhook_id=webhook_id)
        return CreatedWebhook.of(self._call("RotateWebhookSecret", request))

    def test_webhook(self, webhook_id: str) -> WebhookAttempt:
        """Sends the webhook a `ping` now, once, and answers how it went (`.status`, `.error`,
        `.latency_ms`)."""
        reply = self._call("TestWebhook", pb.TestWebhookRequest(webhook_id=webhook_id))
        return WebhookAttempt.of(reply.attempt)

    def webhook_attempts(self, webhook_id: str, limit: int | None = None) -> list[WebhookAttempt]:
        """The webhook's latest attempts, newest first (`limit`: the daemon's 50 by default)."""
        request = _webhooks.attempts(webhook_id, limit)
        return [WebhookAttempt.of(a) for a in self._call("ListWebhookAttempts", request).attempts]

    def create_schedule(
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
        """Forks a batch on a clock: each firing creates a session of its own (`session`:
        `sessions.create`'s keyword arguments, e.g. `{"system": ..., "workspace": ...}`; an
        `upload` directory is uploaded now, once) and forks `directives` on it with `fork`'s
        options. `cron` is 5 fields (minute hour day-of-month month day-of-week) or 6 with
        seconds first, read in `timezone` (IANA; UTC by default). `overlap`: `skip` (default: a
        firing while the previous firing's batch runs is recorded as skipped) or `allow`;
        `catch_up`: `once` (default: after downtime the latest missed firing runs once) or
        `none`. `name` (letters, digits, `.`, `_`, `-`) is unique in the tenant: a name taken is
        `FailedPrecondition`; a cron expression or time zone that does not parse, or a spec that
        would not fork, `InvalidArgument`."""
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
            session_request.upload_id = self.upload(upload).upload_id
        request = _schedules.create(name, cron, timezone, overlap, catch_up, session_request, batch)
        return Schedule.of(self._call("CreateSchedule", request).schedule)

    def list_schedules(self) -> list[Schedule]:
        """The caller's tenant's schedules (without their next firing times and firings)."""
        reply = self._call("ListSchedules", pb.ListSchedulesRequest())
        return [Schedule.of(s) for s in reply.schedules]

    def get_schedule(self, name: str) -> Schedule:
        """A schedule with its next firing times and its latest firings, newest first, with
        their batches' results so far (`NotFound` for another tenant's)."""
        return Schedule.of(self._call("GetSchedule", _schedules.named(name)).schedule)

    def pause_schedule(self, name: str) -> Schedule:
        """Stops the schedule firing until it is resumed (a trigger still fires it)."""
        return Schedule.of(self._call("PauseSchedule", _schedules.named(name)).schedule)

    def resume_schedule(self, name: str) -> Schedule:
        """Fires the schedule again from now: what was due while it was paused is not caught
        up."""
        return Schedule.of(self._call("ResumeSchedule", _schedules.named(name)).schedule)

    def delete_schedule(self, name: str) -> None:
        """Deletes the schedule and its record of firings (their sessions and batches stay)."""
        self._call("DeleteSchedule", _schedules.named(name))

    def trigger_schedule(self, name: str) -> ScheduleFiring:
        """Fires the schedule now, outside its clock (a paused one too), and answers the firing:
        `fired` with its `session_id` and `batch_id`, or `failed` with its `reason`."""
        reply = self._call("TriggerSchedule", _schedules.named(name))
        return ScheduleFiring.of(reply.firing)

    def notifications(
        self,
        since: int = 0,
        *,
        session_id: str = "",
        batch_id: str = "",
        follow_live: bool = True,
    ) -> Iterator[Notification]:
        """This tenant's task notifications after `since`: the stored ones, then live ones (unless
        `follow_live` is false), resumed after the last one yielded across a daemon restart."""
        request = pb.SubscribeNotificationsRequest(
            session_id=session_id, batch_id=batch_id, follow=follow_live
        )

        def open_stream(seq: int) -> Iterator[pb.Notification]:
            request.since_seq = seq
            stream: Iterator[pb.Notification] = self._stream("SubscribeNotifications", request)
            return stream

        window = self.reconnect_for
        for n in follow(open_stream, lambda n: n.seq, since, window, ends=not follow_live):
            yield Notification.of(n)


class Sessions:
    def __init__(self, client: Client) -> None:
        self._client = client

    def create(
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
    ) -> Session:
        """A new parent session: its system prompt and context files (paths read here, or
        `(name, text)`), in `workspace` (a directory on the daemon's machine), or in a tree sent
        from here: `upload` (a directory, uploaded first) or `upload_id` (an upload's id).
        `capacity_tool` gives its model the read-only `Capacity` tool (how busy the daemon is,
        to size its fan-out). `hooks`: the session's own hooks, a Claude Code settings dict
        (`{"hooks": {"PreToolUse": [...]}}`, JSON-encoded here) or its JSON text, run after the
        operator's, in the session's sandbox, for it, its children and its branches
        (`InvalidArgument` if it does not parse or a hook asks for `"sandbox": false`);
        `session.hook_events` tells which events they are for. Retried across a daemon restart
        under one idempotency key."""
        if upload is not None:
            if workspace is not None or upload_id is not None:
                raise ValueError("upload= is exclusive with workspace= and upload_id=")
            upload_id = (self._client.upload(upload)).upload_id
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
        reply = self._client._call("CreateSession", request, idempotent=True)
        return Session(self._client, reply.session)

    def get(self, session_id: str) -> Session:
        reply = self._client._call("GetSession", pb.GetSessionRequest(session_id=session_id))
        return Session(self._client, reply.session)


class Session:
    """A parent session: fork children from it, send it turns, branch it."""

    def __init__(self, client: Client, info: pb.Session) -> None:
        self._client = client
        self.info = info
        self.id: str = info.session_id

    def __repr__(self) -> str:
        return f"Session({self.id!r})"

    @property
    def hook_events(self) -> list[str]:
        """The events its own hooks (`hooks=` at creation) are for, e.g. `["PreToolUse"]`; their
        commands are never shown."""
        return list(self.info.hook_events)

    def fork(
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
    ) -> Batch:
        """Forks one child per directive (a prompt, `(description, prompt)`, or `(description,
        prompt, forkd.Limits(...))`); they inherit the session's context. `output_model` (a
        pydantic model class) or `output_schema` (a JSON Schema dict): each child ends with a
        JSON object valid against it, given back as `report.structured` (a model instance with
        `output_model`).

        The children's limits (`forkd.Limits` tells each; a directive's own win): `timeout` and
        `idle_timeout` (seconds or a `timedelta`), `max_turns`, `max_output_tokens`,
        `timeout_excludes_throttle`. A child past one ends `timed_out`, a failure, with a partial
        report. A value that is not positive raises `ValueError` before anything is sent.

        `webhook` (a webhook's id, or the `forkd.Webhook`): the batch's notifications are also
        posted to that webhook of the caller's tenant, whatever its own filter says (`NotFound`
        for another tenant's or a missing one)."""
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
        reply = self._client._call("ForkBatch", request, idempotent=True)
        return Batch(self._client, reply.batch_id, list(reply.agent_ids), output_model)

    def dry_run(
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
        """Asks the daemon what `fork` with the same arguments would do, without doing it: the
        batch is checked as a submission would be (refused the same way: `InvalidArgument` for a
        turn that has not ended, a bad schema, …), nothing is stored or started, and the
        idempotency key is not recorded. Its `DryRun` tells the children, the prefix they would
        share, the first requests' cost forked and as independent agents, and the daemon's free
        slots and the caller's queued runs now."""
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
        reply = self._client._call("ForkBatch", request, idempotent=True)
        return DryRun.of(reply.dry_run)

    def send(self, text: str, *, idempotency_key: str | None = None) -> Iterator[Event]:
        """Runs one parent turn on `text`: its events as they come, the last `turn_ended`. Sent
        again under its idempotency key while the daemon is unavailable before the turn's first
        event (the daemon stores the message once); a turn cut off later raises."""
        request = pb.SendMessageRequest(
            session_id=self.id, text=text, idempotency_key=_requests.key(idempotency_key)
        )
        backoff = Backoff(self._client.reconnect_for)
        while True:
            started = False
            try:
                for event in self._client._stream("SendMessage", request):
                    started = True
                    yield _requests.session_event(event)
                return
            except grpc.RpcError as e:
                if started or not is_lost(e):
                    raise from_rpc_error(e) from None
                time.sleep(backoff.next(details_of(e)))

    def branch(self, *, at_turn: int, idempotency_key: str | None = None) -> Session:
        """A new session holding this one's history up to turn `at_turn`."""
        request = pb.BranchSessionRequest(
            session_id=self.id, at_turn=at_turn, idempotency_key=_requests.key(idempotency_key)
        )
        reply = self._client._call("BranchSession", request, idempotent=True)
        return Session(self._client, reply.session)

    def merge(self, *, summary: bool = False, idempotency_key: str | None = None) -> str:
        """Merges this branch back into the session it branched from (with `summary`, its model
        summarizes the branch first); the note the origin's model reads."""
        request = pb.MergeBranchRequest(
            session_id=self.id, summary=summary, idempotency_key=_requests.key(idempotency_key)
        )
        reply = self._client._call("MergeBranch", request, idempotent=True)
        return str(reply.note)

    def refresh(self) -> Session:
        return self._client.sessions.get(self.id)


class Batch:
    """A fork batch: its children's ids, their notifications, their changes."""

    def __init__(
        self, client: Client, batch_id: str, agent_ids: list[str], model: Any = None
    ) -> None:
        self._client = client
        self.id = batch_id
        self.agent_ids = agent_ids
        self._model = model

    def __repr__(self) -> str:
        return f"Batch({self.id!r}, {len(self.agent_ids)} children)"

    def notifications(self, timeout: float | None = None) -> Iterator[Notification]:
        """Each child's notification as it ends, once (replayed, then live), until every child
        has reported; resumed across a daemon restart. `timeout` (seconds) raises
        `TimeoutError` when it passes; the children go on."""
        deadline = None if timeout is None else time.monotonic() + timeout
        waiting = set(self.agent_ids)
        request = pb.SubscribeNotificationsRequest(batch_id=self.id, follow=True)

        def open_stream(seq: int) -> Iterator[pb.Notification]:
            request.since_seq = seq
            stream: Iterator[pb.Notification] = self._client._stream(
                "SubscribeNotifications", request, timeout=remaining(deadline)
            )
            return stream

        if not waiting:
            return
        for n in follow(open_stream, lambda n: n.seq, 0, self._client.reconnect_for, deadline):
            if n.agent_id in waiting:
                waiting.discard(n.agent_id)
                yield Notification.of(n, self._model)
                if not waiting:
                    return

    def wait(self, timeout: float | None = None) -> list[Notification]:
        """Every child's notification, in the order they ended. `TimeoutError` when `timeout`
        (seconds) passes first; the children go on."""
        return list(self.notifications(timeout=timeout))

    def changes(self) -> dict[str, pb.GetChangesResponse]:
        """Each isolated child's changes (files, diff, state), by agent id."""
        return {
            agent_id: self._client._call("GetChanges", pb.GetChangesRequest(agent_id=agent_id))
            for agent_id in self.agent_ids
        }

    def apply(self, to: str | Path | None = None) -> list[Applied]:
        """Applies the isolated children's changes, in order: to the session's workspace on the
        daemon's machine, or with `to` to a directory here (a checkout of the tree the batch
        forked from; needs git). A child with a conflict stays unapplied, all of its files; its
        result lists the conflicts per file."""
        if to is None:
            apply = pb.ApplyChangesRequest(batch_id=self.id)
            reply = self._client._call("ApplyChanges", apply)
            return [Applied.of(a) for a in reply.results]
        directory = Path(to).resolve()
        if not directory.is_dir():
            raise ValueError(f"{to} is not a directory")
        results = []
        for agent_id in self.agent_ids:
            request = pb.GetChangesRequest(agent_id=agent_id)
            changes = self._client._call("GetChanges", request)
            results.append(_apply.apply_to(directory, changes))
        return results


class Agents:
    def __init__(self, client: Client) -> None:
        self._client = client

    def get(self, agent_id: str) -> Agent:
        reply = self._client._call("GetAgent", pb.GetAgentRequest(agent_id=agent_id))
        return Agent(self._client, AgentInfo.of(reply.agent))


class Agent:
    """One agent: follow it, hand it to the background, stop it, read its transcript and its
    hooks' runs."""

    def __init__(self, client: Client, info: AgentInfo) -> None:
        self._client = client
        self.info = info
        self.id = info.agent_id

    def __repr__(self) -> str:
        return f"Agent({self.id!r}, {self.info.state})"

    def attach(self, since: int = 0) -> Iterator[Event]:
        """The agent's messages from `since`, then live ones, then `ended` (its notification);
        resumed at the next message across a daemon restart."""
        request = pb.AttachRequest(agent_id=self.id)

        def open_stream(seq: int) -> Iterator[pb.AgentEvent]:
            request.since_seq = seq
            stream: Iterator[pb.AgentEvent] = self._client._stream("Attach", request)
            return stream

        window = self._client.reconnect_for
        for raw in follow(open_stream, _requests.next_message, since, window):
            event, last = _requests.agent_event(raw)
            yield event
            if last:
                return

    def background(self) -> str:
        """Hands the agent's attached clients to the background; the agent goes on."""
        reply = self._client._call("Background", pb.BackgroundRequest(agent_id=self.id))
        return str(reply.status)

    def kill(self) -> None:
        """Stops the agent at once; it ends `killed` with its partial result."""
        self._client._call("Kill", pb.KillRequest(agent_id=self.id))

    def transcript(self, include_shared: bool = False) -> list[Message]:
        """The agent's own messages (with `include_shared`, the inherited prefix too)."""
        request = pb.GetTranscriptRequest(agent_id=self.id, include_shared_prefix=include_shared)
        reply = self._client._call("GetTranscript", request)
        return [Message.of(m) for m in reply.messages]

    def hook_runs(self) -> list[HookRun]:
        """Each hook command's run for the agent (the operator's hooks and the session's own), in
        the order they ended: what it was about, what it decided and said, when and how long."""
        request = pb.GetTranscriptRequest(agent_id=self.id)
        reply = self._client._call("GetTranscript", request)
        return [HookRun.of(h) for h in reply.hook_runs]
