"""The torch twin of the numpy policy head, and masked softmax helpers."""

from __future__ import annotations

import itertools

import numpy as np
import torch
from torch import nn

from router.checkpoint import Architecture


def _activation(name: str) -> nn.Module:
    if name == "gelu_tanh":
        return nn.GELU(approximate="tanh")
    if name == "relu":
        return nn.ReLU()
    if name == "silu":
        return nn.SiLU()
    raise ValueError(f"unknown activation {name!r}")


class CompactMLP(nn.Module):
    """The torch twin of ``router.policies.compact.CompactHead`` (same weights, same
    function): [standardized x, enc(λ)] → hidden layers → [h, enc(λ)] → logits."""

    input_mean: torch.Tensor
    input_std: torch.Tensor

    def __init__(
        self, arch: Architecture, mean: np.ndarray, std: np.ndarray, dropout: float = 0.0
    ) -> None:
        super().__init__()
        self.arch = arch
        e = arch.lambda_encoding.dim
        self.register_buffer("input_mean", torch.as_tensor(mean, dtype=torch.float32))
        self.register_buffer("input_std", torch.as_tensor(std, dtype=torch.float32))
        dims = [arch.input_dim + e, *arch.hidden]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in itertools.pairwise(dims))
        self.act = _activation(arch.activation)
        # No parameters: the exported weights (and the numpy head) are unaffected.
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(dims[-1] + e, arch.n_actions)
        # Start near uniform: a small head keeps the first groups diverse.
        nn.init.normal_(self.head.weight, std=0.01)
        nn.init.zeros_(self.head.bias)

    def forward(self, x: torch.Tensor, lam_enc: torch.Tensor) -> torch.Tensor:
        h = torch.cat([(x - self.input_mean) / self.input_std, lam_enc], dim=1)
        for layer in self.layers:
            h = self.dropout(self.act(layer(h)))
        out: torch.Tensor = self.head(torch.cat([h, lam_enc], dim=1))
        return out

    def export_weights(self) -> dict[str, np.ndarray]:
        return {
            k: v.detach().cpu().numpy().astype(np.float32).copy()
            for k, v in self.state_dict().items()
        }


# Finite, not -inf: 0 * -inf is NaN and would poison the entropy's gradient.
_MASKED_LOGIT = -1e9


def masked_log_softmax(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return logits.masked_fill(~mask, _MASKED_LOGIT).log_softmax(dim=-1)


def masked_entropy(logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    p = logp.exp()
    return -torch.where(mask, p * logp, torch.zeros_like(logp)).sum(dim=-1)
