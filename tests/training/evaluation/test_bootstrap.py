from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from router.outcomes import OutcomeRecord, write_outcome_table
from training.datasets.splits import split_records
from training.evaluation import bootstrap
from training.evaluation.baselines import OracleRouter, RandomMixRouter, SingleModelRouter
from training.evaluation.bootstrap import (
    PromptCurve,
    aiq_intervals,
    apgr_intervals,
    interval,
    mean_difference,
    resample_weights,
    resampled_means,
    weight_blocks,
)
from training.evaluation.cli import main
from training.evaluation.compare import Entry, compare
from training.evaluation.sweep import sweep


def test_resamples_are_seeded_multiplicities_of_the_prompts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    w = resample_weights(50, 200, seed=3)
    assert w.shape == (200, 50)
    assert np.all(w.sum(axis=1) == 50) and np.all(w >= 0)
    assert np.array_equal(w, resample_weights(50, 200, seed=3))
    assert not np.array_equal(w, resample_weights(50, 200, seed=4))
    blocks = list(weight_blocks(50, 200, seed=3))
    assert np.array_equal(blocks[0], np.ones((1, 50)))  # the full sample comes first
    # Drawn in small blocks (as for a large table), the resamples are the same ones.
    monkeypatch.setattr(bootstrap, "_BLOCK_BYTES", 8 * 50 * 7)
    small = list(weight_blocks(50, 200, seed=3))
    assert max(len(b) for b in small[1:]) == 7
    assert np.array_equal(np.vstack(small[1:]), w)
    with pytest.raises(ValueError):
        resample_weights(0, 10)
    with pytest.raises(ValueError):
        resample_weights(10, 0)


def test_resampled_means_are_paired_and_start_with_the_full_sample() -> None:
    a = np.array([[1.0, 0.0, 1.0, 0.0], [2.0, 2.0, 2.0, 2.0]])
    ma, mb = resampled_means([a, a[:1] * 3], samples=20, seed=1)
    assert ma.shape == (21, 2) and mb.shape == (21, 1)
    assert ma[0].tolist() == [0.5, 2.0]
    assert np.allclose(ma[:, 1], 2.0)  # a constant row has no spread
    assert np.allclose(mb[:, 0], 3 * ma[:, 0])  # both arrays saw the same resamples
    with pytest.raises(ValueError, match="different numbers of prompts"):
        resampled_means([a, a[:, :3]], samples=5)


def test_interval_is_the_central_percentile_range() -> None:
    iv = interval(0.5, np.arange(101, dtype=float) / 100, level=0.9)
    assert iv.estimate == 0.5
    assert (iv.low, iv.high) == pytest.approx((0.05, 0.95))
    assert iv.excludes_zero()
    assert not interval(0.0, np.array([-1.0, 1.0])).excludes_zero()
    with pytest.raises(ValueError):
        interval(0.0, np.array([1.0]), level=1.0)


def test_mean_difference_covers_the_true_gap_at_its_stated_rate() -> None:
    # 300 synthetic evaluations of two routers whose true accuracies differ by 0.05: a 90%
    # interval must cover 0.05 in about 90% of them (binomial sd of the rate: 1.7%).
    rng = np.random.default_rng(0)
    covered = 0
    trials = 300
    for t in range(trials):
        a = (rng.random(400) < 0.80).astype(float)
        b = (rng.random(400) < 0.75).astype(float)
        iv = mean_difference(a, b, samples=400, seed=t, level=0.9)
        covered += iv.low <= 0.05 <= iv.high
    assert 0.84 <= covered / trials <= 0.96


def test_mean_difference_of_identical_scores_is_exactly_zero() -> None:
    a = np.array([1.0, 0.0, 1.0, 1.0])
    iv = mean_difference(a, a.copy(), samples=100)
    assert (iv.estimate, iv.low, iv.high) == (0.0, 0.0, 0.0)
    with pytest.raises(ValueError):
        mean_difference(a, a[:3])


def _curves(records, routers):
    return {r.name: PromptCurve.from_results(sweep(r, records).prompts) for r in routers}


def test_aiq_intervals_match_the_point_estimates_and_order_routers(table_factory) -> None:
    records = table_factory(240, seed=5)
    models = ["cheap", "mid", "strong"]
    singles = {
        f"single:{m}": PromptCurve.from_results(sweep(SingleModelRouter(m), records).prompts)
        for m in models
    }
    routers = _curves(records, [OracleRouter(), RandomMixRouter("cheap", "strong", seed=0)])
    routers["twin"] = routers["oracle"]
    ivs = aiq_intervals(routers, singles, samples=300, seed=1, reference="oracle")
    comp = compare(
        [Entry(OracleRouter()), Entry(RandomMixRouter("cheap", "strong", seed=0))], records
    )
    assert ivs.aiq["oracle"].estimate == pytest.approx(comp.curve("oracle").aiq)
    assert ivs.aiq["random"].estimate == pytest.approx(comp.curve("random").aiq)
    assert ivs.no_routing.estimate == pytest.approx(comp.no_routing_aiq)
    for iv in ivs.aiq.values():
        assert iv.low <= iv.estimate <= iv.high
    # The oracle (the best model per prompt) is surely above no routing; random mixes lie on
    # the single models' chords, so surely not above it; a router compared with itself on
    # the same resamples differs by exactly 0.
    assert ivs.gain["oracle"].low > 0
    assert ivs.gain["random"].high <= 1e-9
    assert ivs.vs_reference["random"].high < 0
    twin = ivs.vs_reference["twin"]
    assert (twin.low, twin.high) == (0.0, 0.0)
    back = ivs.difference("oracle", "random")
    fwd = ivs.vs_reference["random"]
    assert (back.estimate, back.low, back.high) == pytest.approx(
        (-fwd.estimate, -fwd.high, -fwd.low)
    )
    with pytest.raises(KeyError):
        ivs.difference("oracle", "nope")
    with pytest.raises(ValueError, match="reference"):
        aiq_intervals(routers, singles, samples=10, reference="nope")
    with pytest.raises(ValueError, match="different numbers of prompts"):
        short = _curves(records[:10], [OracleRouter()])
        aiq_intervals(short, singles, samples=10)


def test_eval_cli_reports_intervals_against_the_policy(tmp_path: Path, table_factory) -> None:
    table = tmp_path / "t.jsonl"
    records = table_factory(300, seed=21)
    write_outcome_table(records, table)
    out = tmp_path / "report"
    argv = ["--table", str(table), "--policy", "knn:k=10", "--baselines", "oracle,random"]
    assert main([*argv, "--bootstrap", "200", "--out", str(out)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    comp = metrics["comparison"]
    assert comp["bootstrap"]["samples"] == 200 and comp["bootstrap"]["reference"] == "knn:k=10"
    rows = {r["name"]: r for r in comp["routers"]}
    policy = rows["knn:k=10"]["intervals"]
    assert policy["aiq"]["low"] <= rows["knn:k=10"]["aiq"] <= policy["aiq"]["high"]
    assert "aiq_minus_reference" not in policy  # the reference is not compared with itself
    oracle = rows["oracle"]["intervals"]["aiq_minus_reference"]
    assert oracle["estimate"] == pytest.approx(rows["oracle"]["aiq"] - rows["knn:k=10"]["aiq"])
    assert oracle["low"] > 0  # the oracle beats a kNN router on every resample
    test_n = len(split_records(records, (0.6, 0.2, 0.2), "0").test)
    report = (out / "report.md").read_text()
    assert f"paired bootstrap over the {test_n} prompts (200 resamples" in report
    assert "AIQ − knn:k=10, 95% CI" in report

    plain = tmp_path / "plain"
    assert main([*argv, "--bootstrap", "0", "--out", str(plain)]) == 0
    metrics = json.loads((plain / "metrics.json").read_text())
    assert metrics["comparison"]["bootstrap"] is None
    assert all(r["intervals"] == {} for r in metrics["comparison"]["routers"])
    assert "CI" not in (plain / "report.md").read_text()
    assert main([*argv, "--bootstrap", "-1", "--out", str(plain)]) == 2


def test_two_model_slice_gets_apgr_intervals(tmp_path: Path, table_factory) -> None:
    table = tmp_path / "t.jsonl"
    write_outcome_table(table_factory(400, seed=8), table)
    out = tmp_path / "report"
    argv = ["--table", str(table), "--policy", "knn:k=10", "--baselines", "oracle,random"]
    argv += ["--strong", "strong", "--weak", "cheap", "--bootstrap", "300", "--out", str(out)]
    assert main(argv) == 0
    two = json.loads((out / "metrics.json").read_text())["two_model"]
    rows = {r["name"]: r for r in two["routers"]}
    for name in ("oracle", "random", "knn:k=10"):
        iv = rows[name]["intervals"]["apgr"]
        assert iv["low"] <= rows[name]["apgr"] <= iv["high"]
    # A random mix's PGR is its share of strong calls in expectation: its interval holds 0.5.
    assert (
        rows["random"]["intervals"]["apgr"]["low"]
        < 0.5
        < rows["random"]["intervals"]["apgr"]["high"]
    )
    # kNN on the topic-separable table recovers most of the gap, surely more than random.
    assert rows["random"]["intervals"]["apgr_minus_reference"]["high"] < 0
    assert rows["oracle"]["intervals"]["apgr"]["low"] > rows["random"]["intervals"]["apgr"]["high"]
    assert "apgr" not in rows["single:strong"]["intervals"]


def test_apgr_intervals_need_strong_calls_and_a_gap(table_factory) -> None:
    records = table_factory(100, seed=2)
    cheap, strong = (
        PromptCurve.from_results(sweep(SingleModelRouter(m), records).prompts)
        for m in ("cheap", "strong")
    )
    oracle = PromptCurve.from_results(sweep(OracleRouter(), records).prompts)
    with pytest.raises(ValueError, match="calls to the strong model"):
        apgr_intervals({"oracle": oracle}, strong, cheap, samples=10)
    oracle = PromptCurve.from_results(sweep(OracleRouter(), records).prompts, "strong")
    with pytest.raises(ValueError, match="does not score above"):
        apgr_intervals({"oracle": oracle}, cheap, strong, samples=10)
    ivs = apgr_intervals({"oracle": oracle}, strong, cheap, samples=50)
    assert ivs.dropped == 0 and ivs.apgr["oracle"].estimate > 0.9


def test_a_slice_whose_gap_vanishes_on_every_resample_gets_no_apgr_interval_not_an_error() -> None:
    """The strong model wins one prompt of three: on a few resamples that prompt may never
    be drawn. Every resample left out used to fail the whole comparison ("no bootstrap
    samples"); now the APGR has no interval, and a note says why."""
    records = [
        OutcomeRecord.model_validate(
            {
                "id": f"r{i}",
                "prompt": f"question {i}",
                "outcomes": {
                    "strong": {"score": float(i == 0), "cost_usd": 1e-3},
                    "weak": {"score": 0.0, "cost_usd": 1e-4},
                },
            }
        )
        for i in range(3)
    ]
    entry = Entry(RandomMixRouter().fit(records), "policy")
    # Seeds whose two resamples both miss the prompt the strong model wins.
    seeds = [s for s in range(40) if (resample_weights(3, 2, s)[:, 0] == 0).all()]
    assert seeds
    comp = compare([entry], records, bootstrap=2, bootstrap_seed=seeds[0])
    curve = comp.curve("random")
    assert curve.apgr is not None and curve.apgr_ci is None
    assert curve.aiq_ci is not None
    assert "APGR intervals: 2 of 2 resamples left out" in " ".join(comp.notes)


def _fractional_slice(strong: list[float], weak: list[float]) -> list[OutcomeRecord]:
    return [
        OutcomeRecord.model_validate(
            {
                "id": f"r{i}",
                "prompt": f"question {i}",
                "outcomes": {
                    "strong": {"score": s, "cost_usd": 1e-3},
                    "weak": {"score": w, "cost_usd": 1e-4},
                },
            }
        )
        for i, (s, w) in enumerate(zip(strong, weak, strict=True))
    ]


def test_two_means_equal_but_for_rounding_have_no_pgr_gap() -> None:
    """Fractional scores with the same mean, summed in another order, differ in the last
    bit (0.20000000000000004 vs 0.19999999999999998): that is no gap to recover. The
    comparison used to take it for one, and PGR's own check then failed the evaluation."""
    records = _fractional_slice([0.1, 0.2, 0.3], [0.3, 0.2, 0.1])
    comp = compare([Entry(RandomMixRouter("weak", "strong"))], records, strong="strong")
    assert comp.strong is None and comp.curve("random").apgr is None
    assert any(n.startswith("no PGR metrics: strong does not score above weak") for n in comp.notes)


def test_resamples_whose_gap_is_rounding_are_left_out_not_an_error() -> None:
    """The strong model wins one prompt outright; resamples that miss it have equal means
    up to rounding, which must be left out like an exact tie."""
    records = _fractional_slice([0.1, 0.2, 0.3, 0.7] * 3 + [1.0], [0.3, 0.7, 0.1, 0.2] * 3 + [0.0])
    comp = compare([Entry(RandomMixRouter("weak", "strong"))], records, bootstrap=200)
    curve = comp.curve("random")
    assert comp.strong == "strong" and curve.apgr is not None and curve.apgr_ci is not None
    assert any(n.startswith("APGR intervals: ") for n in comp.notes)
