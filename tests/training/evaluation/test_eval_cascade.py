from __future__ import annotations

import pytest

from router.outcomes import OutcomeRecord
from training.evaluation.cascade import CascadeFamilyRouter, CascadeRouter, nonempty_check
from training.evaluation.sweep import RoutingError, sweep

COST = {"a": 0.1, "b": 0.2, "c": 1.0, "d": 5.0}


def record(answers: dict[str, str], right: str = "B") -> OutcomeRecord:
    """Responses per model; a response is right when it names the letter ``right``."""
    return OutcomeRecord.model_validate(
        {
            "id": "r",
            "prompt": "Which one? A) x B) y C) z",
            "outcomes": {
                m: {"score": float(right in text), "cost_usd": COST[m], "response": text}
                for m, text in answers.items()
            },
        }
    )


def test_cheap_models_that_agree_answer_alone() -> None:
    # Same final answer in different words: the cheaper model's answer is kept.
    r = record({"a": "B", "b": "The answer is (B).", "c": "C"})
    routed = CascadeRouter(["a", "b", "c"], k=2).trajectory(r)
    assert routed.models_called == ("a", "b")
    assert routed.final_model == "a"
    assert routed.cost_usd == pytest.approx(0.3)
    assert routed.score == 1.0


def test_disagreement_escalates_and_a_late_agreement_selects_the_cheaper() -> None:
    r = record({"a": "A", "b": "B", "c": "(B)", "d": "C"})
    routed = CascadeRouter(["a", "b", "c", "d"], k=2).trajectory(r)
    assert routed.models_called == ("a", "b", "c")
    assert routed.final_model == "b"
    assert routed.cost_usd == pytest.approx(1.3)


def test_the_last_escalation_answers_whatever_it_says() -> None:
    # c agrees with b, but c is the order's last model called alone: its answer is final
    # (so the gateway can stream it), at the same cost as selecting b's.
    r = record({"a": "A", "b": "B", "c": "(B)"})
    routed = CascadeRouter(["a", "b", "c"], k=2).trajectory(r)
    assert (routed.models_called, routed.final_model) == (("a", "b", "c"), "c")
    assert routed.cost_usd == pytest.approx(1.3)


def test_no_agreement_ends_with_the_last_model() -> None:
    r = record({"a": "A", "b": "B", "c": "C"}, right="C")
    routed = CascadeRouter(["a", "b", "c"], k=2).trajectory(r)
    assert (routed.final_model, routed.score) == ("c", 1.0)


def test_quorum_three_needs_three_matching_answers() -> None:
    r = record({"a": "B", "b": "B", "c": "A"}, right="A")
    assert CascadeRouter(["a", "b", "c"], k=2, quorum=2).trajectory(r).final_model == "a"
    routed = CascadeRouter(["a", "b", "c"], k=3, quorum=3).trajectory(r)
    assert (routed.final_model, routed.score) == ("c", 1.0)


def test_checked_cascade_accepts_the_first_passing_answer() -> None:
    r = record({"a": "  ", "b": "B", "c": "C"})
    routed = CascadeRouter(["a", "b", "c"], k=1, check=nonempty_check).trajectory(r)
    assert routed.models_called == ("a", "b") and routed.final_model == "b"
    assert CascadeRouter(["b", "c"], k=1).trajectory(r).final_model == "c"  # no check, no pair


def test_single_model_cascade_and_invalid_configurations() -> None:
    r = record({"a": "A", "b": "B", "c": "C"})
    assert CascadeRouter(["b"], k=1).trajectory(r).models_called == ("b",)
    for bad in (
        lambda: CascadeRouter([]),
        lambda: CascadeRouter(["a", "a"]),
        lambda: CascadeRouter(["a", "b"], k=3),
        lambda: CascadeRouter(["a", "b"], quorum=1),
        lambda: CascadeRouter(["a", "b"], k=2, check=nonempty_check),
    ):
        with pytest.raises(ValueError):
            bad()


def test_missing_responses_are_an_error() -> None:
    r = OutcomeRecord.model_validate(
        {
            "id": "x",
            "prompt": "p",
            "outcomes": {"a": {"score": 1, "cost_usd": 0.1}, "b": {"score": 0, "cost_usd": 0.2}},
        }
    )
    with pytest.raises(RoutingError, match="no recorded response"):
        CascadeRouter(["a", "b"]).trajectory(r)


def test_family_spans_from_best_to_cheapest(table_factory) -> None:
    train, test = table_factory(300, seed=11), table_factory(200, seed=12)
    family = CascadeFamilyRouter(max_cheap=2, quorums=(2, 3), batch_sizes=(2, 3)).fit(train)
    names = {c.name for c in family.configs}
    assert {"cascade:cheap>mid>strong@2", "cascade:cheap>mid@2", "cascade:cheap@1"} <= names
    # A quorum of three among two cheap models plus the fallback would always pay for the
    # fallback: not a candidate.
    assert not any(c.quorum == 3 for c in family.configs)
    grid = family.default_sweep(train)
    assert family.select(grid[-1]).order == ["cheap"]
    best = family.select(0.0)
    # At λ = 0 the member with the best training score wins (cheaper among equals).
    means = family._scores.mean(axis=1)
    assert means[family.configs.index(best)] == pytest.approx(means.max())
    points = sweep(family, test).points
    assert min(p.cost for p in points) == pytest.approx(
        sum(r.outcomes["cheap"].cost_usd for r in test) / len(test)
    )


def test_cascade_with_agreement_beats_its_cheap_members_on_quality(table_factory) -> None:
    records = table_factory(600, seed=13)
    strong_cost = sum(r.outcomes["strong"].cost_usd for r in records) / len(records)
    point = sweep(CascadeRouter(["cheap", "mid", "strong"], k=2), records).points[0]
    cheap = sweep(CascadeRouter(["cheap"], k=1), records).points[0]
    strong = sweep(CascadeRouter(["strong"], k=1), records).points[0]
    assert cheap.score < point.score <= strong.score + 0.02
    assert point.cost < strong_cost
    assert point.calls["cheap"] == point.calls["mid"] == 1.0 and 0 < point.calls["strong"] < 1


def test_local_family_runs_and_caches(table_factory) -> None:
    train, test = table_factory(300, seed=14), table_factory(100, seed=15)
    family = CascadeFamilyRouter(max_cheap=2, local_k=30).fit(train)
    first = family.route(test, 0.05)
    assert family.route(test, 0.05) == first
    assert len(first) == len(test)
