"""A private, throw-away redis-server on a free loopback port: for tests that take Redis
away from a running gateway (the shared one on 6379 must stay up for every other test)."""

from __future__ import annotations

import subprocess
import time

import redis

from tests.support.gateway import free_port


class PrivateRedis:
    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._proc = subprocess.Popen(
            [
                "redis-server",
                *("--port", str(self.port), "--bind", "127.0.0.1"),
                *("--save", "", "--appendonly", "no"),
            ],
            stdout=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while not self.pings():
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("redis-server did not start")
            time.sleep(0.05)

    def pings(self) -> bool:
        try:
            return bool(redis.Redis(port=self.port, socket_timeout=0.2).ping())
        except redis.RedisError:
            return False

    def stop(self) -> None:
        """Kill it (as a crash would: no shutdown, nothing saved)."""
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()
