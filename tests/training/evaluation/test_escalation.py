from __future__ import annotations

import itertools

import numpy as np
import pytest

from router.outcomes import OutcomeRecord
from training.evaluation.escalation import EscalationRouter, best_under_budget
from training.evaluation.sweep import RoutingError, sweep

from .conftest import TableFactory

COST = {"a": 1e-4, "b": 1.5e-4, "s": 3e-3}
LETTERS = "ABCD"


def record(rid: str, answers: dict[str, str], right: str, task: str = "quiz") -> OutcomeRecord:
    return OutcomeRecord.model_validate(
        {
            "id": rid,
            "task": task,
            "prompt": f"Pick one letter. question {rid}",
            "outcomes": {
                m: {
                    "score": float(letter == right),
                    "cost_usd": COST[m],
                    "response": f"The answer is ({letter}).",
                }
                for m, letter in answers.items()
            },
        }
    )


def agreement_table(n: int, seed: int = 0) -> list[OutcomeRecord]:
    """Two cheap models that are right when they agree and wrong (with different letters)
    when they disagree; the strong model is always right."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        right = LETTERS[int(rng.integers(4))]
        wrong = [x for x in LETTERS if x != right]
        if rng.random() < 0.6:
            answers = {"a": right, "b": right}
        else:
            x, y = rng.choice(len(wrong), size=2, replace=False)
            answers = {"a": wrong[int(x)], "b": wrong[int(y)]}
        rows.append(record(f"t{seed}-{i}", {**answers, "s": right}, right))
    return rows


@pytest.fixture(scope="module")
def fitted() -> EscalationRouter:
    return EscalationRouter(max_cheap=2, first=2).fit(agreement_table(200))


def test_agreement_stops_and_disagreement_escalates(fitted: EscalationRouter) -> None:
    agree = record("x1", {"a": "C", "b": "C", "s": "C"}, "C")
    disagree = record("x2", {"a": "A", "b": "B", "s": "D"}, "D")
    lam = 0.05  # the strong call (3 units) is worth it only where the cheap answers differ
    stop, escalate = fitted.route([agree, disagree], lam)
    assert stop.models_called == ("a", "b")
    assert stop.final_model == "a" and stop.score == 1.0
    assert escalate.models_called == ("a", "b", "s")
    assert escalate.final_model == "s" and escalate.score == 1.0


def test_cost_is_the_sum_of_every_call(fitted: EscalationRouter) -> None:
    records = agreement_table(40, seed=1)
    for lam in fitted.default_sweep(records)[::8]:
        for r, routed in zip(records, fitted.route(records, lam), strict=True):
            expected = sum(r.outcomes[m].cost_usd or 0.0 for m in routed.models_called)
            assert routed.cost_usd == pytest.approx(expected)
            assert routed.score == r.outcomes[routed.final_model].score
            assert len(set(routed.models_called)) == len(routed.models_called)


def test_cost_falls_as_the_cost_weight_grows(table_factory: TableFactory) -> None:
    train, test = table_factory(300, seed=0), table_factory(200, seed=1)
    router = EscalationRouter(max_cheap=2, first=1, cheap_ratio=0.5).fit(train)
    points = sweep(router, test).points
    costs = [p.cost for p in points]
    assert all(later <= earlier + 1e-12 for earlier, later in itertools.pairwise(costs))
    assert costs[0] > costs[-1]
    # With cost all but free it buys the strong answer where it helps; when cost dominates
    # it never calls the strong model.
    assert points[0].score > points[-1].score
    assert points[-1].calls.get("strong", 0.0) == 0.0


def test_large_cost_weight_answers_from_the_cheap_stage_only(fitted: EscalationRouter) -> None:
    records = agreement_table(30, seed=2)
    for routed in fitted.route(records, 100.0):
        assert "s" not in routed.models_called


def test_tasks_are_inferred_from_the_prompt(table_factory: TableFactory) -> None:
    train = table_factory(200, seed=0)
    router = EscalationRouter(max_cheap=2, cheap_ratio=0.5).fit(train)
    assert set(router.plans) == {"math", "poem"}
    test = table_factory(60, seed=3)
    unlabeled = [r.model_copy(update={"task": None}) for r in test]
    assert router.infer_tasks([r.text for r in unlabeled]) == [r.task for r in test]


def test_plans_can_be_given_per_task() -> None:
    router = EscalationRouter(plans={"quiz": ["b"]}).fit(agreement_table(100))
    plan = router.plans["quiz"]
    assert plan.cheap == ("b",) and plan.final == "s"
    for routed in router.route(agreement_table(20, seed=4), 0.0):
        assert "a" not in routed.models_called


def test_routing_needs_a_fit_and_recorded_responses() -> None:
    with pytest.raises(RoutingError):
        EscalationRouter().route(agreement_table(3), 0.0)
    rows = agreement_table(50)
    broken = rows[0].model_copy(deep=True)
    broken.outcomes["a"].response = None
    with pytest.raises(RoutingError):
        EscalationRouter(max_cheap=2).fit([broken, *rows[1:]])


def test_best_under_budget_respects_the_budget(fitted: EscalationRouter) -> None:
    records = agreement_table(60, seed=5)
    cheap_only = COST["a"] + COST["b"]
    point = best_under_budget(fitted, records, cheap_only * 1.5)
    assert point is not None
    lam, score, cost = point
    assert cost <= cheap_only * 1.5 + 1e-12
    routed = fitted.route(records, lam)
    assert np.mean([r.score for r in routed]) == pytest.approx(score)
    # A looser budget never scores worse.
    looser = best_under_budget(fitted, records, COST["s"] * 2)
    assert looser is not None and looser[1] >= score
    assert best_under_budget(fitted, records, COST["a"] / 2) is None
