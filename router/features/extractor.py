"""One feature vector per conversation: [static embedding of the prompt, cheap features].

The extractor's ``feature_version`` names exactly what produced a vector: a hash of the
extractor's configuration, the cheap-feature version and the embedding table's digest. It
is written into every checkpoint and every logged decision, and a policy refuses a
checkpoint whose feature version differs from the extractor it runs with (the weights
would be applied to different inputs).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from router.features.cheap import CHEAP_FEATURE_NAMES, CHEAP_FEATURES_VERSION, cheap_features
from router.features.embedding import StaticEmbedding
from router.outcomes import conversation_text

EXTRACTOR_VERSION = "fx1"


@dataclass(frozen=True, slots=True)
class FeatureConfig:
    """What goes into the vector. Part of the feature version."""

    embedding: bool = True
    cheap: bool = True
    max_tokens: int = 512

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FeatureConfig:
        return cls(**{k: data[k] for k in ("embedding", "cheap", "max_tokens") if k in data})


class FeatureExtractor:
    """Turns chat messages into a float32 vector. Thread-safe and stateless per call."""

    def __init__(
        self, embedding: StaticEmbedding | None, config: FeatureConfig | None = None
    ) -> None:
        self.config = config or FeatureConfig()
        if self.config.embedding and embedding is None:
            raise ValueError("FeatureConfig(embedding=True) needs a StaticEmbedding")
        if not (self.config.embedding or self.config.cheap):
            raise ValueError("a feature extractor needs the embedding, the cheap features or both")
        self._embedding = embedding if self.config.embedding else None
        names: list[str] = []
        if self._embedding is not None:
            names += [f"emb_{i}" for i in range(self._embedding.dim)]
        if self.config.cheap:
            names += list(CHEAP_FEATURE_NAMES)
        self.names: tuple[str, ...] = tuple(names)
        self.feature_version = self._version()

    @classmethod
    def load(
        cls, config: FeatureConfig | None = None, embedding_dir: str | Path | None = None
    ) -> FeatureExtractor:
        """An extractor over the packaged (or given) embedding table. Reads files: call it at
        startup or from a thread, not on the event loop."""
        cfg = config or FeatureConfig()
        emb = (
            StaticEmbedding.load(embedding_dir, max_tokens=cfg.max_tokens)
            if cfg.embedding
            else None
        )
        return cls(emb, cfg)

    @property
    def dim(self) -> int:
        return len(self.names)

    @property
    def embedding(self) -> StaticEmbedding | None:
        return self._embedding

    def _version(self) -> str:
        spec = {
            "extractor": EXTRACTOR_VERSION,
            "config": self.config.to_dict(),
            "cheap": CHEAP_FEATURES_VERSION if self.config.cheap else None,
            "cheap_names": list(CHEAP_FEATURE_NAMES) if self.config.cheap else None,
            "embedding": self._embedding.digest if self._embedding is not None else None,
            "embedding_dim": self._embedding.dim if self._embedding is not None else None,
        }
        digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]
        return f"{EXTRACTOR_VERSION}-{digest}"

    def extract(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        tools: Sequence[Any] | None = None,
        prompt: str | None = None,
    ) -> np.ndarray:
        """The vector of one conversation (``prompt`` overrides the last user message)."""
        text = prompt if prompt is not None else conversation_text(messages)
        parts: list[np.ndarray] = []
        n_tokens: int | None = None
        if self._embedding is not None:
            vec, n_tokens = self._embedding.encode_one(text)
            parts.append(vec)
        if self.config.cheap:
            parts.append(cheap_features(messages, prompt=text, n_tokens=n_tokens, tools=tools))
        return np.concatenate(parts).astype(np.float32, copy=False)

    def extract_batch(
        self,
        conversations: Sequence[Sequence[dict[str, Any]]],
        *,
        tools: Sequence[Sequence[Any] | None] | None = None,
    ) -> np.ndarray:
        """``(n, dim)`` float32 for many conversations (the training path: the embedding is
        encoded in batches, which is several times faster than one by one)."""
        n = len(conversations)
        if tools is not None and len(tools) != n:
            raise ValueError("tools must have one entry per conversation")
        texts = [conversation_text(m) for m in conversations]
        out = np.zeros((n, self.dim), dtype=np.float32)
        col = 0
        n_tokens: list[int] | None = None
        if self._embedding is not None:
            ids = self._embedding.tokenize(texts)
            n_tokens = [len(i) for i in ids]
            for i, row in enumerate(ids):
                out[i, : self._embedding.dim] = self._embedding.pool(row)
            col = self._embedding.dim
        if self.config.cheap:
            for i, conv in enumerate(conversations):
                out[i, col:] = cheap_features(
                    conv,
                    prompt=texts[i],
                    n_tokens=n_tokens[i] if n_tokens is not None else None,
                    tools=tools[i] if tools is not None else None,
                )
        return out

    def extract_texts(self, texts: Sequence[str]) -> np.ndarray:
        """Batch features of single-turn prompts (outcome tables with a ``prompt`` field)."""
        return self.extract_batch([[{"role": "user", "content": t}] for t in texts])
