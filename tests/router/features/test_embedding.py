"""The static embedding: deterministic, L2-normalized, faithful to model2vec's pooling, and
importable without torch."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from router.features import StaticEmbedding
from router.features.embedding import EmbeddingAssetError
from tests.support.replay import REPO_ROOT


@pytest.fixture(scope="module")
def emb() -> StaticEmbedding:
    return StaticEmbedding.load()


def test_deterministic_and_normalized(emb: StaticEmbedding) -> None:
    texts = [
        "What is the capital of France?",
        "def add(a, b):\n    return a + b",
        "日本の首都はどこですか",
    ]
    a = emb.encode(texts)
    b = StaticEmbedding.load().encode(texts)
    assert a.dtype == np.float32 and a.shape == (3, emb.dim)
    assert np.array_equal(a, b)
    assert np.allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-5)
    for i, t in enumerate(texts):
        one, n_tokens = emb.encode_one(t)
        assert n_tokens > 0
        assert np.allclose(one, a[i], atol=1e-6)


def test_empty_text_is_the_zero_vector(emb: StaticEmbedding) -> None:
    v, n = emb.encode_one("")
    assert n == 0 and not v.any()


def test_truncates_to_max_tokens(emb: StaticEmbedding) -> None:
    words = [f"w{i} apple" for i in range(2000)]
    long_text = " ".join(words)
    ids = emb.tokenize([long_text])[0]
    assert len(ids) == emb.info.max_tokens
    # Whatever comes after the first 512 tokens does not change the vector.
    v1, _ = emb.encode_one(long_text)
    v2, _ = emb.encode_one(long_text + " zebra " * 500)
    assert np.array_equal(v1, v2)


def test_similar_texts_are_closer(emb: StaticEmbedding) -> None:
    a, b, c = emb.encode(
        [
            "How do I bake sourdough bread at home?",
            "A simple recipe for baking bread",
            "The central bank raised interest rates",
        ]
    )
    assert a @ b > a @ c + 0.1


def test_missing_asset_directory_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(EmbeddingAssetError, match="distill_embedding"):
        StaticEmbedding.load(tmp_path)


def test_inference_imports_neither_torch_nor_model2vec() -> None:
    code = (
        "import sys, router.features, router.policies.compact, router.checkpoint\n"
        "from router.features import FeatureExtractor\n"
        "FeatureExtractor.load().extract([{'role': 'user', 'content': 'hi'}])\n"
        "bad = [m for m in ('torch', 'model2vec', 'transformers') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=True, timeout=60)
