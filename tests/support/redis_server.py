"""A private, throw-away redis-server on a free loopback port: for tests that take Redis
away from a running gateway or store (the shared one on 6379 must stay up for every other
test). With a ``data_dir`` it keeps every write in an append-only file, so it can be killed
(``kill -9``, as in a production blip) and started again with exactly what it acknowledged."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import redis

from tests.support.gateway import free_port


class PrivateRedis:
    def __init__(self, data_dir: Path | None = None) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._dir = data_dir
        self._proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        persistence: tuple[str, ...] = ("--appendonly", "no")
        if self._dir is not None:
            persistence = (
                "--dir",
                str(self._dir),
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
            )
        self._proc = subprocess.Popen(
            [
                "redis-server",
                *("--port", str(self.port), "--bind", "127.0.0.1", "--save", ""),
                *persistence,
            ],
            stdout=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while not self.pings():
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("redis-server did not start")
            time.sleep(0.02)

    def pings(self) -> bool:
        try:
            return bool(redis.Redis(port=self.port, socket_timeout=0.2).ping())
        except redis.RedisError:
            return False

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, decode_responses=True)

    def stop(self) -> None:
        """Kill it (as a crash would: no shutdown; only what an AOF holds survives)."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
        if self._proc is not None:
            self._proc.wait()

    kill = stop
