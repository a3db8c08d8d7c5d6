"""Off-policy estimation and learning from logged traffic with partial feedback."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np
import pytest
import torch

from router.checkpoint import load_checkpoint
from router.features import FeatureExtractor
from router.outcomes import OutcomeRecord
from router.policies.compact import CompactHead
from training.compact.config import TrainConfig
from training.compact.data import TableArrays, cached_features
from training.compact.offpolicy import (
    RewardModel,
    doubly_robust_outcomes,
    dr_estimate,
    ips_estimate,
    snips_estimate,
)
from training.compact.run import evaluate_full
from training.compact.trainer import train


def synthetic_bandit(n: int, seed: int) -> dict[str, np.ndarray]:
    """Two context types, three actions; the logging policy is skewed (not uniform) so that
    naive averaging of logged rewards is biased."""
    rng = np.random.default_rng(seed)
    ctx = rng.integers(2, size=n)
    mean_reward = np.array([[0.8, 0.2, 0.5], [0.1, 0.9, 0.5]])  # [context, action]
    logging = np.array([[0.2, 0.6, 0.2], [0.6, 0.2, 0.2]])  # mostly the wrong action
    actions = np.array([rng.choice(3, p=logging[c]) for c in ctx])
    rewards = (rng.random(n) < mean_reward[ctx, actions]).astype(float)
    return {
        "ctx": ctx,
        "mean": mean_reward,
        "actions": actions,
        "prop": logging[ctx, actions],
        "r": rewards,
    }


def test_estimators_recover_the_better_policy() -> None:
    d = synthetic_bandit(20_000, seed=0)
    n = len(d["ctx"])
    rows = np.arange(n)
    good = np.eye(3)[np.where(d["ctx"] == 0, 0, 1)]  # the best action per context
    bad = np.eye(3)[np.where(d["ctx"] == 0, 1, 0)]
    true_good = d["mean"][d["ctx"], good.argmax(1)].mean()
    true_bad = d["mean"][d["ctx"], bad.argmax(1)].mean()
    assert true_good > 0.8 and true_bad < 0.2
    assert d["r"].mean() < 0.4  # the logged average says little about either
    rhat_perfect = d["mean"][d["ctx"]]
    rhat_wrong = np.full((n, 3), 0.5)
    for target, truth in ((good, true_good), (bad, true_bad)):
        p_logged = target[rows, d["actions"]]
        assert ips_estimate(p_logged, d["prop"], d["r"]) == pytest.approx(truth, abs=0.03)
        assert snips_estimate(p_logged, d["prop"], d["r"]) == pytest.approx(truth, abs=0.03)
        # Doubly robust: right with a perfect reward model, and still right with a wrong one
        # (the importance-weighted correction removes its bias).
        assert dr_estimate(target, rhat_perfect, d["actions"], d["prop"], d["r"]) == pytest.approx(
            truth, abs=0.02
        )
        assert dr_estimate(target, rhat_wrong, d["actions"], d["prop"], d["r"]) == pytest.approx(
            truth, abs=0.03
        )
    # Clipping the weights bounds the estimate (biased low here, never above the unclipped).
    p_good = good[rows, d["actions"]]
    assert ips_estimate(p_good, d["prop"], d["r"], clip=2.0) < ips_estimate(
        p_good, d["prop"], d["r"]
    )


def test_doubly_robust_outcomes_are_unbiased_even_with_a_wrong_reward_model() -> None:
    """Per-record estimates of every action's score and cost from one logged action each:
    their averages per context match the true means, both with a reward model that knows
    nothing (every score 0.5, every cost $0.005) and with clipped weights that never bind."""
    d = synthetic_bandit(30_000, seed=1)
    n = len(d["ctx"])
    true_cost = np.array([0.01, 0.02, 0.001])
    arrays = TableArrays(
        ids=[str(i) for i in range(n)],
        conversations=[[] for _ in range(n)],
        models=["a", "b", "c"],
        score=np.full((n, 3), np.nan),
        cost=np.full((n, 3), np.nan),
        logged_action=d["actions"],
        logged_propensity=d["prop"],
    )
    rows = np.arange(n)
    arrays.score[rows, d["actions"]] = d["r"]
    arrays.cost[rows, d["actions"]] = true_cost[d["actions"]]
    x = np.zeros((n, 1), dtype=np.float32)
    uninformed = RewardModel(1, 3, np.zeros(1), np.ones(1))
    with torch.no_grad():
        for p in uninformed.parameters():
            p.zero_()
        uninformed.log_cost.bias.fill_(float(np.log(0.005)))
    score, cost = doubly_robust_outcomes(uninformed, x, arrays, rows, clip=10.0)
    assert score.shape == cost.shape == (n, 3)
    for c in (0, 1):
        mine = d["ctx"] == c
        assert score[mine].mean(axis=0) == pytest.approx(d["mean"][c], abs=0.04)
        assert cost[mine].mean(axis=0) == pytest.approx(true_cost, rel=0.1)
    # The reward model alone is far off; the importance-weighted correction is what fixes it.
    assert abs(0.5 - d["mean"][0, 0]) > 0.25
    with pytest.raises(ValueError, match="logged action"):
        arrays.logged_action[0] = -1
        doubly_robust_outcomes(uninformed, x, arrays, rows)


@pytest.mark.parametrize("estimator", ["snips", "dr"])
def test_offpolicy_training_beats_the_logging_policy(
    big_tables: tuple[list[OutcomeRecord], list[OutcomeRecord]],
    tmp_path: Path,
    estimator: Literal["snips", "dr"],
) -> None:
    full, logged = big_tables
    extractor = FeatureExtractor.load()
    cfg = TrainConfig(
        steps=300, eval_every=50, checkpoint_every=0, cost_scale=0.01, lambda_max=10.0,
        val_lambdas=(0.0, 1.0), offpolicy=True, estimator=estimator, seed=0, progress=False,
    )  # fmt: skip
    res = train(logged, cfg, tmp_path / estimator, pool=list(full[0].outcomes), extractor=extractor)
    assert res.validation["0"]["reward"] > res.validation["0"]["logging_policy_reward"] + 0.2
    # Judge the learned policy on the hidden full outcomes of the validation prompts.
    ckpt = load_checkpoint(res.checkpoint_path)
    head = CompactHead.from_checkpoint(ckpt)
    val_ids = {r.id for r in logged} & set(_validation_ids(full, cfg))
    val = [r for r in full if r.id in val_ids]
    arrays = TableArrays.from_records(val, ckpt.pool)
    x = cached_features(arrays.conversations, extractor, None)
    truth = evaluate_full(head, x, arrays, (0.0, 1.0), cfg.reward_config())
    uniform = np.nanmean(arrays.score)  # the logging policy's true score at λ = 0
    assert truth["0"]["reward"] > uniform + 0.2, truth["0"]
    # At λ=1 the specialists' cost cancels their reward: the cheap model takes over.
    assert truth["1"]["choices"].get("cheap", 0.0) > 0.5, truth["1"]


def _validation_ids(records: list[OutcomeRecord], cfg: TrainConfig) -> list[str]:
    from training.datasets.splits import split_of

    return [r.id for r in records if split_of(r.id, cfg.fractions, cfg.split_seed) == "validation"]


def test_offpolicy_needs_logged_records(
    tables: tuple[list[OutcomeRecord], list[OutcomeRecord]], tmp_path: Path
) -> None:
    full, _ = tables
    cfg = TrainConfig(steps=5, offpolicy=True, progress=False, checkpoint_every=0)
    with pytest.raises(ValueError, match="no logged records"):
        train(full[:60], cfg, tmp_path / "x", extractor=FeatureExtractor.load())


def test_offpolicy_learns_from_single_model_decisions_only(
    tables: tuple[list[OutcomeRecord], list[OutcomeRecord]],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A gateway export mixes the router's single-model decisions with cascade trajectories
    (`logged.actions` of several models), whose outcome is no one model's."""
    _, logged = tables

    def as_cascade(r: OutcomeRecord) -> OutcomeRecord:
        assert r.logged is not None
        data = r.model_dump(exclude_none=True)
        data["logged"]["actions"] = [r.logged.action, *(m for m in r.outcomes if m != r.logged.action)][:2]  # fmt: skip
        if len(data["logged"]["actions"]) < 2:
            data["logged"]["actions"].append("another-model")
        return OutcomeRecord.model_validate(data)

    cascades = [as_cascade(r) for r in logged[:40]]
    assert all(r.logged is not None and r.logged.multi_call for r in cascades)
    cfg = TrainConfig(steps=5, offpolicy=True, progress=False, checkpoint_every=0, eval_every=5)
    pool = sorted({r.logged.action for r in logged if r.logged is not None})
    with pytest.raises(ValueError, match="no logged records to learn off-policy from"):
        train(cascades, cfg, tmp_path / "none", pool=pool, extractor=FeatureExtractor.load())
    caplog.set_level("INFO", logger="training.compact.run")
    res = train(
        [*cascades, *logged[40:]], cfg, tmp_path / "mixed", pool=pool,
        extractor=FeatureExtractor.load(),
    )  # fmt: skip
    assert res.checkpoint_path.exists()
    assert "skipped 40 records that are not a logged single-model decision" in caplog.text
    assert f"{len(logged) - 40} usable records" in caplog.text
    # Without --pool the actions are the models the usable decisions hold: a model that
    # only ever ended a cascade has no single-model outcome to learn from.
    only_cascaded = []
    for r in cascades:
        data = r.model_dump(exclude_none=True)
        outcome = data["outcomes"].pop(data["logged"]["action"])
        data["outcomes"] = {"cascade-only": outcome}
        data["logged"]["action"] = "cascade-only"
        data["logged"]["actions"] = ["cascade-only", "another-model"]
        only_cascaded.append(OutcomeRecord.model_validate(data))
    res = train(
        [*only_cascaded, *logged[40:]], cfg, tmp_path / "nopool",
        extractor=FeatureExtractor.load(),
    )  # fmt: skip
    assert sorted(load_checkpoint(res.checkpoint_path).pool) == pool
