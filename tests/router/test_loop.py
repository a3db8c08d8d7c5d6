"""The orchestration loop driven by a scripted router model (tool calls as vLLM's parser
emits them) against real downstream models (the replay upstream). In every case the cost
of the result is exactly the sum of its calls, each priced from its real usage."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Any

import pytest

from gateway.hooks import Bookkeeping, KeyBudgetGuard
from gateway.limits import KeyLimits, MemoryLimitStore
from pricing import ModelPrice, TokenUsage, load_default_catalog
from router.estimate import estimate_prompt_tokens
from router.executors import ProviderExecutor, downstream_request
from router.loop import Orchestrator, worst_case_micros
from router.policies.baselines import FixedPolicy
from router.policies.llm import (
    DEFAULT_SYSTEM_PROMPT,
    LLMRouterPolicy,
    cost_weight_line,
    router_system_prompt,
)
from router.policy import (
    Call,
    Decision,
    LoopState,
    Policy,
    RouteContext,
    Select,
    Step,
    ToolCall,
)
from router.pool import ModelPool, PoolModelConfig
from router.providers.client import DownstreamClient
from router.providers.usage import estimate_usage, prompt_tokens_estimate
from router.route_result import NoAnswer, RequestTimeout, RouteResult
from router.tools import tool_name
from tests.conftest import ScriptedRouter
from tests.router.conftest import Downstream

CHEAP, MID, DEAR = "llama-3.2-3b-instruct", "gemma-2-9b-it", "llama-3.3-70b-instruct"
ROUTER_PRICE = ModelPrice(input=Decimal("0.5"), output=Decimal("1.5"))
USER = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is the boiling point of water at sea level in Celsius?"},
]


def pool(base: str, *, fallbacks: dict[str, list[str]] | None = None) -> ModelPool:
    cfgs = [
        PoolModelConfig(
            name=m,
            model=f"openai/{m}",
            api_base=base,
            timeout_s=5,
            max_retries=0,
            fallbacks=(fallbacks or {}).get(m, []),
        )
        for m in (CHEAP, MID, DEAR)
    ]
    return ModelPool.from_configs(cfgs, load_default_catalog())


@pytest.fixture
async def setup(downstream: Downstream, scripted_router: ScriptedRouter) -> AsyncIterator[Any]:
    downstream.control.delete("/_replay/faults")
    p = pool(downstream.base_url, fallbacks={MID: [DEAR]})
    client = DownstreamClient(p)
    router_model = p[CHEAP].__class__(
        name="router",
        provider="openai",
        upstream_model="router",
        api_base=scripted_router.base_url,
        api_key=None,
        transport="native",
        price=ROUTER_PRICE,
        max_output_tokens=1024,
        timeout_s=5,
        max_concurrency=16,
        max_retries=0,
        fallbacks=(),
        description="",
    )
    copies: list[int] = []
    policy = LLMRouterPolicy(
        client.provider("native"), router_model, on_query_copy=lambda: copies.append(1)
    )
    yield p, Orchestrator(ProviderExecutor(client)), policy, copies
    await client.aclose()


def ctx(p: ModelPool, **kw: Any) -> RouteContext:
    return RouteContext(request_id="r1", messages=USER, pool=p, cost_weight=0.5, **kw)


def call(model: str, tc_id: str, **args: Any) -> dict[str, Any]:
    return {
        "id": tc_id,
        "name": tool_name(model),
        "arguments": {"system_prompt": "Answer briefly.", **args},
    }


def select(tc_id: str) -> dict[str, Any]:
    return {"id": f"sel-{tc_id}", "name": "select_response", "arguments": {"tool_call_id": tc_id}}


def assert_costs_add_up(p: ModelPool, result: RouteResult) -> None:
    for o in result.state.router_calls:
        assert o.cost_micros == ROUTER_PRICE.cost_micros(o.usage)
    for o in result.outcomes:
        if o.ok:
            assert (
                o.cost_micros == p[o.model].price.cost_micros(o.usage) and o.usage.total_tokens > 0
            )
        else:
            assert o.cost_micros == 0
    assert result.cost_micros == sum(
        o.cost_micros for o in (*result.state.router_calls, *result.outcomes)
    )
    assert result.router_cost_micros == sum(o.cost_micros for o in result.state.router_calls)


async def test_worst_case_bounds_output_by_the_requests_limit(setup: Any) -> None:
    p, *_ = setup
    price, cap = p[DEAR].price, p[DEAR].max_output_tokens
    prompt = estimate_prompt_tokens(USER, None)

    def worst(router_cap: int | None = None, **params: Any) -> int:
        return worst_case_micros(
            RouteContext(
                request_id="r", messages=USER, pool=p, cost_weight=0, request_params=params
            ),
            ToolCall(id="c", model=DEAR, max_tokens=router_cap),
        )

    assert worst() == price.worst_case_micros(prompt, cap)
    assert worst(max_tokens=50) == price.worst_case_micros(prompt, 50)
    assert worst(max_completion_tokens=70) == price.worst_case_micros(prompt, 70)
    assert worst(max_tokens=10**9) == price.worst_case_micros(prompt, cap)
    assert worst(max_tokens=50, n=3) == price.worst_case_micros(prompt, 150)
    # Both limits set: servers honour max_completion_tokens, so the hold covers the larger.
    assert worst(max_tokens=1, max_completion_tokens=400) == price.worst_case_micros(prompt, 400)
    assert worst(max_tokens=400, max_completion_tokens=1) == price.worst_case_micros(prompt, 400)
    # A router's cap and the client's: the call is sent with the smaller, so held for it.
    assert worst(100_000, max_tokens=10) == price.worst_case_micros(prompt, 10)
    assert worst(20, max_tokens=400) == price.worst_case_micros(prompt, 20)
    assert worst(10**9) == price.worst_case_micros(prompt, cap)


async def test_worst_case_counts_the_tool_schemas_offered(setup: Any) -> None:
    p, *_ = setup
    tools = [
        {"type": "function", "function": {"name": f"tool_{i}", "parameters": {"x": "y" * 3000}}}
        for i in range(10)
    ]
    call = ToolCall(id="c", model=DEAR, max_tokens=10)
    bare = RouteContext(request_id="r", messages=USER, pool=p, cost_weight=0)
    tooled = RouteContext(request_id="r", messages=USER, pool=p, cost_weight=0, tools=tools)
    prompt = estimate_prompt_tokens(USER, None, tools)
    assert prompt > estimate_prompt_tokens(USER, None) + 10_000  # ~30 KB of schemas
    assert worst_case_micros(tooled, call) == p[DEAR].price.worst_case_micros(prompt, 10)
    assert worst_case_micros(tooled, call) > worst_case_micros(bare, call)


async def test_direct_answer(setup: Any, scripted_router: ScriptedRouter) -> None:
    p, orch, policy, _ = setup
    scripted_router.script({"content": "100 °C."})
    r = await orch.run(policy, ctx(p))
    assert r.message == {"role": "assistant", "content": "100 °C."} and r.final_model is None
    assert r.outcomes == [] and len(r.state.router_calls) == 1
    assert r.cost_micros == ROUTER_PRICE.cost_micros(TokenUsage(100, 20)) == 80
    assert_costs_add_up(p, r)
    sent = scripted_router.requests()[0]
    # Capped where the turn's budget hold assumed it would be.
    assert sent["max_tokens"] == policy.router_model.max_output_tokens == 1024
    assert {t["function"]["name"] for t in sent["tools"]} == {
        tool_name(CHEAP),
        tool_name(MID),
        tool_name(DEAR),
        "select_response",
    }
    assert (
        "$0.88/1M input tokens"
        in next(t for t in sent["tools"] if t["function"]["name"] == tool_name(DEAR))["function"][
            "description"
        ]
    )


async def test_router_server_without_usage_is_charged_an_estimate(
    setup: Any, scripted_router: ScriptedRouter
) -> None:
    p, orch, policy, _ = setup
    scripted_router.script({"content": "100 °C."}, usage=False)
    r = await orch.run(policy, ctx(p))
    [router_call] = r.state.router_calls
    sent = scripted_router.requests()[0]
    assert router_call.usage == estimate_usage(sent, {"choices": [{"message": r.message}]})
    assert router_call.usage.prompt_tokens > 0 and router_call.cost_micros > 0
    assert_costs_add_up(p, r)


async def test_cost_weight_reaches_a_lambda_conditioned_router(
    setup: Any, scripted_router: ScriptedRouter
) -> None:
    p, orch, policy, _ = setup
    conditioned = LLMRouterPolicy(policy.provider, policy.router_model, cost_weight_in_prompt=True)
    scripted_router.script({"content": "100 °C."}, {"content": "100 °C."})
    await orch.run(policy, ctx(p))
    await orch.run(conditioned, ctx(p))
    plain, weighted = (r["messages"][0]["content"] for r in scripted_router.requests())
    assert plain == DEFAULT_SYSTEM_PROMPT
    assert weighted == router_system_prompt(0.5) == f"{plain}\n\n{cost_weight_line(0.5)}"
    assert "lambda = 0.5" in weighted


def test_a_negative_zero_cost_weight_reads_as_zero() -> None:
    # `"cost_weight": -0.0` passes the request schema (it is >= 0); a router trained on verl
    # saw "lambda = 0" for no cost pressure, never "lambda = -0".
    assert cost_weight_line(-0.0) == cost_weight_line(0.0)
    assert "lambda = 0." in cost_weight_line(-0.0)


async def test_single_call_then_select(setup: Any, scripted_router: ScriptedRouter) -> None:
    p, orch, policy, _ = setup
    scripted_router.script({"tool_calls": [call(CHEAP, "t1")]}, {"tool_calls": [select("t1")]})
    r = await orch.run(policy, ctx(p))
    assert r.final_model == CHEAP and r.message and r.message["content"]
    assert len(r.state.router_calls) == 2 and [o.model for o in r.outcomes] == [CHEAP]
    # The router saw the downstream answer as the tool result of its call, with the call's
    # id in the text (Hermes chat templates drop tool_call_id).
    second = scripted_router.requests()[1]["messages"]
    assert second[-1] == {
        "role": "tool",
        "tool_call_id": "t1",
        "content": f"[tool_call_id: t1 | model: {CHEAP}]\n{r.message['content']}",
    }
    assert r.decision.actions == [CHEAP, f"select:{CHEAP}"]
    assert_costs_add_up(p, r)


async def test_a_call_listed_before_a_select_is_no_action(
    setup: Any, scripted_router: ScriptedRouter
) -> None:
    # The select ends the loop: the call beside it is never made, so the decision (which
    # off-policy learning reads) must not say it was chosen.
    p, orch, policy, _ = setup
    scripted_router.script(
        {"tool_calls": [call(CHEAP, "t1")]}, {"tool_calls": [call(DEAR, "t2"), select("t1")]}
    )
    r = await orch.run(policy, ctx(p))
    assert r.final_model == CHEAP and [o.model for o in r.outcomes] == [CHEAP]
    assert r.decision.actions == [CHEAP, f"select:{CHEAP}"]


async def test_a_sampling_router_logs_its_propensities_as_unknown(
    setup: Any, scripted_router: ScriptedRouter
) -> None:
    """Greedy, each tool choice has probability 1; sampled, the router cannot say, and
    logging 1.0 would bias every off-policy estimate made from its traffic."""
    p, orch, policy, _ = setup
    sampling = LLMRouterPolicy(policy.provider, policy.router_model, temperature=0.7)
    script = ({"tool_calls": [call(CHEAP, "t1")]}, {"tool_calls": [select("t1")]})
    scripted_router.script(*script, *script)
    greedy, sampled = await orch.run(policy, ctx(p)), await orch.run(sampling, ctx(p))
    assert greedy.decision.propensities == [1.0, 1.0] and greedy.decision.propensity == 1.0
    assert sampled.decision.actions == greedy.decision.actions
    assert sampled.decision.propensities == [None, None]
    assert sampled.decision.propensity is None
    assert sampled.decision.to_dict()["propensity"] is None


async def test_parallel_calls_then_select_by_id(
    setup: Any, scripted_router: ScriptedRouter
) -> None:
    p, orch, policy, _ = setup
    scripted_router.script(
        {"tool_calls": [call(CHEAP, "a"), call(DEAR, "b")]}, {"tool_calls": [select("b")]}
    )
    r = await orch.run(policy, ctx(p))
    assert r.final_model == DEAR
    assert {o.call.id for o in r.outcomes} == {"a", "b"} and all(o.turn == 0 for o in r.outcomes)
    assert_costs_add_up(p, r)


async def test_synthesis(setup: Any, scripted_router: ScriptedRouter) -> None:
    p, orch, policy, _ = setup
    scripted_router.script(
        {"tool_calls": [call(CHEAP, "a"), call(MID, "b")]}, {"content": "Both agree: 100 °C."}
    )
    r = await orch.run(policy, ctx(p))
    assert r.final_model is None and r.message == {
        "role": "assistant",
        "content": "Both agree: 100 °C.",
    }
    assert r.extras["synthesized"] is True and len(r.outcomes) == 2
    assert_costs_add_up(p, r)


async def test_invalid_tool_and_missing_argument_become_tool_errors(
    setup: Any, scripted_router: ScriptedRouter
) -> None:
    p, orch, policy, _ = setup
    scripted_router.script(
        {
            "tool_calls": [
                {"id": "x1", "name": "call_gpt-99", "arguments": {"system_prompt": "hi"}},
                {"id": "x2", "name": tool_name(CHEAP), "arguments": {}},
            ]
        },
        {
            "tool_calls": [
                {"id": "x3", "name": "select_response", "arguments": {}},
                {"id": "x4", "name": tool_name(CHEAP), "arguments": "{not json"},
            ]
        },
        {"content": "I'll answer myself: 100 °C."},
    )
    r = await orch.run(policy, ctx(p))
    assert r.message and r.message["content"].startswith("I'll answer")
    assert r.outcomes == []
    assert r.state.notes["tool_errors"] == [
        "unknown_tool",
        "missing_argument",
        "missing_argument",
        "invalid_arguments",
    ]
    reqs = scripted_router.requests()
    tool_msgs = [m for m in reqs[1]["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_msgs] == ["x1", "x2"]
    assert (
        "unknown_tool" in tool_msgs[0]["content"] and "missing_argument" in tool_msgs[1]["content"]
    )
    assert_costs_add_up(p, r)


@pytest.mark.parametrize("usage", [True, False])
async def test_malformed_tool_calls_become_tool_errors(
    setup: Any, scripted_router: ScriptedRouter, usage: bool
) -> None:
    # Shapes a small router model emits that the parser once crashed on (a 500): a function
    # that is a string, a name that is no string, arguments that are an object. Without
    # usage, its estimate (from the calls' arguments) crashed on the first too.
    p, orch, policy, _ = setup
    calls = [
        {"id": "f1", "type": "function", "function": "call_x"},
        {"id": "f2", "type": "function", "function": {"name": ["a"], "arguments": "{}"}},
        {"id": "f3", "type": "function",
         "function": {"name": tool_name(CHEAP), "arguments": {"system_prompt": "x"}}},
    ]  # fmt: skip
    message = {"role": "assistant", "content": None, "tool_calls": calls}
    scripted_router.script(
        {"raw_choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}]},
        {"content": "I'll answer myself: 100 °C."},
        usage=None if usage else False,
    )
    r = await orch.run(policy, ctx(p))
    assert r.message is not None and r.message["content"].startswith("I'll answer")
    assert r.state.notes["tool_errors"] == [
        "invalid_tool_call",
        "invalid_tool_call",
        "invalid_arguments",
    ]
    turn = r.state.router_calls[0]
    assert turn.ok and turn.usage.completion_tokens > 0 and turn.cost_micros > 0


async def test_the_routers_own_answer_keeps_its_finish_reason_and_refusal(
    setup: Any, scripted_router: ScriptedRouter
) -> None:
    p, orch, policy, _ = setup
    scripted_router.script({"content": "Once upon a", "finish_reason": "length"})
    r = await orch.run(policy, ctx(p))
    assert r.finish_reason == "length" and r.message == {
        "role": "assistant",
        "content": "Once upon a",
    }
    scripted_router.script({"content": None, "refusal": "I can't help with that."})
    r = await orch.run(policy, ctx(p))
    assert r.finish_reason == "stop" and r.message == {
        "role": "assistant",
        "content": None,
        "refusal": "I can't help with that.",
    }
    # Content as text parts is its text.
    parts = [{"type": "text", "text": "100 "}, {"type": "text", "text": "°C."}]
    scripted_router.script({"content": parts})
    r = await orch.run(policy, ctx(p))
    assert r.message is not None and r.message["content"] == "100 °C."


@pytest.mark.parametrize(
    "turn",
    [
        {"raw_choices": []},  # no choices
        {"content": 5},  # content that is no text
        {"content": "  "},  # nothing said
    ],
)
async def test_a_router_turn_with_no_usable_answer_falls_back(
    setup: Any, scripted_router: ScriptedRouter, turn: dict[str, Any]
) -> None:
    p, orch, policy, _ = setup
    # After buying an answer: that answer, not the router's nothing.
    scripted_router.script({"tool_calls": [call(MID, "a")]}, turn)
    r = await orch.run(policy, ctx(p))
    assert r.final_model == MID and r.message is not None and r.message["content"]
    # With none bought: the cheapest model, as when the router fails.
    scripted_router.script(turn)
    r = await orch.run(policy, ctx(p))
    assert r.final_model == CHEAP
    # Its tokens were paid for all the same.
    assert r.state.router_calls[0].cost_micros > 0
    assert_costs_add_up(p, r)


async def test_a_router_turn_cut_short_is_in_the_state_with_its_time(
    setup: Any, scripted_router: ScriptedRouter
) -> None:
    p, orch, policy, _ = setup
    scripted_router.script({"content": "late", "delay_s": 5})
    with pytest.raises(RequestTimeout) as exc:
        await orch.run(policy, ctx(p), timeout_s=0.3)
    (turn,) = exc.value.state.router_calls
    # The request's deadline cut it: a timeout, as a per-model timeout books one.
    assert (turn.ok, turn.role, turn.error_kind) == (False, "router", "timeout")
    assert turn.error == (
        "the request's deadline passed before the call answered; usage estimated from the "
        "prompt sent"
    )
    assert turn.latency_ms >= 250
    # Bug: booked at $0, where a downstream call cut in flight is charged its prompt (the
    # router's server read it): the prompt's estimate, at the router's price, in the spend.
    assert turn.usage.prompt_tokens > 0 and turn.usage.completion_tokens == 0
    assert turn.cost_micros == ROUTER_PRICE.cost_micros(turn.usage) > 0
    assert exc.value.state.spent_micros == turn.cost_micros

    async def hang_up(pol: LLMRouterPolicy, after_s: float) -> LoopState:
        """The run's state once its request is cancelled (a client leaving) ``after_s``
        after the router model received its turn: waited for, not guessed, since a loaded
        machine may take long to send it."""
        state = orch.new_state(pol, ctx(p))
        task = asyncio.create_task(orch.run(pol, ctx(p), timeout_s=30, state=state))
        while not await asyncio.to_thread(scripted_router.requests):  # noqa: ASYNC110 - its server is another process
            await asyncio.sleep(0.02)
        await asyncio.sleep(after_s)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return state

    # A client that leaves is no timeout: cancelled, which says nothing about the model.
    scripted_router.script({"content": "late", "delay_s": 5})
    (turn,) = (await hang_up(policy, 0.2)).router_calls  # it answers 5 s later
    assert (turn.error_kind, turn.error) == (
        "cancelled",
        "the client left before the call answered; usage estimated from the prompt sent",
    )
    assert turn.cost_micros == ROUTER_PRICE.cost_micros(turn.usage) > 0
    # Bug: cut while waiting to retry a failed turn, the turn was missing from the row.
    # Nothing was with the server then: in the row, at $0.
    retrying = LLMRouterPolicy(
        policy.provider, dataclasses.replace(policy.router_model, max_retries=1)
    )
    scripted_router.script({"error_status": 503, "retry_after": 2}, {"content": "hi"})
    state = await hang_up(retrying, 1.0)  # it failed at once; the retry is 2 s later
    (turn,) = state.router_calls
    assert (turn.error_kind, turn.error) == (
        "cancelled",
        "the client left before the call answered",
    )
    assert turn.cost_micros == 0 and state.spent_micros == 0
    # A failed turn has its time too.
    scripted_router.script({"error_status": 500})
    r = await orch.run(policy, ctx(p))
    assert r.state.router_calls[0].latency_ms > 0


async def test_budget_exhausted_mid_loop(setup: Any, scripted_router: ScriptedRouter) -> None:
    p, orch, policy, _ = setup
    # A self-hosted (free) router model: only the downstream calls count against the cap.
    free = LLMRouterPolicy(
        policy.provider,
        dataclasses.replace(
            policy.router_model, price=ModelPrice(input=Decimal(0), output=Decimal(0))
        ),
    )
    scripted_router.script(
        {"tool_calls": [call(CHEAP, "a")]},
        {"tool_calls": [call(DEAR, "b", max_tokens=4000)]},
        {"tool_calls": [select("a")]},
    )
    # Enough for the cheap call, not for the dear one's worst case.
    r = await orch.run(free, ctx(p, max_cost_micros=1000))
    assert r.final_model == CHEAP
    refused = [o for o in r.outcomes if not o.ok]
    assert [o.call.id for o in refused] == ["b"] and refused[0].error_kind == "budget"
    # The router capped the call's output (max_tokens 4000): no hint to the client.
    assert refused[0].error is not None and "max_tokens" not in refused[0].error
    told = next(
        m for m in scripted_router.requests()[2]["messages"] if m.get("tool_call_id") == "b"
    )["content"]
    assert "budget" in told and '"selectable":false' in told
    assert r.cost_micros <= 1000 and r.router_cost_micros == 0


async def test_a_call_refused_by_the_cap_says_max_tokens_would_lower_its_worst_case(
    setup: Any,
) -> None:
    # Its worst case counts the model's whole output limit when nothing caps it: under a
    # small max_cost_usd most refusals are that, and the client can lower it.
    p, orch, _, _ = setup
    with pytest.raises(NoAnswer) as exc:
        await orch.run(FixedPolicy(DEAR), ctx(p, max_cost_micros=1))
    last = exc.value.last_failure
    assert last is not None and last.error_kind == "budget" and last.error is not None
    assert last.error.endswith(
        "(its worst case counts the model's whole output limit: set max_tokens)"
    )
    with pytest.raises(NoAnswer) as exc:
        await orch.run(
            FixedPolicy(DEAR), ctx(p, max_cost_micros=1, request_params={"max_tokens": 50})
        )
    last = exc.value.last_failure
    assert last is not None and last.error is not None and "max_tokens" not in last.error


async def test_the_request_cap_covers_the_router_turns(
    setup: Any, scripted_router: ScriptedRouter
) -> None:
    # max_cost_usd caps the whole request, the router model's turns included: a turn whose
    # worst case the rest of the cap cannot cover is not made, as a downstream call is not.
    p, orch, policy, _ = setup
    scripted_router.script(
        {"tool_calls": [call(CHEAP, "a")]},
        {"content": "I can answer this myself: 100 °C."},
    )
    c = ctx(p, max_cost_micros=0)
    first = policy.router_call(c, LoopState(decision=Decision("llm", 0.5, None)))
    assert first is not None
    r = await orch.run(policy, ctx(p, max_cost_micros=first[1] + 10))
    assert len(scripted_router.requests()) == 1  # the second turn was never sent
    assert r.final_model == CHEAP and r.fallback_used
    refused = r.state.router_calls[-1]
    assert (refused.role, refused.ok, refused.error_kind) == ("router", False, "budget")
    assert refused.error is not None and "the router's next turn" in refused.error
    assert "max_tokens" not in refused.error  # the router's own turn: not the client's to set
    assert r.cost_micros <= first[1] + 10
    assert_costs_add_up(p, r)

    scripted_router.script({"content": "unused"})
    with pytest.raises(NoAnswer) as exc:
        await orch.run(policy, ctx(p, max_cost_micros=first[1] - 1))
    assert scripted_router.requests() == []
    last = exc.value.last_failure
    assert last is not None and last.role == "router" and last.error_kind == "budget"


async def test_reused_tool_call_ids_are_renamed_so_each_call_is_settled_once(
    setup: Any, scripted_router: ScriptedRouter
) -> None:
    # Small router models reuse ids: twice in one turn, and again in the next. Each call
    # gets its own id, hold and settle, and the router reads results under the new ids.
    p, orch, policy, _ = setup
    scripted_router.script(
        {"tool_calls": [call(CHEAP, "c0"), call(MID, "c0")]},
        {"tool_calls": [call(DEAR, "c0")]},
        {"tool_calls": [select("c0~0.1")]},
    )
    guard, store, limits = key_guard(1_000_000)
    r = await orch.run(policy, ctx(p), guard=guard)
    assert [o.call.id for o in r.outcomes] == ["c0", "c0~0.1", "c0~1.1"]
    assert all(o.ok for o in r.outcomes) and r.final_model == MID
    second = scripted_router.requests()[1]["messages"]
    assert [tc["id"] for tc in second[-3]["tool_calls"]] == ["c0", "c0~0.1"]
    assert [m["tool_call_id"] for m in second[-2:]] == ["c0", "c0~0.1"]
    state = await store.spent(limits)
    assert (state.spent, state.reserved) == (r.cost_micros, 0)
    assert_costs_add_up(p, r)


async def test_the_loop_refuses_a_policys_duplicate_call_ids(setup: Any) -> None:
    # The loop's own guard, for any policy: a second call with an id already used is
    # refused before it is reserved or made.
    p, orch, _, _ = setup

    class Twice(Policy):
        name = "twice"

        async def step(self, ctx: RouteContext, state: LoopState) -> Step:
            if state.turn == 0:
                return Call((ToolCall(id="x", model=CHEAP), ToolCall(id="x", model=MID)))
            return Select("x")

    guard, store, limits = key_guard(1_000_000)
    r = await orch.run(Twice(), ctx(p), guard=guard)
    assert [(o.model, o.ok) for o in r.outcomes] == [(CHEAP, True), (MID, False)]
    assert r.outcomes[1].error == "duplicate tool call id 'x'" and r.final_model == CHEAP
    state = await store.spent(limits)
    assert (state.spent, state.reserved) == (r.cost_micros, 0)


async def test_max_turns_falls_back_to_best_successful_answer(
    setup: Any, scripted_router: ScriptedRouter
) -> None:
    p, orch, policy, _ = setup
    scripted_router.script(
        {"tool_calls": [call(CHEAP, "a")]},
        {"tool_calls": [call(DEAR, "b")]},
        {"tool_calls": [call(MID, "c")]},
    )
    r = await orch.run(policy, ctx(p, max_turns=2))
    assert r.fallback_used and r.final_model == DEAR  # the dearest successful answer
    assert len(r.state.router_calls) == 2
    assert_costs_add_up(p, r)


async def test_downstream_failure_uses_the_fallback_model(
    setup: Any, scripted_router: ScriptedRouter, downstream: Downstream
) -> None:
    p, orch, policy, _ = setup
    downstream.fault(MID, "status=500", count=1)
    scripted_router.script({"tool_calls": [call(MID, "a")]}, {"tool_calls": [select("a")]})
    r = await orch.run(policy, ctx(p))
    assert r.final_model == DEAR and r.outcomes[0].fallback_from == MID
    assert_costs_add_up(p, r)


async def test_a_fallback_the_request_may_not_use_is_not_called(
    setup: Any, downstream: Downstream
) -> None:
    # MID falls back to DEAR, but this request may use CHEAP and MID only (its allow-list,
    # its key's, the modalities it needs): MID's failure is not answered by DEAR.
    p, orch, _, _ = setup
    allowed = ModelPool([p[CHEAP], p[MID]])
    for stream in (False, True):
        downstream.fault(MID, "status=500", count=1)
        with pytest.raises(NoAnswer) as exc:
            await orch.run(FixedPolicy(MID), ctx(allowed), stream=stream)
        # Nor by CHEAP: a fixed policy calls its model and that model's fallbacks only.
        outcomes = [(o.model, o.ok, o.fallback_from) for o in exc.value.state.outcomes]
        assert outcomes == [(MID, False, None)], stream
    # The hold covers the dearest model a call may end on: with DEAR allowed, MID's call
    # holds DEAR's worst case.
    dear_alone = worst_case_micros(ctx(p), ToolCall(id="d", model=DEAR))
    assert worst_case_micros(ctx(p), ToolCall(id="m", model=MID)) == dear_alone
    assert worst_case_micros(ctx(allowed), ToolCall(id="m", model=MID)) < dear_alone


async def test_failed_call_cannot_be_selected(
    setup: Any, scripted_router: ScriptedRouter, downstream: Downstream
) -> None:
    p, orch, policy, _ = setup
    downstream.fault(CHEAP, "status=400", count=1)
    scripted_router.script(
        {"tool_calls": [call(CHEAP, "a")]},
        {"tool_calls": [select("a")]},
        {"tool_calls": [call(MID, "b")]},
        {"tool_calls": [select("b")]},
    )
    r = await orch.run(policy, ctx(p))
    assert r.final_model == MID
    assert "not_selectable" in str(scripted_router.requests()[2]["messages"])


async def test_router_failure_without_answers_routes_to_cheapest(
    setup: Any, scripted_router: ScriptedRouter
) -> None:
    p, orch, policy, _ = setup
    scripted_router.script({"error_status": 500})
    r = await orch.run(policy, ctx(p))
    assert r.final_model == CHEAP and not r.state.router_calls[0].ok


@pytest.mark.parametrize("stream", [False, True])
async def test_a_failed_fallback_is_told_to_the_router_not_answered_as_its_call(
    setup: Any, scripted_router: ScriptedRouter, downstream: Downstream, stream: bool
) -> None:
    # The router fails, and so does the cheapest model the gateway calls in its place. The
    # next turn reported that call as a tool message answering a call no assistant message
    # held: a 400 on strict servers (OpenAI's), every later turn failing and falling back.
    p, orch, policy, _ = setup
    downstream.fault(CHEAP, "status=500", count=1)
    scripted_router.script(
        {"error_status": 500}, {"tool_calls": [call(MID, "a")]}, {"tool_calls": [select("a")]}
    )
    r = await orch.run(policy, ctx(p), stream=stream)
    assert r.final_model == MID and r.message is not None and r.message["content"]
    sent = scripted_router.requests()[1]["messages"]
    assert [m["role"] for m in sent[1 + len(USER) :]] == ["user"], sent
    assert f"The gateway called {CHEAP} itself after a failed turn" in sent[-1]["content"]
    assert [(o.call.id, o.model, o.ok) for o in r.outcomes] == [
        ("fallback_0", CHEAP, False),
        ("a", MID, True),
    ]
    assert_costs_add_up(p, r)
    # A router call named as the gateway's fallback would be: the fallback takes another id
    # (the same one was refused as a duplicate call, reported as over budget).
    downstream.fault(CHEAP, "status=500", count=2)
    scripted_router.script(
        {"tool_calls": [call(CHEAP, "fallback_1")]}, {"error_status": 500}, {"content": "100."}
    )
    r = await orch.run(policy, ctx(p), stream=stream)
    assert [(o.call.id, o.model, o.error_kind) for o in r.outcomes] == [
        ("fallback_1", CHEAP, "upstream_5xx"),
        ("fallback_1.1", CHEAP, "upstream_5xx"),
    ]
    last = scripted_router.requests()[2]["messages"][1 + len(USER) :]
    assert [m["role"] for m in last] == ["assistant", "tool", "user"], last
    assert last[1]["tool_call_id"] == "fallback_1"


async def test_a_last_turn_with_no_call_to_make_falls_back(
    setup: Any, scripted_router: ScriptedRouter
) -> None:
    # A router that emits only unusable calls ran out of turns with nothing bought: a 502
    # "no downstream call succeeded" (upstream_error), though no upstream was called.
    p, orch, policy, _ = setup
    unknown = {"id": "x", "name": "call_gpt-99", "arguments": {"system_prompt": "hi"}}
    scripted_router.script(
        {"content": "thinking", "tool_calls": [unknown]},
        {"content": "thinking", "tool_calls": [dict(unknown, id="y")]},
    )
    r = await orch.run(policy, ctx(p, max_turns=2))
    assert r.final_model == CHEAP and r.message is not None and r.message["content"]
    assert r.state.notes["tool_errors"] == ["unknown_tool", "unknown_tool"]
    assert [o.call.id for o in r.outcomes] == ["fallback_1"]
    assert len(r.state.router_calls) == 2
    assert_costs_add_up(p, r)
    # An unusable call on an earlier turn is the router's to correct on the next.
    scripted_router.script(
        {"tool_calls": [unknown]}, {"tool_calls": [call(MID, "a")]}, {"tool_calls": [select("a")]}
    )
    r = await orch.run(policy, ctx(p, max_turns=3))
    assert r.final_model == MID and [o.call.id for o in r.outcomes] == ["a"]


async def test_router_model_transient_failures_are_retried_up_to_its_max_retries(
    setup: Any, scripted_router: ScriptedRouter
) -> None:
    p, orch, policy, _ = setup
    retrying = LLMRouterPolicy(
        policy.provider, dataclasses.replace(policy.router_model, max_retries=1)
    )
    # A 503 (vLLM restarting) is retried: the turn still routes.
    scripted_router.script(
        {"error_status": 503}, {"tool_calls": [call(MID, "a")]}, {"tool_calls": [select("a")]}
    )
    r = await orch.run(retrying, ctx(p))
    assert r.final_model == MID
    first = r.state.router_calls[0]
    assert first.ok and first.attempts == 2
    # Twice in a row is past max_retries: the loop's fallback answers, as without retries.
    scripted_router.script({"error_status": 503}, {"error_status": 503})
    r = await orch.run(retrying, ctx(p))
    assert r.final_model == CHEAP
    assert [(o.ok, o.attempts, o.error_kind) for o in r.state.router_calls] == [
        (False, 2, "upstream_5xx")
    ]
    # A client error is the request's fault, not the router's health: not retried.
    scripted_router.script({"error_status": 400}, {"content": "never sent"})
    r = await orch.run(retrying, ctx(p))
    assert r.final_model == CHEAP and r.state.router_calls[0].attempts == 1
    assert len(scripted_router.requests()) == 1
    # A server that asks for a longer wait than the backoff's cap (2 s) is not called again
    # in the turn, as a pool model is not: it was re-hit 2 s later.
    scripted_router.script({"error_status": 429, "retry_after": 30}, {"content": "never sent"})
    r = await orch.run(retrying, ctx(p))
    assert r.final_model == CHEAP and r.state.router_calls[0].attempts == 1
    assert len(scripted_router.requests()) == 1


async def test_query_copy_is_counted(setup: Any, scripted_router: ScriptedRouter) -> None:
    p, orch, policy, copies = setup
    scripted_router.script(
        {"tool_calls": [call(CHEAP, "a", system_prompt="Answer: " + USER[1]["content"])]},
        {"tool_calls": [select("a")]},
    )
    r = await orch.run(policy, ctx(p))
    assert r.state.notes["query_copies"] == 1 and copies == [1]


async def test_no_answer_when_every_call_fails(setup: Any, downstream: Downstream) -> None:
    from router.policies.baselines import FixedPolicy

    p, orch, _, _ = setup
    downstream.fault(DEAR, "status=400", count=1)
    with pytest.raises(NoAnswer):
        await orch.run(FixedPolicy(DEAR), ctx(p, max_turns=1))


def test_downstream_gets_the_real_conversation() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Client system."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Look:"},
                {"type": "image_url", "image_url": {"url": "data:,"}},
            ],
        },
        {"role": "assistant", "content": "Seen."},
        {"role": "user", "content": "And now?"},
    ]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    c = RouteContext(
        request_id="r",
        messages=messages,
        pool=ModelPool([]),
        cost_weight=0,
        tools=tools,
        request_params={"temperature": 0.2, "max_tokens": 100, "seed": 7},
    )
    body = downstream_request(
        c, ToolCall(id="t", model="m", system_prompt="Router says.", temperature=0.9, max_tokens=50)
    )
    assert body["messages"][0] == {"role": "system", "content": "Router says.\n\nClient system."}
    assert body["messages"][1:] == messages[1:]
    assert body["tools"] == tools and body["seed"] == 7
    assert body["temperature"] == 0.9 and body["max_tokens"] == 50


# -- the router model's calls against a key's budget (the gateway's guard and store) --------


def key_guard(budget_micros: int) -> tuple[KeyBudgetGuard, MemoryLimitStore, KeyLimits]:
    store = MemoryLimitStore()
    limits = KeyLimits("k", budget_micros=budget_micros)
    return KeyBudgetGuard(store, limits, "r1", bookkeeping=Bookkeeping()), store, limits


async def test_a_keys_budget_holds_and_settles_every_router_call(
    setup: Any, scripted_router: ScriptedRouter
) -> None:
    p, orch, policy, _ = setup
    scripted_router.script(
        {"tool_calls": [call(CHEAP, "a"), call(MID, "b")]},
        {"tool_calls": [select("b")]},
        usage={"prompt_tokens": 700, "completion_tokens": 90},
    )
    guard, store, limits = key_guard(1_000_000)
    c = ctx(p)
    planned = policy.router_call(c, LoopState(decision=Decision("llm", 0.5, None)))
    assert planned is not None
    r = await orch.run(policy, c, guard=guard)
    assert r.final_model == MID and r.router_cost_micros == 2 * (700 * 0.5 + 90 * 1.5)
    state = await store.spent(limits)
    # Router and downstream calls alike: the key paid what the request cost, every hold
    # (the router's worst case each turn, the downstream calls') is released.
    assert (state.spent, state.reserved) == (r.cost_micros, 0)
    # The hold covered the call: the estimate is high, as every reservation's.
    assert planned[1] >= r.state.router_calls[0].cost_micros
    assert_costs_add_up(p, r)


async def test_a_router_turn_the_budget_cannot_cover_is_not_made(
    setup: Any, scripted_router: ScriptedRouter
) -> None:
    p, orch, policy, _ = setup
    scripted_router.script(
        {"tool_calls": [call(CHEAP, "a")]},
        {"content": "I can answer this myself: 100 °C."},
    )
    c = ctx(p)
    first = policy.router_call(c, LoopState(decision=Decision("llm", 0.5, None)))
    assert first is not None
    # Enough for the first router turn's worst case (its real cost is far below it) and the
    # cheap call, not for a second turn's worst case, which is larger than the first's.
    guard, store, _ = key_guard(first[1] + 10)
    r = await orch.run(policy, c, guard=guard)
    assert len(scripted_router.requests()) == 1  # the second turn was never sent
    assert r.final_model == CHEAP and r.fallback_used  # the best answer bought so far
    refused = r.state.router_calls[-1]
    assert (refused.role, refused.ok, refused.error_kind) == ("router", False, "budget")
    assert (await store.spent(guard.limits)).reserved == 0

    # Nothing bought yet and no budget for the first turn: no answer, and the refusal says so.
    scripted_router.script({"content": "unused"})
    guard, store, _ = key_guard(first[1] - 1)
    with pytest.raises(NoAnswer) as exc:
        await orch.run(policy, ctx(p), guard=guard)
    assert scripted_router.requests() == []
    last = exc.value.last_failure
    assert last is not None and last.role == "router" and last.error_kind == "budget"
    assert last.error is not None and last.error.startswith("key budget exhausted")
    state = await store.spent(guard.limits)
    assert (state.spent, state.reserved) == (0, 0)


async def test_a_timeout_while_a_stream_opens_releases_its_hold(
    setup: Any, downstream: Downstream
) -> None:
    # The request's timeout cancels the run while the final call's stream is still being
    # opened: the hold on the key's budget goes with it, not an hour of TTL later (settled
    # at the prompt the upstream was sent, as the call's row says it cost).
    p, orch, _, _ = setup
    downstream.fault(CHEAP, "latency=3000")
    guard, store, limits = key_guard(1_000_000)
    with pytest.raises(RequestTimeout) as exc:
        await orch.run(FixedPolicy(CHEAP), ctx(p), stream=True, guard=guard, timeout_s=0.3)
    # Booked as what it was: the call did not answer in the time the request had (it was
    # booked `cancelled`, as a client hang-up, and left out of training exports).
    [outcome] = exc.value.state.outcomes
    assert (outcome.ok, outcome.error_kind) == (False, "timeout") and outcome.cost_micros > 0
    state = await store.spent(limits)
    assert (state.spent, state.reserved) == (outcome.cost_micros, 0)


async def test_a_stream_closed_before_it_is_read_is_settled_and_recorded(setup: Any) -> None:
    # A client that leaves before the relay reads a chunk (or a translation that never
    # starts reading): closing the stream gives back the upstream response, settles the hold
    # and records the call, as reading it to the end would. An async generator that never
    # started runs no `finally`, so this cannot be left to the relay's.
    p, orch, _, _ = setup
    guard, store, limits = key_guard(1_000_000)
    r = await orch.run(FixedPolicy(CHEAP), ctx(p), stream=True, guard=guard)
    assert r.stream is not None and (await store.spent(limits)).reserved > 0
    await r.stream.aclose()
    await r.stream.aclose()  # idempotent: one outcome, one settle
    [outcome] = r.state.outcomes
    assert outcome.model == CHEAP and outcome.error_kind == "connection"
    assert outcome.cost_micros > 0  # the prompt was sent: charged an estimate
    state = await store.spent(limits)
    assert (state.spent, state.reserved) == (outcome.cost_micros, 0)
    assert r.cost_micros == outcome.cost_micros


class ClientLeavesAt:
    """A key's budget guard (the real one, delegated to) whose client hangs up at a chosen
    moment: the request's task is cancelled right after a reserve of ``call_id`` returns,
    or as its settle begins — what the ASGI server does on a disconnect."""

    def __init__(self, inner: KeyBudgetGuard, when: str, call_id: str) -> None:
        self.inner, self.when, self.call_id = inner, when, call_id
        self.request: asyncio.Task[Any] | None = None

    def _leave(self, when: str, call: ToolCall) -> None:
        if self.when == when and call.id == self.call_id and self.request is not None:
            self.request.cancel()

    async def reserve(self, call: ToolCall, worst_case_micros: int) -> str | None:
        reason = await self.inner.reserve(call, worst_case_micros)
        self._leave("reserved", call)
        return reason

    async def settle(self, call: ToolCall, reserved_micros: int, actual_micros: int) -> None:
        self._leave("settling", call)
        await self.inner.settle(call, reserved_micros, actual_micros)


async def _leave_during(
    orch: Orchestrator, policy: Any, c: RouteContext, guard: ClientLeavesAt
) -> LoopState:
    state = orch.new_state(policy, c)
    guard.request = asyncio.create_task(orch.run(policy, c, guard=guard, state=state))
    with pytest.raises(asyncio.CancelledError):
        await guard.request
    await guard.inner.bookkeeping.drain()
    return state


async def test_a_client_leaving_as_parallel_calls_start_releases_their_holds(
    setup: Any, scripted_router: ScriptedRouter
) -> None:
    """Cancelled after the turn's holds were taken but before its calls' tasks ran: a
    coroutine cancelled before it starts runs no `finally`, so neither call settled its
    hold, and both held the key's budget until they expired."""
    p, orch, policy, _ = setup
    scripted_router.script({"tool_calls": [call(CHEAP, "a"), call(MID, "b")]})
    inner, store, limits = key_guard(1_000_000)
    state = await _leave_during(orch, policy, ctx(p), ClientLeavesAt(inner, "reserved", "b"))
    assert not state.outcomes  # neither call was made
    budget = await store.spent(limits)
    assert budget.reserved == 0
    assert budget.spent == sum(o.cost_micros for o in state.router_calls)


async def test_a_client_leaving_while_a_call_is_settled_keeps_the_call_in_the_row(
    setup: Any, scripted_router: ScriptedRouter
) -> None:
    """The call answered and its settle charged the key (run to completion, shielded), but
    the cancellation raised out of the settle threw the outcome away: the ledger row had no
    call, and the key's spent exceeded the ledger's total for good."""
    p, orch, policy, _ = setup
    scripted_router.script({"tool_calls": [call(CHEAP, "a")]})
    inner, store, limits = key_guard(1_000_000)
    state = await _leave_during(orch, policy, ctx(p), ClientLeavesAt(inner, "settling", "a"))
    [made] = state.outcomes
    assert made.ok and made.model == CHEAP and made.cost_micros > 0
    budget = await store.spent(limits)
    assert budget.reserved == 0
    assert budget.spent == made.cost_micros + sum(o.cost_micros for o in state.router_calls)


@pytest.mark.parametrize("ended_by", ["client", "deadline"])
async def test_a_call_that_answered_stays_in_the_row_when_its_sibling_is_cut_off(
    setup: Any, scripted_router: ScriptedRouter, downstream: Downstream, ended_by: str
) -> None:
    """Two parallel calls; the first answers (and is settled on the key's budget) while the
    second is still running when the request ends. The gather's cancellation threw the
    first one's result away: the key had paid for a call the ledger row did not hold."""
    p, orch, policy, _ = setup
    downstream.fault(MID, "latency=3000")
    scripted_router.script({"tool_calls": [call(CHEAP, "a"), call(MID, "b")]})
    guard, store, limits = key_guard(1_000_000)
    c = ctx(p)
    state = orch.new_state(policy, c)
    if ended_by == "client":
        task = asyncio.create_task(orch.run(policy, c, guard=guard, state=state))
        await asyncio.sleep(0.8)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    else:
        with pytest.raises(RequestTimeout):
            await orch.run(policy, c, guard=guard, state=state, timeout_s=0.8)
    await guard.bookkeeping.drain()
    kinds = {o.call.id: (o.ok, o.error_kind) for o in state.outcomes}
    cut = "cancelled" if ended_by == "client" else "timeout"
    assert kinds == {"a": (True, None), "b": (False, cut)}
    budget = await store.spent(limits)
    row_total = sum(o.cost_micros for o in [*state.outcomes, *state.router_calls])
    assert budget.reserved == 0 and budget.spent == row_total > 0


# -- calls the request stops waiting for: what their upstream was sent is paid for ---------


# A prompt whose estimate costs more than rounding could make of it: ~1,000 tokens.
LONG_PROMPT = [{"role": "user", "content": "Summarise this log line by line. " + "ok " * 1300}]


def long_ctx(p: ModelPool) -> RouteContext:
    return RouteContext(request_id="r1", messages=LONG_PROMPT, pool=p, cost_weight=0.5)


def _prompt_cost(p: ModelPool, model: str, c: RouteContext) -> tuple[int, int]:
    """(estimated prompt tokens, their cost at ``model``'s price) of what a FixedPolicy's
    call sends: the estimate a stream cut before its usage is charged."""
    body = downstream_request(c, ToolCall(id="call_0", model=model))
    tokens = prompt_tokens_estimate(body)
    return tokens, p[model].price.cost_micros(TokenUsage(prompt_tokens=tokens))


async def _end_request(
    orch: Orchestrator,
    policy: Policy,
    c: RouteContext,
    guard: KeyBudgetGuard,
    ended_by: str,
    *,
    stream: bool = False,
) -> LoopState:
    """Run ``policy`` until the client leaves (its task cancelled) or the request's deadline
    passes, 0.4 s in; the state as the gateway books it."""
    state = orch.new_state(policy, c)
    if ended_by == "client":
        task = asyncio.create_task(orch.run(policy, c, guard=guard, state=state, stream=stream))
        await asyncio.sleep(0.4)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    else:
        with pytest.raises(RequestTimeout):
            await orch.run(policy, c, guard=guard, state=state, stream=stream, timeout_s=0.4)
    await guard.bookkeeping.drain()
    return state


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("ended_by", ["client", "deadline"])
async def test_a_call_cut_off_after_its_request_was_sent_is_charged_its_prompt(
    setup: Any, downstream: Downstream, ended_by: str, stream: bool
) -> None:
    """The upstream had the request (and bills its prompt) when the request stopped waiting
    for the answer: booked at no cost, a client could spend upstream money without its
    key's budget seeing any by hanging up before each answer came."""
    p, orch, _, _ = setup
    downstream.fault(CHEAP, "latency=3000")
    guard, store, limits = key_guard(1_000_000)
    c = long_ctx(p)
    state = await _end_request(orch, FixedPolicy(CHEAP), c, guard, ended_by, stream=stream)
    [cut] = state.outcomes
    tokens, cost = _prompt_cost(p, CHEAP, c)
    assert tokens > 900 and cost > 50
    # Its error kind is what it was; the row says the prompt it was sent, and that the
    # usage is an estimate (no completion is known), at the model's input price.
    kind = "cancelled" if ended_by == "client" else "timeout"
    assert (cut.ok, cut.model, cut.error_kind) == (False, CHEAP, kind)
    assert cut.error is not None
    assert cut.error.endswith("before the call answered; usage estimated from the prompt sent")
    assert (cut.usage.prompt_tokens, cut.usage.completion_tokens) == (tokens, 0)
    assert cut.cost_micros == cost and cut.latency_ms >= 350
    # The key paid what the row says, within the hold, and holds nothing more.
    budget = await store.spent(limits)
    assert (budget.spent, budget.reserved) == (cost, 0)
    assert cost <= worst_case_micros(c, ToolCall(id="call_0", model=CHEAP))


async def test_a_fallback_cut_off_in_flight_is_charged_at_its_own_price(
    setup: Any, downstream: Downstream
) -> None:
    p, orch, _, _ = setup
    downstream.fault(MID, "status=500", count=1)  # no retries: MID falls back to DEAR
    downstream.fault(DEAR, "latency=3000")
    guard, store, limits = key_guard(1_000_000)
    c = long_ctx(p)
    state = await _end_request(orch, FixedPolicy(MID), c, guard, "deadline")
    [cut] = state.outcomes
    _, cost = _prompt_cost(p, DEAR, c)
    assert (cut.model, cut.fallback_from, cut.attempts, cut.error_kind) == (
        DEAR,
        MID,
        2,
        "timeout",
    )
    assert cut.cost_micros == cost > _prompt_cost(p, MID, c)[1]
    assert (await store.spent(limits)).spent == cost


def _one_slot_pool(base: str, retries: int) -> ModelPool:
    cfg = PoolModelConfig(
        name=CHEAP,
        model=f"openai/{CHEAP}",
        api_base=base,
        timeout_s=5,
        max_retries=retries,
        max_concurrency=1,
    )
    return ModelPool.from_configs([cfg], load_default_catalog())


@pytest.mark.parametrize("waiting_for", ["slot", "backoff"])
async def test_a_call_cut_off_before_its_request_was_sent_costs_nothing(
    downstream: Downstream, waiting_for: str
) -> None:
    """Cut while it waited for its model's concurrency slot, or between a failed attempt and
    its retry: no upstream has its request, so nothing is charged (a failed attempt never
    is)."""
    downstream.control.delete("/_replay/faults")
    p = _one_slot_pool(downstream.base_url, retries=1)

    async def long_backoff(_: float) -> None:
        await asyncio.sleep(30)

    client = DownstreamClient(p, sleep=long_backoff)
    busy: asyncio.Task[Any] | None = None
    try:
        if waiting_for == "slot":
            # Another call holds the model's only slot for 3 s.
            downstream.fault(CHEAP, "latency=3000")
            busy = asyncio.create_task(client.complete(CHEAP, {"messages": USER}))
            await asyncio.sleep(0.2)
        else:
            downstream.fault(CHEAP, "status=500", count=1)
        guard, store, limits = key_guard(1_000_000)
        orch = Orchestrator(ProviderExecutor(client))
        state = await _end_request(orch, FixedPolicy(CHEAP), long_ctx(p), guard, "deadline")
        [cut] = state.outcomes
        assert (cut.ok, cut.error_kind, cut.error) == (
            False,
            "timeout",
            "the request's deadline passed before the call answered",
        )
        assert (cut.cost_micros, cut.usage) == (0, TokenUsage())
        budget = await store.spent(limits)
        assert (budget.spent, budget.reserved) == (0, 0)
    finally:
        if busy is not None:
            busy.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await busy
        downstream.control.delete("/_replay/faults")
        await client.aclose()
