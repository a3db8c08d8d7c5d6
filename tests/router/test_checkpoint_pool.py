"""Whether a checkpoint may serve a configured pool (``router.checkpoint_pool``)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from router.checkpoint import save_checkpoint
from router.checkpoint_pool import CheckpointPoolMismatch, check_pool
from tests.support.checkpoints import MODELS, make_checkpoint, make_pool


def test_pool_check(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    meta, weights = make_checkpoint()
    ckpt = save_checkpoint(tmp_path / "c", meta, weights)

    same = check_pool(ckpt, make_pool(MODELS))
    assert same.active == MODELS and same.masked == [] and same.warnings == []

    subset = check_pool(ckpt, make_pool(["large", "small"]))
    assert subset.active == ["small", "large"] and subset.masked == ["medium"]

    with caplog.at_level(logging.WARNING):
        changed = check_pool(ckpt, make_pool(MODELS, {"large": ("2.5", "15")}))
    assert changed.price_changes == {"large": {"input": ("3", "2.5")}}
    assert "price of 'large' changed" in caplog.text and "3 -> 2.5" in caplog.text

    # A model added since training: served, never routed to by the checkpoint, and said so.
    with caplog.at_level(logging.WARNING):
        added = check_pool(ckpt, make_pool(["small", "huge"], {"huge": ("9", "9")}))
    assert added.active == ["small"] and added.untrained == ["huge"]
    assert added.masked == ["medium", "large"]
    assert "was not trained on huge: it routes among small only" in caplog.text

    with pytest.raises(CheckpointPoolMismatch) as exc:
        check_pool(ckpt, make_pool(["other"], {"other": ("1", "1")}))
    msg = str(exc.value)
    assert "no model of the pool is in the checkpoint" in msg
    assert "checkpoint pool: small, medium, large" in msg and "configured pool: other" in msg
