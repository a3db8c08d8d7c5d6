"""A lean asyncio Redis client for the limit store's hot path: RESP2 over one connection,
auto-pipelined.

Why not redis-py here: the limit store runs 3–4 scripts on every request, and redis-py's
asyncio client costs ~140 µs of CPU per command (connection-pool checkout, command
machinery, a ``StreamReader`` per reply), which alone exceeded the gateway's whole
per-request budget for ledger and limits. The store only needs EVALSHA/SCRIPT LOAD/PING on
small keys, so this module does exactly that on an ``asyncio.Protocol``:

* **One connection, pipelined.** Redis answers commands in order, so callers append their
  reply future to a FIFO and their packed command to a write buffer; everything issued in one
  event-loop tick goes out in a single ``transport.write``. A burst of concurrent requests
  costs one syscall, not one per command, and no connection pool is needed.
* **Fail fast, never desynchronize.** A reply that doesn't arrive within ``timeout_s`` (or a
  lost connection) fails every outstanding command on that connection and drops it: their
  scripts may or may not have run, which the caller must treat as "unknown" (the store's
  fail policy does). The next command reconnects. Commands are never retried after they
  were written, since running ``settle`` twice would double-count spend.
* **Write-behind commands.** ``send_deferred`` queues a command whose reply nobody waits
  for (the limit store's settle and token correction): it rides along with the next
  flush anyone triggers, or goes out after ``defer_s`` when the connection is idle. Redis
  still runs it before any later command on this connection, so a request's next
  ``reserve`` sees its previous ``settle``; a failure is reported to ``on_deferred_error``.
* **Scripts by SHA.** ``Script.__call__`` sends EVALSHA and, on NOSCRIPT (Redis restarted or
  flushed its cache), loads the script and sends it again — safe, because NOSCRIPT means it
  did not run.

Supported URLs: ``redis://[[user]:password@]host[:port][/db]``, ``rediss://`` (TLS, system
trust store) and ``unix:///path/to.sock[?db=N]``.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import ssl
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import parse_qs, unquote, urlsplit

__all__ = ["RespClient", "RespConnectionError", "RespError", "Script"]

logger = logging.getLogger(__name__)


class RespError(Exception):
    """An error reply from Redis (``-ERR ...``, ``-NOSCRIPT ...``)."""


class RespConnectionError(ConnectionError):
    """The connection failed, closed, or a reply timed out: the command's outcome is unknown."""


_INCOMPLETE = object()


def pack(args: Sequence[str | bytes | int]) -> bytes:
    """One command as a RESP array of bulk strings."""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


def parse(buf: bytes | bytearray, pos: int) -> tuple[Any, int]:
    """Parse one RESP2 reply at ``pos``: (value, next position), or (_INCOMPLETE, pos).

    Bulk strings stay bytes, integers become int, nil becomes None and error replies become
    RespError *values* (inside arrays too), so one bad element can't desynchronize the FIFO.
    """
    end = buf.find(b"\r\n", pos)
    if end < 0:
        return _INCOMPLETE, pos
    kind = buf[pos]
    line = bytes(buf[pos + 1 : end])
    nxt = end + 2
    if kind == 58:  # ':' integer
        return int(line), nxt
    if kind == 36:  # '$' bulk string
        size = int(line)
        if size < 0:
            return None, nxt
        if len(buf) < nxt + size + 2:
            return _INCOMPLETE, pos
        return bytes(buf[nxt : nxt + size]), nxt + size + 2
    if kind == 42:  # '*' array
        count = int(line)
        if count < 0:
            return None, nxt
        items = []
        for _ in range(count):
            item, nxt = parse(buf, nxt)
            if item is _INCOMPLETE:
                return _INCOMPLETE, pos
            items.append(item)
        return items, nxt
    if kind == 43:  # '+' simple string
        return line.decode(), nxt
    if kind == 45:  # '-' error
        return RespError(line.decode(errors="replace")), nxt
    raise RespConnectionError(f"protocol error: unexpected reply type {chr(kind)!r}")


class _Protocol(asyncio.Protocol):
    """One connection: a reply FIFO matched to the replies as they arrive."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.waiters: deque[asyncio.Future[Any]] = deque()
        self.closed = False
        self.out: list[bytes] = []  # commands packed, not yet written
        self.flush_scheduled = False  # a flush at the next loop iteration
        self.deferred_flush: asyncio.TimerHandle | None = None
        self.watchdog: asyncio.TimerHandle | None = None
        self._buf = bytearray()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement the interface without subclassing asyncio.Transport.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        pos = 0
        try:
            while pos < len(buf):
                value, nxt = parse(buf, pos)
                if value is _INCOMPLETE:
                    break
                pos = nxt
                if not self.waiters:
                    raise RespConnectionError("protocol error: reply without a command")
                fut = self.waiters.popleft()
                if not fut.done():  # the caller may have been cancelled meanwhile
                    fut.set_result(value)
        except (RespConnectionError, ValueError, IndexError) as exc:
            self.fail(RespConnectionError(f"redis: {exc}"))
            return
        if pos:
            del buf[:pos]

    def connection_lost(self, exc: Exception | None) -> None:
        self.fail(RespConnectionError(f"redis connection lost: {exc or 'closed by server'}"))

    def fail(self, exc: BaseException) -> None:
        """Give up on this connection: every outstanding command gets ``exc``."""
        self.closed = True
        for timer in (self.watchdog, self.deferred_flush):
            if timer is not None:
                timer.cancel()
        self.watchdog = self.deferred_flush = None
        while self.waiters:
            fut = self.waiters.popleft()
            if not fut.done():
                fut.set_exception(exc)
        if self.transport is not None and not self.transport.is_closing():
            self.transport.abort()


@dataclass(frozen=True)
class _Endpoint:
    host: str | None
    port: int
    path: str | None
    db: int
    username: str | None
    password: str | None
    tls: bool

    @classmethod
    def from_url(cls, url: str) -> _Endpoint:
        parts = urlsplit(url)
        if "@" in parts.fragment:
            # "redis://:pa#ss@host": the '#' began a fragment and the host became "pa".
            raise ValueError("Redis URL: write a '#' in its user or password as %23")
        if parts.scheme not in ("redis", "rediss", "unix"):
            raise ValueError(f"unsupported Redis URL scheme {parts.scheme!r} (redis, rediss, unix)")
        query = parse_qs(parts.query)
        db_text = query.get("db", [""])[0]
        if parts.scheme != "unix":
            db_text = db_text or parts.path.lstrip("/")
        try:
            db = int(db_text or 0)
        except ValueError:
            db = -1
        if db < 0:
            raise ValueError(f"Redis URL database must be an integer ≥ 0, got {db_text!r}")
        try:
            port = parts.port
        except ValueError:  # "Port out of range 0-65535", "Port could not be cast to ..."
            raise ValueError("Redis URL port must be an integer in 1-65535") from None
        return cls(
            host=None if parts.scheme == "unix" else (parts.hostname or "127.0.0.1"),
            port=port or 6379,
            path=parts.path if parts.scheme == "unix" else None,
            db=db,
            username=unquote(parts.username) if parts.username else None,
            password=unquote(parts.password) if parts.password else None,
            tls=parts.scheme == "rediss",
        )


def parse_redis_url(url: str) -> None:
    """Raise ``ValueError`` (naming the part, never the password) for a URL the client
    cannot use: what the settings check at load."""
    _Endpoint.from_url(url)


class RespClient:
    """Auto-pipelined commands on one lazily (re)connected connection."""

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 1.0,
        connect_timeout_s: float = 1.0,
        defer_s: float = 0.002,
    ) -> None:
        if timeout_s <= 0 or connect_timeout_s <= 0 or defer_s < 0:
            raise ValueError("timeouts must be > 0 and defer_s >= 0")
        self._endpoint = _Endpoint.from_url(url)
        self._timeout_s = timeout_s
        self._connect_timeout_s = connect_timeout_s
        self._defer_s = defer_s
        # Called (from the event loop) with the error of a deferred command that failed.
        self.on_deferred_error: Callable[[Exception], None] | None = None
        self._deferred: set[asyncio.Future[Any]] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._conn: _Protocol | None = None
        self._connecting: asyncio.Future[_Protocol] | None = None

    async def execute(self, *args: str | bytes | int) -> Any:
        """Send one command (pipelined with the rest of this tick) and await its reply.
        Error replies raise RespError; connection failures and timeouts RespConnectionError."""
        conn, fut, loop = await self._enqueue(args)
        if not conn.flush_scheduled:
            conn.flush_scheduled = True
            loop.call_soon(self._flush, conn, loop)
        reply = await fut
        if isinstance(reply, RespError):
            raise reply
        return reply

    async def send_deferred(
        self, *args: str | bytes | int, on_error: Callable[[Exception], None] | None = None
    ) -> None:
        """Queue a command without waiting for its reply (see the module docstring). Only
        connecting can raise here (RespConnectionError); later failures go to ``on_error``,
        else to ``on_deferred_error``."""
        conn, fut, loop = await self._enqueue(args)
        self._deferred.add(fut)
        fut.add_done_callback(lambda f: self._deferred_done(f, on_error))
        if not conn.flush_scheduled and conn.deferred_flush is None:
            # At most one idle-flush timer per connection; a flush anyone triggers meanwhile
            # sends these bytes and leaves the timer nothing to do.
            conn.deferred_flush = loop.call_later(self._defer_s, self._deferred_timer, conn, loop)

    async def _enqueue(
        self, args: Sequence[str | bytes | int]
    ) -> tuple[_Protocol, asyncio.Future[Any], asyncio.AbstractEventLoop]:
        """Pack a command and register its reply slot, in order, on a live connection."""
        conn = self._conn
        if conn is None or conn.closed:
            conn = await self._connect()
            if conn.closed:  # lost while this caller was waking up: nothing would answer
                raise RespConnectionError("redis connection lost while connecting")
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        conn.waiters.append(fut)
        conn.out.append(pack(args))
        return conn, fut, loop

    def _deferred_done(
        self, fut: asyncio.Future[Any], on_error: Callable[[Exception], None] | None
    ) -> None:
        self._deferred.discard(fut)
        if fut.cancelled():
            return
        exc = fut.exception()
        error = exc if exc is not None else fut.result()
        if isinstance(error, Exception):
            self.report_deferred(error, on_error)

    def report_deferred(
        self, error: Exception, handler: Callable[[Exception], None] | None = None
    ) -> None:
        """Hand a deferred command's failure to ``handler``, else ``on_deferred_error``, else
        the log."""
        handler = handler or self.on_deferred_error
        if handler is None:
            logger.warning("deferred redis command failed: %s", error)
            return
        try:
            handler(error)
        except Exception:  # a broken hook must not break the connection's reply loop
            logger.exception("deferred redis error handler failed")

    def track(self, task: asyncio.Task[Any]) -> None:
        """Keep a background task (a deferred command's follow-up) alive until aclose."""
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _flush(self, conn: _Protocol, loop: asyncio.AbstractEventLoop) -> None:
        conn.flush_scheduled = False
        out, conn.out = conn.out, []
        if not out or conn.closed or conn.transport is None:
            return  # fail() already failed the futures these bytes belonged to
        conn.transport.write(b"".join(out))
        if conn.watchdog is None and conn.waiters:
            self._arm_watchdog(conn, loop)

    def _deferred_timer(self, conn: _Protocol, loop: asyncio.AbstractEventLoop) -> None:
        conn.deferred_flush = None
        if conn.out and not conn.flush_scheduled:
            self._flush(conn, loop)

    # One watchdog per connection (not one timer per command: at a thousand requests a second
    # that would be thousands of live timers). It watches the newest outstanding reply; when
    # that has arrived it moves on to whatever is outstanding then. A reply that never comes
    # is therefore detected within one to two timeouts, and the connection is dropped (failing
    # everything outstanding) rather than left to wait forever.
    def _arm_watchdog(self, conn: _Protocol, loop: asyncio.AbstractEventLoop) -> None:
        conn.watchdog = loop.call_later(
            self._timeout_s, self._watchdog, conn, conn.waiters[-1], loop
        )

    def _watchdog(
        self, conn: _Protocol, fut: asyncio.Future[Any], loop: asyncio.AbstractEventLoop
    ) -> None:
        conn.watchdog = None
        if conn.closed:
            return
        if not fut.done():
            conn.fail(RespConnectionError(f"redis reply timed out after {self._timeout_s:g} s"))
        elif conn.waiters:
            self._arm_watchdog(conn, loop)

    async def _connect(self) -> _Protocol:
        # Concurrent first callers share one connection attempt.
        if self._connecting is None:
            self._connecting = asyncio.ensure_future(self._open())
        pending = self._connecting
        try:
            return await asyncio.shield(pending)
        finally:
            if pending.done() and self._connecting is pending:
                self._connecting = None

    async def _open(self) -> _Protocol:
        ep = self._endpoint
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                if ep.path is not None:
                    _, proto = await loop.create_unix_connection(_Protocol, ep.path)
                else:
                    tls = ssl.create_default_context() if ep.tls else None
                    _, proto = await loop.create_connection(
                        _Protocol,
                        ep.host or "127.0.0.1",
                        ep.port,
                        ssl=tls,
                        server_hostname=ep.host if tls else None,
                    )
                handshake: list[tuple[str, ...]] = []
                if ep.password is not None:
                    auth = (
                        ("AUTH", ep.username, ep.password) if ep.username else ("AUTH", ep.password)
                    )
                    handshake.append(auth)
                if ep.db:
                    handshake.append(("SELECT", str(ep.db)))
                for command in handshake:
                    fut: asyncio.Future[Any] = loop.create_future()
                    proto.waiters.append(fut)
                    assert proto.transport is not None
                    proto.transport.write(pack(command))
                    reply = await fut
                    if isinstance(reply, RespError):
                        proto.fail(RespConnectionError(f"redis {command[0]} failed"))
                        raise RespConnectionError(f"redis {command[0]} failed: {reply}")
        except (OSError, TimeoutError) as exc:
            raise RespConnectionError(
                f"cannot connect to redis: {type(exc).__name__}: {exc}"
            ) from exc
        self._conn = proto
        return proto

    async def aclose(self) -> None:
        """Send what is queued, wait (bounded by the reply timeout) for deferred commands'
        replies, then close."""
        conn = self._conn
        if conn is not None and not conn.closed and conn.out:
            self._flush(conn, asyncio.get_running_loop())
        for _ in range(2):  # a NOSCRIPT follow-up may queue one more round
            if self._tasks:
                await asyncio.wait(set(self._tasks), timeout=2 * self._timeout_s)
            if self._deferred:
                await asyncio.wait(set(self._deferred), timeout=self._timeout_s)
        conn, self._conn = self._conn, None
        if conn is not None and conn.transport is not None:
            conn.closed = True
            conn.transport.close()


class Script:
    """A Lua script called by SHA on a RespClient, loaded on demand."""

    def __init__(self, client: RespClient, body: str) -> None:
        self._client = client
        self.body = body
        self.sha = hashlib.sha1(body.encode()).hexdigest()
        self._loaded = False  # by this client, at least once (Redis may forget it since)

    async def __call__(self, keys: Sequence[str], args: Sequence[str]) -> Any:
        command: tuple[str | int, ...] = ("EVALSHA", self.sha, len(keys), *keys, *args)
        try:
            result = await self._client.execute(*command)
        except RespError as exc:
            if not str(exc).startswith("NOSCRIPT"):
                raise
            # NOSCRIPT: the script did not run. Load it and send the call again.
            await self.load()
            result = await self._client.execute(*command)
        self._loaded = True
        return result

    async def send_deferred(self, keys: Sequence[str], args: Sequence[str]) -> None:
        """Run the script write-behind (``RespClient.send_deferred``). On NOSCRIPT (it did
        not run) a background task loads it and runs the call once more, so a Redis restart
        loses no settle; that retry lands after commands sent meanwhile, which only keeps a
        hold a little longer."""
        if not self._loaded:
            # First use: load it in the foreground, so the common case (a fresh Redis, a
            # new process) keeps the write-behind ordering instead of taking the retry path.
            await self.load()
        command: tuple[str | int, ...] = ("EVALSHA", self.sha, len(keys), *keys, *args)

        def on_error(exc: Exception) -> None:
            if isinstance(exc, RespError) and str(exc).startswith("NOSCRIPT"):
                loop = asyncio.get_running_loop()
                self._client.track(loop.create_task(self._reload_and_send(command)))
            else:
                self._client.report_deferred(exc)

        await self._client.send_deferred(*command, on_error=on_error)

    async def _reload_and_send(self, command: tuple[str | int, ...]) -> None:
        try:
            await self.load()
            await self._client.send_deferred(*command)
        except (RespError, RespConnectionError) as exc:
            self._client.report_deferred(exc)

    async def load(self) -> None:
        await self._client.execute("SCRIPT", "LOAD", self.body)
        self._loaded = True
