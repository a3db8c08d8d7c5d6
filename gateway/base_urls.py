"""The base URLs a client may be given for the gateway, and what a 404 says for the usual
wrong ones.

The API is served under ``/v1``, and also at the root (``/chat/completions``,
``/models``, …), as LiteLLM proxy serves it: its quick start and its ``litellm_proxy/``
provider write the address without ``/v1``, and an OpenAI client given it posts there.
``RootAliases`` maps such a path to its ``/v1`` route before anything else sees the request,
so metrics, limits, load shedding and logs know one path per endpoint, and the OpenAPI
document lists the ``/v1`` ones.

Two other base URLs look right and are not:

- an Anthropic client given the OpenAI base URL (``…/v1``): it adds ``/v1/messages``
  itself, so it posts to ``/v1/v1/messages``;
- OpenRouter's base URL pattern (``…/api/v1``).

Each was a bare "not served" 404, which reads as if the gateway lacked the endpoint. When
the path the client most likely meant is one a route serves, for that method, the 404 says
so and which base URL to give instead. The method and path are echoed clipped
(``gateway.echo``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from starlette.requests import Request
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.echo import clip


def _paths(routes: Iterable[BaseRoute]) -> Iterator[str]:
    for route in routes:
        # FastAPI keeps an included router's routes behind it (``original_router``).
        included = getattr(route, "original_router", None)
        if included is not None:
            yield from _paths(included.routes)
        elif isinstance(path := getattr(route, "path", None), str):
            yield path


def api_segments(routes: Iterable[BaseRoute]) -> frozenset[str]:
    """The first path segments under ``/v1`` that ``routes`` serve (``chat``, ``models``,
    ``messages``, …): the root paths ``RootAliases`` maps."""
    return frozenset(p[4:].split("/", 1)[0] for p in _paths(routes) if p.startswith("/v1/"))


class RootAliases:
    """Pure ASGI: a request to ``/<segment>…`` for an API segment is served as
    ``/v1/<segment>…``. Outermost, so that every middleware sees the ``/v1`` path; a path
    under ``/v1`` passes with one string comparison."""

    def __init__(self, app: ASGIApp, segments: frozenset[str]) -> None:
        self.app = app
        self.segments = segments

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path: str = scope["path"]
            if not path.startswith("/v1/") and path[1:].split("/", 1)[0] in self.segments:
                scope = {**scope, "path": "/v1" + path}
                if scope.get("raw_path") is not None:
                    scope["raw_path"] = b"/v1" + scope["raw_path"]
        await self.app(scope, receive, send)


def _candidate(path: str) -> tuple[str, str] | None:
    """The path a wrong base URL turned into ``path``, and what to say about it."""
    if path.startswith("/v1/v1/"):
        return path[3:], (
            "the base URL has /v1 twice: an OpenAI client's base URL ends in /v1, an "
            "Anthropic client's is the gateway's root, without /v1"
        )
    if path.startswith("/api/v1/"):
        return path[4:], "the base URL here is the gateway's root with /v1, not /api/v1"
    return None


def meant_path(request: Request) -> tuple[str, str] | None:
    """``(path, advice)`` when ``request`` missed a route only by its base URL: the path it
    meant is served for its method."""
    found = _candidate(request.url.path)
    if found is None:
        return None
    path, advice = found
    scope = {**request.scope, "path": path, "root_path": ""}
    if any(route.matches(scope)[0] == Match.FULL for route in request.app.router.routes):
        return path, advice
    return None


def not_served_message(request: Request) -> tuple[str, str]:
    """The 404's message, and the path whose API shape it should take (the path meant, when
    there is one: an Anthropic client that posted to ``/v1/v1/messages`` reads Anthropic's)."""
    message = f"{clip(request.method)} {clip(request.url.path)} is not served by this gateway"
    meant = meant_path(request)
    if meant is None:
        return message, request.url.path
    path, advice = meant
    return f"{message}; {clip(request.method)} {path} is: {advice}", path
