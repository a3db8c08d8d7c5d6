"""The kNN checkpoint kind: the head's arithmetic, the checkpoint's validation, and the
compact policy serving it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from router.checkpoint import (
    Architecture,
    CheckpointError,
    CheckpointMetadata,
    load_checkpoint,
    save_checkpoint,
)
from router.policies.compact import CompactHead, head_for
from router.policies.knn import REWARD_TEMPERATURE, KNNHead
from router.reward import RewardConfig, compute_reward

# Four training prompts in a 2-d embedding (+1 extra feature column the head ignores), two
# models: "a" is right near (1, 0), "b" near (0, 1); "b" costs ten times more.
EXAMPLES = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9]], dtype=np.float32)
SCORES = np.array([[1.0, 0.0], [1.0, 1.0], [0.0, 1.0], [0.0, 1.0]], dtype=np.float32)
COSTS = np.array([[0.1, 1.0]] * 4, dtype=np.float32)  # normalized costs
REWARD = RewardConfig(form="additive", cost_scale=0.001)


def arch(k: int = 2) -> Architecture:
    return Architecture(
        kind="knn", input_dim=3, hidden=(), n_actions=2, neighbours=k, n_examples=4,
        similarity_dims=2,
    )  # fmt: skip


def weights() -> dict[str, np.ndarray]:
    return {"examples": EXAMPLES, "scores": SCORES, "normalized_costs": COSTS}


def test_logits_are_the_neighbours_expected_reward() -> None:
    head = KNNHead(arch(), weights(), REWARD)
    x = np.array([[2.0, 0.1, 99.0], [0.05, 1.0, -5.0]])  # scale and the extra column ignored
    score, cost = head.estimates(x)
    # Row 0's two nearest are examples 0 and 1; row 1's are 2 and 3.
    assert score.tolist() == [[1.0, 0.5], [0.0, 1.0]]
    assert np.allclose(cost, [[0.1, 1.0], [0.1, 1.0]])
    logits = head.logits(x, 0.3)
    for i in range(2):
        for j in range(2):
            expected = compute_reward(score[i, j], cost[i, j] * 0.001, 0.3, REWARD).reward
            assert logits[i, j] == pytest.approx(expected / REWARD_TEMPERATURE, abs=1e-6)
    # λ per row; at a high cost weight the cheap model wins even where it is wrong.
    per_row = head.logits(x, np.array([0.0, 5.0]))
    assert per_row[0].argmax() == 0 and per_row[1].argmax() == 0
    assert head.logits(x, 0.0)[1].argmax() == 1
    with pytest.raises(ValueError):
        head.logits(x, -1.0)
    with pytest.raises(ValueError):
        head.logits(x[:, :2], 0.0)


def test_architecture_and_weights_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ValidationError):
        Architecture(kind="knn", input_dim=3, n_actions=2, neighbours=5, n_examples=4,
                     similarity_dims=2)  # fmt: skip
    with pytest.raises(ValidationError):
        Architecture(kind="knn", input_dim=3, n_actions=2, neighbours=2, n_examples=4,
                     similarity_dims=4)  # fmt: skip
    meta = CheckpointMetadata(
        pool=["a", "b"], feature_version="test", architecture=arch(),
        reward={"form": "additive", "cost_scale": 0.001},
    )  # fmt: skip
    save_checkpoint(tmp_path / "ok", meta, weights())
    ckpt = load_checkpoint(tmp_path / "ok")
    head = head_for(ckpt)
    assert isinstance(head, KNNHead) and head.reward == REWARD
    assert not isinstance(head, CompactHead)
    bad = {**weights(), "scores": SCORES[:3]}
    with pytest.raises(CheckpointError, match="scores has shape"):
        save_checkpoint(tmp_path / "bad", meta, bad)
