"""Load shedding: at most ``server.max_in_flight`` model requests in flight per worker
(and, bound or not, the count of them in ``xrouter_requests_in_flight``).

When upstreams slow down, requests pile up in the gateway — each holding its body, its
routing state and a connection — until memory, file descriptors or the event loop give out,
and then every client waits on a gateway that can answer none of them. A bound turns that
into a fast, retryable refusal for the requests over it, while the ones admitted keep
their share of the worker:

- only the model endpoints count and are shed (``/v1/chat/completions``,
  ``/v1/responses``, ``/v1/messages``): health checks, ``/metrics``, the admin API and the
  dashboard keep answering, so a shedding replica stays observable and is not taken for a
  dead one;
- a request counts from its arrival to the end of its answer, a stream's last event
  included;
- a shed request is answered at once, before its body is read: a 503 ``overloaded`` in
  OpenAI's shape, and on ``/v1/messages`` Anthropic's own 529 ``overloaded_error``, each
  with ``retry-after: 1`` — which the SDKs retry — and never reaches the ledger (nothing
  was called or charged), like a body too large.

uvicorn's ``--limit-concurrency`` bounds every connection instead, health checks included,
and answers a bare text 503. The bound is per worker: with N workers a replica admits up
to N times it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.errors import APIError

if TYPE_CHECKING:
    from gateway.services import Services

# The model endpoints, by the API they serve (the metrics' ``api`` label): what is shed,
# and what gateway.disconnect watches.
MODEL_APIS = {
    "/v1/chat/completions": "chat",
    "/v1/responses": "responses",
    "/v1/messages": "messages",
}
RETRY_AFTER_S = 1


class LoadShedding:
    def __init__(self, app: ASGIApp, services: Services, limit: int | None) -> None:
        self.app = app
        self.services = services
        self.limit = limit
        self.in_flight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        api = MODEL_APIS.get(scope["path"]) if scope["type"] == "http" else None
        if api is None or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        metrics = self.services.metrics
        if self.limit is not None and self.in_flight >= self.limit:
            if metrics is not None:
                metrics.shed(api)
            await self._refuse(api)(scope, receive, send)
            return
        self.in_flight += 1
        if metrics is not None:
            metrics.in_flight(1)
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1
            if metrics is not None:
                metrics.in_flight(-1)

    def _refuse(self, api: str) -> ASGIApp:
        message = (
            f"the gateway is at capacity ({self.limit} requests in flight on this worker); "
            "retry shortly"
        )
        headers = {"retry-after": str(RETRY_AFTER_S)}
        if api == "messages":
            from gateway.messages import anthropic_error

            err = APIError(529, message, type="server_error", code="overloaded", headers=headers)
            return anthropic_error(err)
        err = APIError(503, message, type="server_error", code="overloaded", headers=headers)
        return err.response()
