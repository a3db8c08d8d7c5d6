"""The Anthropic-compatible surface: ``POST /v1/messages`` and
``POST /v1/messages/count_tokens``, for Anthropic's SDKs and the tools built on them
(``GET /v1/models`` answers them in their shape too: ``gateway.routes.openai``).

Plain Starlette routes, as the chat route is. They answer in Anthropic's shapes, errors
included (``{"type": "error", "error": {"type", "message"}}``), each answer with its
request id as Anthropic's SDK reads it (``request-id``), and take the key as Anthropic's
clients send it (``x-api-key``) or as OpenAI's do (``Authorization: Bearer``), as every
route does (``gateway.auth.presented_key``).
"""

from __future__ import annotations

import logging
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from gateway import messages
from gateway.chat import ChatService
from gateway.chat_request import decode_json
from gateway.disconnect import client_watch
from gateway.errors import APIError, internal_error
from gateway.off_loop import read_sized
from gateway.principal import Principal
from gateway.request_body import read_body
from gateway.routes.openai import services
from gateway.translation import renamed_error
from router.estimate import estimate_prompt_tokens

log = logging.getLogger(__name__)


async def create_message(request: Request) -> Response:
    """The Messages API, translated to a chat request and routed like one (see
    :mod:`gateway.messages`)."""
    s = services(request)
    assert s.auth is not None and s.chat is not None
    try:
        who = await s.auth.caller(request.headers)
        raw = await read_body(
            request, s.settings.server.max_body_bytes, s.settings.server.body_timeout_s
        )
    except APIError as err:
        # A bad key, a body too large: refused before it was a request the ledger keeps
        # (as chat's are), it gets a request id all the same (anthropic_error's own).
        return messages.anthropic_error(err)
    except Exception:
        log.exception("unexpected error in POST /v1/messages")
        return messages.anthropic_error(internal_error())
    try:
        req, chat_request = await read_sized(len(raw), lambda: _messages_to_chat(raw))
    except Exception as exc:
        # Refused before it became a chat request: accounted for all the same, as the chat
        # service accounts for a chat request it refuses (ledger row, metrics, request id).
        if isinstance(exc, APIError):
            refusal = exc
        else:
            log.exception("could not translate a Messages request")
            refusal = internal_error()
        refused_id = await s.chat.refused(refusal, who, "messages")
        return messages.anthropic_error(refusal, messages.request_id_headers(refused_id))
    request_id: str | None = None
    try:
        chat = await s.chat.handle(
            chat_request,
            who,
            api="messages",
            watch=client_watch(request.scope),
            body_bytes=len(raw),
        )
        request_id = chat.headers.get("x-xrouter-request-id")
        return messages.adapt(req, chat)
    except Exception:
        log.exception("unexpected error in POST /v1/messages (request %s)", request_id)
        # The id of the request the chat service answered (and keeps a ledger row for).
        return messages.anthropic_error(internal_error(), messages.request_id_headers(request_id))


async def count_tokens(request: Request) -> Response:
    """How many input tokens a Messages request holds, as the gateway estimates them for
    budget holds: on the high side (3 bytes of UTF-8 a token, images and audio by size), never
    a provider's tokenizer.

    A body ``POST /v1/messages`` would refuse before routing it is refused the same way
    (as Anthropic's API does): its translation, the chat service's validation, the model
    or policy it names and whether the key may use it, the models it may be routed to
    (``ChatService.check``). Nothing is routed or called, and a count is neither counted
    against the key's limits nor written to the ledger; its request id names no ledger
    row."""
    s = services(request)
    assert s.auth is not None and s.chat is not None
    ids = messages.request_id_headers()
    try:
        who = await s.auth.caller(request.headers)
        raw = await read_body(
            request, s.settings.server.max_body_bytes, s.settings.server.body_timeout_s
        )
        chat_service = s.chat
        tokens = await read_sized(len(raw), lambda: _count(chat_service, raw, who))
        return Response(
            orjson.dumps({"input_tokens": tokens}), media_type="application/json", headers=ids
        )
    except APIError as err:
        return messages.anthropic_error(err, ids)
    except Exception:
        log.exception("unexpected error in POST /v1/messages/count_tokens")
        return messages.anthropic_error(internal_error(), ids)


def _messages_to_chat(raw: bytes) -> tuple[messages.MessagesRequest, dict[str, Any]]:
    req = messages.parse_request(decode_json(raw))
    return req, messages.to_chat(req)


def _count(chat_service: ChatService, raw: bytes, who: Principal) -> int:
    """The body's input tokens, once refused as ``POST /v1/messages`` would refuse it."""
    req = messages.parse_request(decode_json(raw), messages.CountTokensRequest)
    chat = messages.to_chat(req)
    try:
        chat_service.check(chat, who)
    except APIError as err:
        # About the chat request: named as the client sent it (five stop_sequences are
        # ``stop_sequences``), as POST /v1/messages names it.
        raise renamed_error(err, lambda param: messages.client_param(req, param)) from None
    return estimate_prompt_tokens(chat["messages"], None, chat.get("tools"))
