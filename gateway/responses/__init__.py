"""The Responses API (``POST /v1/responses``), served by translation to and from the chat
completions path: :mod:`gateway.responses.request` turns the request into a chat request,
:mod:`gateway.responses.output` turns the chat service's answer (JSON or SSE) back into a
``response`` object or its events."""

from __future__ import annotations

import time

import orjson
from starlette.responses import Response

from gateway.booked_stream import BookedStream
from gateway.responses.output import EventStream, from_chat_completion
from gateway.responses.request import ResponsesRequest, client_param, parse_request, to_chat
from gateway.translation import BODY_HEADERS, client_error

__all__ = ["ResponsesRequest", "adapt", "parse_request", "to_chat"]


def adapt(req: ResponsesRequest, chat: Response) -> Response:
    """The chat service's answer to the translated request, as the Responses API answers.
    Errors keep their status and OpenAI's error shape, which both APIs share; a 400 names
    the request's field, not the chat request's."""
    if chat.status_code == 400:
        return client_error(chat, lambda param: client_param(req, param))
    if chat.status_code != 200:
        return chat
    headers = {k: v for k, v in chat.headers.items() if k not in BODY_HEADERS}
    if isinstance(chat, BookedStream):
        events = EventStream(
            req, headers["x-xrouter-request-id"], int(time.time()), headers.get("x-xrouter-model")
        )
        return chat.translated(events.translate(chat.body_iterator), headers)
    body = from_chat_completion(req, orjson.loads(chat.body))
    return Response(orjson.dumps(body), media_type="application/json", headers=headers)
