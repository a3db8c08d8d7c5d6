"""The Anthropic Messages API (``POST /v1/messages``), served by translation to and from
the chat completions path: :mod:`gateway.messages.request` turns the request into a chat
request, :mod:`gateway.messages.output` turns the chat service's answer (JSON, SSE or an
error) back into Anthropic's shapes."""

from __future__ import annotations

import secrets

import orjson
from starlette.responses import Response

from gateway.booked_stream import BookedStream
from gateway.errors import APIError
from gateway.messages.output import EventStream, error_body, from_chat_completion
from gateway.messages.request import (
    CountTokensRequest,
    MessagesRequest,
    client_param,
    parse_request,
    to_chat,
)
from gateway.render import id_headers
from gateway.translation import BODY_HEADERS, renamed

__all__ = [
    "CountTokensRequest",
    "MessagesRequest",
    "adapt",
    "anthropic_error",
    "client_param",
    "parse_request",
    "request_id_headers",
    "to_chat",
]


def request_id_headers(request_id: str | None = None) -> dict[str, str]:
    """The request's id as the gateway and OpenAI name it (``id_headers``) and as Anthropic
    does: its SDKs read ``request-id`` (not ``x-request-id``) into a message's
    ``_request_id`` and an error's ``request_id``. Without one (a request refused before
    it had one, a token count), a new id: every answer carries one, as Anthropic's do,
    though only a request the ledger has a row for is known by it to feedback and
    generation stats."""
    if request_id is None:
        request_id = secrets.token_hex(16)
    return {**id_headers(request_id), "request-id": request_id}


def _with_request_id(headers: dict[str, str]) -> dict[str, str]:
    request_id = headers.get("x-xrouter-request-id")
    return {**headers, **request_id_headers(request_id)} if request_id else headers


def anthropic_error(err: APIError, extra_headers: dict[str, str] | None = None) -> Response:
    """An error raised on the way in, in Anthropic's shape (same status and headers), with
    the request's id in ``extra_headers`` (``request_id_headers``), else a new one: an
    error refused before the request had one (a bad key, a body too large) carries one
    too."""
    headers = {**err.headers, **(extra_headers or {})}
    if "x-xrouter-request-id" not in headers:
        headers.update(request_id_headers())
    return Response(
        orjson.dumps(error_body(err.status, err.body()["error"])),
        status_code=err.status,
        media_type="application/json",
        headers=_with_request_id(headers),
    )


def adapt(req: MessagesRequest, chat: Response) -> Response:
    """The chat service's answer to the translated request, as the Messages API answers."""
    headers = _with_request_id({k: v for k, v in chat.headers.items() if k not in BODY_HEADERS})
    if chat.status_code != 200:
        try:
            err = orjson.loads(chat.body)["error"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            err = {"message": "error"}
        if chat.status_code == 400 and isinstance(err, dict):
            # The chat service validated the chat request: name the client's field.
            err = renamed(err, lambda param: client_param(req, param))
        return Response(
            orjson.dumps(error_body(chat.status_code, err)),
            status_code=chat.status_code,
            media_type="application/json",
            headers=headers,
        )
    if isinstance(chat, BookedStream):
        events = EventStream(req, headers["x-xrouter-request-id"], headers.get("x-xrouter-model"))
        return chat.translated(events.translate(chat.body_iterator), headers)
    body = from_chat_completion(req, orjson.loads(chat.body))
    return Response(orjson.dumps(body), media_type="application/json", headers=headers)
