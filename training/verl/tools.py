"""verl tools for the router's rollouts: each downstream model replayed from its recorded
outcome, and ``select_response``.

verl's ``ToolAgentLoop`` runs the router model turn by turn on the GPU, parses its
Hermes-style tool calls and calls these tools; they answer with the outcome the table
recorded for this prompt (handed over per row in ``tools_kwargs`` by
``training.verl.data``), formatted as the gateway formats a live call's answer
(``router.tools.tool_result_text``), so the router trains on the text it will be served.
Every call and the selection are written to the trajectory's ``extra_fields``, which verl
passes to the reward function (``training.verl.reward``) as ``extra_info``.

Arguments are checked as the gateway's ``llm`` policy checks them: a call without a
``system_prompt`` string, or a selection of an id that is not a successful call, gets the
same error and costs nothing.
"""

from __future__ import annotations

from typing import Any

import orjson
from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

from router.answers import normalize_answer
from router.tools import tool_result_text

CALLS = "xrouter_calls"  # extra_fields key: the calls made, in order
SELECTED = "xrouter_selected"  # extra_fields key: the id select_response chose


def _error(kind: str, message: str) -> ToolResponse:
    return ToolResponse(text=orjson.dumps({"error": kind, "message": message}).decode())


def _fields(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The trajectory's extra_fields (verl passes its AgentData to execute)."""
    agent_data = kwargs.get("agent_data")
    fields = getattr(agent_data, "extra_fields", None)
    if not isinstance(fields, dict):
        raise RuntimeError("xrouter's verl tools run inside verl's ToolAgentLoop (agent_data)")
    return fields


class RecordedModelTool(BaseTool):
    """``call_<model>``: the model's recorded answer to this prompt, at its recorded cost."""

    def __init__(self, config: dict[str, Any], tool_schema: OpenAIFunctionToolSchema) -> None:
        super().__init__(config, tool_schema)
        self._outcomes: dict[str, dict[str, Any]] = {}

    async def create(
        self, instance_id: str | None = None, **kwargs: Any
    ) -> tuple[str, ToolResponse]:
        instance_id, response = await super().create(instance_id)
        self._outcomes[instance_id] = dict(kwargs.get("create_kwargs") or {})
        return instance_id, response

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict[str, Any]]:
        fields = _fields(kwargs)
        outcome = self._outcomes.get(instance_id) or {}
        if "model" not in outcome:
            return _error("no_outcome", f"{self.name} has no answer for this prompt"), 0.0, {}
        if not isinstance(parameters.get("system_prompt"), str):
            msg = f"{self.name} needs system_prompt (a string)"
            return _error("missing_argument", msg), 0.0, {}
        calls: list[dict[str, Any]] = fields.setdefault(CALLS, [])
        call_id = f"call_{len(calls) + 1}"
        response = str(outcome.get("response") or "")
        calls.append(
            {
                "id": call_id,
                "model": str(outcome["model"]),
                "score": float(outcome.get("score") or 0.0),
                "cost_usd": float(outcome.get("cost_usd") or 0.0),
                # What the reward function matches a rewritten final answer against.
                "answer_key": normalize_answer(response),
            }
        )
        metrics = {"model": outcome["model"], "cost_usd": calls[-1]["cost_usd"]}
        return (
            ToolResponse(text=tool_result_text(call_id, outcome["model"], response)),
            0.0,
            metrics,
        )

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        self._outcomes.pop(instance_id, None)


class SelectResponseTool(BaseTool):
    """``select_response``: return an earlier call's answer verbatim, by its id."""

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict[str, Any]]:
        fields = _fields(kwargs)
        target = parameters.get("tool_call_id")
        if not isinstance(target, str):
            return _error("missing_argument", "select_response needs tool_call_id"), 0.0, {}
        if not any(c["id"] == target for c in fields.get(CALLS, [])):
            return _error("not_selectable", f"{target!r} is not a successful call"), 0.0, {}
        fields[SELECTED] = target
        text = f"Selected {target}: its answer goes to the user verbatim. End your turn."
        return ToolResponse(text=text), 0.0, {}
