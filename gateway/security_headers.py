"""``X-Content-Type-Options: nosniff`` on every answer.

Error bodies echo what the client sent (a model name, a path); without ``nosniff`` a browser
may sniff a JSON body that looks like HTML and render it as such. A plain ASGI wrapper that
adds one header to ``http.response.start``: on the benchmarked request path it costs one
function call per message, where Starlette's ``BaseHTTPMiddleware`` would run each request
through its own task and memory streams. The dashboard's own page headers (framing, CSP) are
set by its route (``gateway.routes.dashboard``).
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

NOSNIFF = (b"x-content-type-options", b"nosniff")


class NoSniff:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_nosniff(message: Message) -> None:
            if message["type"] == "http.response.start":
                # A new list: a response object's own header list may be sent again.
                message["headers"] = [*message.get("headers", ()), NOSNIFF]
            await send(message)

        await self.app(scope, receive, send_nosniff)
