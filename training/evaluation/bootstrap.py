"""Paired bootstrap confidence intervals for curve metrics.

A router's AIQ on a few hundred prompts is a noisy number: two routers 0.01 apart may swap
places on another sample of prompts. Resampling the evaluated prompts with replacement and
recomputing every router's curve on the *same* resample (a paired bootstrap) gives
percentile intervals for each AIQ and, more usefully, for the difference between two
routers, whose noise largely cancels because both see the same prompts.

Each resample recomputes everything the metric depends on: every operating point's average
score and cost, the hull, and the AIQ cost range (the single models' costs on that
resample). The routers themselves are not refitted, so the intervals describe the
uncertainty from the evaluated prompts given the trained routers, not from training.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from training.evaluation import metrics
from training.evaluation.metrics import CurvePoint
from training.evaluation.sweep import PromptResults

DEFAULT_LEVEL = 0.95


@dataclass(frozen=True, slots=True)
class Interval:
    """A percentile interval of a bootstrapped quantity around its full-sample value."""

    estimate: float
    low: float
    high: float
    level: float

    def excludes_zero(self) -> bool:
        return self.low > 0.0 or self.high < 0.0

    def to_dict(self) -> dict[str, float]:
        return {"estimate": self.estimate, "low": self.low, "high": self.high, "level": self.level}

    def __str__(self) -> str:
        return f"{self.estimate:+.4f} [{self.low:+.4f}, {self.high:+.4f}]"


def interval(estimate: float, samples: np.ndarray, level: float = DEFAULT_LEVEL) -> Interval:
    if not 0.0 < level < 1.0:
        raise ValueError(f"confidence level must be in (0, 1), got {level}")
    if samples.size == 0:
        raise ValueError("no bootstrap samples")
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(samples, [tail, 1.0 - tail])
    return Interval(float(estimate), float(low), float(high), level)


# Resamples are drawn in blocks of at most this many bytes of weights: a table of 100,000
# prompts would otherwise need 800 MB for 1,000 resamples.
_BLOCK_BYTES = 64 * 2**20


def weight_blocks(n: int, samples: int, seed: int = 0) -> Iterator[np.ndarray]:
    """The full sample (one row of ones), then ``samples`` resamples of ``n`` prompts as
    multiplicity counts (row ``b`` says how often each prompt was drawn; rows sum to
    ``n``), in blocks of rows. Seeded: the same arguments give the same resamples."""
    if n <= 0:
        raise ValueError("nothing to resample")
    if samples <= 0:
        raise ValueError(f"bootstrap samples must be positive, got {samples}")
    rng = np.random.default_rng(seed)
    rows = max(1, _BLOCK_BYTES // (8 * n))
    yield np.ones((1, n))
    left = samples
    while left > 0:
        k = min(rows, left)
        yield rng.multinomial(n, np.full(n, 1.0 / n), size=k).astype(np.float64)
        left -= k


def resample_weights(n: int, samples: int, seed: int = 0) -> np.ndarray:
    """The resamples of ``weight_blocks`` as one (samples, n) array."""
    return np.vstack(list(weight_blocks(n, samples, seed))[1:])


def resampled_means(arrays: Sequence[np.ndarray], samples: int, seed: int = 0) -> list[np.ndarray]:
    """For each (rows, n) array of per-prompt values, each row's mean on the full sample
    (index 0) and on every resample: a (samples + 1, rows) array. Every array is resampled
    the same way (a paired bootstrap)."""
    n = arrays[0].shape[1]
    if any(a.shape[1] != n for a in arrays):
        raise ValueError(f"arrays cover different numbers of prompts: {[a.shape for a in arrays]}")
    parts: list[list[np.ndarray]] = [[] for _ in arrays]
    for w in weight_blocks(n, samples, seed):
        for i, a in enumerate(arrays):
            parts[i].append(w @ a.T / n)
    return [np.vstack(p) for p in parts]


@dataclass(frozen=True, slots=True)
class PromptCurve:
    """A router's operating points as per-prompt arrays: (points, prompts) scores and
    costs."""

    scores: np.ndarray
    costs: np.ndarray
    # Calls to the strong model of a two-model slice (for PGR), when asked for.
    strong_calls: np.ndarray | None = None

    @classmethod
    def from_results(
        cls, results: Sequence[PromptResults], strong: str | None = None
    ) -> PromptCurve:
        if not results:
            raise ValueError("a curve needs at least one operating point")
        return cls(
            np.stack([r.scores for r in results]),
            np.stack([r.costs for r in results]),
            None if strong is None else np.stack([r.calls_to(strong) for r in results]),
        )

    @property
    def n_prompts(self) -> int:
        return int(self.scores.shape[1])


def _aiq(scores: np.ndarray, costs: np.ndarray, c_min: float, c_max: float) -> float:
    points = [CurvePoint(float(c), float(s)) for s, c in zip(scores, costs, strict=True)]
    return metrics.aiq(points, c_min, c_max)


@dataclass(frozen=True, slots=True)
class AIQIntervals:
    """Bootstrap intervals of each router's AIQ, of its gain over no routing (the single
    models' hull on the same resample) and, when a reference router is named, of each other
    router's AIQ minus the reference's (positive: the reference is worse)."""

    samples: int
    level: float
    aiq: dict[str, Interval]
    no_routing: Interval
    gain: dict[str, Interval]
    reference: str | None
    vs_reference: dict[str, Interval]
    # Each router's AIQ on the full sample (index 0) and on every resample, for further
    # paired comparisons (``difference``).
    values: dict[str, np.ndarray] = field(repr=False, default_factory=dict)

    def difference(self, a: str, b: str) -> Interval:
        """Paired interval of AIQ(a) - AIQ(b) on the same resamples."""
        missing = [x for x in (a, b) if x not in self.values]
        if missing:
            raise KeyError(f"no bootstrapped AIQ for {', '.join(missing)}")
        return _interval_of(self.values[a] - self.values[b], self.level)


def _intervals(
    values: Mapping[str, np.ndarray], reference: str | None, level: float
) -> tuple[dict[str, Interval], dict[str, Interval]]:
    """From each router's full-sample value (index 0) and resampled values: its interval,
    and each other router's difference from the reference (none without a reference)."""
    own = {k: _interval_of(v, level) for k, v in values.items()}
    if reference is None:
        return own, {}
    ref = values[reference]
    return own, {k: _interval_of(v - ref, level) for k, v in values.items() if k != reference}


def _interval_of(values: np.ndarray, level: float) -> Interval:
    """``values[0]`` is the full-sample estimate, the rest its resamples."""
    return interval(float(values[0]), values[1:], level)


def aiq_intervals(
    routers: Mapping[str, PromptCurve],
    singles: Mapping[str, PromptCurve],
    samples: int = 1000,
    seed: int = 0,
    level: float = DEFAULT_LEVEL,
    reference: str | None = None,
) -> AIQIntervals:
    """Paired bootstrap of AIQ for ``routers`` against the single models ``singles`` (one
    point each), every curve recomputed on the same resamples of the prompts."""
    if not singles:
        raise ValueError("no single-model curves: the AIQ cost range is undefined")
    if reference is not None and reference not in routers:
        raise ValueError(f"reference router {reference!r} is not among the routers")
    sizes = {c.n_prompts for c in [*routers.values(), *singles.values()]}
    if len(sizes) != 1:
        raise ValueError(f"curves cover different numbers of prompts: {sorted(sizes)}")
    curves = [*singles.values(), *routers.values()]
    means = resampled_means([a for c in curves for a in (c.scores, c.costs)], samples, seed)
    single_s = np.hstack(means[0 : 2 * len(singles) : 2])
    single_c = np.hstack(means[1 : 2 * len(singles) : 2])
    lo, hi = single_c.min(axis=1), single_c.max(axis=1)
    rows = range(samples + 1)
    no_routing = np.array([_aiq(single_s[b], single_c[b], lo[b], hi[b]) for b in rows])
    values: dict[str, np.ndarray] = {}
    for i, name in enumerate(routers):
        s, c = means[2 * (len(singles) + i)], means[2 * (len(singles) + i) + 1]
        values[name] = np.array([_aiq(s[b], c[b], lo[b], hi[b]) for b in rows])

    own, vs_reference = _intervals(values, reference, level)
    return AIQIntervals(
        samples=samples,
        level=level,
        aiq=own,
        no_routing=_interval_of(no_routing, level),
        gain={k: _interval_of(v - no_routing, level) for k, v in values.items()},
        reference=reference,
        vs_reference=vs_reference,
        values=values,
    )


@dataclass(frozen=True, slots=True)
class APGRIntervals:
    """Bootstrap intervals of each router's APGR on a two-model slice, recomputed with the
    strong and weak models' scores of each resample, and of each router's APGR minus the
    reference's. Resamples on which the strong model does not score above the weak one have
    no PGR scale and are left out (``dropped`` counts them)."""

    samples: int
    level: float
    apgr: dict[str, Interval]
    reference: str | None
    vs_reference: dict[str, Interval]
    dropped: int


def apgr_intervals(
    routers: Mapping[str, PromptCurve],
    strong: PromptCurve,
    weak: PromptCurve,
    samples: int = 1000,
    seed: int = 0,
    level: float = DEFAULT_LEVEL,
    reference: str | None = None,
) -> APGRIntervals:
    """Paired bootstrap of APGR (``routers`` built with ``strong_calls``) on the same
    resamples as ``aiq_intervals`` with the same seed."""
    if reference is not None and reference not in routers:
        raise ValueError(f"reference router {reference!r} is not among the routers")
    if any(c.strong_calls is None for c in routers.values()):
        raise ValueError("APGR needs each curve's calls to the strong model")
    names = list(routers)
    arrays = [strong.scores, weak.scores]
    for name in names:
        curve = routers[name]
        assert curve.strong_calls is not None
        arrays += [curve.scores, curve.strong_calls]
    means = resampled_means(arrays, samples, seed)
    q_strong, q_weak = means[0][:, 0], means[1][:, 0]
    if not metrics.has_gap(float(q_weak[0]), float(q_strong[0])):
        raise ValueError("the strong model does not score above the weak one")
    # Row 0 (the full sample) is always kept, so index 0 stays the point estimate. A
    # resample whose two means differ by rounding alone has no gap either.
    keep = np.flatnonzero([metrics.has_gap(w, s) for w, s in zip(q_weak, q_strong, strict=True)])
    if len(keep) == 1:
        # Every resample left out (a few resamples of a narrow gap): there is no interval
        # to give, which is no reason to fail the evaluation that asked for one.
        return APGRIntervals(samples, level, {}, reference, {}, dropped=samples)
    values: dict[str, np.ndarray] = {}
    for i, name in enumerate(names):
        scores, shares = means[2 + 2 * i], np.clip(means[3 + 2 * i], 0.0, 1.0)
        values[name] = np.array(
            [
                metrics.apgr(zip(shares[b], scores[b], strict=True), q_weak[b], q_strong[b])
                for b in keep
            ]
        )

    own, vs_reference = _intervals(values, reference, level)
    return APGRIntervals(
        samples=samples,
        level=level,
        apgr=own,
        reference=reference,
        vs_reference=vs_reference,
        dropped=int(samples + 1 - len(keep)),
    )


def mean_difference(
    a: np.ndarray, b: np.ndarray, samples: int = 1000, seed: int = 0, level: float = DEFAULT_LEVEL
) -> Interval:
    """Paired bootstrap interval of ``mean(a) - mean(b)`` over the same prompts (say, two
    routers' per-prompt scores)."""
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"need two equal-length 1-D arrays, got {a.shape} and {b.shape}")
    diff = (a - b)[None, :]
    return _interval_of(resampled_means([diff], samples, seed)[0][:, 0], level)
