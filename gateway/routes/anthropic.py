"""The Anthropic-compatible surface: ``POST /v1/messages`` and
``POST /v1/messages/count_tokens``, for Anthropic's SDKs and the tools built on them
(``GET /v1/models`` answers them in their shape too: ``gateway.routes.openai``).

Plain Starlette routes, as the chat route is. They answer in Anthropic's shapes, errors
included (``{"type": "error", "error": {"type", "message"}}``), and take the key as
Anthropic's clients send it (``x-api-key``) or as OpenAI's do (``Authorization: Bearer``).
"""

from __future__ import annotations

import logging

import orjson
from starlette.requests import Request
from starlette.responses import Response

from gateway import messages
from gateway.chat import decode_json
from gateway.errors import APIError, bad_request, internal_error
from gateway.routes.openai import authorization, read_body, services
from gateway.schemas import ChatCompletionRequest
from gateway.translation import parse_body, renamed
from router.estimate import estimate_prompt_tokens

log = logging.getLogger(__name__)


async def create_message(request: Request) -> Response:
    """The Messages API, translated to a chat request and routed like one (see
    :mod:`gateway.messages`)."""
    s = services(request)
    assert s.auth is not None and s.chat is not None
    try:
        who = await s.auth.principal(authorization(request))
        raw = await read_body(request, s.settings.server.max_body_bytes)
    except APIError as err:
        return messages.anthropic_error(err)
    except Exception:
        log.exception("unexpected error in POST /v1/messages")
        return messages.anthropic_error(internal_error())
    try:
        req = messages.parse_request(decode_json(raw))
        chat_request = messages.to_chat(req)
    except Exception as exc:
        # Refused before it became a chat request: accounted for all the same, as the chat
        # service accounts for a chat request it refuses (ledger row, metrics, request id).
        if isinstance(exc, APIError):
            refusal = exc
        else:
            log.exception("could not translate a Messages request")
            refusal = internal_error()
        request_id = await s.chat.refused(refusal, who, "messages")
        return messages.anthropic_error(refusal, messages.request_id_headers(request_id))
    try:
        return messages.adapt(req, await s.chat.handle(chat_request, who, api="messages"))
    except Exception:
        log.exception("unexpected error in POST /v1/messages")
        return messages.anthropic_error(internal_error())


async def count_tokens(request: Request) -> Response:
    """How many input tokens a Messages request holds, as the gateway estimates them for
    budget holds: on the high side (3 bytes of UTF-8 a token, images and audio by size), never
    a provider's tokenizer."""
    s = services(request)
    assert s.auth is not None
    try:
        await s.auth.principal(authorization(request))
        raw = await read_body(request, s.settings.server.max_body_bytes)
        req = messages.parse_request(decode_json(raw), messages.CountTokensRequest)
        chat = messages.to_chat(req)
        try:
            # As the chat service validates it for POST /v1/messages: the same body is
            # refused the same way here (five stop_sequences, say).
            parse_body(ChatCompletionRequest, chat)
        except APIError as err:
            named = renamed(err.body()["error"], lambda param: messages.client_param(req, param))
            raise bad_request(str(named["message"]), param=named["param"]) from None
        tokens = estimate_prompt_tokens(chat["messages"], None, chat.get("tools"))
        return Response(orjson.dumps({"input_tokens": tokens}), media_type="application/json")
    except APIError as err:
        return messages.anthropic_error(err)
