"""Synthetic outcome tables for the compact trainer: two kinds of prompts with different
vocabularies, a maths specialist, a poetry specialist and a cheap generalist, so the best
model depends on the prompt and on the cost weight."""

from __future__ import annotations

import numpy as np
import pytest

from router.outcomes import LoggedAction, ModelOutcome, OutcomeRecord

MODELS = {"math-pro": 0.01, "poet": 0.01, "cheap": 0.001}  # USD per call
ACCURACY = {
    "math": {"math-pro": 0.9, "poet": 0.2, "cheap": 0.45},
    "poem": {"math-pro": 0.2, "poet": 0.9, "cheap": 0.45},
}
TEMPLATES = {
    "math": [
        "Compute the sum of {a} and {b}.",
        "What is {a} times {b}? Show the equation.",
        "Solve for x: x + {a} = {b}.",
    ],
    "poem": [
        "Write a short poem about the {w} at night.",
        "Compose a haiku on {w} and rain.",
        "Write a story about a {w} that sings.",
    ],
}
WORDS = ["moon", "river", "forest", "cat", "city", "ocean", "winter", "garden"]


def make_tables(n: int = 300, seed: int = 0) -> tuple[list[OutcomeRecord], list[OutcomeRecord]]:
    """(full-information records, the same prompts logged by a uniform random router with
    only the chosen model's outcome)."""
    rng = np.random.default_rng(seed)
    full, logged = [], []
    names = list(MODELS)
    for i in range(n):
        topic = "math" if i % 2 else "poem"
        tpl = TEMPLATES[topic][int(rng.integers(3))]
        text = tpl.format(
            a=int(rng.integers(100)),
            b=int(rng.integers(100)),
            w=WORDS[int(rng.integers(len(WORDS)))],
        )
        outcomes = {
            m: ModelOutcome(score=float(rng.random() < ACCURACY[topic][m]), cost_usd=cost)
            for m, cost in MODELS.items()
        }
        full.append(OutcomeRecord(id=f"s{i}", task=topic, prompt=text, outcomes=outcomes))
        a = names[int(rng.integers(len(names)))]
        logged.append(
            OutcomeRecord(
                id=f"s{i}",
                task=topic,
                prompt=text,
                outcomes={a: outcomes[a]},
                logged=LoggedAction(action=a, propensity=1 / len(names)),
            )
        )
    return full, logged


@pytest.fixture(scope="session")
def tables() -> tuple[list[OutcomeRecord], list[OutcomeRecord]]:
    return make_tables()


@pytest.fixture(scope="session")
def big_tables() -> tuple[list[OutcomeRecord], list[OutcomeRecord]]:
    """More prompts: learning from partial feedback needs more data."""
    return make_tables(n=600, seed=1)
