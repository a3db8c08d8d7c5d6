"""Learning and evaluating from logged traffic with partial feedback.

Each logged record says which model the behaviour policy chose (``logged.action``), with
which probability (``logged.propensity``), and only that model's outcome. Estimators of a
target policy π's value from such data:

- IPS: ``mean(w_i r_i)`` with importance weights ``w_i = π(a_i|x_i) / p_i``, clipped at M
  (bias for variance);
- SNIPS: ``Σ w_i r_i / Σ w_i`` (self-normalized: no blow-up when weights are large);
- doubly robust: ``mean(Σ_a π(a|x_i) r̂(x_i, a) + w_i (r_i − r̂(x_i, a_i)))`` with a learned
  reward model r̂ (here: a small regression head on the same features that predicts each
  model's score and log-cost; the reward is then computed from them by the one reward
  definition). Unbiased if either the propensities or r̂ are right.

The same expressions, made differentiable in π, are the off-policy training objectives.
Rewards are recomputed for each sampled λ from the logged score and cost, so one logged
record teaches every trade-off.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from router.policies.compact import CompactHead, encode_lambda, masked_softmax
from router.policies.knn import KNNHead
from training.compact.config import TrainConfig
from training.compact.data import TableArrays, reward_matrix, stratified_lambdas
from training.compact.model import CompactMLP, masked_entropy, masked_log_softmax
from training.reward import RewardConfig, compute_reward

Estimator = Literal["ips", "snips", "dr"]


# -- estimators (numpy) -------------------------------------------------------------------


def importance_weights(
    target_p: np.ndarray, propensity: np.ndarray, clip: float | None = None
) -> np.ndarray:
    w = np.asarray(target_p, dtype=float) / np.asarray(propensity, dtype=float)
    return np.minimum(w, clip) if clip is not None else w


def ips_estimate(
    target_p: np.ndarray, propensity: np.ndarray, reward: np.ndarray, clip: float | None = None
) -> float:
    """``target_p[i]`` = π's probability of the logged action of record i."""
    return float(np.mean(importance_weights(target_p, propensity, clip) * reward))


def snips_estimate(
    target_p: np.ndarray, propensity: np.ndarray, reward: np.ndarray, clip: float | None = None
) -> float:
    w = importance_weights(target_p, propensity, clip)
    total = w.sum()
    return float((w * reward).sum() / total) if total > 0 else 0.0


def dr_estimate(
    target_probs: np.ndarray,
    reward_hat: np.ndarray,
    actions: np.ndarray,
    propensity: np.ndarray,
    reward: np.ndarray,
    clip: float | None = None,
) -> float:
    """``target_probs`` and ``reward_hat`` are ``(n, n_actions)``."""
    rows = np.arange(len(actions))
    w = importance_weights(target_probs[rows, actions], propensity, clip)
    direct = (target_probs * reward_hat).sum(axis=1)
    return float(np.mean(direct + w * (reward - reward_hat[rows, actions])))


def logged_rewards(
    arrays: TableArrays, rows: np.ndarray, lam: np.ndarray, config: RewardConfig
) -> np.ndarray:
    """The reward of each logged action at the given λ (from its logged score and cost)."""
    out = np.empty(len(rows))
    for k, i in enumerate(rows):
        a = arrays.logged_action[i]
        out[k] = compute_reward(
            float(arrays.score[i, a]), float(arrays.cost[i, a]), float(lam[k]), config
        ).reward
    return out


# -- reward model -------------------------------------------------------------------------


class RewardModel(nn.Module):
    """Predicts every model's score (sigmoid) and log-cost from the features; trained on the
    logged action's outcome only."""

    input_mean: torch.Tensor
    input_std: torch.Tensor

    def __init__(
        self, input_dim: int, n_actions: int, mean: np.ndarray, std: np.ndarray, hidden: int = 64
    ) -> None:
        super().__init__()
        self.register_buffer("input_mean", torch.as_tensor(mean, dtype=torch.float32))
        self.register_buffer("input_std", torch.as_tensor(std, dtype=torch.float32))
        self.body = nn.Sequential(nn.Linear(input_dim, hidden), nn.GELU(approximate="tanh"))
        self.score = nn.Linear(hidden, n_actions)
        self.log_cost = nn.Linear(hidden, n_actions)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.body((x - self.input_mean) / self.input_std)
        return self.score(h), self.log_cost(h)

    @torch.no_grad()
    def predict(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(score in [0, 1], cost in USD), each ``(n, n_actions)``."""
        s, c = self(torch.as_tensor(x, dtype=torch.float32))
        return torch.sigmoid(s).numpy().astype(float), torch.exp(c).numpy().astype(float)

    def reward_hat(self, x: np.ndarray, lam: np.ndarray, config: RewardConfig) -> np.ndarray:
        s, c = self.predict(x)
        return reward_matrix(np.clip(s, 0.0, 1.0), c, lam, config)


def fit_reward_model(
    x: np.ndarray,
    arrays: TableArrays,
    rows: np.ndarray,
    mean: np.ndarray,
    std: np.ndarray,
    *,
    steps: int = 300,
    lr: float = 3e-3,
    seed: int = 0,
) -> RewardModel:
    torch.manual_seed(seed)
    model = RewardModel(x.shape[1], len(arrays.models), mean, std)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=1e-3)
    xt = torch.as_tensor(x[rows], dtype=torch.float32)
    a = torch.as_tensor(arrays.logged_action[rows])
    s = torch.as_tensor(arrays.score[rows, arrays.logged_action[rows]], dtype=torch.float32)
    logc = torch.log(
        torch.as_tensor(
            arrays.cost[rows, arrays.logged_action[rows]], dtype=torch.float32
        ).clamp_min(1e-12)
    )
    idx = torch.arange(len(rows))
    for _ in range(steps):
        s_logit, c_hat = model(xt)
        loss = nn.functional.binary_cross_entropy_with_logits(
            s_logit[idx, a], s
        ) + nn.functional.mse_loss(c_hat[idx, a], logc)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    return model


def doubly_robust_outcomes(
    reward_model: RewardModel,
    x: np.ndarray,
    arrays: TableArrays,
    rows: np.ndarray,
    clip: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Every model's score and cost on each logged record, ``(len(rows), n_actions)`` each:
    the reward model's prediction, corrected on the logged action by the importance-weighted
    residual ``w_i (y_i − ŷ(x_i, a_i))``, ``w_i = 1/p_i`` clipped at ``clip``. Each entry is
    an unbiased estimate of that model's outcome on that prompt when the propensities are
    right (clipping trades a little bias for variance), and close to it when the reward
    model is; averages over many records (a kNN checkpoint's neighbours) are what make
    the single-record noise small. A single entry may fall outside the outcome's range (a
    negative cost where the reward model overestimated it); entries are not clipped, as
    clipping each one would bias their averages."""
    a = arrays.logged_action[rows]
    if np.any(a < 0):
        raise ValueError("every row must have a logged action")
    score, cost = reward_model.predict(x[rows])
    w = importance_weights(np.ones(len(rows)), arrays.logged_propensity[rows], clip)
    i = np.arange(len(rows))
    score[i, a] += w * (arrays.score[rows, a] - score[i, a])
    cost[i, a] += w * (arrays.cost[rows, a] - cost[i, a])
    return score, cost


# -- learner --------------------------------------------------------------------------------


class OffPolicyLearner:
    """One gradient step per call on a batch of logged records."""

    def __init__(
        self,
        model: CompactMLP,
        optimizer: torch.optim.Optimizer,
        x: np.ndarray,
        arrays: TableArrays,
        rows: np.ndarray,
        cfg: TrainConfig,
        rng: np.random.Generator,
        reward_model: RewardModel | None = None,
    ) -> None:
        if cfg.estimator == "dr" and reward_model is None:
            raise ValueError("the doubly robust estimator needs a reward model")
        self.model, self.opt, self.cfg, self.rng = model, optimizer, cfg, rng
        self.arrays, self.x = arrays, x
        self.rows = rows[arrays.logged_action[rows] >= 0]
        if len(self.rows) == 0:
            raise ValueError("no logged records (with a `logged` action) to learn from")
        self.reward_cfg = cfg.reward_config()
        self.reward_model = reward_model

    def _value(
        self, idx: np.ndarray, lam: float, x: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The estimator of the policy's value on the batch at one λ (differentiable)."""
        cfg = self.cfg
        lam_vec = np.full(len(idx), lam)
        enc = torch.as_tensor(encode_lambda(lam_vec, self.model.arch.lambda_encoding))
        actions = torch.as_tensor(self.arrays.logged_action[idx])
        prop = torch.as_tensor(self.arrays.logged_propensity[idx], dtype=torch.float32)
        r = torch.as_tensor(
            logged_rewards(self.arrays, idx, lam_vec, self.reward_cfg), dtype=torch.float32
        )
        mask = torch.ones((len(idx), self.model.arch.n_actions), dtype=torch.bool)
        logp = masked_log_softmax(self.model(x, enc), mask)
        p_a = logp.gather(1, actions[:, None]).squeeze(1).exp()
        w = torch.clamp(p_a / prop, max=cfg.ips_clip)
        if cfg.estimator == "ips":
            # The batch-mean baseline is a control variate: E_μ[w] = 1, so it only cuts variance.
            value = (w * (r - r.mean())).mean()
        elif cfg.estimator == "snips":
            value = (w * r).sum() / w.sum().clamp_min(1e-8)
        else:
            assert self.reward_model is not None
            rhat = torch.as_tensor(
                self.reward_model.reward_hat(self.x[idx], lam_vec, self.reward_cfg),
                dtype=torch.float32,
            )
            rows = torch.arange(len(idx))
            value = ((logp.exp() * rhat).sum(dim=1) + w * (r - rhat[rows, actions])).mean()
        # Scale each λ's estimate by its reward spread (as GRPO normalizes a group): at high λ
        # rewards are small, and unscaled their gradient is drowned by the low-λ ones.
        value = value / (r.std(unbiased=False) + cfg.advantage_std_floor)
        entropy = masked_entropy(logp, mask).mean()
        stats = {"logged_reward": float(r.mean()), "entropy": float(entropy.detach()),
                 "mean_weight": float(w.detach().mean())}  # fmt: skip
        return value + cfg.offpolicy_entropy_coef * entropy, stats

    def step(self) -> dict[str, float]:
        cfg = self.cfg
        idx = self.rng.choice(self.rows, size=min(cfg.batch_size, len(self.rows)), replace=False)
        x = torch.as_tensor(self.x[idx], dtype=torch.float32)
        # The batch is scored at a few λ spread over the range (one λ per estimate: SNIPS'
        # self-normalization and the IPS baseline compare rewards across the batch, which is
        # only meaningful on one reward scale). Spreading them gives every trade-off signal
        # at every step, before the policy sharpens (a sharp softmax passes almost no
        # gradient to the actions it has given up on).
        lams = stratified_lambdas(self.rng, cfg.offpolicy_lambdas, cfg)
        objective = torch.zeros(())
        stats: dict[str, float] = {}
        for lam in lams:
            value, s = self._value(idx, float(lam), x)
            objective = objective + value / len(lams)
            for k, v in s.items():
                stats[k] = stats.get(k, 0.0) + v / len(lams)
        loss = -objective
        self.opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
        self.opt.step()
        return {"loss": float(loss.detach()), **stats, "lambda_mean": float(np.mean(lams))}


def evaluate_logged(
    head: CompactHead | KNNHead,
    x: np.ndarray,
    arrays: TableArrays,
    lambdas: Sequence[float],
    config: RewardConfig,
    clip: float | None = None,
    reward_model: RewardModel | None = None,
) -> dict[str, dict[str, Any]]:
    """Off-policy estimates of the greedy policy's value per λ on logged records; ``reward``
    is the DR estimate when a reward model is given, else SNIPS."""
    rows = np.flatnonzero(arrays.logged_action >= 0)
    out: dict[str, dict[str, Any]] = {}
    if len(rows) == 0:
        return out
    actions = arrays.logged_action[rows]
    prop = arrays.logged_propensity[rows]
    mask = np.ones(len(arrays.models), dtype=bool)
    for lam in lambdas:
        lam_vec = np.full(len(rows), float(lam))
        probs = masked_softmax(head.logits(x[rows], float(lam)), mask)
        greedy = np.zeros_like(probs)
        greedy[np.arange(len(rows)), probs.argmax(axis=1)] = 1.0
        r = logged_rewards(arrays, rows, lam_vec, config)
        p_logged = greedy[np.arange(len(rows)), actions]
        row: dict[str, Any] = {
            "ips": ips_estimate(p_logged, prop, r, clip),
            "snips": snips_estimate(p_logged, prop, r, clip),
            "logging_policy_reward": float(r.mean()),
            "match_rate": float(p_logged.mean()),
            # The records the estimate rests on: those logged with the action it takes.
            "supporting_records": int(p_logged.sum()),
        }
        if reward_model is not None:
            rhat = reward_model.reward_hat(x[rows], lam_vec, config)
            row["dr"] = dr_estimate(greedy, rhat, actions, prop, r, clip)
        row["reward"] = row.get("dr", row["snips"])
        out[f"{lam:g}"] = row
    return out
