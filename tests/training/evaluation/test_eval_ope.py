"""Off-policy estimators on synthetic logged data with known propensities.

Tolerance: each unbiased estimate must land within 3 of its own standard errors of the true
value of the target policy (seeded, so the check is deterministic; at 3 SE a correct
estimator fails by chance about 0.3% of the time over random seeds).
"""

from __future__ import annotations

import numpy as np
import pytest

from router.outcomes import OutcomeRecord
from training.evaluation.ope import (
    CIMethod,
    LoggedBandit,
    OPEError,
    all_estimates,
    cost_reward,
    deterministic_probs,
    doubly_robust,
    ips,
    logged_bandit,
    mean_reward_model,
    snips,
)

MODELS = ["cheap", "mid", "strong"]
# Mean reward by context type (rows) and action (columns).
MU = np.array([[0.9, 0.85, 0.95], [0.2, 0.6, 0.9]])
# Logging policy: uniform-ish, context-dependent, every action possible.
LOGGING = np.array([[0.6, 0.3, 0.1], [0.2, 0.3, 0.5]])
# Target policy: prefers the cheap model on easy contexts, the strong one on hard ones.
TARGET = np.array([[0.8, 0.1, 0.1], [0.05, 0.15, 0.8]])


def synthetic_with_contexts(
    n: int, seed: int
) -> tuple[LoggedBandit, np.ndarray, float, np.ndarray]:
    rng = np.random.default_rng(seed)
    ctx = rng.integers(0, 2, n)
    # Inverse-CDF sampling of the logged action from the context's logging distribution.
    actions = (rng.random(n)[:, None] > np.cumsum(LOGGING[ctx], axis=1)).sum(axis=1)
    rewards = (rng.random(n) < MU[ctx, actions]).astype(float)
    data = LoggedBandit(
        [f"r{i}" for i in range(n)], MODELS, actions, LOGGING[ctx, actions], rewards
    )
    target = TARGET[ctx]
    # The target's value on these contexts (what every estimator is unbiased for).
    truth = float((TARGET[ctx] * MU[ctx]).sum(axis=1).mean())
    return data, target, truth, ctx


def synthetic(n: int, seed: int) -> tuple[LoggedBandit, np.ndarray, float]:
    data, target, truth, _ = synthetic_with_contexts(n, seed)
    return data, target, truth


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_estimators_are_unbiased_within_three_standard_errors(seed: int) -> None:
    data, target, truth = synthetic(20_000, seed)
    for name, est in all_estimates(data, target, max_weight=1e6).items():
        assert abs(est.value - truth) < 3 * est.stderr, (name, est, truth)
        assert est.ci_low < est.value < est.ci_high
        assert est.n == 20_000


def test_normal_intervals_cover_the_truth_at_about_the_nominal_rate() -> None:
    covered = 0
    for seed in range(40):
        data, target, truth = synthetic(2_000, 100 + seed)
        est = ips(data, target)
        covered += est.ci_low <= truth <= est.ci_high
    assert covered >= 34  # 95% nominal: 38 expected, 34+ with probability > 0.95


def test_bootstrap_agrees_with_the_normal_approximation() -> None:
    data, target, _ = synthetic(3_000, 7)
    normal = snips(data, target)
    boot = snips(data, target, ci="bootstrap", n_boot=300, seed=1)
    assert boot.value == normal.value
    assert boot.stderr == pytest.approx(normal.stderr, rel=0.25)
    assert boot.ci_low < boot.value < boot.ci_high


def test_clipping_trades_bias_for_variance() -> None:
    data, target, _ = synthetic(5_000, 3)
    # Weights here reach 0.8 / 0.5 = 1.6; capping them at 1.2 cuts the largest.
    plain, clipped = ips(data, target), ips(data, target, max_weight=1.2)
    assert clipped.value < plain.value
    assert clipped.stderr < plain.stderr
    assert ips(data, target, max_weight=1e9).value == pytest.approx(plain.value)


def test_dr_with_the_true_reward_model_has_lower_variance() -> None:
    data, target, truth, ctx = synthetic_with_contexts(5_000, 4)
    dr = doubly_robust(data, target, MU[ctx])
    assert dr.stderr < ips(data, target).stderr
    assert abs(dr.value - truth) < 3 * dr.stderr
    per_model = mean_reward_model(data)
    assert per_model.shape == (5_000, 3)


def test_deterministic_target_and_shape_checks() -> None:
    data, _, _ = synthetic(100, 5)
    probs = deterministic_probs(["mid"] * 100, MODELS)
    assert probs[:, 1].tolist() == [1.0] * 100
    with pytest.raises(OPEError, match="never logged"):
        deterministic_probs(["other"], MODELS)
    with pytest.raises(OPEError, match="shape"):
        ips(data, probs[:10])
    with pytest.raises(OPEError, match="distribution"):
        ips(data, probs * 2)
    with pytest.raises(OPEError, match="distribution"):  # NaN fails every comparison
        ips(data, np.full_like(probs, np.nan))


def test_logged_bandit_from_records() -> None:
    def rec(i: int, action: str, p: float, score: float) -> OutcomeRecord:
        return OutcomeRecord.model_validate(
            {
                "id": f"q{i}",
                "prompt": "hi",
                "outcomes": {action: {"score": score, "cost_usd": 0.001 * (i + 1)}},
                "logged": {"action": action, "propensity": p, "cost_weight": 0.1},
            }
        )

    records = [rec(0, "b", 0.5, 1.0), rec(1, "a", 0.25, 0.0), rec(2, "b", 0.5, 0.5)]
    data = logged_bandit(records)
    assert data.models == ["a", "b"]
    assert data.actions.tolist() == [1, 0, 1]
    assert data.propensities.tolist() == [0.5, 0.25, 0.5]
    assert data.rewards.tolist() == [1.0, 0.0, 0.5]
    costs = logged_bandit(records, data.models, reward=cost_reward)
    assert costs.rewards.tolist() == pytest.approx([0.001, 0.002, 0.003])
    # Always choosing "b": IPS = mean(w r) with w = 1/0.5 on the b rows, 0 elsewhere.
    est = ips(data, deterministic_probs(["b"] * 3, data.models))
    assert est.value == pytest.approx((2 * 1.0 + 0 + 2 * 0.5) / 3)
    with pytest.raises(OPEError, match="no record has"):
        logged_bandit([r.model_copy(update={"logged": None}) for r in records])


def test_a_router_choosing_a_model_logged_only_elsewhere_in_the_table_is_estimated() -> None:
    # `xrouter eval` on an export: the router's choice, logged 5 times in the table but on
    # none of the evaluated records, left it without any estimate ("target action ... was
    # never logged"). It has no support on those records, as with any unexplored choice.
    from training.evaluation.baselines import SingleModelRouter
    from training.evaluation.compare import Entry, off_policy

    records = [
        OutcomeRecord.model_validate(
            {
                "id": f"q{i}",
                "prompt": "hi",
                "outcomes": {a: {"score": float(i % 2), "cost_usd": 0.001}},
                "logged": {"action": a, "propensity": 0.5, "cost_weight": 0.1},
            }
        )
        for i, a in enumerate(["a", "b"] * 4)
    ]
    entry = Entry(SingleModelRouter("c"), "policy", [0.0])
    rows, notes = off_policy([entry], records, models=["a", "b", "c"])
    row = next(r for r in rows if r.router == entry.router.name)
    assert row.estimates["score"]["ips"]["value"] == 0.0  # no record supports it
    assert "choose a model no record here logged (at most: single:c 8)" in " ".join(notes)
    assert {r.router for r in rows} == {"single:a", "single:b", "single:c"}
    # Without the table's models it is a note, as before: nothing says "c" exists.
    rows, notes = off_policy([entry], records)
    assert "single:c" not in {r.router for r in rows} and "never logged" in " ".join(notes)


def test_multi_call_trajectories_are_not_reweighted_as_single_actions() -> None:
    from router.outcomes import OutcomeRecord
    from training.compact.data import TableArrays
    from training.evaluation.ope import logged_bandit

    def rec(i: int, actions: list[str] | None) -> OutcomeRecord:
        return OutcomeRecord.model_validate(
            {
                "id": f"r{i}",
                "prompt": "q",
                "outcomes": {"a": {"score": 1.0, "cost_usd": 0.5}},
                "logged": {"action": "a", "propensity": 0.5, "actions": actions},
            }
        )

    records = [rec(0, None), rec(1, ["a"]), rec(2, ["a", "b"])]
    assert [r.logged.multi_call for r in records if r.logged] == [False, False, True]
    bandit = logged_bandit(records)
    assert bandit.ids == ["r0", "r1"]
    arrays = TableArrays.from_records(records, ["a", "b"])
    assert list(arrays.logged_action) == [0, 0, -1]
    assert not arrays.available[2].any()
    with pytest.raises(OPEError, match="single-call"):
        logged_bandit(records[2:])


def test_intervals_stay_in_the_reward_range_and_point_estimates_are_not_clipped() -> None:
    """Few logged prompts, all answered well by the target's action with a small logging
    propensity: the normal interval of IPS reaches above 1, which no score's mean can be."""
    rng = np.random.default_rng(0)
    n = 40
    actions = rng.choice(3, size=n, p=[0.45, 0.45, 0.1])
    props = np.where(actions == 2, 0.1, 0.45)
    ids = [f"r{i}" for i in range(n)]
    data = LoggedBandit(ids, MODELS, actions, props, np.ones(n), (0.0, 1.0))
    target = deterministic_probs(["strong"] * n, MODELS)
    for ci in ("normal", "bootstrap"):
        est = ips(data, target, ci=ci)
        # Unclipped, the interval would leave [0, 1]; the point estimate stays as computed.
        assert est.value + 1.96 * est.stderr > 1.0 or est.value > 1.0, est
        assert 0.0 <= est.ci_low <= est.ci_high <= 1.0, est
        assert est.ci_high == 1.0
        assert est.value == pytest.approx(float((actions == 2).sum() / 0.1 / n))
    # A cost has no upper bound: only the lower end is clipped.
    costs = LoggedBandit(data.ids, MODELS, actions, props, np.full(n, 0.002), (0.0, np.inf))
    est = ips(costs, target)
    assert est.ci_low >= 0.0 and est.ci_high > 0.002


def test_a_zero_propensity_is_refused_not_turned_into_nan() -> None:
    """A propensity of 0 made every IPS, SNIPS and DR estimate inf or NaN, silently."""
    with pytest.raises(OPEError, match=r"record 'b': logged propensity 0.0 is not in \(0, 1\]"):
        LoggedBandit(["a", "b"], MODELS, np.array([0, 1]), np.array([0.5, 0.0]), np.ones(2))
    with pytest.raises(OPEError, match="propensity nan"):
        LoggedBandit(["a"], MODELS, np.array([0]), np.array([np.nan]), np.ones(1))


@pytest.mark.parametrize("ci", ["normal", "bootstrap"])
def test_one_logged_record_gives_the_whole_range_as_its_interval(ci: CIMethod) -> None:
    """One record: every bootstrap resample is that record, so the bootstrap gave a
    zero-width interval (certainty from one observation); both methods now give the full
    range the quantity can take."""
    data = LoggedBandit(["a"], MODELS, np.array([0]), np.array([0.5]), np.ones(1), (0.0, 1.0))
    target = deterministic_probs(["cheap"], MODELS)
    for name, est in all_estimates(data, target, ci=ci).items():
        assert (est.ci_low, est.ci_high) == (0.0, 1.0), name
        assert est.stderr == float("inf") and est.n == 1
    assert ips(data, target, ci=ci).value == pytest.approx(2.0)  # 1 / 0.5, unclipped


@pytest.mark.parametrize("ci", ["normal", "bootstrap"])
def test_one_supporting_record_among_many_gives_the_whole_range(ci: CIMethod) -> None:
    """Many records, one of them logged with the action the target takes: SNIPS and the
    default DR rest on that one reward (SNIPS's influence terms and DR's terms come out
    constant), so neither may claim a narrow interval from it."""
    n = 40
    actions = np.array([2] + [0] * (n - 1))  # "strong" logged once, "cheap" on the rest
    rewards = np.array([1.0] + [0.0, 1.0] * ((n - 1) // 2) + [0.0] * ((n - 1) % 2))
    data = LoggedBandit(
        [f"r{i}" for i in range(n)], MODELS, actions, np.full(n, 0.25), rewards, (0.0, 1.0)
    )
    target = deterministic_probs(["strong"] * n, MODELS)
    est = all_estimates(data, target, ci=ci)
    for name in ("snips", "dr"):
        assert (est[name].ci_low, est[name].ci_high) == (0.0, 1.0), (name, est[name])
        assert est[name].value == pytest.approx(1.0)
    # With enough support the intervals are real ones again.
    data2, target2, _ = synthetic(200, 1)
    for name, e in all_estimates(data2, target2, ci=ci).items():
        assert e.ci_high - e.ci_low < 0.5, name


def test_a_bootstrap_interval_needs_two_resamples() -> None:
    data, target, _ = synthetic(50, 3)
    with pytest.raises(OPEError, match="at least 2 resamples"):
        ips(data, target, ci="bootstrap", n_boot=1)


@pytest.mark.parametrize("ci", ["normal", "bootstrap"])
@pytest.mark.parametrize("reward", [1.0, 0.0])
def test_a_few_agreeing_records_do_not_give_a_point_interval(ci: CIMethod, reward: float) -> None:
    """40 logged prompts, the target's model explored on 4 of them (propensity 0.1), all
    four scoring the same: SNIPS's and the default DR's influence terms are then all 0, and
    IPS's too when they scored 0, so their intervals were the single point [1, 1] (or
    [0, 0]) where an exact binomial interval for 4 of 4 starts at 0.40. Each is now at least
    the Wilson interval at the records' effective sample size (4 here)."""
    n = 40
    actions = np.array([2] * 4 + [0] * (n - 4))
    props = np.where(actions == 2, 0.1, 0.9)
    rewards = np.where(actions == 2, reward, np.resize([0.0, 1.0], n))
    data = LoggedBandit([f"r{i}" for i in range(n)], MODELS, actions, props, rewards, (0.0, 1.0))
    target = deterministic_probs(["strong"] * n, MODELS)
    wilson_far_end = 0.5102  # Wilson 95% for 4 of 4: [0.5101, 1]; for 0 of 4: [0, 0.4899]
    for name, est in all_estimates(data, target, ci=ci).items():
        assert 0.0 <= est.ci_low <= est.ci_high <= 1.0, (name, est)
        if reward == 1.0:
            assert est.ci_low <= wilson_far_end, (name, est)
        else:
            assert est.ci_high >= 1.0 - wilson_far_end, (name, est)
    if reward == 1.0:
        assert snips(data, target, ci=ci).value == pytest.approx(1.0)
        assert snips(data, target, ci=ci).ci_low == pytest.approx(0.5101, abs=1e-3)


@pytest.mark.parametrize("ci", ["normal", "bootstrap"])
def test_ips_with_no_record_of_the_targets_model_gives_the_whole_range(ci: CIMethod) -> None:
    """IPS is 0 when the target's model was never logged, whatever that model is worth: its
    interval was [0, 0]; SNIPS and DR already said the whole range."""
    n = 30
    data = LoggedBandit(
        [f"r{i}" for i in range(n)], MODELS, np.zeros(n, int), np.full(n, 0.5), np.ones(n),
        (0.0, 1.0),
    )  # fmt: skip
    target = deterministic_probs(["strong"] * n, MODELS)
    for name in ("ips", "clipped_ips"):
        est = all_estimates(data, target, ci=ci)[name]
        assert est.value == 0.0 and (est.ci_low, est.ci_high) == (0.0, 1.0), est


def test_the_small_sample_floor_gives_way_to_the_normal_interval_with_support() -> None:
    """With 2,000 records the normal interval is wider than the Wilson floor: bounding the
    reward changes nothing but the clipping to [0, 1]."""
    data, target, _ = synthetic(2_000, 5)
    bounded = LoggedBandit(
        data.ids, data.models, data.actions, data.propensities, data.rewards, (0.0, 1.0)
    )
    for name, est in all_estimates(bounded, target).items():
        free = all_estimates(data, target)[name]
        assert (est.ci_low, est.ci_high) == pytest.approx(
            (max(free.ci_low, 0.0), min(free.ci_high, 1.0))
        ), name


def test_thin_support_intervals_cover_the_truth() -> None:
    """40 logged prompts, the target's model explored 10% of the time and worth 0.8: SNIPS's
    nominal 95% interval covered the truth in 60% of runs (zero-width in 38%). Seeded, 300
    runs."""
    rng = np.random.default_rng(0)
    n, runs = 40, 300
    covered = dict.fromkeys(("ips", "clipped_ips", "snips", "dr"), 0)
    target = deterministic_probs(["strong"] * n, MODELS)
    for _ in range(runs):
        explored = rng.random(n) < 0.1
        actions = np.where(explored, 2, 0)
        rewards = (rng.random(n) < np.where(explored, 0.8, 0.5)).astype(float)
        data = LoggedBandit(
            [f"r{i}" for i in range(n)], MODELS, actions, np.where(explored, 0.1, 0.9),
            rewards, (0.0, 1.0),
        )  # fmt: skip
        for name, est in all_estimates(data, target).items():
            covered[name] += est.ci_low <= 0.8 <= est.ci_high
    for name, hits in covered.items():
        assert hits / runs >= 0.92, (name, hits / runs)


@pytest.mark.parametrize("ci", ["normal", "bootstrap"])
def test_an_interval_wholly_outside_the_range_gives_the_whole_range(ci: CIMethod) -> None:
    """Every record logged with propensity 1e-9 (valid, if absurd): IPS of a score comes out
    near 1e8 with an interval entirely above 1. Clipped, it became [0.84, 1] around a truth of
    0.35 — a confident interval from weights that say nothing; now the whole range."""
    n = 40
    actions = np.array([2 * (i % 2) for i in range(n)])  # "cheap" and "strong" alternate
    rewards = np.array([float(i % 3 == 0) for i in range(n)])
    data = LoggedBandit(
        [f"r{i}" for i in range(n)], MODELS, actions, np.full(n, 1e-9), rewards, (0.0, 1.0)
    )
    est = ips(data, deterministic_probs(["strong"] * n, MODELS), ci=ci)
    assert est.value > 1e7  # the point estimate is left as computed
    assert (est.ci_low, est.ci_high) == (0.0, 1.0)


def _logged_records(n: int, claimed: float, seed: int = 0) -> list[OutcomeRecord]:
    """Traffic logged uniformly over three models (each chosen with probability 1/3),
    recorded with propensity ``claimed``."""
    rng = np.random.default_rng(seed)
    return [
        OutcomeRecord.model_validate(
            {
                "id": f"q{i}",
                "prompt": "hi",
                "outcomes": {a: {"score": float(rng.random() < 0.7), "cost_usd": 0.001}},
                "logged": {"action": a, "propensity": claimed, "cost_weight": 0.1},
            }
        )
        for i, a in enumerate(rng.choice(MODELS, n))
    ]


def test_propensities_that_understate_the_logging_policy_are_noted() -> None:
    # IPS read 1.5 times too high on such logs, with nothing said: the importance weights,
    # which average 1 when the propensities are right, average 1.5 here.
    from training.evaluation.baselines import SingleModelRouter
    from training.evaluation.compare import Entry, off_policy

    entry = Entry(SingleModelRouter("strong"), "policy", [0.0])
    rows, notes = off_policy([entry], _logged_records(600, claimed=1 / 3))
    assert all(abs(r.mean_weight - 1.0) < 3 * r.mean_weight_stderr + 0.05 for r in rows)
    assert not any("propensities" in n for n in notes), notes

    rows, notes = off_policy([entry], _logged_records(600, claimed=2 / 9))
    weights = {r.router: r for r in rows}
    assert 1.3 < weights["single:strong"].mean_weight < 1.7
    [said] = [n for n in notes if n.startswith("off-policy propensities:")]
    assert "single:strong 1." in said and "SNIPS divides it out" in said
    ips_value = weights["single:strong"].estimates["score"]["ips"]["value"]
    snips_value = weights["single:strong"].estimates["score"]["snips"]["value"]
    assert ips_value / snips_value == pytest.approx(weights["single:strong"].mean_weight)
    assert weights["single:strong"].to_dict()["mean_weight"] == weights["single:strong"].mean_weight


def test_deterministic_logs_without_support_are_not_taken_for_wrong_propensities() -> None:
    # Weights average below 1 where a router has no support (propensity 1 for another
    # model): that is the support note's, not a sign of wrong propensities.
    from training.evaluation.baselines import SingleModelRouter
    from training.evaluation.compare import Entry, off_policy

    entry = Entry(SingleModelRouter("strong"), "policy", [0.0])
    rows, notes = off_policy([entry], _logged_records(300, claimed=1.0))
    assert all(r.mean_weight <= 1.0 for r in rows)
    assert not any(n.startswith("off-policy propensities:") for n in notes), notes
