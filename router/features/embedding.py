"""A static sentence embedding: one vector per token, mean-pooled, L2-normalized.

The table is distilled once, offline, from all-MiniLM-L6-v2 with model2vec
(``scripts/distill_embedding.py``) and shipped under ``router/assets/embedding``. Inference
needs only ``tokenizers`` (Rust, releases the GIL), ``safetensors`` and numpy: no torch, no
model2vec, nothing downloaded. It reproduces model2vec's ``StaticModel.encode``: tokenize
without special tokens, drop ``[UNK]`` ids, truncate to ``max_tokens``, average the token
vectors and L2-normalize. An empty text (or one made only of unknown tokens) maps to the
zero vector, as in model2vec.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load_file
from tokenizers import Tokenizer

logger = logging.getLogger(__name__)

TABLE_FILE = "embeddings.safetensors"
TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "config.json"
TABLE_KEY = "embeddings"


class EmbeddingAssetError(RuntimeError):
    """The embedding directory is missing a file or its files disagree."""


@dataclass(frozen=True, slots=True)
class EmbeddingInfo:
    """What the embedding is, for feature versions and reports."""

    dim: int
    vocab_size: int
    max_tokens: int
    digest: str  # sha256 of the table and the tokenizer: changes iff the features change
    source: str


def default_embedding_dir() -> Path:
    """The packaged embedding directory (``router/assets/embedding``)."""
    return Path(str(resources.files("router").joinpath("assets/embedding")))


class StaticEmbedding:
    """Encodes texts with a static token-embedding table.

    Thread-safe: the tokenizer's settings are fixed at load time and encoding only reads
    shared state, so one instance serves concurrent requests from a thread pool.
    """

    def __init__(
        self,
        table: np.ndarray,
        tokenizer: Tokenizer,
        *,
        max_tokens: int = 512,
        median_token_length: int = 6,
        unk_token_id: int | None = None,
        digest: str = "",
        source: str = "",
    ) -> None:
        if table.ndim != 2:
            raise EmbeddingAssetError(f"embedding table must be 2-D, got shape {table.shape}")
        if tokenizer.get_vocab_size() > table.shape[0]:
            raise EmbeddingAssetError(
                f"tokenizer has {tokenizer.get_vocab_size()} tokens but the table only "
                f"{table.shape[0]} rows"
            )
        # float32 once at load: gathers and means are faster than on float16 and the memory
        # (vocab x dim x 4 bytes, ~8 MB) is negligible.
        self._table = np.ascontiguousarray(table, dtype=np.float32)
        self._table.setflags(write=False)
        self._tokenizer = tokenizer
        self._tokenizer.no_padding()
        self._tokenizer.enable_truncation(max_tokens)
        self._max_tokens = max_tokens
        # Like model2vec, cut long inputs by characters before tokenizing (max_tokens times
        # the median token length): a 1 MB prompt then costs what a 512-token one does.
        self._max_chars = max_tokens * max(median_token_length, 1)
        self._unk = unk_token_id
        self.info = EmbeddingInfo(
            dim=int(table.shape[1]),
            vocab_size=int(table.shape[0]),
            max_tokens=max_tokens,
            digest=digest,
            source=source,
        )

    @property
    def dim(self) -> int:
        return self.info.dim

    @property
    def digest(self) -> str:
        return self.info.digest

    @classmethod
    def load(
        cls, path: str | Path | None = None, *, max_tokens: int | None = None
    ) -> StaticEmbedding:
        """Load an embedding directory (default: the packaged one)."""
        root = Path(path) if path is not None else default_embedding_dir()
        missing = [f for f in (TABLE_FILE, TOKENIZER_FILE, CONFIG_FILE) if not (root / f).is_file()]
        if missing:
            raise EmbeddingAssetError(
                f"embedding directory {root} lacks {', '.join(missing)}; "
                "rebuild it with scripts/distill_embedding.py"
            )
        config: dict[str, Any] = json.loads((root / CONFIG_FILE).read_text(encoding="utf-8"))
        table_bytes = (root / TABLE_FILE).read_bytes()
        tok_bytes = (root / TOKENIZER_FILE).read_bytes()
        digest = hashlib.sha256(table_bytes + b"\0" + tok_bytes).hexdigest()[:16]
        tensors = load_file(str(root / TABLE_FILE))
        if TABLE_KEY not in tensors:
            raise EmbeddingAssetError(f"{root / TABLE_FILE} has no tensor named {TABLE_KEY!r}")
        tokenizer = Tokenizer.from_str(tok_bytes.decode("utf-8"))
        return cls(
            tensors[TABLE_KEY],
            tokenizer,
            max_tokens=int(max_tokens or config.get("max_tokens", 512)),
            median_token_length=int(config.get("median_token_length", 6)),
            unk_token_id=config.get("unk_token_id"),
            digest=digest,
            source=str(config.get("source_model", "")),
        )

    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids per text (no special tokens, unknown tokens dropped, truncated)."""
        clipped = [t[: self._max_chars] for t in texts]
        encodings = self._tokenizer.encode_batch_fast(clipped, add_special_tokens=False)
        if self._unk is None:
            return [e.ids for e in encodings]
        unk = self._unk
        return [[i for i in e.ids if i != unk] for e in encodings]

    def pool(self, ids: Sequence[int]) -> np.ndarray:
        """Mean of the token vectors, L2-normalized (zeros for no tokens)."""
        if not ids:
            return np.zeros(self.dim, dtype=np.float32)
        # The sum, not the mean: normalization cancels the 1/len factor.
        v: np.ndarray = np.add.reduce(self._table.take(ids, axis=0), axis=0)
        n = float(np.sqrt(v @ v))
        return v / n if n > 0 else v

    def encode_one(self, text: str) -> tuple[np.ndarray, int]:
        """(vector, number of known tokens used) for one text: the request-path entry point."""
        # encode_batch_fast skips the offset bookkeeping encode() does: ~15% faster.
        enc = self._tokenizer.encode_batch_fast(
            [text[: self._max_chars]], add_special_tokens=False
        )[0]
        ids = enc.ids if self._unk is None else [i for i in enc.ids if i != self._unk]
        return self.pool(ids), len(ids)

    def encode(self, texts: Sequence[str], *, batch_size: int = 512) -> np.ndarray:
        """Encode many texts: ``(len(texts), dim)`` float32, rows L2-normalized."""
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for start in range(0, len(texts), batch_size):
            for j, ids in enumerate(self.tokenize(texts[start : start + batch_size])):
                out[start + j] = self.pool(ids)
        return out
