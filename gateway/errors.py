"""One error shape for every failure: OpenAI's ``{"error": {message, type, param, code}}``."""

from __future__ import annotations

import asyncio
import logging
import math
import re
import secrets
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from sqlalchemy import exc as sa_exc
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.routing import Match

from gateway.base_urls import not_served_message
from gateway.echo import MESSAGE_LIMIT, clip
from router.providers.errors import ProviderError, retry_after_s

log = logging.getLogger(__name__)


class APIError(Exception):
    """Raised anywhere in the gateway; rendered as an OpenAI-shaped error response."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        # The last bound on what a client's input can make of an answer: the values a
        # message echoes are clipped where it is written (``gateway.echo``); this catches
        # one that reached it another way (a validator's message, a dict key in ``param``).
        message = clip(message, MESSAGE_LIMIT)
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = None if param is None else clip(param)
        self.code = code
        self.headers = dict(headers or {})

    def body(self) -> dict[str, dict[str, str | None]]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self, extra_headers: Mapping[str, str] | None = None) -> Response:
        headers = {**self.headers, **(extra_headers or {})}
        if "x-request-id" not in headers:
            # Every error carries an id, as OpenAI's API does (the SDKs read it into the
            # error's ``request_id``): one refused before it had a request id (a bad key, a
            # body too large, an admin call) gets one of its own, which no ledger row has.
            request_id = secrets.token_hex(16)
            headers["x-request-id"] = headers.setdefault("x-xrouter-request-id", request_id)
        return Response(
            orjson.dumps(self.body()),
            status_code=self.status,
            media_type="application/json",
            headers=headers,
        )


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def forbidden(message: str, code: str, param: str | None = "model") -> APIError:
    return APIError(403, message, type="permission_error", param=param, code=code)


def not_found(message: str, param: str | None = "model") -> APIError:
    return APIError(404, message, type="invalid_request_error", param=param, code="model_not_found")


# Upstream failures: the status tells the client whether retrying us may help. A request
# the upstream refused as invalid is the client's to fix — a 400, as OpenAI's own API and
# LiteLLM's proxy answer it (an app handles a content filter's refusal as a bad request);
# another 4xx (401, 403) is the gateway's credentials or setup, not the client's doing.
_UPSTREAM_STATUS = {
    "timeout": (504, "upstream_timeout"),
    "rate_limited": (503, "upstream_rate_limited"),
    "upstream_5xx": (502, "upstream_error"),
    "bad_request": (400, "upstream_bad_request"),
    "upstream_4xx": (502, "upstream_error"),
    "not_found": (502, "upstream_error"),
    "connection": (503, "upstream_unavailable"),
    "bad_response": (502, "upstream_bad_response"),
    "circuit_open": (503, "upstream_unavailable"),
}


# The status an error event in a stream stands for (the event carries only the body).
UPSTREAM_CODE_STATUS = {code: status for status, code in _UPSTREAM_STATUS.values()}


# Upstream refusals (of the request itself, of the gateway's credentials, of an unknown
# model): asked again, the gateway would be refused again — it already retried and fell back
# where it could — so the SDKs are told not to retry (OpenAI's honour ``x-should-retry``;
# they retry every 5xx otherwise) instead of sending the same request twice more.
_NOT_RETRYABLE = frozenset({"bad_request", "upstream_4xx", "not_found"})


def retry_after_headers(seconds: float) -> dict[str, str]:
    """``retry-after`` (whole seconds, as HTTP has it) and ``retry-after-ms``, which the
    OpenAI SDKs' backoff honours in place of its own (up to a minute)."""
    return {
        "retry-after": str(max(1, math.ceil(seconds))),
        "retry-after-ms": str(max(1, math.ceil(seconds * 1000))),
    }


def upstream_error(
    kind: str | None,
    message: str,
    *,
    transient: bool = False,
    retry_after_s: float | None = None,
) -> APIError:
    """The answer to a request whose upstream calls failed, ``kind`` being the failure
    reported. ``transient``: some call failed on something that passes (a 503 on one
    deployment before a 401 on the other), so a refusal does not forbid a retry.
    ``retry_after_s``: the upstream's ``retry-after`` on that failure, passed on so the
    client waits as long as the provider asked rather than retrying into its limit."""
    status, code = _UPSTREAM_STATUS.get(kind or "", (502, "upstream_error"))
    headers: dict[str, str] | None = None
    if kind in _NOT_RETRYABLE and not transient:
        headers = {"x-should-retry": "false"}
    elif retry_after_s is not None:
        headers = retry_after_headers(retry_after_s)
    return APIError(status, message, type="upstream_error", code=code, headers=headers)


def from_provider_error(err: ProviderError) -> APIError:
    return upstream_error(
        err.kind, err.message, transient=err.transient, retry_after_s=retry_after_s(err)
    )


# What pydantic puts in an error's location for the member of a union it tried (``str``,
# ``list[ContentPart]``, ``function-after[...]``, a model's class name): not a field. Field
# names here are lower-case identifiers.
_UNION_MEMBER = re.compile(r"^(?:str|int|float|bool|none|list|dict)$|[\[(,]|^[A-Z]")


def loc_to_param(loc: Sequence[int | str]) -> str | None:
    """A validation error's location as OpenAI names a parameter (``messages[0].content``),
    without the ``body`` prefix of FastAPI's locations or the union members pydantic adds
    (``messages[0].content.str``)."""
    parts = [
        str(p) for p in loc if p != "body" and not (isinstance(p, str) and _UNION_MEMBER.search(p))
    ]
    if not parts:
        return None
    out = parts[0]
    for p in parts[1:]:
        out += f"[{p}]" if p.isdigit() else f".{p}"
    return out


# OpenAI's codes for a parameter its schema refuses, by pydantic's error type: what a client
# that branches on ``error.code`` (the SDKs' ``exc.code``) gets from OpenAI for the same body
# ("Missing required parameter: 'messages'." is ``missing_required_parameter``). A rule of
# ours that pydantic reports as a ``value_error`` has no OpenAI counterpart: no code.
_TYPE_ERRORS = frozenset(
    {
        "string_type",
        "int_type",
        "int_from_float",
        "float_type",
        "bool_type",
        "list_type",
        "dict_type",
        "model_type",
        "model_attributes_type",
        "string_sub_type",
    }
)
_BOUNDS = {
    "greater_than": "below_min_value",
    "greater_than_equal": "below_min_value",
    "less_than": "above_max_value",
    "less_than_equal": "above_max_value",
}


def openai_code(err: Mapping[str, Any]) -> str | None:
    """The code OpenAI gives the parameter error pydantic reported as ``err``, if it has one."""
    kind, value = err.get("type"), err.get("input")
    if kind == "missing":
        return "missing_required_parameter"
    if kind in _TYPE_ERRORS:
        return "invalid_type"
    if kind in ("literal_error", "enum"):
        return "invalid_value"
    if kind == "extra_forbidden":
        return "unknown_parameter"
    if kind == "too_short" and isinstance(value, list) and not value:
        return "empty_array"
    bound = _BOUNDS.get(str(kind))
    if bound is not None and isinstance(value, float):
        # Only a number field takes a fraction, so this is OpenAI's "decimal" bound. A whole
        # number out of bounds may be either ("n": 0, "temperature": 3): the error does not
        # say which the field is, and a wrong code is worse than none.
        return "decimal_" + bound
    return None


def validation_error(
    errors: Sequence[Mapping[str, Any]], code: str | None = None, *, openai_codes: bool = True
) -> APIError:
    """The 400 for a body that failed its pydantic model, naming the most specific error: a
    content list's bad part, not the ``str`` member of the union that the list also failed
    to be. A value that is none of a union's members (``content: 5``) gets what each member
    wanted: "a valid string or a valid list". ``code``: OpenAI's for that error unless given
    (or ``openai_codes`` is off: Anthropic's API has no such codes)."""
    if not errors:
        return bad_request("invalid request", code=code)
    deepest = max(len(e["loc"]) for e in errors)
    err = next(e for e in errors if len(e["loc"]) == deepest)
    if code is None and openai_codes:
        code = openai_code(err)
    param = loc_to_param(err["loc"])
    members = [
        str(e["msg"]).removeprefix("Input should be ")
        for e in errors
        if len(e["loc"]) == deepest and loc_to_param(e["loc"]) == param
    ]
    msg = str(err["msg"])
    if len(members) > 1 and msg.startswith("Input should be "):
        msg = "Input should be " + " or ".join(dict.fromkeys(members))
    # Strict models say "a valid dictionary or instance of ImageURL": the class is ours.
    msg = _INSTANCE_OF.sub("", msg)
    # A field's name may be the client's (an unknown key): clipped as any echoed value.
    return bad_request(f"{clip(param)}: {msg}" if param else msg, param=param, code=code)


_INSTANCE_OF = re.compile(r" or instance of \w+")


def internal_error() -> APIError:
    return APIError(500, "internal error", type="server_error", code="internal_error")


def shutting_down() -> APIError:
    return APIError(
        503,
        "the gateway is shutting down; retry the request",
        type="server_error",
        code="shutting_down",
    )


def _shutdown_answer(scope: Any) -> Response:
    """The 503 for a request a shutdown cut short: with the id its ledger row has (as every
    answer carries one), in Anthropic's shape on the Messages API's paths."""
    from gateway.disconnect import client_watch
    from gateway.render import id_headers

    watch = client_watch(scope)
    request_id = watch.request_id if watch is not None else None
    err = shutting_down()
    path = scope.get("path", "")
    if path == "/v1/messages" or path.startswith("/v1/messages/"):
        from gateway import messages

        return messages.anthropic_error(err, messages.request_id_headers(request_id))
    # Without the request's own id, ``response`` gives it one.
    return err.response(id_headers(request_id) if request_id else None)


class CatchUnexpected:
    """Answers an unexpected exception with the OpenAI-shaped 500 *inside* Starlette's
    ServerErrorMiddleware, which would send the same answer and then re-raise, so that
    uvicorn logged the traceback a second time and closed the client's keep-alive
    connection. Once a response has started (a stream) there is nothing left to answer
    with: the exception goes on up as before."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Any) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except asyncio.CancelledError:
            # Nothing inside cancels a request's task: uvicorn does, to the requests still
            # running when its graceful shutdown times out. Their bookkeeping ran shielded
            # (their ledger rows land before the ledger closes); re-raised, uvicorn would
            # log a traceback for each and answer a bare text 500. An OpenAI-shaped 503
            # instead, which SDKs retry (on another replica); a stream already started can
            # only be cut, and uvicorn closes its connection.
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            log.warning(
                "%s %s cut short: the server is shutting down",
                scope.get("method"),
                scope.get("path"),
            )
            if not started:
                await _shutdown_answer(scope)(scope, receive, send)
        except Exception:
            if started:
                raise
            log.exception("unhandled error on %s %s", scope.get("method"), scope.get("path"))
            await internal_error().response()(scope, receive, send)


_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")


def _allowed_methods(request: Request) -> str:
    """The methods some route of the app serves on this request's path."""
    allowed = []
    for method in _METHODS:
        scope = {**request.scope, "method": method}
        if any(route.matches(scope)[0] == Match.FULL for route in request.app.router.routes):
            allowed.append(method)
    return ", ".join(allowed)


# What a database that is down, unreachable or overloaded raises through SQLAlchemy: the
# driver's errors, a pool with no connection to give, a connection lost.
DATABASE_OUTAGES = (sa_exc.DBAPIError, sa_exc.TimeoutError, sa_exc.DisconnectionError)


# How long a client is asked to wait on a 503 for a store that is down (its own answer, not
# an upstream's): about as long as a restarted Redis or a failed-over database takes to
# answer again. Without it, clients that honour only ``retry-after`` (proxies, other SDKs)
# retry at once, into the same outage.
STORE_RETRY_AFTER_S = 1.0


def database_unavailable(retry_after_s: float = STORE_RETRY_AFTER_S) -> APIError:
    """503 ``database_unavailable``; ``retry_after_s``: when the gateway asks the database
    again (a key lookup that failed holds the others back that long)."""
    return APIError(
        503,
        "the ledger database is unavailable",
        type="server_error",
        code="database_unavailable",
        headers=retry_after_headers(retry_after_s),
    )


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> Response:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> Response:
        return validation_error(exc.errors()).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        # Raised by the router alone (routes raise APIError): a path or a method that no
        # route serves.
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        message, headers = str(exc.detail), dict(exc.headers or {})
        path = request.url.path
        if exc.status_code == 404:
            # Say what was asked for, as OpenAI's "Invalid URL (POST /v1/...)" does: an SDK
            # call this gateway does not serve (embeddings, batches) is then plain; and,
            # when only the client's base URL is wrong, which one to give instead.
            message, path = not_served_message(request)
        if exc.status_code == 405:
            # A 405 must say which methods the resource takes (``Allow``, RFC 9110
            # §15.5.6). Starlette's header names only the first route on the path (GET
            # /admin/keys and POST /admin/keys are two routes), so ask every route.
            allow = _allowed_methods(request) or headers.get("Allow", "")
            headers["Allow"] = allow
            message = (
                f"{clip(request.method)} is not allowed on {clip(request.url.path)}; "
                f"it takes {allow}"
            )
        err = APIError(exc.status_code, message, type=kind, headers=headers)
        if path == "/v1/messages" or path.startswith("/v1/messages/"):
            # Anthropic's clients read Anthropic's shape there (a batch call, a wrong
            # method), as every other answer on those paths has it.
            from gateway.messages import anthropic_error

            return anthropic_error(err)
        return err.response()  # with an id of its own, which no ledger row has

    @app.exception_handler(sa_exc.SQLAlchemyError)
    async def _database(request: Request, exc: sa_exc.SQLAlchemyError) -> Response:
        # Admin, feedback and spend read and write the ledger database directly. A value it
        # refuses (a NUL character, a number out of range) is the request's fault; anything
        # else means the database is not answering. Handled here, not as a 500, so the
        # client's connection stays open.
        from gateway.ledger.store import describe_error, refused_data

        if refused_data(exc):
            return bad_request(
                "the request holds a value the database cannot store or compare "
                "(for example a NUL character or a number out of range)"
            ).response()
        if not isinstance(exc, DATABASE_OUTAGES):
            # A statement built wrong (SQLAlchemy refused it before the database saw it)
            # fails on every retry: a bug to show as one, not a database to wait for.
            log.error(
                "unhandled database error on %s %s", request.method, request.url.path,
                exc_info=exc,
            )  # fmt: skip
            return internal_error().response()
        log.warning(
            "database error on %s %s: %s", request.method, request.url.path, describe_error(exc)
        )
        return database_unavailable().response()

    app.add_middleware(CatchUnexpected)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        # Never a traceback to the client; the log has it.
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return internal_error().response()
