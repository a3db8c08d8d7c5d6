"""What a 404 says when the client's base URL is one of the usual wrong ones.

A client is given the gateway's address in one of three ways that look right and are not:

- an OpenAI client pointed at the root, as LiteLLM proxy's quick start writes its address
  (``http://host:4000``, which LiteLLM proxy serves at ``/chat/completions`` too): the SDK
  then posts to ``/chat/completions``;
- an Anthropic client given the OpenAI base URL (``…/v1``): it adds ``/v1/messages``
  itself, so it posts to ``/v1/v1/messages``;
- OpenRouter's base URL pattern (``…/api/v1``).

Each was a bare "not served" 404, which reads as if the gateway lacked the endpoint. When
the path the client most likely meant is one a route serves, for that method, the 404 says
so and which base URL to give instead (the request is not served from there: one address per
endpoint keeps the metrics, the OpenAPI document and the logs plain).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.routing import Match


def _candidate(path: str) -> tuple[str, str] | None:
    """The path a wrong base URL turned into ``path``, and what to say about it."""
    if path.startswith("/v1/v1/"):
        return path[3:], (
            "the base URL has /v1 twice: an OpenAI client's base URL ends in /v1, an "
            "Anthropic client's is the gateway's root, without /v1"
        )
    if path.startswith("/api/v1/"):
        return path[4:], "the base URL here is the gateway's root with /v1, not /api/v1"
    if path.startswith("/") and not path.startswith("/v1/") and path != "/v1":
        return "/v1" + path, "an OpenAI client's base URL ends in /v1"
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
    message = f"{request.method} {request.url.path} is not served by this gateway"
    meant = meant_path(request)
    if meant is None:
        return message, request.url.path
    path, advice = meant
    return f"{message}; {request.method} {path} is: {advice}", path
