"""The OpenAI Agents SDK, a real client of the Responses API (and of chat completions), runs
a tool-using agent through the gateway: the model asks for the tool, the SDK runs it and
sends the result back, and the model answers — routed by the gateway, streamed or not, every
turn in the ledger."""

from __future__ import annotations

import pytest
from agents import (
    Agent,
    MessageOutputItem,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    ToolCallItem,
    ToolCallOutputItem,
    function_tool,
    set_tracing_disabled,
)
from agents.result import RunResultBase
from openai import AsyncOpenAI

from tests.gateway.conftest import ledger_rows
from tests.support.gateway import Gateway

MODEL = "mistral-small-24b-instruct-2501-bf16"


@function_tool
def get_weather(city: str) -> str:
    """Current weather in a city."""
    return f"sunny, 21C in {city}"


def agent(gateway: Gateway, model: str, api: str = "responses") -> Agent:
    set_tracing_disabled(True)  # the SDK would otherwise export traces to OpenAI
    client = AsyncOpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0)
    return Agent(
        name="weather",
        instructions="Use the tools when they help.",
        tools=[get_weather],
        model=(
            OpenAIResponsesModel(model=model, openai_client=client)
            if api == "responses"
            else OpenAIChatCompletionsModel(model=model, openai_client=client)
        ),
    )


def check_run(gateway: Gateway, result: RunResultBase) -> None:
    kinds = [type(item) for item in result.new_items]
    assert kinds == [ToolCallItem, ToolCallOutputItem, MessageOutputItem]
    # The second turn's answer quotes the tool's output, so the round trip happened.
    assert "sunny, 21C" in str(result.final_output)
    responses = [r.response_id for r in result.raw_responses]
    assert len(responses) == 2 and all(rid and rid.startswith("resp_") for rid in responses)
    for rid in responses:
        assert rid is not None
        (status, _, total), _ = ledger_rows(gateway, rid.removeprefix("resp_"))
        assert status == 200 and total > 0


@pytest.mark.parametrize("model", [MODEL, "xrouter"])
async def test_an_agent_calls_its_tool_through_the_gateway(gateway: Gateway, model: str) -> None:
    result = await Runner.run(agent(gateway, model), "Weather in Paris?")
    check_run(gateway, result)


async def test_a_streamed_agent_run(gateway: Gateway) -> None:
    run = Runner.run_streamed(agent(gateway, MODEL), "Weather in Paris?")
    kinds = {event.type async for event in run.stream_events()}
    assert "raw_response_event" in kinds and "run_item_stream_event" in kinds
    check_run(gateway, run)


@pytest.mark.parametrize("stream", [False, True])
async def test_an_agent_on_chat_completions(gateway: Gateway, stream: bool) -> None:
    """The same agent on the SDK's chat-completions model: tool calls through chat."""
    a = agent(gateway, "xrouter", api="chat")
    if stream:
        run = Runner.run_streamed(a, "Weather in Paris?")
        async for _ in run.stream_events():
            pass
        result: RunResultBase = run
    else:
        result = await Runner.run(a, "Weather in Paris?")
    kinds = [type(item) for item in result.new_items]
    assert kinds == [ToolCallItem, ToolCallOutputItem, MessageOutputItem]
    assert "sunny, 21C" in str(result.final_output)
