"""The verl trajectory reward scores a trajectory as ``xrouter eval`` would: the table's
exact costs, not the micro-dollars the replay books."""

from __future__ import annotations

from decimal import Decimal

import pytest

from pricing import ModelPrice, load_default_catalog
from router.executors import OutcomeExecutor
from router.loop import Orchestrator
from router.outcomes import OutcomeRecord
from router.policies.baselines import FixedPolicy
from router.policy import RouteContext
from router.pool import ModelPool, PoolModelConfig
from router.reward import RewardConfig, compute_reward
from training.verl.reward import trajectory_reward

CHEAP, DEAR = "cheap", "dear"
RECORD = OutcomeRecord.model_validate(
    {
        "id": "q0",
        "prompt": "2 + 2?",
        # Costs of a few micro-dollars, as the cheap models' are: whole micro-dollars would
        # move them by 10%.
        "outcomes": {
            CHEAP: {"score": 1.0, "cost_usd": 3.3e-06, "response": "4"},
            DEAR: {"score": 1.0, "cost_usd": 4.45e-05, "response": "4"},
        },
    }
)


def pool() -> ModelPool:
    cfgs = [
        PoolModelConfig(
            name=m,
            model=f"openai/{m}",
            api_base="http://127.0.0.1:9/v1",
            price=ModelPrice(input=Decimal(1), output=Decimal(1)),
        )
        for m in (CHEAP, DEAR)
    ]
    return ModelPool.from_configs(cfgs, load_default_catalog())


async def run(model: str) -> object:
    ctx = RouteContext(
        request_id=RECORD.id, messages=[{"role": "user", "content": RECORD.prompt}],
        pool=pool(), cost_weight=1.0,
    )  # fmt: skip
    return await Orchestrator(OutcomeExecutor({RECORD.id: RECORD})).run(FixedPolicy(model), ctx)


async def test_a_call_costs_what_the_table_records() -> None:
    settings = {"form": "additive", "cost_scale": 1e-6}
    terms = trajectory_reward(await run(CHEAP), RECORD, 1.0, settings)  # type: ignore[arg-type]
    assert terms["cost_usd"] == pytest.approx(3.3e-06, rel=1e-9)
    exact = compute_reward(1.0, 3.3e-06, 1.0, RewardConfig(form="additive", cost_scale=1e-6))
    assert terms["score"] == pytest.approx(exact.reward)
    # A single call is the best single call it could have been, not a regret of 0.3.
    assert terms["best_single_call_reward"] == pytest.approx(terms["score"])


async def test_calling_the_reference_model_costs_one_reference() -> None:
    settings = {"form": "gated", "reference_model": DEAR}
    terms = trajectory_reward(await run(DEAR), RECORD, 1.0, settings)  # type: ignore[arg-type]
    assert terms["normalized_cost"] == pytest.approx(1.0)
