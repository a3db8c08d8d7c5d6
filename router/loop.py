"""The one orchestration loop, shared by the gateway and training rollouts.

The loop asks the policy for a step, runs downstream calls (in parallel, under the
per-request budget), feeds the results back, and stops on an answer, a selection, a final
call or the turn limit. What actually performs a call is an *executor*: the gateway's calls
real providers, training's replays recorded outcomes. Because nothing else differs, a policy
behaves the same in training, evaluation and production (the seed had two diverging copies).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from router.estimate import estimate_prompt_tokens, requested_max_tokens
from router.policy import (
    Answer,
    Call,
    CallOutcome,
    Decision,
    LoopState,
    Policy,
    RouteContext,
    Select,
    ToolCall,
)
from router.providers.base import InFlight
from router.providers.errors import ProviderError
from router.route_result import NoAnswer, RequestTimeout, RouteResult, StreamingCall

log = logging.getLogger(__name__)


class CallExecutor(Protocol):
    """Performs calls. ``in_flight``, when given, is set while the call's request is with an
    upstream (an executor that calls none leaves it alone): a call the request stops
    waiting for is then charged the prompt the upstream read (see ``_abandoned``)."""

    async def execute(
        self, ctx: RouteContext, call: ToolCall, turn: int, in_flight: InFlight | None = None
    ) -> CallOutcome: ...

    async def open_stream(
        self, ctx: RouteContext, call: ToolCall, turn: int, in_flight: InFlight | None = None
    ) -> StreamingCall: ...


class BudgetGuard(Protocol):
    """Reserves worst-case cost before a call and settles it after (the gateway's key
    budgets). ``reserve`` returns None when allowed, else the reason it is refused. The
    router model's own calls (made inside a policy's step) are settled without a hold once
    they return: the budget pays for every call a request makes."""

    async def reserve(self, call: ToolCall, worst_case_micros: int) -> str | None: ...

    async def settle(self, call: ToolCall, reserved_micros: int, actual_micros: int) -> None: ...


def worst_case_micros(ctx: RouteContext, call: ToolCall) -> int:
    """The most ``call`` can cost: its model's, or a configured fallback's the request may
    use if dearer (the provider layer falls back within the same hold)."""
    first = ctx.pool[call.model]
    n = int(ctx.request_params.get("n") or 1)
    prompt = estimate_prompt_tokens(ctx.messages, call.system_prompt, ctx.tools)
    asked = requested_max_tokens(ctx.request_params)
    worst = 0
    for name in (call.model, *first.fallbacks):
        model = ctx.pool.get(name)
        if model is None:
            continue
        # What the call is sent with (``downstream_request``): the router's cap and the
        # client's, the smaller when both are set, within the model's output limit.
        caps = [int(c) for c in (call.max_tokens, asked) if c]
        max_out = min([*caps, model.max_output_tokens])
        worst = max(worst, model.price.worst_case_micros(prompt, max_out * n))
    return worst


def _over_request_cap(
    ctx: RouteContext,
    state: LoopState,
    worst: int,
    what: str,
    reserved: dict[str, int] | None = None,
) -> str | None:
    """Why ``what`` (a call or a router turn) may not start under the request's own
    ``max_cost_usd``: spent so far (router turns included) plus holds plus its worst case."""
    if ctx.max_cost_micros is None:
        return None
    committed = state.spent_micros + (sum(reserved.values()) if reserved else 0)
    if committed + worst <= ctx.max_cost_micros:
        return None
    remaining = max(ctx.max_cost_micros - committed, 0)
    return (
        f"budget exceeded: {what} may cost up to {worst} µUSD and only {remaining} µUSD of "
        "this request's budget remain"
    )


def _refused(call: ToolCall, turn: int, reason: str, role: str = "downstream") -> CallOutcome:
    return CallOutcome(
        call=call,
        turn=turn,
        ok=False,
        role=role,
        model=call.model,
        error=reason,
        error_kind="budget",
    )


def _abandoned(
    call: ToolCall, state: LoopState, started: float, in_flight: InFlight, held: int | None
) -> CallOutcome:
    """A call the request stopped waiting for (its client left, its deadline passed): in
    the row all the same, with how long it ran. Its usage never came. One whose request was
    with an upstream (``in_flight``) is charged its prompt, estimated as a stream's cut
    before its usage is (the upstream read it, and bills it; what it generated is unknown),
    within the call's hold (``held``, when one was taken); one that never reached an
    upstream (waiting for a concurrency slot, between attempts) costs nothing."""
    error, kind = state.abandoned()
    outcome = CallOutcome.failed(call, state.turn, started, error, kind)
    # A call given up on after it left the model asked for (a fallback's attempt in flight,
    # or between them) says why it left, as one a fallback answered does.
    outcome.fallback_reason = in_flight.fallback_reason
    model = in_flight.model
    if model is None:
        return outcome
    usage = in_flight.prompt_usage()
    cost = model.price.cost_micros(usage)
    outcome.model = model.name
    outcome.usage = usage
    outcome.cost_micros = min(cost, held) if held else cost
    outcome.error = f"{error}; usage estimated from the prompt sent"
    outcome.attempts = in_flight.attempts
    outcome.fallback_from = call.model if model.name != call.model else None
    outcome.deployment = in_flight.deployment
    return outcome


def _best_successful(state: LoopState, ctx: RouteContext) -> CallOutcome | None:
    ok = state.successful()
    if not ok:
        return None

    # Price is the only quality signal the loop has without a judge: prefer the answer of
    # the dearest model that answered, the latest on ties.
    def rank(o: CallOutcome) -> tuple[float, int]:
        m = ctx.pool.get(o.model)
        price = float(m.price.input + m.price.output) if m else 0.0
        return (price, o.turn)

    return max(ok, key=rank)


async def _settle_router_calls(
    state: LoopState, charged: int, guard: BudgetGuard, hold: tuple[ToolCall, int] | None
) -> int:
    """Settle the router calls a step made (those after the first ``charged``) with their
    real cost, releasing the step's hold; returns the new count. A step that made no call
    (it failed first) releases its hold with nothing spent."""
    calls = state.router_calls
    for o in calls[charged:]:
        held = 0
        if hold is not None and o.call.id == hold[0].id:
            held, hold = hold[1], None
        if held or o.cost_micros:
            await guard.settle(o.call, held, o.cost_micros)
    if hold is not None:
        await guard.settle(hold[0], hold[1], 0)
    return len(calls)


class Orchestrator:
    """Runs policies over requests. Stateless apart from its collaborators."""

    def __init__(self, executor: CallExecutor) -> None:
        self.executor = executor

    async def _budget_check(
        self,
        ctx: RouteContext,
        state: LoopState,
        call: ToolCall,
        reserved: dict[str, int],
        guard: BudgetGuard | None,
    ) -> str | None:
        if call.model not in ctx.pool:
            return f"unknown model {call.model!r}"
        if ctx.max_cost_micros is None and guard is None:
            reserved[call.id] = 0  # nothing to check against: skip the estimate on the hot path
            return None
        worst = worst_case_micros(ctx, call)
        reason = _over_request_cap(ctx, state, worst, f"calling {call.model}", reserved)
        if reason is not None:
            if not call.max_tokens and requested_max_tokens(ctx.request_params) is None:
                # The usual cause under a small cap: the worst case counts the model's whole
                # output limit, which the client can lower.
                reason += " (its worst case counts the model's whole output limit: set max_tokens)"
            return reason
        if guard is not None:
            reason = await guard.reserve(call, worst)
            if reason is not None:
                return reason
        reserved[call.id] = worst
        return None

    async def _run_call(
        self,
        ctx: RouteContext,
        state: LoopState,
        call: ToolCall,
        reserved: dict[str, int],
        guard: BudgetGuard | None,
    ) -> CallOutcome:
        # Taken over before the first await: a hold still in ``reserved`` belongs to a call
        # that never started (see ``_calls``).
        held = reserved.pop(call.id, None)
        outcome: CallOutcome | None = None
        cut: CallOutcome | None = None
        in_flight = InFlight()
        started = time.perf_counter()
        try:
            outcome = await self.executor.execute(ctx, call, state.turn, in_flight)
            return outcome
        except asyncio.CancelledError:
            if outcome is None:
                cut = _abandoned(call, state, started, in_flight, held)
                state.outcomes.append(cut)
            raise
        finally:
            # Settle even when cancelled (client gone): the hold must never outlive the call.
            # A call cut off is settled at what its row says it cost (see ``_abandoned``).
            if held is not None and guard is not None:
                ended = outcome if outcome is not None else cut
                actual = ended.cost_micros if ended is not None else 0
                try:
                    await guard.settle(call, held, actual)
                except asyncio.CancelledError:
                    # The request ended while the hold was settled (the settle runs on to
                    # completion, shielded): the call answered and its cost is on the key's
                    # budget, so it goes in the row, which would otherwise lose that cost.
                    if outcome is not None:
                        state.outcomes.append(outcome)
                    raise

    async def _calls(
        self,
        ctx: RouteContext,
        state: LoopState,
        calls: tuple[ToolCall, ...],
        guard: BudgetGuard | None,
    ) -> list[CallOutcome]:
        reserved: dict[str, int] = {}
        runnable: list[ToolCall] = []
        outcomes: dict[int, CallOutcome] = {}
        seen = {o.call.id for o in state.outcomes}
        # Reservations are taken one by one, before any call starts, so parallel calls of
        # one turn can't jointly overrun the budget. If taking them fails (the limit store,
        # a timeout), the holds already taken are released before the error goes on.
        try:
            for i, call in enumerate(calls):
                # Holds, settles and selections are keyed by the call's id: a second call with
                # one (a router model that reuses ids) would be settled as the first.
                reason = (
                    f"duplicate tool call id {call.id!r}"
                    if call.id in seen
                    else await self._budget_check(ctx, state, call, reserved, guard)
                )
                seen.add(call.id)
                if reason is None:
                    runnable.append(call)
                else:
                    outcomes[i] = _refused(call, state.turn, reason)
        except BaseException:
            await self._release(calls, reserved, guard)
            raise
        running = [
            asyncio.ensure_future(self._run_call(ctx, state, c, reserved, guard)) for c in runnable
        ]
        try:
            results = await asyncio.gather(*running)
        except asyncio.CancelledError:
            # The request ended with calls of this turn in flight. Those that had already
            # answered are settled (their cost is on the key's budget): they go in the row,
            # which the gather's cancellation would otherwise lose with their results. (A
            # call cancelled in its settle recorded itself, and counts as cancelled here.)
            state.outcomes.extend(
                t.result() for t in running if t.done() and not t.cancelled() and not t.exception()
            )
            # And a coroutine cancelled before its first step runs no `finally`: the holds
            # of the calls that never started are released here. Once the gather is
            # cancelled every call has ended, so what is left in ``reserved`` is theirs.
            await self._release(calls, reserved, guard)
            raise
        ran = iter(results)
        return [outcomes[i] if i in outcomes else next(ran) for i in range(len(calls))]

    @staticmethod
    async def _release(
        calls: tuple[ToolCall, ...], reserved: dict[str, int], guard: BudgetGuard | None
    ) -> None:
        if guard is None:
            return
        for call in calls:
            held = reserved.pop(call.id, None)
            if held:
                await guard.settle(call, held, 0)

    async def run(
        self,
        policy: Policy,
        ctx: RouteContext,
        *,
        stream: bool = False,
        guard: BudgetGuard | None = None,
        timeout_s: float | None = None,
        state: LoopState | None = None,
    ) -> RouteResult:
        """Run ``policy`` on one request. With ``stream``, a final single call is opened as a
        stream and returned un-consumed in ``RouteResult.stream``. ``guard`` reserves and
        settles each call against the caller's budgets (e.g. an API key's). ``timeout_s``
        bounds the whole run (``RequestTimeout``); an opened stream is the caller's to bound.
        ``state`` (from ``new_state``) lets the caller keep what the run did however it ends,
        cancelled included."""
        if state is None:
            state = self.new_state(policy, ctx)
        if timeout_s is None:
            return await self._run(policy, ctx, state, stream, guard)
        try:
            async with asyncio.timeout(timeout_s) as state.deadline:
                return await self._run(policy, ctx, state, stream, guard)
        except TimeoutError:
            raise RequestTimeout(timeout_s, state) from None
        finally:
            # Past the routing the deadline is the caller's (an opened stream's).
            state.deadline = None

    @staticmethod
    def new_state(policy: Policy, ctx: RouteContext) -> LoopState:
        return LoopState(decision=Decision(policy.name, ctx.cost_weight, policy.feature_version))

    async def _run(
        self,
        policy: Policy,
        ctx: RouteContext,
        state: LoopState,
        stream: bool,
        guard: BudgetGuard | None,
    ) -> RouteResult:
        charged = 0  # router calls already settled with the guard
        for turn in range(ctx.max_turns):
            state.turn = turn
            hold: tuple[ToolCall, int] | None = None
            budgeted = guard is not None or ctx.max_cost_micros is not None
            if budgeted and (planned := policy.router_call(ctx, state)) is not None:
                call, worst = planned
                reason = _over_request_cap(ctx, state, worst, "the router's next turn")
                if reason is None and guard is not None:
                    reason = await guard.reserve(call, worst)
                    if reason is None:
                        hold = (call, worst)
                if reason is not None:
                    # The router may not think further on this budget: the best answer so
                    # far, or the refusal (a 429 for the gateway's key budgets).
                    state.router_calls.append(_refused(call, turn, reason, role="router"))
                    charged = len(state.router_calls)
                    break
            try:
                step = await policy.step(ctx, state)
            finally:
                if guard is not None:
                    charged = await _settle_router_calls(state, charged, guard, hold)
            if isinstance(step, Answer):
                message: dict[str, Any] = {"role": "assistant", "content": step.text}
                if step.refusal:
                    message.update(content=step.text or None, refusal=step.refusal)
                return RouteResult(
                    state,
                    message=message,
                    finish_reason=step.finish_reason,
                    extras={"synthesized": step.synthesized},
                )
            if isinstance(step, Select):
                chosen = state.outcome(step.tool_call_id)
                if chosen is not None and chosen.ok:
                    return self._from_outcome(state, chosen)
                # The policy is told on its next step (the llm policy turns it into a tool error).
                state.notes.setdefault("select_errors", []).append(step.tool_call_id)
                continue
            assert isinstance(step, Call)
            if stream and step.final and len(step.calls) == 1:
                streamed = await self._stream_final(ctx, state, step.calls[0], guard)
                if streamed is not None:
                    return streamed
                continue
            outcomes = await self._calls(ctx, state, step.calls, guard)
            for o in outcomes:
                state.outcomes.append(o)
                state.spent_micros += o.cost_micros
            if step.final and len(outcomes) == 1 and outcomes[0].ok:
                return self._from_outcome(state, outcomes[0])
        best = _best_successful(state, ctx)
        if best is None:
            raise NoAnswer("no downstream call succeeded and the router gave no answer", state)
        result = self._from_outcome(state, best)
        result.fallback_used = True
        return result

    async def _stream_final(
        self, ctx: RouteContext, state: LoopState, call: ToolCall, guard: BudgetGuard | None
    ) -> RouteResult | None:
        reserved: dict[str, int] = {}
        if any(o.call.id == call.id for o in state.outcomes):
            reason: str | None = f"duplicate tool call id {call.id!r}"
        else:
            reason = await self._budget_check(ctx, state, call, reserved, guard)
        if reason is not None:
            state.outcomes.append(_refused(call, state.turn, reason))
            return None
        started = time.perf_counter()
        in_flight = InFlight()
        try:
            sc = await self.executor.open_stream(ctx, call, state.turn, in_flight)
        except BaseException as exc:
            # Also when cancelled (the request timed out, the client left): the hold must
            # never outlive the call. One cut off while its upstream had the request is
            # settled at its prompt's estimate, as its row says (see ``_abandoned``).
            held = reserved.pop(call.id)
            actual = 0
            if isinstance(exc, asyncio.CancelledError):
                cut = _abandoned(call, state, started, in_flight, held)
                state.outcomes.append(cut)
                actual = cut.cost_micros
            if guard is not None:
                await guard.settle(call, held, actual)
            if not isinstance(exc, ProviderError):
                raise
            # A failed call, as ``execute`` reports one: in the state (so the ledger row has
            # it), and the policy's to answer on its next step (another model, or no answer).
            state.outcomes.append(CallOutcome.provider_failed(call, state.turn, started, exc))
            return None
        held = reserved.pop(call.id)
        # The model the stream comes from: a fallback's, when the one called failed before
        # its first chunk (the client's header and every chunk name it).
        result = RouteResult(state, final_model=sc.model)
        finished = False

        async def finish() -> None:
            # Once, however the stream ends: read to the end, failed, left early (the client
            # went away, the deadline passed) or closed before it was read at all. The
            # upstream response and the model's concurrency slot are given back now, not
            # when the garbage collector finds the abandoned stream, and the call is
            # recorded and its hold settled even if closing it is cancelled.
            nonlocal finished
            if finished:
                return
            finished = True
            try:
                await sc.aclose()
            finally:
                outcome = sc.finish()
                state.outcomes.append(outcome)
                state.spent_micros += outcome.cost_micros
                result.final_model = outcome.model
                result.response = outcome.response
                if guard is not None:
                    await guard.settle(call, held, outcome.cost_micros)

        async def relay() -> AsyncGenerator[dict[str, Any], None]:
            try:
                async for chunk in sc.chunks:
                    yield chunk
            finally:
                await finish()

        result.stream = _Relay(relay(), sc, finish)
        return result

    @staticmethod
    def _from_outcome(state: LoopState, o: CallOutcome) -> RouteResult:
        finish = "stop"
        if o.response:
            choices = o.response.get("choices") or [{}]
            finish = choices[0].get("finish_reason") or "stop"
        return RouteResult(
            state, message=o.message, response=o.response, final_model=o.model, finish_reason=finish
        )


@dataclass(slots=True)
class _Relay:
    """A final call's stream as the loop hands it over: its chunks, relayed, and ``aclose``,
    which ends the call (closes the upstream, records the outcome, settles the hold)
    whether or not the chunks were read; an async generator that never started runs no
    ``finally``."""

    chunks: AsyncGenerator[dict[str, Any], None]
    inner: StreamingCall
    _end: Callable[[], Awaitable[None]]

    @property
    def model(self) -> str:
        return self.inner.model

    def finish(self) -> CallOutcome:
        return self.inner.finish()

    async def aclose(self) -> None:
        await self.chunks.aclose()
        await self._end()
