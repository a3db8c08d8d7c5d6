from __future__ import annotations

import math

import pytest

from training.evaluation.baselines import OracleRouter, RandomMixRouter
from training.evaluation.metrics import (
    CurvePoint,
    aiq,
    apgr,
    best_single,
    cost_to_reach,
    cpt,
    curve_value,
    frontier,
    pgr,
    single_model_range,
)
from training.evaluation.sweep import OutcomeMatrix, sweep


def P(cost: float, score: float) -> CurvePoint:
    return CurvePoint(cost, score)


def coords(points: list[CurvePoint]) -> list[tuple[float, float]]:
    return [(p.cost, p.score) for p in points]


# -- hull ------------------------------------------------------------------------------------


def test_frontier_drops_points_below_chords_and_the_decreasing_tail() -> None:
    points = [P(1, 0.5), P(2, 0.55), P(3, 0.9), P(4, 0.8), P(2.5, 0.3), P(5, 0.9)]
    # (2, 0.55) lies below the chord (1, .5)-(3, .9) (which passes 0.7 at cost 2);
    # (4, .8) and (5, .9) are after the best point (the curve must not decrease or stay flat).
    assert coords(frontier(points)) == [(1, 0.5), (3, 0.9)]


def test_frontier_keeps_concave_points_and_best_at_equal_cost() -> None:
    points = [P(1, 0.5), P(1, 0.6), P(2, 0.8), P(4, 0.9)]
    assert coords(frontier(points)) == [(1, 0.6), (2, 0.8), (4, 0.9)]


def test_frontier_keeps_the_best_of_costs_equal_up_to_rounding() -> None:
    """0.1 + 0.2 sorts after 0.3 and was dropped as the same cost, better score or not: the
    hull lost its 0.9 point, AIQ over [0, 1] was 0.6125 instead of 0.8125."""
    points = [P(0.1 + 0.2, 0.9), P(0.3, 0.5), P(0, 0.2), P(1, 0.95)]
    assert coords(frontier(points)) == [(0, 0.2), (0.1 + 0.2, 0.9), (1, 0.95)]
    assert aiq(points, 0.0, 1.0) == pytest.approx(0.8125)
    assert cost_to_reach(points, 0.9) == pytest.approx(0.3)


def test_frontier_of_a_cheap_best_point_is_that_point() -> None:
    assert coords(frontier([P(1, 0.9), P(2, 0.5), P(3, 0.7)])) == [(1, 0.9)]
    assert frontier([]) == []


def test_curve_value_is_zero_left_flat_right_linear_inside() -> None:
    hull = frontier([P(1, 0.5), P(3, 0.9)])
    assert curve_value(hull, 0.5) == 0.0
    assert curve_value(hull, 2) == pytest.approx(0.7)
    assert curve_value(hull, 10) == pytest.approx(0.9)


# -- AIQ -------------------------------------------------------------------------------------


def test_aiq_single_point_inside_the_range() -> None:
    # Zero on [0, 1), then 0.8 on [1, 4]: area 0.8 * 3 over a width of 4.
    assert aiq([P(1, 0.8)], 0, 4) == pytest.approx(0.8 * 3 / 4)


def test_aiq_single_point_at_the_cheap_end_is_its_score() -> None:
    assert aiq([P(1, 0.8)], 1, 4) == pytest.approx(0.8)


def test_aiq_single_point_right_of_the_range_is_zero() -> None:
    assert aiq([P(5, 0.8)], 1, 4) == 0.0


def test_aiq_two_points_is_the_trapezoid() -> None:
    assert aiq([P(1, 0.6), P(3, 0.9)], 1, 3) == pytest.approx((0.6 + 0.9) / 2)
    # Half the range is the chord, the other half flat at 0.9.
    assert aiq([P(1, 0.6), P(3, 0.9)], 1, 5) == pytest.approx((0.75 * 2 + 0.9 * 2) / 4)


def test_aiq_ignores_dominated_points() -> None:
    base = aiq([P(1, 0.6), P(3, 0.9)], 1, 3)
    assert aiq([P(1, 0.6), P(3, 0.9), P(2, 0.7), P(2.5, 0.1)], 1, 3) == pytest.approx(base)


def test_aiq_degenerate_range_is_the_value_there() -> None:
    assert aiq([P(1, 0.6), P(3, 0.9)], 2, 2) == pytest.approx(0.75)
    assert aiq([P(1, 0.6)], 0.5, 0.5) == 0.0


def test_aiq_rejects_an_inverted_range() -> None:
    with pytest.raises(ValueError):
        aiq([P(1, 0.5)], 2, 1)


def test_no_routing_range_and_best_single() -> None:
    singles = {"a": P(1, 0.6), "b": P(3, 0.9), "c": P(2, 0.9)}
    assert single_model_range(singles.values()) == (1, 3)
    assert best_single(singles)[0] == "c"  # same score, cheaper


# -- cost to reach ---------------------------------------------------------------------------


def test_cost_to_reach_interpolates_along_the_hull() -> None:
    points = [P(1, 0.6), P(3, 0.9)]
    assert cost_to_reach(points, 0.75) == pytest.approx(2.0)
    assert cost_to_reach(points, 0.9) == pytest.approx(3.0)
    assert cost_to_reach(points, 0.5) == pytest.approx(1.0)
    assert cost_to_reach(points, 0.95) is None


# -- PGR, APGR, CPT --------------------------------------------------------------------------


def test_pgr_and_its_errors() -> None:
    assert pgr(0.7, 0.6, 0.8) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        pgr(0.7, 0.8, 0.8)


def test_apgr_of_the_diagonal_and_of_a_perfect_router() -> None:
    diagonal = [(x / 10, 0.6 + 0.2 * x / 10) for x in range(11)]
    assert apgr(diagonal, 0.6, 0.8) == pytest.approx(0.5)
    # Full recovery with 20% strong calls: 0.2 * 1 / 2 + 0.8 * 1 = 0.9.
    assert apgr([(0.2, 0.8)], 0.6, 0.8) == pytest.approx(0.9)
    assert cpt([(0.2, 0.8)], 0.6, 0.8, 0.5) == pytest.approx(0.1)
    assert cpt(diagonal, 0.6, 0.8, 0.8) == pytest.approx(0.8)


def test_apgr_rejects_negative_shares() -> None:
    for share in (-0.5, math.nan):
        with pytest.raises(ValueError, match="negative"):
            apgr([(share, 0.7)], 0.6, 0.8)


def test_a_router_calling_the_strong_model_twice_a_prompt_sits_at_share_one() -> None:
    """A multi-call router that asks the strong model twice on every prompt made the whole
    evaluation fail (`share of strong calls 2.0 is outside [0, 1]`), every router's AIQ
    lost with it; the bootstrap already clipped the share to 1, where always-strong is."""
    # Averaged with the (1, 1) end point, PGR 0.5 at share 1: the trapezoid from (0, 0).
    assert apgr([(2.0, 0.6)], 0.6, 0.8) == pytest.approx(apgr([(1.0, 0.6)], 0.6, 0.8))
    assert apgr([(2.0, 0.6)], 0.6, 0.8) == pytest.approx(0.25)
    assert cpt([(1.5, 0.8)], 0.6, 0.8, 0.8) == pytest.approx(0.8)


def test_random_router_apgr_is_one_half(table_factory) -> None:
    # Two models, 20,000 prompts: the random mix's PGR tracks its share of strong calls.
    models = {"cheap": 1e-4, "strong": 2e-3}
    records = table_factory(20_000, seed=7, models=models)
    m = OutcomeMatrix.from_records(records)
    q = dict(zip(m.models, m.scores.mean(axis=0), strict=True))
    router = RandomMixRouter("cheap", "strong", seed=3)
    points = sweep(router, records).points
    pairs = [(p.calls.get("strong", 0.0), p.score) for p in points]
    assert apgr(pairs, q["cheap"], q["strong"]) == pytest.approx(0.5, abs=0.01)
    # Its 50% call-performance threshold is about half the calls.
    assert cpt(pairs, q["cheap"], q["strong"], 0.5) == pytest.approx(0.5, abs=0.03)


# -- oracle edge cases -----------------------------------------------------------------------


def test_oracle_picks_the_cheapest_model_with_the_top_score(table_factory) -> None:
    records = table_factory(200, seed=1)
    routes = OracleRouter().route(records, 0.0)
    for r, chosen in zip(records, routes, strict=True):
        top = max(o.score for o in r.outcomes.values())
        assert r.outcomes[chosen].score == top
        cheaper_tops = [
            m
            for m, o in r.outcomes.items()
            if o.score == top and o.cost_usd < r.outcomes[chosen].cost_usd
        ]
        assert cheaper_tops == []


def test_oracle_when_every_model_fails_takes_the_cheapest(table_factory) -> None:
    records = [
        r.model_copy(
            update={
                "outcomes": {m: o.model_copy(update={"score": 0.0}) for m, o in r.outcomes.items()}
            }
        )
        for r in table_factory(20, seed=2)
    ]
    routes = OracleRouter().route(records, 0.0)
    for r, chosen in zip(records, routes, strict=True):
        assert chosen == min(r.outcomes, key=lambda m: r.outcomes[m].cost_usd)


def test_oracle_curve_dominates_every_single_model(table_factory) -> None:
    records = table_factory(300, seed=3)
    oracle = sweep(OracleRouter(), records).points
    m = OutcomeMatrix.from_records(records)
    best_per_prompt = m.scores.max(axis=1).mean()
    assert max(p.score for p in oracle) == pytest.approx(best_per_prompt)
    for j in range(len(m.models)):
        reach = cost_to_reach(oracle, m.scores[:, j].mean())
        assert reach is not None and reach <= m.costs[:, j].mean() + 1e-12
    assert not math.isnan(aiq(oracle, m.costs.mean(axis=0).min(), m.costs.mean(axis=0).max()))
