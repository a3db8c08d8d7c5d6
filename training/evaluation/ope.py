"""Off-policy evaluation of a new routing policy on logged traffic (partial feedback).

Each logged record says which model the logging policy chose (``logged.action``) with which
probability (``logged.propensity``) and holds that model's outcome only. For a target policy
given as action probabilities ``π(a | x_i)`` (an ``(n, M)`` array over ``models``):

- IPS: ``mean(w_i r_i)`` with ``w_i = π(a_i | x_i) / p_i`` (unbiased when every action the
  target takes had a positive logging probability);
- clipped IPS: weights capped at ``max_weight`` (biased low, lower variance);
- SNIPS: ``sum(w_i r_i) / sum(w_i)`` (self-normalized; consistent, slightly biased);
- DR: ``mean(sum_a π(a|x_i) r̂(x_i, a) + w_i (r_i - r̂(x_i, a_i)))`` with a reward model
  ``r̂`` (a per-model mean of the logged rewards by default, or any ``(n, M)`` predictions);
  unbiased if either the propensities or the reward model are right.

Each estimate carries a standard error and a ``1 - alpha`` confidence interval, from the
normal approximation (the estimators are means of per-record terms; SNIPS via its
linearization) or from a seeded bootstrap. The interval is intersected with the range the
reward can take (a score in [0, 1], a cost ≥ 0: the true value lies in it, so coverage is
unchanged); the point estimate is not clipped, since that would bias IPS and DR.

Both intervals measure spread from the records the target policy would have chosen, and a
handful of them that happen to agree (four explored calls that all scored 1) have none: the
interval shrank to a point while an exact binomial one for 4 of 4 starts at 0.40. So where
the reward is bounded and the support is too thin for the normal approximation — by the
textbook rule for a proportion, fewer than 10 effective "successes" or "failures",
``n_eff·p̂`` or ``n_eff·(1 − p̂)`` below 10 with ``p̂`` the estimate rescaled to [0, 1] and
``n_eff = (Σw)² / Σw²`` (Kish's effective sample size: the number of equally weighted
records the weights are worth) — an interval is never narrower than the Wilson score
interval of the estimate at ``n_eff``. That bound is conservative (a quantity in [lo, hi]
with mean p has variance at most (p − lo)(hi − p)), which is why it is not applied where
the support is ample: there the estimators' own intervals are right and may be narrower.
DR with a reward model of the caller's is left to its own interval: a good model
legitimately explains most of the spread.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from statistics import NormalDist
from typing import Literal

import numpy as np

from router.outcomes import ModelOutcome, OutcomeRecord

CIMethod = Literal["normal", "bootstrap"]
# Effective successes and failures each at least this many: the normal approximation holds.
_NORMAL_ENOUGH = 10.0
# What is being estimated from each logged outcome (its score by default).
RewardFn = Callable[[ModelOutcome], float]


class OPEError(ValueError):
    """The logged data cannot support the requested estimate."""


@dataclass(frozen=True, slots=True)
class LoggedBandit:
    """Logged decisions as arrays."""

    ids: list[str]
    models: list[str]
    actions: np.ndarray  # (n,) index into models
    propensities: np.ndarray  # (n,)
    rewards: np.ndarray  # (n,)
    # The range a reward can take; confidence intervals are clipped to it.
    bounds: tuple[float, float] = (-math.inf, math.inf)

    def __post_init__(self) -> None:
        # A propensity of 0 (or NaN) makes a weight infinite (or NaN), and every estimate
        # and interval NaN without a word; records validated as an outcome table cannot
        # carry one, but arrays built by hand can.
        p = np.asarray(self.propensities, dtype=float)
        bad = np.flatnonzero(~((p > 0.0) & (p <= 1.0)))
        if bad.size:
            i = int(bad[0])
            name = self.ids[i] if i < len(self.ids) else i
            raise OPEError(
                f"record {name!r}: logged propensity {p[i]} is not in (0, 1]: an action the "
                "logging policy could not take cannot have been logged"
            )

    def __len__(self) -> int:
        return len(self.ids)


def score_reward(outcome: ModelOutcome) -> float:
    return outcome.score


def cost_reward(outcome: ModelOutcome) -> float:
    if outcome.cost_usd is None:
        raise OPEError("a logged outcome has no cost_usd")
    return outcome.cost_usd


def logged_bandit(
    records: Sequence[OutcomeRecord],
    models: Sequence[str] | None = None,
    reward: RewardFn = score_reward,
    bounds: tuple[float, float] = (0.0, 1.0),
) -> LoggedBandit:
    """The records that carry ``logged``; ``models`` fixes the action index (default: the
    logged actions, sorted). ``bounds``: the range ``reward`` takes (a score's by default)."""
    # A multi-call trajectory's outcome is no single action's: it cannot be reweighted.
    logged = [(r, r.logged) for r in records if r.logged is not None and not r.logged.multi_call]
    if not logged:
        raise OPEError(
            "no record has a single-call `logged` action (action, propensity): nothing to "
            "evaluate off-policy"
        )
    names = list(models) if models is not None else sorted({lg.action for _, lg in logged})
    index = {m: i for i, m in enumerate(names)}
    actions, props, rewards = [], [], []
    for r, lg in logged:
        if lg.action not in index:
            raise OPEError(f"record {r.id!r}: logged action {lg.action!r} is not in {names}")
        actions.append(index[lg.action])
        props.append(lg.propensity)
        rewards.append(reward(r.outcomes[lg.action]))
    return LoggedBandit(
        [r.id for r, _ in logged],
        names,
        np.array(actions, dtype=int),
        np.array(props, dtype=float),
        np.array(rewards, dtype=float),
        bounds,
    )


def deterministic_probs(choices: Sequence[str], models: Sequence[str]) -> np.ndarray:
    """One-hot action probabilities of a deterministic policy's choices."""
    index = {m: i for i, m in enumerate(models)}
    probs = np.zeros((len(choices), len(models)))
    for i, c in enumerate(choices):
        if c not in index:
            raise OPEError(f"target action {c!r} was never logged: no data to evaluate it")
        probs[i, index[c]] = 1.0
    return probs


@dataclass(frozen=True, slots=True)
class Estimate:
    estimator: str
    value: float
    stderr: float
    ci_low: float
    ci_high: float
    n: int

    def to_dict(self) -> dict[str, float | int | str]:
        return asdict(self)


def _check(data: LoggedBandit, target: np.ndarray) -> np.ndarray:
    probs = np.asarray(target, dtype=float)
    if probs.shape != (len(data), len(data.models)):
        raise OPEError(
            f"target probabilities have shape {probs.shape}, expected {(len(data), len(data.models))}"
        )
    # Written as "not all within" so that a NaN, which fails every comparison, fails it too.
    if not (np.all(probs >= -1e-9) and np.all(np.abs(probs.sum(axis=1) - 1.0) <= 1e-6)):
        raise OPEError("each row of target probabilities must be a distribution")
    return probs


def _weights(data: LoggedBandit, probs: np.ndarray) -> np.ndarray:
    return probs[np.arange(len(data)), data.actions] / data.propensities


def _finish(
    name: str,
    estimator: Callable[[np.ndarray], tuple[float, float]],
    data: LoggedBandit,
    ci: CIMethod,
    alpha: float,
    n_boot: int,
    seed: int,
    *,
    unsupported: bool = False,
    weights: np.ndarray | None = None,
) -> Estimate:
    """``estimator(idx)`` returns (value, normal-approximation stderr) on rows ``idx``.
    ``unsupported``: the data hold too little of what the target policy does to say how
    far the estimate may be off (see the callers); its interval is the full range.
    ``weights``: the importance weights, whose effective sample size bounds how narrow the
    interval may be (see the module's docstring)."""
    n = len(data)
    value, stderr = estimator(np.arange(n))
    low, high = data.bounds
    if unsupported:
        return Estimate(name, value, float("inf"), low, high, n)
    if ci == "normal" or n < 2:
        # One record says nothing about the spread: its resamples are all that record, and
        # a bootstrap would give a zero-width interval. The normal approximation's infinite
        # standard error (the full range, below) is the honest answer for both methods.
        z = NormalDist().inv_cdf(1.0 - alpha / 2.0)
        lo, hi = value - z * stderr, value + z * stderr
    else:
        if n_boot < 2:
            raise OPEError(f"a bootstrap interval needs at least 2 resamples, got {n_boot}")
        rng = np.random.default_rng(seed)
        boots = np.array([estimator(rng.integers(0, n, n))[0] for _ in range(n_boot)])
        lo, hi = (float(q) for q in np.quantile(boots, [alpha / 2.0, 1.0 - alpha / 2.0]))
        stderr = float(boots.std(ddof=1))
    if lo > high or hi < low:
        # The whole interval lies outside what the quantity can take (an IPS score of 1e8
        # from propensities of 1e-9): clipped, it would collapse onto the bound and claim a
        # precision the weights do not have. Such weights say nothing of where the value lies.
        return Estimate(name, value, stderr, low, high, n)
    if weights is not None:
        floor = _wilson(value, _effective_size(weights), data.bounds, alpha)
        if floor is not None:
            lo, hi = min(lo, floor[0]), max(hi, floor[1])
    return Estimate(name, value, stderr, min(max(lo, low), high), min(max(hi, low), high), n)


def _effective_size(weights: np.ndarray) -> float:
    """Kish's effective sample size of importance weights (0 when every weight is 0)."""
    square = float(np.square(weights).sum())
    return float(weights.sum()) ** 2 / square if square > 0 else 0.0


def _wilson(
    value: float, n_eff: float, bounds: tuple[float, float], alpha: float
) -> tuple[float, float] | None:
    """The Wilson score interval of ``value`` from ``n_eff`` observations of a quantity
    bounded by ``bounds`` (rescaled to [0, 1] and back); None when the range is unbounded,
    there is no observation to scale by, or the normal approximation needs no floor."""
    low, high = bounds
    if not (math.isfinite(low) and math.isfinite(high) and high > low) or n_eff <= 0:
        return None
    p = min(max((value - low) / (high - low), 0.0), 1.0)
    if min(p, 1.0 - p) * n_eff >= _NORMAL_ENOUGH:
        return None
    z = NormalDist().inv_cdf(1.0 - alpha / 2.0)
    shrink = 1.0 + z * z / n_eff
    center = (p + z * z / (2.0 * n_eff)) / shrink
    half = z * math.sqrt(p * (1.0 - p) / n_eff + z * z / (4.0 * n_eff * n_eff)) / shrink
    return low + (center - half) * (high - low), low + (center + half) * (high - low)


def _mean_and_se(terms: np.ndarray) -> tuple[float, float]:
    n = len(terms)
    se = float(terms.std(ddof=1) / np.sqrt(n)) if n > 1 else float("inf")
    return float(terms.mean()), se


def ips(
    data: LoggedBandit,
    target: np.ndarray,
    *,
    max_weight: float | None = None,
    ci: CIMethod = "normal",
    alpha: float = 0.05,
    n_boot: int = 1000,
    seed: int = 0,
) -> Estimate:
    """Inverse propensity scoring; with ``max_weight`` the clipped variant."""
    w = _weights(data, _check(data, target))
    if max_weight is not None:
        if max_weight <= 0:
            raise OPEError("max_weight must be positive")
        w = np.minimum(w, max_weight)
    terms = w * data.rewards
    name = "ips" if max_weight is None else "clipped_ips"
    # No record the target policy would have chosen: the estimate is 0 whatever the target
    # is worth, and its terms (all 0) have no spread to say so.
    return _finish(
        name,
        lambda idx: _mean_and_se(terms[idx]),
        data,
        ci,
        alpha,
        n_boot,
        seed,
        unsupported=not np.any(w > 0),
        weights=w,
    )


def snips(
    data: LoggedBandit,
    target: np.ndarray,
    *,
    ci: CIMethod = "normal",
    alpha: float = 0.05,
    n_boot: int = 1000,
    seed: int = 0,
) -> Estimate:
    """Self-normalized IPS."""
    w = _weights(data, _check(data, target))

    def estimate(idx: np.ndarray) -> tuple[float, float]:
        wi, ri = w[idx], data.rewards[idx]
        total = wi.sum()
        if total <= 0:
            return 0.0, float("inf")
        value = float((wi * ri).sum() / total)
        # Delta method: the ratio's influence terms are w_i (r_i - V) / mean(w).
        _, se = _mean_and_se(wi * (ri - value) / wi.mean())
        return value, se

    # One record the target policy would also have chosen is the whole estimate: its
    # influence term is 0 (its reward is the estimate), so the delta method, and every
    # bootstrap resample holding it, would claim certainty from one observation.
    unsupported = int(np.count_nonzero(w)) < 2
    return _finish(
        "snips", estimate, data, ci, alpha, n_boot, seed, unsupported=unsupported, weights=w
    )


def mean_reward_model(data: LoggedBandit) -> np.ndarray:
    """r̂(x, a) = the mean logged reward of action a (the overall mean for actions never
    logged), as an ``(n, M)`` array."""
    overall = float(data.rewards.mean())
    per_model = np.array(
        [
            data.rewards[data.actions == j].mean() if np.any(data.actions == j) else overall
            for j in range(len(data.models))
        ]
    )
    return np.broadcast_to(per_model, (len(data), len(data.models))).copy()


def doubly_robust(
    data: LoggedBandit,
    target: np.ndarray,
    reward_model: np.ndarray | None = None,
    *,
    ci: CIMethod = "normal",
    alpha: float = 0.05,
    n_boot: int = 1000,
    seed: int = 0,
) -> Estimate:
    probs = _check(data, target)
    r_hat = mean_reward_model(data) if reward_model is None else np.asarray(reward_model, float)
    if r_hat.shape != probs.shape:
        raise OPEError(f"reward model has shape {r_hat.shape}, expected {probs.shape}")
    w = _weights(data, probs)
    logged_hat = r_hat[np.arange(len(data)), data.actions]
    terms = (probs * r_hat).sum(axis=1) + w * (data.rewards - logged_hat)
    # The default reward model is each action's mean logged reward, fitted on these same
    # records: an action the target takes that was logged once has that one reward as its
    # model on every record, and the terms come out constant — no spread to measure.
    unsupported = reward_model is None and _thin_support(data, probs)
    return _finish(
        "dr",
        lambda idx: _mean_and_se(terms[idx]),
        data,
        ci,
        alpha,
        n_boot,
        seed,
        unsupported=unsupported,
        weights=w if reward_model is None else None,
    )


def _thin_support(data: LoggedBandit, probs: np.ndarray) -> bool:
    """Whether an action the target policy ever takes was logged fewer than twice."""
    taken = np.flatnonzero(probs.max(axis=0) > 0)
    logged = np.bincount(data.actions, minlength=len(data.models))
    return bool(np.any(logged[taken] < 2))


def all_estimates(
    data: LoggedBandit,
    target: np.ndarray,
    *,
    max_weight: float = 10.0,
    reward_model: np.ndarray | None = None,
    ci: CIMethod = "normal",
    alpha: float = 0.05,
    n_boot: int = 1000,
    seed: int = 0,
) -> dict[str, Estimate]:
    return {
        "ips": ips(data, target, ci=ci, alpha=alpha, n_boot=n_boot, seed=seed),
        "clipped_ips": ips(
            data, target, max_weight=max_weight, ci=ci, alpha=alpha, n_boot=n_boot, seed=seed
        ),
        "snips": snips(data, target, ci=ci, alpha=alpha, n_boot=n_boot, seed=seed),
        "dr": doubly_robust(
            data, target, reward_model, ci=ci, alpha=alpha, n_boot=n_boot, seed=seed
        ),
    }


def logged_mean(data: LoggedBandit, alpha: float = 0.05) -> Estimate:
    """What the logging policy itself achieved on ``data``: the plain mean of the logged
    rewards (on-policy, no weights), with its normal interval — floored by the Wilson
    interval where the records are too few, as the estimators' are. The baseline a new
    policy's estimates must beat."""
    terms = data.rewards
    return _finish(
        "logged",
        lambda idx: _mean_and_se(terms[idx]),
        data,
        "normal",
        alpha,
        0,
        0,
        weights=np.ones(len(data)),
    )
