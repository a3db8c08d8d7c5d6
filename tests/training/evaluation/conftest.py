"""Synthetic full-information outcome tables where routing demonstrably pays off.

Two topics with disjoint vocabularies; the cheap model is good at poems and bad at maths, the
strong one good at both. Responses are multiple-choice letters (the right one when the model
is correct, a wrong one otherwise), so agreement cascades have something to check.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from router.outcomes import OutcomeRecord

MODELS = {"cheap": 1e-4, "mid": 4e-4, "strong": 2e-3}
ACCURACY = {
    "math": {"cheap": 0.2, "mid": 0.6, "strong": 0.95},
    "poem": {"cheap": 0.9, "mid": 0.9, "strong": 0.95},
}
WORDS = {
    "math": "integral derivative equation solve algebra matrix prime factor sum limit".split(),
    "poem": "rhyme verse sonnet stanza meter ballad haiku lyric ode elegy".split(),
}
LETTERS = "ABCD"

TableFactory = Callable[..., list[OutcomeRecord]]


def make_table(
    n: int,
    seed: int = 0,
    models: dict[str, float] | None = None,
    accuracy: dict[str, dict[str, float]] | None = None,
) -> list[OutcomeRecord]:
    models = models or MODELS
    accuracy = accuracy or ACCURACY
    rng = np.random.default_rng(seed)
    records = []
    for i in range(n):
        topic = "math" if i % 2 else "poem"
        text = " ".join(rng.choice(WORDS[topic], size=8)) + f" question {i}?"
        right = LETTERS[int(rng.integers(4))]
        outcomes = {}
        for m, cost in models.items():
            ok = bool(rng.random() < accuracy[topic][m])
            wrong = [x for x in LETTERS if x != right]
            answer = right if ok else wrong[int(rng.integers(3))]
            outcomes[m] = {
                "score": 1.0 if ok else 0.0,
                "cost_usd": cost * (1.0 + 0.1 * rng.random()),
                "response": f"The answer is ({answer}).",
            }
        records.append(
            OutcomeRecord.model_validate(
                {"id": f"s{seed}-{i}", "task": topic, "prompt": text, "outcomes": outcomes}
            )
        )
    return records


@pytest.fixture
def table_factory() -> TableFactory:
    return make_table
