"""The reward of a router trajectory on verl: ``router.reward`` (the one reward module) on
the loop's result, as ``xrouter eval`` scores the same trajectory offline.

- Quality ``s``: the recorded score of the model whose answer the loop returned (selected,
  streamed as the last call, or the best one when turns ran out); 0 when the router wrote
  the answer itself, which a table of downstream outcomes cannot grade — so a router
  trained on outcome tables learns to answer through models — or when nothing succeeded.
  What such a trajectory spent (its turns, its failed or unselected calls) is still its cost.
- Cost ``C``: every downstream call's recorded cost (a model called twice is paid twice)
  plus the router's own tokens at the router's price (``xrouter verl-data
  --router-price``; free by default, as a self-hosted router is in the gateway), counted
  from the trajectory's real token ids: each turn reads the whole context so far.

Every term is returned separately; verl logs them per step.
"""

from __future__ import annotations

from typing import Any

from router.outcomes import OutcomeRecord
from router.policy import LoopState
from router.reward import RewardConfig, compute_reward
from router.route_result import RouteResult


def trajectory_reward(
    result: RouteResult | None,
    record: OutcomeRecord,
    cost_weight: float,
    settings: dict[str, Any],
    state: LoopState | None = None,
) -> dict[str, float]:
    """``settings``: the reward's fields (form, K, c_max, cost_scale) and, optionally,
    ``reference_model`` (normalize cost by that model's cost on this prompt). ``result`` is
    None when the trajectory ended with no answer (``NoAnswer``); its ``state`` then still
    holds what the router's turns and calls cost, which is charged as ``xrouter eval``
    charges it: a trajectory of useless turns must not cost less than a cheap answer."""
    if result is not None:
        state = result.state
    settings = dict(settings)
    reference_model = settings.pop("reference_model", None)
    cfg = RewardConfig(**settings)
    ref = record.outcomes.get(reference_model) if reference_model else None
    reference_cost = ref.cost_usd if ref is not None else None

    final = result.final_model if result is not None else None
    score = record.outcomes[final].score if final is not None else 0.0
    downstream = _downstream_cost_usd(state, record)
    router = sum(o.cost_micros for o in state.router_calls) / 1e6 if state is not None else 0.0
    terms = compute_reward(score, downstream + router, cost_weight, cfg, reference_cost)
    # What the best single call would have earned at this λ: the trajectory's regret.
    best = max(
        (
            compute_reward(o.score, o.cost_usd or 0.0, cost_weight, cfg, reference_cost).reward
            for o in record.outcomes.values()
        ),
        default=terms.reward,
    )
    calls = [o for o in state.outcomes if o.ok] if state is not None else []
    return {
        "score": terms.reward,
        "quality": terms.score,
        "cost_usd": terms.cost_usd,
        "router_cost_usd": router,
        "normalized_cost": terms.normalized_cost,
        "penalty": terms.penalty,
        "cost_weight": terms.cost_weight,
        "calls": float(len(calls)),
        "own_answer": 1.0 if result is not None and final is None else 0.0,
        "best_single_call_reward": best,
    }


def _downstream_cost_usd(state: LoopState | None, record: OutcomeRecord) -> float:
    """What the trajectory's calls cost, each at the table's exact ``cost_usd`` (as
    ``xrouter eval`` scores them), not the whole micro-dollars the replay books: at the cheap
    models' costs (a few micro-dollars a prompt) that rounding moved costs by up to 14%."""
    if state is None:
        return 0.0
    total = 0.0
    for o in state.outcomes:
        recorded = record.outcomes.get(o.model or o.call.model)
        if o.ok and recorded is not None and recorded.cost_usd is not None:
            total += recorded.cost_usd
        else:
            total += o.cost_micros / 1e6
    return total
