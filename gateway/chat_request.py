"""Reading a chat request: its body's JSON (with a nesting bound every JSON endpoint
shares), the schema, and what OpenAI's API requires beyond the schema — checked here, since a
provider's 400 for it would reach the client as a 502."""

from __future__ import annotations

import logging
from typing import Any

import orjson
from pydantic import ValidationError

from gateway.echo import echo
from gateway.errors import bad_request, validation_error
from gateway.request_body import invalid_json
from gateway.schemas import OPENAI_PART_TYPES, ChatCompletionRequest

log = logging.getLogger(__name__)

_KNOWN_FIELDS = frozenset(ChatCompletionRequest.model_fields)
# Fields whose null OpenAI documents as their default (``ChatCompletionRequest``).
_NULL_IS_DEFAULT = ("n", "stream")


# orjson reads JSON nested up to 1,024 levels deep but writes at most 254: a body read at
# 300 levels could not be forwarded, logged or cached, and failed as a 500 once routed.
# Bodies are refused (400) past what can be written back with this many levels to spare
# for what the gateway wraps around a request's values (a ledger row, a cache key).
_WRAP_LEVELS = 16
_MAX_DEPTH = 254 - _WRAP_LEVELS
# How the depth is checked: writing the body back costs time in proportion to its bytes
# (~1 µs per KB: 4.6 ms for a 5 MB base64 image), walking its arrays and objects in
# proportion to how many there are (~1 µs each: 1.5 ms for 50 tools' schemas, 10 µs for
# the image). Small bodies are written back; a large one is walked — most of a large body
# is one long string — up to this many containers, then written back.
_WALK_FROM_BYTES = 256 * 1024
_WALK_CONTAINERS = 5_000


def _written_back_fits(data: Any) -> bool:
    wrapped: Any = data
    for _ in range(_WRAP_LEVELS):
        wrapped = [wrapped]
    try:
        orjson.dumps(wrapped)
    except TypeError:  # orjson's "Recursion limit reached": nothing else it read can fail
        return False
    return True


def _walked_fits(data: Any) -> bool | None:
    """Whether no array or object lies deeper than ``_MAX_DEPTH``; None past
    ``_WALK_CONTAINERS`` containers (undecided)."""
    stack: list[tuple[Any, int]] = [(data, 1)]
    seen = 0
    while stack:
        node, depth = stack.pop()
        if depth > _MAX_DEPTH:
            return False
        seen += 1
        if seen > _WALK_CONTAINERS:
            return None
        children = node.values() if isinstance(node, dict) else node
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    return True


def decode_json(raw: bytes) -> Any:
    """A request body's JSON, or the 400 ``invalid_json`` error (every JSON endpoint's)."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise invalid_json(raw, exc) from None
    if not isinstance(data, dict | list):
        return data
    fits = _walked_fits(data) if len(raw) >= _WALK_FROM_BYTES else None
    if fits is None:
        fits = _written_back_fits(data)
    if not fits:
        raise bad_request(
            "request body is nested too deeply (arrays and objects within each other)",
            code="invalid_json",
        )
    return data


def parse_request(raw: bytes) -> tuple[dict[str, Any], ChatCompletionRequest]:
    return validate_request(decode_json(raw))


def validate_request(data: Any) -> tuple[dict[str, Any], ChatCompletionRequest]:
    if not isinstance(data, dict):
        raise bad_request("request body must be a JSON object", code="invalid_json")
    try:
        req = ChatCompletionRequest.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc.errors()) from None
    if any(data.get(k, 0) is None for k in _NULL_IS_DEFAULT):
        # Taken as the default (the schema's validator); forwarded as nothing, since not
        # every upstream takes null for them.
        data = {k: v for k, v in data.items() if not (k in _NULL_IS_DEFAULT and v is None)}
    unknown = data.keys() - _KNOWN_FIELDS
    if unknown:
        log.debug("tolerating unknown request fields: %s", sorted(unknown)[:10])
    _check_messages(req)
    if req.max_tokens is not None and req.max_completion_tokens is not None:
        # OpenAI refuses the pair (max_completion_tokens replaces max_tokens) and servers
        # that take both differ in which one they honour: OpenAI's own 400, not a 502 from
        # one upstream and a different length limit from another.
        raise bad_request(
            "Setting 'max_tokens' and 'max_completion_tokens' at the same time is not supported.",
            param="max_tokens",
            code="invalid_parameter_combination",
        )
    if not req.tools:
        data = _without_tool_settings(data, req)
    else:
        _check_named_tool(req)
    return data, req


# Roles whose message is nothing without its content (an assistant's may be only tool calls
# or a refusal; a legacy function result's may be null).
_CONTENT_REQUIRED = frozenset({"system", "developer", "user", "tool"})


# The parts of OpenAI's types each role's content may hold (the user's alone carry images,
# audio and files; an assistant's text or a refusal). Parts of other types are not judged.
_ROLE_PARTS: dict[str, tuple[str, ...]] = {
    "system": ("text",),
    "developer": ("text",),
    "tool": ("text",),
    "assistant": ("text", "refusal"),
    "user": ("text", "image_url", "input_audio", "file"),
}


def _check_messages(req: ChatCompletionRequest) -> None:
    """What OpenAI's API requires of each message beyond its types: a provider refuses a
    user message without content, an image in a system message or a tool result without
    the call it answers, and its 400 would reach the client as a 502."""
    called: set[str] = set()  # the ids of the calls the history has made so far
    for i, m in enumerate(req.messages):
        if (m.content is None or m.content == []) and m.role in _CONTENT_REQUIRED:
            raise bad_request(
                f"messages[{i}].content: a {m.role} message needs its content",
                param=f"messages[{i}].content",
            )
        allowed = _ROLE_PARTS.get(m.role)
        if isinstance(m.content, list) and allowed is not None:
            for j, part in enumerate(m.content):
                if part.type in OPENAI_PART_TYPES and part.type not in allowed:
                    kinds = " or ".join(f"'{t}'" for t in allowed)
                    raise bad_request(
                        f"messages[{i}].content[{j}].type: a {m.role} message takes {kinds} "
                        f"parts, not '{part.type}'",
                        param=f"messages[{i}].content[{j}].type",
                    )
        if m.role == "tool" and not m.tool_call_id:
            raise bad_request(
                f"messages[{i}].tool_call_id: a tool message answers a call: name it",
                param=f"messages[{i}].tool_call_id",
            )
        if m.role == "tool" and m.tool_call_id not in called:
            raise bad_request(
                f"messages[{i}].tool_call_id: no assistant message before it made a call "
                f"with id {echo(m.tool_call_id)}",
                param=f"messages[{i}].tool_call_id",
            )
        called.update(c.id for c in m.tool_calls or ())


def _check_named_tool(req: ChatCompletionRequest) -> None:
    """A ``tool_choice`` that names a function must name one of the request's tools, as
    OpenAI requires (a provider's 400 for it would reach the client as a 502, and some
    providers answer as if no tool were forced)."""
    choice = req.tool_choice
    if not isinstance(choice, dict) or choice.get("type") != "function":
        return
    fn = choice.get("function")
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str):
        raise bad_request(
            "tool_choice.function.name: a named tool choice needs the function's name",
            param="tool_choice.function.name",
        )
    if name not in {t.function.name for t in req.tools or ()}:
        raise bad_request(
            f"tool_choice.function.name: no tool named {echo(name)} is in the request's tools",
            param="tool_choice.function.name",
        )


def _without_tool_settings(data: dict[str, Any], req: ChatCompletionRequest) -> dict[str, Any]:
    """A request without tools, without what only tools give meaning to. Chat APIs refuse
    ``tool_choice``, ``parallel_tool_calls`` and an empty ``tools`` list without a tool to
    call (OpenAI's is a 400; here it was a 502, which the SDKs retry), and clients send them
    anyway (an agent's settings, with its tools left out). ``auto``, ``none`` and
    ``parallel_tool_calls`` then say what no tools says, and are dropped (as the Responses
    translation drops them); a choice that forces a call is the client's error."""
    choice = req.tool_choice
    if choice is not None and choice not in ("auto", "none"):
        raise bad_request(
            "tool_choice: a tool call is required but the request offers no tools",
            param="tool_choice",
        )
    dropped = ("tools", "tool_choice", "parallel_tool_calls")
    return {k: v for k, v in data.items() if k not in dropped}
