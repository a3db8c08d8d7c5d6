"""The checkpoint registry (``router.checkpoint_registry``): what ``xrouter checkpoints``
finds on disk."""

from __future__ import annotations

import datetime as dt
import logging
from pathlib import Path

import pytest

from router.checkpoint import save_checkpoint
from router.checkpoint_registry import list_checkpoints
from tests.support.checkpoints import make_checkpoint


def test_registry_lists_newest_first_and_skips_junk(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    for i, name in enumerate(["old", "new.safetensors", "mid"]):
        meta, weights = make_checkpoint(i, t0 + dt.timedelta(days=[0, 2, 1][i]))
        save_checkpoint(tmp_path / name, meta, weights)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "checkpoint.json").write_text("{")
    # Not UTF-8: a UnicodeDecodeError escaped and ended the whole listing.
    (tmp_path / "latin1").mkdir()
    (tmp_path / "latin1" / "checkpoint.json").write_bytes(b'{"name": "caf\xe9"}')
    (tmp_path / "notes.txt").write_text("ignored")
    # Metadata without its weights (a copy cut short): deploy and eval refuse it.
    meta, weights = make_checkpoint(9, t0 + dt.timedelta(days=3))
    save_checkpoint(tmp_path / "weightless", meta, weights)
    (tmp_path / "weightless" / "weights.safetensors").unlink()
    with caplog.at_level(logging.WARNING):
        infos = list_checkpoints(tmp_path)
    assert [i.path.name for i in infos] == ["new.safetensors", "mid", "old"]
    assert infos[0].metadata.name == "test-1"
    assert "broken" in caplog.text and "latin1" in caplog.text
    assert "weightless: no weights.safetensors" in caplog.text
    assert list_checkpoints(tmp_path / "missing") == []


def test_registry_finds_the_checkpoints_of_run_directories(tmp_path: Path) -> None:
    """``xrouter train --out RUN`` writes RUN/checkpoint and RUN/checkpoints/step_*: a run
    directory, a directory of runs and several roots are all searched, each checkpoint once."""
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    runs = tmp_path / "runs"
    for i, run in enumerate(["a", "b"]):
        meta, weights = make_checkpoint(i, t0 + dt.timedelta(days=i))
        save_checkpoint(runs / run / "checkpoint", meta, weights)
        step_meta, step_weights = make_checkpoint(10 + i, t0 + dt.timedelta(hours=i))
        save_checkpoint(runs / run / "checkpoints" / "step_000100", step_meta, step_weights)
    assert [i.path.parent.name for i in list_checkpoints(runs)] == ["b", "a"]
    assert [i.path.parent.name for i in list_checkpoints(runs / "a")] == ["a"]
    with_steps = list_checkpoints(runs / "a", steps=True)
    assert [i.path.name for i in with_steps] == ["checkpoint", "step_000100"]
    both = list_checkpoints([runs, runs / "b", runs / "b" / "checkpoint"])
    assert [i.path.parent.name for i in both] == ["b", "a"]  # found twice, listed once


def test_a_checkpoint_without_a_time_zone_is_listed_as_utc(tmp_path: Path) -> None:
    # A created_at with no zone (written by hand or another tool) raised TypeError when
    # sorted with xrouter's own, which are UTC.
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    for i, (name, created) in enumerate(
        [("aware", t0), ("naive", (t0 + dt.timedelta(hours=1)).replace(tzinfo=None))]
    ):
        meta, weights = make_checkpoint(i, created)
        save_checkpoint(tmp_path / name, meta, weights)
    assert [i.path.name for i in list_checkpoints(tmp_path)] == ["naive", "aware"]


def test_registry_looks_a_few_levels_down_and_lists_a_run_s_previous(tmp_path: Path) -> None:
    """Named the project directory (``xrouter checkpoints`` run where the runs live in
    ``runs/<name>``), it found nothing: only the entries directly under it were looked at.
    A run directory retrained with ``--overwrite`` keeps the run it replaced as
    ``previous/``, the checkpoint a rollback deploys: listed with it."""
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    made = {
        "runs/op1/checkpoint": 0,
        "runs/op1/previous/checkpoint": 1,
        "runs/nightly/2026-01-02/checkpoint": 2,
        ".hidden/run/checkpoint": 3,  # .git, .venv, a run set aside: not entered
        "a/b/c/d/checkpoint": 4,  # deeper than the search goes
    }
    for path, i in made.items():
        meta, weights = make_checkpoint(i, t0 + dt.timedelta(days=i))
        save_checkpoint(tmp_path / path, meta, weights)
    found = [i.path.relative_to(tmp_path).as_posix() for i in list_checkpoints(tmp_path)]
    assert found == [
        "runs/nightly/2026-01-02/checkpoint",
        "runs/op1/previous/checkpoint",
        "runs/op1/checkpoint",
    ]
    assert [i.path.parent.name for i in list_checkpoints(tmp_path / "runs" / "op1")] == [
        "previous",
        "op1",
    ]
