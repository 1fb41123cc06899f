"""Addresses, tokens and trace context, read as forkctl reads them (no daemon needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from forkd._config import Target, metadata


def test_addresses_in_every_spelling() -> None:
    assert Target.parse("unix:/run/forkd.sock").target == "unix:/run/forkd.sock"
    assert Target.parse("unix:///run/forkd.sock").target == "unix:/run/forkd.sock"
    assert Target.parse("http://127.0.0.1:7070") == Target(
        "127.0.0.1:7070", False, "http://127.0.0.1:7070"
    )
    assert Target.parse("https://forkd.example:7070").secure
    for bad in ("ftp://x", "unix:", "unix://relative", "http://"):
        with pytest.raises(ValueError):
            Target.parse(bad)


def test_the_default_address_is_forkd_homes_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FORKD_ADDR", raising=False)
    monkeypatch.setenv("FORKD_HOME", "/srv/forkd")
    assert Target.default().target == f"unix:{Path('/srv/forkd') / 'forkd.sock'}"
    monkeypatch.setenv("FORKD_ADDR", "http://10.0.0.1:7070")
    assert Target.default().target == "10.0.0.1:7070"


def test_the_token_and_trace_context_go_with_every_call(monkeypatch: pytest.MonkeyPatch) -> None:
    trace = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    monkeypatch.setenv("TRACEPARENT", trace)
    assert metadata("t0k") == (("authorization", "Bearer t0k"), ("traceparent", trace))
    monkeypatch.delenv("TRACEPARENT")
    assert metadata(None) == ()
