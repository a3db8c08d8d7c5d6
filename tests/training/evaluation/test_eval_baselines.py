from __future__ import annotations

import itertools

import numpy as np
import pytest

from router.outcomes import OutcomeRecord
from training.datasets.splits import split_records
from training.evaluation.baselines import (
    KNNRouter,
    MFRouter,
    RandomMixRouter,
    SingleModelRouter,
)
from training.evaluation.embedding import HashingTfidfEmbedder
from training.evaluation.metrics import aiq, single_model_range
from training.evaluation.sweep import (
    OutcomeMatrix,
    RoutedPrompt,
    RoutingError,
    evaluate_routes,
    is_full_information,
    restrict_models,
    sweep,
    table_models,
)
from training.evaluation.utility import choose, expected_reward, lambda_grid
from training.reward import RewardConfig, RewardForm, compute_reward


def _record(rid: str, outcomes: dict[str, tuple[float, float]]) -> OutcomeRecord:
    return OutcomeRecord.model_validate(
        {
            "id": rid,
            "prompt": f"prompt {rid}",
            "outcomes": {m: {"score": s, "cost_usd": c} for m, (s, c) in outcomes.items()},
        }
    )


# -- utility: the same arithmetic as training.reward -------------------------------------------


@pytest.mark.parametrize("form", ["gated", "additive"])
def test_expected_reward_matches_compute_reward(form: RewardForm) -> None:
    cfg = RewardConfig(form=form, K=1.0, c_max=0.7, cost_scale=0.002)
    rng = np.random.default_rng(0)
    scores, costs = rng.random(50), rng.random(50) * 0.01
    for lam in (0.0, 0.3, 5.0):
        got = expected_reward(scores, costs, lam, cfg)
        want = [compute_reward(s, c, lam, cfg).reward for s, c in zip(scores, costs, strict=True)]
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_choose_breaks_ties_by_cost() -> None:
    utility = np.array([[0.5, 0.5, 0.1], [0.2, 0.9, 0.9]])
    cost = np.array([[2.0, 1.0, 0.5], [1.0, 3.0, 2.0]])
    assert choose(utility, cost).tolist() == [1, 2]


def test_lambda_grid_spans_from_quality_to_cheapest() -> None:
    grid = lambda_grid(np.array([1e-4, 4e-4, 2e-3]))
    assert grid[0] == 0.0 and all(b > a for a, b in itertools.pairwise(grid))
    assert len(grid) == 41
    assert lambda_grid(np.array([0.0, 0.0])) == [0.0]


# -- sweep machinery --------------------------------------------------------------------------


def test_routed_prompt_sums_costs_and_scores_the_final_model() -> None:
    rec = _record("a", {"x": (0.0, 0.1), "y": (1.0, 0.5)})
    r = RoutedPrompt.from_calls(rec, ["x", "y"], "y")
    assert r.cost_usd == pytest.approx(0.6)
    assert (r.score, r.final_model) == (1.0, "y")
    assert RoutedPrompt.from_calls(rec, ["x", "y"], "x").score == 0.0
    with pytest.raises(RoutingError, match="never called"):
        RoutedPrompt.from_calls(rec, ["x"], "y")
    with pytest.raises(RoutingError, match="no outcome for model 'z'"):
        RoutedPrompt.from_calls(rec, ["z"])


def test_evaluate_routes_mixes_single_and_multi_call_routes() -> None:
    recs = [_record(str(i), {"x": (i % 2, 0.1), "y": (1.0, 0.5)}) for i in range(4)]
    point = evaluate_routes(recs, ["x", ["x", "y"], "y", RoutedPrompt.from_calls(recs[3], ["x"])])
    assert point.cost == pytest.approx((0.1 + 0.6 + 0.5 + 0.1) / 4)
    assert point.score == pytest.approx((0 + 1 + 1 + 1) / 4)
    assert point.shares == {"x": 0.5, "y": 0.5}
    assert point.calls == {"x": 0.75, "y": 0.5}
    fast = evaluate_routes(recs, ["x", "x", "y", "y"])
    assert fast.shares == fast.calls == {"x": 0.5, "y": 0.5}
    with pytest.raises(RoutingError, match="3 routes for 4"):
        evaluate_routes(recs, ["x"] * 3)


def test_table_models_restrict_and_full_information() -> None:
    full = [
        _record("a", {"x": (1, 0.1), "y": (0, 0.2)}),
        _record("b", {"x": (0, 0.1), "y": (1, 0.2)}),
    ]
    assert table_models(full) == ["x", "y"] and is_full_information(full)
    partial = [*full, _record("c", {"x": (1, 0.1)})]
    assert table_models(partial) == ["x"] and not is_full_information(partial)
    sliced = restrict_models(full, ["y"])
    assert [list(r.outcomes) for r in sliced] == [["y"], ["y"]]
    with pytest.raises(RoutingError):
        restrict_models(partial, ["y"])


# -- baselines --------------------------------------------------------------------------------


def test_single_and_random_mix(table_factory) -> None:
    records = table_factory(400, seed=4)
    assert set(SingleModelRouter("mid").route(records, 3.0)) == {"mid"}
    router = RandomMixRouter(seed=1).fit(records)
    assert (router.weak, router.strong) == ("cheap", "strong")
    low, high = router.route(records, 0.3), router.route(records, 0.6)
    assert abs(low.count("strong") / len(records) - 0.3) < 0.06
    # Nested: every prompt sent to the strong model at 30% also goes there at 60%.
    assert all(h == "strong" for lo, h in zip(low, high, strict=True) if lo == "strong")
    assert router.route(records[::-1], 0.3) == low[::-1]  # order-independent
    # On a split's part made with the same seed, the shares are still the shares asked for
    # (its hash once was the split's: the test part lies past 0.8, and every share up to
    # 0.8 sent it nothing).
    test = split_records(records, (0.6, 0.2, 0.2), seed=0).test
    mix = RandomMixRouter(seed=0).fit(records)
    for share in (0.3, 0.5, 0.7):
        sent = mix.route(test, share).count("strong") / len(test)
        assert abs(sent - share) < 0.15, (share, sent)


def _aiqs(router, train, test) -> tuple[float, float]:
    singles = [sweep(SingleModelRouter(m), test).points[0] for m in table_models(test)]
    lo, hi = single_model_range(singles)
    return aiq(sweep(router.fit(train), test).points, lo, hi), aiq(singles, lo, hi)


def test_knn_learns_topic_routing_and_beats_no_routing(table_factory) -> None:
    parts = split_records(table_factory(600, seed=5), (0.6, 0.2, 0.2), seed=0)
    routed, no_routing = _aiqs(KNNRouter(k=15), parts.train, parts.test)
    assert routed > no_routing + 0.03
    # At a moderate cost weight maths goes to the strong model, poems do not.
    router = KNNRouter(k=40).fit(parts.train)
    routes = router.route(parts.test, 0.1)
    strong_share = {
        task: np.mean(
            [m == "strong" for r, m in zip(parts.test, routes, strict=True) if r.task == task]
        )
        for task in ("math", "poem")
    }
    assert strong_share["math"] > 0.8 and strong_share["poem"] < 0.2


def test_knn_uses_a_supplied_embedding(table_factory) -> None:
    records = table_factory(200, seed=6)
    seen: list[int] = []

    def topic_embedding(texts: list[str]) -> np.ndarray:
        seen.append(len(texts))
        return np.array(
            [[1.0, 0.0] if "integral" in t or "matrix" in t else [0.0, 1.0] for t in texts]
        )

    router = KNNRouter(k=5, embed=topic_embedding).fit(records[:100])
    router.route(records[100:], 0.0)
    assert seen == [100, 100]


def test_knn_spends_less_as_the_cost_weight_grows(table_factory) -> None:
    records = table_factory(200, seed=8)
    router = KNNRouter(k=10).fit(records[:150])
    grid = router.default_sweep(records)
    rank = {"cheap": 0, "mid": 1, "strong": 2}
    per_lambda = [[rank[m] for m in router.route(records[150:], lam)] for lam in grid]
    # Per prompt, the chosen model never gets dearer as λ grows...
    for before, after in itertools.pairwise(per_lambda):
        assert all(b >= a for b, a in zip(before, after, strict=True))
    # ... and at the top of the grid everything goes to the cheapest model.
    assert set(per_lambda[-1]) == {0}
    assert max(per_lambda[0]) == 2


def test_mf_beats_no_routing(table_factory) -> None:
    parts = split_records(table_factory(600, seed=9), (0.6, 0.2, 0.2), seed=0)
    routed, no_routing = _aiqs(
        MFRouter(dim=8, epochs=150, lr=0.05, l2=1e-2, embed_dim=256), parts.train, parts.test
    )
    assert routed > no_routing + 0.03


def test_mf_predictions_track_per_model_accuracy(table_factory) -> None:
    records = table_factory(400, seed=10)
    router = MFRouter(dim=8, epochs=150, lr=0.05, l2=1e-2, embed_dim=256).fit(records)
    pred, cost = router.predict(records)
    truth = OutcomeMatrix.from_records(records)
    # The mean prediction per model is close to its training accuracy (the bias terms).
    np.testing.assert_allclose(pred.mean(axis=0), truth.scores.mean(axis=0), atol=0.08)
    np.testing.assert_allclose(cost[0], truth.costs.mean(axis=0))


def test_learned_routers_need_fit(table_factory) -> None:
    with pytest.raises(RoutingError, match="fit"):
        KNNRouter().route(table_factory(4), 0.0)


def test_hashing_embedder_is_deterministic_and_normalized() -> None:
    texts = ["solve the integral", "write a sonnet", ""]
    a = HashingTfidfEmbedder(64).fit(texts)(texts)
    b = HashingTfidfEmbedder(64).fit(texts)(texts)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(np.linalg.norm(a[:2], axis=1), 1.0, rtol=1e-6)
    assert not a[2].any()
    with pytest.raises(RuntimeError):
        HashingTfidfEmbedder(8)(["x"])
