"""Compact checkpoints (``router.checkpoint``): round trips in both layouts, validation, and
how a checkpoint is named (a path, a run directory, ``packaged:<name>``). The registry and
the pool check have tests of their own."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from router.checkpoint import (
    CheckpointError,
    default_checkpoint_path,
    is_packaged,
    load_checkpoint,
    packaged_checkpoint_names,
    packaged_checkpoint_path,
    read_metadata,
    save_checkpoint,
)
from tests.support.checkpoints import make_checkpoint


@pytest.mark.parametrize("layout", ["dir", "file.safetensors"])
def test_round_trip(tmp_path: Path, layout: str) -> None:
    meta, weights = make_checkpoint()
    path = tmp_path / layout
    save_checkpoint(path, meta, weights)
    ckpt = load_checkpoint(path)
    assert ckpt.metadata == meta
    assert sorted(ckpt.weights) == sorted(weights)
    for k, w in weights.items():
        assert np.array_equal(ckpt.weights[k], w)
    assert read_metadata(path) == meta
    assert ckpt.version == load_checkpoint(path).version


def test_version_tracks_content(tmp_path: Path) -> None:
    meta, weights = make_checkpoint()
    a = save_checkpoint(tmp_path / "a", meta, weights)
    weights["head.bias"] = weights["head.bias"] + 1
    b = save_checkpoint(tmp_path / "b", meta, weights)
    assert a.version != b.version


def test_a_checkpoint_saved_over_another_is_swapped_in_whole(tmp_path: Path) -> None:
    """Retrained in place (a run directory a gateway serves): the new one is written beside
    the old and renamed over it, so no reader finds new weights with old metadata, and
    nothing of either write is left beside it."""
    meta, weights = make_checkpoint()
    path = tmp_path / "checkpoint"
    old = save_checkpoint(path, meta, weights)
    inode = path.stat().st_ino
    weights["head.bias"] = weights["head.bias"] + 1
    new = save_checkpoint(path, meta.model_copy(update={"name": "second"}), weights)
    assert load_checkpoint(path).version == new.version != old.version
    assert load_checkpoint(path).metadata.name == "second"
    assert path.stat().st_ino != inode  # a new directory, not the old one rewritten
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint"]
    # One named by a symlink is written into the directory it names, as before.
    link = tmp_path / "link"
    link.symlink_to(path)
    save_checkpoint(link, meta, weights)
    assert link.is_symlink() and load_checkpoint(path).metadata.name == meta.name


def test_invalid_checkpoints_are_refused(tmp_path: Path) -> None:
    meta, weights = make_checkpoint()
    bad = dict(weights, **{"layers.0.weight": np.zeros((2, 2), np.float32)})
    with pytest.raises(CheckpointError, match=r"layers\.0\.weight has shape"):
        save_checkpoint(tmp_path / "x", meta, bad)
    nan = dict(weights, **{"head.bias": np.full(3, np.nan, np.float32)})
    with pytest.raises(CheckpointError, match="non-finite"):
        save_checkpoint(tmp_path / "x", meta, nan)
    with pytest.raises(CheckpointError, match="missing"):
        save_checkpoint(
            tmp_path / "x", meta, {k: v for k, v in weights.items() if k != "head.weight"}
        )

    save_checkpoint(tmp_path / "future", meta, weights)
    raw = json.loads((tmp_path / "future" / "checkpoint.json").read_text())
    raw["format_version"] = 99
    (tmp_path / "future" / "checkpoint.json").write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match="newer than this xrouter"):
        load_checkpoint(tmp_path / "future")
    raw["format"] = "something-else"
    (tmp_path / "future" / "checkpoint.json").write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match="not an xrouter-compact checkpoint"):
        load_checkpoint(tmp_path / "future")
    # A λ-encoding scale of 0 or below makes every logit NaN (and every choice the first).
    for scales in ([0.0, 0.3, 3.3], [-0.03, 0.3, 3.3]):
        save_checkpoint(tmp_path / "scales", meta, weights)
        raw = json.loads((tmp_path / "scales" / "checkpoint.json").read_text())
        raw["architecture"]["lambda_encoding"] = {"monotone_scales": scales}
        (tmp_path / "scales" / "checkpoint.json").write_text(json.dumps(raw))
        with pytest.raises(CheckpointError, match="monotone_scales must be positive"):
            load_checkpoint(tmp_path / "scales")
    # Metadata that is not UTF-8: a UnicodeDecodeError escaped `deploy` and the registry.
    (tmp_path / "future" / "checkpoint.json").write_bytes(json.dumps(raw).encode() + b"\xe9")
    with pytest.raises(CheckpointError, match=r"future/checkpoint\.json: metadata is not valid"):
        load_checkpoint(tmp_path / "future")
    (tmp_path / "junk.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(CheckpointError, match="not a safetensors file"):
        load_checkpoint(tmp_path / "junk.safetensors")
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        load_checkpoint(tmp_path / "nowhere")


@pytest.mark.parametrize(
    ("name", "kind", "trained_by"),
    [("demo", "knn", "--knn"), ("demo-rl", "mlp", "training.compact.cli")],
)
def test_packaged_checkpoints_are_valid_small_and_reproducible_by_their_command(
    name: str, kind: str, trained_by: str
) -> None:
    path = packaged_checkpoint_path(name)
    ckpt = load_checkpoint(f"packaged:{name}")
    assert ckpt.path == path and ckpt.version == load_checkpoint(path).version
    assert sum(p.stat().st_size for p in path.iterdir()) < 1_000_000
    meta = ckpt.metadata
    assert meta.architecture.kind == kind
    assert len(meta.pool) == 8 and set(meta.prices) == set(meta.pool)
    assert trained_by in meta.training["command"]
    assert meta.metrics["validation"] and meta.metrics["validation_mean_reward"] > 0
    # Both report the held-out part they never saw while being chosen.
    assert set(meta.metrics["test"]) == set(meta.metrics["validation"])


def test_the_default_is_the_packaged_demo_and_unknown_names_are_refused() -> None:
    assert default_checkpoint_path() == packaged_checkpoint_path("demo")
    assert set(packaged_checkpoint_names()) >= {"demo", "demo-rl"}
    for bad in ("nope", "../demo", ".hidden", ""):
        with pytest.raises(
            CheckpointError, match=r"no packaged checkpoint .*packaged: demo, demo-rl"
        ):
            load_checkpoint(f"packaged:{bad}")


def test_a_checkpoint_is_found_from_its_run_directory_or_its_metadata_file(
    tmp_path: Path,
) -> None:
    import shutil

    from router.checkpoint import META_FILE, checkpoint_location

    src = load_checkpoint("packaged:demo")
    assert src.path is not None
    run = tmp_path / "run"
    shutil.copytree(src.path, run / "checkpoint")
    for named in (run, run / "checkpoint", run / "checkpoint" / META_FILE):
        assert checkpoint_location(named) == run / "checkpoint"
        assert load_checkpoint(named).version == src.version
    # A directory that is neither is left as it is (and said to hold no checkpoint).
    assert checkpoint_location(tmp_path) == tmp_path
    with pytest.raises(CheckpointError, match=r"no checkpoint\.json"):
        load_checkpoint(tmp_path)


def test_packaged_checkpoints_are_known_by_name_or_by_their_installed_path(
    tmp_path: Path,
) -> None:
    demo = packaged_checkpoint_path("demo")
    assert is_packaged("packaged:demo") and is_packaged(str(demo))
    assert is_packaged(f"{demo}/../demo-rl")  # as written, normalized without touching disk
    assert not is_packaged(str(tmp_path / "demo")) and not is_packaged(f"{demo.parent}-copy/x")
