"""Multi-call plans: the agreement rule, escalation, and running a plan inside the loop
(failures, budget refusals, the turn limit)."""

from __future__ import annotations

import pytest

from router.plans import Accept, CascadePlan, Escalate, answer_key, continue_plan, start_plan
from router.policy import (
    Call,
    CallOutcome,
    Decision,
    LoopState,
    RouteContext,
    Select,
    ToolCall,
)
from router.pool import ModelPool


def test_the_first_round_and_agreement_on_the_final_answer() -> None:
    plan = CascadePlan(("a", "b", "c", "d"), k=2)
    assert plan.first == ("a", "b") and plan.rounds == 3
    assert plan.name == "cascade:a>b>c>d@2"
    # Agreement is on the normalized answer: the cheapest of the agreeing models answers.
    assert plan.advance(["a", "b"], {"a": "choice:B", "b": "choice:B"}) == Accept("a")
    assert plan.advance(["a", "b"], {"a": "choice:A", "b": "choice:B"}) == Escalate("c")
    # A later round that agrees with one of the first selects the cheaper of the two.
    answers = {"a": "choice:A", "b": "choice:B", "c": "choice:B"}
    assert plan.advance(["a", "b", "c"], answers) == Accept("b")
    answers["c"] = "choice:C"
    assert plan.advance(["a", "b", "c"], answers) == Escalate("d")
    # The last escalation answers whatever it says, agreeing or not.
    answers["d"] = "choice:A"
    assert plan.advance(["a", "b", "c", "d"], answers) == Accept("d")


def test_failed_calls_agree_with_nothing_and_a_quorum_counts_answers() -> None:
    plan = CascadePlan(("a", "b", "c"), k=2)
    assert plan.advance(["a", "b"], {"a": "", "b": ""}) == Escalate("c")
    assert plan.advance(["a", "b"], {"b": "num:4"}) == Escalate("c")
    three = CascadePlan(("a", "b", "c"), k=3, quorum=3)
    assert three.advance(["a", "b", "c"], dict.fromkeys("abc", "choice:A")) == Accept("a")
    # The whole order in the first round without a quorum: the last model answers.
    two_of_three = {"a": "choice:A", "b": "choice:A", "c": "choice:C"}
    assert three.advance(["a", "b", "c"], two_of_three) == Accept("c")
    assert CascadePlan(("solo",), k=1).advance(["solo"], {}) == Accept("solo")


@pytest.mark.parametrize(
    "bad",
    [
        lambda: CascadePlan(()),
        lambda: CascadePlan(("a", "a")),
        lambda: CascadePlan(("a", "b"), k=3),
        lambda: CascadePlan(("a", "b"), k=0),
        lambda: CascadePlan(("a", "b"), quorum=1),
    ],
)
def test_invalid_plans_are_refused(bad: object) -> None:
    with pytest.raises(ValueError):
        bad()  # type: ignore[operator]


def test_advance_needs_a_called_prefix() -> None:
    plan = CascadePlan(("a", "b", "c"), k=2)
    with pytest.raises(ValueError, match="prefix"):
        plan.advance(["a"], {})
    with pytest.raises(ValueError, match="prefix"):
        plan.advance(["a", "c"], {})


# -- inside the loop ------------------------------------------------------------------------


def ctx(max_turns: int = 4) -> RouteContext:
    return RouteContext(
        request_id="r", messages=[], pool=ModelPool([]), cost_weight=0.0, max_turns=max_turns
    )


def outcome(call: ToolCall, text: str | None, error_kind: str | None = None) -> CallOutcome:
    ok = text is not None
    return CallOutcome(
        call=call,
        turn=0,
        ok=ok,
        model=call.model,
        message={"role": "assistant", "content": text} if ok else None,
        error=None if ok else "failed",
        error_kind=error_kind if not ok else None,
    )


def run_round(state: LoopState, step: Call, answers: dict[str, str | None]) -> None:
    for call in step.calls:
        state.outcomes.append(outcome(call, answers[call.model]))


def test_a_plan_runs_round_by_round_and_selects_the_agreed_answer() -> None:
    plan = CascadePlan(("a", "b", "strong"), k=2)
    state = LoopState(Decision("compact", 0.0))
    first = start_plan(plan, state)
    assert [c.model for c in first.calls] == ["a", "b"] and not first.final
    run_round(state, first, {"a": "The answer is (B).", "b": "B"})
    step = continue_plan(plan, ctx(), state)
    assert isinstance(step, Select) and step.tool_call_id == first.calls[0].id
    assert state.decision.actions == ["a", "b"] and state.decision.propensity == 1.0


def test_disagreement_escalates_with_a_final_call_that_can_stream() -> None:
    plan = CascadePlan(("a", "b", "strong"), k=2)
    state = LoopState(Decision("compact", 0.0))
    run_round(state, start_plan(plan, state), {"a": "A", "b": None})  # b failed
    state.turn = 1
    step = continue_plan(plan, ctx(), state)
    assert isinstance(step, Call) and [c.model for c in step.calls] == ["strong"]
    assert step.final  # the last escalation's answer is the response: streamed through
    assert state.decision.actions == ["a", "b", "strong"]


def test_the_last_turn_makes_the_call_final() -> None:
    plan = CascadePlan(("a", "b", "c", "d", "strong"), k=2)
    state = LoopState(Decision("compact", 0.0))
    run_round(state, start_plan(plan, state), {"a": "A", "b": "B"})
    state.turn = 1
    step = continue_plan(plan, ctx(max_turns=2), state)
    assert isinstance(step, Call) and step.calls[0].model == "c" and step.final


def test_a_budget_refusal_stops_escalation_and_keeps_the_best_answer_in_hand() -> None:
    plan = CascadePlan(("a", "b", "c", "strong"), k=2)
    state = LoopState(Decision("compact", 0.0))
    first = start_plan(plan, state)
    run_round(state, first, {"a": "A", "b": "B"})
    refused = ToolCall(id="x", model="c")
    state.outcomes.append(outcome(refused, None, error_kind="budget"))
    step = continue_plan(plan, ctx(), state)
    # No dearer call: the most capable model that answered (b, later in the order) wins.
    assert isinstance(step, Select) and step.tool_call_id == first.calls[1].id


def test_when_nothing_succeeded_the_last_failure_is_handed_back() -> None:
    plan = CascadePlan(("solo",), k=1)
    state = LoopState(Decision("compact", 0.0))
    first = start_plan(plan, state)
    assert first.final
    run_round(state, first, {"solo": None})
    step = continue_plan(plan, ctx(), state)
    assert isinstance(step, Select) and step.tool_call_id == first.calls[0].id


def test_answers_that_call_the_clients_tools_agree_on_the_calls() -> None:
    def tool_answer(model: str, name: str, args: str) -> CallOutcome:
        call = {"type": "function", "function": {"name": name, "arguments": args}}
        return CallOutcome(
            call=ToolCall(id=f"id-{model}", model=model),
            turn=0,
            ok=True,
            model=model,
            message={"role": "assistant", "content": None, "tool_calls": [call]},
        )

    same_a = tool_answer("a", "get_weather", '{"city": "Paris", "unit": "C"}')
    same_b = tool_answer("b", "get_weather", '{"unit": "C", "city": "Paris"}')
    other = tool_answer("b", "get_weather", '{"city": "Rome", "unit": "C"}')
    assert answer_key(same_a) == answer_key(same_b) != answer_key(other)
    assert answer_key(same_a).startswith("tools:")
    plan = CascadePlan(("a", "b", "strong"), k=2)
    state = LoopState(Decision("compact", 0.0))
    start_plan(plan, state)
    state.outcomes.extend([same_a, same_b])
    step = continue_plan(plan, ctx(), state)
    assert isinstance(step, Select) and step.tool_call_id == "id-a"
    state.outcomes[-1] = other
    escalated = continue_plan(plan, ctx(), state)
    assert isinstance(escalated, Call) and escalated.calls[0].model == "strong"


def test_a_cut_off_answer_agrees_with_none() -> None:
    """Two answers cut off mid-reasoning (``finish_reason: length``) may share a number they
    passed on the way; neither wrote a final answer, so the plan escalates."""
    plan = CascadePlan(("a", "b", "strong"), k=2)
    state = LoopState(Decision("compact", 0.0))
    first = start_plan(plan, state)
    for call, text in zip(first.calls, ("12 * 3 = 36, then", "so 36, so next we"), strict=True):
        o = outcome(call, text)
        o.response = {"choices": [{"message": o.message, "finish_reason": "length"}]}
        state.outcomes.append(o)
    assert answer_key(state.outcomes[0]) == ""
    step = continue_plan(plan, ctx(), state)
    assert isinstance(step, Call) and [c.model for c in step.calls] == ["strong"]


def test_a_fallback_does_not_let_a_model_agree_with_itself() -> None:
    """``a`` failed and its configured fallback ``b`` answered for it, and ``b`` was called
    too: one model's answer twice is no agreement."""
    plan = CascadePlan(("a", "b", "strong"), k=2)
    state = LoopState(Decision("compact", 0.0))
    first = start_plan(plan, state)
    run_round(state, first, {"a": "Paris.", "b": "Paris."})
    state.outcomes[0].model, state.outcomes[0].fallback_from = "b", "a"
    step = continue_plan(plan, ctx(), state)
    assert isinstance(step, Call) and [c.model for c in step.calls] == ["strong"]
