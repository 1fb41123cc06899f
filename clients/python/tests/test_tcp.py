"""The client over TCP with tokens: the token travels, a call without one is refused, and one
tenant cannot reach another's session."""

from __future__ import annotations

import pytest
from conftest import Daemon

import forkd


def test_tokens_travel_over_tcp_and_tenants_stay_apart(tcp_daemon: Daemon) -> None:
    addr = f"http://{tcp_daemon.listen}"
    alice = forkd.Client(addr=addr, token=tcp_daemon.token("alice"))
    bob = forkd.Client(addr=addr, token=tcp_daemon.token("bob"))
    session = alice.sessions.create(system="s")
    batch = session.fork(["Go.\n@sim say done"])
    (n,) = batch.wait(timeout=30)
    assert n.status == "completed"
    with pytest.raises(forkd.NotFound):
        bob.sessions.get(session.id)
    assert all(m.batch_id != batch.id for m in bob.notifications(follow_live=False))
    with pytest.raises(forkd.Unauthenticated):
        forkd.Client(addr=addr).sessions.get(session.id)
    with pytest.raises(forkd.Unauthenticated):
        forkd.Client(addr=addr, token="not-a-token").sessions.get(session.id)
