"""Reading the gateway's additions to OpenAI SDK objects in tests, and what tests send."""

from __future__ import annotations

from typing import Any

from openai.types.chat import ChatCompletionFunctionToolParam
from pydantic import BaseModel

# A client's function tool, as the chat tests offer it (the replay upstream calls the first
# tool offered).
WEATHER_TOOL: ChatCompletionFunctionToolParam = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def extra(obj: BaseModel | None) -> dict[str, Any]:
    """The fields an OpenAI SDK object carries beyond OpenAI's schema (``model_extra``: the
    gateway's ``xrouter`` block, ``usage.cost``), asserting that the object is there (a
    response's ``usage`` is optional in the SDK's types)."""
    assert obj is not None
    assert obj.model_extra is not None  # the SDK's models allow extra fields
    return obj.model_extra
