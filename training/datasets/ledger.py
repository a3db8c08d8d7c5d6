"""The gateway's ledger export -> a validated, normalized outcome table.

``xrouter export`` writes logged traffic already in outcome-table form: one record per
request with ``logged`` (the action taken, its propensity, the cost weight and policy) and
an outcome for the chosen model only (partial feedback). Here every line is validated with
the schema (errors name file:line), ids must be unique, every record must say how it was
routed, and an outcome without ``cost_usd`` gets one from its token counts and the price
table (marked ``cost_estimated: false``: tokens are real, only the arithmetic is ours).

A record whose chosen model was never called (a budget refused it, its circuit kept the call
away), which exports written before the export left such requests out still hold, is
skipped with a warning by the export's own rule (``router.logged_calls``): its outcome is
whatever model answered in its place, filed under the chosen one.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

from pricing import PriceCatalog
from router.logged_calls import chosen_not_called
from router.outcomes import OutcomeRecord, OutcomeTableError, iter_outcome_table, parse_record
from training.datasets.common import ConversionError, UniqueIds, build_record, reading
from training.datasets.prices import call_cost_usd

logger = logging.getLogger(__name__)


def _normalize(record: OutcomeRecord, prices: PriceCatalog | None, where: str) -> OutcomeRecord:
    data = record.model_dump(exclude_none=True)
    for model, outcome in data["outcomes"].items():
        if outcome.get("cost_usd") is not None:
            continue
        pt, ct = outcome.get("prompt_tokens"), outcome.get("completion_tokens")
        if prices is None or pt is None or ct is None:
            raise ConversionError(
                f"{where}: outcomes.{model} has no cost_usd"
                + ("" if prices is not None else " (pass a price table to derive it from tokens)")
                + ("" if pt is not None and ct is not None else " and no token counts")
            )
        outcome["cost_usd"] = call_cost_usd(prices, model, pt, ct, where)
        outcome["cost_estimated"] = False
    return build_record(data, where)


def convert_ledger(
    paths: list[Path], prices: PriceCatalog | None = None, require_logged: bool = True
) -> Iterator[OutcomeRecord]:
    ids = UniqueIds()
    not_called = 0
    for path in paths:
        for where, record in _records(path):
            if require_logged and record.logged is None:
                raise ConversionError(
                    f"{where}: no `logged` (action, propensity): not a ledger export record"
                )
            ids.check(record.id, where)
            if _chosen_not_called(record):
                not_called += 1
                continue
            yield _normalize(record, prices, where)
    if not_called:
        logger.warning(
            "skipped %d records whose chosen model was never called (a budget refused it, "
            "its open circuit kept the call away): their outcome is the model that answered "
            "instead, filed under the chosen one (an export from before xrouter export left "
            "them out)",
            not_called,
        )


def _chosen_not_called(record: OutcomeRecord) -> bool:
    calls = (record.model_extra or {}).get("calls")
    if record.logged is None or not isinstance(calls, list):
        return False
    rows = [c for c in calls if isinstance(c, dict) and isinstance(c.get("model"), str)]
    return chosen_not_called(rows, record.logged.action) is not None


def _records(path: Path) -> Iterator[tuple[str, OutcomeRecord]]:
    """(where, record) for each record of an export, JSONL or Parquet."""
    try:
        if path.suffix == ".parquet":
            for i, record in enumerate(iter_outcome_table(path), 1):
                yield f"{path}: row {i}", record
            return
        with reading(path), path.open("rb") as fh:
            for lineno, line in enumerate(fh, 1):
                if line.strip():  # parse_record skips a byte order mark
                    where = f"{path}:{lineno}"
                    yield where, parse_record(line, where)
    except OutcomeTableError as exc:
        raise ConversionError(str(exc)) from None
