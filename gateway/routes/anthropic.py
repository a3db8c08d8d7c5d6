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
from gateway.errors import APIError, internal_error
from gateway.routes.openai import authorization, read_body, services
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
        req = messages.parse_request(decode_json(raw))
        chat = await s.chat.handle(messages.to_chat(req), who, api="messages")
        return messages.adapt(req, chat)
    except APIError as err:
        return messages.anthropic_error(err)
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
        tokens = estimate_prompt_tokens(chat["messages"], None, chat.get("tools"))
        return Response(orjson.dumps({"input_tokens": tokens}), media_type="application/json")
    except APIError as err:
        return messages.anthropic_error(err)
