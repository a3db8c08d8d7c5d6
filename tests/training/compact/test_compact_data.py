"""Outcome tables as arrays and the feature cache the trainer and the stored builders share."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from router.features import FeatureExtractor
from training.compact.data import cached_features

CONVERSATIONS = [[{"role": "user", "content": f"What is {i} times {i + 1}?"}] for i in range(6)]


def test_a_damaged_feature_cache_is_recomputed_not_fatal(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A run stopped while writing its cache (Ctrl-C on a large table) leaves half a file;
    # every later run on the same table and cache directory must not die reading it.
    extractor = FeatureExtractor.load()
    cache = tmp_path / "cache"
    x = cached_features(CONVERSATIONS, extractor, cache)
    (path,) = cache.glob("features-*.npz")
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with caplog.at_level(logging.WARNING, logger="training.compact.data"):
        again = cached_features(CONVERSATIONS, extractor, cache)
    np.testing.assert_array_equal(again, x)
    assert "unreadable" in caplog.text
    # Rewritten whole: the next run reads it, and no temporary file is left behind.
    assert [p.name for p in cache.iterdir()] == [path.name]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="training.compact.data"):
        np.testing.assert_array_equal(cached_features(CONVERSATIONS, extractor, cache), x)
    assert "features from cache" in caplog.text


def test_a_training_run_splits_repeats_of_a_prompt_together() -> None:
    """A logged table repeats prompts under distinct ids; the run's parts follow the group
    (the prompt), so no repeat is validated or tested on after being trained on."""
    from training.compact.config import TrainConfig
    from training.compact.run import prepare_table

    from .conftest import make_tables

    full, _ = make_tables(200, seed=3)
    repeated = [
        r.model_copy(update={"id": f"{r.id}-again{k}", "group": r.id})
        for r in full
        for k in range(3)
    ]
    table = prepare_table(repeated, TrainConfig())
    part_of = {
        table.records[i].id: name for name, rows in table.splits.items() for i in rows.tolist()
    }
    for r in full:
        assert len({part_of[f"{r.id}-again{k}"] for k in range(3)}) == 1
    assert all(len(rows) for rows in table.splits.values())
