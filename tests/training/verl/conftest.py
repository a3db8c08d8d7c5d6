"""A small outcome table and its verl dataset, shared by the verl tests (the rollout pieces
are in ``tests/support/verl.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from router.outcomes import ModelOutcome, OutcomeRecord
from training.verl.data import VerlDataConfig, write_verl_dataset


def outcome(score: float, cost: float, response: str) -> ModelOutcome:
    return ModelOutcome(score=score, cost_usd=cost, response=response)


def small_table() -> list[OutcomeRecord]:
    """Three models: a cheap one right on even prompts, a mid one right on multiples of
    three, an expensive one always right. The mid model has no outcome on prompt 5."""
    records = []
    for i in range(30):
        outcomes = {
            "cheap": outcome(1.0 if i % 2 == 0 else 0.0, 0.0001, "B" if i % 2 == 0 else "A"),
            "mid": outcome(1.0 if i % 3 == 0 else 0.0, 0.001, "B" if i % 3 == 0 else "C"),
            "dear/model:v1": outcome(1.0, 0.01, "The answer is B."),
        }
        if i == 5:
            del outcomes["mid"]
        records.append(
            OutcomeRecord(
                id=f"q{i}", task="mc", prompt=f"Question {i}: A, B or C?", outcomes=outcomes
            )
        )
    return records


@pytest.fixture(scope="module")
def verl_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("verl")
    write_verl_dataset(small_table(), out, VerlDataConfig(lambdas=(0.0, 0.5)))
    return out
