"""Webhooks against a real daemon that may reach loopback (`[webhooks] allow_private = true`): a
receiver here verifies each delivery with the Standard Webhooks library; a batch's notifications
arrive once per child, a ping is taken, a rotated secret signs beside the old one, a batch names
a `named_only` webhook; missing ids and unreachable URLs raise by meaning. And, with no daemon,
the daemon's answers mapped and a batch's webhook in its request."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import standardwebhooks
from conftest import Daemon, running_daemon
from google.protobuf.timestamp_pb2 import Timestamp

import forkd
from forkd._proto.forkd.v1 import forkd_pb2 as pb

MISSING = "01a00000-0000-7000-8000-000000000000"


@dataclass(frozen=True)
class Delivery:
    path: str
    headers: dict[str, str]
    body: bytes
    payload: Any

    @property
    def id(self) -> str:
        return self.headers["webhook-id"]


class Receiver:
    """An HTTP server on loopback that takes a POST when a secret it knows signed it (2xx), and
    refuses any other (401)."""

    def __init__(self) -> None:
        self.secrets: list[str] = []
        self.verified: list[Delivery] = []
        self.refused: list[str] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                headers = {k.lower(): v for k, v in self.headers.items()}
                code = receiver.take(self.path, headers, body)
                self.send_response(code)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def url(self, path: str = "/") -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}{path}"

    def take(self, path: str, headers: dict[str, str], body: bytes) -> int:
        with self._lock:
            secrets = list(self.secrets)
        for secret in secrets:
            try:
                payload = standardwebhooks.Webhook(secret).verify(body, headers)
            except standardwebhooks.WebhookVerificationError:
                continue
            with self._lock:
                self.verified.append(Delivery(path, headers, body, payload))
            return 200
        with self._lock:
            self.refused.append(headers.get("webhook-id", ""))
        return 401

    def deliveries(self, where: Callable[[Delivery], bool]) -> list[Delivery]:
        with self._lock:
            return [d for d in self.verified if where(d)]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def eventually(check: Callable[[], bool], within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("not within the time")
        time.sleep(0.05)


@pytest.fixture(scope="module")
def hooked() -> Iterator[Daemon]:
    """A daemon whose webhooks may reach loopback (the receiver's address)."""
    yield from running_daemon(
        "forkd-py-wh-", speed="0", config="[webhooks]\nallow_private = true\n"
    )


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    try:
        yield r
    finally:
        r.close()


def test_a_batchs_notifications_arrive_signed_once_per_child(
    hooked: Daemon, receiver: Receiver
) -> None:
    with hooked.client() as client:
        with pytest.raises(forkd.InvalidArgument):
            client.create_webhook("http://169.254.169.254/")
        created = client.create_webhook(receiver.url("/all"), kinds=["fork"])
        receiver.secrets.append(created.secret)
        hook = created.webhook
        assert created.secret.startswith("whsec_")
        assert created.secret not in repr(created)
        assert (hook.url, hook.kinds, hook.session_id, hook.named_only) == (
            receiver.url("/all"),
            ["fork"],
            None,
            False,
        )
        assert hook.created_at is not None and hook.created_at <= datetime.now(timezone.utc)
        assert (hook.failing_since, hook.disabled_reason, hook.disabled_at) == (None, None, None)
        assert client.get_webhook(hook.webhook_id) == hook
        assert hook in client.list_webhooks()

        session = client.sessions.create(system="s", workspace=hooked.workspace)
        batch = session.fork(["One.\n@sim say one", "Two.\n@sim say two", "Three.\n@sim say 3"])
        done = {n.agent_id: n for n in batch.wait(timeout=60)}

        def mine(d: Delivery) -> bool:
            data = d.payload["data"]
            return bool(d.payload["type"] == "notification" and data["batch_id"] == batch.id)

        eventually(lambda: len(receiver.deliveries(mine)) >= len(batch.agent_ids))
        time.sleep(0.3)  # nothing more comes: one delivery per child
        arrived = receiver.deliveries(mine)
        assert len(arrived) == len(batch.agent_ids)
        assert len({d.id for d in arrived}) == len(arrived)
        assert not receiver.refused
        for d in arrived:
            assert d.path == "/all"
            assert d.headers["content-type"].startswith("application/json")
            assert d.payload["timestamp"].endswith("Z")
            data = d.payload["data"]
            n = done[data["agent_id"]]
            assert data["seq"] == n.seq
            assert (data["session_id"], data["kind"], data["status"]) == (
                session.id,
                "fork",
                "completed",
            )
            assert data["report"]["result"] == n.report.result
            assert set(data["usage"]) >= {"input_tokens", "output_tokens"}

        # The attempts as the daemon recorded them: each delivered, at its first try.
        def delivered() -> list[forkd.WebhookAttempt]:
            attempts = client.webhook_attempts(hook.webhook_id)
            return [a for a in attempts if a.state == "delivered"]

        eventually(lambda: len(delivered()) == len(batch.agent_ids))
        attempts = delivered()
        assert {a.delivery_id for a in attempts} == {d.id for d in arrived}
        assert {a.notification_seq for a in attempts} == {n.seq for n in done.values()}
        for a in attempts:
            assert (a.number, a.status, a.error, a.event, a.ok) == (
                1,
                200,
                None,
                "notification",
                True,
            )
            assert a.at is not None
        assert len(client.webhook_attempts(hook.webhook_id, limit=1)) == 1
        with pytest.raises(ValueError, match="limit must be positive"):
            client.webhook_attempts(hook.webhook_id, limit=0)

        # A ping, taken now; then a rotated secret, the old one signing beside it.
        ping = client.test_webhook(hook.webhook_id)
        assert (ping.event, ping.status, ping.error, ping.notification_seq, ping.state) == (
            "ping",
            200,
            None,
            None,
            "delivered",
        )
        (pinged,) = receiver.deliveries(lambda d: d.id == ping.delivery_id)
        assert pinged.payload["type"] == "ping"
        assert pinged.payload["data"] == {"webhook_id": hook.webhook_id}

        rotated = client.rotate_webhook_secret(hook.webhook_id)
        assert rotated.secret.startswith("whsec_") and rotated.secret != created.secret
        assert rotated.webhook.webhook_id == hook.webhook_id
        assert rotated.webhook.previous_secret_until is not None
        receiver.secrets[:] = [rotated.secret]
        after = client.test_webhook(hook.webhook_id)
        assert after.status == 200
        (signed,) = receiver.deliveries(lambda d: d.id == after.delivery_id)
        standardwebhooks.Webhook(created.secret).verify(signed.body, signed.headers)

        client.delete_webhook(hook.webhook_id)
        with pytest.raises(forkd.NotFound):
            client.get_webhook(hook.webhook_id)
        assert hook.webhook_id not in {w.webhook_id for w in client.list_webhooks()}


def test_a_batch_names_its_webhook(hooked: Daemon, receiver: Receiver) -> None:
    with hooked.client() as client:
        named = client.create_webhook(receiver.url("/named"), named_only=True)
        receiver.secrets.append(named.secret)
        assert named.webhook.named_only
        session = client.sessions.create(system="s", workspace=hooked.workspace)
        # Not named: nothing comes.
        quiet = session.fork(["Quiet.\n@sim say quiet"])
        quiet.wait(timeout=60)
        dry = session.dry_run(["One.\n@sim say one"], webhook=named.webhook)
        assert dry.children == 1
        batch = session.fork(
            ["One.\n@sim say one", "Two.\n@sim say two"], webhook=named.webhook.webhook_id
        )
        batch.wait(timeout=60)
        eventually(lambda: len(receiver.deliveries(lambda d: d.path == "/named")) >= 2)
        time.sleep(0.3)
        arrived = receiver.deliveries(lambda d: d.path == "/named")
        assert sorted(d.payload["data"]["agent_id"] for d in arrived) == sorted(batch.agent_ids)
        assert len({d.id for d in arrived}) == 2
        client.delete_webhook(named.webhook.webhook_id)


def test_missing_webhooks_are_not_found(hooked: Daemon) -> None:
    with hooked.client() as client:
        session = client.sessions.create(system="s", workspace=hooked.workspace)
        calls: list[Callable[[], object]] = [
            lambda: client.get_webhook(MISSING),
            lambda: client.delete_webhook(MISSING),
            lambda: client.rotate_webhook_secret(MISSING),
            lambda: client.test_webhook(MISSING),
            lambda: client.webhook_attempts(MISSING),
            lambda: session.fork(["x"], webhook=MISSING),
        ]
        for call in calls:
            with pytest.raises(forkd.NotFound):
                call()
        with pytest.raises(forkd.InvalidArgument):
            client.create_webhook("http://127.0.0.1:9/", kinds=["nope"])
        with pytest.raises(TypeError):
            client.create_webhook("http://127.0.0.1:9/", kinds="fork")


def test_the_async_client_has_the_same_calls(hooked: Daemon, receiver: Receiver) -> None:
    async def run() -> None:
        async with forkd.AsyncClient(addr=hooked.addr) as client:
            with pytest.raises(forkd.InvalidArgument):
                await client.create_webhook("http://169.254.169.254/latest/meta-data/")
            created = await client.create_webhook(receiver.url("/async"), named_only=True)
            receiver.secrets.append(created.secret)
            hook = created.webhook
            assert await client.get_webhook(hook.webhook_id) == hook
            assert hook in await client.list_webhooks()
            ping = await client.test_webhook(hook.webhook_id)
            assert (ping.status, ping.event, ping.state) == (200, "ping", "delivered")
            session = await client.sessions.create(system="s", workspace=hooked.workspace)
            batch = await session.fork(["One.\n@sim say one"], webhook=hook)
            assert (await session.dry_run(["x"], webhook=hook)).children == 1
            await batch.wait(timeout=60)

            async def notified() -> list[forkd.WebhookAttempt]:
                attempts = await client.webhook_attempts(hook.webhook_id)
                return [a for a in attempts if a.event == "notification" and a.ok]

            deadline = time.monotonic() + 30
            while not await notified():
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
            rotated = await client.rotate_webhook_secret(hook.webhook_id)
            assert rotated.secret != created.secret
            await client.delete_webhook(hook.webhook_id)
            with pytest.raises(forkd.NotFound):
                await client.get_webhook(hook.webhook_id)
            with pytest.raises(forkd.NotFound):
                await session.fork(["x"], webhook=MISSING)

    asyncio.run(run())


# With no daemon.


def _at(seconds: int) -> Timestamp:
    return Timestamp(seconds=seconds)


def test_webhooks_and_attempts_are_mapped_from_the_daemons_answers() -> None:
    raw = pb.Webhook(
        webhook_id="w",
        url="https://ci.example.com/forkd",
        kinds=["fork", "typed"],
        session_id="s",
        named_only=True,
        created_at=_at(1_700_000_000),
        failing_since=_at(1_700_000_100),
        disabled_reason="failed every attempt for 5 days",
        disabled_at=_at(1_700_000_200),
        previous_secret_until=_at(1_700_000_300),
    )
    utc = timezone.utc
    assert forkd.Webhook.of(raw) == forkd.Webhook(
        webhook_id="w",
        url="https://ci.example.com/forkd",
        kinds=["fork", "typed"],
        session_id="s",
        named_only=True,
        created_at=datetime.fromtimestamp(1_700_000_000, utc),
        failing_since=datetime.fromtimestamp(1_700_000_100, utc),
        disabled_reason="failed every attempt for 5 days",
        disabled_at=datetime.fromtimestamp(1_700_000_200, utc),
        previous_secret_until=datetime.fromtimestamp(1_700_000_300, utc),
    )
    bare = forkd.Webhook.of(pb.Webhook(webhook_id="w", url="http://x/"))
    assert (bare.kinds, bare.session_id, bare.created_at, bare.disabled_reason) == (
        [],
        None,
        None,
        None,
    )
    created = forkd.CreatedWebhook.of(pb.CreateWebhookResponse(webhook=raw, secret="whsec_abc"))
    assert created.secret == "whsec_abc" and created.webhook.webhook_id == "w"

    taken = forkd.WebhookAttempt.of(
        pb.WebhookAttempt(
            delivery_id="d",
            number=2,
            at=_at(1_700_000_000),
            status=204,
            latency_ms=12,
            event="notification",
            notification_seq=7,
            state="delivered",
        )
    )
    assert taken == forkd.WebhookAttempt(
        delivery_id="d",
        number=2,
        at=datetime.fromtimestamp(1_700_000_000, utc),
        status=204,
        error=None,
        latency_ms=12,
        event="notification",
        notification_seq=7,
        state="delivered",
    )
    assert taken.ok
    # No answer: no status; a ping: no seq.
    lost = forkd.WebhookAttempt.of(
        pb.WebhookAttempt(delivery_id="p", number=1, error="connection refused", event="ping")
    )
    assert (lost.status, lost.error, lost.notification_seq, lost.ok) == (
        None,
        "connection refused",
        None,
        False,
    )


class _Stub:
    def __init__(self) -> None:
        self.sent: list[Any] = []

    def ForkBatch(self, request: pb.ForkBatchRequest, **_: Any) -> pb.ForkBatchResponse:
        self.sent.append(request)
        if request.dry_run:
            return pb.ForkBatchResponse(dry_run=pb.DryRun(children=1))
        return pb.ForkBatchResponse(batch_id="b", agent_ids=["a"])

    def CreateWebhook(self, request: pb.CreateWebhookRequest, **_: Any) -> pb.CreateWebhookResponse:
        self.sent.append(request)
        return pb.CreateWebhookResponse(webhook=pb.Webhook(webhook_id="w"), secret="whsec_x")

    def ListWebhookAttempts(
        self, request: pb.ListWebhookAttemptsRequest, **_: Any
    ) -> pb.ListWebhookAttemptsResponse:
        self.sent.append(request)
        return pb.ListWebhookAttemptsResponse()


def test_a_batch_names_its_webhook_in_its_request() -> None:
    client = forkd.Client(addr="unix:/nonexistent/forkd.sock", reconnect_for=0.1)
    stub = _Stub()
    client._stub = stub  # type: ignore[assignment]
    session = forkd.Session(client, pb.Session(session_id="s"))
    session.fork(["x"], webhook="w1")
    session.dry_run(["x"], webhook=forkd.Webhook(webhook_id="w2", url="http://x/"))
    session.fork(["x"])
    created = client.create_webhook(
        "https://x/", kinds=("fork", "turn"), session_id="s", named_only=True
    )
    assert created.webhook.webhook_id == "w"
    client.webhook_attempts("w", limit=5)
    client.webhook_attempts("w")
    forked, dry, plain, create, five, default = stub.sent
    assert (forked.webhook_id, dry.webhook_id, dry.dry_run, plain.webhook_id) == (
        "w1",
        "w2",
        True,
        "",
    )
    assert create == pb.CreateWebhookRequest(
        url="https://x/", kinds=["fork", "turn"], session_id="s", named_only=True
    )
    assert (five.limit, default.limit) == (5, 0)
    with pytest.raises(TypeError):
        session.fork(["x"], webhook=7)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        client.webhook_attempts("w", limit=-1)
