"""Tool schemas the router model sees, generated from the pool: one ``call_<model>`` per
downstream model (its description carries price and capability text) and
``select_response`` (by tool_call_id, so a selection is never ambiguous)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from router.pool import ModelPool, PoolModel

SELECT_TOOL = "select_response"
_PREFIX = "call_"
_SAFE = re.compile(r"[^A-Za-z0-9_-]")

# Server-side caps on what the router may ask of a downstream model.
MAX_TEMPERATURE = 1.5


def tool_name(model: str) -> str:
    # Tool names allow [A-Za-z0-9_-]{1,64}: dots and colons in model names become '_'.
    return (_PREFIX + _SAFE.sub("_", model))[:64]


def check_tool_names(models: Iterable[str]) -> None:
    """Raise ``ValueError`` naming the models whose tools would have one name (``a.b`` and
    ``a_b``; two long names alike in their first 59 characters): the router would be
    offered two tools of one name and could call only one of the models."""
    seen: dict[str, str] = {}
    clashes = []
    for model in models:
        name = tool_name(model)
        if name in seen:
            clashes.append(f"{seen[name]!r} and {model!r} are both {name!r}")
        else:
            seen[name] = model
    if clashes:
        raise ValueError(
            f"models whose router tools would have one name ({'; '.join(clashes)}): tool "
            "names keep only [A-Za-z0-9_-] (others become '_') and 64 characters; rename one"
        )


def tool_map(pool: ModelPool) -> dict[str, str]:
    """tool name -> pool model name."""
    return {tool_name(m.name): m.name for m in pool}


def _describe(m: PoolModel) -> str:
    price = f"${m.price.input}/1M input tokens, ${m.price.output}/1M output tokens"
    text = m.description.strip() or "General-purpose chat model."
    return f"Ask {m.name} to answer the user's conversation. Price: {price}. {text}"


def call_tool_schema(m: PoolModel) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": tool_name(m.name),
            "description": _describe(m),
            "parameters": {
                "type": "object",
                "properties": {
                    "system_prompt": {
                        "type": "string",
                        "description": "Instructions for this model. The user's conversation is sent "
                        "to it in full: do not repeat the user's query here.",
                    },
                    "temperature": {"type": "number", "minimum": 0, "maximum": MAX_TEMPERATURE},
                    "max_tokens": {"type": "integer", "minimum": 1, "maximum": m.max_output_tokens},
                },
                "required": ["system_prompt"],
            },
        },
    }


def select_tool_schema() -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": SELECT_TOOL,
            "description": "Return one earlier model answer to the user verbatim, by the id of the "
            "tool call that produced it. Use this instead of rewriting a good answer.",
            "parameters": {
                "type": "object",
                "properties": {"tool_call_id": {"type": "string"}},
                "required": ["tool_call_id"],
            },
        },
    }


def tool_result_text(call_id: str, model: str, answer: str) -> str:
    """The content of the tool message that reports a model's answer to the router.

    The call's id is written into the text because Hermes-style chat templates (Qwen, the
    xRouter paper's base family) render tool results without their ``tool_call_id``: a
    router model served that way could otherwise never name the call ``select_response``
    wants. The ``llm`` policy formats results here when it serves and when verl trains it
    (``training.verl.agent_loop`` runs the same policy), so the router sees one text."""
    return f"[tool_call_id: {call_id} | model: {model}]\n{answer or '(empty answer)'}"


def router_tools(pool: ModelPool) -> list[dict[str, Any]]:
    return [*(call_tool_schema(m) for m in pool), select_tool_schema()]
