"""What the replay upstream answers: the recorded response, or deterministic synthesis.

Everything here is a pure function of the request and the table, so the same request always
gets the same answer (tests and benchmarks rely on it), and different models answer an unknown
prompt differently (so a router's choice is visible in the output).

Token counts: a recorded response reports the counts recorded with it. Content synthesized
here (fallback answers, tool calls, tool-result answers, JSON wrapping) has no real count, so
it reports ``estimate_tokens`` (ceil(chars / 4)) — an estimate only for synthesized content.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.replay.schema import ChatRequest
from gateway.replay.table import ReplayTable
from pricing import estimate_tokens
from router.outcomes import content_text

_MAX_SCHEMA_DEPTH = 8


class ReplayRequestError(ValueError):
    """The request is valid JSON but cannot be answered (-> 400)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True, slots=True)
class Completion:
    """One choice's worth of answer; the server copies it ``n`` times."""

    content: str | None
    tool_calls: list[dict[str, Any]] | None
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int  # per choice


def _digest(*parts: str, size: int = 12) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode("utf-8", "surrogatepass"))
        h.update(b"\0")
    return h.hexdigest()[:size]


def fallback_text(model: str, prompt: str) -> str:
    """The answer for a prompt the table does not have (a function of model and prompt)."""
    return (
        f"[replay:{model}] No recorded answer for this prompt. "
        f"Deterministic reply {_digest(model, ' '.join(prompt.split()))}."
    )


def _prompt_chars(messages: Sequence[dict[str, Any]]) -> int:
    return sum(len(content_text(m.get("content"))) for m in messages)


# -- JSON-schema instances (tool arguments, structured output) --------------------------------
class _SchemaFiller:
    """Builds a value satisfying a JSON schema's required properties and types. The first
    string leaf gets ``text`` (the prompt for tool arguments, the answer for structured
    output), so chained calls stay meaningful; other strings get their property name."""

    def __init__(self, root: dict[str, Any], text: str) -> None:
        self._defs = {**root.get("definitions", {}), **root.get("$defs", {})}
        self._text: str | None = text

    def value(self, schema: Any, name: str = "value", depth: int = 0) -> Any:
        if not isinstance(schema, dict) or depth > _MAX_SCHEMA_DEPTH:
            return None
        ref = schema.get("$ref")
        if isinstance(ref, str):
            return self.value(self._defs.get(ref.rsplit("/", 1)[-1], {}), name, depth + 1)
        if "const" in schema:
            return schema["const"]
        if schema.get("enum"):
            return schema["enum"][0]
        if "default" in schema:
            return schema["default"]
        for key in ("anyOf", "oneOf", "allOf"):
            options = schema.get(key)
            if options:
                non_null = [
                    o for o in options if not (isinstance(o, dict) and o.get("type") == "null")
                ]
                return self.value((non_null or options)[0], name, depth + 1)
        kind = schema.get("type")
        if isinstance(kind, list):
            kind = next((k for k in kind if k != "null"), "null")
        if kind is None:
            kind = "object" if "properties" in schema else "string"
        return self._typed(kind, schema, name, depth)

    def _typed(self, kind: str, schema: dict[str, Any], name: str, depth: int) -> Any:
        if kind == "object":
            props = schema.get("properties") or {}
            return {
                key: self.value(props.get(key, {}), key, depth + 1)
                for key in schema.get("required", [])
            }
        if kind == "array":
            count = max(int(schema.get("minItems", 1)), 0)
            count = min(count, int(schema.get("maxItems", count)))
            return [self.value(schema.get("items", {}), name, depth + 1) for _ in range(count)]
        if kind in ("integer", "number"):
            return _number(schema, integer=kind == "integer")
        if kind == "boolean":
            return True
        if kind == "null":
            return None
        return self._string(schema, name)

    def _string(self, schema: dict[str, Any], name: str) -> str:
        fmt = schema.get("format")
        if fmt in _FORMAT_EXAMPLES:
            return _FORMAT_EXAMPLES[fmt]
        if self._text:
            value, self._text = self._text, None
        else:
            value = name
        min_len = int(schema.get("minLength", 0))
        if len(value) < min_len:
            value = value.ljust(min_len, "x")
        if "maxLength" in schema:
            value = value[: int(schema["maxLength"])]
        return value


_FORMAT_EXAMPLES = {
    "date-time": "2024-01-01T00:00:00Z",
    "date": "2024-01-01",
    "time": "00:00:00Z",
    "email": "replay@example.com",
    "uri": "https://example.com/replay",
    "uuid": "00000000-0000-4000-8000-000000000000",
}


def _number(schema: dict[str, Any], *, integer: bool) -> float | int:
    low = schema.get("minimum")
    if low is None and "exclusiveMinimum" in schema:
        low = schema["exclusiveMinimum"] + (1 if integer else 0.5)
    high = schema.get("maximum", schema.get("exclusiveMaximum"))
    value = low if low is not None else (min(0, high - 1) if high is not None else 0)
    return math.ceil(value) if integer else value


def schema_instance(schema: dict[str, Any], text: str) -> Any:
    return _SchemaFiller(schema, text).value(schema)


# -- the answer ----------------------------------------------------------------------------------
def _pick_tool(req: ChatRequest) -> dict[str, Any] | None:
    """The tool to call, or None when this request should be answered with text."""
    if not req.tools or req.tool_choice == "none" or req.messages[-1].get("role") == "tool":
        return None
    functions = [t.get("function") or {} for t in req.tools if isinstance(t, dict)]
    if isinstance(req.tool_choice, dict):
        wanted = (req.tool_choice.get("function") or {}).get("name")
        for fn in functions:
            if fn.get("name") == wanted:
                return fn
        raise ReplayRequestError(f"tool_choice names unknown function {wanted!r}", "tool_choice")
    return functions[0] if functions else None


def _tool_result_text(messages: Sequence[dict[str, Any]]) -> str:
    """Answer to a conversation ending in tool results: quote them, so the round trip shows."""
    results: list[str] = []
    for m in reversed(messages):
        if m.get("role") != "tool":
            break
        results.append(content_text(m.get("content")))
    return "Tool result received: " + " | ".join(reversed(results))


def _format(text: str, response_format: dict[str, Any] | None) -> tuple[str, bool]:
    """Apply response_format; returns (content, changed)."""
    kind = (response_format or {}).get("type")
    if kind == "json_object":
        return orjson.dumps({"answer": text}).decode(), True
    if kind == "json_schema" and response_format is not None:
        spec = response_format.get("json_schema") or {}
        schema = spec.get("schema") or {"type": "object", "properties": {}}
        return orjson.dumps(schema_instance(schema, text)).decode(), True
    return text, False


def synthesize(table: ReplayTable, req: ChatRequest, prompt: str) -> Completion:
    """The answer of ``req.model`` to ``req``; ``prompt`` is the last user message's text
    (with any fault marker already removed)."""
    model = req.model
    recorded = table.lookup(prompt, model)
    prompt_tokens = (
        recorded.prompt_tokens if recorded else math.ceil(_prompt_chars(req.messages) / 4)
    )
    tool = _pick_tool(req)
    if tool is not None:
        name = str(tool.get("name", "tool"))
        params = tool.get("parameters") or {"type": "object", "properties": {}}
        arguments = orjson.dumps(schema_instance(params, prompt)).decode()
        call = {
            "id": f"call_{_digest(model, prompt, name, size=24)}",
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }
        tokens = estimate_tokens(name + arguments)
        return Completion(None, [call], "tool_calls", prompt_tokens, tokens)

    if req.messages[-1].get("role") == "tool":
        text, completion_tokens = _tool_result_text(req.messages), None
    elif recorded is not None:
        text, completion_tokens = recorded.response, recorded.completion_tokens
    else:
        text, completion_tokens = fallback_text(model, prompt), None
    text, changed = _format(text, req.response_format)
    if changed or completion_tokens is None:
        completion_tokens = estimate_tokens(text)

    finish = "stop"
    limit = req.token_limit
    if limit is not None and completion_tokens > limit:
        # Cut proportionally: the recorded counts come from the model's own tokenizer, which
        # we do not have, so characters stand in for tokens at the recorded ratio.
        text = text[: len(text) * limit // completion_tokens]
        completion_tokens, finish = limit, "length"
    return Completion(text, None, finish, prompt_tokens, completion_tokens)
