"""Multi-call plans: call cheap models first and escalate until their answers agree.

This is the xRouter idea in its measurable form. A :class:`CascadePlan` names an order of
models (cheapest first), how many of them are called together at first (``k``) and how many
answers must agree (``quorum``). After each round of calls :meth:`CascadePlan.advance`
either accepts an answer — the cheapest called model whose final answer
(``router.answers.normalize_answer``: the same final answer, not the same wording) is shared
by ``quorum`` called models — or names the next model to call. A model called alone after
the first round because the others disagreed and nothing is left after it (the strong
fallback, typically) has the final answer, whatever it says: so the gateway can stream it
straight through, and a plan needs one turn per round, none to pick an answer afterwards.
When the first round was the whole order and it disagrees, the last model's answer is
final.

The one definition serves both sides: the offline evaluation replays it on recorded
responses (``training.evaluation.cascade``) and the gateway runs it on live answers
(``router.policies.planned``, through :func:`start_plan` and :func:`continue_plan`), so a
plan is served exactly as it was measured.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from router.answers import normalize_answer
from router.policy import Call, CallOutcome, LoopState, RouteContext, Select, Step, ToolCall


@dataclass(frozen=True, slots=True)
class Accept:
    """The answer of ``model`` (already called) is final."""

    model: str


@dataclass(frozen=True, slots=True)
class Escalate:
    """Call ``model`` (the next one of the order) and decide again."""

    model: str


PlanStep = Accept | Escalate


@dataclass(frozen=True, slots=True)
class CascadePlan:
    order: tuple[str, ...]
    k: int = 2
    quorum: int = 2

    def __post_init__(self) -> None:
        if not self.order:
            raise ValueError("a plan needs at least one model")
        if len(set(self.order)) != len(self.order):
            raise ValueError(f"plan order repeats a model: {list(self.order)}")
        if not 1 <= self.k <= len(self.order):
            raise ValueError(f"k must be between 1 and {len(self.order)}, got {self.k}")
        if self.quorum < 2:
            raise ValueError("quorum must be at least 2 (answers that must agree)")

    @property
    def name(self) -> str:
        suffix = f"@{self.k}" + (f"q{self.quorum}" if self.quorum != 2 else "")
        return f"cascade:{'>'.join(self.order)}{suffix}"

    @property
    def rounds(self) -> int:
        """Rounds of calls when every round disagrees: the first, then one per model."""
        return 1 + len(self.order) - self.k

    def is_last(self, model: str) -> bool:
        """Whether ``model``, called after the first round, has the final answer."""
        return model == self.order[-1] and len(self.order) > self.k

    @property
    def first(self) -> tuple[str, ...]:
        """The models called together in the first round."""
        return self.order[: self.k]

    def agreed(self, called: Sequence[str], answers: Mapping[str, str]) -> str | None:
        """The cheapest called model whose non-empty normalized answer is shared by
        ``quorum`` of the called models, if any. ``called`` is in plan order; a model
        missing from ``answers`` or with an empty answer (a failed call) agrees with none."""
        votes: dict[str, list[str]] = {}
        for m in called:
            answer = answers.get(m, "")
            if answer:
                votes.setdefault(answer, []).append(m)
        # Groups list their members in plan (cost) order, so a group's first is its cheapest.
        agreeing = [group[0] for group in votes.values() if len(group) >= self.quorum]
        return min(agreeing, key=called.index) if agreeing else None

    def advance(self, called: Sequence[str], answers: Mapping[str, str]) -> PlanStep:
        """What to do once ``called`` (a prefix of the order, at least the first round) have
        answered: accept the agreed answer, call the next model, or — the order exhausted —
        accept the last model's answer."""
        n = len(called)
        if n < self.k or tuple(called) != self.order[:n]:
            raise ValueError(f"{list(called)} is not a called prefix of {self.name}")
        if n == len(self.order) and n > self.k:
            return Accept(self.order[-1])  # the last escalation: see the module docstring
        agreed = self.agreed(called, answers)
        if agreed is not None:
            return Accept(agreed)
        if n == len(self.order):
            return Accept(self.order[-1])
        return Escalate(self.order[n])


# -- running a plan inside the orchestration loop -------------------------------------


def _call(model: str) -> ToolCall:
    return ToolCall(id=f"call_{uuid.uuid4().hex[:24]}", model=model)


def start_plan(plan: CascadePlan, state: LoopState) -> Call:
    """The first round of ``plan``: its first ``k`` models in parallel. A one-model plan's
    call is final, so the gateway streams it straight through."""
    for m in plan.first:
        state.decision.record(m, 1.0)
    return Call(tuple(_call(m) for m in plan.first), final=len(plan.order) == 1)


def answer_key(outcome: CallOutcome) -> str:
    """What two answers must share to agree: the normalized final answer of the text, or,
    for an answer that calls the client's tools, the calls themselves (function names and
    arguments, key order ignored). A failed call's key is empty: it agrees with none; so is
    a cut-off one's (``finish_reason: length``: its final answer was never written, and a
    number it had reached on the way is not one)."""
    if not outcome.ok:
        return ""
    choice = ((outcome.response or {}).get("choices") or [{}])[0]
    if isinstance(choice, dict) and choice.get("finish_reason") == "length":
        return ""
    calls = (outcome.message or {}).get("tool_calls") or []
    if calls:
        canon = []
        for c in calls:
            fn = (c or {}).get("function") or {}
            try:
                args = json.loads(fn.get("arguments") or "{}")
            except (TypeError, ValueError):
                args = fn.get("arguments")
            canon.append([fn.get("name"), args])
        return "tools:" + json.dumps(canon, sort_keys=True, separators=(",", ":"))
    return normalize_answer(outcome.text)


def continue_plan(plan: CascadePlan, ctx: RouteContext, state: LoopState) -> Step:
    """The next step of ``plan`` given the calls made so far: select the agreed answer, or
    call the next model. A failed call counts as an answer that agrees with none; a call
    refused by the budget stops escalation (a dearer model would be refused too)."""
    by_model: dict[str, CallOutcome] = {}
    for o in state.outcomes:
        by_model[o.call.model] = o  # a retried model: its latest outcome
    called = [m for m in plan.order if m in by_model]
    answers: dict[str, str] = {}
    answered_by: set[str] = set()
    for m in called:
        o = by_model[m]
        # One model's answer counts once: a call a configured fallback answered for a model
        # that is also in the plan must not agree with that model's own answer.
        who = o.model or m
        answers[m] = answer_key(o) if who not in answered_by else ""
        answered_by.add(who)
    step = plan.advance(called, answers)
    refused = any(o.error_kind == "budget" for o in state.outcomes)
    if not isinstance(step, Accept) and not refused:
        state.decision.record(step.model, 1.0)
        # The last turn's call must be final: there is no turn left to select an answer.
        final = plan.is_last(step.model) or state.turn >= ctx.max_turns - 1
        return Call((_call(step.model),), final=final)
    chosen = by_model.get(step.model) if isinstance(step, Accept) else None
    if chosen is not None and chosen.ok:
        return Select(chosen.call.id)
    # The accepted answer failed (or escalation stopped): the best answer in hand is the
    # latest successful one in plan order, the most capable model that answered.
    for m in reversed(called):
        if by_model[m].ok:
            return Select(by_model[m].call.id)
    if not state.outcomes:
        raise RuntimeError("plan: no call outcome to select from")
    # Nothing succeeded: hand back the last failure so the loop reports its error.
    return Select(state.outcomes[-1].call.id)
