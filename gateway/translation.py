"""What the API translations over the chat service share (``gateway.responses``,
``gateway.messages``): validating a request body into its model with the error naming the
field, naming the client's field in an error about the translated chat request, the headers
of a chat answer worth keeping, and reading the chat service's SSE stream as chunks."""

from __future__ import annotations

import abc
import logging
import re
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar

import orjson
from pydantic import BaseModel, ValidationError
from starlette.responses import Response

from gateway.errors import APIError, bad_request, validation_error
from router.providers.content_parts import parts_text

log = logging.getLogger(__name__)

__all__ = [
    "BODY_HEADERS",
    "ChatAnswer",
    "Origin",
    "StreamTranslation",
    "chat_answer",
    "chat_chunks",
    "client_error",
    "grown_name",
    "message_param",
    "parse_body",
    "renamed",
    "renamed_error",
    "retranslated_param",
    "split_param",
    "with_meta",
]

M = TypeVar("M", bound=BaseModel)

# Headers of the chat answer that describe its body, not the request: a translated answer
# has a body of its own.
BODY_HEADERS = frozenset({"content-length", "content-type"})


def parse_body(kind: type[M], data: Any, *, openai_codes: bool = True) -> M:
    """``data`` (a decoded JSON body) as ``kind``, or a 400 naming the first bad field (with
    OpenAI's code for it, unless ``openai_codes`` is off)."""
    if not isinstance(data, dict):
        raise bad_request("request body must be a JSON object", code="invalid_json")
    try:
        return kind.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc.errors(), openai_codes=openai_codes) from None


_PARAM = re.compile(r"([^.\[]*)(?:\[(\d+)\])?(.*)", re.DOTALL)


def split_param(param: str) -> tuple[str, int | None, str]:
    """A field path as its first field, that field's index if it has one, and the rest:
    ``tools[2].function.name`` is ``("tools", 2, ".function.name")``."""
    m = _PARAM.fullmatch(param)
    assert m is not None  # every string matches
    return m[1], None if m[2] is None else int(m[2]), m[3]


def renamed(error: dict[str, Any], rename: Callable[[str], str]) -> dict[str, Any]:
    """An OpenAI-shaped error's content (``{message, type, param, code}``) about a field of
    the translated chat request, renamed to the field the client sent: the chat service
    validates the chat request, whose fields a Responses or Messages client never wrote."""
    param = error.get("param")
    if not isinstance(param, str) or not param:
        return error
    client = rename(param)
    if client == param:
        return error
    message = str(error.get("message") or "")
    if message.startswith(f"{param}: "):
        message = f"{client}: {message[len(param) + 2 :]}"
    return {**error, "param": client, "message": message}


def renamed_error(err: APIError, rename: Callable[[str], str]) -> APIError:
    """``err`` (about a field of the translated chat request) renamed as ``renamed`` does,
    its status, type, code and headers kept."""
    named = renamed(err.body()["error"], rename)
    return APIError(
        err.status,
        str(named["message"]),
        type=err.type,
        param=named["param"],
        code=err.code,
        headers=err.headers,
    )


@dataclass(slots=True)
class Origin:
    """Where a chat message of a translated request came from in the client's request, for
    an error about it (``messages[3].content``) to name the client's field: the item it was
    made from (``input[2]``, ``system``), the client's fields its own fields were made from
    (``content`` from ``input[2].content``), and, where one chat message gathers them from
    several places (a turn's tool calls, a tool result's images), each content part's and
    each tool call's."""

    at: str
    fields: dict[str, str] = field(default_factory=dict)
    parts: list[str] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)


def retranslated_param(translate: Callable[[list[Origin]], Any], param: str, whole: str) -> str:
    """``message_param`` for an error about the translated chat messages: ``translate``
    (the request's translation, run again) records where each came from; ``whole`` if it
    fails (it succeeded once already: not expected)."""
    origins: list[Origin] = []
    try:
        translate(origins)
    except APIError:
        return whole
    return message_param(origins, param, whole)


def message_param(origins: Sequence[Origin], param: str, whole: str) -> str:
    """The client's field that a chat-layer error naming ``param`` (``messages[3].content``,
    a field of the translated chat messages) is about, given each chat message's origin:
    the field the message's field was made from, else the item the message was made from;
    ``whole`` (the client's messages as a whole) when the error names no message."""
    _, index, rest = split_param(param)
    if index is None or index >= len(origins):
        return whole
    origin = origins[index]
    if not rest.startswith("."):
        return origin.at
    name, sub, tail = split_param(rest[1:])
    listed = {"content": origin.parts, "tool_calls": origin.calls}.get(name)
    if sub is not None and listed and sub < len(listed):
        # A part's ``type`` is ``type`` in every API's parts and blocks; its other fields
        # are named otherwise there (``image_url`` is an image block's ``source``).
        return listed[sub] + (tail if name == "content" and tail == ".type" else "")
    return origin.fields.get(name, origin.at)


def client_error(chat: Response, rename: Callable[[str], str]) -> Response:
    """The chat service's 400 (a JSON error body) with its field renamed (``renamed``); the
    status and headers stay as they are."""
    try:
        body = orjson.loads(chat.body)
        error = body["error"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return chat
    if not isinstance(error, dict):
        return chat
    headers = {k: v for k, v in chat.headers.items() if k not in BODY_HEADERS}
    return Response(
        orjson.dumps({**body, "error": renamed(error, rename)}),
        status_code=chat.status_code,
        media_type="application/json",
        headers=headers,
    )


class ChatAnswer(NamedTuple):
    request_id: str
    message: dict[str, Any]  # the first choice's
    finish_reason: str | None
    meta: dict[str, Any]  # the xrouter object


def chat_answer(chat: dict[str, Any]) -> ChatAnswer:
    """What a translation reads from the chat service's completion."""
    meta = chat.get("xrouter") or {}
    request_id = str(meta.get("request_id") or chat["id"].removeprefix("chatcmpl-"))
    choice = (chat.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    content = message.get("content")
    if isinstance(content, list):
        # Content parts (Mistral's reasoning models: text and thinking parts) reach here as
        # text, made so by the providers (``flatten_answer``); an answer cached before they
        # were may still hold them. The other APIs' text is a string (a list broke their
        # SDKs): the text parts', as a stream's is.
        message = {**message, "content": parts_text(content)}
    return ChatAnswer(request_id, message, choice.get("finish_reason"), meta)


def grown_name(name: str, piece: Any) -> str:
    """A streamed tool call's name so far, with the ``function.name`` a delta carried.

    Appended, as the OpenAI SDK accumulates a name (its ``accumulate_delta``): OpenAI sends
    the name whole in the call's first delta, but other servers split it into pieces or
    send ``""`` first. A piece that is the whole name so far is a repeat, not appended:
    servers that repeat the name in every delta (MiniMax through NVIDIA NIM, Fireworks) are
    common, and the SDK's ``read_fileread_file`` is no tool. Only a name that is one string
    twice, split at its middle, reads otherwise (``abab`` from ``ab`` + ``ab``: ``ab``)."""
    if not isinstance(piece, str) or not piece or piece == name:
        return name
    return name + piece


def with_meta(
    body: dict[str, Any], xrouter: dict[str, Any] | None, ignored_tools: list[str]
) -> dict[str, Any]:
    """``body`` with the ``xrouter`` object, if there is one or tools were left out: those
    the client offered that no model behind a chat API can call."""
    if xrouter is not None or ignored_tools:
        body["xrouter"] = dict(xrouter or {})
        if ignored_tools:
            body["xrouter"]["ignored_tools"] = ignored_tools
    return body


async def chat_chunks(
    chat_sse: AsyncIterable[str | bytes | memoryview],
) -> AsyncGenerator[dict[str, Any], None]:
    """The chat service's SSE stream as its chunks (``[DONE]`` left out), however the bytes
    were split. Closing this iterator (a client that went away) closes the chat stream with
    it, so that its bookkeeping (the ledger row, status 499) runs at once."""
    try:
        buffer = b""
        async for raw in chat_sse:
            buffer += raw.encode() if isinstance(raw, str) else bytes(raw)
            # One SSE event ends with a blank line; a read may hold several, or part of one.
            *events, buffer = buffer.split(b"\n\n")
            for event in events:
                for line in event.split(b"\n"):
                    if line.startswith(b"data: ") and line != b"data: [DONE]":
                        yield orjson.loads(line[6:])
    finally:
        aclose = getattr(chat_sse, "aclose", None)
        if aclose is not None:
            await aclose()


class StreamTranslation(abc.ABC):
    """A chat SSE stream translated event by event into another API's stream: ``start``
    opens it, ``on_chunk`` translates each chat chunk (setting ``done`` at the last one),
    and ``ended_early`` closes a stream whose chat side stopped before its last chunk."""

    done = False

    @abc.abstractmethod
    def start(self) -> bytes: ...

    @abc.abstractmethod
    def on_chunk(self, chunk: dict[str, Any]) -> bytes: ...

    @abc.abstractmethod
    def ended_early(self) -> bytes: ...

    async def translate(
        self, chat_sse: AsyncIterable[str | bytes | memoryview]
    ) -> AsyncIterator[bytes]:
        chunks = chat_chunks(chat_sse)
        try:
            yield self.start()
            async for chunk in chunks:
                try:
                    out = self.on_chunk(chunk)
                except Exception:
                    # A chunk this translation cannot take (a bug of ours: the providers
                    # check what they relay): end the stream with this API's failure event
                    # rather than cutting the connection.
                    log.exception("could not translate a chat chunk: %.200r", chunk)
                    break
                if out:
                    yield out
            if not self.done:  # the chat stream ended without its last chunk
                yield self.ended_early()
        finally:
            await chunks.aclose()  # a client that went away: the chat stream goes too
