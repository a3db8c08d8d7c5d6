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

from collections.abc import Iterable
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, Field
from pydantic.json_schema import models_json_schema

_SCHEMAS = "#/components/schemas/"


class ErrorDetail(BaseModel):
    message: str
    type: str = Field(description="invalid_request_error, authentication_error, ... (README)")
    param: str | None = Field(description="the request field at fault, when one is")
    code: str | None = Field(description="a stable code for programs, e.g. budget_exceeded")


class Error(BaseModel):
    """Every error of every endpoint but the Messages API: OpenAI's shape."""

    error: ErrorDetail


class AnthropicErrorDetail(BaseModel):
    type: str
    message: str


class AnthropicError(BaseModel):
    """The Messages API's errors, in Anthropic's shape (its clients parse nothing else)."""

    type: str = "error"
    error: AnthropicErrorDetail


def _ref(model: type[BaseModel] | str) -> dict[str, str]:
    return {"$ref": _SCHEMAS + (model if isinstance(model, str) else model.__name__)}


def json_body(model: type[BaseModel], *, required: bool = True) -> dict[str, Any]:
    """``openapi_extra`` for a route that parses ``model`` from its JSON body itself. The
    model must be one of :func:`build`'s ``models`` (the document's own test checks that
    every reference resolves)."""
    return {
        "requestBody": {
            "required": required,
            "content": {"application/json": {"schema": _ref(model)}},
        }
    }


def query(*params: tuple[str, dict[str, Any], str]) -> dict[str, Any]:
    """``openapi_extra`` for query parameters a route reads itself: (name, JSON schema,
    description) each; optional unless the schema says ``"x-required": True``."""
    out = []
    for name, schema, description in params:
        schema = dict(schema)
        required = bool(schema.pop("x-required", False))
        out.append(
            {
                "name": name,
                "in": "query",
                "required": required,
                "schema": schema,
                "description": description,
            }
        )
    return {"parameters": out}


def merge(*extras: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for extra in extras:
        out.update(extra)
    return out


_ERROR = {
    "description": "An error, in OpenAI's shape (status codes and codes: the README's API section)",
    "content": {"application/json": {"schema": _ref(Error)}},
}
_ANTHROPIC_ERROR = {
    "description": "An error, in Anthropic's shape",
    "content": {"application/json": {"schema": _ref(AnthropicError)}},
}
_OBJECT = {"type": "object"}


def _json(description: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": schema or _OBJECT}},
    }


def _streamable(description: str, events: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {
            "application/json": {"schema": _OBJECT},
            "text/event-stream": {"schema": {"type": "string"}, "x-events": events},
        },
    }


def _plain_routes(models: dict[str, type[BaseModel]]) -> dict[str, dict[str, Any]]:
    """The endpoints mounted as plain Starlette routes (``gateway.app``)."""
    chat = {
        "summary": "Create a chat completion (OpenAI's API); model xrouter routes it",
        "description": "The routing decision, cost and savings ride in the answer's `xrouter` "
        "object and `usage.cost`; `stream: true` answers with server-sent chunks.",
        "operationId": "chat_completions",
        "tags": ["openai"],
        "requestBody": json_body(models["ChatCompletionRequest"])["requestBody"],
        "responses": {
            "200": _streamable("A chat.completion, or its chunks", "chat.completion.chunk"),
            "default": _ERROR,
        },
    }
    response = {
        "summary": "Create a response (OpenAI's Responses API), routed as a chat request",
        "operationId": "create_response",
        "tags": ["openai"],
        "requestBody": json_body(models["ResponsesRequest"])["requestBody"],
        "responses": {
            "200": _streamable("A response object, or its events", "response.*"),
            "default": _ERROR,
        },
    }
    message = {
        "summary": "Create a message (Anthropic's Messages API), routed as a chat request",
        "operationId": "create_message",
        "tags": ["anthropic"],
        "requestBody": json_body(models["MessagesRequest"])["requestBody"],
        "responses": {
            "200": _streamable("A message, or its events", "message_start, content_block_*"),
            "default": _ANTHROPIC_ERROR,
        },
    }
    count = {
        "summary": "Count a Messages request's input tokens without calling a model",
        "operationId": "count_message_tokens",
        "tags": ["anthropic"],
        "requestBody": json_body(models["CountTokensRequest"])["requestBody"],
        "responses": {
            "200": _json(
                "The input token count",
                {"type": "object", "properties": {"input_tokens": {"type": "integer"}}},
            ),
            "default": _ANTHROPIC_ERROR,
        },
    }
    return {
        "/v1/chat/completions": {"post": chat},
        "/v1/responses": {"post": response},
        "/v1/messages": {"post": message},
        "/v1/messages/count_tokens": {"post": count},
    }


def build(app: FastAPI, models: Iterable[type[BaseModel]]) -> dict[str, Any]:
    """The whole document: FastAPI's, completed. ``models``: the request bodies the routes
    reference (by class name) with :func:`json_body`."""
    every: list[type[BaseModel]] = [*models, Error, AnthropicError]
    wire = {m.__name__: m for m in every}
    doc = get_openapi(
        title=app.title,
        version=app.version,
        description="A cost-aware LLM routing gateway: OpenAI's and Anthropic's APIs, "
        "routed by a learned policy. The README documents every endpoint.",
        routes=app.routes,
    )
    components = doc.setdefault("components", {})
    _, top = models_json_schema(
        [(m, "validation") for m in wire.values()], ref_template=_SCHEMAS + "{model}"
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
    }
    # Optional: with auth off (the embedded default) no key is needed.
    doc["security"] = [{"bearer": []}, {"x-api-key": []}, {}]
    paths = doc.setdefault("paths", {})
    paths.update(_plain_routes(wire))
    for item in paths.values():
        for operation in item.values():
            responses = operation.setdefault("responses", {})
            responses.pop("422", None)
            responses.setdefault("default", _ERROR)
    return doc


def install(app: FastAPI, models: Iterable[type[BaseModel]]) -> None:
    """Serve :func:`build`'s document, built on first request and kept."""
    wire = tuple(models)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = build(app, wire)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
