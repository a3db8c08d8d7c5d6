"""Baseline policies, run through the same loop as the learned ones: for evaluation, for
fallback routing, and as cheap production options."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Literal

from router.plans import CascadePlan, continue_plan, start_plan
from router.policy import Call, LoopState, Policy, RouteContext, Select, Step, ToolCall
from router.pool import ModelPool


def _by_price(pool: ModelPool) -> list[str]:
    return [m.name for m in sorted(pool, key=lambda m: (m.price.input + m.price.output, m.name))]


class _SingleCall(Policy):
    """Calls one model chosen by ``choose``; on failure tries the remaining models in
    price order so a request is not lost to one bad upstream."""

    def choose(self, ctx: RouteContext) -> tuple[str, float, dict[str, float] | None]:
        raise NotImplementedError

    async def step(self, ctx: RouteContext, state: LoopState) -> Step:
        if state.turn == 0:
            model, p, dist = self.choose(ctx)
            state.decision.record(model, p, dist)
            return Call((ToolCall(id="call_0", model=model),), final=True)
        ok = state.successful()
        if ok:
            return Select(ok[-1].call.id)
        tried = {o.call.model for o in state.outcomes}
        for name in _by_price(ctx.pool):
            if name not in tried:
                state.decision.record(name, 1.0)
                return Call((ToolCall(id=f"call_{state.turn}", model=name),), final=True)
        return Call(())


class FixedPolicy(Policy):
    """Calls exactly one model, with the fallbacks its pool entry configures (which the
    client applies), as a pass-through does: never another model standing in for it, so
    what is reported under this policy's name — its answers, costs and failures — is that
    model's. A model the request may not use is no answer (the gateway refuses such a
    request before routing it)."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.name = f"fixed:{model}"

    async def step(self, ctx: RouteContext, state: LoopState) -> Step:
        if state.turn == 0 and self.model in ctx.pool:
            state.decision.record(self.model, 1.0)
            return Call((ToolCall(id="call_0", model=self.model),), final=True)
        ok = state.successful()
        return Select(ok[0].call.id) if ok else Call(())


class CheapestPolicy(_SingleCall):
    name = "cheapest"

    def choose(self, ctx: RouteContext) -> tuple[str, float, dict[str, float] | None]:
        return _by_price(ctx.pool)[0], 1.0, None


class RandomPolicy(_SingleCall):
    """Uniform over the allowed pool; the propensity is exact (1/|pool|)."""

    name = "random"

    def __init__(self, seed: int | None = None) -> None:
        self._rng = random.Random(seed)

    def choose(self, ctx: RouteContext) -> tuple[str, float, dict[str, float] | None]:
        names = ctx.pool.names
        p = 1.0 / len(names)
        return self._rng.choice(names), p, dict.fromkeys(names, p)


class CascadePolicy(Policy):
    """Cheap models first; escalate only when the cheap answer fails a check.

    - ``nonempty``: accept the cheapest model's answer unless it failed, is empty or was cut
      off (finish_reason "length");
    - ``agreement`` (the xRouter idea, measurable offline on recorded responses): call the
      two cheapest models in parallel and accept when their final answers agree, else call
      the next model up, and so on; the last model's answer is final.
    """

    name = "cascade"

    def __init__(
        self, order: Sequence[str] = (), check: Literal["nonempty", "agreement"] = "agreement"
    ) -> None:
        self.order = list(order)
        self.check = check

    def _order(self, ctx: RouteContext) -> list[str]:
        base = [m for m in self.order if m in ctx.pool] or _by_price(ctx.pool)
        return base

    async def step(self, ctx: RouteContext, state: LoopState) -> Step:
        order = self._order(ctx)
        if self.check == "agreement":
            # The same plan semantics as a cascade checkpoint's and the offline evaluation's.
            plan = CascadePlan(tuple(order), k=min(2, len(order)))
            if state.turn == 0:
                return start_plan(plan, state)
            return continue_plan(plan, ctx, state)
        tried = [o.call.model for o in state.outcomes]
        ok = [o for o in state.outcomes if o.ok and o.text.strip()]
        if state.turn > 0:
            last = state.outcomes[-1]
            finish = ((last.response or {}).get("choices") or [{}])[0].get("finish_reason")
            if last.ok and last.text.strip() and finish != "length":
                return Select(last.call.id)
        remaining = [m for m in order if m not in tried]
        if not remaining:
            return Select(ok[-1].call.id) if ok else Call(())
        state.decision.record(remaining[0], 1.0)
        return Call(
            (ToolCall(id=f"call_{state.turn}_0", model=remaining[0]),),
            final=len(remaining) == 1,
        )
