"""A streamed answer whose bookkeeping runs even if its body never starts.

A stream's body is an async generator that books the request in its ``finally`` (the ledger
row, the key's slot, the budget holds, the upstream call closed, the answer cache's
waiters). An async generator that never started never runs its ``finally``. Under ASGI
spec 2.4 a server's ``send`` raises ``OSError`` once the client has gone, and Starlette then
ends the response at its first message, before the body is iterated: a client that hung up
between the routing and the response left no ledger row, and its slot, holds and upstream
call open until they expired. (Uvicorn's HTTP servers declare 2.3 today, where Starlette
starts the body before a disconnect can cancel it; this must not depend on that.)
``settle`` runs after the response, however it ended; the body makes it a no-op once it
has run.

A client that stops reading without closing its connection (a stalled reader, a client
frozen mid-stream) makes each write wait once the socket's buffers are full, and the body
waits with it, forever: ``server.request_timeout_s`` was only checked while waiting for the
upstream, so such a stream held its upstream connection, its ``max_in_flight`` place and
its key's parallel slot, and wrote no ledger row, until the client went. With a
``deadline``, a write still waiting at it ends the response: the connection is closed, the
body closed (the upstream call closed and booked for what was read, the row written as a
client's hang-up, 499, ``error_type`` ``client_stalled``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterable, Awaitable, Callable, Mapping

from starlette.responses import StreamingResponse
from starlette.types import Message, Receive, Scope, Send

log = logging.getLogger(__name__)

Settle = Callable[[], Awaitable[None]]


class _ClientStalled(Exception):
    """A write to the client was still waiting at the request's deadline."""


class BookedStream(StreamingResponse):
    def __init__(
        self,
        content: AsyncIterable[bytes],
        settle: Settle,
        *,
        headers: Mapping[str, str],
        media_type: str | None = "text/event-stream",
        deadline: float | None = None,
        on_stall: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(content, media_type=media_type, headers=headers)
        self.settle = settle
        # time.perf_counter() by which every write must have gone out; on_stall is told
        # (before the body is closed) when one had not.
        self.deadline = deadline
        self.on_stall = on_stall

    def translated(self, content: AsyncIterable[bytes], headers: Mapping[str, str]) -> BookedStream:
        """This stream's body as another API streams it (the Responses and Messages APIs
        translate the chat stream): settled as this one is."""
        return BookedStream(
            content,
            self.settle,
            headers=headers,
            media_type=self.media_type,
            deadline=self.deadline,
            on_stall=self.on_stall,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        bounded, timer = self._bounded(send)
        try:
            await super().__call__(scope, receive, bounded)
        except _ClientStalled:
            # Returning without the response's end: the server closes the connection.
            log.warning(
                "request %s: its client read nothing more of the stream by the request's "
                "deadline; connection closed",
                self.headers.get("x-xrouter-request-id"),
            )
            if self.on_stall is not None:
                self.on_stall()
        finally:
            if timer is not None:
                timer.cancel()  # it holds the connection's send until the deadline
            # Closed here, not whenever the abandoned generator is collected: its own
            # bookkeeping (the upstream call closed, the row) runs before settle's.
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                await aclose()
            await self.settle()

    def _bounded(self, send: Send) -> tuple[Send, asyncio.TimerHandle | None]:
        """``send``, cut with :class:`_ClientStalled` if it is still waiting at the deadline.
        One timer per stream, not one per write (a write that need not wait costs an
        assignment): at the deadline it cancels the write under way, if any; a write that
        starts later has to go out at once."""
        deadline = self.deadline
        if deadline is None:
            return send, None
        loop = asyncio.get_running_loop()
        writing: asyncio.Task[object] | None = None
        cut = False

        def expire() -> None:
            nonlocal cut
            if writing is not None and not cut:
                cut = True
                writing.cancel()

        timer = loop.call_later(max(deadline - time.perf_counter(), 0.0), expire)

        async def bounded(message: Message) -> None:
            nonlocal writing, cut
            past = time.perf_counter() >= deadline
            writing = asyncio.current_task()
            try:
                if past:
                    # After the deadline (the body's own timeout event, its last chunk): a
                    # write that must wait for the client is not waited for.
                    async with asyncio.timeout(0):
                        await send(message)
                else:
                    await send(message)
            except TimeoutError:
                raise _ClientStalled from None
            except asyncio.CancelledError:
                if cut and writing is not None and writing.uncancel() == 0:
                    raise _ClientStalled from None
                raise
            finally:
                writing = None

        return bounded, timer
