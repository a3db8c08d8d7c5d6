"""Build the packaged demo outcome table from the RouteProfile data (MIT).

Reads ``../shared/data/routeprofile`` (relative to the repository root) and writes
``router/assets/demo_outcomes.jsonl`` in the outcome-table format of ``router/outcomes.py``:
one record per query with, for each of the 8 models, the recorded response, its token counts,
its task score (``task_performance`` clipped to [0, 1]) and its cost (tokens x the model's
USD-per-1M-token prices from ``candidate_models.json``).

The output is deterministic (same input -> byte-identical file), so rebuilding it produces no
diff. Every line is validated with ``router.outcomes.parse_record`` before it is written.

Usage::

    python scripts/build_demo_table.py [--source DIR] [--out FILE] [--max-bytes N]
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import logging
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))  # run as a plain script from a checkout

from router.outcomes import parse_record  # noqa: E402

log = logging.getLogger("build_demo_table")

DEFAULT_SOURCE = REPO_ROOT.parent / "shared" / "data" / "routeprofile"
DEFAULT_OUT = REPO_ROOT / "router" / "assets" / "demo_outcomes.jsonl"
# The packaged table ships inside the wheel; keep it small.
DEFAULT_MAX_BYTES = 4_000_000
# If the table is over budget, responses are cut to this many characters (with a marker).
TRUNCATE_CHARS = 2_000
TRUNCATION_MARKER = " [...]"


def record_id(task: str, query: str) -> str:
    """Stable id: the task plus a hash of the query, so it survives reordering of the source."""
    digest = hashlib.sha256(query.encode("utf-8")).hexdigest()[:10]
    return f"rp-{task}-{digest}"


def _performance(item: dict[str, Any]) -> dict[str, dict[str, Any]]:
    # The upstream file stores this column as a Python-literal string in some versions and
    # as a JSON object in others; accept both.
    raw = item["model_performance"]
    perf = ast.literal_eval(raw) if isinstance(raw, str) else raw
    if not isinstance(perf, dict):
        raise ValueError(f"model_performance is not a mapping: {type(perf).__name__}")
    return perf


def _cost_usd(prompt_tokens: int, completion_tokens: int, price: dict[str, Any]) -> float:
    # Prices are USD per 1M tokens; Decimal (via str) keeps 0.2 exactly 0.2.
    per_million = prompt_tokens * Decimal(str(price["input_price"])) + completion_tokens * Decimal(
        str(price["output_price"])
    )
    return float(per_million / Decimal(1_000_000))


def _clip01(x: float) -> float:
    return min(1.0, max(0.0, float(x)))


def build_records(
    items: list[dict[str, Any]],
    prices: dict[str, dict[str, Any]],
    truncate_chars: int | None = None,
) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    seen: set[str] = set()
    for item in items:
        task = str(item["task_name"])
        query = str(item["query"])
        rid = record_id(task, query)
        if rid in seen:
            raise ValueError(f"duplicate record id {rid} (duplicate query in task {task})")
        seen.add(rid)
        outcomes: dict[str, dict[str, Any]] = {}
        for model, res in _performance(item).items():
            if model not in prices:
                raise ValueError(f"model {model!r} has no price in candidate_models.json")
            response = str(res.get("response") or "")
            if truncate_chars is not None and len(response) > truncate_chars:
                response = response[:truncate_chars] + TRUNCATION_MARKER
            pt, ct = int(res["prompt_tokens"]), int(res["completion_tokens"])
            outcomes[model] = {
                "score": _clip01(res.get("task_performance") or 0.0),
                "cost_usd": _cost_usd(pt, ct, prices[model]),
                "prompt_tokens": pt,
                "completion_tokens": ct,
                "response": response,
            }
        records.append({"id": rid, "task": task, "prompt": query, "outcomes": outcomes})
    return records


def encode(records: list[dict[str, Any]]) -> bytes:
    lines = []
    for n, rec in enumerate(records, 1):
        line = orjson.dumps(rec)
        parse_record(line, f"record {n} ({rec['id']})")  # raises on anything malformed
        lines.append(line)
    return b"\n".join(lines) + b"\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", type=Path, default=DEFAULT_SOURCE)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--max-bytes", type=int, default=DEFAULT_MAX_BYTES)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    items = json.loads((args.source / "routing_test_data.json").read_text(encoding="utf-8"))
    prices = json.loads((args.source / "candidate_models.json").read_text(encoding="utf-8"))
    data = encode(build_records(items, prices))
    truncated = False
    if len(data) > args.max_bytes:
        log.warning(
            "full table is %d bytes (> %d): cutting responses to %d chars",
            len(data),
            args.max_bytes,
            TRUNCATE_CHARS,
        )
        data = encode(build_records(items, prices, truncate_chars=TRUNCATE_CHARS))
        truncated = True
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(data)
    print(
        f"wrote {args.out} ({len(items)} records, {len(data)} bytes"
        f"{', responses truncated' if truncated else ''})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
