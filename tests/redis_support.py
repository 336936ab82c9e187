"""A throwaway redis-server for the Redis tests and benchmark.

``shared_redis_url`` uses ``FANOUT_TEST_REDIS_URL`` when CI set it, else starts
a server of its own; a test that must stop its server starts a private one.
No persistence, loopback only, a free port: nothing is left behind.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterator

ENV_URL = "FANOUT_TEST_REDIS_URL"


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def unique_prefix() -> str:
    """A key prefix no other test (or run sharing the server) uses."""
    return f"fanout-test:{uuid.uuid4().hex[:10]}:"


def have_redis_server() -> bool:
    return shutil.which("redis-server") is not None


def answers_ping(port: int, timeout: float = 0.2) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as conn:
            conn.sendall(b"PING\r\n")
            return conn.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """One redis-server subprocess on 127.0.0.1, which a test may stop or freeze."""

    def __init__(self) -> None:
        self.port = free_port()
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while not answers_ping(self.port):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"redis-server did not start on port {self.port}")
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


@contextlib.contextmanager
def shared_redis_url() -> Iterator[str]:
    """The CI server's URL, or a server of our own for as long as the block runs."""
    url = os.environ.get(ENV_URL)
    if url:
        yield url
        return
    server = RedisServer()
    try:
        yield server.url
    finally:
        server.stop()
