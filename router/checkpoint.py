"""Compact-policy checkpoints: weights (safetensors) plus JSON metadata.

Two layouts, both written by :func:`save_checkpoint` and read by :func:`load_checkpoint`:

- a directory holding ``weights.safetensors`` and ``checkpoint.json`` (the default: easy to
  inspect and diff);
- a single ``*.safetensors`` file whose header metadata carries the same JSON under the key
  ``xrouter_checkpoint`` (one file to ship).

The metadata says everything needed to decide whether a checkpoint may serve a pool: the
ordered pool it was trained on (position = action index), the prices at training time, the
feature version of the inputs, the architecture, and how it was trained and scored.
numpy + safetensors + pydantic only: the gateway loads checkpoints without torch.

Whether a checkpoint may serve a configured pool is decided in :mod:`router.checkpoint_pool`;
finding the checkpoints under a directory, in :mod:`router.checkpoint_registry`.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
import os
import shutil
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

FORMAT: Literal["xrouter-compact"] = "xrouter-compact"
FORMAT_VERSION = 1
WEIGHTS_FILE = "weights.safetensors"
META_FILE = "checkpoint.json"
HEADER_KEY = "xrouter_checkpoint"


PACKAGED_PREFIX = "packaged:"
DEFAULT_PACKAGED = "demo"


class CheckpointError(ValueError):
    """A checkpoint is missing, malformed or internally inconsistent."""


def _packaged_root() -> Path:
    return Path(str(resources.files("router").joinpath("assets/checkpoints")))


def packaged_checkpoint_names() -> list[str]:
    """The checkpoints shipped inside the package (``router/assets/checkpoints``)."""
    return sorted(p.name for p in _packaged_root().iterdir() if (p / META_FILE).is_file())


def packaged_checkpoint_path(name: str = DEFAULT_PACKAGED) -> Path:
    path = _packaged_root() / name
    if "/" in name or name.startswith(".") or not (path / META_FILE).is_file():
        raise CheckpointError(
            f"no packaged checkpoint {name!r}; packaged: {', '.join(packaged_checkpoint_names())}"
        )
    return path


def is_packaged(checkpoint: str) -> bool:
    """Whether ``checkpoint`` names one shipped with xrouter: ``packaged:<name>``, or a path
    inside the installed package's checkpoints (compared as written: no file I/O)."""
    if checkpoint.startswith(PACKAGED_PREFIX):
        return True
    root = os.path.normpath(os.path.abspath(_packaged_root()))
    path = os.path.normpath(os.path.abspath(checkpoint))
    return os.path.commonpath([root, path]) == root


def default_checkpoint_path() -> Path:
    """The checkpoint the gateway serves when none is configured: ``demo``, for the demo pool."""
    return packaged_checkpoint_path(DEFAULT_PACKAGED)


def checkpoint_location(path: str | Path) -> Path:
    """A checkpoint path, or ``packaged:<name>`` for one shipped with xrouter (installed
    packages live in site-packages, whose path operators should not have to spell). A
    checkpoint directory may also be named by its ``checkpoint.json`` or by the run
    directory (``xrouter train --out``) that holds it. Blocking file I/O (a stat or two)."""
    text = str(path)
    if text.startswith(PACKAGED_PREFIX):
        return packaged_checkpoint_path(text.removeprefix(PACKAGED_PREFIX))
    p = Path(path)
    if p.name == META_FILE and p.is_file():
        return p.parent
    if p.is_dir() and not (p / META_FILE).exists() and (p / "checkpoint" / META_FILE).is_file():
        return p / "checkpoint"
    return p


class LambdaEncoding(BaseModel):
    """How the cost weight λ enters the network (see ``router.policies.compact.encode_lambda``).

    ``u = log1p(λ / lambda_scale) / log_scale`` (0 at λ = 0, about 1 at the largest trained λ;
    dividing by ``lambda_scale`` ≈ the smallest trained λ keeps small cost weights apart,
    which plain ``log1p(λ)`` squashes together); the encoding is ``[u, sin(πfu), cos(πfu) for
    f in fourier_freqs, 1 − exp(−λ/c) for c in monotone_scales]``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    lambda_scale: float = Field(default=0.01, gt=0)
    log_scale: float = Field(default=math.log1p(30.0 / 0.01), gt=0)
    fourier_freqs: tuple[float, ...] = (0.5, 1.0, 2.0)
    monotone_scales: tuple[float, ...] = (0.03, 0.5, 10.0)

    @field_validator("fourier_freqs", "monotone_scales")
    @classmethod
    def _finite(cls, value: tuple[float, ...], info: Any) -> tuple[float, ...]:
        # A scale of 0 divides λ = 0 by 0; a negative one sends exp(−λ/c) to infinity:
        # either way the logits are NaN and every choice silently the first model.
        if not all(math.isfinite(v) and v > 0 for v in value):
            raise ValueError(f"{info.field_name} must be positive and finite: {list(value)}")
        return value

    @property
    def dim(self) -> int:
        return 1 + 2 * len(self.fourier_freqs) + len(self.monotone_scales)

    @property
    def lambda_max(self) -> float:
        """The largest cost weight the encoding spans (u = 1): the top of the range the
        network was trained on."""
        return self.lambda_scale * math.expm1(self.log_scale)


class PlanSpec(BaseModel):
    """One multi-call plan of a ``cascade`` checkpoint (``router.plans.CascadePlan``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    order: tuple[str, ...] = Field(min_length=1)
    k: int = Field(default=2, ge=1)
    quorum: int = Field(default=2, ge=2)

    @model_validator(mode="after")
    def _valid(self) -> PlanSpec:
        if len(set(self.order)) != len(self.order):
            raise ValueError(f"plan order repeats a model: {list(self.order)}")
        if self.k > len(self.order):
            raise ValueError(f"plan calls k={self.k} models first but has {len(self.order)}")
        return self


class Architecture(BaseModel):
    """How a checkpoint maps features and λ to decisions.

    - ``mlp`` (trained by policy gradient): an MLP over [standardized features,
      λ-encoding]; the λ-encoding is fed again to the output layer so the cost trade-off can
      act directly on the logits.
    - ``knn``: the training prompts themselves — the first ``similarity_dims`` feature
      columns of ``n_examples`` prompts (the static embedding), each model's score and
      normalized cost on them; a request's logits are each model's expected reward over its
      ``neighbours`` most similar prompts (``router.policies.knn``).
    - ``cascade``: like ``knn``, but what is ranked are multi-call ``plans`` (call cheap
      models first, escalate until answers agree); it stores every plan's score and
      normalized cost on each training prompt and runs the plan with the best expected
      reward over the neighbours (``router.policies.planned``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["mlp", "knn", "cascade"] = "mlp"
    input_dim: int = Field(gt=0)
    hidden: tuple[int, ...] = (128, 128)
    activation: Literal["gelu_tanh", "relu", "silu"] = "gelu_tanh"
    n_actions: int = Field(gt=0)
    lambda_encoding: LambdaEncoding = Field(default_factory=LambdaEncoding)
    neighbours: int = Field(default=0, ge=0)
    n_examples: int = Field(default=0, ge=0)
    similarity_dims: int = Field(default=0, ge=0)
    plans: tuple[PlanSpec, ...] = ()

    @model_validator(mode="after")
    def _knn_fields(self) -> Architecture:
        if self.kind == "cascade" and not self.plans:
            raise ValueError("a cascade architecture needs at least one plan")
        if self.kind != "cascade" and self.plans:
            raise ValueError(f"a {self.kind} architecture has no plans")
        if self.kind in ("knn", "cascade") and not (
            1 <= self.neighbours <= self.n_examples and 1 <= self.similarity_dims <= self.input_dim
        ):
            raise ValueError(
                f"a {self.kind} architecture needs 1 <= neighbours <= n_examples and "
                "1 <= similarity_dims <= input_dim"
            )
        return self

    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor of the checkpoint and its shape (torch layout: (out, in))."""
        if self.kind == "knn":
            n, m = self.n_examples, self.n_actions
            return {
                "examples": (n, self.similarity_dims),
                "scores": (n, m),
                "normalized_costs": (n, m),
            }
        if self.kind == "cascade":
            n, p = self.n_examples, len(self.plans)
            return {
                "examples": (n, self.similarity_dims),
                "plan_scores": (n, p),
                "plan_normalized_costs": (n, p),
            }
        e = self.lambda_encoding.dim
        shapes: dict[str, tuple[int, ...]] = {
            "input_mean": (self.input_dim,),
            "input_std": (self.input_dim,),
        }
        prev = self.input_dim + e
        for i, width in enumerate(self.hidden):
            shapes[f"layers.{i}.weight"] = (width, prev)
            shapes[f"layers.{i}.bias"] = (width,)
            prev = width
        shapes["head.weight"] = (self.n_actions, prev + e)
        shapes["head.bias"] = (self.n_actions,)
        return shapes


class CheckpointMetadata(BaseModel):
    model_config = ConfigDict(extra="allow")

    format: Literal["xrouter-compact"] = FORMAT
    format_version: int = FORMAT_VERSION
    created_at: dt.datetime = Field(default_factory=lambda: dt.datetime.now(dt.UTC))
    name: str = ""
    description: str = ""
    # Ordered: position i is the model of logit i.
    pool: list[str]
    # USD per 1M tokens as decimal strings, {"<model>": {"input": "0.2", "output": "0.2"}};
    # a model may be absent when its price was unknown at training time.
    prices: dict[str, dict[str, str]] = Field(default_factory=dict)
    feature_version: str
    feature_config: dict[str, Any] = Field(default_factory=dict)
    architecture: Architecture
    reward: dict[str, Any] = Field(default_factory=dict)
    training: dict[str, Any] = Field(default_factory=dict)
    metrics: dict[str, Any] = Field(default_factory=dict)

    @field_validator("pool")
    @classmethod
    def _unique_pool(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError("pool is empty")
        if len(set(v)) != len(v):
            raise ValueError(f"pool has duplicate models: {v}")
        return v


@dataclass(slots=True)
class CompactCheckpoint:
    metadata: CheckpointMetadata
    weights: dict[str, np.ndarray]
    path: Path | None = None
    # ``version``, hashed once: a checkpoint is not changed after it is loaded or saved.
    _version: str | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def pool(self) -> list[str]:
        return list(self.metadata.pool)

    @property
    def feature_version(self) -> str:
        return self.metadata.feature_version

    @property
    def version(self) -> str:
        """A short content hash of weights and metadata: names exactly this checkpoint in
        logs, the ledger and reload responses."""
        if self._version is None:
            h = hashlib.sha256(self.metadata.model_dump_json().encode())
            for name in sorted(self.weights):
                h.update(name.encode())
                h.update(np.ascontiguousarray(self.weights[name], dtype=np.float32).tobytes())
            self._version = h.hexdigest()[:12]
        return self._version

    @property
    def architecture(self) -> Architecture:
        return self.metadata.architecture

    def validate(self) -> None:
        """Raise :class:`CheckpointError` unless metadata and weights agree."""
        meta = self.metadata
        where = str(self.path) if self.path else "checkpoint"
        if meta.format_version > FORMAT_VERSION:
            raise CheckpointError(
                f"{where}: format version {meta.format_version} is newer than this xrouter "
                f"understands ({FORMAT_VERSION}); upgrade xrouter"
            )
        if meta.architecture.n_actions != len(meta.pool):
            raise CheckpointError(
                f"{where}: architecture has {meta.architecture.n_actions} actions but the pool "
                f"lists {len(meta.pool)} models"
            )
        expected = meta.architecture.weight_shapes()
        missing = sorted(set(expected) - set(self.weights))
        extra = sorted(set(self.weights) - set(expected))
        if missing or extra:
            raise CheckpointError(f"{where}: weights missing {missing}, unexpected {extra}")
        for name, shape in expected.items():
            w = self.weights[name]
            if tuple(w.shape) != shape:
                raise CheckpointError(f"{where}: {name} has shape {w.shape}, expected {shape}")
            if not np.all(np.isfinite(w)):
                raise CheckpointError(f"{where}: {name} has non-finite values")
        if meta.architecture.kind == "mlp" and np.any(self.weights["input_std"] <= 0):
            raise CheckpointError(f"{where}: input_std must be positive")
        for plan in meta.architecture.plans:
            unknown = [m for m in plan.order if m not in meta.pool]
            if unknown:
                raise CheckpointError(
                    f"{where}: a plan calls {', '.join(unknown)}, not in the checkpoint's pool"
                )


def is_single_file(path: Path) -> bool:
    """Whether ``path`` names a one-file checkpoint (weights with the metadata in their
    header) rather than a checkpoint directory."""
    return path.suffix == ".safetensors"


def save_checkpoint(
    path: str | Path, metadata: CheckpointMetadata, weights: dict[str, np.ndarray]
) -> CompactCheckpoint:
    """Validate and write a checkpoint (a directory, or one file if ``path`` ends in
    ``.safetensors``). Returns the checkpoint as it will load."""
    p = Path(path)
    arrays = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in weights.items()}
    ckpt = CompactCheckpoint(metadata, arrays, p)
    ckpt.validate()
    meta_json = metadata.model_dump_json(indent=2)
    if is_single_file(p):
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(p.name + ".tmp")
        save_file(arrays, str(tmp), metadata={HEADER_KEY: meta_json})
        tmp.chmod(0o644)  # safetensors creates files owner-only; a checkpoint is not a secret
        tmp.replace(p)
    elif p.is_symlink():
        _write_dir(p, arrays, meta_json)  # into the directory it names, as it always was
    else:
        # Written whole beside it, then swapped in: a checkpoint retrained in place (a run
        # directory a gateway serves, whose file watcher reloads it) is never read with new
        # weights and old metadata, and one replaced is missing only between two renames.
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(f"{p.name}.tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        _write_dir(tmp, arrays, meta_json)
        old = p.with_name(f"{p.name}.old-{os.getpid()}")
        if p.is_dir():
            p.rename(old)
        try:
            tmp.rename(p)
        except OSError:
            if old.is_dir():
                old.rename(p)  # the checkpoint that was there stays
            raise
        shutil.rmtree(old, ignore_errors=True)
    return ckpt


def _write_dir(p: Path, arrays: dict[str, np.ndarray], meta_json: str) -> None:
    p.mkdir(parents=True, exist_ok=True)
    save_file(arrays, str(p / WEIGHTS_FILE))
    (p / WEIGHTS_FILE).chmod(0o644)
    (p / META_FILE).write_text(meta_json + "\n", encoding="utf-8")


def _parse_metadata(raw: str | bytes, where: str) -> CheckpointMetadata:
    try:
        data = json.loads(raw)
    except ValueError as exc:  # JSONDecodeError, or UnicodeDecodeError for bytes not UTF-8
        raise CheckpointError(f"{where}: metadata is not valid JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise CheckpointError(f"{where}: not an {FORMAT} checkpoint")
    try:
        return CheckpointMetadata.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(x) for x in first["loc"]) or "(metadata)"
        raise CheckpointError(f"{where}: {loc}: {first['msg']}") from None


def read_metadata(path: str | Path) -> CheckpointMetadata:
    """The metadata only (cheap: no weights are read)."""
    p = checkpoint_location(path)
    if p.is_dir():
        meta = p / META_FILE
        if not meta.is_file():
            raise CheckpointError(f"{p}: no {META_FILE}")
        return _parse_metadata(meta.read_bytes(), str(meta))
    if p.is_file():
        try:
            with safe_open(str(p), framework="np") as fh:
                header = fh.metadata() or {}
        except Exception as exc:  # safetensors raises its own error types
            raise CheckpointError(f"{p}: not a safetensors file ({exc})") from None
        if HEADER_KEY not in header:
            raise CheckpointError(f"{p}: safetensors file has no {HEADER_KEY} metadata")
        return _parse_metadata(header[HEADER_KEY], str(p))
    raise CheckpointError(f"{p}: no such checkpoint")


def load_checkpoint(path: str | Path) -> CompactCheckpoint:
    """Read and validate a checkpoint directory or file. Blocking file I/O: call it at
    startup or from a thread."""
    p = checkpoint_location(path)
    metadata = read_metadata(p)
    weights_path = p / WEIGHTS_FILE if p.is_dir() else p
    if not weights_path.is_file():
        raise CheckpointError(f"{p}: no {WEIGHTS_FILE}")
    try:
        weights = load_file(str(weights_path))
    except Exception as exc:
        raise CheckpointError(f"{weights_path}: cannot read weights ({exc})") from None
    ckpt = CompactCheckpoint(metadata, {k: v.astype(np.float32) for k, v in weights.items()}, p)
    ckpt.validate()
    return ckpt
