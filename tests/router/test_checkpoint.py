"""Compact checkpoints: round trips in both layouts, validation, the registry, and the pool
check that decides whether a checkpoint may serve a configured pool."""

from __future__ import annotations

import datetime as dt
import json
import logging
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest

from pricing import ModelPrice, PriceCatalog
from router.checkpoint import (
    Architecture,
    CheckpointError,
    CheckpointMetadata,
    default_checkpoint_path,
    is_packaged,
    load_checkpoint,
    packaged_checkpoint_names,
    packaged_checkpoint_path,
    read_metadata,
    save_checkpoint,
)
from router.checkpoint_pool import CheckpointPoolMismatch, check_pool
from router.checkpoint_registry import list_checkpoints
from router.pool import ModelPool, PoolModelConfig

MODELS = ["small", "medium", "large"]
PRICES = {"small": ("0.1", "0.2"), "medium": ("0.5", "1.5"), "large": ("3", "15")}


def make_pool(names: list[str], prices: dict[str, tuple[str, str]] | None = None) -> ModelPool:
    table = {**PRICES, **(prices or {})}
    catalog = PriceCatalog(
        {n: ModelPrice(input=Decimal(table[n][0]), output=Decimal(table[n][1])) for n in names}
    )
    return ModelPool.from_configs(
        [
            PoolModelConfig(name=n, model=f"hosted_vllm/{n}", api_base="http://127.0.0.1:9/v1")
            for n in names
        ],
        catalog,
    )


def make_checkpoint(
    seed: int = 0, created: dt.datetime | None = None
) -> tuple[CheckpointMetadata, dict[str, np.ndarray]]:
    arch = Architecture(input_dim=6, hidden=(5, 4), n_actions=len(MODELS))
    rng = np.random.default_rng(seed)
    weights = {k: rng.normal(size=s).astype(np.float32) for k, s in arch.weight_shapes().items()}
    weights["input_std"] = np.abs(weights["input_std"]) + np.float32(0.5)
    meta = CheckpointMetadata(
        name=f"test-{seed}",
        pool=MODELS,
        prices=make_pool(MODELS).price_snapshot(),
        feature_version="fx1-test",
        architecture=arch,
        reward={"form": "gated"},
        training={"steps": 3},
        metrics={"validation_mean_reward": 0.5},
        created_at=created or dt.datetime.now(dt.UTC),
    )
    return meta, weights


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
    (tmp_path / "junk.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(CheckpointError, match="not a safetensors file"):
        load_checkpoint(tmp_path / "junk.safetensors")
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        load_checkpoint(tmp_path / "nowhere")


def test_registry_lists_newest_first_and_skips_junk(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    for i, name in enumerate(["old", "new.safetensors", "mid"]):
        meta, weights = make_checkpoint(i, t0 + dt.timedelta(days=[0, 2, 1][i]))
        save_checkpoint(tmp_path / name, meta, weights)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "checkpoint.json").write_text("{")
    (tmp_path / "notes.txt").write_text("ignored")
    with caplog.at_level(logging.WARNING):
        infos = list_checkpoints(tmp_path)
    assert [i.path.name for i in infos] == ["new.safetensors", "mid", "old"]
    assert infos[0].metadata.name == "test-1"
    assert "broken" in caplog.text
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
