"""The Parquet layout of a ledger export, shared by its writer (``gateway.ledger.export``)
and its readers (``router.outcomes.load_outcome_table``, so ``xrouter train`` and ``xrouter
eval`` take a ``.parquet`` export as they take a JSONL one).

A flat table, one row per record: the chosen outcome in columns, ``calls`` and ``feedback``
as lists of structs, the conversation as JSON text, which analytics tools read directly.
``pyarrow`` is imported only when a Parquet file is written or read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

# The reward terms a feedback entry carries when its reward was logged (the export's
# ``_reward_terms``), in both formats.
REWARD_TERMS = ("reward", "cost_usd", "cost_weight", "normalized_cost", "penalty")


def parquet_schema() -> Any:
    import pyarrow as pa

    call = pa.struct(
        [
            ("turn", pa.int32()),
            ("role", pa.string()),
            ("model", pa.string()),
            ("status", pa.string()),
            ("error_type", pa.string()),
            ("prompt_tokens", pa.int64()),
            ("completion_tokens", pa.int64()),
            ("cached_tokens", pa.int64()),
            ("reasoning_tokens", pa.int64()),
            ("cost_micros", pa.int64()),
            ("latency_ms", pa.float64()),
            ("attempts", pa.int32()),
            ("fallback_from", pa.string()),
            # Which of the model's deployments served the call, if it has several.
            ("deployment", pa.string()),
            # Why a fallback answered it: the first error of the model asked for.
            ("fallback_reason", pa.string()),
        ]
    )
    fb = pa.struct(
        [
            ("score", pa.float64()),
            ("source", pa.string()),
            ("comment", pa.string()),
            ("created_at", pa.string()),
            # The request it was given on: the record's own, or a cache hit of its answer.
            ("request_id", pa.string()),
            # The reward logged with the score (router.reward), every term; null when none
            # was logged. A struct keeps only the fields it names: these were dropped.
            *((term, pa.float64()) for term in REWARD_TERMS),
        ]
    )
    return pa.schema(
        [
            ("id", pa.string()),
            ("created_at", pa.string()),
            # When the row reached the ledger database (null for rows from before it said).
            ("logged_at", pa.string()),
            ("key_id", pa.string()),
            ("policy", pa.string()),
            ("requested_model", pa.string()),
            ("content_logged", pa.string()),
            ("prompt", pa.string()),
            ("prompt_sha256", pa.string()),
            # The split group (the prompt's hash; null when the content was not logged).
            ("group", pa.string()),
            ("messages_json", pa.string()),
            ("action", pa.string()),
            ("model", pa.string()),
            ("score", pa.float64()),
            ("cost_usd", pa.float64()),
            ("cost_micros", pa.int64()),
            ("router_cost_micros", pa.int64()),
            ("downstream_cost_micros", pa.int64()),
            ("prompt_tokens", pa.int64()),
            ("completion_tokens", pa.int64()),
            ("latency_ms", pa.float64()),
            ("response", pa.string()),
            # The chosen model's call failed (score 0, its call's cost): see the JSONL export.
            ("failed", pa.bool_()),
            ("error_type", pa.string()),
            ("propensity", pa.float64()),
            ("cost_weight", pa.float64()),
            ("logged_policy", pa.string()),
            # Every model called, when a multi-call policy (a cascade's plan) made several.
            ("logged_actions", pa.list_(pa.string())),
            ("logged_checkpoint", pa.string()),
            ("calls", pa.list_(call)),
            ("feedback", pa.list_(fb)),
        ]
    )


def flatten(rec: dict[str, Any]) -> dict[str, Any]:
    ((action, outcome),) = rec["outcomes"].items()
    logged = rec.get("logged") or {}
    messages = rec.get("messages")
    return {
        "id": rec["id"],
        "created_at": rec["created_at"],
        "logged_at": rec.get("logged_at"),
        "key_id": rec["key_id"],
        "policy": rec["policy"],
        "requested_model": rec["requested_model"],
        "content_logged": rec["content_logged"],
        "prompt": rec.get("prompt"),
        "prompt_sha256": rec.get("prompt_sha256"),
        "group": rec.get("group"),
        "messages_json": orjson.dumps(messages).decode() if messages is not None else None,
        "action": action,
        "model": outcome["model"],
        "score": outcome.get("score"),
        "cost_usd": outcome["cost_usd"],
        "cost_micros": outcome["cost_micros"],
        "router_cost_micros": rec["router_cost_micros"],
        "downstream_cost_micros": rec["downstream_cost_micros"],
        "prompt_tokens": outcome["prompt_tokens"],
        "completion_tokens": outcome["completion_tokens"],
        "latency_ms": outcome["latency_ms"],
        "response": outcome.get("response"),
        "failed": bool(outcome.get("failed")),
        "error_type": outcome.get("error_type"),
        "propensity": logged.get("propensity"),
        "cost_weight": logged.get("cost_weight"),
        "logged_policy": logged.get("policy"),
        "logged_actions": logged.get("actions"),
        "logged_checkpoint": logged.get("checkpoint"),
        "calls": rec["calls"],
        "feedback": rec["feedback"],
    }


def unflatten(row: dict[str, Any]) -> dict[str, Any]:
    outcome: dict[str, Any] = {
        k: row[k]
        for k in ("score", "cost_usd", "cost_micros", "prompt_tokens", "completion_tokens")
        if row[k] is not None
    }
    outcome.update(latency_ms=row["latency_ms"], model=row["model"])
    if row["response"] is not None:
        outcome["response"] = row["response"]
    if row.get("failed"):
        outcome.update(failed=True, error_type=row.get("error_type"))
    rec: dict[str, Any] = {"id": row["id"], "outcomes": {row["action"]: outcome}}
    if row["messages_json"] is not None:
        rec["messages"] = orjson.loads(row["messages_json"])
    else:
        rec["prompt"] = row["prompt"]
    if row["propensity"] is not None:
        rec["logged"] = {
            "action": row["action"],
            "propensity": row["propensity"],
            "cost_weight": row["cost_weight"],
            "policy": row["logged_policy"],
        }
        if row.get("logged_actions"):
            rec["logged"]["actions"] = list(row["logged_actions"])
        if row.get("logged_checkpoint"):
            rec["logged"]["checkpoint"] = row["logged_checkpoint"]
    if row["score"] is None:
        rec["scored"] = False
    # Files written before these columns lack them.
    for k in ("logged_at", "group"):
        if row.get(k) is not None:
            rec[k] = row[k]
    for k in (
        "created_at",
        "key_id",
        "policy",
        "requested_model",
        "content_logged",
        "prompt_sha256",
        "router_cost_micros",
        "downstream_cost_micros",
        "calls",
    ):
        if row[k] is not None:
            rec[k] = row[k]
    if row["feedback"] is not None:
        # A score logged without a reward has no terms, as in the JSONL export (a struct
        # column has every field: null where the entry had none).
        rec["feedback"] = [
            {k: v for k, v in f.items() if v is not None or k not in REWARD_TERMS}
            for f in row["feedback"]
        ]
    return rec


def read_parquet_records(path: str | Path) -> list[dict[str, Any]]:
    """The export's rows as outcome-record dicts (``unflatten``), in file order."""
    import pyarrow.parquet as pq

    return [unflatten(r) for r in pq.read_table(str(path)).to_pylist()]
