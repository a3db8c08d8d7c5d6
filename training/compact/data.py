"""Outcome tables as arrays, rewards, λ sampling and cached features (numpy only)."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
import os
import time
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from pricing import PriceCatalog, load_default_catalog
from router.checkpoint import LambdaEncoding
from router.features import FeatureExtractor
from router.outcomes import OutcomeRecord
from training.compact.config import TrainConfig
from training.datasets.prices import call_cost_usd, load_price_table
from training.reward import RewardConfig, compute_reward

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class TableArrays:
    """An outcome table as matrices over an ordered pool (NaN where a model has no outcome)."""

    ids: list[str]
    conversations: list[list[dict[str, Any]]]
    models: list[str]
    score: np.ndarray
    cost: np.ndarray
    logged_action: np.ndarray  # index into models, -1 when the record was not logged
    logged_propensity: np.ndarray

    @property
    def available(self) -> np.ndarray:
        return np.isfinite(self.score) & np.isfinite(self.cost)

    @classmethod
    def from_records(
        cls,
        records: Sequence[OutcomeRecord],
        models: Sequence[str],
        prices: PriceCatalog | None = None,
    ) -> TableArrays:
        n, a = len(records), len(models)
        score = np.full((n, a), np.nan)
        cost = np.full((n, a), np.nan)
        action = np.full(n, -1, dtype=np.int64)
        prop = np.ones(n)
        index = {m: j for j, m in enumerate(models)}
        multi = 0
        for i, r in enumerate(records):
            if r.logged is not None and r.logged.multi_call:
                # No single model's outcome was observed: the row stays unknown and
                # unlogged, so off-policy learning skips it.
                multi += 1
                continue
            for m, o in r.outcomes.items():
                j = index.get(m)
                if j is None:
                    continue
                score[i, j] = o.score
                if o.cost_usd is not None:
                    cost[i, j] = o.cost_usd
                elif (
                    prices is not None
                    and o.prompt_tokens is not None
                    and o.completion_tokens is not None
                ):
                    cost[i, j] = call_cost_usd(
                        prices, m, o.prompt_tokens, o.completion_tokens, r.id
                    )
                else:
                    raise ValueError(
                        f"record {r.id!r}: model {m!r} has neither cost_usd nor tokens and prices"
                    )
            if r.logged is not None and r.logged.action in index:
                action[i] = index[r.logged.action]
                prop[i] = r.logged.propensity
        if multi:
            logger.warning(
                "%d logged records are multi-call trajectories (several models called for one "
                "request, as a cascade's plan): skipped, "
                "their outcome is not one model's",
                multi,
            )
        return cls(
            [r.id for r in records],
            [r.chat_messages() for r in records],
            list(models),
            score,
            cost,
            action,
            prop,
        )

    def subset(self, rows: np.ndarray) -> TableArrays:
        return TableArrays(
            [self.ids[i] for i in rows],
            [self.conversations[i] for i in rows],
            self.models,
            self.score[rows],
            self.cost[rows],
            self.logged_action[rows],
            self.logged_propensity[rows],
        )


def pool_of(records: Sequence[OutcomeRecord], full_information: bool = True) -> list[str]:
    """The models of a table, in first-seen order; with full information only the models
    that every record has an outcome for."""
    order: dict[str, int] = {}
    for r in records:
        for m in r.outcomes:
            order.setdefault(m, len(order))
    models = list(order)
    if full_information:
        models = [m for m in models if all(m in r.outcomes for r in records)]
    return models


def reward_matrix(
    score: np.ndarray,
    cost: np.ndarray,
    cost_weights: np.ndarray,
    config: RewardConfig,
    reference_cost: np.ndarray | None = None,
) -> np.ndarray:
    """``R[i, j]`` = the reward of model j on prompt i at cost weight λ_i (NaN if unknown).
    Goes through ``compute_reward`` entry by entry: there is one reward definition."""
    out = np.full(score.shape, np.nan)
    for i in range(score.shape[0]):
        lam = float(cost_weights[i])
        ref = None if reference_cost is None else float(reference_cost[i])
        for j in range(score.shape[1]):
            s, c = score[i, j], cost[i, j]
            if math.isfinite(s) and math.isfinite(c):
                out[i, j] = compute_reward(float(s), float(c), lam, config, ref).reward
    return out


def sample_lambdas(rng: np.random.Generator, n: int, cfg: TrainConfig) -> np.ndarray:
    """λ = 0 with probability ``lambda_zero_prob``, else log-uniform on [λ_min, λ_max]."""
    lo, hi = (math.log(v) for v in cfg.lambda_range)
    lam = np.exp(rng.uniform(lo, hi, size=n))
    lam[rng.random(n) < cfg.lambda_zero_prob] = 0.0
    return lam


def auto_lambda_range(
    cost: np.ndarray, config: RewardConfig, reference_cost: np.ndarray | None = None
) -> tuple[float, float]:
    """The cost weights over which the choice of model changes, from the models' mean
    normalized costs c̃: from where the dearest model's penalty is a hundredth of a score
    point (0.01 / max c̃) toward where even the cheapest model's penalty reaches a full point
    (1 / min c̃), both rounded *down* to a power of ten (so the top of the range can fall
    short of that point by up to tenfold: 63 gives 10; the default checkpoints were trained
    so, and a λ above the range is served at its top), and at least two decades wide."""
    norm = (
        cost / reference_cost[:, None] if reference_cost is not None else cost / config.cost_scale
    )
    finite = np.isfinite(norm)
    # A model never logged (partial feedback) has no cost here: it has no mean either.
    counts = finite.sum(axis=0)
    sums = np.where(finite, norm, 0.0).sum(axis=0)
    c = np.divide(sums, counts, out=np.full(counts.shape, np.nan), where=counts > 0)
    c = c[np.isfinite(c) & (c > 0)]
    if c.size == 0:
        return 0.01, 10.0
    lo = 10.0 ** math.floor(math.log10(0.01 / float(c.max())))
    hi = 10.0 ** math.floor(math.log10(1.0 / float(c.min())))
    return lo, max(hi, lo * 100)


def resolve_lambdas(
    cfg: TrainConfig, arrays: TableArrays, reference_cost: np.ndarray | None = None
) -> TrainConfig:
    """The config with its λ range and validation λs filled in from the (training) table."""
    lo, hi = auto_lambda_range(arrays.cost, cfg.reward_config(), reference_cost)
    lam_min, lam_max = cfg.lambda_min, cfg.lambda_max
    if lam_min is None:
        # Two decades under a given λ_max at least, so that it is a range.
        lam_min = lo if lam_max is None else min(lo, lam_max / 100)
    if lam_max is None:
        lam_max = max(hi, lam_min * 100)
    val = cfg.val_lambdas
    if val is None:
        k0, k1 = math.ceil(math.log10(lam_min) - 1e-9), math.floor(math.log10(lam_max) + 1e-9)
        val = (0.0, *(float(10.0**k) for k in range(k0, k1 + 1)))
    return dataclasses.replace(cfg, lambda_min=lam_min, lambda_max=lam_max, val_lambdas=val)


def stratified_lambdas(rng: np.random.Generator, k: int, cfg: TrainConfig) -> np.ndarray:
    """``k`` cost weights, one log-uniform draw in each of ``k`` equal slices of
    [log λ_min, log λ_max], each replaced by 0 with probability ``lambda_zero_prob``."""
    lo, hi = (math.log(v) for v in cfg.lambda_range)
    edges = np.linspace(lo, hi, k + 1)
    lam = np.exp(rng.uniform(edges[:-1], edges[1:]))
    lam[rng.random(k) < cfg.lambda_zero_prob] = 0.0
    return lam


def lambda_encoding_for(cfg: TrainConfig) -> LambdaEncoding:
    """Scale the λ encoding to the trained range: u = log1p(λ/λ_min)/log1p(λ_max/λ_min)
    spans [0, 1], and the saturating terms switch on at the low end, middle and high end."""
    lo, hi = cfg.lambda_range
    scales = (
        np.geomspace(lo * 3.0, hi / 3.0, 3) if hi / lo > 9.0 else np.array([lo, (lo + hi) / 2, hi])
    )
    return LambdaEncoding(
        lambda_scale=lo,
        log_scale=math.log1p(hi / lo),
        fourier_freqs=(0.5, 1.0, 2.0),
        monotone_scales=tuple(float(f"{s:.4g}") for s in scales),
    )


# -- features ---------------------------------------------------------------------------


def cached_features(
    conversations: Sequence[list[dict[str, Any]]],
    extractor: FeatureExtractor,
    cache_dir: Path | None,
) -> np.ndarray:
    """Features of many conversations, cached in ``cache_dir`` under a hash of the
    conversations and the feature version (so a changed table or extractor misses)."""
    h = hashlib.sha256(extractor.feature_version.encode())
    for conv in conversations:
        h.update(orjson.dumps(conv, option=orjson.OPT_SORT_KEYS))
        h.update(b"\x1e")
    key = h.hexdigest()[:20]
    path = cache_dir / f"features-{key}.npz" if cache_dir is not None else None
    if path is not None and path.is_file():
        try:
            with np.load(path) as data:
                cached: np.ndarray = data["x"]
        except (OSError, ValueError, KeyError, zipfile.BadZipFile) as exc:
            # A damaged file (say, from an older version's interrupted write) is a miss to
            # recompute and overwrite, not an error every later run on this table dies of.
            logger.warning("feature cache %s is unreadable (%s): recomputing", path, exc)
        else:
            if cached.shape == (len(conversations), extractor.dim):
                logger.info("features from cache %s", path)
                return cached
    started = time.perf_counter()
    x: np.ndarray = extractor.extract_batch(conversations)
    logger.info(
        "computed %d feature vectors in %.2fs", len(conversations), time.perf_counter() - started
    )
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Written aside and renamed into place: a run stopped mid-write (features of a large
        # table take a while) must not leave half a file under the name the next run reads.
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        try:
            with tmp.open("wb") as f:
                np.savez_compressed(f, x=x, feature_version=np.array(extractor.feature_version))
            tmp.replace(path)
        finally:
            tmp.unlink(missing_ok=True)
    return x


def standardization(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-feature mean and std for the network's input. Constant columns get std 1 (their
    weights stay near zero instead of amplifying an unseen value at serving time), and a
    floor keeps rare binary features from being scaled up by 100x."""
    mean = x.mean(axis=0)
    std = x.std(axis=0)
    std = np.where(std < 1e-6, 1.0, np.maximum(std, 0.02))
    return mean.astype(np.float32), std.astype(np.float32)


def resolve_prices(
    models: Sequence[str], prices_path: str | Path | None
) -> tuple[PriceCatalog | None, dict[str, dict[str, str]]]:
    """The price table for deriving missing costs and the snapshot stored in the checkpoint
    (``--prices`` file, else the packaged catalog); unpriced models are left out with a warning."""
    catalog: PriceCatalog | None
    if prices_path is not None:
        catalog = load_price_table(prices_path)
    else:
        try:
            catalog = load_default_catalog()
        except Exception as exc:  # a slim install without the catalog still trains
            logger.warning("no price catalog (%s): the checkpoint will carry no prices", exc)
            catalog = None
    snapshot: dict[str, dict[str, str]] = {}
    for m in models:
        price = catalog.get(m) if catalog is not None else None
        if price is None:
            logger.warning("no price for %r: the checkpoint cannot warn when its price changes", m)
            continue
        snapshot[m] = {"input": str(price.input), "output": str(price.output)}
    return catalog, snapshot
