"""A client that hangs up before its answer starts stops the routing it is waiting for.

Once a response has started, Starlette's ``StreamingResponse`` notices the client leaving
and ends the stream (the request is booked as 499, for what it used). Before that — a JSON
answer being routed, a stream whose first chunk has not come, a retry after an upstream
failure — nothing reads from the connection, so a client that timed out left the gateway
routing, retrying and paying for an answer nobody would read, and the ledger said 200.

:class:`WatchDisconnect` (ASGI middleware, on the model endpoints) reads the connection once
the request body is in: the next message can only be ``http.disconnect``. If it comes
before the response starts, the :class:`ClientWatch` in the scope cancels the routing task
that :meth:`ClientWatch.guard` runs, and the request is answered as the client left (499,
booked with the calls it made, the upstream calls closed). Only the routing is cancelled,
never the bookkeeping after it, so no ledger row is cut in half.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from starlette.types import ASGIApp, Message, Receive, Scope, Send

T = TypeVar("T")

# Where the route finds the request's watch (``request.scope``).
SCOPE_KEY = "xrouter.client_watch"


class ClientGone(Exception):
    """The client hung up before its answer started."""


class ClientWatch:
    def __init__(self) -> None:
        self.gone = False
        self._routing: asyncio.Future[Any] | None = None
        # The request's id once it has one: an answer made outside the route (the 503 of a
        # shutdown that cut it short) carries it too.
        self.request_id: str | None = None

    def left(self) -> None:
        self.gone = True
        if self._routing is not None:
            self._routing.cancel()

    async def guard(self, work: Coroutine[Any, Any, T]) -> T:
        """``work``, cancelled if the client leaves meanwhile (then :class:`ClientGone`).
        A cancellation from outside (a shutdown) reaches ``work`` and goes on as one."""
        if self.gone:
            work.close()  # never started
            raise ClientGone
        task = asyncio.ensure_future(work)
        self._routing = task
        try:
            return await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if self.gone and current is not None and not current.cancelling():
                raise ClientGone from None
            raise
        finally:
            self._routing = None


def client_watch(scope: Scope) -> ClientWatch | None:
    watch = scope.get(SCOPE_KEY)
    return watch if isinstance(watch, ClientWatch) else None


class WatchDisconnect:
    def __init__(self, app: ASGIApp, paths: frozenset[str]) -> None:
        self.app = app
        self.paths = paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in self.paths:
            await self.app(scope, receive, send)
            return
        watch = ClientWatch()
        scope[SCOPE_KEY] = watch
        started = False
        listener: asyncio.Task[Message] | None = None

        async def listen() -> Message:
            message = await receive()
            if message["type"] == "http.disconnect" and not started:
                watch.left()
            return message

        async def watched_receive() -> Message:
            nonlocal listener
            if listener is not None:
                # The app listens too once it streams (Starlette's own disconnect check):
                # it gets what the listener got, never a second read of the connection.
                return await asyncio.shield(listener)
            message = await receive()
            if message["type"] == "http.request" and not message.get("more_body", False):
                listener = asyncio.create_task(listen(), name="xrouter-client-watch")
            elif message["type"] == "http.disconnect":
                watch.left()
            return message

        async def watched_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, watched_receive, watched_send)
        finally:
            if listener is not None and not listener.done():
                listener.cancel()
