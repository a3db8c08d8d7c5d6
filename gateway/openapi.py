"""The OpenAPI document at ``/openapi.json``: every endpoint with what it takes and what it
answers, so that clients can be generated from it and a conformance tool can check the
server against it (tests/gateway/test_openapi.py runs schemathesis on a live gateway).

FastAPI writes the document from route signatures, and ours read their bodies and query
strings themselves (their error messages name the client's field; the chat endpoints are
plain Starlette routes, with no dependency solving on the hot path), so FastAPI alone would
document the chat, Responses and Messages endpoints not at all and the others without their
bodies, parameters or errors. Routes declare theirs with :func:`json_body` and :func:`query`
(``openapi_extra``); :func:`build` adds the plain routes, the request models' schemas and the
error shapes every endpoint answers with."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.messages.request import CountTokensRequest, MessagesRequest
from gateway.response_models import (
    AnthropicError,
    AnthropicMessage,
    ChatCompletion,
    Error,
    ResponseObject,
    TokenCount,
)
from gateway.responses.request import ResponsesRequest
from gateway.routes.admin_models import KeyCreate, KeyUpdate, ReloadRequest
from gateway.schemas import ChatCompletionRequest, FeedbackRequest

log = logging.getLogger(__name__)

_SCHEMAS = "#/components/schemas/"


def _ref(model: type[BaseModel] | str) -> dict[str, str]:
    return {"$ref": _SCHEMAS + (model if isinstance(model, str) else model.__name__)}


def json_body(model: type[BaseModel], *, required: bool = True) -> dict[str, Any]:
    """``openapi_extra`` for a route that parses ``model`` from its JSON body itself. The
    model must be one of ``_MODELS`` (the document's own test checks that every reference
    resolves)."""
    return {
        "requestBody": {
            "required": required,
            "content": {"application/json": {"schema": _ref(model)}},
        }
    }


@dataclass(frozen=True)
class Param:
    """A query parameter a route reads itself."""

    name: str
    schema: dict[str, Any]
    description: str
    required: bool = False


def query(*params: Param) -> dict[str, Any]:
    """``openapi_extra`` for the query parameters a route reads itself."""
    return {
        "parameters": [
            {
                "name": p.name,
                "in": "query",
                "required": p.required,
                "schema": p.schema,
                "description": p.description,
            }
            for p in params
        ]
    }


_ERROR = {
    "description": "An error, in OpenAI's shape (status codes and codes: the README's API section)",
    "content": {"application/json": {"schema": _ref(Error)}},
}
_ANTHROPIC_ERROR = {
    "description": "An error, in Anthropic's shape",
    "content": {"application/json": {"schema": _ref(AnthropicError)}},
}


def _operation(
    summary: str,
    operation_id: str,
    tag: str,
    body: type[BaseModel],
    answer: type[BaseModel],
    events: str | None,
    error: dict[str, Any],
) -> dict[str, Any]:
    content: dict[str, Any] = {"application/json": {"schema": _ref(answer)}}
    description = f"A {answer.__name__}"
    if events is not None:
        description += ", or its events when the request streams"
        # ``stream: true``: server-sent events, one JSON object each (``x-events``: which).
        content["text/event-stream"] = {"schema": {"type": "string"}, "x-events": events}
    return {
        "summary": summary,
        "operationId": operation_id,
        "tags": [tag],
        **json_body(body),
        "responses": {
            "200": {"description": description, "content": content},
            "default": error,
        },
    }


def _plain_routes() -> dict[str, dict[str, Any]]:
    """The endpoints mounted as plain Starlette routes (``gateway.app``)."""
    return {
        "/v1/chat/completions": {
            "post": _operation(
                "Create a chat completion (OpenAI's API); the model xrouter routes it",
                "chat_completions",
                "openai",
                ChatCompletionRequest,
                ChatCompletion,
                "chat.completion.chunk",
                _ERROR,
            )
        },
        "/v1/responses": {
            "post": _operation(
                "Create a response (OpenAI's Responses API), routed as a chat request",
                "create_response",
                "openai",
                ResponsesRequest,
                ResponseObject,
                "response.created … response.completed",
                _ERROR,
            )
        },
        "/v1/messages": {
            "post": _operation(
                "Create a message (Anthropic's Messages API), routed as a chat request",
                "create_message",
                "anthropic",
                MessagesRequest,
                AnthropicMessage,
                "message_start … message_stop",
                _ANTHROPIC_ERROR,
            )
        },
        "/v1/messages/count_tokens": {
            "post": _operation(
                "Count a Messages request's input tokens without asking a model",
                "count_message_tokens",
                "anthropic",
                CountTokensRequest,
                TokenCount,
                None,
                _ANTHROPIC_ERROR,
            )
        },
    }


# The models the plain routes and the routes' ``json_body`` name, and the error shapes.
_MODELS: tuple[type[BaseModel], ...] = (
    ChatCompletionRequest,
    ChatCompletion,
    ResponsesRequest,
    ResponseObject,
    MessagesRequest,
    CountTokensRequest,
    AnthropicMessage,
    TokenCount,
    FeedbackRequest,
    KeyCreate,
    KeyUpdate,
    ReloadRequest,
    Error,
    AnthropicError,
)


def build(app: FastAPI) -> dict[str, Any]:
    """The whole document: FastAPI's, completed."""
    doc = get_openapi(
        title=app.title,
        version=app.version,
        description="A cost-aware LLM routing gateway: OpenAI's and Anthropic's APIs, "
        "routed by a learned policy. The README documents every endpoint.",
        routes=app.routes,
    )
    components = doc.setdefault("components", {})
    _, top = models_json_schema(
        [(m, "validation") for m in _MODELS], ref_template=_SCHEMAS + "{model}"
    )
    schemas = components.setdefault("schemas", {})
    # FastAPI's own validation-error models describe a 422 this API never sends (a bad
    # request is a 400 in the one error shape).
    schemas.pop("HTTPValidationError", None)
    schemas.pop("ValidationError", None)
    schemas.update(top.get("$defs", {}))
    components["securitySchemes"] = {
        "bearer": {
            "type": "http",
            "scheme": "bearer",
            "description": "an API key, or the admin key for /admin",
        },
        "x-api-key": {
            "type": "apiKey",
            "in": "header",
            "name": "x-api-key",
            "description": "an API key, as Anthropic's clients send it",
        },
        "api-key": {
            "type": "apiKey",
            "in": "header",
            "name": "api-key",
            "description": "an API key, as Azure OpenAI's clients send it",
        },
    }
    # Optional: with auth off (the embedded default) no key is needed.
    doc["security"] = [{"bearer": []}, {"x-api-key": []}, {"api-key": []}, {}]
    paths = doc.setdefault("paths", {})
    paths.update(_plain_routes())
    for item in paths.values():
        for operation in item.values():
            responses = operation.setdefault("responses", {})
            responses.pop("422", None)
            responses.setdefault("default", _ERROR)
    return doc


def install(app: FastAPI) -> None:
    """Serve :func:`build`'s document, built on first request (in a worker thread) and
    kept."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            started = time.perf_counter()
            app.openapi_schema = build(app)
            log.debug(
                "built the OpenAPI document in %.0f ms", 1000 * (time.perf_counter() - started)
            )
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    for i, route in enumerate(app.router.routes):
        if isinstance(route, Route) and route.path == app.openapi_url:
            app.router.routes[i] = _built_off_loop(app, route)


def _built_off_loop(app: FastAPI, route: Route) -> Route:
    """FastAPI's ``/openapi.json`` route, with the document built in a worker thread on
    first request: ~200 ms of schema generation that held the event loop, and every request
    and stream on the worker with it, the first time a client or tool asked for it. (Two
    first requests at once may both build it: the same document, kept once.)"""
    served = route.endpoint

    async def serve(request: Request) -> Response:
        if app.openapi_schema is None:
            await asyncio.to_thread(app.openapi)
        response: Response = await served(request)
        return response

    return Route(route.path, serve, methods=route.methods, include_in_schema=False)
