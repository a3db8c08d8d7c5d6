"""The Anthropic Messages API request (``POST /v1/messages``) and its translation into the
chat completions request that the gateway routes.

Anthropic's SDKs and the tools built on them (Claude Code among them) speak this shape;
LiteLLM's proxy serves it for any model, and so does the gateway: everything a Messages
request says that a chat request can say too is translated — ``system``, text and image
blocks, ``tool_use`` and ``tool_result`` blocks, custom tools with their ``input_schema``,
``tool_choice``, ``max_tokens``, ``stop_sequences``, ``temperature``/``top_p``,
``metadata.user_id``, structured outputs (``output_config.format``, or the older beta's
``output_format``, as chat's ``response_format``) and the ``xrouter`` routing controls.
What has no chat equivalent is dropped and said so where it matters: ``top_k``,
``thinking`` and earlier turns' thinking blocks, ``output_config.effort``,
``cache_control`` marks (prompt caching is the provider's), and tools Anthropic runs
itself (web search, code execution, computer use), which are named in the answer's
``xrouter.ignored_tools``. Documents (PDF) are refused with a 400 naming the block.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field

from gateway.echo import echo
from gateway.errors import APIError, bad_request
from gateway.schemas import MAX_STOP_SEQUENCES
from gateway.translation import Origin, parse_body, retranslated_param, split_param

log = logging.getLogger(__name__)


class MessagesRequest(BaseModel):
    # Unknown fields are tolerated (Anthropic adds fields often) but not forwarded.
    # Known ones are checked strictly, as Anthropic checks them and as the chat endpoint does:
    # "stream": "yes" is a 400, not a stream.
    model_config = ConfigDict(extra="allow", strict=True)

    model: str = Field(min_length=1)
    max_tokens: int = Field(ge=1)
    messages: list[dict[str, Any]] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(default=None, ge=0, le=1)
    top_p: float | None = Field(default=None, ge=0, le=1)
    top_k: int | None = Field(default=None, ge=0)
    metadata: dict[str, Any] | None = None
    stream: bool = False
    # Structured outputs: ``format`` is translated, the rest (``effort``, the beta's
    # ``task_budget``) is not forwarded. ``output_format`` is the older beta's ``format``.
    output_config: dict[str, Any] | None = None
    output_format: dict[str, Any] | None = None
    # Validated again, with the chat request, by the chat service.
    xrouter: dict[str, Any] | None = None

    @property
    def ignored_tools(self) -> list[str]:
        """Tools Anthropic runs itself, which no model behind a chat API can call."""
        return [_tool_label(t) for t in self.tools or [] if not _is_custom(t)]


class CountTokensRequest(MessagesRequest):
    max_tokens: int = Field(default=1, ge=1)  # not part of a count_tokens request


def parse_request(data: Any, kind: type[MessagesRequest] = MessagesRequest) -> MessagesRequest:
    return parse_body(kind, data, openai_codes=False)  # Anthropic's errors have no codes


def _unsupported(message: str, param: str) -> APIError:
    return APIError(400, message, param=param, code="unsupported_parameter")


def _is_custom(tool: dict[str, Any]) -> bool:
    # Custom (client) tools have no type, or type "custom"; Anthropic's own are versioned
    # types such as "web_search_20250305".
    return tool.get("type") in (None, "custom")


def _tool_label(tool: dict[str, Any]) -> str:
    return str(tool.get("name") or tool.get("type") or "?")


def to_chat(req: MessagesRequest) -> dict[str, Any]:
    """The chat completions request that asks for what ``req`` asks for."""
    unknown = (req.model_extra or {}).keys()
    if unknown or req.top_k is not None:
        log.debug("messages: not forwarding %s", sorted([*unknown, "top_k"])[:10])
    messages = _chat_messages(req)
    if not any(m["role"] != "system" for m in messages):
        raise bad_request("messages: nothing to answer", param="messages")
    chat: dict[str, Any] = {
        "model": req.model,
        "messages": messages,
        "max_tokens": req.max_tokens,
        "stream": req.stream,
    }
    tools = [_chat_tool(t, f"tools[{i}]") for i, t in enumerate(req.tools or []) if _is_custom(t)]
    if tools:
        chat["tools"] = tools
    if req.tool_choice is not None:
        _tool_choice(chat, req.tool_choice, {t["function"]["name"] for t in tools})
    if req.stop_sequences:
        if len(req.stop_sequences) > MAX_STOP_SEQUENCES:
            # Anthropic's API takes more, but the chat APIs this request is routed to take
            # four (OpenAI's limit, which OpenAI-compatible servers copy): dropping the rest
            # would let an answer run past a stop the client set.
            raise bad_request(
                f"stop_sequences: at most {MAX_STOP_SEQUENCES} stop sequences (the limit of "
                "the chat APIs this gateway routes to)",
                param="stop_sequences",
            )
        chat["stop"] = req.stop_sequences
    response_format = _response_format(req)
    if response_format is not None:
        chat["response_format"] = response_format
    for field in ("temperature", "top_p", "xrouter"):
        value = getattr(req, field)
        if value is not None:
            chat[field] = value
    user = (req.metadata or {}).get("user_id")
    if user is not None and not isinstance(user, str):
        # Checked as Anthropic checks it: a number dropped here lost the request's per-user
        # spend attribution without a word.
        raise bad_request("metadata.user_id: a string is required", param="metadata.user_id")
    if user:
        chat["user"] = user
    return chat


def _response_format(req: MessagesRequest) -> dict[str, Any] | None:
    """The chat ``response_format`` of the structured output ``req`` asks for, if any."""
    config_format = (req.output_config or {}).get("format")
    if config_format is not None and req.output_format is not None:
        # Two schemas, one answer: Anthropic's SDK refuses the pair too.
        raise bad_request(
            "output_format: send output_config.format alone (output_format is its older name)",
            param="output_format",
        )
    if config_format is not None:
        return _json_schema_format(config_format, "output_config.format")
    if req.output_format is not None:
        return _json_schema_format(req.output_format, "output_format")
    return None


def _json_schema_format(fmt: Any, where: str) -> dict[str, Any]:
    if not isinstance(fmt, dict):
        raise bad_request(f"{where}: an object is required", param=where)
    kind = fmt.get("type")
    if kind != "json_schema":
        # Dropped, the answer would be free text where the client parses the format.
        raise _unsupported(
            f"{where}.type: {echo(kind)} formats are not supported (json_schema is)",
            f"{where}.type",
        )
    schema = fmt.get("schema")
    if not isinstance(schema, dict):
        raise bad_request(
            f"{where}.schema: a JSON schema object is required", param=f"{where}.schema"
        )
    # Strict where chat's strict mode can take the schema: Anthropic's structured outputs
    # constrain decoding to it, so the answer always matches (the SDK's parse relies on
    # that), and chat's strict mode asks a provider for the same guarantee. But OpenAI's
    # strict mode refuses (400, a 502 here) an object that leaves a property out of
    # ``required``, which Anthropic allows and its SDK writes for every field with a
    # default: such a schema goes as a hint, which vLLM's guided decoding enforces anyway.
    # The name is chat's requirement, which Anthropic's format has no field for.
    return {
        "type": "json_schema",
        "json_schema": {"name": "output", "schema": schema, "strict": _strict_ok(schema)},
    }


# Keywords whose values are data, not schemas (an example object is no object schema).
_NOT_SCHEMAS = frozenset({"required", "enum", "const", "default", "examples", "description"})


def _strict_ok(schema: Any) -> bool:
    """Whether OpenAI's strict mode takes ``schema``: every object it holds requires all
    its properties and allows no others."""
    if isinstance(schema, list):
        return all(_strict_ok(s) for s in schema)
    if not isinstance(schema, dict):
        return True
    properties = schema.get("properties")
    if isinstance(properties, dict) or schema.get("type") == "object":
        props = properties if isinstance(properties, dict) else {}
        required = schema.get("required")
        if schema.get("additionalProperties") is not False:
            return False
        if not isinstance(required, list) or set(props) - set(required):
            return False
    return all(_strict_ok(v) for k, v in schema.items() if k not in _NOT_SCHEMAS)


def _chat_messages(
    req: MessagesRequest, origins: list[Origin] | None = None
) -> list[dict[str, Any]]:
    """The chat messages ``req`` translates to; with ``origins``, where each came from in
    the request (appended to it, one per message), for an error about one to name it."""
    messages: list[dict[str, Any]] = []
    system = _system_text(req.system)
    if system:
        messages.append({"role": "system", "content": system})
        if origins is not None:
            origins.append(Origin("system", {"content": "system"}))
    for i, message in enumerate(req.messages):
        _add_message(messages, message, f"messages[{i}]", origins)
    return messages


# Chat request fields -> the Messages fields they were translated from.
_CLIENT_FIELDS = {
    "stop": "stop_sequences",
    "user": "metadata.user_id",
    "parallel_tool_calls": "tool_choice.disable_parallel_tool_use",
}
# A chat function's fields -> the custom tool's.
_TOOL_FIELDS = {".function.parameters": ".input_schema", ".function": ""}


def client_param(req: MessagesRequest, param: str) -> str:
    """The request's field that a chat-layer error naming ``param`` (a field of the
    translated chat request) is about: ``stop`` is ``stop_sequences``,
    ``tools[0].function.parameters`` the ``input_schema`` of the first custom tool,
    ``messages[2].content`` the content of the turn that became the third chat message
    (``messages[1].content`` after a system prompt, which became the first)."""
    head, index, rest = split_param(param)
    if head == "messages":
        # Translated again, noting where each message came from: the chat messages are not
        # the request's one for one (the system prompt, tool results split into tool
        # messages, turns of thinking only left out).
        return retranslated_param(lambda o: _chat_messages(req, o), param, "messages")
    if head == "tools" and index is not None:
        custom = [i for i, t in enumerate(req.tools or []) if _is_custom(t)]
        if index < len(custom):
            for chat_field, field in _TOOL_FIELDS.items():
                if rest.startswith(chat_field):
                    rest = field + rest[len(chat_field) :]
                    break
            return f"tools[{custom[index]}]{rest}"
    return _CLIENT_FIELDS.get(head, param)


def _system_text(system: str | list[dict[str, Any]] | None, where: str = "system") -> str:
    if system is None or isinstance(system, str):
        return system or ""
    texts = []
    for j, block in enumerate(system):
        if block.get("type") != "text" or not isinstance(block.get("text"), str):
            raise bad_request(f"{where}[{j}]: text blocks only", param=f"{where}[{j}]")
        texts.append(block["text"])
    return "\n\n".join(texts)


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list) or not all(isinstance(b, dict) for b in content):
        raise bad_request(
            f"{where}.content: a string or a list of content blocks is required",
            param=f"{where}.content",
        )
    return content


def _add_message(
    messages: list[dict[str, Any]],
    message: dict[str, Any],
    where: str,
    origins: list[Origin] | None,
) -> None:
    role = message.get("role")
    if role not in ("user", "assistant", "system"):
        raise bad_request(
            f"{where}.role: must be 'user', 'assistant' or 'system'", param=f"{where}.role"
        )
    if role == "system":
        # A system message mid-conversation (Anthropic's beta; Claude Code sends them):
        # a chat system message at the same place.
        given = message.get("content")
        text = (
            given
            if isinstance(given, str)
            else _system_text(_blocks(given, where), f"{where}.content")
        )
        messages.append({"role": "system", "content": text})
        if origins is not None:
            origins.append(Origin(where, {"content": f"{where}.content", "role": f"{where}.role"}))
        return
    blocks = _blocks(message.get("content"), where)
    if role == "assistant":
        turn = _assistant(blocks, where)
        # A turn of thinking blocks only (or of nothing) has nothing left for a chat model:
        # an assistant message with neither content nor tool calls is refused by chat
        # providers (a 400 that reached the client as a 502), so the turn is left out, as
        # its blocks are. (Last, it was a prefill of nothing.)
        if turn["content"] is not None or "tool_calls" in turn:
            messages.append(turn)
            if origins is not None:
                fields = {"content": f"{where}.content", "role": f"{where}.role"}
                calls = [f"{where}.content[{j}]" for j, b in enumerate(blocks) if _is_call(b)]
                origins.append(Origin(where, fields, calls=calls))
        return
    if not blocks:
        # As Anthropic refuses it (and the chat API an empty content list), rather than
        # leave the turn out and answer a conversation the client did not send.
        raise bad_request(
            f"{where}.content: a user turn needs at least one content block",
            param=f"{where}.content",
        )
    # A user turn: its tool results become chat tool messages (they answer the previous
    # assistant turn's calls, so they come first), the rest one user message. Each part
    # with where it was in the request.
    parts: list[tuple[dict[str, Any], str]] = []
    for j, block in enumerate(blocks):
        at = f"{where}.content[{j}]"
        kind = block.get("type")
        if kind == "tool_result":
            messages.append(_tool_message(block, at, parts))
            if origins is not None:
                fields = {"content": f"{at}.content", "tool_call_id": f"{at}.tool_use_id"}
                origins.append(Origin(at, fields))
        elif kind in ("text", "image"):
            if kind == "text" and block.get("text") == "":
                # Anthropic refuses empty text ("text content blocks must be non-empty"),
                # which a chat model would answer as if the user had said nothing.
                param = f"{where}.content" if isinstance(message.get("content"), str) else at
                raise bad_request(f"{param}: text must be non-empty", param=param)
            parts.append((_part(block, at), at))
        else:
            raise _unsupported(
                f"{at}.type: {echo(kind)} blocks are not supported in user turns (text, image and "
                "tool_result are)",
                f"{at}.type",
            )
    if parts:
        content: Any = [part for part, _ in parts]
        if all(p["type"] == "text" for p in content):
            content = "".join(p["text"] for p in content)
        messages.append({"role": "user", "content": content})
        if origins is not None:
            fields = {"content": f"{where}.content", "role": f"{where}.role"}
            at_parts = [at for _, at in parts] if isinstance(content, list) else []
            origins.append(Origin(where, fields, at_parts))


def _part(block: dict[str, Any], at: str) -> dict[str, Any]:
    kind = block.get("type")
    if kind == "text":
        if not isinstance(block.get("text"), str):
            raise bad_request(f"{at}.text: a string is required", param=f"{at}.text")
        return {"type": "text", "text": block["text"]}
    if kind != "image":
        # A tool result's blocks come here unchecked (a user turn's are checked first):
        # a document must not go upstream as an image.
        raise _unsupported(
            f"{at}.type: {echo(kind)} blocks are not supported here (text and image are)",
            f"{at}.type",
        )
    found = block.get("source")
    source: dict[str, Any] = found if isinstance(found, dict) else {}
    if source.get("type") == "base64" and isinstance(source.get("data"), str):
        url = f"data:{source.get('media_type', 'image/png')};base64,{source['data']}"
    elif source.get("type") == "url" and isinstance(source.get("url"), str):
        url = source["url"]
    else:
        raise _unsupported(
            f"{at}.source: images as base64 data or a URL are supported", f"{at}.source"
        )
    return {"type": "image_url", "image_url": {"url": url}}


def _tool_message(
    block: dict[str, Any], at: str, parts: list[tuple[dict[str, Any], str]]
) -> dict[str, Any]:
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str) or not call_id:
        raise bad_request(f"{at}.tool_use_id: a string is required", param=f"{at}.tool_use_id")
    texts = []
    for k, inner in enumerate(_blocks(block.get("content", ""), at)):
        part = _part(inner, f"{at}.content[{k}]")
        if part["type"] == "text":
            texts.append(part["text"])
        else:
            # A chat tool message holds text only: the result's images go to the user
            # message that follows it.
            parts.append((part, f"{at}.content[{k}]"))
    text = "".join(texts)
    if block.get("is_error"):
        text = f"[tool error] {text}"
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def _is_call(block: dict[str, Any]) -> bool:
    return block.get("type") == "tool_use"


def _assistant(blocks: list[dict[str, Any]], where: str) -> dict[str, Any]:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        at = f"{where}.content[{j}]"
        kind = block.get("type")
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool_use":
            if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
                raise bad_request(f"{at}: tool_use needs an id and a name", param=at)
            if block.get("input") is not None and not isinstance(block["input"], dict):
                # A tool's input is an object (Anthropic's check); a string would be sent on
                # as arguments that are a JSON string, which no tool schema describes.
                raise bad_request(f"{at}.input: an object is required", param=f"{at}.input")
            calls.append(
                {
                    "id": block["id"],
                    "type": "function",
                    "function": {
                        "name": block["name"],
                        "arguments": orjson.dumps(block.get("input") or {}).decode(),
                    },
                }
            )
        elif kind in ("thinking", "redacted_thinking"):
            continue  # an earlier turn's reasoning: not input for chat models
        else:
            raise _unsupported(
                f"{at}.type: {echo(kind)} blocks are not supported in assistant turns (text, "
                "tool_use and thinking are)",
                f"{at}.type",
            )
    out: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
    if calls:
        out["tool_calls"] = calls
    return out


def _chat_tool(tool: dict[str, Any], where: str) -> dict[str, Any]:
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise bad_request(f"{where}.name: a string is required", param=f"{where}.name")
    schema = tool.get("input_schema")
    if not isinstance(schema, dict):
        raise bad_request(
            f"{where}.input_schema: a JSON schema object is required",
            param=f"{where}.input_schema",
        )
    if schema.get("type") != "object":
        # As Anthropic requires: a tool's input is an object. A schema of another type had
        # models answer with a string, which no tool_use block's ``input`` can hold.
        raise bad_request(
            f"{where}.input_schema.type: must be 'object'", param=f"{where}.input_schema.type"
        )
    fn: dict[str, Any] = {"name": name, "parameters": schema}
    description = tool.get("description")
    if description is not None:
        if not isinstance(description, str):
            raise bad_request(
                f"{where}.description: a string is required", param=f"{where}.description"
            )
        fn["description"] = description
    return {"type": "function", "function": fn}


def _tool_choice(chat: dict[str, Any], choice: dict[str, Any], names: set[str]) -> None:
    kind = choice.get("type")
    if not names and kind in ("auto", "none"):
        return  # nothing a chat model could call either way
    if not names:
        raise bad_request(
            f"tool_choice: {echo(kind)} needs a tool the model can call (custom tools)",
            param="tool_choice",
        )
    if kind == "auto":
        chat["tool_choice"] = "auto"
    elif kind == "any":
        chat["tool_choice"] = "required"
    elif kind == "none":
        chat["tool_choice"] = "none"
    elif kind == "tool":
        name = choice.get("name")
        if not isinstance(name, str) or name not in names:
            raise bad_request(
                "tool_choice.name: must name one of the request's tools",
                param="tool_choice.name",
            )
        chat["tool_choice"] = {"type": "function", "function": {"name": name}}
    else:
        raise bad_request(
            "tool_choice.type: must be 'auto', 'any', 'tool' or 'none'", param="tool_choice.type"
        )
    disable_parallel = choice.get("disable_parallel_tool_use")
    if disable_parallel is not None and not isinstance(disable_parallel, bool):
        raise bad_request(
            "tool_choice.disable_parallel_tool_use: a boolean is required",
            param="tool_choice.disable_parallel_tool_use",
        )
    if disable_parallel and kind != "none":
        chat["parallel_tool_calls"] = False
