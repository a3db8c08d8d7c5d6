"""The Responses API request (``POST /v1/responses``) and its translation into the chat
completions request that the gateway routes.

The Responses API is the shape newer OpenAI clients send (the Agents SDK and Codex use it by
default). Everything it can say that a chat request can say too is translated: ``input`` as
a string or as items (messages with text and image parts, ``function_call`` and
``function_call_output`` items), ``instructions``, function tools and ``tool_choice``,
``text.format`` (JSON mode and schemas), ``max_output_tokens``, sampling settings and the
``xrouter`` routing controls. What needs state on the server (``previous_response_id``,
``conversation``, ``background``, a stored ``prompt`` template, item references) is refused
with a 400 that says so: the gateway stores no responses, so a client sends the whole
conversation, as it does with ``store: false``. Tools OpenAI hosts are left out
(``gateway.responses.tools``); forcing one with ``tool_choice`` is refused.
"""

from __future__ import annotations

import logging
from functools import cached_property
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gateway.echo import echo
from gateway.errors import APIError, bad_request
from gateway.responses.tools import ToolMap, chat_name, map_tools
from gateway.translation import Origin, parse_body, retranslated_param, split_param

log = logging.getLogger(__name__)


class ResponsesRequest(BaseModel):
    # Unknown fields are tolerated (OpenAI adds fields often) but not forwarded: they are
    # Responses fields, which a chat provider would refuse.
    # Known ones are checked strictly, as OpenAI checks them and as the chat endpoint does:
    # "stream": "yes" is a 400, not a stream.
    model_config = ConfigDict(extra="allow", strict=True)

    model: str = Field(min_length=1)
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    text: dict[str, Any] | None = None
    stream: bool = False
    store: bool | None = None
    previous_response_id: str | None = None
    conversation: str | dict[str, Any] | None = None
    background: bool | None = None
    prompt: dict[str, Any] | None = None  # a prompt template stored at OpenAI
    metadata: dict[str, str] | None = None
    user: str | None = None
    safety_identifier: str | None = None  # OpenAI's newer name for the end user
    seed: int | None = None
    # Validated again, with the chat request, by the chat service.
    xrouter: dict[str, Any] | None = None

    @cached_property
    def tool_map(self) -> ToolMap:
        """The request's tools as chat tools (computed once; the answer is mapped back with
        the same map). A cached property, not a private attribute: pydantic's private
        attributes cost microseconds per read."""
        return map_tools(self.tools)

    @field_validator("stream", mode="before")
    @classmethod
    def _null_stream(cls, v: Any) -> Any:
        # "boolean or null" in OpenAI's reference; its SDK sends null for stream=None.
        return False if v is None else v

    @field_validator("input", mode="before")
    @classmethod
    def _input(cls, v: Any) -> Any:
        # One message for both wrong shapes (pydantic would report each union branch).
        if not isinstance(v, str) and not (
            isinstance(v, list) and all(isinstance(item, dict) for item in v)
        ):
            raise ValueError("must be a string or a list of input items (objects)")
        return v


def parse_request(data: Any) -> ResponsesRequest:
    return parse_body(ResponsesRequest, data)


def _unsupported(message: str, param: str) -> APIError:
    return APIError(400, message, param=param, code="unsupported_parameter")


_STATEFUL = {
    "previous_response_id": "xrouter stores no responses: send the whole conversation as `input`",
    "conversation": "xrouter stores no conversations: send the whole conversation as `input`",
    "background": "background responses are not supported: stream the response instead",
    "prompt": "xrouter stores no prompt templates: send the prompt's text as `instructions`"
    " and `input`",
}
_ROLES = {"user", "system", "developer", "assistant"}


def to_chat(req: ResponsesRequest) -> dict[str, Any]:
    """The chat completions request that asks for what ``req`` asks for."""
    for field, why in _STATEFUL.items():
        # Present at all (an empty `conversation` too), except `background: false`, which
        # asks for what is served anyway.
        if getattr(req, field) not in (None, False):
            raise _unsupported(f"{field}: {why}", field)
    unknown = (req.model_extra or {}).keys()
    if unknown:
        log.debug("responses: not forwarding fields %s", sorted(unknown)[:10])
    messages = _chat_messages(req)
    if not any(m["role"] != "system" for m in messages):
        raise bad_request("input: nothing to answer (no message in the input)", param="input")
    chat: dict[str, Any] = {"model": req.model, "messages": messages, "stream": req.stream}
    tools = req.tool_map
    if tools.chat_tools:
        chat["tools"] = tools.chat_tools
    if tools.ignored:
        log.debug("responses: tools no chat model can call, left out: %s", tools.ignored)
    if req.tool_choice is not None:
        choice = _tool_choice(req.tool_choice, {t["function"]["name"] for t in tools.chat_tools})
        if choice is not None:
            chat["tool_choice"] = choice
    fmt = (req.text or {}).get("format")
    if fmt is not None:
        response_format = _response_format(fmt)
        if response_format is not None:
            chat["response_format"] = response_format
    if req.max_output_tokens is not None:
        chat["max_completion_tokens"] = req.max_output_tokens
    # The end user under both names, as the chat API takes them: forwarded, and the
    # ledger's end user (``user``, else ``safety_identifier``) as on the chat endpoint.
    for field in ("temperature", "top_p", "user", "safety_identifier", "seed", "xrouter"):
        value = getattr(req, field)
        if value is not None:
            chat[field] = value
    # Chat APIs refuse parallel_tool_calls (and tool_choice) without tools; with none to
    # offer (every tool left out, or none sent) it says nothing anyway.
    if req.parallel_tool_calls is not None and tools.chat_tools:
        chat["parallel_tool_calls"] = req.parallel_tool_calls
    return chat


def _chat_messages(
    req: ResponsesRequest, origins: list[Origin] | None = None
) -> list[dict[str, Any]]:
    """The chat messages ``req`` translates to; with ``origins``, where each came from in
    the request (appended to it, one per message), for an error about one to name it."""
    messages: list[dict[str, Any]] = []
    if req.instructions:
        messages.append({"role": "system", "content": req.instructions})
        if origins is not None:
            origins.append(Origin("instructions", {"content": "instructions"}))
    if isinstance(req.input, str):
        messages.append({"role": "user", "content": req.input})
        if origins is not None:
            origins.append(Origin("input", {"content": "input"}))
    else:
        # Images from function_call_output items (with where each was in the request), for
        # the user message after the outputs.
        images: list[tuple[dict[str, Any], str]] = []
        for i, item in enumerate(req.input):
            _add_item(messages, item, f"input[{i}]", images, origins)
        _add_images(messages, images, origins)
    return messages


# Chat request fields -> the Responses fields they were translated from.
_CLIENT_FIELDS = {"max_completion_tokens": "max_output_tokens"}


def client_param(req: ResponsesRequest, param: str) -> str:
    """The request's field that a chat-layer error naming ``param`` (a field of the
    translated chat request) is about: ``tools[0].function.parameters`` is
    ``tools[0].parameters``, or ``tools[2].tools[0].parameters`` in a namespace;
    ``messages[2].content`` the content of the input item that became the third chat
    message (``input[1].content`` after instructions, which became the first)."""
    head, index, rest = split_param(param)
    if head == "tools" and index is not None and index < len(req.tool_map.sources):
        return req.tool_map.sources[index] + rest.removeprefix(".function")
    if head == "response_format" and index is None:
        # ``text.format`` is the chat format's type and its ``json_schema`` object's fields
        # in one object: ``response_format.json_schema.name`` is ``text.format.name``.
        return "text.format" + rest.removeprefix(".json_schema")
    if head == "messages":
        # Translated again, noting where each message came from: the chat messages are not
        # the input items one for one (instructions, a turn's text and calls merged into one
        # message, a function output's images moved to a user message after it).
        return retranslated_param(lambda o: _chat_messages(req, o), param, "input")
    if head in _CLIENT_FIELDS:
        return _CLIENT_FIELDS[head]
    return param


def _add_images(
    messages: list[dict[str, Any]],
    images: list[tuple[dict[str, Any], str]],
    origins: list[Origin] | None,
) -> None:
    """The images of the function outputs just added, as the user message after them: a
    chat tool message holds text only (as the Messages API's tool-result images)."""
    if images:
        messages.append({"role": "user", "content": [image for image, _ in images]})
        if origins is not None:
            parts = [at for _, at in images]
            origins.append(Origin(parts[0], {"content": parts[0]}, parts))
        images.clear()


def _add_item(
    messages: list[dict[str, Any]],
    item: dict[str, Any],
    where: str,
    images: list[tuple[dict[str, Any], str]],
    origins: list[Origin] | None,
) -> None:
    kind = item.get("type", "message" if "role" in item else None)
    if kind != "function_call_output":
        # A turn's outputs (parallel calls' are consecutive items) stay together, right
        # after the calls they answer, as chat requires: their images come after them.
        _add_images(messages, images, origins)
    if kind == "message":
        role = item.get("role")
        # Checked as a string first: a list or an object is not hashable.
        if not isinstance(role, str) or role not in _ROLES:
            raise bad_request(
                f"{where}.role: must be one of {', '.join(sorted(_ROLES))}", param=f"{where}.role"
            )
        content = item.get("content")
        if role == "assistant" and _calls_pending(messages):
            _join_turn(messages[-1], _assistant_text(content, where))
            if origins is not None:
                fields = origins[-1].fields
                fields.setdefault("content", f"{where}.content")
                fields.setdefault("role", f"{where}.role")
            return
        if role == "assistant":
            messages.append({"role": "assistant", "content": _assistant_text(content, where)})
        else:
            messages.append({"role": role, "content": _user_content(content, where)})
        if origins is not None:
            fields = {"content": f"{where}.content", "role": f"{where}.role"}
            parts: list[str] = []
            if role != "assistant" and isinstance(content, list):
                # A user, system or developer message's parts are the chat message's, one
                # for one (an assistant's are joined into one text).
                parts = [f"{where}.content[{j}]" for j in range(len(content))]
            origins.append(Origin(where, fields, parts))
    elif kind == "function_call":
        namespace = item.get("namespace")
        call = {
            "id": _required_str(item, "call_id", where),
            "type": "function",
            "function": {
                "name": chat_name(
                    namespace if isinstance(namespace, str) else None,
                    _required_str(item, "name", where),
                ),
                "arguments": _required_str(item, "arguments", where),
            },
        }
        # Chat puts a turn's calls (parallel calls are consecutive items) in the assistant
        # message of that turn, after its text if it had any.
        if messages and messages[-1]["role"] == "assistant":
            messages[-1].setdefault("tool_calls", []).append(call)
            if origins is not None:
                origins[-1].calls.append(where)
        else:
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            if origins is not None:
                origins.append(Origin(where, calls=[where]))
    elif kind == "function_call_output":
        output = item.get("output")
        text = (
            output if isinstance(output, str) else _output_parts(output, f"{where}.output", images)
        )
        messages.append(
            {
                "role": "tool",
                "tool_call_id": _required_str(item, "call_id", where),
                "content": text,
            }
        )
        if origins is not None:
            fields = {"content": f"{where}.output", "tool_call_id": f"{where}.call_id"}
            origins.append(Origin(where, fields))
    elif kind == "reasoning":
        return  # a reasoning model's summary from an earlier turn: not input for chat models
    else:
        raise _unsupported(
            f"{where}.type: {echo(kind)} items are not supported (messages, function_call and "
            "function_call_output are)",
            f"{where}.type",
        )


def _calls_pending(messages: list[dict[str, Any]]) -> bool:
    """Whether the last chat message is an assistant's calls that no output answers yet."""
    return bool(messages) and messages[-1]["role"] == "assistant" and "tool_calls" in messages[-1]


def _join_turn(turn: dict[str, Any], text: str) -> None:
    """An assistant message's text that came after its turn's calls (a model that streamed
    its call first, a client that sends them so) joins the calls' message: chat requires
    the tool messages to follow that message directly, and OpenAI, DeepSeek and others
    refuse a second assistant message between them with a 400. One chat message holds
    both, its text first, as the Messages translation makes one of a turn's blocks."""
    turn["content"] = (turn["content"] or "") + text or None


def _required_str(item: dict[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    # Arguments may be empty (a function without parameters); ids and names may not.
    if not isinstance(value, str) or (not value and key != "arguments"):
        raise bad_request(f"{where}.{key}: a string is required", param=f"{where}.{key}")
    return value


def _user_content(content: Any, where: str) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(
            f"{where}.content: a string or a list of parts is required", param=f"{where}.content"
        )
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        at = f"{where}.content[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text"):
            if not isinstance(part.get("text"), str):
                raise bad_request(f"{at}.text: a string is required", param=f"{at}.text")
            parts.append({"type": "text", "text": part["text"]})
        elif kind == "input_image":
            parts.append(_image(part, at))
        else:
            raise _unsupported(
                f"{at}.type: {echo(kind)} parts are not supported (input_text and input_image are)",
                f"{at}.type",
            )
    return parts


def _image(part: dict[str, Any], at: str) -> dict[str, Any]:
    url = part.get("image_url")
    if not isinstance(url, str):
        raise _unsupported(
            f"{at}: images by file_id are not supported; send image_url (a URL or a data: URL)",
            at,
        )
    image: dict[str, Any] = {"url": url}
    detail = part.get("detail")
    if detail is not None:
        if detail not in ("low", "high", "auto"):
            raise bad_request(
                f"{at}.detail: 'auto', 'low' or 'high' is required, not {echo(detail)}",
                param=f"{at}.detail",
            )
        image["detail"] = detail
    return {"type": "image_url", "image_url": image}


def _output_parts(content: Any, where: str, images: list[tuple[dict[str, Any], str]]) -> str:
    """A function output given as parts: its text, for the tool message; its images go to
    ``images`` (the user message after the outputs)."""
    if not isinstance(content, list):
        raise bad_request(f"{where}: a string or a list of parts is required", param=where)
    texts = []
    for j, part in enumerate(content):
        at = f"{where}[{j}]"
        if isinstance(part, dict) and part.get("type") == "input_image":
            images.append((_image(part, at), at))
        else:
            texts.append(_part_text(part, at, "input_text and input_image"))
    return "".join(texts)


def _parts_text(content: Any, where: str) -> str:
    if not isinstance(content, list):
        raise bad_request(f"{where}: a string or a list of parts is required", param=where)
    parts = enumerate(content)
    return "".join(_part_text(p, f"{where}[{j}]", "output_text and refusal") for j, p in parts)


def _part_text(part: Any, at: str, supported: str) -> str:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind not in ("input_text", "output_text", "refusal"):
        raise _unsupported(
            f"{at}.type: {echo(kind)} parts are not supported here ({supported} are)", f"{at}.type"
        )
    return str(part.get("text") or part.get("refusal") or "")


def _assistant_text(content: Any, where: str) -> str:
    return content if isinstance(content, str) else _parts_text(content, f"{where}.content")


def _tool_choice(choice: str | dict[str, Any], names: set[str]) -> str | dict[str, Any] | None:
    """The chat ``tool_choice`` (None: none to send), given the chat functions' names."""
    if isinstance(choice, str):
        if choice not in ("none", "auto", "required"):
            raise bad_request(
                "tool_choice: must be 'none', 'auto', 'required' or a function",
                param="tool_choice",
            )
        if names or choice != "required":
            # Chat APIs refuse tool_choice without tools; without any, 'auto' and 'none'
            # say the same as no tool_choice at all.
            return choice if names else None
        raise bad_request(
            "tool_choice: 'required' needs a function tool the model can call",
            param="tool_choice",
        )
    if choice.get("type") == "function" and isinstance(choice.get("name"), str):
        namespace = choice.get("namespace")
        name = chat_name(namespace if isinstance(namespace, str) else None, choice["name"])
        if name not in names:
            raise bad_request(
                "tool_choice.name: must name one of the request's function tools",
                param="tool_choice.name",
            )
        return {"type": "function", "function": {"name": name}}
    raise _unsupported(
        f"tool_choice: {echo(choice.get('type'))} is not supported (a function is)", "tool_choice"
    )


def _response_format(fmt: Any) -> dict[str, Any] | None:
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        if not isinstance(schema.get("schema"), dict):
            raise bad_request(
                "text.format.schema: a JSON schema object is required", param="text.format.schema"
            )
        return {"type": "json_schema", "json_schema": schema}
    raise bad_request(
        "text.format.type: must be 'text', 'json_object' or 'json_schema'",
        param="text.format.type",
    )
