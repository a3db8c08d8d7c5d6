"""`xrouter train --knn`: a kNN checkpoint built from a table, k picked on validation, and
served by the compact policy."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pricing import load_default_catalog
from router.checkpoint import load_checkpoint
from router.outcomes import OutcomeRecord, write_outcome_table
from router.policies.compact import CompactPolicy
from router.policies.knn import KNNHead
from router.pool import ModelPool, PoolModelConfig
from training.compact.cli import main


@pytest.fixture
def built(
    tables: tuple[list[OutcomeRecord], list[OutcomeRecord]], tmp_path: Path
) -> tuple[Path, dict]:
    full, _ = tables
    table = tmp_path / "table.jsonl"
    write_outcome_table(full, table)
    out = tmp_path / "run"
    code = main(["--table", str(table), "--out", str(out), "--knn", "3,15,1000",
                 "--cost-scale", "0.01", "--val-lambdas", "0,1", "--name", "topics"])  # fmt: skip
    assert code == 0
    return out, json.loads((out / "summary.json").read_text())


def test_builds_a_checkpoint_with_k_picked_on_validation(built: tuple[Path, dict]) -> None:
    out, summary = built
    ckpt = load_checkpoint(out / "checkpoint")
    arch = ckpt.architecture
    assert arch.kind == "knn" and ckpt.metadata.name == "topics"
    tried = ckpt.metadata.training["neighbours_tried"]
    # 1000 is more than the training part holds: it is tried as "all of them".
    assert set(map(int, tried)) == {3, 15, arch.n_examples}
    best = int(max(tried, key=lambda k: tried[k]))
    assert arch.neighbours == summary["neighbours"] == best
    assert ckpt.metadata.training["mode"] == "knn"
    assert ckpt.metadata.training["command"].startswith("python -m training.compact.cli")
    assert ckpt.weights["examples"].shape == (arch.n_examples, arch.similarity_dims)
    assert summary["validation"]["0"]["reward"] > 0
    # Without --report-test the test part is not even looked at.
    assert "test" not in ckpt.metadata.metrics and "test" not in summary


def test_the_compact_policy_serves_it_by_topic_and_by_cost(built: tuple[Path, dict]) -> None:
    out, _ = built
    ckpt = load_checkpoint(out / "checkpoint")
    pool = ModelPool.from_configs(
        [
            PoolModelConfig(name=m, model=f"openai/{m}", api_base="http://127.0.0.1:9/v1",
                            price={"input": p, "output": p})
            for m, p in (("math-pro", 10), ("poet", 10), ("cheap", 1))
        ],
        load_default_catalog(),
    )  # fmt: skip
    policy = CompactPolicy(ckpt, pool)
    assert isinstance(policy._head, KNNHead)
    mask = policy.mask_for(pool)

    def pick(text: str, lam: float) -> str:
        probs = policy.policy_probs([{"role": "user", "content": text}], lam, mask)
        assert probs.sum() == pytest.approx(1.0) and np.all(probs >= 0)
        return policy.actions[int(probs.argmax())]

    # With cost nearly free, each topic goes to its specialist; when cost dominates, the
    # cheap generalist gets both.
    assert pick("Solve for x: x + 12 = 40.", 0.0) == "math-pro"
    assert pick("Write a short poem about the moon at night.", 0.0) == "poet"
    assert pick("Solve for x: x + 12 = 40.", 5.0) == "cheap"
    assert pick("Compose a haiku on winter and rain.", 5.0) == "cheap"
    # Far out, the gated reward's capped penalty zeroes every model: the tie goes to the
    # cheapest, never to an expensive model for nothing.
    assert pick("Solve for x: x + 12 = 40.", 500.0) == "cheap"


def test_knn_needs_full_information(
    tables: tuple[list[OutcomeRecord], list[OutcomeRecord]], tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    _, logged = tables
    table = tmp_path / "logged.jsonl"
    write_outcome_table(logged, table)
    argv = ["--table", str(table), "--out", str(tmp_path / "o"), "--knn", "5"]
    assert main([*argv, "--offpolicy"]) == 2
    assert "full-information" in capsys.readouterr().err
    assert main([*argv[:-1], "0"]) == 2
