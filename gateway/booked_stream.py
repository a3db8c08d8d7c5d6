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
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Awaitable, Callable, Mapping

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

Settle = Callable[[], Awaitable[None]]


class BookedStream(StreamingResponse):
    def __init__(
        self,
        content: AsyncIterable[bytes],
        settle: Settle,
        *,
        headers: Mapping[str, str],
        media_type: str | None = "text/event-stream",
    ) -> None:
        super().__init__(content, media_type=media_type, headers=headers)
        self.settle = settle

    def translated(self, content: AsyncIterable[bytes], headers: Mapping[str, str]) -> BookedStream:
        """This stream's body as another API streams it (the Responses and Messages APIs
        translate the chat stream): settled as this one is."""
        return BookedStream(content, self.settle, headers=headers, media_type=self.media_type)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.settle()
