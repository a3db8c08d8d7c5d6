"""`xrouter train --knn`: a kNN checkpoint built from a table, k picked on validation, and
served by the compact policy."""

from __future__ import annotations

import json
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest

from pricing import ModelPrice, load_default_catalog
from router.checkpoint import load_checkpoint
from router.outcomes import OutcomeRecord, load_outcome_table, write_outcome_table
from router.policies.compact import CompactPolicy
from router.policies.knn import KNNHead
from router.pool import ModelPool, PoolModelConfig
from tests.training.compact.conftest import ACCURACY
from training.compact.cli import main
from training.compact.config import TrainConfig
from training.datasets.splits import split_of
from training.evaluation.overlap import read_seen_prompts


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
    # The prompts it was built and selected on are kept beside it for `xrouter eval`.
    table = ckpt.metadata.training["table"]
    seen = read_seen_prompts(out / "checkpoint")
    fitted = [r for r in load_outcome_table(table["path"]) if split_of(r.id) != "test"]
    assert len(fitted) == table["n_train"] + table["n_validation"]
    # Each prompt's split key and its text (the texts of this table repeat).
    assert seen is not None and len(seen) == len(fitted) + len({r.text for r in fitted})
    assert ckpt.metadata.training["stored_outcomes"] == "recorded"
    assert ckpt.metadata.training["command"].startswith("python -m training.compact.cli")
    assert ckpt.weights["examples"].shape == (arch.n_examples, arch.similarity_dims)
    assert summary["validation"]["0"]["reward"] > 0
    # Without --report-test the test part is not even looked at.
    assert "test" not in ckpt.metadata.metrics and "test" not in summary


def serving(ckpt_dir: Path) -> Callable[[str, float], str]:
    """The greedy choice of the compact policy serving a checkpoint, by prompt and λ."""
    ckpt = load_checkpoint(ckpt_dir)
    pool = ModelPool.from_configs(
        [
            PoolModelConfig(name=m, model=f"openai/{m}", api_base="http://127.0.0.1:9/v1",
                            price=ModelPrice(input=Decimal(p), output=Decimal(p)))
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

    return pick


def test_the_compact_policy_serves_it_by_topic_and_by_cost(built: tuple[Path, dict]) -> None:
    out, _ = built
    pick = serving(out / "checkpoint")
    # With cost nearly free, each topic goes to its specialist; when cost dominates, the
    # cheap generalist gets both.
    assert pick("Solve for x: x + 12 = 40.", 0.0) == "math-pro"
    assert pick("Write a short poem about the moon at night.", 0.0) == "poet"
    assert pick("Solve for x: x + 12 = 40.", 5.0) == "cheap"
    assert pick("Compose a haiku on winter and rain.", 5.0) == "cheap"
    # Far out, the gated reward's capped penalty zeroes every model: the tie goes to the
    # cheapest, never to an expensive model for nothing.
    assert pick("Solve for x: x + 12 = 40.", 500.0) == "cheap"


@pytest.mark.parametrize("estimator", ["snips", "dr"])
def test_built_from_logged_traffic_with_doubly_robust_outcomes(
    big_tables: tuple[list[OutcomeRecord], list[OutcomeRecord]], tmp_path: Path, estimator: str
) -> None:
    """Each prompt logged with one model's outcome, chosen uniformly at random (propensity
    1/3): the stored estimates recover what the full table says, and the router serves it."""
    full, logged = big_tables
    table = tmp_path / "logged.jsonl"
    write_outcome_table(logged, table)
    out = tmp_path / "run"
    code = main(["--table", str(table), "--out", str(out), "--offpolicy", "--knn", "5,40,1000",
                 "--estimator", estimator, "--cost-scale", "0.01", "--val-lambdas", "0,1",
                 "--report-test", "--threads", "1"])  # fmt: skip
    assert code == 0
    ckpt = load_checkpoint(out / "checkpoint")
    arch, meta = ckpt.architecture, ckpt.metadata
    assert meta.training["mode"] == "knn-offpolicy" and meta.training["config"]["offpolicy"] is True
    assert meta.training["stored_outcomes"] == "doubly_robust"
    # Validation and test are off-policy estimates on the logged parts.
    for part in ("validation", "test"):
        for m in meta.metrics[part].values():
            assert {"ips", "snips", "logging_policy_reward", "match_rate"} <= set(m)
            assert ("dr" in m) == (estimator == "dr")
            assert m["reward"] == m[estimator]
    assert meta.training["neighbours_tried"] and arch.neighbours in (5, 40, arch.n_examples)

    # The stored per-prompt estimates, averaged per topic, are close to each model's true
    # mean on that topic (the table's accuracies), though each prompt saw one model.
    by_id = {r.id: r for r in full}
    cfg = TrainConfig()
    rows = [r for r in logged if split_of(r.id, cfg.fractions, cfg.split_seed) == "train"]
    assert len(rows) == arch.n_examples
    scores = ckpt.weights["scores"]
    for topic, accuracy in ACCURACY.items():
        mine = [i for i, r in enumerate(rows) if by_id[r.id].task == topic]
        for j, model in enumerate(ckpt.pool):
            assert scores[mine, j].mean() == pytest.approx(accuracy[model], abs=0.12)

    pick = serving(out / "checkpoint")
    assert pick("Solve for x: x + 12 = 40.", 0.0) == "math-pro"
    assert pick("Write a short poem about the moon at night.", 0.0) == "poet"
    assert pick("Compose a haiku on winter and rain.", 5.0) == "cheap"


def test_knn_refuses_a_logged_table_without_offpolicy_and_bad_k(
    tables: tuple[list[OutcomeRecord], list[OutcomeRecord]], tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    _, logged = tables
    table = tmp_path / "logged.jsonl"
    write_outcome_table(logged, table)
    argv = ["--table", str(table), "--out", str(tmp_path / "o"), "--knn", "5"]
    # Without --offpolicy, a kNN checkpoint takes every model's outcome as known.
    assert main(argv) == 2
    assert "train on them with --offpolicy" in capsys.readouterr().err
    # A k of 0 is refused as the option is read, by argparse (exit 2, its usage line).
    with pytest.raises(SystemExit) as exited:
        main([*argv[:-1], "0", "--offpolicy"])
    assert exited.value.code == 2
    assert "argument --knn: expected comma-separated positive integers" in (capsys.readouterr().err)


def test_report_test_on_an_empty_test_split_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Two records split into training and validation only: --report-test has nothing to
    score, which it said nowhere (summary.json simply had no test figures)."""
    ids = ["r0", "r1"]
    assert sorted(split_of(i) for i in ids) == ["train", "validation"]
    rows = [
        OutcomeRecord.model_validate(
            {
                "id": i,
                "prompt": f"question {i}",
                "outcomes": {
                    "a": {"score": 1.0, "cost_usd": 0.001},
                    "b": {"score": float(n), "cost_usd": 0.0001},
                },
            }
        )
        for n, i in enumerate(ids)
    ]
    table = tmp_path / "two.jsonl"
    write_outcome_table(rows, table)
    out = tmp_path / "run"
    with caplog.at_level("WARNING"):
        assert main(["--table", str(table), "--out", str(out), "--knn", "1", "--report-test"]) == 0
    assert "--report-test: the test split is empty" in caplog.text
    assert "test" not in json.loads((out / "summary.json").read_text())
