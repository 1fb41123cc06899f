"""A real `forkd serve` for the tests: `FORKD_BIN` names the binary (the cargo test that runs
these sets it); each test module gets a daemon on a temporary home and socket."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

import forkd
from forkd._proto.forkd.v1 import forkd_pb2 as pb
from forkd._proto.forkd.v1 import forkd_pb2_grpc as pb_grpc


@dataclass
class Daemon:
    """`forkd serve` on `home` with the sim at `speed`: killed with SIGKILL and started again
    by the restart test."""

    binary: str
    home: Path
    workspace: Path
    speed: str
    # `--listen` too: a TCP port on loopback, where calls need a token.
    listen: str | None = None
    process: subprocess.Popen[bytes] | None = field(default=None, init=False)

    @property
    def addr(self) -> str:
        return f"unix:{self.home / 'forkd.sock'}"

    def start(self) -> None:
        env = dict(os.environ, FORKD_HOME=str(self.home), RUST_LOG="warn")
        env.pop("FORKD_ADDR", None)
        env.pop("FORKD_TOKEN", None)
        listen = ["--listen", self.listen] if self.listen else []
        self.process = subprocess.Popen(
            [self.binary, "serve", "--sim-speed", self.speed, "--grace", "1s", *listen],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.wait_ready()

    def wait_ready(self, within: float = 30.0) -> None:
        deadline = time.monotonic() + within
        while True:
            channel = grpc.insecure_channel(
                f"unix:{self.home / 'forkd.sock'}",
                options=[("grpc.default_authority", "localhost")],
            )
            try:
                pb_grpc.ForkdStub(channel).ListSessions(pb.ListSessionsRequest(), timeout=1)
                return
            except grpc.RpcError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
            finally:
                channel.close()

    def kill9(self) -> None:
        if self.process is not None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()
            self.process = None

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill9()
            self.process = None

    def token(self, name: str) -> str:
        """A new token of tenant `name` (`forkd token create`)."""
        out = subprocess.run(
            [self.binary, "token", "create", name],
            env=dict(os.environ, FORKD_HOME=str(self.home)),
            capture_output=True,
            text=True,
            check=True,
        )
        return out.stdout.strip()

    def client(self, **kwargs: object) -> forkd.Client:
        return forkd.Client(addr=self.addr, **kwargs)  # type: ignore[arg-type]


def _binary() -> str:
    binary = os.environ.get("FORKD_BIN") or shutil.which("forkd")
    if not binary:
        pytest.fail("set FORKD_BIN to the forkd binary (cargo test -p forkd --test python_client)")
    return binary


def running_daemon(prefix: str, speed: str, config: str | None = None) -> Iterator[Daemon]:
    """A started daemon on a fresh home and workspace (`config` its config.toml), stopped and
    removed when the generator is closed: the body of a fixture."""
    # Not under the system's temp dir's forkd home: a short path, as a socket needs.
    root = Path(tempfile.mkdtemp(prefix=prefix))
    home, workspace = root / "home", root / "ws"
    home.mkdir()
    workspace.mkdir()
    (workspace / "README.md").write_text("# A project\n")
    if config is not None:
        (home / "config.toml").write_text(config)
    d = Daemon(_binary(), home, workspace, speed=speed)
    d.start()
    try:
        yield d
    finally:
        d.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    yield from running_daemon("forkd-py-", speed="1")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def tcp_daemon() -> Iterator[Daemon]:
    """A daemon that also listens on a loopback TCP port (`http://`), where calls need a token."""
    root = Path(tempfile.mkdtemp(prefix="forkd-py-tcp-"))
    home, workspace = root / "home", root / "ws"
    home.mkdir()
    workspace.mkdir()
    d = Daemon(_binary(), home, workspace, speed="0", listen=f"127.0.0.1:{_free_port()}")
    d.start()
    try:
        yield d
    finally:
        d.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def client(daemon: Daemon) -> Iterator[forkd.Client]:
    with daemon.client() as c:
        yield c
