"""The ASGI middleware that takes a request's W3C Trace Context (``traceparent``,
``tracestate``) for its upstream calls (``router.providers.trace_context``).

Pure ASGI rather than a route dependency: every API (chat, Responses, Messages) gets it,
and the app runs in this middleware's task, so the context variable it sets is the one the
route and the tasks it starts see. Off with ``server.forward_trace_context: false``."""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from router.providers.trace_context import bind, parse, unbind


class TraceContextMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        traceparents: list[str] = []
        tracestate: str | None = None
        for name, value in scope["headers"]:
            if name == b"traceparent":
                traceparents.append(value.decode("latin-1"))
            elif name == b"tracestate":
                # Several tracestate headers are one list (the spec: combine them).
                piece = value.decode("latin-1")
                tracestate = piece if tracestate is None else f"{tracestate},{piece}"
        # Two traceparent headers are no valid context (the spec): neither is forwarded.
        traceparent = traceparents[0] if len(traceparents) == 1 else None
        headers = parse(traceparent, tracestate)
        if headers is None:
            await self.app(scope, receive, send)
            return
        token = bind(headers)
        try:
            await self.app(scope, receive, send)
        finally:
            unbind(token)
