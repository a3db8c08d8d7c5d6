"""Where cached answers live: in the worker's memory, or in Redis shared by every worker and
replica. Both store opaque bytes with a time to live; neither ever raises into a request
(a failing backend is a miss, reported to the caller as ``CacheUnavailable``)."""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from typing import Protocol

from gateway.limits.resp import RespClient, RespConnectionError, RespError

# An answer's key is the prefix and ``cache_key``'s SHA-256 hex digest.
_DIGEST_CHARS = 64
_HEX = frozenset(b"0123456789abcdef")


def _glob_escape(text: str) -> str:
    """``text`` as a Redis MATCH pattern that matches only itself."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def _is_digest(tail: bytes | str) -> bool:
    raw = tail.encode() if isinstance(tail, str) else tail
    return len(raw) == _DIGEST_CHARS and _HEX.issuperset(raw)


__all__ = ["CacheBackend", "CacheUnavailable", "MemoryBackend", "RedisBackend"]


class CacheUnavailable(Exception):
    """The backend could not answer (connection, timeout, error reply)."""


class CacheBackend(Protocol):
    async def get(self, key: str) -> bytes | None: ...

    async def put(self, key: str, value: bytes, ttl_s: float) -> None: ...

    def put_nowait(self, key: str, value: bytes, ttl_s: float) -> bool:
        """Store at once if that needs no I/O (True); else False, and ``put`` it is."""
        ...

    async def clear(self) -> int:
        """Drop every stored answer; how many there were."""
        ...

    async def aclose(self) -> None: ...


class MemoryBackend:
    """A per-process LRU with per-entry expiry, bounded by entries and by bytes.

    Everything is synchronous dictionary work (no awaits inside), so it is safe on the
    event loop without locks."""

    def __init__(self, max_entries: int, max_bytes: int) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._items: OrderedDict[str, tuple[float, bytes]] = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._items)

    @property
    def size_bytes(self) -> int:
        return self._bytes

    async def get(self, key: str) -> bytes | None:
        item = self._items.get(key)
        if item is None:
            return None
        expires, value = item
        if expires <= time.monotonic():
            self._drop(key)
            return None
        self._items.move_to_end(key)
        return value

    async def put(self, key: str, value: bytes, ttl_s: float) -> None:
        self.put_nowait(key, value, ttl_s)

    def put_nowait(self, key: str, value: bytes, ttl_s: float) -> bool:
        # Plain dictionary work: done inline, without a task per store.
        if len(value) > self.max_bytes:
            return True
        if key in self._items:
            self._drop(key)
        self._items[key] = (time.monotonic() + ttl_s, value)
        self._bytes += len(value)
        # Least recently used first; expired entries go the same way when they reach the
        # front, or earlier when read.
        while len(self._items) > self.max_entries or self._bytes > self.max_bytes:
            self._drop(next(iter(self._items)))
        return True

    def _drop(self, key: str) -> None:
        _, value = self._items.pop(key)
        self._bytes -= len(value)

    async def clear(self) -> int:
        n = len(self._items)
        self._items.clear()
        self._bytes = 0
        return n

    async def aclose(self) -> None:
        self._items.clear()
        self._bytes = 0


class RedisBackend:
    """GET on lookup, and a write-behind ``SET … PX`` that no request waits for.

    It has its own connection: a lookup that times out drops the connection it was
    pipelined on, which must never take the limit store's in-flight commands with it."""

    def __init__(self, url: str, *, prefix: str, timeout_s: float) -> None:
        self.prefix = prefix.rstrip(":") + ":"
        self._timeout_s = timeout_s
        self._client = RespClient(url, timeout_s=max(timeout_s, 0.05), connect_timeout_s=1.0)
        self.errors = 0  # write-behind failures, which no caller sees

        def on_error(exc: Exception) -> None:
            self.errors += 1

        self._client.on_deferred_error = on_error

    async def get(self, key: str) -> bytes | None:
        try:
            async with asyncio.timeout(self._timeout_s):
                value = await self._client.execute("GET", self.prefix + key)
        except (TimeoutError, RespConnectionError, RespError, OSError) as exc:
            raise CacheUnavailable(str(exc) or type(exc).__name__) from None
        return value if isinstance(value, bytes) else None

    async def put(self, key: str, value: bytes, ttl_s: float) -> None:
        try:
            await self._client.send_deferred(
                "SET", self.prefix + key, value, "PX", max(int(ttl_s * 1000), 1)
            )
        except (RespConnectionError, OSError) as exc:
            raise CacheUnavailable(str(exc) or type(exc).__name__) from None

    def put_nowait(self, key: str, value: bytes, ttl_s: float) -> bool:
        return False  # queuing the SET may have to (re)connect first

    async def clear(self) -> int:
        """Every answer under the prefix, found with SCAN (never KEYS, which blocks Redis)
        and unlinked (freed in the background) a page at a time. The prefix is matched as
        written (its glob characters escaped) and followed by a digest only: another
        deployment whose prefix merely starts with this one keeps its answers."""
        pattern = _glob_escape(self.prefix) + "?" * _DIGEST_CHARS
        start = len(self.prefix.encode())
        deleted, cursor = 0, b"0"
        try:
            while True:
                cursor, found = await self._client.execute(
                    "SCAN", cursor, "MATCH", pattern, "COUNT", 1000
                )
                keys = [k for k in found if _is_digest(k[start:])]
                if keys:
                    deleted += int(await self._client.execute("UNLINK", *keys))
                if cursor in (b"0", "0"):
                    return deleted
        except (RespConnectionError, RespError, OSError) as exc:
            raise CacheUnavailable(str(exc) or type(exc).__name__) from None

    async def aclose(self) -> None:
        await self._client.aclose()
