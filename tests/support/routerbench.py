"""Small RouterBench-style wide CSVs (``<model>``, ``<model>|model_response``,
``<model>|total_cost``) for the converter and ``xrouter convert`` tests: two models, ``m/a``
(a name with a slash) and ``b``."""

from __future__ import annotations

import csv
from pathlib import Path


def write_routerbench(path: Path, rows: list[dict[str, str]]) -> Path:
    """``rows`` (see :func:`rb_row`) as RouterBench writes them, its index column first."""
    models = ["m/a", "b"]
    header = ["", "sample_id", "prompt", "eval_name"]
    header += models + [f"{m}|model_response" for m in models] + [f"{m}|total_cost" for m in models]
    header += ["oracle_model_to_route_to"]
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=header)
        w.writeheader()
        for i, row in enumerate(rows):
            w.writerow({"": str(i), **row})
    return path


def rb_row(sid: str, a: str = "1.0", b: str = "0.0", cost_b: str = "0.002") -> dict[str, str]:
    """One prompt: its scores (``m/a`` right, ``b`` wrong by default), responses (one a
    Python literal, as RouterBench stores them) and costs."""
    return {
        "sample_id": sid,
        "prompt": repr(["Which is it?\nA) x\nB) y\nAnswer:"]),
        "eval_name": "arc",
        "m/a": a,
        "b": b,
        "m/a|model_response": repr(["A\n"]),
        "b|model_response": "plain text",
        "m/a|total_cost": "0.0001",
        "b|total_cost": cost_b,
    }
