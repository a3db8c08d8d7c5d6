"""The OpenAI-compatible surface: chat completions, responses, models."""

from __future__ import annotations

import logging
import secrets
from typing import Any

import orjson
from fastapi import APIRouter, Request
from starlette.exceptions import HTTPException
from starlette.responses import Response

from gateway import messages, model_list, responses
from gateway.chat_request import decode_json
from gateway.disconnect import client_watch
from gateway.echo import echo
from gateway.errors import APIError, internal_error, not_found
from gateway.off_loop import read_sized
from gateway.render import id_headers
from gateway.request_body import read_body
from gateway.response_models import ModelEntry, ModelList
from gateway.services import Services

log = logging.getLogger(__name__)

router = APIRouter()


def services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


async def chat_completions(request: Request) -> Response:
    """Mounted as a plain Starlette route (see ``gateway.app``): the hot path needs none of
    FastAPI's dependency solving, and skipping it is measurable at 1,000 requests/s."""
    s = services(request)
    assert s.auth is not None and s.chat is not None
    try:
        who = await s.auth.caller(request.headers)
        raw = await read_body(
            request, s.settings.server.max_body_bytes, s.settings.server.body_timeout_s
        )
    except APIError as err:
        # A bad key, a body too large: refused before it was a request the ledger keeps,
        # with a request id all the same, as every other answer has.
        return err.response()
    return await s.chat.handle(raw, who, watch=client_watch(request.scope))


async def create_response(request: Request) -> Response:
    """The Responses API, translated to a chat request and routed like one (see
    :mod:`gateway.responses`). A plain Starlette route, as the chat endpoint is. Every
    answer carries its request id (``x-request-id``, which OpenAI's SDKs read into an
    error's ``request_id``), errors included."""
    s = services(request)
    assert s.auth is not None and s.chat is not None
    try:
        who = await s.auth.caller(request.headers)
        raw = await read_body(
            request, s.settings.server.max_body_bytes, s.settings.server.body_timeout_s
        )
    except APIError as err:
        # A bad key, a body too large: refused before it was a request the ledger keeps (as
        # chat's are), with a request id all the same.
        return err.response()
    try:
        req, chat_request = await read_sized(len(raw), lambda: _responses_to_chat(raw))
    except APIError as err:
        # Refused before it became a chat request: accounted for all the same, as the chat
        # service accounts for a chat request it refuses (ledger row, metrics, request id).
        request_id = await s.chat.refused(err, who, "responses")
        return err.response(id_headers(request_id))
    except Exception:
        log.exception("could not translate a Responses request")
        failure = internal_error()
        request_id = await s.chat.refused(failure, who, "responses")
        return failure.response(id_headers(request_id))
    chat = await s.chat.handle(
        chat_request,
        who,
        api="responses",
        watch=client_watch(request.scope),
        body_bytes=len(raw),
    )
    try:
        return responses.adapt(req, chat)
    except Exception:
        request_id = chat.headers.get("x-xrouter-request-id") or secrets.token_hex(16)
        log.exception("unexpected error in POST /v1/responses (request %s)", request_id)
        # The id of the request the chat service answered (and keeps a ledger row for).
        return internal_error().response(id_headers(request_id))


def _responses_to_chat(raw: bytes) -> tuple[responses.ResponsesRequest, dict[str, Any]]:
    req = responses.parse_request(decode_json(raw))
    return req, responses.to_chat(req)


# OpenAI's calls on a stored response: retrieve, delete, cancel, list its input items.
_STORED_RESPONSE_CALLS = frozenset(
    {("GET", ""), ("DELETE", ""), ("POST", "/cancel"), ("GET", "/input_items")}
)


# Not in the OpenAPI document: it answers nothing but a 404 that says why, for clients of
# OpenAI's stored responses; no client should be generated to call it.
@router.api_route(
    "/v1/responses/{response_id}{rest:path}",
    methods=["GET", "POST", "DELETE"],
    include_in_schema=False,
)
async def stored_response(request: Request, response_id: str, rest: str) -> Response:
    """Retrieve, delete, cancel, input_items: the calls on a stored response. Nothing is
    stored here, so each is a 404 that says so (rather than a bare "Not Found"), with a
    request id as every Responses API error has."""
    if (request.method, rest) not in _STORED_RESPONSE_CALLS:
        # Another endpoint under /v1/responses/ (input_tokens, compact) or a wrong method:
        # not served, said as for any path the gateway does not serve.
        raise HTTPException(404)
    s = services(request)
    assert s.auth is not None
    try:
        await s.auth.caller(request.headers)
    except APIError as err:
        return err.response()
    return APIError(
        404,
        f"no response {echo(response_id)}: xrouter stores no responses (each is answered with "
        "store: false); keep what you need from the response itself",
        param="response_id",
        code="response_not_found",
    ).response()


def _anthropic_client(request: Request) -> bool:
    # Anthropic's API requires this header on every request; OpenAI's clients never send it.
    return "anthropic-version" in request.headers


@router.get("/v1/models", response_model=ModelList)
async def list_models(request: Request) -> Response:
    s = services(request)
    assert s.auth is not None
    anthropic = _anthropic_client(request)
    # An id on every answer, as both providers' APIs send one (no ledger row has it).
    headers = messages.request_id_headers()
    try:
        who = await s.auth.caller(request.headers)
        data = model_list.list_models(s.current(), who)
        if anthropic:
            q = request.query_params
            body = model_list.anthropic_list(
                data, q.get("limit"), q.get("after_id"), q.get("before_id")
            )
        else:
            body = {"object": "list", "data": data}
    except APIError as err:
        return messages.anthropic_error(err, headers) if anthropic else err.response(headers)
    return Response(orjson.dumps(body), media_type="application/json", headers=headers)


# ``:path`` because router names have a slash in them (``xrouter/cascade``).
@router.get("/v1/models/{model_id:path}", response_model=ModelEntry)
async def retrieve_model(request: Request, model_id: str) -> Response:
    s = services(request)
    assert s.auth is not None
    anthropic = _anthropic_client(request)
    headers = messages.request_id_headers()
    try:
        who = await s.auth.caller(request.headers)
        entry = model_list.find_model(s.current(), who, model_id)
        if entry is None:
            raise not_found(
                f"the model {echo(model_id)} does not exist; "
                "GET /v1/models lists the available ones"
            )
    except APIError as err:
        return messages.anthropic_error(err, headers) if anthropic else err.response(headers)
    body = model_list.anthropic_entry(entry) if anthropic else entry
    return Response(orjson.dumps(body), media_type="application/json", headers=headers)
