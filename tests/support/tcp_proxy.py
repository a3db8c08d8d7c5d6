"""A loopback TCP proxy in front of a real server (PostgreSQL, in the outage tests), run on
the test's own event loop, that a test can *cut* — every connection closed and new ones
refused, as when the server is down — or *freeze* — connections accepted and held with
nothing forwarded either way, as when the server or the network hangs — and then restore."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any

from tests.support.gateway import free_port


class TcpProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        self._thawed = asyncio.Event()
        self._thawed.set()
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)

    async def cut(self) -> None:
        """The server is down: close what is open, refuse what comes."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        await self._drop()

    async def freeze(self) -> None:
        """The server hangs: connections stay open (new ones are accepted) and nothing
        is forwarded."""
        self._thawed.clear()

    async def restore(self) -> None:
        self._thawed = asyncio.Event()
        self._thawed.set()
        await self._drop()  # what froze is gone; clients reconnect
        if self._server is None:
            await self.start()

    async def close(self) -> None:
        await self.cut()

    async def _drop(self) -> None:
        for w in list(self._conns):
            w.close()
        me = asyncio.current_task()
        tasks = [t for t in self._tasks if t is not me]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(BaseException):
                await t
        self._conns.clear()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._conns.add(writer)
        me = asyncio.current_task()
        if me is not None:  # dropped with the rest (a frozen connection waits on nothing)
            self._tasks.add(me)
            me.add_done_callback(self._tasks.discard)
        try:
            if not self._thawed.is_set():
                await asyncio.Event().wait()  # held open until dropped
            up_reader, up_writer = await asyncio.open_connection(*self.target)
            self._conns.add(up_writer)
            pipes = [
                asyncio.ensure_future(self._pipe(reader, up_writer)),
                asyncio.ensure_future(self._pipe(up_reader, writer)),
            ]
            for t in pipes:
                self._tasks.add(t)
                t.add_done_callback(self._tasks.discard)
            await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                await self._thawed.wait()  # while frozen: hold what arrives, forward nothing
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()


class ThreadedTcpProxy:
    """The same proxy on an event loop of its own thread, for tests that are not async (a
    gateway in a subprocess reaching its database through it)."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self.proxy = TcpProxy(target_host, target_port)
        self.port = self.proxy.port
        self._call(self.proxy.start())

    def cut(self) -> None:
        self._call(self.proxy.cut())

    def freeze(self) -> None:
        self._call(self.proxy.freeze())

    def restore(self) -> None:
        self._call(self.proxy.restore())

    def close(self) -> None:
        self._call(self.proxy.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    def _call(self, coro: Coroutine[Any, Any, None]) -> None:
        asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)
