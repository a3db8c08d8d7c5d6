"""The compact policy with the shipped checkpoint: decisions and propensities, cost
trade-offs on the demo data, pool masking, and fallback through the real orchestration
loop against the replay upstream."""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

from pricing import load_default_catalog
from router.checkpoint import load_checkpoint, packaged_checkpoint_path
from router.checkpoint_pool import CheckpointPoolMismatch
from router.executors import ProviderExecutor
from router.features import FeatureExtractor
from router.loop import Orchestrator, worst_case_micros
from router.outcomes import load_outcome_table
from router.policies.compact import CompactPolicy
from router.policy import Call, Decision, LoopState, RouteContext, ToolCall
from router.pool import ModelPool, PoolModelConfig
from router.providers.client import DownstreamClient
from tests.router.conftest import Downstream
from tests.support.replay import REPO_ROOT

QUESTION = [{"role": "user", "content": "What is the capital of Australia? Answer with one word."}]


@pytest.fixture(scope="module")
def ckpt() -> Any:
    # The packaged policy network (the default packaged checkpoint is a kNN router).
    return load_checkpoint(packaged_checkpoint_path("demo-rl"))


@pytest.fixture(scope="module")
def extractor() -> FeatureExtractor:
    return FeatureExtractor.load()


def demo_pool(names: list[str], base: str = "http://127.0.0.1:9/v1") -> ModelPool:
    cfgs = [
        PoolModelConfig(name=m, model=f"openai/{m}", api_base=base, timeout_s=5, max_retries=0)
        for m in names
    ]
    return ModelPool.from_configs(cfgs, load_default_catalog())


def policy(
    ckpt: Any, extractor: FeatureExtractor, names: list[str] | None = None, **kw: Any
) -> CompactPolicy:
    return CompactPolicy(ckpt, demo_pool(names or ckpt.pool), extractor=extractor, **kw)


def context(
    pool: ModelPool, lam: float = 0.5, messages: list[dict[str, Any]] = QUESTION
) -> RouteContext:
    return RouteContext(request_id="r1", messages=messages, pool=pool, cost_weight=lam)


def new_state(lam: float = 0.5) -> LoopState:
    return LoopState(decision=Decision("compact", lam))


async def test_greedy_step_records_a_deterministic_decision(
    ckpt: Any, extractor: FeatureExtractor
) -> None:
    p = policy(ckpt, extractor)
    state = new_state()
    step = await p.step(context(demo_pool(ckpt.pool)), state)
    assert isinstance(step, Call) and step.final and len(step.calls) == 1
    call = step.calls[0]
    assert call.id.startswith("call_") and call.model in ckpt.pool
    dist = p.distribution(QUESTION, 0.5)
    assert call.model == max(dist, key=lambda m: dist[m])
    d = state.decision
    assert d.actions == [call.model] and d.propensities == [1.0] and not d.explored
    assert d.feature_version == ckpt.feature_version == p.feature_version
    # Greedy behaviour is one-hot; the policy's own softmax goes to the notes.
    assert d.distribution is not None and d.distribution[call.model] == 1.0
    assert sum(d.distribution.values()) == pytest.approx(1.0)
    assert state.notes["compact"]["policy_distribution"] == pytest.approx(dist)
    await p.aclose()


async def test_the_offered_tools_do_not_change_the_decision(
    ckpt: Any, extractor: FeatureExtractor
) -> None:
    # Training never sees tools (outcome tables have none): serving must not feed them in.
    p = policy(ckpt, extractor)
    tools = [
        {"type": "function", "function": {"name": f"tool_{i}", "parameters": {}}} for i in range(5)
    ]
    dists = []
    for offered in (None, tools):
        state = new_state()
        ctx = RouteContext(
            request_id="r1", messages=QUESTION, pool=demo_pool(ckpt.pool), cost_weight=0.5,
            tools=offered,
        )  # fmt: skip
        await p.step(ctx, state)
        dists.append(state.notes["compact"]["policy_distribution"])
    assert dists[0] == dists[1]
    await p.aclose()


def test_exploration_propensities_match_the_behaviour(
    ckpt: Any, extractor: FeatureExtractor
) -> None:
    eps = 0.3
    p = policy(ckpt, extractor, epsilon=eps, seed=7)
    mask = p.mask_for(None)
    probs = p.policy_probs(QUESTION, 0.5, mask)
    greedy = int(np.argmax(probs))
    n = int(mask.sum())
    picks = []
    for _ in range(3000):
        idx, prop, beh, explored = p.choose(probs, mask)
        assert prop == pytest.approx(beh[idx]) and beh.sum() == pytest.approx(1.0)
        assert explored == (idx != greedy)
        picks.append(idx)
    expected = 1 - eps + eps / n
    assert prop == pytest.approx(expected if idx == greedy else eps / n)
    assert np.mean(np.array(picks) == greedy) == pytest.approx(expected, abs=0.03)

    sampler = policy(ckpt, extractor, sample=True, temperature=2.0, seed=3)
    sprobs = sampler.policy_probs(QUESTION, 0.5, mask)
    assert sprobs.max() < probs.max()  # a higher temperature flattens the distribution
    idx, prop, beh, _ = sampler.choose(sprobs, mask)
    assert prop == pytest.approx(sprobs[idx]) and np.allclose(beh, sprobs)


def test_higher_cost_weight_routes_to_cheaper_models(
    ckpt: Any, extractor: FeatureExtractor
) -> None:
    records = load_outcome_table(REPO_ROOT / "router/assets/demo_outcomes.jsonl")
    p = policy(ckpt, extractor)
    x = extractor.extract_batch([r.chat_messages() for r in records])
    mean_cost = []
    for lam in (0.0, 0.3, 1.0, 3.0, 10.0):
        choices = p.route_batch(x, lam)
        mean_cost.append(
            np.mean([r.outcomes[m].cost_usd for r, m in zip(records, choices, strict=True)])
        )
    assert all(b <= a * 1.05 for a, b in itertools.pairwise(mean_cost)), mean_cost
    assert mean_cost[-1] < 0.6 * mean_cost[0], mean_cost


def test_masks_models_outside_the_configured_pool(ckpt: Any, extractor: FeatureExtractor) -> None:
    full = policy(ckpt, extractor)
    best = max(full.distribution(QUESTION, 0.0), key=lambda m: full.distribution(QUESTION, 0.0)[m])
    rest = [m for m in ckpt.pool if m != best]
    sub = policy(ckpt, extractor, rest[:3])
    assert sub.pool_check.masked and best in sub.pool_check.masked
    dist = sub.distribution(QUESTION, 0.0)
    assert set(dist) == set(rest[:3]) and sum(dist.values()) == pytest.approx(1.0)
    # A request's allow-list narrows it further.
    assert set(sub.distribution(QUESTION, 0.0, allowed=rest[:1])) == {rest[0]}
    with pytest.raises(CheckpointPoolMismatch):
        sub.distribution(QUESTION, 0.0, allowed=[best])
    with pytest.raises(CheckpointPoolMismatch, match="no model of the pool is in the checkpoint"):
        CompactPolicy(ckpt, demo_pool(["gpt-4o"]), extractor=extractor)


async def test_a_model_added_since_training_is_only_explored(
    ckpt: Any, extractor: FeatureExtractor
) -> None:
    """A pool model the checkpoint was not trained on: greedy decisions never pick it,
    ε-exploration does, with its true propensity, so logs can teach the next checkpoint."""
    names = [*ckpt.pool[:3], "gpt-4o"]
    pool = demo_pool(names)
    greedy = policy(ckpt, extractor, names)
    assert greedy.pool_check.untrained == ["gpt-4o"]
    assert set(greedy.distribution(QUESTION, 0.0)) == set(ckpt.pool[:3])
    for lam in (0.0, 0.5, 5.0):
        state = new_state(lam)
        step = await greedy.step(context(pool, lam), state)
        assert isinstance(step, Call) and step.calls[0].model in ckpt.pool[:3]
        assert state.decision.propensities == [1.0]

    eps = 0.4
    exploring = policy(ckpt, extractor, names, epsilon=eps, seed=3)
    chosen: list[str] = []
    for _ in range(200):
        state = new_state()
        step = await exploring.step(context(pool), state)
        assert isinstance(step, Call)
        d = state.decision
        model = step.calls[0].model
        chosen.append(model)
        dist = d.distribution
        assert dist is not None and set(dist) == set(names)
        assert sum(dist.values()) == pytest.approx(1.0)
        assert dist["gpt-4o"] == pytest.approx(eps / len(names))
        assert d.propensities == [pytest.approx(dist[model])]
        if model == "gpt-4o":
            assert d.explored  # the checkpoint itself never picks it
    # ε/4 = 10% of 200 draws: 20 expected; 5..40 holds with overwhelming probability.
    assert 5 <= chosen.count("gpt-4o") <= 40
    # A request that allows only the new model: the checkpoint cannot rank it, so the
    # cheapest allowed model (the only one) answers, deterministically.
    for p in (greedy, exploring):
        state = new_state()
        step = await p.step(context(demo_pool(["gpt-4o"])), state)
        assert isinstance(step, Call) and step.calls[0].model == "gpt-4o"
        assert state.decision.propensities == [1.0]
    # A request whose allow-list leaves it out cannot explore it.
    sub = demo_pool(ckpt.pool[:3])
    for _ in range(50):
        step = await exploring.step(context(sub), new_state())
        assert isinstance(step, Call) and step.calls[0].model != "gpt-4o"


class CountingExecutor(ThreadPoolExecutor):
    def __init__(self) -> None:
        super().__init__(max_workers=1, thread_name_prefix="counting")
        self.threads: list[str] = []

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        def run() -> Any:
            self.threads.append(threading.current_thread().name)
            return fn(*args, **kwargs)

        return super().submit(run)


async def test_features_are_computed_off_the_event_loop(
    ckpt: Any, extractor: FeatureExtractor
) -> None:
    ex = CountingExecutor()
    p = policy(ckpt, extractor, executor=ex)
    steps = await asyncio.gather(
        *(p.step(context(demo_pool(ckpt.pool)), new_state()) for _ in range(5))
    )
    assert (
        len(steps) == 5
        and len(ex.threads) == 5
        and all(t.startswith("counting") for t in ex.threads)
    )
    ex.shutdown()


@pytest.fixture
async def orchestrated(
    downstream: Downstream, ckpt: Any, extractor: FeatureExtractor
) -> AsyncIterator[tuple[ModelPool, Orchestrator, CompactPolicy]]:
    downstream.control.delete("/_replay/faults")
    pool = demo_pool(ckpt.pool, downstream.base_url)
    client = DownstreamClient(pool)
    p = CompactPolicy(ckpt, pool, extractor=extractor)
    yield pool, Orchestrator(ProviderExecutor(client)), p
    await p.aclose()
    await client.aclose()
    downstream.control.delete("/_replay/faults")


async def test_routes_through_the_loop_and_falls_back(
    orchestrated: Any, downstream: Downstream
) -> None:
    pool, orch, p = orchestrated
    ctx = context(pool, 0.5)
    result = await orch.run(p, ctx)
    ranking = result.state.notes["compact"]["ranking"]
    assert result.final_model == ranking[0] and result.message and result.message["content"]
    assert result.decision.actions == [ranking[0]] and result.decision.propensity == 1.0

    downstream.fault(ranking[0], "status=500")
    result = await orch.run(p, ctx)
    assert [o.model for o in result.outcomes] == ranking[:2]
    assert not result.outcomes[0].ok and result.outcomes[1].ok
    assert result.final_model == ranking[1]
    assert result.decision.actions == ranking[:2] and result.decision.propensities == [1.0, 1.0]


async def test_budget_refusal_falls_back_to_a_cheaper_model(orchestrated: Any, ckpt: Any) -> None:
    pool, orch, p = orchestrated
    dist = p.distribution(QUESTION, 0.0)
    cheap = "llama-3.2-3b-instruct"
    dear = next(m for m in sorted(dist, key=lambda m: -dist[m]) if m != cheap)
    sub = pool.subset([dear, cheap])
    probe = context(sub, 0.0)
    worst = {m: worst_case_micros(probe, ToolCall(id="x", model=m)) for m in (dear, cheap)}
    assert worst[cheap] < worst[dear]
    ctx = RouteContext(request_id="r2", messages=QUESTION, pool=sub, cost_weight=0.0,
                       max_cost_micros=(worst[cheap] + worst[dear]) // 2)  # fmt: skip
    result = await orch.run(p, ctx)
    assert [o.model for o in result.outcomes] == [dear, cheap]
    assert result.outcomes[0].error_kind == "budget" and result.outcomes[1].ok
    assert result.final_model == cheap and result.decision.actions == [dear, cheap]


def test_a_cost_weight_above_the_trained_range_is_served_as_its_top(
    ckpt: Any, extractor: FeatureExtractor
) -> None:
    """demo-rl was trained on λ up to 10: a higher λ routes as λ = 10 does, never to a
    dearer model through the encoding's extrapolated oscillations."""
    from router.policies.compact import encode_lambda

    spec = ckpt.architecture.lambda_encoding
    assert spec.lambda_max == pytest.approx(10.0)
    assert np.array_equal(encode_lambda(1e4, spec), encode_lambda(10.0, spec))
    assert not np.array_equal(encode_lambda(5.0, spec), encode_lambda(10.0, spec))
    rows = load_outcome_table(REPO_ROOT / "router" / "assets" / "demo_outcomes.jsonl")[:100]
    feats = extractor.extract_texts([r.text for r in rows])
    p = policy(ckpt, extractor)
    assert p.route_batch(feats, 1e4) == p.route_batch(feats, 10.0)
