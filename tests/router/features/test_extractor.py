"""The feature extractor: one vector per conversation, versioned by what produced it."""

from __future__ import annotations

import numpy as np
import pytest

from router.features import CHEAP_FEATURE_NAMES, FeatureConfig, FeatureExtractor


@pytest.fixture(scope="module")
def fx() -> FeatureExtractor:
    return FeatureExtractor.load()


def test_layout_and_batch_agree(fx: FeatureExtractor) -> None:
    assert fx.embedding is not None
    assert fx.dim == fx.embedding.dim + len(CHEAP_FEATURE_NAMES) == len(fx.names)
    convs = [
        [{"role": "user", "content": "What is 17 * 23?"}],
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Write a haiku about rain"},
        ],
    ]
    batch = fx.extract_batch(convs)
    assert batch.shape == (2, fx.dim) and batch.dtype == np.float32
    for i, c in enumerate(convs):
        assert np.allclose(fx.extract(c), batch[i], atol=1e-6)
    # The embedding part is the embedding of the last user message.
    emb = fx.embedding.encode(["Write a haiku about rain"])[0]
    assert np.allclose(batch[1, : fx.embedding.dim], emb, atol=1e-6)


def test_tools_change_the_vector(fx: FeatureExtractor) -> None:
    m = [{"role": "user", "content": "What's the weather in Paris?"}]
    with_tools = fx.extract(m, tools=[{"type": "function", "function": {"name": "weather"}}])
    assert not np.array_equal(fx.extract(m), with_tools)
    assert with_tools[fx.names.index("has_tools")] == 1.0


def test_feature_version_is_stable_and_tracks_the_config(fx: FeatureExtractor) -> None:
    assert FeatureExtractor.load().feature_version == fx.feature_version
    assert fx.feature_version.startswith("fx1-")
    cheap_only = FeatureExtractor(None, FeatureConfig(embedding=False))
    assert cheap_only.feature_version != fx.feature_version
    assert cheap_only.dim == len(CHEAP_FEATURE_NAMES)
    shorter = FeatureExtractor.load(FeatureConfig(max_tokens=128))
    assert shorter.feature_version != fx.feature_version
    with pytest.raises(ValueError):
        FeatureExtractor(None, FeatureConfig(embedding=True))
