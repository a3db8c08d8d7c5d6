"""A dependency-free text embedding for the kNN and MF baselines: hashed TF-IDF.

Word unigrams and bigrams are hashed (CRC-32, stable across processes, unlike ``hash()``)
into ``dim`` signed buckets, weighted by sublinear term frequency times the inverse document
frequency learned on the training texts, and L2-normalized, so a dot product is the cosine.
Any ``Callable[[list[str]], np.ndarray]`` (e.g. the packaged static sentence embedding) can
replace it.
"""

from __future__ import annotations

import itertools
import re
import zlib
from collections import Counter
from collections.abc import Callable, Sequence

import numpy as np

_TOKEN = re.compile(r"[a-z0-9]+")

# What the kNN/MF baselines and local cascades accept as a text embedding.
Embed = Callable[[list[str]], np.ndarray]


def normalize_rows(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (zero rows stay zero), as float32."""
    x = np.asarray(x, dtype=np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def _features(text: str) -> Counter[int]:
    words = _TOKEN.findall(text.lower())
    grams = words + [f"{a} {b}" for a, b in itertools.pairwise(words)]
    return Counter(zlib.crc32(g.encode("utf-8")) for g in grams)


class HashingTfidfEmbedder:
    """Call ``fit`` on training texts (for IDF), then call the instance on any texts."""

    def __init__(self, dim: int = 2048) -> None:
        if dim < 2:
            raise ValueError("dim must be at least 2")
        self.dim = dim
        self._idf: np.ndarray | None = None

    def _counts(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            for h, tf in _features(text).items():
                # The top bit picks a sign so colliding features cancel rather than pile up.
                sign = 1.0 if h & 0x80000000 else -1.0
                out[i, h % self.dim] += sign * (1.0 + np.log(tf))
        return out

    def fit(self, texts: Sequence[str]) -> HashingTfidfEmbedder:
        counts = self._counts(texts)
        df = np.count_nonzero(counts, axis=0)
        self._idf = (np.log((1.0 + len(texts)) / (1.0 + df)) + 1.0).astype(np.float32)
        return self

    def __call__(self, texts: list[str]) -> np.ndarray:
        if self._idf is None:
            raise RuntimeError("HashingTfidfEmbedder.fit must be called before embedding")
        return normalize_rows(self._counts(texts) * self._idf)
