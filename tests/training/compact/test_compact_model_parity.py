"""The torch network the trainer optimizes and the numpy head the gateway runs are the same
function of the same weights."""

from __future__ import annotations

from typing import Literal

import numpy as np
import pytest
import torch

from router.checkpoint import Architecture, LambdaEncoding
from router.policies.compact import CompactHead, encode_lambda
from training.compact.model import CompactMLP


@pytest.mark.parametrize(
    ("activation", "hidden"),
    [("gelu_tanh", (32, 16)), ("relu", (32, 16)), ("silu", (24,)), ("gelu_tanh", ())],
)
def test_numpy_head_matches_torch_forward(
    activation: Literal["gelu_tanh", "relu", "silu"], hidden: tuple[int, ...]
) -> None:
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    arch = Architecture(
        input_dim=20,
        hidden=hidden,
        activation=activation,
        n_actions=5,
        lambda_encoding=LambdaEncoding(
            lambda_scale=0.01, log_scale=8.0, monotone_scales=(0.03, 1.0, 10.0)
        ),
    )
    mean = rng.normal(size=20).astype(np.float32)
    std = rng.uniform(0.5, 2.0, size=20).astype(np.float32)
    model = CompactMLP(arch, mean, std, dropout=0.5).eval()
    for p in model.parameters():  # larger than init so every unit is exercised
        torch.nn.init.normal_(p, std=0.5)
    head = CompactHead(arch, model.export_weights())
    x = rng.normal(size=(64, 20)).astype(np.float32)
    lams = np.concatenate([[0.0, 0.01, 0.5, 3.0, 30.0], rng.uniform(0, 50, size=59)])
    with torch.no_grad():
        expected = model(
            torch.from_numpy(x), torch.from_numpy(encode_lambda(lams, arch.lambda_encoding))
        ).numpy()
    got = head.logits(x, lams)
    assert got.shape == (64, 5)
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=1e-5)
    # One λ broadcasts over the batch (float32: the two shapes may take different BLAS
    # kernels, which round differently on some CPUs — a few ulps of logits near 10).
    np.testing.assert_allclose(
        head.logits(x, 0.5), head.logits(x, np.full(64, 0.5)), atol=1e-5, rtol=1e-5
    )
    with pytest.raises(ValueError):
        head.logits(x, -1.0)
